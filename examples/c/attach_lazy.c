// attach_lazy: a program (linked with lazy binding, -Wl,-z,lazy) that calls malloc itself
// for the first time only after `heapdump attach`, then forks. Prints "ready PID" (with
// write(2): no allocation of its own before), waits for a line on stdin, then keeps 10 blocks
// of 1000 B (lazy_blocks), forks a child that keeps 90 more (child_blocks) and prints
// "child PID"; both wait for stdin to close.
// Expected, attached before the line: the parent's 10 blocks recorded (its malloc slot was
// not yet bound at the attach), the child with a region of its own holding all 100.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

void *kept[100]; // external: the compiler may not elide the mallocs

__attribute__((noinline)) void lazy_blocks(void) {
    for (int i = 0; i < 10; i++) kept[i] = malloc(1000);
}

__attribute__((noinline)) void child_blocks(void) {
    for (int i = 10; i < 100; i++) kept[i] = malloc(1000);
}

static void say(const char *s) {
    if (write(1, s, strlen(s)) < 0) _exit(3);
}

int main(void) {
    char line[64];
    int n = snprintf(line, sizeof line, "ready %d\n", getpid());
    if (write(1, line, n) != n) return 3;
    char c;
    while (read(0, &c, 1) == 1 && c != '\n') {
    }
    lazy_blocks();
    pid_t child = fork();
    if (child == 0) {
        child_blocks();
        n = snprintf(line, sizeof line, "child %d\n", getpid());
        say(line);
        while (read(0, &c, 1) > 0) {
        }
        _exit(0);
    }
    while (read(0, &c, 1) > 0) {
    }
    waitpid(child, NULL, 0);
    return 0;
}
