//! heapdump's recording core.
//!
//! Records every live allocation — address, requested size, time, thread, stack — into a
//! shared-memory region laid out by [`vmo_layout`], which the `heapdump` collector snapshots from
//! outside the process. Two ways in:
//! - [`HeapdumpAlloc`], a `#[global_allocator]` wrapper for Rust programs;
//! - the `heapdump-preload` crate (`libheapdump.so`), which exports the malloc family for
//!   `LD_PRELOAD` and calls [`hooks`].
//!
//! Modules: [`hooks`] (what each allocator call records), [`state`] (start-up, per-thread state,
//! reentrancy guard, node caches), [`region`] (the region file), [`unwind`] (frame-pointer
//! walk), [`stacks`] (stack interning), [`index`] (address → record), [`modules`] (the module
//! table), [`sys`] (helpers usable inside malloc).
//!
//! Nothing on the recording path allocates, panics or takes a lock shared by all threads.

#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(target_arch = "x86_64")]
pub mod dwarf;
pub mod global_alloc;
pub mod hooks;
pub mod index;
pub mod modules;
pub mod region;
pub mod stacks;
pub mod state;
pub mod sys;
pub mod unwind;

pub use global_alloc::HeapdumpAlloc;
pub use state::{init, refresh_modules};
