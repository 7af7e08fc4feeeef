//! `heapdump list`: the region files of this user, with their process's status and counters.

use crate::{cli, moments, regions};
use anyhow::Result;

/// What `list` prints.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// One JSON array instead of a table.
    pub json: bool,
    /// Each process's named snapshots too.
    pub snapshots: bool,
}

impl From<cli::ListArgs> for Options {
    fn from(a: cli::ListArgs) -> Self {
        Options {
            json: a.json,
            snapshots: a.snapshots,
        }
    }
}

pub fn run(a: Options) -> Result<()> {
    let entries = regions::scan()?;
    if a.json {
        let v: Vec<serde_json::Value> = entries
            .iter()
            .map(|e| match &e.info {
                Some(i) => serde_json::json!({
                    "pid": e.file.pid,
                    "command": regions::command_name(i),
                    "cmdline": i.cmdline,
                    "executable": i.exe_path,
                    "status": e.status(),
                    "foreign": e.foreign,
                    "live_bytes": i.counters.live_bytes,
                    "live_blocks": i.counters.live_blocks,
                    "allocations": i.counters.allocs,
                    "frees": i.counters.frees,
                    "peak_live_bytes": i.counters.peak_live_bytes,
                    "dropped_blocks": i.counters.dropped_blocks,
                    "dropped_stacks": i.counters.dropped_stacks,
                    "threads": i.counters.threads,
                    "layout_version": i.version,
                    "region": e.file.path,
                    "recording_stopped": i.stop_reasons(),
                    "warnings": i.warnings,
                    "named_snapshots": e.named.iter().map(|s| serde_json::json!({
                        "name": s.name,
                        "number": s.index + 1,
                        "time": moments::utc(s.realtime_ns),
                        "time_unix_ns": s.realtime_ns,
                        "region_clock_ns": s.time_ns,
                        "incomplete_by_at_most": s.lost,
                    })).collect::<Vec<_>>(),
                }),
                None => serde_json::json!({
                    "pid": e.file.pid,
                    "region": e.file.path,
                    "error": e.error,
                }),
            })
            .collect();
        println!(
            "{}",
            crate::output::json_for_terminal(serde_json::to_string_pretty(&v)?)
        );
        return Ok(());
    }
    println!(
        "{:>8}  {:<7}  {:>12}  {:>10}  {:>8}  {:>3}  COMMAND",
        "PID", "STATUS", "LIVE BYTES", "BLOCKS", "DROPPED", "VER"
    );
    // A kept region of a process that exited without allocating anything (a wrapper's
    // helper: `HEAPDUMP_KEEP=1` behind a script) has nothing to show: left out of the table,
    // counted under it. `--json` lists every region.
    // One that dropped what it could not record (a full file system) or whose recording
    // stopped is shown: it did allocate.
    let empty = |e: &&regions::Entry| {
        e.foreign.is_none()
            && e.liveness != regions::Liveness::Alive
            && e.info.as_ref().is_some_and(|i| {
                i.counters.allocs == 0
                    && i.counters.dropped_blocks == 0
                    && i.stop_reasons().is_empty()
            })
    };
    let left_out = entries.iter().filter(empty).count();
    for e in entries.iter().filter(|e| !empty(e)) {
        match &e.info {
            Some(i) => {
                println!(
                    "{:>8}  {:<7}  {:>12}  {:>10}  {:>8}  {:>3}  {}",
                    e.file.pid,
                    e.status(),
                    i.counters.live_bytes,
                    i.counters.live_blocks,
                    i.counters.dropped_blocks,
                    i.version,
                    regions::show_cmdline(&i.cmdline)
                );
                if let Some(why) = &e.foreign {
                    println!("{:>8}  {why}", "");
                }
                // Why recording stopped and start-up warnings, under the process's line.
                for r in i.stop_reasons() {
                    println!("{:>8}  recording stopped: {r}", "");
                }
                for w in &i.warnings {
                    println!("{:>8}  warning: {}", "", regions::shown(w));
                }
                if a.snapshots {
                    // Per name, the number `--named NAME@N` takes.
                    let mut seen: std::collections::HashMap<&str, usize> = Default::default();
                    for s in &e.named {
                        let k = seen.entry(s.name.as_str()).or_default();
                        *k += 1;
                        println!(
                            "{:>8}  named snapshot {:?} (@{k}) at {}{}",
                            "",
                            s.name,
                            moments::utc(s.realtime_ns),
                            if s.lost > 0 {
                                format!(", incomplete: up to {} blocks missing", s.lost)
                            } else {
                                String::new()
                            }
                        );
                    }
                    if i.named_requested > i.named_capacity {
                        let more = i.named_requested - i.named_capacity;
                        println!(
                            "{:>8}  {more} more named snapshot{} refused: the table holds {}",
                            "",
                            if more == 1 { " was" } else { "s were" },
                            i.named_capacity
                        );
                    }
                }
            }
            None => println!(
                "{:>8}  {:<7}  {:>12}  {:>10}  {:>8}  {:>3}  ({})",
                e.file.pid,
                "?",
                "-",
                "-",
                "-",
                "-",
                e.error.as_deref().unwrap_or("")
            ),
        }
    }
    if left_out > 0 {
        println!(
            "({left_out} region{} of exited processes that allocated nothing not shown; \
             `heapdump gc` removes {})",
            if left_out == 1 { "" } else { "s" },
            if left_out == 1 { "it" } else { "them" }
        );
    }
    Ok(())
}
