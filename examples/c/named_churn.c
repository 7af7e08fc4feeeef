/*
 * examples/c/named_churn.c — named snapshots and "born since" (collector/tests/moments.rs).
 *
 * A cache of POOL entries (64 B each, allocated by make_entry) churns: each of ROUNDS steps
 * allocates an entry and frees it again, except every 1000th, which is kept ("leaked") while
 * one old cache entry is freed instead — so the number and bytes of live entries never change
 * (a stack-level diff of two moments shows nothing), yet LEAKS new entries are left behind.
 *
 *   1. POOL entries; heapdump_take_named_snapshot("before")
 *   2. ROUNDS churn steps (ROUNDS / 1000 leaks); heapdump_take_named_snapshot("after")
 *   3. everything freed (the named snapshots must come from the records the shim kept)
 *   4. "ready PID" on stdout; then per input line "more": 5 new entries, "done" on stdout;
 *      exit at end of input.
 *
 * With NAMED_COST=1 it also times 200 calls of heapdump_take_named_snapshot("cost") and
 * prints "cost NS" (ns per call) before "ready".
 *
 * Build: cc -O1 -g -fno-omit-frame-pointer -fno-optimize-sibling-calls -I instrumentation/include
 */
#include "heapdump.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define POOL 2000
#define ROUNDS 100000

__attribute__((noinline)) void *make_entry(void) {
    void *p = malloc(64);
    memset(p, 0x5a, 64);
    return p;
}

static void *pool[POOL];
static void *leaked[ROUNDS / 1000];
static void *more[1000];

int main(void) {
    for (int i = 0; i < POOL; i++)
        pool[i] = make_entry();
    if (!heapdump_take_named_snapshot("before"))
        fprintf(stderr, "named_churn: not running under heapdump\n");
    int nleaked = 0, victim = 0;
    for (int i = 0; i < ROUNDS; i++) {
        void *p = make_entry();
        if (i % 1000 == 999) {
            leaked[nleaked++] = p;
            free(pool[victim]);
            pool[victim++] = NULL;
        } else {
            free(p);
        }
    }
    heapdump_take_named_snapshot("after");
    for (int i = 0; i < POOL; i++)
        free(pool[i]);
    for (int i = 0; i < nleaked; i++)
        free(leaked[i]);
    if (getenv("NAMED_COST")) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int i = 0; i < 200; i++)
            heapdump_take_named_snapshot("cost");
        clock_gettime(CLOCK_MONOTONIC, &b);
        printf("cost %.0f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / 200);
    }
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    char line[64];
    int nmore = 0;
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "more", 4) == 0) {
            for (int k = 0; k < 5 && nmore < 1000; k++)
                more[nmore++] = make_entry();
            printf("done\n");
            fflush(stdout);
        }
    }
    return 0;
}
