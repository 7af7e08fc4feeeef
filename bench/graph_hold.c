/*
 * bench/graph_hold.c — a heap for the reference-graph benchmark.
 *
 *   usage: graph_hold N
 *
 * Allocates N blocks of 16..128 bytes; a quarter of each block's words point to other blocks
 * (chosen at random), the rest hold small integers. Every block stays reachable from a global
 * array. Writes "ready PID" (write(2)) and waits until stdin is closed.
 *
 * Build: cc -O2 -g -fno-omit-frame-pointer -o graph_hold graph_hold.c
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void **g_blocks; /* keeps every block reachable */

static uint64_t rng = 0x9e3779b97f4a7c15u;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

__attribute__((noinline)) void *graph_alloc(size_t n) { return malloc(n); }

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    g_blocks = malloc((size_t)n * sizeof *g_blocks);
    size_t *sizes = malloc((size_t)n * sizeof *sizes);
    for (long i = 0; i < n; i++) {
        sizes[i] = 16 + (next() % 113) / 8 * 8;
        g_blocks[i] = graph_alloc(sizes[i]);
    }
    for (long i = 0; i < n; i++) {
        uint64_t *w = g_blocks[i];
        for (size_t k = 0; k < sizes[i] / 8; k++)
            w[k] = (next() % 4 == 0) ? (uint64_t)(uintptr_t)g_blocks[next() % n] : next() % 1000;
    }
    free(sizes);
    char msg[64];
    int len = snprintf(msg, sizeof msg, "ready %d\n", (int)getpid());
    write(1, msg, len);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
