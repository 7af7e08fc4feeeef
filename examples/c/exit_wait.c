// exit_wait: a library (LD_PRELOAD after libheapdump.so) whose constructor registers an exit
// handler before the shim registers its own, so that it runs after the shim's: it prints
// "exiting PID" and waits for stdin to close, the process alive inside exit().
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void wait_at_exit(void) {
    char msg[64];
    int n = snprintf(msg, sizeof msg, "exiting %d\n", (int)getpid());
    write(1, msg, n);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {}
}

__attribute__((constructor)) static void early(void) { atexit(wait_at_exit); }
