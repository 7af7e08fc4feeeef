//! `heapdump retainers`: the chains from the roots that hold the blocks allocated under a
//! function.

use super::stages;
use crate::analysis::{analysis, sites, Source};
use crate::{cli, graph};
use anyhow::{bail, Context, Result};

/// What `retainers` looks for.
#[derive(Debug, Clone)]
pub struct Options {
    /// The process, or a capture.
    pub source: Source,
    /// `--drop-frames`: more frames to skip, as allocator wrappers, at the top of a stack.
    pub drop_frames: Option<String>,
    /// A regular expression over function names.
    pub function: String,
    /// One JSON object per chain.
    pub json: bool,
    /// Chains to show, largest first.
    pub top: usize,
}

impl From<cli::RetainersArgs> for Options {
    fn from(mut a: cli::RetainersArgs) -> Self {
        Options {
            drop_frames: a.target.drop_frames.take(),
            source: a.target.into(),
            function: a.function,
            json: a.json,
            top: a.top,
        }
    }
}

/// `heapdump retainers`.
pub fn run(a: Options) -> Result<()> {
    let re = regex::Regex::new(&a.function)
        .with_context(|| format!("--function {:?} is not a regular expression", a.function))?;
    let rule = super::site_rule(a.drop_frames.as_deref())?;
    let stage = stages();
    let mut an = analysis(&a.source, &stage)?;
    an.name_all_stacks();
    let g = &an.g;
    stage("finding the shortest chains from the roots");
    let tree = graph::paths::Tree::new(g);
    let names = &an.stacks;
    let sites = sites(&an, &rule);
    let matching: std::collections::HashSet<u32> = names
        .iter()
        .filter(|(_, f)| f.iter().any(|n| re.is_match(n)))
        .map(|(s, _)| *s)
        .collect();
    if matching.is_empty() {
        bail!(
            "no live block was allocated under a function matching {:?}",
            a.function
        );
    }
    // Aggregated by folded chain (a run of one site is one step: a linked list's nodes are
    // one chain, not one each), named only for the chains shown.
    let named = crate::analysis::NamedChains::new(g, &tree, &sites);
    let mut by_id: std::collections::HashMap<u32, (u64, u64)> = Default::default();
    let (mut unreachable, mut unreachable_bytes) = (0u64, 0u64);
    for (i, b) in g.blocks.iter().enumerate() {
        if !matching.contains(&b.stack) {
            continue;
        }
        match named.id(i as u32) {
            Some(id) => {
                let e = by_id.entry(id).or_default();
                e.0 += 1;
                e.1 += b.size;
            }
            None => {
                unreachable += 1;
                unreachable_bytes += b.size;
            }
        }
    }
    let mut ranked: Vec<(u32, (u64, u64))> = by_id.into_iter().collect();
    ranked.sort_by(|x, y| (y.1 .1, y.1 .0, x.0).cmp(&(x.1 .1, x.1 .0, y.0)));
    let total = ranked.len();
    // Chains equal in bytes and blocks are ordered by their names, as before.
    let mut chains: Vec<(Vec<String>, (u64, u64))> = ranked
        .into_iter()
        .take(a.top.saturating_add(64).max(a.top))
        .map(|(id, v)| (named.names(id), v))
        .collect();
    chains.sort_by(|x, y| (y.1 .1, y.1 .0, &x.0).cmp(&(x.1 .1, x.1 .0, &y.0)));
    if a.json {
        let v: Vec<serde_json::Value> = chains
            .iter()
            .take(a.top)
            .map(|(path, (blocks, bytes))| {
                serde_json::json!({"chain": path, "blocks": blocks, "bytes": bytes})
            })
            .collect();
        println!(
            "{}",
            crate::output::json_for_terminal(serde_json::to_string_pretty(&v)?)
        );
        return Ok(());
    }
    for (path, (blocks, bytes)) in chains.iter().take(a.top) {
        println!("{} → {bytes} bytes in {blocks} blocks", path.join(" → "));
    }
    if total > a.top {
        println!("({} more chains)", total - a.top);
    }
    if unreachable > 0 {
        println!(
            "(unreachable from any root, leaked: {unreachable_bytes} bytes in {unreachable} blocks)"
        );
    }
    Ok(())
}
