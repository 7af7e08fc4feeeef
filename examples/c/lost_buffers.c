// lost_buffers: a shared library for ctypes (Python) tests. lose_buffers(n, size) mallocs n
// buffers, fills them and drops every pointer (a C extension's true leak: nothing anywhere
// points to them). keep_buffer(size) mallocs one kept in the global g_kept (not leaked).
// Build with -shared -fPIC -fno-optimize-sibling-calls.
#include <stdlib.h>
#include <string.h>

void *volatile lost_sink;
void *g_kept;

__attribute__((noinline)) void lose_one(size_t size) {
    lost_sink = malloc(size);
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
    lose_deep(n, size);
    memset((char *)pad, 0, sizeof pad);
}

void keep_buffer(size_t size) {
    g_kept = malloc(size);
    memset(g_kept, 0x33, size);
}
