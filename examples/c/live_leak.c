// live_leak: a steady cache and a slow leak that starts growing fast on request; for the live
// view (`heapdump top --live`).
//
// - fill_cache: 2,000 blocks of 1,024 B (2,048,000 B), one of them replaced at random (freed,
//   allocated again at the same size) every millisecond: flat, but always busy.
// - leak_more: 64 B every 100 ms, never freed (a slow leak); after a line "fast" on stdin,
//   65,536 B every 10 ms (6.25 MiB/s), up to 64 MiB or 100,000 blocks in all so that a forgotten run stays small.
//
// Prints "ready PID" on stdout (with write(2), so stdio allocates nothing) once the cache is
// full; frees everything and exits 0 when stdin closes. Build with -fno-optimize-sibling-calls
// so that each allocating function keeps its frame.
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CACHE 2000
#define CACHE_SIZE 1024
#define LEAK_CAP (64L << 20)
#define LEAK_MAX 100000

void *cache[CACHE];
void *leaked[LEAK_MAX]; // external: the compiler may not elide the mallocs
long n_leaked, leaked_bytes;

__attribute__((noinline)) void *fill_cache(size_t size) {
    void *p = malloc(size);
    if (!p) exit(3);
    memset(p, 7, size);
    return p;
}

__attribute__((noinline)) void leak_more(size_t size) {
    if (leaked_bytes + (long)size > LEAK_CAP || n_leaked == LEAK_MAX) return;
    void *p = malloc(size);
    if (!p) exit(3);
    memset(p, 9, size);
    leaked[n_leaked++] = p;
    leaked_bytes += (long)size;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(void) {
    for (int i = 0; i < CACHE; i++) cache[i] = fill_cache(CACHE_SIZE);
    char msg[64];
    int n = snprintf(msg, sizeof msg, "ready %d\n", (int)getpid());
    write(1, msg, n);
    srand(1);
    int fast = 0;
    double next_leak = now();
    char line[64];
    size_t have = 0;
    for (;;) {
        struct pollfd p = {.fd = 0, .events = POLLIN};
        if (poll(&p, 1, 1) > 0) {
            ssize_t r = read(0, line + have, sizeof line - 1 - have);
            if (r <= 0) break; // stdin closed: done
            have += (size_t)r;
            line[have] = 0;
            if (strstr(line, "fast\n")) fast = 1;
            if (strchr(line, '\n') || have == sizeof line - 1) have = 0;
        }
        int k = rand() % CACHE;
        free(cache[k]);
        cache[k] = fill_cache(CACHE_SIZE);
        double t = now();
        if (t >= next_leak) {
            leak_more(fast ? 65536 : 64);
            next_leak = t + (fast ? 0.010 : 0.100);
        }
    }
    for (int i = 0; i < CACHE; i++) free(cache[i]);
    for (long i = 0; i < n_leaked; i++) free(leaked[i]);
    return 0;
}
