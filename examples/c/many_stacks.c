// many_stacks BITS: holds 2^BITS blocks, each allocated through a call stack of its own: a chain
// of BITS calls to left() or right() spelling the block's number in binary, then hold_one().
// Block i is 16 + (i % 64) * 8 bytes. More stacks than a profiling server takes in one profile
// (Pyroscope: 16,000 samples) for BITS >= 14: the push trimming test. Build with
// -fno-optimize-sibling-calls so that every call keeps its frame.
//
// Prints "ready PID N BYTES" on stdout (with write(2), so stdio allocates nothing) when done,
// then frees everything when stdin closes.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void **blocks; // external: the compiler may not elide the mallocs that fill it
long total;

__attribute__((noinline)) void hold_one(long i) {
    size_t size = 16 + (size_t)(i % 64) * 8;
    blocks[i] = malloc(size);
    if (!blocks[i]) exit(3);
    memset(blocks[i], 1, size);
    total += (long)size;
}

__attribute__((noinline)) void step(int d, long i, int bits);

__attribute__((noinline)) void left(int d, long i, int bits) {
    step(d + 1, i, bits);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void right(int d, long i, int bits) {
    step(d + 1, i, bits);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void step(int d, long i, int bits) {
    if (d == bits) {
        hold_one(i);
    } else if ((i >> d) & 1) {
        right(d, i, bits);
    } else {
        left(d, i, bits);
    }
    __asm__ volatile("" ::: "memory");
}

int main(int argc, char **argv) {
    int bits = argc > 1 ? atoi(argv[1]) : 15;
    if (bits < 1 || bits > 20) return 2;
    long n = 1L << bits;
    blocks = calloc((size_t)n, sizeof *blocks);
    if (!blocks) return 2;
    for (long i = 0; i < n; i++) step(0, i, bits);
    char msg[96];
    int len = snprintf(msg, sizeof msg, "ready %d %ld %ld\n", (int)getpid(), n, total);
    write(1, msg, len);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    for (long i = 0; i < n; i++) free(blocks[i]);
    free(blocks);
    return 0;
}
