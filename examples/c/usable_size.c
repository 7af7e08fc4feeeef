// usable_size: malloc_usable_size on the program's own blocks, each then written to its
// last usable byte (as redis does), for sizes 1 B to 64 KiB, then freed; keep_blocks keeps
// 10 blocks of 100 B. Prints "ready PID 10 1000" and waits for stdin to close.
// Run with another allocator preloaded after the shim (jemalloc): the shim's blocks are
// glibc's, so malloc_usable_size must be glibc's too (jemalloc's crashed on them).
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *kept[10]; // external: the compiler may not elide the mallocs

__attribute__((noinline)) void keep_blocks(void) {
    for (int i = 0; i < 10; i++) kept[i] = malloc(100);
}

int main(void) {
    for (size_t n = 1; n <= 65536; n = n * 3 + 1) {
        char *p = malloc(n);
        size_t u = malloc_usable_size(p);
        if (u < n) {
            printf("usable %zu < %zu\n", u, n);
            return 1;
        }
        memset(p, 1, u);
        free(p);
    }
    keep_blocks();
    printf("ready %d 10 1000\n", getpid());
    fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
