// libc_owned: blocks that cross the line between the program and the C/C++ runtime — libc
// reallocating or freeing the program's malloc'd buffers (getline, open_memstream, realloc
// through reallocarray), libc's own allocations the program frees (strdup, asprintf,
// getdelim, realpath, scandir), C++ aligned new/delete, a thread_local whose destructor
// allocates and frees at thread exit, and blocks freed by another thread. Under heapdump's
// block headers each of these must behave exactly as bare: the output is compared with a bare
// run, and glibc's own heap checks abort on a block freed with the wrong address.
//
// Prints one line per check, then "held N BYTES" for the blocks it keeps (hold_many frames);
// with the argument "wait", then "ready PID" and waits for stdin to close.
#include <dirent.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <new>

struct Local {
    void *p;
    Local() { p = malloc(123); }
    ~Local() {
        free(p);
        free(malloc(333));
    }
};
thread_local Local local;

static void *in_thread(void *arg) {
    // Touch the thread_local (constructed here, destroyed at thread exit), and free a block
    // the main thread allocated.
    printf("thread_local block: %s\n", local.p ? "yes" : "null");
    free(arg);
    return malloc(77); // freed by the main thread
}

extern "C" __attribute__((noinline)) void *hold_many(size_t n) {
    return malloc(n);
}

int main(int argc, char **argv) {
    // getline grows the program's buffer with realloc inside libc.
    FILE *f = fmemopen((void *)"short\na much longer line than the buffer had room for\n", 55,
                       "r");
    size_t cap = 4;
    char *line = (char *)malloc(cap);
    ssize_t n;
    while ((n = getline(&line, &cap, f)) > 0) printf("getline %zd cap>=len %d\n", n, cap >= (size_t)n);
    fclose(f);
    free(line);

    // open_memstream: libc allocates and reallocates the buffer, the program frees it.
    char *buf = nullptr;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    for (int i = 0; i < 1000; i++) fprintf(m, "%d,", i);
    fclose(m);
    printf("open_memstream %zu usable>=len %d\n", len, malloc_usable_size(buf) >= len);
    free(buf);

    // libc's own allocations, freed by the program.
    char *d = strdup("duplicate me");
    char *a = nullptr;
    int an = asprintf(&a, "%s %d", d, 42);
    char *rp = realpath("/", nullptr);
    printf("strdup %s asprintf %d %s realpath %s\n", d, an, a, rp);
    free(d);
    free(a);
    free(rp);
    struct dirent **names = nullptr;
    int k = scandir("/", &names, nullptr, alphasort);
    for (int i = 0; i < k; i++) free(names[i]);
    free(names);
    printf("scandir %s\n", k > 0 ? "yes" : "no");
    char *q = (char *)reallocarray(nullptr, 10, 10);
    q = (char *)reallocarray(q, 1000, 10);
    free(q);

    // C++ aligned new/delete, and plain new[] / delete[].
    struct alignas(64) Wide {
        char c[100];
    };
    Wide *w = new Wide[3];
    printf("aligned new: %d\n", (int)((unsigned long)w % 64 == 0));
    delete[] w;
    int *ints = new int[1000];
    delete[] ints;

    // Across threads, with a thread_local destructor that allocates at thread exit.
    for (int i = 0; i < 4; i++) {
        pthread_t t;
        pthread_create(&t, nullptr, in_thread, malloc(55));
        void *ret;
        pthread_join(t, &ret);
        free(ret);
    }

    // What it keeps: 100 blocks of 1000 bytes.
    static void *kept[100];
    for (int i = 0; i < 100; i++) kept[i] = hold_many(1000);
    printf("held 100 100000\n");
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "wait") == 0) {
        printf("ready %d\n", (int)getpid());
        fflush(stdout);
        char c;
        while (read(0, &c, 1) > 0) {
        }
    }
    return 0;
}
