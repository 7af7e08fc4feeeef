// examples/c/reuse_fool.cc — allocations that could fool a stack walk reusing the frames of the
// previous capture (issue 20): consecutive allocations at the same stack depth and call site
// reached through different outer frames, after longjmp, C++ exceptions, in a signal handler,
// on a ucontext coroutine's stack, and in a forked child.
//
//   usage: reuse_fool [fork]
//
// Everything runs under deep(12) (12 more outer frames to reuse). Blocks kept (all held until
// stdin closes), by the function they are allocated through:
//   callers:   100 × 24 B through outer_a, 100 × 24 B through outer_b (both via mid → leaf)
//   longjmp:   100 × 40 B through jump_a, 100 × 40 B through jump_b (alloca of 0–128 B first)
//   exception: 100 × 56 B through throw_a, 100 × 56 B through throw_b
//   signal:    200 × 72 B through on_signal (raised from sig_a and sig_b alternately)
//   ucontext:  100 × 88 B through co_leaf (coroutine stack), 100 × 104 B through main_leaf
//   deep:      100 × 120 B through deep_alloc, 40–69 levels down (stacks cut at 64 frames)
// With "fork", the parent allocates once, forks, and the child does all of the above and
// prints "ready PID 1100 69600" (PID the child's); the parent waits for it.
//
// Build: g++ -O1 -g -fomit-frame-pointer -fno-optimize-sibling-calls -pthread reuse_fool.cc
// (without frame pointers: the CFI walk matches the previous capture only at frames that keep
// none, so this is where reuse happens)
#include <alloca.h>
#include <csetjmp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))
#define KEEP() __asm__ volatile("" ::: "memory")

static void *held[2000];
static int nheld;

NOINLINE static void leaf(size_t n) {
    held[nheld++] = malloc(n);
    KEEP();
}
NOINLINE static void mid(size_t n) {
    leaf(n);
    KEEP();
}
NOINLINE static void outer_a(size_t n) {
    mid(n);
    KEEP();
}
NOINLINE static void outer_b(size_t n) {
    mid(n);
    KEEP();
}
NOINLINE static void callers() {
    for (int i = 0; i < 200; i++)
        (i % 2 ? outer_a : outer_b)(24);
    KEEP();
}

static jmp_buf env;
NOINLINE static void jump_leaf() {
    leaf(40);
    longjmp(env, 1);
}
NOINLINE static void jump_a(int pad) {
    char *p = (char *)alloca(pad + 1);
    p[0] = 1;
    KEEP();
    jump_leaf();
}
NOINLINE static void jump_b(int pad) {
    char *p = (char *)alloca(pad + 1);
    p[0] = 2;
    KEEP();
    jump_leaf();
}
NOINLINE static void jumps() {
    for (volatile int i = 0; i < 200; i++)
        if (!setjmp(env))
            (i % 2 ? jump_a : jump_b)((i % 5) * 32);
    KEEP();
}

NOINLINE static void throw_leaf() {
    leaf(56);
    throw 1;
}
NOINLINE static void throw_a() {
    throw_leaf();
    KEEP();
}
NOINLINE static void throw_b() {
    throw_leaf();
    KEEP();
}
NOINLINE static void throws() {
    for (int i = 0; i < 200; i++) {
        try {
            (i % 2 ? throw_a : throw_b)();
        } catch (int) {
        }
    }
    KEEP();
}

NOINLINE static void on_signal(int) {
    leaf(72);
    KEEP();
}
NOINLINE static void sig_a() {
    raise(SIGUSR1);
    KEEP();
}
NOINLINE static void sig_b() {
    raise(SIGUSR1);
    KEEP();
}
NOINLINE static void signals() {
    signal(SIGUSR1, on_signal);
    for (int i = 0; i < 200; i++)
        (i % 2 ? sig_a : sig_b)();
    KEEP();
}

static ucontext_t main_ctx, co_ctx;
static char co_stack[256 * 1024] __attribute__((aligned(16)));
NOINLINE static void co_leaf() {
    leaf(88);
    KEEP();
}
static void co_main() {
    for (;;) {
        co_leaf();
        swapcontext(&co_ctx, &main_ctx);
    }
}
NOINLINE static void main_leaf() {
    leaf(104);
    KEEP();
}
NOINLINE static void coroutines() {
    getcontext(&co_ctx);
    co_ctx.uc_stack.ss_sp = co_stack;
    co_ctx.uc_stack.ss_size = sizeof co_stack;
    co_ctx.uc_link = &main_ctx;
    makecontext(&co_ctx, co_main, 0);
    for (int i = 0; i < 100; i++) {
        swapcontext(&main_ctx, &co_ctx);
        main_leaf();
    }
    KEEP();
}

NOINLINE static void deep_alloc(int d) {
    if (d > 0)
        deep_alloc(d - 1);
    else
        leaf(120);
    KEEP();
}
NOINLINE static void deeps() {
    for (int i = 0; i < 100; i++)
        deep_alloc(40 + (i * 7) % 30);
    KEEP();
}

NOINLINE static void deep(int d) {
    if (d > 0) {
        deep(d - 1);
    } else {
        callers();
        jumps();
        throws();
        signals();
        coroutines();
        deeps();
    }
    KEEP();
}

int main(int argc, char **argv) {
    bool fork_first = argc > 1 && strcmp(argv[1], "fork") == 0;
    if (fork_first) {
        outer_a(8); // the parent's last capture, inherited by the child
        free(held[--nheld]);
        pid_t pid = fork();
        if (pid < 0)
            return 1;
        if (pid > 0) {
            int st = 0;
            waitpid(pid, &st, 0);
            return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
        }
    }
    deep(12);
    printf("ready %d %d %d\n", (int)getpid(), nheld,
           100 * (24 + 24 + 40 + 40 + 56 + 56 + 72 + 72 + 88 + 104 + 120));
    fflush(stdout);
    // read(2), not fread: stdio would allocate stdin's 4 KiB buffer at the first fread, after
    // "ready", racing the test's snapshot (the two profiles it compares then differed by it).
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    for (int i = 0; i < nheld; i++)
        free(held[i]);
    return 0;
}
