// mixed_frames: allocations at the bottom of a call chain whose functions alternate between
// keeping a frame pointer and not (as when a program built with frame pointers calls through
// a library built without them, which calls back into the program):
//
//   main -> fp_a -> nofp_b -> fp_c -> nofp_d -> fp_leaf -> malloc      (100 x 100 bytes)
//
// Built with -fno-omit-frame-pointer; the nofp_* functions override it and use rbp as an
// ordinary register, so a frame-pointer walk skips or misreads their frames while a CFI walk
// does not. Prints "ready PID" (write(2)) and waits for stdin to close.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NOFP __attribute__((noinline, optimize("omit-frame-pointer")))
#define FP __attribute__((noinline))
#define KEEP_FRAME() __asm__ volatile("" ::: "memory")

static void *blocks[100];
static volatile unsigned sink;

FP void *fp_leaf(int i) {
    void *p = malloc(100);
    KEEP_FRAME();
    return p;
}

// Clobbers rbp (the asm says so) and keeps a stack frame, so rbp no longer points at a frame.
NOFP void *nofp_d(int i) {
    volatile char pad[40];
    pad[i % 40] = (char)i;
    __asm__ volatile("xor %%ebp, %%ebp" ::: "rbp");
    void *p = fp_leaf(i + pad[i % 40] - (char)i);
    KEEP_FRAME();
    return p;
}

FP void *fp_c(int i) {
    void *p = nofp_d(i);
    KEEP_FRAME();
    return p;
}

NOFP void *nofp_b(int i) {
    volatile char pad[24];
    pad[i % 24] = (char)i;
    __asm__ volatile("mov $1, %%ebp" ::: "rbp");
    void *p = fp_c(i + pad[i % 24] - (char)i);
    KEEP_FRAME();
    return p;
}

FP void fp_a(void) {
    for (int i = 0; i < 100; i++) blocks[i] = nofp_b(i);
    KEEP_FRAME();
}

int main(void) {
    fp_a();
    char msg[64];
    int n = snprintf(msg, sizeof msg, "ready %d\n", (int)getpid());
    write(1, msg, n);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    for (int i = 0; i < 100; i++) sink += ((unsigned char *)blocks[i])[0], free(blocks[i]);
    return 0;
}
