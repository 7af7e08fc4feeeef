//! Fuzzing (proptest) of the analyses a region feeds, as `vmo-layout/tests/fuzz_reader.rs`
//! fuzzes the reader itself: the reference graph (`graph::scan::build`, then leaks, paths and
//! dominators), block contents (`contents::read`) and moments (`moments::resolve`), on blocks
//! and named snapshots as a crafted or rewritten region can make them. Blocks go through
//! `vmo_layout::check::validate` first, as every snapshot's do; `contents::read` also gets
//! them unvalidated (it must not trust its caller either). Nothing may panic, and every
//! result must stay within what the input can describe.
//!
//! Run longer with `PROPTEST_CASES=10000 cargo test --release -p heapdump-collector --bin
//! heapdump fuzz`.

use crate::{contents, graph, moments};
use proptest::prelude::*;
use vmo_layout::{check, Block, NamedSnapshot, RegionInfo};

/// `PROPTEST_CASES` when set, else `default`.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Words of this process that crafted blocks may lie in, each a pointer to another word of
/// it (so that the scan finds edges), or a small number.
fn arena() -> &'static [u64] {
    static ARENA: std::sync::OnceLock<Vec<u64>> = std::sync::OnceLock::new();
    ARENA.get_or_init(|| {
        let mut v = vec![0u64; 1 << 13];
        let base = v.as_ptr() as u64;
        let n = v.len() as u64;
        for (i, w) in v.iter_mut().enumerate() {
            let i = i as u64;
            *w = if i.is_multiple_of(3) {
                i
            } else {
                base + ((i * 2_654_435_761) % n) * 8
            };
        }
        v
    })
}

/// A block as a crafted region can describe it: inside the arena (readable, pointing at its
/// neighbours), overlapping, of impossible size, wrapping, near null, or anywhere.
fn block() -> impl Strategy<Value = Block> {
    (0u8..8, any::<u64>(), any::<u64>(), 0u32..4).prop_map(|(kind, x, y, stack)| {
        let a = arena();
        let base = a.as_ptr() as u64;
        let len = a.len() as u64 * 8;
        let (address, size) = match kind {
            0..=2 => (base + (x % len) / 8 * 8, y % 512),
            3 => (base + (x % len), y % (len * 2)),
            4 => (x, y),
            5 => (u64::MAX - (x % 64), y % 64),
            6 => (
                base,
                [u64::MAX, 1 << 63, 1 << 30, 1 << 47][(y % 4) as usize],
            ),
            _ => (x % 8192, y % 8192),
        };
        Block {
            address,
            size,
            t_alloc: x % 1000,
            stack,
            thread: 1,
        }
    })
}

/// A named snapshot with crafted fields.
fn named() -> impl Strategy<Value = NamedSnapshot> {
    (0u32..8, 0u8..4, any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
        |(index, name, t, rt, lost)| NamedSnapshot {
            index,
            name: ["before", "after", "", "a@1"][name as usize].to_owned(),
            time_ns: [t, 0, u64::MAX, u64::MAX - 1][(t % 4) as usize],
            realtime_ns: rt,
            lost,
        },
    )
}

/// A `--named` / `--since` argument.
fn spec() -> impl Strategy<Value = Option<String>> {
    prop::option::of(
        prop_oneof![
            Just("before".to_owned()),
            Just("before@0".to_owned()),
            Just("before@2".to_owned()),
            Just("before@18446744073709551615".to_owned()),
            Just("a@1@1".to_owned()),
            Just("@".to_owned()),
            Just("1h".to_owned()),
            Just("0s".to_owned()),
            Just("584942417y".to_owned()),
            "[a-z@0-9]{0,12}",
        ]
        .boxed(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(48), ..ProptestConfig::default() })]

    /// The graph of validated blocks: every block kept, every edge and root in bounds, and
    /// leaks, paths and dominators computed over it without panicking.
    #[test]
    fn graph_of_crafted_blocks(blocks in prop::collection::vec(block(), 0..64)) {
        let mut v = blocks;
        check::validate(&mut v);
        let gb: Vec<graph::Block> = v
            .iter()
            .map(|b| graph::Block { address: b.address, size: b.size, stack: b.stack, thread: b.thread })
            .collect();
        let n = gb.len();
        let (g, stats) = graph::scan::build(
            std::process::id(),
            gb,
            &[],
            std::path::Path::new("/nonexistent/region"),
            &[],
            None,
            &|_| {},
        )
        .unwrap();
        prop_assert_eq!(g.blocks.len(), n);
        prop_assert!(stats.bytes_read <= check::USER_END);
        for i in 0..n as u32 {
            prop_assert!(g.edges(i).iter().all(|&t| (t as usize) < n));
        }
        for r in &g.roots {
            prop_assert!(r.targets.iter().all(|&t| (t as usize) < n));
        }
        let status = graph::leaks::classify(&g);
        prop_assert_eq!(status.len(), n);
        let tree = graph::paths::Tree::new(&g);
        for i in 0..n as u32 {
            let _ = tree.chain(i);
        }
        let folded = tree.fold(|r| r as u32, |b| b % 3);
        prop_assert_eq!(folded.of_block.len(), n);
        for i in 0..n as u32 {
            let s = folded.of_block[i as usize];
            if s != graph::paths::NONE {
                prop_assert!(!folded.chain(s).is_empty());
            }
        }
        let d = graph::dominators::dominators(&g);
        for i in 0..n as u32 {
            let _ = d.dominator(i);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(256), ..ProptestConfig::default() })]

    /// Contents of crafted blocks, validated or not: never a panic, never more than the caps
    /// allow, labels only for blocks asked about.
    #[test]
    fn contents_of_crafted_blocks(blocks in prop::collection::vec(block(), 0..64),
                                  validate in any::<bool>(),
                                  to_files in any::<bool>(),
                                  max_block in 1u64..100_000,
                                  max_total in 1u64..1_000_000) {
        let mut v = blocks;
        if validate {
            check::validate(&mut v);
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = to_files
            .then(|| contents::OutDir::prepare(&tmp.path().join("c")).unwrap());
        let req = contents::Request {
            dir: dir.as_ref().map(|_| tmp.path().join("c")),
            max_block,
            max_total,
            strings: true,
        };
        let out = contents::read(std::process::id(), &v, &req, dir.as_ref()).unwrap();
        prop_assert!(out.bytes <= max_total);
        prop_assert!(out.files <= v.len() as u64);
        prop_assert!(out.strings.len() <= v.len());
        prop_assert!(out.strings.values().all(|s| s.len() <= contents::STRING_MAX));
    }

    /// `--named` and `--since` over crafted named snapshots and header facts: a moment or a
    /// clean error.
    #[test]
    fn moments_of_crafted_named_snapshots(list in prop::collection::vec(named(), 0..8),
                                          at in spec(),
                                          since in spec(),
                                          pid in any::<u32>(),
                                          hold in any::<u64>()) {
        let info = RegionInfo { pid, named_hold_limit: hold, ..RegionInfo::default() };
        if let Ok(m) = moments::resolve(&info, &list, at.as_deref(), since.as_deref()) {
            if let Some(at) = m.at {
                prop_assert!(m.born_after < at || m.born_after == 0 || since.is_none());
            }
        }
    }
}
