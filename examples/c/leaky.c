// leaky: planted leaks and non-leaks, for `heapdump leaks` and LeakSanitizer alike.
//
//   leaked (LeakSanitizer's split):
//     make_list     a 10-node list whose head pointer is overwritten: 1 direct + 9 indirect
//     make_cycle    two blocks pointing at each other, nobody else at them: 2 indirect
//     make_masked   a block whose only pointer is kept XOR-masked: 1 direct (a conservative
//                   scan cannot see it)
//     make_lost     3 blocks whose pointers were dropped: 3 direct
//   not leaked:
//     make_interior a block pointed to only through an interior pointer (global g_interior)
//     make_global   a block in the global g_kept
//     make_thread   a block only another (blocked) thread's stack points to
//     make_lib      a block only a global of a dlopened library (argv[1]) points to
//     make_tls      a block only a static TLS variable of the main thread points to
//     make_mmap     a block only a mmap-ed region the program manages points to (LeakSanitizer
//                   does not scan such regions and reports it leaked: it is not)
//
// Prints "ready PID" and waits for stdin to close (then exits 0, so LeakSanitizer reports).
// Build with -fno-optimize-sibling-calls so every make_* keeps its frame.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct node {
    struct node *next;
    char pad[40];
};

void *g_kept;
char *g_interior;
uintptr_t g_masked;
__thread void *t_kept;
void **g_region; // a page the program mmaps and manages itself
void *volatile sink;

__attribute__((noinline)) void make_list(void) {
    struct node *head = NULL;
    for (int i = 0; i < 10; i++) {
        struct node *n = malloc(sizeof *n);
        memset(n, 0, sizeof *n);
        n->next = head;
        head = n;
    }
    sink = head;
    sink = NULL; // the head pointer is overwritten
}

__attribute__((noinline)) void make_cycle(void) {
    void **a = malloc(32), **b = malloc(48);
    memset(a, 0, 32);
    memset(b, 0, 48);
    a[0] = b;
    b[0] = a;
    sink = a;
    sink = NULL;
}

__attribute__((noinline)) void make_masked(void) {
    void *p = malloc(24);
    memset(p, 0, 24);
    g_masked = (uintptr_t)p ^ 0x5555555555555555u;
}

__attribute__((noinline)) void make_lost(void) {
    for (int i = 0; i < 3; i++) {
        sink = malloc(72);
        memset((void *)sink, 0, 72);
    }
    sink = NULL;
}

__attribute__((noinline)) void make_interior(void) {
    char *p = malloc(256);
    memset(p, 0, 256);
    g_interior = p + 100;
}

__attribute__((noinline)) void make_global(void) {
    g_kept = malloc(88);
    memset(g_kept, 0, 88);
}

static int pipefd[2];

__attribute__((noinline)) void *make_thread_body(void *arg) {
    (void)arg;
    void *volatile mine = malloc(99);
    memset((void *)mine, 0, 99);
    char c;
    (void)!read(pipefd[0], &c, 1); // blocks with `mine` on this thread's stack
    sink = mine;
    return NULL;
}

__attribute__((noinline)) void make_lib(const char *path) {
    void *h = dlopen(path, RTLD_NOW);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        exit(2);
    }
    void (*keep)(void *) = (void (*)(void *))dlsym(h, "lib_keep");
    void *p = malloc(111);
    memset(p, 0, 111);
    keep(p);
}

__attribute__((noinline)) void make_tls(void) {
    t_kept = malloc(77);
    memset(t_kept, 0, 77);
}

__attribute__((noinline)) void make_mmap(void) {
    g_region = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void **page = g_region;
    page[10] = malloc(66);
    memset(page[10], 0, 66);
    // Only the mapping keeps it: forget the page's address in a way a scan cannot follow.
    g_region = (void **)((uintptr_t)g_region ^ 0x5555555555555555u);
}

// Scrubs the stack below the current frame, so that stale copies of the planted pointers left
// by the make_* calls do not keep blocks alive (LeakSanitizer suffers the same way).
__attribute__((noinline)) void scrub(void) {
    volatile char buf[16384];
    memset((char *)buf, 0, sizeof buf);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    if (pipe(pipefd)) return 2;
    pthread_t t;
    pthread_create(&t, NULL, make_thread_body, NULL);
    make_list();
    make_cycle();
    make_masked();
    make_lost();
    make_interior();
    make_global();
    make_lib(argv[1]);
    make_tls();
    make_mmap();
    scrub();
    usleep(100000); // let the thread block in read()
    char msg[64];
    int n = snprintf(msg, sizeof msg, "ready %d\n", (int)getpid());
    write(1, msg, n);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    // LeakSanitizer reports at exit: the other thread must still hold its block then.
    return 0;
}
