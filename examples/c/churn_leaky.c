// churn_leaky: planted leaks in a process that frees and reallocates constantly, for `heapdump
// leaks` without --stop.
//
//   leaked (LeakSanitizer's split):
//     make_list   a 10-node list whose head pointer is overwritten: 1 direct + 9 indirect (48 B)
//     make_lost   3 blocks of 72 B whose pointers were dropped: 3 direct
//   churning (never leaked), N threads each:
//     churn_slot  K slots, each replaced by "allocate the new block, then free the old one"
//     churn_list  a list of L nodes: the head is popped and freed, a new node pushed at the
//                 tail (pointers move from node to node), and the array of slots is
//                 reallocated now and then (churn_grow: every pointer moves at once)
//
// Prints "ready PID" once every thread churns; churns until stdin closes, then exits 0.
//   usage: churn_leaky [N [K [L]]]      (defaults 2 20000 2000)
// Build with -fno-optimize-sibling-calls.
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct node {
    struct node *next;
    char pad[40];
};

void *volatile sink;
static int K = 20000, L = 2000;
static atomic_int started, stop;
pthread_t *g_threads; // global: main keeps its copy in a register while blocked

__attribute__((noinline)) void make_list(void) {
    struct node *head = NULL;
    for (int i = 0; i < 10; i++) {
        struct node *n = malloc(sizeof *n);
        memset(n, 0, sizeof *n);
        n->next = head;
        head = n;
    }
    sink = head;
    sink = NULL;
}

__attribute__((noinline)) void make_lost(void) {
    for (int i = 0; i < 3; i++) {
        sink = malloc(72);
        memset((void *)sink, 0, 72);
    }
    sink = NULL;
}

__attribute__((noinline)) void *churn_slot(void) { return calloc(1, 40); }

__attribute__((noinline)) struct node *churn_list(void) {
    return calloc(1, sizeof(struct node));
}

__attribute__((noinline)) void **churn_grow(void **slots, size_t n) {
    return realloc(slots, n * sizeof(void *));
}

static void *worker(void *arg) {
    (void)arg;
    size_t cap = K;
    void **slots = churn_grow(NULL, cap);
    for (int i = 0; i < K; i++) slots[i] = churn_slot();
    struct node *head = NULL, *tail = NULL;
    for (int i = 0; i < L; i++) {
        struct node *n = churn_list();
        if (tail) tail->next = n; else head = n;
        tail = n;
    }
    atomic_fetch_add(&started, 1);
    for (unsigned long i = 0; !atomic_load_explicit(&stop, memory_order_relaxed); i++) {
        int k = i % K;
        void *fresh = churn_slot();
        free(slots[k]);
        slots[k] = fresh;
        // The list: pop the head, push a new node at the tail.
        struct node *n = churn_list();
        tail->next = n;
        tail = n;
        struct node *old = head;
        head = head->next;
        free(old);
        if (i % 100000 == 99999) {
            // Every pointer of the array moves to a new block.
            cap = cap == (size_t)K ? (size_t)K + 1024 : (size_t)K;
            slots = churn_grow(slots, cap);
        }
    }
    for (int i = 0; i < K; i++) free(slots[i]);
    free(slots);
    while (head) {
        struct node *n = head->next;
        free(head);
        head = n;
    }
    return NULL;
}

__attribute__((noinline)) void scrub(void) {
    volatile char buf[16384];
    memset((char *)buf, 0, sizeof buf);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 2;
    if (argc > 2) K = atoi(argv[2]);
    if (argc > 3) L = atoi(argv[3]);
    make_list();
    make_lost();
    scrub();
    pthread_t *t = g_threads = calloc(n, sizeof *t);
    for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, worker, NULL);
    while (atomic_load(&started) < n) usleep(1000);
    usleep(200000);
    char msg[64];
    int len = snprintf(msg, sizeof msg, "ready %d\n", (int)getpid());
    write(1, msg, len);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    free(t);
    return 0;
}
