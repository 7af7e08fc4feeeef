// containers: C++ built the usual way (-O2, no frame pointers): 1000 strings of 200 bytes in a
// std::map, allocated through operator new from fill_map. Prints "ready PID" and waits.
#include <cstdio>
#include <map>
#include <string>
#include <unistd.h>

static std::map<int, std::string> *m;

__attribute__((noinline)) void fill_map() {
    m = new std::map<int, std::string>();
    for (int i = 0; i < 1000; i++) (*m)[i] = std::string(200, 'x');
}

int main() {
    fill_map();
    char b[64];
    int n = snprintf(b, sizeof b, "ready %d\n", (int)getpid());
    write(1, b, n);
    char c;
    while (read(0, &c, 1) > 0) {}
    delete m;
}
