//! The queue of dead nodes shared between threads ([`FreeNodes`]), behind a spin lock.

use crate::sys::{map_anon, SpinLock};

/// Nodes per batch moved between a thread cache and the shared free list.
pub(crate) const BATCH: usize = 32;

/// Dead nodes shared between threads: a FIFO queue of node ids behind a spin lock, touched once
/// per [`BATCH`] frees or allocations at most. Oldest first, because a node freed long ago is
/// the one a snapshot's lease lets us rewrite. The queue is a ring buffer in an anonymous
/// mapping that doubles when full (up to the allocations table's capacity), so its memory
/// follows the largest number of dead nodes waiting at once.
#[derive(Debug)]
pub struct FreeNodes {
    pub(crate) q: SpinLock<Queue>,
    max: usize,
    /// The queue's length, written under the lock, read without it: a thread whose own nodes
    /// ran out (an allocation-only phase) sees an empty queue without taking the lock shared
    /// by all threads (one lock per allocation made 8 allocating threads 5× slower).
    len: std::sync::atomic::AtomicUsize,
}

#[derive(Debug)]
pub(crate) struct Queue {
    buf: *mut u32,
    /// A power of two, or 0.
    cap: usize,
    head: usize,
    len: usize,
}

// SAFETY: the queue's buffer is owned by the queue and only reached through its lock.
unsafe impl Send for Queue {}

impl FreeNodes {
    pub(crate) fn new(max: u64) -> Option<Self> {
        Some(FreeNodes {
            q: SpinLock::new(Queue {
                buf: std::ptr::null_mut(),
                cap: 0,
                head: 0,
                len: 0,
            }),
            max: (max as usize).max(BATCH).next_power_of_two(),
            len: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Appends `ids` (dropping what does not fit when memory for the queue cannot be mapped:
    /// those nodes are then never reused).
    pub(crate) fn push(&self, ids: &[u32]) {
        let mut q = self.q.lock();
        self.append(&mut q, ids);
    }

    /// Appends `older` then `ids` if the lock is free at once; false (nothing appended) when
    /// another thread holds it.
    pub(crate) fn try_push(&self, older: &[u32], ids: &[u32]) -> bool {
        let Some(mut q) = self.q.try_lock() else {
            return false;
        };
        self.append(&mut q, older);
        self.append(&mut q, ids);
        true
    }

    /// Appends `ids` to the locked queue `q` (see [`FreeNodes::push`]).
    fn append(&self, q: &mut Queue, ids: &[u32]) {
        if q.len + ids.len() > q.cap {
            grow(q, q.len + ids.len(), self.max);
        }
        let k = ids.len().min(q.cap - q.len);
        for (i, id) in ids[..k].iter().enumerate() {
            // SAFETY: cap is a power of two and the index is masked into [0, cap).
            unsafe { *q.buf.add((q.head + q.len + i) & (q.cap - 1)) = *id };
        }
        q.len += k;
        self.len.store(q.len, std::sync::atomic::Ordering::Relaxed);
    }

    /// Moves up to `out.len()` of the oldest ids into `out`; returns how many.
    /// Whether the queue looks empty (its mirrored length, read without the lock: see
    /// [`Self::pop`]).
    #[inline(always)]
    pub(crate) fn looks_empty(&self) -> bool {
        self.len.load(std::sync::atomic::Ordering::Relaxed) == 0
    }

    pub(crate) fn pop(&self, out: &mut [u32]) -> usize {
        // A stale zero only means fresh nodes are taken this time; a stale non-zero, one
        // needless trip through the lock.
        if self.len.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            return 0;
        }
        let mut q = self.q.lock();
        let q = &mut *q;
        let k = out.len().min(q.len);
        for (i, o) in out[..k].iter_mut().enumerate() {
            // SAFETY: as in push; k <= len, so these slots hold queued ids.
            *o = unsafe { *q.buf.add((q.head + i) & (q.cap - 1)) };
        }
        if k > 0 {
            q.head = (q.head + k) & (q.cap - 1);
            q.len -= k;
            self.len.store(q.len, std::sync::atomic::Ordering::Relaxed);
        }
        k
    }
}

/// Doubles `q` until it holds `need` ids (at most `max`), keeping their order.
pub(crate) fn grow(q: &mut Queue, need: usize, max: usize) {
    let mut cap = q.cap.max(4096);
    while cap < need && cap < max {
        cap *= 2;
    }
    if cap <= q.cap {
        return;
    }
    let buf = map_anon(cap * 4) as *mut u32;
    if buf.is_null() {
        return;
    }
    for i in 0..q.len {
        // SAFETY: i < len <= old cap; the new buffer holds cap >= len ids.
        unsafe { *buf.add(i) = *q.buf.add((q.head + i) & (q.cap - 1)) };
    }
    if !q.buf.is_null() {
        // SAFETY: the old buffer came from map_anon with this size and is no longer used.
        unsafe { crate::sys::unmap(q.buf as *mut u8, q.cap * 4) };
    }
    *q = Queue {
        buf,
        cap,
        head: 0,
        len: q.len,
    };
}
