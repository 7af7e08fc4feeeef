// ctor_lib: a library whose constructor allocates, built without frame pointers (-O2
// -fomit-frame-pointer) so that only CFI can unwind through it. Loaded with dlopen by
// dlopener.c (which also calls plugin_alloc and takes the blocks from plugin_block).
// The constructor runs inside dlopen, before dlopen returns: the block's stack must reach
// dlopen's caller (main) through the loader (call_init, _dl_init, ..., dlopen).
#include <stdlib.h>

void *ctor_block; // external: the compiler may not elide the malloc
static void *kept[100];

__attribute__((noinline)) void ctor_alloc(void) {
    ctor_block = malloc(4242);
    __asm__ volatile("" ::: "memory");
}

__attribute__((constructor)) static void init_lib(void) {
    ctor_alloc();
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void plugin_alloc(int n) {
    for (int i = 0; i < n && i < 100; i++) kept[i] = malloc(3000);
}

void *plugin_block(int i) { return kept[i]; }
