//! Crafting regions for the trust tests: finding a region's sections and live records
//! (layout v1) and rewriting them in place, as a buggy or hostile region owner could.
#![allow(dead_code)]

use std::os::unix::fs::FileExt;
use std::path::Path;

/// Offset of the section table in the v1 header (8 entries of 32 bytes: kind (u32), entry
/// size (u32), offset, capacity, reserved).
const SECTIONS_AT: u64 = 384;
/// Offset of `node_cursor` (records ever handed out) in the v1 header.
pub const NODE_CURSOR_AT: u64 = 192;
/// Size of a v1 record (`NodeV1`): address, size, t_alloc, t_free, stack, thread.
pub const NODE_SIZE: u64 = 40;
/// Section kinds of layout v1.
pub const ALLOCATIONS: u32 = 1;
pub const STACK_ENTRIES: u32 = 2;
pub const STACK_FRAMES: u32 = 3;
pub const THREADS: u32 = 5;
pub const MODULES: u32 = 6;
pub const NAMED: u32 = 7;

/// A u64 of `region` at `offset`.
pub fn peek_u64(region: &Path, offset: u64) -> u64 {
    let mut b = [0u8; 8];
    std::fs::File::open(region)
        .unwrap()
        .read_exact_at(&mut b, offset)
        .unwrap();
    u64::from_ne_bytes(b)
}

/// Writes a u64 into `region` at `offset`.
pub fn poke_u64(region: &Path, offset: u64, v: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(region)
        .unwrap()
        .write_all_at(&v.to_ne_bytes(), offset)
        .unwrap();
}

/// (offset, capacity, entry size) of section `kind` of a v1 region file.
pub fn section(region: &Path, kind: u32) -> (u64, u64, u64) {
    for i in 0..8u64 {
        let at = SECTIONS_AT + 32 * i;
        let kind_size = peek_u64(region, at);
        if kind_size as u32 == kind {
            return (
                peek_u64(region, at + 8),
                peek_u64(region, at + 16),
                kind_size >> 32,
            );
        }
    }
    panic!("no section {kind} in {}", region.display());
}

/// A live record of a region.
#[derive(Debug, Clone, Copy)]
pub struct Node {
    /// File offset of the record.
    pub offset: u64,
    pub address: u64,
    pub size: u64,
    pub t_alloc: u64,
}

impl Node {
    /// Rewrites the record's block address.
    pub fn set_address(&self, region: &Path, v: u64) {
        poke_u64(region, self.offset, v);
    }
    /// Rewrites the record's block size.
    pub fn set_size(&self, region: &Path, v: u64) {
        poke_u64(region, self.offset + 8, v);
    }
}

/// The live records (published, not freed) among those handed out so far.
pub fn live_nodes(region: &Path) -> Vec<Node> {
    let (at, cap, _) = section(region, ALLOCATIONS);
    let n = peek_u64(region, NODE_CURSOR_AT).min(cap);
    let mut bytes = vec![0u8; (n * NODE_SIZE) as usize];
    std::fs::File::open(region)
        .unwrap()
        .read_exact_at(&mut bytes, at)
        .unwrap();
    let word = |b: &[u8], k: usize| u64::from_ne_bytes(b[k * 8..k * 8 + 8].try_into().unwrap());
    bytes
        .chunks_exact(NODE_SIZE as usize)
        .enumerate()
        .filter_map(|(i, b)| {
            let (t_alloc, t_free) = (word(b, 2), word(b, 3));
            (t_alloc != 0 && t_alloc != u64::MAX && t_free == u64::MAX).then(|| Node {
                offset: at + i as u64 * NODE_SIZE,
                address: word(b, 0),
                size: word(b, 1),
                t_alloc,
            })
        })
        .collect()
}

/// The byte ranges of `region` that a live writer keeps changing and a reader trusts the
/// least: the header's counters and cursors, the first `nodes` records, the stack entries and
/// frames in use, the thread slots and the module table. (offset, length) pairs.
pub fn live_parts(region: &Path, nodes: u64) -> Vec<(u64, u64)> {
    // flags, creation times, sampling interval, state, named snapshots' floor, lease,
    // cursors, counts: up to the section table; the beginnings of the executable path, the
    // command line and the warnings. Not the identity (pid, start ticks, executable's device
    // and inode): a region claiming another process is the ownership rule's case, and the
    // analyses of a live process are only reached through a matching one.
    let mut parts = vec![
        (36u64, 4),
        (48, 16),
        (80, 384 - 80),
        (1024, 64),
        (2048, 64),
        (3072, 64),
    ];
    let (at, cap, es) = section(region, ALLOCATIONS);
    parts.push((at, nodes.min(cap) * es));
    for kind in [STACK_ENTRIES, STACK_FRAMES, THREADS, MODULES, NAMED] {
        let (at, cap, es) = section(region, kind);
        parts.push((at, cap.min(64) * es));
    }
    parts.retain(|p| p.1 > 0);
    parts
}

/// A thread rewriting parts of a region file continuously (`pwrite`, so every mapping of the
/// file sees it at once) until dropped: random words, zeros, all-ones, 2^63, small numbers,
/// the original word with one bit flipped or nudged, or the original back; every few thousand
/// writes everything is restored, so the region keeps swinging between sound and absurd.
pub struct Rewriter {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<u64>>,
}

impl Rewriter {
    /// Starts rewriting `parts` ((offset, length) pairs, see [`live_parts`]) of `region`.
    pub fn start(region: &Path, parts: Vec<(u64, u64)>, seed: u64) -> Rewriter {
        use std::sync::atomic::Ordering;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(region)
            .unwrap();
        let original: Vec<Vec<u8>> = parts
            .iter()
            .map(|&(at, len)| {
                let mut b = vec![0u8; len as usize];
                file.read_exact_at(&mut b, at).unwrap();
                b
            })
            .collect();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut x = seed | 1;
            let mut next = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            let mut writes = 0u64;
            while !flag.load(Ordering::Relaxed) {
                for _ in 0..64 {
                    let p = (next() % parts.len() as u64) as usize;
                    let (at, len) = parts[p];
                    let k = (next() % (len / 8).max(1)) as usize * 8;
                    // A part shorter than a word (the 4-byte flags) gets that many bytes.
                    let n = (len as usize - k).min(8);
                    let mut word = [0u8; 8];
                    word[..n].copy_from_slice(&original[p][k..k + n]);
                    let was = u64::from_ne_bytes(word);
                    let v = match next() % 9 {
                        0 | 1 => next(),
                        2 => 0,
                        3 => u64::MAX,
                        4 => 1 << 63,
                        5 => next() % 4096,
                        6 => was ^ (1 << (next() % 64)),
                        7 => was.wrapping_add(next() % 64).wrapping_sub(32),
                        _ => was,
                    };
                    let _ = file.write_all_at(&v.to_ne_bytes()[..n], at + k as u64);
                    writes += 1;
                }
                if writes.is_multiple_of(8192) {
                    for (&(at, _), b) in parts.iter().zip(&original) {
                        let _ = file.write_all_at(b, at);
                    }
                }
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            writes
        });
        Rewriter {
            stop,
            handle: Some(handle),
        }
    }

    /// Stops the thread; returns how many words it wrote.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.take().unwrap().join().unwrap()
    }
}

impl Drop for Rewriter {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
