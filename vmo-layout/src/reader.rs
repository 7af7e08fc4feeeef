//! The reader side: validates a region (hostile input) and takes point-in-time snapshots.
//!
//! Every offset, count and length read from the region is checked against the mapping before
//! use; every loop is bounded by a capacity the header declares and the mapping can hold. A
//! corrupt region yields an error or fewer records, never a panic or an unbounded allocation.
//!
//! Every table is read only where the file holds data when the reader knows the file
//! ([`Region::with_file`]): reading a hole of a sparse tmpfs file through a mapping would
//! allocate it.
//!
//! Snapshot protocol for a live writer (the argument is in `ARCHITECTURE.md`):
//! 1. store a lease `L = now` in the header (SeqCst), after the identity of its holder
//!    (`lease_pid`, `lease_start_ticks`: writers free the lease of a dead holder) and with
//!    `L > lease_last`, then `lease_last = L` (after the lease: see ARCHITECTURE.md, point 2 of
//!    the claim); writers stop recycling nodes freed at or after `L`;
//! 2. read the snapshot time `T = now` and wait until the clock has passed it — or, with a
//!    writer that stamps every event after the latest lease (`FLAG_LEASE_FLOOR`), take `T = L`
//!    at once if the clock still reads `L` (no event can have been stamped after `L` before
//!    the lease was visible), and only then publish `lease_scanned_for = L`;
//! 3. for every thread slot that is inside an operation, wait until that operation ends
//!    (one wait budget for all slots together) — or, with a writer that says which record each
//!    operation writes (`FLAG_OP_NODE`), pin up to `LEASE_PINNED` of those records
//!    (`lease_pinned`: writers do not rewrite them), skip them in the scan and read them once
//!    their operations have ended, after it;
//! 4. scan the allocations table: a node is live at `T` iff `t_alloc <= T < t_free`, read under
//!    the node's seqlock (`t_alloc` before and after);
//!    publishing its progress (`lease_scanned`): nodes it has read may be rewritten at once;
//! 5. clear the lease.
//!
//! A stopped writer (every thread stopped by SIGSTOP, ptrace or a freezer for the whole scan,
//! which the caller establishes and checks again afterwards: [`SnapshotOptions::frozen`]) is
//! read without lease or wait: `T` is taken at least as late as every stamp written, and each
//! record, including one an operation stopped in its window left half done, counts by the
//! same rule `t_alloc <= T < t_free`.

use crate::clock::{now_ns, precise_ns};
use crate::v1::*;
use std::fmt;
use std::mem::size_of;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Nodes between two stores of the scan's progress ([`HeaderV1::lease_scanned`]).
const PROGRESS_STEP: u64 = 1024;

/// Why a region cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// Shorter than a header.
    TooSmall(u64),
    /// Does not start with [`MAGIC`].
    BadMagic,
    /// A layout version this build does not read.
    UnsupportedVersion(u32),
    /// The header is inconsistent (the text says how).
    Corrupt(&'static str),
    /// The writer has not finished laying out the region.
    NotReady,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::TooSmall(n) => write!(f, "file is not a heapdump region ({n} bytes, shorter than a header)"),
            ReadError::BadMagic => write!(f, "file is not a heapdump region (bad magic)"),
            ReadError::UnsupportedVersion(v) => write!(
                f,
                "region layout v{v} is not supported by this heapdump (reads v{}); upgrade heapdump",
                SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", v")
            ),
            ReadError::Corrupt(why) => write!(f, "corrupt heapdump region: {why}"),
            ReadError::NotReady => write!(f, "region is still being initialized by its process"),
        }
    }
}

impl std::error::Error for ReadError {}

/// Layout versions this reader understands.
pub const SUPPORTED_VERSIONS: &[u32] = &[LAYOUT_VERSION];

/// Process-level facts and counters from the header and thread table.
#[derive(Debug, Clone, Default)]
pub struct RegionInfo {
    /// Layout version.
    pub version: u32,
    /// Writer's pid.
    pub pid: u32,
    /// Start time in clock ticks since boot.
    pub start_ticks: u64,
    /// Region creation time, ns since the Unix epoch.
    pub created_realtime_ns: u64,
    /// Region creation time, region-clock ns (`CLOCK_MONOTONIC_COARSE`).
    pub created_monotonic_ns: u64,
    /// Device of the executable.
    pub exe_dev: u64,
    /// Inode of the executable.
    pub exe_ino: u64,
    /// Executable path.
    pub exe_path: String,
    /// Command line arguments.
    pub cmdline: Vec<String>,
    /// `STATE_*` value.
    pub state: u32,
    /// Sampling interval in bytes (0: every allocation).
    pub sample_interval: u64,
    /// Counters summed over thread slots.
    pub counters: Counters,
    /// `RECORDING_*` bits: why recording is (partly) stopped; 0 when it is not.
    pub recording_flags: u32,
    /// The writer's start-up warnings (invalid settings, …), one per line.
    pub warnings: Vec<String>,
    /// Named snapshots the program asked for (including refused ones past the table's
    /// capacity).
    pub named_requested: u64,
    /// Named-snapshot entries the region holds.
    pub named_capacity: u64,
    /// Dead records kept for named snapshots, and the most the writer keeps.
    pub named_held: u64,
    /// See `named_held`.
    pub named_hold_limit: u64,
}

impl RegionInfo {
    /// Why recording is (partly) stopped, in words; empty when everything is recorded.
    pub fn stop_reasons(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.recording_flags & RECORDING_FS_FULL != 0 {
            v.push("the region's file system is full: blocks or stack traces not recorded (see dropped counts)");
        }
        if self.recording_flags & RECORDING_FOREIGN_WRITER != 0 {
            v.push("a child process made without fork handlers (raw clone/fork) tried to record here and was stopped");
        }
        v
    }
}

/// Cumulative counters of a region.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Blocks recorded.
    pub allocs: u64,
    /// Blocks erased.
    pub frees: u64,
    /// Bytes recorded.
    pub alloc_bytes: u64,
    /// Bytes erased.
    pub free_bytes: u64,
    /// Live blocks (`allocs - frees`).
    pub live_blocks: u64,
    /// Live bytes (`alloc_bytes - free_bytes`).
    pub live_bytes: u64,
    /// Highest live bytes seen.
    pub peak_live_bytes: u64,
    /// Blocks not recorded (allocations table full).
    pub dropped_blocks: u64,
    /// Stack traces not recorded (stack sections full).
    pub dropped_stacks: u64,
    /// Thread slots used.
    pub threads: u64,
}

/// One live block in a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Address.
    pub address: u64,
    /// Requested size in bytes.
    pub size: u64,
    /// Allocation time, region-clock ns (`CLOCK_MONOTONIC_COARSE`, tick resolution).
    pub t_alloc: u64,
    /// Stack id (`u32::MAX`: none).
    pub stack: u32,
    /// OS thread id that allocated it.
    pub thread: u32,
}

/// A thread slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadInfo {
    /// OS thread id.
    pub tid: u32,
    /// Thread name.
    pub name: String,
    /// Whether the slot is owned by a running thread.
    pub running: bool,
    /// Memory that is not a root (`ThreadSlotV1::private`): while running, the shim's memory
    /// of the thread that keeps copies of the program's words; once released, the exited
    /// thread's stack. (start, bytes), nonempty ranges only.
    pub private: Vec<(u64, u64)>,
    /// A running thread's own stack (start, bytes), when the shim knows it: a root.
    pub stack: Option<(u64, u64)>,
}

/// A module (ELF object) of the process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    /// Path of the ELF file.
    pub path: String,
    /// Load bias: runtime address = base + ELF virtual address.
    pub base: u64,
    /// GNU build ID bytes (may be empty).
    pub build_id: Vec<u8>,
    /// PT_LOAD segments.
    pub segments: Vec<SegmentV1>,
    /// Whether it was still loaded when last seen.
    pub loaded: bool,
}

/// How to take a snapshot.
#[derive(Debug, Clone, Copy, Default)]
pub struct SnapshotOptions {
    /// The writer is running: use the lease and wait for in-flight operations.
    pub live: bool,
    /// Longest total wait for in-flight operations, over all thread slots.
    pub wait_timeout: Duration,
    /// Pid of the process taking the snapshot as the writer sees it, stored with the lease
    /// ([`HeaderV1::lease_pid`]) so that writers can free the lease if this process dies; 0
    /// when unknown (e.g. another pid namespace).
    pub lease_pid: u32,
    /// Start time of that process in clock ticks since boot (`/proc/self/stat` field 22), 0
    /// when unknown.
    pub lease_start_ticks: u64,
    /// Report the blocks live at this earlier instant (region-clock ns; a named snapshot's
    /// `time_ns`) instead of at the snapshot's own instant. Only as exact as the records kept:
    /// see [`NamedSnapshot::lost`].
    pub at: Option<u64>,
    /// Report only blocks allocated after this instant (region-clock ns, exclusive; 0: all):
    /// "born since".
    pub born_after: u64,
    /// The writer is stopped: the caller has established that no thread of the writing
    /// process runs from before this call until after it returns (every thread stopped by
    /// SIGSTOP, ptrace or a cgroup freezer), and will check afterwards that none ran,
    /// discarding the snapshot if one did. The records are then read as they are: no lease is
    /// stored (the region may be read-only), nothing is waited for, and an operation frozen
    /// inside its window counts by what its record says ([`SnapshotMeta::stopped_in_operation`]).
    /// Takes precedence over `live`; ignored for an exited writer (`live` false).
    pub frozen: bool,
}

/// A named snapshot the program took (`heapdump_take_named_snapshot`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedSnapshot {
    /// Entry index, in the order the program took them (0 first).
    pub index: u32,
    /// The name given (invalid UTF-8 replaced).
    pub name: String,
    /// The instant, region-clock ns.
    pub time_ns: u64,
    /// The instant, ns since the Unix epoch.
    pub realtime_ns: u64,
    /// Upper bound on the blocks live at the instant whose records were recycled since
    /// (the writer's hold limit was reached); 0 when the snapshot is complete.
    pub lost: u64,
}

/// What a snapshot reports besides its blocks.
#[derive(Debug, Clone, Default)]
pub struct SnapshotMeta {
    /// Snapshot time `T`, region-clock ns (`u64::MAX - 1` for an exited process).
    pub time_ns: u64,
    /// Live blocks visited.
    pub blocks: u64,
    /// Bytes of live blocks visited.
    pub bytes: u64,
    /// Nodes scanned.
    pub nodes_scanned: u64,
    /// Longest wait for an in-flight operation, ns.
    pub max_wait_ns: u64,
    /// How long the lease was held (from storing it to clearing it, the scan included), ns:
    /// the time the writer could not recycle records. 0 without a lease.
    pub lease_ns: u64,
    /// Taken with [`SnapshotOptions::frozen`]: the records were read as the stopped writer
    /// left them, without a lease or any wait.
    pub frozen: bool,
    /// With `frozen`: thread slots found inside an operation window (stopped in the middle
    /// of an insert or erase), each resolved from its record.
    pub stopped_in_operation: u64,
    /// Operations in flight at `T` whose records were read after the scan, once they had
    /// ended, instead of being waited for before it (see [`FLAG_OP_NODE`]).
    pub resolved_after_scan: u64,
    /// Problems that may make the snapshot inexact.
    pub warnings: Vec<String>,
    /// The lease this snapshot held was released by the target during the scan (a warning
    /// says so): records may have been rewritten before they were read.
    pub lease_lost: bool,
}

/// The waits of one snapshot for operations in flight.
#[derive(Default)]
struct Waits {
    /// Longest wait, ns.
    longest_ns: u64,
    /// Operations still in progress at their deadline.
    stuck: u64,
    /// Thread ids of the first 8 of those.
    tids: Vec<u32>,
}

impl Waits {
    /// Waits for the operation `slot` was in when its sequence read `seq` (see [`wait_op`]).
    fn wait(&mut self, slot: &ThreadSlotV1, seq: u64, deadline: u64) {
        let w = wait_op(slot, seq, deadline);
        self.longest_ns = self.longest_ns.max(w.waited_ns);
        if w.stuck {
            self.stuck += 1;
            if self.tids.len() < 8 {
                self.tids.push(slot.tid.load(Ordering::Relaxed));
            }
        }
    }
}

/// What [`wait_op`] saw.
struct OpWait {
    waited_ns: u64,
    /// The deadline passed with the operation still in progress.
    stuck: bool,
}

/// Waits until the operation a slot was in when its sequence read `seq` has ended, or until
/// `deadline` (precise ns): spins briefly, then yields.
fn wait_op(slot: &ThreadSlotV1, seq: u64, deadline: u64) -> OpWait {
    let began = precise_ns();
    let mut spins = 0u32;
    let mut stuck = false;
    while slot.op_seq.load(Ordering::Acquire) == seq {
        if began >= deadline {
            stuck = true;
            break;
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(256) {
            if precise_ns() > deadline {
                stuck = true;
                break;
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    OpWait {
        waited_ns: precise_ns() - began,
        stuck,
    }
}

/// A Python code object as the writer recorded it when one of its frames was first seen (see
/// [`PYTHON_FRAME`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonCode {
    /// Address of the code object in the writer.
    pub address: u64,
    /// `co_qualname`.
    pub qualname: String,
    /// `co_filename`.
    pub filename: String,
    /// `co_firstlineno`.
    pub first_line: u32,
    /// `co_linetable` (CPython 3.11+ location table), maybe truncated.
    pub linetable: Vec<u8>,
    /// CPython minor version (11 for 3.11).
    pub minor: u8,
    /// The line table was cut at the record's size limit.
    pub truncated: bool,
}

/// A validated region mapping.
#[derive(Debug, Clone, Copy)]
pub struct Region<'a> {
    base: *const u8,
    len: u64,
    writable: bool,
    sections: [SectionV1; section::COUNT],
    /// The region's file, when known (see [`Region::with_file`]); -1 otherwise.
    fd: i32,
    _life: std::marker::PhantomData<&'a [u8]>,
}

impl<'a> Region<'a> {
    /// Validates a region held in ordinary memory (a copy of a file, a fuzz input).
    ///
    /// Snapshots of such a region never write to it and never wait.
    pub fn from_bytes(bytes: &'a [u8]) -> Result<Self, ReadError> {
        // SAFETY: `bytes` is a valid slice for 'a; with `writable = false` nothing writes it.
        unsafe { Self::from_raw(bytes.as_ptr(), bytes.len() as u64, false) }
    }

    /// Validates a mapped region.
    ///
    /// # Safety
    /// `base[..len]` must stay mapped and readable for `'a`, 8-byte aligned; when `writable`, it
    /// must be a writable shared mapping (the reader stores its lease in the header).
    pub unsafe fn from_raw(base: *const u8, len: u64, writable: bool) -> Result<Self, ReadError> {
        if len < HEADER_SIZE as u64 {
            return Err(ReadError::TooSmall(len));
        }
        if !(base as usize).is_multiple_of(8) {
            return Err(ReadError::Corrupt("region not 8-byte aligned in memory"));
        }
        // SAFETY: len >= HEADER_SIZE, so the first 16 bytes are readable.
        let head = unsafe { std::slice::from_raw_parts(base, 16) };
        if head[..8] != MAGIC {
            return Err(ReadError::BadMagic);
        }
        let version = u32::from_ne_bytes(head[8..12].try_into().unwrap());
        if !SUPPORTED_VERSIONS.contains(&version) {
            return Err(ReadError::UnsupportedVersion(version));
        }
        let header_size = u32::from_ne_bytes(head[12..16].try_into().unwrap()) as u64;
        if header_size < HEADER_SIZE as u64 || header_size > len {
            return Err(ReadError::Corrupt("header size out of range"));
        }
        // SAFETY: the header fits in the mapping and is 8-byte aligned per the contract.
        let h = unsafe { &*(base as *const HeaderV1) };
        let count = (h.section_count as usize).min(h.sections.len());
        if h.section_entry_size as usize != size_of::<SectionV1>() {
            return Err(ReadError::Corrupt("section entry size"));
        }
        let expected: [(u32, usize); section::COUNT] = [
            (section::ALLOCATIONS, size_of::<NodeV1>()),
            (section::STACK_ENTRIES, size_of::<StackEntryV1>()),
            (section::STACK_FRAMES, 8),
            (section::STACK_COUNTERS, size_of::<StackCounterV1>()),
            (section::THREADS, size_of::<ThreadSlotV1>()),
            (section::MODULES, size_of::<ModuleV1>()),
            (section::NAMED, size_of::<NamedSnapshotV1>()),
            (section::PYTHON, 8),
        ];
        let mut sections = [SectionV1::default(); section::COUNT];
        for (kind, size) in expected {
            let Some(s) = h.sections[..count].iter().find(|s| s.kind == kind) else {
                // NAMED and PYTHON came later: a region without them has no named snapshots
                // and no Python frames.
                if kind == section::NAMED || kind == section::PYTHON {
                    sections[kind as usize - 1].kind = kind;
                    continue;
                }
                return Err(ReadError::Corrupt("missing section"));
            };
            if s.entry_size as usize != size {
                return Err(ReadError::Corrupt("section entry size mismatch"));
            }
            let bytes = s
                .capacity
                .checked_mul(size as u64)
                .and_then(|b| b.checked_add(s.offset))
                .ok_or(ReadError::Corrupt("section size overflows"))?;
            if s.offset < header_size || s.offset % 8 != 0 || bytes > len {
                return Err(ReadError::Corrupt("section outside the region"));
            }
            sections[kind as usize - 1] = *s;
        }
        let stacks = sections[section::STACK_ENTRIES as usize - 1].capacity;
        if sections[section::STACK_COUNTERS as usize - 1].capacity / STRIPES as u64 != stacks {
            return Err(ReadError::Corrupt(
                "stack counter section does not match stack section",
            ));
        }
        Ok(Region {
            base,
            len,
            writable,
            sections,
            fd: -1,
            _life: std::marker::PhantomData,
        })
    }

    /// Tells the reader which file the mapping comes from, so that it reads only the parts of
    /// the tables that hold data: a region is a sparse file, and on tmpfs merely reading a
    /// hole through a mapping allocates a page for it (`read(2)` does not). A crafted
    /// `node_cursor` would otherwise commit gigabytes of the file system's memory, and a
    /// crafted count over a huge sparse section would make the reader walk (and allocate for)
    /// entries that cannot hold anything. Holes are found with `lseek(SEEK_DATA/SEEK_HOLE)`
    /// (entries wholly inside data are read; a hole reads as zeros, i.e. empty entries, so
    /// nothing real is skipped). `fd` must be the file `base` maps.
    pub fn with_file(mut self, fd: std::os::fd::BorrowedFd<'a>) -> Self {
        self.fd = std::os::fd::AsRawFd::as_raw_fd(&fd);
        self
    }

    /// Calls `f(first, end)`, in order, for the runs of entries `[first, end)` among the first
    /// `count` of section `kind` that lie wholly in data of the file (all of them when the
    /// file is unknown or cannot tell holes apart); stops when `f` returns false.
    fn data_runs(&self, kind: u32, count: u64, f: impl FnMut(u64, u64) -> bool) {
        self.data_runs_in(kind, 0, count, f)
    }

    /// [`Self::data_runs`] over the entries `[from, to)` of section `kind`.
    fn data_runs_in(&self, kind: u32, from: u64, to: u64, mut f: impl FnMut(u64, u64) -> bool) {
        let s = &self.sections[kind as usize - 1];
        let count = to.min(s.capacity);
        if from >= count {
            return;
        }
        if self.fd < 0 {
            f(from, count);
            return;
        }
        let es = s.entry_size as u64;
        let end = s.offset + count * es; // validated: inside the mapping
        let mut pos = s.offset + from * es;
        while pos < end {
            // SAFETY: lseek on a descriptor the caller vouched for; it only moves the offset.
            let d = unsafe { libc::lseek(self.fd, pos as libc::off_t, libc::SEEK_DATA) };
            if d < 0 {
                let e = std::io::Error::last_os_error().raw_os_error();
                if e == Some(libc::ENXIO) {
                    return; // no data from `pos` to the end of the file
                }
                // SEEK_DATA unsupported: read everything that is left.
                f((pos - s.offset).div_ceil(es), count);
                return;
            }
            let d = d as u64;
            if d >= end {
                return;
            }
            // SAFETY: as above.
            let h = unsafe { libc::lseek(self.fd, d as libc::off_t, libc::SEEK_HOLE) };
            let h = if h < 0 { end } else { (h as u64).min(end) };
            let first = (d.max(s.offset) - s.offset).div_ceil(es);
            let last = (h - s.offset) / es;
            if first < last && !f(first, last) {
                return;
            }
            pos = h.max(d + 1);
        }
    }

    /// Visits the thread slots among the first `count` that hold data, in order.
    fn for_each_slot<'s>(&'s self, count: u64, mut f: impl FnMut(&'s ThreadSlotV1)) {
        self.data_runs(section::THREADS, count, |a, b| {
            for i in a..b {
                if let Some(s) = self.at::<ThreadSlotV1>(section::THREADS, i) {
                    f(s);
                }
            }
            true
        });
    }

    fn header(&self) -> &HeaderV1 {
        // SAFETY: validated in `from_raw`: the header lies in the mapping.
        unsafe { &*(self.base as *const HeaderV1) }
    }

    fn cap(&self, kind: u32) -> u64 {
        self.sections[kind as usize - 1].capacity
    }

    fn at<T>(&self, kind: u32, index: u64) -> Option<&T> {
        let s = &self.sections[kind as usize - 1];
        if index >= s.capacity {
            return None;
        }
        let off = s.offset + index * s.entry_size as u64;
        debug_assert!(off + size_of::<T>() as u64 <= self.len);
        // SAFETY: `from_raw` checked that the whole section lies in the mapping and is 8-byte
        // aligned; T consists of atomics (or plain data read under a seqlock).
        Some(unsafe { &*(self.base.add(off as usize) as *const T) })
    }

    /// Header facts and counters.
    pub fn info(&self) -> RegionInfo {
        let h = self.header();
        let threads = h
            .thread_count
            .load(Ordering::Acquire)
            .min(self.cap(section::THREADS));
        let mut c = Counters {
            peak_live_bytes: h.peak_live_bytes.load(Ordering::Relaxed),
            dropped_stacks: h.dropped_stacks.load(Ordering::Relaxed),
            threads,
            ..Counters::default()
        };
        self.for_each_slot(threads, |s| {
            c.allocs = c.allocs.saturating_add(s.allocs.load(Ordering::Relaxed));
            c.frees = c.frees.saturating_add(s.frees.load(Ordering::Relaxed));
            c.alloc_bytes = c
                .alloc_bytes
                .saturating_add(s.alloc_bytes.load(Ordering::Relaxed));
            c.free_bytes = c
                .free_bytes
                .saturating_add(s.free_bytes.load(Ordering::Relaxed));
            c.dropped_blocks = c
                .dropped_blocks
                .saturating_add(s.dropped.load(Ordering::Relaxed));
        });
        c.live_blocks = c.allocs.saturating_sub(c.frees);
        c.live_bytes = c.alloc_bytes.saturating_sub(c.free_bytes);
        c.peak_live_bytes = c.peak_live_bytes.max(c.live_bytes);
        RegionInfo {
            version: h.layout_version,
            pid: h.pid,
            start_ticks: h.start_ticks,
            created_realtime_ns: h.created_realtime_ns,
            created_monotonic_ns: h.created_monotonic_ns,
            exe_dev: h.exe_dev,
            exe_ino: h.exe_ino,
            exe_path: c_string(&h.exe_path),
            cmdline: h
                .cmdline
                .split(|b| *b == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect(),
            state: AtomicU32::load(&h.state, Ordering::Acquire),
            sample_interval: h.sample_interval,
            counters: c,
            recording_flags: h.recording_flags.load(Ordering::Relaxed),
            warnings: h
                .warnings
                .split(|b| *b == b'\n' || *b == 0)
                .filter(|s| !s.is_empty())
                .take(32)
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect(),
            named_requested: h.named_count.load(Ordering::Relaxed),
            named_capacity: self.cap(section::NAMED),
            named_held: h.named_held.load(Ordering::Relaxed),
            named_hold_limit: h.named_hold_limit,
        }
    }

    /// Visits every block live at one instant; see the module docs for the protocol.
    ///
    /// With `opts.live` the region must have been opened writable (the lease is stored in it);
    /// otherwise the snapshot time is "end of recording" and nothing is written or waited for.
    /// Only one live snapshot per region may run at a time (the caller serializes, e.g. with
    /// `flock`).
    pub fn snapshot(&self, opts: &SnapshotOptions, mut visit: impl FnMut(&Block)) -> SnapshotMeta {
        let h = self.header();
        let mut meta = SnapshotMeta::default();
        let mut leased_at = 0;
        // The lease value this snapshot stored (0: none).
        let mut held = 0;
        // Operations in flight at T whose node is pinned: (slot, op_seq seen, node).
        let mut pinned: Vec<(&ThreadSlotV1, u64, u32)> = Vec::new();
        let mut waits = Waits::default();
        // Whether writers were told to use this scan's progress (see below).
        let mut progress_ok = false;
        let frozen = opts.live && opts.frozen;
        let live = opts.live && self.writable && !frozen;
        let t = if frozen {
            self.frozen_instant(&mut meta)
        } else if live {
            // Lease values only grow (see `HeaderV1::lease_last`): wait for the clock to pass
            // the last one stored (at most a tick, and only right after another snapshot).
            // Bounded: a crafted value in the future is not waited for (20 ms at most).
            // (And past a lease still stored: a collector that died between storing its lease
            // and `lease_last` must not see its value taken again.)
            let last = (h.lease_last.load(Ordering::SeqCst)).max(h.lease.load(Ordering::SeqCst));
            for _ in 0..100 {
                if now_ns() > last {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            // With a writer that stamps every event after `lease_last` (FLAG_LEASE_FLOOR), the
            // lease value itself is T — if no event can have read the clock past it before the
            // lease was stored: the clock reads the same before and after storing it. Only then
            // is the scan's progress published (`lease_scanned_for`), which lets writers rewrite
            // what it has read and records born after T. Otherwise (the clock ticked meanwhile,
            // a few times in a row) T is read after the lease and waited past, and records are
            // reused only once the lease ends, as with writers of the first release.
            let floor = h.flags & FLAG_LEASE_FLOOR != 0;
            let mut lease;
            let mut exact = false;
            let mut tries = 0;
            loop {
                lease = now_ns();
                // Who holds the lease, stored before it (writers read it after the lease).
                h.lease_pid.store(opts.lease_pid, Ordering::SeqCst);
                h.lease_start_ticks
                    .store(opts.lease_start_ticks, Ordering::SeqCst);
                // No progress yet for this lease (reset before the lease is visible: a writer
                // that sees the new lease sees no older scan's progress as this one's).
                h.lease_scanned.store(0, Ordering::SeqCst);
                h.lease.store(lease, Ordering::SeqCst);
                // `lease_last` after `lease`: a writer whose stamp saw `lease_last` (and so
                // stamped its free after `lease`) sees the lease in its next recycling check,
                // and does not rewrite that record, live at T. Stored the other way round, a
                // free could be stamped after T by the floor while the same thread's next
                // allocation still saw no lease and rewrote the record at once (its ring's only
                // dead record): a block live at T missing from the snapshot (issue 20; the
                // churn tests' "one block short").
                h.lease_last.store(lease, Ordering::SeqCst);
                tries += 1;
                if !floor {
                    break;
                }
                if now_ns() == lease {
                    h.lease_scanned_for.store(lease, Ordering::SeqCst);
                    exact = true;
                    break;
                }
                if tries == 8 {
                    break;
                }
                // The clock has moved past `lease`: the next lease is larger, as they must be.
            }
            leased_at = precise_ns();
            held = lease;
            progress_ok = exact;
            let t = if exact {
                lease
            } else {
                let t = now_ns();
                // Every clock reading taken after this loop is strictly greater than T. The
                // clock ticks every 1–4 ms: sleep rather than spin.
                while now_ns() <= t {
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                t
            };
            let threads = h
                .thread_count
                .load(Ordering::SeqCst)
                .min(self.cap(section::THREADS));
            // Operations in flight now. Their records may be half written: with a writer
            // that says which node each window writes (FLAG_OP_NODE), up to LEASE_PINNED of
            // them are pinned — writers may not rewrite those nodes — and read again once
            // the operation has ended, after the scan; the others are waited for now.
            let by_node = h.flags & FLAG_OP_NODE != 0;
            let mut wait_now: Vec<(&ThreadSlotV1, u64)> = Vec::new();
            self.for_each_slot(threads, |slot| {
                let s = slot.op_seq.load(Ordering::SeqCst);
                if s & 1 == 0 {
                    return;
                }
                if !by_node {
                    wait_now.push((slot, s));
                    return;
                }
                let n = slot.op_node.load(Ordering::Acquire);
                if slot.op_seq.load(Ordering::SeqCst) != s {
                    return; // ended meanwhile: its writes are visible to us
                }
                if n == u32::MAX {
                    return; // a window that writes no record (a dropped block)
                }
                // Two windows never write one node but in a damaged region: pin it once
                // (and read it once), wait for the other before the scan.
                if pinned.len() < LEASE_PINNED && !pinned.iter().any(|&(_, _, m)| m == n) {
                    pinned.push((slot, s, n));
                } else {
                    wait_now.push((slot, s));
                }
            });
            for (i, &(_, _, n)) in pinned.iter().enumerate() {
                h.lease_pinned[i].store(n, Ordering::Relaxed);
            }
            // Published by the progress stores (Release) that follow: a writer that may
            // rewrite a scanned node sees the pins first.
            h.lease_pinned_count
                .store(pinned.len() as u32, Ordering::Release);
            // One wait budget for all slots together: a region whose slots all look busy
            // (a stopped process, a crafted file) costs `wait_timeout` once, not per slot.
            let start = precise_ns();
            let deadline = start.saturating_add(opts.wait_timeout.as_nanos() as u64);
            for &(slot, s) in &wait_now {
                waits.wait(slot, s, deadline);
            }
            fence(Ordering::SeqCst);
            t
        } else {
            TIME_NONE - 1
        };
        // A named snapshot's instant is in the past: the consistency protocol above still runs
        // (operations in flight now are waited for), then blocks are judged at that instant.
        // The scan's own duration is counted from now (`scan_from`), not from that instant.
        let scan_from = t;
        let t = match opts.at {
            Some(at) => at.min(t),
            None => t,
        };
        let born_after = opts.born_after;
        meta.time_ns = t;
        let nodes = h
            .node_cursor
            .load(Ordering::Acquire)
            .min(self.cap(section::ALLOCATIONS));
        let mut scanned = 0u64;
        // The block node `i` holds if it was live at T (and born after `born_after`), read
        // under its seqlock.
        let judge = |i: u64| -> Option<Block> {
            let n = self.at::<NodeV1>(section::ALLOCATIONS, i)?;
            let a1 = n.t_alloc.load(Ordering::Acquire);
            if a1 > t || a1 <= born_after {
                return None;
            }
            let block = Block {
                address: n.address.load(Ordering::Relaxed),
                size: n.size.load(Ordering::Relaxed),
                t_alloc: a1,
                stack: n.stack.load(Ordering::Relaxed),
                thread: n.thread.load(Ordering::Relaxed),
            };
            let t_free = n.t_free.load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if n.t_alloc.load(Ordering::Relaxed) != a1 || t_free <= t {
                return None;
            }
            Some(block)
        };
        // With a lease, tell writers how far the scan got (every PROGRESS_STEP nodes): what it
        // has read they may rewrite, pinned nodes excepted.
        let progress = (live && progress_ok).then_some(&h.lease_scanned);
        let is_pinned = |i: u64| pinned.iter().any(|&(_, _, n)| n as u64 == i);
        self.data_runs(section::ALLOCATIONS, nodes, |a, b| {
            scanned += b - a;
            for i in a..b {
                if let Some(p) = progress {
                    if i % PROGRESS_STEP == 0 {
                        p.store(i, Ordering::Release);
                    }
                }
                if !pinned.is_empty() && is_pinned(i) {
                    continue; // read once its operation has ended, below
                }
                if self.at::<NodeV1>(section::ALLOCATIONS, i).is_none() {
                    break;
                }
                if let Some(block) = judge(i) {
                    meta.blocks += 1;
                    meta.bytes = meta.bytes.saturating_add(block.size);
                    visit(&block);
                }
            }
            if let Some(p) = progress {
                p.store(b, Ordering::Release);
            }
            true
        });
        // The pinned nodes, once the operations writing them at T have ended (one budget for
        // all of them; an operation still unfinished past it is read as it is, as a stopped
        // writer's is).
        if !pinned.is_empty() {
            let deadline = precise_ns().saturating_add(opts.wait_timeout.as_nanos() as u64);
            for &(slot, s, n) in &pinned {
                waits.wait(slot, s, deadline);
                fence(Ordering::Acquire);
                // A writer takes its record's index from the cursor before it names it in
                // `op_node`, and the cursor was read after the pins: a pin past it is a
                // damaged or crafted region's, not a record.
                if n as u64 >= nodes {
                    continue;
                }
                if let Some(block) = judge(n as u64) {
                    meta.blocks += 1;
                    meta.bytes = meta.bytes.saturating_add(block.size);
                    visit(&block);
                }
            }
            meta.resolved_after_scan = pinned.len() as u64;
        }
        meta.max_wait_ns = waits.longest_ns;
        if waits.stuck > 0 {
            let (n, tids) = (waits.stuck, &waits.tids);
            let more = if n > tids.len() as u64 { ", …" } else { "" };
            meta.warnings.push(format!(
                "{n} thread(s) stayed inside the allocator past the {:?} wait for operations in \
                 progress (tids {tids:?}{more}); those operations may be missing",
                opts.wait_timeout,
            ));
        }
        meta.nodes_scanned = scanned;
        if frozen {
            // Every stamp the target writes once it resumes must be later than `T` (as in the
            // live protocol, for `--since` this snapshot): the caller checks that it stayed
            // stopped until after this returns, so wait here until the clock has passed `T`
            // (at most a tick; bounded against a crafted `named_floor` in the future).
            let mut passed = false;
            for _ in 0..100 {
                if now_ns() > t {
                    passed = true;
                    break;
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            if !passed {
                meta.warnings.push(format!(
                    "the region's clock did not pass the snapshot's instant {t} ns (named \
                     snapshot floor in the future?): blocks allocated right after it may count \
                     as born before it"
                ));
            }
        }
        if live {
            // Helper V, 2: from the named moment, every `--named` of a moment 30 s old warned
            // that blocks may be missing.
            let took = now_ns().saturating_sub(scan_from);
            // A writer clears a lease whose holder it judges dead (`lease_holder_gone`): from
            // then on it rewrote records this scan had not read yet.
            if h.lease.load(Ordering::SeqCst) != held {
                meta.lease_lost = true;
                meta.warnings.push(
                    "the target released this snapshot's lease during the scan (it judged the \
                     collector dead): blocks may be missing"
                        .to_owned(),
                );
            }
            h.lease.store(0, Ordering::SeqCst);
            h.lease_scanned_for.store(0, Ordering::SeqCst);
            h.lease_scanned.store(0, Ordering::SeqCst);
            h.lease_pinned_count.store(0, Ordering::SeqCst);
            meta.lease_ns = precise_ns().saturating_sub(leased_at);
            if took + 1_000_000_000 > LEASE_NS {
                meta.warnings.push(format!(
                    "snapshot took {took} ns, near the {LEASE_NS} ns lease: blocks may be missing"
                ));
            }
        }
        meta
    }

    /// The instant `T` of a snapshot of a stopped writer (see [`SnapshotOptions::frozen`]),
    /// and the count of threads stopped inside an operation window.
    ///
    /// Why the records, read as they are, are the blocks live at the instant of the freeze
    /// (the argument in full is in `ARCHITECTURE.md`, "Snapshots of a stopped target"):
    ///
    /// * No writer thread runs from before this call until the caller's check after it, so no
    ///   record changes during the scan and none is recycled: no lease is needed. The writer's
    ///   stores were made before its threads stopped; the kernel's stop path and the caller's
    ///   reading of the thread states order them before ours (plus the fence below).
    /// * Every stamp the writer wrote was read from the clock before its thread stopped, so it
    ///   is at most `now` read here — or `named_floor + 1` when a named snapshot made stamps run
    ///   ahead of the clock in its tick: `T = max(now, named_floor + 1)` is at least every
    ///   stamp written. `T` is then the freeze: a record counts iff it is published and not
    ///   freed (`t_alloc <= T < t_free`).
    /// * An operation stopped inside its window took its stamp and wrote part of its record.
    ///   An insert is visible only once `t_alloc` holds its stamp, which is stored last: before
    ///   that the node shows `u64::MAX` (skipped by the seqlock check) or the dead record it
    ///   replaces (dead at `T`), so the block, whose `malloc` has not returned, is not counted.
    ///   An erase stores `t_free` in one store, before the block goes back to the allocator:
    ///   stored, the block is not counted; not stored, it is, and its address cannot have been
    ///   handed out again meanwhile. Either way the record says what the program could
    ///   observe at the freeze, by the same rule as every other record.
    fn frozen_instant(&self, meta: &mut SnapshotMeta) -> u64 {
        let h = self.header();
        fence(Ordering::SeqCst);
        meta.frozen = true;
        let threads = h
            .thread_count
            .load(Ordering::Acquire)
            .min(self.cap(section::THREADS));
        let mut in_window = 0u64;
        self.for_each_slot(threads, |slot| {
            if slot.op_seq.load(Ordering::Acquire) & 1 == 1 {
                in_window += 1;
            }
        });
        meta.stopped_in_operation = in_window;
        // `named_floor` is never u64::MAX in a sound region; a crafted one is clamped below the
        // post-mortem instant.
        let floor = h.named_floor.load(Ordering::Acquire);
        now_ns().max(floor.saturating_add(1)).min(TIME_NONE - 2)
    }

    /// The lease word of a writable region (for a signal handler of the collector that must
    /// release the lease before the process dies: storing 0 is async-signal-safe); `None` for
    /// a read-only region.
    pub fn lease_word(&self) -> Option<&AtomicU64> {
        self.writable.then(|| &self.header().lease)
    }

    /// Number of stack entries recorded.
    pub fn stack_count(&self) -> u64 {
        self.header()
            .stack_count
            .load(Ordering::Acquire)
            .min(self.cap(section::STACK_ENTRIES))
    }

    /// Visits, in order, the ids below [`Self::stack_count`] whose entries hold data (an entry
    /// in a hole of the file is not published: it is not read, see [`Self::with_file`]).
    pub fn for_each_stack_id(&self, mut f: impl FnMut(u32)) {
        self.data_runs(section::STACK_ENTRIES, self.stack_count(), |a, b| {
            (a..b).for_each(|i| f(i as u32));
            true
        });
    }

    /// Frames (leaf first) of each stack of `ids` that is a valid, published entry, as
    /// [`Self::stack`] reads them; but with [`Self::with_file`], an entry or frames lying in a
    /// hole of the file are not read (they cannot have been published, and reading them
    /// through the mapping would allocate their pages): the data runs of both sections are
    /// found once, so this costs no system call per stack.
    pub fn stacks(
        &self,
        ids: impl IntoIterator<Item = u32>,
    ) -> std::collections::HashMap<u32, Vec<u64>> {
        let runs = |kind: u32| {
            let mut v: Vec<(u64, u64)> = Vec::new();
            self.data_runs(kind, self.cap(kind), |a, b| {
                v.push((a, b));
                true
            });
            v
        };
        // Whether [a, b) lies within one run.
        let inside = |runs: &[(u64, u64)], a: u64, b: u64| {
            let i = runs.partition_point(|r| r.1 <= a);
            runs.get(i).is_some_and(|r| r.0 <= a && b <= r.1)
        };
        let (entries, frames) = (runs(section::STACK_ENTRIES), runs(section::STACK_FRAMES));
        let mut out = std::collections::HashMap::new();
        for id in ids {
            let id64 = id as u64;
            if !inside(&entries, id64, id64 + 1) {
                continue;
            }
            let Some(e) = self.at::<StackEntryV1>(section::STACK_ENTRIES, id64) else {
                continue;
            };
            let df = e.depth_flags.load(Ordering::Acquire);
            let depth = (df & 0xffff) as u64;
            let off = e.frames_offset.load(Ordering::Relaxed) as u64;
            if df & STACK_PUBLISHED == 0
                || depth as usize > MAX_FRAMES
                || !inside(&frames, off, off + depth)
            {
                continue;
            }
            if let Some(f) = self.stack(id) {
                out.insert(id, f);
            }
        }
        out
    }

    /// Frames of stack `id` (leaf first), or `None` if it is not a valid, published entry.
    pub fn stack(&self, id: u32) -> Option<Vec<u64>> {
        let e = self.at::<StackEntryV1>(section::STACK_ENTRIES, id as u64)?;
        let df = e.depth_flags.load(Ordering::Acquire);
        if df & STACK_PUBLISHED == 0 {
            return None;
        }
        let depth = (df & 0xffff) as u64;
        if depth as usize > MAX_FRAMES {
            return None;
        }
        let off = e.frames_offset.load(Ordering::Relaxed) as u64;
        (0..depth)
            .map(|i| {
                self.at::<AtomicU64>(section::STACK_FRAMES, off + i)
                    .map(|f| f.load(Ordering::Relaxed))
            })
            .collect()
    }

    /// Whether the writer may store Python frames ([`PYTHON_FRAME`]) in its stacks.
    pub fn has_python_frames(&self) -> bool {
        self.header().flags & FLAG_PYTHON_FRAMES != 0
    }

    /// The Python code record that frame `frame` (a [`PYTHON_FRAME`]) names; `None` when the
    /// frame is not a Python frame, the record is unknown (0), not published, out of bounds or
    /// malformed, or lies in a hole of the file (see [`Self::with_file`]).
    pub fn python_code(&self, frame: u64) -> Option<PythonCode> {
        if frame & PYTHON_FRAME == 0 || !self.has_python_frames() {
            return None;
        }
        let first = (frame & !PYTHON_FRAME) >> 32;
        let cap = self.cap(section::PYTHON);
        let used = 1 + self.header().python_cursor.load(Ordering::Acquire).min(cap);
        if first == 0 || first + PYTHON_RECORD_WORDS > used.min(cap) {
            return None;
        }
        let word = |i: u64| {
            self.at::<AtomicU64>(section::PYTHON, first + i)
                .map(|w| w.load(Ordering::Relaxed))
        };
        // The header words must be in data before they are read.
        let mut in_data = false;
        self.data_runs_in(
            section::PYTHON,
            first,
            first + PYTHON_RECORD_WORDS,
            |a, b| {
                in_data = a <= first && first + PYTHON_RECORD_WORDS <= b;
                false
            },
        );
        if !in_data {
            return None;
        }
        let w0 = self
            .at::<AtomicU64>(section::PYTHON, first)?
            .load(Ordering::Acquire);
        let words = w0 & 0xffff_ffff;
        if w0 & PYTHON_RECORD_PUBLISHED == 0
            || !(PYTHON_RECORD_WORDS..=PYTHON_RECORD_MAX_WORDS).contains(&words)
            || first + words > used.min(cap)
        {
            return None;
        }
        let mut in_data = false;
        self.data_runs_in(section::PYTHON, first, first + words, |a, b| {
            in_data = a <= first && first + words <= b;
            false
        });
        if !in_data {
            return None;
        }
        let (w1, w2, w3) = (word(1)?, word(2)?, word(3)?);
        let (qlen, flen, llen) = ((w2 >> 32) & 0xffff, w2 >> 48, w3 & 0xffff_ffff);
        let body = (words - PYTHON_RECORD_WORDS) * 8;
        if qlen + flen + llen > body {
            return None;
        }
        let mut bytes = Vec::with_capacity(body as usize);
        for i in PYTHON_RECORD_WORDS..words {
            bytes.extend_from_slice(&word(i)?.to_le_bytes());
        }
        let (q, rest) = bytes.split_at(qlen as usize);
        let (f, rest) = rest.split_at(flen as usize);
        Some(PythonCode {
            address: w1,
            first_line: (w2 & 0xffff_ffff) as u32,
            qualname: String::from_utf8_lossy(q).into_owned(),
            filename: String::from_utf8_lossy(f).into_owned(),
            linetable: rest[..llen as usize].to_vec(),
            minor: ((w3 >> 32) & 0xff) as u8,
            truncated: (w3 >> 40) & 1 != 0,
        })
    }

    /// Cumulative `(allocations, bytes)` of every stack below [`Self::stack_count`] that has
    /// any, summed over stripes; only counters in data are read (see [`Self::with_file`]), and
    /// the map holds only stacks with counts, so its size is bounded by the file's data.
    pub fn all_stack_totals(&self) -> std::collections::HashMap<u32, (u64, u64)> {
        let stacks = self.cap(section::STACK_ENTRIES);
        let count = self.stack_count();
        let mut out = std::collections::HashMap::new();
        for stripe in 0..STRIPES as u64 {
            let base = stripe * stacks;
            self.data_runs_in(section::STACK_COUNTERS, base, base + count, |a, b| {
                for i in a..b {
                    let Some(c) = self.at::<StackCounterV1>(section::STACK_COUNTERS, i) else {
                        break;
                    };
                    let (n, by) = (
                        c.count.load(Ordering::Relaxed),
                        c.bytes.load(Ordering::Relaxed),
                    );
                    if n != 0 || by != 0 {
                        let e: &mut (u64, u64) = out.entry((i - base) as u32).or_default();
                        e.0 = e.0.saturating_add(n);
                        e.1 = e.1.saturating_add(by);
                    }
                }
                true
            });
        }
        out
    }

    /// Cumulative `(allocations, bytes)` made from stack `id`, summed over stripes.
    pub fn stack_totals(&self, id: u32) -> (u64, u64) {
        let stacks = self.cap(section::STACK_ENTRIES);
        let (mut n, mut b) = (0u64, 0u64);
        for stripe in 0..STRIPES as u64 {
            if let Some(c) =
                self.at::<StackCounterV1>(section::STACK_COUNTERS, stripe * stacks + id as u64)
            {
                n = n.saturating_add(c.count.load(Ordering::Relaxed));
                b = b.saturating_add(c.bytes.load(Ordering::Relaxed));
            }
        }
        (n, b)
    }

    /// Thread slots in use or used before.
    pub fn threads(&self) -> Vec<ThreadInfo> {
        let n = self
            .header()
            .thread_count
            .load(Ordering::Acquire)
            .min(self.cap(section::THREADS));
        let mut out = Vec::new();
        self.for_each_slot(n, |s| {
            let mut name = [0u8; 16];
            name[..8].copy_from_slice(&s.name[0].load(Ordering::Relaxed).to_ne_bytes());
            name[8..].copy_from_slice(&s.name[1].load(Ordering::Relaxed).to_ne_bytes());
            let ranges: Vec<(u64, u64, bool)> = (s.private.iter())
                .filter_map(|w| crate::v1::unpack_range(w.load(Ordering::Relaxed)))
                .collect();
            out.push(ThreadInfo {
                tid: s.tid.load(Ordering::Relaxed),
                name: c_string(&name),
                running: s.state.load(Ordering::Relaxed) == SLOT_USED,
                private: (ranges.iter())
                    .filter(|r| !r.2)
                    .map(|&(a, n, _)| (a, n))
                    .collect(),
                stack: ranges.iter().find(|r| r.2).map(|&(a, n, _)| (a, n)),
            });
        });
        out
    }

    /// The named snapshots the program took, in order (complete entries only).
    pub fn named_snapshots(&self) -> Vec<NamedSnapshot> {
        let n = self
            .header()
            .named_count
            .load(Ordering::Acquire)
            .min(self.cap(section::NAMED));
        let mut out = Vec::new();
        for i in 0..n {
            let Some(e) = self.at::<NamedSnapshotV1>(section::NAMED, i) else {
                break;
            };
            if e.state.load(Ordering::Acquire) != NAMED_READY {
                continue;
            }
            let mut bytes = Vec::with_capacity(NAME_BYTES);
            for w in &e.name {
                bytes.extend_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
            }
            let len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
            out.push(NamedSnapshot {
                index: i as u32,
                name: String::from_utf8_lossy(&bytes[..len]).into_owned(),
                time_ns: e.time_ns.load(Ordering::Relaxed),
                realtime_ns: e.realtime_ns.load(Ordering::Relaxed),
                lost: e.lost.load(Ordering::Relaxed),
            });
        }
        out
    }

    /// The module table, copied under its seqlock (retried a bounded number of times).
    pub fn modules(&self) -> Vec<Module> {
        let h = self.header();
        let sec = self.sections[section::MODULES as usize - 1];
        for _ in 0..1000 {
            let s1 = h.module_seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::thread::yield_now();
                continue;
            }
            // No allocation sized by the count: only entries in data are read, and only
            // non-empty ones kept.
            let n = h.module_count.load(Ordering::Acquire).min(sec.capacity);
            let mut out = Vec::new();
            self.data_runs(section::MODULES, n, |a, b| {
                for i in a..b {
                    let mut raw = [0u64; size_of::<ModuleV1>() / 8];
                    let p = (self.base as usize + (sec.offset + i * sec.entry_size as u64) as usize)
                        as *const u64;
                    for (k, w) in raw.iter_mut().enumerate() {
                        // SAFETY: the module section lies in the mapping (validated) and is
                        // 8-byte aligned; a concurrent writer is detected by the seqlock below.
                        *w = unsafe { std::ptr::read_volatile(p.add(k)) };
                    }
                    // SAFETY: ModuleV1 is plain old data of exactly this size; any bit pattern
                    // is a valid value.
                    let m: ModuleV1 = unsafe { std::mem::transmute(raw) };
                    if m.state == MODULE_EMPTY {
                        continue;
                    }
                    let path_len = (m.path_len as usize).min(MODULE_PATH_BYTES);
                    out.push(Module {
                        path: String::from_utf8_lossy(&m.path[..path_len]).into_owned(),
                        base: m.base,
                        build_id: m.build_id[..(m.build_id_len as usize).min(MAX_BUILD_ID)]
                            .to_vec(),
                        segments: m.segments[..(m.segment_count as usize).min(MAX_SEGMENTS)]
                            .to_vec(),
                        loaded: m.state == MODULE_LOADED,
                    });
                }
                true
            });
            fence(Ordering::Acquire);
            if h.module_seq.load(Ordering::Relaxed) == s1 {
                return out;
            }
        }
        Vec::new()
    }
}

fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}
