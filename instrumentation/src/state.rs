//! Process-wide and per-thread state: the start-up state machine, sampling, thread
//! registration and exit, process exit. The shared types themselves (`Global`, `Tls`, the
//! guard) are in `shared.rs`, re-exported here.

pub use crate::deferred::set_real_free;
use crate::deferred::{Deferred, Op, DEFERRED_FRAMES, FREE_HELD, FREE_OP, REAL_FREE};
pub use crate::fork::register_fork_handlers;
use crate::fork::set_process_token;
pub use crate::freelist::FreeNodes;
#[doc(hidden)]
pub use crate::index::PRESENCE_LIVE_OFFSET;
use crate::nodes::flush_nodes;
pub use crate::nodes::{recycle_node, take_node};
use crate::region;
pub use crate::shared::*;
use crate::stacks::StackIndex;
use crate::sys::map_anon;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use vmo_layout::clock::now_ns;
use vmo_layout::v1::{STATE_EXITED, STATE_READY};

/// Set when the library was `dlopen`ed rather than preloaded ([`wait_for_start`]): the first
/// allocator call does not start recording; only an explicit [`init`] (`heapdump attach`'s
/// entry) does.
pub(crate) static WAIT_FOR_START: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Recording starts only when [`init`] is called, not lazily at the first allocator call: for
/// a library `dlopen`ed into a running process, whose calls before `heapdump attach` starts it
/// pass through unrecorded (a lazy start on one thread would record part of the program, with
/// the default settings rather than the collector's).
pub fn wait_for_start() {
    WAIT_FOR_START.store(true, Ordering::Relaxed);
}

/// Allocator calls that arrived while their thread was already inside the shim (the shim's own
/// libc calls during start-up or thread registration; never on the recording path).
pub(crate) static NESTED: AtomicU64 = AtomicU64::new(0);

/// Number of allocator calls made from inside the shim so far (see [`NESTED`]); a test reads it
/// around the recording path to prove that path allocates nothing.
pub fn nested_calls() -> u64 {
    NESTED.load(Ordering::Relaxed)
}

/// Blocks recorded by the calling thread's slot (0 if it has none yet).
pub fn thread_recorded_allocations() -> u64 {
    let Some(g) = global() else { return 0 };
    with_tls(|t| match t.slot.get() {
        0 | EXITED => 0,
        s => g.writer.thread(s - 1).allocs.load(Ordering::Relaxed),
    })
}

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

/// The sampling interval in bytes (0: every allocation is recorded).
#[inline]
pub fn sample_interval() -> u64 {
    SAMPLE_INTERVAL.load(Ordering::Relaxed)
}

/// 1 when the preloaded `malloc` may decide an unsampled allocation from the thread's
/// countdown alone, without a Rust frame (sampling mode with headers on sampled blocks, no
/// CPython poll due): its entry is written in assembly (the preload crate's `malloc`) and
/// reads this byte first. Kept by [`update_malloc_fast`].
#[doc(hidden)]
pub static MALLOC_FAST: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Offset (bytes) of the thread's sampling countdown ([`skip_sample`]'s) in [`crate::shared::Tls`],
/// for the preloaded `malloc`'s assembly entry.
#[doc(hidden)]
pub const SAMPLE_LEFT_OFFSET: usize = std::mem::offset_of!(crate::shared::Tls, sample_left);

/// 1 when the preloaded `free` may give a block without a header straight to glibc, no
/// address being indexed (sampling mode with headers on sampled blocks, no trailers): its
/// entry is written in assembly (the preload crate's `free`) and reads this byte first, then
/// the block's chunk-header word and [`PRESENCE`]'s count. Kept by
/// [`update_malloc_fast`].
#[doc(hidden)]
pub static FREE_FAST: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Sets [`MALLOC_FAST`] and [`FREE_FAST`] from the switches they stand for (after any of them
/// changes).
pub fn update_malloc_fast() {
    let sampled = crate::header::on() && crate::header::sampled_only() && sample_interval() != 0;
    MALLOC_FAST.store(
        (sampled && !crate::python::poll_due()) as u8,
        Ordering::Relaxed,
    );
    FREE_FAST.store((sampled && !crate::trailer::on()) as u8, Ordering::Relaxed);
}

/// Sampling mode's common case, decided without a call: counts `size` bytes against the
/// thread's distance to its next sampled byte and returns true when the block is not sampled.
/// False, with nothing counted, when [`sample`] must decide (the distance runs out, or the
/// thread has not allocated yet).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn skip_sample(size: u64) -> bool {
    let p = crate::tls::get() as *const crate::shared::Tls;
    if p.is_null() {
        return false;
    }
    // SAFETY: this thread's state (see `shared::with_tls`), set by its first access.
    let t = unsafe { &*p };
    let left = t.sample_left.get();
    if left == i64::MIN {
        return false;
    }
    let left = vmo_layout::sampling::count_down(left, size);
    if left <= 0 {
        return false;
    }
    t.sample_left.set(left);
    true
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
#[cold]
#[inline(never)]
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
    // After the claim: what it calls may allocate (another preload's wrappers), and that
    // allocation must find start-up under way, not start it again (helper N, 2).
    crate::sys::note_stderr();
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
    w.claim_thread(0, b"(other threads)\0", (0, 0));
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

/// Turns block trailers and headers on (see [`crate::trailer`], [`crate::header`]) if recording started and
/// `HEAPDUMP_BLOCK_HEADERS` allows it: for every block, or in sampling mode for sampled blocks
/// only. Only the preloaded shim calls this, from its constructor: its `malloc`, `calloc` and
/// `realloc` then add trailers to small blocks and headers to the others, and its `free`,
/// `realloc` and `malloc_usable_size` recognise them for the rest of the process's life.
pub fn enable_block_headers() {
    if let Some(g) = global() {
        if g.settings.block_headers {
            if g.settings.sample_interval == 0 {
                crate::header::enable();
                crate::trailer::enable();
            } else {
                // Sampled blocks get headers only (see the preload crate's `mark_of`).
                crate::header::enable_sampled_only();
                update_malloc_fast();
            }
        }
    }
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

/// The calling thread's name (`PR_GET_NAME`; all zero if refused). errno is kept: [`tick`]
/// asks from inside `malloc` and `free`, and a seccomp filter may refuse `prctl` (helper H, 1:
/// a successful `malloc` left errno `EPERM`).
fn thread_name() -> [u8; 16] {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes into the buffer; errno is restored.
    unsafe {
        let saved = *libc::__errno_location();
        libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr());
        *libc::__errno_location() = saved;
    }
    name
}

#[cold]
pub(crate) fn register_thread(g: &Global, t: &Tls) {
    let tid = gettid();
    t.tid.set(tid);
    // A forked child keeps the stack bounds of the thread that forked (which may not be the
    // process's first thread).
    if t.stack_hi.get() == 0 {
        let marker = 0u8;
        let sp = std::hint::black_box(&marker) as *const u8 as usize;
        if tid != g.pid && crate::unwind::inside_getattr(sp) {
            // Asked later, outside it (see `unwind::inside_getattr` and `Tls::stack_limit`):
            // until then walks stop at the end of the memory readable above them.
            t.bounds_pending.set(true);
        } else {
            let (lo, hi) = crate::unwind::current_stack_bounds(tid == g.pid);
            t.stack_lo.set(lo);
            t.stack_hi.set(hi);
        }
    }
    let (lo, hi) = (t.stack_lo.get() as u64, t.stack_hi.get() as u64);
    match g
        .writer
        .claim_thread(tid, &thread_name(), (lo, hi.saturating_sub(lo)))
    {
        Some(i) => {
            t.slot.set(i + 1);
            claim_stripe(t);
            // SAFETY: the key was created at init; the value is an integer tag, not a pointer.
            unsafe { libc::pthread_setspecific(g.key, (i as usize + 1) as *const libc::c_void) };
            note_private(t);
        }
        None => t.slot.set(EXITED),
    }
}

/// [`Tls::stripe`] of a thread that owns no counter stripe.
pub(crate) const NO_STRIPE: u8 = u8::MAX;

/// The per-stack counter stripes a thread may own, all but the last (`STRIPES - 1`, shared
/// by every other thread and the orphan slot with locked additions): each holds the thread
/// id of its owner, 0 when free. Process-local; the region's readers sum every stripe, so
/// which stripe counted an allocation does not show.
static STRIPE_OWNERS: [AtomicU32; vmo_layout::v1::STRIPES - 1] =
    [const { AtomicU32::new(0) }; vmo_layout::v1::STRIPES - 1];

/// Gives the thread a counter stripe of its own if one is free (at registration): its
/// allocations are then counted without a locked instruction
/// ([`vmo_layout::RegionWriter::count_alloc_owned`]). The Acquire pairs with the previous
/// owner's release, so the counts it left are the ones added to.
pub(crate) fn claim_stripe(t: &Tls) {
    let tid = t.tid.get().max(1);
    for (k, owner) in STRIPE_OWNERS.iter().enumerate() {
        if owner
            .compare_exchange(0, tid, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            t.stripe.set(k as u8);
            return;
        }
    }
}

/// Gives the thread's stripe back (at its exit): its last counts happen before the next
/// owner's first.
pub(crate) fn release_stripe(t: &Tls) {
    let k = t.stripe.replace(NO_STRIPE);
    if let Some(owner) = STRIPE_OWNERS.get(k as usize) {
        owner.store(0, Ordering::Release);
    }
}

/// In a forked child (one thread, the one that forked): no other thread owns a stripe, and
/// this one claims again when it registers in the child's region.
pub(crate) fn forget_stripes_in_child(t: &Tls) {
    t.stripe.set(NO_STRIPE);
    for owner in &STRIPE_OWNERS {
        owner.store(0, Ordering::Relaxed);
    }
}

/// Writes into the thread's slot where its private memory that keeps copies of the
/// program's words lies (its walk memo, its Python memos: `ThreadSlotV1::private`), so that
/// the reference graph does not take it for a root: a stale copy of a saved `rbp` there kept
/// leaked lists reachable (helper G, 1: 1,288 of 20,000 leaked nodes at -O2). Called when
/// the thread gets its slot and whenever one of those mappings is made (a forked child's
/// thread re-registers with the mappings it inherited). Nothing without a slot.
pub(crate) fn note_private(t: &Tls) {
    let Some(g) = global() else { return };
    let slot = t.slot.get();
    if slot == 0 || slot == EXITED {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    let [cache, walks] = {
        let c = t.dwarf_cache.get();
        if c.is_null() {
            [(0, 0); 2]
        } else {
            // SAFETY: the thread's own cache, alive until its exit handler.
            unsafe { crate::dwarf::private_ranges(c) }
        }
    };
    #[cfg(not(target_arch = "x86_64"))]
    let [cache, walks] = [(0u64, 0u64); 2];
    let [frames, stacks] = crate::python::private_ranges(t);
    let d = t.deferred.get();
    let deferred = if d.is_null() {
        (0, 0)
    } else {
        (d as u64, std::mem::size_of::<Deferred>() as u64)
    };
    let i = slot - 1;
    for (k, (start, bytes)) in [cache, walks, frames, stacks, deferred]
        .into_iter()
        .enumerate()
    {
        g.writer.set_thread_private(i, k, start, bytes, false);
    }
    // The thread's own stack, a root: a dead thread's stack listed by a released slot is not
    // excluded where a running thread's stack now lies (glibc reuses them).
    let (lo, hi) = (t.stack_lo.get(), t.stack_hi.get());
    g.writer
        .set_thread_private(i, 5, lo as u64, hi.saturating_sub(lo) as u64, true);
}

/// Clears the ranges of the thread's slot (at its exit, before its memory is unmapped).
fn clear_private(g: &Global, t: &Tls) {
    let slot = t.slot.get();
    if slot != 0 && slot != EXITED {
        for k in 0..vmo_layout::v1::THREAD_PRIVATE_RANGES {
            g.writer.set_thread_private(slot - 1, k, 0, 0, false);
        }
    }
}

unsafe extern "C" fn thread_exit(value: *mut libc::c_void) {
    let Some(g) = global() else { return };
    with_tls(|t| {
        let outer = t.guard.replace(GUARD_INTERNAL);
        t.exited.set(true);
        clear_private(g, t);
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
        crate::python::free_frame_memo(t);
        crate::python::free_stack_memo(t);
        t.free_scratch();
        let slot = value as usize as u32;
        if slot != 0 && t.slot.get() == slot {
            // Its stack stays mapped in glibc's cache of stacks, holding stale words: listed
            // as dead, not a root (helper K, 1: leaks of joined threads went unreported). Up
            // to its descriptor only (`pthread_self()`, at the top of the block): glibc keeps
            // the dead thread's DTV, a malloc block it points to, for the next thread.
            let (lo, hi) = (t.stack_lo.get(), t.stack_hi.get());
            // SAFETY: pthread_self has no preconditions.
            let pd = unsafe { libc::pthread_self() } as usize;
            let dead = if t.tid.get() != g.pid && lo < pd && pd <= hi {
                (lo as u64, ((pd - lo) & !15) as u64)
            } else {
                (0, 0)
            };
            g.writer.release_thread(slot - 1, dead);
        }
        release_stripe(t);
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
        if g.settings.remove_perf_map {
            remove_node_perf_map(g.pid);
        }
    }
}

/// Removes `/tmp/perf-PID.map` when this process is node (its executable is named `node`,
/// `nodejs` or `node` and digits) and the map is a regular file of this user: the map node
/// wrote because `heapdump run` added its perf-map flags to `NODE_OPTIONS`
/// (`HEAPDUMP_REMOVE_PERF_MAP=1`), which node's child processes inherit with the setting.
/// Called at a clean exit, as the region goes; a region that stays (`HEAPDUMP_KEEP=1`, a kill)
/// keeps the map too, whose names its post-mortem snapshots need. No allocation.
fn remove_node_perf_map(pid: u32) {
    let mut exe = [0u8; 4096];
    // SAFETY: the path is NUL-terminated and `exe` is writable for its length.
    let n = unsafe {
        libc::readlink(
            c"/proc/self/exe".as_ptr(),
            exe.as_mut_ptr() as *mut libc::c_char,
            exe.len(),
        )
    };
    if n <= 0 || n as usize >= exe.len() {
        return;
    }
    let exe = &exe[..n as usize];
    let name = exe.rsplit(|&b| b == b'/').next().unwrap_or(exe);
    if !is_node_name(name) {
        return;
    }
    let mut path = [0u8; 40];
    let mut num = [0u8; 20];
    let digits = crate::sys::fmt_u64(pid as u64, &mut num);
    let parts: [&[u8]; 3] = [b"/tmp/perf-", digits, b".map\0"];
    let mut k = 0;
    for part in parts {
        path[k..k + part.len()].copy_from_slice(part);
        k += part.len();
    }
    // SAFETY: an all-zero `stat` is a valid value of the plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated; `st` is writable.
    if unsafe { libc::lstat(path.as_ptr() as *const libc::c_char, &mut st) } != 0 {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_uid == unsafe { libc::geteuid() } {
        // SAFETY: as for lstat.
        unsafe { libc::unlink(path.as_ptr() as *const libc::c_char) };
    }
}

/// Whether an executable's file name is node's: `node`, `nodejs`, or `node` and a version's
/// digits (`node22`); not `nodemon` or `node-gyp`.
fn is_node_name(name: &[u8]) -> bool {
    name == b"nodejs"
        || name
            .strip_prefix(b"node")
            .is_some_and(|v| v.iter().all(u8::is_ascii_digit))
}

/// Bytes a thread allocates between two refreshes of the live-bytes peak at most (besides
/// every 1024th operation, [`tick`]): a burst of a few large blocks freed again before the
/// 1024th operation was missed by the peak (10 blocks of 1 MB: a peak of 4 KiB).
const PEAK_EVERY_BYTES: u64 = 1 << 20;

/// Notes `size` bytes allocated by this thread (recorded): the live-bytes peak is refreshed
/// once a thread has allocated [`PEAK_EVERY_BYTES`] since its last refresh.
#[inline(always)]
pub fn note_allocated(g: &Global, t: &Tls, size: u64) {
    let since = t.since_peak.get().wrapping_add(size);
    if since >= PEAK_EVERY_BYTES {
        t.since_peak.set(0);
        g.writer.update_peak();
    } else {
        t.since_peak.set(since);
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

/// From a signal handler that interrupted this thread's recording: queues an allocation
/// (`frames` its stack) or a free (`size == None`) to be recorded when the interrupted
/// operation ends. For a free, returns true when the caller must not free the block: the
/// drain will, after closing its record (only with [`set_real_free`]).
pub fn defer(ptr: u64, size: Option<u64>, frames: &[u64], may_hold: bool) -> bool {
    with_tls(|t| {
        let mut d = t.deferred.get();
        if d.is_null() {
            d = map_anon(std::mem::size_of::<Deferred>()) as *mut Deferred;
            if d.is_null() {
                return false;
            }
            t.deferred.set(d);
            note_private(t);
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

#[cfg(test)]
mod tests {
    use super::is_node_name;

    #[test]
    fn node_executables_by_name() {
        for name in ["node", "nodejs", "node22", "node18"] {
            assert!(is_node_name(name.as_bytes()), "{name}");
        }
        for name in [
            "nodemon", "node-gyp", "npm", "python3", "nod", "", "node.js",
        ] {
            assert!(!is_node_name(name.as_bytes()), "{name}");
        }
    }
}
