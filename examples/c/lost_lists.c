// Leaked linked lists, built by code without frame pointers (-O2 -fomit-frame-pointer), where
// the compiler keeps the list's last node in `rbp` across each `malloc`: a saved `rbp` the
// shim's stack walk reads is then a heap pointer, and a copy of it kept in the shim's walk
// memo must not keep the leaked list reachable (helper G, 1).
//
// 20 lists of 1000 nodes of 56 B are built and dropped (20,000 blocks, 1,120,000 B leaked:
// 20 direct, 19,980 indirect); then 100 short-lived blocks. Prints
// "ready PID 20000 1120000" and waits for stdin to close.
//
// Build: cc -O2 -g -fomit-frame-pointer -fno-optimize-sibling-calls lost_lists.c
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct node {
    struct node *next;
    char pad[48];
};

__attribute__((noinline)) static struct node *build_list(int n) {
    struct node *head = malloc(sizeof *head), *cur = head;
    for (int i = 1; i < n; i++) {
        cur->next = malloc(sizeof *cur);
        cur = cur->next;
    }
    cur->next = NULL;
    return head;
}

__attribute__((noinline)) static long length(const struct node *h) {
    long k = 0;
    for (; h; h = h->next)
        k++;
    return k;
}

__attribute__((noinline)) static void other_work(void) {
    for (int i = 0; i < 100; i++)
        free(malloc(32 + i));
}

int main(void) {
    long total = 0;
    for (int r = 0; r < 20; r++)
        total += length(build_list(1000)); // the list is dropped: leaked
    other_work();
    printf("ready %d %ld %ld\n", (int)getpid(), total, total * (long)sizeof(struct node));
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}
