//! The writer side: lays out a fresh region and performs the insert/erase protocol on it.
//!
//! Nothing here allocates or locks, and system calls are made only by [`Backing`], once per
//! chunk of a section that the region grows into, and by the liveness check of a lease's
//! holder ([`RegionWriter::lease_holder_gone`], at most every few ms, only while a lease blocks
//! recycling); the shim calls these functions from inside
//! `malloc`. Concurrency contract (see `ARCHITECTURE.md`):
//!
//! * a node is written only by the thread that took it from the pool (or erases it);
//! * every insert or erase runs between [`RegionWriter::op_begin`] and [`RegionWriter::op_end`]
//!   on the calling thread's own slot, and reads its timestamp *inside* that window;
//! * a dead node is rewritten only when [`RegionWriter::node_reusable`] says no reader may
//!   still need it.

use crate::clock::{now_ns, realtime_ns};
use crate::v1::*;
use std::mem::size_of;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};

/// Who the writer is; stored in the header.
#[derive(Debug, Clone, Copy)]
pub struct ProcessIdentity<'a> {
    /// Process id.
    pub pid: u32,
    /// Start time in clock ticks since boot (`/proc/self/stat` field 22).
    pub start_ticks: u64,
    /// `st_dev` of `/proc/self/exe`.
    pub exe_dev: u64,
    /// `st_ino` of `/proc/self/exe`.
    pub exe_ino: u64,
    /// Executable path (truncated to [`PATH_BYTES`] - 1).
    pub exe_path: &'a [u8],
    /// Command line, NUL-separated (truncated).
    pub cmdline: &'a [u8],
    /// Sampling interval in bytes, 0 when every allocation is recorded.
    pub sample_interval: u64,
}

/// Handle on a mapped region for the process that owns it. `Copy`: it is a pointer and offsets.
#[derive(Debug, Clone, Copy)]
pub struct RegionWriter {
    base: *mut u8,
    sections: [SectionV1; section::COUNT],
    /// Reserves storage for pages before their first write; null when the mapping needs none
    /// (anonymous memory, tests).
    backing: *const Backing,
}

// SAFETY: the region is shared memory accessed only through atomics (or, for the module
// table, under the writer's own lock plus the module seqlock); the raw pointer stays valid for
// the life of the mapping, which the shim never unmaps.
unsafe impl Send for RegionWriter {}
// SAFETY: see `Send`.
unsafe impl Sync for RegionWriter {}

impl RegionWriter {
    /// Lays out a new region in `base[..len]` and returns its writer.
    ///
    /// Returns `None` when `len` is smaller than the plan for `caps` needs.
    ///
    /// # Safety
    /// `base` must point to a writable, zero-filled, page-aligned shared mapping of `len` bytes
    /// that stays mapped for the rest of the process and that no one else writes yet.
    pub unsafe fn create(
        base: *mut u8,
        len: u64,
        caps: &Capacities,
        id: &ProcessIdentity<'_>,
    ) -> Option<Self> {
        let (sections, total) = plan(caps);
        if total > len {
            return None;
        }
        // SAFETY: the caller guarantees `base` is a writable, aligned mapping of at least
        // HEADER_SIZE bytes (total > HEADER_SIZE) that no one else accesses yet.
        let h = unsafe { &mut *(base as *mut HeaderV1) };
        h.magic = MAGIC;
        h.layout_version = LAYOUT_VERSION;
        h.header_size = HEADER_SIZE as u32;
        h.region_size = len;
        h.section_count = section::COUNT as u32;
        h.section_entry_size = size_of::<SectionV1>() as u32;
        h.pid = id.pid;
        h.start_ticks = id.start_ticks;
        h.created_realtime_ns = realtime_ns();
        h.created_monotonic_ns = now_ns();
        h.exe_dev = id.exe_dev;
        h.exe_ino = id.exe_ino;
        h.sample_interval = id.sample_interval;
        h.named_hold_limit = NAMED_HOLD_DEFAULT;
        h.flags = FLAG_OP_NODE | FLAG_LEASE_FLOOR | FLAG_PYTHON_FRAMES;
        h.sections[..section::COUNT].copy_from_slice(&sections);
        copy_truncated(&mut h.exe_path, id.exe_path);
        copy_truncated(&mut h.cmdline, id.cmdline);
        Some(RegionWriter {
            base,
            sections,
            backing: std::ptr::null(),
        })
    }

    /// From now on, reserve the storage of every page of the region before it is first
    /// touched (written or read) through `backing`, and refuse to grow into pages whose storage
    /// cannot be reserved. Call before the writer is shared with other threads.
    ///
    /// Only the header page must already be backed: everything else is reserved on demand.
    pub fn set_backing(&mut self, backing: &'static Backing) {
        backing.reset();
        self.backing = backing;
    }

    /// Whether entries `[0, end)` of section `kind` may be touched (their storage reserved).
    #[inline]
    fn backed(&self, kind: u32, end: u64) -> bool {
        if self.backing.is_null() {
            return true;
        }
        // SAFETY: set from a `&'static Backing`.
        let b = unsafe { &*self.backing };
        let have = b.backed[kind as usize - 1].load(Ordering::Acquire);
        if end <= have {
            // Reserve the next chunk before anyone needs it: a thread that finds the section
            // close to its reserved end grows it if nobody else is doing so, and goes on
            // either way; only a thread past the reserved end ever waits.
            let es = self.sections[kind as usize - 1].entry_size as u64;
            // Ahead by an eighth of what the section holds (64 KiB to 512 KiB): a small
            // section — most of them, in most programs — keeps little storage in reserve.
            // The boost is for the allocations table only: it is what threads outrun (every
            // allocation takes a record); a stack or thread table grows far more slowly.
            let mut ahead = (have * es / 8).clamp(BACKING_MIN_CHUNK, BACKING_AHEAD);
            if kind == section::ALLOCATIONS {
                ahead += b.boost.load(Ordering::Relaxed);
            }
            if (have - end) * es < ahead {
                // Ahead of `have`, so that a grow serves many claims (ahead of `end`, each
                // claim grew again: +10 instructions an operation on the storm). `have` may
                // be a grower's progress read just before it finished: at most `2 × ahead`
                // is then reserved beyond `end`.
                b.grow(self, kind, end, have + ahead / es.max(1), false);
            }
            return true;
        }
        b.grow(self, kind, end, end, true)
    }

    /// Writes the start-up warnings (`text`: lines ending in `\n`; truncated to
    /// [`WARNINGS_BYTES`] − 1 bytes).
    ///
    /// # Safety
    /// Only before the region is published ([`Self::set_state`] to [`STATE_READY`]) and before
    /// the writer is shared with other threads: the field is plain memory.
    pub unsafe fn set_warnings(&self, text: &[u8]) {
        // SAFETY: the caller guarantees nobody else accesses the header's warnings now; the
        // header lies in the mapping (checked by `create`).
        let h = unsafe { &mut *(self.base as *mut HeaderV1) };
        h.warnings = [0; WARNINGS_BYTES];
        copy_truncated(&mut h.warnings, text);
    }

    /// Sets `RECORDING_*` bits in the header's `recording_flags`.
    pub fn raise_recording_flag(&self, bits: u32) {
        let f = &self.header().recording_flags;
        if f.load(Ordering::Relaxed) & bits != bits {
            f.fetch_or(bits, Ordering::Relaxed);
        }
    }

    /// Marks the region ready for readers (Release: everything written before is visible).
    pub fn set_state(&self, state: u32) {
        self.header().state.store(state, Ordering::Release);
    }

    /// The region header.
    #[inline]
    pub fn header(&self) -> &HeaderV1 {
        // SAFETY: `create` checked the mapping holds a header; shared fields are atomics.
        unsafe { &*(self.base as *const HeaderV1) }
    }

    #[inline]
    fn entry<T>(&self, kind: u32, index: u64) -> &T {
        let s = &self.sections[kind as usize - 1];
        debug_assert!(index < s.capacity);
        // SAFETY: callers pass `index < capacity` (checked by every public caller); the section
        // lies inside the mapping (checked by `create`), and T is made of atomics.
        unsafe {
            &*(self
                .base
                .add((s.offset + index * s.entry_size as u64) as usize) as *const T)
        }
    }

    #[inline]
    fn capacity(&self, kind: u32) -> u64 {
        self.sections[kind as usize - 1].capacity
    }

    // ---- named snapshots ---------------------------------------------------------------

    /// Sets the most dead records kept for named snapshots (`HeaderV1::named_hold_limit`).
    ///
    /// # Safety
    /// Only before the region is published and the writer shared (the field is plain memory).
    pub unsafe fn set_named_hold_limit(&self, records: u64) {
        // SAFETY: as for `set_warnings`.
        let h = unsafe { &mut *(self.base as *mut HeaderV1) };
        h.named_hold_limit = records;
    }

    /// The timestamp of an allocator event whose clock reading is `t` (read inside its
    /// operation window), and the `named_last` it saw (0: no named snapshot; `u64::MAX`: one
    /// is being taken).
    ///
    /// The stamp is `t`, or just after the latest named snapshot `N` when `t <= N` (the clock
    /// is coarse: events after a snapshot in the same tick must not look earlier). Stamps stay
    /// consistent with the address-reuse order: `named_last` only grows, so a later event sees
    /// at least what an earlier one saw. A named snapshot reads its clock after storing
    /// `u64::MAX` into `named_last`; an event that still loaded the older value therefore read
    /// its own clock earlier and gets a stamp `<= N` (it happened before the snapshot); an
    /// event that loads `u64::MAX` is concurrent with it, stamped after the previous one, and
    /// keeps its record if it is a free (see `take_named_snapshot`).
    ///
    /// Stamps are also after the latest snapshot lease (`lease_last`, [`FLAG_LEASE_FLOOR`]):
    /// a reader takes its lease value as its instant `T` at once instead of waiting for the
    /// coarse clock to pass it, since an event whose window opened after the lease was stored
    /// loads it and is stamped after `T`. A value more than a second ahead of the clock (a
    /// damaged header) is ignored. Both floors live in the header line the call loads anyway.
    #[inline]
    pub fn stamp(&self, t: u64) -> (u64, u64) {
        let h = self.header();
        let last = h.named_last.load(Ordering::SeqCst);
        let leased = h.lease_last.load(Ordering::SeqCst);
        let mut floor = if leased <= t.saturating_add(1_000_000_000) {
            leased
        } else {
            0
        };
        if last != 0 {
            floor = floor.max(if last == TIME_NONE {
                h.named_floor.load(Ordering::SeqCst)
            } else {
                last
            });
        }
        (if t <= floor { floor + 1 } else { t }, last)
    }

    /// Records a named snapshot at the current instant: the blocks live now stay readable
    /// (their records are kept when freed, within `named_hold_limit`). No allocation, no
    /// system call except the clock; serialised by a spin lock of its own (named snapshots
    /// only, never taken by malloc or free).
    ///
    /// Protocol: store `u64::MAX` into `named_last` (frees that see it keep their record),
    /// read the clock, take `N = max(clock, previous + 1)`, write the entry, then store `N`
    /// into `named_floor` and `named_last`. See [`Self::stamp`] for why every event after the
    /// call is stamped after `N` and every event that did not see the call before it.
    ///
    /// Returns the entry's index, or `None` when the NAMED section is full or missing (then
    /// nothing is recorded).
    pub fn take_named_snapshot(&self, name: &[u8]) -> Option<u32> {
        static LOCK: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let h = self.header();
        let cap = self.capacity(section::NAMED);
        let idx = h.named_count.fetch_add(1, Ordering::Relaxed);
        if idx >= cap || !self.backed(section::NAMED, idx + 1) {
            return None;
        }
        while LOCK
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        let e: &NamedSnapshotV1 = self.entry(section::NAMED, idx);
        e.state.store(NAMED_WRITING, Ordering::Relaxed);
        let mut bytes = [0u8; NAME_BYTES];
        copy_truncated(&mut bytes, name);
        for (w, chunk) in e.name.iter().zip(bytes.chunks_exact(8)) {
            w.store(
                u64::from_ne_bytes(chunk.try_into().unwrap()),
                Ordering::Relaxed,
            );
        }
        let prev = h.named_floor.load(Ordering::SeqCst);
        h.named_last.store(TIME_NONE, Ordering::SeqCst);
        let now = now_ns();
        let t = if prev != 0 && now <= prev {
            prev + 1
        } else {
            now
        };
        e.time_ns.store(t, Ordering::Relaxed);
        e.realtime_ns.store(realtime_ns(), Ordering::Relaxed);
        e.state.store(NAMED_READY, Ordering::Release);
        h.named_floor.store(t, Ordering::SeqCst);
        h.named_last.store(t, Ordering::SeqCst);
        LOCK.store(0, Ordering::Release);
        Some(idx as u32)
    }

    /// Adds `k` records to the count kept for named snapshots; whether the count is still
    /// within `named_hold_limit`.
    #[cold]
    pub fn add_named_held(&self, k: u64) -> bool {
        let h = self.header();
        h.named_held.fetch_add(k, Ordering::Relaxed) + k <= h.named_hold_limit
    }

    /// Whether records are still being kept for named snapshots (the limit not reached).
    #[inline]
    pub fn named_holding(&self) -> bool {
        let h = self.header();
        h.named_held.load(Ordering::Relaxed) < h.named_hold_limit
    }

    /// A record born at `t_alloc` and needed by named snapshots is recycled anyway (the limit
    /// was reached): counted in `lost` of every named snapshot at or after `t_alloc`.
    #[cold]
    #[inline(never)]
    pub fn named_lost(&self, t_alloc: u64) {
        let h = self.header();
        let n = h
            .named_count
            .load(Ordering::Relaxed)
            .min(self.capacity(section::NAMED));
        for i in 0..n {
            let e: &NamedSnapshotV1 = self.entry(section::NAMED, i);
            if e.state.load(Ordering::Acquire) == NAMED_READY
                && e.time_ns.load(Ordering::Relaxed) >= t_alloc
            {
                e.lost.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// `t_alloc` of node `index` (a cache miss where the record is cold: only read once a
    /// named snapshot exists).
    #[inline]
    pub fn node_t_alloc(&self, index: u32) -> u64 {
        self.node(index).t_alloc.load(Ordering::Relaxed)
    }

    // ---- allocations table -------------------------------------------------------------

    /// Number of nodes the allocations table holds.
    #[inline]
    pub fn node_capacity(&self) -> u64 {
        self.capacity(section::ALLOCATIONS)
    }

    /// Takes `n` never-used nodes from the pool: returns `[start, end)`, shorter than `n` near the
    /// end, `None` when the pool is exhausted.
    pub fn claim_nodes(&self, n: u64) -> Option<(u64, u64)> {
        let cap = self.node_capacity();
        let h = self.header();
        if h.node_cursor.load(Ordering::Relaxed) >= cap {
            return None;
        }
        let mut start = h.node_cursor.load(Ordering::Relaxed);
        loop {
            if start >= cap {
                return None;
            }
            let end = (start + n).min(cap);
            // Never hand out a node whose page has no storage: writing it would raise SIGBUS.
            if !self.backed(section::ALLOCATIONS, end) {
                return None;
            }
            match h.node_cursor.compare_exchange_weak(
                start,
                end,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    // Map the batch's page (and, when the backing wrote it, its neighbours)
                    // by a read, before the writes (see `Backing::fill_zeros`).
                    // SAFETY: node `start` has storage (checked above) and lies in the mapping.
                    unsafe {
                        std::ptr::read_volatile(
                            &self.node(start as u32).t_alloc as *const AtomicU64 as *const u64,
                        )
                    };
                    return Some((start, end));
                }
                Err(now) => start = now,
            }
        }
    }

    /// The node at `index` (< [`Self::node_capacity`]).
    #[inline]
    pub fn node(&self, index: u32) -> &NodeV1 {
        assert!((index as u64) < self.node_capacity());
        self.entry(section::ALLOCATIONS, index as u64)
    }

    /// Writes a live block into node `index` with allocation time `t` (ns).
    ///
    /// Seqlock order: `t_alloc = TIME_NONE` first, fields, then `t_alloc = t` (Release).
    #[inline]
    pub fn publish_node(&self, index: u32, address: u64, size: u64, stack: u32, tid: u32, t: u64) {
        let n = self.node(index);
        n.t_alloc.store(TIME_NONE, Ordering::Relaxed);
        fence(Ordering::Release);
        n.address.store(address, Ordering::Relaxed);
        n.size.store(size, Ordering::Relaxed);
        n.stack.store(stack, Ordering::Relaxed);
        n.thread.store(tid, Ordering::Relaxed);
        n.t_free.store(TIME_NONE, Ordering::Relaxed);
        n.t_alloc.store(t, Ordering::Release);
    }

    /// Hints the CPU to start loading node `index`'s record (it will be written soon).
    #[inline]
    pub fn prefetch_node(&self, index: u32) {
        let p = self.node(index) as *const NodeV1 as *const i8;
        #[cfg(target_arch = "x86_64")]
        // SAFETY: PREFETCHT0 (SSE, part of the x86-64 baseline) only hints the cache and
        // cannot fault; `p` points into the mapped allocations table anyway.
        #[allow(unused_unsafe)]
        unsafe {
            core::arch::x86_64::_mm_prefetch(p, core::arch::x86_64::_MM_HINT_T0)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = p;
    }

    /// Marks node `index` freed at `t` (ns), without reading it (the caller knows the size).
    #[inline]
    pub fn mark_freed(&self, index: u32, t: u64) {
        self.node(index).t_free.store(t, Ordering::Release);
    }

    /// Marks node `index` freed at `t` (ns) and returns its size in bytes.
    #[inline]
    pub fn erase_node(&self, index: u32, t: u64) -> u64 {
        let n = self.node(index);
        n.t_free.store(t, Ordering::Release);
        n.size.load(Ordering::Relaxed)
    }

    /// Whether dead node `index` may be rewritten now (`now` = the caller's timestamp, ns):
    /// true unless a reader that started before the node died may still be copying.
    ///
    /// The common case is two loads of the header. Only when the reader lease blocks the
    /// rewrite does [`Self::lease_holder_gone`] check, at most every [`LEASE_CHECK_NS`] per
    /// process, whether the collector holding it is still alive (a collector killed with
    /// SIGKILL cannot clear its lease), and clear the lease of a dead one.
    #[inline]
    pub fn node_reusable(&self, index: u32, now: u64) -> bool {
        let h = self.header();
        let lease = h.lease.load(Ordering::SeqCst);
        let fork_lease = h.fork_lease.load(Ordering::SeqCst);
        // No lease (the common case): reusable without reading the record, whose cache line
        // the rewrite fetches later, after its prefetch (issue 20: the read here was a cache
        // miss on every allocation).
        if lease == 0 && fork_lease == 0 {
            return true;
        }
        let t_free = self.node(index).t_free.load(Ordering::Relaxed);
        let ok = |lease: u64| lease == 0 || t_free < lease || now.saturating_sub(lease) > LEASE_NS;
        if !ok(fork_lease) {
            return false;
        }
        // The holder check first: a dead collector's lease must be cleared even when its
        // published progress would let every rewrite through.
        ok(lease) || self.lease_holder_gone(lease, now) || self.scanned_by(lease, index)
    }

    /// Whether the reader holding `lease` (as just loaded) has finished reading node `index`
    /// ([`HeaderV1::lease_scanned`]). Loaded after the lease: a reader resets the progress
    /// before it stores a new lease, so progress read for this lease is this scan's or a
    /// later lease's, under whose rule the node is reusable too. The Acquire (SeqCst) load
    /// pairs with the reader's store after its reads of the node: they happen before our
    /// rewrite.
    ///
    /// Nodes the reader pinned ([`HeaderV1::lease_pinned`], read after the progress, which
    /// the reader stores after the pins) stay unwritable until the lease ends.
    ///
    /// A record born after the lease is reusable too, scanned or not: a reader that publishes
    /// its progress takes the lease as its instant `T` (or an earlier one), so that record was
    /// not live at `T`, and a rewrite the scan meets is one it skips (`t_alloc` is
    /// `u64::MAX` or later than `T` throughout). Busy threads allocate and free many
    /// short-lived blocks during a long lease: their records are recycled at once.
    #[inline]
    fn scanned_by(&self, lease: u64, index: u32) -> bool {
        let h = self.header();
        if h.lease_scanned_for.load(Ordering::SeqCst) != lease {
            return false;
        }
        if index as u64 >= h.lease_scanned.load(Ordering::SeqCst)
            && self.node(index).t_alloc.load(Ordering::Relaxed) <= lease
        {
            return false;
        }
        let pins = (h.lease_pinned_count.load(Ordering::Acquire) as usize).min(LEASE_PINNED);
        !h.lease_pinned[..pins]
            .iter()
            .any(|p| p.load(Ordering::Relaxed) == index)
    }

    /// How far the scan of the reader holding the current lease has got
    /// ([`HeaderV1::lease_scanned`]; 0 without a lease or progress): nodes below it may be
    /// reusable although freed during the lease, the ones above certainly are not unless freed
    /// before it. A hint for choosing among dead nodes; [`Self::node_reusable`] decides.
    #[inline]
    pub fn scan_progress(&self) -> u64 {
        let h = self.header();
        let lease = h.lease.load(Ordering::SeqCst);
        if lease == 0 || h.lease_scanned_for.load(Ordering::SeqCst) != lease {
            return 0;
        }
        h.lease_scanned.load(Ordering::SeqCst)
    }

    /// Called when `lease` (as just loaded) blocks a rewrite: whether its holder is known to
    /// be dead, in which case the lease is cleared (compare-exchange from `lease` to 0, so a
    /// newer collector's lease is never touched) and true returned.
    ///
    /// Rate-limited to one check per [`LEASE_CHECK_NS`] per process (a timestamp in an
    /// atomic; other threads meanwhile get false at once). The check: `kill(pid, 0)` fails with
    /// ESRCH, or `/proc/PID/stat` shows another start time than the one the collector recorded
    /// (a reused pid). A holder that cannot be checked (pid 0: another pid namespace) counts as
    /// alive; [`LEASE_NS`] still bounds its lease. System calls are made directly (no libc
    /// wrapper a program could interpose) and `errno` is preserved.
    #[cold]
    #[inline(never)]
    pub fn lease_holder_gone(&self, lease: u64, now: u64) -> bool {
        static LAST_CHECK: AtomicU64 = AtomicU64::new(0);
        let last = LAST_CHECK.load(Ordering::Relaxed);
        if now < last.saturating_add(LEASE_CHECK_NS)
            || LAST_CHECK
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        let h = self.header();
        let pid = h.lease_pid.load(Ordering::SeqCst);
        let ticks = h.lease_start_ticks.load(Ordering::SeqCst);
        if pid == 0 || pid > i32::MAX as u32 {
            return false;
        }
        let saved = errno();
        let gone = !process_alive(pid, ticks);
        set_errno(saved);
        // The identity was stored before the lease, and read after it: it is the identity of
        // the collector that stored `lease`, or of a later one (whose lease differs from
        // `lease`: readers never store the same lease value twice), so the exchange below
        // fails unless `lease` is still the dead collector's.
        gone && h
            .lease
            .compare_exchange(lease, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// The capacities this region was laid out with.
    pub fn capacities(&self) -> Capacities {
        let c = |k: u32| self.capacity(k);
        Capacities {
            nodes: c(section::ALLOCATIONS),
            stacks: c(section::STACK_ENTRIES),
            frames: c(section::STACK_FRAMES),
            threads: c(section::THREADS),
            modules: c(section::MODULES),
            named: c(section::NAMED),
            python_words: c(section::PYTHON),
        }
    }

    /// Fills this fresh region (a forked child's) from `parent`: the blocks live at the fork
    /// keep their node indices (so the inherited address index stays valid), everything else
    /// is dead; the stack table, stack counters and module table are copied up to their
    /// cursors. Returns the inherited (blocks, bytes), `None` when this region's file system
    /// has no room for the copy.
    ///
    /// `live` is the child's inherited address index as `(address, node)` pairs (the blocks
    /// live at the fork: its shards were locked across it), `fork_time` a stamp
    /// ([`Self::stamp`]) read before the fork. With a `scratch` bitmap of at least `node_cursor`
    /// bits the allocations table is copied whole (sequential: the nodes in index order were a
    /// cache miss each, 1 M blocks took 0.23 s), then fixed in one pass: a node of the index
    /// whose record was live at the fork is live (its `t_free`, if the parent freed it since,
    /// cleared), any other record the parent changed since the fork is zeroed. Without the
    /// bitmap (`scratch` too short) each indexed node is copied alone.
    ///
    /// The parent keeps running: its `fork_lease` must have been set before the fork, so no
    /// node live then is recycled while this copies.
    ///
    /// # Safety
    /// This region must be fresh, laid out with the parent's capacities, and written by no one
    /// else; `parent` must be mapped.
    pub unsafe fn inherit(
        &self,
        parent: &RegionWriter,
        live: impl Iterator<Item = (u64, u32)>,
        fork_time: u64,
        scratch: &mut [u64],
    ) -> Option<(u64, u64)> {
        let (ph, h) = (parent.header(), self.header());
        // Only what has storage in the parent is read, and only what has storage here is
        // written (`None` when this region's file system cannot hold the copy).
        let limit = |kind: u32, n: u64| n.min(parent.backed_len(kind)).min(self.capacity(kind));
        let cursor = limit(section::ALLOCATIONS, ph.node_cursor.load(Ordering::Acquire));
        let stacks = limit(
            section::STACK_ENTRIES,
            ph.stack_count.load(Ordering::Acquire),
        );
        let frames = limit(
            section::STACK_FRAMES,
            ph.frame_cursor.load(Ordering::Acquire),
        );
        let modules = limit(section::MODULES, ph.module_count.load(Ordering::Acquire));
        let python_cursor = ph.python_cursor.load(Ordering::Acquire);
        let python = limit(section::PYTHON, python_cursor.saturating_add(1));
        if !(self.backed(section::ALLOCATIONS, cursor)
            && self.backed(section::PYTHON, python)
            && self.backed(section::STACK_ENTRIES, stacks)
            && self.backed(section::STACK_FRAMES, frames)
            && self.backed(section::MODULES, modules))
        {
            return None;
        }
        let copy = |kind: u32, first: u64, count: u64| {
            let (ps, cs) = (
                &parent.sections[kind as usize - 1],
                &self.sections[kind as usize - 1],
            );
            let count = count
                .min(ps.capacity.saturating_sub(first))
                .min(cs.capacity.saturating_sub(first));
            let (off, n) = (first * cs.entry_size as u64, count * cs.entry_size as u64);
            // SAFETY: both ranges lie inside their sections (clamped to both capacities); the
            // regions are distinct mappings.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    parent.base.add((ps.offset + off) as usize),
                    self.base.add((cs.offset + off) as usize),
                    n as usize,
                )
            };
        };
        let (mut blocks, mut bytes) = (0u64, 0u64);
        // The child's per-stack allocation counts start from the blocks it inherits, as its
        // counters do (`allocations` = those blocks + what it allocates): not the parent's
        // history, which would make one profile say two things (`alloc_objects` far above the
        // `allocations` counter). Counted in stripe 0 for stacks the copy below covers.
        let count_inherited = |stack: u32, size: u64| {
            if (stack as u64) < stacks {
                self.count_alloc(stack, 0, size);
            }
        };
        if (scratch.len() as u64) * 64 >= cursor {
            let bits = &mut scratch[..cursor.div_ceil(64) as usize];
            bits.fill(0);
            for (_, i) in live {
                if (i as u64) < cursor {
                    bits[i as usize / 64] |= 1 << (i % 64);
                }
            }
            copy(section::ALLOCATIONS, 0, cursor);
            for i in 0..cursor as u32 {
                let n = self.node(i);
                let (ta, tf) = (
                    n.t_alloc.load(Ordering::Relaxed),
                    n.t_free.load(Ordering::Relaxed),
                );
                let indexed = bits[i as usize / 64] & (1 << (i % 64)) != 0;
                if indexed && ta != TIME_NONE && tf >= fork_time {
                    // Live at the fork (freed by the parent since, maybe).
                    n.t_free.store(TIME_NONE, Ordering::Relaxed);
                    let size = n.size.load(Ordering::Relaxed);
                    blocks += 1;
                    bytes += size;
                    count_inherited(n.stack.load(Ordering::Relaxed), size);
                } else if ta == TIME_NONE || (!indexed && tf >= fork_time) {
                    // Being rewritten by the parent, or live in the parent only (allocated or
                    // freed around the fork by a thread the child does not have).
                    n.t_alloc.store(0, Ordering::Relaxed);
                    n.t_free.store(0, Ordering::Relaxed);
                }
                // Else dead at the fork: kept as it is.
            }
        } else {
            for (address, i) in live {
                if i as u64 >= cursor {
                    continue;
                }
                if let Some((addr, size, stack, tid, t_alloc)) = parent.read_node_any(i) {
                    if addr == address {
                        self.publish_node(i, addr, size, stack, tid, t_alloc);
                        blocks += 1;
                        bytes += size;
                        count_inherited(stack, size);
                    }
                }
            }
        }
        h.node_cursor.store(cursor, Ordering::Relaxed);
        copy(section::STACK_ENTRIES, 0, stacks);
        copy(section::STACK_FRAMES, 0, frames);
        h.stack_count.store(stacks, Ordering::Relaxed);
        h.frame_cursor.store(frames, Ordering::Relaxed);
        h.dropped_stacks
            .store(ph.dropped_stacks.load(Ordering::Relaxed), Ordering::Relaxed);
        copy(section::MODULES, 0, modules);
        h.module_count.store(modules, Ordering::Relaxed);
        // The Python code records the copied stacks name (a record still being written by
        // the parent is copied unpublished: its frames read as unknown code).
        copy(section::PYTHON, 0, python);
        h.python_cursor.store(python_cursor, Ordering::Relaxed);
        h.peak_live_bytes.store(bytes, Ordering::Relaxed);
        Some((blocks, bytes))
    }

    /// Entries of section `kind` whose storage is reserved (`u64::MAX` without [`Backing`]).
    fn backed_len(&self, kind: u32) -> u64 {
        if self.backing.is_null() {
            return u64::MAX;
        }
        // SAFETY: set from a `&'static Backing`.
        unsafe { &*self.backing }.backed[kind as usize - 1].load(Ordering::Acquire)
    }

    /// Reads node `index` whatever its state (under its seqlock): a record the parent freed
    /// after a fork still holds the block's fields.
    fn read_node_any(&self, index: u32) -> Option<(u64, u64, u32, u32, u64)> {
        let n = self.node(index);
        let a1 = n.t_alloc.load(Ordering::Acquire);
        if a1 == TIME_NONE {
            return None;
        }
        let r = (
            n.address.load(Ordering::Relaxed),
            n.size.load(Ordering::Relaxed),
            n.stack.load(Ordering::Relaxed),
            n.thread.load(Ordering::Relaxed),
            a1,
        );
        fence(Ordering::Acquire);
        (n.t_alloc.load(Ordering::Relaxed) == a1).then_some(r)
    }

    // ---- threads ----------------------------------------------------------------------

    /// Thread slot `index` (< thread capacity).
    #[inline]
    pub fn thread(&self, index: u32) -> &ThreadSlotV1 {
        assert!((index as u64) < self.capacity(section::THREADS));
        self.entry(section::THREADS, index as u64)
    }

    /// Claims a free thread slot for OS thread `tid` (with `name`, 16 bytes), or `None` if all
    /// are taken. `stack`: the thread's stack (start, bytes; (0, 0) unknown). A released slot
    /// that names a dead thread's stack (see [`ThreadSlotV1::private`]) is taken only by the
    /// thread that now runs on that stack, or when no other slot is free: taking it forgets
    /// that stack, whose stale words are then roots again.
    pub fn claim_thread(&self, tid: u32, name: &[u8; 16], stack: (u64, u64)) -> Option<u32> {
        let keeps_other_stack = |slot: &ThreadSlotV1| {
            crate::v1::unpack_range(slot.private[0].load(Ordering::Relaxed))
                .is_some_and(|(a, n, _)| !(a < stack.0.saturating_add(stack.1) && stack.0 < a + n))
        };
        for pass in 0..2 {
            if let Some(i) = self.claim_free(tid, name, |s| pass == 1 || !keeps_other_stack(s)) {
                return Some(i);
            }
        }
        None
    }

    /// [`Self::claim_thread`]'s search: the first free slot `ok` accepts.
    fn claim_free(
        &self,
        tid: u32,
        name: &[u8; 16],
        ok: impl Fn(&ThreadSlotV1) -> bool,
    ) -> Option<u32> {
        let cap = self.capacity(section::THREADS);
        for i in 0..cap as u32 {
            if !self.backed(section::THREADS, i as u64 + 1) {
                return None;
            }
            let slot = self.thread(i);
            if slot.state.load(Ordering::Relaxed) == SLOT_FREE
                && ok(slot)
                && slot
                    .state
                    .compare_exchange(SLOT_FREE, SLOT_USED, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                slot.tid.store(tid, Ordering::Relaxed);
                self.set_thread_name(i, name);
                self.header()
                    .thread_count
                    .fetch_max(i as u64 + 1, Ordering::SeqCst);
                return Some(i);
            }
        }
        None
    }

    /// Stores the thread name of slot `index`.
    pub fn set_thread_name(&self, index: u32, name: &[u8; 16]) {
        let slot = self.thread(index);
        let (a, b) = name.split_at(8);
        slot.name[0].store(u64::from_ne_bytes(a.try_into().unwrap()), Ordering::Relaxed);
        slot.name[1].store(u64::from_ne_bytes(b.try_into().unwrap()), Ordering::Relaxed);
    }

    /// Returns slot `index` to the pool (its counters stay, cumulative). `dead_stack`: the
    /// exiting owner's stack (start, bytes), left as the slot's only range (see
    /// [`ThreadSlotV1::private`]); its other ranges are cleared, their memory being unmapped.
    pub fn release_thread(&self, index: u32, dead_stack: (u64, u64)) {
        let slot = self.thread(index);
        for w in &slot.private {
            w.store(0, Ordering::Relaxed);
        }
        slot.private[0].store(
            crate::v1::pack_range(dead_stack.0, dead_stack.1, false),
            Ordering::Relaxed,
        );
        slot.state.store(SLOT_FREE, Ordering::Release);
    }

    /// Stores range `k` (< [`crate::v1::THREAD_PRIVATE_RANGES`]) of slot `index`: `bytes` at
    /// `start`, the owner's own stack when `stack`, else shim memory that keeps copies of the
    /// program's words (see [`ThreadSlotV1::private`]); (0, 0) clears it.
    pub fn set_thread_private(&self, index: u32, k: usize, start: u64, bytes: u64, stack: bool) {
        let slot = self.thread(index);
        if let Some(w) = slot.private.get(k) {
            w.store(
                crate::v1::pack_range(start, bytes, stack),
                Ordering::Relaxed,
            );
        }
    }

    /// Starts an insert/erase of record `node` (`u32::MAX`: none) on the caller's own slot.
    /// Read the operation's timestamp after this returns. SeqCst: a reader that saw the slot
    /// idle reads its clock before ours; `op_node` is stored first, so a reader that sees the
    /// window open sees which node it writes.
    #[inline]
    pub fn op_begin(slot: &ThreadSlotV1, node: u32) {
        slot.op_node.store(node, Ordering::Release);
        let s = slot.op_seq.load(Ordering::Relaxed);
        slot.op_seq.store(s | 1, Ordering::SeqCst);
    }

    /// Ends the operation started by [`Self::op_begin`] (Release: its writes are visible to a
    /// reader that sees the slot idle).
    #[inline]
    pub fn op_end(slot: &ThreadSlotV1) {
        let s = slot.op_seq.load(Ordering::Relaxed);
        slot.op_seq.store((s | 1) + 1, Ordering::Release);
    }

    /// Adds to the live-bytes high-water mark from the thread counters (a sum over every slot:
    /// call it rarely).
    pub fn update_peak(&self) {
        let n = self.header().thread_count.load(Ordering::Acquire);
        let (mut a, mut f) = (0u64, 0u64);
        for i in 0..n as u32 {
            let s = self.thread(i);
            a = a.wrapping_add(s.alloc_bytes.load(Ordering::Relaxed));
            f = f.wrapping_add(s.free_bytes.load(Ordering::Relaxed));
        }
        self.header()
            .peak_live_bytes
            .fetch_max(a.saturating_sub(f), Ordering::Relaxed);
    }

    // ---- stack traces -----------------------------------------------------------------

    /// Appends a stack trace (`frames`, leaf first, at most [`MAX_FRAMES`]) and returns its id;
    /// `None` when a stack section is full (counted in `dropped_stacks`). Does not deduplicate:
    /// the caller's index does.
    pub fn append_stack(&self, hash: u64, frames: &[u64]) -> Option<u32> {
        let h = self.header();
        let frames = &frames[..frames.len().min(MAX_FRAMES)];
        let id = h.stack_count.fetch_add(1, Ordering::Relaxed);
        let off = h
            .frame_cursor
            .fetch_add(frames.len() as u64, Ordering::Relaxed);
        if id
            >= self
                .capacity(section::STACK_ENTRIES)
                .min(u32::MAX as u64 - 1)
            || off + frames.len() as u64 > self.capacity(section::STACK_FRAMES)
        {
            h.dropped_stacks.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        // The entry, its counters and its frames must have storage before they are written.
        if !self.backed(section::STACK_ENTRIES, id + 1)
            || !self.backed(section::STACK_FRAMES, off + frames.len() as u64)
        {
            h.dropped_stacks.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        for (i, f) in frames.iter().enumerate() {
            self.entry::<AtomicU64>(section::STACK_FRAMES, off + i as u64)
                .store(*f, Ordering::Relaxed);
        }
        let e: &StackEntryV1 = self.entry(section::STACK_ENTRIES, id);
        e.hash.store(hash, Ordering::Relaxed);
        e.frames_offset.store(off as u32, Ordering::Relaxed);
        e.depth_flags
            .store(frames.len() as u32 | STACK_PUBLISHED, Ordering::Release);
        Some(id as u32)
    }

    /// Whether stack `id` holds exactly `frames`.
    pub fn stack_equals(&self, id: u32, frames: &[u64]) -> bool {
        if id as u64 >= self.capacity(section::STACK_ENTRIES) {
            return false;
        }
        let e: &StackEntryV1 = self.entry(section::STACK_ENTRIES, id as u64);
        let df = e.depth_flags.load(Ordering::Acquire);
        if df & STACK_PUBLISHED == 0 || (df & 0xffff) as usize != frames.len() {
            return false;
        }
        let off = e.frames_offset.load(Ordering::Relaxed) as u64;
        frames.iter().enumerate().all(|(i, f)| {
            self.entry::<AtomicU64>(section::STACK_FRAMES, off + i as u64)
                .load(Ordering::Relaxed)
                == *f
        })
    }

    /// Counts one allocation of `bytes` from stack `id` in counter stripe `stripe`.
    #[inline]
    pub fn count_alloc(&self, id: u32, stripe: usize, bytes: u64) {
        if let Some(c) = self.stack_counter(id, stripe) {
            c.count.fetch_add(1, Ordering::Relaxed);
            c.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// The counter of stack `id` in stripe `stripe`; `None` for an id beyond the stack table.
    #[inline]
    fn stack_counter(&self, id: u32, stripe: usize) -> Option<&StackCounterV1> {
        let stacks = self.capacity(section::STACK_ENTRIES);
        (u64::from(id) < stacks).then(|| {
            self.entry(
                section::STACK_COUNTERS,
                (stripe % STRIPES) as u64 * stacks + id as u64,
            )
        })
    }

    /// [`Self::count_alloc`] by the only writer of counter stripe `stripe`: a load and a
    /// store per counter, no locked instruction (readers still see whole values: aligned
    /// 8-byte stores). The caller must be the stripe's sole writer until it gives the stripe
    /// up, with a Release store that the next writer's Acquire pairs with (the shim's
    /// per-thread stripes, `instrumentation/src/state.rs`). Two locked additions on each
    /// allocation were ~20 ns of a malloc's ~110 ns of recording on this 2-core VM (issue 20).
    #[inline]
    pub fn count_alloc_owned(&self, id: u32, stripe: usize, bytes: u64) {
        if let Some(c) = self.stack_counter(id, stripe) {
            let add = |a: &AtomicU64, v: u64| {
                a.store(a.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed)
            };
            add(&c.count, 1);
            add(&c.bytes, bytes);
        }
    }

    // ---- Python code records --------------------------------------------------------------

    /// Claims `words` words of the PYTHON section for a code record (see
    /// [`crate::v1::PYTHON_FRAME`]) and returns the index of its first word (never 0), with
    /// their storage reserved; `None` when the section (or the file system) is full. The caller
    /// fills the words with [`Self::python_word`] and publishes the record by storing word 0
    /// last, with Release ordering.
    pub fn claim_python(&self, words: u64) -> Option<u64> {
        let h = self.header();
        let cap = self.capacity(section::PYTHON);
        if words == 0 || words > PYTHON_RECORD_MAX_WORDS || cap == 0 {
            return None;
        }
        // Word 0 is never handed out: record 0 means "unknown".
        let first = 1 + h.python_cursor.fetch_add(words, Ordering::Relaxed);
        if first.checked_add(words)? > cap.min(1 << 31) {
            return None;
        }
        if !self.backed(section::PYTHON, first + words) {
            return None;
        }
        Some(first)
    }

    /// Word `index` of the PYTHON section (`index` below the end of a record handed out by
    /// [`Self::claim_python`]).
    #[inline]
    pub fn python_word(&self, index: u64) -> &AtomicU64 {
        assert!(index < self.capacity(section::PYTHON));
        self.entry(section::PYTHON, index)
    }

    // ---- modules ------------------------------------------------------------------------

    /// Number of module entries the table holds.
    pub fn module_capacity(&self) -> u64 {
        self.capacity(section::MODULES)
    }

    /// Runs `f` with mutable access to the module table (entries `[0, capacity)`) and the
    /// module count, inside the module seqlock.
    ///
    /// # Safety
    /// Only one thread at a time may call this (the caller holds its own lock).
    pub unsafe fn with_modules<R>(&self, f: impl FnOnce(&mut [ModuleV1], &AtomicU64) -> R) -> R {
        let h = self.header();
        let s = h.module_seq.load(Ordering::Relaxed);
        h.module_seq.store(s | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        let sec = &self.sections[section::MODULES as usize - 1];
        // Hand out only entries with storage: the used ones and room for this refresh.
        let used = h.module_count.load(Ordering::Relaxed).min(sec.capacity);
        let mut len = (used + 64).min(sec.capacity);
        while len > used && !self.backed(section::MODULES, len) {
            len = used + (len - used) / 2;
        }
        // SAFETY: the section lies in the mapping; the caller guarantees exclusive writers;
        // readers in other processes copy under the seqlock and validate what they read.
        let table = unsafe {
            std::slice::from_raw_parts_mut(
                self.base.add(sec.offset as usize) as *mut ModuleV1,
                len as usize,
            )
        };
        let r = f(table, &h.module_count);
        h.module_seq.store((s | 1) + 1, Ordering::Release);
        r
    }
}

/// Reserves the storage of a region's pages before the writer first touches them.
///
/// A region is a sparse file in a `MAP_SHARED` mapping: a page gets its storage when first
/// touched, and when the file system (a tmpfs such as `/dev/shm`, 64 MiB by default in
/// Docker) has none left, that touch raises `SIGBUS` and kills the program. So each section
/// grows by chunks (64 KiB at first, then an eighth of what it has, at most 1 MiB) whose pages
/// are populated with `madvise(MADV_POPULATE_WRITE)` (Linux ≥ 5.14), which reports a full file
/// system as an error instead of a signal. When that fails the section stops growing, the
/// header's `recording_flags` gets [`RECORDING_FS_FULL`], and growth is tried again at most
/// once a second; the writer drops what it cannot record and counts it. On kernels without
/// `MADV_POPULATE_WRITE` pages are taken as backed (the old behaviour).
///
/// On a tmpfs whose region file the writer keeps open ([`Backing::set_file`]), storage is
/// reserved with `fallocate` instead, which takes no lock of the address space (see
/// [`Backing::set_file`]).
#[derive(Debug)]
pub struct Backing {
    lock: AtomicBool,
    /// Populate by read faults ([`Backing::set_shmem`]).
    shmem: AtomicBool,
    /// The region file's descriptor, or -1: reserve by `fallocate` ([`Backing::set_file`]).
    fd: std::sync::atomic::AtomicI32,
    /// The file's device and inode, checked before each use of `fd`.
    dev: AtomicU64,
    ino: AtomicU64,
    /// Bytes of the allocations table reserved ahead beyond the usual (0 to
    /// [`BACKING_BOOST_MAX`]; other sections never get it): doubled each time
    /// a thread had to wait for a grower, so that threads allocating faster than one grower
    /// reserves (8 threads on 2 cores, each descheduled in turn) stop waiting. A program that
    /// never outruns its growers keeps only the usual eighth in reserve.
    boost: AtomicU64,
    /// Per section (kind − 1): entries `[0, backed)` have storage.
    backed: [AtomicU64; section::COUNT],
    /// Region-clock ns before which no new attempt is made after a failure.
    retry_at: AtomicU64,
}

const BACKING_MIN_CHUNK: u64 = 64 << 10;
const BACKING_MAX_CHUNK: u64 = 1 << 20;
/// Growing ahead starts when fewer than this many bytes of a section's reserved storage are
/// left beyond what is in use (fewer for a small section: an eighth of its storage, at least
/// [`BACKING_MIN_CHUNK`]).
const BACKING_AHEAD: u64 = 512 << 10;
/// At most this many more bytes reserved ahead after waits (see `Backing::boost`).
const BACKING_BOOST_MAX: u64 = 8 << 20;

impl Default for Backing {
    fn default() -> Self {
        Self::new()
    }
}

impl Backing {
    /// Nothing backed yet.
    pub const fn new() -> Self {
        Backing {
            lock: AtomicBool::new(false),
            shmem: AtomicBool::new(false),
            fd: std::sync::atomic::AtomicI32::new(-1),
            dev: AtomicU64::new(0),
            ino: AtomicU64::new(0),
            boost: AtomicU64::new(0),
            backed: [const { AtomicU64::new(0) }; section::COUNT],
            retry_at: AtomicU64::new(0),
        }
    }

    fn reset(&self) {
        for b in &self.backed {
            b.store(0, Ordering::Relaxed);
        }
        self.shmem.store(false, Ordering::Relaxed);
        self.release_file();
        self.boost.store(0, Ordering::Relaxed);
        self.retry_at.store(0, Ordering::Relaxed);
        self.lock.store(false, Ordering::Release);
    }

    /// The region file is on a tmpfs (shmem: `/dev/shm`, the default): a read fault gives a
    /// page its storage there, so pages are populated by read faults from now on (see
    /// [`Backing::populate`]). Call before the writer is shared, after
    /// [`RegionWriter::set_backing`].
    pub fn set_shmem(&self) {
        self.shmem.store(true, Ordering::Relaxed);
    }

    /// Reserves storage on the tmpfs with `fallocate(fd)` from now on: `fd` is the region
    /// file, open read-write, whose device and inode are `dev`, `ino`; the backing owns it
    /// (closes it at [`Backing::release_file`]). Call after [`Backing::set_shmem`], before the
    /// writer is shared.
    ///
    /// Why: `madvise(MADV_POPULATE_READ)` holds the address-space lock (`mmap_lock`) for
    /// reading while it populates a chunk, and glibc's `mprotect` growing a thread's heap
    /// waits for it. With 8 threads allocating on 2 cores (bench/phases.c) that wait cost
    /// about 0.2 s of a 1.2 s allocation phase, measured by populating all records at start
    /// instead. `fallocate` allocates the tmpfs pages under the file's own lock; the first
    /// write to each page then maps it with a minor fault under the mapping's own lock, and a
    /// full tmpfs is reported by `fallocate` (`ENOSPC`), never by a `SIGBUS` at that write.
    ///
    /// The descriptor belongs to the program's table: before each use its device and inode
    /// are checked, and at the first mismatch or error other than `ENOSPC` (the program closed
    /// it, a seccomp filter refuses the call) it is forgotten and `madvise` takes over.
    pub fn set_file(&self, fd: i32, dev: u64, ino: u64) {
        self.dev.store(dev, Ordering::Relaxed);
        self.ino.store(ino, Ordering::Relaxed);
        self.fd.store(fd, Ordering::Release);
    }

    /// The backing `w` was given ([`RegionWriter::set_backing`]; tests only).
    #[cfg(test)]
    fn of(w: &RegionWriter) -> &'static Backing {
        assert!(!w.backing.is_null());
        // SAFETY: set from a `&'static Backing`.
        unsafe { &*w.backing }
    }

    /// Closes the file given to [`Backing::set_file`] if its descriptor still refers to it
    /// (in a forked child: the parent's region file), and forgets it.
    pub fn release_file(&self) {
        let fd = self.fd.swap(-1, Ordering::AcqRel);
        if fd >= 0 && self.is_region_file(fd) {
            // SAFETY: `fd` is the region file this backing was given (checked just above).
            unsafe { libc::close(fd) };
        }
    }

    /// Whether descriptor `fd` is open on the file of [`Backing::set_file`].
    fn is_region_file(&self, fd: i32) -> bool {
        // SAFETY: an all-zero `stat` is a valid value for fstat to overwrite.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a writable stat; fstat on any descriptor number is harmless.
        let r = unsafe { libc::fstat(fd, &mut st) };
        r == 0
            && st.st_dev == self.dev.load(Ordering::Relaxed)
            && st.st_ino == self.ino.load(Ordering::Relaxed)
    }

    /// Writes zeros over `[from, to)` of the region file (page-aligned, storage reserved by
    /// [`Self::allocate`], no entry of it in use yet), best effort.
    ///
    /// Why: a page `fallocate` reserved on a tmpfs is not yet up to date (it is cleared at its
    /// first fault), and the kernel maps such pages one fault at a time. Pages written
    /// through the file are up to date, and the first read of one through the mapping maps
    /// its neighbours too (the kernel's fault-around, 64 KiB): the writer reads the first
    /// record of each batch it claims ([`RegionWriter::claim_nodes`]), so a thread takes one
    /// minor fault per 16 pages of records instead of one per page (bench/phases.c, 8 threads
    /// × 500,000 blocks: 47,000 faults, about 4 µs each with 8 threads on 2 cores).
    fn fill_zeros(&self, from: u64, to: u64) {
        /// Zeros the writes copy from (`.bss`: read-only use maps the zero page).
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        let fd = self.fd.load(Ordering::Acquire);
        let mut at = from;
        while fd >= 0 && at < to {
            let mut iov = [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; 16];
            let mut k = 0;
            let mut left = to - at;
            while k < iov.len() && left > 0 {
                let len = left.min(ZEROS.len() as u64);
                iov[k] = libc::iovec {
                    iov_base: ZEROS.as_ptr() as *mut libc::c_void,
                    iov_len: len as usize,
                };
                left -= len;
                k += 1;
            }
            // SAFETY: `fd` is the region file (checked by `allocate` just before); the vectors
            // point at `ZEROS`, read only; the range lies inside the file.
            let r = unsafe { libc::pwritev(fd, iov.as_ptr(), k as libc::c_int, at as libc::off_t) };
            if r <= 0 {
                return;
            }
            at += r as u64;
        }
    }

    /// Reserves `[off, off + len)` of the region file with `fallocate`: `Some(true)` reserved,
    /// `Some(false)` the file system is full, `None` not done (no file, or it cannot be used:
    /// the caller populates by `madvise`).
    fn allocate(&self, off: u64, len: u64) -> Option<bool> {
        let fd = self.fd.load(Ordering::Acquire);
        if fd < 0 {
            return None;
        }
        if !self.is_region_file(fd) {
            self.fd.store(-1, Ordering::Relaxed);
            return None;
        }
        // SAFETY: `fd` is the region file (checked just above); KEEP_SIZE: the range lies
        // inside the file, whose size this never changes.
        let r = unsafe {
            libc::fallocate(
                fd,
                libc::FALLOC_FL_KEEP_SIZE,
                off as libc::off_t,
                len as libc::off_t,
            )
        };
        if r == 0 {
            return Some(true);
        }
        if errno() == libc::ENOSPC {
            return Some(false);
        }
        self.fd.store(-1, Ordering::Relaxed);
        None
    }

    /// Reserves storage for `len` bytes at `p`; false when the file system has none.
    ///
    /// `shmem`: the file is on a tmpfs, where a read fault allocates the page
    /// (`MADV_POPULATE_READ`). Elsewhere only a write fault reserves blocks
    /// (`MADV_POPULATE_WRITE`). The kernel makes the write-populate of a shared file page drop
    /// and retake the address-space lock page by page (to throttle dirty pages), waking every
    /// thread of the program that waits to change its mappings, such as glibc growing a
    /// thread's heap with `mprotect`: with 2 threads allocating on 2 cores
    /// (bench/phases.c) that ping-pong was a sixth of the program's CPU time. The first write
    /// to a page populated by reading takes a minor fault instead, under the mapping's own
    /// lock.
    ///
    /// # Safety
    /// `[p, p + len)` must lie in a shared mapping of the region.
    pub unsafe fn populate(p: *mut u8, len: usize, shmem: bool) -> bool {
        const MADV_POPULATE_READ: libc::c_int = 22;
        const MADV_POPULATE_WRITE: libc::c_int = 23;
        let advice = if shmem {
            MADV_POPULATE_READ
        } else {
            MADV_POPULATE_WRITE
        };
        // SAFETY: the caller guarantees the range is mapped; populating writes nothing the
        // program can see (it faults pages in as an access would, zero-filled).
        let r = unsafe { libc::madvise(p as *mut libc::c_void, len, advice) };
        // EINVAL: a kernel older than 5.14 (no way to ask without a signal): proceed.
        r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL)
    }

    /// Reserves storage for the entries of section `kind` up to at least `need` (the caller
    /// needs `[0, need)`), and up to `want` if it can.
    ///
    /// `wait`: the caller cannot go on without `need` — it waits for a grower holding the lock
    /// (yielding the CPU: on a machine with more threads than cores, spinning would starve the
    /// grower). Otherwise (growing ahead) it gives up at once when another thread holds it.
    /// Returns whether `[0, need)` has storage.
    #[cold]
    #[inline(never)]
    fn grow(&self, w: &RegionWriter, kind: u32, need: u64, want: u64, wait: bool) -> bool {
        // `fallocate` and `pwritev` are cancellation points: a thread with a pending cancel
        // (POSIX: not acted on inside malloc) was unwound from here with the lock held, and
        // every other thread then waited for it for ever (helper N, 1).
        crate::clock::without_cancel(|| self.grow_locked(w, kind, need, want, wait))
    }

    fn grow_locked(&self, w: &RegionWriter, kind: u32, need: u64, want: u64, wait: bool) -> bool {
        let i = kind as usize - 1;
        let sec = &w.sections[i];
        if need > sec.capacity {
            return false;
        }
        let want = want.clamp(need, sec.capacity);
        if now_ns() < self.retry_at.load(Ordering::Relaxed) {
            return need <= self.backed[i].load(Ordering::Acquire);
        }
        let mut spins = 0u32;
        while self
            .lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            if !wait {
                return need <= self.backed[i].load(Ordering::Acquire);
            }
            if spins == 0 {
                // Outran the grower: reserve further ahead from now on.
                let b = self.boost.load(Ordering::Relaxed);
                let more = (b * 2).clamp(BACKING_MAX_CHUNK, BACKING_BOOST_MAX);
                self.boost.fetch_max(more, Ordering::Relaxed);
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // SAFETY: sched_yield has no preconditions and does not touch errno on
                // success (it cannot fail on Linux).
                unsafe { libc::sched_yield() };
            }
        }
        let saved_errno = errno();
        let mut ok = true;
        let end = want;
        while ok && self.backed[i].load(Ordering::Relaxed) < end {
            let have = self.backed[i].load(Ordering::Relaxed);
            let es = sec.entry_size as u64;
            let chunk = (have * es / 8).clamp(BACKING_MIN_CHUNK, BACKING_MAX_CHUNK);
            // Round the new end up to a page boundary, in entries.
            let page_end = (have * es + chunk).div_ceil(4096) * 4096;
            let new = (page_end / es).max(end).min(sec.capacity);
            ok = self.populate_entries(w, kind, have, new);
            if kind == section::STACK_ENTRIES && ok {
                // The entry's counters, one per stripe, grow with it.
                let c = &w.sections[section::STACK_COUNTERS as usize - 1];
                for s in 0..STRIPES as u64 {
                    let lo = s * sec.capacity;
                    ok = ok
                        && self.populate_range(
                            w,
                            c.offset + (lo + have) * c.entry_size as u64,
                            c.offset + (lo + new) * c.entry_size as u64,
                            false,
                        );
                }
            }
            if ok {
                self.backed[i].store(new, Ordering::Release);
            }
        }
        if !ok {
            self.retry_at
                .store(now_ns().saturating_add(1_000_000_000), Ordering::Relaxed);
            w.raise_recording_flag(RECORDING_FS_FULL);
        }
        set_errno(saved_errno);
        self.lock.store(false, Ordering::Release);
        need <= self.backed[i].load(Ordering::Acquire)
    }

    fn populate_entries(&self, w: &RegionWriter, kind: u32, from: u64, to: u64) -> bool {
        let sec = &w.sections[kind as usize - 1];
        let es = sec.entry_size as u64;
        // Zero-filled for fault-around: records only, whose batches are read first (see
        // `Backing::fill_zeros`).
        let zero = kind == section::ALLOCATIONS;
        self.populate_range(w, sec.offset + from * es, sec.offset + to * es, zero)
    }

    /// Populates the pages overlapping `[from, to)` (byte offsets in the region).
    fn populate_range(&self, w: &RegionWriter, from: u64, to: u64, zero: bool) -> bool {
        let lo = from & !4095;
        let hi = to.div_ceil(4096) * 4096;
        if hi <= lo {
            return true;
        }
        if let Some(ok) = self.allocate(lo, hi - lo) {
            if ok && zero {
                // Whole pages only: the pages holding `from` and `to` may hold entries in use.
                self.fill_zeros(from.div_ceil(4096) * 4096, to & !4095);
            }
            return ok;
        }
        // SAFETY: section offsets and capacities were checked against the mapping by
        // `create`; page rounding stays inside it (sections are page-aligned and the file
        // size is a multiple of the page size).
        unsafe {
            Self::populate(
                w.base.add(lo as usize),
                (hi - lo) as usize,
                self.shmem.load(Ordering::Relaxed),
            )
        }
    }
}

/// Whether process `pid` exists and, when `start_ticks` is not 0, started at `start_ticks`
/// (field 22 of `/proc/PID/stat`). Raw system calls only; anything uncertain counts as alive.
fn process_alive(pid: u32, start_ticks: u64) -> bool {
    // SAFETY: kill with signal 0 sends nothing; it only checks that the process exists.
    let r = unsafe { libc::syscall(libc::SYS_kill, pid as libc::c_long, 0 as libc::c_long) };
    if r != 0 {
        return errno() != libc::ESRCH;
    }
    if start_ticks == 0 {
        return true;
    }
    let mut path = [0u8; 32];
    let mut n = 0;
    for &b in b"/proc/" {
        path[n] = b;
        n += 1;
    }
    let mut digits = [0u8; 10];
    let (mut v, mut k) = (pid, 0);
    loop {
        digits[k] = b'0' + (v % 10) as u8;
        k += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    while k > 0 {
        k -= 1;
        path[n] = digits[k];
        n += 1;
    }
    for &b in b"/stat" {
        path[n] = b;
        n += 1;
    }
    // SAFETY: `path` is NUL-terminated (zero-initialized, at most 6 + 10 + 5 bytes written).
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD as libc::c_long,
            path.as_ptr(),
            (libc::O_RDONLY | libc::O_CLOEXEC) as libc::c_long,
        )
    };
    if fd < 0 {
        return errno() != libc::ENOENT;
    }
    let mut buf = [0u8; 1024];
    // SAFETY: reading into our own buffer from the descriptor just opened, then closing it.
    let len = unsafe {
        let len = libc::syscall(
            libc::SYS_read,
            fd,
            buf.as_mut_ptr(),
            buf.len() as libc::c_long,
        );
        libc::syscall(libc::SYS_close, fd);
        len
    };
    if len <= 0 {
        return true;
    }
    let text = &buf[..len as usize];
    // Fields after the command name, which ends at the last ')': state is field 3, start
    // time field 22, i.e. the 20th after the state.
    let Some(close) = text.iter().rposition(|&c| c == b')') else {
        return true;
    };
    let mut fields = text[close + 1..]
        .split(|&c| c == b' ')
        .filter(|f| !f.is_empty());
    let Some(field) = fields.nth(19) else {
        return true;
    };
    let mut t: u64 = 0;
    for &c in field {
        if !c.is_ascii_digit() {
            return true;
        }
        t = t.wrapping_mul(10).wrapping_add((c - b'0') as u64);
    }
    t == start_ticks
}

fn errno() -> i32 {
    // SAFETY: __errno_location returns the calling thread's errno.
    unsafe { *libc::__errno_location() }
}

fn set_errno(v: i32) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = v };
}

fn copy_truncated(dst: &mut [u8], src: &[u8]) {
    let n = src.len().min(dst.len() - 1);
    dst[..n].copy_from_slice(&src[..n]);
}

#[cfg(test)]
mod lease_tests {
    use super::*;

    /// A region of 64 records, 4 stack traces and 2 thread slots.
    const CAPS: Capacities = Capacities {
        nodes: 64,
        stacks: 4,
        frames: 64,
        threads: 2,
        modules: 1,
        named: 1,
        python_words: 1,
    };
    const ID: ProcessIdentity<'static> = ProcessIdentity {
        pid: 1,
        start_ticks: 1,
        exe_dev: 0,
        exe_ino: 0,
        exe_path: b"/x",
        cmdline: b"x",
        sample_interval: 0,
    };

    /// A zeroed, 8-aligned buffer the size [`CAPS`] plans, and that size in bytes.
    fn tiny_buffer() -> (Vec<u64>, u64) {
        let (_, size) = plan(&CAPS);
        (vec![0u64; size as usize / 8], size)
    }

    /// Start time of process `pid` from `/proc/PID/stat` (field 22).
    fn start_ticks(pid: u32) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let rest = &s[s.rfind(')').unwrap() + 1..];
        rest.split_whitespace().nth(19).unwrap().parse().unwrap()
    }

    /// A lease blocks the rewrite of a node freed after it while its holder lives; a dead
    /// holder's (gone, or its pid reused by a process started at another time) is cleared by
    /// the writer, at most once per `LEASE_CHECK_NS`, and an unknown holder's is kept.
    #[test]
    fn dead_holders_lease_is_cleared_live_and_unknown_ones_kept() {
        let (mut buf, size) = tiny_buffer();
        // SAFETY: a zeroed, 8-aligned buffer of the planned size that nothing else touches.
        let w =
            unsafe { RegionWriter::create(buf.as_mut_ptr() as *mut u8, size, &CAPS, &ID) }.unwrap();
        let (n, _) = w.claim_nodes(1).unwrap();
        let n = n as u32;
        w.publish_node(n, 0x1000, 8, 0, 1, 100);
        w.erase_node(n, 2_000);
        let h = w.header();
        let me = std::process::id();
        // A dead process: a child that has exited and been reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let mut now = 1_000_000_000u64;
        let mut step = || {
            now += 2 * LEASE_CHECK_NS;
            now
        };
        for (pid, ticks, holder_alive) in [
            (me, start_ticks(me), true),
            (me, 0, true),                    // no start time recorded: the pid alone
            (0, 0, true),                     // unknown holder: only LEASE_NS frees it
            (me, start_ticks(me) + 1, false), // the pid now belongs to another process
            (dead, 12345, false),
        ] {
            h.lease_pid.store(pid, Ordering::SeqCst);
            h.lease_start_ticks.store(ticks, Ordering::SeqCst);
            h.lease.store(1_000, Ordering::SeqCst); // before the free at 2_000: blocks
            let t = step();
            assert_eq!(w.node_reusable(n, t), !holder_alive, "holder {pid}/{ticks}");
            assert_eq!(
                h.lease.load(Ordering::SeqCst) == 0,
                !holder_alive,
                "lease of holder {pid}/{ticks}"
            );
            // Within LEASE_CHECK_NS of the last check nothing is checked again.
            h.lease.store(1_000, Ordering::SeqCst);
            h.lease_pid.store(dead, Ordering::SeqCst);
            assert!(!w.node_reusable(n, t + 1), "rate limit");
            assert_eq!(h.lease.load(Ordering::SeqCst), 1_000);
        }
        // A newer lease is never cleared by a writer that loaded an older one.
        h.lease.store(5_000, Ordering::SeqCst);
        assert!(!w.lease_holder_gone(1_000, step()));
        assert_eq!(h.lease.load(Ordering::SeqCst), 5_000);
        // errno is preserved (kill set ESRCH).
        // SAFETY: the calling thread's errno.
        unsafe { *libc::__errno_location() = 1234 };
        h.lease.store(1_000, Ordering::SeqCst);
        assert!(w.node_reusable(n, step()));
        // SAFETY: as above.
        assert_eq!(unsafe { *libc::__errno_location() }, 1234);
    }

    /// A snapshot whose lease the writer released during the scan says so: records it had not
    /// read yet may have been rewritten meanwhile.
    #[test]
    fn a_lease_released_during_the_scan_is_reported() {
        let (mut buf, size) = tiny_buffer();
        // SAFETY: a zeroed, 8-aligned buffer of the planned size that nothing else touches.
        let w =
            unsafe { RegionWriter::create(buf.as_mut_ptr() as *mut u8, size, &CAPS, &ID) }.unwrap();
        let (n, _) = w.claim_nodes(2).unwrap();
        w.publish_node(n as u32, 0x1000, 8, 0, 1, 100);
        w.publish_node(n as u32 + 1, 0x2000, 8, 0, 1, 100);
        // SAFETY: the writer's buffer, alive and of this size for the whole test.
        let region =
            unsafe { crate::Region::from_raw(buf.as_ptr() as *const u8, size, true) }.unwrap();
        let opts = crate::SnapshotOptions {
            live: true,
            wait_timeout: std::time::Duration::from_millis(10),
            lease_pid: 0,
            lease_start_ticks: 0,
            at: None,
            born_after: 0,
            frozen: false,
        };
        let kept = region.snapshot(&opts, |_| {});
        assert_eq!((kept.blocks, kept.lease_lost), (2, false));
        assert!(kept.warnings.is_empty(), "{:?}", kept.warnings);
        // A named moment long past (region-clock ns 200, the records born at 100): the scan
        // is quick, and no warning says it took that long (helper V, 2: every `--named` of a
        // moment 30 s old warned that blocks may be missing).
        let past = region.snapshot(
            &crate::SnapshotOptions {
                at: Some(200),
                ..opts
            },
            |_| {},
        );
        assert_eq!(past.blocks, 2);
        assert!(past.warnings.is_empty(), "{:?}", past.warnings);
        let lease = region.lease_word().unwrap();
        let lost = region.snapshot(&opts, |_| lease.store(0, Ordering::SeqCst));
        assert!(lost.lease_lost);
        assert!(
            lost.warnings
                .iter()
                .any(|w| w.contains("released this snapshot's lease")),
            "{:?}",
            lost.warnings
        );
    }
}

#[cfg(test)]
mod backing_tests {
    use super::*;

    /// A region file on `/dev/shm` holding `nodes` records, mapped shared, with a writer whose
    /// storage is reserved by `fallocate` on it (as the shim does on a tmpfs).
    fn tmpfs_region(nodes: u64) -> Option<(RegionWriter, std::path::PathBuf)> {
        use std::os::unix::fs::MetadataExt;
        use std::os::unix::io::IntoRawFd;
        let caps = Capacities {
            nodes,
            stacks: 4,
            frames: 64,
            threads: 2,
            modules: 1,
            named: 1,
            python_words: 1,
        };
        let id = ProcessIdentity {
            pid: 1,
            start_ticks: 1,
            exe_dev: 0,
            exe_ino: 0,
            exe_path: b"/x",
            cmdline: b"x",
            sample_interval: 0,
        };
        let (_, size) = plan(&caps);
        let path = std::path::PathBuf::from(format!(
            "/dev/shm/vmo-layout-backing-test-{}-{nodes}",
            std::process::id()
        ));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .ok()?;
        file.set_len(size).unwrap();
        let meta = file.metadata().unwrap();
        let fd = file.into_raw_fd();
        // SAFETY: a fresh shared mapping of the whole file, never unmapped (the test leaks it).
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        // SAFETY: the mapping is zero-filled (a new sparse file), page-aligned and ours.
        let mut w = unsafe { RegionWriter::create(base as *mut u8, size, &caps, &id) }.unwrap();
        let backing: &'static Backing = Box::leak(Box::new(Backing::new()));
        w.set_backing(backing);
        backing.set_shmem();
        backing.set_file(fd, meta.dev(), meta.ino());
        // The header page, as the shim reserves it before creating the writer.
        assert_eq!(backing.allocate(0, 4096), Some(true));
        Some((w, path))
    }

    /// Minor faults of this process so far.
    fn minor_faults() -> i64 {
        // SAFETY: getrusage fills the zeroed struct.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
        ru.ru_minflt
    }

    /// Records written while the allocations table grows chunk by chunk keep what was written
    /// (the zeros written ahead for fault-around never reach a page holding records in use,
    /// such as the page a chunk starts or ends in), and the records' pages are mapped many at
    /// a fault (fault-around) rather than one page at each.
    #[test]
    fn records_survive_growth_and_take_few_faults() {
        // 40-byte records, which do not divide 4096: chunks start and end inside pages.
        const NODES: u64 = 200_000;
        let Some((w, path)) = tmpfs_region(NODES) else {
            println!("skipped: /dev/shm is not writable here");
            return;
        };
        // The records' section ends inside a page after the first chunk: the next chunk
        // starts in that page, whose first records are in use (written here up to the last).
        let (s, _) = w.claim_nodes(64).unwrap();
        assert_eq!(s, 0);
        let b = Backing::of(&w);
        let i = section::ALLOCATIONS as usize - 1;
        let have = b.backed[i].load(Ordering::Acquire);
        assert_ne!(
            have * size_of::<NodeV1>() as u64 % 4096,
            0,
            "a chunk ending in a page"
        );
        for n in 0..have {
            w.publish_node(n as u32, 0x10_0000 + n * 16, n % 1000 + 1, 0, 1, 100 + n);
        }
        assert!(b.grow(&w, section::ALLOCATIONS, have + 1, have + 1, true));
        assert!(b.backed[i].load(Ordering::Acquire) > have);
        for n in 0..have {
            let node = w.node(n as u32);
            assert_eq!(
                node.address.load(Ordering::Relaxed),
                0x10_0000 + n * 16,
                "record {n}"
            );
        }
        let before = minor_faults();
        let mut written = 0u64;
        while let Some((s, e)) = w.claim_nodes(64) {
            for n in s..e {
                w.publish_node(n as u32, 0x10_0000 + n * 16, n % 1000 + 1, 0, 1, 100 + n);
            }
            written = e;
        }
        let faults = minor_faults() - before;
        let _ = std::fs::remove_file(&path);
        assert_eq!(written, NODES, "every record got storage");
        for n in 0..NODES {
            let node = w.node(n as u32);
            assert_eq!(
                node.address.load(Ordering::Relaxed),
                0x10_0000 + n * 16,
                "record {n}"
            );
            assert_eq!(
                node.size.load(Ordering::Relaxed),
                n % 1000 + 1,
                "record {n}"
            );
        }
        // 200,000 records of 40 bytes are 1,954 pages: one fault per page before.
        let pages = (NODES * size_of::<NodeV1>() as u64).div_ceil(4096) as i64;
        assert!(
            faults * 4 < pages,
            "{faults} minor faults for {pages} pages of records"
        );
    }
}
