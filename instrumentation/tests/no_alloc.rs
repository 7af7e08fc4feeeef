//! The recording path makes no allocation: neither through the Rust allocator (counted by the
//! inner allocator below, per thread) nor through libc's malloc (which would re-enter the shim
//! and be counted as a nested call).

use heapdump_instrumentation::state::{nested_calls, thread_recorded_allocations};
use heapdump_instrumentation::HeapdumpAlloc;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static CALLS: Cell<u64> = const { Cell::new(0) };
}

struct Counting;

// SAFETY: forwards to System unchanged; only counts calls on this thread.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        CALLS.with(|c| c.set(c.get() + 1));
        // SAFETY: caller's contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: caller's contract.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: HeapdumpAlloc<Counting> = HeapdumpAlloc::new(Counting);

#[test]
fn recording_path_allocates_nothing() {
    // Warm up: this thread registers (which may call libc) and its caches fill.
    for i in 0..1000 {
        drop(std::hint::black_box(Vec::<u8>::with_capacity(64 + i)));
    }
    let calls = CALLS.with(|c| c.get());
    let nested = nested_calls();
    let recorded = thread_recorded_allocations();
    const N: u64 = 100_000;
    for i in 0..N {
        drop(std::hint::black_box(Vec::<u8>::with_capacity(
            16 + (i as usize % 4000),
        )));
    }
    assert_eq!(
        CALLS.with(|c| c.get()) - calls,
        N,
        "allocations beyond the program's own"
    );
    assert_eq!(
        nested_calls() - nested,
        0,
        "the shim called malloc from inside itself"
    );
    assert_eq!(
        thread_recorded_allocations() - recorded,
        N,
        "every allocation recorded"
    );
}
