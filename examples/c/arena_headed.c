// A thread whose glibc arena holds only blocks above 112 bytes, which have the shim's header
// (helper O, 1): it keeps one 1,000-byte block (from a global), loses a 500-byte one, and
// frees a 200-byte block after filling it with copies of the lost one's address (stale words
// in a free chunk of the arena). The arena's heap is glibc's, not a root; the 500 bytes are
// leaked. Prints "ready PID 1 1000" and waits for stdin to close.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *held;
void *volatile sink; // the compiler may not elide the blocks or the stores into them

static void *thread_main(void *arg) {
    (void)arg;
    held = malloc(1000);
    void *lost = malloc(500);
    memset(lost, 1, 500);
    sink = lost;
    void *volatile *tmp = malloc(200);
    for (int i = 0; i < 25; i++)
        tmp[i] = lost;
    free((void *)tmp);
    sink = NULL;
    return NULL;
}

int main(void) {
    pthread_t t;
    pthread_create(&t, NULL, thread_main, NULL);
    pthread_join(t, NULL);
    printf("ready %d 1 1000\n", (int)getpid());
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}
