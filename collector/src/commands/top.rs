//! `heapdump top --retained`: what retains the most, by dominator tree.

use super::stages;
use crate::analysis::{analysis, sites, Source};
use crate::{cli, graph};
use anyhow::{bail, Result};

/// What `top` ranks.
#[derive(Debug, Clone)]
pub struct Options {
    /// The process, or a capture.
    pub source: Source,
    /// `--drop-frames`: more frames to skip, as allocator wrappers, at the top of a stack.
    pub drop_frames: Option<String>,
    /// `--retained` (required: the only ranking so far).
    pub retained: bool,
    /// One JSON object instead of tables.
    pub json: bool,
    /// Rows per table.
    pub top: usize,
}

impl From<cli::TopArgs> for Options {
    fn from(mut a: cli::TopArgs) -> Self {
        Options {
            drop_frames: a.target.drop_frames.take(),
            source: a.target.into(),
            retained: a.retained,
            json: a.json,
            top: a.top,
        }
    }
}

/// `heapdump top --retained`: the blocks and the allocation sites that retain the most.
pub fn run(a: Options) -> Result<()> {
    if !a.retained {
        bail!("`heapdump top` ranks by retained size: pass --retained (or --live)");
    }
    let rule = super::site_rule(a.drop_frames.as_deref())?;
    let stage = stages();
    let mut an = analysis(&a.source, &stage)?;
    an.name_all_stacks();
    let g = &an.g;
    stage("computing the dominator tree");
    let d = graph::dominators::dominators(g);
    stage("ranking");
    let sites = sites(&an, &rule);
    let site_of = |b: u32| {
        sites
            .get(&g.blocks[b as usize].stack)
            .cloned()
            .unwrap_or_else(|| "(no stack trace)".to_owned())
    };
    let by_site = retained_by_site(g, &d, &site_of);
    let n = g.blocks.len();
    // The `a.top` blocks retaining the most: selected, then only those sorted.
    let key = |b: &u32| (std::cmp::Reverse(d.retained[*b as usize]), *b);
    let mut blocks: Vec<u32> = (0..n as u32).collect();
    if blocks.len() > a.top {
        if a.top > 0 {
            blocks.select_nth_unstable_by_key(a.top - 1, key);
        }
        blocks.truncate(a.top);
    }
    blocks.sort_by_key(key);
    let mut roots: Vec<(usize, u64)> = d.root_retained.iter().copied().enumerate().collect();
    roots.sort_by_key(|&(r, v)| (std::cmp::Reverse(v), r));
    if a.json {
        let v = serde_json::json!({
            "sites": by_site.iter().take(a.top).map(|(s, r, b)| serde_json::json!({"site": s, "retained": r, "blocks": b})).collect::<Vec<_>>(),
            "blocks": blocks.iter().take(a.top).map(|&b| {
                let bl = &g.blocks[b as usize];
                serde_json::json!({"address": format!("{:#x}", bl.address), "size": bl.size, "retained": d.retained[b as usize], "site": site_of(b)})
            }).collect::<Vec<_>>(),
            "roots": roots.iter().take(a.top).map(|&(r, v)| serde_json::json!({"root": g.roots[r].name, "retained": v})).collect::<Vec<_>>(),
        });
        println!(
            "{}",
            crate::output::json_for_terminal(serde_json::to_string_pretty(&v)?)
        );
        return Ok(());
    }
    println!(
        "{:>14}  {:>10}  allocation site (retained: each dominated block counted once)",
        "RETAINED", "BLOCKS"
    );
    for (s, r, b) in by_site.iter().take(a.top) {
        println!("{r:>14}  {b:>10}  {s}");
    }
    println!();
    println!(
        "{:>14}  {:>10}  {:<18}  allocation site",
        "RETAINED", "SIZE", "BLOCK"
    );
    for &b in blocks.iter().take(a.top) {
        let bl = &g.blocks[b as usize];
        println!(
            "{:>14}  {:>10}  {:<18}  {}",
            d.retained[b as usize],
            bl.size,
            format!("{:#x}", bl.address),
            site_of(b)
        );
    }
    println!();
    println!("{:>14}  root", "RETAINED");
    for &(r, v) in roots.iter().take(a.top) {
        println!("{v:>14}  {}", g.roots[r].name);
    }
    Ok(())
}

/// The allocation sites of `g` ranked by retained bytes, largest first (ties by name):
/// (site, retained bytes, blocks). A site's retained size counts each dominated block once:
/// the sum, over its blocks that no other block of the same site dominates, of their retained
/// sizes (`d`: `g`'s dominator tree; `site_of`: a block index's site name). `top --retained`
/// and `report`'s reference-graph section.
pub fn retained_by_site(
    g: &graph::Graph,
    d: &graph::dominators::Dominators,
    site_of: &dyn Fn(u32) -> String,
) -> Vec<(String, u64, u64)> {
    use graph::dominators::Dominator;
    // Found by walking the dominator tree from the top with a count, per site, of the blocks
    // of that site on the current path.
    let n = g.blocks.len();
    // Children lists of the dominator tree in CSR form (a vector per block cost 24 bytes per
    // block and an allocation per parent).
    let parent_of = |b: u32| match d.dominator(b) {
        Dominator::Block(p) => Some(p),
        _ => None,
    };
    let mut child_start = vec![0u32; n + 1];
    for b in 0..n as u32 {
        if let Some(p) = parent_of(b) {
            child_start[p as usize + 1] += 1;
        }
    }
    for i in 0..n {
        child_start[i + 1] += child_start[i];
    }
    let mut fill = child_start.clone();
    let mut children = vec![0u32; child_start[n] as usize];
    let mut tops: Vec<u32> = Vec::new();
    for b in 0..n as u32 {
        match parent_of(b) {
            Some(p) => {
                children[fill[p as usize] as usize] = b;
                fill[p as usize] += 1;
            }
            None => tops.push(b),
        }
    }
    drop(fill);
    // Sites by name (several stack traces can end in the same function): named once per
    // stack id, not once per block.
    let mut site_names: Vec<String> = Vec::new();
    let site_ids: Vec<u32> = {
        let mut by_name: std::collections::HashMap<String, u32> = Default::default();
        let mut by_stack: rustc_hash::FxHashMap<u32, u32> = Default::default();
        (0..n as u32)
            .map(|b| {
                *by_stack
                    .entry(g.blocks[b as usize].stack)
                    .or_insert_with(|| {
                        let name = site_of(b);
                        let k = by_name.len() as u32;
                        *by_name.entry(name.clone()).or_insert_with(|| {
                            site_names.push(name);
                            k
                        })
                    })
            })
            .collect()
    };
    let mut on_path = vec![0u32; site_names.len().max(1)];
    // Per site: (retained bytes, blocks).
    let mut site_retained = vec![(0u64, 0u64); site_names.len()];
    // (block, entering?) pairs: an explicit stack, the tree can be millions deep.
    let mut stack: Vec<(u32, bool)> = tops.iter().rev().map(|&b| (b, true)).collect();
    while let Some((b, enter)) = stack.pop() {
        let s = site_ids[b as usize] as usize;
        if !enter {
            on_path[s] -= 1;
            continue;
        }
        let e = &mut site_retained[s];
        e.1 += 1;
        if on_path[s] == 0 {
            e.0 += d.retained[b as usize];
        }
        on_path[s] += 1;
        stack.push((b, false));
        let (c0, c1) = (child_start[b as usize], child_start[b as usize + 1]);
        stack.extend(
            children[c0 as usize..c1 as usize]
                .iter()
                .map(|&c| (c, true)),
        );
    }
    drop((children, child_start, site_ids, on_path));
    let mut by_site: Vec<(String, u64, u64)> = site_retained
        .iter()
        .enumerate()
        .filter(|(_, (_, blocks))| *blocks > 0)
        .map(|(s, (ret, blocks))| (site_names[s].clone(), *ret, *blocks))
        .collect();
    by_site.sort_by(|x, y| (y.1, &x.0).cmp(&(x.1, &y.0)));
    by_site
}
