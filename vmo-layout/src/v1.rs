//! Layout version 1 of the heapdump region.
//!
//! A region is one file (mode 0600) mapped `MAP_SHARED` by the instrumented process (the writer)
//! and, at snapshot time, by the collector (the reader). Every multi-byte field is native-endian
//! 64-bit little-endian (x86-64, aarch64): a region is meant to be read on the machine that wrote
//! it (or one of the same architecture).
//!
//! ```text
//! offset  size      what
//! 0       4096      Header: magic, version, header size, section table, process identity,
//!                   counters (each hot one on its own 64-byte line)
//! ...     sections, each 4096-aligned, at the offsets the section table gives:
//!         ALLOCATIONS   capacity × 40 B   NodeV1: one record per block (live or dead)
//!         STACK_ENTRIES capacity × 16 B   StackEntryV1: hash, offset/depth into STACK_FRAMES
//!         STACK_FRAMES  capacity × 8 B    return addresses, raw u64
//!         STACK_COUNTERS STRIPES × stacks × 16 B  cumulative allocations per stack trace
//!         THREADS       capacity × 128 B  ThreadSlotV1: op sequence, tid, name, counters
//!         MODULES       capacity × 1024 B ModuleV1: path, load bias, build ID, PT_LOAD segments
//!         NAMED         capacity × 128 B  NamedSnapshotV1: named snapshots the program took
//!         PYTHON        capacity × 8 B    Python code records (see [`PYTHON_FRAME`])
//! ```
//!
//! NAMED and PYTHON were added after the first release of v1: readers accept regions without
//! them (no named snapshots, no Python frames), and readers that predate them ignore them (they
//! look sections up by kind).
//!
//! The design follows Fuchsia's heapdump (`src/performance/memory/heapdump/vmo`: a node pool of
//! 40-byte records and append-only, deduplicated stack traces) with three changes: a header with
//! magic, version and section table; no global writer lock; and timestamps on insert *and* erase,
//! which give a reader a point-in-time view without a kernel copy-on-write snapshot (see
//! `ARCHITECTURE.md` and [`crate::reader`]).

use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicU32, AtomicU64};

/// First eight bytes of every region.
pub const MAGIC: [u8; 8] = *b"HEAPDUMP";
/// The layout version this module describes.
pub const LAYOUT_VERSION: u32 = 1;
/// Size of [`HeaderV1`] in bytes (one page).
pub const HEADER_SIZE: usize = 4096;
/// Alignment of every section's offset, in bytes.
pub const SECTION_ALIGN: u64 = 4096;
/// Most frames kept per stack trace.
pub const MAX_FRAMES: usize = 64;
/// Number of stripes of the per-stack cumulative counters (threads use slot % STRIPES).
pub const STRIPES: usize = 4;
/// `t_free` of a live block; also the `t_alloc` of a node being rewritten.
pub const TIME_NONE: u64 = u64::MAX;
/// A reader lease older than this (ns) is considered abandoned by writers.
pub const LEASE_NS: u64 = 30_000_000_000;
/// A writer blocked by a lease checks whether the lease's holder ([`HeaderV1::lease_pid`]) is
/// still alive at most this often (ns), per process.
pub const LEASE_CHECK_NS: u64 = 5_000_000;
/// Bytes reserved for the executable path and for the command line in the header.
pub const PATH_BYTES: usize = 1024;
/// Most PT_LOAD segments recorded per module.
pub const MAX_SEGMENTS: usize = 8;
/// Longest build ID recorded (bytes).
pub const MAX_BUILD_ID: usize = 32;
/// Bytes for a module's path (NUL-padded).
pub const MODULE_PATH_BYTES: usize = 1024 - 64 - MAX_SEGMENTS * 24;

/// Section kinds, as stored in [`SectionV1::kind`].
pub mod section {
    /// [`super::NodeV1`] records.
    pub const ALLOCATIONS: u32 = 1;
    /// [`super::StackEntryV1`] records.
    pub const STACK_ENTRIES: u32 = 2;
    /// Raw `u64` return addresses.
    pub const STACK_FRAMES: u32 = 3;
    /// `STRIPES × capacity` [`super::StackCounterV1`] records.
    pub const STACK_COUNTERS: u32 = 4;
    /// [`super::ThreadSlotV1`] records.
    pub const THREADS: u32 = 5;
    /// [`super::ModuleV1`] records.
    pub const MODULES: u32 = 6;
    /// [`super::NamedSnapshotV1`] records (optional: regions of older writers lack it).
    pub const NAMED: u32 = 7;
    /// Python code records, 8-byte words (optional: see [`super::FLAG_PYTHON_FRAMES`]).
    pub const PYTHON: u32 = 8;
    /// Number of section kinds in v1.
    pub const COUNT: usize = 8;
}

/// One entry of the section table (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SectionV1 {
    /// One of [`section`].
    pub kind: u32,
    /// Size of one entry in bytes.
    pub entry_size: u32,
    /// Byte offset of the section from the start of the region.
    pub offset: u64,
    /// Number of entries the section can hold.
    pub capacity: u64,
    /// Zero.
    pub reserved: u64,
}
const _: () = assert!(size_of::<SectionV1>() == 32);

/// The region header: one page at offset 0.
///
/// Immutable fields are written once before `state` becomes [`STATE_READY`]; atomics are updated
/// while the process runs. Unused bytes are zero; later minor versions may give them meaning
/// (readers must ignore them).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct HeaderV1 {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// [`LAYOUT_VERSION`].
    pub layout_version: u32,
    /// [`HEADER_SIZE`].
    pub header_size: u32,
    /// Total size of the region file in bytes.
    pub region_size: u64,
    /// Number of valid entries in `sections`.
    pub section_count: u32,
    /// `size_of::<SectionV1>()`.
    pub section_entry_size: u32,
    /// Process id of the writer.
    pub pid: u32,
    /// Features of the writer: an or of `FLAG_*` bits (0 for the first release of v1).
    pub flags: u32,
    /// Process start time in clock ticks since boot (`/proc/PID/stat` field 22).
    pub start_ticks: u64,
    /// `CLOCK_REALTIME` when the region was created (ns since the Unix epoch).
    pub created_realtime_ns: u64,
    /// The region's clock (`CLOCK_MONOTONIC_COARSE`, ns; see `clock::now_ns`) when the region
    /// was created; all other times use this clock.
    pub created_monotonic_ns: u64,
    /// Device and inode of `/proc/self/exe` at creation (tells images of one pid apart).
    pub exe_dev: u64,
    /// See `exe_dev`.
    pub exe_ino: u64,
    /// Requested-size sampling interval in bytes (0: every allocation recorded).
    pub sample_interval: u64,
    /// [`STATE_INITIALIZING`], [`STATE_READY`] or [`STATE_EXITED`].
    pub state: AtomicU32,
    /// Why recording is (partly) stopped: an or of `RECORDING_*` bits, 0 while everything is
    /// recorded. Set by the writer, never cleared.
    pub recording_flags: AtomicU32,
    /// Most dead records kept for named snapshots (`HEAPDUMP_NAMED_SNAPSHOT_RECORDS`): past it,
    /// records a named snapshot needs are recycled and counted in its `lost`.
    pub named_hold_limit: u64,
    /// Region-clock ns of the latest completed named snapshot (0: none); unlike `named_last`
    /// never `u64::MAX`. Events in the same clock tick after it are stamped `named_floor + 1`.
    pub named_floor: AtomicU64,
    _pad0: [u8; 128 - 112],
    /// Reader lease: region-clock ns at which a reader started, 0 when none.
    pub lease: AtomicU64,
    /// Fork lease: region-clock ns of a `fork` whose child is still copying the blocks it
    /// inherited from this region; 0 when none. Writers treat it like `lease`.
    pub fork_lease: AtomicU64,
    /// Pid of the collector holding `lease`, as the writer sees it (same pid namespace), or 0
    /// when unknown (then only the [`LEASE_NS`] expiry frees the lease). Stored before the
    /// lease; writers that find the lease blocking them check, at most every
    /// [`LEASE_CHECK_NS`], whether this process is still alive, and clear a dead one's lease.
    pub lease_pid: AtomicU32,
    _pad1a: u32,
    /// Start time (clock ticks since boot, `/proc/PID/stat` field 22) of the collector holding
    /// `lease`, so that a reused pid is not taken for the collector; 0 when unknown.
    pub lease_start_ticks: AtomicU64,
    /// The last lease value any collector stored (never cleared). A collector waits until the
    /// clock has passed it before storing its own lease, so lease values only grow and a
    /// writer clearing a dead collector's lease (compare-exchange) never clears a later one.
    pub lease_last: AtomicU64,
    /// Region-clock ns of the latest named snapshot (0: none yet; `u64::MAX` while one is
    /// being taken). A block freed later whose `t_alloc` is at most this was live at that
    /// instant: its record is kept (not recycled) within `named_hold_limit`. Every allocation
    /// and free is stamped after it (`max(clock, named_last + 1)`): the clock ticks every few
    /// ms, and events after a named snapshot in the same tick must not look earlier.
    pub named_last: AtomicU64,
    /// Entries of NAMED handed out (may exceed the capacity: the excess calls were refused).
    pub named_count: AtomicU64,
    /// Dead records kept for named snapshots so far (added in batches of up to 64 per thread).
    pub named_held: AtomicU64,
    /// Nodes of ALLOCATIONS handed out so far (bump cursor, multiples of a batch).
    pub node_cursor: AtomicU64,
    /// The lease whose scan [`Self::lease_scanned`] describes (0: none). Added after the
    /// first release of v1: older readers leave it 0 (or a value from an earlier lease of a
    /// newer reader, never equal to their own lease, since lease values only grow).
    pub lease_scanned_for: AtomicU64,
    /// Entries `[0, lease_scanned)` of ALLOCATIONS the reader holding lease
    /// [`Self::lease_scanned_for`] has finished reading: a writer may rewrite those whatever
    /// their `t_free`, which keeps the allocations table from growing with every snapshot of a
    /// busy process (records freed during a snapshot become reusable as its scan passes them).
    pub lease_scanned: AtomicU64,
    /// Entries of [`Self::lease_pinned`] in use for the lease [`Self::lease_scanned_for`].
    pub lease_pinned_count: AtomicU32,
    /// Nodes written by operations that were in flight at the snapshot's instant: the reader
    /// reads them again once those operations end, so writers must not rewrite them even
    /// where [`Self::lease_scanned`] would let them (`u32::MAX`: unused).
    pub lease_pinned: [AtomicU32; LEASE_PINNED],
    _pad2: [u8; 4],
    /// Stack entries handed out so far.
    pub stack_count: AtomicU64,
    /// Frames of STACK_FRAMES handed out so far.
    pub frame_cursor: AtomicU64,
    /// Stack traces not recorded because a stack section was full.
    pub dropped_stacks: AtomicU64,
    /// Words of the PYTHON section handed out so far, after its first word (never handed
    /// out, so that code record 0 means "unknown"): records lie in `[1, 1 + python_cursor)`. Added after the first release of v1, in what was
    /// reserved space: older writers leave it 0.
    pub python_cursor: AtomicU64,
    _pad3: [u8; 32],
    /// Thread slots ever used (high-water mark).
    pub thread_count: AtomicU64,
    /// Modules ever recorded.
    pub module_count: AtomicU64,
    /// Seqlock over the module table: odd while a writer changes it.
    pub module_seq: AtomicU64,
    /// Highest live bytes observed (sampled by each writer thread every 1024 operations).
    pub peak_live_bytes: AtomicU64,
    _pad4: [u8; 32],
    /// The section table.
    pub sections: [SectionV1; 8],
    _pad5: [u8; 1024 - 384 - 256],
    /// Executable path, NUL-padded.
    pub exe_path: [u8; PATH_BYTES],
    /// Command line, arguments separated by NUL, NUL-padded (truncated).
    pub cmdline: [u8; PATH_BYTES],
    /// Warnings of the writer at start-up (invalid settings, …): UTF-8 lines, each ending in
    /// `\n`, NUL-padded (truncated). Written before `state` becomes [`STATE_READY`].
    pub warnings: [u8; WARNINGS_BYTES],
}
const _: () = assert!(size_of::<HeaderV1>() == HEADER_SIZE);
const _: () = assert!(offset_of!(HeaderV1, state) == 88);
const _: () = assert!(offset_of!(HeaderV1, lease) == 128);
const _: () = assert!(offset_of!(HeaderV1, lease_pid) == 144);
const _: () = assert!(offset_of!(HeaderV1, lease_start_ticks) == 152);
const _: () = assert!(offset_of!(HeaderV1, lease_last) == 160);
const _: () = assert!(offset_of!(HeaderV1, node_cursor) == 192);
const _: () = assert!(offset_of!(HeaderV1, lease_scanned_for) == 200);
const _: () = assert!(offset_of!(HeaderV1, lease_scanned) == 208);
const _: () = assert!(offset_of!(HeaderV1, lease_pinned_count) == 216);

/// Capacity of [`HeaderV1::lease_pinned`]: a reader that finds more operations in flight waits
/// for the others before its scan, as readers without the pin list do.
pub const LEASE_PINNED: usize = 8;

/// [`HeaderV1::flags`] bit: the writer stores [`ThreadSlotV1::op_node`] before each operation
/// window, so a reader need not wait for operations in flight before it scans (it pins their
/// nodes and reads them again afterwards). Writers of the first release of v1 leave it 0.
pub const FLAG_OP_NODE: u32 = 1;
/// [`HeaderV1::flags`] bit: every event is stamped after [`HeaderV1::lease_last`] (see
/// `RegionWriter::stamp`), so a reader may take its lease value as its instant `T` without
/// waiting for the clock to pass it. Writers of the first release of v1 leave it 0.
pub const FLAG_LEASE_FLOOR: u32 = 2;
/// [`HeaderV1::flags`] bit: stack frames with bit 63 set are Python frames
/// ([`PYTHON_FRAME`]), whose code records are in the PYTHON section. Writers without it never
/// store such frames (no user-space return address has bit 63 set).
pub const FLAG_PYTHON_FRAMES: u32 = 4;

/// A stack frame with this bit set is a Python frame, not a return address: bits 32..63 are the
/// word index of its code record in the PYTHON section (0: unknown code), bits 0..32 the index
/// of the instruction executing (in 2-byte code units from the start of the code object's
/// bytecode; `u32::MAX`: unknown). Frames are stored leaf first like return addresses, the
/// Python frames of one run of the eval loop just below (callee side of) the native frame of
/// that run (`_PyEval_EvalFrameDefault`, marked [`PYTHON_EVAL_FRAME`]).
///
/// A code record is `PYTHON_RECORD_WORDS` header words, then the bytes of the qualified name,
/// the file name and the line table (`co_linetable`, CPython's `Objects/locations.md` format,
/// 3.11 and later), packed in order, NUL-padded to a whole word:
///
/// * word 0: the record's length in words (bits 0..32), [`PYTHON_RECORD_PUBLISHED`] once the
///   record is complete (stored last, Release);
/// * word 1: the code object's address (for display);
/// * word 2: `co_firstlineno` (bits 0..32), the qualified name's length in bytes (bits 32..48),
///   the file name's length (bits 48..64);
/// * word 3: the line table's length in bytes (bits 0..32), the CPython minor version
///   (bits 32..40), flags (bits 40..48: bit 0, the line table was truncated).
pub const PYTHON_FRAME: u64 = 1 << 63;
/// A stack frame with this bit set (and [`PYTHON_FRAME`] clear) is a return address into
/// CPython's eval loop (`_PyEval_EvalFrameDefault`) whose Python frames were spliced in just
/// before it (leafward): the address is the frame without this bit, and of the functions it
/// symbolizes to only the outermost is shown (code the compiler inlined into the eval loop
/// runs on behalf of the innermost Python frame, which now stands for it).
pub const PYTHON_EVAL_FRAME: u64 = 1 << 62;
/// Header words of a Python code record (see [`PYTHON_FRAME`]).
pub const PYTHON_RECORD_WORDS: u64 = 4;
/// Word 0 bit of a complete Python code record.
pub const PYTHON_RECORD_PUBLISHED: u64 = 1 << 63;
/// Longest Python code record, in words (a longer line table is truncated).
pub const PYTHON_RECORD_MAX_WORDS: u64 = 8192;

const _: () = assert!(offset_of!(HeaderV1, named_hold_limit) == 96);
const _: () = assert!(offset_of!(HeaderV1, python_cursor) == 280);
const _: () = assert!(offset_of!(HeaderV1, named_last) == 168);
const _: () = assert!(offset_of!(HeaderV1, named_floor) == 104);
const _: () = assert!(offset_of!(HeaderV1, named_count) == 176);
const _: () = assert!(offset_of!(HeaderV1, named_held) == 184);
const _: () = assert!(offset_of!(HeaderV1, stack_count) == 256);
const _: () = assert!(offset_of!(HeaderV1, thread_count) == 320);
const _: () = assert!(offset_of!(HeaderV1, sections) == 384);
const _: () = assert!(offset_of!(HeaderV1, exe_path) == 1024);
const _: () = assert!(offset_of!(HeaderV1, cmdline) == 2048);
const _: () = assert!(offset_of!(HeaderV1, recording_flags) == 92);
const _: () = assert!(offset_of!(HeaderV1, warnings) == 3072);

/// Size of [`HeaderV1::warnings`].
pub const WARNINGS_BYTES: usize = 1024;
/// `HeaderV1::recording_flags`: blocks or stack traces were not recorded because the file
/// system holding the region is full (the shim reserves the file's pages before it writes
/// them, and stops growing the region when it cannot).
pub const RECORDING_FS_FULL: u32 = 1;
/// `HeaderV1::recording_flags`: a process sharing this region's mapping without being its
/// writer (a child made by a raw `clone`/`fork` system call, which runs no fork handlers) was
/// detected and stopped recording into it.
pub const RECORDING_FOREIGN_WRITER: u32 = 2;

/// `HeaderV1::state`: the writer is still laying out the region.
pub const STATE_INITIALIZING: u32 = 0;
/// `HeaderV1::state`: the region is in use.
pub const STATE_READY: u32 = 1;
/// `HeaderV1::state`: the process exited cleanly (region kept by `HEAPDUMP_KEEP=1`).
pub const STATE_EXITED: u32 = 2;
/// `HeaderV1::state`: recording was stopped by `heapdump detach` and the process runs on: the
/// region holds the heap as it was at the detach.
pub const STATE_DETACHED: u32 = 3;

/// One record of the allocations table (40 bytes).
///
/// A node is live at time `T` iff `t_alloc <= T < t_free`. Writers publish with `t_alloc` last
/// (Release); a node being rewritten has `t_alloc == TIME_NONE`, so `t_alloc` doubles as the
/// node's seqlock. A zeroed node (`t_alloc == t_free == 0`) is never live.
#[repr(C)]
#[derive(Debug)]
pub struct NodeV1 {
    /// Block address.
    pub address: AtomicU64,
    /// Requested size in bytes.
    pub size: AtomicU64,
    /// Region-clock ns (`CLOCK_MONOTONIC_COARSE`) of the allocation.
    pub t_alloc: AtomicU64,
    /// Region-clock ns of the free, [`TIME_NONE`] while live.
    pub t_free: AtomicU64,
    /// Stack entry id (index into STACK_ENTRIES), `u32::MAX` when none was recorded.
    pub stack: AtomicU32,
    /// OS thread id of the allocating thread.
    pub thread: AtomicU32,
}
const _: () = assert!(size_of::<NodeV1>() == 40);

/// One stack trace (16 bytes); frames are `depth` consecutive u64 at `frames_offset` in
/// STACK_FRAMES, leaf (the caller of the allocation function) first.
#[repr(C)]
#[derive(Debug)]
pub struct StackEntryV1 {
    /// 64-bit hash of the frames.
    pub hash: AtomicU64,
    /// Index of the first frame in STACK_FRAMES.
    pub frames_offset: AtomicU32,
    /// Low 16 bits: depth; bit 31: published.
    pub depth_flags: AtomicU32,
}
const _: () = assert!(size_of::<StackEntryV1>() == 16);
/// `StackEntryV1::depth_flags` bit set once the entry is complete.
pub const STACK_PUBLISHED: u32 = 1 << 31;

/// Cumulative allocations of one stack trace in one stripe (16 bytes).
#[repr(C)]
#[derive(Debug)]
pub struct StackCounterV1 {
    /// Allocations made from this stack.
    pub count: AtomicU64,
    /// Bytes requested by those allocations.
    pub bytes: AtomicU64,
}
const _: () = assert!(size_of::<StackCounterV1>() == 16);

/// One thread slot (128 bytes, two cache lines written only by the owning thread).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct ThreadSlotV1 {
    /// Operation sequence: odd while the owner is inside an insert or erase.
    pub op_seq: AtomicU64,
    /// OS thread id of the current (or last) owner.
    pub tid: AtomicU32,
    /// [`SLOT_FREE`], [`SLOT_USED`].
    pub state: AtomicU32,
    /// Thread name (`comm`, NUL-padded, 16 bytes).
    pub name: [AtomicU64; 2],
    /// Blocks recorded by owners of this slot.
    pub allocs: AtomicU64,
    /// Blocks erased by owners of this slot.
    pub frees: AtomicU64,
    /// Bytes of blocks recorded.
    pub alloc_bytes: AtomicU64,
    /// Bytes of blocks erased.
    pub free_bytes: AtomicU64,
    /// Blocks not recorded because the allocations table was full.
    pub dropped: AtomicU64,
    /// The node the current (or last) operation window writes, stored before the window opens
    /// (`u32::MAX`: none); see [`FLAG_OP_NODE`].
    pub op_node: AtomicU32,
    _reserved0: u32,
    /// Memory ranges the reference graph must know about, each a word packed by
    /// [`pack_range`] (0: unused). While the slot is used: the shim's private memory of the
    /// owner that keeps copies of the program's words (its unwinder's registers and rule
    /// cache, its stack-walk memo — saved `rbp` values, heap pointers in code built without
    /// frame pointers —, its Python memos, its signal-handler queue), not roots, and the
    /// owner's own stack ([`RANGE_STACK`]), a root. Once released by an exiting thread: that
    /// thread's stack, which glibc keeps mapped for a later thread, dead until then (not a root
    /// unless a running thread's stack overlaps it). Zero in regions of older writers.
    pub private: [AtomicU64; 6],
}
/// Ranges in [`ThreadSlotV1::private`].
pub const THREAD_PRIVATE_RANGES: usize = 6;
/// In a [`pack_range`] word: the range is a running thread's own stack (a root).
pub const RANGE_STACK: u64 = 1 << 63;

/// One range of [`ThreadSlotV1::private`] as a word: bit 63 [`RANGE_STACK`], bits 28–62 the
/// first page (`start >> 12`), bits 0–27 the length in 16-byte units (rounded up). 0 (nothing)
/// for an empty range, one not page-aligned at its start or beyond 47 bits, or of 4 GiB or
/// more.
pub fn pack_range(start: u64, bytes: u64, stack: bool) -> u64 {
    let units = bytes.div_ceil(16);
    if bytes == 0 || !start.is_multiple_of(4096) || start >= 1 << 47 || units >= 1 << 28 {
        return 0;
    }
    (if stack { RANGE_STACK } else { 0 }) | (start >> 12) << 28 | units
}

/// The (start, bytes, stack) of a [`pack_range`] word; `None` for 0.
pub fn unpack_range(w: u64) -> Option<(u64, u64, bool)> {
    if w & !RANGE_STACK == 0 {
        return None;
    }
    let start = ((w & !RANGE_STACK) >> 28) << 12;
    let bytes = (w & ((1 << 28) - 1)) * 16;
    Some((start, bytes, w & RANGE_STACK != 0))
}
const _: () = assert!(offset_of!(ThreadSlotV1, op_node) == 72);
const _: () = assert!(size_of::<ThreadSlotV1>() == 128);
/// `ThreadSlotV1::state`: never used or released by an exited thread.
pub const SLOT_FREE: u32 = 0;
/// `ThreadSlotV1::state`: owned by a running thread.
pub const SLOT_USED: u32 = 1;

/// One PT_LOAD segment of a module (24 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentV1 {
    /// `p_vaddr`.
    pub vaddr: u64,
    /// `p_memsz`.
    pub memsz: u64,
    /// `p_offset` in the low 56 bits, `p_flags` (PF_X = 1) in the top 8.
    pub offset_flags: u64,
}

/// One loaded (or unloaded) module (1024 bytes). Written under `HeaderV1::module_seq`.
#[repr(C)]
#[derive(Debug)]
pub struct ModuleV1 {
    /// Load bias (`dlpi_addr`): runtime address = bias + ELF virtual address.
    pub base: u64,
    /// [`MODULE_EMPTY`], [`MODULE_LOADED`], [`MODULE_UNLOADED`].
    pub state: u32,
    /// Length of `path` in bytes.
    pub path_len: u16,
    /// Length of `build_id` in bytes.
    pub build_id_len: u8,
    /// Number of valid `segments`.
    pub segment_count: u8,
    /// Zero.
    pub reserved: [u64; 2],
    /// GNU build ID.
    pub build_id: [u8; MAX_BUILD_ID],
    /// PT_LOAD segments.
    pub segments: [SegmentV1; MAX_SEGMENTS],
    /// Absolute path of the ELF file.
    pub path: [u8; MODULE_PATH_BYTES],
}
const _: () = assert!(size_of::<ModuleV1>() == 1024);
/// `ModuleV1::state`: unused entry.
pub const MODULE_EMPTY: u32 = 0;
/// `ModuleV1::state`: mapped.
pub const MODULE_LOADED: u32 = 1;
/// `ModuleV1::state`: was mapped, then `dlclose`d.
pub const MODULE_UNLOADED: u32 = 2;

/// Bytes of a named snapshot's name (NUL-padded, truncated to 95 bytes).
pub const NAME_BYTES: usize = 96;

/// A named snapshot (128 bytes): the program asked (`heapdump_take_named_snapshot`) for the
/// blocks live at `time_ns` to stay readable. Written once, under the writer's named-snapshot
/// lock; `state` is stored last (Release).
#[repr(C)]
#[derive(Debug)]
pub struct NamedSnapshotV1 {
    /// [`NAMED_EMPTY`], [`NAMED_WRITING`] or [`NAMED_READY`].
    pub state: AtomicU64,
    /// The instant, region-clock ns: the snapshot holds the blocks with
    /// `t_alloc <= time_ns < t_free`.
    pub time_ns: AtomicU64,
    /// `CLOCK_REALTIME` at that instant, ns since the Unix epoch (for display).
    pub realtime_ns: AtomicU64,
    /// Records this snapshot needed that were recycled because `named_hold_limit` was reached
    /// (an upper bound on the blocks missing from it).
    pub lost: AtomicU64,
    /// The name, NUL-padded: bytes in order, eight per word (native-endian).
    pub name: [AtomicU64; NAME_BYTES / 8],
}
const _: () = assert!(size_of::<NamedSnapshotV1>() == 128);
/// `NamedSnapshotV1::state`: unused entry.
pub const NAMED_EMPTY: u64 = 0;
/// `NamedSnapshotV1::state`: being written.
pub const NAMED_WRITING: u64 = 1;
/// `NamedSnapshotV1::state`: complete.
pub const NAMED_READY: u64 = 2;
/// Default of `HeaderV1::named_hold_limit`: 4 M records (160 MiB of the allocations table).
pub const NAMED_HOLD_DEFAULT: u64 = 4 << 20;

/// How big each section is; chosen by the writer when it creates a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacities {
    /// Records in the allocations table (live blocks plus recently freed ones).
    pub nodes: u64,
    /// Distinct stack traces.
    pub stacks: u64,
    /// Frames over all stack traces.
    pub frames: u64,
    /// Thread slots (threads alive at once).
    pub threads: u64,
    /// Modules ever loaded.
    pub modules: u64,
    /// Named snapshots.
    pub named: u64,
    /// 8-byte words of Python code records.
    pub python_words: u64,
}

impl Default for Capacities {
    fn default() -> Self {
        Capacities {
            nodes: 64 << 20,
            stacks: 1 << 20,
            frames: 24 << 20,
            threads: 8192,
            modules: 1024,
            named: 256,
            python_words: 8 << 20,
        }
    }
}

/// Byte offsets of every section for the given capacities, and the total region size.
///
/// Returns the section table (in [`section`] order) and the region size in bytes.
pub fn plan(c: &Capacities) -> ([SectionV1; section::COUNT], u64) {
    let specs: [(u32, u32, u64); section::COUNT] = [
        (section::ALLOCATIONS, size_of::<NodeV1>() as u32, c.nodes),
        (
            section::STACK_ENTRIES,
            size_of::<StackEntryV1>() as u32,
            c.stacks,
        ),
        (section::STACK_FRAMES, 8, c.frames),
        (
            section::STACK_COUNTERS,
            size_of::<StackCounterV1>() as u32,
            c.stacks * STRIPES as u64,
        ),
        (
            section::THREADS,
            size_of::<ThreadSlotV1>() as u32,
            c.threads,
        ),
        (section::MODULES, size_of::<ModuleV1>() as u32, c.modules),
        (section::NAMED, size_of::<NamedSnapshotV1>() as u32, c.named),
        (section::PYTHON, 8, c.python_words),
    ];
    let mut out = [SectionV1::default(); section::COUNT];
    let mut offset = HEADER_SIZE as u64;
    for (i, (kind, entry_size, capacity)) in specs.into_iter().enumerate() {
        out[i] = SectionV1 {
            kind,
            entry_size,
            offset,
            capacity,
            reserved: 0,
        };
        offset += (entry_size as u64 * capacity).div_ceil(SECTION_ALIGN) * SECTION_ALIGN;
    }
    (out, offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_pinned() {
        assert_eq!(size_of::<HeaderV1>(), 4096);
        assert_eq!(size_of::<NodeV1>(), 40);
        assert_eq!(size_of::<ThreadSlotV1>(), 128);
        assert_eq!(size_of::<ModuleV1>(), 1024);
    }

    #[test]
    fn plan_is_aligned_and_disjoint() {
        let (s, total) = plan(&Capacities::default());
        let mut end = HEADER_SIZE as u64;
        for sec in s {
            assert_eq!(sec.offset % SECTION_ALIGN, 0);
            assert!(sec.offset >= end);
            end = sec.offset + sec.entry_size as u64 * sec.capacity;
        }
        assert!(total >= end);
    }
}
