// sparse_root: reserves 16 GiB of address space (MAP_NORESERVE, read-write) and touches one
// page of it, 8 GiB in, where it keeps the only pointer to a block from keep_block (64 bytes);
// loses a block from lose_block (48 bytes). Prints "ready PID" and waits for stdin to close.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void *volatile lost;

__attribute__((noinline)) void *keep_block(void) {
    void *p = malloc(64);
    memset(p, 1, 64);
    return p;
}

__attribute__((noinline)) void lose_block(void) {
    lost = malloc(48);
    memset(lost, 2, 48);
    lost = 0;
}

int main(void) {
    size_t size = (size_t)16 << 30;
    char *m = mmap(0, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) return 2;
    void **slot = (void **)(m + ((size_t)8 << 30) + 128);
    *slot = keep_block();
    lose_block();
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {}
    return 0;
}
