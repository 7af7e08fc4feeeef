/*
 * bench/hold.c — holds many small live blocks for the snapshot benchmark.
 *
 *   usage: hold N
 *
 * Allocates N blocks of 16..64 bytes (malloc) from 4 distinct call paths, keeps them all live,
 * writes "ready PID\n" to stdout with write(2) (no stdio buffering), then waits until stdin is
 * closed (EOF) and exits without freeing (the harness only measures while it waits).
 *
 * Build: cc -O2 -g -fno-omit-frame-pointer -pthread -o hold hold.c
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))
#define KEEP_FRAME() __asm__ volatile("" ::: "memory")

static NOINLINE void *path_a(size_t n) { void *p = malloc(n); KEEP_FRAME(); return p; }
static NOINLINE void *path_b(size_t n) { void *p = path_a(n); KEEP_FRAME(); return p; }
static NOINLINE void *path_c(size_t n) { void *p = path_b(n); KEEP_FRAME(); return p; }
static NOINLINE void *path_d(size_t n) { void *p = path_c(n); KEEP_FRAME(); return p; }

static NOINLINE void *hold_alloc(unsigned path, size_t n) {
    void *p;
    switch (path & 3) {
    case 0: p = path_a(n); break;
    case 1: p = path_b(n); break;
    case 2: p = path_c(n); break;
    default: p = path_d(n); break;
    }
    KEEP_FRAME();
    return p;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s N\n", argv[0]);
        return 2;
    }
    long n = atol(argv[1]);
    if (n < 0) return 2;
    void **blocks = malloc(sizeof(void *) * (size_t)(n ? n : 1));
    if (!blocks) return 1;
    uint64_t x = 88172645463325252ULL; /* xorshift64 */
    for (long i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t size = 16 + (size_t)(x % 49); /* 16..64 */
        blocks[i] = hold_alloc((unsigned)(x >> 32), size);
        if (!blocks[i]) return 1;
        memset(blocks[i], (int)i, size);
    }

    char msg[64];
    int len = snprintf(msg, sizeof msg, "ready %ld\n", (long)getpid());
    if (write(1, msg, (size_t)len) != len) return 1;

    char buf[256];
    for (;;) {
        ssize_t r = read(0, buf, sizeof buf);
        if (r == 0) break;
        if (r < 0) break;
    }
    return 0;
}
