// lost_buffers: a shared library for ctypes (Python) tests. lose_buffers(n, size) mallocs n
// buffers, fills them and drops every pointer (a C extension's true leak: nothing anywhere
// points to them). keep_buffer(size) mallocs one kept in the global g_kept (not leaked).
// Build with -shared -fPIC -fno-optimize-sibling-calls.
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

void *volatile lost_sink;
void *g_kept;

// Buffers near a 4 GiB boundary kept (not lost): see lose_one.
void *g_near[16];

// Whether [p, p + size) comes within 64 MiB of a multiple of 4 GiB.
static int near_boundary(void *p, size_t size) {
    unsigned long lo = (unsigned long)p & 0xffffffffUL;
    return lo < (64UL << 20) || lo + size > (1UL << 32) - (64UL << 20);
}

// A buffer near a multiple of 4 GiB (0x7f0900000000) is named by every word that holds a small
// int32 beside 4 bytes of a stale pointer's upper half (0x00007f09_00000001, a struct's
// padding), which a conservative scan cannot tell from a pointer: such a buffer is kept in
// g_near, and another one taken, so that the lost ones are named by nothing.
__attribute__((noinline)) void lose_one(size_t size) {
    for (int i = 0;; i++) {
        lost_sink = malloc(size);
        if (i < 16 && lost_sink && near_boundary((void *)lost_sink, size)) {
            g_near[i] = (void *)lost_sink;
            continue;
        }
        break;
    }
    memset((void *)lost_sink, 0x5a, size < 4096 ? size : 4096); // the first page: RSS stays small
    lost_sink = NULL;
}

// Scrubs the stack below the caller and allocates a little more, so that stale copies of the
// lost pointers (in dead stack slots, in the registers the next allocations save) do not keep
// the buffers "reachable" (a conservative scan cannot tell a stale copy from a pointer).
__attribute__((noinline)) void scrub(void) {
    volatile char buf[32768];
    memset((char *)buf, 0, sizeof buf);
    for (int i = 0; i < 8; i++) {
        lost_sink = malloc(16);
        free((void *)lost_sink);
    }
    lost_sink = NULL;
}

__attribute__((noinline)) void lose_deep(int n, size_t size) {
    for (int i = 0; i < n; i++) lose_one(size);
    scrub();
}

// The buffers are lost 64 KiB deeper than the caller's frame, where the interpreter's later
// calls do not reach (whatever the allocations left in dead stack slots stays below the
// stack pointer of the blocked thread, which is not scanned), and that space is scrubbed.
void lose_buffers(int n, size_t size) {
    volatile char pad[65536];
    pad[0] = 0;
    // Addresses the program never used: mmap places a mapping that fits no hole below the
    // lowest one, over the addresses of what was unmapped at the bottom (the interpreter's
    // freed chunks and arenas, whose stale pointers live objects and free memory still hold).
    // 1 GiB of address space reserved first (no access, no memory) takes that place; the
    // buffers' chunks go below it.
    static void *reserve;
    if (!reserve)
        reserve = mmap(NULL, 1UL << 30, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
    lose_deep(n, size);
    memset((char *)pad, 0, sizeof pad);
}

void keep_buffer(size_t size) {
    g_kept = malloc(size);
    memset(g_kept, 0x33, size);
}
