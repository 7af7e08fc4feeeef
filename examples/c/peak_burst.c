// peak_burst: a burst of 10 blocks of 1,000,000 B, all live at once, freed again within a
// few operations (fewer than the shim's 1024 between routine refreshes of the peak). Prints
// "ready PID" and waits for stdin to close.
// Expected: a live-bytes peak of at least 10,000,000 B.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *burst[10]; // external: the compiler may not elide the mallocs

int main(void) {
    for (int i = 0; i < 10; i++) {
        burst[i] = malloc(1000000);
        memset(burst[i], 1, 1000000);
    }
    for (int i = 0; i < 10; i++) free(burst[i]);
    printf("ready %d\n", getpid());
    fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
