// stderr_taken: a program whose descriptor 2 is no longer the stderr it was given, whose
// forked children cannot get a region (RLIMIT_NOFILE 3), so that the shim has a warning to
// give. Nothing may reach the program's descriptors or kill it:
//   pipe: descriptor 2 is a pipe whose reader is gone (a write raises SIGPIPE);
//   file: descriptor 2 is a data file (argv[1]) the program wrote "DATA\n" into.
// Prints "pipe exit=E signal=S" and "file bytes=N" (bare: exit=0 signal=0, bytes=5).
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void child_allocates(int *exit_code, int *signal) {
    pid_t c = fork();
    if (c == 0) {
        errno = 1234;
        void *q = malloc(100);
        int e = errno;
        free(q);
        _exit(e == 1234 ? 0 : 10);
    }
    int st;
    waitpid(c, &st, 0);
    *exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    *signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    struct rlimit keep;
    getrlimit(RLIMIT_NOFILE, &keep);
    int out = dup(1);
    // The pipe.
    int p[2];
    if (pipe(p)) return 2;
    close(p[0]);
    dup2(p[1], 2);
    close(p[1]);
    struct rlimit three = {3, keep.rlim_max};
    setrlimit(RLIMIT_NOFILE, &three);
    int e, s;
    child_allocates(&e, &s);
    setrlimit(RLIMIT_NOFILE, &keep);
    dprintf(out, "pipe exit=%d signal=%d\n", e, s);
    // The data file.
    close(2);
    int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0600); // becomes descriptor 2
    if (fd != 2) return 2;
    if (write(fd, "DATA\n", 5) != 5) return 2;
    setrlimit(RLIMIT_NOFILE, &three);
    child_allocates(&e, &s);
    setrlimit(RLIMIT_NOFILE, &keep);
    struct stat st;
    fstat(fd, &st);
    dprintf(out, "file bytes=%lld exit=%d\n", (long long)st.st_size, e);
    return 0;
}
