//! Finding the blocks glibc's allocator has handed out, from inside the process, without
//! allocating (for `heapdump attach`: the blocks live before the shim was loaded).
//!
//! Layout of glibc 2.27 and later on x86-64 (`malloc/malloc.c`, `malloc/arena.c`):
//! - a chunk is `prev_size` (8 bytes), `size` (8 bytes: bytes of the chunk, flags in the low
//!   3 bits: `PREV_INUSE` 1, `IS_MMAPPED` 2, `NON_MAIN_ARENA` 4), then the user's bytes
//!   (the block's address is the chunk's + 16). A chunk is in use when the next chunk's
//!   `PREV_INUSE` is set, except the chunks in fastbins and in the per-thread caches (tcache),
//!   which keep it set; their `fd` pointers are "safe-linked" since 2.32
//!   (`stored = (address of the field >> 12) ^ pointer`).
//! - `struct malloc_state` (an arena, 2200 bytes): `mutex` 0, `flags` 4, `have_fastchunks` 8,
//!   `fastbinsY[10]` 16, `top` 96, `last_remainder` 104, `bins[254]` 112, `binmap[4]` 2144,
//!   `next` 2160, `next_free` 2168, `attached_threads` 2176, `system_mem` 2184. An empty bin
//!   `i` points at itself: `bins[2i] == bins[2i+1] == &bins[2i] - 16`.
//! - `main_arena` lives in libc's writable data; it is found by that signature (most bins of
//!   a live arena are empty), its `top` chunk inside `[heap]` ending at the break, and its
//!   `next` list coming back to it. Its heap starts at the start of `[heap]` and ends at `top`.
//! - other arenas' heaps are 64 MiB-aligned mappings starting with a `heap_info` (`ar_ptr`,
//!   `prev`, `size`, `mprotect_size`, and `pagesize` since 2.35: 32 or 48 bytes); the first
//!   heap of an arena holds its `malloc_state` right after; older heaps end with fenceposts.
//! - chunks of their own mapping (`mmap`ped, above `M_MMAP_THRESHOLD`) are in no list: they
//!   are found (read through the kernel, which reports a mapping gone instead of faulting)
//!   at the start of anonymous writable mappings (`prev_size` 0, `size` a multiple
//!   of the page with only `IS_MMAPPED` set), one after another when the kernel merged
//!   adjacent ones. One made by `memalign` with a large alignment starts further in and is
//!   missed (its free is still passed to glibc).
//! - a thread's tcache (`tcache_perthread_struct`: `counts[64]` as u16, `entries[64]`) is a
//!   0x290-byte chunk; it is recognised by its contents (every count matching a chain of that
//!   many entries of the right size, all with the same `key`), and it and its entries are left
//!   out. A thread's cache with no entry at all cannot be told from a zeroed block and is
//!   reported as a block.
//!
//! Every other thread must be stopped outside the allocator while this runs (the collector
//! does that); every pointer taken from the heap is checked against the ranges found before
//! it is followed.

use crate::sys::{map_anon, read_file, unmap};

/// One block in use: the address the program got, and its usable size (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Block {
    /// Address returned by the allocator.
    pub addr: u64,
    /// Usable bytes (`malloc_usable_size`): the chunk's size less its header.
    pub size: u64,
}

/// A growable array in anonymous mappings (never the allocator).
#[derive(Debug)]
pub struct Vecm<T: Copy> {
    ptr: *mut T,
    len: usize,
    cap: usize,
}

/// The blocks found.
pub type Blocks = Vecm<Block>;

impl<T: Copy> Vecm<T> {
    /// Empty; maps nothing yet.
    pub const fn new() -> Self {
        Vecm {
            ptr: std::ptr::null_mut(),
            len: 0,
            cap: 0,
        }
    }

    /// Appends `v`; false when no memory could be mapped.
    pub fn push(&mut self, v: T) -> bool {
        if self.len == self.cap {
            let cap = (self.cap * 2).max(4096 / std::mem::size_of::<T>().max(1));
            let p = map_anon(cap * std::mem::size_of::<T>()) as *mut T;
            if p.is_null() {
                return false;
            }
            if !self.ptr.is_null() {
                // SAFETY: both mappings hold at least `len` elements; they do not overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(self.ptr, p, self.len);
                    unmap(self.ptr as *mut u8, self.cap * std::mem::size_of::<T>());
                }
            }
            self.ptr = p;
            self.cap = cap;
        }
        // SAFETY: `len < cap` elements are mapped.
        unsafe { self.ptr.add(self.len).write(v) };
        self.len += 1;
        true
    }

    /// The elements.
    pub fn as_slice(&self) -> &[T] {
        if self.ptr.is_null() {
            return &[];
        }
        // SAFETY: `len` initialised elements at `ptr`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Keeps the first `len` elements.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// The elements, mutable (to sort them).
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        if self.ptr.is_null() {
            return &mut [];
        }
        // SAFETY: as above, and `self` is borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Unmaps the storage.
    pub fn release(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: the mapping is ours; nothing refers to it after this.
            unsafe { unmap(self.ptr as *mut u8, self.cap * std::mem::size_of::<T>()) };
        }
        self.ptr = std::ptr::null_mut();
        self.len = 0;
        self.cap = 0;
    }
}

// SAFETY: a `Vecm` owns its mapping (nothing else refers to it), as a `Vec` owns its buffer.
unsafe impl<T: Copy + Send> Send for Vecm<T> {}

impl<T: Copy> Default for Vecm<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Copy> Drop for Vecm<T> {
    fn drop(&mut self) {
        self.release();
    }
}

const MINSIZE: u64 = 32;
const HEAP_MAX: u64 = 64 << 20;
const ARENA_SIZE: u64 = 2200;
const TOP: u64 = 96;
const BINS: u64 = 112;
const NEXT: u64 = 2160;
const SYSTEM_MEM: u64 = 2184;
const TCACHE_CHUNK: u64 = 0x290;
/// Most steps along any list or heap (a damaged heap ends the walk, not the process).
const MAX_STEPS: usize = 1 << 26;

/// A mapping of `/proc/self/maps`.
#[derive(Debug, Clone, Copy)]
struct Map {
    start: u64,
    end: u64,
    /// 0 anonymous read-write, 1 `[heap]`, 2 libc read-write, 3 other.
    kind: u8,
}

/// The ranges reads may go to: `[heap]` and the other arenas' heaps.
struct Ranges {
    heaps: Vecm<(u64, u64)>,
}

impl Ranges {
    fn contains(&self, a: u64, len: u64) -> bool {
        self.heaps
            .as_slice()
            .iter()
            .any(|&(s, e)| a >= s && a.checked_add(len).is_some_and(|x| x <= e))
    }
}

/// Reads the word at `a`.
///
/// # Safety
/// `a..a+8` is mapped and readable.
unsafe fn rd(a: u64) -> u64 {
    // SAFETY: per the contract.
    unsafe { (a as *const u64).read_unaligned() }
}

/// Finds the blocks in use in glibc's heap (see the module docs) into `out`. Errors: why the
/// heap was not walked (then `out` holds nothing).
pub fn walk(out: &mut Blocks) -> Result<(), &'static str> {
    let (major, minor) = glibc_version().ok_or("the C library is not glibc")?;
    if major != 2 || minor < 27 {
        return Err("glibc older than 2.27: its heap layout is not known to heapdump");
    }
    if !malloc_is_glibcs() {
        return Err("the program's malloc is not glibc's (another allocator is linked in)");
    }
    let safe_linking = minor >= 32;
    let mut maps: Vecm<Map> = Vecm::new();
    read_maps(&mut maps).ok_or("cannot read /proc/self/maps")?;
    let heap = maps.as_slice().iter().find(|m| m.kind == 1).copied();
    let arena = find_main_arena(maps.as_slice(), heap).ok_or("glibc's main arena not found")?;
    let mut ranges = Ranges { heaps: Vecm::new() };
    if let Some(h) = heap {
        ranges.heaps.push((h.start, h.end));
    }
    // The arenas, main first, and their heaps.
    let mut arenas: Vecm<u64> = Vecm::new();
    arenas.push(arena);
    let mut a = arena;
    for _ in 0..4096 {
        // SAFETY: `a` is main_arena (validated) or an arena validated below.
        let next = unsafe { rd(a + NEXT) };
        if next == arena {
            break;
        }
        if !arena_heaps(next, &maps, &mut ranges) {
            return Err("an arena's heaps are not where glibc keeps them");
        }
        arenas.push(next);
        a = next;
    }
    // Pass 1: the chunks marked in use, and the free ones in fastbins.
    let mut used: Blocks = Vecm::new();
    let mut free: Vecm<u64> = Vecm::new();
    let mut tcaches: Vecm<u64> = Vecm::new();
    for &a in arenas.as_slice() {
        fastbins(a, safe_linking, &ranges, &mut free);
        if a == arena {
            if let Some(h) = heap {
                // SAFETY: `top` of the validated main arena.
                let top = unsafe { rd(a + TOP) };
                if top >= h.start
                    && top < h.end
                    && !walk_chunks(h.start, top, true, &mut used, &mut tcaches)
                {
                    return Err("the main heap's chunks do not chain up to its top");
                }
            }
        } else if !walk_arena(a, &ranges, &mut used, &mut tcaches) {
            return Err("an arena's chunks do not chain up to its top");
        }
    }
    // The per-thread caches' chunks.
    for &t in tcaches.as_slice() {
        tcache(t, safe_linking, &ranges, &mut free);
    }
    free.as_mut_slice().sort_unstable();
    for b in used.as_slice() {
        if free.as_slice().binary_search(&(b.addr - 16)).is_err() && !out.push(*b) {
            return Err("out of memory");
        }
    }
    // Chunks of their own mapping.
    for m in maps.as_slice() {
        if m.kind == 0 && !ranges.contains(m.start, 16) {
            mmapped_chunks(m.start, m.end, out);
        }
    }
    Ok(())
}

/// glibc's version, from `gnu_get_libc_version`.
fn glibc_version() -> Option<(u32, u32)> {
    extern "C" {
        fn gnu_get_libc_version() -> *const libc::c_char;
    }
    // SAFETY: returns a static NUL-terminated string.
    let v = unsafe { std::ffi::CStr::from_ptr(gnu_get_libc_version()) }.to_bytes();
    let mut it = v.split(|b| *b == b'.');
    let num = |s: &[u8]| -> Option<u32> {
        let mut n = 0u32;
        for &c in s.iter().take_while(|c| c.is_ascii_digit()) {
            n = n.checked_mul(10)?.checked_add((c - b'0') as u32)?;
        }
        Some(n)
    };
    Some((num(it.next()?)?, num(it.next()?)?))
}

/// Whether `malloc` as the program sees it (first in the global scope) is libc's: the lookup
/// finds libc's, or an executable's PLT entry (a non-PIE executable that takes `malloc`'s
/// address makes that its canonical address; `dladdr` finds no `malloc` defined there),
/// rather than a `malloc` another object defines (jemalloc, tcmalloc, mimalloc linked in).
fn malloc_is_glibcs() -> bool {
    extern "C" {
        fn __libc_malloc(size: libc::size_t) -> *mut libc::c_void;
    }
    // SAFETY: a lookup of a NUL-terminated name in the global scope.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) } as usize;
    if f == __libc_malloc as *const () as usize {
        return true;
    }
    extern "C" {
        fn dladdr1(
            addr: *const libc::c_void,
            info: *mut libc::Dl_info,
            extra: *mut *mut libc::c_void,
            flags: libc::c_int,
        ) -> libc::c_int;
    }
    const RTLD_DL_SYMENT: libc::c_int = 1;
    // SAFETY: a zeroed Dl_info is valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut sym: *mut libc::c_void = std::ptr::null_mut();
    // SAFETY: dladdr1 fills `info` and points `sym` at the matching ELF symbol, if any.
    if unsafe {
        dladdr1(
            f as *const libc::c_void,
            &mut info,
            &mut sym,
            RTLD_DL_SYMENT,
        )
    } == 0
        || sym.is_null()
    {
        return false;
    }
    // SAFETY: with RTLD_DL_SYMENT, `sym` points at the symbol's `Elf64_Sym`.
    let s = unsafe { &*(sym as *const libc::Elf64_Sym) };
    let defines_malloc = info.dli_saddr as usize == f
        && s.st_shndx != 0 // SHN_UNDEF: a canonical PLT entry, not a definition
        && !info.dli_sname.is_null()
        // SAFETY: dli_sname is a NUL-terminated string owned by the loader.
        && unsafe { std::ffi::CStr::from_ptr(info.dli_sname) }.to_bytes() == b"malloc";
    !defines_malloc
}

/// Parses `/proc/self/maps` into `out`.
fn read_maps(out: &mut Vecm<Map>) -> Option<()> {
    let mut cap = 1usize << 20;
    loop {
        let buf = map_anon(cap);
        if buf.is_null() {
            return None;
        }
        // SAFETY: a fresh mapping of `cap` bytes.
        let b = unsafe { std::slice::from_raw_parts_mut(buf, cap) };
        let n = read_file(b"/proc/self/maps\0", b);
        if n == cap && cap < (1 << 28) {
            // SAFETY: ours, unused.
            unsafe { unmap(buf, cap) };
            cap *= 4;
            continue;
        }
        for line in b[..n].split(|c| *c == b'\n') {
            if let Some(m) = parse_map(line) {
                out.push(m);
            }
        }
        // SAFETY: ours, no longer used.
        unsafe { unmap(buf, cap) };
        return Some(());
    }
}

fn parse_map(line: &[u8]) -> Option<Map> {
    let mut f = line.split(|c| *c == b' ').filter(|s| !s.is_empty());
    let range = f.next()?;
    let perms = f.next()?;
    let (_off, _dev, _inode) = (f.next()?, f.next()?, f.next()?);
    let path = f.next().unwrap_or(b"");
    let dash = range.iter().position(|c| *c == b'-')?;
    let hex = |s: &[u8]| -> Option<u64> {
        let mut v = 0u64;
        for &c in s {
            v = v.checked_mul(16)? + (c as char).to_digit(16)? as u64;
        }
        Some(v)
    };
    let (start, end) = (hex(&range[..dash])?, hex(&range[dash + 1..])?);
    let rw = perms.starts_with(b"rw");
    let file = path.rsplit(|c| *c == b'/').next().unwrap_or(path);
    let kind = if path == b"[heap]" {
        1
    } else if rw && (file.starts_with(b"libc.so") || file.starts_with(b"libc-2")) {
        2
    } else if rw && path.is_empty() {
        0
    } else {
        3
    };
    Some(Map { start, end, kind })
}

/// `main_arena`, by its signature in libc's writable data (and the anonymous mapping right
/// after it, its `.bss`).
fn find_main_arena(maps: &[Map], heap: Option<Map>) -> Option<u64> {
    for (i, m) in maps.iter().enumerate() {
        if m.kind != 2 {
            continue;
        }
        // libc's data and the bss mapping that follows it.
        let mut end = m.end;
        if let Some(n) = maps.get(i + 1) {
            if n.kind == 0 && n.start == m.end {
                end = n.end;
            }
        }
        let mut c = m.start;
        while c + ARENA_SIZE <= end {
            if is_main_arena(c, heap) {
                return Some(c);
            }
            c += 8;
        }
    }
    None
}

fn is_main_arena(c: u64, heap: Option<Map>) -> bool {
    // SAFETY: `c..c+ARENA_SIZE` lies in libc's readable, writable data (caller).
    let word = |off: u64| unsafe { rd(c + off) };
    let mut empty = 0;
    for i in 0..127u64 {
        let own = c + BINS + 16 * i - 16;
        if word(BINS + 16 * i) == own && word(BINS + 16 * i + 8) == own {
            empty += 1;
        }
    }
    if empty < 32 {
        return false;
    }
    let top = word(TOP);
    // Before the first allocation `top` is the unsorted bin's header.
    if top == c + TOP {
        return heap.is_none();
    }
    let Some(h) = heap else { return false };
    if top & 15 != 0 || top < h.start || top + 16 > h.end {
        return false;
    }
    // SAFETY: inside [heap].
    let tsize = unsafe { rd(top + 8) } & !7;
    top + tsize == h.end && word(SYSTEM_MEM) >= tsize && word(NEXT) != 0
}

/// Adds the heaps of the non-main arena `a` to `ranges`; false when they do not check out.
fn arena_heaps(a: u64, maps: &Vecm<Map>, ranges: &mut Ranges) -> bool {
    let mapped = |s: u64, len: u64| {
        maps.as_slice()
            .iter()
            .any(|m| m.kind == 0 && s >= m.start && s + len <= m.end)
    };
    if a & 7 != 0 || !mapped(a, ARENA_SIZE) {
        return false;
    }
    // SAFETY: checked mapped just above.
    let top = unsafe { rd(a + TOP) };
    let mut h = top & !(HEAP_MAX - 1);
    for _ in 0..4096 {
        if !mapped(h, 48) {
            return false;
        }
        // SAFETY: checked mapped.
        let (ar, prev, size) = unsafe { (rd(h), rd(h + 8), rd(h + 16)) };
        if ar != a || size > HEAP_MAX || !mapped(h, size) {
            return false;
        }
        ranges.heaps.push((h, h + size));
        if prev == 0 {
            return h == a & !(HEAP_MAX - 1);
        }
        h = prev;
    }
    false
}

/// Walks the chunks from `start` to `top` (exclusive; `to_top`) or to the fenceposts that
/// end an older heap, pushing those marked in use into `used` and the 0x290-byte ones into
/// `tcaches` too. False when the chain is broken.
fn walk_chunks(
    start: u64,
    end: u64,
    to_top: bool,
    used: &mut Blocks,
    tcaches: &mut Vecm<u64>,
) -> bool {
    let mut p = start;
    for _ in 0..MAX_STEPS {
        if to_top && p == end {
            return true;
        }
        if p + 16 > end {
            return !to_top && p == end;
        }
        // SAFETY: `p + 16 <= end`, inside the heap being walked.
        let size = unsafe { rd(p + 8) } & !7;
        if !to_top && size < MINSIZE {
            // The fenceposts ending an older heap (16 bytes, then 0).
            return size == 16 || size == 0;
        }
        if size < MINSIZE || size & 15 != 0 || p + size > end {
            return false;
        }
        let next = p + size;
        // The next chunk's header (the top chunk's for the last one) is inside the heap.
        let in_use = if next + 16 <= end || (to_top && next == end) {
            // SAFETY: `next + 16 <= end` or `next` is the top chunk, whose header is in the
            // heap.
            let head = unsafe { rd(next + 8) };
            head & 1 == 1
        } else {
            false
        };
        if in_use {
            used.push(Block {
                addr: p + 16,
                size: size - 8,
            });
            if size == TCACHE_CHUNK {
                tcaches.push(p + 16);
            }
        }
        p = next;
    }
    false
}

/// Walks every heap of the non-main arena `a` (see [`arena_heaps`]).
fn walk_arena(a: u64, ranges: &Ranges, used: &mut Blocks, tcaches: &mut Vecm<u64>) -> bool {
    // SAFETY: `a` was validated by arena_heaps.
    let top = unsafe { rd(a + TOP) };
    let mut h = top & !(HEAP_MAX - 1);
    let first = a & !(HEAP_MAX - 1);
    for _ in 0..4096 {
        // SAFETY: validated by arena_heaps.
        let (prev, size) = unsafe { (rd(h + 8), rd(h + 16)) };
        let end = h + size;
        let top_here = top >= h && top < end;
        let stop = if top_here { top } else { end };
        let ok = if h == first {
            // The arena's own first heap: chunks start after its malloc_state, aligned so
            // that the user's address is a multiple of 16.
            let mut s = a + ARENA_SIZE;
            s += (16 - (s + 16) % 16) % 16;
            walk_chunks(s, stop, top_here, used, tcaches)
        } else {
            // heap_info is 48 bytes since 2.35, 32 before: the start whose chain checks out.
            let mark = (used.len, tcaches.len);
            walk_chunks(h + 48, stop, top_here, used, tcaches) || {
                used.len = mark.0;
                tcaches.len = mark.1;
                walk_chunks(h + 32, stop, top_here, used, tcaches)
            }
        };
        if !ok {
            return false;
        }
        if prev == 0 || h == first {
            return true;
        }
        h = prev;
    }
    let _ = ranges;
    false
}

/// Pushes the chunks in the fastbins of arena `a` into `free`.
fn fastbins(a: u64, safe_linking: bool, ranges: &Ranges, free: &mut Vecm<u64>) {
    for i in 0..10u64 {
        // SAFETY: inside the validated arena.
        let mut p = unsafe { rd(a + 16 + 8 * i) };
        let mut steps = 0;
        while p != 0 && p & 15 == 0 && ranges.contains(p, 32) && steps < MAX_STEPS {
            free.push(p);
            // SAFETY: checked inside a heap.
            let fd = unsafe { rd(p + 16) };
            p = if safe_linking {
                ((p + 16) >> 12) ^ fd
            } else {
                fd
            };
            steps += 1;
        }
    }
}

/// If `mem` (a 0x290-byte chunk's user address) is a thread's tcache, pushes it and its
/// entries' chunks into `free`.
///
/// A thread that is exiting (glibc's `tcache_thread_shutdown`, where a thread stopped for an
/// attach may be) empties its cache bin by bin, in order, without lowering the counts, and
/// then frees the cache itself, all inside glibc where the shim does not see it: such a cache
/// is recognised too (the bins before the one being emptied hold no entry, the rest hold as
/// many as they count), or its chunk and entries were recorded as blocks that nobody would
/// ever free through the shim (helper U, 1: under attach/detach cycles on a server with a
/// thread per connection, 8 of 45 snapshots found such a stale record overlapping a block).
fn tcache(mem: u64, safe_linking: bool, ranges: &Ranges, free: &mut Vecm<u64>) {
    let mark = free.len;
    let mut key = None;
    let mut entries = 0u64;
    // (a bin emptied below its count seen, a full bin seen, every count at most 7)
    let (mut short, mut intact, mut small) = (false, false, true);
    for i in 0..64u64 {
        // SAFETY: inside the 0x290-byte chunk (counts: 128 bytes, entries: 512).
        let count = unsafe { ((mem + 2 * i) as *const u16).read_unaligned() } as u64;
        // SAFETY: as above.
        let mut e = unsafe { rd(mem + 128 + 8 * i) };
        if count == 0 && e != 0 {
            free.len = mark;
            return;
        }
        small &= count <= 7;
        let mut found = 0;
        for _ in 0..count {
            if e == 0 {
                break;
            }
            if e & 15 != 0 || !ranges.contains(e - 16, 32) {
                free.len = mark;
                return;
            }
            // SAFETY: checked inside a heap.
            let (size, next, k) = unsafe { (rd(e - 8) & !7, rd(e), rd(e + 8)) };
            if size != 32 + 16 * i || *key.get_or_insert(k) != k {
                free.len = mark;
                return;
            }
            free.push(e - 16);
            entries += 1;
            found += 1;
            e = if safe_linking { (e >> 12) ^ next } else { next };
        }
        if e != 0 {
            free.len = mark;
            return;
        }
        if found < count {
            // Emptied by an exiting thread: only before every full bin.
            if intact {
                free.len = mark;
                return;
            }
            short = true;
        } else if count > 0 {
            intact = true;
        }
    }
    // No entry left: a cache emptied whole by an exiting thread, by its counts (at most 7,
    // glibc's default); one that never held an entry cannot be told from a zeroed block.
    if entries == 0 && !(short && small) {
        free.len = mark;
        return;
    }
    free.push(mem - 16);
}

/// Pushes the chunks of their own mapping found in the anonymous mapping `start..end`: at
/// any page of it (the kernel merges adjacent anonymous mappings, a library's `.bss` among
/// them, into one), one after another.
fn mmapped_chunks(start: u64, end: u64, out: &mut Blocks) {
    const BATCH: usize = 256;
    let mut p = start;
    while p + 16 <= end {
        let pages = (((end - p) / 4096) as usize).clamp(1, BATCH);
        let mut heads = [[0u64; 2]; BATCH];
        let got = read_pages(p, &mut heads[..pages]);
        if got == 0 {
            return; // unmapped since the list was read
        }
        let mut next = p + got as u64 * 4096;
        for (i, &[prev, head]) in heads[..got].iter().enumerate() {
            let q = p + i as u64 * 4096;
            let size = head & !7;
            if prev == 0 && head & 7 == 2 && size != 0 && size % 4096 == 0 && q + size <= end {
                out.push(Block {
                    addr: q + 16,
                    size: size - 16,
                });
                next = q + size;
                break;
            }
        }
        p = next;
    }
}

/// Reads the first two words of `out.len()` consecutive pages from `p`, through the kernel
/// (`process_vm_readv`: a mapping gone since the list was read is not a fault). Returns how
/// many pages were read.
fn read_pages(p: u64, out: &mut [[u64; 2]]) -> usize {
    const MAX: usize = 256;
    let n = out.len().min(MAX);
    let local = libc::iovec {
        iov_base: out.as_mut_ptr() as *mut libc::c_void,
        iov_len: n * 16,
    };
    let mut remote = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 16,
    }; MAX];
    for (i, r) in remote[..n].iter_mut().enumerate() {
        r.iov_base = (p + i as u64 * 4096) as *mut libc::c_void;
    }
    // SAFETY: the local iovec covers `out`; the kernel checks the remote ranges.
    let r = unsafe {
        libc::process_vm_readv(
            libc::getpid(),
            &local,
            1,
            remote.as_ptr(),
            n as libc::c_ulong,
            0,
        )
    };
    if r < 0 {
        0
    } else {
        r as usize / 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A heap of 32 KiB laid out by hand: a cache's chunk at the start (its user address
    /// returned), entry chunks from 0x1000 on.
    struct Heap {
        words: Vec<u64>,
        next: u64,
    }

    impl Heap {
        fn new() -> Heap {
            let mut h = Heap {
                words: vec![0; 4096],
                next: 0x1000,
            };
            h.words[1] = TCACHE_CHUNK | 1;
            h
        }
        fn base(&self) -> u64 {
            self.words.as_ptr() as u64
        }
        fn cache(&self) -> u64 {
            self.base() + 16
        }
        fn set(&mut self, a: u64, v: u64) {
            let i = ((a - self.base()) / 8) as usize;
            self.words[i] = v;
        }
        /// Bin `bin`: `count`, and a chain of `chain` entries (no safe linking, key 0x5a).
        fn bin(&mut self, bin: u64, count: u16, chain: u64) {
            let cache = self.cache();
            let mut first = 0;
            for _ in 0..chain {
                let chunk = self.base() + self.next;
                self.next += 32 + 16 * bin;
                self.set(chunk + 8, (32 + 16 * bin) | 1);
                self.set(chunk + 16, first);
                self.set(chunk + 24, 0x5a);
                first = chunk + 16;
            }
            let i = ((cache + 2 * bin - self.base()) / 8) as usize;
            let shift = ((cache + 2 * bin) % 8) * 8;
            self.words[i] = (self.words[i] & !(0xffff << shift)) | (u64::from(count) << shift);
            self.set(cache + 128 + 8 * bin, first);
        }
        /// How many chunks `tcache` left out (entries and the cache), 0 if not recognised.
        fn left_out(&self) -> usize {
            let mut ranges = Ranges { heaps: Vecm::new() };
            ranges.heaps.push((self.base(), self.base() + 8 * 4096));
            let mut free = Vecm::new();
            tcache(self.cache(), false, &ranges, &mut free);
            free.len
        }
    }

    #[test]
    fn a_cache_is_recognised_also_while_its_thread_empties_it() {
        let mut full = Heap::new();
        full.bin(0, 2, 2);
        full.bin(3, 1, 1);
        assert_eq!(full.left_out(), 4, "a cache as a running thread has it");
        // Exiting: bin 0 emptied (its count stays 2), bin 1 half emptied, bin 3 still full.
        let mut exiting = Heap::new();
        exiting.bin(0, 2, 0);
        exiting.bin(1, 3, 1);
        exiting.bin(3, 1, 1);
        assert_eq!(
            exiting.left_out(),
            3,
            "a cache its exiting thread is emptying"
        );
        let mut emptied = Heap::new();
        emptied.bin(0, 2, 0);
        emptied.bin(5, 7, 0);
        assert_eq!(
            emptied.left_out(),
            1,
            "a cache its exiting thread has emptied"
        );
        // Not a cache: a bin short of its count after a full one, a chain longer than its
        // count, a count with no chain beyond glibc's default, nothing at all.
        let mut odd = Heap::new();
        odd.bin(0, 1, 1);
        odd.bin(3, 2, 1);
        assert_eq!(odd.left_out(), 0);
        let mut long = Heap::new();
        long.bin(2, 1, 2);
        assert_eq!(long.left_out(), 0);
        let mut big = Heap::new();
        big.bin(0, 9, 0);
        assert_eq!(big.left_out(), 0);
        assert_eq!(Heap::new().left_out(), 0);
    }
}
