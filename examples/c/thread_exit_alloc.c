// thread_exit_alloc: 4 threads each set a pthread key whose destructor, run at the thread's
// exit (in its third round, after the shim's own exit handler), keeps a 555-byte block
// from at_thread_exit_alloc. Prints "ready PID" once the threads are joined and waits for
// stdin to close.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static pthread_key_t key;
void *kept[4];

__attribute__((noinline)) void *at_thread_exit_alloc(void) { return malloc(555); }

// glibc calls key destructors in rounds, in the order the keys were made: set again, this one
// runs once more in the next round, after the shim's (made first) has run.
static __thread int rounds;
static void on_exit_of_thread(void *v) {
    if (rounds++ < 2) {
        pthread_setspecific(key, v);
        return;
    }
    kept[(long)v - 1] = at_thread_exit_alloc();
}

static void *volatile sink;

static void *run(void *v) {
    sink = malloc(10); // the thread records, so the shim's exit handler runs for it
    free(sink);
    pthread_setspecific(key, v);
    return NULL;
}

int main(void) {
    pthread_key_create(&key, on_exit_of_thread);
    pthread_t t[4];
    for (long i = 0; i < 4; i++) pthread_create(&t[i], NULL, run, (void *)(i + 1));
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
