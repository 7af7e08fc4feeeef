/*
 * bench/nop.c — a program that allocates almost nothing: its peak RSS with and without the
 * shim is the shim's fixed cost (bench/run.py, "Fixed footprint").
 *
 * Build: cc -O2 -o nop nop.c
 */
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    char *p = malloc(100);
    if (!p) return 1;
    snprintf(p, 100, "%d", 42);
    free(p);
    return 0;
}
