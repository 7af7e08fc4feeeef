// A program that confines itself with a seccomp filter making some system calls fail with
// EPERM — those the shim makes and the program does not (`prctl`, `process_vm_readv`,
// `sched_getaffinity`) — then allocates on 4 threads, checking errno around every malloc and
// free (helper H, 1: a successful malloc left errno EPERM). Each thread keeps 100 blocks of
// 1000 B (thread_blocks) once its 300,000 malloc/free pairs are done.
//
// Prints "ready PID 400 400000 BAD" (BAD: calls that changed errno) and waits for stdin to
// close.
//
// Build: cc -O1 -g -fno-optimize-sibling-calls -pthread seccomp_eperm.c
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))
#define THREADS 4

static int bad;
static void *kept[THREADS][100];

NOINLINE static void *thread_blocks(size_t n) {
    void *p = malloc(n);
    __asm__ volatile("" ::: "memory");
    return p;
}

static void *thread_main(void *arg) {
    void **mine = arg;
    void *v[64] = {0};
    for (int i = 0; i < 300000; i++) {
        int k = i % 64;
        errno = 4242;
        free(v[k]);
        if (errno != 4242)
            __atomic_fetch_add(&bad, 1, __ATOMIC_RELAXED);
        errno = 4343;
        v[k] = malloc(16 + i % 300);
        if (v[k] == NULL || errno != 4343)
            __atomic_fetch_add(&bad, 1, __ATOMIC_RELAXED);
    }
    for (int k = 0; k < 64; k++)
        free(v[k]);
    for (int i = 0; i < 100; i++)
        mine[i] = thread_blocks(1000);
    return NULL;
}

int main(void) {
    static const int denied[] = {SYS_prctl, SYS_process_vm_readv, SYS_sched_getaffinity};
    struct sock_filter f[8];
    int k = 0;
    f[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    for (int i = 0; i < 3; i++)
        f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, denied[i], 3 - i, 0);
    f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
    struct sock_fprog prog = {.len = (unsigned short)k, .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        perror("seccomp");
        return 1;
    }
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, thread_main, kept[i]);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    printf("ready %d 400 400000 %d\n", (int)getpid(), bad);
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}
