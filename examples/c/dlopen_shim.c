/*
 * examples/c/dlopen_shim.c — loads libheapdump.so with dlopen (as `heapdump attach` will) into
 * a process started without it, and allocates through the shim's own malloc from 4 threads.
 *
 *   usage: dlopen_shim PATH_TO_LIBHEAPDUMP_SO
 *
 * The shim keeps one TLS word (its per-thread state pointer, read through a TLS descriptor);
 * glibc must still load it by dlopen. A dlopened shim records nothing until `heapdump attach`
 * starts it. Each thread keeps 100 blocks of 48 B
 * allocated through hold_thread and frees 1000 more. Prints "ready PID 400 19200", waits for
 * stdin to close, frees everything and exits 0; exits 1 (with dlerror's message) when the
 * library cannot be loaded.
 *
 * Build: cc -O1 -g -fno-omit-frame-pointer -pthread dlopen_shim.c -ldl
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void *(*shim_malloc)(size_t);
static void (*shim_free)(void *);
static void *held[4][100];

__attribute__((noinline)) static void hold_thread(long k) {
    for (int i = 0; i < 1000; i++)
        shim_free(shim_malloc(16 + i % 64));
    for (int i = 0; i < 100; i++)
        held[k][i] = shim_malloc(48);
    __asm__ volatile("" ::: "memory");
}

static void *run(void *arg) {
    hold_thread((long)arg);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: dlopen_shim PATH\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("dlopen failed: %s\n", dlerror());
        return 1;
    }
    shim_malloc = (void *(*)(size_t))dlsym(h, "malloc");
    shim_free = (void (*)(void *))dlsym(h, "free");
    if (!shim_malloc || !shim_free) {
        printf("dlsym failed\n");
        return 1;
    }
    pthread_t t[4];
    for (long k = 0; k < 4; k++)
        pthread_create(&t[k], NULL, run, (void *)k);
    for (int k = 0; k < 4; k++)
        pthread_join(t[k], NULL);
    printf("ready %d 400 19200\n", (int)getpid());
    fflush(stdout);
    char buf[16];
    while (fread(buf, 1, sizeof buf, stdin) > 0) {
    }
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 100; i++)
            shim_free(held[k][i]);
    return 0;
}
