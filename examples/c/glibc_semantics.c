// glibc_semantics: calls the allocation functions at their edges (odd alignments, huge sizes,
// errno around free) and prints one line per call with what the caller can observe: whether
// a pointer came back, the return value, errno. Run bare and under the shim, the output must
// be identical.
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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

int main(void) {
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
    return 0;
}
