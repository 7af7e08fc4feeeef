// thread_fork: a worker thread (not the main one) forks; the child allocates 100 x 100 B from
// child_alloc_in_thread, prints "ready PID" and waits for stdin to close.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void *kept[100];

__attribute__((noinline)) void child_alloc_in_thread(void) {
    for (int i = 0; i < 100; i++) kept[i] = malloc(100);
}

static void *worker(void *arg) {
    (void)arg;
    pid_t pid = fork();
    if (pid == 0) {
        child_alloc_in_thread();
        char msg[64];
        int n = snprintf(msg, sizeof msg, "ready %d\n", (int)getpid());
        write(1, msg, n);
        char buf[16];
        while (read(0, buf, sizeof buf) > 0) {}
        for (int i = 0; i < 100; i++) free(kept[i]);
        exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    return NULL;
}

int main(void) {
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    pthread_join(t, NULL);
    return 0;
}
