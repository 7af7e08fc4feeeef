//! Records (nodes) of the allocations table: taking one for a new block, recycling dead ones
//! oldest first through a per-thread ring, a stash and a shared queue (see ARCHITECTURE.md,
//! "Writer-private structures", node recycling).

use crate::shared::{Global, Tls, BATCH, RING};

// ---- nodes ------------------------------------------------------------------------------

/// Takes a node for a new block at time `now`: a recycled one no reader may still need, else a
/// never-used one. `None` when the allocations table is full.
///
/// Dead nodes are reused oldest first: the thread's own ring, then the shared queue (nodes
/// other threads freed, and this thread's overflow), and only then never-used nodes. While a
/// snapshot holds its lease, nodes freed since it began may not be rewritten, so the ring's
/// oldest is refused and older nodes from the shared queue are taken instead: the allocations
/// table does not grow with each snapshot, and no fresh page of the region is touched.
///
/// An allocation-only phase takes never-used nodes one after another: when nothing dead is
/// held anywhere (ring, stash, spill, shared queue) and the thread's batch of fresh nodes has
/// one left, it is taken here, as `take_node_slow` would (bench/phases.c 4 × 100,000,
/// cachegrind: about 30 of the 43 instructions of each such call were its checks).
#[inline]
pub fn take_node(g: &Global, t: &Tls, now: u64) -> Option<u32> {
    if let Some(n) = ring_front(t) {
        if g.writer.node_reusable(n, now) {
            ring_pop(t);
            return Some(n);
        }
    } else {
        let next = t.fresh_next.get();
        if t.stash_head.get() == t.stash_len.get()
            && t.spill_len.get() == 0
            && g.free.looks_empty()
            && next < t.fresh_end.get()
        {
            t.fresh_next.set(next + 1);
            return Some(next);
        }
    }
    take_node_slow(g, t, now)
}

#[cold]
pub(crate) fn take_node_slow(g: &Global, t: &Tls, now: u64) -> Option<u32> {
    // A snapshot is scanning: the ring's oldest node died during it, but the scan may have
    // passed younger ones (their index below its progress), which may be rewritten already.
    // Picking one of those — by index, without touching the nodes — keeps busy threads from
    // taking fresh nodes for the whole scan (the allocations table would grow by that much).
    let progress = g.writer.scan_progress();
    if progress > 0 {
        // SAFETY: the ring is only touched by its own thread, inside the reentrancy guard.
        let ring = unsafe { &mut *t.ring.get() };
        let (head, len) = (t.ring_head.get(), t.ring_len.get());
        for k in 1..len {
            let i = (head + k) % RING;
            let n = ring[i];
            if (n as u64) < progress && g.writer.node_reusable(n, now) {
                // Take it; the older front node moves into its place.
                ring[i] = ring[head];
                ring[head] = n;
                return ring_pop(t);
            }
        }
    }
    if t.stash_head.get() == t.stash_len.get() {
        // This thread's spilled nodes are older than the ring's: queue them first.
        flush_spill(g, t);
        // SAFETY: the stash is only touched by its own thread, inside the reentrancy guard.
        let k = g.free.pop(unsafe { &mut *t.stash.get() });
        t.stash_head.set(0);
        t.stash_len.set(k);
    }
    let h = t.stash_head.get();
    if h < t.stash_len.get() {
        // SAFETY: as above; h < stash_len <= BATCH.
        let n = unsafe { (*t.stash.get())[h] };
        if g.writer.node_reusable(n, now) {
            t.stash_head.set(h + 1);
            return Some(n);
        }
    }
    let next = t.fresh_next.get();
    if next < t.fresh_end.get() {
        t.fresh_next.set(next + 1);
        return Some(next);
    }
    let Some((s, e)) = g.writer.claim_nodes(BATCH as u64) else {
        crate::region::table_full(&g.writer);
        return None;
    };
    t.fresh_next.set(s as u32 + 1);
    t.fresh_end.set(e as u32);
    Some(s as u32)
}

/// Returns a dead node to the thread's cache (moving a batch to the shared list when full).
#[inline]
pub fn recycle_node(g: &Global, t: &Tls, n: u32) {
    if t.ring_len.get() == RING {
        let mut batch = [0u32; BATCH];
        for b in batch.iter_mut() {
            *b = ring_pop(t).unwrap_or(0);
        }
        push_or_spill(g, t, &batch);
    }
    ring_push(t, n);
}

/// Most ids a thread's spill holds (32 KiB, 256 batches): past that, a full ring waits for
/// the shared list's lock as before. It bounds what an idle thread keeps from other threads
/// (records only it can reuse): 8 Ki records, 320 KiB of the region.
const SPILL_MAX: usize = 1 << 13;
/// A spill's first mapping, in ids (4 KiB).
const SPILL_MIN: usize = 1024;

/// Queues `batch` on the shared list if its lock is free, with the thread's spilled nodes
/// before it; else keeps it in the thread's spill (an anonymous mapping of its own, up to
/// [`SPILL_MAX`] ids), queued at a later batch or when the thread next needs recycled
/// nodes. A freeing thread so never waits for a lock another thread holds — with more
/// threads than cores, for one descheduled while holding it (bench/phases.c's free phase
/// spent a sixth of its time there).
#[cold]
#[inline(never)]
fn push_or_spill(g: &Global, t: &Tls, batch: &[u32; BATCH]) {
    let (p, len, cap) = (t.spill.get(), t.spill_len.get(), t.spill_cap.get());
    let spilled: &[u32] = if len == 0 {
        &[]
    } else {
        // SAFETY: the thread's own spill: `len` ids written at `p` (see below).
        unsafe { std::slice::from_raw_parts(p, len) }
    };
    if g.free.try_push(spilled, batch) {
        t.spill_len.set(0);
        return;
    }
    // After the thread's exit handler nothing would queue a spill again.
    if t.exited.get() || (len + BATCH > cap && !grow_spill(t)) {
        flush_spill(g, t);
        g.free.push(batch);
        return;
    }
    let p = t.spill.get();
    // SAFETY: the spill holds `spill_cap >= len + BATCH` ids (checked or grown above).
    unsafe { std::ptr::copy_nonoverlapping(batch.as_ptr(), p.add(len), BATCH) };
    t.spill_len.set(len + BATCH);
}

/// Doubles the thread's spill (at most [`SPILL_MAX`] ids); false when it cannot grow.
fn grow_spill(t: &Tls) -> bool {
    let (old, len, cap) = (t.spill.get(), t.spill_len.get(), t.spill_cap.get());
    let new_cap = if cap == 0 { SPILL_MIN } else { cap * 2 };
    if new_cap > SPILL_MAX {
        return false;
    }
    let p = crate::sys::map_anon(new_cap * 4) as *mut u32;
    if p.is_null() {
        return false;
    }
    if !old.is_null() {
        // SAFETY: `len <= cap` ids at `old`, a mapping of `cap` ids from here; the new one
        // holds `new_cap > cap`.
        unsafe {
            std::ptr::copy_nonoverlapping(old, p, len);
            crate::sys::unmap(old as *mut u8, cap * 4);
        }
    }
    t.spill.set(p);
    t.spill_cap.set(new_cap);
    true
}

/// Queues the thread's spilled nodes on the shared list (waiting for its lock).
pub(crate) fn flush_spill(g: &Global, t: &Tls) {
    let len = t.spill_len.get();
    if len > 0 {
        // SAFETY: the thread's own spill: `len` ids written at `spill`.
        g.free
            .push(unsafe { std::slice::from_raw_parts(t.spill.get(), len) });
        t.spill_len.set(0);
    }
}

pub(crate) fn flush_nodes(g: &Global, t: &Tls) {
    flush_spill(g, t);
    let cap = t.spill_cap.replace(0);
    let p = t.spill.replace(std::ptr::null_mut());
    if !p.is_null() {
        // SAFETY: the spill's mapping of `cap` ids, empty (flushed above) and no longer
        // reachable from the thread's state.
        unsafe { crate::sys::unmap(p as *mut u8, cap * 4) };
    }
    let mut batch = [0u32; BATCH];
    let mut k = 0;
    while let Some(n) = ring_pop(t) {
        batch[k] = n;
        k += 1;
        if k == BATCH {
            g.free.push(&batch);
            k = 0;
        }
    }
    for h in t.stash_head.get()..t.stash_len.get() {
        // SAFETY: the stash is only touched by its own thread, inside the reentrancy guard.
        batch[k] = unsafe { (*t.stash.get())[h] };
        k += 1;
        if k == BATCH {
            g.free.push(&batch);
            k = 0;
        }
    }
    t.stash_head.set(0);
    t.stash_len.set(0);
    while t.fresh_next.get() < t.fresh_end.get() {
        batch[k] = t.fresh_next.get();
        t.fresh_next.set(t.fresh_next.get() + 1);
        k += 1;
        if k == BATCH {
            g.free.push(&batch);
            k = 0;
        }
    }
    g.free.push(&batch[..k]);
}

pub(crate) fn ring_front(t: &Tls) -> Option<u32> {
    if t.ring_len.get() == 0 {
        return None;
    }
    // SAFETY: the ring is only touched by its own thread, inside the reentrancy guard.
    Some(unsafe { (*t.ring.get())[t.ring_head.get()] })
}

pub(crate) fn ring_pop(t: &Tls) -> Option<u32> {
    let n = ring_front(t)?;
    t.ring_head.set((t.ring_head.get() + 1) % RING);
    t.ring_len.set(t.ring_len.get() - 1);
    Some(n)
}

pub(crate) fn ring_push(t: &Tls, n: u32) {
    debug_assert!(t.ring_len.get() < RING);
    let i = (t.ring_head.get() + t.ring_len.get()) % RING;
    // SAFETY: as in ring_front.
    unsafe { (*t.ring.get())[i] = n };
    t.ring_len.set(t.ring_len.get() + 1);
}
