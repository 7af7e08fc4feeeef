/*
 * bench/latency.c — allocation latency of a target while a collector snapshots it.
 *
 *   usage: latency HOLD SECONDS [THREADS]
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
 * THREADS (default 1): the HOLD blocks are split into THREADS contiguous shares (thread t owns
 * blocks [HOLD*t/THREADS, HOLD*(t+1)/THREADS)) and each thread replaces random blocks of its own
 * share only, so the threads never touch one another's blocks. The threads are started once,
 * after the blocks are allocated (all by the main thread, as with one thread), and wait on a
 * barrier between phases; during "run NAME" they all run until the same deadline, SECONDS after
 * the command was read. With THREADS = 1 the main thread does the replacing itself, exactly as
 * before the option existed (same random sequence, same output).
 *
 * Samples and memory: every replacement's time is kept (uint32_t ns, saturated), and the
 * percentiles are exact over the merged samples of all threads. The sample buffer is one array
 * of MAX_SAMPLES (256 MiB of address space, only the part written is touched), split into
 * THREADS equal slices of MAX_SAMPLES / THREADS; a thread whose slice is full ends its phase
 * early (as the single thread does at MAX_SAMPLES). 64 Mi samples is far more than a 2 s phase
 * produces at any thread count on a small machine (the threads share the cores). After the
 * phase the slices are packed together and the percentiles are found by an exact two-pass
 * radix selection (histogram of the upper 16 bits, then of the lower 16 bits within the
 * buckets that hold the wanted ranks) instead of sorting: the same values as sorting and
 * indexing n/2, n*0.99, n*0.999, n-1, in linear time, so that a phase of tens of millions of
 * samples is reported in a fraction of a second rather than the seconds a qsort would take
 * (during which the harness would still be snapshotting).
 *
 * The harness alternates "run quiet" and "run snap" phases, taking snapshots back to back
 * during the "snap" ones, and compares the percentiles. Output uses write(2), unbuffered.
 *
 * Build: cc -O2 -g -fno-omit-frame-pointer -pthread -o latency latency.c
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))
#define KEEP_FRAME() __asm__ volatile("" ::: "memory")
#define MAX_SAMPLES (64u << 20) /* 64 Mi samples, 256 MiB of uint32_t: far more than needed */
#define MAX_THREADS 1024

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* splitmix64; one state per thread (thread 0 continues the main thread's sequence). */
static uint64_t rng_next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
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

/* One thread's share of the blocks and of the sample buffer. */
struct worker {
    pthread_t tid;
    void **blocks; /* its share */
    size_t count;  /* blocks in its share */
    uint32_t *lat; /* its slice of the sample buffer */
    size_t cap;    /* slice length */
    size_t n;      /* samples taken in the last phase */
    uint64_t rng;
};

static struct {
    pthread_barrier_t go, done;
    uint64_t end;   /* deadline of the current phase (CLOCK_MONOTONIC ns) */
    int quit;
} phase;

/* Replace random blocks of w's share until `end`, timing each replacement. */
static void churn(struct worker *w, uint64_t start, uint64_t end) {
    size_t n = 0;
    uint64_t t0 = start;
    while (n < w->cap) {
        size_t i = rng_next(&w->rng) % w->count;
        size_t size = 16 + rng_next(&w->rng) % 49;
        free(w->blocks[i]);
        w->blocks[i] = mid(size);
        uint64_t t1 = now_ns();
        uint64_t d = t1 - t0;
        w->lat[n++] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
        t0 = t1;
        if (t1 >= end) break;
    }
    w->n = n;
}

static void *worker_main(void *arg) {
    struct worker *w = arg;
    for (;;) {
        pthread_barrier_wait(&phase.go);
        if (phase.quit) return NULL;
        churn(w, now_ns(), phase.end);
        pthread_barrier_wait(&phase.done);
    }
}

/* The values at ranks[0..k) (0-based, ascending order) of lat[0..n), exactly: a histogram of
 * the upper 16 bits finds each rank's bucket, a second pass histograms the lower 16 bits of the
 * values in those buckets. k <= 4. */
static void select_ranks(const uint32_t *lat, size_t n, const size_t *ranks, int k,
                         uint32_t *out) {
    size_t *hist = calloc(65536, sizeof *hist);
    size_t *low = calloc((size_t)k * 65536, sizeof *low);
    if (!hist || !low) {
        fprintf(stderr, "latency: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) hist[lat[i] >> 16]++;
    uint32_t hi[4];
    size_t rest[4];
    for (int r = 0; r < k; r++) {
        size_t below = 0, b = 0;
        while (below + hist[b] <= ranks[r]) below += hist[b++];
        hi[r] = (uint32_t)b;
        rest[r] = ranks[r] - below;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t h = lat[i] >> 16;
        for (int r = 0; r < k; r++)
            if (h == hi[r]) low[(size_t)r * 65536 + (lat[i] & 0xffff)]++;
    }
    for (int r = 0; r < k; r++) {
        const size_t *l = low + (size_t)r * 65536;
        size_t below = 0, b = 0;
        while (below + l[b] <= rest[r]) below += l[b++];
        out[r] = hi[r] << 16 | (uint32_t)b;
    }
    free(hist);
    free(low);
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: latency HOLD SECONDS [THREADS]\n");
        return 2;
    }
    size_t hold = strtoull(argv[1], NULL, 10);
    double seconds = strtod(argv[2], NULL);
    long threads = argc == 4 ? strtol(argv[3], NULL, 10) : 1;
    if (hold == 0 || seconds <= 0) {
        fprintf(stderr, "latency: HOLD and SECONDS must be positive\n");
        return 2;
    }
    if (threads < 1 || threads > MAX_THREADS || (size_t)threads > hold) {
        fprintf(stderr, "latency: THREADS must be in 1..%d and at most HOLD\n", MAX_THREADS);
        return 2;
    }
    uint64_t rng = 0x9e3779b97f4a7c15ULL;
    void **blocks = calloc(hold, sizeof *blocks);
    uint32_t *lat = calloc(MAX_SAMPLES, sizeof *lat);
    struct worker *workers = calloc((size_t)threads, sizeof *workers);
    if (!blocks || !lat || !workers) {
        fprintf(stderr, "latency: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < hold; i++) blocks[i] = mid(16 + rng_next(&rng) % 49);
    size_t cap = MAX_SAMPLES / (size_t)threads;
    for (long t = 0; t < threads; t++) {
        struct worker *w = &workers[t];
        size_t lo = hold * (size_t)t / (size_t)threads, hi = hold * (size_t)(t + 1) / (size_t)threads;
        w->blocks = blocks + lo;
        w->count = hi - lo;
        w->lat = lat + (size_t)t * cap;
        w->cap = cap;
        /* Thread 0 continues the main sequence (the single-thread case is unchanged). */
        w->rng = t == 0 ? rng : rng_next(&rng);
    }
    if (threads > 1) {
        pthread_barrier_init(&phase.go, NULL, (unsigned)threads + 1);
        pthread_barrier_init(&phase.done, NULL, (unsigned)threads + 1);
        for (long t = 0; t < threads; t++) {
            if (pthread_create(&workers[t].tid, NULL, worker_main, &workers[t]) != 0) {
                fprintf(stderr, "latency: pthread_create failed\n");
                return 1;
            }
        }
    }
    char line[256];
    snprintf(line, sizeof line, "ready %d\n", (int)getpid());
    say(line);

    char cmd[256];
    int status = 0;
    while (fgets(cmd, sizeof cmd, stdin)) {
        if (strncmp(cmd, "quit", 4) == 0) break;
        if (strncmp(cmd, "run ", 4) != 0) {
            fprintf(stderr, "latency: unknown command %s", cmd);
            status = 2;
            break;
        }
        char name[64];
        if (sscanf(cmd + 4, "%63s", name) != 1) {
            status = 2;
            break;
        }
        uint64_t start = now_ns(), end = start + (uint64_t)(seconds * 1e9);
        size_t n;
        if (threads == 1) {
            churn(&workers[0], start, end);
            n = workers[0].n;
        } else {
            phase.end = end;
            pthread_barrier_wait(&phase.go);
            pthread_barrier_wait(&phase.done);
            /* Pack the slices together (slice 0 is already in place). */
            n = workers[0].n;
            for (long t = 1; t < threads; t++) {
                memmove(lat + n, workers[t].lat, workers[t].n * sizeof *lat);
                n += workers[t].n;
            }
        }
        if (n == 0) {
            fprintf(stderr, "latency: no samples\n");
            status = 1;
            break;
        }
        size_t ranks[4] = {n / 2, (size_t)(n * 0.99), (size_t)(n * 0.999), n - 1};
        uint32_t v[4];
        select_ranks(lat, n, ranks, 4, v);
        snprintf(line, sizeof line, "%s n=%zu p50=%u p99=%u p999=%u max=%u\n", name, n, v[0],
                 v[1], v[2], v[3]);
        say(line);
    }
    if (threads > 1) {
        phase.quit = 1;
        pthread_barrier_wait(&phase.go);
        for (long t = 0; t < threads; t++) pthread_join(workers[t].tid, NULL);
    }
    return status;
}
