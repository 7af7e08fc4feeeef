// tcmalloc_held: a C++ program linked with tcmalloc (`g++ … -ltcmalloc`), which grows with
// sbrk, so its memory lies in [heap] beside glibc's: a vector made by tcmalloc's operator new
// holds the only pointers to 10 blocks of 200 bytes that malloc (the shim's, glibc's) made.
// Prints "ready PID" and waits for stdin to close; exits 0.
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <vector>

static std::vector<void *> *held;

__attribute__((noinline)) std::vector<void *> *keep_blocks() {
    auto *v = new std::vector<void *>;
    v->reserve(10);
    for (int i = 0; i < 10; i++) v->push_back(std::malloc(200));
    return v;
}

int main() {
    held = keep_blocks();
    std::printf("ready %d\n", static_cast<int>(getpid()));
    std::fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    for (void *p : *held) std::free(p);
    delete held;
    return 0;
}
