//! Process-wide and per-thread state: the start-up state machine, the reentrancy guard, thread
//! slots and the per-thread node caches.

use crate::index::AddressIndex;
use crate::region::{self, Settings};
use crate::stacks::{StackIndex, CACHE};
use crate::sys::{map_anon, SpinLock};
use std::cell::{Cell, UnsafeCell};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use vmo_layout::clock::now_ns;
use vmo_layout::v1::{ThreadSlotV1, LEASE_NS, STATE_EXITED, STATE_READY};
use vmo_layout::RegionWriter;

const UNINIT: u8 = 0;
const INITIALIZING: u8 = 1;
const READY: u8 = 2;
const DISABLED: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
/// Mean sampling interval in bytes; 0 when every allocation is recorded.
static SAMPLE_INTERVAL: AtomicU64 = AtomicU64::new(0);
/// Whether stacks are unwound by CFI (else by frame pointers).
static DWARF: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// The fork lease this process stored in its region before `fork` (0: none of ours).
static FORK_LEASE: AtomicU64 = AtomicU64::new(0);
/// The address index (private to this process).
pub static INDEX: AddressIndex = AddressIndex::new();
/// In sampling mode, which addresses may be in [`INDEX`] (see [`crate::index::Presence`]).
pub static PRESENCE: crate::index::Presence = crate::index::Presence::new();
/// Serializes users of the shared thread slot 0 (threads with no slot of their own).
static ORPHAN: SpinLock = SpinLock::new();
/// Thread slot shared by threads that have no slot of their own (exited, or table full).
pub const ORPHAN_SLOT: u32 = 0;
/// Allocator calls that arrived while their thread was already inside the shim (the shim's own
/// libc calls during start-up or thread registration; never on the recording path).
static NESTED: AtomicU64 = AtomicU64::new(0);

/// Number of allocator calls made from inside the shim so far (see [`NESTED`]); a test reads it
/// around the recording path to prove that path allocates nothing.
pub fn nested_calls() -> u64 {
    NESTED.load(Ordering::Relaxed)
}

/// Whether the calling thread is inside the shim right now: an allocation made now is the
/// shim's own (its unwinder tables, libc calls at start-up), not the program's, and is not
/// recorded. A counting inner allocator can use this to keep its tally comparable.
pub fn inside_shim() -> bool {
    TLS.with(|t| t.guard.get() != GUARD_FREE)
}

/// [`Tls::guard`]: the thread is not inside the shim.
const GUARD_FREE: u8 = 0;
/// [`Tls::guard`]: the thread is recording an operation. The recording path calls nothing
/// that allocates, so an allocator call arriving now comes from a signal handler that
/// interrupted it: it is queued ([`Deferred`]) and recorded when the operation ends.
const GUARD_RECORDING: u8 = 1;
/// [`Tls::guard`]: the shim's own work that may call libc's allocator (start-up, thread
/// registration, unwinder tables, module refresh, thread exit, fork). Signals are blocked
/// meanwhile, so every allocator call arriving now is the shim's own: passed through
/// unrecorded.
const GUARD_INTERNAL: u8 = 2;

/// Runs `f` as the shim's own work ([`GUARD_INTERNAL`]): allocations go straight to glibc
/// unrecorded, and signals are blocked so that no handler's allocation is mistaken for one.
/// errno is kept: this work's failing system calls (`mkdir` of an existing directory, …) must
/// not show through `malloc` or `free`.
fn internal<R>(t: &Tls, f: impl FnOnce() -> R) -> R {
    // SAFETY: __errno_location returns this thread's errno.
    let saved_errno = unsafe { *libc::__errno_location() };
    // SAFETY: a sigset filled by sigfillset; pthread_sigmask only changes this thread's mask,
    // restored below.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
    }
    let outer = t.guard.replace(GUARD_INTERNAL);
    let r = f();
    t.guard.set(outer);
    // SAFETY: restores the mask saved above, then errno.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        *libc::__errno_location() = saved_errno;
    }
    r
}

/// Blocks recorded by the calling thread's slot (0 if it has none yet).
pub fn thread_recorded_allocations() -> u64 {
    let Some(g) = global() else { return 0 };
    TLS.with(|t| match t.slot.get() {
        0 | EXITED => 0,
        s => g.writer.thread(s - 1).allocs.load(Ordering::Relaxed),
    })
}

/// Everything set up once per process.
#[derive(Debug)]
pub struct Global {
    /// Writer over this process's region.
    pub writer: RegionWriter,
    /// Private stack index.
    pub stacks: StackIndex,
    /// Recycled nodes shared between threads.
    pub free: FreeNodes,
    /// Region file path, NUL-terminated.
    pub path: [u8; 640],
    /// Executable path.
    pub exe: [u8; 1024],
    /// Length of `exe`.
    pub exe_len: usize,
    /// Settings from the environment.
    pub settings: Settings,
    /// Pid that created the region.
    pub pid: u32,
    /// pthread key whose destructor releases a thread's slot.
    pub key: libc::pthread_key_t,
}

struct GlobalCell(UnsafeCell<MaybeUninit<Global>>);
// SAFETY: written once by the initializing thread before STATE becomes READY (Release);
// read only after observing READY (Acquire).
unsafe impl Sync for GlobalCell {}
static GLOBAL: GlobalCell = GlobalCell(UnsafeCell::new(MaybeUninit::uninit()));

/// The global state, if recording.
#[inline]
pub fn global() -> Option<&'static Global> {
    if STATE.load(Ordering::Acquire) == READY {
        // SAFETY: READY is stored (Release) only after GLOBAL was fully written.
        Some(unsafe { (*GLOBAL.0.get()).assume_init_ref() })
    } else {
        None
    }
}

/// Nodes per batch moved between a thread cache and the shared free list.
const BATCH: usize = 32;
const RING: usize = 2 * BATCH;

/// Per-thread state. Const-initialised, no destructor: usable from inside `malloc` at any time.
pub struct Tls {
    /// `GUARD_*`: whether the thread is inside the shim, and doing what.
    guard: Cell<u8>,
    /// Allocator calls made by signal handlers that interrupted this thread while it was
    /// recording: null until the first.
    deferred: Cell<*mut Deferred>,
    /// Slot index + 1; 0 = not registered; `EXITED` = uses the orphan slot.
    slot: Cell<u32>,
    tid: Cell<u32>,
    /// This thread's stack: `[stack_lo, stack_hi)` (0, 0 if unknown).
    stack_lo: Cell<usize>,
    stack_hi: Cell<usize>,
    ops: Cell<u32>,
    fresh_next: Cell<u32>,
    fresh_end: Cell<u32>,
    ring: UnsafeCell<[u32; RING]>,
    ring_head: Cell<usize>,
    ring_len: Cell<usize>,
    /// Dead nodes taken from the shared queue, oldest first, used when the ring's oldest node
    /// may not be rewritten yet (a snapshot's lease): `stash[stash_head..stash_len]`.
    stash: UnsafeCell<[u32; BATCH]>,
    stash_head: Cell<usize>,
    stash_len: Cell<usize>,
    /// Stack cache: (hash, id) by hash % CACHE.
    pub cache: UnsafeCell<[(u64, u32); CACHE]>,
    /// Bytes left before the next sampled allocation (sampling mode); `i64::MIN`: not drawn yet.
    sample_left: Cell<i64>,
    /// xorshift state for the sampling intervals (0: not seeded yet).
    rng: Cell<u64>,
    /// Timestamp of this thread's last operation (ns): the "now" for the lease-expiry check
    /// made before an operation's window.
    last_now: Cell<u64>,
    /// CFI rule cache of this thread (null until its first CFI unwind).
    #[cfg(target_arch = "x86_64")]
    dwarf_cache: Cell<*mut crate::dwarf::Cache>,
    /// The thread's exit handler has run: no new CFI cache (it would never be freed).
    exited: Cell<bool>,
}
const EXITED: u32 = u32::MAX;

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("slot", &self.slot.get())
            .finish_non_exhaustive()
    }
}

impl Tls {
    const fn new() -> Self {
        Tls {
            guard: Cell::new(GUARD_FREE),
            deferred: Cell::new(std::ptr::null_mut()),
            slot: Cell::new(0),
            tid: Cell::new(0),
            stack_lo: Cell::new(0),
            stack_hi: Cell::new(0),
            ops: Cell::new(0),
            fresh_next: Cell::new(0),
            fresh_end: Cell::new(0),
            ring: UnsafeCell::new([0; RING]),
            ring_head: Cell::new(0),
            ring_len: Cell::new(0),
            stash: UnsafeCell::new([0; BATCH]),
            stash_head: Cell::new(0),
            stash_len: Cell::new(0),
            cache: UnsafeCell::new([(0, 0); CACHE]),
            sample_left: Cell::new(i64::MIN),
            rng: Cell::new(0),
            last_now: Cell::new(0),
            #[cfg(target_arch = "x86_64")]
            dwarf_cache: Cell::new(std::ptr::null_mut()),
            exited: Cell::new(false),
        }
    }

    /// The highest address a stack walk from `sp` may read below: the top of this thread's
    /// stack when `sp` lies in it, else (a coroutine stack, a `sigaltstack`) the end of the
    /// readable memory just above `sp`, probed (see [`crate::unwind::readable_above`]); 0 when
    /// unknown (the walks then read nothing beyond the shim's own frame).
    pub fn stack_limit(&self, sp: usize) -> usize {
        let (lo, hi) = (self.stack_lo.get(), self.stack_hi.get());
        if sp >= lo && sp < hi {
            return hi;
        }
        crate::unwind::readable_above(sp)
    }

    /// OS thread id.
    pub fn tid(&self) -> u32 {
        self.tid.get()
    }

    /// Timestamp of this thread's last recorded operation (ns), 0 before the first.
    pub fn last_now(&self) -> u64 {
        self.last_now.get()
    }

    /// Sets [`Self::last_now`].
    pub fn set_last_now(&self, t: u64) {
        self.last_now.set(t);
    }

    /// This thread's CFI rule cache, created at first use; `None` when unwinding by frame
    /// pointers (or before the unwinder exists). The cache belongs to this thread: use it only
    /// inside the thread's reentrancy guard, one capture at a time.
    #[cfg(target_arch = "x86_64")]
    pub fn dwarf_cache(&self) -> Option<*mut crate::dwarf::Cache> {
        if !DWARF.load(Ordering::Relaxed) {
            return None;
        }
        if !crate::dwarf::ready() {
            // An allocation before the preload constructor ran (another library's
            // constructor: libstdc++'s emergency pool, …): build the object list now.
            rebuild_unwind_tables(self);
        }
        let mut c = self.dwarf_cache.get();
        if c.is_null() {
            if self.exited.get() {
                return None;
            }
            // Allocates once per thread, as the shim's own work (straight to glibc).
            c = internal(self, crate::dwarf::new_cache);
            if c.is_null() {
                return None;
            }
            self.dwarf_cache.set(c);
        }
        Some(c)
    }
}

thread_local! {
    static TLS: Tls = const { Tls::new() };
}

/// The sampling interval in bytes (0: every allocation is recorded).
#[inline]
pub fn sample_interval() -> u64 {
    SAMPLE_INTERVAL.load(Ordering::Relaxed)
}

/// Sampling mode: whether an allocation of `size` bytes is sampled. Bytes are sampled as a
/// Poisson process of mean `interval` (as heapprofd and jemalloc do): the distance to the next
/// sampled byte is drawn from an exponential distribution, so a block of `size` bytes is
/// sampled with probability `1 - exp(-size / interval)`; the collector unbiases by that.
#[inline]
pub fn sample(size: u64, interval: u64) -> bool {
    TLS.with(|t| {
        let mut left = t.sample_left.get();
        if left == i64::MIN {
            left = draw(t, interval);
        }
        left -= size.min(i64::MAX as u64 / 2) as i64;
        if left > 0 {
            t.sample_left.set(left);
            return false;
        }
        t.sample_left.set(draw(t, interval));
        true
    })
}

/// An exponentially distributed distance (mean `interval` bytes) to the next sampled byte.
fn draw(t: &Tls, interval: u64) -> i64 {
    let mut x = t.rng.get();
    if x == 0 {
        x = (t as *const Tls as u64) ^ now_ns() ^ 0x9E37_79B9_7F4A_7C15;
    }
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t.rng.set(x);
    let u = ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    ((-u.ln() * interval as f64).min(i64::MAX as f64 / 4.0) as i64).max(1)
}

/// Runs `f` with the global and thread state unless recording is off, not yet possible, or the
/// thread is already inside the shim (then the call is not recorded and `None` returned).
#[inline]
pub fn enter<R>(f: impl FnOnce(&'static Global, &Tls) -> R) -> Option<R> {
    let g = match global() {
        Some(g) => g,
        None => {
            init();
            global()?
        }
    };
    TLS.with(|t| {
        if t.guard.get() != GUARD_FREE {
            NESTED.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        // After the guard: the shim's own allocations in a forked child, before its fork
        // handler has moved it to a region of its own, are not the program's.
        if !same_process() {
            foreign_child(g);
            return None;
        }
        t.guard.set(GUARD_RECORDING);
        if t.slot.get() == 0 {
            internal(t, || register_thread(g, t));
        }
        let r = f(g, t);
        // Record what signal handlers did meanwhile, until none did since the last look.
        loop {
            let d = t.deferred.get();
            if !d.is_null() {
                // SAFETY: this thread's queue; handlers only append (see `Deferred`).
                unsafe { (*d).drain(g, t) };
            }
            t.guard.set(GUARD_FREE);
            std::sync::atomic::compiler_fence(Ordering::SeqCst);
            // SAFETY: as above.
            if d.is_null() || unsafe { (*d).is_empty() } {
                break;
            }
            t.guard.set(GUARD_RECORDING);
        }
        Some(r)
    })
}

/// [`Tls::stack_limit`] of the calling thread.
pub fn stack_limit(sp: usize) -> usize {
    TLS.with(|t| t.stack_limit(sp))
}

/// A word in a private page that the kernel zeroes in a child at any `fork` (also a raw
/// `clone`/`fork` system call, which runs no fork handlers): `MADV_WIPEONFORK`. Nonzero in
/// the process that owns the current region.
static PROCESS_TOKEN: std::sync::atomic::AtomicPtr<u64> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// Whether this process is the one that owns the region (not a child made by a raw fork
/// system call, which shares the parent's `MAP_SHARED` region and must not write to it). One
/// load of a word that is rarely out of the cache.
#[inline]
fn same_process() -> bool {
    let p = PROCESS_TOKEN.load(Ordering::Relaxed);
    // SAFETY: set once to a page that is never unmapped.
    p.is_null() || unsafe { p.read_volatile() } != 0
}

/// Makes the token page (at start-up) and marks this process as the region's owner.
fn set_process_token() {
    let mut p = PROCESS_TOKEN.load(Ordering::Relaxed);
    if p.is_null() {
        p = map_anon(4096) as *mut u64;
        if p.is_null() {
            return;
        }
        // SAFETY: our own fresh page. Without MADV_WIPEONFORK (Linux < 4.14) the page is not
        // wiped and a raw-fork child is not detected, as before.
        if unsafe { libc::madvise(p as *mut libc::c_void, 4096, libc::MADV_WIPEONFORK) } != 0 {
            // SAFETY: as above.
            unsafe { crate::sys::unmap(p as *mut u8, 4096) };
            return;
        }
        PROCESS_TOKEN.store(p, Ordering::Relaxed);
    }
    // SAFETY: the page is ours and mapped.
    unsafe { p.write_volatile(1) };
}

/// In a child made by a raw fork system call: stop recording here (the region is the
/// parent's, and the locks the child inherited may be held by threads that do not exist in
/// it). Nothing of the child is written to the parent's region but a flag, so that
/// `heapdump list` says a child went unrecorded.
#[cold]
fn foreign_child(g: &Global) {
    if STATE
        .compare_exchange(READY, DISABLED, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
    {
        g.writer
            .raise_recording_flag(vmo_layout::v1::RECORDING_FOREIGN_WRITER);
    }
}

/// Whether the calling thread is a signal handler that interrupted this thread's recording:
/// its allocator call must be deferred ([`defer`]).
#[inline]
pub fn interrupted_recording() -> bool {
    TLS.with(|t| t.guard.get() == GUARD_RECORDING)
}

/// The function that really frees a block whose free was deferred (`__libc_free` for
/// `libheapdump.so`); 0 when frees are never deferred, only their records.
static REAL_FREE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Registers the function that frees blocks for real (see [`defer`]). With it, a free made by
/// a signal handler while its thread is recording is held back until the record is closed,
/// so the address cannot be handed out again before.
pub fn set_real_free(f: unsafe extern "C" fn(*mut libc::c_void)) {
    REAL_FREE.store(f as usize, Ordering::Relaxed);
}

/// One allocator call deferred from a signal handler.
#[derive(Clone, Copy)]
struct Op {
    /// Block address.
    ptr: u64,
    /// Requested size; `FREE_OP` for a free, `FREE_HELD` for a free whose block the drain
    /// frees for real.
    size: u64,
    depth: u64,
    frames: [u64; DEFERRED_FRAMES],
}
const FREE_OP: u64 = u64::MAX;
const FREE_HELD: u64 = u64::MAX - 1;
/// Frames kept for an allocation made by a signal handler (its own frames, up to the signal
/// trampoline).
const DEFERRED_FRAMES: usize = 16;
/// Allocator calls a thread's signal handlers may make during one recorded operation.
const DEFERRED_CAP: usize = 1024;

/// A thread's queue of allocator calls made by signal handlers that interrupted its
/// recording (LeakSanitizer and heaptrack lose these; so did we). Appended only by handlers
/// on the owning thread (a handler can itself be interrupted by another, so the slot is
/// reserved with one atomic add), drained by the owning thread when the interrupted
/// operation ends — every append is complete by then, as a handler finishes before the code
/// it interrupted goes on. In an anonymous mapping made at the first deferral (about
/// 150 KiB of address space, touched as used), released at thread exit.
struct Deferred {
    head: AtomicU64,
    tail: AtomicU64,
    /// Calls that did not fit (allocations then go unrecorded; frees are done at once and
    /// their records stay open).
    lost: AtomicU64,
    ops: [Op; DEFERRED_CAP],
}

impl Deferred {
    fn is_empty(&self) -> bool {
        self.head.load(Ordering::Relaxed) == self.tail.load(Ordering::Relaxed)
    }

    /// Appends `op`; false when full.
    fn push(&self, op: &Op) -> bool {
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
    fn drain(&self, g: &'static Global, t: &Tls) {
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
            let (slot_idx, slot) = acquire_slot(g, t);
            slot.dropped.store(
                slot.dropped.load(Ordering::Relaxed) + lost,
                Ordering::Relaxed,
            );
            release_slot(slot_idx);
        }
    }
}

/// From a signal handler that interrupted this thread's recording: queues an allocation
/// (`frames` its stack) or a free (`size == None`) to be recorded when the interrupted
/// operation ends. For a free, returns true when the caller must not free the block: the
/// drain will, after closing its record (only with [`set_real_free`]).
pub fn defer(ptr: u64, size: Option<u64>, frames: &[u64], may_hold: bool) -> bool {
    TLS.with(|t| {
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

/// Starts recording if nobody has yet. Safe to call from any thread at any time.
#[cold]
pub fn init() {
    if STATE
        .compare_exchange(UNINIT, INITIALIZING, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    TLS.with(|t| {
        internal(t, || {
            let ok = init_locked();
            STATE.store(if ok { READY } else { DISABLED }, Ordering::Release);
            if ok {
                // SAFETY: registering the process-exit handler; may allocate, which the guard
                // routes straight to glibc. Fork handlers: see register_fork_handlers.
                unsafe { libc::atexit(on_exit) };
            }
        })
    });
}

fn init_locked() -> bool {
    let settings = region::settings();
    if settings.disabled {
        return false;
    }
    let Some(created) = region::create(&settings) else {
        return false;
    };
    SAMPLE_INTERVAL.store(settings.sample_interval, Ordering::Relaxed);
    DWARF.store(settings.dwarf, Ordering::Relaxed);
    let Some(stacks) = StackIndex::new() else {
        return false;
    };
    let Some(free) = FreeNodes::new(created.writer.node_capacity()) else {
        return false;
    };
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: creating a key with a destructor of the right signature.
    if unsafe { libc::pthread_key_create(&mut key, Some(thread_exit)) } != 0 {
        return false;
    }
    let w = created.writer;
    // Slot 0 is the orphan slot.
    w.claim_thread(0, b"(other threads)\0");
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    // SAFETY: only this thread (holding INITIALIZING) writes GLOBAL, before READY is published.
    unsafe {
        (*GLOBAL.0.get()).write(Global {
            writer: w,
            stacks,
            free,
            path: created.path,
            exe: created.exe,
            exe_len: created.exe_len,
            settings,
            pid,
            key,
        });
    }
    w.set_state(STATE_READY);
    set_process_token();
    true
}

/// Rebuilds the CFI unwinder's object list from inside the recording path (the shim's own
/// work: it allocates, with signals blocked). `dl_iterate_phdr` takes the loader's list lock,
/// which is recursive and never held across a call to `malloc`.
#[cfg(target_arch = "x86_64")]
pub fn rebuild_unwind_tables(t: &Tls) {
    internal(t, crate::dwarf::rebuild);
}

/// Registers the shim's fork handlers, once. Called by the preload constructor (and at
/// start-up for `HeapdumpAlloc`), never from inside `malloc`: `pthread_atfork` allocates while
/// holding its own lock, so registering from a `malloc` that `pthread_atfork` itself made
/// would deadlock.
pub fn register_fork_handlers() {
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if DONE.swap(true, Ordering::AcqRel) {
        return;
    }
    TLS.with(|t| {
        internal(t, || {
            // SAFETY: registering handlers of the right signature; may allocate (the guard
            // routes that to glibc).
            unsafe {
                libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child))
            };
        })
    });
}

/// Refreshes the module table (call where the loader lock is not held: a constructor, after
/// `dlopen`/`dlclose`).
pub fn refresh_modules() {
    if let Some(g) = global() {
        TLS.with(|t| {
            internal(t, || {
                crate::modules::refresh(&g.writer, &g.exe[..g.exe_len]);
                #[cfg(target_arch = "x86_64")]
                if DWARF.load(Ordering::Relaxed) {
                    crate::dwarf::rebuild();
                }
            })
        });
    }
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

fn thread_name() -> [u8; 16] {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes into the buffer.
    unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    name
}

#[cold]
fn register_thread(g: &Global, t: &Tls) {
    let tid = gettid();
    t.tid.set(tid);
    // A forked child keeps the stack bounds of the thread that forked (which may not be the
    // process's first thread).
    if t.stack_hi.get() == 0 {
        let (lo, hi) = crate::unwind::current_stack_bounds(tid == g.pid);
        t.stack_lo.set(lo);
        t.stack_hi.set(hi);
    }
    match g.writer.claim_thread(tid, &thread_name()) {
        Some(i) => {
            t.slot.set(i + 1);
            // SAFETY: the key was created at init; the value is an integer tag, not a pointer.
            unsafe { libc::pthread_setspecific(g.key, (i as usize + 1) as *const libc::c_void) };
        }
        None => t.slot.set(EXITED),
    }
}

unsafe extern "C" fn thread_exit(value: *mut libc::c_void) {
    let Some(g) = global() else { return };
    TLS.with(|t| {
        let outer = t.guard.replace(GUARD_INTERNAL);
        t.exited.set(true);
        flush_nodes(g, t);
        let d = t.deferred.replace(std::ptr::null_mut());
        if !d.is_null() {
            // SAFETY: this thread's queue, empty (drained at the end of every operation) and
            // no longer reachable from its thread state.
            unsafe { crate::sys::unmap(d as *mut u8, std::mem::size_of::<Deferred>()) };
        }
        #[cfg(target_arch = "x86_64")]
        {
            let c = t.dwarf_cache.replace(std::ptr::null_mut());
            if !c.is_null() {
                // SAFETY: created by new_cache for this thread, which no longer uses it.
                unsafe { crate::dwarf::free_cache(c) };
            }
        }
        let slot = value as usize as u32;
        if slot != 0 && t.slot.get() == slot {
            g.writer.release_thread(slot - 1);
        }
        t.slot.set(EXITED);
        t.guard.set(outer);
    });
}

extern "C" fn on_exit() {
    exit_cleanup();
}

/// Removes this process's region (or marks it exited with `HEAPDUMP_KEEP=1`): called at
/// `exit` and from the shim's `_exit`/`_Exit`. Does nothing in a process other than the one
/// that created the region (a `vfork` child, for example).
pub fn exit_cleanup() {
    let Some(g) = global() else { return };
    // SAFETY: getpid has no preconditions.
    if unsafe { libc::getpid() } as u32 != g.pid {
        return;
    }
    if g.settings.keep {
        g.writer.set_state(STATE_EXITED);
    } else {
        // SAFETY: the path is NUL-terminated; the mapping stays valid after the unlink.
        unsafe { libc::unlink(g.path.as_ptr() as *const libc::c_char) };
    }
}

/// Whether `fork_prepare` took the locks (what `fork_parent`/`fork_child` release, whatever
/// the state is by then).
static FORK_LOCKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn fork_prepare() {
    if let Some(g) = global() {
        // Protect the nodes live at the fork from being recycled while the child copies them.
        let lease = &g.writer.header().fork_lease;
        let now = now_ns();
        let old = lease.load(Ordering::Relaxed);
        if old == 0 || now.saturating_sub(old) > LEASE_NS {
            lease.store(now, Ordering::SeqCst);
            FORK_LEASE.store(now, Ordering::Relaxed);
        } else {
            FORK_LEASE.store(0, Ordering::Relaxed);
        }
        // The module table's lock first (its holder calls the loader, never the others),
        // then the recording paths' order: orphan slot, index shards, free list.
        crate::modules::lock_for_fork();
        #[cfg(target_arch = "x86_64")]
        crate::dwarf::lock_for_fork();
        ORPHAN.lock();
        INDEX.lock_all();
        g.free.lock.lock();
        FORK_LOCKED.store(true, Ordering::Relaxed);
    }
}

/// Releases what `fork_prepare` took.
fn fork_unlock(g: &Global) {
    if FORK_LOCKED.swap(false, Ordering::Relaxed) {
        ORPHAN.unlock();
        g.free.lock.unlock();
        INDEX.unlock_all();
        #[cfg(target_arch = "x86_64")]
        crate::dwarf::unlock_after_fork();
        crate::modules::unlock_after_fork();
    }
}

extern "C" fn fork_parent() {
    // SAFETY: GLOBAL was written before FORK_LOCKED could be set (READY was observed).
    if FORK_LOCKED.load(Ordering::Relaxed) {
        fork_unlock(unsafe { (*GLOBAL.0.get()).assume_init_ref() });
    }
}

/// In the child: the region is shared with the parent, so the child moves to a region of its
/// own holding the blocks it inherited (those live at the fork), then goes on recording there.
extern "C" fn fork_child() {
    if !FORK_LOCKED.load(Ordering::Relaxed) {
        return;
    }
    // SAFETY: GLOBAL was written before FORK_LOCKED could be set.
    let g = unsafe { (*GLOBAL.0.get()).assume_init_ref() };
    fork_unlock(g);
    if global().is_none() {
        return;
    }
    let lease = FORK_LEASE.load(Ordering::Relaxed);
    TLS.with(|t| {
        internal(t, || {
            if !child_region(g, t, lease) {
                STATE.store(DISABLED, Ordering::Release);
            }
        })
    });
}

fn child_region(g: &Global, t: &Tls, lease: u64) -> bool {
    let parent = g.writer;
    let mut settings = g.settings;
    settings.caps = parent.capacities();
    let release_lease = || {
        let _ = parent.header().fork_lease.compare_exchange(
            lease,
            0,
            Ordering::SeqCst,
            Ordering::Relaxed,
        );
    };
    let created = match region::create(&settings) {
        Some(c) if c.writer.capacities() == parent.capacities() => c,
        _ => {
            release_lease();
            return false;
        }
    };
    let w = created.writer;
    w.claim_thread(0, b"(other threads)\0");
    // The inherited address index holds exactly the blocks live at the fork (its shards were
    // locked across it): copy the records it points to.
    // SAFETY: this child is single-threaded (fork handlers run before anything else); the
    // region is fresh and laid out with the parent's capacities; the parent's fork lease (set
    // before the fork) keeps the records the index points to from being recycled meanwhile.
    let inherited = unsafe { w.inherit(&parent, INDEX.entries()) };
    release_lease();
    let Some((blocks, bytes)) = inherited else {
        // No room for the copy: this child records nothing.
        // SAFETY: the path is NUL-terminated.
        unsafe { libc::unlink(created.path.as_ptr() as *const libc::c_char) };
        return false;
    };
    let orphan = w.thread(ORPHAN_SLOT);
    orphan.allocs.store(blocks, Ordering::Relaxed);
    orphan.alloc_bytes.store(bytes, Ordering::Relaxed);
    // SAFETY: the child has a single thread (the one running fork handlers), which is inside
    // the reentrancy guard: nobody else reads GLOBAL while it is updated.
    unsafe {
        let gm = (*GLOBAL.0.get()).assume_init_mut();
        gm.writer = w;
        gm.path = created.path;
        gm.pid = libc::getpid() as u32;
    }
    t.slot.set(0); // registers again, in the new region, at the next operation
    t.tid.set(gettid());
    w.set_state(STATE_READY);
    set_process_token();
    true
}

/// The thread's slot index and slot; takes the orphan lock when the thread has no slot of its
/// own (release it with [`release_slot`]).
#[inline]
pub fn acquire_slot<'g>(g: &'g Global, t: &Tls) -> (u32, &'g ThreadSlotV1) {
    let s = t.slot.get();
    if s == EXITED || s == 0 {
        ORPHAN.lock();
        (ORPHAN_SLOT, g.writer.thread(ORPHAN_SLOT))
    } else {
        (s - 1, g.writer.thread(s - 1))
    }
}

/// Releases what [`acquire_slot`] took.
#[inline]
pub fn release_slot(slot: u32) {
    if slot == ORPHAN_SLOT {
        ORPHAN.unlock();
    }
}

/// Counts an operation; every 1024th refreshes the peak and the thread name.
#[inline]
pub fn tick(g: &Global, t: &Tls, slot: u32) {
    let n = t.ops.get().wrapping_add(1);
    t.ops.set(n);
    if n.is_multiple_of(1024) {
        g.writer.update_peak();
        if slot != ORPHAN_SLOT && n.is_multiple_of(65536) {
            g.writer.set_thread_name(slot, &thread_name());
        }
    }
}

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
fn take_node_slow(g: &Global, t: &Tls, now: u64) -> Option<u32> {
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

fn flush_nodes(g: &Global, t: &Tls) {
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

fn ring_front(t: &Tls) -> Option<u32> {
    if t.ring_len.get() == 0 {
        return None;
    }
    // SAFETY: the ring is only touched by its own thread, inside the reentrancy guard.
    Some(unsafe { (*t.ring.get())[t.ring_head.get()] })
}

fn ring_pop(t: &Tls) -> Option<u32> {
    let n = ring_front(t)?;
    t.ring_head.set((t.ring_head.get() + 1) % RING);
    t.ring_len.set(t.ring_len.get() - 1);
    Some(n)
}

fn ring_push(t: &Tls, n: u32) {
    debug_assert!(t.ring_len.get() < RING);
    let i = (t.ring_head.get() + t.ring_len.get()) % RING;
    // SAFETY: as in ring_front.
    unsafe { (*t.ring.get())[i] = n };
    t.ring_len.set(t.ring_len.get() + 1);
}

/// Dead nodes shared between threads: a FIFO queue of node ids behind a spin lock, touched once
/// per [`BATCH`] frees or allocations at most. Oldest first, because a node freed long ago is
/// the one a snapshot's lease lets us rewrite. The queue is a ring buffer in an anonymous
/// mapping that doubles when full (up to the allocations table's capacity), so its memory
/// follows the largest number of dead nodes waiting at once.
#[derive(Debug)]
pub struct FreeNodes {
    lock: SpinLock,
    q: UnsafeCell<Queue>,
    max: usize,
}

#[derive(Debug)]
struct Queue {
    buf: *mut u32,
    /// A power of two, or 0.
    cap: usize,
    head: usize,
    len: usize,
}

// SAFETY: `q` is only accessed with `lock` held.
unsafe impl Sync for FreeNodes {}
// SAFETY: as above.
unsafe impl Send for FreeNodes {}

impl FreeNodes {
    fn new(max: u64) -> Option<Self> {
        Some(FreeNodes {
            lock: SpinLock::new(),
            q: UnsafeCell::new(Queue {
                buf: std::ptr::null_mut(),
                cap: 0,
                head: 0,
                len: 0,
            }),
            max: (max as usize).max(BATCH).next_power_of_two(),
        })
    }

    /// Appends `ids` (dropping what does not fit when memory for the queue cannot be mapped:
    /// those nodes are then never reused).
    fn push(&self, ids: &[u32]) {
        self.lock.lock();
        // SAFETY: the lock is held.
        let q = unsafe { &mut *self.q.get() };
        if q.len + ids.len() > q.cap {
            grow(q, q.len + ids.len(), self.max);
        }
        let k = ids.len().min(q.cap - q.len);
        for (i, id) in ids[..k].iter().enumerate() {
            // SAFETY: cap is a power of two and the index is masked into [0, cap).
            unsafe { *q.buf.add((q.head + q.len + i) & (q.cap - 1)) = *id };
        }
        q.len += k;
        self.lock.unlock();
    }

    /// Moves up to `out.len()` of the oldest ids into `out`; returns how many.
    fn pop(&self, out: &mut [u32]) -> usize {
        self.lock.lock();
        // SAFETY: the lock is held.
        let q = unsafe { &mut *self.q.get() };
        let k = out.len().min(q.len);
        for (i, o) in out[..k].iter_mut().enumerate() {
            // SAFETY: as in push; k <= len, so these slots hold queued ids.
            *o = unsafe { *q.buf.add((q.head + i) & (q.cap - 1)) };
        }
        if k > 0 {
            q.head = (q.head + k) & (q.cap - 1);
            q.len -= k;
        }
        self.lock.unlock();
        k
    }
}

/// Doubles `q` until it holds `need` ids (at most `max`), keeping their order.
fn grow(q: &mut Queue, need: usize, max: usize) {
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
