// sizes: holds N blocks (argv[1], default 150000) of random sizes 64..2047 bytes from
// hold_blocks; prints "ready PID BLOCKS BYTES" and waits for stdin to close. Used to check the
// sampling mode's estimates against the truth. With "churn" as argv[2], hold_blocks also frees
// a block for each one it keeps, and reallocates or callocs some of the kept ones: the blocks
// held are the same in number, of other sizes (the tally is what is held).
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int churn;

__attribute__((noinline)) void hold_blocks(void **v, long n, size_t *bytes) {
    unsigned x = 2463534242u;
    for (long i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        size_t sz = 64 + x % 1984;
        v[i] = malloc(sz);
        if (churn) {
            size_t other = 64 + (x >> 11) % 1984;
            void *gone = malloc(other);
            *(volatile char *)gone = 1;
            free(gone);
            switch ((x >> 24) & 3) {
            case 0: // moved or resized in place
                v[i] = realloc(v[i], other);
                sz = other;
                break;
            case 1: // freed, and a zeroed block kept instead
                free(v[i]);
                v[i] = calloc(1, other);
                sz = other;
                break;
            default:
                break;
            }
        }
        *bytes += sz;
    }
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 150000;
    churn = argc > 2 && argv[2][0] == 'c';
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
