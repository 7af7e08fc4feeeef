// epoll_fatal: an event loop that treats EINTR as fatal (as many do): epoll_wait on stdin,
// exit 1 on any error, exit 0 when stdin closes. Loses 3 blocks of 50 bytes in lose_some.
// Prints "ready PID". A ptrace stop makes epoll_wait fail with EINTR (signal(7)): a tool
// that stops it for a moment kills it.
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>

__attribute__((noinline)) void lose_some(void) {
    for (int i = 0; i < 3; i++) {
        char *volatile p = malloc(50);
        p[0] = 1;
    }
}

int main(void) {
    lose_some();
    int e = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    epoll_ctl(e, EPOLL_CTL_ADD, 0, &ev);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    for (;;) {
        struct epoll_event o;
        int n = epoll_wait(e, &o, 1, 1000);
        if (n < 0) {
            perror("epoll_wait");
            return 1;
        }
        if (n > 0) {
            char buf[64];
            if (read(0, buf, sizeof buf) <= 0) return 0;
        }
    }
}
