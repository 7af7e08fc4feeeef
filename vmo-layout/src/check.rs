//! Which blocks of a snapshot can be true.
//!
//! A region is written by the process it describes, which may be buggy or hostile, and may be
//! rewritten while it is read: a node's `address` and `size` are untrusted numbers. Before any
//! consumer (profile totals, contents, the reference graph) uses the blocks of a snapshot,
//! [`validate`] keeps only blocks that a real heap could hold at one instant:
//!
//! * the block `[address, address + max(size, 1))` lies inside the user address space
//!   (`[USER_START, USER_END)`), without overflow — so no block is larger than that space;
//! * no two blocks overlap (two live heap blocks never share a byte). The blocks are sorted by
//!   `(address, size, t_alloc, stack, thread)`, and of overlapping blocks the first in that
//!   order is kept: the result does not depend on the order of the nodes in the region.
//!
//! What is left is sorted by address and non-overlapping, so its total size is below
//! `USER_END` and no sum of sizes can wrap; everything else is counted in a [`Damage`].

use crate::reader::Block;

/// Lowest address a block may start at: page 0 is never mapped (`vm.mmap_min_addr`), so a
/// null or near-null address is no heap block.
pub const USER_START: u64 = 4096;

/// End of the user address space: 47-bit virtual addresses on x86-64 with 4-level paging
/// (the kernel maps user memory above 2^47 only for an `mmap` hint asking for it, which no
/// malloc does), 48-bit on aarch64.
#[cfg(not(target_arch = "aarch64"))]
pub const USER_END: u64 = 1 << 47;
/// See the x86-64 definition.
#[cfg(target_arch = "aarch64")]
pub const USER_END: u64 = 1 << 48;

/// Blocks of a snapshot that could not be true, and were left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Damage {
    /// Blocks not wholly inside `[USER_START, USER_END)` (sizes of 2^63, addresses near
    /// 2^64, address + size wrapping).
    pub out_of_range: u64,
    /// Blocks overlapping a block that was kept (the same address twice included).
    pub overlapping: u64,
    /// Up to [`Damage::EXAMPLES`] of the blocks left out, with why.
    pub examples: Vec<(Block, &'static str)>,
}

impl Damage {
    /// How many left-out blocks [`Damage::examples`] keeps.
    pub const EXAMPLES: usize = 3;

    /// Whether every block was kept.
    pub fn is_empty(&self) -> bool {
        self.out_of_range == 0 && self.overlapping == 0
    }

    /// Blocks left out.
    pub fn skipped(&self) -> u64 {
        self.out_of_range.saturating_add(self.overlapping)
    }

    /// Adds `other`'s counts (and examples, up to the limit).
    pub fn add(&mut self, other: &Damage) {
        self.out_of_range = self.out_of_range.saturating_add(other.out_of_range);
        self.overlapping = self.overlapping.saturating_add(other.overlapping);
        for e in &other.examples {
            if self.examples.len() < Self::EXAMPLES {
                self.examples.push(*e);
            }
        }
    }

    /// One line saying what was left out and why, e.g. "region damaged: 2002 of 2010 live
    /// records skipped (2 outside the user address space, 2000 overlapping another block;
    /// e.g. 0x7f00…+1073741824 bytes: overlaps another block)"; `live` is the number of live
    /// records read before validation.
    pub fn describe(&self, live: u64) -> String {
        let mut why = Vec::new();
        if self.out_of_range > 0 {
            why.push(format!(
                "{} outside the user address space or of impossible size",
                self.out_of_range
            ));
        }
        if self.overlapping > 0 {
            why.push(format!("{} overlapping another block", self.overlapping));
        }
        let eg: Vec<String> = self
            .examples
            .iter()
            .map(|(b, w)| format!("{:#x}+{} bytes: {w}", b.address, b.size))
            .collect();
        format!(
            "region damaged: {} of {live} live records skipped ({}; e.g. {})",
            self.skipped(),
            why.join(", "),
            eg.join("; ")
        )
    }

    fn note(&mut self, b: &Block, why: &'static str) {
        if self.examples.len() < Self::EXAMPLES {
            self.examples.push((*b, why));
        }
    }
}

/// End of `b` (exclusive): `address + max(size, 1)`, `None` if it wraps.
pub fn block_end(b: &Block) -> Option<u64> {
    b.address.checked_add(b.size.max(1))
}

/// Whether `b` lies wholly inside the user address space.
pub fn in_range(b: &Block) -> bool {
    b.address >= USER_START && block_end(b).is_some_and(|e| e <= USER_END)
}

/// Keeps the blocks of `blocks` that can be true (see the module docs), sorted by address,
/// and says what was left out. O(n log n) time, no memory besides the sort's.
pub fn validate(blocks: &mut Vec<Block>) -> Damage {
    validate_within(blocks, USER_END)
}

/// [`validate`], where no block may be larger than `max_size` bytes either: for a running
/// process, the most it had mapped (its `VmSize`) around the snapshot, which every live
/// block lies in.
pub fn validate_within(blocks: &mut Vec<Block>, max_size: u64) -> Damage {
    let mut damage = Damage::default();
    blocks.retain(|b| {
        if !in_range(b) {
            damage.out_of_range += 1;
            damage.note(b, "outside the user address space");
            return false;
        }
        if b.size > max_size {
            damage.out_of_range += 1;
            damage.note(b, "larger than all the memory the process has mapped");
            return false;
        }
        true
    });
    // By address (cheap), then each run of one address by the whole record (rare: only a
    // damaged region has two blocks at one address), so that which one is kept does not
    // depend on the nodes' order.
    blocks.sort_unstable_by_key(|b| b.address);
    let key = |b: &Block| (b.address, b.size, b.t_alloc, b.stack, b.thread);
    let mut i = 0;
    while i < blocks.len() {
        let a = blocks[i].address;
        let mut j = i + 1;
        while j < blocks.len() && blocks[j].address == a {
            j += 1;
        }
        if j - i > 1 {
            blocks[i..j].sort_unstable_by_key(key);
        }
        i = j;
    }
    let mut end = 0u64; // end of the last block kept
    blocks.retain(|b| {
        if b.address < end {
            damage.overlapping += 1;
            damage.note(b, "overlaps another block");
            return false;
        }
        end = b.address + b.size.max(1); // in range: no overflow
        true
    });
    damage
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(address: u64, size: u64, t_alloc: u64) -> Block {
        Block {
            address,
            size,
            t_alloc,
            stack: 0,
            thread: 1,
        }
    }

    #[test]
    fn keeps_sound_blocks_and_skips_impossible_ones() {
        let mut v = vec![
            b(0x2000, 16, 1),
            b(0x1000, 32, 2),
            b(0xffff_ffff_ffff_fff8, 16, 3), // wraps
            b(0x3000, u64::MAX, 4),          // impossible size
            b(0x4000, 1 << 63, 5),
            b(0x1000, 32, 6), // same address again
            b(0x1010, 8, 7),  // inside the block at 0x1000
            b(0x5000, 0, 8),  // malloc(0): one byte for overlap
            b(0x5000, 0, 9),  // the same address again
            b(0x0, 8, 10),    // null
            b(USER_END - 8, 8, 11),
            b(USER_END - 8, 9, 12), // one byte past the end
        ];
        let d = validate(&mut v);
        let kept: Vec<(u64, u64)> = v.iter().map(|b| (b.address, b.size)).collect();
        assert_eq!(
            kept,
            vec![(0x1000, 32), (0x2000, 16), (0x5000, 0), (USER_END - 8, 8)]
        );
        assert_eq!(
            v[0].t_alloc, 2,
            "the first of equal blocks in sort order is kept"
        );
        assert_eq!(d.out_of_range, 5);
        assert_eq!(d.overlapping, 3);
        assert_eq!(d.examples.len(), Damage::EXAMPLES);
        assert!(d
            .describe(12)
            .starts_with("region damaged: 8 of 12 live records skipped"));
    }

    #[test]
    fn no_block_larger_than_the_mapped_memory() {
        let mut v = vec![b(0x1000, 4096, 1), b(0x10000, 4097, 2), b(0x20000, 0, 3)];
        let d = validate_within(&mut v, 4096);
        assert_eq!(v.len(), 2);
        assert_eq!(d.out_of_range, 1);
        assert_eq!(
            d.examples[0].1,
            "larger than all the memory the process has mapped"
        );
    }

    #[test]
    fn order_of_the_nodes_does_not_matter() {
        let blocks: Vec<Block> = (0..50)
            .map(|i| b(0x10000 + (i % 7) * 24, 16 + (i % 5) * 8, i))
            .collect();
        let mut a = blocks.clone();
        let mut r = blocks;
        r.reverse();
        assert_eq!(validate(&mut a).skipped(), validate(&mut r).skipped());
        assert_eq!(a, r);
        for w in a.windows(2) {
            assert!(w[0].address + w[0].size.max(1) <= w[1].address);
        }
    }
}
