// A program that frees small blocks with glibc's `__libc_free` directly, past the shim (helper
// L, 3): each `malloc(24)` gets the address the previous one gave back. Prints
// "ready PID 1 24" (the block whose record stays: its free is never seen and nothing reuses
// its address after) and waits for stdin to close.
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

extern void __libc_free(void *);

__attribute__((noinline)) static void churn_libc_free(int n) {
    for (int i = 0; i < n; i++) {
        char *volatile p = malloc(24);
        p[0] = (char)i;
        __libc_free(p);
    }
}

int main(void) {
    churn_libc_free(100000);
    printf("ready %d 1 24\n", (int)getpid());
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}
