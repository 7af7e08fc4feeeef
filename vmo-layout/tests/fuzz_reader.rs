//! The reader treats a region as hostile input: for valid regions with random bytes changed,
//! truncated regions and random bytes behind a valid magic, it never panics, never loops
//! without bound and never allocates more than the region's size allows.
//!
//! Seeds: a region laid out and filled by the real writer (`seed()`), deterministic.
//! Run longer with `PROPTEST_CASES=100000 cargo test --release -p vmo-layout --test fuzz_reader`.

use proptest::prelude::*;
use std::sync::atomic::Ordering;
use vmo_layout::v1::{plan, Capacities, ModuleV1, SegmentV1, MODULE_LOADED};
use vmo_layout::{ProcessIdentity, Region, RegionWriter, SnapshotOptions};

const CAPS: Capacities = Capacities {
    nodes: 256,
    stacks: 64,
    frames: 1024,
    threads: 8,
    modules: 4,
};

/// A region written by the real writer: threads, live and freed blocks, stacks, a module.
fn seed() -> Vec<u64> {
    let (_, size) = plan(&CAPS);
    let mut buf = vec![0u64; size as usize / 8];
    let id = ProcessIdentity {
        pid: 42,
        start_ticks: 7,
        exe_dev: 1,
        exe_ino: 2,
        exe_path: b"/bin/seed",
        cmdline: b"seed\0--flag\0",
        sample_interval: 0,
    };
    // SAFETY: a zeroed, 8-aligned buffer of the planned size that nothing else touches.
    let w = unsafe { RegionWriter::create(buf.as_mut_ptr() as *mut u8, size, &CAPS, &id) }.unwrap();
    let t = w.claim_thread(9, b"main\0\0\0\0\0\0\0\0\0\0\0\0").unwrap();
    let s1 = w.append_stack(11, &[0x1000, 0x2000, 0x3000]).unwrap();
    let s2 = w.append_stack(12, &[0x4000]).unwrap();
    let (a, b) = w.claim_nodes(32).unwrap();
    for n in a..b {
        let stack = if n % 2 == 0 { s1 } else { s2 };
        w.publish_node(n as u32, 0x10_0000 + n * 64, 16 + n, stack, 9, 100 + n);
        w.count_alloc(stack, t as usize, 16 + n);
        if n % 3 == 0 {
            w.erase_node(n as u32, 1000 + n);
        }
    }
    // SAFETY: single writer.
    unsafe {
        w.with_modules(|table, count| {
            let m: &mut ModuleV1 = &mut table[0];
            m.base = 0x1000;
            m.state = MODULE_LOADED;
            m.path[..9].copy_from_slice(b"/bin/seed");
            m.path_len = 9;
            m.build_id[..4].copy_from_slice(&[1, 2, 3, 4]);
            m.build_id_len = 4;
            m.segments[0] = SegmentV1 {
                vaddr: 0,
                memsz: 0x5000,
                offset_flags: 1 << 56,
            };
            m.segment_count = 1;
            count.store(1, Ordering::Relaxed);
        })
    };
    w.set_state(vmo_layout::v1::STATE_READY);
    buf
}

/// Reads everything a collector reads; returns the number of live blocks.
fn read_all(bytes: &[u8]) -> Option<u64> {
    let r = Region::from_bytes(bytes).ok()?;
    let _ = r.info();
    let opts = SnapshotOptions {
        live: true,
        wait_timeout: std::time::Duration::from_millis(1),
        ..SnapshotOptions::default()
    };
    let meta = r.snapshot(&opts, |b| {
        let _ = (b.address, b.size);
    });
    assert!(
        meta.nodes_scanned <= bytes.len() as u64 / 40,
        "scanned more nodes than fit"
    );
    for id in 0..(r.stack_count() as u32 + 4) {
        if let Some(f) = r.stack(id) {
            assert!(f.len() <= vmo_layout::v1::MAX_FRAMES);
        }
        let _ = r.stack_totals(id);
    }
    assert!(r.threads().len() as u64 <= bytes.len() as u64 / 128);
    assert!(r.modules().len() as u64 <= bytes.len() as u64 / 1024);
    Some(meta.blocks)
}

fn as_bytes(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

/// `Region::from_bytes` needs 8-byte alignment: copy into a u64 buffer.
fn aligned(bytes: &[u8]) -> Vec<u64> {
    let mut v = vec![0u64; bytes.len().div_ceil(8)];
    // SAFETY: v has at least bytes.len() bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr() as *mut u8, bytes.len())
    };
    v
}

fn check(bytes: &[u8]) -> Option<u64> {
    let v = aligned(bytes);
    // SAFETY: viewing the u64 buffer as its bytes, truncated to the input length.
    let view = unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, bytes.len()) };
    read_all(view)
}

#[test]
fn seed_reads_back_exactly() {
    let s = as_bytes(&seed());
    // 32 blocks, every third erased (0, 3, …, 30: 11 of them).
    assert_eq!(check(&s), Some(21));
    // A misaligned view is refused, not read.
    let v = aligned(&[&[0u8][..], &s[..]].concat());
    // SAFETY: viewing the buffer's bytes from offset 1.
    let view = unsafe { std::slice::from_raw_parts((v.as_ptr() as *const u8).add(1), s.len()) };
    assert!(Region::from_bytes(view).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn mutated_regions_never_panic(muts in prop::collection::vec((0usize..1 << 20, any::<u8>()), 1..64),
                                   hot in prop::collection::vec((0usize..640, any::<u8>()), 0..16),
                                   cut in prop::option::of(0usize..1 << 20)) {
        let mut s = as_bytes(&seed());
        let len = s.len();
        for (off, b) in muts { s[off % len] = b; }
        // Mutations concentrated on the header's fields and section table.
        for (off, b) in hot { s[off] = b; }
        if let Some(c) = cut { s.truncate(c % (len + 1)); }
        let _ = check(&s);
    }

    #[test]
    fn random_bytes_behind_a_valid_magic_never_panic(body in prop::collection::vec(any::<u8>(), 0..70_000)) {
        let mut s = b"HEAPDUMP\x01\0\0\0\0\x10\0\0".to_vec();
        s.extend(body);
        let _ = check(&s);
    }
}
