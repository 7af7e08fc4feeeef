// late_atexit: registers, after the shim started recording, an atexit handler that allocates
// 3 blocks of 123 B (at_exit_alloc) and frees the 5 blocks of 45 B main kept; then exits
// normally. With HEAPDUMP_KEEP=1 the kept region must show what was live at the very end:
// the 3 blocks and none of the 5.
#include <stdlib.h>

void *late[3], *early[5]; // external: the compiler may not elide the mallocs

__attribute__((noinline)) void at_exit_alloc(void) {
    for (int i = 0; i < 3; i++) late[i] = malloc(123);
    for (int i = 0; i < 5; i++) free(early[i]);
}

int main(void) {
    for (int i = 0; i < 5; i++) early[i] = malloc(45);
    atexit(at_exit_alloc);
    return 0;
}
