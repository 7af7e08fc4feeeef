// shim_memory: how much of the program's own heap (glibc's mallinfo2().uordblks) the
// program uses, at three moments: with 100 threads alive that each allocated once ("threads"),
// after they exited through a TLS destructor that allocates ("joined"), and after dlopening
// the N libraries named on the command line ("dlopened"). Prints "heap MOMENT BYTES" lines.
// Under the shim the numbers must stay those of the bare program: the shim's own memory
// (unwinder caches, object lists) must not come from the program's heap, nor grow with
// every dlopen.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 100

static pthread_key_t key;
static pthread_barrier_t ready, go;
void *volatile sink;

static void destructor(void *v) {
    free(v);
    sink = malloc(32); // allocates after the shim's own thread-exit handler ran
    free(sink);
}

static void *worker(void *arg) {
    (void)arg;
    void *p = malloc(100);
    pthread_setspecific(key, p);
    pthread_barrier_wait(&ready);
    pthread_barrier_wait(&go);
    return NULL;
}

static void report(const char *moment) {
    struct mallinfo2 mi = mallinfo2();
    printf("heap %s %zu\n", moment, mi.uordblks);
    fflush(stdout);
}

int main(int argc, char **argv) {
    pthread_key_create(&key, destructor);
    pthread_barrier_init(&ready, NULL, THREADS + 1);
    pthread_barrier_init(&go, NULL, THREADS + 1);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, NULL);
    pthread_barrier_wait(&ready);
    report("threads");
    pthread_barrier_wait(&go);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    report("joined");
    for (int i = 1; i < argc; i++) {
        if (!dlopen(argv[i], RTLD_NOW)) {
            fprintf(stderr, "%s\n", dlerror());
            return 1;
        }
        sink = malloc(16); // an allocation (and a stack walk) between two dlopens
        free(sink);
    }
    report("dlopened");
    return 0;
}
