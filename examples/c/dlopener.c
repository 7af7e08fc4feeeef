// dlopener: dlopens the plugin given as argv[1], calls plugin_alloc(100), takes the blocks,
// dlcloses the plugin, prints "ready PID" and waits for stdin to close.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    void (*alloc)(int) = (void (*)(int))dlsym(h, "plugin_alloc");
    void *(*block)(int) = (void *(*)(int))dlsym(h, "plugin_block");
    alloc(100);
    void *blocks[100];
    for (int i = 0; i < 100; i++) blocks[i] = block(i);
    dlclose(h);
    char msg[64];
    int n = snprintf(msg, sizeof msg, "ready %d\n", (int)getpid());
    write(1, msg, n);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {}
    for (int i = 0; i < 100; i++) free(blocks[i]);
    return 0;
}
