// linked_list: a singly-linked list of N (argv[1], default 20000) 16-byte nodes hanging off
// a global, built by push(); prints "ready PID" and waits for stdin to close. The most common
// heap shape: every node's chain from the root is one longer than the last.
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct node {
    struct node *next;
    long v;
};
struct node *head;

__attribute__((noinline)) void push(long v) {
    struct node *n = malloc(sizeof *n);
    n->v = v;
    n->next = head;
    head = n;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 20000;
    for (long i = 0; i < n; i++) push(i);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
