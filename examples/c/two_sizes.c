// two_sizes: one call site (alloc_n) keeps 30 blocks of 100 bytes and 20 of 200 bytes, and
// allocates and frees 10 of 300 bytes; another (alloc_fixed) keeps 5 blocks of 64 bytes.
// Prints "ready PID" and waits for stdin to close.
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void *kept[64];

__attribute__((noinline)) void *alloc_n(size_t n) { return malloc(n); }

__attribute__((noinline)) void *alloc_fixed(void) { return malloc(64); }

int main(void) {
    int k = 0;
    for (int i = 0; i < 50; i++) kept[k++] = alloc_n(i % 5 < 3 ? 100 : 200);
    for (int i = 0; i < 10; i++) free(alloc_n(300));
    for (int i = 0; i < 5; i++) kept[k++] = alloc_fixed();
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
