//! Re-checking leak candidates of a process that kept running while it was read (no
//! `--stop`): the first scan reads each block and root at a different instant after the
//! snapshot, so a block freed meanwhile, or one whose only pointer moved from memory not yet
//! read to memory already read, looks unreachable. Before they are reported, the candidates are
//! checked again:
//!
//! 1. the region is snapshotted again, and the target's memory read a second time — the roots
//!    (found anew: new mappings, stacks from the threads' stack pointers now), every block live
//!    now that is not a candidate (including blocks born since the first snapshot), and the
//!    candidates themselves — looking only for pointers into the candidates. A candidate
//!    pointed to from outside the candidates, and every candidate it points to (by the first
//!    scan's edges or the second's), was reachable after all;
//! 2. the region is snapshotted a third time: a candidate no longer live with the same birth
//!    time (freed, or its address reused by a younger block) is no leak.
//!
//! A true leak passes both: nothing points to it, and it stays live. A false one must lose its
//! only pointer in both reads, at different instants, and stay live: what is left is what
//! `--stop` adds (registers, and a pointer that moves at exactly the wrong times twice).
//! A younger block that is itself unreachable but points into a candidate hides it (a leak
//! made during the re-check): reported as reachable, never the other way round.

use super::leaks::Status;
use super::{Block, Graph};
use anyhow::Result;
use std::path::Path;
use vmo_layout::Module;

/// A live block of a later snapshot: the block and its birth time (region clock, ns).
#[derive(Debug, Clone, Copy)]
pub struct Born {
    /// The block.
    pub block: Block,
    /// When it was allocated (region clock, ns).
    pub t_alloc: u64,
}

/// What the re-check did.
#[derive(Debug, Clone, Default)]
pub struct Recheck {
    /// Unreachable blocks after the first scan.
    pub candidates: u64,
    /// Of those, found referenced by the second read (with what they point to).
    pub referenced: u64,
    /// Of those, not live any more with the same birth time at the third snapshot.
    pub freed: u64,
    /// Of those referenced, the candidates a thread's register pointed into (with what they
    /// point to, counted in `referenced` too).
    pub by_registers: u64,
    /// The threads' registers were read (a stop of `stopped_seconds`); false when no
    /// candidate was left to look for, or the process could not be stopped.
    pub registers_read: bool,
    /// How long the target was stopped to read its registers, seconds.
    pub stopped_seconds: f64,
    /// Threads whose registers were not read (running, or in a system call a stop would
    /// interrupt), when candidates were left.
    pub threads_not_read: u64,
    /// Bytes read by the second read.
    pub bytes_read: u64,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// Re-checks the unreachable blocks of `g` (`status` from [`super::leaks::classify`]) and
/// updates `status`: candidates found referenced or freed become [`Status::Reachable`] (not
/// leaked), the others stay leaked, direct or indirect by the candidates left.
///
/// `births[i]` is the birth time of `g.blocks[i]` (region clock, ns); `snapshot` takes a new
/// snapshot of the region (every live block with its birth time, any order). `modules`,
/// `region` and `private` as for [`super::scan::build`].
///
/// Errors: a snapshot fails, or the target's memory cannot be read any more (it exited).
#[allow(clippy::too_many_arguments)]
pub fn recheck(
    pid: u32,
    g: &Graph,
    status: &mut [Status],
    births: &[u64],
    snapshot: &mut dyn FnMut() -> Result<Vec<Born>>,
    modules: &[Module],
    region: &Path,
    private: &[(u64, u64)],
) -> Result<Recheck> {
    let started = std::time::Instant::now();
    let cands: Vec<u32> = (0..g.blocks.len() as u32)
        .filter(|&i| status[i as usize] != Status::Reachable)
        .collect();
    let mut out = Recheck {
        candidates: cands.len() as u64,
        ..Default::default()
    };
    if cands.is_empty() {
        return Ok(out);
    }
    // Candidate position by graph index (u32::MAX: not a candidate).
    let mut pos = vec![u32::MAX; g.blocks.len()];
    for (k, &c) in cands.iter().enumerate() {
        pos[c as usize] = k as u32;
    }
    let targets: Vec<Block> = cands.iter().map(|&c| g.blocks[c as usize]).collect();
    // Is this live block (address, birth) one of the candidates? `targets` is sorted.
    let candidate = |b: &Born| -> Option<usize> {
        let k = targets.partition_point(|t| t.address < b.block.address);
        (k < targets.len()
            && targets[k].address == b.block.address
            && births[cands[k] as usize] == b.t_alloc)
            .then_some(k)
    };

    // 1. The second read.
    let mut live = snapshot()?;
    live.sort_unstable_by_key(|b| b.block.address);
    live.dedup_by_key(|b| b.block.address);
    let readers: Vec<Block> = live
        .iter()
        .filter(|b| candidate(b).is_none())
        .map(|b| b.block)
        .collect();
    let live_blocks: Vec<Block> = live.iter().map(|b| b.block).collect();
    drop(live);
    let refs = super::scan::references_into(
        pid,
        &live_blocks,
        &readers,
        &targets,
        modules,
        region,
        private,
    )?;
    drop((live_blocks, readers));
    out.bytes_read = refs.bytes_read;
    // Rescued: pointed to from outside, and everything a rescued candidate points to.
    let mut rescued = refs.from_outside.clone();
    // A pointer held only in a register (an -O2 program blocked in a system call keeps its
    // containers in callee-saved registers: helper T, 3, 3,032 of 3,139 blocks reported
    // leaked) is in no memory either read sees: when candidates are left, the threads blocked
    // in system calls that a stop does not disturb ([`super::stop::quietly_stoppable`]) are
    // stopped just long enough to read their registers, and resumed; the others are not
    // stopped (the summary says so). A process that cannot be stopped (traced already) is
    // reported as read.
    let mut by_register = vec![false; targets.len()];
    let left = rescued.iter().any(|r| !r);
    let quiet = if left {
        super::stop::quietly_stoppable(pid)
    } else {
        Vec::new()
    };
    if !quiet.is_empty() {
        if let Ok(stopped) = super::stop::stop_some(pid, Some(&quiet)) {
            let values: Vec<u64> = (stopped.threads.iter())
                .flat_map(|t| t.registers.iter().copied())
                .collect();
            out.stopped_seconds = stopped.seconds();
            drop(stopped);
            out.registers_read = true;
            for v in values {
                let k = targets.partition_point(|t| t.address <= v);
                if k > 0 && v < targets[k - 1].address + targets[k - 1].size.max(1) {
                    by_register[k - 1] = true;
                    rescued[k - 1] = true;
                }
            }
        }
    }
    let mut stack: Vec<u32> = (0..targets.len() as u32)
        .filter(|&k| rescued[k as usize])
        .collect();
    while let Some(k) = stack.pop() {
        let old = g
            .edges(cands[k as usize])
            .iter()
            .map(|&e| pos[e as usize])
            .filter(|&p| p != u32::MAX);
        for p in old.chain(refs.edges[k as usize].iter().copied()) {
            if !rescued[p as usize] {
                rescued[p as usize] = true;
                stack.push(p);
            }
        }
    }
    out.referenced = rescued.iter().filter(|&&r| r).count() as u64;
    out.by_registers = by_register.iter().filter(|&&r| r).count() as u64;
    if left {
        let read = if out.registers_read { quiet.len() } else { 0 };
        out.threads_not_read = (super::stop::tids(pid).len() as u64).saturating_sub(read as u64);
    }

    // 2. Still live, born at the same instant.
    let mut still = vec![false; targets.len()];
    for b in snapshot()? {
        if let Some(k) = candidate(&b) {
            still[k] = true;
        }
    }
    let leaked: Vec<bool> = (0..targets.len())
        .map(|k| {
            if !rescued[k] && !still[k] {
                out.freed += 1;
            }
            !rescued[k] && still[k]
        })
        .collect();

    // Direct or indirect among the leaks left.
    for (k, &c) in cands.iter().enumerate() {
        status[c as usize] = if leaked[k] {
            Status::Direct
        } else {
            Status::Reachable
        };
    }
    for (k, &c) in cands.iter().enumerate() {
        if !leaked[k] {
            continue;
        }
        let old = g
            .edges(c)
            .iter()
            .map(|&e| pos[e as usize])
            .filter(|&p| p != u32::MAX);
        for p in old.chain(refs.edges[k].iter().copied()) {
            if p as usize != k && leaked[p as usize] {
                status[cands[p as usize] as usize] = Status::Indirect;
            }
        }
    }
    out.seconds = started.elapsed().as_secs_f64();
    Ok(out)
}
