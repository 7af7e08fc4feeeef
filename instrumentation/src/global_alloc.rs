//! [`HeapdumpAlloc`]: a `#[global_allocator]` that records every live allocation of a Rust
//! program into a heapdump region, forwarding the allocation itself to any inner
//! [`GlobalAlloc`] (the system allocator by default).

use crate::frame_pointer;
use crate::hooks::{record_alloc, record_free};
use std::alloc::{GlobalAlloc, Layout, System};

/// Records allocations made through `A`.
///
/// ```no_run
/// use heapdump_instrumentation::HeapdumpAlloc;
///
/// #[global_allocator]
/// static ALLOC: HeapdumpAlloc = HeapdumpAlloc::system();
/// ```
///
/// Stacks are taken by frame-pointer walk: build the program with
/// `RUSTFLAGS="-C force-frame-pointers=yes"` for complete stacks.
#[derive(Debug, Default, Clone, Copy)]
pub struct HeapdumpAlloc<A = System> {
    inner: A,
}

impl HeapdumpAlloc<System> {
    /// Wraps the system allocator.
    pub const fn system() -> Self {
        HeapdumpAlloc { inner: System }
    }
}

impl<A> HeapdumpAlloc<A> {
    /// Wraps `inner`.
    pub const fn new(inner: A) -> Self {
        HeapdumpAlloc { inner }
    }
}

// SAFETY: every method forwards to `inner` with the caller's arguments unchanged and returns
// its result; recording only reads the returned pointer.
unsafe impl<A: GlobalAlloc> GlobalAlloc for HeapdumpAlloc<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let fp = frame_pointer!();
        // SAFETY: forwarded with the caller's contract.
        let p = unsafe { self.inner.alloc(layout) };
        record_alloc(p, layout.size(), fp);
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let fp = frame_pointer!();
        // SAFETY: forwarded with the caller's contract.
        let p = unsafe { self.inner.alloc_zeroed(layout) };
        record_alloc(p, layout.size(), fp);
        p
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        record_free(ptr);
        // SAFETY: forwarded with the caller's contract.
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let fp = frame_pointer!();
        let old = record_free(ptr);
        // SAFETY: forwarded with the caller's contract.
        let q = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if !q.is_null() {
            record_alloc(q, new_size, fp);
        } else if old.is_some() {
            // The old block is still valid: record it again.
            record_alloc(ptr, layout.size(), fp);
        }
        q
    }
}
