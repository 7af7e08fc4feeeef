// grower: keeps 100 blocks of 100 B (old_alloc) from g_old, prints "ready PID", waits for a
// line on stdin, then keeps 50 blocks of 200 B (new_alloc) from g_new, prints "grown", and
// waits for stdin to close. For "what is new since a baseline, and who holds it".
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *g_old[100], *g_new[50];

__attribute__((noinline)) void old_alloc(void) {
    for (int i = 0; i < 100; i++) g_old[i] = calloc(1, 100);
}

__attribute__((noinline)) void new_alloc(void) {
    for (int i = 0; i < 50; i++) g_new[i] = calloc(1, 200);
}

static void say(const char *what) {
    char msg[64];
    int n = snprintf(msg, sizeof msg, "%s %d\n", what, (int)getpid());
    write(1, msg, n);
}

int main(void) {
    old_alloc();
    say("ready");
    char c;
    while (read(0, &c, 1) == 1 && c != '\n') {
    }
    new_alloc();
    say("grown");
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
