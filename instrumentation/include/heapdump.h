/*
 * heapdump.h — what a program can ask of the heapdump shim (libheapdump.so).
 *
 * Include it and call the functions unconditionally: when the program does not run under
 * heapdump (the shim is not loaded) they do nothing. Nothing to link: the shim is looked up
 * at the first call with dlsym (glibc ≥ 2.34 has dlsym in libc; older ones need -ldl).
 *
 *   #include "heapdump.h"
 *   ...
 *   heapdump_take_named_snapshot("after warm-up");
 *
 *   $ heapdump run -- ./server          # or LD_PRELOAD=libheapdump.so ./server
 *   $ heapdump list --snapshots
 *   $ heapdump snapshot --by-name server --named "after warm-up" -o warm.pb.gz
 *   $ heapdump snapshot --by-name server --since "after warm-up" -o new.pb.gz
 */
#ifndef HEAPDUMP_H
#define HEAPDUMP_H

#include <dlfcn.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Records a named snapshot: `heapdump snapshot --named NAME` gives exactly the blocks live at
 * this call, when run later and also after the process has exited. Cheap for the program: no
 * allocation, no file written, no system call but the clock — the name (at most 95 bytes
 * kept) and the instant go into the shim's shared region. Names may repeat: the latest wins,
 * `--named NAME@N` picks the N-th (from 1). Up to 256 per process.
 *
 * Records the blocks of the snapshot's instant are kept when freed (not recycled), within
 * HEAPDUMP_NAMED_SNAPSHOT_RECORDS (default 4 Mi records, 160 MiB of region); past it a later
 * `--named` snapshot says it is incomplete and by how many blocks at most.
 *
 * Returns 1 when recorded, 0 when not (no shim, not recording, or the table is full).
 * Async-signal-safe once the first call has returned (the first one calls dlsym).
 */
static inline int heapdump_take_named_snapshot(const char *name) {
    typedef int (*heapdump_named_fn)(const char *);
    static heapdump_named_fn fn;
    static int looked_up;
    if (!looked_up) {
        /* RTLD_DEFAULT, which <dlfcn.h> defines only with _GNU_SOURCE. */
        fn = (heapdump_named_fn)dlsym((void *)0, "heapdump_take_named_snapshot");
        looked_up = 1;
    }
    return fn ? fn(name) : 0;
}

#ifdef __cplusplus
}
#endif

#endif /* HEAPDUMP_H */
