// glibc_semantics: calls the allocation functions at their edges (odd alignments, huge sizes,
// errno around free) and prints one line per call with what the caller can observe: whether
// a pointer came back, the return value, errno — and what a program sees of its blocks
// (usable sizes, alignment, realloc and calloc contents). Run bare and under the shim, the
// output must be identical. With the argument "offset": where a big block starts in its page,
// and how many usable bytes it has beyond those asked for.
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *keep[64]; // external: the compiler may not elide the calls
int nk;

#define SHOW(name, expr)                                                                       \
    do {                                                                                       \
        errno = 4321;                                                                          \
        void *p_ = (expr);                                                                     \
        int e_ = errno;                                                                        \
        keep[nk++ % 64] = p_;                                                                  \
        printf("%-28s ptr=%s errno=%d\n", name, p_ ? "yes" : "null", e_);                      \
    } while (0)

extern void *__libc_malloc(size_t);

static int pattern_ok(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 7 + 1)) return 0;
    return 1;
}

static void fill(unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 7 + 1);
}

// What a program sees of its blocks: usable sizes (at least what was asked for, less than 32
// bytes more), the whole usable area writable (glibc checks its chunk headers at free, and the
// shim finds its block trailers after it), alignment, realloc keeping the
// contents in place and moved, calloc zeroing reused memory, realloc(p, 0), and blocks the
// shim did not allocate (glibc's own __libc_malloc) freed through free().
static void block_semantics(void) {
    const size_t small[] = {0, 1, 10, 24, 25, 100, 1000, 4000};
    for (int i = 0; i < 8; i++) {
        unsigned char *p = malloc(small[i]);
        size_t u = malloc_usable_size(p);
        memset(p, 0xab, u);
        printf("malloc_usable_size(malloc(%zu)) in [%zu, %zu): %s\n", small[i], small[i],
               small[i] + 32, u >= small[i] && u < small[i] + 32 ? "yes" : "no");
        free(p);
    }
    const size_t big[] = {200000, 1 << 20, 10 << 20};
    for (int i = 0; i < 3; i++) {
        unsigned char *p = malloc(big[i]);
        size_t u = malloc_usable_size(p);
        memset(p, 0xab, u);
        printf("malloc_usable_size(malloc(%zu)) >= %zu: %s\n", big[i], big[i],
               u >= big[i] ? "yes" : "no");
        free(p);
    }
    printf("malloc_usable_size(NULL) = %zu\n", malloc_usable_size(NULL));
    const size_t aligns[] = {16, 32, 64, 256, 4096, 65536};
    for (int i = 0; i < 6; i++) {
        void *a = aligned_alloc(aligns[i], 100);
        void *m = memalign(aligns[i], 100);
        void *q = NULL;
        int r = posix_memalign(&q, aligns[i], 100);
        printf("aligned to %zu: %d %d %d (ret %d)\n", aligns[i],
               (uintptr_t)a % aligns[i] == 0, (uintptr_t)m % aligns[i] == 0,
               (uintptr_t)q % aligns[i] == 0, r);
        memset(a, 1, malloc_usable_size(a));
        a = realloc(a, 5000);
        free(a);
        free(m);
        free(q);
    }
    // realloc: shrinking stays in place; growing keeps the contents, in place or moved.
    unsigned char *p = malloc(1000);
    fill(p, 1000);
    unsigned char *q = realloc(p, 500);
    printf("realloc shrink: in place %d, contents %d\n", q == p, pattern_ok(q, 500));
    const size_t grow[] = {600, 5000, 300000, 3 << 20};
    size_t have = 500;
    for (int i = 0; i < 4; i++) {
        unsigned char *r = realloc(q, grow[i]);
        printf("realloc to %zu: contents %d\n", grow[i], r && pattern_ok(r, have));
        fill(r, grow[i]);
        have = grow[i];
        q = r;
    }
    errno = 4321;
    unsigned char *z = realloc(q, 0);
    printf("realloc(p, 0): ptr=%s errno=%d\n", z ? "yes" : "null", errno);
    free(z);
    unsigned char *n = realloc(NULL, 10);
    printf("realloc(NULL, 10): ptr=%s\n", n ? "yes" : "null");
    free(n);
    // calloc zeroes memory a freed, dirty block of the same size leaves behind.
    for (int i = 0; i < 4; i++) {
        size_t sz = (size_t)100 << (i * 5);
        unsigned char *d = malloc(sz);
        memset(d, 0xff, sz);
        free(d);
        unsigned char *c = calloc(sz, 1);
        int zero = 1;
        for (size_t k = 0; k < sz; k++) zero &= c[k] == 0;
        printf("calloc(%zu, 1) zeroed: %d\n", sz, zero);
        free(c);
    }
    // A block the shim did not allocate, freed and reallocated through the shim.
    unsigned char *g = __libc_malloc(100);
    fill(g, 100);
    g = realloc(g, 200);
    printf("__libc_malloc block realloc: contents %d usable>=200 %d\n", pattern_ok(g, 100),
           malloc_usable_size(g) >= 200);
    free(g);
    free(__libc_malloc(50));
    printf("__libc_malloc block freed\n");
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "offset") == 0) {
        // Where a block above the mmap threshold starts in its page (16 bytes of glibc's chunk
        // header before it, 16 more for a heapdump block header), its usable bytes beyond
        // those asked for (glibc's page rounding, less a block header), and a 40-byte block's
        // (0 from glibc: 40 + 8 fill a 48-byte chunk; 8 with a heapdump block trailer, whose
        // 8 bytes make glibc round up to 64).
        void *big = malloc(1 << 20);
        void *small = malloc(40);
        printf("%lu %zu %zu\n", (unsigned long)((uintptr_t)big & 4095),
               malloc_usable_size(big) - (1 << 20), malloc_usable_size(small) - 40);
        free(big);
        free(small);
        return 0;
    }
    SHOW("aligned_alloc(3, 10)", aligned_alloc(3, 10));
    SHOW("aligned_alloc(0, 10)", aligned_alloc(0, 10));
    SHOW("aligned_alloc(24, 100)", aligned_alloc(24, 100));
    SHOW("aligned_alloc(64, 10)", aligned_alloc(64, 10));
    SHOW("aligned_alloc(64, huge)", aligned_alloc(64, SIZE_MAX / 2));
    SHOW("memalign(3, 10)", memalign(3, 10));
    SHOW("memalign(0, 10)", memalign(0, 10));
    SHOW("malloc(huge)", malloc(SIZE_MAX / 2));
    SHOW("calloc(overflow)", calloc(SIZE_MAX / 4, 16));
    SHOW("valloc(10)", valloc(10));
    SHOW("pvalloc(10)", pvalloc(10));
    SHOW("reallocarray(overflow)", reallocarray(NULL, SIZE_MAX / 4, 16));
    void *r = malloc(10);
    SHOW("realloc(p, huge)", realloc(r, SIZE_MAX / 2));
    free(r);

    const size_t aligns[] = {0, 3, 8, 24, 64};
    for (int i = 0; i < 5; i++) {
        void *p = NULL;
        errno = 4321;
        int ret = posix_memalign(&p, aligns[i], 10);
        printf("posix_memalign(%zu, 10)%*s ret=%d ptr=%s errno=%d\n", aligns[i],
               aligns[i] < 10 ? 4 : 3, "", ret, p ? "yes" : "null", errno);
        keep[nk++ % 64] = p;
    }
    void *p = NULL;
    errno = 4321;
    int ret = posix_memalign(&p, 64, SIZE_MAX / 2);
    printf("posix_memalign(64, huge)      ret=%d ptr=%s errno=%d\n", ret, p ? "yes" : "null", errno);

    const size_t sizes[] = {0, 10, 100000, 1 << 20, 64 << 20};
    for (int i = 0; i < 5; i++) {
        void *q = malloc(sizes[i]);
        errno = 4321;
        free(q);
        printf("free(malloc(%zu)) errno=%d\n", sizes[i], errno);
    }
    errno = 4321;
    free(NULL);
    printf("free(NULL) errno=%d\n", errno);
    block_semantics();
    return 0;
}
