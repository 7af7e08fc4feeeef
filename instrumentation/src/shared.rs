//! The state every part of the shim shares: the process-wide [`Global`] and the per-thread
//! [`Tls`], their constants (start-up states, reentrancy guard values) and statics (the
//! address index, the orphan slot), the guard helpers and thread-slot access. Imports none of
//! the modules that use it (`state`, `hooks`, `nodes`, `fork`, `deferred`, `python`), so the
//! shim's modules form no import cycle.

use crate::deferred::Deferred;
use crate::freelist::FreeNodes;
use crate::index::AddressIndex;
use crate::region::Settings;
use crate::stacks::{StackIndex, CACHE};
use crate::sys::{SpinGuard, SpinLock};
use std::cell::{Cell, UnsafeCell};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use vmo_layout::v1::ThreadSlotV1;
use vmo_layout::RegionWriter;

pub(crate) const UNINIT: u8 = 0;
pub(crate) const INITIALIZING: u8 = 1;
pub(crate) const READY: u8 = 2;
pub(crate) const DISABLED: u8 = 3;

pub(crate) static STATE: AtomicU8 = AtomicU8::new(UNINIT);
/// Mean sampling interval in bytes; 0 when every allocation is recorded.
pub(crate) static SAMPLE_INTERVAL: AtomicU64 = AtomicU64::new(0);
/// Whether stacks are unwound by CFI (else by frame pointers).
pub(crate) static DWARF: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// The fork lease this process stored in its region before `fork` (0: none of ours).
pub(crate) static FORK_LEASE: AtomicU64 = AtomicU64::new(0);
/// The address index (private to this process).
pub(crate) static INDEX: AddressIndex = AddressIndex::new();
/// In sampling mode, which addresses may be in [`INDEX`] (see [`crate::index::Presence`]).
#[doc(hidden)]
pub static PRESENCE: crate::index::Presence = crate::index::Presence::new();
/// Serializes users of the shared thread slot 0 (threads with no slot of their own).
pub(crate) static ORPHAN: SpinLock = SpinLock::new(());
/// Thread slot shared by threads that have no slot of their own (exited, or table full).
pub const ORPHAN_SLOT: u32 = 0;
/// Whether the calling thread is inside the shim right now: an allocation made now is the
/// shim's own (its unwinder tables, libc calls at start-up), not the program's, and is not
/// recorded. A counting inner allocator can use this to keep its tally comparable.
pub fn inside_shim() -> bool {
    with_tls(|t| t.guard.get() != GUARD_FREE)
}

/// [`Tls::guard`]: the thread is not inside the shim.
pub(crate) const GUARD_FREE: u8 = 0;
/// [`Tls::guard`]: the thread is recording an operation. The recording path calls nothing
/// that allocates, so an allocator call arriving now comes from a signal handler that
/// interrupted it: it is queued ([`Deferred`]) and recorded when the operation ends.
pub(crate) const GUARD_RECORDING: u8 = 1;
/// [`Tls::guard`]: the shim's own work that may call libc's allocator (start-up, thread
/// registration, unwinder tables, module refresh, thread exit, fork). Signals are blocked
/// meanwhile, so every allocator call arriving now is the shim's own: passed through
/// unrecorded.
pub(crate) const GUARD_INTERNAL: u8 = 2;
/// [`Tls::guard`]: a wrapper of the Python allocator domains is forwarding a call to the
/// interpreter's own allocator ([`forwarding`]), which records the block itself afterwards:
/// the `malloc` a large request ends in is passed through unrecorded.
pub(crate) const GUARD_FORWARD: u8 = 3;

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
/// Runs `f` as the shim's own work ([`internal`]: its allocations go to glibc unrecorded): for
/// the preloaded library's look-ups in its constructor (`dlopen` of libc with `RTLD_NOLOAD`
/// leaves the loader a 40-byte block that is not the program's).
pub fn own_work<R>(f: impl FnOnce() -> R) -> R {
    internal_work(f)
}

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
    // The shim's own work calls cancellation points (`open`, `read`, `mkdir`…) from inside
    // allocator calls, which are none: a pending cancel waits for the program's next one
    // (helper N, 1).
    let r = vmo_layout::clock::without_cancel(f);
    t.guard.set(outer);
    // SAFETY: restores the mask saved above, then errno.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        *libc::__errno_location() = saved_errno;
    }
    r
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

pub(crate) use crate::freelist::BATCH;
/// Capacity of a thread's ring of dead nodes.
pub(crate) const RING: usize = 2 * BATCH;

/// A thread's stack cache and capture buffer, in a mapping of its own rather than in its
/// `Tls`: glibc takes the static TLS of every object out of each thread's stack, and these
/// 4.6 KiB made the shim's TLS 5.2 KiB — a thread made with `PTHREAD_STACK_MIN` (16 KiB) ran
/// off its stack (helper P, 1). Hashes, stack ids and return addresses only: no word of the
/// program's data (so not listed among the thread's private ranges).
#[derive(Debug)]
pub struct Scratch {
    /// Stack cache: (hash, id) by hash % CACHE.
    pub cache: [(u64, u32); CACHE],
    /// Where a capture writes the stack's return addresses.
    pub frames: [u64; vmo_layout::v1::MAX_FRAMES],
}

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
    /// The stack bounds are still to be asked for: the thread registered inside
    /// `pthread_getattr_np` (see [`crate::unwind::inside_getattr`]).
    pub(crate) bounds_pending: Cell<bool>,
    pub(crate) ops: Cell<u32>,
    /// Bytes this thread allocated since it last refreshed the live-bytes peak (see
    /// `state::note_allocated`).
    pub(crate) since_peak: Cell<u64>,
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
    /// Dead nodes kept while the shared queue's lock was busy, oldest first:
    /// `spill[..spill_len]` in an anonymous mapping of `spill_cap` ids (null: none yet; see
    /// `nodes::push_or_spill`).
    pub(crate) spill: Cell<*mut u32>,
    pub(crate) spill_len: Cell<usize>,
    pub(crate) spill_cap: Cell<usize>,
    /// The thread's [`Scratch`] (null until its first stack capture; see [`Tls::scratch`]).
    pub(crate) scratch: Cell<*mut Scratch>,
    /// Bytes left before the next sampled allocation (sampling mode); `i64::MIN`: not drawn yet.
    pub(crate) sample_left: Cell<i64>,
    /// xorshift state for the sampling intervals (0: not seeded yet).
    pub(crate) rng: Cell<u64>,
    /// Timestamp of this thread's last operation (ns): the "now" for the lease-expiry check
    /// made before an operation's window.
    pub(crate) last_now: Cell<u64>,
    /// The per-stack counter stripe this thread alone writes ([`crate::state::claim_stripe`]);
    /// [`crate::state::NO_STRIPE`]: none, the shared stripe's locked additions.
    pub(crate) stripe: Cell<u8>,
    /// CFI rule cache of this thread (null until its first CFI unwind).
    #[cfg(target_arch = "x86_64")]
    pub(crate) dwarf_cache: Cell<*mut crate::dwarf::Cache>,
    /// The thread's exit handler has run: no new CFI cache (it would never be freed).
    pub(crate) exited: Cell<bool>,
    /// Records this thread kept for named snapshots and not yet added to the header's count.
    pub(crate) named_held: Cell<u32>,
    /// The block a Python allocator wrapper's `realloc` is forwarding (0: none), whose record
    /// only the preloaded `realloc` can close when it is kept in a block trailer (see
    /// `hooks::py_realloc`).
    pub(crate) py_realloc: Cell<u64>,
    /// The size of the record the preloaded `realloc` closed for `py_realloc`'s block
    /// (`u64::MAX`: none); the wrapper records the new block itself, so the preloaded
    /// `realloc` skips its own record of it while `py_skip` is set.
    pub(crate) py_closed: Cell<u64>,
    pub(crate) py_skip: Cell<bool>,
    /// This thread's memo of spliced Python frames (null until its first splice; see
    /// `python::FrameMemo`).
    pub(crate) py_memo: Cell<*mut crate::python::FrameMemo>,
    /// The thread's memo of whole stacks with CPython's frames (see
    /// [`crate::python::StackMemo`]); null until its first splice.
    pub(crate) py_stacks: Cell<*mut crate::python::StackMemo>,
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
            bounds_pending: Cell::new(false),
            ops: Cell::new(0),
            since_peak: Cell::new(0),
            fresh_next: Cell::new(0),
            fresh_end: Cell::new(0),
            ring: UnsafeCell::new([0; RING]),
            ring_head: Cell::new(0),
            ring_len: Cell::new(0),
            stash: UnsafeCell::new([0; BATCH]),
            stash_head: Cell::new(0),
            stash_len: Cell::new(0),
            spill: Cell::new(std::ptr::null_mut()),
            spill_len: Cell::new(0),
            spill_cap: Cell::new(0),
            scratch: Cell::new(std::ptr::null_mut()),
            sample_left: Cell::new(i64::MIN),
            rng: Cell::new(0),
            last_now: Cell::new(0),
            stripe: Cell::new(crate::state::NO_STRIPE),
            #[cfg(target_arch = "x86_64")]
            dwarf_cache: Cell::new(std::ptr::null_mut()),
            exited: Cell::new(false),
            named_held: Cell::new(0),
            py_realloc: Cell::new(0),
            py_closed: Cell::new(u64::MAX),
            py_skip: Cell::new(false),
            py_memo: Cell::new(std::ptr::null_mut()),
            py_stacks: Cell::new(std::ptr::null_mut()),
        }
    }

    /// The highest address a stack walk from `sp` may read below: the top of this thread's
    /// stack when `sp` lies in it, else (a coroutine stack, a `sigaltstack`) the end of the
    /// readable memory just above `sp`, probed (see [`crate::unwind::readable_above`]); 0 when
    /// unknown (the walks then read nothing beyond the shim's own frame).
    #[inline(always)]
    pub fn stack_limit(&self, sp: usize) -> usize {
        let (lo, hi) = (self.stack_lo.get(), self.stack_hi.get());
        if sp >= lo && sp < hi {
            return hi;
        }
        crate::unwind::readable_above(sp)
    }

    /// Asks for the stack bounds of a thread that registered inside `pthread_getattr_np`
    /// ([`Tls::bounds_pending`]) once it is out of it, and not on an alternate signal stack (a
    /// handler there may have interrupted `pthread_getattr_np` out of sight of the search).
    /// Called by a recording operation, inside the reentrancy guard.
    #[cold]
    #[inline(never)]
    pub(crate) fn settle_bounds(&self, sp: usize) {
        // SAFETY: a zeroed stack_t is valid for sigaltstack to fill; no new stack is set.
        let on_alt = unsafe {
            let mut ss: libc::stack_t = std::mem::zeroed();
            libc::sigaltstack(std::ptr::null(), &mut ss) != 0 || ss.ss_flags & libc::SS_ONSTACK != 0
        };
        if on_alt || crate::unwind::inside_getattr(sp) {
            return;
        }
        let (lo, hi) = crate::unwind::current_stack_bounds(false);
        self.stack_lo.set(lo);
        self.stack_hi.set(hi);
        self.bounds_pending.set(false);
        // The slot names the thread's stack (see `state::note_private`).
        crate::state::note_private(self);
    }

    /// OS thread id.
    pub fn tid(&self) -> u32 {
        self.tid.get()
    }

    /// The thread's [`Scratch`], mapped at its first use (zero-filled: an empty cache); null
    /// when it cannot be mapped. Only the thread itself, inside its reentrancy guard, uses it
    /// (a signal handler's capture has a buffer of its own).
    #[inline]
    pub(crate) fn scratch(&self) -> *mut Scratch {
        let s = self.scratch.get();
        if !s.is_null() {
            return s;
        }
        self.map_scratch()
    }

    #[cold]
    #[inline(never)]
    fn map_scratch(&self) -> *mut Scratch {
        if self.exited.get() {
            return std::ptr::null_mut();
        }
        let s = crate::sys::map_anon(std::mem::size_of::<Scratch>()) as *mut Scratch;
        self.scratch.set(s);
        s
    }

    /// Unmaps the thread's [`Scratch`] (its exit handler).
    pub(crate) fn free_scratch(&self) {
        let s = self.scratch.replace(std::ptr::null_mut());
        if !s.is_null() {
            // SAFETY: mapped by `map_scratch` with this size; the thread no longer captures.
            unsafe { crate::sys::unmap(s as *mut u8, std::mem::size_of::<Scratch>()) };
        }
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
    #[inline]
    pub fn dwarf_cache(&self) -> Option<*mut crate::dwarf::Cache> {
        if !DWARF.load(Ordering::Relaxed) {
            return None;
        }
        let c = self.dwarf_cache.get();
        if !c.is_null() && crate::dwarf::ready() {
            return Some(c);
        }
        self.dwarf_cache_slow()
    }

    /// [`Self::dwarf_cache`] when the object list or the thread's cache does not exist yet
    /// (out of line: the common case then saves no registers).
    #[cfg(target_arch = "x86_64")]
    #[cold]
    #[inline(never)]
    fn dwarf_cache_slow(&self) -> Option<*mut crate::dwarf::Cache> {
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
            crate::state::note_private(self);
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

/// Rebuilds the CFI unwinder's object list from inside the recording path (the shim's own
/// work: it allocates, with signals blocked). `dl_iterate_phdr` takes the loader's list lock,
/// which is recursive and never held across a call to `malloc`.
#[cfg(target_arch = "x86_64")]
pub fn rebuild_unwind_tables(t: &Tls) {
    internal(t, crate::dwarf::rebuild);
}

pub(crate) fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
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
