//! Process-wide and per-thread state: the start-up state machine, the reentrancy guard, thread
//! slots and the per-thread node caches.

use crate::deferred::Deferred;
pub use crate::deferred::{defer, set_real_free};
pub use crate::fork::register_fork_handlers;
use crate::fork::{foreign_child, same_process, set_process_token};
use crate::index::AddressIndex;
use crate::nodes::flush_nodes;
pub use crate::nodes::{recycle_node, take_node, FreeNodes};
use crate::region::{self, Settings};
use crate::stacks::{StackIndex, CACHE};
use crate::sys::{SpinGuard, SpinLock};
use std::cell::{Cell, UnsafeCell};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use vmo_layout::clock::now_ns;
use vmo_layout::v1::{ThreadSlotV1, STATE_EXITED, STATE_READY};
use vmo_layout::RegionWriter;

const UNINIT: u8 = 0;
const INITIALIZING: u8 = 1;
pub(crate) const READY: u8 = 2;
pub(crate) const DISABLED: u8 = 3;

pub(crate) static STATE: AtomicU8 = AtomicU8::new(UNINIT);
/// Mean sampling interval in bytes; 0 when every allocation is recorded.
static SAMPLE_INTERVAL: AtomicU64 = AtomicU64::new(0);
/// Whether stacks are unwound by CFI (else by frame pointers).
static DWARF: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// The fork lease this process stored in its region before `fork` (0: none of ours).
pub(crate) static FORK_LEASE: AtomicU64 = AtomicU64::new(0);
/// The address index (private to this process).
pub(crate) static INDEX: AddressIndex = AddressIndex::new();
/// In sampling mode, which addresses may be in [`INDEX`] (see [`crate::index::Presence`]).
pub(crate) static PRESENCE: crate::index::Presence = crate::index::Presence::new();
/// Set when the library was `dlopen`ed rather than preloaded ([`wait_for_start`]): the first
/// allocator call does not start recording; only an explicit [`init`] (`heapdump attach`'s
/// entry) does.
static WAIT_FOR_START: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Recording starts only when [`init`] is called, not lazily at the first allocator call: for
/// a library `dlopen`ed into a running process, whose calls before `heapdump attach` starts it
/// pass through unrecorded (a lazy start on one thread would record part of the program, with
/// the default settings rather than the collector's).
pub fn wait_for_start() {
    WAIT_FOR_START.store(true, Ordering::Relaxed);
}

/// Serializes users of the shared thread slot 0 (threads with no slot of their own).
pub(crate) static ORPHAN: SpinLock = SpinLock::new(());
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
    with_tls(|t| t.guard.get() != GUARD_FREE)
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
/// [`Tls::guard`]: a wrapper of the Python allocator domains is forwarding a call to the
/// interpreter's own allocator ([`forwarding`]), which records the block itself afterwards:
/// the `malloc` a large request ends in is passed through unrecorded.
const GUARD_FORWARD: u8 = 3;

/// Runs `f` (a call into the allocator a recording wrapper wraps) with the calling thread's
/// allocations passed through unrecorded, unless it is already inside the shim. No system
/// call: a signal handler's allocation meanwhile is passed through unrecorded too.
#[inline(always)]
pub fn forwarding<R>(f: impl FnOnce() -> R) -> R {
    with_tls(|t| {
        let outer = t.guard.get();
        if outer == GUARD_FREE {
            t.guard.set(GUARD_FORWARD);
        }
        let r = f();
        t.guard.set(outer);
        r
    })
}

/// Runs `f` as the shim's own work (see [`internal`]) on the calling thread.
pub(crate) fn internal_work<R>(f: impl FnOnce() -> R) -> R {
    with_tls(|t| internal(t, f))
}

/// Runs `f` as the shim's own work ([`GUARD_INTERNAL`]): allocations go straight to glibc
/// unrecorded, and signals are blocked so that no handler's allocation is mistaken for one.
/// errno is kept: this work's failing system calls (`mkdir` of an existing directory, …) must
/// not show through `malloc` or `free`.
pub(crate) fn internal<R>(t: &Tls, f: impl FnOnce() -> R) -> R {
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
    with_tls(|t| match t.slot.get() {
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

pub(crate) struct GlobalCell(pub(crate) UnsafeCell<MaybeUninit<Global>>);
// SAFETY: written once by the initializing thread before STATE becomes READY (Release);
// read only after observing READY (Acquire).
unsafe impl Sync for GlobalCell {}
pub(crate) static GLOBAL: GlobalCell = GlobalCell(UnsafeCell::new(MaybeUninit::uninit()));

/// Records a named snapshot: the blocks live now can be snapshotted later by that name
/// (`heapdump snapshot --named NAME`), even after the process exits. Cheap: no allocation, no
/// file written, no system call but the clock; the name (truncated to 95 bytes) and the
/// instant go into the region. Returns false when nothing was recorded (not recording, or the
/// region's table of named snapshots is full).
pub fn take_named_snapshot(name: &[u8]) -> bool {
    match global() {
        Some(g) => g.writer.take_named_snapshot(name).is_some(),
        None => false,
    }
}

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
pub(crate) const BATCH: usize = 32;
pub(crate) const RING: usize = 2 * BATCH;

/// Per-thread state. Const-initialised, no destructor: usable from inside `malloc` at any time.
pub struct Tls {
    /// `GUARD_*`: whether the thread is inside the shim, and doing what.
    pub(crate) guard: Cell<u8>,
    /// Allocator calls made by signal handlers that interrupted this thread while it was
    /// recording: null until the first.
    pub(crate) deferred: Cell<*mut Deferred>,
    /// Slot index + 1; 0 = not registered; `EXITED` = uses the orphan slot.
    pub(crate) slot: Cell<u32>,
    pub(crate) tid: Cell<u32>,
    /// This thread's stack: `[stack_lo, stack_hi)` (0, 0 if unknown).
    pub(crate) stack_lo: Cell<usize>,
    pub(crate) stack_hi: Cell<usize>,
    pub(crate) ops: Cell<u32>,
    pub(crate) fresh_next: Cell<u32>,
    pub(crate) fresh_end: Cell<u32>,
    pub(crate) ring: UnsafeCell<[u32; RING]>,
    pub(crate) ring_head: Cell<usize>,
    pub(crate) ring_len: Cell<usize>,
    /// Dead nodes taken from the shared queue, oldest first, used when the ring's oldest node
    /// may not be rewritten yet (a snapshot's lease): `stash[stash_head..stash_len]`.
    pub(crate) stash: UnsafeCell<[u32; BATCH]>,
    pub(crate) stash_head: Cell<usize>,
    pub(crate) stash_len: Cell<usize>,
    /// Stack cache: (hash, id) by hash % CACHE.
    pub cache: UnsafeCell<[(u64, u32); CACHE]>,
    /// Where a capture writes the stack's return addresses (kept here rather than on the
    /// stack, where the 512 bytes would be zeroed at every allocation).
    pub(crate) frames: UnsafeCell<[u64; vmo_layout::v1::MAX_FRAMES]>,
    /// Bytes left before the next sampled allocation (sampling mode); `i64::MIN`: not drawn yet.
    pub(crate) sample_left: Cell<i64>,
    /// xorshift state for the sampling intervals (0: not seeded yet).
    pub(crate) rng: Cell<u64>,
    /// Timestamp of this thread's last operation (ns): the "now" for the lease-expiry check
    /// made before an operation's window.
    pub(crate) last_now: Cell<u64>,
    /// CFI rule cache of this thread (null until its first CFI unwind).
    #[cfg(target_arch = "x86_64")]
    pub(crate) dwarf_cache: Cell<*mut crate::dwarf::Cache>,
    /// The thread's exit handler has run: no new CFI cache (it would never be freed).
    pub(crate) exited: Cell<bool>,
    /// Records this thread kept for named snapshots and not yet added to the header's count.
    pub(crate) named_held: Cell<u32>,
}
pub(crate) const EXITED: u32 = u32::MAX;

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
            frames: UnsafeCell::new([0; vmo_layout::v1::MAX_FRAMES]),
            sample_left: Cell::new(i64::MIN),
            rng: Cell::new(0),
            last_now: Cell::new(0),
            #[cfg(target_arch = "x86_64")]
            dwarf_cache: Cell::new(std::ptr::null_mut()),
            exited: Cell::new(false),
            named_held: Cell::new(0),
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
    /// The thread's state. Reach it through [`with_tls`], which finds it without
    /// `__tls_get_addr` on x86-64.
    static TLS: Tls = const { Tls::new() };
}

/// Runs `f` with the calling thread's [`Tls`]. On x86-64 its address comes from one
/// initial-exec TLS word ([`crate::tls`]), set at the thread's first call: a `fs:`-relative
/// load instead of a call to `__tls_get_addr`. The state is const-initialised and has no
/// destructor, so it is usable at any time, from inside `malloc` too.
#[inline(always)]
pub(crate) fn with_tls<R>(f: impl FnOnce(&Tls) -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        let mut p = crate::tls::get() as *const Tls;
        if p.is_null() {
            p = tls_first();
        }
        // SAFETY: `p` is the address of this thread's `TLS`, which lives as long as the
        // thread (no destructor); only this thread uses it, through shared references.
        f(unsafe { &*p })
    }
    #[cfg(not(target_arch = "x86_64"))]
    TLS.with(f)
}

/// The thread's first access: stores its state's address in the initial-exec word.
#[cfg(target_arch = "x86_64")]
#[cold]
#[inline(never)]
fn tls_first() -> *const Tls {
    let p = TLS.with(|t| t as *const Tls);
    crate::tls::set(p as *const u8);
    p
}

/// The sampling interval in bytes (0: every allocation is recorded).
#[inline]
pub fn sample_interval() -> u64 {
    SAMPLE_INTERVAL.load(Ordering::Relaxed)
}

/// Sampling mode: whether an allocation of `size` bytes is sampled. Bytes are sampled as a
/// Poisson process of mean `interval` (as heapprofd and jemalloc do): the distance to the next
/// sampled byte is drawn from an exponential distribution, so a block of `size` bytes is
/// sampled with probability `1 - exp(-size / interval)`; the collector unbiases by that. The
/// formula is [`vmo_layout::sampling`]'s, shared with the collector.
#[inline]
pub fn sample(size: u64, interval: u64) -> bool {
    with_tls(|t| {
        let mut left = t.sample_left.get();
        if left == i64::MIN {
            left = draw(t, interval);
        }
        left = vmo_layout::sampling::count_down(left, size);
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
    vmo_layout::sampling::next_distance(u, interval)
}

/// Runs `f` with the global and thread state unless recording is off, not yet possible, or the
/// thread is already inside the shim (then the call is not recorded and `None` returned).
#[inline]
pub fn enter<R>(f: impl FnOnce(&'static Global, &Tls) -> R) -> Option<R> {
    enter_as(false, f)
}

/// As [`enter`], and also inside a wrapper's forwarded call ([`forwarding`]): for the records
/// of blocks that are not the wrapper's own (it closes its block's record before forwarding),
/// such as the interpreter's own tables that its allocator reallocates or frees meanwhile
/// (pymalloc's `arenas` array, grown by `realloc` inside an object allocation). Without this
/// the old block's record would stay live after glibc took it back.
#[inline]
pub fn enter_forwarded<R>(f: impl FnOnce(&'static Global, &Tls) -> R) -> Option<R> {
    enter_as(true, f)
}

#[inline(always)]
fn enter_as<R>(forwarded: bool, f: impl FnOnce(&'static Global, &Tls) -> R) -> Option<R> {
    let g = match global() {
        Some(g) => g,
        None => {
            // Disabled (HEAPDUMP_DISABLE=1, a failed start-up) or another thread is starting
            // up: a plain load and a jump, no locked instruction on the shared state word.
            if STATE.load(Ordering::Relaxed) != UNINIT || WAIT_FOR_START.load(Ordering::Relaxed) {
                return None;
            }
            init();
            global()?
        }
    };
    with_tls(|t| {
        let guard = t.guard.get();
        // The guard to go back to: a forwarded call goes on once this record is made.
        let outer = guard;
        if guard != GUARD_FREE && !(forwarded && guard == GUARD_FORWARD) {
            if guard != GUARD_FORWARD {
                NESTED.fetch_add(1, Ordering::Relaxed);
            }
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
            t.guard.set(outer);
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
    with_tls(|t| t.stack_limit(sp))
}

/// Whether the calling thread is a signal handler that interrupted this thread's recording:
/// its allocator call must be deferred ([`defer`]).
#[inline]
pub fn interrupted_recording() -> bool {
    with_tls(|t| t.guard.get() == GUARD_RECORDING)
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
    with_tls(|t| {
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
    #[cfg(target_arch = "x86_64")]
    crate::dwarf::set_stack_reuse(settings.stack_reuse);
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

/// Refreshes the module table (call where the loader lock is not held: a constructor, after
/// `dlopen`/`dlclose`).
pub fn refresh_modules() {
    if let Some(g) = global() {
        with_tls(|t| {
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

pub(crate) fn gettid() -> u32 {
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
pub(crate) fn register_thread(g: &Global, t: &Tls) {
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
    with_tls(|t| {
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
        // Mappings made since the last scan (a JIT's), for the post-mortem snapshot.
        crate::modules::add_mappings(&g.writer);
        g.writer.set_state(STATE_EXITED);
    } else {
        // SAFETY: the path is NUL-terminated; the mapping stays valid after the unlink.
        unsafe { libc::unlink(g.path.as_ptr() as *const libc::c_char) };
    }
}

/// A thread's slot for one operation: its index, the slot, and (for the shared orphan slot)
/// the orphan lock, released when this is dropped.
#[derive(Debug)]
pub struct SlotRef<'g> {
    /// The slot's index in the region's thread table.
    pub idx: u32,
    /// The slot.
    pub slot: &'g ThreadSlotV1,
    _orphan: Option<SpinGuard<'static>>,
}

/// The thread's slot; holds the orphan lock while the returned value lives when the thread
/// has no slot of its own.
#[inline]
pub fn acquire_slot<'g>(g: &'g Global, t: &Tls) -> SlotRef<'g> {
    let s = t.slot.get();
    if s == EXITED || s == 0 {
        let guard = ORPHAN.lock();
        SlotRef {
            idx: ORPHAN_SLOT,
            slot: g.writer.thread(ORPHAN_SLOT),
            _orphan: Some(guard),
        }
    } else {
        SlotRef {
            idx: s - 1,
            slot: g.writer.thread(s - 1),
            _orphan: None,
        }
    }
}

/// Counts an operation; every 1024th refreshes the peak and the thread name.
#[inline]
pub fn tick(g: &Global, t: &Tls, slot: u32) {
    let n = t.ops.get().wrapping_add(1);
    t.ops.set(n);
    if n.is_multiple_of(1024) {
        g.writer.update_peak();
        crate::modules::maybe_add_mappings(&g.writer);
        if slot != ORPHAN_SLOT && n.is_multiple_of(65536) {
            g.writer.set_thread_name(slot, &thread_name());
        }
    }
}
