//! What happens around each allocator call: capture the stack, intern it, and insert or erase
//! the block's record under the thread's operation window.
//!
//! Timestamps (see ARCHITECTURE.md): an insert reads its time *after* the real allocator
//! returned the block; an erase reads its time *before* the block goes back to the allocator.
//! So if a block's address is reused, the old record's `t_free` is below the new one's `t_alloc`.

use crate::deferred::{Deferred, DEFERRED_FRAMES, FREE_HELD, FREE_OP, REAL_FREE};
use crate::header;
use crate::python::{self, Wrappers};
use crate::shared;
use crate::state::{self, acquire_slot, recycle_node, take_node, tick, Global, Tls};
use crate::trailer;
use crate::unwind::{hash_frames, walk, Start};
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use vmo_layout::clock::now_ns;
use vmo_layout::v1::MAX_FRAMES;
use vmo_layout::RegionWriter;

/// Records a new block `ptr` of `size` requested bytes; `fp` is the frame pointer of the
/// exported allocation function (the walk starts at its caller).
#[inline]
pub fn record_alloc(ptr: *mut u8, size: usize, fp: usize) {
    record_alloc_from(ptr, size, Start::FramePointer(fp));
}

/// Records a new block `ptr` of `size` requested bytes, its stack captured from `start`.
#[inline]
pub fn record_alloc_from(ptr: *mut u8, size: usize, start: Start) {
    record_alloc_as(ptr, size, start, false, 0);
}

/// [`record_alloc`] of a block with room for a trailer at `at` (see [`trailer`]): the record
/// number goes there instead of into the address index (the trailer is written only when the
/// block is recorded). `at` may also be [`header::JUST_HEADED`] (a block the wrapper just gave
/// a header: the record number goes there) or 0 (the header or index is looked up).
#[inline]
pub fn record_alloc_trailed(ptr: *mut u8, size: usize, fp: usize, at: u64) {
    record_alloc_as(ptr, size, Start::FramePointer(fp), false, at);
}

/// [`record_realloc`] of a block with a trailer at `at` (as [`record_alloc_trailed`]).
#[inline]
pub fn record_realloc_trailed(ptr: *mut u8, size: usize, fp: usize, at: u64) {
    record_alloc_as(ptr, size, Start::FramePointer(fp), true, at);
}

/// Records the block `realloc` made of a block that had a record (`fp` as in
/// [`record_alloc`]), even inside a Python allocator wrapper's forwarded call
/// ([`state::forwarding`]): the wrapper closed its own block's record before forwarding, so a
/// recorded block reallocated meanwhile is the interpreter's own (pymalloc's `arenas` array)
/// and stays recorded at its new address.
#[inline]
pub fn record_realloc(ptr: *mut u8, size: usize, fp: usize) {
    record_alloc_as(ptr, size, Start::FramePointer(fp), true, 0);
}

/// Sampling mode with block headers ([`header::sampled_only`]): whether the allocation of
/// `size` bytes about to be made is sampled, decided before the wrapper asks glibc for it (a
/// sampled block gets a header). Every allocation calls this or [`record_alloc`], never both.
#[inline]
pub fn sample_next(size: usize) -> bool {
    // Not sampled, as `state::sample` would decide, without a call, unless the interpreter's
    // allocators are to be wrapped first or a sample is due.
    #[cfg(target_arch = "x86_64")]
    if !python::poll_due() && state::skip_sample(size as u64) {
        return false;
    }
    sample_next_slow(size)
}

#[inline(never)]
fn sample_next_slow(size: usize) -> bool {
    python::poll(&PY_WRAPPERS);
    state::sample(size as u64, state::sample_interval())
}

/// Records block `ptr` that [`sample_next`] sampled (`fp` as in [`record_alloc`];
/// `forwarded` as for [`record_realloc`]: it replaces a recorded block; `at` as for
/// [`record_alloc_trailed`], 0 without a trailer).
#[inline]
pub fn record_sampled(ptr: *mut u8, size: usize, fp: usize, forwarded: bool, at: u64) {
    if ptr.is_null() {
        return;
    }
    record_chosen(ptr, size, Start::FramePointer(fp), forwarded, at);
}

#[inline(always)]
fn record_alloc_as(ptr: *mut u8, size: usize, start: Start, forwarded: bool, at: u64) {
    if ptr.is_null() {
        return;
    }
    python::poll(&PY_WRAPPERS);
    let interval = state::sample_interval();
    if interval != 0 && !state::sample(size as u64, interval) {
        return;
    }
    record_chosen(ptr, size, start, forwarded, at);
}

/// Records block `ptr`, already sampled when sampling (`at`: its trailer, [`header::JUST_HEADED`], or 0).
#[inline(always)]
fn record_chosen(ptr: *mut u8, size: usize, start: Start, forwarded: bool, at: u64) {
    let record = |g: &'static Global, t: &Tls| {
        // The block a Python allocator wrapper's forwarded `realloc` made: the wrapper records
        // it (see `py_realloc`).
        if forwarded && t.py_skip.get() {
            t.py_skip.set(false);
            return;
        }
        insert(g, t, ptr as u64, size as u64, at, |g, t| {
            stack_id(g, t, start)
        })
    };
    let done = if forwarded {
        enter_forwarded(record)
    } else {
        enter(record)
    };
    if done.is_none() && state::interrupted_recording() {
        deferred_alloc(ptr, size, start);
    }
}

/// An allocation made by a signal handler that interrupted this thread's recording: its
/// stack is walked by frame pointers (the thread's CFI cache is in use below us) up to the
/// signal trampoline, and the block queued for the end of the interrupted operation.
#[cold]
fn deferred_alloc(ptr: *mut u8, size: usize, start: Start) {
    let mut frames = [0u64; MAX_FRAMES];
    let fp = match start {
        Start::FramePointer(fp) | Start::Here { fp, .. } => fp,
    };
    let hi = state::stack_limit(frames.as_ptr() as usize);
    let mut n = walk(fp, hi, &mut frames);
    // End at the signal trampoline (`__restore_rt`): below it are the interrupted frames, the
    // shim's among them. A trace through CFI ends there too.
    if let Some(i) = frames[..n]
        .iter()
        .position(|&pc| crate::unwind::is_sigreturn(pc))
    {
        n = i + 1;
    }
    state::defer(ptr as u64, Some(size as u64), &frames[..n], false);
}

/// Erases the record of `ptr` (ignored when the shim never saw it). Returns the recorded size.
/// Also inside a Python allocator wrapper's forwarded call ([`enter_forwarded`]): a
/// block freed there that still has a record is not the wrapper's.
#[inline]
pub fn record_free(ptr: *mut u8) -> Option<u64> {
    if ptr.is_null() {
        return None;
    }
    // Sampling mode: most blocks were not sampled, and the filter says so without a lookup;
    // a sampled block with a header is not in the filter.
    if state::sample_interval() != 0
        && !state::PRESENCE.may_contain(ptr as u64)
        // SAFETY: a pointer handed to the malloc family or CPython's allocator (see `header`).
        && !(header::on() && unsafe { header::read(ptr as u64) }.is_some())
    {
        return None;
    }
    record_free_headed(ptr)
}

/// [`record_free`] of a block known to have a header (see [`header`]), whose record the
/// header names: no presence filter (sampled blocks with headers are not in the index), or
/// of any block outside sampling mode.
#[inline]
pub fn record_free_headed(ptr: *mut u8) -> Option<u64> {
    match enter_forwarded(|g, t| py_realloc_closed(t, ptr, erase(g, t, ptr as u64))) {
        Some(r) => r,
        None => {
            if state::interrupted_recording() {
                state::defer(ptr as u64, None, &[], false);
            }
            None
        }
    }
}

/// `free` for callers that can let the shim free the block later: as [`record_free`], but
/// when a signal handler frees while its thread is recording, the record is closed when the
/// interrupted operation ends and the block freed only then (through the function given to
/// [`state::set_real_free`]), so its address is not reused before. Returns true when the
/// caller must not free `ptr` itself.
#[inline]
pub fn record_free_deferrable(ptr: *mut u8) -> bool {
    if ptr.is_null() {
        return false;
    }
    // SAFETY: as in `record_free`.
    if header::on() && unsafe { header::read(ptr as u64) }.is_some() {
        return record_free_deferrable_headed(ptr);
    }
    record_free_deferrable_plain(ptr)
}

/// Whether no block at `addr` can be in the address index: sampling mode and its presence
/// filter says so (a free of such a block, with no mark either, records nothing).
#[inline(always)]
pub fn certainly_unindexed(addr: u64) -> bool {
    state::sample_interval() != 0 && !state::PRESENCE.may_contain(addr)
}

/// [`record_free_deferrable`] of a block known to have no header (see [`header`]): in
/// sampling mode the presence filter answers for it.
#[inline]
pub fn record_free_deferrable_plain(ptr: *mut u8) -> bool {
    if ptr.is_null() {
        return false;
    }
    if certainly_unindexed(ptr as u64) {
        return false;
    }
    record_free_deferrable_headed(ptr)
}

/// [`record_free`] of a block whose trailer (at `at`) names record `n` (see [`trailer`]):
/// no index lookup unless `n` is [`trailer::NONE`]. Returns the recorded size.
#[inline]
pub fn record_free_trailed(ptr: *mut u8, n: u32, at: u64) -> Option<u64> {
    prefetch_record(n);
    let closed =
        enter_forwarded(|g, t| py_realloc_closed(t, ptr, erase_trailed(g, t, ptr as u64, n, at)));
    match closed {
        Some(r) => r,
        None => {
            if state::interrupted_recording() {
                state::defer(ptr as u64, None, &[], false);
            }
            None
        }
    }
}

/// Starts loading record `n`, which a trailer names, before entering the recording path: the
/// erase reads it (`erase_trailed`'s check) and the record is usually cold, written when its
/// block was allocated.
#[inline(always)]
fn prefetch_record(n: u32) {
    if let Some(g) = shared::global() {
        if (n as u64) < g.writer.node_capacity() {
            g.writer.prefetch_node(n);
        }
    }
}

/// `r`, the erase of `ptr`'s record by a `realloc`: when `ptr` is the block a Python allocator
/// wrapper's `realloc` is forwarding (see `py_realloc`), the size closed is noted for it and
/// the new block left to it.
///
/// The wrapper's block is `ptr` itself, or lies inside it: CPython's debug hooks
/// (`PYTHONMALLOC=debug`, the default of debug builds) hand out a pointer a few words into the
/// block they allocate. Such a block, allocated before the domains were wrapped, has its
/// record from `malloc` (3.6–3.10 resize frames kept from start-up that way, with
/// `_PyObject_GC_Resize`); without this its new block was recorded by the preloaded `realloc`
/// and the object again by the wrapper, two live records over the same bytes.
#[inline(always)]
fn py_realloc_closed(t: &Tls, ptr: *mut u8, r: Option<u64>) -> Option<u64> {
    let (wrapped, p) = (t.py_realloc.get(), ptr as u64);
    if let Some(size) = r {
        if wrapped != 0 && (wrapped == p || (wrapped > p && wrapped - p < size)) {
            t.py_closed.set(size - (wrapped - p));
            t.py_skip.set(true);
        }
    }
    r
}

/// [`record_free_deferrable`] of a block whose trailer (at `at`) names record `n` (as
/// [`record_free_trailed`]).
#[inline]
pub fn record_free_deferrable_trailed(ptr: *mut u8, n: u32, at: u64) -> bool {
    prefetch_record(n);
    match enter_forwarded(|g, t| erase_trailed(g, t, ptr as u64, n, at)) {
        Some(_) => false,
        None => state::interrupted_recording() && state::defer(ptr as u64, None, &[], true),
    }
}

/// [`record_free_deferrable`] of a block known to have a header (as [`record_free_headed`]).
#[inline]
pub fn record_free_deferrable_headed(ptr: *mut u8) -> bool {
    match enter_forwarded(|g, t| erase(g, t, ptr as u64)) {
        Some(_) => false,
        None => state::interrupted_recording() && state::defer(ptr as u64, None, &[], true),
    }
}

/// [`record_free_deferrable_headed`] of a block whose header was just read: it names record
/// `n` ([`header::NONE`]: none) and holds the block's size `size32` (see [`header::read`]).
///
/// The header is left naming `n`: when this returns false the caller clears the block's
/// mark and gives it to glibc at once (`free`), and rewriting it first was ~20 instructions
/// a free for nothing (issue 20). When it returns true nothing was closed.
///
/// # Safety
/// `ptr` is a block handed to `free` whose header [`header::read`] just returned as
/// `(n, size32)`; when this returns false, the caller clears its mark before anything else
/// can read it (no other thread may: the program freed it).
#[inline]
pub unsafe fn record_free_deferrable_header(ptr: *mut u8, n: u32, size32: u32) -> bool {
    match enter_forwarded(|g, t| (n != header::NONE).then(|| close(g, t, n, size32))) {
        Some(_) => false,
        None => state::interrupted_recording() && state::defer(ptr as u64, None, &[], true),
    }
}

/// Records an allocation deferred from a signal handler (see [`state::defer`]).
/// (A block with a trailer keeps [`trailer::NONE`] there and is indexed: a free finding
/// `NONE` looks in the index.)
pub(crate) fn insert_deferred(g: &Global, t: &Tls, addr: u64, size: u64, frames: &[u64]) {
    insert(g, t, addr, size, 0, |g, t| intern(g, t, frames));
}

/// Records a free deferred from a signal handler. `held`: the preloaded `free` held the block
/// back from glibc (so it is glibc's block, and may have a trailer).
pub(crate) fn erase_deferred(g: &Global, t: &Tls, addr: u64, held: bool) {
    if held && trailer::on() {
        // SAFETY: a block handed to `free` and held back from glibc until this returns.
        if let Some((n, at)) = unsafe { trailer::read(addr) } {
            if n != trailer::NONE {
                erase_trailed(g, t, addr, n, at);
                return;
            }
        }
    }
    // SAFETY: the block is held back from glibc until this returns (see `state::defer`).
    let headed = header::on() && unsafe { header::read(addr) }.is_some();
    if !headed && state::sample_interval() != 0 && !state::PRESENCE.may_contain(addr) {
        return;
    }
    erase(g, t, addr);
}

#[inline(always)]
fn stack_id(g: &Global, t: &Tls, start: Start) -> u32 {
    if crate::ablate::on(crate::ablate::STACK) {
        return u32::MAX;
    }
    let scratch = t.scratch();
    if scratch.is_null() {
        return stack_id_without_scratch(g, t, start);
    }
    // SAFETY: the buffer is this thread's and we are inside its reentrancy guard (called from
    // `enter`): nothing else uses it during this capture (a signal handler's allocation is
    // deferred, captured into a buffer of its own). `intern` borrows the scratch's other
    // field only.
    let frames = unsafe { &mut (*scratch).frames };
    stack_id_into(g, t, start, frames)
}

/// [`stack_id`] with a buffer on the stack: a thread past its exit handler (a `thread_local`
/// destructor that allocates) has no scratch any more, and one whose scratch could not be
/// mapped never had one.
#[cold]
#[inline(never)]
fn stack_id_without_scratch(g: &Global, t: &Tls, start: Start) -> u32 {
    let mut frames = [0u64; MAX_FRAMES];
    stack_id_into(g, t, start, &mut frames)
}

/// [`stack_id`], capturing into `frames`.
#[inline(always)]
fn stack_id_into(g: &Global, t: &Tls, start: Start, frames: &mut [u64; MAX_FRAMES]) -> u32 {
    // Where stack reads must stop: the thread's stack top, or on another stack (a coroutine's,
    // a sigaltstack) the end of the memory readable above this frame.
    let marker = 0u8;
    let sp = std::hint::black_box(&marker) as *const u8 as usize;
    if t.bounds_pending.get() {
        t.settle_bounds(sp);
    }
    let hi = t.stack_limit(sp);
    let fp = match start {
        Start::FramePointer(fp) | Start::Here { fp, .. } => fp,
    };
    // The thread's CFI cache when the stack id may be kept in its memo (see below).
    #[cfg(target_arch = "x86_64")]
    let mut memo = None;
    // A capture with CPython's frames that the stack memo did not find: kept there once
    // interned.
    #[cfg(target_arch = "x86_64")]
    let mut pending = None;
    // No CPython frames were to be spliced when the capture began.
    #[cfg(target_arch = "x86_64")]
    let mut native_only = false;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the cache is this thread's, and we are inside its reentrancy guard (called from
    // `enter`): no other reference to it exists during this capture.
    let n = match (t.dwarf_cache().map(|c| unsafe { &mut *c }), start) {
        (Some(cache), start) => {
            let splice = crate::python::may_splice();
            // With CPython's frames spliced in, the thread's memo of whole stacks may hold this
            // one: then nothing is walked, spliced or interned.
            if splice {
                let regs = match start {
                    Start::FramePointer(fp) => [0, 0, fp as u64],
                    Start::Here { pc, sp, fp } => [pc, sp, fp as u64],
                };
                match crate::python::find_stack(t, regs, hi as u64) {
                    crate::python::Found::Id(id) => return id,
                    crate::python::Found::Miss(p) => pending = Some(p),
                    crate::python::Found::Off => {}
                }
            }
            // Without CPython's frames to splice in, a walk found in the memo with its stack id
            // is answered first, inline; else it need not write its frames out when the memo
            // has them: only the id is used (below).
            if let (false, Start::FramePointer(fp)) = (splice, start) {
                if let Some(id) = crate::dwarf::memo_id(fp, sp as u64, hi, cache) {
                    return id;
                }
            }
            cache.set_id_only(!splice);
            let n = cfi_walk(start, sp, hi, cache, frames);
            cache.set_id_only(false);
            // Code of an object loaded since the list was built (a library's constructor,
            // running inside dlopen before the hook's refresh): rebuild and walk again.
            let n = if crate::dwarf::take_stale(cache) {
                rewalk(t, start, sp, hi, cache, frames)
            } else {
                n
            };
            // Frames the walk found in its memo come with the id they were interned as,
            // unless CPython's frames are spliced in (they are not part of the walk).
            if !splice {
                if let Some(id) = cache.memo_stack() {
                    return id;
                }
            }
            native_only = !splice;
            memo = Some(cache);
            n
        }
        (None, _) => walk(fp, hi, frames),
    };
    #[cfg(not(target_arch = "x86_64"))]
    let n = walk(fp, hi, frames);
    let n = crate::python::splice(g, t, frames, n);
    let id = intern(g, t, &frames[..n]);
    // Kept only when nothing was spliced in: CPython's frames were not being recorded before
    // the splice (checked above) nor after it.
    #[cfg(target_arch = "x86_64")]
    if let Some(cache) = memo {
        if let Some(p) = pending {
            crate::python::keep_stack(t, p, cache, id);
        } else if native_only && id != u32::MAX && !crate::python::may_splice() {
            cache.set_memo_stack(id);
        }
    }
    id
}

/// A CFI walk from `start` (see [`crate::dwarf::walk_at`], reading the stack above `sp`,
/// and [`crate::dwarf::walk_from`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn cfi_walk(
    start: Start,
    sp: usize,
    hi: usize,
    cache: &mut crate::dwarf::Cache,
    frames: &mut [u64; MAX_FRAMES],
) -> usize {
    match start {
        Start::FramePointer(fp) => crate::dwarf::walk_at(fp, sp as u64, hi, cache, frames),
        Start::Here { pc, sp, fp } => crate::dwarf::walk_from(pc, sp, fp as u64, hi, cache, frames),
    }
}

/// Rebuilds the unwinder's object list and walks again (rare: see `stack_id`).
#[cfg(target_arch = "x86_64")]
#[cold]
#[inline(never)]
fn rewalk(
    t: &Tls,
    start: Start,
    sp: usize,
    hi: usize,
    cache: &mut crate::dwarf::Cache,
    frames: &mut [u64; MAX_FRAMES],
) -> usize {
    state::rebuild_unwind_tables(t);
    cfi_walk(start, sp, hi, cache, frames)
}

/// The stack id of `frames` (interned in the region if new), `u32::MAX` when not recorded.
fn intern(g: &Global, t: &Tls, frames: &[u64]) -> u32 {
    let h = hash_frames(frames);
    let scratch = t.scratch();
    if scratch.is_null() {
        // No cache (see `stack_id_without_scratch`): the region's own index answers.
        return match g.stacks.intern(&g.writer, h, frames) {
            Some(id) => id,
            None => {
                crate::region::table_full(&g.writer);
                u32::MAX
            }
        };
    }
    // SAFETY: the cache belongs to this thread and we are inside its reentrancy guard; the
    // caller's `frames` may be the scratch's other field, never this one.
    let cache = unsafe { &mut (*scratch).cache };
    let e = &mut cache[h as usize % cache.len()];
    if e.0 == h && h != 0 {
        return e.1;
    }
    match g.stacks.intern(&g.writer, h, frames) {
        Some(id) => {
            cache[h as usize % cache.len()] = (h, id);
            id
        }
        None => {
            crate::region::table_full(&g.writer);
            u32::MAX
        }
    }
}

#[inline(always)]
fn insert(
    g: &Global,
    t: &Tls,
    addr: u64,
    size: u64,
    at: u64,
    stack_of: impl FnOnce(&Global, &Tls) -> u32,
) {
    // The index line and the record this insert will write are likely not in the cache:
    // start loading both now, so the stack walk overlaps the memory latency.
    // (Blocks with trailers or headers, the common case, have no index entry.)
    if at == 0 && !header::on() {
        state::INDEX.prefetch(addr);
    }
    // Choosing the node (which may take the shared free-list lock) stays outside the operation
    // window a snapshot may wait on: recycling is safe whenever the lease allows it, and the
    // record's timestamp is still read inside the window.
    let node = take_node(g, t, t.last_now());
    if let Some(n) = node {
        g.writer.prefetch_node(n);
    }
    let stack = stack_of(g, t);
    let w: &RegionWriter = &g.writer;
    let held = acquire_slot(g, t);
    let (slot_idx, slot) = (held.idx, held.slot);
    // The index is private to this process: updating it (which may grow a shard) stays out of
    // the operation window a snapshot may wait on. Nobody can free `addr` before this call
    // returns, so indexing it before its record is published is safe; doing it first keeps
    // the index lock's locked instruction from waiting on the record's stores.
    let mut node = node;
    // A block with a trailer (see `trailer`) or a header (see `header`) keeps its record
    // number there, not in the index.
    // SAFETY: `addr` is a block just returned by the malloc family or CPython's allocator.
    let headed = at == header::JUST_HEADED
        || (at == 0 && header::on() && unsafe { header::read(addr) }.is_some());
    // A record of an earlier block at this address still live: that block went back to glibc
    // without the shim (the address index finds it; a trailer left behind names it).
    let mut closed = None;
    if at > header::JUST_HEADED {
        // glibc just handed out `addr`: a live record there is of a block freed without the
        // shim (`__libc_free` of a small block: helper L, 3, a million such frees left a
        // million live records and "region damaged").
        // SAFETY: `at` is the trailer's place the wrapper found for this block (see `trailer`).
        if let Some(m) = unsafe { trailer::left_at(at, addr) } {
            closed = live_at(w, m, addr).then_some(m);
        }
        if let Some(n) = node {
            // SAFETY: as above.
            unsafe { trailer::write(at, addr, n) };
        }
    } else if let (Some(n), true) = (node, headed) {
        // SAFETY: the block has a header (just read), written by the shim's allocation.
        unsafe { header::write(addr, n, header::size32(size)) };
    } else if let Some(n) = node {
        closed = match state::INDEX.insert(addr, n, size.min(u32::MAX as u64) as u32) {
            Ok(None) => {
                if state::sample_interval() != 0 {
                    state::PRESENCE.add(addr);
                }
                None
            }
            // The block at this address was freed behind our back: close its old record.
            Ok(Some(old)) => Some(old),
            // No memory for the index: the record could never be erased, so drop it.
            Err(crate::index::OutOfMemory) => {
                node = None;
                recycle_node(g, t, n);
                None
            }
        };
    }
    if let Some(c) = closed {
        RegionWriter::op_begin(slot, c);
        let (now, last) = w.stamp(now_ns());
        let old_size = w.erase_node(c, now);
        add(&slot.frees, 1);
        add(&slot.free_bytes, old_size);
        RegionWriter::op_end(slot);
        retire(g, t, c, last);
    }
    if stack != u32::MAX {
        // The thread's own stripe without a locked instruction, else the shared one.
        match t.stripe.get() {
            s if (s as usize) < vmo_layout::v1::STRIPES - 1 => {
                w.count_alloc_owned(stack, s as usize, size)
            }
            _ => w.count_alloc(stack, vmo_layout::v1::STRIPES - 1, size),
        }
    }
    RegionWriter::op_begin(slot, node.unwrap_or(u32::MAX));
    let (now, _) = w.stamp(now_ns());
    t.set_last_now(now);
    match node {
        Some(n) => {
            if !crate::ablate::on(crate::ablate::TABLE) {
                w.publish_node(n, addr, size, stack, t.tid(), now);
            }
            add(&slot.allocs, 1);
            add(&slot.alloc_bytes, size);
        }
        None => add(&slot.dropped, 1),
    }
    RegionWriter::op_end(slot);
    drop(held);
    if node.is_some() {
        state::note_allocated(g, t, size);
    }
    tick(g, t, slot_idx);
}

#[inline(always)]
fn erase(g: &Global, t: &Tls, addr: u64) -> Option<u64> {
    // SAFETY: `addr` is a block handed to the malloc family's free or realloc, or CPython's.
    let (n, size32) = match header::on().then(|| unsafe { header::read(addr) }) {
        // A header: the record it names, or none (not recorded: no index entry either).
        // SAFETY: the block has a header (just read).
        Some(Some((n, size32))) => return unsafe { erase_header(g, t, addr, n, size32) },
        _ => {
            let r = state::INDEX.remove(addr)?;
            if state::sample_interval() != 0 {
                state::PRESENCE.sub(addr);
            }
            r
        }
    };
    Some(close(g, t, n, size32))
}

/// Erases the record that block `addr`'s header names (`n`, [`header::NONE`]: none; `size32`
/// its size field): the header is rewritten naming none first. Returns the recorded size.
///
/// # Safety
/// Block `addr` has a header holding `n` and `size32` (just read by [`header::read`]).
#[inline(always)]
unsafe fn erase_header(g: &Global, t: &Tls, addr: u64, n: u32, size32: u32) -> Option<u64> {
    if n == header::NONE {
        return None;
    }
    // SAFETY: per the contract.
    unsafe { header::write(addr, header::NONE, size32) };
    Some(close(g, t, n, size32))
}

/// Whether record `n` is live and of the block at `addr`.
#[inline(always)]
fn live_at(w: &RegionWriter, n: u32, addr: u64) -> bool {
    (n as u64) < w.node_capacity() && {
        let node = w.node(n);
        node.address.load(Ordering::Relaxed) == addr
            && node.t_free.load(Ordering::Relaxed) == vmo_layout::v1::TIME_NONE
    }
}

/// Erases the record of block `addr`, whose trailer at `at` names record `n` ([`trailer::NONE`]:
/// none there, look in the address index). The trailer is trusted only when the record is live
/// and holds this address (see [`trailer`]: 1 in 2^32 blocks without a trailer seem to have
/// one); otherwise the block is looked up as one without a trailer. Returns the recorded size.
#[inline(always)]
fn erase_trailed(g: &Global, t: &Tls, addr: u64, n: u32, at: u64) -> Option<u64> {
    let w = &g.writer;
    let ours = n != trailer::NONE && (n as u64) < w.node_capacity() && {
        if crate::ablate::on(crate::ablate::TABLE) {
            return Some(close(g, t, n, u32::MAX));
        }
        let node = w.node(n);
        node.address.load(Ordering::Relaxed) == addr
            && node.t_free.load(Ordering::Relaxed) == vmo_layout::v1::TIME_NONE
    };
    if !ours {
        return erase(g, t, addr);
    }
    // Cleared before the record is stamped freed: a trailer names a record only while it is
    // live (a forked child relies on it), and costs no hash.
    // SAFETY: the trailer was just read at `at` for this block.
    unsafe { trailer::clear(at) };
    Some(close(g, t, n, u32::MAX))
}

/// Stamps record `n` freed (`size32`: the block's size from its header, `u32::MAX` to read it
/// from the record) and recycles it. Returns its size.
#[inline(always)]
fn close(g: &Global, t: &Tls, n: u32, size32: u32) -> u64 {
    let held = acquire_slot(g, t);
    let (slot_idx, slot) = (held.idx, held.slot);
    RegionWriter::op_begin(slot, n);
    let (now, last) = g.writer.stamp(now_ns());
    t.set_last_now(now);
    let size = if crate::ablate::on(crate::ablate::TABLE) {
        if size32 == u32::MAX {
            0
        } else {
            size32 as u64
        }
    } else if size32 == u32::MAX {
        g.writer.erase_node(n, now)
    } else {
        g.writer.mark_freed(n, now);
        size32 as u64
    };
    add(&slot.frees, 1);
    add(&slot.free_bytes, size);
    RegionWriter::op_end(slot);
    drop(held);
    retire(g, t, n, last);
    tick(g, t, slot_idx);
    size
}

/// A record whose block was just freed: recycled, unless a named snapshot taken while the
/// block was live needs it (then it is kept as it is, dead, for good).
///
/// `last` is the `named_last` the free saw when it stamped itself (`RegionWriter::stamp`).
/// Named snapshots are in the past of every free that sees them, so a record is needed iff
/// it was born at or before the latest one; `u64::MAX` (a named snapshot being taken) keeps
/// every record. Without named snapshots this costs nothing: `last` is 0.
#[inline]
fn retire(g: &Global, t: &Tls, n: u32, last: u64) {
    if last != 0 && keep_for_named(g, t, n, last) {
        return;
    }
    recycle_node(g, t, n);
}

#[cold]
#[inline(never)]
fn keep_for_named(g: &Global, t: &Tls, n: u32, last: u64) -> bool {
    let born = g.writer.node_t_alloc(n);
    if born > last {
        return false;
    }
    if g.writer.named_holding() {
        // Counted in batches: one shared update per 64 records kept.
        let k = t.named_held.get() + 1;
        if k < 64 {
            t.named_held.set(k);
        } else {
            t.named_held.set(0);
            g.writer.add_named_held(64);
        }
        return true;
    }
    // The limit is reached: recycle, and tell the named snapshots that needed it.
    g.writer.named_lost(born);
    false
}

/// Owner-only counter update: a load and a store, no locked instruction.
#[inline]
fn add(c: &std::sync::atomic::AtomicU64, v: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
}

/// Runs `f` with the global and thread state unless recording is off, not yet possible, or the
/// thread is already inside the shim (then the call is not recorded and `None` returned).
#[inline]
pub fn enter<R>(f: impl FnOnce(&'static Global, &Tls) -> R) -> Option<R> {
    enter_as(false, f)
}

/// As [`enter`], and also inside a wrapper's forwarded call ([`state::forwarding`]): for the
/// records of blocks that are not the wrapper's own (it closes its block's record before
/// forwarding), such as the interpreter's own tables that its allocator reallocates or frees
/// meanwhile (pymalloc's `arenas` array, grown by `realloc` inside an object allocation).
/// Without this the old block's record would stay live after glibc took it back.
#[inline]
pub fn enter_forwarded<R>(f: impl FnOnce(&'static Global, &Tls) -> R) -> Option<R> {
    enter_as(true, f)
}

#[inline(always)]
fn enter_as<R>(forwarded: bool, f: impl FnOnce(&'static Global, &Tls) -> R) -> Option<R> {
    let g = match shared::global() {
        Some(g) => g,
        None => {
            // Disabled (HEAPDUMP_DISABLE=1, a failed start-up) or another thread is starting
            // up: a plain load and a jump, no locked instruction on the shared state word.
            if shared::STATE.load(Ordering::Relaxed) != shared::UNINIT
                || state::WAIT_FOR_START.load(Ordering::Relaxed)
            {
                return None;
            }
            state::init();
            shared::global()?
        }
    };
    shared::with_tls(|t| {
        let guard = t.guard.get();
        // The guard to go back to: a forwarded call goes on once this record is made.
        let outer = guard;
        if guard != shared::GUARD_FREE && !(forwarded && guard == shared::GUARD_FORWARD) {
            if guard != shared::GUARD_FORWARD {
                state::NESTED.fetch_add(1, Ordering::Relaxed);
            }
            return None;
        }
        // After the guard: the shim's own allocations in a forked child, before its fork
        // handler has moved it to a region of its own, are not the program's.
        if !crate::fork::same_process() {
            crate::fork::foreign_child(g);
            return None;
        }
        t.guard.set(shared::GUARD_RECORDING);
        if t.slot.get() == 0 {
            shared::internal(t, || state::register_thread(g, t));
        }
        let r = f(g, t);
        // Record what signal handlers did meanwhile, until none did since the last look.
        loop {
            let d = t.deferred.get();
            if !d.is_null() {
                // SAFETY: this thread's queue; handlers only append (see `Deferred`).
                drain(unsafe { &*d }, g, t);
            }
            t.guard.set(outer);
            std::sync::atomic::compiler_fence(Ordering::SeqCst);
            // SAFETY: as above.
            if d.is_null() || unsafe { (*d).is_empty() } {
                break;
            }
            t.guard.set(shared::GUARD_RECORDING);
        }
        Some(r)
    })
}

/// Records every call queued in `d` (oldest first), including those handlers add meanwhile.
fn drain(d: &Deferred, g: &'static Global, t: &Tls) {
    while let Some(op) = d.pop() {
        if op.size == FREE_OP || op.size == FREE_HELD {
            erase_deferred(g, t, op.ptr, op.size == FREE_HELD);
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
            insert_deferred(g, t, op.ptr, op.size, &op.frames[..n]);
        }
    }
    let lost = d.take_lost();
    if lost != 0 {
        let held = acquire_slot(g, t);
        held.slot.dropped.store(
            held.slot.dropped.load(Ordering::Relaxed) + lost,
            Ordering::Relaxed,
        );
    }
}

// ---- CPython's allocator domains ---------------------------------------------------------

/// What `python` installs as the MEM and OBJ domains' allocator once the interpreter is up.
static PY_WRAPPERS: Wrappers = Wrappers {
    malloc: py_malloc,
    calloc: py_calloc,
    realloc: py_realloc,
    free: py_free,
};

#[inline(never)]
unsafe extern "C" fn py_malloc(ctx: *mut c_void, size: usize) -> *mut c_void {
    let fp = crate::frame_pointer!();
    // SAFETY: CPython calls us with the ctx we installed; the original is complete.
    let o = unsafe { python::orig(ctx) };
    // SAFETY: forwarding the caller's arguments to the original allocator.
    let p = state::forwarding(|| unsafe { (o.malloc.unwrap_unchecked())(o.ctx, size) });
    record_py_block(ctx, p, size, fp);
    p
}

/// Records block `p` of `size` bytes a wrapped domain's allocator just made: in its trailer
/// when the domain hands out glibc's blocks (see `python::glibc_backed`) and the block has
/// room for one past those bytes, else in the address index.
///
/// Why the room is checked: the preloaded `malloc` and `calloc` ask glibc for 8 bytes more,
/// but `realloc` of a block without a mark (one the address index holds) is glibc's own, and
/// may leave fewer than 8 bytes after the program's (49 bytes: a 64-byte chunk, 56 usable). A
/// trailer written there overwrote the program's last bytes, and the program's next write
/// there broke the trailer, so the block's record was never closed: two live records at one
/// address, "region damaged" (seen on CPython 3.11.7, `PYTHONMALLOC=malloc`, a `bytes`
/// object resized in place while the main script compiled).
#[inline(always)]
fn record_py_block(ctx: *mut c_void, p: *mut c_void, size: usize, fp: usize) {
    if python::glibc_backed(ctx) && !p.is_null() {
        // SAFETY: the domain's blocks are glibc's (see `python::glibc_domain`): the chunk
        // header precedes `p`.
        let at = unsafe { trailer::locate(p as u64) };
        if at != 0 && at >= (p as u64).saturating_add(size as u64) {
            record_alloc_trailed(p as *mut u8, size, fp, at);
            return;
        }
    }
    record_alloc(p as *mut u8, size, fp);
}

#[inline(never)]
unsafe extern "C" fn py_calloc(ctx: *mut c_void, n: usize, size: usize) -> *mut c_void {
    let fp = crate::frame_pointer!();
    // SAFETY: as in py_malloc.
    let o = unsafe { python::orig(ctx) };
    // SAFETY: as in py_malloc.
    let p = state::forwarding(|| unsafe { (o.calloc.unwrap_unchecked())(o.ctx, n, size) });
    record_py_block(ctx, p, n.wrapping_mul(size), fp);
    p
}

#[inline(never)]
unsafe extern "C" fn py_realloc(ctx: *mut c_void, ptr: *mut c_void, size: usize) -> *mut c_void {
    let fp = crate::frame_pointer!();
    // SAFETY: as in py_malloc.
    let o = unsafe { python::orig(ctx) };
    // SAFETY: a block handed to the wrapped domain's realloc.
    unsafe { python::note_free(ctx, ptr) };
    // A domain of glibc's blocks: the preloaded `realloc` closes the record, from the block's
    // trailer or the address index (below).
    let old = if python::glibc_backed(ctx) {
        None
    } else {
        record_free(ptr as *mut u8)
    };
    // A block with a record in its trailer (made by the interpreter's own `malloc` calls, not
    // through this wrapper) is not found above: the shim cannot tell whether `ptr` is glibc's
    // block (CPython's small-object allocator's are not). The preloaded `realloc` it reaches
    // closes that record and leaves the new block to this wrapper (see `record_free_trailed`).
    shared::with_tls(|t| {
        t.py_realloc.set(ptr as u64);
        t.py_closed.set(u64::MAX);
    });
    // SAFETY: as in py_malloc.
    let q = state::forwarding(|| unsafe { (o.realloc.unwrap_unchecked())(o.ctx, ptr, size) });
    let closed = shared::with_tls(|t| {
        t.py_realloc.set(0);
        t.py_skip.set(false);
        t.py_closed.replace(u64::MAX)
    });
    let old = old.or((closed != u64::MAX).then_some(closed));
    if !q.is_null() {
        record_py_block(ctx, q, size, fp);
    } else if let Some(old_size) = old {
        // Failure leaves the old block valid: record it again.
        record_alloc(ptr as *mut u8, old_size as usize, fp);
    }
    q
}

#[inline(never)]
unsafe extern "C" fn py_free(ctx: *mut c_void, ptr: *mut c_void) {
    // SAFETY: as in py_malloc.
    let o = unsafe { python::orig(ctx) };
    // SAFETY: a block handed to the wrapped domain's free.
    unsafe { python::note_free(ctx, ptr) };
    // A domain of glibc's blocks: the preloaded `free` closes the record, from the block's
    // trailer or the address index, before glibc gets the block.
    if !python::glibc_backed(ctx) {
        record_free(ptr as *mut u8);
    }
    // SAFETY: as in py_malloc.
    state::forwarding(|| unsafe { (o.free.unwrap_unchecked())(o.ctx, ptr) });
}
