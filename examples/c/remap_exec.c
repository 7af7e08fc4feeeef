// remap_exec: maps the page of its own executable that holds alloc_in_copy() a second time,
// read+exec, at an address the kernel picks (as node does with V8's embedded builtins), and
// calls the function there: 100 blocks of 1,000 bytes allocated from code in a mapping that
// dl_iterate_phdr does not report. The copy uses no PC-relative reference (malloc and the
// block array come as arguments), so it runs the same at any address.
//
// Prints "ready PID 100 100000" when done, keeps the blocks live until stdin closes, then
// exits without freeing them (for a post-mortem snapshot).
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef void *(*alloc_fn)(size_t);

__attribute__((noinline, aligned(64))) void alloc_in_copy(alloc_fn m, void **out, long n) {
    for (long i = 0; i < n; i++) out[i] = m(1000);
    __asm__ volatile("" ::: "memory");
}

/// File offset of the executable's mapping holding `addr`, and that mapping's start.
static int mapping_of(uintptr_t addr, uintptr_t *start, unsigned long *offset) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[512];
    int found = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi, off;
        if (sscanf(line, "%lx-%lx %*s %lx", &lo, &hi, &off) == 3 && addr >= lo && addr < hi) {
            *start = lo;
            *offset = off;
            found = 0;
            break;
        }
    }
    fclose(f);
    return found;
}

static void *blocks[100];

int main(void) {
    uintptr_t fn = (uintptr_t)&alloc_in_copy, start;
    unsigned long offset;
    if (mapping_of(fn, &start, &offset)) return 2;
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t fn_page = fn & ~(uintptr_t)(page - 1);
    int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 3;
    // Two pages: the function may cross a page boundary.
    char *copy = mmap(NULL, 2 * page, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd,
                      (off_t)(offset + (fn_page - start)));
    close(fd);
    if (copy == MAP_FAILED) return 4;
    void (*moved)(alloc_fn, void **, long) =
        (void (*)(alloc_fn, void **, long))(copy + (fn - fn_page));
    moved(malloc, blocks, 100);
    char msg[96];
    int len = snprintf(msg, sizeof msg, "ready %d 100 100000\n", (int)getpid());
    write(1, msg, len);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return blocks[0] ? 0 : 5;
}
