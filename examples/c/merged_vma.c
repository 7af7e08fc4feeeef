// merged_vma: the program's own anonymous mapping in the same kernel memory area as one of
// glibc's mmapped chunks (a block of 256 KiB: above the mmap threshold). The kernel merges
// neighbouring anonymous mappings of the same protection into one area, so /proc/PID/maps
// shows one line for both. A block held only from the program's mapping is not leaked; one
// whose pointer was dropped is.
//
//   not leaked: make_held    40 B, pointed to only from the program's own page
//               make_big     256 KiB (the global g_big), and 24 B it points to (again for
//                            each big block kept in g_spare when its neighbours were taken)
//   leaked:     make_lost    56 B, pointer dropped: 1 direct
//
// Prints "ready PID PAGE CHUNK" (the program's page and the big block) and waits for stdin to
// close. Build with -fno-optimize-sibling-calls.
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void **g_big;
uintptr_t g_page_masked; // the page's address, kept where a scan cannot follow it
void *volatile sink;

void *g_spare[16]; // big blocks whose neighbours were taken (kept, not leaked)

__attribute__((noinline)) void make_big(void) {
    g_big = malloc(256 << 10);
    memset(g_big, 0, 256 << 10);
    g_big[100] = malloc(24);
    memset(g_big[100], 0, 24);
}

// A page of the program's own right below the big block's chunk mapping, or right above it:
// the kernel merges the two. When both neighbours are taken, another big block is tried (the
// first one kept).
__attribute__((noinline)) void **make_page(void) {
    for (int tries = 0; tries < 16; tries++) {
        // The mapping starts at the page of the block (16 bytes of glibc's chunk header before
        // it, and under heapdump 16 more of its block header).
        char *chunk = (char *)((uintptr_t)g_big & ~(uintptr_t)4095);
        size_t len = ((char *)g_big - chunk + (256 << 10) + 4095) & ~(size_t)4095;
        char *at[2] = {chunk - 4096, chunk + len};
        for (int i = 0; i < 2; i++) {
            void **page = mmap(at[i], 4096, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
            if (page != MAP_FAILED) return page;
        }
        g_spare[tries] = g_big;
        make_big();
    }
    fprintf(stderr, "no free page next to a big block\n");
    exit(2);
}

__attribute__((noinline)) void make_held(void **page) {
    page[7] = malloc(40);
    memset(page[7], 0, 40);
}

__attribute__((noinline)) void make_lost(void) {
    sink = malloc(56);
    memset((void *)sink, 0, 56);
    sink = NULL;
}

__attribute__((noinline)) void scrub(void) {
    volatile char buf[16384];
    memset((char *)buf, 0, sizeof buf);
}

int main(void) {
    make_big();
    void **page = make_page();
    make_held(page);
    make_lost();
    char msg[96];
    int n = snprintf(msg, sizeof msg, "ready %d %lx %lx\n", (int)getpid(), (unsigned long)page,
                     (unsigned long)g_big);
    g_page_masked = (uintptr_t)page ^ 0x5555555555555555u;
    page = NULL;
    scrub();
    write(1, msg, n);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
