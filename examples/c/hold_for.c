// hold_for: allocates 100 blocks of 1000 bytes from hold(), then sleeps argv[1] seconds
// (default 4) and exits: a service a launcher starts in the background.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *held[100];

__attribute__((noinline)) void hold(void) {
    for (int i = 0; i < 100; i++) {
        held[i] = malloc(1000);
        memset(held[i], 1, 1000);
    }
}

int main(int argc, char **argv) {
    hold();
    sleep(argc > 1 ? atoi(argv[1]) : 4);
    return 0;
}
