// cpp_names: keeps a block allocated inside std::string's constructor template
// `basic_string<std::allocator<char> >(unsigned long, char, std::allocator<char> const&)`
// (std::string(300, 'x'): 301 bytes) and one of 1000 bytes allocated inside the constructor
// template A::A<int>(unsigned long, char) (mangled _ZN1AC2IiEEmc), whose demangled names
// cpp_demangle gets wrong. Build with -O0 so both constructors keep frames of their own.
// Prints "ready PID" and waits for stdin to close.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>

struct A {
    template <class T = int> A(unsigned long n, char c);
    void *p;
};

template <class T> __attribute__((noinline)) A::A(unsigned long n, char c) {
    p = malloc(n);
    memset(p, c, n);
}

std::string *g_string;
A *g_a;

int main() {
    g_string = new std::string(300, 'x');
    g_a = new A(1000, 'y');
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
