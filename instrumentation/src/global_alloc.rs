//! [`HeapdumpAlloc`]: a `#[global_allocator]` that records every live allocation of a Rust
//! program into a heapdump region, forwarding the allocation itself to any inner
//! [`GlobalAlloc`] (the system allocator by default).

use crate::hooks::{record_alloc_from, record_free};
use crate::unwind::Start;
use crate::{frame_pointer, here};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, Ordering};

static MODULES_RECORDED: AtomicBool = AtomicBool::new(false);

/// Fills the module table once, after the first recorded allocation (a Rust program's first
/// allocation happens after the loader has finished, so `dl_iterate_phdr` is safe here).
#[inline]
fn record_modules_once() {
    if !MODULES_RECORDED.load(Ordering::Relaxed) && crate::state::global().is_some() {
        MODULES_RECORDED.store(true, Ordering::Relaxed);
        crate::state::refresh_modules();
        crate::state::register_fork_handlers();
    }
}

/// Records a block, unwinding from this function's own registers: whatever the compiler
/// inlined into our caller (the allocator, `__rust_alloc`, `RawVec`), the first frame is the
/// return address into the function that contains the allocation. With CFI unwinding (the
/// default) nothing needs frame pointers; the `fp` fallback uses this function's `rbp`.
#[inline(never)]
fn record(p: *mut u8, size: usize) {
    let fp = frame_pointer!();
    let (pc, sp) = here!();
    record_alloc_from(p, size, Start::Here { pc, sp, fp });
}

/// Records allocations made through `A`.
///
/// ```no_run
/// use heapdump_instrumentation::HeapdumpAlloc;
///
/// #[global_allocator]
/// static ALLOC: HeapdumpAlloc = HeapdumpAlloc::system();
/// ```
///
/// Stacks are unwound by CFI (`.eh_frame`) from this allocator's own registers: the program
/// and its dependencies need no frame pointers (`HEAPDUMP_UNWIND=fp` walks frame pointers
/// only, cheaper and complete only where every frame keeps one). A signal handler's
/// allocations made while its thread is inside this allocator are recorded when the
/// interrupted call ends; their frees are recorded then too, but the block is returned to `A`
/// at once (a `GlobalAlloc` free cannot be postponed without its layout).
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
        // SAFETY: forwarded with the caller's contract.
        let p = unsafe { self.inner.alloc(layout) };
        record(p, layout.size());
        record_modules_once();
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's contract.
        let p = unsafe { self.inner.alloc_zeroed(layout) };
        record(p, layout.size());
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
        let old = record_free(ptr);
        // SAFETY: forwarded with the caller's contract.
        let q = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if !q.is_null() {
            record(q, new_size);
        } else if old.is_some() {
            // The old block is still valid: record it again.
            record(ptr, layout.size());
        }
        q
    }
}
