// register_held: keeps its only pointers to 5 blocks (a list of 4 nodes of 64 bytes, whose
// head is in r12, and a buffer of 1,000 bytes in r13) in callee-saved registers while it is
// blocked in read(2), as an -O2 program keeps its containers (helper T, 3). Build with -O2.
// Prints "ready PID" and waits for stdin to close; frees everything and exits 0.
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct node {
    struct node *next;
    char pad[56];
};

__attribute__((noinline)) struct node *make_list(int n) {
    struct node *head = NULL;
    for (int i = 0; i < n; i++) {
        struct node *x = malloc(sizeof *x);
        x->next = head;
        head = x;
    }
    return head;
}

__attribute__((noinline)) char *make_buffer(void) { return malloc(1000); }

int main(void) {
#if defined(__x86_64__)
    register struct node *list asm("r12") = make_list(4);
    register char *buf asm("r13") = make_buffer();
#else
    struct node *list = make_list(4);
    char *buf = make_buffer();
#endif
    asm volatile("" : "+r"(list), "+r"(buf));
    char line[32];
    int n = snprintf(line, sizeof line, "ready %d\n", (int)getpid());
    write(1, line, n);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    asm volatile("" : "+r"(list), "+r"(buf));
    while (list) {
        struct node *next = list->next;
        free(list);
        list = next;
    }
    free(buf);
    return 0;
}
