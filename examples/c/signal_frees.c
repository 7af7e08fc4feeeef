// signal_frees: allocator calls made by a signal handler that interrupts the program's own
// malloc/free (and so, under the shim, its recording). make_victims allocates 64 blocks of
// 200 B; then the main thread loops malloc(64)/free while a SIGALRM every 200 µs frees one
// victim per run and, in its first 40 runs, keeps a new 333 B block (on_alarm). When the
// handler has run 64 times, prints "ready PID" and waits for stdin to close.
// Expected live: 40 blocks of 333 B from on_alarm, none of 200 B from make_victims.
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

void *victims[64]; // external: the compiler may not elide the mallocs that fill them
void *kept[40];
volatile sig_atomic_t runs;
void *volatile sink;

__attribute__((noinline)) void on_alarm(int sig) {
    (void)sig;
    int k = runs;
    if (k >= 64) return;
    free(victims[k]);
    victims[k] = NULL;
    if (k < 40) kept[k] = malloc(333);
    runs = k + 1;
}

__attribute__((noinline)) void make_victims(void) {
    for (int i = 0; i < 64; i++) victims[i] = malloc(200);
}

int main(void) {
    make_victims();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 200}, {0, 200}};
    setitimer(ITIMER_REAL, &it, NULL);
    while (runs < 64) {
        void *p = malloc(64);
        sink = p;
        free(p);
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    char msg[64];
    int n = snprintf(msg, sizeof msg, "ready %d\n", (int)getpid());
    write(1, msg, n);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
