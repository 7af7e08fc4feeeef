//! Finding the objects CPython's small-object allocator (pymalloc) has handed out, from inside
//! the process, without allocating and without trusting anything it reads (for `heapdump
//! attach`: the objects made before the shim was loaded live in pymalloc's own mmapped
//! arenas, which glibc's heap walk does not see).
//!
//! Layout of CPython 3.6 to 3.13 (default build, 64-bit; `Objects/obmalloc.c`,
//! `Include/internal/pycore_obmalloc.h` since 3.12): arenas of 1 MiB (`ARENA_SIZE`) carved into
//! pools of 16 KiB (`POOL_SIZE`) since 3.10, of 256 KiB into pools of 4 KiB before ([`Layout`];
//! `sys._debugmallocstats()` of each version says so); blocks of size classes
//! `16 * (szidx + 1)` up to 512 bytes (`ALIGNMENT` 16, 32 classes) in all of them.
//! - `struct arena_object` (48 bytes): `address` 0 (the arena's mapping, 0 when the entry is
//!   unused), `pool_address` 8 (the next pool never used), `nfreepools` 16 and `ntotalpools`
//!   20 (u32), `freepools` 24, `nextarena` 32, `prevarena` 40. The array of them (`arenas`,
//!   `maxarenas` entries: 16, then doubled) is grown with `PyMem_RawRealloc`: it is a glibc
//!   block, found among the glibc walk's blocks by its contents.
//! - `struct pool_header` (48 bytes, `POOL_OVERHEAD`): `ref.count` 0 (u32: blocks allocated),
//!   `freeblock` 8, `nextpool` 16, `prevpool` 24, `arenaindex` 32, `szidx` 36, `nextoffset`
//!   40, `maxnextoffset` 44 (u32). Pools start at the arena's address rounded up to 16 KiB,
//!   up to `pool_address`. A pool's blocks start at offset 48; the blocks below `nextoffset`
//!   are allocated, or on the `freeblock` list (each free block's first word is the next).
//!   `sys.getallocatedblocks()` is the sum of the pools' counts.
//!
//! Every pointer taken from memory is read through the kernel (`process_vm_readv` on this
//! process: an unmapped address is an error, not a fault) and every structure checked
//! before it is used: an arena entry (its pools inside its arena, `ntotalpools` all of them
//! or one fewer when the arena is not pool-aligned), a
//! pool (its arena index, size class, offsets, and `count` + free blocks = blocks below
//! `nextoffset`, the free list inside the pool without a cycle). A pool that does not check
//! out is skipped (a thread stopped in the middle of a pymalloc call can leave one so).

use crate::glibc_heap::{Block, Blocks};

/// The largest pool of any version (the pool buffer's and free-block bitmap's size).
const POOL_SIZE: u64 = 16 << 10;
const POOL_OVERHEAD: u64 = 48;

/// The arena and pool sizes of one CPython version (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// `ARENA_SIZE`.
    pub arena: u64,
    /// `POOL_SIZE`.
    pub pool: u64,
}

/// 3.10 to 3.13 (`USE_LARGE_ARENAS`, `USE_LARGE_POOLS` with the radix tree, 64-bit).
const LARGE: Layout = Layout {
    arena: 1 << 20,
    pool: 16 << 10,
};
/// 3.6 to 3.9.
const SMALL: Layout = Layout {
    arena: 256 << 10,
    pool: 4 << 10,
};
const ARENA_OBJECT: u64 = 48;
const SIZE_CLASSES: u32 = 32;
/// Most arena entries checked in one candidate array (1 TiB of arenas).
const MAX_ARENAS: u64 = 1 << 20;

/// What [`walk`] found.
#[derive(Debug, Clone, Copy, Default)]
pub struct Found {
    /// Allocated blocks pushed.
    pub blocks: u64,
    /// Their size classes' bytes.
    pub bytes: u64,
    /// Arenas walked.
    pub arenas: u64,
    /// Pools skipped because they did not check out.
    pub bad_pools: u64,
}

/// Reads `buf.len()` bytes at `addr` of this process through the kernel; false when any of
/// it is not mapped readable.
fn read(addr: u64, buf: &mut [u8]) -> bool {
    if buf.is_empty() {
        return true;
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: the local iovec covers `buf`; the kernel checks the remote range (a bad
    // address is an error return, never a fault here).
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    n == buf.len() as isize
}

fn word(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap_or([0; 8]))
}

fn half(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap_or([0; 4]))
}

/// CPython's version (`Py_Version`, 3.11+; `Py_GetVersion()` for 3.6 to 3.10) as (major,
/// minor), when the process runs CPython. `Some((0, 0))`: another version with
/// `Py_GetVersion` (2.x, 3.5 and older).
pub fn python_version() -> Option<(u32, u32)> {
    // SAFETY: lookups of NUL-terminated names in the global scope.
    let v = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"Py_Version".as_ptr()) } as u64;
    if v == 0 {
        // SAFETY: as above.
        let old = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"Py_GetVersion".as_ptr()) };
        if old.is_null() {
            return None;
        }
        return Some(crate::python::older_minor().map_or((0, 0), |m| (3, u32::from(m))));
    }
    let mut b = [0u8; 8];
    if !read(v, &mut b[..std::mem::size_of::<libc::c_ulong>()]) {
        return None;
    }
    let v = u64::from_le_bytes(b);
    Some((((v >> 24) & 0xff) as u32, ((v >> 16) & 0xff) as u32))
}

/// pymalloc's layout of CPython `major.minor`, when this module knows it.
pub fn layout_of(major: u32, minor: u32) -> Option<Layout> {
    match (major, minor) {
        (3, 10..=13) => Some(LARGE),
        (3, 6..=9) => Some(SMALL),
        _ => None,
    }
}

/// One arena entry that checks out: its index, first pool, end of its used pools.
#[derive(Debug, Clone, Copy)]
struct Arena {
    index: u32,
    first_pool: u64,
    pool_end: u64,
}

/// Checks the arena entry `e` (48 bytes) at index `i`: `Ok(Some)` a used arena, `Ok(None)`
/// an unused entry, `Err` not an arena entry.
fn check_entry(l: Layout, e: &[u8], i: u64) -> Result<Option<Arena>, ()> {
    let address = word(e, 0);
    if address == 0 {
        return Ok(None);
    }
    let pool_address = word(e, 8);
    let (nfree, ntotal) = (half(e, 16), half(e, 20));
    let first_pool = address.checked_add(l.pool - 1).ok_or(())? & !(l.pool - 1);
    let full = (l.arena / l.pool) as u32 - u32::from(address & (l.pool - 1) != 0);
    let end = address.checked_add(l.arena).ok_or(())?;
    if address & 15 != 0
        || ntotal != full
        || nfree > ntotal
        || pool_address < first_pool
        || pool_address > end
        || !(pool_address - first_pool).is_multiple_of(l.pool)
        || i >= u32::MAX as u64
    {
        return Err(());
    }
    Ok(Some(Arena {
        index: i as u32,
        first_pool,
        pool_end: pool_address,
    }))
}

/// The used arenas of the candidate array `b` (a glibc block): empty when it is not
/// pymalloc's `arenas`. Entries past the array's end (`maxarenas`, a multiple of 16) are
/// whatever the block holds there.
fn arenas_of(l: Layout, b: Block, out: &mut crate::glibc_heap::Vecm<Arena>) -> bool {
    let n = (b.size / ARENA_OBJECT).min(MAX_ARENAS);
    if n < 16 {
        return false;
    }
    let mark = out.as_slice().len();
    const BATCH: u64 = 64;
    let mut batch = [0u8; (BATCH * ARENA_OBJECT) as usize];
    let mut used = 0;
    for i in 0..n {
        let k = i % BATCH;
        if k == 0 {
            // pymalloc hands out the lowest unused entries first: an array with no arena
            // in its first 64 entries is not taken for one (a zeroed block is not read to
            // its end).
            if i == BATCH && used == 0 {
                return false;
            }
            let len = ((n - i).min(BATCH) * ARENA_OBJECT) as usize;
            if !read(b.addr + i * ARENA_OBJECT, &mut batch[..len]) {
                truncate(out, mark);
                return false;
            }
        }
        let e = &batch[(k * ARENA_OBJECT) as usize..((k + 1) * ARENA_OBJECT) as usize];
        match check_entry(l, e, i) {
            Ok(Some(a)) => {
                // The first pool, when there is one, must name this arena.
                if a.pool_end > a.first_pool {
                    let mut h = [0u8; POOL_OVERHEAD as usize];
                    if !read(a.first_pool, &mut h) || half(&h, 32) as u64 != i {
                        truncate(out, mark);
                        return false;
                    }
                }
                out.push(a);
                used += 1;
            }
            Ok(None) => {}
            // Past `maxarenas` (a multiple of 16): whatever the block holds there.
            Err(()) if i.is_multiple_of(16) && used > 0 => break,
            Err(()) => {
                truncate(out, mark);
                return false;
            }
        }
    }
    if used == 0 {
        truncate(out, mark);
        return false;
    }
    true
}

fn truncate(v: &mut crate::glibc_heap::Vecm<Arena>, len: usize) {
    v.truncate(len);
}

/// Pushes the allocated blocks of the pool at `p` of arena `a` into `out` (their size class
/// sizes); false when the pool does not check out. `buf` holds a pool of layout `l`.
fn pool(l: Layout, p: u64, a: &Arena, buf: &mut [u8], out: &mut Blocks, found: &mut Found) -> bool {
    let Some(buf) = buf.get_mut(..l.pool as usize) else {
        return false;
    };
    if !read(p, buf) {
        return false;
    }
    let count = half(buf, 0) as u64;
    if count == 0 {
        return true; // an empty pool (on the arena's free list)
    }
    let (freeblock, arenaindex, szidx) = (word(buf, 8), half(buf, 32), half(buf, 36));
    let (next, maxnext) = (half(buf, 40) as u64, half(buf, 44) as u64);
    if arenaindex != a.index || szidx >= SIZE_CLASSES {
        return false;
    }
    let size = 16 * (szidx as u64 + 1);
    if maxnext != l.pool - size
        || next < POOL_OVERHEAD
        || next > maxnext + size
        || !(next - POOL_OVERHEAD).is_multiple_of(size)
    {
        return false;
    }
    let carved = (next - POOL_OVERHEAD) / size;
    if count > carved {
        return false;
    }
    // The free list: every entry a block below `next`, each once.
    let mut free = [0u64; (POOL_SIZE / 16 / 64) as usize];
    let mut nfree = 0u64;
    let mut f = freeblock;
    while f != 0 {
        if f < p + POOL_OVERHEAD || f >= p + next || !(f - p - POOL_OVERHEAD).is_multiple_of(size) {
            return false;
        }
        let k = (f - p - POOL_OVERHEAD) / size;
        if free[(k / 64) as usize] & (1 << (k % 64)) != 0 || nfree >= carved {
            return false;
        }
        free[(k / 64) as usize] |= 1 << (k % 64);
        nfree += 1;
        f = word(buf, (f - p) as usize);
    }
    if count + nfree != carved {
        return false;
    }
    for k in 0..carved {
        if free[(k / 64) as usize] & (1 << (k % 64)) == 0 {
            out.push(Block {
                addr: p + POOL_OVERHEAD + k * size,
                size,
            });
            found.blocks += 1;
            found.bytes += size;
        }
    }
    true
}

/// Finds pymalloc's allocated blocks into `out`, its `arenas` array searched among `heap`
/// (the glibc walk's blocks). Call with every other thread stopped. Errors: why nothing was
/// found (not CPython, a version whose layout is not known, no arenas).
pub fn walk(heap: &[Block], out: &mut Blocks) -> Result<Found, &'static str> {
    let (major, minor) = python_version().ok_or("not CPython")?;
    let Some(l) = layout_of(major, minor) else {
        return Err(
            "this CPython's pymalloc layout is not known to heapdump (3.6 to 3.13 are): its \
             objects made before the attach are not recorded",
        );
    };
    let mut arenas = crate::glibc_heap::Vecm::new();
    let mut candidates = 0;
    for &b in heap {
        if b.size >= 16 * ARENA_OBJECT && b.addr & 15 == 0 && arenas_of(l, b, &mut arenas) {
            candidates += 1;
        }
    }
    if candidates == 0 {
        return Err(
            "pymalloc's arenas were not found (PYTHONMALLOC=malloc, or none made yet): no \
             pymalloc object made before the attach is recorded",
        );
    }
    if candidates > 1 {
        return Err("two blocks look like pymalloc's arenas: none is trusted");
    }
    let buf = crate::sys::map_anon(POOL_SIZE as usize);
    if buf.is_null() {
        return Err("out of memory");
    }
    // SAFETY: a fresh mapping of POOL_SIZE bytes, ours until unmapped below.
    let pool_buf = unsafe { std::slice::from_raw_parts_mut(buf, POOL_SIZE as usize) };
    let mut found = Found::default();
    for a in arenas.as_slice() {
        found.arenas += 1;
        let mut p = a.first_pool;
        while p < a.pool_end {
            if !pool(l, p, a, pool_buf, out, &mut found) {
                found.bad_pools += 1;
            }
            p += l.pool;
        }
    }
    // SAFETY: mapped above, no longer used.
    unsafe { crate::sys::unmap(buf, POOL_SIZE as usize) };
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::glibc_heap::Vecm;

    fn entry(address: u64, pool_address: u64, ntotal: u32) -> [u8; 48] {
        let mut e = [0u8; 48];
        e[0..8].copy_from_slice(&address.to_le_bytes());
        e[8..16].copy_from_slice(&pool_address.to_le_bytes());
        e[20..24].copy_from_slice(&ntotal.to_le_bytes());
        e
    }

    /// A made-up arena of each layout (aligned) whose first pool holds 3 blocks of 32 bytes
    /// carved, the middle one free; its arenas array (16 entries, the first used) in a Vec.
    #[test]
    fn walks_a_made_up_arena_exactly() {
        for l in [LARGE, SMALL] {
            let map = crate::sys::map_anon(2 * l.arena as usize);
            assert!(!map.is_null());
            let arena = ((map as u64) + l.arena - 1) & !(l.arena - 1);
            let p = arena;
            let hdr = |off: u64, v: u64, wide: bool| {
                // SAFETY: inside the mapping made above.
                unsafe {
                    if wide {
                        ((p + off) as *mut u64).write(v)
                    } else {
                        ((p + off) as *mut u32).write(v as u32)
                    }
                }
            };
            hdr(0, 2, false); // count
            hdr(8, p + 48 + 32, true); // freeblock: block 1
            hdr(32, 0, false); // arenaindex
            hdr(36, 1, false); // szidx: 32 bytes
            hdr(40, 48 + 3 * 32, false); // nextoffset
            hdr(44, l.pool - 32, false); // maxnextoffset
            let mut array = vec![0u8; 16 * 48];
            array[..48].copy_from_slice(&entry(arena, arena + l.pool, (l.arena / l.pool) as u32));
            let b = Block {
                addr: array.as_ptr() as u64,
                size: array.len() as u64,
            };
            let mut arenas = Vecm::new();
            assert!(arenas_of(l, b, &mut arenas), "{l:?}");
            assert_eq!(arenas.as_slice().len(), 1);
            let mut buf = vec![0u8; POOL_SIZE as usize];
            let mut out = Blocks::new();
            let mut found = Found::default();
            let a = arenas.as_slice()[0];
            assert!(pool(l, p, &a, &mut buf, &mut out, &mut found));
            let got: Vec<(u64, u64)> = out.as_slice().iter().map(|b| (b.addr, b.size)).collect();
            assert_eq!(got, [(p + 48, 32), (p + 48 + 64, 32)], "{l:?}");
            // A count that does not add up with the free list: the pool is refused.
            hdr(0, 3, false);
            assert!(!pool(l, p, &a, &mut buf, &mut out, &mut found));
            // A free list that loops: refused.
            hdr(0, 2, false);
            hdr(48 + 32, p + 48 + 32, true);
            assert!(!pool(l, p, &a, &mut buf, &mut out, &mut found));
            // SAFETY: mapped above, no longer used.
            unsafe { crate::sys::unmap(map, 2 * l.arena as usize) };
        }
    }

    /// Entries pointing at memory that is not mapped, or garbage: nothing is taken, and
    /// nothing faults (every read goes through the kernel).
    #[test]
    fn wrong_guesses_record_nothing() {
        let mut array = vec![0u8; 64 * 48];
        // An arena at an unmapped address (its first pool cannot be read).
        array[..48].copy_from_slice(&entry(1 << 40, (1 << 40) + POOL_SIZE, 64));
        let l = LARGE;
        let b = Block {
            addr: array.as_ptr() as u64,
            size: array.len() as u64,
        };
        let mut arenas = Vecm::new();
        assert!(!arenas_of(l, b, &mut arenas));
        // Garbage.
        for (i, x) in array.iter_mut().enumerate() {
            *x = (i * 37 % 251) as u8;
        }
        assert!(!arenas_of(l, b, &mut arenas));
        // All zero: no arena.
        array.iter_mut().for_each(|x| *x = 0);
        assert!(!arenas_of(l, b, &mut arenas));
        assert!(arenas.as_slice().is_empty());
        // A pool at an unmapped address.
        let a = Arena {
            index: 0,
            first_pool: 1 << 40,
            pool_end: (1 << 40) + POOL_SIZE,
        };
        let mut buf = vec![0u8; POOL_SIZE as usize];
        let mut out = Blocks::new();
        assert!(!pool(
            l,
            1 << 40,
            &a,
            &mut buf,
            &mut out,
            &mut Found::default()
        ));
        assert!(out.as_slice().is_empty());
        // A candidate block whose end is not mapped.
        let b = Block {
            addr: (1 << 40) - 48 * 16,
            size: 48 * 64,
        };
        assert!(!arenas_of(l, b, &mut arenas));
    }
}
