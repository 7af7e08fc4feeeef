//! A loom model of the insert/erase/recycle protocol (`writer.rs`) against a concurrent
//! snapshot reader (`reader.rs`), checking the consistency claim of ARCHITECTURE.md:
//! a snapshot shows exactly the blocks live at its time T — here, a writer that keeps one block
//! by "allocate the new block, then free the old one" is seen holding one or two blocks, never
//! zero, and never the same address twice — even when the writer recycles the nodes the
//! reader is scanning.
//!
//! The model mirrors the real orderings operation by operation, in the real order: an insert
//! chooses its node — checking the lease, with the time of the thread's previous operation —
//! before its operation window opens (`hooks::insert`, `state::take_node`), then reads its
//! timestamp and publishes the record inside the window; an erase closes the record inside
//! the window and recycles the node after it. The clock is an atomic counter
//! (`fetch_add`, SeqCst): strictly increasing and consistent with the SeqCst order, which is
//! what `clock::now_ns` plus the reader's spin past T provide on hardware.

use loom::sync::atomic::{fence, AtomicU64, Ordering::*};
use loom::sync::Arc;
use loom::thread;

const NONE: u64 = u64::MAX;
const NODES: usize = 4;

struct Node {
    address: AtomicU64,
    t_alloc: AtomicU64,
    t_free: AtomicU64,
}

/// `LEASE_NS` of the real writer: a lease older than this is treated as abandoned. The model's
/// clock never gets that far.
const LEASE: u64 = 30_000_000_000;

/// The writing thread's own state (`state::Tls`): its dead nodes, oldest first, the fresh nodes
/// it may still take, and the time of its last operation.
struct Writer {
    recycled: Vec<usize>,
    fresh: Vec<usize>,
    last_now: u64,
    /// Every operation's block address, timestamp and kind (true: allocation).
    events: Vec<(u64, u64, bool)>,
}

struct Region {
    /// Whether recycling asks the lease (the real writer always does; the negative control
    /// turns it off to show the model finds the race).
    check_lease: bool,
    /// The coarse clock of the real writer (`CLOCK_MONOTONIC_COARSE`): `clock` does not move,
    /// so events of one tick share a reading, and writers stamp after `lease_last`
    /// (`RegionWriter::stamp`'s floor, `FLAG_LEASE_FLOOR`); the reader stores `lease_last`
    /// too, after the lease — or before it when `lease_last_first` (the order before
    /// 2026-11-25, the negative control). Off: the counter clock of the other models.
    coarse: bool,
    lease_last_first: bool,
    lease_last: AtomicU64,
    clock: AtomicU64,
    lease: AtomicU64,
    /// `HeaderV1::lease_scanned_for` and `lease_scanned`: the reader's published progress.
    scanned_for: AtomicU64,
    scanned: AtomicU64,
    /// `HeaderV1::lease_pinned` (one entry; `u64::MAX`: none) and `ThreadSlotV1::op_node`.
    pinned: AtomicU64,
    /// Negative control: 1 = recycling ignores `pinned`.
    ignore_pins: AtomicU64,
    op_node: AtomicU64,
    op_seq: AtomicU64,
    nodes: Vec<Node>,
}

impl Region {
    fn now(&self) -> u64 {
        if self.coarse {
            // Read-modify-writes (adding 0) stand for the x86-64 order the real code relies
            // on, which loom's AcqRel model of SeqCst does not give plain loads (see
            // `snapshot`).
            return self.clock.fetch_add(0, SeqCst);
        }
        self.clock.fetch_add(1, SeqCst) + 1
    }
    /// `RegionWriter::stamp`: the clock, or just after `lease_last` when it is not later.
    fn stamp(&self) -> u64 {
        let t = self.now();
        if !self.coarse {
            return t;
        }
        let floor = self.lease_last.fetch_add(0, SeqCst);
        if t <= floor {
            floor + 1
        } else {
            t
        }
    }
    fn op_begin(&self, node: usize) {
        self.op_node.store(node as u64, Release);
        let s = self.op_seq.load(Relaxed);
        self.op_seq.store(s | 1, SeqCst);
    }
    fn op_end(&self) {
        let s = self.op_seq.load(Relaxed);
        self.op_seq.store((s | 1) + 1, Release);
    }
    /// `RegionWriter::node_reusable(n, now)`: `now` is the caller's last timestamp (the real
    /// writer passes the time of its thread's previous operation, read before this one's
    /// window opens). There is no fork in the model, so `fork_lease` is always 0.
    fn reusable(&self, n: usize, now: u64) -> bool {
        let t_free = self.nodes[n].t_free.load(Relaxed);
        let lease = if self.check_lease {
            self.lease.load(SeqCst)
        } else {
            0
        };
        t_free != NONE
            && (lease == 0
                || t_free < lease
                || now.saturating_sub(lease) > LEASE
                // `RegionWriter::scanned_by`: nodes the reader has read may be rewritten.
                // A record born after the lease (= T) is reusable whether scanned or not.
                || (self.scanned_for.load(SeqCst) == lease
                    && ((n as u64) < self.scanned.load(SeqCst)
                        || self.nodes[n].t_alloc.load(Relaxed) > lease)
                    && (self.ignore_pins.load(Relaxed) == 1
                        || self.pinned.load(Acquire) != n as u64)))
    }
    /// `RegionWriter::publish_node`.
    fn publish(&self, n: usize, address: u64, t: u64) {
        let node = &self.nodes[n];
        node.t_alloc.store(NONE, Relaxed);
        fence(Release);
        node.address.store(address, Relaxed);
        node.t_free.store(NONE, Relaxed);
        node.t_alloc.store(t, Release);
    }
    /// `state::take_node`: a recyclable node (`recycled`, oldest first) the lease lets us
    /// rewrite, else a fresh one.
    fn take_node(&self, w: &mut Writer) -> usize {
        match w.recycled.first() {
            Some(&n) if self.reusable(n, w.last_now) => w.recycled.remove(0),
            _ => w.fresh.remove(0),
        }
    }
    /// `hooks::insert`, in its order: the node is chosen — with the lease check — before the
    /// operation window opens (the real writer then captures the stack and updates its private
    /// index); the timestamp is read and the record published inside the window.
    fn insert(&self, address: u64, w: &mut Writer) -> usize {
        let n = self.take_node(w);
        self.op_begin(n);
        let t = self.stamp();
        w.last_now = t;
        w.events.push((address, t, true));
        self.publish(n, address, t);
        self.op_end();
        n
    }
    /// `hooks::erase`: the record closed inside the window, the node recycled after it.
    fn erase(&self, n: usize, w: &mut Writer) {
        self.op_begin(n);
        let t = self.stamp();
        w.last_now = t;
        w.events
            .push((self.nodes[n].address.load(Relaxed), t, false));
        self.nodes[n].t_free.store(t, Release);
        self.op_end();
        w.recycled.push(n);
    }
    /// `Region::snapshot`: the addresses live at T. An operation in flight at T has its node
    /// pinned and read after the scan, once it has ended (the writer marks which node each
    /// window writes).
    fn snapshot(&self) -> (u64, Vec<u64>) {
        let lease = self.now();
        if self.coarse && self.lease_last_first {
            self.lease_last.swap(lease, SeqCst);
        }
        self.scanned.store(0, SeqCst);
        self.pinned.store(NONE, SeqCst);
        self.lease.store(lease, SeqCst);
        if self.coarse && !self.lease_last_first {
            self.lease_last.swap(lease, SeqCst);
        }
        // T = L if no clock reading happened since ours (the real reader: the coarse clock
        // still reads L after the lease is stored; its writers' `lease_last` floor stamps
        // every later event after L); only then are the progress rules enabled. Otherwise T
        // is read after the lease, and every later reading of the counter is larger.
        //
        // The check is a read-modify-write (adding 0): loom models SeqCst as AcqRel, which
        // allows store buffering (our lease store unseen by a writer whose counter read we do
        // not see either). The real reader's lease store is a locked instruction on x86-64,
        // globally visible before its clock read; an RMW that the writer's counter read then
        // reads from gives the model that order.
        let t = if self.clock.fetch_add(0, SeqCst) == lease {
            self.scanned_for.store(lease, SeqCst);
            lease
        } else {
            self.now()
        };
        let mut pin = None;
        let s = self.op_seq.load(SeqCst);
        if s & 1 == 1 {
            let n = self.op_node.load(Acquire);
            if self.op_seq.load(SeqCst) == s {
                pin = Some((s, n));
                self.pinned.store(n, Relaxed);
            }
        }
        fence(SeqCst);
        let judge = |node: &Node| -> Option<u64> {
            let a1 = node.t_alloc.load(Acquire);
            if a1 > t {
                return None;
            }
            let address = node.address.load(Relaxed);
            let t_free = node.t_free.load(Relaxed);
            fence(Acquire);
            if node.t_alloc.load(Relaxed) != a1 || t_free <= t {
                return None;
            }
            Some(address)
        };
        let mut live = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            // Progress after each node read (the real reader publishes every 1024 nodes).
            if pin.is_none_or(|(_, n)| n != i as u64) {
                live.extend(judge(node));
            }
            self.scanned.store(i as u64 + 1, Release);
        }
        if let Some((s, n)) = pin {
            while self.op_seq.load(Acquire) == s {
                thread::yield_now();
            }
            fence(Acquire);
            live.extend(judge(&self.nodes[n as usize]));
        }
        self.lease.store(0, SeqCst);
        self.scanned_for.store(0, SeqCst);
        self.scanned.store(0, SeqCst);
        self.pinned.store(NONE, SeqCst);
        (t, live)
    }
}

fn region(check_lease: bool) -> Arc<Region> {
    region_with(check_lease, false, false)
}

/// A region whose clock is `coarse` (see [`Region::coarse`]).
fn region_with(check_lease: bool, coarse: bool, lease_last_first: bool) -> Arc<Region> {
    let nodes = (0..NODES)
        .map(|_| Node {
            address: AtomicU64::new(0),
            t_alloc: AtomicU64::new(0),
            t_free: AtomicU64::new(0),
        })
        .collect();
    let r = Region {
        check_lease,
        coarse,
        lease_last_first,
        lease_last: AtomicU64::new(0),
        clock: AtomicU64::new(if coarse { 10 } else { 0 }),
        lease: AtomicU64::new(0),
        scanned_for: AtomicU64::new(0),
        scanned: AtomicU64::new(0),
        pinned: AtomicU64::new(NONE),
        ignore_pins: AtomicU64::new(0),
        op_node: AtomicU64::new(NONE),
        op_seq: AtomicU64::new(0),
        nodes,
    };
    // Block 0xA is live in node 0 before the threads start.
    let t = r.now();
    r.publish(0, 0xA, t);
    Arc::new(r)
}

/// What the snapshot of [`churn_against_a_snapshot`] must not see. The negative control checks
/// that loom finds the first one without the lease check.
const LOST: &str = "lost a block: the snapshot saw none";
const TOO_MANY: &str = "more than two blocks";
const TWICE: &str = "an address twice";
const NOT_ADJACENT: &str = "A and C at once";

/// The writer keeps one block by "new B, free A; new C (recycling A's node when allowed),
/// free B" while a reader snapshots.
fn churn_against_a_snapshot(check_lease: bool) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(move || {
        let r = region(check_lease);
        let w = {
            let r = r.clone();
            thread::spawn(move || {
                let mut w = Writer {
                    recycled: Vec::new(),
                    fresh: vec![1, 2],
                    last_now: 1,
                    events: Vec::new(),
                };
                let b = r.insert(0xB, &mut w);
                r.erase(0, &mut w);
                let _c = r.insert(0xC, &mut w);
                r.erase(b, &mut w);
            })
        };
        let (_, live) = r.snapshot();
        w.join().unwrap();
        assert!(!live.is_empty(), "{LOST}");
        assert!(live.len() <= 2, "{TOO_MANY}: {live:x?}");
        let mut d = live.clone();
        d.sort();
        d.dedup();
        assert_eq!(d.len(), live.len(), "{TWICE}: {live:x?}");
        // Only adjacent generations can be live together.
        assert!(
            !(live.contains(&0xA) && live.contains(&0xC)),
            "{NOT_ADJACENT}: {live:x?}"
        );
    });
}

#[test]
fn snapshot_sees_one_or_two_blocks_while_the_writer_churns_and_recycles() {
    churn_against_a_snapshot(true);
}

#[test]
fn without_the_lease_recycling_would_lose_a_block() {
    // Negative control: with recycling that ignores the lease, loom must find a snapshot that
    // misses the live block — proof the check matters and the model can see the race. Any
    // other failure (another assertion, a loom error) fails this test.
    let r = std::panic::catch_unwind(|| churn_against_a_snapshot(false));
    let payload = r.expect_err("loom found no lost block without the lease check");
    let msg = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("(not a string)");
    assert_eq!(
        msg, LOST,
        "the model failed otherwise than by losing a block"
    );
}

/// The writer allocates B, frees A and B, then allocates C and D (recycling A's and B's nodes
/// when the lease allows) while a reader snapshots: the snapshot is exactly the blocks whose
/// stamps say they were live at its T — with an operation in flight at T pinned and read
/// after the scan, and nodes the scan has passed recycled during it.
fn exact_against_the_stamps(check_pins: bool) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.check(move || {
        let r = region(true);
        if !check_pins {
            r.ignore_pins.store(1, SeqCst);
        }
        let w = {
            let r = r.clone();
            thread::spawn(move || {
                let mut w = Writer {
                    recycled: Vec::new(),
                    fresh: vec![1, 2, 3],
                    last_now: 1,
                    events: vec![(0xA, 1, true)],
                };
                let b = r.insert(0xB, &mut w);
                r.erase(0, &mut w);
                r.erase(b, &mut w);
                r.insert(0xC, &mut w);
                r.insert(0xD, &mut w);
                w.events
            })
        };
        let (t, mut live) = r.snapshot();
        let events = w.join().unwrap();
        let mut truth: Vec<u64> = Vec::new();
        for &(address, at, alloc) in &events {
            if alloc && at <= t {
                let freed = events
                    .iter()
                    .find(|&&(a, ft, al)| !al && a == address && ft > at)
                    .map(|e| e.1);
                if freed.is_none_or(|f| f > t) {
                    truth.push(address);
                }
            }
        }
        live.sort();
        truth.sort();
        assert_eq!(live, truth, "{NOT_EXACT} at T = {t}: events {events:?}");
    });
}

const NOT_EXACT: &str = "snapshot differs from the blocks live at T";

#[test]
fn snapshot_is_exact_while_scanned_nodes_are_recycled() {
    exact_against_the_stamps(true);
}

#[test]
fn without_the_pins_recycling_a_scanned_node_would_lose_a_block() {
    // Negative control: a writer that ignores the reader's pins may rewrite the node of an
    // operation that was in flight at T before the reader reads it again.
    let r = std::panic::catch_unwind(|| exact_against_the_stamps(false));
    let payload = r.expect_err("loom found no inexact snapshot without the pins");
    let msg = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("(not a string)");
    assert!(msg.contains(NOT_EXACT), "failed otherwise: {msg}");
}

/// The writer keeps one block by "new B, free A; new C (recycling A's node when allowed),
/// free B" while a reader snapshots, with the real writer's coarse clock and `lease_last`
/// floor: whatever the interleaving, the snapshot holds the blocks the stamps say were live at
/// T — in particular never none.
fn floor_against_a_snapshot(lease_last_first: bool) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(move || {
        let r = region_with(true, true, lease_last_first);
        let w = {
            let r = r.clone();
            thread::spawn(move || {
                let mut w = Writer {
                    recycled: Vec::new(),
                    fresh: vec![1, 2],
                    last_now: 10,
                    events: vec![(0xA, 10, true)],
                };
                let b = r.insert(0xB, &mut w);
                r.erase(0, &mut w);
                r.insert(0xC, &mut w);
                r.erase(b, &mut w);
                w.events
            })
        };
        let (t, mut live) = r.snapshot();
        let events = w.join().unwrap();
        assert!(!live.is_empty(), "{LOST}");
        let mut truth: Vec<u64> = Vec::new();
        for &(address, at, alloc) in &events {
            if alloc && at <= t {
                let freed = events
                    .iter()
                    .find(|&&(a, ft, al)| !al && a == address && ft >= at)
                    .map(|e| e.1);
                if freed.is_none_or(|f| f > t) {
                    truth.push(address);
                }
            }
        }
        live.sort();
        truth.sort();
        assert_eq!(live, truth, "{NOT_EXACT} at T = {t}: events {events:?}");
    });
}

#[test]
fn snapshot_is_exact_with_the_coarse_clock_and_its_floor() {
    floor_against_a_snapshot(false);
}

#[test]
fn with_lease_last_stored_before_the_lease_a_block_is_lost() {
    // Negative control, the reader's order before 2026-11-25: a free stamped after T by the
    // floor while the same thread's next allocation still sees no lease and rewrites that
    // record. Loom must find the snapshot that misses the live block.
    let r = std::panic::catch_unwind(|| floor_against_a_snapshot(true));
    let payload = r.expect_err("loom found no lost block with lease_last stored first");
    let msg = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("(not a string)");
    assert!(
        msg == LOST || msg.contains(NOT_EXACT),
        "failed otherwise: {msg}"
    );
}
