/*
 * bench/forkbig.c — fork() latency in a process holding many live blocks (issue 11).
 *
 *   usage: forkbig BLOCKS [FORKS]
 *
 * Allocates BLOCKS blocks of 16–64 B, then forks FORKS times (default 5); each child writes
 * the time it got control back from fork() into a pipe and exits at once. Prints
 * "blocks=N parent_ms=P child_ms=C": medians of the time fork() took to return in the parent,
 * and from the call to the child's first instruction after it.
 *
 * Build: cc -O2 -g -fno-omit-frame-pointer -o forkbig forkbig.c
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    int forks = argc > 2 ? atoi(argv[2]) : 5;
    if (n < 0 || forks < 1 || forks > 100)
        return 2;
    void **v = malloc((n + 1) * sizeof *v);
    uint64_t r = 88172645463325252ull;
    for (long i = 0; i < n; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        v[i] = malloc(16 + r % 49);
    }
    double parent[100], child[100];
    for (int k = 0; k < forks; k++) {
        int fd[2];
        if (pipe(fd) != 0)
            return 1;
        double t0 = now_ms();
        pid_t p = fork();
        if (p == 0) {
            double t = now_ms();
            if (write(fd[1], &t, sizeof t) != sizeof t)
                _exit(1);
            _exit(0);
        }
        double t1 = now_ms();
        double tc = 0;
        if (read(fd[0], &tc, sizeof tc) != sizeof tc)
            return 1;
        waitpid(p, NULL, 0);
        close(fd[0]);
        close(fd[1]);
        parent[k] = t1 - t0;
        child[k] = tc - t0;
    }
    qsort(parent, forks, sizeof *parent, cmp);
    qsort(child, forks, sizeof *child, cmp);
    printf("blocks=%ld parent_ms=%.2f child_ms=%.2f\n", n, parent[forks / 2], child[forks / 2]);
    return 0;
}
