//! Allocator calls made by signal handlers that interrupt the shim's recording: queued per
//! thread and recorded when the interrupted operation ends (see ARCHITECTURE.md, "Start-up
//! and process events", reentrancy guard).

use std::sync::atomic::{AtomicU64, Ordering};

/// The function that really frees a block whose free was deferred (`__libc_free` for
/// `libheapdump.so`); 0 when frees are never deferred, only their records.
pub(crate) static REAL_FREE: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Registers the function that frees blocks for real (see `state::defer`). With it, a free made by
/// a signal handler while its thread is recording is held back until the record is closed,
/// so the address cannot be handed out again before.
pub fn set_real_free(f: unsafe extern "C" fn(*mut libc::c_void)) {
    REAL_FREE.store(f as usize, Ordering::Relaxed);
}

/// One allocator call deferred from a signal handler.
#[derive(Clone, Copy)]
pub(crate) struct Op {
    /// Block address.
    pub(crate) ptr: u64,
    /// Requested size; `FREE_OP` for a free, `FREE_HELD` for a free whose block the drain
    /// frees for real.
    pub(crate) size: u64,
    pub(crate) depth: u64,
    pub(crate) frames: [u64; DEFERRED_FRAMES],
}
pub(crate) const FREE_OP: u64 = u64::MAX;
pub(crate) const FREE_HELD: u64 = u64::MAX - 1;
/// Frames kept for an allocation made by a signal handler (its own frames, up to the signal
/// trampoline).
pub(crate) const DEFERRED_FRAMES: usize = 16;
/// Allocator calls a thread's signal handlers may make during one recorded operation.
pub(crate) const DEFERRED_CAP: usize = 1024;

/// A thread's queue of allocator calls made by signal handlers that interrupted its
/// recording (LeakSanitizer and heaptrack lose these; so did we). Appended only by handlers
/// on the owning thread (a handler can itself be interrupted by another, so the slot is
/// reserved with one atomic add), drained by the owning thread when the interrupted
/// operation ends — every append is complete by then, as a handler finishes before the code
/// it interrupted goes on. In an anonymous mapping made at the first deferral (about
/// 150 KiB of address space, touched as used), released at thread exit.
pub(crate) struct Deferred {
    head: AtomicU64,
    tail: AtomicU64,
    /// Calls that did not fit (allocations then go unrecorded; frees are done at once and
    /// their records stay open).
    lost: AtomicU64,
    ops: [Op; DEFERRED_CAP],
}

impl Deferred {
    pub(crate) fn is_empty(&self) -> bool {
        self.head.load(Ordering::Relaxed) == self.tail.load(Ordering::Relaxed)
    }

    /// Appends `op`; false when full.
    pub(crate) fn push(&self, op: &Op) -> bool {
        let i = self.tail.load(Ordering::Relaxed);
        if i - self.head.load(Ordering::Relaxed) >= DEFERRED_CAP as u64 {
            self.lost.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        // Reserve the slot first: a handler interrupting this one appends after it.
        let i = self.tail.fetch_add(1, Ordering::Relaxed);
        let slot = &self.ops[i as usize % DEFERRED_CAP] as *const Op as *mut Op;
        // SAFETY: the slot was reserved by this call alone; the drain reads it only after
        // this handler has returned.
        unsafe { slot.write(*op) };
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
        true
    }

    /// Takes the oldest queued call, if any (the owning thread only: handlers only append).
    pub(crate) fn pop(&self) -> Option<Op> {
        let h = self.head.load(Ordering::Relaxed);
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
        if h == self.tail.load(Ordering::Relaxed) {
            return None;
        }
        let op = self.ops[h as usize % DEFERRED_CAP];
        self.head.store(h + 1, Ordering::Relaxed);
        Some(op)
    }

    /// The calls that did not fit since the last look, counted back to zero.
    pub(crate) fn take_lost(&self) -> u64 {
        self.lost.swap(0, Ordering::Relaxed)
    }
}
