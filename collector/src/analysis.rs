//! The reference graph a command analyses (`leaks`, `retainers`, `graph`, `top`, `convert`):
//! a running process's (snapshotted, scanned, symbolized on demand) or a capture file's, and
//! the names of its stacks and allocation sites.

use crate::regions::{self, Liveness, Target};
use crate::{graph, pprof, python, sites, snapshot};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;

/// Where the graph comes from.
#[derive(Debug, Clone)]
pub enum Source {
    /// A capture file (`graph -o FILE.hdsnap`).
    Capture(PathBuf),
    /// A running process.
    Live(Live),
}

/// A running process to build the reference graph of, and how.
#[derive(Debug, Clone)]
pub struct Live {
    /// `Target::Pid` or `Target::Name`.
    pub target: Target,
    /// Freeze the program (ptrace) while its memory is read.
    pub stop: bool,
    /// Longest wait, in seconds, for another snapshot of the same region.
    pub lock_timeout: f64,
}

/// A running process's snapshot with its reference graph.
pub struct Captured {
    pub c: snapshot::Collected,
    pub g: graph::Graph,
    pub stats: graph::scan::ScanStats,
    /// What a re-check of the leak candidates needs (absent with `--stop`: exact already).
    pub recheck: Option<RecheckInput>,
}

/// The region of a running process, open, and the birth time of each graph block: what
/// `leaks` needs to re-check its candidates ([`graph::recheck`]).
pub struct RecheckInput {
    pub opened: regions::Opened,
    pub path: PathBuf,
    pub lock_timeout: std::time::Duration,
    /// Birth time (region clock, ns) of each block of the graph, in its order.
    pub births: Vec<u64>,
}

/// A reference graph to analyse: from a running process, or from a capture file.
pub struct Analysis {
    /// The live snapshot (absent for a capture file).
    pub c: Option<snapshot::Collected>,
    pub g: graph::Graph,
    /// How the scan went (absent for a capture file).
    pub stats: Option<graph::scan::ScanStats>,
    /// For re-checking leak candidates (a running process read without `--stop`).
    pub recheck: Option<RecheckInput>,
    /// Function names of every stack id of the graph, innermost first.
    pub stacks: std::collections::HashMap<u32, Vec<String>>,
    /// Where the script frames (Python's, JavaScript's) are in the stacks that have some (for their sites).
    pub hints: std::collections::HashMap<u32, sites::ScriptHint>,
    pub header: graph::capture::CaptureHeader,
}

impl Analysis {
    /// Makes sure `stacks` has the names of the given stack ids (symbolizing them for a live
    /// process; a capture has them all).
    pub fn name_stacks(&mut self, ids: impl Iterator<Item = u32>) {
        let Some(c) = &self.c else { return };
        let mut missing: Vec<u32> = ids.filter(|s| !self.stacks.contains_key(s)).collect();
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            let (names, hints) = stack_names_hinted(c, missing.into_iter());
            self.stacks.extend(names);
            self.hints.extend(hints);
        }
    }

    /// [`Self::name_stacks`] for every stack of the graph.
    pub fn name_all_stacks(&mut self) {
        let ids: Vec<u32> = self.g.blocks.iter().map(|b| b.stack).collect();
        self.name_stacks(ids.into_iter());
    }

    /// `pid PID (COMMAND)`.
    pub fn describe(&self) -> String {
        format!(
            "pid {} ({})",
            self.header.pid,
            self.header
                .cmdline
                .first()
                .map(|a| a.rsplit('/').next().unwrap_or(a).to_owned())
                .unwrap_or_default()
        )
    }
}

/// The graph of `t`: a capture file's, or a running process's (snapshotted, scanned and
/// symbolized now).
pub fn analysis(t: &Source, stage: &dyn Fn(&str)) -> Result<Analysis> {
    let t = match t {
        Source::Live(live) => live,
        Source::Capture(file) => {
            // A file that cannot be read says why (missing, a directory, no permission),
            // before its contents are judged.
            let md = std::fs::metadata(file)
                .with_context(|| format!("cannot open {}", file.display()))?;
            if md.is_dir() {
                bail!("{}: a directory, not a graph capture", file.display());
            }
            // Opened without blocking and checked on the descriptor: a FIFO is refused, not
            // waited on.
            crate::regions::open_regular(file)
                .with_context(|| format!("cannot open {}", file.display()))?;
            if !graph::capture::is_capture(file) {
                bail!(
                "{}: not a heapdump graph capture (write one with `heapdump graph --by-pid PID -o FILE.hdsnap`)",
                file.display()
            );
            }
            stage(&format!("reading {}", file.display()));
            let cap = graph::capture::read(file)?;
            return Ok(Analysis {
                c: None,
                g: cap.graph,
                stats: None,
                recheck: None,
                stacks: cap.stacks,
                hints: cap.hints,
                header: cap.header,
            });
        }
    };
    let Captured {
        c,
        g,
        stats,
        recheck,
    } = capture(t, stage)?;
    // Stacks are symbolized on demand (`Analysis::name_stacks`): `leaks` needs only the leaked
    // blocks' ones.
    let stacks = Default::default();
    let header = graph::capture::CaptureHeader {
        writer: format!("heapdump {}", env!("CARGO_PKG_VERSION")),
        pid: c.info.pid,
        cmdline: c.info.cmdline.clone(),
        executable: c.info.exe_path.clone(),
        time_unix_ns: c.time_realtime_ns,
        sample_interval: c.info.sample_interval,
        threads: c
            .threads
            .iter()
            .map(|t| heapdump_proto::hdsnap::Thread {
                tid: t.tid,
                name: t.name.clone(),
            })
            .collect(),
        modules: Vec::new(),
        warnings: c.meta.warnings.clone(),
    };
    Ok(Analysis {
        c: Some(c),
        g,
        stats: Some(stats),
        recheck,
        stacks,
        hints: Default::default(),
        header,
    })
}

/// Snapshots `target` and builds its reference graph (`leaks`, `retainers`, `graph`).
pub fn capture(t: &Live, stage: &dyn Fn(&str)) -> Result<Captured> {
    let (lock_timeout, stop) = (t.lock_timeout, t.stop);
    let (path, file) = regions::pick(&t.target)?;
    let regions::Usable {
        opened,
        info,
        liveness,
        ..
    } = regions::open_usable(&path, file.as_ref())?;
    if liveness != Liveness::Alive {
        bail!(
            "{}",
            liveness.why_no_memory(
                info.pid,
                "the reference graph can only be built for a running process it records"
            )
        );
    }
    // --stop: frozen from before the snapshot until the graph is built.
    let stopped = if stop {
        stage(&format!("stopping pid {}", info.pid));
        Some(graph::stop::stop(info.pid)?)
    } else {
        None
    };
    stage(&format!("snapshotting pid {}", info.pid));
    let timeout = std::time::Duration::from_secs_f64(lock_timeout.clamp(0.0, 1e9));
    let mut c = snapshot::collect(&opened, liveness, true, timeout)?;
    heapdump_testhooks::contents_pause();
    for w in &c.meta.warnings {
        eprintln!("heapdump: warning: {w}");
    }
    // Birth times, by address, for the re-check of leak candidates.
    let mut births: Vec<(u64, u64)> = if stop {
        Vec::new()
    } else {
        c.blocks
            .iter()
            .flatten()
            .map(|b| (b.address, b.t_alloc))
            .collect()
    };
    births.sort_unstable();
    births.dedup_by_key(|b| b.0);
    let blocks: Vec<graph::Block> = c
        .blocks
        .take()
        .unwrap_or_default()
        // By value: collected in place, in the snapshot's own allocation (both lists of 10 M
        // blocks at once were the collector's peak: 530 MiB).
        .into_iter()
        .map(|b| graph::Block {
            address: b.address,
            size: b.size,
            stack: b.stack,
            thread: b.thread,
        })
        .collect();
    let private = c.private_ranges();
    let (g, stats) = graph::scan::build(
        info.pid,
        blocks,
        &c.modules,
        &path,
        &private,
        stopped.as_ref(),
        stage,
    )?;
    // The process checked when the region was opened must still be the one read: not gone,
    // not a zombie, its pid not reused by another.
    if regions::proc_start_ticks(info.pid) != Some(info.start_ticks)
        || matches!(regions::proc_state(info.pid), None | Some('Z' | 'X'))
    {
        bail!(
            "pid {} exited during the read: what was read cannot be trusted",
            info.pid
        );
    }
    if let Some(s) = stopped {
        let (threads, seconds) = (s.threads.len(), s.seconds());
        drop(s); // resumes the program
        eprintln!(
            "heapdump: pid {} was stopped for {:.1} ms ({threads} threads)",
            c.info.pid,
            seconds * 1e3
        );
    }
    let recheck = (!stop).then(|| {
        let births = g
            .blocks
            .iter()
            .map(|b| {
                let k = births.partition_point(|x| x.0 < b.address);
                births
                    .get(k)
                    .filter(|x| x.0 == b.address)
                    .map_or(0, |x| x.1)
            })
            .collect();
        RecheckInput {
            opened,
            path: path.clone(),
            lock_timeout: timeout,
            births,
        }
    });
    Ok(Captured {
        c,
        g,
        stats,
        recheck,
    })
}

/// Function names of the given stacks, innermost first, the shim's own frames left out (as in
/// the profiles), and the [`sites::ScriptHint`] of each stack with script frames (Python's,
/// JavaScript's).
pub fn stack_names_hinted(
    c: &snapshot::Collected,
    stacks: impl Iterator<Item = u32>,
) -> (
    std::collections::HashMap<u32, Vec<String>>,
    std::collections::HashMap<u32, sites::ScriptHint>,
) {
    use sites::FrameKind;
    let stacks: Vec<u32> = stacks.collect();
    let mut addrs: Vec<u64> = stacks
        .iter()
        .filter_map(|s| c.stacks.get(s))
        .flatten()
        .map(|pc| pc.wrapping_sub(1))
        .collect();
    addrs.sort_unstable();
    addrs.dedup();
    let resolved = python::resolve(
        &c.modules,
        &c.jit,
        &c.python,
        &addrs,
        true,
        c.read_as.as_ref(),
    );
    let mut out = std::collections::HashMap::new();
    let mut hints = std::collections::HashMap::new();
    for s in stacks {
        let Some(frames) = c.stacks.get(&s) else {
            continue;
        };
        let mut names = Vec::new();
        // One per name: what its frame is (sites of stacks with script frames).
        let mut kinds: Vec<FrameKind<'_>> = Vec::new();
        // One per name: its source file (a script frame's site names it).
        let mut files: Vec<&str> = Vec::new();
        let mut leaf = true;
        for pc in frames {
            let a = pc.wrapping_sub(1);
            let Some(r) = resolved.get(&a) else {
                names.push(format!("{a:#x}"));
                kinds.push(FrameKind::Native(None));
                files.push("");
                leaf = false;
                continue;
            };
            // The shim's frames at the leaf, in libheapdump.so or compiled into a Rust program
            // as its `#[global_allocator]`.
            let own = |f: &crate::symbolize::Frame| {
                (sites::qualified_name(&f.function, &f.file))
                    .trim_start_matches('<')
                    .starts_with("heapdump_instrumentation::")
            };
            if leaf && (pprof::is_shim_frame(r, &c.modules) || r.frames.last().is_some_and(own)) {
                continue;
            }
            // A Rust program's `#[global_allocator]` is inlined into its callers: the leaf
            // frame's innermost inlined frames are the shim's (`alloc<std::alloc::System>`,
            // `__rust_alloc`), the rest the program's.
            let inner_shim = if leaf {
                (r.frames.iter())
                    .take_while(|f| own(f) || pprof::is_shim_function(&f.function))
                    .count()
                    .min(r.frames.len().saturating_sub(1))
            } else {
                0
            };
            let r_frames = &r.frames[inner_shim..];
            leaf = false;
            let kind = if python::record_of(*pc).is_some() {
                FrameKind::Script
            } else if let Some(m) = r.module {
                FrameKind::Native(Some(c.modules[m].path.as_str()))
            } else {
                // Generated code: a script function if its JIT names it so (node's).
                let file = r.frames.first().map_or("", |f| f.file.as_str());
                (c.jit.name(a))
                    .and_then(|n| sites::script_kind(n, file))
                    .unwrap_or(FrameKind::Native(None))
            };
            if r.frames.is_empty() {
                names.push(match r.module {
                    Some(m) => pprof::module_frame(&c.modules[m], a),
                    None => format!("{a:#x}"),
                });
                kinds.push(kind);
                files.push("");
            }
            names.extend(
                (r_frames.iter()).map(|f| sites::qualified_name(&f.function, &f.file).into_owned()),
            );
            kinds.resize(names.len(), kind);
            files.extend(r_frames.iter().map(|f| f.file.as_str()));
        }
        if let Some(mut h) = sites::script_hint(&kinds) {
            let i = h.innermost as usize;
            h.label = sites::script_label(&names[i], files[i]);
            for (i, label) in &mut h.outer {
                *label = sites::script_label(&names[*i as usize], files[*i as usize]);
            }
            hints.insert(s, h);
        }
        out.insert(s, names);
    }
    (out, hints)
}

/// The allocation site of each block's stack: its first frame outside the allocator wrappers
/// (`rule`: the default list and `--drop-frames`).
pub fn sites(an: &Analysis, rule: &sites::Sites) -> std::collections::HashMap<u32, String> {
    an.stacks
        .iter()
        .map(|(s, names)| (*s, rule.site_hinted(names, an.hints.get(s)).to_owned()))
        .collect()
}

/// Every block's chain from a root, folded (see [`graph::paths::Folded`]: a run of blocks of
/// one allocation site is one step), with the names of its steps — roots by name, blocks by
/// allocation site. What `retainers` and the ownership flame graph aggregate by.
#[derive(Debug, Default)]
pub struct NamedChains {
    folded: graph::paths::Folded,
    names: Vec<String>,
}

impl NamedChains {
    /// Folds the chains of `tree` over `g`, naming blocks by `sites` (stack id → site).
    pub fn new(
        g: &graph::Graph,
        tree: &graph::paths::Tree,
        sites: &std::collections::HashMap<u32, String>,
    ) -> NamedChains {
        let mut names: Vec<String> = Vec::new();
        let mut ids: std::collections::HashMap<String, u32> = Default::default();
        let mut by_stack: std::collections::HashMap<u32, u32> = Default::default();
        let mut intern = |names: &mut Vec<String>, s: &str| -> u32 {
            if let Some(&i) = ids.get(s) {
                return i;
            }
            names.push(s.to_owned());
            ids.insert(s.to_owned(), (names.len() - 1) as u32);
            (names.len() - 1) as u32
        };
        let root_ids: Vec<u32> = g
            .roots
            .iter()
            .map(|r| intern(&mut names, &r.name))
            .collect();
        let folded = tree.fold(
            |r| root_ids[r],
            |b| {
                let st = g.blocks[b as usize].stack;
                *by_stack.entry(st).or_insert_with(|| {
                    let site = sites.get(&st).map(String::as_str);
                    intern(&mut names, site.unwrap_or("(no stack trace)"))
                })
            },
        );
        NamedChains { folded, names }
    }

    /// Block `b`'s folded chain (its last step), `None` when unreachable.
    pub fn id(&self, b: u32) -> Option<u32> {
        self.folded
            .of_block
            .get(b as usize)
            .copied()
            .filter(|&s| s != graph::paths::NONE)
    }

    /// The names along folded chain `id`, from its root: a run is `SITE (up to N in a row)`,
    /// the middle of a chain of more than [`graph::paths::MAX_SHOWN`] steps `… N steps …`.
    pub fn names(&self, id: u32) -> Vec<String> {
        self.folded
            .chain(id)
            .into_iter()
            .map(|(name, run)| {
                if name == graph::paths::ELIDED {
                    format!("… {run} steps …")
                } else {
                    let n = self
                        .names
                        .get(name as usize)
                        .map(String::as_str)
                        .unwrap_or("?");
                    if run > 1 {
                        format!("{n} (up to {run} in a row)")
                    } else {
                        n.to_owned()
                    }
                }
            })
            .collect()
    }
}
