// known_allocs: allocates known blocks from known functions and keeps them live until stdin
// closes, so a snapshot can be compared with exactly what the program allocated.
//
//   alloc_small:  1000 x 1 KiB   (malloc)
//   alloc_medium:  100 x 64 KiB  (calloc)
//   alloc_large:    10 x 1 MiB   (malloc, then realloc from 512 KiB)
//
// Prints "ready PID" on stdout (with write(2), so stdio allocates nothing) when done.
// With the argument "leak" it exits without freeing them.
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <unistd.h>

static void *small[1000], *medium[100], *large[10];

__attribute__((noinline)) void alloc_small(void) {
    for (int i = 0; i < 1000; i++) { small[i] = malloc(1024); memset(small[i], 1, 1024); }
}

__attribute__((noinline)) void alloc_medium(void) {
    for (int i = 0; i < 100; i++) medium[i] = calloc(1, 64 * 1024);
}

__attribute__((noinline)) void alloc_large(void) {
    for (int i = 0; i < 10; i++) {
        void *p = malloc(512 * 1024);
        large[i] = realloc(p, 1024 * 1024);
        memset(large[i], 2, 1024 * 1024);
    }
}

int main(int argc, char **argv) {
    int leak = argc > 1 && strcmp(argv[1], "leak") == 0; // keep everything live at exit
    alloc_small();
    alloc_medium();
    alloc_large();
    char msg[64];
    int n = snprintf(msg, sizeof msg, "ready %d\n", (int)getpid());
    write(1, msg, n);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {}
    if (leak) return 0;
    for (int i = 0; i < 1000; i++) free(small[i]);
    for (int i = 0; i < 100; i++) free(medium[i]);
    for (int i = 0; i < 10; i++) free(large[i]);
    return 0;
}
