// forker: the parent allocates 120 x 4 KiB in parent_alloc and frees 20 of them, then forks. The child allocates
// 50 x 8 KiB in child_alloc and frees 10 of the inherited blocks; both print
// "ready PID" (child first, then parent after the child is ready) and wait for stdin to close.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void *inherited[100], *own[50];
static void *volatile before[20];

__attribute__((noinline)) void parent_alloc(void) {
    for (int i = 0; i < 20; i++) before[i] = malloc(4096);
    for (int i = 0; i < 100; i++) inherited[i] = malloc(4096);
    for (int i = 0; i < 20; i++) free(before[i]);
}

__attribute__((noinline)) void child_alloc(void) {
    for (int i = 0; i < 50; i++) own[i] = malloc(8192);
    for (int i = 0; i < 10; i++) free(inherited[i]);
}

static void say_ready(void) {
    char msg[64];
    int n = snprintf(msg, sizeof msg, "ready %d\n", (int)getpid());
    write(1, msg, n);
}

int main(void) {
    parent_alloc();
    int pipefd[2];
    pipe(pipefd);
    pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        child_alloc();
        say_ready();
        close(pipefd[1]); // tells the parent we are ready
        char buf[16];
        while (read(0, buf, sizeof buf) > 0) {}
        for (int i = 0; i < 50; i++) free(own[i]);
        for (int i = 10; i < 100; i++) free(inherited[i]);
        return 0;
    }
    close(pipefd[1]);
    char c;
    read(pipefd[0], &c, 1);
    say_ready();
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {}
    int st = 0;
    waitpid(pid, &st, 0);
    for (int i = 0; i < 100; i++) free(inherited[i]);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
