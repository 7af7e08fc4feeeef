// small_stacks: allocation on the smallest stacks a program may use; the shim must fit in
// what glibc's own malloc leaves (helper P, 1: each mode ran off its stack under the shim).
//
//   threads  8 threads made with PTHREAD_STACK_MIN (16 KiB) format a line and strdup it;
//            prints "threads ok LINE" (exit 0)
//   crash    a crash reporter: a SIGSEGV handler on a SIGSTKSZ alternate stack (a heap
//            block) prints a backtrace with backtrace_symbols (which allocates) and exits 3
//   handler  4 threads whose first allocation is a signal handler's, on an 8 KiB alternate
//            stack that is a heap block; prints "handler ok N" (exit 0)
#define _GNU_SOURCE
#include <execinfo.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *lines[8];

static void *format_line(void *a) {
    char buf[256];
    snprintf(buf, sizeof buf, "worker %ld: %f", (long)a, 3.14159 * (long)a);
    lines[(long)a] = strdup(buf);
    return NULL;
}

static int threads(void) {
    pthread_attr_t at;
    pthread_attr_init(&at);
    if (pthread_attr_setstacksize(&at, PTHREAD_STACK_MIN)) return 2;
    pthread_t t[8];
    for (long i = 0; i < 8; i++)
        if (pthread_create(&t[i], &at, format_line, (void *)i)) return 2;
    for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
    printf("threads ok %s\n", lines[7]);
    return 0;
}

static void on_segv(int s) {
    (void)s;
    void *f[64];
    int n = backtrace(f, 64);
    char **sym = backtrace_symbols(f, n); // allocates
    dprintf(1, "crash: %d frames, first %s\n", n, sym ? sym[0] : "?");
    _exit(3);
}

static int crash(void) {
    size_t size = SIGSTKSZ;
    stack_t st = {.ss_sp = malloc(size), .ss_size = size};
    if (!st.ss_sp || sigaltstack(&st, NULL)) return 2;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_segv;
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGSEGV, &sa, NULL);
    char *keep = malloc(1000);
    strcpy(keep, "crashing");
    puts(keep);
    fflush(stdout);
    volatile int *volatile p = NULL;
    *p = 1;
    return 0;
}

#define N 4
static void *alt[N];
static volatile int ready[N], got[N];
static void *volatile node[N];
static __thread int me;

static void on_usr1(int s) {
    (void)s;
    node[me] = malloc(48);
    got[me] = 1;
}

static void *wait_for_signal(void *a) {
    me = (int)(long)a;
    stack_t st = {.ss_sp = alt[me], .ss_size = 8192};
    sigaltstack(&st, NULL);
    ready[me] = 1;
    while (!got[me]) {
    }
    return NULL;
}

static int handler(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGUSR1, &sa, NULL);
    pthread_t t[N];
    for (long i = 0; i < N; i++) {
        alt[i] = malloc(8192);
        if (pthread_create(&t[i], NULL, wait_for_signal, (void *)i)) return 2;
    }
    for (int i = 0; i < N; i++) {
        while (!ready[i]) {
        }
        pthread_kill(t[i], SIGUSR1);
    }
    for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
    int n = 0;
    for (int i = 0; i < N; i++) n += node[i] != NULL;
    printf("handler ok %d\n", n);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    if (!strcmp(argv[1], "threads")) return threads();
    if (!strcmp(argv[1], "crash")) return crash();
    if (!strcmp(argv[1], "handler")) return handler();
    return 2;
}
