// sizes: holds N blocks (argv[1], default 150000) of random sizes 64..2047 bytes from
// hold_blocks; prints "ready PID BLOCKS BYTES" and waits for stdin to close. Used to check the
// sampling mode's estimates against the truth.
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((noinline)) void hold_blocks(void **v, long n, size_t *bytes) {
    unsigned x = 2463534242u;
    for (long i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        size_t sz = 64 + x % 1984;
        v[i] = malloc(sz);
        *bytes += sz;
    }
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 150000;
    size_t bytes = 0;
    void **v = calloc(n, sizeof *v); // outside hold_blocks: not part of the tally
    hold_blocks(v, n, &bytes);
    char msg[96];
    int len = snprintf(msg, sizeof msg, "ready %d %ld %zu\n", (int)getpid(), n, bytes);
    write(1, msg, len);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {}
    for (long i = 0; i < n; i++) free(v[i]);
    free(v);
    return 0;
}
