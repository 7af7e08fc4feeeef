// subreaper_exec: a child subreaper (as tini, dumb-init, a container's PID 1 or a supervisor
// is) forks N children that each exec `sh -c 'exit 7'`, then reaps with wait() until ECHILD.
// Under the shim it must see exactly its own N children, each with status 7: before helper
// N, 5 was fixed, every successful exec left the shim's helper process reparented here.
// Prints "reaped MINE UNKNOWN" and exits with UNKNOWN.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 3;
    if (n < 1 || n > 64) return 2;
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) return 2;
    pid_t kids[64];
    for (int i = 0; i < n; i++) {
        kids[i] = fork();
        if (kids[i] < 0) return 2;
        if (kids[i] == 0) {
            execl("/bin/sh", "sh", "-c", "exit 7", (char *)NULL);
            _exit(127);
        }
    }
    int mine = 0, unknown = 0, st;
    for (;;) {
        pid_t r = wait(&st);
        if (r < 0) {
            if (errno == EINTR) continue;
            break; // ECHILD
        }
        int ours = 0;
        for (int i = 0; i < n; i++) ours |= kids[i] == r;
        if (ours && WIFEXITED(st) && WEXITSTATUS(st) == 7) {
            mine++;
        } else {
            unknown++;
            printf("unknown child %d, status %d\n", (int)r, st);
        }
    }
    printf("reaped %d %d\n", mine, unknown);
    return unknown;
}
