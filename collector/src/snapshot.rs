//! Taking a snapshot of a region and aggregating it for output.

use crate::regions::{Liveness, Opened};
use anyhow::{Context, Result};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::time::Duration;
use vmo_layout::{Block, Module, RegionInfo, SnapshotMeta, SnapshotOptions, ThreadInfo};

/// Everything read from a region at one instant, aggregated.
#[derive(Debug, Default)]
pub struct Collected {
    /// Header facts and counters.
    pub info: RegionInfo,
    /// Whether the writer was alive.
    pub alive: bool,
    /// What the snapshot reported.
    pub meta: SnapshotMeta,
    /// Wall-clock time of the snapshot, ns since the Unix epoch.
    pub time_realtime_ns: u64,
    /// Frames (return addresses, leaf first) of every stack used below.
    pub stacks: HashMap<u32, Vec<u64>>,
    /// Cumulative (allocations, bytes) per stack, unbiased when the region was sampled.
    pub alloc_totals: HashMap<u32, (f64, f64)>,
    /// Live (blocks, bytes) per (stack, thread id, block size), unbiased when the region was
    /// sampled.
    pub inuse: HashMap<(u32, u32, u64), (f64, f64)>,
    /// Every live block, when asked for (`--with-tags`).
    pub blocks: Option<Vec<Block>>,
    /// Thread slots.
    pub threads: Vec<ThreadInfo>,
    /// Module table.
    pub modules: Vec<Module>,
}

/// How many blocks of `size` bytes one sampled block stands for, when bytes are sampled as a
/// Poisson process of mean `interval` (heapprofd, jemalloc; Go's `scaleHeapSample`):
/// `1 / (1 - exp(-size / interval))`. 1 when `interval` is 0 (every block recorded).
pub fn weight(size: f64, interval: u64) -> f64 {
    if interval == 0 || size <= 0.0 {
        return 1.0;
    }
    1.0 / (1.0 - (-size / interval as f64).exp())
}

/// Snapshots the region in `opened`.
///
/// For a live writer the snapshot holds an exclusive `flock` on the file (one live snapshot at a
/// time per region; the target never takes it) and uses the lease protocol.
pub fn collect(opened: &Opened, liveness: Liveness, with_blocks: bool) -> Result<Collected> {
    let region = opened.region()?;
    let live = liveness == Liveness::Alive && opened.writable();
    if live {
        // SAFETY: flock on our own open descriptor.
        let r = unsafe { libc::flock(opened.file.as_raw_fd(), libc::LOCK_EX) };
        if r != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("cannot lock {}", opened.path.display()));
        }
    }
    let interval = region.info().sample_interval;
    let mut inuse: HashMap<(u32, u32, u64), (f64, f64)> = HashMap::new();
    let mut blocks = with_blocks.then(Vec::new);
    let mut meta = region.snapshot(
        &SnapshotOptions {
            live,
            wait_timeout: Duration::from_millis(200),
        },
        |b| {
            let w = weight(b.size as f64, interval);
            let e = inuse.entry((b.stack, b.thread, b.size)).or_default();
            e.0 += w;
            e.1 += w * b.size as f64;
            if let Some(v) = blocks.as_mut() {
                v.push(*b);
            }
        },
    );
    let time_realtime_ns = vmo_layout::clock::realtime_ns();
    if live {
        // SAFETY: as above.
        unsafe { libc::flock(opened.file.as_raw_fd(), libc::LOCK_UN) };
    }
    if liveness == Liveness::Alive && !opened.writable() {
        meta.warnings.push(
            "region is read-only to us: snapshot taken without the consistency protocol".into(),
        );
    }
    let info = region.info();
    let mut alloc_totals = HashMap::new();
    let mut stacks = HashMap::new();
    let want = |id: u32, stacks: &mut HashMap<u32, Vec<u64>>| {
        if id != u32::MAX && !stacks.contains_key(&id) {
            stacks.insert(id, region.stack(id).unwrap_or_default());
        }
    };
    for id in 0..region.stack_count() as u32 {
        let (n, b) = region.stack_totals(id);
        if n > 0 {
            let w = weight(b as f64 / n as f64, interval);
            alloc_totals.insert(id, (n as f64 * w, b as f64 * w));
            want(id, &mut stacks);
        }
    }
    for &(s, _, _) in inuse.keys() {
        want(s, &mut stacks);
    }
    Ok(Collected {
        info,
        alive: liveness == Liveness::Alive,
        meta,
        time_realtime_ns,
        stacks,
        alloc_totals,
        inuse,
        blocks,
        threads: region.threads(),
        modules: region.modules(),
    })
}
