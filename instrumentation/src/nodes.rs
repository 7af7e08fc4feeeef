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
#[inline]
pub fn take_node(g: &Global, t: &Tls, now: u64) -> Option<u32> {
    if let Some(n) = ring_front(t) {
        if g.writer.node_reusable(n, now) {
            ring_pop(t);
            return Some(n);
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
    let (s, e) = g.writer.claim_nodes(BATCH as u64)?;
    t.fresh_next.set(s as u32 + 1);
    t.fresh_end.set(e as u32);
    Some(s as u32)
}

/// Returns a dead node to the thread's cache (spilling a batch to the shared list when full).
#[inline]
pub fn recycle_node(g: &Global, t: &Tls, n: u32) {
    if t.ring_len.get() == RING {
        let mut batch = [0u32; BATCH];
        for b in batch.iter_mut() {
            *b = ring_pop(t).unwrap_or(0);
        }
        g.free.push(&batch);
    }
    ring_push(t, n);
}

pub(crate) fn flush_nodes(g: &Global, t: &Tls) {
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
