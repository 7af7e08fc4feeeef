//! `libheapdump.so`: load it with `LD_PRELOAD` (or `heapdump run`) to record every live
//! allocation of a dynamically linked program.
//!
//! Exports `malloc free calloc realloc reallocarray posix_memalign aligned_alloc memalign valloc
//! pvalloc malloc_usable_size`, forwarding to glibc's allocator through its `__libc_*` entry
//! points (no `dlsym` during start-up), and `dlopen`/`dlclose`, forwarding to the next definition
//! and then refreshing the module table. C++ `new`/`delete` reach these through libstdc++.
//! A constructor starts recording as soon as the library is loaded; when it is `dlopen`ed by
//! `heapdump attach` instead, recording starts in the attach entry ([`attach`]).

#![deny(unsafe_op_in_unsafe_fn)]
// No `unwrap` in the shim: it runs inside other programs' `malloc` (issue 22 A4). Tests may.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use heapdump_instrumentation::frame_pointer;
use heapdump_instrumentation::header;
use heapdump_instrumentation::hooks::{
    record_alloc, record_alloc_trailed, record_free, record_free_deferrable_header,
    record_free_deferrable_plain, record_free_deferrable_trailed, record_free_headed,
    record_free_trailed, record_realloc, record_realloc_trailed, record_sampled, sample_next,
};
use heapdump_instrumentation::trailer;
use libc::{c_char, c_int, c_void, size_t};
use std::sync::atomic::{AtomicUsize, Ordering};

pub mod attach;
pub mod exec;
mod got;

extern "C" {
    fn __libc_malloc(size: size_t) -> *mut c_void;
    fn __libc_free(ptr: *mut c_void);
    fn __libc_calloc(n: size_t, size: size_t) -> *mut c_void;
    fn __libc_realloc(ptr: *mut c_void, size: size_t) -> *mut c_void;
    fn __libc_memalign(align: size_t, size: size_t) -> *mut c_void;
    fn __libc_valloc(size: size_t) -> *mut c_void;
    fn __libc_pvalloc(size: size_t) -> *mut c_void;
}

/// `malloc(3)`: sampling mode's unsampled case from a few instructions, the rest in
/// [`malloc_slow`].
///
/// Written in assembly because the Rust function's prologue saved five registers on every
/// call for the sake of its slow path (the thread-state read clobbers the C ABI's scratch
/// registers), and a split into two Rust functions cost the recording path a call layer (+4.7 M
/// instructions on bench/storm.c, 200,000 operations). This entry reads
/// `state::MALLOC_FAST`; when set, it counts `size` down from the thread's distance to its next
/// sampled byte exactly as `state::skip_sample` does and, when the block is not sampled, stores
/// the distance and jumps to `__libc_malloc`. Anything else (recording every block, the thread
/// without state yet, a sample due) jumps to [`malloc_slow`] with the stack as the caller left
/// it, so its frame pointer and return address are what they were for the Rust `malloc`.
/// Nothing is pushed but `rdi` around the thread-state descriptor call (keeping the stack
/// 16-byte aligned for it); the CFI says so.
///
/// # Safety
/// As `malloc(3)`.
#[cfg(all(target_arch = "x86_64", not(test)))]
// SAFETY: the body follows the C ABI for `malloc`: it reads `rdi` and its own statics and TLS
// word, keeps `rdi` across the descriptor call (which preserves every other general register)
// and leaves by a jump with the stack as it came in, to `__libc_malloc` or `malloc_slow`, both
// of `malloc`'s signature; the CFI describes the one push.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn malloc(size: size_t) -> *mut c_void {
    // rustc gives a naked function no CFI of its own: the directives are written here.
    core::arch::naked_asm!(
        ".cfi_startproc",
        "cmp byte ptr [rip + {fast}], 0",
        "je 2f",
        "push rdi",
        ".cfi_adjust_cfa_offset 8",
        "lea rax, [rip + heapdump_self@TLSDESC]",
        "call qword ptr [rax + heapdump_self@TLSCALL]",
        "pop rdi",
        ".cfi_adjust_cfa_offset -8",
        "mov rax, qword ptr fs:[rax]",
        "test rax, rax",
        "jz 2f",
        "mov rcx, qword ptr [rax + {left}]",
        // i64::MIN: the thread has no distance yet.
        "mov rdx, rcx",
        "neg rdx",
        "jo 2f",
        // `vmo_layout::sampling::count_down`: left - min(size, i64::MAX / 2).
        "movabs rdx, 0x3fffffffffffffff",
        "cmp rdi, rdx",
        "cmovb rdx, rdi",
        "sub rcx, rdx",
        "test rcx, rcx",
        "jle 2f",
        "mov qword ptr [rax + {left}], rcx",
        "jmp qword ptr [rip + {libc_malloc}@GOTPCREL]",
        "2:",
        "jmp {slow}",
        ".cfi_endproc",
        fast = sym heapdump_instrumentation::state::MALLOC_FAST,
        left = const heapdump_instrumentation::state::SAMPLE_LEFT_OFFSET,
        libc_malloc = sym __libc_malloc,
        slow = sym malloc_slow,
    )
}

/// `malloc(3)` (elsewhere than x86-64, and in unit tests).
///
/// # Safety
/// As `malloc(3)`.
#[cfg(not(all(target_arch = "x86_64", not(test))))]
#[cfg_attr(not(test), no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn malloc(size: size_t) -> *mut c_void {
    // SAFETY: as `malloc(3)`.
    unsafe { malloc_impl(size) }
}

/// The rest of [`malloc`], jumped to with the caller's stack (its frame pointer is `malloc`'s).
///
/// # Safety
/// As `malloc(3)`.
#[cfg(all(target_arch = "x86_64", not(test)))]
#[inline(never)]
unsafe extern "C" fn malloc_slow(size: size_t) -> *mut c_void {
    // SAFETY: as `malloc(3)`.
    unsafe { malloc_impl(size) }
}

/// `malloc`'s work, inlined into the function whose frame pointer it reads.
///
/// # Safety
/// As `malloc(3)`.
#[inline(always)]
unsafe fn malloc_impl(size: size_t) -> *mut c_void {
    let fp = frame_pointer!();
    if header::on() {
        if header::sampled_only() && !sample_next(size) {
            // Sampling mode, not sampled: glibc's block as it is, no mark, no record.
            // SAFETY: forwarding to glibc with the caller's arguments.
            return unsafe { __libc_malloc(size) };
        }
        // SAFETY: `malloc`'s contract; glibc's `malloc` allocates.
        let (p, at) = unsafe { new_marked(size, __libc_malloc) };
        if heapdump_instrumentation::ablate::on(heapdump_instrumentation::ablate::RECORD) {
            return p;
        }
        record_marked(p, size, fp, false, at);
        return p;
    }
    // SAFETY: forwarding to glibc with the caller's arguments.
    let p = unsafe { __libc_malloc(size) };
    if !attach::from_loader(fp) {
        record_alloc(p as *mut u8, size, fp);
    }
    p
}

/// A new block of `size` bytes with room for its record number (ENOMEM and null when that
/// overflows): a small one (up to `trailer::MAX_REQUEST` bytes) with 8 bytes for a trailer at
/// the end of glibc's usable area, written when it is recorded; a larger one 16 bytes into
/// glibc's block, after a header written now as not yet recorded (see
/// `heapdump_instrumentation::trailer` and `header`). Returns the block and its trailer's
/// address (0: a block glibc made larger than a trailer's chunk, which is indexed;
/// `header::JUST_HEADED`: a header).
///
/// # Safety
/// `alloc` is `__libc_malloc`, or a zeroing allocation of that many bytes.
#[inline(always)]
unsafe fn new_marked(
    size: size_t,
    alloc: unsafe extern "C" fn(size_t) -> *mut c_void,
) -> (*mut c_void, u64) {
    // Sampling mode: headers only (see `mark_of`).
    if size <= trailer::MAX_REQUEST && trailer::on() {
        // SAFETY: per the contract; `size + 8` does not overflow.
        let p = unsafe { alloc(size + trailer::SIZE) };
        // SAFETY: `p` is null or a block of at least `size + 8` bytes just made by glibc.
        return (p, unsafe { trailed(p) });
    }
    let Some(total) = size.checked_add(header::SIZE) else {
        set_errno(libc::ENOMEM);
        return (std::ptr::null_mut(), 0);
    };
    // SAFETY: per the contract, with room for the header.
    let q = unsafe { alloc(total) };
    // SAFETY: `q` is null or a block of `size + 16` bytes.
    (unsafe { headed(q, size) }, header::JUST_HEADED)
}

/// `__libc_calloc(1, n)`, for [`new_marked`].
unsafe extern "C" fn zeroed(n: size_t) -> *mut c_void {
    // SAFETY: forwarding to glibc.
    unsafe { __libc_calloc(1, n) }
}

/// Records block `p` just made by [`new_marked`] (`at`: its trailer, `header::JUST_HEADED`, or 0): sampled already in
/// sampling mode ([`header::sampled_only`]: only sampled blocks get a mark), else every block
/// is recorded. `forwarded`: it replaces a recorded block (`realloc`).
#[inline(always)]
fn record_marked(p: *mut c_void, size: size_t, fp: usize, forwarded: bool, at: u64) {
    if header::sampled_only() {
        record_sampled(p as *mut u8, size, fp, forwarded, at);
    } else if forwarded {
        record_realloc_trailed(p as *mut u8, size, fp, at);
    } else {
        record_alloc_trailed(p as *mut u8, size, fp, at);
    }
}

/// Where the trailer of block `p` just made by glibc goes (0 for null, or for a chunk too large
/// for one). The record's insert writes it (see `hooks::record_alloc_trailed`); a block left
/// unrecorded (sampling, a forwarded call, a full table) gets none and is treated as one
/// without a trailer.
///
/// # Safety
/// `p` is null or a block of at least `size + 8` bytes just returned by glibc, `size` what the
/// program asked for.
#[inline(always)]
unsafe fn trailed(p: *mut c_void) -> u64 {
    if p.is_null() {
        return 0;
    }
    // SAFETY: per the contract: glibc's chunk header precedes `p`, and its last 8 usable
    // bytes are past what the program asked for.
    unsafe { trailer::locate(p as u64) }
}

/// The program's block in glibc's block `q` (null stays null), its header written as not yet
/// recorded (see `heapdump_instrumentation::header`).
///
/// # Safety
/// `q` is null or a block of at least `size + 16` bytes just returned by glibc.
#[inline(always)]
unsafe fn headed(q: *mut c_void, size: size_t) -> *mut c_void {
    if q.is_null() {
        return q;
    }
    // SAFETY: per the contract, q .. q + 16 is the header's room.
    unsafe {
        let p = (q as *mut u8).add(header::SIZE);
        header::write(p as u64, header::NONE, header::size32(size as u64));
        p as *mut c_void
    }
}

/// Where a block keeps its record number.
#[derive(Clone, Copy)]
enum Mark {
    /// Nowhere: the address index.
    None,
    /// A header before it, naming a record (or `header::NONE`) and the block's size (see
    /// `header::read`): glibc's block is 16 bytes lower.
    Header(u32, u32),
    /// A trailer at the address given, naming a record.
    Trailer(u32, u64),
}

/// The mark of block `p`. The word at `p - 8` tells a header (see `header::marked`) from glibc's
/// chunk header, from which a trailer is found. In sampling mode, where most blocks have no
/// mark, sampled blocks get headers only: a free of an unsampled block then reads only the
/// word glibc's own free reads first, and no block's last word (nor, for a trailer's check,
/// the record it would name).
///
/// # Safety
/// `p` is null or a pointer the program hands to `free`, `realloc` or `malloc_usable_size`
/// (see `header::read` and `trailer::read`).
#[inline(always)]
unsafe fn mark_of(p: *mut c_void) -> Mark {
    if !header::on() {
        return Mark::None;
    }
    // SAFETY: per the contract.
    unsafe {
        if let Some((n, size32)) = header::read(p as u64) {
            return Mark::Header(n, size32);
        }
        if !trailer::on() {
            return Mark::None;
        }
        match trailer::read(p as u64) {
            Some((n, at)) => Mark::Trailer(n, at),
            None => Mark::None,
        }
    }
}

/// Gives block `p` back to glibc, its mark cleared first. Its record (if any) was closed.
///
/// # Safety
/// As `free(3)`; `m` is `p`'s mark.
#[inline(always)]
unsafe fn release(p: *mut c_void, m: Mark) {
    // SAFETY: per the contract.
    unsafe {
        match m {
            Mark::None => __libc_free(p),
            Mark::Header(..) => {
                header::clear(p as u64);
                __libc_free((p as *mut u8).sub(header::SIZE) as *mut c_void);
            }
            Mark::Trailer(_, at) => {
                trailer::clear(at);
                __libc_free(p);
            }
        }
    }
}

/// What the deferred free of a signal handler's block calls once its record is closed (see
/// `state::set_real_free`): its mark is cleared and glibc gets it.
unsafe extern "C" fn free_block(p: *mut c_void) {
    // SAFETY: `p` is a block the program freed, held back until now.
    unsafe { release(p, mark_of(p)) }
}

/// `free(3)`: sampling mode's unsampled case from a few instructions, the rest in
/// [`free_recorded`].
///
/// Written in assembly for the reason [`malloc`] is. When `state::FREE_FAST` is set
/// (sampling mode, headers on sampled blocks only), a block whose chunk-header word at
/// `ptr - 8` has bit 3 clear (no header: see `header::marked`), or a pointer that cannot have
/// a header (null, misaligned, below 4096), goes straight to `__libc_free` while no address is
/// indexed (`PRESENCE`'s count is 0), as `unsampled` decides elsewhere. Anything else jumps
/// to [`free_recorded`] with the stack as the caller left it, and as its frame pointer the
/// address below the return address (where a frame pointer pushed at entry would be).
///
/// # Safety
/// As `free(3)`.
#[cfg(all(target_arch = "x86_64", not(test)))]
// SAFETY: the body follows the C ABI for `free`: it reads `rdi`, its own statics and, for a
// 16-aligned pointer of at least 4096, the byte at `ptr - 8` that glibc's `free` reads first;
// it leaves by a jump with the stack as it came in, to `__libc_free` (same signature) or to
// `free_recorded` with `rsi` set to the frame-pointer position that function expects.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    // rustc gives a naked function no CFI of its own: the directives are written here.
    core::arch::naked_asm!(
        ".cfi_startproc",
        "cmp byte ptr [rip + {fast}], 0",
        "je 2f",
        // Null, misaligned or in the first page: no header is read (`header::read`).
        "test dil, 15",
        "jnz 3f",
        "cmp rdi, 4096",
        "jb 3f",
        "test byte ptr [rdi - 8], 8",
        "jnz 2f",
        "3:",
        "cmp qword ptr [rip + {presence} + {live}], 0",
        "jne 2f",
        "jmp qword ptr [rip + {libc_free}@GOTPCREL]",
        "2:",
        "lea rsi, [rsp - 8]",
        "jmp {slow}",
        ".cfi_endproc",
        fast = sym heapdump_instrumentation::state::FREE_FAST,
        presence = sym heapdump_instrumentation::state::PRESENCE,
        live = const heapdump_instrumentation::state::PRESENCE_LIVE_OFFSET,
        libc_free = sym __libc_free,
        slow = sym free_recorded,
    )
}

/// `free(3)` (elsewhere than x86-64, and in unit tests).
///
/// # Safety
/// As `free(3)`.
#[cfg(not(all(target_arch = "x86_64", not(test))))]
#[cfg_attr(not(test), no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    // SAFETY: as `free(3)`.
    unsafe { free_slow(ptr) }
}

/// The Rust [`free`]'s work.
///
/// # Safety
/// As `free(3)`.
#[cfg(not(all(target_arch = "x86_64", not(test))))]
#[inline(always)]
unsafe fn free_slow(ptr: *mut c_void) {
    // Sampling mode's common case: a block without a mark and not in the address index was
    // never sampled, and glibc gets it at once. Everything else is `free_recorded`, out of
    // line, so that this path saves no registers (bench/storm.c sampled at 512 KiB,
    // cachegrind: the prologue and epilogue were 15 of its ~40 instructions).
    // SAFETY: the caller's pointer for free.
    if unsafe { unsampled(ptr) } {
        // SAFETY: forwarding to glibc with the caller's argument (as for a call from the
        // loader, see `free_recorded`).
        return unsafe { __libc_free(ptr) };
    }
    // Called or jumped to, `free_recorded` finds the return address into the caller where
    // `fp` says: a jump leaves that word in place.
    // SAFETY: the caller's pointer, passed on.
    unsafe { free_recorded(ptr, frame_pointer!()) }
}

/// Whether block `p` (given to `free`) is certainly one sampling mode did not sample: sampling
/// mode (marks on sampled blocks only, no trailers), no header on `p`, and nothing indexed at
/// its address (sampled blocks without room for a header, such as `memalign`'s).
///
/// # Safety
/// As [`mark_of`].
#[cfg(not(all(target_arch = "x86_64", not(test))))]
#[inline(always)]
unsafe fn unsampled(p: *mut c_void) -> bool {
    header::on()
        && header::sampled_only()
        && !trailer::on()
        // SAFETY: per the contract.
        && unsafe { header::read(p as u64) }.is_none()
        && heapdump_instrumentation::hooks::certainly_unindexed(p as u64)
}

/// The rest of [`free`] (`fp`: its frame pointer, or where one would be).
///
/// # Safety
/// As `free(3)`; the word above `fp` is the return address into `free`'s caller (the Rust
/// `free`'s frame pointer; from the assembly entry, the address below its return address).
#[inline(never)]
unsafe extern "C" fn free_recorded(ptr: *mut c_void, fp: usize) {
    if attach::from_loader(fp) {
        // SAFETY: forwarding to glibc with the caller's argument.
        return unsafe { __libc_free(ptr) };
    }
    // glibc >= 2.33 keeps errno across free (POSIX.1-2024 requires it); so does the recording:
    // its own work that may fail a system call (start-up, thread registration) restores errno.
    // A signal handler that interrupted this thread's recording: the shim frees the block
    // when the interrupted operation ends, after closing its record.
    // SAFETY: the caller's pointer for free (see `mark_of`).
    let m = unsafe { mark_of(ptr) };
    if heapdump_instrumentation::ablate::on(heapdump_instrumentation::ablate::RECORD) {
        // SAFETY: the caller's pointer and its mark (benchmark ablation: nothing recorded).
        return unsafe { release(ptr, m) };
    }
    let held = match m {
        // SAFETY: `m` was just read from the block's header.
        Mark::Header(n, size32) => unsafe {
            record_free_deferrable_header(ptr as *mut u8, n, size32)
        },
        Mark::Trailer(n, at) => record_free_deferrable_trailed(ptr as *mut u8, n, at),
        Mark::None => record_free_deferrable_plain(ptr as *mut u8),
    };
    if !held {
        // SAFETY: the caller's pointer, its mark; its record (if any) was just closed.
        unsafe { release(ptr, m) };
    }
}

/// `calloc(3)`.
///
/// # Safety
/// As `calloc(3)`.
#[cfg_attr(not(test), no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn calloc(n: size_t, size: size_t) -> *mut c_void {
    let fp = frame_pointer!();
    if header::on() {
        let bytes = n.checked_mul(size);
        if header::sampled_only() && !sample_next(bytes.unwrap_or(0)) {
            // SAFETY: forwarding to glibc (which checks n * size for overflow).
            return unsafe { __libc_calloc(n, size) };
        }
        let Some(bytes) = bytes else {
            set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        };
        // SAFETY: `calloc`'s contract; a zeroing allocation (the mark's room zeroed too, then
        // written).
        let (p, at) = unsafe { new_marked(bytes, zeroed) };
        record_marked(p, bytes, fp, false, at);
        return p;
    }
    // SAFETY: forwarding to glibc (which checks n * size for overflow).
    let p = unsafe { __libc_calloc(n, size) };
    if !attach::from_loader(fp) {
        record_alloc(p as *mut u8, n.wrapping_mul(size), fp);
    }
    p
}

/// `realloc(3)`: the old block's record is closed before glibc may hand its address to another
/// thread, and the new block recorded after.
///
/// # Safety
/// As `realloc(3)`.
#[cfg_attr(not(test), no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: size_t) -> *mut c_void {
    let fp = frame_pointer!();
    if attach::from_loader(fp) {
        // SAFETY: forwarding to glibc with the caller's arguments.
        return unsafe { __libc_realloc(ptr, size) };
    }
    // SAFETY: the caller's contract for realloc.
    unsafe { realloc_impl(ptr, size, fp) }
}

/// # Safety
/// As `realloc(3)`; `fp` is the exported function's frame pointer.
#[inline(always)]
unsafe fn realloc_impl(ptr: *mut c_void, size: size_t, fp: usize) -> *mut c_void {
    if header::on() {
        if ptr.is_null() {
            if header::sampled_only() && !sample_next(size) {
                // SAFETY: forwarding to glibc, as malloc(size).
                return unsafe { __libc_malloc(size) };
            }
            // SAFETY: as in malloc.
            let (p, at) = unsafe { new_marked(size, __libc_malloc) };
            record_marked(p, size, fp, false, at);
            return p;
        }
        // SAFETY: the caller's pointer for realloc.
        match unsafe { mark_of(ptr) } {
            // SAFETY: as above; the block has a header.
            Mark::Header(..) => return unsafe { realloc_headed(ptr, size, fp) },
            // SAFETY: as above; `at` is its trailer, naming `n`.
            Mark::Trailer(n, at) => return unsafe { realloc_trailed(ptr, n, at, size, fp) },
            Mark::None if header::sampled_only() => {
                // SAFETY: as above; `ptr` has no mark.
                return unsafe { realloc_sampling(ptr, size, fp) };
            }
            // A block without a mark (allocated before the shim started, aligned, or made
            // larger than asked by glibc) stays without one: glibc's realloc, recorded
            // through the address index.
            Mark::None => {}
        }
    }
    let old = record_free(ptr as *mut u8);
    // SAFETY: forwarding to glibc with the caller's arguments.
    let q = unsafe { __libc_realloc(ptr, size) };
    if !q.is_null() {
        if old.is_some() {
            record_realloc(q as *mut u8, size, fp);
        } else {
            record_alloc(q as *mut u8, size, fp);
        }
    } else if let (Some(old_size), false) = (old, size == 0) {
        // Failure leaves the old block valid: record it again.
        record_realloc(ptr as *mut u8, old_size as usize, fp);
    }
    q
}

/// `realloc` of a block with a header: glibc reallocates the whole (header included), and the
/// header is written again for the new address (whatever the new size: the mark is decided
/// when a block is made). `realloc(p, 0)` frees `p` and returns null, as glibc's does.
///
/// # Safety
/// As `realloc(3)`; `ptr` has a header.
#[inline(always)]
unsafe fn realloc_headed(ptr: *mut c_void, size: size_t, fp: usize) -> *mut c_void {
    if size == 0 {
        // SAFETY: as free(ptr), which is what glibc's realloc(ptr, 0) does.
        unsafe { free(ptr) };
        return std::ptr::null_mut();
    }
    let Some(total) = size.max(16).checked_add(header::SIZE) else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    let old = record_free_headed(ptr as *mut u8);
    // SAFETY: glibc's block is ptr - 16 (it has a header); forwarding with room for it.
    let q = unsafe { __libc_realloc((ptr as *mut u8).sub(header::SIZE) as *mut c_void, total) };
    if q.is_null() {
        // Failure leaves the old block, and its header, valid: record it again.
        if let Some(old_size) = old {
            record_realloc(ptr as *mut u8, old_size as usize, fp);
        }
        return q;
    }
    // SAFETY: `q` is a block of `size + 16` bytes.
    let p = unsafe { headed(q, size) };
    // Sampling mode: the block keeps its header whether or not its new size is sampled.
    if old.is_some() {
        record_realloc(p as *mut u8, size, fp);
    } else {
        record_alloc(p as *mut u8, size, fp);
    }
    p
}

/// `realloc` of a block with a trailer at `at` naming record `n`. Up to
/// `trailer::MAX_REQUEST` bytes, glibc reallocates the block with room for a trailer, written
/// again at the new block's end (where glibc made a larger chunk than a trailer's, the new
/// block is indexed); beyond, the block moves into a new one with a header (`realloc` may
/// always move; the old block is at most `MAX_REQUEST` bytes). `realloc(p, 0)` frees `p` and
/// returns null, as glibc's does.
///
/// # Safety
/// As `realloc(3)`; `ptr` has a trailer at `at` naming `n`.
#[inline(always)]
unsafe fn realloc_trailed(
    ptr: *mut c_void,
    n: u32,
    at: u64,
    size: size_t,
    fp: usize,
) -> *mut c_void {
    if size == 0 {
        // SAFETY: as free(ptr), which is what glibc's realloc(ptr, 0) does.
        unsafe { free(ptr) };
        return std::ptr::null_mut();
    }
    let old = record_free_trailed(ptr as *mut u8, n, at);
    let (q, new_at) = if size <= trailer::MAX_REQUEST {
        // SAFETY: the trailer is the shim's; glibc may now move, grow or shrink the block (a
        // shrink in place may hand the trailer's bytes to a new free chunk).
        let q = unsafe {
            trailer::clear(at);
            __libc_realloc(ptr, size + trailer::SIZE)
        };
        // SAFETY: `q` is null or a block of at least `size + 8` bytes just made by glibc.
        (q, unsafe { trailed(q) })
    } else {
        // SAFETY: a new block with a header; the old block's bytes before its trailer are the
        // program's, the two blocks distinct; then the old block goes back to glibc, as
        // glibc's realloc does when it moves.
        unsafe {
            let (q, _) = new_marked(size, __libc_malloc);
            if !q.is_null() {
                let keep = ((at - ptr as u64) as usize).min(size);
                std::ptr::copy_nonoverlapping(ptr as *const u8, q as *mut u8, keep);
                trailer::clear(at);
                __libc_free(ptr);
            }
            (q, 0)
        }
    };
    if q.is_null() {
        // Failure leaves the old block valid: recorded again (its trailer written again).
        if let Some(old_size) = old {
            record_realloc_trailed(ptr as *mut u8, old_size as usize, fp, at);
        }
        return q;
    }
    // Sampling mode: the block keeps a mark whether or not its new size is sampled.
    if old.is_some() {
        record_realloc_trailed(q as *mut u8, size, fp, new_at);
    } else {
        record_alloc_trailed(q as *mut u8, size, fp, new_at);
    }
    q
}

/// Sampling mode with marks: `realloc` of a block without one (not sampled, or of the
/// `memalign` family). The new block is sampled by its size like any allocation: a sampled one
/// is moved into a block with a mark (`realloc` may always move), any other is glibc's
/// `realloc` of the block as it is.
///
/// # Safety
/// As `realloc(3)`; `ptr` is not null and has no mark.
#[inline(never)]
unsafe fn realloc_sampling(ptr: *mut c_void, size: size_t, fp: usize) -> *mut c_void {
    let old = record_free(ptr as *mut u8);
    if size == 0 || !sample_next(size) {
        // SAFETY: forwarding to glibc with the caller's arguments.
        let q = unsafe { __libc_realloc(ptr, size) };
        if q.is_null() && size != 0 {
            if let Some(old_size) = old {
                // Failure leaves the old block valid: record it again.
                record_sampled(ptr as *mut u8, old_size as usize, fp, true, 0);
            }
        }
        return q;
    }
    // The old block's usable size is glibc's to tell, through a function looked up at
    // start-up (never from here: see `constructor`); before that, this block is left to
    // glibc's realloc and not sampled.
    if REAL_USABLE.load(Ordering::Acquire) == 0 {
        // SAFETY: forwarding to glibc with the caller's arguments.
        let q = unsafe { __libc_realloc(ptr, size) };
        if q.is_null() {
            if let Some(old_size) = old {
                record_sampled(ptr as *mut u8, old_size as usize, fp, true, 0);
            }
        }
        return q;
    }
    // SAFETY: as in malloc.
    let (q, at) = unsafe { new_marked(size, __libc_malloc) };
    if q.is_null() {
        if let Some(old_size) = old {
            record_sampled(ptr as *mut u8, old_size as usize, fp, true, 0);
        }
        return q;
    }
    // SAFETY: `q` is a block of at least `size` bytes; the old block's usable bytes are the
    // program's (glibc's own realloc copies them the same way), and the two blocks are
    // distinct; then the old block goes back to glibc, as glibc's realloc does when it moves.
    unsafe {
        let keep = glibc_usable(ptr).min(size);
        std::ptr::copy_nonoverlapping(ptr as *const u8, q as *mut u8, keep);
        __libc_free(ptr);
        record_sampled(q as *mut u8, size, fp, old.is_some(), at);
        q
    }
}

/// `reallocarray(3)`.
///
/// # Safety
/// As `reallocarray(3)`.
#[cfg_attr(not(test), no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn reallocarray(ptr: *mut c_void, n: size_t, size: size_t) -> *mut c_void {
    let fp = frame_pointer!();
    let Some(total) = n.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    // Another allocator preloaded ahead of the shim owns `realloc` but may have no
    // `reallocarray` (jemalloc): its blocks go to its `realloc`, never to glibc's (helper N,
    // 3: `wc`, `sort`, `tar` crashed through gnulib's `xreallocarray`).
    let other = REALLOC_IN_FORCE.load(Ordering::Acquire);
    if other != 0 {
        // SAFETY: `other` is the `realloc` the process's symbol search finds, of this
        // signature; the caller's contract for reallocarray, with the product checked.
        return unsafe {
            std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void, size_t) -> *mut c_void>(
                other,
            )(ptr, total)
        };
    }
    // SAFETY: the caller's contract for reallocarray, with the product checked.
    unsafe { realloc_impl(ptr, total, fp) }
}

/// The `realloc` the process's global symbol search finds when it is not the shim's (another
/// allocator preloaded ahead of it); 0 otherwise. Set by [`constructor`].
static REALLOC_IN_FORCE: AtomicUsize = AtomicUsize::new(0);

/// Notes the `realloc` in force (see [`REALLOC_IN_FORCE`]).
fn note_realloc_in_force() {
    // SAFETY: dlsym with a NUL-terminated name; RTLD_DEFAULT searches the global scope.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"realloc".as_ptr()) };
    // Whose it is, by the object it lies in (the shim's own references to `realloc` bind to
    // the one in force too, so its address says nothing).
    let object = |p: *const c_void| {
        // SAFETY: a zeroed Dl_info is valid for dladdr to fill; `p` is only looked up.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        (unsafe { libc::dladdr(p, &mut info) } != 0).then_some(info.dli_fbase as usize)
    };
    let own = object(note_realloc_in_force as *const () as *const c_void);
    if !f.is_null() && own.is_some() && object(f) != own {
        REALLOC_IN_FORCE.store(f as usize, Ordering::Release);
    }
}

/// `memalign(3)`.
///
/// # Safety
/// As `memalign(3)`.
#[cfg_attr(not(test), no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    let fp = frame_pointer!();
    // SAFETY: forwarding to glibc with the caller's arguments.
    let p = unsafe { __libc_memalign(align, size) };
    record_alloc(p as *mut u8, size, fp);
    p
}

/// `aligned_alloc(3)`: glibc has no `__libc_aligned_alloc`; built on `__libc_memalign`, which
/// is what glibc's own `aligned_alloc` is before 2.38: any alignment is accepted (rounded up
/// to a power of two; 0 means none), as the program would see without the shim.
///
/// # Safety
/// As `aligned_alloc(3)`.
#[cfg_attr(not(test), no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    let fp = frame_pointer!();
    // SAFETY: forwarding to glibc with the caller's arguments (memalign checks them).
    let p = unsafe { __libc_memalign(align, size) };
    record_alloc(p as *mut u8, size, fp);
    p
}

/// `posix_memalign(3)`: built on `__libc_memalign`, with its argument checks.
///
/// # Safety
/// As `posix_memalign(3)`: `memptr` must be writable.
#[cfg_attr(not(test), no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn posix_memalign(
    memptr: *mut *mut c_void,
    align: size_t,
    size: size_t,
) -> c_int {
    let fp = frame_pointer!();
    if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<*mut c_void>()) {
        return libc::EINVAL;
    }
    // SAFETY: forwarding to glibc with a valid alignment. On failure errno is left as the
    // allocator set it (ENOMEM), as glibc's posix_memalign does.
    let p = unsafe { __libc_memalign(align, size) };
    if p.is_null() {
        return libc::ENOMEM;
    }
    record_alloc(p as *mut u8, size, fp);
    // SAFETY: the caller guarantees memptr is writable.
    unsafe { *memptr = p };
    0
}

/// `valloc(3)`.
///
/// # Safety
/// As `valloc(3)`.
#[cfg_attr(not(test), no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn valloc(size: size_t) -> *mut c_void {
    let fp = frame_pointer!();
    // SAFETY: forwarding to glibc.
    let p = unsafe { __libc_valloc(size) };
    record_alloc(p as *mut u8, size, fp);
    p
}

/// `pvalloc(3)`.
///
/// # Safety
/// As `pvalloc(3)`.
#[cfg_attr(not(test), no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn pvalloc(size: size_t) -> *mut c_void {
    let fp = frame_pointer!();
    // SAFETY: forwarding to glibc.
    let p = unsafe { __libc_pvalloc(size) };
    record_alloc(p as *mut u8, size, fp);
    p
}

static REAL_USABLE: AtomicUsize = AtomicUsize::new(0);
static REAL_DLOPEN: AtomicUsize = AtomicUsize::new(0);
static REAL_DLCLOSE: AtomicUsize = AtomicUsize::new(0);

/// The next definition of `name` (NUL-terminated) after this library, cached in `cache`.
fn next_symbol(cache: &AtomicUsize, name: &[u8]) -> usize {
    let mut f = cache.load(Ordering::Acquire);
    if f == 0 {
        // SAFETY: `name` is NUL-terminated; RTLD_NEXT lookups have no other preconditions.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr() as *const c_char) } as usize;
        cache.store(f, Ordering::Release);
    }
    f
}

/// glibc's own definition of `name` (cached in `cache`), not the next one after the shim: the
/// blocks the shim hands out are glibc's (`__libc_malloc`), and a program linked with another
/// allocator that defines the same name (redis with jemalloc: `libjemalloc.so.2` comes before
/// libc in its search order), or one preloaded after the shim, would be handed glibc's
/// blocks (a crash in jemalloc's `malloc_usable_size`). Looked up in the object that defines
/// the `__libc_malloc` the shim calls — libc, or an allocator that defines glibc's internal
/// names too and comes first (tcmalloc and mimalloc do: the shim's blocks are then theirs,
/// and glibc's own `malloc_usable_size` crashed on them: helper X, 1) — by
/// `dlopen(FILE, RTLD_NOLOAD)`; the next definition if that fails. 0: none.
fn glibc_symbol(cache: &AtomicUsize, name: &[u8]) -> usize {
    let mut f = cache.load(Ordering::Acquire);
    if f == 0 {
        let mut info: libc::Dl_info = unsafe_zeroed();
        // SAFETY: dladdr only looks the address up; `__libc_malloc` is the definition the
        // shim's calls reach (taking its address goes through the GOT).
        let found =
            unsafe { libc::dladdr(__libc_malloc as *const () as *const c_void, &mut info) != 0 }
                && !info.dli_fname.is_null();
        let file: *const c_char = if found {
            info.dli_fname
        } else {
            c"libc.so.6".as_ptr()
        };
        // The loader's own `dlopen`/`dlclose`, not the shim's (which refresh its module table).
        let (open, close) = (
            next_symbol(&REAL_DLOPEN, b"dlopen\0"),
            next_symbol(&REAL_DLCLOSE, b"dlclose\0"),
        );
        if open != 0 && close != 0 {
            // SAFETY: `open` and `close` are the loader's dlopen and dlclose, of these
            // signatures; RTLD_NOLOAD only returns the already loaded libc.
            unsafe {
                let h = std::mem::transmute::<
                    usize,
                    unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void,
                >(open)(file, libc::RTLD_NOLOAD | libc::RTLD_LAZY);
                if !h.is_null() {
                    f = libc::dlsym(h, name.as_ptr() as *const c_char) as usize;
                    // Drops the reference RTLD_NOLOAD took; libc stays loaded.
                    std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void) -> c_int>(close)(
                        h,
                    );
                }
            }
        }
        if f == 0 {
            return next_symbol(cache, name);
        }
        cache.store(f, Ordering::Release);
    }
    f
}

/// glibc's `malloc_usable_size` of `ptr`, a block of glibc's without a mark, through the
/// function [`constructor`] looked up (0 when it did not).
///
/// # Safety
/// `ptr` is a live block glibc made.
unsafe fn glibc_usable(ptr: *mut c_void) -> size_t {
    let f = REAL_USABLE.load(Ordering::Acquire);
    if f == 0 {
        return 0;
    }
    // SAFETY: `f` is glibc's malloc_usable_size, of this signature; `ptr` is its block.
    unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void) -> size_t>(f)(ptr) }
}

/// `malloc_usable_size(3)`, forwarded to glibc's.
///
/// # Safety
/// As `malloc_usable_size(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn malloc_usable_size(ptr: *mut c_void) -> size_t {
    let f = glibc_symbol(&REAL_USABLE, b"malloc_usable_size\0");
    if f == 0 || ptr.is_null() {
        return 0;
    }
    // SAFETY: `f` is glibc's malloc_usable_size, of this signature.
    let usable = |p| unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void) -> size_t>(f)(p)
    };
    // SAFETY: the caller's pointer for malloc_usable_size.
    match unsafe { mark_of(ptr) } {
        // The bytes before the trailer.
        Mark::Trailer(_, at) => (at - ptr as u64) as size_t,
        // SAFETY: glibc's block is ptr - 16.
        Mark::Header(..) => usable(unsafe { (ptr as *mut u8).sub(header::SIZE) } as *mut c_void)
            .saturating_sub(header::SIZE),
        Mark::None => usable(ptr),
    }
}

/// The loader's `dlsym` (glibc ≥ 2.34: libc's; before: libdl's), found by [`resolve_dlsym`].
#[cfg(all(target_arch = "x86_64", not(test)))]
static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// Finds the loader's `dlsym` by version (`dlvsym` is not hooked), stores it in
/// [`REAL_DLSYM`] and returns it; 0 if not found.
#[cfg(all(target_arch = "x86_64", not(test)))]
extern "C" fn resolve_dlsym() -> usize {
    let mut f = REAL_DLSYM.load(Ordering::Acquire);
    if f != 0 {
        return f;
    }
    for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
        // SAFETY: NUL-terminated name and version; RTLD_NEXT from this library finds the
        // definition after ours.
        f = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) } as usize;
        if f != 0 {
            break;
        }
    }
    if f != 0 {
        // The next `dlsym` after ours may be another interposer's, preloaded after the shim
        // (`LD_PRELOAD=libdlwrap.so heapdump run -- …`), which a versioned lookup skips
        // (helper X, 3: its hook was never called): asked of the loader's own, from here.
        // SAFETY: `f` is the loader's dlsym, of this signature; RTLD_NEXT from this library.
        let next = unsafe {
            std::mem::transmute::<
                usize,
                unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void,
            >(f)(libc::RTLD_NEXT, c"dlsym".as_ptr())
        } as usize;
        if next != 0 && next != dlsym_address() {
            f = next;
        }
    }
    REAL_DLSYM.store(f, Ordering::Release);
    f
}

/// `dlsym(3)`: for a lookup in an explicit handle (not `RTLD_DEFAULT` or `RTLD_NEXT`) that
/// finds glibc's own definition of a function of the malloc family, ours instead.
///
/// Why: `ctypes.CDLL("libc.so.6").free(p)` (or `find_library("c")`, as public Python packages
/// do) looks `free` up in libc's handle and got glibc's: it freed the shim's blocks past it —
/// "free(): invalid size", exit 134 — and blocks malloc'd so were never recorded (helper V, 1).
/// A handle lookup of any other name, and every lookup the shim makes itself, is the loader's
/// answer. `RTLD_DEFAULT` and `RTLD_NEXT` depend on the caller (the loader reads the return
/// address): those calls jump to the loader's `dlsym` with the caller's return address in
/// place, and already find ours first.
///
/// # Safety
/// As `dlsym(3)`.
#[cfg(all(target_arch = "x86_64", not(test)))]
// SAFETY: the body follows the C ABI for `dlsym`: it reads `rdi`, `rsi` and the return address,
// and leaves by a jump with the stack as it came in (to the loader's dlsym, or to
// `dlsym_explicit` with the return address as a third argument), or, when the loader's is
// not known yet, calls `resolve_dlsym` (C ABI, no arguments) with the arguments saved and
// the stack aligned; the CFI describes the pushes.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // rustc gives a naked function no CFI of its own: the directives are written here.
    core::arch::naked_asm!(
        ".cfi_startproc",
        "test rdi, rdi",
        "je 3f",
        "cmp rdi, -1",
        "je 3f",
        "mov rdx, [rsp]",
        "jmp {explicit}",
        "3:",
        "mov rax, [rip + {real}]",
        "test rax, rax",
        "je 4f",
        "jmp rax",
        "4:",
        "push rdi",
        ".cfi_adjust_cfa_offset 8",
        "push rsi",
        ".cfi_adjust_cfa_offset 8",
        "sub rsp, 8",
        ".cfi_adjust_cfa_offset 8",
        "call {resolve}",
        "add rsp, 8",
        ".cfi_adjust_cfa_offset -8",
        "pop rsi",
        ".cfi_adjust_cfa_offset -8",
        "pop rdi",
        ".cfi_adjust_cfa_offset -8",
        "test rax, rax",
        "je 5f",
        "jmp rax",
        "5:",
        "ret",
        ".cfi_endproc",
        explicit = sym dlsym_explicit,
        real = sym REAL_DLSYM,
        resolve = sym resolve_dlsym,
    )
}

/// The address of this library's [`dlsym`].
#[cfg(all(target_arch = "x86_64", not(test)))]
fn dlsym_address() -> usize {
    dlsym as *const () as usize
}

/// [`dlsym`] with an explicit handle, called from `caller` (a return address).
#[cfg(all(target_arch = "x86_64", not(test)))]
extern "C" fn dlsym_explicit(
    handle: *mut c_void,
    name: *const c_char,
    caller: usize,
) -> *mut c_void {
    let real = resolve_dlsym();
    if real == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: `real` is the loader's dlsym, of this signature; the caller's arguments.
    let r = unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void>(
            real,
        )(handle, name)
    };
    if r.is_null() || name.is_null() {
        return r;
    }
    let in_object = |a: usize, of: usize| {
        let (mut x, mut y): (libc::Dl_info, libc::Dl_info) = (unsafe_zeroed(), unsafe_zeroed());
        // SAFETY: dladdr only looks addresses up in the loader's list.
        unsafe {
            libc::dladdr(a as *const c_void, &mut x) != 0
                && libc::dladdr(of as *const c_void, &mut y) != 0
                && x.dli_fbase == y.dli_fbase
        }
    };
    // SAFETY: the caller's NUL-terminated name.
    let wanted = unsafe { std::ffi::CStr::from_ptr(name) }.to_bytes();
    let ours: usize = match wanted {
        b"malloc" => malloc as *const () as usize,
        b"free" => free as *const () as usize,
        b"calloc" => calloc as *const () as usize,
        b"realloc" => realloc as *const () as usize,
        b"reallocarray" => reallocarray as *const () as usize,
        b"posix_memalign" => posix_memalign as *const () as usize,
        b"aligned_alloc" => aligned_alloc as *const () as usize,
        b"memalign" => memalign as *const () as usize,
        b"valloc" => valloc as *const () as usize,
        b"pvalloc" => pvalloc as *const () as usize,
        b"malloc_usable_size" => malloc_usable_size as *const () as usize,
        _ => return r,
    };
    // The shim's own lookups of glibc's functions, and a definition that is not glibc's
    // (another allocator's library), stay as found.
    if in_object(caller, ours) || !in_object(r as usize, __libc_free as *const () as usize) {
        return r;
    }
    ours as *mut c_void
}

/// `dlopen(3)`, then a refresh of the module table.
///
/// # Safety
/// As `dlopen(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
    let f = next_symbol(&REAL_DLOPEN, b"dlopen\0");
    if f == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: `f` is the loader's dlopen, of this signature.
    let h = unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void>(f)(
            file, mode,
        )
    };
    if !h.is_null() {
        if heapdump_instrumentation::attach::attached() {
            // Attached: the new objects bound the malloc family to glibc's.
            got::rebind_attached(&rebind_table());
        } else if mode & libc::RTLD_DEEPBIND != 0 {
            rebind_deepbound();
        }
        heapdump_instrumentation::refresh_modules();
        heapdump_instrumentation::python::detect();
    }
    h
}

/// After a `dlopen(…, RTLD_DEEPBIND)`: the new library (and its dependencies) bound the
/// allocation functions to glibc's; point them at ours (see [`got`]).
fn rebind_deepbound() {
    let table = rebind_table();
    got::rebind_all(&table[..ALLOC_FUNCTIONS]);
}

/// How many entries of [`rebind_table`] are the malloc family (the rest are the `dlopen`,
/// `dlclose` and exit functions, rebound only by `heapdump attach`).
const ALLOC_FUNCTIONS: usize = 10;

/// glibc's definition and ours of every function this library exports that a process it
/// was attached to must call (the malloc family first, [`ALLOC_FUNCTIONS`] of them); an entry
/// whose glibc definition is not found has `libc` 0 and matches no slot.
pub(crate) fn rebind_table() -> [got::Rebind; 15] {
    let libc_h = real_dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
    let glibc = |name: &std::ffi::CStr| -> usize {
        if libc_h.is_null() {
            return 0;
        }
        // SAFETY: a valid handle and a NUL-terminated name.
        unsafe { libc::dlsym(libc_h, name.as_ptr()) as usize }
    };
    let r = |name: &'static [u8], libc: usize, ours: usize| got::Rebind { name, libc, ours };
    let own = |name: &std::ffi::CStr, fallback: usize| own_symbol(name).unwrap_or(fallback);
    let table = [
        r(
            b"malloc",
            glibc(c"malloc"),
            own(c"malloc", malloc as *const () as usize),
        ),
        r(
            b"free",
            glibc(c"free"),
            own(c"free", free as *const () as usize),
        ),
        r(
            b"calloc",
            glibc(c"calloc"),
            own(c"calloc", calloc as *const () as usize),
        ),
        r(
            b"realloc",
            glibc(c"realloc"),
            own(c"realloc", realloc as *const () as usize),
        ),
        r(
            b"reallocarray",
            glibc(c"reallocarray"),
            reallocarray as *const () as usize,
        ),
        r(
            b"posix_memalign",
            glibc(c"posix_memalign"),
            posix_memalign as *const () as usize,
        ),
        r(
            b"aligned_alloc",
            glibc(c"aligned_alloc"),
            aligned_alloc as *const () as usize,
        ),
        r(
            b"memalign",
            glibc(c"memalign"),
            own(c"memalign", memalign as *const () as usize),
        ),
        r(
            b"valloc",
            glibc(c"valloc"),
            own(c"valloc", valloc as *const () as usize),
        ),
        r(
            b"pvalloc",
            glibc(c"pvalloc"),
            own(c"pvalloc", pvalloc as *const () as usize),
        ),
        r(
            b"dlopen",
            glibc(c"dlopen"),
            own(c"dlopen", dlopen as *const () as usize),
        ),
        r(
            b"dlclose",
            glibc(c"dlclose"),
            own(c"dlclose", dlclose as *const () as usize),
        ),
        r(
            b"_exit",
            glibc(c"_exit"),
            own(c"_exit", _exit as *const () as usize),
        ),
        r(
            b"_Exit",
            glibc(c"_Exit"),
            own(c"_Exit", _Exit as *const () as usize),
        ),
        r(
            b"quick_exit",
            glibc(c"quick_exit"),
            own(c"quick_exit", quick_exit as *const () as usize),
        ),
    ];
    real_dlclose(libc_h);
    table
}

/// This library's own definition of `name`. Taking a function's address in Rust code goes
/// through the GOT, which holds the first definition in the lookup scope: ours when
/// preloaded, glibc's when `dlopen`ed by `heapdump attach`; asking the loader with this
/// library's own handle finds ours in both cases.
pub(crate) fn own_symbol(name: &std::ffi::CStr) -> Option<usize> {
    let mut info: libc::Dl_info = unsafe_zeroed();
    // SAFETY: dladdr fills `info` for an address inside this library.
    if unsafe { libc::dladdr(own_symbol as *const () as *const c_void, &mut info) } == 0
        || info.dli_fname.is_null()
    {
        return None;
    }
    let h = real_dlopen(info.dli_fname, libc::RTLD_NOW | libc::RTLD_NOLOAD);
    if h.is_null() {
        return None;
    }
    // SAFETY: a valid handle and a NUL-terminated name; a handle lookup starts at the object.
    let f = unsafe { libc::dlsym(h, name.as_ptr()) } as usize;
    real_dlclose(h);
    (f != 0).then_some(f)
}

/// Whether the `__libc_malloc` the shim calls is glibc's own (defined in `libc.so.*`).
fn libc_malloc_is_glibcs() -> bool {
    let mut info: libc::Dl_info = unsafe_zeroed();
    // SAFETY: dladdr only looks the address up; taking `__libc_malloc`'s address goes through
    // the GOT to the definition the shim's calls reach.
    if unsafe { libc::dladdr(__libc_malloc as *const () as *const c_void, &mut info) } == 0
        || info.dli_fname.is_null()
    {
        return true;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_bytes();
    let file = path.rsplit(|b| *b == b'/').next().unwrap_or(path);
    file.starts_with(b"libc.so") || file.starts_with(b"libc-")
}

/// When C++'s `operator new` is another allocator's, linked into the program (jemalloc by
/// `-ljemalloc`: it comes before libc in the lookup order, after the preloaded shim), that
/// library's own references to the malloc family are pointed at its own definitions, as they
/// bind without the shim (see [`got::bind_to_itself`]). Returns how many slots changed.
fn bind_other_allocator_to_itself() -> usize {
    // SAFETY: a NUL-terminated name; RTLD_DEFAULT looks in the global scope.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_Znwm".as_ptr()) };
    if f.is_null() {
        return 0;
    }
    let mut info: libc::Dl_info = unsafe_zeroed();
    // SAFETY: dladdr only looks the address up.
    if unsafe { libc::dladdr(f, &mut info) } == 0 || info.dli_fname.is_null() {
        return 0;
    }
    let base = info.dli_fbase as usize;
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_bytes();
    let file = path.rsplit(|b| *b == b'/').next().unwrap_or(path);
    let mut own: libc::Dl_info = unsafe_zeroed();
    // SAFETY: as above, for an address of this library.
    unsafe { libc::dladdr(own_symbol as *const () as *const c_void, &mut own) };
    // The C++ runtimes' operator new calls malloc (the shim's); an executable defining it
    // (or taking its address: a PLT entry) is not another allocator's library.
    if base == own.dli_fbase as usize
        || base == 0
        || [
            &b"libstdc++.so"[..],
            b"libc++.so",
            b"libc++abi.so",
            b"libc.so",
        ]
        .iter()
        .any(|e| file.starts_with(e))
    {
        return 0;
    }
    let h = real_dlopen(info.dli_fname, libc::RTLD_NOW | libc::RTLD_NOLOAD);
    if h.is_null() {
        return 0;
    }
    let names: [&'static [u8]; 12] = [
        b"malloc",
        b"free",
        b"calloc",
        b"realloc",
        b"reallocarray",
        b"posix_memalign",
        b"aligned_alloc",
        b"memalign",
        b"valloc",
        b"pvalloc",
        b"malloc_usable_size",
        b"cfree",
    ];
    let mut table = [got::Rebind {
        name: b"",
        libc: 0,
        ours: 0,
    }; 12];
    let mut n = 0;
    for name in names {
        let mut z = [0u8; 32];
        z[..name.len()].copy_from_slice(name);
        // SAFETY: a valid handle and a NUL-terminated name; a handle lookup starts at the
        // object itself.
        let d = unsafe { libc::dlsym(h, z.as_ptr() as *const c_char) };
        let mut di: libc::Dl_info = unsafe_zeroed();
        if d.is_null()
            // SAFETY: dladdr only looks the address up.
            || unsafe { libc::dladdr(d, &mut di) } == 0
            || di.dli_fbase as usize != base
        {
            continue; // not defined by that library: its slot binds as before
        }
        table[n] = got::Rebind {
            name,
            libc: 0,
            ours: d as usize,
        };
        n += 1;
    }
    real_dlclose(h);
    if n == 0 {
        return 0;
    }
    got::bind_to_itself(base, &table[..n])
}

/// The loader's `dlopen` (not our hook, which a call to `libc::dlopen` from this library
/// reaches): for `RTLD_NOLOAD` lookups of loaded libraries.
fn real_dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
    let f = next_symbol(&REAL_DLOPEN, b"dlopen\0");
    if f == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: `f` is the loader's dlopen, of this signature; RTLD_NOLOAD only returns the
    // handle of a library already loaded.
    unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void>(f)(
            file, mode,
        )
    }
}

/// The loader's `dlclose` of a handle from [`real_dlopen`] (null: nothing).
fn real_dlclose(h: *mut c_void) {
    let f = next_symbol(&REAL_DLCLOSE, b"dlclose\0");
    if f == 0 || h.is_null() {
        return;
    }
    // SAFETY: `f` is the loader's dlclose, of this signature; `h` came from real_dlopen.
    unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void) -> c_int>(f)(h) };
}

fn unsafe_zeroed<T>() -> T {
    // SAFETY: only used for plain C structs (Dl_info) for which all-zero is valid.
    unsafe { std::mem::zeroed() }
}

/// `dlclose(3)`, then a refresh of the module table.
///
/// # Safety
/// As `dlclose(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    let f = next_symbol(&REAL_DLCLOSE, b"dlclose\0");
    if f == 0 {
        return -1;
    }
    // SAFETY: `f` is the loader's dlclose, of this signature.
    let r = unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void) -> c_int>(f)(handle)
    };
    heapdump_instrumentation::refresh_modules();
    heapdump_instrumentation::python::forget_if_unloaded();
    r
}

/// `_exit(2)`: removes the region (as a clean exit does), then ends the process. Shells such
/// as dash leave through `_exit`, skipping `atexit` handlers.
///
/// # Safety
/// As `_exit(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    heapdump_instrumentation::state::exit_cleanup();
    // SAFETY: exit_group ends every thread of the process; it does not return.
    unsafe { libc::syscall(libc::SYS_exit_group, status as libc::c_long) };
    unreachable_exit()
}

/// `heapdump_take_named_snapshot(3)` (instrumentation/include/heapdump.h): records a named
/// snapshot — the blocks live now, retrievable later with `heapdump snapshot --named NAME`.
/// Returns 1 when recorded, 0 when not (not recording, NULL name, or the table is full).
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn heapdump_take_named_snapshot(name: *const libc::c_char) -> c_int {
    if name.is_null() {
        return 0;
    }
    // SAFETY: the caller passes a NUL-terminated string; at most 4096 bytes are looked at.
    let len = unsafe { libc::strnlen(name, 4096) };
    // SAFETY: `len` bytes at `name` are readable (strnlen just read them).
    let bytes = unsafe { std::slice::from_raw_parts(name as *const u8, len) };
    heapdump_instrumentation::state::take_named_snapshot(bytes) as c_int
}

static REAL_QUICK_EXIT: AtomicUsize = AtomicUsize::new(0);

/// `quick_exit(3)`: removes the region (as a clean exit does: `quick_exit` skips `atexit`
/// handlers), then runs the program's `at_quick_exit` handlers through glibc's.
///
/// # Safety
/// As `quick_exit(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn quick_exit(status: c_int) -> ! {
    heapdump_instrumentation::state::exit_cleanup();
    let f = next_symbol(&REAL_QUICK_EXIT, b"quick_exit\0");
    if f != 0 {
        // SAFETY: `f` is glibc's quick_exit, of this signature; it does not return.
        unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(c_int) -> !>(f)(status) }
    }
    // SAFETY: as in `_exit`.
    unsafe { libc::syscall(libc::SYS_exit_group, status as libc::c_long) };
    unreachable_exit()
}

/// `_Exit(3)`: as `_exit`.
///
/// # Safety
/// As `_Exit(3)`.
#[cfg_attr(not(test), no_mangle)]
#[allow(non_snake_case)]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    // SAFETY: same contract.
    unsafe { _exit(status) }
}

fn unreachable_exit() -> ! {
    loop {
        // SAFETY: only reached if exit_group returned, which it does not.
        unsafe { libc::syscall(libc::SYS_exit_group, 127 as libc::c_long) };
    }
}

fn set_errno(v: c_int) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = v };
}

extern "C" fn constructor() {
    // Looked up now, outside any allocator call: `dlsym` from inside one (the first sampled
    // `realloc`, which copies a block `malloc_usable_size` long) ran while glibc's `dlerror`
    // was formatting its message with `asprintf`, and the nested lookup freed the thread's
    // dlerror result under it: heap corruption, SIGSEGV (helper L, 1: `python3 -c pass` at a
    // 64-byte sampling interval, 40 of 40 runs).
    heapdump_instrumentation::state::own_work(|| {
        glibc_symbol(&REAL_USABLE, b"malloc_usable_size\0");
        note_realloc_in_force();
    });
    heapdump_instrumentation::state::set_real_free(free_block);
    if !attach::decide_preloaded() {
        // `dlopen`ed by `heapdump attach`: recording starts in its entry, not lazily at the
        // first allocator call.
        heapdump_instrumentation::state::wait_for_start();
        return;
    }
    heapdump_instrumentation::state::own_work(bind_other_allocator_to_itself);
    heapdump_instrumentation::init();
    // Block marks (trailers in glibc's usable area, headers before blocks) rely on glibc's
    // chunk layout: an allocator that defines glibc's own names too and comes first
    // (tcmalloc, mimalloc: `__libc_malloc` is theirs) gets the index instead (helper X, 1:
    // node died at start-up with tcmalloc preloaded after the shim).
    if libc_malloc_is_glibcs() {
        heapdump_instrumentation::state::enable_block_headers();
    }
    heapdump_instrumentation::state::register_fork_handlers();
    heapdump_instrumentation::refresh_modules();
    heapdump_instrumentation::python::detect();
}

#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: extern "C" fn() = constructor;
