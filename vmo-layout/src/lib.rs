//! The heapdump region: the only crate both the shim (writer) and the collector (reader) use.
//!
//! Map of modules:
//! - [`v1`]: layout version 1, field by field (`#[repr(C)]`, sizes pinned at compile time);
//! - [`writer`]: lays out a region and performs inserts/erases (used inside `malloc`: no
//!   allocation, no locks, no system calls);
//! - [`reader`]: validates a region as hostile input and takes point-in-time snapshots;
//! - [`check`]: which blocks of a snapshot can be true (in the address space, not
//!   overlapping): every consumer of a snapshot's blocks goes through [`check::validate`];
//! - [`name`]: the region file's name (`PID-STARTTICKS-CREATEDNS.heapdump`), written by the
//!   shim, parsed by both;
//! - [`sampling`]: the sampling formula (probability a block is recorded, its unbiasing
//!   weight, the countdown's distances), used by the shim and the collector;
//! - [`clock`]: the region's clock (`CLOCK_MONOTONIC_COARSE`, ns) both sides order their operations by.
//!
//! The region format, the insert/erase/snapshot protocol and the argument for its consistency
//! are described in `ARCHITECTURE.md` at the root of the repository.

pub mod attach;
pub mod check;
pub mod clock;
pub mod name;
pub mod reader;
pub mod sampling;
pub mod v1;
pub mod writer;

pub use reader::{
    Block, Counters, Module, NamedSnapshot, PythonCode, ReadError, Region, RegionInfo,
    SnapshotMeta, SnapshotOptions, ThreadInfo,
};
pub use writer::{ProcessIdentity, RegionWriter};
