//! Building the reference graph of a running process: the live blocks of one snapshot, their
//! contents read from the target, and the roots found from `/proc/PID/maps`.
//!
//! * **Contents** are read with `process_vm_readv` in runs of neighbouring blocks (up to 8 MiB
//!   per call: per-block calls ran at 70–100 MiB/s here), falling back to one call per block
//!   where a run crosses memory that is gone. A block that cannot be read any more (freed and
//!   unmapped after the snapshot) has no edges and is counted in [`ScanStats::vanished`].
//! * **Edges**: every 8-byte-aligned word of a block whose value falls inside a live block (its
//!   first byte or any interior one), found by binary search in the blocks sorted by address.
//! * **Roots**: writable mappings that hold no live block — the modules' writable segments and
//!   the anonymous mapping right after a module's last one (`.data`, `.bss`: named by the data
//!   symbol covering each word), thread stacks (named by thread; from the stack pointer up when
//!   the thread is blocked in a system call and `/proc/PID/task/TID/syscall` tells it, else the
//!   whole mapping), and anonymous mappings the program manages itself (static TLS of the main
//!   thread lives in one). Not roots: `[heap]` and every mapping holding a live block (malloc's
//!   arenas and large chunks: only live blocks' contents are scanned there), the region file.
//!   The shim's own address index stores addresses with their top bits flipped, so it points at
//!   nothing.
//!
//! The target is not stopped: contents are read after the snapshot instant. A block freed after
//! it keeps its place in the graph (its memory may hold anything by then), and a pointer moved
//! from one place to another while the scan runs can make a reachable block look unreachable.

use super::{Block, Graph, Root, RootKind};
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;
use vmo_layout::Module;

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Readable.
    pub read: bool,
    /// Writable.
    pub write: bool,
    /// The path or pseudo-name (`[stack]`, `[heap]`), empty for anonymous memory.
    pub path: String,
}

/// Whether `[start, end)` lies wholly in readable mappings of `maps` (sorted by address, as
/// `/proc/PID/maps` lists them): memory a block can only be read from. A block claiming more
/// (a crafted size, or one freed and unmapped since the snapshot) is not read at all, so the
/// work of reading is bounded by what the target has mapped, not by what its region says.
pub fn readable(maps: &[Mapping], start: u64, end: u64) -> bool {
    let mut at = start;
    let mut i = maps.partition_point(|m| m.end <= start);
    while at < end {
        match maps.get(i) {
            Some(m) if m.read && m.start <= at => {
                at = m.end;
                i += 1;
            }
            _ => return false,
        }
    }
    true
}

/// Parses `/proc/PID/maps`.
pub fn read_maps(pid: u32) -> Result<Vec<Mapping>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .with_context(|| format!("reading /proc/{pid}/maps"))?;
    Ok(text.lines().filter_map(parse_maps_line).collect())
}

fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut it = line.splitn(6, ' ');
    let range = it.next()?;
    let perms = it.next()?.as_bytes();
    let (_offset, _dev, _inode) = (it.next()?, it.next()?, it.next()?);
    let path = it.next().unwrap_or("").trim().to_owned();
    let (a, b) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(a, 16).ok()?,
        end: u64::from_str_radix(b, 16).ok()?,
        read: perms.first() == Some(&b'r'),
        write: perms.get(1) == Some(&b'w'),
        path,
    })
}

/// Reads the target's memory.
#[derive(Debug)]
pub struct Memory {
    pid: u32,
    /// `/proc/PID/mem`, used when `process_vm_readv` is not allowed (seccomp) but the file is.
    mem: Option<std::fs::File>,
}

impl Memory {
    /// Checks that the target's memory can be read; the error names the fix when it cannot.
    pub fn open(pid: u32, probe: u64) -> Result<Memory> {
        let mut m = Memory { pid, mem: None };
        let mut b = [0u8; 8];
        if m.vm_read(probe, &mut b) == 8 {
            return Ok(m);
        }
        let err = std::io::Error::last_os_error();
        if let Ok(f) = std::fs::File::open(format!("/proc/{pid}/mem")) {
            m.mem = Some(f);
            if m.read(probe, &mut b) == 8 {
                return Ok(m);
            }
        }
        // A process that exited (or is a zombie: its memory is gone) is not a permission
        // problem: ESRCH, or no running process of that pid now.
        if err.raw_os_error() == Some(libc::ESRCH)
            || matches!(crate::regions::proc_state(pid), None | Some('Z' | 'X'))
        {
            bail!("pid {pid} exited during the read ({err}): its memory is gone");
        }
        let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        bail!(
            "cannot read the memory of pid {pid} ({err}): reading another process's memory needs \
             the right to ptrace it — run heapdump as the same user{}, as root, or with \
             CAP_SYS_PTRACE",
            if scope == "1" || scope == "2" {
                format!(" with /proc/sys/kernel/yama/ptrace_scope set to 0 (it is {scope})")
            } else {
                String::new()
            }
        )
    }

    fn vm_read(&self, addr: u64, buf: &mut [u8]) -> usize {
        vm_readv(self.pid, &mut [&mut buf[..]], &[addr])
    }

    /// Reads 16 bytes at each of `addrs` into `out` (as two native words), with one system
    /// call per [`HEADER_BATCH`] addresses; `out` must be at least as long as `addrs`.
    /// Returns per address whether it could be read.
    pub fn read_many(&self, addrs: &[u64], out: &mut [[u64; 2]]) -> Vec<bool> {
        let mut ok = vec![false; addrs.len()];
        let mut from = 0usize;
        while from < addrs.len() {
            let to = if self.mem.is_none() {
                (from + HEADER_BATCH).min(addrs.len())
            } else {
                from + 1
            };
            let n = if self.mem.is_none() {
                let mut local: Vec<&mut [u8]> = out[from..to]
                    .iter_mut()
                    // SAFETY: `[u64; 2]` is 16 plain bytes, any byte pattern valid, borrowed
                    // mutably for as long as the byte slice.
                    .map(|o| unsafe { std::slice::from_raw_parts_mut(o.as_mut_ptr().cast(), 16) })
                    .collect();
                let got = vm_readv(self.pid, &mut local, &addrs[from..to]);
                // Whole elements read before the first that failed.
                (got / 16).min(to - from)
            } else {
                let mut b = [0u8; 16];
                let n = usize::from(self.read(addrs[from], &mut b) == 16);
                if n == 1 {
                    out[from] = [
                        u64::from_ne_bytes(b[..8].try_into().unwrap()),
                        u64::from_ne_bytes(b[8..].try_into().unwrap()),
                    ];
                }
                n
            };
            for o in &mut ok[from..from + n] {
                *o = true;
            }
            // The element that failed, if any, is skipped.
            from += n + usize::from(from + n < to);
        }
        ok
    }

    /// Reads up to `buf.len()` bytes at `addr`; returns how many were read (a prefix).
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> usize {
        match &self.mem {
            None => self.vm_read(addr, buf),
            Some(f) => {
                use std::os::unix::fs::FileExt;
                let mut n = 0;
                while n < buf.len() {
                    match f.read_at(&mut buf[n..], addr + n as u64) {
                        Ok(0) | Err(_) => break,
                        Ok(k) => n += k,
                    }
                }
                n
            }
        }
    }
}

/// What the scan did.
#[derive(Debug, Clone, Default)]
pub struct ScanStats {
    /// Live blocks whose contents were read.
    pub blocks_read: u64,
    /// Live blocks that could not be read any more (freed and unmapped since the snapshot).
    pub vanished: u64,
    /// Bytes of block contents read.
    pub bytes_read: u64,
    /// Bytes of roots read.
    pub root_bytes: u64,
    /// Bytes of large anonymous mappings not read: pages neither resident nor swapped out
    /// (never touched: they hold only zeros), found by `/proc/PID/pagemap`.
    pub root_bytes_untouched: u64,
    /// Edges found (after removing duplicates per block).
    pub edges: u64,
    /// Wall time of the scan, seconds.
    pub seconds: f64,
}

impl ScanStats {
    fn add(&mut self, o: &ScanStats) {
        self.blocks_read += o.blocks_read;
        self.bytes_read += o.bytes_read;
        self.vanished += o.vanished;
    }
}

/// `process_vm_readv` of process `pid`: `local[i]` filled from the target's address
/// `remote[i]` (as many bytes as `local[i]` holds), in order; the one wrapper of the
/// collector. Returns the bytes read: the kernel stops at the first range it cannot read, so
/// a prefix of the ranges is filled; 0 on any error (no such process, not allowed).
pub fn vm_readv(pid: u32, local: &mut [&mut [u8]], remote: &[u64]) -> usize {
    assert_eq!(
        local.len(),
        remote.len(),
        "one local buffer per remote address"
    );
    let lv: Vec<libc::iovec> = local
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        })
        .collect();
    let rv: Vec<libc::iovec> = (remote.iter().zip(local.iter()))
        .map(|(&a, b)| libc::iovec {
            iov_base: a as *mut libc::c_void,
            iov_len: b.len(),
        })
        .collect();
    // SAFETY: every local iovec describes one of `local`'s buffers, writable and borrowed for
    // the call; the kernel checks the remote ranges in the target.
    let n = unsafe {
        libc::process_vm_readv(
            pid as libc::pid_t,
            lv.as_ptr(),
            lv.len() as libc::c_ulong,
            rv.as_ptr(),
            rv.len() as libc::c_ulong,
            0,
        )
    };
    n.max(0) as usize
}

/// Longest `process_vm_readv` of block contents.
const RUN_MAX: u64 = 8 << 20;
/// Blocks closer than this are read in one run (the gap is read too).
const RUN_GAP: u64 = 64 << 10;

/// Granule of the block index: 256 bytes (about three small blocks).
const GRANULE_SHIFT: u32 = 8;
/// Blocks further apart than this start a new segment of the index (a gap costs 4 bytes per
/// granule in the table).
const SEGMENT_GAP: u64 = 1 << 20;
/// Granules of table a segment may spend per block on the gaps between its blocks.
const TABLE_PER_BLOCK: u64 = 64;
/// Blocks at least this large get a segment of their own, without a table.
const BIG_BLOCK: u64 = 64 << 10;

/// A run of the address space covered by [`Lookup`]: either one big block (no table) or
/// neighbouring blocks with a granule table.
#[derive(Debug, Clone, Copy)]
struct Segment {
    /// First byte covered (a block's address, rounded down to a granule for a table segment).
    start: u64,
    /// One past the last byte covered.
    end: u64,
    /// Index in `Lookup::first` of the segment's first granule (unused for a big block).
    table: usize,
    /// Blocks of the segment: `[first_block, end_block)`.
    first_block: u32,
    end_block: u32,
    /// A single big block, without a table.
    single: bool,
}

/// Finds the block containing an address among blocks sorted by address.
///
/// The covered address space is cut into segments (neighbouring blocks, or one big block);
/// a segment of small blocks has a table giving, for each 256-byte granule, the first block
/// that ends after the granule's start. A lookup is a binary search among the few segments
/// (cached), one load from the table and one or two blocks: two cache misses where the
/// previous design (a hash map per 4 KiB page, then a binary search among the page's ~40
/// blocks) took five or six, which made the scan memory-bound (72% of its time on those
/// loads, 10 M blocks). The table costs 4 bytes per 256 bytes of heap (~1.5 bytes per block).
struct Lookup<'a> {
    blocks: &'a [Block],
    lo: u64,
    hi: u64,
    segments: Vec<Segment>,
    /// Granule → index of the first block of its segment whose end is past the granule's start.
    first: Vec<u32>,
}

/// One past the last byte of `b` (a 0-byte block owns its address).
#[inline]
fn block_end(b: &Block) -> u64 {
    b.address.saturating_add(b.size.max(1))
}

impl<'a> Lookup<'a> {
    /// Indexes `blocks`, which must be sorted by address.
    fn new(blocks: &'a [Block]) -> Self {
        let mut segments: Vec<Segment> = Vec::new();
        let mut i = 0usize;
        while i < blocks.len() {
            let b = &blocks[i];
            if b.size >= BIG_BLOCK {
                segments.push(Segment {
                    start: b.address,
                    end: block_end(b),
                    table: 0,
                    first_block: i as u32,
                    end_block: i as u32 + 1,
                    single: true,
                });
                i += 1;
                continue;
            }
            // Small neighbours: up to a big block or a gap, and while the segment's table
            // stays within TABLE_PER_BLOCK granules per block plus two per granule of the
            // blocks' bytes — so that blocks a crafted region spreads just under
            // SEGMENT_GAP apart cost a few hundred bytes each, not 16 KiB.
            let start = b.address & !((1 << GRANULE_SHIFT) - 1);
            let mut end = block_end(b);
            let (mut count, mut bytes) = (1u64, b.size);
            let mut j = i + 1;
            while j < blocks.len()
                && blocks[j].size < BIG_BLOCK
                && blocks[j].address < end.saturating_add(SEGMENT_GAP)
            {
                let new_end = end.max(block_end(&blocks[j]));
                let granules = (new_end - start) >> GRANULE_SHIFT;
                let budget = TABLE_PER_BLOCK * (count + 1)
                    + ((bytes + blocks[j].size) >> (GRANULE_SHIFT - 1));
                if granules > budget {
                    break;
                }
                end = new_end;
                count += 1;
                bytes += blocks[j].size;
                j += 1;
            }
            segments.push(Segment {
                start,
                end,
                table: 0,
                first_block: i as u32,
                end_block: j as u32,
                single: false,
            });
            i = j;
        }
        // Blocks overlap only in a damaged region: keep the segments disjoint and ordered by
        // trimming each to start where the previous one ends.
        for k in 1..segments.len() {
            let prev_end = segments[k - 1].end;
            let s = &mut segments[k];
            if s.start < prev_end {
                s.start = prev_end.min(s.end);
            }
        }
        let mut first: Vec<u32> = Vec::new();
        for s in segments.iter_mut().filter(|s| !s.single) {
            s.table = first.len();
            let granules = ((s.end - s.start + (1 << GRANULE_SHIFT) - 1) >> GRANULE_SHIFT) as usize;
            first.reserve(granules);
            let mut g = 0usize;
            for k in s.first_block..s.end_block {
                let last = ((block_end(&blocks[k as usize]).max(s.start + 1) - 1 - s.start)
                    >> GRANULE_SHIFT) as usize;
                while g <= last.min(granules - 1) {
                    first.push(k);
                    g += 1;
                }
            }
            // Only reachable with overlapping blocks: the table must still cover the segment.
            while g < granules {
                first.push(s.end_block - 1);
                g += 1;
            }
        }
        Lookup {
            blocks,
            lo: segments.first().map_or(0, |s| s.start),
            hi: segments.iter().map(|s| s.end).max().unwrap_or(0),
            segments,
            first,
        }
    }

    /// Index of the live block holding byte `v`.
    #[inline]
    fn find(&self, v: u64) -> Option<u32> {
        if v < self.lo || v >= self.hi {
            return None;
        }
        let k = self
            .segments
            .partition_point(|s| s.start <= v)
            .checked_sub(1)?;
        let s = &self.segments[k];
        if v >= s.end {
            return None;
        }
        let mut i = if s.single {
            s.first_block
        } else {
            self.first[s.table + ((v - s.start) >> GRANULE_SHIFT) as usize]
        };
        while i < s.end_block {
            let b = &self.blocks[i as usize];
            if b.address > v {
                return None;
            }
            if v < block_end(b) {
                return Some(i);
            }
            i += 1;
        }
        None
    }

    /// Indices of the blocks the aligned words of `bytes` point into, appended to `out`
    /// (unsorted, with duplicates).
    fn scan_words(&self, bytes: &[u8], out: &mut Vec<u32>) {
        for w in bytes.chunks_exact(8) {
            let v = u64::from_ne_bytes(w.try_into().unwrap());
            if let Some(i) = self.find(v) {
                out.push(i);
            }
        }
    }
}

/// Builds the graph of process `pid` from the live blocks of a snapshot (any order).
///
/// `modules` is the region's module table (to name global roots by symbol), `region` the
/// region file (never a root), `private` the shim's memory that keeps copies of the
/// program's words ((start, bytes) from the region's thread slots: never roots either),
/// `progress` reports stages.
///
/// Errors: the target's memory cannot be read (the message names the fix), `/proc/PID/maps`
/// cannot be read (the process is gone).
pub fn build(
    pid: u32,
    mut blocks: Vec<Block>,
    modules: &[Module],
    region: &Path,
    private: &[(u64, u64)],
    stopped: Option<&super::stop::Stopped>,
    progress: &dyn Fn(&str),
) -> Result<(Graph, ScanStats)> {
    let started = Instant::now();
    // The snapshot validated them (`vmo_layout::check`); kept here too so that no address
    // arithmetic below can overflow, whoever calls this.
    blocks.retain(|b| {
        b.address
            .checked_add(b.size.max(1))
            .is_some_and(|e| e <= vmo_layout::check::USER_END)
    });
    blocks.sort_unstable_by_key(|b| b.address);
    blocks.dedup_by_key(|b| b.address);
    // The list may have been collected in place into a larger allocation (the snapshot's).
    blocks.shrink_to_fit();
    let maps = read_maps(pid).with_context(|| format!("pid {pid} exited during the read"))?;
    let probe = maps
        .iter()
        .find(|m| m.read && m.write)
        .map(|m| m.start)
        .unwrap_or(0);
    let mem = Memory::open(pid, probe)?;
    let lookup = Lookup::new(&blocks);
    let mut stats = ScanStats::default();

    progress(&format!(
        "reading the contents of {} live blocks",
        blocks.len()
    ));
    // Work is cut into units of about UNIT_BYTES of contents (a run of blocks, or a piece of
    // one large block) that the scanning threads take in turn, so that a large block or a
    // dense part of the heap does not leave a core idle; the results are put back in order.
    let units = work_units(&blocks, |b| {
        readable(&maps, b.address, b.address.saturating_add(b.size))
    });
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 16)
        .min(units.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    // Results are appended in unit order as they arrive (a unit finished early waits in
    // `pending`), and each unit's vectors are freed once copied: the edges are never held
    // twice (the growing vector is moved by mremap, not copied).
    let mut edge_start: Vec<u32> = Vec::with_capacity(blocks.len() + 1);
    let mut targets: Vec<u32> = Vec::new();
    let mut total = 0u32;
    let mut piece: Option<(u32, Vec<u32>, bool)> = None;
    let mut append = |r: UnitResult, stats: &mut ScanStats| match r {
        UnitResult::Blocks(counts, t, st) => {
            stats.add(&st);
            for c in counts {
                edge_start.push(total);
                total += c;
            }
            targets.extend_from_slice(&t);
        }
        UnitResult::Piece {
            block,
            hits,
            ok,
            last,
        } => {
            let (_, all, all_ok) = piece.get_or_insert_with(|| (block, Vec::new(), true));
            all.extend_from_slice(&hits);
            *all_ok &= ok;
            if last {
                let (_, mut all, all_ok) = piece.take().unwrap();
                if all_ok {
                    all.sort_unstable();
                    all.dedup();
                    stats.blocks_read += 1;
                    stats.bytes_read += blocks[block as usize].size;
                } else {
                    all.clear();
                    stats.vanished += 1;
                }
                edge_start.push(total);
                total += all.len() as u32;
                targets.extend_from_slice(&all);
            }
        }
    };
    std::thread::scope(|sc| {
        let (tx, rx) = std::sync::mpsc::channel::<(usize, UnitResult)>();
        for _ in 0..workers {
            let tx = tx.clone();
            let (next, units, blocks, lookup, mem) = (&next, &units, &blocks, &lookup, &mem);
            sc.spawn(move || loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(u) = units.get(k) else { break };
                if tx.send((k, scan_unit(blocks, u, lookup, mem))).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        let mut pending = std::collections::BTreeMap::new();
        let mut want = 0usize;
        for (k, r) in rx {
            pending.insert(k, r);
            while let Some(r) = pending.remove(&want) {
                append(r, &mut stats);
                want += 1;
            }
        }
    });
    edge_start.push(total);
    targets.shrink_to_fit();
    stats.edges = targets.len() as u64;

    progress("scanning roots");
    let mut roots = find_roots(
        pid, &maps, &blocks, &blocks, &lookup, &mem, modules, region, private, stopped, &mut stats,
    );
    // With the threads stopped, their registers are roots too.
    if let Some(st) = stopped {
        let names: HashMap<u32, String> =
            threads(pid).into_iter().map(|t| (t.tid, t.name)).collect();
        for t in &st.threads {
            let mut targets: Vec<u32> =
                t.registers.iter().filter_map(|&v| lookup.find(v)).collect();
            targets.sort_unstable();
            targets.dedup();
            if !targets.is_empty() {
                roots.push(Root {
                    kind: RootKind::Registers,
                    name: format!(
                        "registers of {} ({})",
                        names.get(&t.tid).map(String::as_str).unwrap_or("?"),
                        t.tid
                    ),
                    targets,
                });
            }
        }
        roots.sort_by(|a, b| (a.kind as u8, &a.name).cmp(&(b.kind as u8, &b.name)));
    }
    drop(lookup);
    // Thread, library and data-symbol names are the target's to choose: no control character
    // reaches a terminal, a capture or an SVG.
    for r in &mut roots {
        if let std::borrow::Cow::Owned(s) = crate::regions::shown(&r.name) {
            r.name = s;
        }
    }
    stats.seconds = started.elapsed().as_secs_f64();
    Ok((
        Graph {
            blocks,
            edge_start,
            targets,
            roots,
        },
        stats,
    ))
}

/// What a second read of the target's memory found pointing into a set of blocks (the leak
/// candidates of a first scan): see [`references_into`].
#[derive(Debug, Clone, Default)]
pub struct Referenced {
    /// Per target: a root or a block of `readers` points into it.
    pub from_outside: Vec<bool>,
    /// Per target: the targets its contents point into now (sorted, no duplicates).
    pub edges: Vec<Vec<u32>>,
    /// Bytes of roots and blocks read.
    pub bytes_read: u64,
}

/// Reads the roots (found again: `/proc/PID/maps`, thread stacks, minus what malloc owns and
/// the `live` blocks, as [`build`] finds them), the contents of `readers` and of `targets`
/// again, and reports which of `targets` are pointed to. All three lists are sorted by
/// address; `readers` and `targets` are disjoint, `live` (for the root ranges) is every block
/// live now.
///
/// Errors: as [`build`].
pub fn references_into(
    pid: u32,
    live: &[Block],
    readers: &[Block],
    targets: &[Block],
    modules: &[Module],
    region: &Path,
    private: &[(u64, u64)],
) -> Result<Referenced> {
    let maps = read_maps(pid)?;
    let probe = maps
        .iter()
        .find(|m| m.read && m.write)
        .map(|m| m.start)
        .unwrap_or(0);
    let mem = Memory::open(pid, probe)?;
    let lookup = Lookup::new(targets);
    let mut stats = ScanStats::default();
    let mut from_outside = vec![false; targets.len()];
    let roots = find_roots(
        pid, &maps, live, targets, &lookup, &mem, modules, region, private, None, &mut stats,
    );
    for r in &roots {
        for &t in &r.targets {
            from_outside[t as usize] = true;
        }
    }
    let mut bytes_read = stats.root_bytes;
    // The readers in contiguous shares, one thread per core.
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 16);
    let share = readers.len().div_ceil(workers).max(1);
    let found: Vec<(Vec<u32>, u64)> = std::thread::scope(|sc| {
        let handles: Vec<_> = readers
            .chunks(share)
            .map(|part| {
                let (lookup, mem) = (&lookup, &mem);
                sc.spawn(move || {
                    let (_, mut hits, st) = scan_blocks(part, lookup, mem);
                    hits.sort_unstable();
                    hits.dedup();
                    (hits, st.bytes_read)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    for (hits, bytes) in found {
        bytes_read += bytes;
        for t in hits {
            from_outside[t as usize] = true;
        }
    }
    let (counts, hits, st) = scan_blocks(targets, &lookup, &mem);
    bytes_read += st.bytes_read;
    let mut edges = Vec::with_capacity(targets.len());
    let mut at = 0usize;
    for c in counts {
        edges.push(hits[at..at + c as usize].to_vec());
        at += c as usize;
    }
    Ok(Referenced {
        from_outside,
        edges,
        bytes_read,
    })
}

/// Contents scanned by one unit of work, bytes.
const UNIT_BYTES: u64 = 1 << 20;

/// A unit of scanning work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    /// Blocks `[first, end)`.
    Blocks(u32, u32),
    /// Bytes `[from, to)` (offsets, multiples of 8) of block `block`, larger than a unit.
    Piece { block: u32, from: u64, to: u64 },
    /// Block `block`, larger than a unit, not wholly in readable memory: nothing to read.
    Unreadable(u32),
}

/// What a unit found.
enum UnitResult {
    /// Per block its number of edges, the edges in order, and what was read.
    Blocks(Vec<u32>, Vec<u32>, ScanStats),
    /// The blocks a piece of one block points into (unsorted, with duplicates); `ok` is false
    /// when the piece could not be read, `last` true for the block's last piece.
    Piece {
        block: u32,
        hits: Vec<u32>,
        ok: bool,
        last: bool,
    },
}

/// Cuts the scan of `blocks` (sorted by address) into units of about [`UNIT_BYTES`]; a block
/// larger than a unit that is not wholly `readable` becomes one [`Unit::Unreadable`] (so the
/// number of units is bounded by the mapped memory, not by the sizes a region claims).
fn work_units(blocks: &[Block], readable: impl Fn(&Block) -> bool) -> Vec<Unit> {
    let mut units = Vec::new();
    let mut i = 0usize;
    while i < blocks.len() {
        let size = blocks[i].size & !7;
        if size > UNIT_BYTES && !readable(&blocks[i]) {
            units.push(Unit::Unreadable(i as u32));
            i += 1;
            continue;
        }
        if size > UNIT_BYTES {
            let mut from = 0;
            while from < size {
                let to = (from + UNIT_BYTES).min(size);
                units.push(Unit::Piece {
                    block: i as u32,
                    from,
                    to,
                });
                from = to;
            }
            i += 1;
            continue;
        }
        let (first, mut bytes) = (i, 0u64);
        while i < blocks.len() && bytes < UNIT_BYTES && blocks[i].size & !7 <= UNIT_BYTES {
            bytes += blocks[i].size;
            i += 1;
        }
        units.push(Unit::Blocks(first as u32, i as u32));
    }
    units
}

fn scan_unit(blocks: &[Block], unit: &Unit, lookup: &Lookup, mem: &Memory) -> UnitResult {
    match *unit {
        Unit::Blocks(a, b) => {
            let (counts, targets, stats) =
                scan_blocks(&blocks[a as usize..b as usize], lookup, mem);
            UnitResult::Blocks(counts, targets, stats)
        }
        Unit::Unreadable(block) => UnitResult::Piece {
            block,
            hits: Vec::new(),
            ok: false,
            last: true,
        },
        Unit::Piece { block, from, to } => {
            let mut buf = vec![0u8; (to - from) as usize];
            let ok = mem.read(blocks[block as usize].address + from, &mut buf) == buf.len();
            let mut hits = Vec::new();
            if ok {
                lookup.scan_words(&buf, &mut hits);
            }
            UnitResult::Piece {
                block,
                hits,
                ok,
                last: to == blocks[block as usize].size & !7,
            }
        }
    }
}

/// Finds the edges of `blocks` (sorted by address): per block its number of edges, the edges
/// in order, and what was read.
fn scan_blocks(blocks: &[Block], lookup: &Lookup, mem: &Memory) -> (Vec<u32>, Vec<u32>, ScanStats) {
    let mut stats = ScanStats::default();
    let mut counts = Vec::with_capacity(blocks.len());
    let mut targets: Vec<u32> = Vec::new();
    let mut buf = Vec::new();
    let mut scratch = Vec::new();
    let mut i = 0;
    while i < blocks.len() {
        // A run of neighbouring blocks, read with one call.
        let start = blocks[i].address;
        let mut end = start + blocks[i].size;
        let mut j = i + 1;
        while j < blocks.len()
            && blocks[j].address < end + RUN_GAP
            && blocks[j].address + blocks[j].size - start <= RUN_MAX
        {
            end = end.max(blocks[j].address + blocks[j].size);
            j += 1;
        }
        buf.resize((end - start) as usize, 0);
        let got = mem.read(start, &mut buf) as u64;
        for b in &blocks[i..j] {
            let off = (b.address - start) as usize;
            let len = (b.size & !7) as usize;
            scratch.clear();
            if b.address + b.size <= start + got {
                lookup.scan_words(&buf[off..off + len], &mut scratch);
                stats.blocks_read += 1;
                stats.bytes_read += b.size;
            } else {
                // Past what the run could read: this block alone.
                let mut one = vec![0u8; len];
                if mem.read(b.address, &mut one) == len {
                    lookup.scan_words(&one, &mut scratch);
                    stats.blocks_read += 1;
                    stats.bytes_read += b.size;
                } else {
                    stats.vanished += 1;
                }
            }
            scratch.sort_unstable();
            scratch.dedup();
            targets.extend_from_slice(&scratch);
            counts.push(scratch.len() as u32);
        }
        i = j;
    }
    (counts, targets, stats)
}

/// Whether `v` is where glibc puts the header of the chunk after `b` (x86-64: chunks are
/// 16-aligned, at least 32 bytes, with an 8-byte size field before the user data and the next
/// chunk's 8-byte `prev_size` overlapping the end of this one): `address − 16 + chunk size`.
fn is_next_chunk_header(b: &Block, v: u64) -> bool {
    let chunk = ((b.size + 8 + 15) & !15).max(32);
    v == (b.address + chunk).wrapping_sub(16)
}

/// `[lo, hi)` minus the sorted, disjoint `ranges`: the pieces left, in order.
fn subtract(lo: u64, hi: u64, ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = lo;
    let first = ranges.partition_point(|r| r.1 <= lo);
    for &(a, b) in &ranges[first..] {
        if a >= hi {
            break;
        }
        if a > at {
            out.push((at, a));
        }
        at = at.max(b);
    }
    if at < hi {
        out.push((at, hi));
    }
    out
}

/// Largest heap of a glibc thread arena (`HEAP_MAX_SIZE` on 64-bit: twice the largest mmap
/// threshold, 2 × 32 MiB); heaps are aligned to it, so a chunk's heap starts at its address
/// rounded down (glibc's `heap_for_ptr`).
const ARENA_HEAP_MAX: u64 = 64 << 20;
/// Chunk size field flags of glibc: the chunk was mmapped on its own; it belongs to a thread
/// arena (not the main one, which lives in `[heap]`).
const IS_MMAPPED: u64 = 2;
const NON_MAIN_ARENA: u64 = 4;
/// Headers read per `process_vm_readv`.
const HEADER_BATCH: usize = 512;

/// The memory malloc owns, outside `[heap]`: sorted, disjoint `[start, end)` ranges.
///
/// Found from the live blocks' glibc chunk headers (the 16 bytes before each block: the
/// previous chunk's size or the mmap offset, then the chunk's size and flags), read in
/// batches, one block per range found (the other blocks of that range are skipped):
/// * `IS_MMAPPED`: the chunk's own mapping, `[chunk − prev_size, chunk + size)` — page
///   aligned, inside the block's memory area, holding no other live block;
/// * `NON_MAIN_ARENA`: the thread arena's heap at the block's address rounded down to 64 MiB,
///   whose `heap_info` (`ar_ptr`, `prev`, `size`, `mprotect_size`) must hold together (sizes
///   page multiples, `size ≤ mprotect_size ≤ 64 MiB`, the block inside `size`): up to 64 MiB
///   or the end of the memory area.
///
/// Free chunks there hold stale pointers, and malloc's own state points at chunk headers: never
/// roots. A block whose header fits neither (another allocator, CPython's pymalloc objects,
/// a main arena outside `[heap]`) claims only its own bytes. The kernel merges neighbouring
/// anonymous mappings with the same protection into one memory area, so a program's own
/// mapping often shares one with a large chunk: that is why roots are address ranges, not
/// whole areas.
fn allocator_ranges(maps: &[Mapping], blocks: &[Block], mem: &Memory) -> Vec<(u64, u64)> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    let mut out: Vec<(u64, u64)> = maps
        .iter()
        .filter(|m| m.path == "[heap]")
        .map(|m| (m.start, m.end))
        .collect();
    out.sort_unstable();
    // `/proc/PID/maps` lists memory areas in address order.
    let area_of = |a: u64| {
        let k = maps.partition_point(|m| m.start <= a).checked_sub(1)?;
        let m = &maps[k];
        (a < m.end).then_some((m.start, m.end))
    };
    let covered = |out: &[(u64, u64)], a: u64| {
        let k = out.partition_point(|r| r.0 <= a);
        k > 0 && a < out[k - 1].1
    };
    let mut i = 0usize;
    let mut batch: Vec<usize> = Vec::with_capacity(HEADER_BATCH);
    let mut headers = vec![[0u64; 2]; HEADER_BATCH];
    while i < blocks.len() {
        batch.clear();
        while i < blocks.len() && batch.len() < HEADER_BATCH {
            let a = blocks[i].address;
            if a >= 16 && !covered(&out, a) {
                batch.push(i);
            }
            i += 1;
        }
        let addrs: Vec<u64> = batch.iter().map(|&k| blocks[k].address - 16).collect();
        let mut ok = mem.read_many(&addrs, &mut headers[..batch.len()]);
        // A block with the shim's 16-byte header before it (above 112 bytes under
        // `LD_PRELOAD`): its word at `address - 8` is the header's tag, bit 3 set, which a
        // glibc chunk size never has; glibc's chunk header is 16 bytes lower (helper O, 1: the
        // tag's low bits taken for chunk flags left a thread arena holding only such blocks
        // unrecognised, and it was scanned as a root: leaks missed in 5 of 12 runs).
        let mut below = vec![0u64; batch.len()];
        let headed: Vec<usize> = (0..batch.len())
            .filter(|&n| ok[n] && headers[n][1] & 8 != 0 && blocks[batch[n]].address >= 32)
            .collect();
        if !headed.is_empty() {
            let lower: Vec<u64> = headed
                .iter()
                .map(|&n| blocks[batch[n]].address - 32)
                .collect();
            let mut words = vec![[0u64; 2]; headed.len()];
            let got = mem.read_many(&lower, &mut words);
            for (j, &n) in headed.iter().enumerate() {
                ok[n] = got[j];
                headers[n] = words[j];
                below[n] = 16;
            }
        }
        for (n, &k) in batch.iter().enumerate() {
            let b = &blocks[k];
            if !ok[n] || covered(&out, b.address) {
                continue;
            }
            let Some((area_lo, area_hi)) = area_of(b.address) else {
                continue;
            };
            let [prev_size, size_word] = headers[n];
            let (flags, csize) = (size_word & 7, size_word & !7);
            let chunk = b.address - 16 - below[n];
            let found = if flags & (IS_MMAPPED | NON_MAIN_ARENA) == IS_MMAPPED {
                chunk
                    .checked_sub(prev_size)
                    .zip(chunk.checked_add(csize))
                    .filter(|&(lo, hi)| {
                        lo % page == 0
                            && hi % page == 0
                            && csize >= b.size.saturating_add(b.address - chunk)
                            && lo >= area_lo
                            && hi <= area_hi
                            && (k == 0 || block_end(&blocks[k - 1]) <= lo)
                            && blocks.get(k + 1).is_none_or(|n| n.address >= hi)
                    })
            } else if flags & (IS_MMAPPED | NON_MAIN_ARENA) == NON_MAIN_ARENA {
                let heap = b.address & !(ARENA_HEAP_MAX - 1);
                let mut info = [[0u64; 2]; 2];
                let read =
                    heap >= area_lo && mem.read_many(&[heap, heap + 16], &mut info) == [true, true];
                let [_, [size, mprotect_size]] = info;
                (read
                    && size % page == 0
                    && mprotect_size % page == 0
                    && size <= mprotect_size
                    && mprotect_size <= ARENA_HEAP_MAX
                    && block_end(b) <= heap + size)
                    .then(|| (heap, (heap + ARENA_HEAP_MAX).min(area_hi)))
            } else {
                None
            };
            if let Some(r) = found {
                let at = out.partition_point(|x| x.0 < r.0);
                out.insert(at, r);
            }
        }
    }
    // Ranges found from different blocks never overlap in a sound process; merge if they do.
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(out.len());
    for r in out {
        match merged.last_mut() {
            Some(last) if r.0 <= last.1 => last.1 = last.1.max(r.1),
            _ => merged.push(r),
        }
    }
    merged
}

/// A thread of the target: id, name and stack pointer when known.
#[derive(Debug)]
struct Thread {
    tid: u32,
    name: String,
    sp: Option<u64>,
}

fn threads(pid: u32) -> Vec<Thread> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let name = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        // "NR arg1 … arg6 SP PC" while blocked in a system call, "-1 SP PC" while blocked
        // otherwise, "running" while running (then the stack pointer is not known).
        let sp = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall"))
            .ok()
            .and_then(|s| {
                let f: Vec<&str> = s.split_whitespace().collect();
                (f.len() >= 3)
                    .then(|| f[f.len() - 2])
                    .and_then(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).ok())
            });
        out.push(Thread { tid, name, sp });
    }
    out.sort_by_key(|t| t.tid);
    out
}

/// Data symbols of one module: (runtime start, end, name), sorted by start.
fn data_symbols(m: &Module) -> Vec<(u64, u64, String)> {
    use object::{Object, ObjectSymbol, SymbolKind};
    let Ok(data) =
        crate::regions::read_regular(Path::new(&m.path), crate::regions::MAX_OBJECT_BYTES)
    else {
        return Vec::new();
    };
    let Ok(file) = object::File::parse(&*data) else {
        return Vec::new();
    };
    let mut out: Vec<(u64, u64, String)> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Data && s.size() > 0)
        .filter_map(|s| {
            let name = s.name().ok()?;
            let start = m.base.wrapping_add(s.address());
            Some((start, start + s.size(), crate::symbolize::demangle(name)))
        })
        .collect();
    out.sort();
    out.dedup_by_key(|s| s.0);
    out
}

/// Anonymous mappings at least this large are read only where they have pages
/// ([`touched_runs`]).
const SPARSE_MIN: u64 = 64 << 20;

/// Most `/proc/PID/pagemap` entries read in one scan: 2^25 pages (128 GiB of address space,
/// 256 MiB of entries). Past it, the rest of a large mapping is read as before.
const PAGEMAP_BUDGET: u64 = 1 << 25;

/// The runs of pages of `[lo, hi)` (page-aligned) that are resident or swapped out, from the
/// target's `/proc/PID/pagemap` (bits 63 and 62 of each 8-byte entry; `Documentation/admin-
/// guide/mm/pagemap.rst`): the others were never written and read as zeros, which hold no
/// pointer. `None` when the entries cannot be read, or when reading them all would pass
/// `budget` (entries left for the scan, decreased by those read).
fn touched_runs(
    pagemap: &std::fs::File,
    lo: u64,
    hi: u64,
    budget: &mut u64,
) -> Option<Vec<(u64, u64)>> {
    use std::os::unix::fs::FileExt;
    const PAGE: u64 = 4096;
    let pages = (hi - lo) / PAGE;
    if pages > *budget {
        return None;
    }
    *budget -= pages;
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut entries = vec![0u8; 8 << 16];
    let mut page = lo / PAGE;
    let end = hi / PAGE;
    while page < end {
        let n = ((end - page) as usize).min(entries.len() / 8);
        let buf = &mut entries[..n * 8];
        pagemap.read_exact_at(buf, page * 8).ok()?;
        for (k, e) in buf.chunks_exact(8).enumerate() {
            let e = u64::from_ne_bytes(e.try_into().ok()?);
            if e & (3 << 62) == 0 {
                continue;
            }
            let a = (page + k as u64) * PAGE;
            match runs.last_mut() {
                Some(r) if r.1 == a => r.1 = a + PAGE,
                _ => runs.push((a, a + PAGE)),
            }
        }
        page += n as u64;
    }
    Some(runs)
}

/// The parts of `ranges` inside `runs` (both sorted, disjoint).
fn intersect(ranges: &[(u64, u64)], runs: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < ranges.len() && j < runs.len() {
        let (a, b) = (ranges[i].0.max(runs[j].0), ranges[i].1.min(runs[j].1));
        if a < b {
            out.push((a, b));
        }
        if ranges[i].1 < runs[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn find_roots(
    pid: u32,
    maps: &[Mapping],
    live: &[Block],
    blocks: &[Block],
    lookup: &Lookup,
    mem: &Memory,
    modules: &[Module],
    region: &Path,
    private: &[(u64, u64)],
    stopped: Option<&super::stop::Stopped>,
    stats: &mut ScanStats,
) -> Vec<Root> {
    let mut threads = threads(pid);
    // Stopped threads' stack pointers are exact, whatever they were doing.
    if let Some(st) = stopped {
        for t in &mut threads {
            if let Some(s) = st.threads.iter().find(|s| s.tid == t.tid) {
                t.sp = Some(s.sp);
            }
        }
    }
    // Without --stop a thread's sp is known only while it is blocked in a system call, so
    // nothing below it is live (its red zone holds stale values of returned calls, and
    // LeakSanitizer too starts at sp); a thread stopped anywhere may keep live data in its
    // 128-byte red zone.
    let red_zone = if stopped.is_some() { 128 } else { 0 };
    // What malloc owns (its arenas, its mmapped chunks) is never a root; the rest of every
    // writable mapping is, minus the live blocks themselves (their contents are edges).
    let mut owned = allocator_ranges(maps, live, mem);
    // Nor the shim's private memory that keeps copies of the program's words (its threads'
    // walk memos: saved `rbp` values, heap pointers in code without frame pointers; its Python
    // memos), as the region's thread slots list it: a stale copy there kept leaked lists
    // reachable (helper G, 1).
    if !private.is_empty() {
        owned.extend(private.iter().map(|&(a, n)| (a, a.saturating_add(n))));
        owned.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(owned.len());
        for (a, b) in owned {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        owned = merged;
    }
    let region = region.to_string_lossy();
    let file_name = |p: &str| p.rsplit('/').next().unwrap_or(p).to_owned();
    let mut roots: HashMap<(RootKind, String), Vec<u32>> = HashMap::new();
    let mut symbols: HashMap<usize, Vec<(u64, u64, String)>> = HashMap::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut found = Vec::new();
    // Where the large anonymous mappings have pages (see `touched_runs`).
    let pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap")).ok();
    let mut pagemap_budget = PAGEMAP_BUDGET;
    for m in maps {
        if !m.write || !m.read || m.path.ends_with(".heapdump") || m.path == region {
            continue;
        }
        if m.path == "[heap]" || m.path.starts_with("[v") {
            continue;
        }
        // Which module's globals these are: a file mapping of the module, or memory inside its
        // segments (the anonymous mapping of its .bss).
        let module_path = m.path.starts_with('/').then(|| m.path.clone());
        // By path, else by address: a loaded module whose PT_LOAD segments (their memory size
        // includes .bss) cover the mapping — the loader may name a file by another path
        // (`/lib64/ld-linux-x86-64.so.2` for `/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2`).
        let module = module_path
            .as_ref()
            .and_then(|p| modules.iter().position(|x| &x.path == p && x.loaded))
            .or_else(|| {
                modules.iter().position(|x| {
                    x.loaded
                        && x.segments.iter().any(|sg| {
                            let lo = x.base.wrapping_add(sg.vaddr);
                            m.start >= lo && m.start < lo.wrapping_add(sg.memsz)
                        })
                })
            });
        // A thread whose stack pointer lies here: its stack, scanned from sp up. The thread is
        // blocked in a system call (that is how its sp is known), so nothing below sp is live:
        // the red zone there holds stale values of returned calls (as LeakSanitizer, which
        // starts at sp).
        let thread = threads
            .iter()
            .find(|t| t.sp.is_some_and(|sp| sp >= m.start && sp < m.end));
        let (kind, from) = match (module, thread, m.path.as_str()) {
            (Some(_), _, _) => (RootKind::Global, m.start),
            (None, Some(t), _) => (
                RootKind::Stack,
                (t.sp.unwrap().saturating_sub(red_zone) & !7).max(m.start),
            ),
            (None, None, "[stack]") => (RootKind::Stack, m.start),
            (None, None, p) if p.is_empty() || p.starts_with("[anon") => {
                (RootKind::Mapping, m.start)
            }
            // Other file mappings (a file the program maps writable): its memory, scanned.
            _ => (RootKind::Mapping, m.start),
        };
        // glibc's malloc state (main_arena, in libc's data) points at chunk headers: of free
        // chunks in its bins and of the top chunk. A chunk's header lies in the last bytes of
        // the live block before it, so those pointers would keep that block alive.
        let in_libc = kind == RootKind::Global
            && module.is_some_and(|mi| file_name(&modules[mi].path).starts_with("libc.so"));
        let mut ranges = subtract(from, m.end, &owned);
        // A large anonymous mapping (a reservation: AddressSanitizer's shadow, a JIT's or a
        // database's arena) is read only where it has pages: reading its untouched address
        // space would take as long as its virtual size and map page tables into the target
        // for each page read (helper E: 16 GiB reserved, 6 s and 33 MB of the target's page
        // tables for one 4 KiB page used).
        let anonymous = m.path.is_empty() || m.path.starts_with("[anon");
        if anonymous && m.end - m.start >= SPARSE_MIN {
            if let Some(runs) = pagemap
                .as_ref()
                .and_then(|f| touched_runs(f, m.start, m.end, &mut pagemap_budget))
            {
                let before: u64 = ranges.iter().map(|(a, b)| b - a).sum();
                ranges = intersect(&ranges, &runs);
                let after: u64 = ranges.iter().map(|(a, b)| b - a).sum();
                stats.root_bytes_untouched += before - after;
            }
        }
        for (lo, hi) in ranges {
            // Live blocks inside the range: skipped word by word (`j`: the first block that
            // ends after the word being looked at).
            let mut j = live.partition_point(|b| block_end(b) <= lo);
            let mut addr = lo;
            while addr < hi {
                let len = ((hi - addr) as usize).min(buf.len());
                let got = mem.read(addr, &mut buf[..len]);
                if got == 0 {
                    break;
                }
                for (w, word) in buf[..got & !7].chunks_exact(8).enumerate() {
                    let at = addr + 8 * w as u64;
                    while j < live.len() && block_end(&live[j]) <= at {
                        j += 1;
                    }
                    if j < live.len() && live[j].address <= at {
                        continue;
                    }
                    stats.root_bytes += 8;
                    let v = u64::from_ne_bytes(word.try_into().unwrap());
                    if let Some(b) = lookup.find(v) {
                        if in_libc && is_next_chunk_header(&blocks[b as usize], v) {
                            continue;
                        }
                        found.push((at, b));
                    }
                }
                addr += got as u64;
            }
        }
        // The end of the module's segments: a mapping the program made right after its .bss
        // can be merged into the same memory area by the kernel; words past the end are that
        // mapping's.
        let module_end = module.map(|mi| {
            let x = &modules[mi];
            x.segments
                .iter()
                .map(|sg| x.base.wrapping_add(sg.vaddr).wrapping_add(sg.memsz))
                .max()
                .unwrap_or(0)
        });
        for (at, b) in found.drain(..) {
            let (kind, module) = match module_end {
                Some(end) if kind == RootKind::Global && at >= end => (RootKind::Mapping, None),
                _ => (kind, module),
            };
            let name = match (kind, module) {
                (RootKind::Global, Some(mi)) => {
                    let syms = symbols
                        .entry(mi)
                        .or_insert_with(|| data_symbols(&modules[mi]));
                    let k = syms.partition_point(|s| s.0 <= at);
                    let lib = file_name(&modules[mi].path);
                    match k.checked_sub(1).map(|k| &syms[k]) {
                        Some((_, end, name)) if at < *end => format!("{name} ({lib})"),
                        _ => format!("(data of {lib})"),
                    }
                }
                (RootKind::Stack, _) => match thread {
                    Some(t) => format!("stack of {} ({})", t.name, t.tid),
                    None => "stack of the main thread".to_owned(),
                },
                _ => format!(
                    "mapping {:#x}-{:#x}{}",
                    m.start,
                    m.end,
                    if m.path.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", m.path)
                    }
                ),
            };
            roots.entry((kind, name)).or_default().push(b);
        }
    }
    let mut out: Vec<Root> = roots
        .into_iter()
        .map(|((kind, name), mut targets)| {
            targets.sort_unstable();
            targets.dedup();
            Root {
                kind,
                name,
                targets,
            }
        })
        .collect();
    out.sort_by(|a, b| (a.kind as u8, &a.name).cmp(&(b.kind as u8, &b.name)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intersect_keeps_only_what_both_cover() {
        let ranges = [(0, 10), (20, 40), (50, 60)];
        let runs = [(5, 25), (30, 35), (38, 55), (70, 80)];
        assert_eq!(
            intersect(&ranges, &runs),
            vec![(5, 10), (20, 25), (30, 35), (38, 40), (50, 55)]
        );
        assert_eq!(intersect(&ranges, &[]), vec![]);
    }

    #[test]
    fn maps_lines() {
        let m = parse_maps_line(
            "7f1c2a000000-7f1c2a021000 rw-p 00000000 00:00 0                          [heap]",
        )
        .unwrap();
        assert_eq!(
            (m.start, m.end, m.read, m.write, m.path.as_str()),
            (0x7f1c2a000000, 0x7f1c2a021000, true, true, "[heap]")
        );
        let m = parse_maps_line("7f1c2a000000-7f1c2a021000 r--p 00000000 00:00 0").unwrap();
        assert_eq!((m.write, m.path.as_str()), (false, ""));
        let m = parse_maps_line("55d0-55e0 rw-p 00002000 fe:00 123   /usr/lib/with space/libx.so")
            .unwrap();
        assert_eq!(m.path, "/usr/lib/with space/libx.so");
    }

    #[test]
    fn subtract_ranges() {
        let r = [(10, 20), (30, 40), (45, 50)];
        assert_eq!(
            subtract(0, 100, &r),
            vec![(0, 10), (20, 30), (40, 45), (50, 100)]
        );
        assert_eq!(subtract(15, 35, &r), vec![(20, 30)]);
        assert_eq!(subtract(12, 18, &r), vec![]);
        assert_eq!(subtract(40, 45, &r), vec![(40, 45)]);
        assert_eq!(subtract(0, 5, &[]), vec![(0, 5)]);
    }

    /// glibc's own chunks in this process: a 40 MiB block (an mmapped chunk whatever the
    /// dynamic threshold, which other tests' frees may have raised up to 32 MiB), a
    /// small block of another thread (a thread arena: its 64 MiB-aligned heap), and a block
    /// of the program's own mapping (no glibc header: nothing but itself). The kernel may put
    /// the chunk's mapping right next to the thread's heap (then one merged range holds both).
    #[test]
    fn allocator_ranges_of_glibc_chunks_in_this_process() {
        const BIG: usize = 40 << 20;
        let b = |address, size| Block {
            address,
            size,
            stack: 0,
            thread: 0,
        };
        // SAFETY: plain malloc/free of glibc (the test binary's allocator is glibc's too);
        // the blocks are freed at the end and never dereferenced here.
        let big = unsafe { libc::malloc(BIG) } as u64;
        // SAFETY: as above, on another thread (another arena).
        let small = std::thread::spawn(|| unsafe { libc::malloc(100) } as u64)
            .join()
            .unwrap();
        // SAFETY: an anonymous mapping of 2 pages, unmapped at the end.
        let own = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as u64;
        let pid = std::process::id();
        let maps = read_maps(pid).unwrap();
        let mem = Memory::open(pid, own).unwrap();
        let mut blocks = vec![b(big, BIG as u64), b(small, 100), b(own + 4096, 64)];
        blocks.sort_by_key(|x| x.address);
        let ranges = allocator_ranges(&maps, &blocks, &mem);
        let holding = |a: u64| ranges.iter().find(|r| a >= r.0 && a < r.1).copied();
        let covered = |a: u64| holding(a).is_some();
        // The kernel may place the chunk's mapping right against the thread arena's heap
        // (either side): the two ranges are then merged into one, so each is checked by what
        // it covers, and by where it starts unless the other one is just before it.
        let chunk = big - 16;
        let chunk_end = (chunk + BIG as u64 + 16).next_multiple_of(4096);
        let heap = small & !(ARENA_HEAP_MAX - 1);
        let in_chunk = |a: u64| a >= chunk && a < chunk_end;
        let in_heap = |a: u64| a >= heap && a < heap + ARENA_HEAP_MAX;
        let r = holding(big).expect("the mmapped chunk");
        assert!(
            r.0 <= chunk && r.1 >= chunk_end && r.1 % 4096 == 0,
            "{ranges:x?}"
        );
        assert!(!covered(chunk - 1) || in_heap(chunk - 1), "{ranges:x?}");
        let Some(r) = holding(small) else {
            let area: Vec<&Mapping> = (maps.iter())
                .filter(|m| m.end > heap && m.start < heap + ARENA_HEAP_MAX)
                .collect();
            let mut words = [0u8; 32];
            let got = mem.read(heap, &mut words);
            let words: Vec<u64> = (words[..got].chunks(8))
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect();
            panic!("the thread arena: small {small:#x}, heap {heap:#x}, heap_info {words:x?}, areas {area:x?}, ranges {ranges:x?}");
        };
        assert!(r.0 <= heap, "{ranges:x?}");
        assert!(!covered(heap - 1) || in_chunk(heap - 1), "{ranges:x?}");
        assert_eq!(holding(own + 4096), None, "{ranges:x?}");
        // SAFETY: the blocks and the mapping made above, not used any more.
        unsafe {
            libc::free(big as *mut libc::c_void);
            libc::free(small as *mut libc::c_void);
            libc::munmap(own as *mut libc::c_void, 8192);
        }
    }

    #[test]
    fn glibc_next_chunk_headers() {
        let b = |address, size| Block {
            address,
            size,
            stack: 0,
            thread: 0,
        };
        // 200 B: chunk of 208 B, next header at address + 192 (inside the block's bytes).
        assert!(is_next_chunk_header(&b(0x1000, 200), 0x10c0));
        assert!(!is_next_chunk_header(&b(0x1000, 200), 0x10b8));
        // 24 B: a 32-byte chunk; 100 B: 112 bytes; 0 B: the 32-byte minimum.
        assert!(is_next_chunk_header(&b(0x2000, 24), 0x2010));
        assert!(is_next_chunk_header(&b(0x3000, 100), 0x3060));
        assert!(is_next_chunk_header(&b(0x4000, 0), 0x4010));
    }

    #[test]
    fn lookup_finds_starts_and_interiors_only() {
        let b = |address, size| Block {
            address,
            size,
            stack: 0,
            thread: 0,
        };
        let blocks = [b(0x1000, 16), b(0x1010, 0), b(0x2000, 100)];
        let l = Lookup::new(&blocks);
        assert_eq!(l.find(0x1000), Some(0));
        assert_eq!(l.find(0x100f), Some(0));
        assert_eq!(l.find(0x1010), Some(1)); // a 0-byte block owns its address
        assert_eq!(l.find(0x1011), None);
        assert_eq!(l.find(0x2063), Some(2));
        assert_eq!(l.find(0x2064), None);
        assert_eq!(l.find(0xfff), None);
        assert_eq!(l.find(u64::MAX), None);
    }

    #[test]
    fn lookup_segments_big_blocks_and_gaps() {
        let b = |address, size| Block {
            address,
            size,
            stack: 0,
            thread: 0,
        };
        // Small blocks across granules, a gap wider than SEGMENT_GAP, a big block (own
        // segment), then small blocks right after it.
        let big = 0x10_0000_0000u64;
        let blocks = [
            b(0x1000, 300),
            b(0x1130, 8),
            b(0x1400, 0),
            b(0x1_0000_0000, 24),
            b(big, 3 << 20),
            b(big + (3 << 20), 16),
        ];
        let l = Lookup::new(&blocks);
        assert_eq!(l.segments.len(), 4);
        assert_eq!(l.find(0x1000 + 299), Some(0));
        assert_eq!(l.find(0x1000 + 300), None);
        assert_eq!(l.find(0x1137), Some(1));
        assert_eq!(l.find(0x1138), None);
        assert_eq!(l.find(0x1400), Some(2));
        assert_eq!(l.find(0x1401), None);
        assert_eq!(l.find(0x8000_0000), None); // in the gap
        assert_eq!(l.find(0x1_0000_0017), Some(3));
        assert_eq!(l.find(big - 1), None);
        assert_eq!(l.find(big + 12345), Some(4));
        assert_eq!(l.find(big + (3 << 20) - 1), Some(4));
        assert_eq!(l.find(big + (3 << 20)), Some(5));
        assert_eq!(l.find(big + (3 << 20) + 16), None);
        // Every byte of the small blocks' span agrees with a linear search.
        for v in 0xff0..0x1500u64 {
            let want = blocks
                .iter()
                .position(|x| v >= x.address && v < x.address + x.size.max(1))
                .map(|i| i as u32);
            assert_eq!(l.find(v), want, "{v:#x}");
        }
        // The big block is cut into 1 MiB pieces, the rest into runs of blocks.
        let units = work_units(&blocks, |_| true);
        assert_eq!(
            units,
            vec![
                Unit::Blocks(0, 4),
                Unit::Piece {
                    block: 4,
                    from: 0,
                    to: 1 << 20
                },
                Unit::Piece {
                    block: 4,
                    from: 1 << 20,
                    to: 2 << 20
                },
                Unit::Piece {
                    block: 4,
                    from: 2 << 20,
                    to: 3 << 20
                },
                Unit::Blocks(5, 6),
            ]
        );
        // A big block outside the mapped memory is one unit, whatever its size.
        let units = work_units(&blocks, |b| b.size < 1 << 20);
        assert_eq!(units[1], Unit::Unreadable(4));
        assert_eq!(units.len(), 3);
    }

    #[test]
    fn sparse_small_blocks_cost_a_bounded_table() {
        // A crafted region's 10,000 one-byte blocks, each just under SEGMENT_GAP from the
        // next: one segment would need 4,096 granules per block.
        let blocks: Vec<Block> = (0..10_000u64)
            .map(|i| Block {
                address: 0x10_0000_0000 + i * (SEGMENT_GAP - 4096),
                size: 1,
                stack: 0,
                thread: 0,
            })
            .collect();
        let l = Lookup::new(&blocks);
        assert!(
            l.first.len() as u64 <= (TABLE_PER_BLOCK + 2) * blocks.len() as u64,
            "{} granules for {} blocks",
            l.first.len(),
            blocks.len()
        );
        for (i, b) in blocks.iter().enumerate().step_by(97) {
            assert_eq!(l.find(b.address), Some(i as u32));
            assert_eq!(l.find(b.address + 1), None);
        }
        // Dense blocks still share one segment.
        let dense: Vec<Block> = (0..10_000u64)
            .map(|i| Block {
                address: 0x10_0000 + i * 48,
                size: 40,
                stack: 0,
                thread: 0,
            })
            .collect();
        assert_eq!(Lookup::new(&dense).segments.len(), 1);
    }

    #[test]
    fn readable_is_covered_by_readable_mappings() {
        let m = |start, end, read| Mapping {
            start,
            end,
            read,
            write: read,
            path: String::new(),
        };
        let maps = [
            m(0x1000, 0x3000, true),
            m(0x3000, 0x5000, true),
            m(0x5000, 0x6000, false),
            m(0x8000, 0x9000, true),
        ];
        assert!(readable(&maps, 0x1000, 0x5000), "across two neighbours");
        assert!(readable(&maps, 0x2ff8, 0x3008));
        assert!(!readable(&maps, 0x4ff8, 0x5008), "into an unreadable one");
        assert!(!readable(&maps, 0x8ff8, 0x9008), "past the last");
        assert!(!readable(&maps, 0x7000, 0x8008), "from a gap");
        assert!(!readable(&maps, 0x10_0000_0000, 0x10_4000_0000));
        assert!(readable(&maps, 0x8000, 0x8000), "empty");
    }

    #[test]
    fn overlapping_blocks_do_not_break_the_lookup() {
        // Only a damaged region has these: the lookup must stay in bounds and terminate.
        let b = |address, size| Block {
            address,
            size,
            stack: 0,
            thread: 0,
        };
        let blocks = [
            b(0x1000, 0x800),
            b(0x1100, 0x10),
            b(0x1200, 1 << 20),
            b(0x1300, 8),
        ];
        let l = Lookup::new(&blocks);
        for v in (0..0x20_0000u64).step_by(7) {
            if let Some(i) = l.find(v) {
                let x = &blocks[i as usize];
                assert!(v >= x.address && v < x.address + x.size.max(1));
            }
        }
    }
}
