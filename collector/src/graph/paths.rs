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

    /// The chain from a root down to block `b` (inclusive), or `None` if unreachable.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Block, Root, RootKind};

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
