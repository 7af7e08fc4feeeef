//! Starting to record in a process that is already running (`heapdump attach`), and stopping
//! (`heapdump detach`).
//!
//! The collector stops every thread of the target with ptrace at a point where none is inside
//! the allocator or the loader, makes one of them `dlopen` `libheapdump.so` and call its attach
//! entry (`heapdump_attach_start`, preload crate), which calls [`start`] with every other thread
//! still stopped: the blocks already live are found by walking glibc's heap
//! ([`crate::glibc_heap`]), recording starts (the region is created as at start-up, with the
//! settings the collector passed instead of the process's environment), and the blocks found
//! are recorded under one synthetic frame, the address of the shim's
//! `heapdump_live_before_attach` function, which the collector shows by that name. The preload
//! crate then points the GOT slots of the malloc family at its own functions.

use crate::glibc_heap::{self, Block, Blocks, Vecm};
use crate::state;
use crate::sys::SpinLock;
use std::sync::atomic::{AtomicU8, Ordering};

/// What [`start`] found and recorded.
#[derive(Debug, Clone, Copy, Default)]
pub struct Started {
    /// Blocks live before the attach that were recorded.
    pub blocks: u64,
    /// Their usable sizes, bytes.
    pub bytes: u64,
    /// glibc's `mallinfo2` just before the walk: `uordblks`, `hblkhd`, `hblks`.
    pub mallinfo: [u64; 3],
    /// Attached again after a detach: `blocks`/`bytes` are the blocks made while detached;
    /// see `kept` and `closed`.
    pub reattached: bool,
    /// Records from before the detach whose blocks are still live (re-attach).
    pub kept: u64,
    /// Records from before the detach closed: their blocks were freed while detached.
    pub closed: u64,
    /// Re-attach: blocks left out as the shim's own ([`AT_DETACH`]), and their usable bytes.
    pub own: [u64; 2],
    /// pymalloc objects live before the attach that were recorded, and their bytes (their
    /// size classes'); included in `blocks` and `bytes`.
    pub pymalloc: [u64; 2],
    /// Why CPython's pymalloc arenas were not walked, in a CPython process (`None`: walked,
    /// or not CPython).
    pub pymalloc_not_walked: Option<&'static str>,
    /// Why the heap was not walked (another allocator, a glibc whose layout was not
    /// recognised): only what comes after the attach is recorded. `None` when it was.
    pub heap_not_walked: Option<&'static str>,
}

/// Why [`start`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachError {
    /// The process records already (preloaded, or attached before).
    AlreadyRecording,
    /// The region could not be created (directory not writable, settings disabling it…).
    NoRegion,
    /// No memory could be mapped for the list of records (re-attach).
    NoMemory,
}

impl AttachError {
    /// One line for the user.
    pub fn message(self) -> &'static [u8] {
        match self {
            AttachError::AlreadyRecording => {
                b"the process records already (libheapdump.so preloaded, or attached before)"
            }
            AttachError::NoMemory => b"no memory could be mapped to reconcile the records",
            AttachError::NoRegion => {
                b"recording could not start: the region could not be created (is the region directory writable? HEAPDUMP_DISABLE set?)"
            }
        }
    }
}

const NEVER: u8 = 0;
const ATTACHED: u8 = 1;
const DETACHED: u8 = 2;

/// [`NEVER`], [`ATTACHED`] or [`DETACHED`].
static ATTACH: AtomicU8 = AtomicU8::new(NEVER);

/// Whether the shim was attached to this process (and not detached since): every `dlopen`
/// then points the new objects' GOT slots at the shim.
pub fn attached() -> bool {
    ATTACH.load(Ordering::Acquire) == ATTACHED
}

/// Whether the shim was ever attached to this process (attached now, or detached since).
pub fn attached_before() -> bool {
    ATTACH.load(Ordering::Acquire) != NEVER
}

/// Starts recording in a running process: walks glibc's heap, starts recording with the
/// settings in `env` (NUL-separated `NAME=VALUE` entries, as `/proc/self/environ`; kept for
/// the life of the process), then records the blocks found, each under the single frame
/// `marker_pc`. Call with every other thread of the process stopped outside the allocator.
///
/// After a [`stop`] this attaches again ([`restart`]): `env` is then ignored (the region and
/// its settings are those of the first attach).
///
/// Errors: [`AttachError`].
pub fn start(env: &'static [u8], marker_pc: u64) -> Result<Started, AttachError> {
    if ATTACH.load(Ordering::Acquire) == DETACHED {
        return restart(marker_pc);
    }
    if ATTACH.load(Ordering::Acquire) != NEVER || state::STATE.load(Ordering::Acquire) != 0 {
        return Err(AttachError::AlreadyRecording);
    }
    // Walked before recording starts: the shim's own start-up allocations (unwinder tables)
    // are then not taken for the program's.
    let mut found = Blocks::new();
    let mut py = Blocks::new();
    let mut mallinfo = [0u64; 3];
    let (walked, py_walked) = state::internal_work(|| {
        mallinfo = mallinfo2();
        walk_all(&mut found, &mut py)
    });
    crate::region::set_env_override(env);
    state::init();
    let Some(_) = state::global() else {
        return Err(AttachError::NoRegion);
    };
    let mut started = Started {
        mallinfo,
        heap_not_walked: walked.err(),
        pymalloc_not_walked: py_walked,
        ..Started::default()
    };
    let interval = state::sample_interval();
    for (blocks, pymalloc) in [(&found, false), (&py, true)] {
        for &Block { addr, size } in blocks.as_slice() {
            if interval != 0 && !state::sample(size, interval) {
                continue;
            }
            let done = crate::hooks::enter(|g, t| {
                crate::hooks::insert_deferred(g, t, addr, size, &[marker_pc])
            });
            if done.is_some() {
                started.blocks += 1;
                started.bytes += size;
                if pymalloc {
                    started.pymalloc[0] += 1;
                    started.pymalloc[1] += size;
                }
            }
        }
    }
    found.release();
    py.release();
    ATTACH.store(ATTACHED, Ordering::Release);
    Ok(started)
}

/// Walks glibc's heap into `found`, then pymalloc's arenas (CPython) into `py`. Returns the
/// glibc walk's error and the pymalloc walk's (`None` when the process is not CPython).
fn walk_all(
    found: &mut Blocks,
    py: &mut Blocks,
) -> (Result<(), &'static str>, Option<&'static str>) {
    let walked = glibc_heap::walk(found);
    if walked.is_err() {
        return (walked, None);
    }
    let py_walked = match crate::pymalloc_heap::walk(found.as_slice(), py) {
        Ok(_) => None,
        Err("not CPython") => None,
        Err(why) => Some(why),
    };
    (walked, py_walked)
}

/// glibc's `mallinfo2`: `uordblks`, `hblkhd`, `hblks`.
fn mallinfo2() -> [u64; 3] {
    // SAFETY: mallinfo2 takes the arena locks, which no stopped thread holds (the caller's
    // contract); it does not allocate.
    let mi = unsafe { libc::mallinfo2() };
    [mi.uordblks as u64, mi.hblkhd as u64, mi.hblks as u64]
}

/// The blocks glibc had handed out at the last [`stop`] (its heap walked then), sorted by
/// address. At the next attach, a block found again at the same address with the same size
/// and with no record is one that had no record at the detach either: the shim's own (its
/// unwinder tables, module list…, allocated unrecorded while it was attached, which it does
/// not free while detached) or, in sampling mode, one not sampled; [`restart`] leaves them out.
static AT_DETACH: SpinLock<Blocks> = SpinLock::new(Blocks::new());

/// Whether a record of `recorded` requested bytes can be the block glibc reports at the same
/// address with `usable` bytes: glibc's chunk for a request is the request plus its 8-byte
/// header rounded up to 16 (32 at least), or 16 bytes more when the free chunk it was cut
/// from left a remainder too small to split off (after a shrinking `realloc` or a `memalign`
/// too); a chunk of its own mapping is rounded up to the page (and may keep its pages after a
/// shrinking `realloc`). A record of another size at that address is a block freed while
/// detached whose address a new block took.
fn same_block(recorded: u64, usable: u64, mmapped: bool) -> bool {
    if usable < recorded {
        return false;
    }
    if mmapped {
        return usable - recorded < 4096 + 32;
    }
    let chunk = (recorded.saturating_add(8 + 15) & !15).max(32);
    usable + 8 <= chunk + 16
}

/// [`start`] after a [`stop`]: the shim is loaded and its region kept (one region per
/// process: the collector's `--by-pid` sees one, and the records of blocks still live since
/// the previous attach keep their true stacks and times). glibc's heap is walked again and
/// reconciled with the records still open: a record whose block is not found at its address
/// with a size it can have ([`same_block`]) is closed (freed while detached), and a block
/// found with no record (made while detached) is recorded under `marker_pc`, except the
/// blocks that were there at the detach already ([`AT_DETACH`]). Recording then resumes.
/// Call with every other thread stopped outside the allocator and the shim (none may hold
/// the index).
fn restart(marker_pc: u64) -> Result<Started, AttachError> {
    let mut found = Blocks::new();
    let mut py = Blocks::new();
    let mut mallinfo = [0u64; 3];
    let (walked, py_walked) = state::internal_work(|| {
        mallinfo = mallinfo2();
        walk_all(&mut found, &mut py)
    });
    // pymalloc's objects are reconciled with their records as glibc's blocks are.
    for b in py.as_slice() {
        if !found.push(*b) {
            return Err(AttachError::NoMemory);
        }
    }
    py.release();
    found.as_mut_slice().sort_unstable();
    // Recording was started by the first attach (ATTACH is DETACHED only after a successful
    // one), so the global state is there: only the switch is turned back on.
    state::STATE.store(state::READY, Ordering::Release);
    let Some(g) = state::global() else {
        return Err(AttachError::NoRegion);
    };
    g.writer.set_state(vmo_layout::v1::STATE_READY);
    release_dead_threads(g);
    let mut started = Started {
        mallinfo,
        heap_not_walked: walked.err(),
        pymalloc_not_walked: py_walked,
        reattached: true,
        ..Started::default()
    };
    // The open records, by address.
    let mut live: Vecm<(u64, u32)> = Vecm::new();
    // SAFETY: every other thread is stopped outside the shim (the collector's safe point),
    // so nobody else uses the index while it is read.
    for e in unsafe { state::INDEX.entries() } {
        if !live.push(e) {
            return Err(AttachError::NoMemory);
        }
    }
    live.as_mut_slice().sort_unstable();
    let unrecorded = AT_DETACH.lock();
    let mut close: Vecm<u64> = Vecm::new();
    let mut add: Blocks = Vecm::new();
    {
        let live = live.as_slice();
        let mut i = 0;
        let size_of = |node: u32| g.writer.node(node).size.load(Ordering::Relaxed);
        for b in found.as_slice() {
            while i < live.len() && live[i].0 < b.addr {
                close.push(live[i].0);
                i += 1;
            }
            let mmapped = (b.size + 16).is_multiple_of(4096) && b.size >= 4096 - 16;
            if i < live.len() && live[i].0 == b.addr {
                if same_block(size_of(live[i].1), b.size, mmapped) {
                    started.kept += 1;
                    i += 1;
                    continue;
                }
                close.push(live[i].0);
                i += 1;
            }
            if unrecorded.as_slice().binary_search(b).is_err() {
                add.push(*b);
            } else {
                started.own[0] += 1;
                started.own[1] += b.size;
            }
        }
        for e in &live[i..] {
            close.push(e.0);
        }
    }
    drop(unrecorded);
    // Without a walk (another allocator), nothing is known of what happened while detached:
    // the records are kept as they are.
    if started.heap_not_walked.is_none() {
        for &addr in close.as_slice() {
            if crate::hooks::enter(|g, t| crate::hooks::erase_deferred(g, t, addr, false)).is_some()
            {
                started.closed += 1;
            }
        }
    }
    let interval = state::sample_interval();
    for &Block { addr, size } in add.as_slice() {
        if interval != 0 && !state::sample(size, interval) {
            continue;
        }
        let done = crate::hooks::enter(|g, t| {
            crate::hooks::insert_deferred(g, t, addr, size, &[marker_pc])
        });
        if done.is_some() {
            started.blocks += 1;
            started.bytes += size;
        }
    }
    ATTACH.store(ATTACHED, Ordering::Release);
    Ok(started)
}

/// Frees the thread slots of the threads that exited while detached (their exit handler
/// found recording off and kept its slot); slot 0 is the orphan slot, kept. A thread is gone
/// when `tgkill(pid, tid, 0)` says there is no such thread.
fn release_dead_threads(g: &state::Global) {
    let n = g.writer.header().thread_count.load(Ordering::Acquire);
    let n = n.min(g.writer.capacities().threads) as u32;
    for i in 1..n {
        let slot = g.writer.thread(i);
        if slot.state.load(Ordering::Acquire) != vmo_layout::v1::SLOT_USED {
            continue;
        }
        let tid = slot.tid.load(Ordering::Relaxed) as libc::c_long;
        // SAFETY: signal 0 only checks that the thread exists; no signal is sent.
        let r = unsafe { libc::syscall(libc::SYS_tgkill, g.pid as libc::c_long, tid, 0) };
        // SAFETY: __errno_location returns this thread's errno.
        if r != 0 && unsafe { *libc::__errno_location() } == libc::ESRCH {
            g.writer.release_thread(i, (0, 0));
        }
    }
}

/// Stops recording after the preload crate restored the GOT slots: the region is marked
/// detached (it stays readable, as after an exit with `HEAPDUMP_KEEP=1`: snapshots show the
/// blocks live at the detach), and nothing more is recorded. glibc's heap
/// is walked once more and kept for the next attach ([`AT_DETACH`]). Returns false when the
/// shim was not attached. Call with every other thread stopped outside the allocator; they
/// may be inside the shim (nothing here takes a lock the recording takes: a thread in the
/// middle of an operation finishes it when it resumes).
pub fn stop() -> bool {
    if ATTACH
        .compare_exchange(ATTACHED, DETACHED, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return false;
    }
    if let Some(g) = state::global() {
        g.writer.set_state(vmo_layout::v1::STATE_DETACHED);
    }
    state::STATE.store(state::DISABLED, Ordering::Release);
    // Taken only here and in `restart`, both run by the thread of an entry while every other
    // thread is stopped: never contended.
    let mut at_detach = AT_DETACH.lock();
    at_detach.release();
    if state::internal_work(|| glibc_heap::walk(&mut at_detach)).is_err() {
        at_detach.release();
    }
    at_detach.as_mut_slice().sort_unstable();
    true
}
