// foreign_stack: allocations made while running on stacks that are not the thread's own, where
// the memory above the stack pointer ends before the thread's stack does:
//
//   * a makecontext coroutine on a stack in its own mapping, with an unmapped page above it,
//     whose entry function leaves rbp pointing into that unmapped page (as a function that
//     uses rbp as an ordinary register may), then calls co_alloc -> malloc;
//   * a signal handler running on a sigaltstack (SA_ONSTACK) that allocates.
//
// A stack walk that trusts [sp, top of the thread's stack) reads the unmapped page and
// crashes the program. Holds 1000 blocks from co_alloc and 10 from on_signal; prints
// "ready PID" (write(2)) and waits for stdin to close.
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#define PAGE 4096
#define STACK (64 * 1024)

static ucontext_t main_ctx, co_ctx;
void *blocks[1010]; // external: the compiler may not elide the mallocs that fill it
static int n;
static char *gap; // an unmapped page above the coroutine stack

__attribute__((noinline)) void *co_alloc(void) {
    void *p = malloc(100);
    __asm__ volatile("" ::: "memory");
    return p;
}

// Entered by makecontext; sets rbp to an address in the unmapped page before each call, as
// code without frame pointers may leave any value there.
__attribute__((noinline, optimize("omit-frame-pointer"))) void co_entry(void) {
    for (int i = 0; i < 1000; i++) {
        void *p;
        // The call is made with rsp 16-byte aligned, as the psABI requires (r12 keeps rsp).
        __asm__ volatile("mov %%rsp, %%r12\n\tand $-16, %%rsp\n\tmov %1, %%rbp\n\t"
                         "call co_alloc\n\tmov %%r12, %%rsp\n\tmov %%rax, %0"
                         : "=r"(p)
                         : "r"(gap + 64)
                         : "rbp", "r12", "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10",
                           "r11", "memory");
        blocks[n++] = p;
    }
}

__attribute__((noinline)) void on_signal(int sig) {
    (void)sig;
    blocks[n++] = malloc(200);
}

int main(void) {
    // [guard][stack 64 KiB][gap page, unmapped][rest of the reservation, unmapped]
    char *base = mmap(NULL, STACK + 3 * PAGE, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return 1;
    munmap(base, PAGE);
    gap = base + PAGE + STACK;
    munmap(gap, 2 * PAGE);
    getcontext(&co_ctx);
    co_ctx.uc_stack.ss_sp = base + PAGE;
    co_ctx.uc_stack.ss_size = STACK;
    co_ctx.uc_link = &main_ctx;
    makecontext(&co_ctx, co_entry, 0);
    swapcontext(&main_ctx, &co_ctx);

    stack_t ss = {.ss_sp = malloc(64 * 1024), .ss_size = 64 * 1024, .ss_flags = 0};
    sigaltstack(&ss, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGUSR1, &sa, NULL);
    for (int i = 0; i < 10; i++) raise(SIGUSR1);

    char msg[64];
    int len = snprintf(msg, sizeof msg, "ready %d\n", (int)getpid());
    write(1, msg, len);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
