// hold_sized N SIZE: keeps N blocks of SIZE bytes, all allocated by hold_blocks(), live until
// stdin closes, then frees them. Several copies with different N and SIZE make processes whose
// heaps are told apart by their counts (the multi-process snapshot test).
//
// Prints "ready PID N BYTES" on stdout (with write(2), so stdio allocates nothing) when done.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void **blocks; // external: the compiler may not elide the mallocs that fill it

__attribute__((noinline)) void hold_blocks(long n, size_t size) {
    blocks = calloc((size_t)n, sizeof *blocks);
    if (!blocks) exit(2);
    for (long i = 0; i < n; i++) {
        blocks[i] = malloc(size);
        if (!blocks[i]) exit(3);
        memset(blocks[i], 1, size);
    }
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100;
    size_t size = argc > 2 ? (size_t)atol(argv[2]) : 1000;
    hold_blocks(n, size);
    char msg[96];
    int len = snprintf(msg, sizeof msg, "ready %d %ld %ld\n", (int)getpid(), n, n * (long)size);
    write(1, msg, len);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    for (long i = 0; i < n; i++) free(blocks[i]);
    free(blocks);
    return 0;
}
