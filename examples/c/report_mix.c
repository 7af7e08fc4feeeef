// report_mix: three kinds of memory over time, for `heapdump report`'s growth ranking.
//   cache_put: a steady cache of 20,000 blocks of 64 B, 200 of them replaced at random every
//              10 ms (the same size: its live bytes stay flat);
//   leak_some: a slow leak, 50 blocks of 128 B every 10 ms, never freed (6,400 B per tick);
//   burst:     1 MiB each second (at a random moment of it), freed 100 ms later.
// Prints "ready PID" once the cache is full, then runs until killed or stdin closes.
// Build with -fno-optimize-sibling-calls so each function keeps its frame.
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CACHE 20000

static void *cache[CACHE];
// Where the leak keeps its blocks (global, so the compiler cannot drop the stores; reachable:
// `leaks` would not call them leaked; a leak of the
// "forgotten in a list" kind): room for 200 s of leaking.
#define LEAKED (1 << 20)
void *leaked[LEAKED];
size_t nleaked;

__attribute__((noinline)) void *cache_put(void) {
    void *p = malloc(64);
    memset(p, 1, 64);
    return p;
}

__attribute__((noinline)) void leak_some(void) {
    for (int i = 0; i < 50 && nleaked < LEAKED; i++) leaked[nleaked++] = malloc(128);
}

__attribute__((noinline)) void *burst(void) {
    void *p = malloc(1 << 20);
    memset(p, 2, 1 << 20);
    return p;
}

int main(void) {
    srand(42);
    for (int i = 0; i < CACHE; i++) cache[i] = cache_put();
    char msg[64];
    int n = snprintf(msg, sizeof msg, "ready %d\n", (int)getpid());
    if (write(1, msg, n) != n) return 1;
    void *b = NULL;
    unsigned burst_at = 0;
    for (unsigned tick = 0;; tick++) {
        for (int i = 0; i < 200; i++) {
            int k = rand() % CACHE;
            free(cache[k]);
            cache[k] = cache_put();
        }
        leak_some();
        // Once a cycle of 100 ticks (about a second), at a random tick: a cycle as long as
        // watch's beat would keep the burst in the same phase of every beat, and a slow drift
        // would make it look like a step up.
        if (tick % 100 == 0) burst_at = tick + (unsigned)(rand() % 90);
        if (tick == burst_at) b = burst();
        if (b != NULL && tick == burst_at + 10) {
            free(b);
            b = NULL;
        }
        // 10 ms, or stdin closed: end.
        struct pollfd pfd = {.fd = 0, .events = POLLIN};
        if (poll(&pfd, 1, 10) > 0) {
            char c;
            if (read(0, &c, 1) <= 0) break;
        }
    }
    return 0;
}
