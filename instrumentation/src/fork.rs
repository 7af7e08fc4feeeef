//! `fork`: the handlers that move a forked child to a region of its own, and the detection of
//! children made by a raw `fork`/`clone` system call, which run no handlers (see
//! ARCHITECTURE.md, "Start-up and process events").

use crate::region;
use crate::shared::*;
use crate::sys::map_anon;
use std::sync::atomic::{AtomicU64, Ordering};
use vmo_layout::clock::now_ns;
use vmo_layout::v1::{LEASE_NS, STATE_READY};
use vmo_layout::RegionWriter;

/// A word in a private page that the kernel zeroes in a child at any `fork` (also a raw
/// `clone`/`fork` system call, which runs no fork handlers): `MADV_WIPEONFORK`. Nonzero in
/// the process that owns the current region.
pub(crate) static PROCESS_TOKEN: std::sync::atomic::AtomicPtr<u64> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// Whether this process is the one that owns the region (not a child made by a raw fork
/// system call, which shares the parent's `MAP_SHARED` region and must not write to it). One
/// load of a word that is rarely out of the cache.
#[inline]
pub(crate) fn same_process() -> bool {
    let p = PROCESS_TOKEN.load(Ordering::Relaxed);
    // SAFETY: set once to a page that is never unmapped.
    p.is_null() || unsafe { p.read_volatile() } != 0
}

/// Makes the token page (at start-up) and marks this process as the region's owner.
pub(crate) fn set_process_token() {
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
pub(crate) fn foreign_child(g: &Global) {
    if STATE
        .compare_exchange(READY, DISABLED, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
    {
        g.writer
            .raise_recording_flag(vmo_layout::v1::RECORDING_FOREIGN_WRITER);
    }
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
    crate::shared::with_tls(|t| {
        internal(t, || {
            // SAFETY: registering handlers of the right signature; may allocate (the guard
            // routes that to glibc).
            unsafe {
                libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child))
            };
        })
    });
}

/// Whether `fork_prepare` took the locks (what `fork_parent`/`fork_child` release, whatever
/// the state is by then).
pub(crate) static FORK_LOCKED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// A stamp read in `fork_prepare`: records stamped later were written after the fork.
static FORK_TIME: AtomicU64 = AtomicU64::new(0);

pub(crate) extern "C" fn fork_prepare() {
    if let Some(g) = global() {
        // Protect the nodes live at the fork from being recycled while the child copies them.
        let lease = &g.writer.header().fork_lease;
        let now = now_ns();
        // Every stamp written before the fork is at most this (see `RegionWriter::stamp`).
        FORK_TIME.store(g.writer.stamp(now).0, Ordering::Relaxed);
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
        ORPHAN.lock_for_fork();
        INDEX.lock_all();
        g.free.q.lock_for_fork();
        FORK_LOCKED.store(true, Ordering::Relaxed);
    }
}

/// Releases what `fork_prepare` took.
pub(crate) fn fork_unlock(g: &Global) {
    if FORK_LOCKED.swap(false, Ordering::Relaxed) {
        // SAFETY: FORK_LOCKED was set, so fork_prepare took each of these with lock_for_fork
        // and no guard exists for them.
        unsafe {
            ORPHAN.unlock_after_fork();
            g.free.q.unlock_after_fork();
            INDEX.unlock_all();
            #[cfg(target_arch = "x86_64")]
            crate::dwarf::unlock_after_fork();
            crate::modules::unlock_after_fork();
        }
    }
}

pub(crate) extern "C" fn fork_parent() {
    if FORK_LOCKED.load(Ordering::Relaxed) {
        // SAFETY: GLOBAL was written before FORK_LOCKED could be set (READY was observed).
        fork_unlock(unsafe { (*GLOBAL.0.get()).assume_init_ref() });
    }
}

/// In the child: the region is shared with the parent, so the child moves to a region of its
/// own holding the blocks it inherited (those live at the fork), then goes on recording there.
pub(crate) extern "C" fn fork_child() {
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
    crate::shared::with_tls(|t| {
        internal(t, || {
            if !child_region(g, t, lease) {
                STATE.store(DISABLED, Ordering::Release);
            }
        })
    });
}

/// Marks in `live` the records (below `cursor`) of blocks that have a header or a trailer
/// naming them in this child's memory, a copy of the parent's at the fork: the blocks live at
/// the fork whose record number is kept next to them (see [`crate::header`] and
/// [`crate::trailer`]), as the index holds the others.
///
/// A free clears the record number before the record is stamped freed, and the tag before
/// glibc gets the block back, so a header or trailer names a record exactly while the block
/// is recorded. Candidates are the records allocated at or before the fork and not freed
/// before it; the parent goes on running, so their addresses may be anything by now: the words
/// are read with `process_vm_readv` on this process, which fails on unmapped memory instead of
/// faulting (where it is refused, through a pipe: [`read_by_pipe`]).
fn mark_headed(parent: &RegionWriter, cursor: u64, fork_time: u64, live: &mut [u64]) {
    const BATCH: usize = 128;
    let mut nodes = [0u32; BATCH];
    let mut addrs = [0u64; BATCH];
    let mut k = 0;
    let check = |nodes: &[u32], addrs: &[u64], live: &mut [u64]| {
        let mut at = [0u64; BATCH];
        let mut words = [[0u64; 2]; BATCH];
        let mut ok = [false; BATCH];
        let n = nodes.len();
        let mark = |j: usize, live: &mut [u64]| {
            live[nodes[j] as usize / 64] |= 1 << (nodes[j] % 64);
        };
        if crate::header::on() {
            for j in 0..n {
                at[j] = addrs[j] - 16;
            }
            read_each(&at[..n], 16, &mut words[..n], &mut ok[..n]);
            for j in 0..n {
                if ok[j] && crate::header::decode(addrs[j], words[j]).map(|h| h.0) == Some(nodes[j])
                {
                    mark(j, live);
                }
            }
        }
        if crate::trailer::on() {
            // glibc's chunk header first, then the trailer it places.
            for j in 0..n {
                at[j] = addrs[j] - 8;
            }
            read_each(&at[..n], 8, &mut words[..n], &mut ok[..n]);
            for j in 0..n {
                at[j] = if ok[j] {
                    crate::trailer::at_from(addrs[j], words[j][0])
                } else {
                    0
                };
            }
            read_each(&at[..n], 8, &mut words[..n], &mut ok[..n]);
            for j in 0..n {
                if ok[j]
                    && at[j] != 0
                    && crate::trailer::decode(addrs[j], words[j][0]) == Some(nodes[j])
                {
                    mark(j, live);
                }
            }
        }
    };
    for i in 0..cursor as u32 {
        if live[i as usize / 64] & (1 << (i % 64)) != 0 {
            continue;
        }
        let n = parent.node(i);
        let ta = n.t_alloc.load(Ordering::Acquire);
        let tf = n.t_free.load(Ordering::Relaxed);
        let a = n.address.load(Ordering::Relaxed);
        if ta == 0 || ta > fork_time || tf < fork_time || a < 4096 || a & 15 != 0 {
            continue;
        }
        nodes[k] = i;
        addrs[k] = a;
        k += 1;
        if k == BATCH {
            check(&nodes, &addrs, live);
            k = 0;
        }
    }
    check(&nodes[..k], &addrs[..k], live);
}

/// Reads `len` (8 or 16) bytes at each address of `at` into `words` (0: skipped), setting
/// `ok[j]` where the read succeeded: with `process_vm_readv` on this process, which fails on
/// unmapped memory instead of faulting, or where that is refused (a seccomp filter, as
/// containers' default one without CAP_SYS_PTRACE) through a pipe ([`read_by_pipe`]).
fn read_each(at: &[u64], len: usize, words: &mut [[u64; 2]], ok: &mut [bool]) {
    const BATCH: usize = 128;
    let n = at.len().min(BATCH);
    ok[..n].fill(false);
    let local: [libc::iovec; BATCH] = std::array::from_fn(|j| libc::iovec {
        iov_base: words
            .get_mut(j)
            .map_or(std::ptr::null_mut(), |w| w.as_mut_ptr())
            as *mut libc::c_void,
        iov_len: len,
    });
    let remote: [libc::iovec; BATCH] = std::array::from_fn(|j| libc::iovec {
        iov_base: at.get(j).copied().unwrap_or(0) as *mut libc::c_void,
        iov_len: len,
    });
    let mut from = 0;
    while from < n {
        // A zero address stands for "nothing to read": skipped.
        if at[from] == 0 {
            from += 1;
            continue;
        }
        // Up to the next zero address.
        let to = (from..n).find(|&j| at[j] == 0).unwrap_or(n);
        let count = to - from;
        // SAFETY: `local` points at `words`, writable, `len` (<= 16) bytes an entry; the remote
        // ranges are only read by the kernel, which fails on unmapped ones.
        let got = unsafe {
            libc::process_vm_readv(
                libc::getpid(),
                local[from..].as_ptr(),
                count as libc::c_ulong,
                remote[from..].as_ptr(),
                count as libc::c_ulong,
                0,
            )
        };
        if got < 0 {
            // SAFETY: reading errno, just set by the failed call.
            let e = unsafe { *libc::__errno_location() };
            if e != libc::EFAULT {
                read_by_pipe(&at[from..n], len, &mut words[from..n], &mut ok[from..n]);
                return;
            }
        }
        // Whole entries read; the one after them failed (unmapped) and is skipped.
        let whole = if got < 0 { 0 } else { got as usize / len };
        for o in &mut ok[from..from + whole.min(count)] {
            *o = true;
        }
        from += whole + 1;
    }
}

/// [`read_each`]'s reads where `process_vm_readv` is refused: each range is written into a
/// pipe (`write` fails with EFAULT on unmapped memory instead of faulting) and read back.
fn read_by_pipe(at: &[u64], len: usize, words: &mut [[u64; 2]], ok: &mut [bool]) {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a writable array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return;
    }
    for j in 0..at.len() {
        if at[j] == 0 {
            continue;
        }
        // SAFETY: the kernel reads `len` bytes at `at[j]` or fails with EFAULT; the pipe's
        // buffer holds them (it is emptied after each write).
        let wrote = unsafe { libc::write(fds[1], at[j] as *const libc::c_void, len) };
        if wrote != len as isize {
            continue;
        }
        // SAFETY: reading the bytes just written into an entry of `words` (16 bytes).
        let got = unsafe { libc::read(fds[0], words[j].as_mut_ptr() as *mut libc::c_void, len) };
        ok[j] = got == len as isize;
    }
    // SAFETY: closing the pipe made above.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
}

pub(crate) fn child_region(g: &Global, t: &Tls, lease: u64) -> bool {
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
    w.claim_thread(0, b"(other threads)\0", (0, 0));
    // The inherited address index holds exactly the blocks live at the fork (its shards were
    // locked across it): copy the records it points to.
    // A bitmap of the allocations table for the copy (1 bit per record, 128 KiB per million).
    let cursor = parent.header().node_cursor.load(Ordering::Relaxed);
    // Two bitmaps: the records live at the fork (index and block headers), and inherit's own.
    let cursor = cursor.min(parent.node_capacity());
    let words = (cursor as usize).div_ceil(64);
    let map = if words > 0 {
        map_anon(words * 16)
    } else {
        std::ptr::null_mut()
    };
    let (live, scratch): (&mut [u64], &mut [u64]) = if map.is_null() {
        (&mut [], &mut [])
    } else {
        // SAFETY: a fresh private mapping of `2 * words` u64, zero-filled, used only here.
        unsafe { std::slice::from_raw_parts_mut(map as *mut u64, 2 * words) }.split_at_mut(words)
    };
    let fork_time = FORK_TIME.load(Ordering::Relaxed);
    let inherited = if live.is_empty() && cursor > 0 {
        None
    } else {
        // SAFETY: this child is single-threaded (fork handlers run before anything else), so
        // the index is not modified while read.
        for (_, i) in unsafe { INDEX.entries() } {
            if (i as u64) < cursor {
                live[i as usize / 64] |= 1 << (i % 64);
            }
        }
        if crate::header::on() || crate::trailer::on() {
            mark_headed(&parent, cursor, fork_time, live);
        }
        let live = &*live;
        let entries = (0..cursor as u32)
            .filter(|&i| live[i as usize / 64] & (1 << (i % 64)) != 0)
            .map(|i| (parent.node(i).address.load(Ordering::Relaxed), i));
        // SAFETY: as above; the region is fresh and laid out with the parent's capacities;
        // the parent's fork lease (set before the fork) keeps the records live at the fork
        // from being recycled meanwhile.
        unsafe { w.inherit(&parent, entries, fork_time, scratch) }
    };
    if !map.is_null() {
        // SAFETY: the mapping made above, no longer used.
        unsafe { crate::sys::unmap(map, words * 16) };
    }
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
    crate::state::forget_stripes_in_child(t);
    t.slot.set(0); // registers again, in the new region, at the next operation
    t.tid.set(gettid());
    w.set_state(STATE_READY);
    set_process_token();
    true
}
