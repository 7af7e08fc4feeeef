// `reallocarray` of a block another allocator made (helper N, 3: jemalloc preloaded ahead of
// the shim owns malloc and realloc but has no reallocarray, which resolved to the shim's and
// handed jemalloc's block to glibc: "realloc(): invalid pointer"). Prints "ok".
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    int *p = malloc(10 * sizeof *p);
    if (!p)
        return 2;
    p = reallocarray(p, 1000, sizeof *p);
    if (!p)
        return 3;
    p[999] = 1;
    free(p);
    puts("ok");
    return 0;
}
