// quick_exit: allocates a block, then leaves through quick_exit(3), which skips atexit
// handlers (the shim's among them) but runs at_quick_exit ones. Exits with status 3.
#include <stdio.h>
#include <stdlib.h>

void *block; // external: the compiler may not elide the malloc

static void bye(void) { puts("at_quick_exit ran"); fflush(stdout); }

int main(void) {
    block = malloc(100);
    at_quick_exit(bye);
    quick_exit(3);
}
