// own_new: a C++ program with its own operator new and delete, forwarding to malloc and free
// (as many do, to count or to align): its objects are recorded like any malloc block. It
// keeps 10 objects of 40 bytes from keep_some and drops 5 more from lose_some (real leaks).
// Prints "ready PID" and waits for stdin to close; exits 0.
#include <cstdio>
#include <cstdlib>
#include <new>
#include <unistd.h>

void *operator new(std::size_t n) {
    if (void *p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void operator delete(void *p) noexcept { std::free(p); }
void operator delete(void *p, std::size_t) noexcept { std::free(p); }

static char *kept[10];

__attribute__((noinline)) void keep_some() {
    for (int i = 0; i < 10; i++) kept[i] = new char[40];
}

__attribute__((noinline)) void lose_some() {
    for (int i = 0; i < 5; i++) {
        char *volatile lost = new char[40];
        lost[0] = 1;
    }
}

int main() {
    keep_some();
    lose_some();
    std::printf("ready %d\n", static_cast<int>(getpid()));
    std::fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
