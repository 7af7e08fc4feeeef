// undumpable: keeps a secret in a heap block, then makes itself not dumpable
// (prctl(PR_SET_DUMPABLE, 0), as ssh-agent and gpg-agent do, and as a daemon that drops its
// privileges becomes): its own user can no longer read its memory through /proc. Prints
// "ready PID" and waits for stdin to close.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

char *volatile secret;

int main(int argc, char **argv) {
    secret = malloc(64);
    strcpy(secret, "UNDUMPABLE-SECRET-7c1e");
    if (argc < 2 || strcmp(argv[1], "dumpable") != 0) prctl(PR_SET_DUMPABLE, 0);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
