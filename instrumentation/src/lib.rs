//! heapdump's recording core.
//!
//! Records every live allocation — address, requested size, time, thread, stack — into a
//! shared-memory region laid out by [`vmo_layout`], which the `heapdump` collector snapshots from
//! outside the process. Two ways in:
//! - [`HeapdumpAlloc`], a `#[global_allocator]` wrapper for Rust programs;
//! - the `heapdump-preload` crate (`libheapdump.so`), which exports the malloc family for
//!   `LD_PRELOAD` and calls [`hooks`].
//!
//! Public modules (what `HeapdumpAlloc`, the preload crate and the tests use): [`hooks`] (what
//! each allocator call records), [`state`] (start-up, per-thread state, the reentrancy guard),
//! [`unwind`] (frame-pointer walk, stack bounds), `dwarf` (the CFI unwinder, x86-64),
//! [`global_alloc`], [`header`] and [`trailer`] (a block's record number kept next to it), [`attach`], [`glibc_heap`] and [`pymalloc_heap`] (`heapdump attach`), [`python`] (CPython's objects and frames, used by the preload crate). Private: `deferred` (signal handlers' calls), `fork` (fork handlers,
//! raw-fork detection), `nodes` (record recycling), `region` (the region file and settings),
//! `stacks` (stack interning), `index` (address → record), `modules` (the module table),
//! `sys` (helpers usable inside malloc), `tls` (the initial-exec word that finds the thread's
//! state without `__tls_get_addr`).
//!
//! Nothing on the recording path allocates, panics or takes a lock shared by all threads.

#![deny(unsafe_op_in_unsafe_fn)]
// No `unwrap` in the shim: it runs inside other programs' `malloc` (issue 22 A4). Tests may.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod ablate;
pub mod attach;
mod deferred;
#[cfg(target_arch = "x86_64")]
pub mod dwarf;
pub mod exec;
mod fork;
mod freelist;
pub mod glibc_heap;
pub mod global_alloc;
pub mod header;
pub mod hooks;
mod index;
mod modules;
mod nodes;
pub mod pymalloc_heap;
pub mod python;
mod region;
mod shared;
mod stacks;
pub mod state;
mod sys;
#[cfg(target_arch = "x86_64")]
mod tls;
pub mod trailer;
pub mod unwind;

pub use global_alloc::HeapdumpAlloc;
pub use state::{init, refresh_modules};

/// Records a named snapshot of this process (the Rust side of `heapdump_take_named_snapshot`):
/// `heapdump snapshot --named NAME` later gives exactly the blocks live at this call, also
/// after the process exits. Cheap (no allocation, no file written); a no-op returning false
/// when the process is not recording or its table of named snapshots (256) is full. Names
/// longer than 95 bytes are truncated.
pub fn take_named_snapshot(name: &str) -> bool {
    state::take_named_snapshot(name.as_bytes())
}
