// threads: 4 threads allocate and free with malloc/calloc/realloc/free, then each keeps a known
// set of live blocks. After joining, prints "ready PID BLOCKS BYTES" (the program's own tally of
// what its threads left live) and waits for stdin to close.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define THREADS 4
#define ROUNDS 20000
#define KEEP 250

static void *kept[THREADS][KEEP];
static size_t kept_bytes[THREADS];

__attribute__((noinline)) static void *worker(void *arg) {
    long id = (long)arg;
    unsigned x = 12345u + (unsigned)id;
    void *scratch[64] = {0};
    for (int r = 0; r < ROUNDS; r++) {
        x = x * 1103515245u + 12345u;
        int i = (x >> 8) % 64;
        size_t sz = 16 + (x >> 16) % 4096;
        switch (r % 3) {
        case 0: free(scratch[i]); scratch[i] = malloc(sz); break;
        case 1: scratch[i] = realloc(scratch[i], sz); break;
        default: free(scratch[i]); scratch[i] = calloc(1, sz); break;
        }
    }
    for (int i = 0; i < 64; i++) free(scratch[i]);
    for (int k = 0; k < KEEP; k++) {
        size_t sz = 100 + id * 10 + k;
        kept[id][k] = malloc(sz);
        kept_bytes[id] += sz;
    }
    return NULL;
}

int main(void) {
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    size_t bytes = 0;
    for (int i = 0; i < THREADS; i++) bytes += kept_bytes[i];
    char msg[96];
    int n = snprintf(msg, sizeof msg, "ready %d %d %zu\n", (int)getpid(), THREADS * KEEP, bytes);
    write(1, msg, n);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {}
    for (int i = 0; i < THREADS; i++)
        for (int k = 0; k < KEEP; k++) free(kept[i][k]);
    return 0;
}
