//! A Rust program recorded through `#[global_allocator]`: `HeapdumpAlloc` wraps a counting
//! allocator that keeps the program's own tally of live blocks and bytes, so a snapshot can be
//! compared with exactly what the program allocated.
//!
//! Allocates 1000 × 1 KiB from `alloc_small`, 100 × 64 KiB from `alloc_medium` and 10 × 1 MiB
//! from `alloc_large` (grown by `Vec::reserve_exact` from 512 KiB), prints
//! `ready PID LIVE_BLOCKS LIVE_BYTES` and waits for stdin to close. Takes the named snapshot
//! `before-large` between the medium and the large blocks. Before that, `churn` allocates,
//! grows and frees 20,000 blocks, none of which is live at the snapshot.

use heapdump_instrumentation::state::inside_shim;
use heapdump_instrumentation::HeapdumpAlloc;
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What the program asked for, from a layout `HeapdumpAlloc` handed to `Counting` (each
/// block's header included).
fn requested(l: Layout) -> u64 {
    HeapdumpAlloc::<Counting>::requested(l) as u64
}

/// The system allocator, counting the program's live blocks and bytes (not the few the
/// recorder allocates for itself, e.g. its unwind tables: `inside_shim`).
struct Counting;
static LIVE_BLOCKS: AtomicU64 = AtomicU64::new(0);
static LIVE_BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to System unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: caller's contract.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() && !inside_shim() {
            LIVE_BLOCKS.fetch_add(1, Relaxed);
            LIVE_BYTES.fetch_add(requested(l), Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if !inside_shim() {
            LIVE_BLOCKS.fetch_sub(1, Relaxed);
            LIVE_BYTES.fetch_sub(requested(l), Relaxed);
        }
        // SAFETY: caller's contract.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        // SAFETY: caller's contract.
        let q = unsafe { System.realloc(p, l, n) };
        if !q.is_null() && !inside_shim() {
            // `n` is the new inner size: the header's room (the alignment) included.
            LIVE_BYTES.fetch_add((n - l.align()) as u64, Relaxed);
            LIVE_BYTES.fetch_sub(requested(l), Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOC: HeapdumpAlloc<Counting> = HeapdumpAlloc::new(Counting);

#[inline(never)]
fn alloc_small(out: &mut Vec<Box<[u8]>>) {
    for _ in 0..1000 {
        out.push(vec![1u8; 1024].into_boxed_slice());
    }
}

/// Blocks allocated, grown (realloc) and freed: nothing of them is live afterwards, in the
/// sampling mode too (a sampled block's free must close its record).
#[inline(never)]
fn churn() {
    let mut grown: Vec<u64> = Vec::new();
    for i in 0..20_000usize {
        let v = vec![3u8; 1024 + i % 1024];
        std::hint::black_box(&v);
        grown.push(i as u64);
    }
    std::hint::black_box(&grown);
}

#[inline(never)]
fn alloc_medium(out: &mut Vec<Box<[u8]>>) {
    for _ in 0..100 {
        out.push(vec![0u8; 64 * 1024].into_boxed_slice());
    }
}

#[inline(never)]
fn alloc_large(out: &mut Vec<Vec<u8>>) {
    for _ in 0..10 {
        let mut v: Vec<u8> = Vec::with_capacity(512 * 1024);
        v.reserve_exact(1024 * 1024);
        v.resize(1024 * 1024, 2);
        out.push(v);
    }
}

fn main() {
    let mut small = Vec::with_capacity(1000);
    let mut medium = Vec::with_capacity(100);
    let mut large = Vec::with_capacity(10);
    churn();
    alloc_small(&mut small);
    alloc_medium(&mut medium);
    // A named snapshot: `heapdump snapshot --named before-large` gives the blocks live here.
    heapdump_instrumentation::take_named_snapshot("before-large");
    alloc_large(&mut large);
    // Report without allocating: a stack buffer and an unbuffered write to fd 1.
    let mut msg = [0u8; 96];
    let mut cur = std::io::Cursor::new(&mut msg[..]);
    let _ = writeln!(
        cur,
        "ready {} {} {}",
        std::process::id(),
        LIVE_BLOCKS.load(Relaxed),
        LIVE_BYTES.load(Relaxed)
    );
    let n = cur.position() as usize;
    let mut out = std::mem::ManuallyDrop::new(unsafe_stdout());
    let _ = out.write_all(&msg[..n]);
    let mut buf = [0u8; 16];
    let mut stdin = std::mem::ManuallyDrop::new(unsafe_stdin());
    while matches!(stdin.read(&mut buf), Ok(k) if k > 0) {}
    drop((small, medium, large));
}

fn unsafe_stdout() -> std::fs::File {
    use std::os::fd::FromRawFd;
    // SAFETY: fd 1 is open for the life of the process; ManuallyDrop keeps it from being closed.
    unsafe { std::fs::File::from_raw_fd(1) }
}

fn unsafe_stdin() -> std::fs::File {
    use std::os::fd::FromRawFd;
    // SAFETY: as for stdout.
    unsafe { std::fs::File::from_raw_fd(0) }
}
