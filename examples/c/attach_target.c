/* A program for `heapdump attach` tests, started WITHOUT the shim. It allocates 1,110 blocks it
 * keeps (1,100 small ones whose usable size equals the request, 10 of their own mapping),
 * allocates and frees 60 more, alternately of 120 and 968 bytes (free chunks among the kept
 * ones: in the per-thread cache, fastbins and the unsorted bin), and plants a leak of 1,000
 * bytes (the pointer is dropped). Then it prints, with no allocation after mallinfo2:
 *   ready PID KEPT KEPT_BYTES LEAK_ADDRESS
 *   mallinfo UORDBLKS HBLKHD HBLKS
 *   held ADDR...      (the kept blocks)
 *   freed ADDR...     (the freed ones)
 * and reads one-letter commands from stdin (read(2): no stdio buffer is allocated):
 *   m  allocate 100 more blocks in make_more() (sizes 100..199), kept; prints "more ADDR..."
 *   f  free the first 10 kept blocks; prints "freed10"
 *   s  start a thread that fills stderr (a pipe nobody reads) and then calls malloc_stats(),
 *      which blocks writing to it while it holds the main arena's lock: a thread stuck in
 *      the allocator; prints "stuck"
 *   q  exit(0)
 * stdout is unbuffered (no buffer allocated). Build with -fno-optimize-sibling-calls. */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KEPT 1110
static void *held[KEPT];
static void *more[100];
static void *freed[60];

__attribute__((noinline)) static void plant_leak(unsigned long *where) {
    char *p = malloc(1000);
    memset(p, 'L', 1000);
    *where = (unsigned long)p ^ 0x5555555555555555ul; /* not a pointer any more */
}

__attribute__((noinline)) static void make_more(void) {
    for (int i = 0; i < 100; i++) {
        more[i] = malloc(100 + i);
        memset(more[i], 1, 100 + i);
    }
}

static void *stuck(void *arg) {
    (void)arg;
    char buf[4096];
    memset(buf, 's', sizeof buf);
    int fl = fcntl(2, F_GETFL);
    fcntl(2, F_SETFL, fl | O_NONBLOCK);
    while (write(2, buf, sizeof buf) > 0 || errno == EINTR) {
    }
    fcntl(2, F_SETFL, fl);
    malloc_stats(); /* blocks in its fprintf(stderr), holding the arena lock */
    return NULL;
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    unsigned long bytes = 0, leak = 0;
    for (int i = 0; i < KEPT; i++) {
        size_t n = i < 1100 ? 24 + 16 * (i % 40) : 49 * 4096 - 16;
        held[i] = malloc(n);
        memset(held[i], 0, n);
        bytes += n;
        if (i % 20 == 0 && i / 20 < 60) {
            freed[i / 20] = malloc((i / 20) % 2 ? 968 : 120);
        }
    }
    plant_leak(&leak);
    for (int i = 0; i < 60; i++) {
        free(freed[i]);
    }
    struct mallinfo2 mi = mallinfo2();
    printf("ready %d %d %lu %#lx\n", (int)getpid(), KEPT, bytes, leak ^ 0x5555555555555555ul);
    printf("mallinfo %zu %zu %zu\n", mi.uordblks, mi.hblkhd, mi.hblks);
    printf("held");
    for (int i = 0; i < KEPT; i++) printf(" %#lx", (unsigned long)held[i]);
    printf("\nfreed");
    for (int i = 0; i < 60; i++) printf(" %#lx", (unsigned long)freed[i]);
    printf("\n");
    leak = 0;
    char c;
    errno = 77; /* 'e' prints it: an attach or detach must leave it as it was */
    while (read(0, &c, 1) == 1) {
        if (c == 'e') {
            int e = errno;
            printf("errno %d\n", e);
            errno = 77;
        } else if (c == 'm') {
            make_more();
            printf("more");
            for (int i = 0; i < 100; i++) printf(" %#lx", (unsigned long)more[i]);
            printf("\n");
        } else if (c == 'f') {
            for (int i = 0; i < 10; i++) free(held[i]);
            printf("freed10\n");
        } else if (c == 's') {
            pthread_t t;
            pthread_create(&t, NULL, stuck, NULL);
            usleep(200000);
            printf("stuck\n");
        } else if (c == 'q') {
            exit(0);
        }
    }
    return 0;
}
