// deepbind: dlopens the library argv[1] (deeplib.c) with RTLD_DEEPBIND. main_alloc keeps
// 100 blocks of 55 B, of which the library frees 50; the library's lib_alloc keeps 100 blocks
// of 77 B, of which main frees 30. Prints "ready PID" and waits for stdin to close.
// Expected live: 50 blocks from main_alloc, 70 from lib_alloc.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void *main_blocks[100]; // external: the compiler may not elide the mallocs that fill it

__attribute__((noinline)) void main_alloc(void) {
    for (int i = 0; i < 100; i++) main_blocks[i] = malloc(55);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_DEEPBIND);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    void (*lib_alloc)(int) = (void (*)(int))dlsym(h, "lib_alloc");
    void (*lib_free)(void **, int) = (void (*)(void **, int))dlsym(h, "lib_free");
    void **lib_blocks = (void **)dlsym(h, "lib_blocks");
    main_alloc();
    lib_free(main_blocks, 50);
    lib_alloc(100);
    for (int i = 0; i < 30; i++) free(lib_blocks[i]);
    char msg[64];
    int n = snprintf(msg, sizeof msg, "ready %d\n", (int)getpid());
    write(1, msg, n);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
