// A thread with a pending deferred cancel calls only functions that are no cancellation points
// (malloc, dlopen), then pthread_testcancel: POSIX says it gets there (helper N, 1: under the
// shim it was cancelled inside the shim's own `fallocate`/`open`, with a lock held, and the
// program hung). Argument: "malloc" or "dlopen". Prints "reached yes|NO", then "done".
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile int reached;
static const char *what;
void *volatile sink;

static void *worker(void *arg) {
    (void)arg;
    pthread_cancel(pthread_self()); // pending until the next cancellation point
    if (!strcmp(what, "malloc")) {
        for (int i = 0; i < 300000; i++) // kept: the allocations table must grow
            sink = malloc(32);
    } else if (!dlopen("libz.so.1", RTLD_NOW) && !dlopen("libm.so.6", RTLD_NOW)) {
        abort();
    }
    reached = 1;
    pthread_testcancel();
    return NULL;
}

int main(int argc, char **argv) {
    what = argc > 1 ? argv[1] : "malloc";
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    void *rv;
    pthread_join(t, &rv);
    printf("reached %s\n", reached ? "yes" : "NO");
    for (int i = 0; i < 300000; i++) // the main thread goes on allocating
        sink = malloc(48);
    printf("done %s\n", rv == PTHREAD_CANCELED ? "cancelled" : "not cancelled");
    return 0;
}
