// churn: N threads each keep K blocks of SIZE bytes from churn_alloc, replacing them at full
// speed by "allocate the new block, then free the old one". At every instant the live blocks
// from churn_alloc number between N*K and N*K+N. Prints "ready PID" once every thread has its
// K blocks, churns until stdin closes, then frees everything and exits.
//   usage: churn N K [SIZE]
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int K;
static size_t SIZE = 48;
static atomic_int filled, stop;

__attribute__((noinline)) void *churn_alloc(void) { return malloc(SIZE); }

static void *worker(void *arg) {
    (void)arg;
    void **slots = calloc(K, sizeof(void *));
    for (int i = 0; i < K; i++) slots[i] = churn_alloc();
    atomic_fetch_add(&filled, 1);
    for (unsigned long i = 0; !atomic_load_explicit(&stop, memory_order_relaxed); i++) {
        int k = i % K;
        void *fresh = churn_alloc();
        free(slots[k]);
        slots[k] = fresh;
    }
    for (int i = 0; i < K; i++) free(slots[i]);
    free(slots);
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 2;
    K = argc > 2 ? atoi(argv[2]) : 50000;
    if (argc > 3) SIZE = strtoul(argv[3], NULL, 10);
    pthread_t *t = calloc(n, sizeof *t);
    for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, worker, NULL);
    while (atomic_load(&filled) < n) usleep(1000);
    char msg[64];
    int len = snprintf(msg, sizeof msg, "ready %d\n", (int)getpid());
    write(1, msg, len);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {}
    atomic_store(&stop, 1);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    free(t);
    return 0;
}
