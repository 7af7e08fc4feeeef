// swaplib: built twice by the symbols test, as libswapa.so (-DLIB_ALLOC=a_alloc) and
// libswapb.so (-DLIB_ALLOC=b_alloc): same layout, so dlswap.c's two libraries map alike.
#include <stdlib.h>

__attribute__((noinline)) void *LIB_ALLOC(size_t n) {
    void *p = malloc(n);
    __asm__ volatile("" ::"r"(p) : "memory");
    return p;
}
