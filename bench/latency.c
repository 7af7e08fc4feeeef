/*
 * bench/latency.c — allocation latency of a target while a collector snapshots it.
 *
 *   usage: latency HOLD SECONDS
 *
 * Allocates HOLD blocks of 16..64 bytes and keeps them live (so that a snapshot has HOLD records
 * to copy), prints "ready PID\n", then serves commands read line by line from stdin:
 *
 *   run NAME   for SECONDS, repeatedly replace one random held block (free it, malloc a new
 *              one of 16..64 bytes) and time each replacement (free + malloc) with
 *              CLOCK_MONOTONIC; then print
 *              "NAME n=N p50=NS p99=NS p999=NS max=NS\n" (nanoseconds)
 *   quit       exit
 *
 * The harness alternates "run quiet" and "run snap" phases, taking snapshots back to back
 * during the "snap" ones, and compares the percentiles. Output uses write(2), unbuffered.
 *
 * Build: cc -O2 -g -fno-omit-frame-pointer -o latency latency.c
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))
#define KEEP_FRAME() __asm__ volatile("" ::: "memory")
#define MAX_SAMPLES (64u << 20) /* 64 Mi samples, 256 MiB of uint32_t: far more than needed */

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static NOINLINE void *leaf(size_t n) {
    void *p = malloc(n);
    KEEP_FRAME();
    return p;
}
static NOINLINE void *mid(size_t n) {
    void *p = leaf(n);
    KEEP_FRAME();
    return p;
}

static void say(const char *s) {
    size_t len = strlen(s);
    while (len > 0) {
        ssize_t w = write(1, s, len);
        if (w <= 0) exit(1);
        s += w;
        len -= (size_t)w;
    }
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: latency HOLD SECONDS\n");
        return 2;
    }
    size_t hold = strtoull(argv[1], NULL, 10);
    double seconds = strtod(argv[2], NULL);
    if (hold == 0 || seconds <= 0) {
        fprintf(stderr, "latency: HOLD and SECONDS must be positive\n");
        return 2;
    }
    void **blocks = calloc(hold, sizeof *blocks);
    uint32_t *lat = calloc(MAX_SAMPLES, sizeof *lat);
    if (!blocks || !lat) {
        fprintf(stderr, "latency: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < hold; i++) blocks[i] = mid(16 + rng_next() % 49);
    char line[256];
    snprintf(line, sizeof line, "ready %d\n", (int)getpid());
    say(line);

    char cmd[256];
    while (fgets(cmd, sizeof cmd, stdin)) {
        if (strncmp(cmd, "quit", 4) == 0) break;
        if (strncmp(cmd, "run ", 4) != 0) {
            fprintf(stderr, "latency: unknown command %s", cmd);
            return 2;
        }
        char name[64];
        if (sscanf(cmd + 4, "%63s", name) != 1) return 2;
        uint64_t start = now_ns(), end = start + (uint64_t)(seconds * 1e9);
        size_t n = 0;
        uint64_t t0 = start;
        while (n < MAX_SAMPLES) {
            size_t i = rng_next() % hold;
            size_t size = 16 + rng_next() % 49;
            free(blocks[i]);
            blocks[i] = mid(size);
            uint64_t t1 = now_ns();
            uint64_t d = t1 - t0;
            lat[n++] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
            t0 = t1;
            if (t1 >= end) break;
        }
        qsort(lat, n, sizeof *lat, cmp_u32);
        snprintf(line, sizeof line, "%s n=%zu p50=%u p99=%u p999=%u max=%u\n", name, n,
                 lat[n / 2], lat[(size_t)(n * 0.99)], lat[(size_t)(n * 0.999)], lat[n - 1]);
        say(line);
    }
    return 0;
}
