// mixed: 8 threads mix malloc, calloc, realloc, free and posix_memalign for a while (long
// enough for snapshots to run during it), then keep a set of blocks. Prints "started PID",
// then after joining "ready PID BLOCKS BYTES" with the program's own tally of what its
// threads left live, and waits for stdin to close.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define THREADS 8
#define SLOTS 512
#define ROUNDS 300000

static void *slots[THREADS][SLOTS];
static size_t sizes[THREADS][SLOTS];

__attribute__((noinline)) static void *mixed_worker(void *arg) {
    long id = (long)arg;
    unsigned x = 777u + (unsigned)id * 7919u;
    for (int r = 0; r < ROUNDS; r++) {
        x = x * 1664525u + 1013904223u;
        int i = (x >> 9) % SLOTS;
        size_t sz = 1 + (x >> 18) % 2000;
        void *p = NULL;
        switch ((x >> 4) % 5) {
        case 0: free(slots[id][i]); p = malloc(sz); break;
        case 1: free(slots[id][i]); p = calloc(1, sz); break;
        case 2: p = realloc(slots[id][i], sz); if (!p) { sz = sizes[id][i]; p = slots[id][i]; } break;
        case 3: free(slots[id][i]); if (posix_memalign(&p, 64, sz)) p = NULL; break;
        default: free(slots[id][i]); p = NULL; sz = 0; break;
        }
        slots[id][i] = p;
        sizes[id][i] = p ? sz : 0;
    }
    return NULL;
}

int main(void) {
    char msg[96];
    int n = snprintf(msg, sizeof msg, "started %d\n", (int)getpid());
    write(1, msg, n);
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, mixed_worker, (void *)i);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    size_t blocks = 0, bytes = 0;
    for (int i = 0; i < THREADS; i++)
        for (int k = 0; k < SLOTS; k++)
            if (slots[i][k]) { blocks++; bytes += sizes[i][k]; }
    n = snprintf(msg, sizeof msg, "ready %d %zu %zu\n", (int)getpid(), blocks, bytes);
    write(1, msg, n);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {}
    for (int i = 0; i < THREADS; i++)
        for (int k = 0; k < SLOTS; k++) free(slots[i][k]);
    return 0;
}
