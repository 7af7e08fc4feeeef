/*
 * bench/storm.c — a malloc/free storm (issue 11): what a busy service's allocator sees, without
 * the reallocs of large blocks that make bench/workload.c's baseline slow.
 *
 *   usage: storm THREADS OPS_PER_THREAD [LIVE]
 *
 * Each thread keeps LIVE live blocks (default 10,000; bench/run.py's "where the time goes"
 * also runs it with 100, where every block stays in cache). Each operation runs through one of 16 call paths
 * 2 to 24 frames deep and is, at random: 81% a malloc/free pair (the block in a random slot
 * freed, a new one of 8 B–64 KiB, log-uniform, allocated in its place), 2% a realloc of a slot
 * to a new size, 17% a write into a slot's block (work without allocation).
 *
 * Output: one line, "threads=T ops=N elapsed=S checksum=X", elapsed being the wall time of the
 * operation phase (after the 10,000 blocks per thread are allocated, until every thread is done).
 *
 * Build: cc -O2 -g -fno-omit-frame-pointer -pthread -o storm storm.c
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_LIVE 1000000
#define PATHS 16

static long ops_per_thread;
static size_t LIVE = 10000;
static pthread_barrier_t start_barrier;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

struct th {
    void **slot;
    uint64_t rng;
    uint64_t sum;
};

static uint64_t next(struct th *t) {
    t->rng ^= t->rng << 13;
    t->rng ^= t->rng >> 7;
    t->rng ^= t->rng << 17;
    return t->rng;
}

static size_t size_of_op(struct th *t) {
    uint64_t r = next(t);
    size_t hi = (size_t)8 << (r % 14); /* 8 B .. 64 KiB */
    size_t s = 8 + (size_t)((r >> 8) % hi);
    return s > 65536 ? 65536 : s;
}

__attribute__((noinline)) static void op(struct th *t) {
    uint64_t r = next(t);
    unsigned kind = r % 100;
    size_t i = (r >> 16) % LIVE;
    if (kind < 81) {
        free(t->slot[i]);
        size_t n = size_of_op(t);
        char *p = malloc(n);
        p[0] = (char)r;
        t->slot[i] = p;
    } else if (kind < 83) {
        size_t n = size_of_op(t);
        char *p = realloc(t->slot[i], n);
        p[0] = (char)r;
        t->slot[i] = p;
    } else {
        char *p = t->slot[i];
        t->sum += (unsigned char)p[0];
        p[0] = (char)(r >> 24);
    }
}

/* Two kinds of frame, so that paths of equal depth still differ. */
__attribute__((noinline)) static void path_b(struct th *t, int depth, unsigned bits);
__attribute__((noinline)) static void path_a(struct th *t, int depth, unsigned bits) {
    if (depth == 0) {
        op(t);
    } else if (bits & 1) {
        path_b(t, depth - 1, bits >> 1);
    } else {
        path_a(t, depth - 1, bits >> 1);
    }
    __asm__ volatile("" ::: "memory"); /* keep the frame: no tail call */
}
__attribute__((noinline)) static void path_b(struct th *t, int depth, unsigned bits) {
    if (depth == 0) {
        op(t);
    } else if (bits & 1) {
        path_a(t, depth - 1, bits >> 1);
    } else {
        path_b(t, depth - 1, bits >> 1);
    }
    __asm__ volatile("" ::: "memory");
}

static void *run(void *arg) {
    struct th *t = arg;
    for (size_t i = 0; i < LIVE; i++) {
        t->slot[i] = malloc(size_of_op(t));
        ((char *)t->slot[i])[0] = 1;
    }
    pthread_barrier_wait(&start_barrier);
    for (long k = 0; k < ops_per_thread; k++) {
        unsigned p = next(t) % PATHS;
        int depth = 2 + (int)(p * 22 / (PATHS - 1)) - 2; /* 2..24 frames with op and path_* */
        path_a(t, depth, p * 0x9e37u);
    }
    pthread_barrier_wait(&start_barrier);
    for (size_t i = 0; i < LIVE; i++)
        free(t->slot[i]);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    ops_per_thread = argc > 2 ? atol(argv[2]) : 2000000;
    long live = argc > 3 ? atol(argv[3]) : 10000;
    if (threads < 1 || threads > 256 || ops_per_thread < 0 || live < 1 || live > MAX_LIVE) {
        fprintf(stderr, "usage: storm THREADS OPS_PER_THREAD [LIVE]\n");
        return 2;
    }
    LIVE = (size_t)live;
    pthread_barrier_init(&start_barrier, NULL, threads + 1);
    pthread_t tid[256];
    struct th *ts = calloc(threads, sizeof *ts);
    for (int i = 0; i < threads; i++) {
        ts[i].rng = 0x9e3779b97f4a7c15ull * (i + 1);
        ts[i].slot = calloc(LIVE, sizeof(void *));
        pthread_create(&tid[i], NULL, run, &ts[i]);
    }
    pthread_barrier_wait(&start_barrier);
    double t0 = now_s();
    pthread_barrier_wait(&start_barrier);
    double elapsed = now_s() - t0;
    uint64_t sum = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(tid[i], NULL);
        sum += ts[i].sum;
        free(ts[i].slot);
    }
    printf("threads=%d ops=%ld elapsed=%.6f checksum=%llu\n", threads, ops_per_thread, elapsed,
           (unsigned long long)sum);
    free(ts);
    return 0;
}
