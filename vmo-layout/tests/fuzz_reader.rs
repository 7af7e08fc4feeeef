//! The reader treats a region as hostile input: for valid regions with random bytes changed,
//! truncated regions and random bytes behind a valid magic, it never panics, never loops
//! without bound and never allocates more than the region's size allows; and every snapshot
//! (also at a named snapshot's instant and "born since" it: the moments paths) passes through
//! `check::validate` to blocks that are sorted, in the address space and disjoint.
//!
//! Seeds: a region laid out and filled by the real writer (`seed()`), deterministic.
//! Run longer with `PROPTEST_CASES=100000 cargo test --release -p vmo-layout --test fuzz_reader`.

use proptest::prelude::*;
use std::sync::atomic::Ordering;
use vmo_layout::v1::{plan, Capacities, ModuleV1, SegmentV1, MODULE_LOADED};
use vmo_layout::{check, Block, ProcessIdentity, Region, RegionWriter, SnapshotOptions};

const CAPS: Capacities = Capacities {
    nodes: 256,
    stacks: 64,
    frames: 1024,
    threads: 8,
    modules: 4,
    named: 4,
    python_words: 64,
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
    let t = w
        .claim_thread(9, b"main\0\0\0\0\0\0\0\0\0\0\0\0", (0, 0))
        .unwrap();
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
    let mut blocks = Vec::new();
    let meta = r.snapshot(&opts, |b| blocks.push(*b));
    assert!(
        meta.nodes_scanned <= bytes.len() as u64 / 40,
        "scanned more nodes than fit"
    );
    let live = blocks.len() as u64;
    valid_blocks(blocks);
    // The moments paths: blocks live at each named snapshot's instant, and born after it.
    for s in r.named_snapshots().into_iter().take(8) {
        for (at, born_after) in [(Some(s.time_ns), 0), (None, s.time_ns)] {
            let mut blocks = Vec::new();
            let o = SnapshotOptions {
                at,
                born_after,
                ..opts
            };
            r.snapshot(&o, |b| blocks.push(*b));
            valid_blocks(blocks);
        }
    }
    for id in 0..(r.stack_count() as u32 + 4) {
        if let Some(f) = r.stack(id) {
            assert!(f.len() <= vmo_layout::v1::MAX_FRAMES);
            // Python frames name code records: each is read with its bounds checked.
            for w in f {
                if let Some(c) = r.python_code(w) {
                    assert!(c.linetable.len() as u64 <= bytes.len() as u64);
                }
            }
        }
        // And records anywhere in the section.
        for i in 0..64u64 {
            let _ = r.python_code(vmo_layout::v1::PYTHON_FRAME | i << 32);
        }
        let _ = r.stack_totals(id);
    }
    assert!(r.threads().len() as u64 <= bytes.len() as u64 / 128);
    assert!(r.modules().len() as u64 <= bytes.len() as u64 / 1024);
    Some(live)
}

/// What every consumer of a snapshot relies on after `check::validate`: blocks sorted, inside
/// the user address space, not overlapping, so that no total of their sizes can wrap; and
/// every block either kept or counted as damage.
fn valid_blocks(mut blocks: Vec<Block>) {
    let n = blocks.len() as u64;
    let damage = check::validate(&mut blocks);
    assert_eq!(blocks.len() as u64 + damage.skipped(), n);
    assert!(damage.examples.len() <= check::Damage::EXAMPLES);
    let mut total = 0u64;
    let mut end = 0u64;
    for b in &blocks {
        assert!(check::in_range(b), "{b:?}");
        assert!(b.address >= end, "overlap at {b:?}");
        end = check::block_end(b).unwrap();
        total = total.checked_add(b.size).unwrap();
    }
    assert!(total <= check::USER_END);
    if !damage.is_empty() {
        assert!(damage.describe(n).starts_with("region damaged: "));
    }
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

    /// The records' address and size words set to extremes, small numbers or each other's:
    /// impossible sizes, wrapping ends, blocks at one address and overlapping ones.
    #[test]
    fn crafted_addresses_and_sizes_are_validated(
        words in prop::collection::vec((0usize..32, any::<bool>(), 0u8..6, any::<u64>()), 1..48)) {
        let mut v = seed();
        let (sections, _) = plan(&CAPS);
        // The allocations section's offset, in words (records are 5 words).
        let at = sections[section_index(vmo_layout::v1::section::ALLOCATIONS)].offset as usize / 8;
        for (node, size, kind, x) in words {
            let w = at + node * 5 + size as usize;
            v[w] = match kind {
                0 => x,
                1 => u64::MAX - (x % 64),
                2 => 1 << 63,
                3 => 0x10_0000 + (x % 4096),
                4 => v[at + ((x % 32) as usize) * 5 + size as usize],
                _ => x % (1 << 30),
            };
        }
        let _ = check(&as_bytes(&v));
    }

    #[test]
    fn random_bytes_behind_a_valid_magic_never_panic(body in prop::collection::vec(any::<u8>(), 0..70_000)) {
        let mut s = b"HEAPDUMP\x01\0\0\0\0\x10\0\0".to_vec();
        s.extend(body);
        let _ = check(&s);
    }
}

/// A region laid out by the real writer in a sparse memfd (tmpfs: reading a hole through a
/// mapping would allocate a page) with capacities far beyond what it holds.
struct Sparse {
    fd: std::os::fd::OwnedFd,
    base: *mut u8,
    len: u64,
}

impl Drop for Sparse {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping made in `sparse`, which nothing uses any more.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len as usize) };
    }
}

impl Sparse {
    /// Bytes of the file actually allocated.
    fn committed(&self) -> u64 {
        use std::os::fd::AsRawFd;
        // SAFETY: a zeroed stat is valid; fstat on our own descriptor.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::fstat(self.fd.as_raw_fd(), &mut st) }, 0);
        st.st_blocks as u64 * 512
    }
}

/// Huge capacities (about 60 GiB of sparse file): 1 G records, 16 M modules (the 94 GB
/// allocation of issue 8 was `module_count` × sizeof(Module) over such a capacity).
const HUGE: Capacities = Capacities {
    nodes: 1 << 30,
    stacks: 1 << 24,
    frames: 1 << 26,
    threads: 1 << 22,
    modules: 1 << 24,
    named: 1 << 20,
    python_words: 1 << 20,
};

fn sparse() -> Sparse {
    use std::os::fd::{AsRawFd, FromRawFd};
    let (_, size) = plan(&HUGE);
    // SAFETY: memfd_create with a NUL-terminated name; the descriptor is owned below.
    let fd = unsafe { libc::memfd_create(c"heapdump-fuzz".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: `fd` is a fresh descriptor we own.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate and mmap on our own descriptor; the mapping is checked below.
    let base = unsafe {
        assert_eq!(libc::ftruncate(fd.as_raw_fd(), size as libc::off_t), 0);
        libc::mmap(
            std::ptr::null_mut(),
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_NORESERVE,
            fd.as_raw_fd(),
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    let base = base as *mut u8;
    let id = ProcessIdentity {
        pid: 42,
        start_ticks: 7,
        exe_dev: 1,
        exe_ino: 2,
        exe_path: b"/bin/sparse",
        cmdline: b"sparse\0",
        sample_interval: 0,
    };
    // SAFETY: a fresh, zero-filled shared mapping of the planned size that nothing else uses.
    let w = unsafe { RegionWriter::create(base, size, &HUGE, &id) }.unwrap();
    let t = w
        .claim_thread(9, b"main\0\0\0\0\0\0\0\0\0\0\0\0", (0, 0))
        .unwrap();
    let s1 = w.append_stack(11, &[0x1000, 0x2000]).unwrap();
    let (a, b) = w.claim_nodes(32).unwrap();
    for n in a..b {
        w.publish_node(n as u32, 0x10_0000 + n * 64, 16, s1, 9, 100 + n);
        w.count_alloc(s1, t as usize, 16);
    }
    w.set_state(vmo_layout::v1::STATE_READY);
    Sparse {
        fd,
        base,
        len: size,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Counts up to u64::MAX over huge sparse sections, and busy thread slots: the reader
    /// allocates and commits nothing the file does not hold, and waits once, not per slot.
    #[test]
    fn crafted_counts_over_sparse_sections_cost_nothing(
        counts in prop::collection::vec(prop_oneof![Just(u64::MAX), Just(1u64 << 40), any::<u64>(), 0u64..64], 5),
        busy in prop::collection::vec(0u64..(1 << 22), 0..64),
    ) {
        use vmo_layout::v1::HeaderV1;
        use std::os::fd::AsFd;
        let r = sparse();
        // SAFETY: the header lies at the start of the mapping; nothing else writes it now.
        let h = unsafe { &*(r.base as *const HeaderV1) };
        h.node_cursor.store(counts[0], Ordering::Relaxed);
        h.stack_count.store(counts[1], Ordering::Relaxed);
        h.frame_cursor.store(counts[2], Ordering::Relaxed);
        h.thread_count.store(counts[3], Ordering::Relaxed);
        h.module_count.store(counts[4], Ordering::Relaxed);
        let threads_at = vmo_layout::v1::plan(&HUGE).0[section_index(5)].offset;
        for &slot in &busy {
            // SAFETY: op_seq of slot `slot`, inside the threads section of the mapping.
            let op = unsafe { &*(r.base.add((threads_at + slot * 128) as usize) as *const std::sync::atomic::AtomicU64) };
            op.store(1, Ordering::Relaxed);
        }
        let before = r.committed();
        let started = std::time::Instant::now();
        // SAFETY: the mapping lives as long as `r`, writable and shared.
        let region = unsafe { Region::from_raw(r.base, r.len, true) }.unwrap().with_file(r.fd.as_fd());
        let _ = region.info();
        let meta = region.snapshot(&SnapshotOptions {
            live: true,
            wait_timeout: std::time::Duration::from_millis(20),
            ..SnapshotOptions::default()
        }, |_| {});
        prop_assert_eq!(meta.blocks, counts[0].min(32));
        let mut ids = Vec::new();
        region.for_each_stack_id(|id| ids.push(id));
        prop_assert!(ids.len() <= 4096 / 32 * 2, "{} stack ids read", ids.len());
        // Ids from crafted nodes may point anywhere: far into the holes too.
        ids.extend([0, 1 << 20, (1 << 24) - 1, u32::MAX]);
        let stacks = region.stacks(ids);
        prop_assert_eq!(stacks.len(), 1, "only the one real stack: {:?}", stacks);
        let totals = region.all_stack_totals();
        prop_assert!(totals.len() <= 1, "{:?}", totals);
        prop_assert!(region.threads().len() <= 32 + busy.len() * 32);
        prop_assert!(region.modules().is_empty());
        let took = started.elapsed();
        prop_assert!(took < std::time::Duration::from_secs(2), "took {:?}", took);
        prop_assert_eq!(r.committed(), before, "reading committed pages of the sparse file");
    }
}

/// Index in `plan()`'s output of section `kind`.
fn section_index(kind: u32) -> usize {
    kind as usize - 1
}
