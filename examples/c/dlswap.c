// dlswap: dlopens library A (argv[1]), keeps the 10 blocks of 1000 bytes its a_alloc makes,
// dlcloses it, then dlopens library B (argv[2], built from the same source: the loader maps
// it where A was) and keeps the 20 blocks of 2000 bytes its b_alloc makes.
// Prints "ready PID A_BASE B_BASE" (load addresses) and waits for stdin to close.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void *kept[32];

static unsigned long load(const char *path, const char *fn, int n, size_t size, int close) {
    void *h = dlopen(path, RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); exit(1); }
    struct link_map *lm = 0;
    dlinfo(h, RTLD_DI_LINKMAP, &lm);
    unsigned long base = lm->l_addr;
    void *(*alloc)(size_t) = (void *(*)(size_t))dlsym(h, fn);
    static int k;
    for (int i = 0; i < n; i++) kept[k++] = alloc(size);
    if (close) dlclose(h);
    return base;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    unsigned long a = load(argv[1], "a_alloc", 10, 1000, 1);
    unsigned long b = load(argv[2], "b_alloc", 20, 2000, 0);
    printf("ready %d %#lx %#lx\n", (int)getpid(), a, b);
    fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
