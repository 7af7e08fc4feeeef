//! Stack-trace interning: frames → stack id in the region's append-only stack table.
//!
//! A per-thread direct-mapped cache (hash → id) answers repeated stacks without touching shared
//! memory. Misses go to a private, lock-free open-addressing index arranged in levels of growing
//! size (4 Ki, 16 Ki, … slots): a level is used only once the probe window of every smaller level
//! is full, so memory follows the number of distinct stacks. Slots are never cleared, so an empty
//! slot in a probe window proves the stack is in no later level.

use crate::sys::map_anon;
use std::sync::atomic::{AtomicU64, Ordering};
use vmo_layout::RegionWriter;

const LEVELS: usize = 6; // 2^12 .. 2^22 slots
const FIRST_BITS: u32 = 12;
const PROBES: usize = 16;
/// Entries of the per-thread cache.
pub const CACHE: usize = 256;

/// The private stack index.
#[derive(Debug)]
pub struct StackIndex {
    levels: [(*const AtomicU64, usize); LEVELS],
}

// SAFETY: the slots are atomics in a mapping that is never unmapped.
unsafe impl Sync for StackIndex {}
// SAFETY: as above.
unsafe impl Send for StackIndex {}

impl StackIndex {
    /// Reserves the levels (lazily committed); `None` if the mapping fails.
    pub fn new() -> Option<Self> {
        let total: usize = (0..LEVELS)
            .map(|l| 1usize << (FIRST_BITS + 2 * l as u32))
            .sum();
        let base = map_anon(total * 8) as *const AtomicU64;
        if base.is_null() {
            return None;
        }
        let mut levels = [(std::ptr::null(), 0); LEVELS];
        let mut off = 0;
        for (l, lv) in levels.iter_mut().enumerate() {
            let n = 1usize << (FIRST_BITS + 2 * l as u32);
            // SAFETY: off + n <= total: the level lies in the mapping.
            *lv = (unsafe { base.add(off) }, n);
            off += n;
        }
        Some(StackIndex { levels })
    }

    /// Returns the id of `frames` (hash `hash`), appending it to the region if new; `None` when
    /// the stack table or this index is full.
    pub fn intern(&self, w: &RegionWriter, hash: u64, frames: &[u64]) -> Option<u32> {
        let tag = (hash >> 32) | 0x8000_0000;
        for &(slots, n) in &self.levels {
            for i in 0..PROBES {
                // SAFETY: the index is masked to the level's size.
                let slot = unsafe { &*slots.add((hash as usize).wrapping_add(i) & (n - 1)) };
                let mut v = slot.load(Ordering::Acquire);
                if v == 0 {
                    let id = w.append_stack(hash, frames)?;
                    match slot.compare_exchange(
                        0,
                        (tag << 32) | (id as u64 + 1),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => return Some(id),
                        Err(other) => v = other, // lost a race: our entry is wasted
                    }
                }
                if v >> 32 == tag {
                    let id = (v as u32).wrapping_sub(1);
                    if w.stack_equals(id, frames) {
                        return Some(id);
                    }
                }
            }
        }
        w.header()
            .dropped_stacks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        None
    }
}
