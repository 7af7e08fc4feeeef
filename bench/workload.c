/*
 * bench/workload.c — malloc-heavy, CPU-bound workload for the heapdump benchmark harness.
 *
 *   usage: workload THREADS OPS_PER_THREAD
 *
 * Each thread keeps SLOTS (10,000) live blocks in a slot array. It first fills every slot, then
 * performs OPS_PER_THREAD operations, each of which replaces one random slot:
 *   30 %  realloc the block to a new size
 *   70 %  free it, then allocate a new one with malloc (40 %), calloc (15 %) or
 *         posix_memalign (15 %, alignment 16..4096)
 * Sizes are log-uniform in [8 B, 64 KiB]. Every allocation happens at the bottom of one of
 * 16 distinct call paths, 2..24 frames deep (counting from the function calling the
 * allocator): a noinline recursive descend() followed by one of four noinline leaf functions.
 * All randomness comes from a per-thread splitmix64/xorshift PRNG seeded by the thread index,
 * so every run does exactly the same work.
 *
 * Output: one line, "threads=T ops=N elapsed=S checksum=X", where elapsed is the wall time of
 * the operation phase only (after every thread has filled its slots and all threads started
 * together), so that the harness can compute throughput and thread scaling without counting
 * start-up (e.g. the profiler's initialisation).
 *
 * Build: cc -O2 -g -fno-omit-frame-pointer -pthread -o workload workload.c
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SLOTS 10000
#define PATHS 16
#define MIN_LOG2 3  /* 8 B */
#define MAX_LOG2 16 /* 64 KiB */

#define NOINLINE __attribute__((noinline, noclone))
/* An empty asm with a memory clobber after a call keeps GCC from turning the call into a tail
 * call or the recursion into a loop, so every level really is a frame on the stack. */
#define KEEP_FRAME() __asm__ volatile("" ::: "memory")

enum op { OP_MALLOC, OP_CALLOC, OP_MEMALIGN, OP_REALLOC };

struct rng {
    uint64_t s;
};

static inline uint64_t rng_next(struct rng *r) {
    /* splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in [0, n). The modulo bias is irrelevant here. */
static inline uint32_t rng_below(struct rng *r, uint32_t n) { return (uint32_t)(rng_next(r) % n); }

/* Log-uniform size in [8, 65536]: a uniform exponent, then a uniform size within that octave. */
static inline size_t rng_size(struct rng *r) {
    uint64_t x = rng_next(r);
    unsigned e = MIN_LOG2 + (unsigned)(x % (MAX_LOG2 - MIN_LOG2)); /* 3..15 */
    size_t lo = (size_t)1 << e;
    return lo + (size_t)((x >> 20) % (lo + 1)); /* lo..2*lo */
}

/* What the leaf should do: the request, and the block to realloc (if any). */
struct req {
    enum op op;
    size_t size;
    size_t align;
    void *old;
};

/* Touch the block a little, as a real program would (first and last byte, and up to 64 bytes
 * at the start), so the allocator's pages are really used. */
static inline void touch(void *p, size_t n) {
    if (!p) return;
    unsigned char *b = p;
    memset(b, 0xa5, n < 64 ? n : 64);
    b[n - 1] = 0x5a;
}

static void *do_alloc(struct req *q) {
    void *p = NULL;
    switch (q->op) {
    case OP_MALLOC:
        p = malloc(q->size);
        break;
    case OP_CALLOC:
        p = calloc(1, q->size);
        break;
    case OP_MEMALIGN:
        if (posix_memalign(&p, q->align, q->size) != 0) p = NULL;
        break;
    case OP_REALLOC:
        p = realloc(q->old, q->size);
        break;
    }
    return p;
}

/* Four leaf functions: each has its own allocator call sites, so the same descend() depth
 * ending in different leaves gives different stack traces. Each is a separate copy of the
 * switch (always_inline into the noinline leaf) so the return addresses differ. */
static inline __attribute__((always_inline)) void *leaf_body(struct req *q, int tweak) {
    void *p = do_alloc(q);
    touch(p, q->size);
    if (p && tweak) ((unsigned char *)p)[0] ^= (unsigned char)tweak;
    return p;
}
static NOINLINE void *leaf_a(struct req *q) { void *p = leaf_body(q, 1); KEEP_FRAME(); return p; }
static NOINLINE void *leaf_b(struct req *q) { void *p = leaf_body(q, 2); KEEP_FRAME(); return p; }
static NOINLINE void *leaf_c(struct req *q) { void *p = leaf_body(q, 3); KEEP_FRAME(); return p; }
static NOINLINE void *leaf_d(struct req *q) { void *p = leaf_body(q, 4); KEEP_FRAME(); return p; }

/* Recurse `depth` levels, then call the leaf picked by `path`. */
static NOINLINE void *descend(int depth, int path, struct req *q) {
    void *p;
    if (depth > 0) {
        p = descend(depth - 1, path, q);
    } else {
        switch (path & 3) {
        case 0: p = leaf_a(q); break;
        case 1: p = leaf_b(q); break;
        case 2: p = leaf_c(q); break;
        default: p = leaf_d(q); break;
        }
    }
    KEEP_FRAME();
    return p;
}

/* Path p recurses d = p*22/15 levels: d+1 descend() frames plus the leaf, 2..24 frames. */
static int path_depth(int path) { return path * 22 / (PATHS - 1); }

struct worker {
    pthread_t th;
    int index;
    long ops;
    uint64_t checksum;
};

static pthread_barrier_t start_barrier;

static void *alloc_on_path(struct rng *r, enum op op, size_t size, void *old) {
    struct req q = {op, size, 0, old};
    if (op == OP_MEMALIGN) q.align = (size_t)16 << rng_below(r, 9); /* 16..4096 */
    int path = (int)rng_below(r, PATHS);
    return descend(path_depth(path), path, &q);
}

static void *worker_main(void *arg) {
    struct worker *w = arg;
    struct rng r = {0x1234567ULL + 0x9e3779b97f4a7c15ULL * (uint64_t)(w->index + 1)};
    void **slot = calloc(SLOTS, sizeof *slot);
    size_t *slot_size = calloc(SLOTS, sizeof *slot_size);
    if (!slot || !slot_size) abort();

    /* Fill every slot. */
    for (int i = 0; i < SLOTS; i++) {
        size_t n = rng_size(&r);
        slot[i] = alloc_on_path(&r, OP_MALLOC, n, NULL);
        if (!slot[i]) abort();
        slot_size[i] = n;
    }

    pthread_barrier_wait(&start_barrier);

    uint64_t sum = 0;
    for (long k = 0; k < w->ops; k++) {
        uint32_t i = rng_below(&r, SLOTS);
        uint32_t pick = rng_below(&r, 100);
        size_t n = rng_size(&r);
        void *p;
        if (pick < 30) {
            p = alloc_on_path(&r, OP_REALLOC, n, slot[i]);
        } else {
            free(slot[i]);
            enum op op = pick < 70 ? OP_MALLOC : pick < 85 ? OP_CALLOC : OP_MEMALIGN;
            p = alloc_on_path(&r, op, n, NULL);
        }
        if (!p) abort();
        slot[i] = p;
        slot_size[i] = n;
        sum += ((unsigned char *)p)[n - 1] + n;
    }

    for (int i = 0; i < SLOTS; i++) free(slot[i]);
    free(slot);
    free(slot_size);
    w->checksum = sum;
    return NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s THREADS OPS_PER_THREAD\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[1]);
    long ops = atol(argv[2]);
    if (threads < 1 || threads > 1024 || ops < 0) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    struct worker *ws = calloc((size_t)threads, sizeof *ws);
    if (!ws) return 1;
    /* The main thread joins the barrier too, so it can time the operation phase. */
    pthread_barrier_init(&start_barrier, NULL, (unsigned)threads + 1);
    for (int t = 0; t < threads; t++) {
        ws[t].index = t;
        ws[t].ops = ops;
        if (pthread_create(&ws[t].th, NULL, worker_main, &ws[t]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return 1;
        }
    }
    pthread_barrier_wait(&start_barrier);
    double t0 = now_s();
    uint64_t sum = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(ws[t].th, NULL);
        sum += ws[t].checksum;
    }
    double elapsed = now_s() - t0;
    printf("threads=%d ops=%ld elapsed=%.6f checksum=%llu\n", threads, ops, elapsed,
           (unsigned long long)sum);
    free(ws);
    return 0;
}
