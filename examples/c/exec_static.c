// exec_static: children that exec a static binary (argv[1], which cannot load the shim), one
// through each of execl, execv and execvp, and one whose exec fails. The region of a child
// is set aside (PID-*.heapdump.exec, for `heapdump gc` or the next process that starts
// recording to remove) once its exec succeeded, and still be there (the same file, under its
// own name) after one failed.
//
// The failing child looks for its own region in $HEAPDUMP_DIR after the failed execv and
// prints "failed-exec PID ERRNO FOUND ASIDE": FOUND is 1 when PID-*.heapdump exists, ASIDE the
// number of its own PID-*.exec files. Then the parent prints "ready PID" and waits for stdin to close.
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

void *volatile sink;

static void count_own(int *found, int *aside) {
    *found = *aside = 0;
    const char *dir = getenv("HEAPDUMP_DIR");
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d) return;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%d-", (int)getpid());
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && n > 9 &&
            strcmp(e->d_name + n - 9, ".heapdump") == 0)
            (*found)++;
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && n > 5 &&
            strcmp(e->d_name + n - 5, ".exec") == 0)
            (*aside)++;
    }
    closedir(d);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *bin = argv[1];
    sink = malloc(100);
    for (int i = 0; i < 4; i++) {
        pid_t p = fork();
        if (p < 0) return 2;
        if (p > 0) {
            int st;
            waitpid(p, &st, 0);
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                fprintf(stderr, "child %d: status %d\n", i, st);
                return 1;
            }
            continue;
        }
        sink = malloc(200); // the child records into its own region
        char *args[] = {(char *)bin, NULL};
        switch (i) {
        case 0:
            execl(bin, bin, (char *)NULL);
            break;
        case 1:
            execv(bin, args);
            break;
        case 2:
            execvp(bin, args);
            break;
        default: {
            char *missing[] = {"/nonexistent/heapdump-no-such-program", NULL};
            execv(missing[0], missing);
            int err = errno, found, aside;
            sink = malloc(300); // still recording, into the restored region
            count_own(&found, &aside);
            printf("failed-exec %d %d %d %d\n", (int)getpid(), err, found, aside);
            fflush(stdout);
            exit(0);
        }
        }
        _exit(127); // a successful exec does not return
    }
    char msg[64];
    int n = snprintf(msg, sizeof msg, "ready %d\n", (int)getpid());
    write(1, msg, n);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
