//! Chrome DevTools' `.heapsnapshot` writer: a [`Graph`] opened in Chrome's Memory panel
//! ("Load profile"), so that Summary, Containment, Retainers and Dominators work on a native
//! heap.
//!
//! # What is written
//!
//! Nodes, in this order (a node's *ordinal* is its position; `to_node` is ordinal × 5):
//!
//! | ordinal | type | name | id | self_size | edges (of type `element`; `weak` from a leaked block into a reachable one) |
//! |---|---|---|---|---|---|
//! | 0 | `synthetic` | `(heapdump roots)` | 1 | 0 | to each group node, index 0, 1, … |
//! | 1 ..= G | `synthetic` | one per [`RootKind`] present, in declaration order: `(globals)`, `(thread stacks)`, `(self-managed mappings)` | 3, 5, … | 0 | to each root of that kind |
//! | G + 1 ..= G + R | `synthetic` | [`Root::name`] | odd, continuing | 0 | to each of [`Root::targets`] |
//! | G + R + 1 + b | `native` | `site_name(&blocks[b])` | 2 · (b + 1) | [`Block::size`] | to each block `b` points to |
//!
//! * Roots appear grouped by kind, in [`Graph::roots`] order within a kind ([`Layout`] maps
//!   them). Root and group nodes are `synthetic`, so DevTools treats none of them as a "user
//!   root" and measures distances from node 0 (a block a global points to is at distance 3).
//! * Blocks are `native` (never `hidden` or `array`, whose sizes DevTools moves to their
//!   owner), named by their allocation site, so Summary groups them by site.
//! * Ids follow V8's convention — odd ids for the snapshot's own nodes, even ids for native
//!   objects — and are small and stable: a block's id depends only on its index (never the
//!   address: DevTools keeps ids in 32 bits).
//! * Edges are `element` edges whose index is the position of the target in the source's
//!   target list (blocks in address order): [`Graph`] does not record the offset of the pointer
//!   inside the source block, so Retainers shows `[k] in site @id`. `element` edges are
//!   "essential" to DevTools (unlike `weak`, `shortcut` or WeakMap `internal` edges), so its
//!   dominators and retained sizes are computed over exactly our edges: they equal
//!   [`super::dominators`]'s, including for unreachable blocks, which DevTools hangs off node 0
//!   the way `dominators` hangs them off its super-root (checked by this module's tests with
//!   DevTools' own parser). Self-pointers are written (Retainers shows them); DevTools, like
//!   `dominators`, ignores them for dominance.
//! * `self_size` is clamped to `u32::MAX`: DevTools stores node fields as 32-bit integers.
//!
//! # Format
//!
//! One JSON object with keys in V8's order — `snapshot` (`meta`, `node_count`, `edge_count`,
//! `trace_function_count`), `nodes`, `edges`, the empty `trace_function_infos`, `trace_tree`,
//! `samples`, `locations`, and `strings` last (DevTools' loader is a streaming scanner that
//! expects them in that order). Every number is a non-negative integer. Nodes and edges are
//! streamed as they are produced; only the deduplicated string table (site and root names) is
//! kept in memory and written at the end.

use super::{Block, Graph, Root, RootKind};
use std::collections::HashMap;
use std::io::{self, BufWriter, Write};

/// Fields per node in `nodes` (`type, name, id, self_size, edge_count`).
pub const NODE_FIELDS: u32 = 5;

/// V8's node types; the index of a name is the value of a node's `type` field.
const NODE_TYPES: [&str; 15] = [
    "hidden",
    "array",
    "string",
    "object",
    "code",
    "closure",
    "regexp",
    "number",
    "native",
    "synthetic",
    "concatenated string",
    "sliced string",
    "symbol",
    "bigint",
    "object shape",
];
const NATIVE: u64 = 8;
const SYNTHETIC: u64 = 9;
/// V8's edge types; the index of a name is the value of an edge's `type` field.
const EDGE_TYPES: [&str; 7] = [
    "context", "element", "property", "internal", "hidden", "shortcut", "weak",
];
const ELEMENT: u64 = 1;
/// Edge type `weak` (index into [`EDGE_TYPES`]).
const WEAK: u64 = 6;
/// The name of a `weak` edge (its field is a string, not an index).
const WEAK_NAME: &str = "(from a leaked block: keeps nothing alive)";

/// Where each part of a [`Graph`] lands in the written snapshot (node ordinals; multiply by
/// [`NODE_FIELDS`] for DevTools' node index).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The kinds of the group nodes, at ordinals `1..=groups.len()`.
    pub groups: Vec<RootKind>,
    /// Per root (index into [`Graph::roots`]), the ordinal of its node.
    pub root_node: Vec<u32>,
    /// The ordinal of block 0; block `b` is at `first_block + b`.
    pub first_block: u32,
    /// Number of nodes (`snapshot.node_count`).
    pub node_count: u32,
    /// Number of edges (`snapshot.edge_count`).
    pub edge_count: u64,
}

impl Layout {
    /// Computes the layout of `g`'s snapshot. Fails (`InvalidInput`) if DevTools could not
    /// address the nodes with 32-bit `to_node` values.
    pub fn of(g: &Graph) -> io::Result<Layout> {
        let mut groups: Vec<RootKind> = Vec::new();
        for r in &g.roots {
            if !groups.contains(&r.kind) {
                groups.push(r.kind);
            }
        }
        groups.sort_by_key(|&k| kind_rank(k));
        let mut root_node = vec![0u32; g.roots.len()];
        let mut next = 1 + groups.len() as u64;
        for &k in &groups {
            for (j, r) in g.roots.iter().enumerate() {
                if r.kind == k {
                    root_node[j] = next as u32;
                    next += 1;
                }
            }
        }
        let node_count = next + g.blocks.len() as u64;
        if node_count * NODE_FIELDS as u64 > u32::MAX as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{node_count} nodes: too many for a .heapsnapshot (32-bit node indices)"),
            ));
        }
        let edge_count = groups.len() as u64
            + g.roots.len() as u64
            + g.roots.iter().map(|r| r.targets.len() as u64).sum::<u64>()
            + g.targets.len() as u64;
        Ok(Layout {
            groups,
            root_node,
            first_block: next as u32,
            node_count: node_count as u32,
            edge_count,
        })
    }

    /// The ordinal of block `b`'s node.
    #[cfg(test)]
    pub fn block_node(&self, b: u32) -> u32 {
        self.first_block + b
    }
}

/// Group nodes' order: [`RootKind`]'s declaration order.
fn kind_rank(k: RootKind) -> u8 {
    match k {
        RootKind::Global => 0,
        RootKind::Stack => 1,
        RootKind::Registers => 2,
        RootKind::Mapping => 3,
    }
}

/// The name of the group node of a kind.
fn group_name(k: RootKind) -> &'static str {
    match k {
        RootKind::Global => "(globals)",
        RootKind::Stack => "(thread stacks)",
        RootKind::Registers => "(registers)",
        RootKind::Mapping => "(self-managed mappings)",
    }
}

/// The name of node 0.
const ROOT_NAME: &str = "(heapdump roots)";

/// The deduplicated string table.
#[derive(Default)]
struct Strings {
    index: HashMap<String, u32>,
}

impl Strings {
    fn intern(&mut self, s: &str) -> u64 {
        if let Some(&i) = self.index.get(s) {
            return i as u64;
        }
        let i = self.index.len() as u32;
        self.index.insert(s.to_string(), i);
        i as u64
    }

    /// The strings in index order.
    fn into_list(self) -> Vec<String> {
        let mut list: Vec<(String, u32)> = self.index.into_iter().collect();
        list.sort_unstable_by_key(|&(_, i)| i);
        list.into_iter().map(|(s, _)| s).collect()
    }
}

/// A buffered writer of the snapshot's numbers and strings.
struct Out<'a> {
    w: BufWriter<&'a mut dyn Write>,
    /// Whether the next array element is the first of its array (no comma before it).
    first: bool,
}

impl Out<'_> {
    fn raw(&mut self, s: &str) -> io::Result<()> {
        self.w.write_all(s.as_bytes())
    }

    fn num(&mut self, v: u64) -> io::Result<()> {
        let mut buf = [0u8; 20];
        let mut i = buf.len();
        let mut v = v;
        loop {
            i -= 1;
            buf[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.w.write_all(&buf[i..])
    }

    /// One record of an integer array (a node or an edge) on its own line.
    fn record(&mut self, fields: &[u64]) -> io::Result<()> {
        self.raw(if self.first { "\n" } else { ",\n" })?;
        self.first = false;
        for (i, &f) in fields.iter().enumerate() {
            if i > 0 {
                self.raw(",")?;
            }
            self.num(f)?;
        }
        Ok(())
    }

    /// A JSON string literal.
    fn string(&mut self, s: &str) -> io::Result<()> {
        self.raw("\"")?;
        let bytes = s.as_bytes();
        let mut start = 0;
        for (i, &c) in bytes.iter().enumerate() {
            let esc: Option<&[u8]> = match c {
                b'"' => Some(b"\\\""),
                b'\\' => Some(b"\\\\"),
                b'\n' => Some(b"\\n"),
                b'\r' => Some(b"\\r"),
                b'\t' => Some(b"\\t"),
                0..=0x1f => None,
                _ => continue,
            };
            self.w.write_all(&bytes[start..i])?;
            match esc {
                Some(e) => self.w.write_all(e)?,
                None => write!(self.w, "\\u{:04x}", c)?,
            }
            start = i + 1;
        }
        self.w.write_all(&bytes[start..])?;
        self.raw("\"")
    }

    fn string_array(&mut self, list: &[&str]) -> io::Result<()> {
        self.raw("[")?;
        for (i, s) in list.iter().enumerate() {
            if i > 0 {
                self.raw(",")?;
            }
            self.string(s)?;
        }
        self.raw("]")
    }
}

/// Writes `g` as a Chrome DevTools `.heapsnapshot` to `out` (see the module documentation for
/// the nodes and edges), naming each block by `site_name` (its allocation site). Streams: the
/// memory used is the string table plus a 64 KiB buffer. Returns where each root and block
/// went.
pub fn write(
    g: &Graph,
    site_name: &dyn Fn(&Block) -> String,
    out: &mut dyn Write,
) -> io::Result<Layout> {
    let layout = Layout::of(g)?;
    let mut o = Out {
        w: BufWriter::with_capacity(1 << 16, out),
        first: true,
    };
    let mut strings = Strings::default();

    o.raw("{\"snapshot\":{\"meta\":{\"node_fields\":")?;
    o.string_array(&["type", "name", "id", "self_size", "edge_count"])?;
    o.raw(",\"node_types\":[")?;
    o.string_array(&NODE_TYPES)?;
    o.raw(",\"string\",\"number\",\"number\",\"number\"],\"edge_fields\":")?;
    o.string_array(&["type", "name_or_index", "to_node"])?;
    o.raw(",\"edge_types\":[")?;
    o.string_array(&EDGE_TYPES)?;
    o.raw(",\"string_or_number\",\"node\"],\"trace_function_info_fields\":")?;
    o.string_array(&[
        "function_id",
        "name",
        "script_name",
        "script_id",
        "line",
        "column",
    ])?;
    o.raw(",\"trace_node_fields\":")?;
    o.string_array(&["id", "function_info_index", "count", "size", "children"])?;
    o.raw(",\"sample_fields\":")?;
    o.string_array(&["timestamp_us", "last_assigned_id"])?;
    o.raw(",\"location_fields\":")?;
    o.string_array(&["object_index", "script_id", "line", "column"])?;
    o.raw("},\"node_count\":")?;
    o.num(layout.node_count as u64)?;
    o.raw(",\"edge_count\":")?;
    o.num(layout.edge_count)?;
    o.raw(",\"trace_function_count\":0},\n\"nodes\":[")?;

    // Nodes. Synthetic ids: 2 · ordinal + 1; block ids: 2 · (b + 1).
    let n_kind = |k: RootKind| g.roots.iter().filter(|r| r.kind == k).count() as u64;
    let name = strings.intern(ROOT_NAME);
    o.record(&[SYNTHETIC, name, 1, 0, layout.groups.len() as u64])?;
    for (i, &k) in layout.groups.iter().enumerate() {
        let name = strings.intern(group_name(k));
        o.record(&[SYNTHETIC, name, 2 * (i as u64 + 1) + 1, 0, n_kind(k)])?;
    }
    let roots_in_order = roots_in_node_order(g, &layout);
    for (j, r) in &roots_in_order {
        let name = strings.intern(&r.name);
        let id = 2 * layout.root_node[*j] as u64 + 1;
        o.record(&[SYNTHETIC, name, id, 0, r.targets.len() as u64])?;
    }
    for (b, block) in g.blocks.iter().enumerate() {
        let name = strings.intern(&site_name(block));
        let size = block.size.min(u32::MAX as u64);
        let edges = g.edges(b as u32).len() as u64;
        o.record(&[NATIVE, name, 2 * (b as u64 + 1), size, edges])?;
    }

    // Edges, in node order.
    o.raw("],\n\"edges\":[")?;
    o.first = true;
    let f = NODE_FIELDS as u64;
    for i in 0..layout.groups.len() as u64 {
        o.record(&[ELEMENT, i, (1 + i) * f])?;
    }
    for &k in &layout.groups {
        let mut i = 0;
        for (j, r) in &roots_in_order {
            if r.kind == k {
                o.record(&[ELEMENT, i, layout.root_node[*j] as u64 * f])?;
                i += 1;
            }
        }
    }
    let first_block = layout.first_block as u64;
    for (_, r) in &roots_in_order {
        for (i, &t) in r.targets.iter().enumerate() {
            o.record(&[ELEMENT, i as u64, (first_block + t as u64) * f])?;
        }
    }
    // A leaked block's pointers into blocks the roots reach are `weak`: DevTools leaves them
    // out of dominance as `dominators` does (a leak keeps nothing alive).
    let reachable = g.reachable();
    let reached = |b: u32| reachable[b as usize / 64] & (1 << (b % 64)) != 0;
    let mut weak_name = None;
    for b in 0..g.blocks.len() as u32 {
        let leaked = !reached(b);
        for (i, &t) in g.edges(b).iter().enumerate() {
            if leaked && reached(t) {
                let name = *weak_name.get_or_insert_with(|| strings.intern(WEAK_NAME));
                o.record(&[WEAK, name, (first_block + t as u64) * f])?;
            } else {
                o.record(&[ELEMENT, i as u64, (first_block + t as u64) * f])?;
            }
        }
    }

    o.raw("],\n\"trace_function_infos\":[],\n\"trace_tree\":[],\n\"samples\":[],\n")?;
    o.raw("\"locations\":[],\n\"strings\":[")?;
    for (i, s) in strings.into_list().iter().enumerate() {
        o.raw(if i == 0 { "\n" } else { ",\n" })?;
        o.string(s)?;
    }
    o.raw("]}\n")?;
    o.w.flush()?;
    Ok(layout)
}

/// The roots with their indices, in node order (grouped by kind).
fn roots_in_node_order<'g>(g: &'g Graph, layout: &Layout) -> Vec<(usize, &'g Root)> {
    let mut v: Vec<(usize, &Root)> = g.roots.iter().enumerate().collect();
    v.sort_by_key(|&(j, _)| layout.root_node[j]);
    v
}

#[cfg(test)]
mod tests {
    use super::super::dominators::tests::{graph, random_graph, root, Rng};
    use super::super::dominators::{dominators, Dominator};
    use super::*;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    fn site(b: &Block) -> String {
        format!("site_{}", b.stack % 3)
    }

    fn to_string(g: &Graph) -> String {
        let mut v = Vec::new();
        write(g, &site, &mut v).unwrap();
        String::from_utf8(v).unwrap()
    }

    /// The exact text for a small graph: a global → block 0 → block 1 (which points to itself),
    /// a stack → block 1, an empty global.
    #[test]
    fn exact_output() {
        let g = graph(
            &[24, 4294967296 + 5],
            &[&[1], &[1]],
            vec![
                root(RootKind::Stack, "stack of main (7)", &[1]),
                root(RootKind::Global, "g_table (prog)", &[0]),
                root(RootKind::Global, "g_\"empty\"", &[]),
            ],
        );
        let text = to_string(&g);
        let meta = concat!(
            r#"{"snapshot":{"meta":{"node_fields":["type","name","id","self_size","edge_count"],"#,
            r#""node_types":[["hidden","array","string","object","code","closure","regexp","#,
            r#""number","native","synthetic","concatenated string","sliced string","symbol","#,
            r#""bigint","object shape"],"string","number","number","number"],"#,
            r#""edge_fields":["type","name_or_index","to_node"],"#,
            r#""edge_types":[["context","element","property","internal","hidden","shortcut","#,
            r#""weak"],"string_or_number","node"],"#,
            r#""trace_function_info_fields":["function_id","name","script_name","script_id","#,
            r#""line","column"],"trace_node_fields":["id","function_info_index","count","size","#,
            r#""children"],"sample_fields":["timestamp_us","last_assigned_id"],"#,
            r#""location_fields":["object_index","script_id","line","column"]},"#,
        );
        let rest = concat!(
            r#""node_count":8,"edge_count":9,"trace_function_count":0},"#,
            "\n\"nodes\":[",
            "\n9,0,1,0,2",           // 0: root → 2 groups
            ",\n9,1,3,0,2",          // 1: (globals), 2 roots
            ",\n9,2,5,0,1",          // 2: (thread stacks), 1 root
            ",\n9,3,7,0,1",          // 3: g_table → block 0
            ",\n9,4,9,0,0",          // 4: g_"empty"
            ",\n9,5,11,0,1",         // 5: stack of main → block 1
            ",\n8,6,2,24,1",         // 6: block 0 (site_0) → block 1
            ",\n8,7,4,4294967295,1", // 7: block 1 (site_1), size clamped, → itself
            "],\n\"edges\":[",
            "\n1,0,5,\n1,1,10",   // root → groups
            ",\n1,0,15,\n1,1,20", // (globals) → g_table, g_"empty"
            ",\n1,0,25",          // (thread stacks) → stack of main
            ",\n1,0,30",          // g_table → block 0
            ",\n1,0,35",          // stack of main → block 1
            ",\n1,0,35",          // block 0 → block 1
            ",\n1,0,35",          // block 1 → block 1
            "],\n\"trace_function_infos\":[],\n\"trace_tree\":[],\n\"samples\":[],\n",
            "\"locations\":[],\n\"strings\":[",
            "\n\"(heapdump roots)\",\n\"(globals)\",\n\"(thread stacks)\",\n\"g_table (prog)\"",
            ",\n\"g_\\\"empty\\\"\",\n\"stack of main (7)\",\n\"site_0\",\n\"site_1\"]}\n",
        );
        assert_eq!(text, format!("{meta}{rest}"));
        let l = Layout::of(&g).unwrap();
        assert_eq!(
            l,
            Layout {
                groups: vec![RootKind::Global, RootKind::Stack],
                root_node: vec![5, 3, 4],
                first_block: 6,
                node_count: 8,
                edge_count: 9,
            }
        );
    }

    /// Names are valid JSON strings whatever they hold, and deduplicated.
    #[test]
    fn names_are_escaped_and_deduplicated() {
        let names = [
            "a \"quoted\" \\ name\n\t\r",
            "\u{1}\u{1f}é ✓",
            "a \"quoted\" \\ name\n\t\r",
        ];
        let g = graph(&[1, 2, 3], &[&[], &[], &[]], vec![]);
        let mut v = Vec::new();
        write(&g, &|b| names[b.stack as usize].to_string(), &mut v).unwrap();
        let j: serde_json::Value = serde_json::from_slice(&v).unwrap();
        let strings: Vec<&str> = j["strings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        assert_eq!(strings, ["(heapdump roots)", names[0], names[1]]);
        let nodes: Vec<u64> = j["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(
            nodes,
            [9, 0, 1, 0, 0, 8, 1, 2, 1, 0, 8, 2, 4, 2, 0, 8, 1, 6, 3, 0]
        );
    }

    /// The format's invariants on random graphs: keys in order, exact counts, `to_node` a node
    /// index, string indices in range, integers only.
    #[test]
    fn random_graphs_are_well_formed() {
        for seed in 1..=300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let g = random_graph(&mut rng, 40);
            let text = to_string(&g);
            let keys = [
                "\"snapshot\"",
                "\"nodes\"",
                "\"edges\"",
                "\"trace_function_infos\"",
                "\"trace_tree\"",
                "\"samples\"",
                "\"locations\"",
                "\"strings\"",
            ];
            let pos: Vec<usize> = keys.iter().map(|k| text.find(k).unwrap()).collect();
            assert!(
                pos.windows(2).all(|w| w[0] < w[1]),
                "seed {seed}: key order"
            );
            let j: serde_json::Value = serde_json::from_str(&text).unwrap();
            let ints = |k: &str| -> Vec<u64> {
                j[k].as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().expect("non-negative integer"))
                    .collect()
            };
            let (nodes, edges) = (ints("nodes"), ints("edges"));
            let strings = j["strings"].as_array().unwrap().len() as u64;
            let l = Layout::of(&g).unwrap();
            assert_eq!(j["snapshot"]["node_count"], l.node_count);
            assert_eq!(j["snapshot"]["edge_count"], l.edge_count);
            assert_eq!(nodes.len() as u64, 5 * l.node_count as u64);
            assert_eq!(edges.len() as u64, 3 * l.edge_count);
            let edge_sum: u64 = nodes.chunks(5).map(|n| n[4]).sum();
            assert_eq!(edge_sum, l.edge_count);
            assert!(nodes.chunks(5).all(|n| n[1] < strings));
            assert!(edges
                .chunks(3)
                .all(|e| e[2] % 5 == 0 && e[2] < nodes.len() as u64));
            // Block edges land on the blocks they should (they are the last edges).
            let e = edges.len() / 3 - g.targets.len();
            for (k, &t) in g.targets.iter().enumerate() {
                assert_eq!(edges[3 * (e + k) + 2], 5 * (l.first_block + t) as u64);
            }
        }
    }

    /// Where `heap-snapshot-toolkit` is (or is to be) installed: `$HEAPDUMP_DEVTOOLS_DIR`, or
    /// `target/devtools-node` of this workspace (where `.ci/run` installs it).
    fn toolkit_dir() -> PathBuf {
        if let Some(d) = std::env::var_os("HEAPDUMP_DEVTOOLS_DIR") {
            return d.into();
        }
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
        target.join("devtools-node")
    }

    /// Runs `check.mjs` on the files with `$HEAPDUMP_NODE` (default `node`); `None` if that
    /// cannot be run (the test is skipped).
    fn devtools(files: &[PathBuf]) -> Option<Vec<serde_json::Value>> {
        let node = std::env::var_os("HEAPDUMP_NODE").unwrap_or_else(|| "node".into());
        if Command::new(&node).arg("--version").output().is_err() {
            return None;
        }
        let dir = toolkit_dir();
        if !dir
            .join("node_modules/heap-snapshot-toolkit/index.js")
            .exists()
        {
            // .ci/run installs it; a developer machine with node and a network gets it here.
            let st = Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--prefix"])
                .arg(&dir)
                .arg("heap-snapshot-toolkit@1.1.3")
                .status();
            assert!(
                matches!(st, Ok(s) if s.success()),
                "node is installed but heap-snapshot-toolkit is not, and `npm install --prefix \
                 {} heap-snapshot-toolkit@1.1.3` failed ({st:?})",
                dir.display()
            );
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/devtools/check.mjs");
        let out = Command::new(&node)
            .arg(script)
            .arg(&dir)
            .args(files)
            .output()
            .expect("run node");
        assert!(
            out.status.success(),
            "check.mjs failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        Some(
            text.lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect(),
        )
    }

    /// The blocks reachable from the given roots and from the unreachable blocks that no other
    /// block points to (the ones DevTools and `dominators` visit from the super-root).
    fn reach(g: &Graph, roots: &[usize]) -> Vec<bool> {
        let n = g.blocks.len();
        let mut referred = vec![false; n];
        for b in 0..n as u32 {
            for &t in g.edges(b) {
                if t != b {
                    referred[t as usize] = true;
                }
            }
        }
        let mut seen_from_roots = vec![false; n];
        let mut stack: Vec<u32> = g.roots.iter().flat_map(|r| r.targets.clone()).collect();
        while let Some(b) = stack.pop() {
            if !std::mem::replace(&mut seen_from_roots[b as usize], true) {
                stack.extend_from_slice(g.edges(b));
            }
        }
        let mut live = vec![false; n];
        let mut todo: Vec<u32> = (0..n as u32)
            .filter(|&b| !seen_from_roots[b as usize] && !referred[b as usize])
            .collect();
        for &j in roots {
            todo.extend_from_slice(&g.roots[j].targets);
        }
        while let Some(b) = todo.pop() {
            if !std::mem::replace(&mut live[b as usize], true) {
                // A leaked block's pointers into blocks the roots reach keep nothing alive.
                let leaked = !seen_from_roots[b as usize];
                todo.extend(
                    (g.edges(b).iter()).filter(|&&t| !(leaked && seen_from_roots[t as usize])),
                );
            }
        }
        live
    }

    /// What DevTools must compute for `g`: per node ordinal, the retained size and the
    /// immediate dominator (for a block our super-root dominates: the group node of a kind if
    /// every path to the block passes through roots of that kind, else node 0). Group nodes'
    /// retained sizes come from the definition, all others from [`dominators`].
    fn expected(g: &Graph) -> (Vec<u64>, Vec<u32>) {
        let d = dominators(g);
        let l = Layout::of(g).unwrap();
        let n = g.blocks.len();
        let mut retained = vec![0u64; l.node_count as usize];
        let mut idom = vec![0u32; l.node_count as usize];
        retained[0] = g.blocks.iter().map(|b| b.size).sum();
        let every: Vec<usize> = (0..g.roots.len()).collect();
        let all = reach(g, &every);
        // Blocks each group dominates: reachable, but not without the roots of its kind.
        let mut in_group = vec![0u32; n];
        for (i, &k) in l.groups.iter().enumerate() {
            let others: Vec<usize> = (0..g.roots.len())
                .filter(|&j| g.roots[j].kind != k)
                .collect();
            let without = reach(g, &others);
            for b in 0..n {
                if all[b] && !without[b] {
                    retained[1 + i] += g.blocks[b].size;
                    in_group[b] = 1 + i as u32;
                }
            }
        }
        for (j, r) in g.roots.iter().enumerate() {
            let o = l.root_node[j] as usize;
            retained[o] = d.root_retained[j];
            idom[o] = 1 + l.groups.iter().position(|&k| k == r.kind).unwrap() as u32;
        }
        for b in 0..n as u32 {
            let o = l.block_node(b) as usize;
            retained[o] = d.retained[b as usize];
            idom[o] = match d.dominator(b) {
                Dominator::Block(c) => l.block_node(c),
                Dominator::Root(j) => l.root_node[j as usize],
                Dominator::SuperRoot => in_group[b as usize],
            };
        }
        (retained, idom)
    }

    /// Our files loaded by DevTools' own parser: same counts, ids, sizes, dominators and
    /// retained sizes, and Summary groups blocks by allocation site.
    #[test]
    fn devtools_computes_the_same_retained_sizes() {
        let mut graphs: Vec<(String, Graph)> = vec![
            (
                "chain".into(),
                graph(
                    &[1, 10, 100],
                    &[&[1], &[2], &[]],
                    vec![root(RootKind::Global, "g", &[0])],
                ),
            ),
            (
                "diamond".into(),
                graph(
                    &[1, 10, 100, 1000],
                    &[&[1, 2], &[3], &[3], &[]],
                    vec![root(RootKind::Global, "g", &[0])],
                ),
            ),
            (
                "cycle".into(),
                graph(
                    &[1, 10, 100],
                    &[&[1], &[2], &[0, 2]],
                    vec![root(RootKind::Global, "g", &[1])],
                ),
            ),
            (
                "shared".into(),
                graph(
                    &[1, 10, 100, 1000, 10000],
                    &[&[2], &[2], &[3], &[], &[]],
                    vec![
                        root(RootKind::Global, "a", &[0]),
                        root(RootKind::Stack, "stack of t (1)", &[1, 4]),
                        root(RootKind::Global, "empty", &[]),
                    ],
                ),
            ),
            (
                "unreachable".into(),
                graph(
                    &[1, 2, 4, 8, 16, 32, 64, 128],
                    &[&[], &[2], &[3], &[], &[3, 5, 6], &[0, 4], &[], &[7]],
                    vec![root(RootKind::Global, "g", &[0])],
                ),
            ),
            ("empty".into(), graph(&[], &[], vec![])),
        ];
        for seed in 1..=60u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            graphs.push((format!("random{seed}"), random_graph(&mut rng, 30)));
        }
        // A larger one: 20,000 blocks, about 2 pointers each, 60 roots of up to 100 targets.
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let n = 20_000u64;
        let sizes: Vec<u64> = (0..n).map(|_| 16 + rng.below(4096)).collect();
        let edges: Vec<Vec<u32>> = (0..n)
            .map(|_| (0..rng.below(5)).map(|_| rng.below(n) as u32).collect())
            .collect();
        let kinds = [RootKind::Global, RootKind::Stack, RootKind::Mapping];
        let roots = (0..60)
            .map(|j| {
                let mut t: Vec<u32> = (0..rng.below(101)).map(|_| rng.below(n) as u32).collect();
                t.sort_unstable();
                t.dedup();
                root(kinds[j % 3], &format!("root {j}"), &t)
            })
            .collect();
        let edges: Vec<&[u32]> = edges.iter().map(|e| e.as_slice()).collect();
        graphs.push(("large".into(), graph(&sizes, &edges, roots)));

        // Leaked cycles: 1,000 live blocks (a random graph from 10 roots) and 2,000 leaked
        // ones on a ring with random chords, also pointing into the live part; no leaked block
        // is unreferenced, so all 2,000 are reachable only through unreachable cycles.
        let (live, leaked) = (1000u64, 2000u64);
        let sizes: Vec<u64> = (0..live + leaked).map(|_| 1 + rng.below(512)).collect();
        let edges: Vec<Vec<u32>> = (0..live + leaked)
            .map(|i| {
                if i < live {
                    (0..rng.below(4)).map(|_| rng.below(live) as u32).collect()
                } else {
                    let next = live + (i - live + 1) % leaked;
                    let chord = live + rng.below(leaked);
                    vec![next as u32, chord as u32, rng.below(live) as u32]
                }
            })
            .collect();
        let roots = (0..10)
            .map(|j| {
                let t: Vec<u32> = (0..10).map(|i| (j * 100 + i * 7) as u32).collect();
                root(kinds[j % 3], &format!("live {j}"), &t)
            })
            .collect();
        let edges: Vec<&[u32]> = edges.iter().map(|e| e.as_slice()).collect();
        graphs.push(("leaked_cycles".into(), graph(&sizes, &edges, roots)));

        let tmp = tempfile::tempdir().unwrap();
        let mut files = Vec::new();
        for (name, g) in &graphs {
            let p = tmp.path().join(format!("{name}.heapsnapshot"));
            let mut f = std::fs::File::create(&p).unwrap();
            write(g, &site, &mut f).unwrap();
            files.push(p);
        }
        let Some(results) = devtools(&files) else {
            // Straight to standard error, where `cargo test` shows it (`println!` is captured).
            let _ = writeln!(
                io::stderr().lock(),
                "skipped: devtools_computes_the_same_retained_sizes: node is not installed \
                 (.ci/run installs nodejs and npm)"
            );
            return;
        };
        assert_eq!(results.len(), graphs.len());
        let (mut under_node_0, mut behind_cycles) = (0, 0);
        for ((name, g), r) in graphs.iter().zip(&results) {
            let l = Layout::of(g).unwrap();
            let nums = |k: &str| -> Vec<u64> {
                r[k].as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap())
                    .collect()
            };
            assert_eq!(r["node_count"], l.node_count, "{name}: node count");
            assert_eq!(r["edge_count"], l.edge_count, "{name}: edge count");
            let ids: Vec<u64> = (0..l.node_count as u64)
                .map(|o| {
                    if o < l.first_block as u64 {
                        2 * o + 1
                    } else {
                        2 * (o - l.first_block as u64 + 1)
                    }
                })
                .collect();
            assert_eq!(nums("ids"), ids, "{name}: ids");
            let mut sizes = vec![0u64; l.first_block as usize];
            sizes.extend(g.blocks.iter().map(|b| b.size));
            assert_eq!(nums("self_sizes"), sizes, "{name}: self sizes");
            let total: u64 = g.blocks.iter().map(|b| b.size).sum();
            assert_eq!(
                r["statistics"]["native"]["total"], total,
                "{name}: native total"
            );
            let (retained, idom) = expected(g);
            assert_eq!(nums("retained"), retained, "{name}: retained sizes");
            let got_idom: Vec<u32> = nums("dominator").iter().map(|&x| x as u32).collect();
            assert_eq!(got_idom, idom, "{name}: dominators");
            for s in 0..3u32 {
                let blocks: Vec<&Block> = g.blocks.iter().filter(|b| b.stack % 3 == s).collect();
                let got = &r["summary"][format!("site_{s}")];
                if blocks.is_empty() {
                    assert!(got.is_null(), "{name}: site_{s}");
                } else {
                    assert_eq!(got["count"], blocks.len(), "{name}: site_{s} count");
                    let bytes: u64 = blocks.iter().map(|b| b.size).sum();
                    assert_eq!(got["self"], bytes, "{name}: site_{s} bytes");
                }
            }
            under_node_0 += (0..g.blocks.len() as u32)
                .filter(|&b| idom[l.block_node(b) as usize] == 0)
                .count();
            let every: Vec<usize> = (0..g.roots.len()).collect();
            behind_cycles += reach(g, &every).iter().filter(|&&r| !r).count();
        }
        let large = &results[graphs.iter().position(|(n, _)| n == "large").unwrap()];
        println!(
            "devtools: {} files agree; large: {} nodes, {} edges, root retains {} bytes; in all, \
             {} blocks immediately dominated by node 0, {} reachable only through unreachable \
             cycles",
            results.len(),
            large["node_count"],
            large["edge_count"],
            large["retained"][0],
            under_node_0,
            behind_cycles
        );
    }
}
