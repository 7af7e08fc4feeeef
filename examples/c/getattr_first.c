// getattr_first: threads whose first allocator call is glibc's own, inside
// pthread_getattr_np(pthread_self()) — which holds the thread's descriptor lock while it
// reallocs its CPU set, as Ruby's, the JVM's and Rust std's new threads do first thing.
// Each of 4 threads then keeps 100 blocks of 1000 B from thread_blocks (called from
// thread_main). A thread that does not finish within 10 s (a deadlock) makes the program
// print "hung" and exit 2. Then prints "ready PID 400 400000" and waits for stdin to close.
// Expected live: 400 blocks, 400,000 B, through thread_blocks and thread_main.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define THREADS 4
#define BLOCKS 100
void *kept[THREADS][BLOCKS]; // external: the compiler may not elide the mallocs
size_t stack_size[THREADS];

__attribute__((noinline)) void thread_blocks(int k) {
    for (int i = 0; i < BLOCKS; i++) kept[k][i] = malloc(1000);
}

__attribute__((noinline)) void *thread_main(void *arg) {
    int k = (int)(long)arg;
    pthread_attr_t at;
    void *addr;
    if (pthread_getattr_np(pthread_self(), &at) == 0) {
        pthread_attr_getstack(&at, &addr, &stack_size[k]);
        pthread_attr_destroy(&at);
    }
    thread_blocks(k);
    __asm__ volatile("" ::: "memory"); /* keep the frame: no tail call */
    return NULL;
}

int main(void) {
    pthread_t t[THREADS];
    for (long k = 0; k < THREADS; k++) pthread_create(&t[k], NULL, thread_main, (void *)k);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 10;
    for (int k = 0; k < THREADS; k++) {
        if (pthread_timedjoin_np(t[k], NULL, &deadline) != 0) {
            printf("hung\n");
            fflush(stdout);
            _exit(2);
        }
        if (stack_size[k] == 0) {
            printf("no stack size\n");
            fflush(stdout);
            _exit(3);
        }
    }
    printf("ready %d %d %d\n", getpid(), THREADS * BLOCKS, THREADS * BLOCKS * 1000);
    fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
