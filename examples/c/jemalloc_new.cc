// jemalloc_new: a C++ program linked with another allocator (built with
// `g++ … -ljemalloc`, as services are): jemalloc's operator new and delete take the C++
// objects; its operator delete reaches `free` through jemalloc's own PLT. The program's own
// malloc calls (keep_blocks: 20 blocks of 1,000 bytes) are recorded. Strings and vectors are
// made and destroyed in static initializers, in main and in a thread. Prints "ready PID" and
// waits for stdin to close; exits 0.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

static std::vector<std::string> made_early(50, std::string(60, 'e'));

__attribute__((noinline)) void **keep_blocks() {
    void **kept = static_cast<void **>(calloc(20, sizeof(void *)));
    for (int i = 0; i < 20; i++) kept[i] = malloc(1000);
    return kept;
}

static void churn() {
    for (int round = 0; round < 100; round++) {
        std::vector<std::string> v;
        for (int i = 0; i < 100; i++) v.emplace_back(40 + i, 'x');
        auto *p = new std::vector<int>(1000);
        delete p;
    }
}

int main() {
    made_early.clear();
    made_early.shrink_to_fit();
    churn();
    std::thread t(churn);
    t.join();
    void **kept = keep_blocks();
    std::printf("ready %d\n", static_cast<int>(getpid()));
    std::fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    for (int i = 0; i < 20; i++) free(kept[i]);
    free(kept);
    return 0;
}
