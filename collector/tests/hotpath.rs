//! The shim's recording path (issue 20): its thread state found without `__tls_get_addr`
//! still loads by `dlopen`, and stacks reused from the previous capture are exactly the stacks
//! a full walk gives.

mod common;

use common::*;
use std::process::Command;

/// The shim keeps its thread-state pointer in a TLS word read through a TLS descriptor; an
/// initial-exec access would have marked the whole module `STATIC_TLS` and made `dlopen` fail
/// ("cannot allocate memory in static TLS block"). A program started without the shim loads
/// it by `dlopen` and allocates through its `malloc` from 4 threads: the snapshot has exactly
/// those threads' 400 held blocks of 48 B.
#[test]
fn shim_loads_by_dlopen() {
    if !can_run("shim_loads_by_dlopen") {
        return;
    }
    let exe = compile_c("dlopen_shim", &["-fno-optimize-sibling-calls", "-ldl"]);
    let dir = region_dir("dlopen-shim");
    let mut cmd = Command::new(&exe);
    cmd.arg(shim());
    let r = start(cmd, &dir, false);
    let p = decode(&snapshot(&dir, r.pid(), &[]));
    let held = sum_through(&p, "hold_thread");
    assert_eq!([held[2], held[3]], [400, 400 * 48]);
    assert_eq!(r.finish(), 0);
}
