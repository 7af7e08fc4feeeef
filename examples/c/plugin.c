// plugin: a shared library loaded with dlopen by dlopener.c; allocates from plugin_alloc.
#include <stdlib.h>

static void *kept[100];

__attribute__((noinline)) void plugin_alloc(int n) {
    for (int i = 0; i < n && i < 100; i++) kept[i] = malloc(3000);
}

void *plugin_block(int i) { return kept[i]; }
