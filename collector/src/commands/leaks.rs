//! `heapdump leaks`: the blocks no chain of pointers from a root reaches.

use super::stages;
use crate::analysis::{analysis, Source};
use crate::regions::Liveness;
use crate::{cli, graph, pprof, snapshot};
use anyhow::Result;
use std::path::PathBuf;

/// What `leaks` reads and writes.
#[derive(Debug, Clone)]
pub struct Options {
    /// The process, or a capture.
    pub source: Source,
    /// `--drop-frames`: more frames to skip, as allocator wrappers, at the top of a stack.
    pub drop_frames: Option<String>,
    /// One JSON object per leak group instead of a report.
    pub json: bool,
    /// Also the leaked blocks as a pprof profile here.
    pub output: Option<PathBuf>,
}

impl From<cli::LeaksArgs> for Options {
    fn from(mut a: cli::LeaksArgs) -> Self {
        Options {
            drop_frames: a.target.drop_frames.take(),
            source: a.target.into(),
            json: a.json,
            output: a.output,
        }
    }
}

/// `heapdump leaks`: snapshot, scan the contents, report the unreachable blocks.
pub fn run(a: Options) -> Result<()> {
    use graph::leaks::Status;
    // --drop-frames: the frames matching it are left off the top of each stack shown.
    super::check_regex(a.drop_frames.as_deref())?;
    let drop = (a.drop_frames.as_deref())
        .map(|d| regex::Regex::new(&format!("^(?:{d})$")))
        .transpose()?;
    let stage = stages();
    let mut an = analysis(&a.source, &stage)?;
    stage("finding what is reachable");
    let mut status = graph::leaks::classify(&an.g);
    // Read without --stop: the candidates are checked again before they are reported.
    let rechecked = match (&an.recheck, &an.c) {
        (Some(rc), Some(c)) => {
            stage("re-checking the leak candidates");
            let mut snap = || -> Result<Vec<graph::recheck::Born>> {
                let s = snapshot::collect(&rc.opened, Liveness::Alive, true, rc.lock_timeout)?;
                Ok(s.blocks
                    .unwrap_or_default()
                    .into_iter()
                    .map(|b| graph::recheck::Born {
                        block: graph::Block {
                            address: b.address,
                            size: b.size,
                            stack: b.stack,
                            thread: b.thread,
                        },
                        t_alloc: b.t_alloc,
                    })
                    .collect())
            };
            // A target that exits meanwhile cannot be read again: the first read's findings
            // are reported, with a warning (`recheck` changes `status` only when it succeeds).
            let mut checked = status.clone();
            match graph::recheck::recheck(
                c.info.pid,
                &an.g,
                &mut checked,
                &rc.births,
                &mut snap,
                &c.modules,
                &rc.path,
                &c.private_ranges(),
            ) {
                Ok(r) => {
                    status = checked;
                    Some(r)
                }
                Err(e) => {
                    eprintln!(
                        "heapdump: warning: the leak candidates could not be checked again \
                         ({e:#}); reported as the first read found them (a busy program may \
                         show false leaks: run again, or use --stop)"
                    );
                    None
                }
            }
        }
        _ => None,
    };
    let leaked: Vec<u32> =
        an.g.blocks
            .iter()
            .zip(&status)
            .filter(|(_, s)| **s != Status::Reachable)
            .map(|(b, _)| b.stack)
            .collect();
    stage("symbolizing");
    an.name_stacks(leaked.into_iter());
    let g = &an.g;

    // Leak groups: (status, stack) -> (blocks, bytes), largest first.
    let mut groups: std::collections::HashMap<(Status, u32), (u64, u64)> = Default::default();
    let mut inuse: std::collections::HashMap<(u32, u32, u64), (f64, f64)> = Default::default();
    for (b, s) in g.blocks.iter().zip(&status) {
        if *s == Status::Reachable {
            continue;
        }
        let e = groups.entry((*s, b.stack)).or_default();
        e.0 += 1;
        e.1 += b.size;
        let e = inuse.entry((b.stack, b.thread, b.size)).or_default();
        e.0 += 1.0;
        e.1 += b.size as f64;
    }
    let shown: std::collections::HashMap<u32, Vec<String>> = (an.stacks.iter())
        .map(|(s, f)| {
            let keep = match &drop {
                Some(re) => f
                    .iter()
                    .position(|n| !re.is_match(n))
                    .unwrap_or(f.len().saturating_sub(1)),
                None => 0,
            };
            (*s, f[keep.min(f.len())..].to_vec())
        })
        .collect();
    let names = &shown;
    // Stacks that print the same (return addresses that differ within one line, or frames
    // --drop-frames removed) are one group: two groups whose frames read alike would look
    // like one leak split in two.
    let mut merged: std::collections::HashMap<(Status, &[String]), (u32, u64, u64)> =
        Default::default();
    let none: &[String] = &[];
    for ((s, stack), (blocks, bytes)) in groups {
        let frames = names.get(&stack).map(Vec::as_slice).unwrap_or(none);
        let e = merged.entry((s, frames)).or_insert((stack, 0, 0));
        e.0 = e.0.min(stack);
        e.1 += blocks;
        e.2 += bytes;
    }
    let mut groups: Vec<((Status, u32), (u64, u64))> = (merged.into_iter())
        .map(|((s, _), (stack, blocks, bytes))| ((s, stack), (blocks, bytes)))
        .collect();
    groups.sort_by(|x, y| (y.1 .1, y.1 .0, x.0).cmp(&(x.1 .1, x.1 .0, y.0)));
    let (direct, indirect) =
        groups
            .iter()
            .fold((0u64, 0u64), |acc, ((s, _), (_, bytes))| match s {
                Status::Direct => (acc.0 + bytes, acc.1),
                _ => (acc.0, acc.1 + bytes),
            });
    if a.json {
        let v: Vec<serde_json::Value> = groups
            .iter()
            .map(|((s, stack), (blocks, bytes))| {
                serde_json::json!({
                    "kind": s.as_str(),
                    "blocks": blocks,
                    "bytes": bytes,
                    "frames": names.get(stack).cloned().unwrap_or_default(),
                })
            })
            .collect();
        println!(
            "{}",
            crate::output::json_for_terminal(serde_json::to_string_pretty(&v)?)
        );
    } else {
        for ((s, stack), (blocks, bytes)) in &groups {
            let kind = if *s == Status::Direct {
                "Direct"
            } else {
                "Indirect"
            };
            println!("{kind} leak of {bytes} byte(s) in {blocks} object(s) allocated from:");
            match names.get(stack) {
                Some(f) if !f.is_empty() => {
                    for (i, n) in f.iter().enumerate() {
                        println!("    #{i} {n}");
                    }
                }
                _ => println!("    (no stack trace recorded)"),
            }
            println!();
        }
        let count = |k: Status| {
            groups
                .iter()
                .filter(|g| g.0 .0 == k)
                .map(|g| g.1 .0)
                .sum::<u64>()
        };
        let scan = match &an.stats {
            Some(st) => {
                format!(
                    "; scanned {} bytes of blocks and {} bytes of {} roots in {:.2} s{}{}",
                    st.bytes_read,
                    st.root_bytes,
                    g.roots.len(),
                    st.seconds,
                    if st.root_bytes_untouched > 0 {
                        format!(
                            " ({} bytes of reserved address space never touched, not read)",
                            st.root_bytes_untouched
                        )
                    } else {
                        String::new()
                    },
                    if st.vanished > 0 {
                        format!("; {} blocks freed meanwhile could not be read", st.vanished)
                    } else {
                        String::new()
                    },
                ) + &match &rechecked {
                    Some(r) if r.candidates > 0 => format!(
                        "; re-checked {} candidates in {:.2} s: {} referenced, {} freed since{}",
                        r.candidates,
                        r.seconds,
                        r.referenced,
                        r.freed,
                        match (r.registers_read, r.threads_not_read) {
                            (true, 0) => format!(
                                "; {} held by a thread's register (the threads stopped {:.1} ms \
                                 to read them)",
                                r.by_registers,
                                r.stopped_seconds * 1e3
                            ),
                            (true, n) => format!(
                                "; {} held by a thread's register (threads blocked in quiet \
                                 system calls stopped {:.1} ms to read them; {n} others not \
                                 stopped: a pointer only in their registers is not seen, \
                                 --stop reads them)",
                                r.by_registers,
                                r.stopped_seconds * 1e3
                            ),
                            (false, n) if n > 0 => format!(
                                "; the registers of {n} threads were not read (running, in a \
                                 system call a stop would interrupt, or traced already): a \
                                 pointer only in a register is not seen, --stop reads them"
                            ),
                            _ => String::new(),
                        }
                    ),
                    _ => String::new(),
                }
            }
            None => format!("; from a capture of {}", an.describe()),
        };
        println!(
            "SUMMARY: heapdump: {} byte(s) leaked in {} allocation(s) ({} direct bytes, {} indirect) \
             of {} live blocks{scan}",
            direct + indirect,
            count(Status::Direct) + count(Status::Indirect),
            direct,
            indirect,
            g.blocks.len(),
        );
    }
    // Another allocator's memory is scanned only where it has its own mappings: one that grows
    // with sbrk (tcmalloc) shares `[heap]` with glibc's free chunks, never roots (their stale
    // pointers would hide real leaks: helper Y, 1), so a block held only from there is
    // reported leaked (helper T, 4). Said, so that such a report is read for what it is.
    let other = (an.c.iter())
        .flat_map(|c| c.info.warnings.iter())
        .find(|w| w.contains("is another allocator's"));
    if let Some(w) = other {
        eprintln!(
            "heapdump: note: {}; a block held only from that allocator's memory in the brk \
             heap (tcmalloc's) is reported leaked",
            crate::regions::shown(w.split(':').next().unwrap_or(w))
        );
    }
    if let Some(out) = &a.output {
        let what = an.describe();
        let leaked_bytes = direct + indirect;
        let blocks_of = |k: Status| -> u64 {
            (groups.iter())
                .filter(|g| (g.0 .0 == Status::Direct) == (k == Status::Direct))
                .map(|g| g.1 .0)
                .sum()
        };
        // What tells `heapdump report` this profile from a snapshot (see
        // `report::model::LEAKS_COMMENT`).
        let summary = format!(
            "{}pid={} direct_bytes={direct} direct_blocks={} indirect_bytes={indirect} \
             indirect_blocks={} live_blocks={}",
            crate::report::model::LEAKS_COMMENT,
            an.header.pid,
            blocks_of(Status::Direct),
            blocks_of(Status::Indirect),
            g.blocks.len(),
        );
        let time_ns = an.header.time_unix_ns as i64;
        let mut profile = match an.c {
            Some(mut c) => {
                c.inuse = inuse;
                c.alloc_totals.clear();
                pprof::build(
                    &c,
                    pprof::Options {
                        with_tags: false,
                        symbolize: true,
                    },
                )
                .0
            }
            None => {
                let mut by_stack: std::collections::BTreeMap<u32, (u64, u64)> = Default::default();
                for ((stack, _, _), (blocks, bytes)) in &inuse {
                    let e = by_stack.entry(*stack).or_default();
                    e.0 += *blocks as u64;
                    e.1 += *bytes as u64;
                }
                pprof::from_names(
                    &an.stacks,
                    by_stack.into_iter().map(|(s, (b, n))| (s, b, n)),
                    &[format!(
                        "leaked blocks of {what}, from a heapdump graph capture"
                    )],
                )
            }
        };
        profile.string_table.push(summary);
        (profile.comment).push(profile.string_table.len() as i64 - 1);
        if profile.time_nanos == 0 {
            profile.time_nanos = time_ns;
        }
        pprof::write(&profile, None, out)?;
        eprintln!(
            "heapdump: {what}: {leaked_bytes} leaked bytes -> {}",
            out.display()
        );
    }
    Ok(())
}
