//! `heapdump snapshot --multi-process`: several running processes snapshotted one after the
//! other and merged into one profile whose samples are labelled `process_name` and `pid`
//! ([`crate::pprof::merge`]).
//!
//! Each process's snapshot is an instant of its own (the processes are not frozen together):
//! the profile is the union of per-process snapshots taken within a short span, exactly what
//! separate `heapdump snapshot --by-pid` runs would give for each.

use crate::cli::{Selection, SnapshotProps};
use crate::regions::{self, Liveness};
use crate::{pprof, Entry};
use anyhow::{bail, Result};
use heapdump_proto as pb;

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
    let tree = sel.tree.map(regions::process_tree).transpose()?;
    let me = std::process::id();
    let entries = crate::scan()?;
    let mut chosen: Vec<&Entry> = entries
        .iter()
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
    let mut parts = Vec::new();
    let mut skipped = Vec::new();
    let (mut blocks, mut bytes) = (0u64, 0u64);
    for e in &chosen {
        let name = e
            .info
            .as_ref()
            .map(regions::command_name)
            .unwrap_or_default();
        match one(e, p) {
            Ok((profile, meta)) => {
                for w in &meta.warnings {
                    eprintln!("heapdump: pid {} ({name}): warning: {w}", e.file.pid);
                }
                eprintln!(
                    "heapdump: pid {} ({name}): {} live blocks, {} bytes",
                    e.file.pid, meta.blocks, meta.bytes
                );
                blocks += meta.blocks;
                bytes += meta.bytes;
                parts.push(pprof::Part {
                    profile,
                    process_name: name,
                    pid: e.file.pid,
                });
            }
            Err(err) => {
                // One line per process, whatever the error's text holds.
                let why = format!("{err:#}").replace('\n', "; ");
                eprintln!("heapdump: pid {} ({name}): skipped: {why}", e.file.pid);
                skipped.push(format!("pid {} ({name}): {why}", e.file.pid));
            }
        }
    }
    if parts.is_empty() {
        bail!(
            "none of the {} selected processes could be snapshotted",
            chosen.len()
        );
    }
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
    let mut merged = pprof::merge(&parts, &comments);
    pprof::write_as(
        &mut merged,
        None,
        &p.output,
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
        p.output.display()
    );
    Ok(())
}

/// The profile of one process (as `heapdump snapshot --by-pid` builds it) and how its
/// snapshot went.
///
/// Errors: the process is no longer running this image, or its snapshot fails.
fn one(e: &Entry, p: &SnapshotProps) -> Result<(pb::Profile, vmo_layout::SnapshotMeta)> {
    let opened = regions::open(&e.file.path)?;
    let info = opened.region()?.info();
    let files = regions::list_files(&regions::region_dir()).unwrap_or_default();
    let liveness = regions::liveness(&info, &e.file, regions::has_newer(&files, &e.file));
    if liveness != Liveness::Alive {
        bail!("exited before its snapshot");
    }
    let c = crate::snapshot::collect(&opened, liveness, false, p.lock_timeout)?;
    let (profile, _) = pprof::build(
        &c,
        pprof::Options {
            with_tags: false,
            symbolize: p.symbolize,
        },
    );
    Ok((profile, c.meta))
}
