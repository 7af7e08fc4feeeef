//! `heapdump graph`: the reference graph as an ownership flame graph, a DevTools heap
//! snapshot, a capture or a pprof profile (and, from a capture, `convert`).

use super::stages;
use crate::analysis::{analysis, sites, Analysis, Source};
use crate::{cli, flame, graph, output, pprof};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;

/// What `graph` writes.
#[derive(Debug, Clone)]
pub struct Options {
    /// The process, or a capture.
    pub source: Source,
    /// `--drop-frames`: more frames to skip, as allocator wrappers, at the top of a stack.
    pub drop_frames: Option<String>,
    /// The output; its name says the format.
    pub output: PathBuf,
    /// An earlier capture: the flame graph counts only blocks new since it.
    pub baseline: Option<PathBuf>,
}

impl From<cli::GraphArgs> for Options {
    fn from(mut a: cli::GraphArgs) -> Self {
        Options {
            drop_frames: a.target.drop_frames.take(),
            source: a.target.into(),
            output: a.output,
            baseline: a.baseline,
        }
    }
}

/// `heapdump graph -o FILE.{svg,heapsnapshot,hdsnap,pb.gz}` (and `convert`).
pub fn run(a: Options) -> Result<()> {
    let kind = check_output_kind(&a.output)?;
    let since = match &a.baseline {
        Some(_) if kind != "svg" => bail!("--baseline applies to the flame graph (-o FILE.svg)"),
        Some(base) => {
            let cap = graph::capture::read(base)
                .with_context(|| format!("reading the baseline {}", base.display()))?;
            let mut old: Vec<u64> = cap.graph.blocks.iter().map(|b| b.address).collect();
            old.sort_unstable();
            Some(old)
        }
        None => None,
    };
    let rule = super::site_rule(a.drop_frames.as_deref())?;
    let stage = stages();
    let mut an = analysis(&a.source, &stage)?;
    an.name_all_stacks();
    write_graph_since(&an, &a.output, since.as_deref(), &rule, &stage)
}

/// What `graph` and `convert` can write, by the output's name.
pub fn check_output_kind(out: &std::path::Path) -> Result<&'static str> {
    let name = out.to_string_lossy();
    for kind in ["svg", "heapsnapshot", "hdsnap", "pb.gz"] {
        if name.ends_with(&format!(".{kind}")) {
            return Ok(kind);
        }
    }
    bail!(
        "{}: the output's name says what to write: FILE.svg (an ownership flame graph), \
         FILE.heapsnapshot (Chrome DevTools: Memory panel, Load profile), FILE.hdsnap (a capture \
         to analyse later) or FILE.pb.gz (pprof)",
        out.display()
    )
}

/// Writes `an` to `out` as its name says.
pub fn write_graph(an: &Analysis, out: &std::path::Path, stage: &dyn Fn(&str)) -> Result<()> {
    write_graph_since(an, out, None, &crate::sites::Sites::default(), stage)
}

/// As [`write_graph`]; a flame graph counts only blocks whose address is not in `since`
/// (sorted addresses of a baseline), if given.
fn write_graph_since(
    an: &Analysis,
    out: &std::path::Path,
    since: Option<&[u64]>,
    rule: &crate::sites::Sites,
    stage: &dyn Fn(&str),
) -> Result<()> {
    let kind = check_output_kind(out)?;
    let g = &an.g;
    let sites = sites(an, rule);
    let site_of = |b: &graph::Block| {
        sites
            .get(&b.stack)
            .cloned()
            .unwrap_or_else(|| "(no stack trace)".to_owned())
    };
    match kind {
        "heapsnapshot" => {
            stage("writing the DevTools heap snapshot");
            let mut layout = None;
            output::write_with(out, |o| {
                layout = Some(graph::heapsnapshot::write(g, &site_of, o)?);
                Ok(())
            })?;
            let layout = layout.expect("written");
            eprintln!(
                "heapdump: {}: {} nodes, {} edges ({} live blocks, {} roots) -> {}",
                an.describe(),
                layout.node_count,
                layout.edge_count,
                g.blocks.len(),
                g.roots.len(),
                out.display()
            );
        }
        "hdsnap" => {
            stage("writing the capture");
            output::write_with(out, |o| {
                graph::capture::write(o, &an.header, g, &an.stacks, &an.hints)
            })?;
            eprintln!(
                "heapdump: {}: {} live blocks, {} edges, {} roots -> {}",
                an.describe(),
                g.blocks.len(),
                g.targets.len(),
                g.roots.len(),
                out.display()
            );
        }
        "pb.gz" => {
            let mut by_stack: std::collections::BTreeMap<u32, (u64, u64)> = Default::default();
            for b in &g.blocks {
                let e = by_stack.entry(b.stack).or_default();
                e.0 += 1;
                e.1 += b.size;
            }
            let p = pprof::from_names(
                &an.stacks,
                by_stack.into_iter().map(|(s, (b, n))| (s, b, n)),
                &[format!(
                    "live blocks of {}, from a heapdump graph",
                    an.describe()
                )],
            );
            pprof::write(&p, None, out)?;
            eprintln!(
                "heapdump: {}: {} live blocks, {} bytes -> {}",
                an.describe(),
                g.blocks.len(),
                g.blocks.iter().map(|b| b.size).sum::<u64>(),
                out.display()
            );
        }
        _ => {
            stage("finding the shortest chains from the roots");
            let tree = graph::paths::Tree::new(g);
            // Collapsed stacks, one per folded chain: root, then the sites along it (a run of
            // one site is one level: a linked list is not one level per node).
            let named = crate::analysis::NamedChains::new(g, &tree, &sites);
            let mut by_id: std::collections::HashMap<u32, u64> = Default::default();
            let mut folded = flame::Folded::new();
            for (i, b) in g.blocks.iter().enumerate() {
                if since.is_some_and(|old| old.binary_search(&b.address).is_ok()) {
                    continue;
                }
                match named.id(i as u32) {
                    Some(id) => *by_id.entry(id).or_default() += b.size.max(1),
                    None => {
                        let names = ["(unreachable: leaked)".to_owned(), site_of(b)];
                        *folded
                            .entry(flame::key(names.iter().map(String::as_str)))
                            .or_default() += b.size.max(1);
                    }
                }
            }
            for (id, bytes) in by_id {
                let names = named.names(id);
                *folded
                    .entry(flame::key(names.iter().map(String::as_str)))
                    .or_default() += bytes;
            }
            let title = match since {
                Some(_) => format!(
                    "Ownership: who holds what is new in the heap of {}",
                    an.describe()
                ),
                None => format!("Ownership: who holds the live heap of {}", an.describe()),
            };
            if !flame::write_svg(&folded, &title, "bytes", out)? {
                eprintln!(
                    "heapdump: nothing to draw: {}",
                    match since {
                        Some(_) =>
                            "every live block was already in the baseline (a block is \
                                    new when no block of the baseline had its address)",
                        None => "no live block",
                    }
                );
            }
            eprintln!(
                "heapdump: {}: {} live blocks, {} roots -> {}",
                an.describe(),
                g.blocks.len(),
                g.roots.len(),
                out.display()
            );
        }
    }
    Ok(())
}
