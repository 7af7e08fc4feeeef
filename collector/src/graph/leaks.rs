//! Leaks: the live blocks no chain of pointers from a root reaches, split as LeakSanitizer
//! splits them (`lsan_common.cpp`): an unreachable block that another unreachable block points
//! to is an *indirect* leak, the others are *direct* leaks. A block's pointer to itself does
//! not count (as in LeakSanitizer), so two blocks pointing at each other and nothing else are
//! both indirect.

use super::Graph;

/// What became of one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    /// Reachable from a root.
    Reachable,
    /// Unreachable, and no other unreachable block points to it.
    Direct,
    /// Unreachable, pointed to by another unreachable block.
    Indirect,
}

impl Status {
    /// `"direct"`, `"indirect"` or `"reachable"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Reachable => "reachable",
            Status::Direct => "direct",
            Status::Indirect => "indirect",
        }
    }
}

/// The status of every block of `g` (indexed like `g.blocks`).
///
/// Marks from every root's targets through the edges (iterative, a stack of block indices:
/// 4 bytes per block at most), then scans the unreachable blocks' edges once.
pub fn classify(g: &Graph) -> Vec<Status> {
    let n = g.blocks.len();
    let mut reached = vec![false; n];
    let mut stack: Vec<u32> = Vec::new();
    for r in &g.roots {
        for &t in &r.targets {
            if !reached[t as usize] {
                reached[t as usize] = true;
                stack.push(t);
            }
        }
    }
    while let Some(b) = stack.pop() {
        for &t in g.edges(b) {
            if !reached[t as usize] {
                reached[t as usize] = true;
                stack.push(t);
            }
        }
    }
    let mut status: Vec<Status> = reached
        .iter()
        .map(|&r| if r { Status::Reachable } else { Status::Direct })
        .collect();
    for b in 0..n as u32 {
        if reached[b as usize] {
            continue;
        }
        for &t in g.edges(b) {
            if t != b && !reached[t as usize] {
                status[t as usize] = Status::Indirect;
            }
        }
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Block, Root, RootKind};

    fn graph(n: usize, edges: &[(u32, u32)], roots: &[u32]) -> Graph {
        let blocks = (0..n)
            .map(|i| Block {
                address: 0x1000 * (i as u64 + 1),
                size: 16,
                stack: 0,
                thread: 0,
            })
            .collect();
        let mut lists = vec![Vec::new(); n];
        for &(a, b) in edges {
            lists[a as usize].push(b);
        }
        let roots = vec![Root {
            kind: RootKind::Global,
            name: "g".into(),
            targets: roots.to_vec(),
        }];
        Graph::from_lists(blocks, &lists, roots)
    }

    #[test]
    fn list_cycle_and_self_pointer() {
        use Status::*;
        // 0 (root) -> 1; list 2 -> 3 -> 4 (head lost); cycle 5 <-> 6; 7 points to itself;
        // 8 points into the reachable 1.
        let g = graph(
            9,
            &[(0, 1), (2, 3), (3, 4), (5, 6), (6, 5), (7, 7), (8, 1)],
            &[0],
        );
        assert_eq!(
            classify(&g),
            [
                Reachable, Reachable, Direct, Indirect, Indirect, Indirect, Indirect, Direct,
                Direct
            ]
        );
    }
}
