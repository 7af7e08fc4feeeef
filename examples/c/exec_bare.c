// exec_bare: allocates, then execs `sleep 2` with an empty environment, so the new image runs
// without the shim (as a static binary or a cleared environment would). The region of the
// image before exec is left behind: `heapdump list` shows it as exited and `heapdump gc`
// removes it. Prints "ready PID" before the exec.
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void *block; // external: the compiler may not elide the malloc

int main(void) {
    block = malloc(100);
    char msg[64];
    int n = snprintf(msg, sizeof msg, "ready %d\n", (int)getpid());
    write(1, msg, n);
    char *env[] = {NULL};
    execle("/bin/sleep", "sleep", "2", (char *)NULL, env);
    return 1;
}
