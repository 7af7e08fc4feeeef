//! Shortest reference chains from the roots: a breadth-first tree over the graph, in which
//! every reachable block hangs from the first root or block that reached it (roots taken in
//! order: globals, then stacks, then mappings). Luau's reachability tool charges each object
//! to that first path; `retainers` and the ownership flame graph do the same.

use super::Graph;

/// The breadth-first tree: for each block, who reached it first.
#[derive(Debug, Clone)]
pub struct Tree {
    /// Per block: `< blocks.len()` the parent block, `NONE` unreachable, otherwise
    /// `blocks.len() + r` for root `r`.
    pub parent: Vec<u32>,
}

/// [`Tree::parent`] of an unreachable block.
pub const NONE: u32 = u32::MAX;

/// One step of a chain, from the root down.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Root index into `Graph::roots`.
    Root(usize),
    /// Block index into `Graph::blocks`.
    Block(u32),
}

impl Tree {
    /// Breadth-first from every root's targets (4 bytes per block, plus the queue).
    pub fn new(g: &Graph) -> Tree {
        let n = g.blocks.len();
        let mut parent = vec![NONE; n];
        let mut queue: std::collections::VecDeque<u32> = Default::default();
        for (r, root) in g.roots.iter().enumerate() {
            for &t in &root.targets {
                if parent[t as usize] == NONE {
                    parent[t as usize] = (n + r) as u32;
                    queue.push_back(t);
                }
            }
        }
        while let Some(b) = queue.pop_front() {
            for &t in g.edges(b) {
                if parent[t as usize] == NONE {
                    parent[t as usize] = b;
                    queue.push_back(t);
                }
            }
        }
        Tree { parent }
    }

    /// The chain from a root down to block `b` (inclusive), or `None` if unreachable (the
    /// tests' reference for [`Tree::fold`]).
    #[cfg(test)]
    pub fn chain(&self, b: u32) -> Option<Vec<Step>> {
        let n = self.parent.len() as u32;
        let mut out = vec![Step::Block(b)];
        let mut at = b;
        loop {
            let p = self.parent[at as usize];
            if p == NONE {
                return None;
            }
            if p >= n {
                out.push(Step::Root((p - n) as usize));
                out.reverse();
                return Some(out);
            }
            out.push(Step::Block(p));
            at = p;
            if out.len() > self.parent.len() + 1 {
                return None; // cannot happen in a tree; a guard against a corrupt one
            }
        }
    }
}

/// The chains of every block, named and folded into a trie: a chain is its root's name, then
/// the names of the blocks along it, where a run of blocks of the same name (a linked list's
/// nodes, a tree's levels) is one step. Built in one pass over the tree, O(blocks): the chains
/// themselves, materialized for every block, take memory quadratic in a list's length (helper
/// Q, 1: 20,000 nodes of a list needed more than 6 GB).
#[derive(Debug, Clone, Default)]
pub struct Folded {
    /// Per block: its chain's last step (an index into `steps`), `NONE` when unreachable.
    pub of_block: Vec<u32>,
    /// The trie's steps.
    pub steps: Vec<FoldedStep>,
}

/// One step of a [`Folded`] chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FoldedStep {
    /// The step before it (`NONE`: this is a root).
    pub up: u32,
    /// Its name, as given by the caller's namer.
    pub name: u32,
    /// The longest run of blocks folded into it (1: no run; a root: 1).
    pub run: u32,
}

/// Steps [`Folded::chain`] shows at most: the first and last halves, with [`ELIDED`] between.
pub const MAX_SHOWN: usize = 64;

/// The name [`Folded::chain`] gives the steps it leaves out.
pub const ELIDED: u32 = u32::MAX;

impl Folded {
    /// The steps of chain `last` from its root: (name, run), at most [`MAX_SHOWN`] of them
    /// (the middle of a longer chain is one step named [`ELIDED`], its run the number left out).
    pub fn chain(&self, last: u32) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        let mut at = last;
        while at != NONE && (at as usize) < self.steps.len() && out.len() <= self.steps.len() {
            let s = self.steps[at as usize];
            out.push((s.name, s.run));
            at = s.up;
        }
        out.reverse();
        if out.len() > MAX_SHOWN {
            let (head, tail) = (MAX_SHOWN / 2, MAX_SHOWN / 2 - 1);
            let left_out = (out.len() - head - tail) as u32;
            let mut shown = out[..head].to_vec();
            shown.push((ELIDED, left_out));
            shown.extend_from_slice(&out[out.len() - tail..]);
            out = shown;
        }
        out
    }
}

impl Tree {
    /// Folds every block's chain (see [`Folded`]); `root_name(r)` and `block_name(b)` name the
    /// steps.
    pub fn fold(
        &self,
        mut root_name: impl FnMut(usize) -> u32,
        mut block_name: impl FnMut(u32) -> u32,
    ) -> Folded {
        const UNSET: u32 = u32::MAX - 1;
        let n = self.parent.len();
        let mut of_block = vec![UNSET; n];
        let mut run = vec![0u32; n];
        let mut steps: Vec<FoldedStep> = Vec::new();
        let mut index: std::collections::HashMap<(u32, u32), u32> = Default::default();
        let mut intern = |steps: &mut Vec<FoldedStep>, up: u32, name: u32| -> u32 {
            *index.entry((up, name)).or_insert_with(|| {
                steps.push(FoldedStep { up, name, run: 1 });
                (steps.len() - 1) as u32
            })
        };
        let mut pending: Vec<u32> = Vec::new();
        for b in 0..n as u32 {
            if of_block[b as usize] != UNSET {
                continue;
            }
            // Climb to a resolved block, a root or an unreachable block, then resolve down.
            let mut at = b;
            loop {
                pending.push(at);
                let p = self.parent[at as usize];
                if p == NONE
                    || p as usize >= n
                    || of_block[p as usize] != UNSET
                    || pending.len() > n
                {
                    break;
                }
                at = p;
            }
            while let Some(x) = pending.pop() {
                let p = self.parent[x as usize];
                let name = block_name(x);
                let (up, up_run) = if p == NONE {
                    of_block[x as usize] = NONE;
                    continue;
                } else if p as usize >= n {
                    let r = root_name(p as usize - n);
                    (intern(&mut steps, NONE, r), 0)
                } else {
                    match of_block[p as usize] {
                        NONE | UNSET => {
                            of_block[x as usize] = NONE; // a corrupt tree: treat as unreachable
                            continue;
                        }
                        s => (s, run[p as usize]),
                    }
                };
                if up_run > 0 && steps[up as usize].name == name {
                    let r = up_run.saturating_add(1);
                    of_block[x as usize] = up;
                    run[x as usize] = r;
                    let s = &mut steps[up as usize];
                    s.run = s.run.max(r);
                } else {
                    of_block[x as usize] = intern(&mut steps, up, name);
                    run[x as usize] = 1;
                }
            }
        }
        Folded { of_block, steps }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Block, Root, RootKind};

    #[test]
    fn a_list_folds_into_one_chain() {
        // Root 0 → block 0 → 1 → … → 9 (a list of one site), and block 10 of another site
        // hanging from block 4; block 11 unreachable.
        let mut parent: Vec<u32> = (0..10u32)
            .map(|i| if i == 0 { 12 } else { i - 1 })
            .collect();
        parent.push(4);
        parent.push(NONE);
        let t = Tree { parent };
        let f = t.fold(|r| 100 + r as u32, |b| if b == 10 { 2 } else { 1 });
        assert_eq!(f.of_block[11], NONE);
        let list = f.of_block[9];
        assert!((0..10).all(|b| f.of_block[b] == list));
        assert_eq!(f.chain(list), vec![(100, 1), (1, 10)]);
        assert_eq!(f.chain(f.of_block[10]), vec![(100, 1), (1, 10), (2, 1)]);
        // A chain longer than MAX_SHOWN steps (alternating names) is shown elided.
        let parent: Vec<u32> = (0..200u32)
            .map(|i| if i == 0 { 200 } else { i - 1 })
            .collect();
        let t = Tree { parent };
        let f = t.fold(|_| 7, |b| b % 2);
        let c = f.chain(f.of_block[199]);
        assert_eq!(c.len(), MAX_SHOWN);
        assert_eq!(c[MAX_SHOWN / 2], (ELIDED, 201 - (MAX_SHOWN as u32 - 1)));
    }

    #[test]
    fn shortest_chain_from_the_first_root() {
        let blocks: Vec<Block> = (0..5)
            .map(|i| Block {
                address: 0x100 * (i + 1),
                size: 8,
                stack: 0,
                thread: 0,
            })
            .collect();
        // root A -> 0 -> 1 -> 2; root B -> 2 directly; 3 -> 4 unreachable.
        let roots = vec![
            Root {
                kind: RootKind::Global,
                name: "A".into(),
                targets: vec![0],
            },
            Root {
                kind: RootKind::Stack,
                name: "B".into(),
                targets: vec![2],
            },
        ];
        let g = Graph::from_lists(blocks, &[vec![1], vec![2], vec![], vec![4], vec![]], roots);
        let t = Tree::new(&g);
        assert_eq!(
            t.chain(1),
            Some(vec![Step::Root(0), Step::Block(0), Step::Block(1)])
        );
        assert_eq!(t.chain(2), Some(vec![Step::Root(1), Step::Block(2)]));
        assert_eq!(t.chain(4), None);
    }
}
