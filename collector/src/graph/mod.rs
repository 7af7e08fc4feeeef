//! The heap reference graph: live blocks as nodes, pointers between them as edges, and the
//! roots that hold blocks from outside the heap (global variables, thread stacks, TLS,
//! mappings the program manages itself).
//!
//! A graph is built from one snapshot of a running process (`scan`): the live blocks of the
//! region at instant `T`, their contents read from the target afterwards, and the roots found
//! from `/proc/PID/maps`. An edge is an 8-byte-aligned word whose value falls inside a live
//! block (its start or any interior byte), as LeakSanitizer and Boehm's collector count them.
//!
//! Modules: `scan` (reading contents and roots, finding edges), `leaks` (reachability, direct
//! and indirect leaks), `dominators` (dominator tree, retained sizes), `heapsnapshot` (Chrome
//! DevTools' `.heapsnapshot` writer).

pub mod capture;
pub mod dominators;
pub mod heapsnapshot;
pub mod leaks;
pub mod paths;
pub mod recheck;
pub mod scan;
pub mod stop;

/// One live block: a node of the graph. Blocks are sorted by address and do not overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Address of the block in the target.
    pub address: u64,
    /// Requested size, bytes.
    pub size: u64,
    /// Stack trace id in the region (`u32::MAX`: none recorded).
    pub stack: u32,
    /// OS thread id of the allocating thread.
    pub thread: u32,
}

/// Where a root is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RootKind {
    /// A writable segment of a loaded module (`.data`, `.bss`): global and static variables.
    Global,
    /// A thread's stack, from its stack pointer region to its top (glibc keeps a thread's
    /// static TLS at the top of its stack: scanned with it).
    Stack,
    /// A thread's registers (only with `--stop`, when the threads are frozen).
    Registers,
    /// A writable mapping that holds no heap block (memory the program `mmap`s and manages).
    Mapping,
}

/// A root: a named place outside the heap and the blocks it points to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    /// What kind of place.
    pub kind: RootKind,
    /// Its name: the data symbol covering the word (`g_sessions (server)`), the thread
    /// (`stack of worker (1234)`), the mapping (`[anon 0x7f…]`).
    pub name: String,
    /// Indices into [`Graph::blocks`] of the blocks it points to (sorted, no duplicates).
    pub targets: Vec<u32>,
}

/// The reference graph of one snapshot, in compressed sparse row form.
///
/// Edges of block `i` are `targets[edge_start[i] as usize..edge_start[i + 1] as usize]`
/// (indices into `blocks`, sorted, no duplicates; a block may point to itself).
/// `edge_start.len() == blocks.len() + 1`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Graph {
    /// The live blocks, sorted by address.
    pub blocks: Vec<Block>,
    /// CSR offsets into `targets`, one per block plus one.
    pub edge_start: Vec<u32>,
    /// Edge targets.
    pub targets: Vec<u32>,
    /// The roots.
    pub roots: Vec<Root>,
}

impl Graph {
    /// Per block (a bit set: block `b` is bit `b % 64` of word `b / 64`), whether a chain of
    /// pointers from a root reaches it.
    pub fn reachable(&self) -> Vec<u64> {
        let n = self.blocks.len();
        let mut seen = vec![0u64; n.div_ceil(64)];
        let mut stack: Vec<u32> = Vec::new();
        let visit = |b: u32, seen: &mut [u64], stack: &mut Vec<u32>| {
            if (b as usize) < n && seen[b as usize / 64] & (1 << (b % 64)) == 0 {
                seen[b as usize / 64] |= 1 << (b % 64);
                stack.push(b);
            }
        };
        for r in &self.roots {
            for &t in &r.targets {
                visit(t, &mut seen, &mut stack);
            }
        }
        while let Some(b) = stack.pop() {
            for &t in self.edges(b) {
                visit(t, &mut seen, &mut stack);
            }
        }
        seen
    }

    /// The blocks block `i` points to.
    pub fn edges(&self, i: u32) -> &[u32] {
        let (a, b) = (
            self.edge_start[i as usize] as usize,
            self.edge_start[i as usize + 1] as usize,
        );
        &self.targets[a..b]
    }

    /// Builds a graph from blocks and per-block edge lists (tests and hand-made graphs).
    #[cfg(test)]
    pub fn from_lists(blocks: Vec<Block>, edges: &[Vec<u32>], roots: Vec<Root>) -> Graph {
        assert_eq!(blocks.len(), edges.len());
        let mut edge_start = Vec::with_capacity(blocks.len() + 1);
        let mut targets = Vec::new();
        edge_start.push(0);
        for e in edges {
            let mut e = e.clone();
            e.sort_unstable();
            e.dedup();
            targets.extend_from_slice(&e);
            edge_start.push(targets.len() as u32);
        }
        Graph {
            blocks,
            edge_start,
            targets,
            roots,
        }
    }
}
