/*
 * bench/nop.c — a program that allocates almost nothing: its peak RSS with and without the
 * shim is the shim's fixed cost (bench/run.py, "Fixed footprint").
 *
 *   usage: nop [ignored]
 *
 * Makes one small allocation, writes "ready PID\n" with write(2), and waits until stdin is
 * closed (EOF), so the harness can read its VmHWM from /proc/PID/status.
 *
 * Build: cc -O2 -o nop nop.c
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(void) {
    char *p = malloc(100);
    if (!p) return 1;
    int n = snprintf(p, 100, "ready %d\n", (int)getpid());
    if (write(1, p, (size_t)n) != n) return 1;
    free(p);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
