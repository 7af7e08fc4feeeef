//! The CFI unwinder walks exactly the frames libgcc's unwinder walks (through the `backtrace`
//! crate), to the end of the thread's stack, including through Rust's std and glibc's thread
//! start, which have no frame pointers; the frame-pointer walk, on the same stack, stops early.

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
    // The two documented differences. At the leaf, libgcc's first frame is the pc inside
    // `capture` where the trace was taken, while our walk starts from `capture`'s frame
    // pointer, so our first frame is the return address into `level2`. At the root, libgcc
    // reports the outermost frame (`clone3`'s caller) with a pc of 0, where our walk stops.
    assert!(
        theirs.len() >= 2,
        "libgcc found {} frames: {theirs:#x?}",
        theirs.len()
    );
    let mut expected = theirs[1..].to_vec();
    while expected.last() == Some(&0) {
        expected.pop();
    }
    assert_eq!(
        ours, expected,
        "CFI walk (left) against libgcc's frames without its leaf and end marker (right)"
    );
    // level2, level1, the thread's closure, std's thread start, start_thread, clone3.
    assert!(ours.len() >= 6, "{} frames: {ours:#x?}", ours.len());
    // The thread's stack ends in code without frame pointers (std's thread start, glibc):
    // the CFI walk gets to its end, the frame-pointer walk does not.
    assert!(
        ours.len() > fp.len(),
        "CFI {} frames, FP {}",
        ours.len(),
        fp.len()
    );
    assert_eq!(
        fp,
        ours[..fp.len()],
        "the FP walk is a prefix of the CFI walk"
    );
}
