// A preloaded library whose `fstat` looks the real one up on its first call after a lookup
// that fails, as libfaketime's does: the failing `dlsym` allocates its error message (helper N,
// 2: the shim's start-up called `fstat`, which allocated, which started the shim's start-up
// again, for ever; every program crashed).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/stat.h>

int fstat(int fd, struct stat *st) {
    static int (*real)(int, struct stat *);
    if (!real) {
        dlsym(RTLD_DEFAULT, "heapdump_test_no_such_symbol");
        real = (int (*)(int, struct stat *))dlsym(RTLD_NEXT, "fstat");
    }
    return real(fd, st);
}
