// owners: a known ownership tree. The global g_table points to a table (make_table) of 3
// buckets (make_bucket), each with an array (make_entries) of 1000 entries (make_entry),
// each holding a 1 KiB payload (make_payload). Prints "ready PID" and waits for stdin to close.
//
// Sizes: table 24 B; bucket 16 B; array 8000 B; entry 32 B; payload 1024 B.
// Retained by each bucket: 16 + 8000 + 1000 * (32 + 1024) = 1,064,016 B; by the table:
// 24 + 3 * 1,064,016 = 3,192,072 B.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct entry {
    char *payload;
    char name[24];
};
struct bucket {
    struct entry **entries;
    long n;
};
struct table {
    struct bucket *buckets[3];
};

struct table *g_table;

__attribute__((noinline)) char *make_payload(void) {
    char *p = malloc(1024);
    memset(p, 'x', 1024);
    return p;
}

__attribute__((noinline)) struct entry *make_entry(void) {
    struct entry *e = malloc(sizeof *e);
    memset(e, 0, sizeof *e);
    e->payload = make_payload();
    return e;
}

__attribute__((noinline)) struct entry **make_entries(long n) {
    struct entry **a = malloc(n * sizeof *a);
    for (long i = 0; i < n; i++) a[i] = make_entry();
    return a;
}

__attribute__((noinline)) struct bucket *make_bucket(void) {
    struct bucket *b = malloc(sizeof *b);
    b->n = 1000;
    b->entries = make_entries(b->n);
    return b;
}

__attribute__((noinline)) struct table *make_table(void) {
    struct table *t = malloc(sizeof *t);
    for (int i = 0; i < 3; i++) t->buckets[i] = make_bucket();
    return t;
}

// Clears the stack below main's frame, so that stale copies of pointers left there by the
// make_* calls do not count as a second root of the table.
__attribute__((noinline)) void scrub(void) {
    volatile char buf[16384];
    memset((char *)buf, 0, sizeof buf);
}

// Builds the tree from a function of its own, so that no register of main holds a pointer to
// it afterwards (a saved register on the stack would be a second root).
__attribute__((noinline)) void setup(void) { g_table = make_table(); }

int main(void) {
    setup();
    scrub();
    char msg[64];
    int n = snprintf(msg, sizeof msg, "ready %d\n", (int)getpid());
    write(1, msg, n);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
