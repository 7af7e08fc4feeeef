//! Named snapshots in the region: the writer's protocol (`take_named_snapshot`, `stamp`) and
//! the reader's `at` / `born_after`, on a region laid out in memory.

use vmo_layout::v1::{plan, section, Capacities, HeaderV1};
use vmo_layout::{ProcessIdentity, Region, RegionWriter, SnapshotOptions};

const CAPS: Capacities = Capacities {
    nodes: 64,
    stacks: 4,
    frames: 64,
    threads: 2,
    modules: 1,
    named: 4,
    python_words: 64,
};

fn region() -> (Vec<u64>, RegionWriter, u64) {
    let (_, size) = plan(&CAPS);
    let mut buf = vec![0u64; size as usize / 8];
    let id = ProcessIdentity {
        pid: 1,
        start_ticks: 1,
        exe_dev: 0,
        exe_ino: 0,
        exe_path: b"/x",
        cmdline: b"x",
        sample_interval: 0,
    };
    // SAFETY: a zeroed, 8-aligned buffer of the planned size that nothing else touches; the
    // Vec's heap buffer does not move when the Vec is returned.
    let w = unsafe { RegionWriter::create(buf.as_mut_ptr() as *mut u8, size, &CAPS, &id) }.unwrap();
    (buf, w, size)
}

fn bytes(buf: &[u64]) -> &[u8] {
    // SAFETY: a u64 slice viewed as bytes, same length in bytes, read-only.
    unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, buf.len() * 8) }
}

/// Addresses of the blocks a snapshot with `at` / `born_after` reports (exited-style read).
fn blocks(buf: &[u64], at: Option<u64>, born_after: u64) -> Vec<u64> {
    let r = Region::from_bytes(bytes(buf)).unwrap();
    let mut out = Vec::new();
    r.snapshot(
        &SnapshotOptions {
            at,
            born_after,
            ..Default::default()
        },
        |b| out.push(b.address),
    );
    out.sort_unstable();
    out
}

#[test]
fn named_instant_stamps_and_reading() {
    let (buf, w, _) = region();
    let (a, _) = w.claim_nodes(8).unwrap();
    let a = a as u32;
    // Before any named snapshot, stamps are the clock readings.
    assert_eq!(w.stamp(100), (100, 0));
    w.publish_node(a, 0x1000, 8, 0, 1, 10);
    w.publish_node(a + 1, 0x2000, 8, 0, 1, 20);
    assert!(w.take_named_snapshot(b"first").is_some());
    let n = Region::from_bytes(bytes(&buf)).unwrap().named_snapshots();
    assert_eq!(n.len(), 1);
    assert_eq!(n[0].name, "first");
    let t1 = n[0].time_ns;
    assert!(t1 > 20);
    // An event in the same tick (a clock reading <= t1) is stamped just after it.
    assert_eq!(w.stamp(t1), (t1 + 1, t1));
    assert_eq!(w.stamp(t1 - 5), (t1 + 1, t1));
    assert_eq!(w.stamp(t1 + 9), (t1 + 9, t1));
    // A free after the snapshot, in the same tick: the block was live at it.
    let (s, _) = w.stamp(t1);
    w.erase_node(a, s);
    // A block allocated after it, in the same tick.
    let (s2, _) = w.stamp(t1);
    w.publish_node(a + 2, 0x3000, 8, 0, 1, s2);
    // A second named snapshot in the same tick comes after those events.
    assert!(w.take_named_snapshot(b"second").is_some());
    let n = Region::from_bytes(bytes(&buf)).unwrap().named_snapshots();
    let t2 = n[1].time_ns;
    // (Events between the two are stamped t1 + 1 = t2: allocations before it count as live
    // at it, frees before it as gone — intervals are half-open.)
    assert_eq!(t2, s2);
    assert_eq!(w.stamp(t2).0, t2 + 1);

    assert_eq!(blocks(&buf, Some(t1), 0), [0x1000, 0x2000]);
    assert_eq!(blocks(&buf, Some(t2), 0), [0x2000, 0x3000]);
    assert_eq!(blocks(&buf, Some(t2), t1), [0x3000]);
    assert_eq!(blocks(&buf, None, t1), [0x3000]);
    assert_eq!(blocks(&buf, None, 0), [0x2000, 0x3000]);
}

#[test]
fn names_are_truncated_and_the_table_refuses_when_full() {
    let (buf, w, _) = region();
    let long = [b'x'; 200];
    assert_eq!(w.take_named_snapshot(&long), Some(0));
    for i in 1..4 {
        assert_eq!(w.take_named_snapshot(b"n"), Some(i));
    }
    assert_eq!(w.take_named_snapshot(b"over"), None);
    let r = Region::from_bytes(bytes(&buf)).unwrap();
    let n = r.named_snapshots();
    assert_eq!(n.len(), 4);
    assert_eq!(n[0].name.len(), 95);
    let info = r.info();
    assert_eq!((info.named_requested, info.named_capacity), (5, 4));
}

#[test]
fn a_region_without_the_named_section_is_read() {
    // A region of an older writer: six sections.
    let (mut buf, _w, _) = region();
    {
        // SAFETY: the buffer starts with the header; nothing else uses it now.
        let h = unsafe { &mut *(buf.as_mut_ptr() as *mut HeaderV1) };
        assert_eq!(h.sections[6].kind, section::NAMED);
        h.section_count = 6;
    }
    let r = Region::from_bytes(bytes(&buf)).unwrap();
    assert!(r.named_snapshots().is_empty());
    assert_eq!(r.info().named_capacity, 0);
}

#[test]
fn kept_records_are_counted_up_to_the_limit_then_reported_lost() {
    let (buf, w, _) = region();
    // SAFETY: not published yet, single thread.
    unsafe { w.set_named_hold_limit(100) };
    assert!(w.named_holding());
    assert!(w.add_named_held(64));
    assert!(w.named_holding());
    assert!(!w.add_named_held(64));
    assert!(!w.named_holding());
    w.take_named_snapshot(b"a");
    w.take_named_snapshot(b"b");
    let n = Region::from_bytes(bytes(&buf)).unwrap().named_snapshots();
    // A record born between the two is needed by "b" only.
    w.named_lost(n[0].time_ns + 1);
    w.named_lost(0);
    let n = Region::from_bytes(bytes(&buf)).unwrap().named_snapshots();
    assert_eq!((n[0].lost, n[1].lost), (1, 2));
}
