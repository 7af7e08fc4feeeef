//! The collector's allocator: the system allocator, with large blocks backed by transparent
//! huge pages.
//!
//! The graph analyses index arrays of tens or hundreds of MiB at random places (the scan's
//! block lookup, the dominator tree's depth-first search and forest). With 4 KiB pages nearly
//! every such access is also a TLB miss, and in a virtual machine a TLB miss walks two page
//! tables: on 10 M blocks the dominator tree took 19 s with 4 KiB pages and 12 s with 2 MiB
//! ones. Most systems leave transparent huge pages to `madvise` (the default of
//! `/sys/kernel/mm/transparent_hugepage/enabled` in Debian and Ubuntu), so allocations of
//! [`HUGE_FROM`] bytes or more are advised `MADV_HUGEPAGE` (a hint: ignored where huge pages
//! are off). A wrapper of a few lines rather than an allocator crate (jemalloc's `thp:always`,
//! mimalloc's large OS pages): those would add a C build to every build for this one hint.

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations at least this large (bytes) are advised to use huge pages: glibc serves them
/// with their own `mmap`, so the advice covers the block and nothing else.
pub const HUGE_FROM: usize = 4 << 20;

/// [`System`] plus `MADV_HUGEPAGE` on large blocks.
pub struct HugeAlloc;

fn advise(p: *mut u8, size: usize) {
    if p.is_null() || size < HUGE_FROM {
        return;
    }
    // Whole 2 MiB pages inside the block only.
    let start = (p as usize + (2 << 20) - 1) & !((2 << 20) - 1);
    let end = (p as usize + size) & !((2 << 20) - 1);
    if end > start {
        // SAFETY: the range lies inside a block the system allocator just handed out (and
        // that no one else uses yet); MADV_HUGEPAGE changes no content and fails harmlessly.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

// SAFETY: every method forwards to `System` with the same arguments and returns its result;
// `advise` only adds a hint on memory of the returned block.
unsafe impl GlobalAlloc for HugeAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as received.
        let p = unsafe { System.alloc(layout) };
        advise(p, layout.size());
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as received.
        let p = unsafe { System.alloc_zeroed(layout) };
        advise(p, layout.size());
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as received.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if new_size > layout.size() {
            advise(p, new_size);
        }
        p
    }
}
