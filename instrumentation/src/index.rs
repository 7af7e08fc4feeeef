//! The address index: block address → node of the allocations table, private to the process.
//!
//! Only writers need to find a block's node (to erase it), so the index lives in private
//! memory, not in the region. It is split into [`SHARDS`] independent open-addressing tables,
//! each behind its own spin lock: two threads contend only when their addresses fall in the
//! same shard, and only for the few nanoseconds of a probe. Tables live in anonymous mappings
//! and double past 60% occupancy, so memory follows the number of live blocks.
//!
//! Removal shifts the following entries of the probe run back (Knuth's Algorithm R for linear
//! probing) instead of leaving tombstones: under churn a tombstone table fills up with dead
//! entries, lengthens every probe and must be rebuilt (a fresh mapping, page faults and an
//! `munmap` that interrupts every other core) again and again.

use crate::sys::{map_anon, unmap, SpinLock};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// Number of shards (a power of two).
pub const SHARDS: usize = 256;
const EMPTY: u64 = 0;

/// Addresses are stored with their top 16 bits flipped (`address ^ HIDE`): a value no user-space
/// pointer can have (x86-64 and AArch64 user addresses are below 2^48), so a conservative scan
/// of this process's memory — the collector's reference scan, LeakSanitizer, Boehm's collector
/// — does not take the index for a root that points at every live block. Never `EMPTY`.
const HIDE: u64 = 0xffff << 48;
const MIN_CAP: usize = 256;

#[repr(C)]
#[derive(Clone, Copy)]
struct Entry {
    address: u64,
    node: u32,
    /// The block's size, so an erase need not read the record (`u32::MAX`: 4 GiB or more,
    /// read it from the record).
    size: u32,
}

struct Table {
    entries: *mut Entry,
    cap: usize,
    len: usize,
}

#[repr(align(64))]
struct Shard {
    table: SpinLock<Table>,
    /// Copies of `table.entries` and `table.cap` for [`AddressIndex::prefetch`], read without
    /// the lock (a stale pair only makes the prefetch useless).
    hint_entries: AtomicPtr<Entry>,
    hint_cap: AtomicUsize,
}

/// The index could not map memory for a larger table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfMemory;

/// The sharded index.
pub struct AddressIndex {
    shards: [Shard; SHARDS],
}

impl std::fmt::Debug for AddressIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddressIndex").finish_non_exhaustive()
    }
}

// SAFETY: a table's entries are an owned mapping, only reached through its shard's lock (or,
// in `entries`, by a single thread per its contract).
unsafe impl Send for Table {}

/// MurmurHash3's fmix64.
#[inline]
fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    h ^= h >> 33;
    h = h.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    h ^ (h >> 33)
}

/// Shard selector: the address's 1 MiB group, mixed (top byte used).
#[inline]
fn hash(address: u64) -> u64 {
    mix(address >> 20)
}

/// Locality-preserving slot in a table of `cap` (a power of two, at least 256) entries: the
/// address's 1 KiB chunk (64 granules of 16 bytes) is hashed to a random 64-slot-aligned run,
/// and the granule's offset in the chunk picks the slot in it. Blocks allocated next to each
/// other (a heap carving consecutive chunks) fill the same few table cache lines, while chunks
/// land at random like the entries of a bucketed hash table, so linear probing does not build
/// long clusters (a structured mapping of whole 1 MiB spans did, at 10 M blocks).
#[inline]
fn slot_of(address: u64, cap: usize) -> usize {
    (((mix(address >> 10) << 6) + ((address >> 4) & 63)) as usize) & (cap - 1)
}

impl AddressIndex {
    /// An empty index (no memory mapped until the first insert).
    pub const fn new() -> Self {
        AddressIndex {
            shards: [const {
                Shard {
                    table: SpinLock::new(Table {
                        entries: std::ptr::null_mut(),
                        cap: 0,
                        len: 0,
                    }),
                    hint_entries: AtomicPtr::new(std::ptr::null_mut()),
                    hint_cap: AtomicUsize::new(0),
                }
            }; SHARDS],
        }
    }

    #[inline]
    fn shard(&self, h: u64) -> &Shard {
        &self.shards[(h >> 56) as usize % SHARDS]
    }

    /// Starts loading the table line where `address` would be found into the cache, so that a
    /// later [`Self::insert`] or [`Self::remove`] of it does not wait for memory.
    #[inline]
    pub fn prefetch(&self, address: u64) {
        let address = address ^ HIDE;
        let shard = self.shard(hash(address));
        let cap = shard.hint_cap.load(Ordering::Relaxed);
        let entries = shard.hint_entries.load(Ordering::Relaxed);
        if cap == 0 {
            return;
        }
        let p = entries.wrapping_add(slot_of(address, cap));
        crate::sys::prefetch(p as *const u8);
    }

    /// Maps `address` to `node` (a block of `size` bytes, saturated at `u32::MAX`). Returns the
    /// node it was mapped to before (a block whose free the shim never saw).
    ///
    /// # Errors
    /// [`OutOfMemory`] when memory for a larger table could not be mapped.
    pub fn insert(&self, address: u64, node: u32, size: u32) -> Result<Option<u32>, OutOfMemory> {
        let address = address ^ HIDE;
        debug_assert!(address != EMPTY);
        let h = hash(address);
        let shard = self.shard(h);
        let mut t = shard.table.lock();
        let cap = t.cap;
        let r = insert_locked(&mut t, address, node, size);
        if t.cap != cap {
            shard.hint_entries.store(t.entries, Ordering::Relaxed);
            shard.hint_cap.store(t.cap, Ordering::Relaxed);
        }
        r
    }

    /// Removes `address`, returning its node and size (as given to `insert`), or `None` if it
    /// is not indexed.
    pub fn remove(&self, address: u64) -> Option<(u32, u32)> {
        let address = address ^ HIDE;
        let h = hash(address);
        let shard = self.shard(h);
        remove_locked(&mut shard.table.lock(), address)
    }

    /// Takes every shard lock (before `fork`, so the child gets a consistent index).
    pub fn lock_all(&self) {
        for s in &self.shards {
            s.table.lock_for_fork();
        }
    }

    /// Releases every shard lock (after `fork`, in parent and child).
    ///
    /// # Safety
    /// [`AddressIndex::lock_all`] took the locks (no guard exists).
    pub unsafe fn unlock_all(&self) {
        for s in &self.shards {
            // SAFETY: per the contract.
            unsafe { s.table.unlock_after_fork() };
        }
    }

    /// Every `(address, node)` entry, without locking.
    ///
    /// # Safety
    /// No other thread may use the index while the iterator lives (a forked child, before it
    /// starts threads).
    pub unsafe fn entries(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.shards.iter().flat_map(|s| {
            // SAFETY: single-threaded per the contract.
            let t = unsafe { &*s.table.get_unlocked() };
            let (entries, cap) = (t.entries, t.cap);
            (0..cap).filter_map(move |i| {
                // SAFETY: i < cap, and the table is not modified meanwhile (contract).
                let e = unsafe { *entries.add(i) };
                (e.address != EMPTY).then_some((e.address ^ HIDE, e.node))
            })
        })
    }

    /// Live entries (for tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.table.lock().len).sum()
    }

    /// Whether no address is indexed.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for AddressIndex {
    fn default() -> Self {
        Self::new()
    }
}

fn insert_locked(
    t: &mut Table,
    address: u64,
    node: u32,
    size: u32,
) -> Result<Option<u32>, OutOfMemory> {
    // Grow past 60% occupancy.
    if (t.len + 1) * 5 > t.cap * 3 {
        grow(t)?;
    }
    let mask = t.cap - 1;
    let mut i = slot_of(address, t.cap);
    loop {
        // SAFETY: i <= mask < cap; entries has cap elements.
        let e = unsafe { &mut *t.entries.add(i) };
        if e.address == address {
            let old = e.node;
            e.node = node;
            e.size = size;
            return Ok(Some(old));
        }
        if e.address == EMPTY {
            *e = Entry {
                address,
                node,
                size,
            };
            t.len += 1;
            return Ok(None);
        }
        i = (i + 1) & mask;
    }
}

fn remove_locked(t: &mut Table, address: u64) -> Option<(u32, u32)> {
    if t.cap == 0 {
        return None;
    }
    let mask = t.cap - 1;
    let mut i = slot_of(address, t.cap);
    let found = loop {
        // SAFETY: i < cap.
        let e = unsafe { *t.entries.add(i) };
        if e.address == address {
            break (e.node, e.size);
        }
        if e.address == EMPTY {
            return None;
        }
        i = (i + 1) & mask;
    };
    t.len -= 1;
    // Close the hole at `i`: an entry further along the run moves into it unless its home slot
    // lies cyclically after the hole (then a lookup starting at its home would not pass the
    // hole, so it must stay).
    let mut hole = i;
    let mut j = (i + 1) & mask;
    loop {
        // SAFETY: j < cap.
        let e = unsafe { *t.entries.add(j) };
        if e.address == EMPTY {
            break;
        }
        let home = slot_of(e.address, t.cap);
        if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
            // SAFETY: hole < cap.
            unsafe { *t.entries.add(hole) = e };
            hole = j;
        }
        j = (j + 1) & mask;
    }
    // SAFETY: hole < cap.
    unsafe { (*t.entries.add(hole)).address = EMPTY };
    Some(found)
}

fn grow(t: &mut Table) -> Result<(), OutOfMemory> {
    let new_cap = (t.len * 3).next_power_of_two().max(MIN_CAP);
    let bytes = new_cap * std::mem::size_of::<Entry>();
    let entries = map_anon(bytes) as *mut Entry;
    if entries.is_null() {
        return Err(OutOfMemory);
    }
    // Fault the whole table in, writable, now: probing reads slots before writing them, and a
    // page first read is the shared zero page, whose copy on the first write flushes the TLB of
    // every core running a thread of the process (an IPI each: 12% of an 8-thread
    // allocation-only phase). Hashing spreads entries over every page soon anyway.
    // SAFETY: the range is the mapping just made; populating changes no content (zeros).
    unsafe {
        libc::madvise(
            entries as *mut libc::c_void,
            bytes,
            23, /* MADV_POPULATE_WRITE */
        )
    };
    let mut nt = Table {
        entries,
        cap: new_cap,
        len: 0,
    };
    for i in 0..t.cap {
        // SAFETY: i < old cap.
        let e = unsafe { *t.entries.add(i) };
        if e.address != EMPTY {
            let _ = insert_locked(&mut nt, e.address, e.node, e.size);
        }
    }
    if !t.entries.is_null() {
        // SAFETY: the old table came from map_anon with this size and is no longer referenced.
        unsafe { unmap(t.entries as *mut u8, t.cap * std::mem::size_of::<Entry>()) };
    }
    *t = nt;
    Ok(())
}

/// Number of counters in a [`Presence`] filter.
const PRESENCE: usize = 1 << 14;

/// A counting filter over the indexed addresses, used in sampling mode so that the free of a
/// block that was not sampled (nearly all of them) is dismissed without touching the index.
///
/// Each address maps to one of 16,384 one-byte counters (16 KiB, which stays in the cache);
/// a counter holds how many indexed addresses map to it, saturating at 255 (then it stays
/// there). A zero counter proves the address is not indexed; a nonzero one means "look it up".
/// Relaxed atomics suffice: the insert that counted a block happens-before its free through
/// the program's own hand-over of the pointer.
pub struct Presence {
    counts: [AtomicU8; PRESENCE],
    /// Addresses counted and not uncounted (not saturating): while 0, which is the common case
    /// when sampled blocks have headers instead of index entries, no address is indexed and
    /// [`Self::may_contain`] answers from this one rarely written word, not from a counter that
    /// may be out of the cache. Each uncount follows its own count (the program hands the
    /// pointer over between them), so this never drops to 0 while an address is indexed.
    live: AtomicU64,
}

/// Offset (bytes) of [`Presence`]'s count of indexed addresses, for the preloaded `free`'s
/// assembly entry (a zero count: no address is indexed).
#[doc(hidden)]
pub const PRESENCE_LIVE_OFFSET: usize = std::mem::offset_of!(Presence, live);

impl std::fmt::Debug for Presence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Presence").finish_non_exhaustive()
    }
}

impl Presence {
    /// An empty filter.
    pub const fn new() -> Self {
        Presence {
            counts: [const { AtomicU8::new(0) }; PRESENCE],
            live: AtomicU64::new(0),
        }
    }

    #[inline]
    fn counter(&self, address: u64) -> &AtomicU8 {
        &self.counts[(mix(address >> 4) >> 50) as usize % PRESENCE]
    }

    /// False only if `address` is certainly not indexed.
    #[inline]
    pub fn may_contain(&self, address: u64) -> bool {
        self.live.load(Ordering::Relaxed) != 0 && self.counter(address).load(Ordering::Relaxed) != 0
    }

    /// Counts a newly indexed `address`.
    pub fn add(&self, address: u64) {
        self.live.fetch_add(1, Ordering::Relaxed);
        let _ = self
            .counter(address)
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                (v != u8::MAX).then_some(v + 1)
            });
    }

    /// Uncounts an `address` removed from the index (a saturated counter stays saturated).
    pub fn sub(&self, address: u64) {
        self.live.fetch_sub(1, Ordering::Relaxed);
        let _ = self
            .counter(address)
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                (v != u8::MAX && v != 0).then_some(v - 1)
            });
    }
}

impl Default for Presence {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn matches_a_hashmap() {
        let idx = AddressIndex::new();
        let mut reference = HashMap::new();
        let mut x: u64 = 0x1234_5678;
        for i in 0..200_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let addr = ((x % 50_000) + 1) << 4;
            if x.is_multiple_of(3) {
                assert_eq!(idx.remove(addr).map(|x| x.0), reference.remove(&addr));
            } else {
                assert_eq!(idx.insert(addr, i, i).unwrap(), reference.insert(addr, i));
            }
        }
        assert_eq!(idx.len(), reference.len());
        for (a, n) in reference {
            assert_eq!(idx.remove(a), Some((n, n)));
        }
        assert!(idx.is_empty());
    }

    #[test]
    fn presence_has_no_false_negatives() {
        let p = Presence::new();
        let addrs: Vec<u64> = (1..100_000u64).map(|i| i * 48).collect();
        for a in &addrs {
            p.add(*a);
        }
        assert!(addrs.iter().all(|a| p.may_contain(*a)));
        for a in &addrs[..50_000] {
            p.sub(*a);
        }
        // Saturated counters stay set; the rest must still cover every remaining address.
        assert!(addrs[50_000..].iter().all(|a| p.may_contain(*a)));
        let q = Presence::new();
        q.add(4096);
        q.sub(4096);
        assert!(!q.may_contain(4096));
        assert!(!q.may_contain(8192) || q.may_contain(4096));
    }
}
