//! `heapdump snapshot --multi-process`: several running processes snapshotted one after the
//! other and merged into one profile whose samples are labelled `process_name` and `pid`
//! ([`crate::pprof::merge`]).
//!
//! Each process's snapshot is an instant of its own (the processes are not frozen together):
//! the profile is the union of per-process snapshots taken within a short span, exactly what
//! separate `heapdump snapshot --by-pid` runs would give for each.

use crate::cli::{Selection, SnapshotProps};
use crate::pprof;
use crate::regions::Entry;
use crate::regions::{self, Liveness};
use anyhow::{bail, Result};

/// Snapshots every running instrumented process that `sel` selects (this user's region
/// directory; never this collector itself) into one profile written as `p` says.
///
/// A process that exits before its turn, or whose snapshot fails (lock held past
/// `--lock-timeout`, region unreadable), is reported on stderr in one line,
/// `heapdump: pid PID (NAME): skipped: WHY`, and left out.
///
/// Errors: `--tree PID` names no running process; no running process matches; none of those
/// that match could be snapshotted; the output cannot be written.
pub fn snapshot(p: &SnapshotProps, sel: &Selection) -> Result<()> {
    let Some(output) = &p.output else {
        bail!("--multi-process writes one profile: give -o FILE");
    };
    let chosen = select(sel)?;
    if chosen.is_empty() {
        let mut what = Vec::new();
        if !sel.names.is_empty() {
            what.push(format!("named {}", sel.names.join(" or ")));
        }
        if let Some(t) = sel.tree {
            what.push(format!("in the process tree of pid {t}"));
        }
        bail!(
            "no running instrumented process{}{} (region directory {}; see `heapdump list`)",
            if what.is_empty() { "" } else { " " },
            what.join(" "),
            regions::region_dir().display()
        );
    }
    // Every snapshot first (the per-block samples borrow from them), then the profiles.
    let mut taken = Vec::new();
    let mut skipped = Vec::new();
    let (mut blocks, mut bytes) = (0u64, 0u64);
    for e in &chosen {
        let name = e
            .info
            .as_ref()
            .map(regions::command_label)
            .unwrap_or_default();
        match one(e, p.with_tags, p.lock_timeout) {
            Ok(c) => {
                for w in &c.meta.warnings {
                    eprintln!(
                        "heapdump: pid {} ({name}): warning: {}",
                        e.file.pid,
                        regions::shown(w)
                    );
                }
                eprintln!(
                    "heapdump: pid {} ({name}): {} live blocks, {} bytes",
                    e.file.pid, c.meta.blocks, c.meta.bytes
                );
                for line in regions::incomplete_lines(&c.info) {
                    eprintln!("heapdump: pid {} ({name}): warning: {line}", e.file.pid);
                }
                blocks = c.meta.blocks.saturating_add(blocks);
                bytes = c.meta.bytes.saturating_add(bytes);
                taken.push((e.file.pid, name, c));
            }
            Err(err) => {
                // One line per process, whatever the error's text holds.
                let why = format!("{err:#}").replace('\n', "; ");
                eprintln!(
                    "heapdump: pid {} ({name}): skipped: {}",
                    e.file.pid,
                    crate::regions::shown(&why)
                );
                skipped.push(format!("pid {} ({name}): {why}", e.file.pid));
            }
        }
    }
    if taken.is_empty() {
        bail!(
            "none of the {} selected processes could be snapshotted",
            chosen.len()
        );
    }
    let mut parts: Vec<pprof::Part<'_>> = taken
        .iter()
        .map(|(pid, name, c)| {
            let (profile, blocks) = pprof::build(
                c,
                pprof::Options {
                    with_tags: p.with_tags,
                    symbolize: p.symbolize,
                },
            );
            pprof::Part {
                profile,
                blocks,
                process_name: name.clone(),
                pid: *pid,
            }
        })
        .collect();
    let list: Vec<String> = parts
        .iter()
        .map(|x| format!("pid {} ({})", x.pid, x.process_name))
        .collect();
    let mut comments = vec![format!(
        "heapdump multi-process snapshot of {} processes: {}; samples labelled process_name and pid",
        parts.len(),
        list.join(", ")
    )];
    comments.extend(skipped.iter().map(|s| format!("skipped {s}")));
    let mut merged = pprof::merge(&mut parts, &comments);
    let per_block: Vec<&pprof::BlockSamples<'_>> =
        parts.iter().filter_map(|x| x.blocks.as_ref()).collect();
    pprof::write_as(
        &mut merged,
        &per_block,
        output,
        p.format,
        p.sample_index,
        &format!("{} processes", parts.len()),
    )?;
    eprintln!(
        "heapdump: {} processes{}: {blocks} live blocks, {bytes} bytes -> {}",
        parts.len(),
        if skipped.is_empty() {
            String::new()
        } else {
            format!(" ({} skipped)", skipped.len())
        },
        output.display()
    );
    Ok(())
}

/// The running instrumented processes that `sel` selects (this user's region directory;
/// never this collector itself), in pid order; possibly none.
///
/// Errors: `--tree PID` names no running process; the region directory cannot be read.
pub fn select(sel: &Selection) -> Result<Vec<Entry>> {
    select_following(sel, &[])
}

/// [`select`], the processes of `--tree` also counting every running descendant of
/// `following` (processes already followed: a watch keeps them, and what they start, when the
/// tree's root exits or an intermediate process does and they are re-parented out of it;
/// helper R, 1).
///
/// Errors: `--tree PID` names no running process and none of `following` runs; the region
/// directory cannot be read.
pub fn select_following(sel: &Selection, following: &[u32]) -> Result<Vec<Entry>> {
    let tree = match sel.tree {
        None => None,
        Some(root) => {
            let mut pids = Vec::new();
            let mut any = false;
            for p in std::iter::once(root).chain(following.iter().copied()) {
                if let Ok(t) = regions::process_tree(p) {
                    any = true;
                    pids.extend(t);
                }
            }
            if !any {
                regions::process_tree(root)?;
            }
            pids.sort_unstable();
            pids.dedup();
            Some(pids)
        }
    };
    let me = std::process::id();
    let mut chosen: Vec<Entry> = regions::scan()?
        .into_iter()
        .filter(|e| e.liveness == Liveness::Alive && e.file.pid != me)
        .filter(|e| match &tree {
            Some(t) => t.binary_search(&e.file.pid).is_ok(),
            None => true,
        })
        .filter(|e| {
            sel.names.is_empty()
                || e.info
                    .as_ref()
                    .is_some_and(|i| sel.names.iter().any(|n| regions::matches_name(i, n)))
        })
        .collect();
    chosen.sort_by_key(|e| e.file.pid);
    Ok(chosen)
}

/// The snapshot of one process (as `heapdump snapshot --by-pid` takes it), with every live
/// block when `with_blocks`; waits at most `lock_timeout` for another collector's lock.
///
/// Errors: the process is no longer running this image ("exited before its snapshot"), or
/// its snapshot fails.
pub fn one(
    e: &Entry,
    with_blocks: bool,
    lock_timeout: std::time::Duration,
) -> Result<crate::snapshot::Collected> {
    let regions::Usable {
        opened, liveness, ..
    } = regions::open_usable(&e.file.path, Some(&e.file))?;
    match liveness {
        Liveness::Alive => {}
        Liveness::Zombie => bail!("became a zombie (exited, not reaped) before its snapshot"),
        Liveness::Exited => bail!("exited before its snapshot"),
        Liveness::Detached => bail!("was detached (heapdump detach) before its snapshot"),
    }
    crate::snapshot::collect(&opened, liveness, with_blocks, lock_timeout)
}
