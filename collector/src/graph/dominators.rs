//! Dominator tree and retained sizes of a [`Graph`].
//!
//! # The flow graph
//!
//! Nodes are the blocks, the roots and a virtual *super-root* `S`. Edges: `S → every root`,
//! `root → each of its targets`, `block → each block it points to`. A root is therefore a node
//! of its own between `S` and its targets, and its retained size means "what would be freed if
//! this root let go". A block *dominates* another if every path from `S` to the other passes
//! through it; a node's *retained size* is the sum of the sizes of the blocks it dominates
//! (itself included) — what would be freed if it were freed. Self-pointers are ignored.
//!
//! # Blocks unreachable from every root
//!
//! They are hung off `S` exactly as Chrome DevTools does with the unreachable nodes of a
//! `.heapsnapshot` (`HeapSnapshot.calculateDominatorsAndRetainedSizes` in devtools-frontend), so
//! that the retained sizes DevTools computes from our export ([`super::heapsnapshot`]) equal
//! ours:
//!
//! 1. An unreachable block that no other block points to (self-pointers do not count) — the
//!    head of a leaked structure, LeakSanitizer's "direct" leak with no referrer — gets a
//!    virtual edge `S → block`; everything reachable from it is then dominated as usual, so the
//!    head of a leaked list retains the whole list. Its pointers into blocks the roots reach
//!    are not edges: a leak keeps nothing alive, and a stale pointer in a leaked block must
//!    not take a block's retained size from its real owner. ([`super::heapsnapshot`] exports
//!    them as `weak` edges, which DevTools leaves out of dominance likewise.)
//! 2. The blocks still unvisited after that are those reachable only through unreachable
//!    *cycles* (a leaked doubly linked list, two blocks pointing to each other). Each one is
//!    dominated by `S` directly, retains only its own size, and its outgoing pointers are
//!    ignored (also where they point into reachable blocks: a leaked cycle never changes the
//!    dominators of live blocks). This is what DevTools' Lengauer–Tarjan does when it "visits
//!    the remaining unreachable nodes individually from the root".
//!
//! # Algorithm and memory
//!
//! Semi-NCA (Georgiadis, Werneck and Tarjan, "Finding dominators in practice", 2004): the
//! semidominators of Lengauer–Tarjan's "simple" version (path compression without balancing,
//! O(e log n)), each immediate dominator then found as the nearest common ancestor of the DFS
//! parent and the semidominator. Fully iterative: the depth-first search keeps its stack in the
//! DFS-parent array and a per-vertex edge cursor, path compression uses a reusable explicit
//! stack. All arrays are `u32` indexed by DFS number; the forest keeps a node's ancestor and
//! label (a semidominator number, not a vertex) side by side, so a path step is one cache miss.
//! Pointers are read in order with their targets' entries prefetched ahead. Peak working
//! memory, freed before returning: about 32 bytes per block (and per root) plus 4 bytes per
//! pointer (the predecessor lists), on top of the graph itself; the result keeps 12 bytes per
//! block (`idom` 4 + `retained` 8) and 8 per root. Measured on this 2-core machine
//! (bench/graph_hold.c, 3.1 random pointers per block, the worst case for caches): 10 M blocks
//! 10–11 s with the collector's arrays on huge pages (19 s on 4 KiB pages, 23 s with
//! Lengauer–Tarjan's buckets and `semi[label[x]]`), 1 M blocks 0.7 s.
//! Cooper–Harvey–Kennedy was not used: on a doubly linked list referenced from both ends
//! (common in heaps) its iteration needs one pass per list element, O(n²).

use super::Graph;

/// The dominator tree and retained sizes of a [`Graph`] (see the module documentation for the
/// flow graph and the treatment of unreachable blocks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dominators {
    /// Per block (index into [`Graph::blocks`]), its immediate dominator, encoded in one `u32`:
    /// a value `< blocks.len()` is a block index; `blocks.len() + j` is root `j` (index into
    /// [`Graph::roots`]); `blocks.len() + roots.len()` is the super-root, which dominates the
    /// blocks reachable from several roots through no single dominating block, and the
    /// unreachable blocks. Decode with [`Dominators::dominator`].
    pub idom: Vec<u32>,
    /// Per block, its retained size in bytes: the sum of [`super::Block::size`] over the blocks
    /// it dominates, itself included.
    pub retained: Vec<u64>,
    /// Per root (index into [`Graph::roots`]), its retained size in bytes: the sum of the sizes
    /// of the blocks it dominates. Roots are never dominated by a block.
    pub root_retained: Vec<u64>,
}

/// A decoded immediate dominator (see [`Dominators::idom`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dominator {
    /// A block (index into [`Graph::blocks`]).
    Block(u32),
    /// A root (index into [`Graph::roots`]).
    Root(u32),
    /// The virtual super-root: no single block or root dominates the block (reachable from
    /// several roots), or the block is unreachable.
    SuperRoot,
}

impl Dominators {
    /// The immediate dominator of block `b`.
    pub fn dominator(&self, b: u32) -> Dominator {
        let n = self.idom.len() as u32;
        let m = self.root_retained.len() as u32;
        let d = self.idom[b as usize];
        if d < n {
            Dominator::Block(d)
        } else if d - n < m {
            Dominator::Root(d - n)
        } else {
            Dominator::SuperRoot
        }
    }
}

/// The successors of the flow-graph nodes. Node ids: block `b` is `b`, root `j` is `n + j`,
/// the super-root is `n + m`.
struct Flow<'a> {
    g: &'a Graph,
    n: u32,
    m: u32,
}

impl Flow<'_> {
    fn len(&self, v: u32) -> u32 {
        if v < self.n {
            self.g.edge_start[v as usize + 1] - self.g.edge_start[v as usize]
        } else if v - self.n < self.m {
            self.g.roots[(v - self.n) as usize].targets.len() as u32
        } else {
            self.m
        }
    }

    /// The `k`-th successor of `v` (`k < len(v)`); may be `v` itself (a self-pointer).
    fn at(&self, v: u32, k: u32) -> u32 {
        if v < self.n {
            self.g.targets[(self.g.edge_start[v as usize] + k) as usize]
        } else if v - self.n < self.m {
            self.g.roots[(v - self.n) as usize].targets[k as usize]
        } else {
            self.n + k
        }
    }
}

/// The iterative depth-first numbering. Number 0 means "none"; numbers start at 1.
struct Dfs {
    /// Per node id, its DFS number (0: not visited).
    dfnum: Vec<u32>,
    /// Per number, the node id.
    vertex: Vec<u32>,
    /// Per number, the number of the DFS-tree parent (0 for the super-root).
    parent: Vec<u32>,
    /// Per number, the next successor to look at.
    cursor: Vec<u32>,
}

impl Dfs {
    fn number(&mut self, v: u32, parent: u32) -> u32 {
        let num = self.vertex.len() as u32;
        self.dfnum[v as usize] = num;
        self.vertex.push(v);
        self.parent.push(parent);
        self.cursor.push(0);
        num
    }

    /// Numbers everything reachable from `start` (not yet visited) whose DFS parent is `parent`.
    fn run(&mut self, f: &Flow, start: u32, parent: u32) {
        let first = self.number(start, parent);
        let mut num = first;
        loop {
            let v = self.vertex[num as usize];
            let len = f.len(v);
            let mut c = self.cursor[num as usize];
            if c == 0 && v < f.n {
                // Each successor's `dfnum` (and its row, for the one descended into) is a cache
                // miss at a random place: asked for at once so that the misses overlap
                // (depth-first search of 10 M blocks 5.5 s -> 4.3 s).
                for &w in f.g.edges(v).iter().take(16) {
                    prefetch(&self.dfnum, w);
                    prefetch(&f.g.edge_start, w);
                }
            }
            let mut next = 0;
            while c < len {
                let w = f.at(v, c);
                c += 1;
                if self.dfnum[w as usize] == 0 {
                    next = self.number(w, num);
                    break;
                }
            }
            self.cursor[num as usize] = c;
            if next != 0 {
                num = next;
            } else if num == first {
                return;
            } else {
                num = self.parent[num as usize];
            }
        }
    }
}

/// Computes the dominator tree and retained sizes of `g` (see the module documentation).
///
/// Time O((n + e) log n) for n nodes and e pointers; memory as documented on the module.
/// Panics if blocks + roots + 1 or the number of edges (pointers, root targets, roots) does not
/// fit in a `u32`.
pub fn dominators(g: &Graph) -> Dominators {
    dominators_within(g, None)
}

/// [`dominators`], the nearest-common-ancestor walk given up after `nca_budget` steps (None:
/// `8 × nodes + 2^20`) for Lengauer–Tarjan's buckets ([`lt_idoms`]).
fn dominators_within(g: &Graph, nca_budget: Option<u64>) -> Dominators {
    let n = g.blocks.len();
    let m = g.roots.len();
    let total = n + m + 1;
    assert!(total < u32::MAX as usize, "graph too large: {total} nodes");
    assert_eq!(
        g.edge_start.len(),
        n + 1,
        "edge_start must have blocks + 1 entries"
    );
    let f = Flow {
        g,
        n: n as u32,
        m: m as u32,
    };
    let s = (n + m) as u32;

    // Depth-first numbering: from the super-root, then from each unreachable block nobody
    // else points to (case 1 of the module documentation).
    let mut dfs = Dfs {
        dfnum: vec![0; total],
        vertex: Vec::with_capacity(total + 1),
        parent: Vec::with_capacity(total + 1),
        cursor: Vec::with_capacity(total + 1),
    };
    dfs.vertex.push(u32::MAX);
    dfs.parent.push(0);
    dfs.cursor.push(0);
    dfs.run(&f, s, 0);
    // Numbers up to here: the nodes the roots reach. A pointer from a block numbered later (a
    // leak's) into one of them keeps nothing alive: it is not an edge of the flow graph (see
    // the module documentation), so the leak takes no retained size from the real owner.
    let reached = dfs.vertex.len() - 1;
    if dfs.vertex.len() - 1 < total {
        let mut referred = vec![0u64; n.div_ceil(64)];
        for b in 0..n as u32 {
            for &t in g.edges(b) {
                if t != b {
                    referred[t as usize / 64] |= 1 << (t % 64);
                }
            }
        }
        for b in 0..n as u32 {
            if dfs.dfnum[b as usize] == 0 && referred[b as usize / 64] & (1 << (b % 64)) == 0 {
                dfs.run(&f, b, 1);
            }
        }
    }
    let Dfs {
        dfnum,
        vertex,
        parent,
        cursor,
    } = dfs;
    drop(cursor);
    // Visited nodes: numbers 1..=k. The blocks left unvisited are case 2.
    let k = vertex.len() - 1;

    // Predecessor lists in DFS-number space (CSR). Only visited nodes' edges count: the
    // outgoing pointers of case-2 blocks are ignored. A case-1 block (a block whose DFS parent
    // is the super-root) has the super-root as its one predecessor.
    // Sources are scanned in node order (the pointer array sequentially), not DFS order.
    // `e(dfnum of the target, dfnum of the source)` for every edge between visited nodes,
    // blocks' pointers read in order with the targets' `dfnum` prefetched ahead (each is a
    // cache miss at a random place).
    fn for_each_edge(
        f: &Flow,
        dfnum: &[u32],
        vertex: &[u32],
        parent: &[u32],
        reached: usize,
        mut e: impl FnMut(usize, u32),
    ) {
        const AHEAD: usize = 16;
        let g = f.g;
        for v in 0..f.n {
            let nv = dfnum[v as usize];
            let (a, b) = (
                g.edge_start[v as usize] as usize,
                g.edge_start[v as usize + 1] as usize,
            );
            if nv == 0 {
                continue;
            }
            for j in a..b {
                if let Some(&ahead) = g.targets.get(j + AHEAD) {
                    prefetch(dfnum, ahead);
                }
                let w = g.targets[j];
                let nw = dfnum[w as usize] as usize;
                if w != v && !(nv as usize > reached && nw != 0 && nw <= reached) {
                    e(nw, nv);
                }
            }
        }
        for v in f.n..=f.n + f.m {
            let nv = dfnum[v as usize];
            if nv == 0 {
                continue;
            }
            for c in 0..f.len(v) {
                let w = f.at(v, c);
                if w != v {
                    e(dfnum[w as usize] as usize, nv);
                }
            }
        }
        for num in 1..vertex.len() {
            if vertex[num] < f.n && parent[num] == 1 {
                e(num, 1);
            }
        }
    }
    let mut pstart = vec![0u32; k + 2];
    for_each_edge(&f, &dfnum, &vertex, &parent, reached, |w, _| {
        pstart[w + 1] = pstart[w + 1]
            .checked_add(1)
            .expect("graph too large: more than 2^32 edges");
    });
    for i in 0..=k {
        pstart[i + 1] = pstart[i + 1]
            .checked_add(pstart[i])
            .expect("graph too large: more than 2^32 edges");
    }
    let mut preds = vec![0u32; pstart[k + 1] as usize];
    for_each_edge(&f, &dfnum, &vertex, &parent, reached, |w, p| {
        preds[pstart[w] as usize] = p;
        pstart[w] += 1;
    });
    // After filling, pstart[w] is the end of w's list, i.e. the start of w + 1's: shift back.
    for i in (1..=k + 1).rev() {
        pstart[i] = pstart[i - 1];
    }
    pstart[0] = 0;
    drop(dfnum);

    // Semi-NCA (Georgiadis, Werneck and Tarjan, "Finding dominators in practice"), in
    // DFS-number space: semidominators as in Lengauer–Tarjan, with the forest's labels holding
    // semidominator *values* (so `eval` needs no `semi[label[x]]` indirection and a node's
    // ancestor and label share one cache line), then each immediate dominator as the nearest
    // common ancestor of the DFS parent and the semidominator (no buckets). On 10 M blocks of a
    // random graph every access is a cache miss: one per path step instead of three.
    let mut forest: Vec<[u32; 2]> = (0..=k as u32).map(|i| [0, i]).collect(); // [ancestor, label]
    let mut semi: Vec<u32> = (0..=k as u32).collect();
    let mut stack: Vec<u32> = Vec::new();
    for w in (2..=k).rev() {
        let mut sw = semi[w];
        let (a, b) = (pstart[w] as usize, pstart[w + 1] as usize);
        for j in a..b {
            // The predecessors of the next nodes are read in order: their forest entries
            // (random places) are asked for ahead.
            if let Some(&ahead) = preds.get(j.wrapping_sub(16)) {
                prefetch2(&forest, ahead);
            }
            let v = preds[j];
            let u = eval(v, &mut forest, &mut stack);
            if u < sw {
                sw = u;
            }
        }
        semi[w] = sw;
        forest[w] = [parent[w], sw]; // link(parent[w], w)
    }
    drop((forest, preds, pstart));
    let budget = nca_budget.unwrap_or(8 * k as u64 + (1 << 20));
    let dom = match nca_idoms(&parent, &semi, k, budget) {
        Some(dom) => dom,
        None => lt_idoms(&parent, &semi, k),
    };
    drop((semi, parent));

    // Results. Unvisited (case-2) blocks keep the super-root and their own size.
    let mut idom = vec![s; n];
    let mut retained: Vec<u64> = Vec::with_capacity(total);
    retained.extend(g.blocks.iter().map(|b| b.size));
    retained.resize(total, 0);
    for num in (2..=k).rev() {
        let v = vertex[num] as usize;
        let d = vertex[dom[num] as usize];
        if v < n {
            idom[v] = d;
        }
        retained[d as usize] += retained[v];
    }
    let root_retained = retained[n..n + m].to_vec();
    retained.truncate(n);
    retained.shrink_to_fit();
    Dominators {
        idom,
        retained,
        root_retained,
    }
}

/// Semi-NCA's last step: each immediate dominator (DFS numbers, 2..=k) as the nearest common
/// ancestor, in the dominator tree built so far, of the DFS parent and the semidominator.
/// Fast on the graphs of real heaps, but quadratic on some: a chain of `c` blocks whose last
/// holds `c` blocks a global also holds walks the chain once for each (helper Q, 2: a 27 KB
/// capture took 79 s). `None` once the walk took more than `budget` steps.
fn nca_idoms(parent: &[u32], semi: &[u32], k: usize, budget: u64) -> Option<Vec<u32>> {
    let mut dom = parent.to_vec();
    let mut steps = 0u64;
    for w in 2..=k {
        let mut d = dom[w];
        while d > semi[w] {
            d = dom[d as usize];
            steps += 1;
        }
        if steps > budget {
            return None;
        }
        dom[w] = d;
    }
    Some(dom)
}

/// The immediate dominators (DFS numbers, 2..=k) from the DFS parents and semidominators by
/// Lengauer–Tarjan's second half (Lengauer and Tarjan, "A fast algorithm for finding
/// dominators in a flowgraph", 1979, steps 3 and 4: buckets, and a forest with path
/// compression whose labels are the vertices of least semidominator): O(m log n) on any graph.
fn lt_idoms(parent: &[u32], semi: &[u32], k: usize) -> Vec<u32> {
    // Forest: ancestor (0: a forest root) and label, by DFS number.
    let mut anc = vec![0u32; k + 1];
    let mut label: Vec<u32> = (0..=k as u32).collect();
    // Buckets as singly linked lists (0: end; members are 2..=k).
    let mut head = vec![0u32; k + 1];
    let mut next = vec![0u32; k + 1];
    let mut dom = vec![0u32; k + 1];
    let mut path: Vec<u32> = Vec::new();
    for w in (2..=k).rev() {
        let s = semi[w] as usize;
        next[w] = head[s];
        head[s] = w as u32;
        let p = parent[w] as usize;
        anc[w] = p as u32;
        let mut v = std::mem::take(&mut head[p]);
        while v != 0 {
            let after = next[v as usize];
            let u = lt_eval(v, &mut anc, &mut label, semi, &mut path);
            dom[v as usize] = if semi[u as usize] < semi[v as usize] {
                u
            } else {
                p as u32
            };
            v = after;
        }
    }
    for w in 2..=k {
        if dom[w] != semi[w] {
            dom[w] = dom[dom[w] as usize];
        }
    }
    dom
}

/// Lengauer–Tarjan's EVAL with path compression, iteratively: the vertex of least
/// semidominator on the forest path above `v` (`v` itself at a forest root).
fn lt_eval(v: u32, anc: &mut [u32], label: &mut [u32], semi: &[u32], path: &mut Vec<u32>) -> u32 {
    if anc[v as usize] == 0 {
        return v;
    }
    path.clear();
    let mut x = v;
    while anc[anc[x as usize] as usize] != 0 {
        path.push(x);
        x = anc[x as usize];
    }
    while let Some(x) = path.pop() {
        let a = anc[x as usize] as usize;
        if semi[label[a] as usize] < semi[label[x as usize] as usize] {
            label[x as usize] = label[a];
        }
        anc[x as usize] = anc[a];
    }
    label[v as usize]
}

/// Asks the CPU to bring `a[i]` into the cache (a hint: no effect on results; out of range is
/// ignored).
#[inline(always)]
fn prefetch<T>(a: &[T], i: u32) {
    #[cfg(target_arch = "x86_64")]
    if let Some(p) = a.get(i as usize) {
        // SAFETY: `p` is a valid reference; a prefetch reads nothing architecturally and cannot
        // fault.
        unsafe {
            std::arch::x86_64::_mm_prefetch(
                p as *const T as *const i8,
                std::arch::x86_64::_MM_HINT_T0,
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (a, i);
}

/// [`prefetch`] of a forest entry.
#[inline(always)]
fn prefetch2(a: &[[u32; 2]], i: u32) {
    prefetch(a, i)
}

/// `eval` of Semi-NCA over `forest` (`[ancestor, label]` per DFS number, ancestor 0 for a
/// forest root): the minimum label (a semidominator number) on the forest path from `v` up to,
/// excluding, its forest root; `v`'s own label if `v` is a forest root.
fn eval(v: u32, forest: &mut [[u32; 2]], stack: &mut Vec<u32>) -> u32 {
    let [anc, _] = forest[v as usize];
    if anc == 0 || forest[anc as usize][0] == 0 {
        return forest[v as usize][1];
    }
    // compress(v), iteratively: collect the path whose ancestors are not forest roots, then
    // update it top-down (the order of the recursive version's returns).
    stack.clear();
    let mut x = v;
    loop {
        let a = forest[x as usize][0];
        if forest[a as usize][0] == 0 {
            break;
        }
        stack.push(x);
        x = a;
    }
    while let Some(x) = stack.pop() {
        let a = forest[x as usize][0] as usize;
        let [aa, la] = forest[a];
        let e = &mut forest[x as usize];
        if la < e[1] {
            e[1] = la;
        }
        e[0] = aa;
    }
    forest[v as usize][1]
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::{Block, Graph, Root, RootKind};
    use super::*;

    /// Blocks of the given sizes at addresses 0x1000, 0x2000, …
    pub(crate) fn blocks(sizes: &[u64]) -> Vec<Block> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| Block {
                address: 0x1000 * (i as u64 + 1),
                size,
                stack: i as u32,
                thread: 1,
            })
            .collect()
    }

    pub(crate) fn root(kind: RootKind, name: &str, targets: &[u32]) -> Root {
        Root {
            kind,
            name: name.to_string(),
            targets: targets.to_vec(),
        }
    }

    fn global(name: &str, targets: &[u32]) -> Root {
        root(RootKind::Global, name, targets)
    }

    /// A graph of blocks with the given sizes and edge lists.
    pub(crate) fn graph(sizes: &[u64], edges: &[&[u32]], roots: Vec<Root>) -> Graph {
        let edges: Vec<Vec<u32>> = edges.iter().map(|e| e.to_vec()).collect();
        Graph::from_lists(blocks(sizes), &edges, roots)
    }

    const SUPER: Dominator = Dominator::SuperRoot;
    use Dominator::{Block as B, Root as R};

    fn check(g: &Graph, idom: &[Dominator], retained: &[u64], root_retained: &[u64]) {
        let d = dominators(g);
        let got: Vec<Dominator> = (0..g.blocks.len() as u32).map(|b| d.dominator(b)).collect();
        assert_eq!(got, idom, "idom");
        assert_eq!(d.retained, retained, "retained");
        assert_eq!(d.root_retained, root_retained, "root_retained");
        // And the definition agrees.
        let nv = naive(g);
        assert_eq!(d.idom, nv.idom, "naive idom");
        assert_eq!(d.retained, nv.retained, "naive retained");
        assert_eq!(d.root_retained, nv.root_retained, "naive root_retained");
    }

    #[test]
    fn chain() {
        // R → 0 → 1 → 2
        let g = graph(&[1, 10, 100], &[&[1], &[2], &[]], vec![global("g", &[0])]);
        check(&g, &[R(0), B(0), B(1)], &[111, 110, 100], &[111]);
    }

    #[test]
    fn diamond() {
        // R → 0; 0 → 1, 2; 1 → 3; 2 → 3
        let g = graph(
            &[1, 10, 100, 1000],
            &[&[1, 2], &[3], &[3], &[]],
            vec![global("g", &[0])],
        );
        check(
            &g,
            &[R(0), B(0), B(0), B(0)],
            &[1111, 10, 100, 1000],
            &[1111],
        );
    }

    #[test]
    fn reachable_cycle_and_self_pointer() {
        // R → 1 → 2 → 0 → 1 (a cycle entered at 1), 2 points to itself.
        let g = graph(
            &[1, 10, 100],
            &[&[1], &[2], &[0, 2]],
            vec![global("g", &[1])],
        );
        check(&g, &[B(2), R(0), B(1)], &[1, 111, 101], &[111]);
    }

    #[test]
    fn two_roots_sharing_a_subtree() {
        // R0 → 0, R1 → 1; 0 → 2, 1 → 2; 2 → 3; R1 also → 4 alone; R2 points to nothing.
        let g = graph(
            &[1, 10, 100, 1000, 10000],
            &[&[2], &[2], &[3], &[], &[]],
            vec![
                global("a", &[0]),
                root(RootKind::Stack, "stack of t (1)", &[1, 4]),
                global("empty", &[]),
            ],
        );
        check(
            &g,
            &[R(0), R(1), SUPER, B(2), R(1)],
            &[1, 10, 1100, 1000, 10000],
            &[1, 10010, 0],
        );
    }

    #[test]
    fn unreachable_blocks_follow_devtools() {
        // Reachable: R → 0.
        // Leaked list with a head nobody points to: 1 → 2 → 3 (case 1).
        // Leaked cycle 4 ⇄ 5, 4 → 6 (6 only from the cycle), 5 → 0 (into the live part) and
        // 4 → 3 (into the leaked list): case 2, outgoing pointers ignored.
        // A block that points only to itself: 7 (case 1: self-pointers do not count).
        let g = graph(
            &[1, 2, 4, 8, 16, 32, 64, 128],
            &[&[], &[2], &[3], &[], &[3, 5, 6], &[0, 4], &[], &[7]],
            vec![global("g", &[0])],
        );
        check(
            &g,
            &[R(0), SUPER, B(1), B(2), SUPER, SUPER, SUPER, SUPER],
            &[1, 14, 12, 8, 16, 32, 64, 128],
            &[1],
        );
    }

    #[test]
    fn doubly_linked_list_referenced_from_both_ends() {
        // head R0 → 0, tail R1 → 9; i ⇄ i + 1.
        let n = 10u32;
        let edges: Vec<Vec<u32>> = (0..n)
            .map(|i| {
                let mut e = Vec::new();
                if i > 0 {
                    e.push(i - 1);
                }
                if i + 1 < n {
                    e.push(i + 1);
                }
                e
            })
            .collect();
        let g = Graph::from_lists(
            blocks(&vec![8; n as usize]),
            &edges,
            vec![global("head", &[0]), global("tail", &[n - 1])],
        );
        // Block 0 is also reachable from the tail through the `prev` pointers: no root alone
        // keeps any block.
        check(&g, &vec![SUPER; n as usize], &vec![8; n as usize], &[0, 0]);
    }

    #[test]
    fn empty_graph() {
        let g = Graph::from_lists(Vec::new(), &[], Vec::new());
        check(&g, &[], &[], &[]);
        let g = Graph::from_lists(Vec::new(), &[], vec![global("g", &[])]);
        check(&g, &[], &[], &[0]);
    }

    /// A deep chain (10^6 blocks) and a wide star: no recursion, no quadratic blow-up.
    #[test]
    fn deep_chain_does_not_recurse() {
        let n = 1_000_000u32;
        let edges: Vec<Vec<u32>> = (0..n)
            .map(|i| if i + 1 < n { vec![i + 1] } else { vec![0] })
            .collect();
        let g = Graph::from_lists(
            blocks(&vec![1; n as usize]),
            &edges,
            vec![global("g", &[0])],
        );
        let d = dominators(&g);
        assert_eq!(d.root_retained, [n as u64]);
        assert_eq!(d.retained[0], n as u64);
        assert_eq!(d.retained[n as usize - 1], 1);
        assert_eq!(d.dominator(n - 1), B(n - 2));
    }

    /// The result of [`naive`], in the encoding of [`Dominators`].
    pub(crate) struct Naive {
        pub idom: Vec<u32>,
        pub retained: Vec<u64>,
        pub root_retained: Vec<u64>,
    }

    /// The flow graph of the module documentation, built from the definitions (reachability),
    /// as adjacency lists over node ids (blocks, then roots, then the super-root).
    pub(crate) fn flow_graph(g: &Graph) -> Vec<Vec<u32>> {
        let n = g.blocks.len();
        let m = g.roots.len();
        let s = n + m;
        let mut adj: Vec<Vec<u32>> = vec![Vec::new(); n + m + 1];
        for (b, a) in adj.iter_mut().enumerate().take(n) {
            *a = g
                .edges(b as u32)
                .iter()
                .copied()
                .filter(|&t| t as usize != b)
                .collect();
        }
        for (j, r) in g.roots.iter().enumerate() {
            adj[n + j] = r.targets.clone();
        }
        adj[s] = (n..n + m).map(|j| j as u32).collect();
        let reach = |adj: &Vec<Vec<u32>>| {
            let mut seen = vec![false; n + m + 1];
            let mut todo = vec![s];
            seen[s] = true;
            while let Some(v) = todo.pop() {
                for &w in &adj[v] {
                    if !seen[w as usize] {
                        seen[w as usize] = true;
                        todo.push(w as usize);
                    }
                }
            }
            seen
        };
        let live = reach(&adj);
        // A leaked block's pointers into live blocks are not edges (a leak keeps nothing
        // alive).
        for b in 0..n {
            if !live[b] {
                adj[b].retain(|&t| !live[t as usize]);
            }
        }
        let referred: Vec<bool> = (0..n)
            .map(|b| (0..n + m).any(|v| adj[v].contains(&(b as u32))))
            .collect();
        for b in 0..n {
            if !live[b] && !referred[b] {
                adj[s].push(b as u32);
            }
        }
        let visited = reach(&adj);
        for b in 0..n {
            if !visited[b] {
                adj[b].clear();
                adj[s].push(b as u32);
            }
        }
        adj
    }

    /// Dominators by definition: `d` dominates `w` iff `w` is unreachable from the super-root
    /// once `d` is removed. O(n · (n + e)).
    pub(crate) fn naive(g: &Graph) -> Naive {
        let adj = flow_graph(g);
        let n = g.blocks.len();
        let m = g.roots.len();
        let total = n + m + 1;
        let s = n + m;
        let reach_without = |cut: usize| {
            let mut seen = vec![false; total];
            if cut == s {
                return seen;
            }
            let mut todo = vec![s];
            seen[s] = true;
            while let Some(v) = todo.pop() {
                for &w in &adj[v] {
                    let w = w as usize;
                    if w != cut && !seen[w] {
                        seen[w] = true;
                        todo.push(w);
                    }
                }
            }
            seen
        };
        // dominated[d][w]: d dominates w (reflexive).
        let dominated: Vec<Vec<bool>> = (0..total)
            .map(|d| {
                let seen = reach_without(d);
                (0..total).map(|w| w == d || !seen[w]).collect()
            })
            .collect();
        let depth = |w: usize| (0..total).filter(|&d| dominated[d][w]).count();
        let idom = (0..n)
            .map(|w| {
                // The strict dominator with the most dominators itself is the closest.
                (0..total)
                    .filter(|&d| d != w && dominated[d][w])
                    .max_by_key(|&d| depth(d))
                    .unwrap() as u32
            })
            .collect();
        let retained_of = |d: usize| -> u64 {
            (0..n)
                .filter(|&w| dominated[d][w])
                .map(|w| g.blocks[w].size)
                .sum()
        };
        Naive {
            idom,
            retained: (0..n).map(retained_of).collect(),
            root_retained: (n..n + m).map(retained_of).collect(),
        }
    }

    /// A small deterministic generator (xorshift64*), so failures are reproducible by seed.
    pub(crate) struct Rng(pub u64);
    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        pub(crate) fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// A random graph of up to `max_blocks` blocks: sparse or dense edges, self-pointers,
    /// 0–3 roots of mixed kinds, often leaving unreachable parts (heads, cycles).
    pub(crate) fn random_graph(rng: &mut Rng, max_blocks: u64) -> Graph {
        let n = rng.below(max_blocks + 1) as usize;
        let density = 1 + rng.below(4);
        let sizes: Vec<u64> = (0..n).map(|_| 1 + rng.below(1000)).collect();
        let edges: Vec<Vec<u32>> = (0..n)
            .map(|_| {
                (0..rng.below(density + 1))
                    .map(|_| rng.below(n as u64) as u32)
                    .collect()
            })
            .collect();
        let kinds = [RootKind::Global, RootKind::Stack, RootKind::Mapping];
        let roots = (0..rng.below(4))
            .map(|j| {
                let mut t: Vec<u32> = if n == 0 {
                    Vec::new()
                } else {
                    (0..rng.below(3))
                        .map(|_| rng.below(n as u64) as u32)
                        .collect()
                };
                t.sort_unstable();
                t.dedup();
                root(kinds[rng.below(3) as usize], &format!("root {j}"), &t)
            })
            .collect();
        Graph::from_lists(blocks(&sizes), &edges, roots)
    }

    /// Lengauer–Tarjan's buckets (the walk's budget 0) against the definition on 3000 random
    /// small graphs, and on the chain-and-index shape that made the walk quadratic.
    #[test]
    fn buckets_match_the_definition() {
        for seed in 1..=3000u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let g = random_graph(&mut rng, 14);
            let d = dominators_within(&g, Some(0));
            let nv = naive(&g);
            assert_eq!(
                (&d.idom, &d.retained, &d.root_retained),
                (&nv.idom, &nv.retained, &nv.root_retained),
                "seed {seed}: graph {g:?}"
            );
        }
        // A chain 0 → 1 → … → c-1 from root 0; block c-1 holds blocks c..2c, which root 1 (an
        // index) holds too: each of those is dominated by the super-root only.
        let c = 2000usize;
        let mut edges: Vec<Vec<u32>> = (0..c).map(|i| vec![i as u32 + 1]).collect();
        edges[c - 1] = (c as u32..2 * c as u32).collect();
        edges.resize(2 * c, Vec::new());
        let sizes = vec![8u64; 2 * c];
        let roots = vec![
            root(RootKind::Global, "head", &[0]),
            root(
                RootKind::Global,
                "index",
                &(c as u32..2 * c as u32).collect::<Vec<_>>(),
            ),
        ];
        let g = Graph::from_lists(blocks(&sizes), &edges, roots);
        let (fast, walked) = (dominators(&g), dominators_within(&g, Some(u64::MAX)));
        assert_eq!(
            (&fast.idom, &fast.retained),
            (&walked.idom, &walked.retained)
        );
        assert_eq!(fast.retained[0], 8 * c as u64);
    }

    /// Lengauer–Tarjan against the definition on 3000 random small graphs.
    #[test]
    fn random_graphs_match_the_definition() {
        for seed in 1..=3000u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let g = random_graph(&mut rng, 14);
            let d = dominators(&g);
            let nv = naive(&g);
            assert_eq!(
                (&d.idom, &d.retained, &d.root_retained),
                (&nv.idom, &nv.retained, &nv.root_retained),
                "seed {seed}: graph {g:?}"
            );
        }
    }
}
