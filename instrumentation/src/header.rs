//! Block headers: the record number of a block kept next to the block (issue 20, design 1b).
//!
//! With `LD_PRELOAD` (the shim loaded at start-up, every allocation recorded), `malloc`,
//! `calloc` and `realloc` ask glibc for 16 bytes more and hand out the address after a
//! 16-byte header:
//!
//! ```text
//!   q = glibc's block        p = q + 16 = the program's block
//!   | node: u32 | size: u32 | tag: u64 | the program's bytes ...
//! ```
//!
//! `node` is the block's record in the allocations table ([`NONE`]: not recorded), `size` the
//! requested size (`u32::MAX`: 4 GiB or more, read from the record), and `tag` a keyed hash of
//! `p`, `node` and `size` under a per-process random key, with bit 3 set: where glibc keeps a
//! chunk's size, a multiple of 16, so the word at `p - 8` alone tells a header (bit 3 set) from
//! glibc's chunk header (clear), which the preloaded shim's block trailers ([`crate::trailer`])
//! are found from. Under `LD_PRELOAD` only blocks of more than [`crate::trailer::MAX_REQUEST`]
//! bytes get a header, smaller ones a trailer. A free reads the header (the cache
//! line glibc's own free reads next, for the chunk's size field at `p - 8`) instead of probing
//! the private address index: one structure from block to record, no index memory (about 29 B
//! a block at 1 M blocks), no index lock, no index cache miss.
//!
//! Blocks the shim did not give a header — allocated before the shim started, by
//! `memalign`/`aligned_alloc`/`posix_memalign`/`valloc`/`pvalloc` (their alignment leaves no
//! room), by CPython's object allocator, after `heapdump attach` (glibc's own `free` may get
//! them again after `detach`) — fail the tag check and go through the address index as before.
//! A false match needs 64 bits of the block's neighbourhood to equal a keyed hash of its
//! address: the key is drawn from `getrandom` at start-up and never leaves the process.
//!
//! Reading `p - 16` is safe for every pointer handed to the malloc family: the shim forwards to
//! glibc, whose `free`, `realloc` and `malloc_usable_size` read the chunk header at `p - 16`
//! and `p - 8` themselves (the same 16-byte granule when `p` is 16-aligned; other pointers are
//! not read). CPython's small-object allocator hands out blocks inside pools whose header
//! precedes them, so the word before such a block is mapped too.
//!
//! A header is written before the block is recorded and its tag cleared before glibc gets the
//! block back, so a stale header never names a record: a free that clears it closes the record
//! first. Headers are turned on once ([`enable`]) and never off: a block with a header must
//! always be freed as one.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Bytes before the program's block.
pub const SIZE: usize = 16;
/// `node` of a block that has a header but no record.
pub const NONE: u32 = u32::MAX;
/// The `at` a preloaded wrapper passes with a block it just gave a header naming [`NONE`]
/// (`hooks::record_alloc_trailed`'s argument, otherwise a trailer's address or 0): the
/// record's insert writes the header without reading it back first (1 is never a trailer's
/// address).
pub const JUST_HEADED: u64 = 1;

static MARKS: Marks = Marks::new();

#[repr(C)]
struct Header {
    node: u32,
    size: u32,
    tag: u64,
}
const _: () = assert!(std::mem::size_of::<Header>() == SIZE);

/// Whether blocks get headers (set once by [`enable`], never cleared).
#[inline(always)]
pub fn on() -> bool {
    MARKS.on.load(Ordering::Relaxed)
}

/// Whether only sampled blocks get headers (sampling mode, [`enable_sampled_only`]); when false
/// and [`on`], every block the preloaded wrappers allocate gets one.
#[inline(always)]
pub fn sampled_only() -> bool {
    MARKS.sampled_only.load(Ordering::Relaxed)
}

/// Sampling mode: turns headers on for sampled blocks only. The wrappers decide whether to
/// sample before asking glibc for the block, and give a header only to a sampled one; a free
/// then tells a sampled block from the others by its header (the cache line glibc's free reads
/// anyway), with no lookup for the unsampled majority (before: a load from the address index's
/// presence filter, which missed the L1 cache under allocation-heavy work).
pub fn enable_sampled_only() {
    MARKS.enable(true);
}

/// Turns headers on for the rest of the process's life (the preloaded shim, once recording
/// started, every allocation recorded; `HeapdumpAlloc`, at its first block).
pub fn enable() {
    MARKS.enable(false);
}

/// The switches and key of one kind of mark kept next to blocks (headers here, and
/// [`crate::trailer`]s): turned on once, never off.
#[derive(Debug)]
pub(crate) struct Marks {
    pub(crate) on: AtomicBool,
    pub(crate) sampled_only: AtomicBool,
    pub(crate) key: AtomicU64,
}

impl Marks {
    pub(crate) const fn new() -> Self {
        Marks {
            on: AtomicBool::new(false),
            sampled_only: AtomicBool::new(false),
            key: AtomicU64::new(0),
        }
    }

    /// Turns the marks on (for sampled blocks only: `sampled_only`). The key comes from
    /// `getrandom(2)`, or when that fails from the clock and an address (a weaker key only
    /// makes a deliberate forgery easier, and the program itself is the only one that could
    /// try); it is odd, never 0.
    pub(crate) fn enable(&self, sampled_only: bool) {
        if sampled_only {
            self.sampled_only.store(true, Ordering::Relaxed);
        }
        if self.on.load(Ordering::Relaxed) {
            return;
        }
        let mut key = 0u64;
        // SAFETY: writing at most 8 bytes into a local u64.
        let got = unsafe {
            libc::getrandom(
                &mut key as *mut u64 as *mut libc::c_void,
                8,
                libc::GRND_NONBLOCK,
            )
        };
        if got != 8 {
            key = vmo_layout::clock::precise_ns() ^ ((&key as *const u64 as u64) << 17);
        }
        self.key.store(key | 1, Ordering::Relaxed);
        self.on.store(true, Ordering::Release);
    }
}

/// The tag of a header at `p - 16` holding `node` and `size` (bit 3 set: never a glibc chunk
/// size, never 0).
#[inline(always)]
fn tag(p: u64, node: u32, size: u32) -> u64 {
    let k = MARKS.key.load(Ordering::Relaxed);
    let x = (p ^ k).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((node as u64) << 32 | size as u64);
    let x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (x ^ (x >> 31)) | 8
}

/// Whether the word at `p - 8` may be a header's tag (bit 3 set), not glibc's chunk size.
#[inline(always)]
pub fn marked(word: u64) -> bool {
    word & 8 != 0
}

/// The header of block `p`, if it has one: `(node, size)`.
///
/// # Safety
/// `p` is null, misaligned, or a block of the malloc family (or of CPython's object allocator):
/// the 16 bytes before it are mapped (see the module documentation).
#[inline(always)]
pub unsafe fn read(p: u64) -> Option<(u32, u32)> {
    if p & 15 != 0 || p < 4096 {
        return None;
    }
    // SAFETY: per the contract, `p - 16` is mapped; volatile reads, as the bytes may be
    // anything (glibc's chunk header, a neighbour's data, when `p` has no header).
    let t = unsafe { std::ptr::read_volatile((p - 8) as *const u64) };
    if !marked(t) {
        return None;
    }
    // SAFETY: as above.
    let w = unsafe { std::ptr::read_volatile((p - SIZE as u64) as *const u64) };
    let (node, size) = (w as u32, (w >> 32) as u32);
    (t == tag(p, node, size)).then_some((node, size))
}

/// The header `words` (the 16 bytes before block `p`, read elsewhere) if they are one:
/// `(node, size)`.
pub fn decode(p: u64, words: [u64; 2]) -> Option<(u32, u32)> {
    let (node, size) = (words[0] as u32, (words[0] >> 32) as u32);
    (p & 15 == 0 && words[1] == tag(p, node, size)).then_some((node, size))
}

/// Writes the header of block `p` (16-aligned, the 16 bytes before it the shim's).
///
/// # Safety
/// `p - 16 .. p` is memory the shim allocated for this header.
#[inline(always)]
pub unsafe fn write(p: u64, node: u32, size: u32) {
    let h = Header {
        tag: tag(p, node, size),
        node,
        size,
    };
    // SAFETY: per the contract.
    unsafe { std::ptr::write((p - SIZE as u64) as *mut Header, h) };
}

/// Clears the tag of block `p` before its memory goes back to glibc.
///
/// # Safety
/// As [`write`].
#[inline(always)]
pub unsafe fn clear(p: u64) {
    // SAFETY: per the contract.
    unsafe { std::ptr::write((p - 8) as *mut u64, 0) };
}

/// The size field for a header: the requested size, or `u32::MAX` at 4 GiB or more.
#[inline(always)]
pub fn size32(size: u64) -> u32 {
    size.min(u32::MAX as u64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_is_found_only_where_written_and_until_cleared() {
        enable();
        let mut buf = [0u64; 8];
        let base = buf.as_mut_ptr() as u64;
        let p = (base + 31) & !15;
        // SAFETY: p - 16 .. p + 16 lies inside `buf`.
        unsafe {
            assert_eq!(read(p), None);
            write(p, 7, 100);
            assert_eq!(read(p), Some((7, 100)));
            // Another address, or changed contents, fail the tag.
            assert_eq!(read(p + 16), None);
            *((p - 16) as *mut u32) = 8;
            assert_eq!(read(p), None);
            write(p, NONE, 5);
            assert_eq!(read(p), Some((NONE, 5)));
            clear(p);
            assert_eq!(read(p), None);
        }
        // Misaligned pointers are not read.
        // SAFETY: not dereferenced (misaligned).
        assert_eq!(unsafe { read(p + 8) }, None);
    }
}
