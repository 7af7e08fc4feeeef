// hold_many N SIZE: allocates N blocks of SIZE bytes, writes to each, and exits 0 without
// freeing them (so a kept region shows N live blocks). Prints "done N" at the end.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void **blocks; // external: the compiler may not elide the mallocs that fill it

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 500000;
    size_t size = argc > 2 ? (size_t)atol(argv[2]) : 24;
    blocks = calloc((size_t)n, sizeof *blocks);
    if (!blocks) return 2;
    for (long i = 0; i < n; i++) {
        blocks[i] = malloc(size);
        if (!blocks[i]) return 3;
        memset(blocks[i], 1, size);
    }
    printf("done %ld\n", n);
    return 0;
}
