// deeplib: a library meant to be opened with dlopen(..., RTLD_DEEPBIND), whose own malloc and
// free then bind to glibc's, ahead of any LD_PRELOAD. Used by deepbind.c.
#include <stdlib.h>

void *lib_blocks[100]; // external: the compiler may not elide the mallocs that fill it

__attribute__((noinline)) void lib_alloc(int n) {
    for (int i = 0; i < n; i++) lib_blocks[i] = malloc(77);
}

__attribute__((noinline)) void lib_free(void **blocks, int n) {
    for (int i = 0; i < n; i++) free(blocks[i]);
}
