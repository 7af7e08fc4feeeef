//! Starting to record in a process that is already running (`heapdump attach`), and stopping
//! (`heapdump detach`).
//!
//! The collector stops every thread of the target with ptrace at a point where none is inside
//! the allocator or the loader, makes one of them `dlopen` `libheapdump.so` and call its attach
//! entry (`heapdump_attach_start`, preload crate), which calls [`start`] with every other thread
//! still stopped: the blocks already live are found by walking glibc's heap
//! ([`crate::glibc_heap`]), recording starts (the region is created as at start-up, with the
//! settings the collector passed instead of the process's environment), and the blocks found
//! are recorded under one synthetic frame, the address of the shim's
//! `heapdump_live_before_attach` function, which the collector shows by that name. The preload
//! crate then points the GOT slots of the malloc family at its own functions.

use crate::glibc_heap::{self, Block, Blocks};
use crate::state;
use std::sync::atomic::{AtomicU8, Ordering};

/// What [`start`] found and recorded.
#[derive(Debug, Clone, Copy, Default)]
pub struct Started {
    /// Blocks live before the attach that were recorded.
    pub blocks: u64,
    /// Their usable sizes, bytes.
    pub bytes: u64,
    /// glibc's `mallinfo2` just before the walk: `uordblks`, `hblkhd`, `hblks`.
    pub mallinfo: [u64; 3],
    /// Why the heap was not walked (another allocator, a glibc whose layout was not
    /// recognised): only what comes after the attach is recorded. `None` when it was.
    pub heap_not_walked: Option<&'static str>,
}

/// Why [`start`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachError {
    /// The process records already (preloaded, or attached before).
    AlreadyRecording,
    /// The region could not be created (directory not writable, settings disabling it…).
    NoRegion,
}

impl AttachError {
    /// One line for the user.
    pub fn message(self) -> &'static [u8] {
        match self {
            AttachError::AlreadyRecording => {
                b"the process records already (libheapdump.so preloaded, or attached before)"
            }
            AttachError::NoRegion => {
                b"recording could not start: the region could not be created (is the region directory writable? HEAPDUMP_DISABLE set?)"
            }
        }
    }
}

const NEVER: u8 = 0;
const ATTACHED: u8 = 1;
const DETACHED: u8 = 2;

/// [`NEVER`], [`ATTACHED`] or [`DETACHED`].
static ATTACH: AtomicU8 = AtomicU8::new(NEVER);

/// Whether the shim was attached to this process (and not detached since): every `dlopen`
/// then points the new objects' GOT slots at the shim.
pub fn attached() -> bool {
    ATTACH.load(Ordering::Acquire) == ATTACHED
}

/// Starts recording in a running process: walks glibc's heap, starts recording with the
/// settings in `env` (NUL-separated `NAME=VALUE` entries, as `/proc/self/environ`; kept for
/// the life of the process), then records the blocks found, each under the single frame
/// `marker_pc`. Call with every other thread of the process stopped outside the allocator.
///
/// Errors: [`AttachError`].
pub fn start(env: &'static [u8], marker_pc: u64) -> Result<Started, AttachError> {
    if ATTACH.load(Ordering::Acquire) != NEVER || state::STATE.load(Ordering::Acquire) != 0 {
        return Err(AttachError::AlreadyRecording);
    }
    // Walked before recording starts: the shim's own start-up allocations (unwinder tables)
    // are then not taken for the program's.
    let mut found = Blocks::new();
    let mut mallinfo = [0u64; 3];
    let walked = state::internal_work(|| {
        // SAFETY: mallinfo2 takes the arena locks, which no stopped thread holds; it does
        // not allocate.
        let mi = unsafe { libc::mallinfo2() };
        mallinfo = [mi.uordblks as u64, mi.hblkhd as u64, mi.hblks as u64];
        glibc_heap::walk(&mut found)
    });
    crate::region::set_env_override(env);
    state::init();
    let Some(_) = state::global() else {
        return Err(AttachError::NoRegion);
    };
    let mut started = Started {
        mallinfo,
        heap_not_walked: walked.err(),
        ..Started::default()
    };
    let interval = state::sample_interval();
    for &Block { addr, size } in found.as_slice() {
        if interval != 0 && !state::sample(size, interval) {
            continue;
        }
        let done = crate::hooks::enter(|g, t| {
            crate::hooks::insert_deferred(g, t, addr, size, &[marker_pc])
        });
        if done.is_some() {
            started.blocks += 1;
            started.bytes += size;
        }
    }
    found.release();
    ATTACH.store(ATTACHED, Ordering::Release);
    Ok(started)
}

/// Stops recording after the preload crate restored the GOT slots: the region is marked as
/// a process that is gone (it stays readable, as after an exit with `HEAPDUMP_KEEP=1`:
/// snapshots show the blocks live at the detach), and nothing more is recorded. Returns
/// false when the shim was not attached.
pub fn stop() -> bool {
    if ATTACH
        .compare_exchange(ATTACHED, DETACHED, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return false;
    }
    // Nothing that takes a lock: other threads may be stopped inside the recording path.
    if let Some(g) = state::global() {
        g.writer.set_state(vmo_layout::v1::STATE_EXITED);
    }
    state::STATE.store(state::DISABLED, Ordering::Release);
    true
}
