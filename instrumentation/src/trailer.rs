//! Block trailers: the record number of a block kept in glibc's slack at the block's end
//! (issue 20, design 1b; the preloaded shim's form of [`crate::header`]).
//!
//! With `LD_PRELOAD` (the shim loaded at start-up, every allocation recorded), `malloc`,
//! `calloc` and `realloc` of up to [`MAX_REQUEST`] bytes ask glibc for 8 bytes more and keep
//! one word in the last 8 bytes of glibc's usable area (larger blocks, and sampled ones in
//! sampling mode, get a [`crate::header`]):
//!
//! ```text
//!   p = glibc's block = the program's block            p + usable(p) - 8
//!   | the program's bytes ... | glibc's slack ... | node: u32 | tag: u32 |
//! ```
//!
//! `node` is the block's record in the allocations table, `tag` a keyed 32-bit hash of `p` and
//! `node` under a per-process random key, never 0. The word is written when the block is
//! recorded and cleared when its record is closed: a block left unrecorded (sampling, a
//! forwarded call, a full table) has no trailer and is looked up in the address index.
//! `usable(p)` is read from glibc's chunk header at `p - 8` (the word glibc's own `free` reads
//! first), as glibc's `malloc_usable_size` computes it (`malloc/malloc.c`, `musable`): the chunk
//! size less 8, or less 16 for a chunk of its own mapping.
//!
//! Why at the end and 8 bytes, not a 16-byte header before the block: glibc rounds every
//! request up to a multiple of 16 and
//! keeps 8 bytes of it for its own header, so a block's usable area ends 0 to 15 bytes after
//! what was asked for. A header before the block must keep the block 16-aligned and so always
//! costs 16 bytes; 8 bytes at the end cost nothing when glibc's slack already holds them (half
//! of all sizes) and 16 bytes otherwise: 8 bytes a block on average instead of 16 (bench/hold.c,
//! 1 M blocks of 16–64 B: 59.9 B per live block with headers, 51.5 with trailers). And the
//! program's block stays glibc's block: nothing shifts the pointer, so a small block reaching
//! glibc without the shim (`__libc_free`, a library bound to glibc directly) is freed
//! correctly (its record stays live until glibc hands the address out again: [`left_at`]), and a false
//! match cannot make the shim free the wrong address. Why only small
//! blocks: a larger block's last word is a cache line of its own, which glibc's free of a block
//! it keeps in its thread cache never loads; a header costs such a block at most an eighth.
//!
//! A false match (a block the shim gave no trailer, whose last word happens to hold a valid
//! tag: 1 in 2^32 per such free) is caught by the record it names: the erase checks that the
//! record is live and holds this block's address before closing it (see `hooks`). Blocks
//! without a trailer — allocated before the shim started, by the `memalign` family, by
//! CPython's object allocator, unsampled ones in sampling mode — go through the address index.
//!
//! The program sees `usable(p) - 8` bytes from `malloc_usable_size`, at least what it asked
//! for; the trailer is rewritten when `realloc` moves or resizes a block and cleared before the
//! block goes back to glibc, so a stale trailer never names a record.

use crate::header::Marks;
use std::sync::atomic::Ordering;

/// Bytes the trailer takes at the end of glibc's usable area.
pub const SIZE: usize = 8;
/// Largest glibc chunk (bytes) whose block has a trailer: its last word lies in the cache line
/// of glibc's chunk header or the next one. A larger block's last word is a cache line of its
/// own, which a free would have to load (glibc's own free of a block it keeps in its thread
/// cache never reads it): larger blocks get a 16-byte [`crate::header`] instead, 16 bytes being
/// at most an eighth of them.
pub const MAX_CHUNK: u64 = 128;
/// Largest request (bytes) given a trailer: `MAX_REQUEST + 8` bytes fit a [`MAX_CHUNK`] chunk
/// (glibc adds 8 and rounds up to 16). glibc may hand out a larger chunk than asked for (a
/// remainder too small to split); such a block gets no trailer and is indexed.
pub const MAX_REQUEST: usize = MAX_CHUNK as usize - 16;
/// A `node` naming no record (look in the address index); never written by the shim since
/// trailers are written only for recorded blocks, still understood.
pub const NONE: u32 = u32::MAX;

static MARKS: Marks = Marks::new();

/// Whether blocks get trailers (set once by [`enable`], never cleared).
#[inline(always)]
pub fn on() -> bool {
    MARKS.on.load(Ordering::Relaxed)
}

/// Turns trailers on for the rest of the process's life (the preloaded shim, once recording
/// started and every allocation is recorded: in sampling mode sampled blocks get headers only;
/// see [`Marks::enable`] for the key).
pub fn enable() {
    MARKS.enable(false);
}

/// The trailer word of block `p` naming `node`: `node` in bits 0..32, the tag (never 0) in
/// bits 32..64.
#[inline(always)]
fn word(p: u64, node: u32) -> u64 {
    let k = MARKS.key.load(Ordering::Relaxed);
    let x = (p ^ k).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ node as u64;
    let x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let tag = ((x ^ (x >> 29)) >> 32) as u32 | 1;
    (tag as u64) << 32 | node as u64
}

/// glibc's usable size of block `p` (bytes), from its chunk header; `None` for a pointer glibc
/// would reject as misaligned or whose size field it would reject (`free(): invalid size`).
///
/// # Safety
/// `p` is null, misaligned, or a block of glibc's malloc family (handed to `free`, `realloc`
/// or `malloc_usable_size`, or just returned by glibc): the 8 bytes before it are mapped.
#[inline(always)]
pub unsafe fn usable(p: u64) -> Option<u64> {
    if p & 15 != 0 || p < 4096 {
        return None;
    }
    // SAFETY: per the contract (glibc's chunk header); volatile, as for a pointer the program
    // got elsewhere the word may be anything.
    let field = unsafe { std::ptr::read_volatile((p - 8) as *const u64) };
    usable_from(p, field)
}

/// Where block `p`'s trailer goes (the address of its last 8 usable bytes), 0 when `p` is
/// null, not a plausible glibc block, or of a chunk larger than [`MAX_CHUNK`].
///
/// # Safety
/// As [`usable`].
#[inline(always)]
pub unsafe fn locate(p: u64) -> u64 {
    if p & 15 != 0 || p < 4096 {
        return 0;
    }
    // SAFETY: per the contract (glibc's chunk header); volatile, as for a pointer the program
    // got elsewhere the word may be anything.
    let field = unsafe { std::ptr::read_volatile((p - 8) as *const u64) };
    at_from(p, field)
}

/// Where block `p`'s trailer is, from glibc's chunk header word `field` (the 8 bytes before
/// `p`, read elsewhere): 0 as for [`locate`].
#[inline(always)]
pub(crate) fn at_from(p: u64, field: u64) -> u64 {
    match usable_from(p, field) {
        Some(u) if field & !7 <= MAX_CHUNK => p + u - SIZE as u64,
        _ => 0,
    }
}

/// The trailer of block `p`, if it has one: `(node, where it is)`. Only blocks of chunks up to
/// [`MAX_CHUNK`] bytes are read.
///
/// # Safety
/// As [`usable`]; `p`'s chunk is the one glibc would free (its usable area is mapped).
#[inline(always)]
pub unsafe fn read(p: u64) -> Option<(u32, u64)> {
    // SAFETY: per the contract.
    let at = unsafe { locate(p) };
    if at == 0 {
        return None;
    }
    // SAFETY: `at` is the last word of `p`'s usable area (per the contract, mapped); volatile,
    // as without a trailer it is the program's data.
    let w = unsafe { std::ptr::read_volatile(at as *const u64) };
    (w == word(p, w as u32)).then_some((w as u32, at))
}

/// The record a trailer left at `at` names for block `p`, when the word there is one (it is
/// cleared whenever the shim frees the block, so a trailer still there for a block glibc just
/// handed out is that of a block freed without the shim: `__libc_free`). Cheap when there is
/// none: one load of the line the new trailer is written to, and a test for 0.
///
/// # Safety
/// `at` is [`locate`]`(p)` for a block glibc just returned (its usable area is mapped).
#[inline(always)]
pub unsafe fn left_at(at: u64, p: u64) -> Option<u32> {
    // SAFETY: per the contract; volatile, as it is the program's bytes of an earlier block.
    let w = unsafe { std::ptr::read_volatile(at as *const u64) };
    (w != 0 && w == word(p, w as u32)).then_some(w as u32)
}

/// Writes block `p`'s trailer at `at` (from [`locate`]) naming `node`.
///
/// # Safety
/// `at` is [`locate`]`(p)` for a block the shim asked glibc 8 bytes more for.
#[inline(always)]
pub unsafe fn write(at: u64, p: u64, node: u32) {
    // SAFETY: per the contract, the shim's 8 bytes.
    unsafe { std::ptr::write(at as *mut u64, word(p, node)) };
}

/// Clears the trailer at `at` before the block goes back to glibc.
///
/// # Safety
/// As [`write`].
#[inline(always)]
pub unsafe fn clear(at: u64) {
    // SAFETY: per the contract.
    unsafe { std::ptr::write(at as *mut u64, 0) };
}

/// The trailer word of block `p` naming `node`, as [`write`] stores it (for `fork`, which reads
/// trailers with `process_vm_readv`).
pub(crate) fn decode(p: u64, w: u64) -> Option<u32> {
    (w == word(p, w as u32)).then_some(w as u32)
}

/// glibc's usable size of a block from its chunk header word (the 8 bytes before it), as
/// [`usable`] (for `fork`).
#[inline(always)]
pub(crate) fn usable_from(p: u64, field: u64) -> Option<u64> {
    let chunk = field & !7;
    // glibc's checks in free (malloc/malloc.c, `_int_free`): 16-aligned, at least MINSIZE (32),
    // a multiple of MALLOC_ALIGNMENT (16), not wrapping around the address space.
    if p & 15 != 0 || p < 4096 || chunk < 32 || chunk & 15 != 0 || p.checked_add(chunk).is_none() {
        return None;
    }
    // IS_MMAPPED (bit 1): a chunk of its own mapping, whose 16-byte header is all glibc's; any
    // other lends its last 8 bytes from the next chunk's first word while in use.
    Some(if field & 2 != 0 {
        chunk - 16
    } else {
        chunk - 8
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trailer_is_found_only_where_written_and_until_cleared() {
        enable();
        // A made-up in-use chunk of 64 bytes: the size word, then 56 usable bytes.
        let mut buf = [0u64; 16];
        let base = buf.as_mut_ptr() as u64;
        let p = (base + 31) & !15;
        // SAFETY: p - 8 .. p + 56 lies inside `buf`.
        unsafe {
            *((p - 8) as *mut u64) = 64 | 1;
            assert_eq!(usable(p), Some(56));
            let at = locate(p);
            assert_eq!(at, p + 48);
            assert_eq!(read(p), None);
            write(at, p, 7);
            assert_eq!(read(p), Some((7, at)));
            // Another block at another address, or changed contents, fail the tag.
            *((p + 8) as *mut u64) = 48 | 1;
            assert_eq!(read(p + 16), None);
            *(at as *mut u32) = 8;
            assert_eq!(read(p), None);
            write(at, p, NONE);
            assert_eq!(read(p), Some((NONE, at)));
            clear(at);
            assert_eq!(read(p), None);
            // A chunk of its own mapping: 16 bytes of header.
            *((p - 8) as *mut u64) = 64 | 2;
            assert_eq!(usable(p), Some(48));
            // Chunks larger than MAX_CHUNK have no trailer (their blocks get headers).
            *((p - 8) as *mut u64) = 144 | 1;
            assert_eq!(locate(p), 0);
            assert_eq!(read(p), None);
            // Sizes glibc's free would reject are not followed.
            *((p - 8) as *mut u64) = 24;
            assert_eq!(usable(p), None);
            *((p - 8) as *mut u64) = 72;
            assert_eq!(usable(p), None);
            *((p - 8) as *mut u64) = !0;
            assert_eq!(usable(p), None);
        }
        // Misaligned pointers are not read.
        // SAFETY: not dereferenced (misaligned).
        assert_eq!(unsafe { read(p + 8) }, None);
        assert_eq!(decode(p, word(p, 3)), Some(3));
        assert_eq!(decode(p + 16, word(p, 3)), None);
        assert_eq!(usable_from(p, 64 | 1), Some(56));
    }
}
