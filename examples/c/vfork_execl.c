// `vfork` + `execl` many times (helper N, 6: the shim built `execl`'s argument vector in a
// fresh mapping, which in a vfork child is the parent's, and kept it for good once the exec
// succeeded: 4 KiB a call). Argument: how many. Prints "grew KIB", the growth of the
// process's virtual size (VmSize) over the loop, in KiB.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static long vm_size_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmSize:", 7))
            kib = atol(line + 7);
    if (f)
        fclose(f);
    return kib;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    long before = vm_size_kib();
    for (int i = 0; i < n; i++) {
        pid_t p = vfork();
        if (p == 0) {
            execl("/bin/true", "true", (char *)NULL);
            _exit(127);
        }
        int st;
        waitpid(p, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            return 2;
    }
    printf("grew %ld\n", vm_size_kib() - before);
    return 0;
}
