//! The CFI unwinder walks the same frames as libgcc's unwinder (through the `backtrace`
//! crate), including through Rust's std and the test harness, which have no frame pointers;
//! the frame-pointer walk, on the same stack, stops early.

use heapdump_instrumentation::{dwarf, frame_pointer, unwind};
use vmo_layout::v1::MAX_FRAMES;

#[inline(never)]
fn capture() -> (Vec<u64>, Vec<u64>, Vec<u64>) {
    let fp = frame_pointer!();
    let top = unwind::current_stack_bounds(false).1;
    let cache = dwarf::new_cache();
    let mut ours = [0u64; MAX_FRAMES];
    // SAFETY: the cache is ours; freed below.
    let n = dwarf::walk(fp, top, unsafe { &mut *cache }, &mut ours);
    // SAFETY: from new_cache, not used again.
    unsafe { dwarf::free_cache(cache) };
    let mut fp_frames = [0u64; MAX_FRAMES];
    let k = unwind::walk(fp, top, &mut fp_frames);
    let mut theirs = Vec::new();
    backtrace::trace(|f| {
        theirs.push(f.ip() as u64);
        true
    });
    (ours[..n].to_vec(), fp_frames[..k].to_vec(), theirs)
}

#[inline(never)]
fn level2() -> (Vec<u64>, Vec<u64>, Vec<u64>) {
    std::hint::black_box(capture())
}

#[inline(never)]
fn level1() -> (Vec<u64>, Vec<u64>, Vec<u64>) {
    std::hint::black_box(level2())
}

#[test]
fn cfi_walk_matches_libgcc() {
    dwarf::rebuild();
    // A thread of our own, so the stack top is known (not the main thread's).
    let (ours, fp, theirs) = std::thread::spawn(level1).join().unwrap();
    let start = theirs
        .iter()
        .position(|ip| *ip == ours[0])
        .unwrap_or_else(|| panic!("our first frame {:#x} not in {theirs:#x?}", ours[0]));
    let common = ours.len().min(theirs.len() - start);
    assert!(common >= 6, "only {common} frames in common");
    assert_eq!(
        ours[..common],
        theirs[start..start + common],
        "frames differ"
    );
    // The thread's stack ends in std's thread start code (no frame pointers): the CFI walk
    // gets there, the frame-pointer walk does not.
    assert!(
        ours.len() > fp.len(),
        "CFI {} frames, FP {}",
        ours.len(),
        fp.len()
    );
}
