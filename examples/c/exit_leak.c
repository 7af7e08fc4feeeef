// exit_leak: leaks 10 blocks of 1000 bytes from leak_at_exit and returns from main (for
// exit_wait.c, which holds the process inside exit()).
#include <stdlib.h>
#include <string.h>

static void *volatile sink;

__attribute__((noinline)) void leak_at_exit(void) {
    for (int i = 0; i < 10; i++) {
        sink = malloc(1000);
        memset(sink, 0, 1000);
    }
    sink = 0;
}

int main(void) {
    leak_at_exit();
    return 0;
}
