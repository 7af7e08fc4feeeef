/*
 * bench/phases.c — allocation-only and free-only phases on many threads (issue 11).
 *
 *   usage: phases THREADS BLOCKS_PER_THREAD
 *
 * Every thread allocates BLOCKS_PER_THREAD blocks of 16–256 B without freeing any, all
 * threads wait for each other, then every thread frees its blocks. Under a recorder whose
 * threads share a lock when their own recycled records run out, the first phase serializes.
 *
 * Output: one line, "threads=T ops=N elapsed=S alloc=A free=F": S = A + F, the wall times of
 * the two phases (from the first thread starting to the last one done), N = blocks per thread.
 *
 * Build: cc -O2 -g -fno-omit-frame-pointer -pthread -o phases phases.c
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long blocks;
static pthread_barrier_t barrier;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((noinline)) static void *alloc_one(size_t n) {
    void *p = malloc(n);
    __asm__ volatile("" ::: "memory");
    return p;
}

static void *run(void *arg) {
    uint64_t rng = (uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;
    void **v = malloc(blocks * sizeof *v);
    pthread_barrier_wait(&barrier);
    for (long i = 0; i < blocks; i++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        v[i] = alloc_one(16 + rng % 241);
        *(char *)v[i] = 1;
    }
    pthread_barrier_wait(&barrier);
    pthread_barrier_wait(&barrier);
    for (long i = 0; i < blocks; i++)
        free(v[i]);
    pthread_barrier_wait(&barrier);
    free(v);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 8;
    blocks = argc > 2 ? atol(argv[2]) : 500000;
    if (threads < 1 || threads > 256 || blocks < 1) {
        fprintf(stderr, "usage: phases THREADS BLOCKS_PER_THREAD\n");
        return 2;
    }
    pthread_barrier_init(&barrier, NULL, threads + 1);
    pthread_t tid[256];
    for (int i = 0; i < threads; i++)
        pthread_create(&tid[i], NULL, run, (void *)(uintptr_t)(i + 1));
    pthread_barrier_wait(&barrier);
    double t0 = now_s();
    pthread_barrier_wait(&barrier);
    double t1 = now_s();
    pthread_barrier_wait(&barrier);
    double t2 = now_s();
    pthread_barrier_wait(&barrier);
    double t3 = now_s();
    for (int i = 0; i < threads; i++)
        pthread_join(tid[i], NULL);
    printf("threads=%d ops=%ld elapsed=%.6f alloc=%.6f free=%.6f\n", threads, blocks,
           (t1 - t0) + (t3 - t2), t1 - t0, t3 - t2);
    return 0;
}
