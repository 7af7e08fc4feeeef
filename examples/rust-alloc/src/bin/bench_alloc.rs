//! Benchmark workload for the `#[global_allocator]` path: each thread keeps 10,000 live
//! `Vec<u8>` of random sizes (8 B – 64 KiB, log-uniform) reached through 16 call paths 2–24
//! frames deep, replacing one at random per operation.
//!
//! Usage: `bench_alloc THREADS OPS_PER_THREAD`. Run with `HEAPDUMP_DISABLE=1` for the baseline
//! (the wrapper then forwards straight to the system allocator).

use heapdump_instrumentation::HeapdumpAlloc;

#[global_allocator]
static ALLOC: HeapdumpAlloc = HeapdumpAlloc::system();

const LIVE: usize = 10_000;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[inline(never)]
fn leaf(size: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(size);
    v.push(1);
    v
}

#[inline(never)]
fn descend(depth: u32, size: usize) -> Vec<u8> {
    if depth == 0 {
        leaf(size)
    } else {
        std::hint::black_box(descend(depth - 1, size))
    }
}

fn work(seed: u64, ops: u64) -> u64 {
    let mut rng = Rng(seed | 1);
    let mut live: Vec<Vec<u8>> = (0..LIVE).map(|_| Vec::new()).collect();
    let mut sum = 0u64;
    for _ in 0..ops {
        let r = rng.next();
        let path = (r % 16) as u32; // 16 call paths, 2..=24 frames deep
        let size = 8usize << ((r >> 8) % 14); // 8 B .. 64 KiB
        let size = size + (r >> 20) as usize % size;
        let slot = (r >> 32) as usize % LIVE;
        live[slot] = descend(path * 22 / 15, size.min(64 << 10));
        sum = sum.wrapping_add(live[slot].capacity() as u64);
    }
    sum
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1);
    let ops: u64 = args
        .get(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let handles: Vec<_> = (0..threads)
        .map(|t| std::thread::spawn(move || work(0x9E37_79B9 + t, ops)))
        .collect();
    let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    println!("{total}");
}
