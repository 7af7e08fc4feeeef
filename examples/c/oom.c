// oom: grows its heap 1 MiB at a time from grow(), touching every page, until the kernel's
// OOM killer ends it (run it in a memory-limited cgroup).
#include <stdlib.h>
#include <string.h>

static void *blocks[1 << 16];

__attribute__((noinline)) void *grow(void) {
    void *p = malloc(1 << 20);
    if (p) memset(p, 1, 1 << 20);
    return p;
}

int main(void) {
    for (int i = 0; i < (1 << 16); i++) blocks[i] = grow();
    return 1; // not reached under a memory limit
}
