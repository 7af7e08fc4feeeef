// raw_fork: the parent keeps 1000 blocks of 48 B (parent_alloc); a child made by the raw
// fork system call (no fork handlers run) frees all of them and allocates 2 of its own, then
// exits. The parent waits for it, prints "ready PID" and waits for stdin to close.
// Expected in the parent's region: the 1000 blocks, intact.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

void *blocks[1000]; // external: the compiler may not elide the mallocs that fill it
void *child_blocks[2];

__attribute__((noinline)) void parent_alloc(void) {
    for (int i = 0; i < 1000; i++) blocks[i] = malloc(48);
}

int main(void) {
    parent_alloc();
    long pid = syscall(SYS_fork);
    if (pid < 0) return 1;
    if (pid == 0) {
        for (int i = 0; i < 1000; i++) free(blocks[i]);
        child_blocks[0] = malloc(100);
        child_blocks[1] = malloc(100);
        syscall(SYS_exit_group, 0);
    }
    int st;
    if (waitpid((pid_t)pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return 2;
    char msg[64];
    int n = snprintf(msg, sizeof msg, "ready %d\n", (int)getpid());
    write(1, msg, n);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
