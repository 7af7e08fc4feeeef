//! Allocator calls made by signal handlers that interrupt the shim's recording: queued per
//! thread and recorded when the interrupted operation ends (see ARCHITECTURE.md, "Start-up
//! and process events", reentrancy guard).

use crate::state::{acquire_slot, with_tls, Global, Tls};
use crate::sys::map_anon;
use std::sync::atomic::{AtomicU64, Ordering};

/// The function that really frees a block whose free was deferred (`__libc_free` for
/// `libheapdump.so`); 0 when frees are never deferred, only their records.
pub(crate) static REAL_FREE: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Registers the function that frees blocks for real (see [`defer`]). With it, a free made by
/// a signal handler while its thread is recording is held back until the record is closed,
/// so the address cannot be handed out again before.
pub fn set_real_free(f: unsafe extern "C" fn(*mut libc::c_void)) {
    REAL_FREE.store(f as usize, Ordering::Relaxed);
}

/// One allocator call deferred from a signal handler.
#[derive(Clone, Copy)]
pub(crate) struct Op {
    /// Block address.
    ptr: u64,
    /// Requested size; `FREE_OP` for a free, `FREE_HELD` for a free whose block the drain
    /// frees for real.
    size: u64,
    depth: u64,
    frames: [u64; DEFERRED_FRAMES],
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

    /// Records every queued call (oldest first), including those handlers add meanwhile.
    pub(crate) fn drain(&self, g: &'static Global, t: &Tls) {
        loop {
            let h = self.head.load(Ordering::Relaxed);
            std::sync::atomic::compiler_fence(Ordering::SeqCst);
            if h == self.tail.load(Ordering::Relaxed) {
                break;
            }
            let op = self.ops[h as usize % DEFERRED_CAP];
            self.head.store(h + 1, Ordering::Relaxed);
            if op.size == FREE_OP || op.size == FREE_HELD {
                crate::hooks::erase_deferred(g, t, op.ptr);
                let f = REAL_FREE.load(Ordering::Relaxed);
                if op.size == FREE_HELD && f != 0 {
                    // SAFETY: `f` was registered by set_real_free with this signature; the
                    // block was the program's and its free was held back for this.
                    unsafe {
                        std::mem::transmute::<usize, unsafe extern "C" fn(*mut libc::c_void)>(f)(
                            op.ptr as *mut libc::c_void,
                        )
                    };
                }
            } else {
                let n = (op.depth as usize).min(DEFERRED_FRAMES);
                crate::hooks::insert_deferred(g, t, op.ptr, op.size, &op.frames[..n]);
            }
        }
        let lost = self.lost.swap(0, Ordering::Relaxed);
        if lost != 0 {
            let held = acquire_slot(g, t);
            held.slot.dropped.store(
                held.slot.dropped.load(Ordering::Relaxed) + lost,
                Ordering::Relaxed,
            );
        }
    }
}

/// From a signal handler that interrupted this thread's recording: queues an allocation
/// (`frames` its stack) or a free (`size == None`) to be recorded when the interrupted
/// operation ends. For a free, returns true when the caller must not free the block: the
/// drain will, after closing its record (only with [`set_real_free`]).
pub fn defer(ptr: u64, size: Option<u64>, frames: &[u64], may_hold: bool) -> bool {
    with_tls(|t| {
        let mut d = t.deferred.get();
        if d.is_null() {
            d = map_anon(std::mem::size_of::<Deferred>()) as *mut Deferred;
            if d.is_null() {
                return false;
            }
            t.deferred.set(d);
        }
        let hold = may_hold && size.is_none() && REAL_FREE.load(Ordering::Relaxed) != 0;
        let mut op = Op {
            ptr,
            size: match size {
                Some(s) => s.min(FREE_HELD - 1),
                None if hold => FREE_HELD,
                None => FREE_OP,
            },
            depth: frames.len().min(DEFERRED_FRAMES) as u64,
            frames: [0; DEFERRED_FRAMES],
        };
        let n = op.depth as usize;
        op.frames[..n].copy_from_slice(&frames[..n]);
        // SAFETY: a zero-filled mapping is a valid, empty queue; only this thread uses it.
        let ok = unsafe { (*d).push(&op) };
        ok && hold
    })
}
