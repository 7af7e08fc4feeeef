//! The report's data: the snapshots of each process, their stack traces interned in one trie
//! per process, and what the page shows computed from them (summary, timeline, growth
//! ranking), serialized as JSON.

use super::growth::{growth, line, Growth};
use crate::sites::Sites;
use heapdump_proto as pb;
use rustc_hash::FxHashMap;
use serde_json::{json, Value};
use std::collections::HashMap;

/// How many allocation sites the timeline stacks by name (the rest are "other").
pub const TIMELINE_SITES: usize = 8;
/// How many sites the growth ranking lists.
pub const RANKED_SITES: usize = 50;
/// How many sites, the best by least-squares slope × R², the growth ranking scores (the
/// Theil–Sen slope costs the square of the snapshots per site).
pub const SCORED_SITES: usize = 4 * RANKED_SITES;

/// How many allocation sites a leaks or reference-graph section lists.
pub const SECTION_SITES: usize = 20;
/// The start of the comment `heapdump leaks -o` adds to its profile:
/// `heapdump leaks: pid=P direct_bytes=N direct_blocks=N indirect_bytes=N indirect_blocks=N
/// live_blocks=N`. A profile with it is a leaks report, not a snapshot.
pub const LEAKS_COMMENT: &str = "heapdump leaks: ";

/// The leak counts of a `leaks -o` profile's comment ([`LEAKS_COMMENT`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeakCounts {
    pub pid: u32,
    pub direct_bytes: u64,
    pub direct_blocks: u64,
    pub indirect_bytes: u64,
    pub indirect_blocks: u64,
    /// Live blocks of the graph the leaks were found in.
    pub live_blocks: u64,
}

/// The [`LeakCounts`] of `p`, if it is a `leaks -o` profile.
pub fn leak_counts(p: &pb::Profile) -> Option<LeakCounts> {
    let s = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
    let rest = p
        .comment
        .iter()
        .find_map(|&c| s(c).strip_prefix(LEAKS_COMMENT))?;
    let mut l = LeakCounts::default();
    for kv in rest.split_whitespace() {
        let Some((k, v)) = kv.split_once('=') else {
            continue;
        };
        let n: u64 = v.parse().unwrap_or(0);
        match k {
            "pid" => l.pid = n as u32,
            "direct_bytes" => l.direct_bytes = n,
            "direct_blocks" => l.direct_blocks = n,
            "indirect_bytes" => l.indirect_bytes = n,
            "indirect_blocks" => l.indirect_blocks = n,
            "live_blocks" => l.live_blocks = n,
            _ => {}
        }
    }
    Some(l)
}

/// A `leaks -o` profile among the inputs: its process's **Leaks** section.
#[derive(Debug, Clone)]
struct Leaks {
    file: String,
    /// When the leaks were found (ns since the Unix epoch; 0: unknown).
    t_ns: i64,
    counts: LeakCounts,
    /// (site, leaked bytes, leaked blocks), most bytes first.
    sites: Vec<(String, i64, i64)>,
}

/// A graph capture (`graph -o FILE.hdsnap`) among the inputs: its process's **Reference
/// graph** section.
#[derive(Debug, Clone)]
pub struct GraphSection {
    /// Where it was read from.
    pub file: String,
    /// The capture's instant, ns since the Unix epoch.
    pub t_ns: u64,
    /// Live blocks, their bytes, roots and references (edges) of the graph.
    pub blocks: u64,
    pub bytes: u64,
    pub roots: u64,
    pub edges: u64,
    /// The top sites by retained size: (site, retained bytes, blocks), as `top --retained`
    /// ranks them, at most [`SECTION_SITES`].
    pub sites: Vec<(String, u64, u64)>,
}

/// What a heapdump profile's comments say of the process and the instant (see
/// `pprof::build`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Identity {
    /// Process id (0 when the profile does not say: not a heapdump profile of one process).
    pub pid: u32,
    /// The image's start time (clock ticks since boot), which tells a reused pid apart.
    pub start_ticks: u64,
    /// Command line, as the region recorded it.
    pub command: String,
    /// The snapshot's instant on the region's clock (ns), when the profile says.
    pub region_ns: Option<u64>,
    /// The shim's own peak of live bytes (`counters: ... peak_live_bytes=N`).
    pub shim_peak: Option<i64>,
    /// The sampling comment (`sampled: one byte in N ...` or `every allocation recorded`).
    pub sampling: Option<String>,
}

/// Reads [`Identity`] from the comments of `p`.
pub fn identity(p: &pb::Profile) -> Identity {
    let s = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
    let mut id = Identity::default();
    for c in p.comment.iter().map(|&c| s(c)) {
        if let Some(rest) = c.strip_prefix("heapdump snapshot of pid ") {
            // `PID (COMMAND LINE), alive|exited`: the command line may hold parentheses.
            if let Some((pid, rest)) = rest.split_once(" (") {
                id.pid = pid.parse().unwrap_or(0);
                id.command = rest
                    .rsplit_once("), ")
                    .map_or(rest, |(cmd, _)| cmd)
                    .to_owned();
            }
        } else if let Some(rest) = c.strip_prefix("heapdump-instant ") {
            for kv in rest.split_whitespace() {
                match kv.split_once('=') {
                    Some(("start_ticks", v)) => id.start_ticks = v.parse().unwrap_or(0),
                    Some(("region_ns", v)) => id.region_ns = v.parse().ok(),
                    Some(("pid", v)) if id.pid == 0 => id.pid = v.parse().unwrap_or(0),
                    _ => {}
                }
            }
        } else if let Some(rest) = c.strip_prefix("counters: ") {
            id.shim_peak = rest
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix("peak_live_bytes="))
                .and_then(|v| v.parse().ok());
        } else if c.starts_with("sampled: ") || c.starts_with("every allocation recorded") {
            id.sampling = Some(c.to_owned());
        }
    }
    id
}

/// Frame names interned root-first into a trie: a stack trace is the id of its last node.
#[derive(Debug, Default)]
struct Trie {
    names: Vec<String>,
    name_ids: FxHashMap<String, u32>,
    /// Per node: (parent node, or `u32::MAX` for a root; name id).
    nodes: Vec<(u32, u32)>,
    children: FxHashMap<(u32, u32), u32>,
}

impl Trie {
    /// The id of frame name `f`.
    fn name(&mut self, f: &str) -> u32 {
        match self.name_ids.get(f) {
            Some(&n) => n,
            None => {
                let n = self.names.len() as u32;
                self.names.push(f.to_owned());
                self.name_ids.insert(f.to_owned(), n);
                n
            }
        }
    }

    /// The node of the stack of name ids `names` (root first).
    fn intern(&mut self, names: impl IntoIterator<Item = u32>) -> u32 {
        let mut at = u32::MAX;
        for name in names {
            at = *self.children.entry((at, name)).or_insert_with(|| {
                self.nodes.push((at, name));
                self.nodes.len() as u32 - 1
            });
        }
        at
    }

    /// The frame names of node `n`'s stack, innermost first.
    fn innermost_first(&self, mut n: u32) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(&(parent, name)) = self.nodes.get(n as usize) {
            out.push(self.names[name as usize].clone());
            n = parent;
        }
        out
    }
}

/// One snapshot of a process.
#[derive(Debug)]
struct Snap {
    /// Wall-clock instant (`time_nanos`, ns since the Unix epoch).
    t_ns: i64,
    region_ns: Option<u64>,
    /// Where it was read from (a file name; empty for a profile built in memory).
    file: String,
    inuse_bytes: i64,
    inuse_blocks: i64,
    /// Cumulative since the process started (heapdump's profiles count from the start).
    alloc_bytes: i64,
    alloc_blocks: i64,
    shim_peak: Option<i64>,
    /// (trie node of the stack, live bytes), sorted by node, one entry per node.
    stacks: Vec<(u32, i64)>,
}

/// The snapshots of one process (one image of one pid).
#[derive(Debug)]
struct Process {
    pid: u32,
    start_ticks: u64,
    command: String,
    sampling: Option<String>,
    trie: Trie,
    /// Trie node → site id, for the nodes that end a stack.
    site_of: FxHashMap<u32, u32>,
    sites: Vec<String>,
    site_ids: HashMap<String, u32>,
    snaps: Vec<Snap>,
    leaks: Vec<Leaks>,
    graphs: Vec<GraphSection>,
}

/// The sample-type indexes of a heap profile.
struct Types {
    inuse_space: usize,
    inuse_objects: Option<usize>,
    alloc_space: Option<usize>,
    alloc_objects: Option<usize>,
}

fn types(p: &pb::Profile) -> Option<Types> {
    let s = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
    let find = |name: &str| p.sample_type.iter().position(|t| s(t.r#type) == name);
    Some(Types {
        inuse_space: find("inuse_space")?,
        inuse_objects: find("inuse_objects"),
        alloc_space: find("alloc_space"),
        alloc_objects: find("alloc_objects"),
    })
}

/// Errors adding a profile to a [`Report`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddError {
    /// The profile has no `inuse_space` sample type: not a heap profile.
    NotHeap,
    /// A `snapshot --since` profile: only the blocks born after an instant, not the live heap
    /// (helper I, 4: plotted as a point of the timeline, a false 217 KiB dip).
    Since,
    /// A `snapshot --multi-process` profile: several processes in one.
    MultiProcess,
}

impl std::fmt::Display for AddError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AddError::NotHeap => write!(f, "not a heap profile (no inuse_space sample type)"),
            AddError::Since => write!(
                f,
                "a `snapshot --since` profile (only the blocks born after an instant, not the \
                 live heap): left out of the timeline"
            ),
            AddError::MultiProcess => write!(
                f,
                "a `snapshot --multi-process` profile (several processes in one): report takes \
                 one profile per process, as `watch --multi-process -o DIR` writes them"
            ),
        }
    }
}

impl std::error::Error for AddError {}

/// The snapshots of one or more processes, growing as profiles are added (`heapdump report`
/// adds every file, `watch --report` each beat's profiles), rendered as JSON for the page.
#[derive(Debug)]
pub struct Report {
    rule: Sites,
    processes: Vec<Process>,
}

impl Report {
    /// An empty report naming allocation sites by `rule`.
    pub fn new(rule: Sites) -> Self {
        Report {
            rule,
            processes: Vec::new(),
        }
    }

    /// Number of snapshots added, over all processes.
    pub fn len(&self) -> usize {
        self.processes.iter().map(|p| p.snaps.len()).sum()
    }

    /// Number of snapshots added of process `pid`.
    pub fn len_of(&self, pid: u32) -> usize {
        (self.processes.iter())
            .filter(|p| p.pid == pid)
            .map(|p| p.snaps.len())
            .sum()
    }

    /// The processes added so far: (pid, command), in the order first seen.
    pub fn processes(&self) -> Vec<(u32, String)> {
        (self.processes.iter())
            .map(|p| (p.pid, p.command.clone()))
            .collect()
    }

    /// Keeps only the newest `n` snapshots of each process (`watch --keep N --report`: the page
    /// shows what the directory keeps, and memory stays bounded).
    pub fn keep_last(&mut self, n: usize) {
        for p in &mut self.processes {
            let excess = p.snaps.len().saturating_sub(n);
            p.snaps.drain(..excess);
        }
    }

    /// The index of the process `id` names, added if new. A process known only by its pid (a
    /// graph capture: `start_ticks` 0) is the first one of that pid.
    fn process(&mut self, id: &Identity) -> usize {
        let same = |q: &Process| {
            q.pid == id.pid
                && (q.start_ticks == id.start_ticks || id.start_ticks == 0 || q.start_ticks == 0)
        };
        if let Some(i) = self.processes.iter().position(same) {
            let q = &mut self.processes[i];
            if q.start_ticks == 0 {
                q.start_ticks = id.start_ticks;
            }
            if q.command.is_empty() {
                q.command = id.command.clone();
            }
            return i;
        }
        self.processes.push(Process {
            pid: id.pid,
            start_ticks: id.start_ticks,
            command: id.command.clone(),
            sampling: id.sampling.clone(),
            trie: Trie::default(),
            site_of: FxHashMap::default(),
            sites: Vec::new(),
            site_ids: HashMap::new(),
            snaps: Vec::new(),
            leaks: Vec::new(),
            graphs: Vec::new(),
        });
        self.processes.len() - 1
    }

    /// Adds the `leaks -o` profile `p` as a Leaks section of its process.
    fn add_leaks(
        &mut self,
        p: &pb::Profile,
        ty: &Types,
        mut id: Identity,
        counts: LeakCounts,
        file: &str,
    ) {
        if id.pid == 0 {
            id.pid = counts.pid;
        }
        let frames = crate::flame::location_frames(p);
        let kinds = crate::flame::location_kinds(p);
        let mut by_site: HashMap<String, (i64, i64)> = HashMap::new();
        for smp in &p.sample {
            let value = |i: Option<usize>| i.and_then(|i| smp.value.get(i)).copied().unwrap_or(0);
            // Innermost first, as `Sites::site` reads it.
            let stack: Vec<String> = (smp.location_id.iter())
                .filter_map(|l| frames.get(l))
                .flat_map(|f| f.iter().cloned())
                .collect();
            let hint = crate::flame::sample_hint(
                &smp.location_id,
                |l| frames.get(l).map(Vec::len),
                &kinds,
            );
            let site = if stack.is_empty() {
                crate::sites::NO_STACK
            } else {
                self.rule.site_hinted(&stack, hint.as_ref())
            };
            let e = by_site.entry(site.to_owned()).or_default();
            e.0 += value(Some(ty.inuse_space));
            e.1 += value(ty.inuse_objects);
        }
        let mut sites: Vec<(String, i64, i64)> =
            by_site.into_iter().map(|(s, (b, n))| (s, b, n)).collect();
        sites.sort_by(|a, b| (b.1, b.2, &a.0).cmp(&(a.1, a.2, &b.0)));
        let at = self.process(&id);
        let proc = &mut self.processes[at];
        proc.leaks.push(Leaks {
            file: file.to_owned(),
            t_ns: p.time_nanos,
            counts,
            sites,
        });
        proc.leaks.sort_by_key(|l| (l.t_ns, l.file.clone()));
    }

    /// Adds the graph capture `cap` (read from `file`) as a Reference graph section of its
    /// process: its size, and its top sites by retained size (the dominator tree, as
    /// `top --retained` ranks them).
    pub fn add_graph(&mut self, cap: &crate::graph::capture::Capture, file: &str) {
        let g = &cap.graph;
        let d = crate::graph::dominators::dominators(g);
        let names: HashMap<u32, &str> = (cap.stacks.iter())
            .map(|(s, f)| (*s, self.rule.site_hinted(f, cap.hints.get(s))))
            .collect();
        let site_of = |b: u32| {
            (names.get(&g.blocks[b as usize].stack))
                .map_or_else(|| "(no stack trace)".to_owned(), |s| (*s).to_owned())
        };
        let mut sites = crate::commands::top::retained_by_site(g, &d, &site_of);
        sites.truncate(SECTION_SITES);
        let section = GraphSection {
            file: file.to_owned(),
            t_ns: cap.header.time_unix_ns,
            blocks: g.blocks.len() as u64,
            bytes: g.blocks.iter().map(|b| b.size).sum(),
            roots: g.roots.len() as u64,
            edges: g.targets.len() as u64,
            sites,
        };
        let id = Identity {
            pid: cap.header.pid,
            command: cap.header.cmdline.join(" "),
            ..Identity::default()
        };
        let at = self.process(&id);
        let proc = &mut self.processes[at];
        proc.graphs.push(section);
        proc.graphs.sort_by_key(|g| (g.t_ns, g.file.clone()));
    }

    /// Number of leaks and reference-graph sections added, over all processes.
    pub fn sections(&self) -> usize {
        (self.processes.iter())
            .map(|p| p.leaks.len() + p.graphs.len())
            .sum()
    }

    /// Adds profile `p` (read from `file`) as one snapshot of the process its comments name
    /// (pid 0, "", when they do not).
    ///
    /// Errors: `p` has no `inuse_space` sample type, holds only blocks born since an instant
    /// (`snapshot --since`), or several processes (`--multi-process`).
    pub fn add(&mut self, p: &pb::Profile, file: &str) -> Result<(), AddError> {
        let ty = types(p).ok_or(AddError::NotHeap)?;
        for c in p
            .comment
            .iter()
            .filter_map(|&c| p.string_table.get(c as usize))
        {
            if c.starts_with("born since ") {
                return Err(AddError::Since);
            }
            if c.starts_with("heapdump multi-process snapshot of ") {
                return Err(AddError::MultiProcess);
            }
        }
        let id = identity(p);
        if let Some(counts) = leak_counts(p) {
            self.add_leaks(p, &ty, id, counts, file);
            return Ok(());
        }
        let at = self.process(&id);
        let proc = &mut self.processes[at];
        // Each location's frames as name ids, innermost first.
        let frames: FxHashMap<u64, Vec<u32>> = (crate::flame::location_frames(p).into_iter())
            .map(|(id, names)| (id, names.iter().map(|n| proc.trie.name(n)).collect()))
            .collect();
        let kinds = crate::flame::location_kinds(p);
        let no_stack = proc.trie.name(crate::sites::NO_STACK);
        let value = |s: &pb::Sample, i: Option<usize>| -> i64 {
            i.and_then(|i| s.value.get(i)).copied().unwrap_or(0)
        };
        let mut snap = Snap {
            t_ns: p.time_nanos,
            region_ns: id.region_ns,
            file: file.to_owned(),
            inuse_bytes: 0,
            inuse_blocks: 0,
            alloc_bytes: 0,
            alloc_blocks: 0,
            shim_peak: id.shim_peak,
            stacks: Vec::new(),
        };
        let mut by_node: FxHashMap<u32, i64> = FxHashMap::default();
        for s in &p.sample {
            let bytes = value(s, Some(ty.inuse_space));
            snap.inuse_bytes += bytes;
            snap.inuse_blocks += value(s, ty.inuse_objects);
            snap.alloc_bytes += value(s, ty.alloc_space);
            snap.alloc_blocks += value(s, ty.alloc_objects);
            if bytes == 0 {
                continue;
            }
            let mut names: Vec<u32> = Vec::new();
            for l in s.location_id.iter().rev() {
                if let Some(f) = frames.get(l) {
                    names.extend(f.iter().rev());
                }
            }
            if names.is_empty() {
                names.push(no_stack);
            }
            let node = proc.trie.intern(names);
            if !proc.site_of.contains_key(&node) {
                let stack = proc.trie.innermost_first(node);
                let hint = crate::flame::sample_hint(
                    &s.location_id,
                    |l| frames.get(l).map(Vec::len),
                    &kinds,
                );
                let site = self.rule.site_hinted(&stack, hint.as_ref());
                let sid = match proc.site_ids.get(site) {
                    Some(&i) => i,
                    None => {
                        proc.sites.push(site.to_owned());
                        proc.site_ids
                            .insert(site.to_owned(), proc.sites.len() as u32 - 1);
                        proc.sites.len() as u32 - 1
                    }
                };
                proc.site_of.insert(node, sid);
            }
            *by_node.entry(node).or_default() += bytes;
        }
        snap.stacks = by_node.into_iter().collect();
        snap.stacks.sort_unstable();
        // Kept ordered by the recorded instants; the region's clock, then the file name,
        // break ties.
        let key = |s: &Snap| (s.t_ns, s.region_ns, s.file.clone());
        let at = proc.snaps.partition_point(|s| key(s) <= key(&snap));
        proc.snaps.insert(at, snap);
        Ok(())
    }

    /// The report's data as JSON: `{"processes": [...]}`, one entry per process (only `pid`'s
    /// when given), each ordered by the snapshots' instants. See `assets/report/report.js` for
    /// how the page reads it.
    pub fn json(&self, pid: Option<u32>) -> Value {
        let mut out = Vec::new();
        for proc in &self.processes {
            if pid.is_some_and(|p| p != proc.pid)
                || (proc.snaps.is_empty() && proc.leaks.is_empty() && proc.graphs.is_empty())
            {
                continue;
            }
            out.push(process_json(proc));
        }
        json!({ "version": 1, "processes": out })
    }
}

/// The Leaks and Reference graph sections of `proc` as JSON.
fn sections_json(proc: &Process) -> (Value, Value) {
    let leaks: Vec<Value> = (proc.leaks.iter())
        .map(|l| {
            json!({
                "file": l.file,
                "t_ns": l.t_ns,
                "direct_bytes": l.counts.direct_bytes,
                "direct_blocks": l.counts.direct_blocks,
                "indirect_bytes": l.counts.indirect_bytes,
                "indirect_blocks": l.counts.indirect_blocks,
                "live_blocks": l.counts.live_blocks,
                "sites": (l.sites.iter().take(SECTION_SITES))
                    .map(|(s, b, n)| json!({"site": s, "bytes": b, "blocks": n}))
                    .collect::<Vec<_>>(),
                "more_sites": l.sites.len().saturating_sub(SECTION_SITES),
            })
        })
        .collect();
    let graphs: Vec<Value> = (proc.graphs.iter())
        .map(|g| {
            json!({
                "file": g.file,
                "t_ns": g.t_ns,
                "blocks": g.blocks,
                "bytes": g.bytes,
                "roots": g.roots,
                "edges": g.edges,
                "sites": (g.sites.iter())
                    .map(|(s, r, b)| json!({"site": s, "retained": r, "blocks": b}))
                    .collect::<Vec<_>>(),
            })
        })
        .collect();
    (Value::Array(leaks), Value::Array(graphs))
}

/// The JSON of one process (see [`Report::json`]). A process with no snapshot (only a leaks
/// profile or a graph capture among the inputs) has `summary` null and no timeline, growth
/// ranking or flame graph.
fn process_json(proc: &Process) -> Value {
    let snaps = &proc.snaps;
    let n = snaps.len();
    let (leaks, graphs) = sections_json(proc);
    if n == 0 {
        return json!({
            "pid": proc.pid,
            "start_ticks": proc.start_ticks,
            "command": proc.command,
            "summary": null,
            "leaks": leaks,
            "graphs": graphs,
        });
    }
    let t0 = snaps[0].t_ns;
    // Seconds since the Unix epoch (uPlot's time axis), and since the first snapshot.
    let t: Vec<f64> = snaps.iter().map(|s| s.t_ns as f64 / 1e9).collect();
    let rel: Vec<f64> = snaps.iter().map(|s| (s.t_ns - t0) as f64 / 1e9).collect();

    // Live bytes per site per snapshot.
    let mut per_site = vec![vec![0i64; n]; proc.sites.len()];
    for (i, s) in snaps.iter().enumerate() {
        for &(node, bytes) in &s.stacks {
            per_site[proc.site_of[&node] as usize][i] += bytes;
        }
    }

    // Summary.
    let (peak_i, peak) = (snaps.iter().enumerate())
        .map(|(i, s)| (i, s.inuse_bytes))
        .max_by_key(|&(i, b)| (b, std::cmp::Reverse(i)))
        .unwrap_or((0, 0));
    let span = rel[n - 1];
    let rate =
        |f: fn(&Snap) -> i64| (span > 0.0).then(|| (f(&snaps[n - 1]) - f(&snaps[0])) as f64 / span);
    let summary = json!({
        "pid": proc.pid,
        "command": proc.command,
        "sampling": proc.sampling,
        "snapshots": n,
        "first_ns": snaps[0].t_ns,
        "last_ns": snaps[n - 1].t_ns,
        "span_s": span,
        "peak_bytes": peak,
        "peak_index": peak_i,
        "peak_ns": snaps[peak_i].t_ns,
        "shim_peak_bytes": snaps[n - 1].shim_peak,
        "last_bytes": snaps[n - 1].inuse_bytes,
        "last_blocks": snaps[n - 1].inuse_blocks,
        "alloc_bytes_per_s": rate(|s| s.alloc_bytes),
        "alloc_blocks_per_s": rate(|s| s.alloc_blocks),
    });

    // Timeline: the sites with the most live bytes on average, the rest as "other".
    let mut by_mean: Vec<usize> = (0..proc.sites.len()).collect();
    by_mean.sort_by_key(|&i| {
        (
            std::cmp::Reverse(per_site[i].iter().sum::<i64>()),
            proc.sites[i].clone(),
        )
    });
    by_mean.retain(|&i| per_site[i].iter().any(|&b| b != 0));
    let top: Vec<usize> = by_mean.iter().take(TIMELINE_SITES).copied().collect();
    let total: Vec<i64> = snaps.iter().map(|s| s.inuse_bytes).collect();
    let other: Vec<i64> = (0..n)
        .map(|i| total[i] - top.iter().map(|&s| per_site[s][i]).sum::<i64>())
        .collect();
    let timeline = json!({
        "t": t,
        "total": total,
        "blocks": snaps.iter().map(|s| s.inuse_blocks).collect::<Vec<_>>(),
        "sites": top.iter().map(|&s| &proc.sites[s]).collect::<Vec<_>>(),
        "series": top.iter().map(|&s| &per_site[s]).collect::<Vec<_>>(),
        "other": other,
    });

    // Growth ranking: a line fitted to every site, the best scored.
    let series = |i: usize| -> Vec<f64> { per_site[i].iter().map(|&b| b as f64).collect() };
    let mut ranked: Vec<(usize, Growth)> = (0..proc.sites.len())
        .map(|i| (i, line(&rel, &series(i))))
        .filter(|(_, g)| g.slope > 0.0 && g.r2 > 0.0)
        .collect();
    ranked.sort_by(|a, b| (b.1.slope * b.1.r2).total_cmp(&(a.1.slope * a.1.r2)));
    ranked.truncate(SCORED_SITES);
    for (i, g) in &mut ranked {
        *g = growth(&rel, &series(*i));
    }
    // Then the sites that did not grow, by their last live bytes (a listing, scored 0).
    let mut rest: Vec<(usize, Growth)> = (0..proc.sites.len())
        .filter(|i| !ranked.iter().any(|(j, _)| j == i))
        .map(|i| (i, line(&rel, &series(i))))
        .collect();
    rest.sort_by(|a, b| per_site[b.0][n - 1].cmp(&per_site[a.0][n - 1]));
    rest.truncate(RANKED_SITES);
    ranked.extend(rest);
    ranked.sort_by(|a, b| {
        (b.1.score.total_cmp(&a.1.score))
            .then(per_site[b.0][n - 1].cmp(&per_site[a.0][n - 1]))
            .then(proc.sites[a.0].cmp(&proc.sites[b.0]))
    });
    let growth: Vec<Value> = (ranked.iter().take(RANKED_SITES))
        .map(|(i, g)| {
            json!({
                "site": proc.sites[*i],
                "slope": g.slope,
                "median_slope": g.median_slope,
                "r2": g.r2,
                "grew": g.grew,
                "score": g.score,
                "since": g.since,
                "first": per_site[*i][0],
                "last": per_site[*i][n - 1],
                "values": per_site[*i],
            })
        })
        .collect();

    // Flame graphs: the trie, and each snapshot's live bytes per stack as changes from the
    // previous snapshot: [node gap, byte change, ...] (node ids increasing; the first gap from
    // -1), so that stacks that did not change cost nothing.
    let mut prev: HashMap<u32, i64> = HashMap::new();
    let mut deltas: Vec<Vec<i64>> = Vec::with_capacity(n);
    for s in snaps {
        let mut changes: Vec<(u32, i64)> = Vec::new();
        let now: HashMap<u32, i64> = s.stacks.iter().copied().collect();
        for (&node, &b) in &now {
            let was = prev.get(&node).copied().unwrap_or(0);
            if b != was {
                changes.push((node, b - was));
            }
        }
        for (&node, &was) in &prev {
            if !now.contains_key(&node) {
                changes.push((node, -was));
            }
        }
        changes.sort_unstable();
        let mut flat = Vec::with_capacity(changes.len() * 2);
        let mut last = -1i64;
        for (node, d) in changes {
            flat.push(node as i64 - last);
            flat.push(d);
            last = node as i64;
        }
        deltas.push(flat);
        prev = now;
    }
    // Gzip-compressed and base64-encoded (the page inflates it with the browser's
    // DecompressionStream): a third of the size or less, the deltas being repetitive text.
    let flame = deflate(&json!({
        "names": proc.trie.names,
        "parent": proc.trie.nodes.iter().map(|&(p, _)| if p == u32::MAX { -1 } else { p as i64 }).collect::<Vec<_>>(),
        "name": proc.trie.nodes.iter().map(|&(_, n)| n).collect::<Vec<_>>(),
        "deltas": deltas,
    }));

    json!({
        "pid": proc.pid,
        "start_ticks": proc.start_ticks,
        "command": proc.command,
        "files": snaps.iter().map(|s| &s.file).collect::<Vec<_>>(),
        "alloc_bytes": snaps.iter().map(|s| s.alloc_bytes).collect::<Vec<_>>(),
        "alloc_blocks": snaps.iter().map(|s| s.alloc_blocks).collect::<Vec<_>>(),
        "summary": summary,
        "timeline": timeline,
        "growth": growth,
        "flame_gz": flame,
        "leaks": leaks,
        "graphs": graphs,
    })
}

/// `v` as JSON text, gzip-compressed, in standard base64.
fn deflate(v: &Value) -> String {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing into a Vec cannot fail.
    gz.write_all(v.to_string().as_bytes())
        .and_then(|()| gz.finish())
        .map(|b| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, b))
        .expect("gzip into memory")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 16,000 stack traces of 12 frames (a call tree fanning out to them), innermost first.
    fn stacks(n: u32) -> HashMap<u32, Vec<String>> {
        (0..n)
            .map(|k| {
                // Innermost first: malloc, the leaf, then its callers out to main.
                let mut all = vec!["malloc".to_owned(), format!("leaf_alloc_{k}")];
                all.extend(
                    (0..10)
                        .rev()
                        .map(|d: u32| format!("module{d}::function_{}", k % 4u32.pow(d / 2 + 1))),
                );
                all.push("main".into());
                (k, all)
            })
            .collect()
    }

    /// A profile of `values` (stack id → live bytes) at second `t`.
    fn profile(names: &HashMap<u32, Vec<String>>, values: &[u64], t: i64) -> pb::Profile {
        let mut p = crate::pprof::from_names(
            names,
            values.iter().enumerate().map(|(s, &b)| (s as u32, 1, b)),
            &["heapdump snapshot of pid 7 (/bin/app --flag), alive".into()],
        );
        p.time_nanos = t * 1_000_000_000;
        p
    }

    /// The size of the page of 100 snapshots of 16,000 stacks, where `changed` of the stacks
    /// change at each snapshot.
    fn page_size(changed: usize) -> usize {
        let names = stacks(16_000);
        let mut values: Vec<u64> = (0..16_000u64).map(|k| 1000 + k * 7).collect();
        let mut r = Report::new(Sites::default());
        let mut seed = 1u64;
        for t in 0..100 {
            for _ in 0..changed {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let k = (seed >> 33) as usize % values.len();
                values[k] = (seed >> 40) % 100_000;
            }
            r.add(&profile(&names, &values, 1_700_000_000 + t), "")
                .unwrap();
        }
        let d = r.json(None);
        let html = super::super::page::html("app", &d);
        assert_eq!(
            d["processes"][0]["timeline"]["t"].as_array().unwrap().len(),
            100
        );
        assert_eq!(
            d["processes"][0]["timeline"]["total"][99].as_i64().unwrap(),
            values.iter().sum::<u64>() as i64
        );
        html.len()
    }

    #[test]
    fn a_hundred_snapshots_of_16000_stacks_fit_in_a_few_megabytes() {
        // Every stack changing at every beat (16,000 random draws change about 10,100; with a
        // tenth changing, 1,600 draws, the page was 1.2 MB).
        let worst = page_size(16_000);
        println!("100 × 16,000 stacks, about 10,100 changing per snapshot: {worst} bytes");
        assert!(worst < 4 << 20, "{worst} bytes");
    }

    #[test]
    fn keep_last_drops_the_oldest() {
        let names = stacks(3);
        let mut r = Report::new(Sites::default());
        for t in 0..5 {
            r.add(&profile(&names, &[t, 2 * t, 7], 100 + t as i64), "")
                .unwrap();
        }
        r.keep_last(2);
        let d = r.json(None);
        let tl = &d["processes"][0]["timeline"];
        assert_eq!(tl["t"], json!([103.0, 104.0]));
        assert_eq!(tl["total"], json!([3 + 6 + 7, 4 + 8 + 7]));
    }

    #[test]
    fn a_leaks_profile_is_a_section_not_a_snapshot() {
        let names: HashMap<u32, Vec<String>> = [
            (0, vec!["malloc".into(), "make_list".into(), "main".into()]),
            (1, vec!["malloc".into(), "make_lost".into(), "main".into()]),
        ]
        .into();
        let mut r = Report::new(Sites::default());
        r.add(&profile(&names, &[100, 50], 10), "snap").unwrap();
        let mut leaks = crate::pprof::from_names(
            &names,
            [(0, 10, 480), (1, 3, 216)].into_iter(),
            &[format!(
                "{LEAKS_COMMENT}pid=7 direct_bytes=264 direct_blocks=4 indirect_bytes=432 \
                 indirect_blocks=9 live_blocks=28"
            )],
        );
        leaks.time_nanos = 11_000_000_000;
        r.add(&leaks, "leaks").unwrap();
        assert_eq!((r.len(), r.sections()), (1, 1));
        let d = r.json(None);
        let p = &d["processes"][0];
        assert_eq!(p["files"], json!(["snap"]));
        assert_eq!(
            p["leaks"],
            json!([{
                "file": "leaks", "t_ns": 11_000_000_000i64,
                "direct_bytes": 264, "direct_blocks": 4,
                "indirect_bytes": 432, "indirect_blocks": 9, "live_blocks": 28,
                "sites": [
                    {"site": "make_list", "bytes": 480, "blocks": 10},
                    {"site": "make_lost", "bytes": 216, "blocks": 3},
                ],
                "more_sites": 0,
            }])
        );
    }

    #[test]
    fn partial_profiles_are_left_out_of_the_timeline() {
        let profile = |comment: &str| {
            crate::pprof::from_names(
                &HashMap::from([(1u32, vec!["f".to_owned()])]),
                [(1u32, 2u64, 200u64)].into_iter(),
                &[
                    "heapdump snapshot of pid 42 (./srv), alive".into(),
                    comment.to_owned(),
                ],
            )
        };
        let mut r = Report::new(Sites::new(None).unwrap());
        let since = profile("born since 2s ago: only blocks allocated after that instant");
        assert!(matches!(r.add(&since, "since.pb.gz"), Err(AddError::Since)));
        let multi = profile("heapdump multi-process snapshot of 2 processes: a, b");
        assert!(matches!(
            r.add(&multi, "all.pb.gz"),
            Err(AddError::MultiProcess)
        ));
        assert_eq!(r.len(), 0);
        r.add(&profile("counters: live_bytes=200"), "full.pb.gz")
            .unwrap();
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn identity_from_the_comments() {
        let mut p = crate::pprof::from_names(
            &HashMap::new(),
            std::iter::empty(),
            &[
                "heapdump snapshot of pid 42 (./srv --name (x)), alive".into(),
                "heapdump-instant pid=42 start_ticks=99 region_ns=123".into(),
                "counters: live_bytes=1 live_blocks=1 allocations=3 frees=2 peak_live_bytes=777 dropped_blocks=0".into(),
                "every allocation recorded (not sampled)".into(),
            ],
        );
        p.time_nanos = 5;
        let id = identity(&p);
        assert_eq!(
            id,
            Identity {
                pid: 42,
                start_ticks: 99,
                command: "./srv --name (x)".into(),
                region_ns: Some(123),
                shim_peak: Some(777),
                sampling: Some("every allocation recorded (not sampled)".into()),
            }
        );
    }
}
