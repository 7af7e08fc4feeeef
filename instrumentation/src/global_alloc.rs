//! [`HeapdumpAlloc`]: a `#[global_allocator]` that records every live allocation of a Rust
//! program into a heapdump region, forwarding the allocation itself to any inner
//! [`GlobalAlloc`] (the system allocator by default).

use crate::header;
use crate::hooks::{record_alloc_from, record_free_headed};
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
/// Each block has a 16-byte header before it (more for alignments above 16: as many bytes as
/// the alignment) holding its record number, so a free finds its record without a lookup: `A`
/// sees layouts that much larger (see [`HeapdumpAlloc::requested`]).
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

    /// The size in bytes the program asked for, from a layout this allocator handed to its
    /// inner allocator (for an inner allocator that keeps its own tally): each block has a
    /// 16-byte header before it (see [`crate::header`]), or as many bytes as its alignment
    /// when that is larger, and the inner layout's alignment is that many bytes.
    pub const fn requested(inner_layout: Layout) -> usize {
        inner_layout.size() - inner_layout.align()
    }
}

/// Bytes before the program's block: room for the block header (see [`crate::header`]), as
/// much as the alignment asks for (at least 16).
#[inline(always)]
fn offset(layout: Layout) -> usize {
    layout.align().max(header::SIZE)
}

/// The layout asked of the inner allocator for `layout`: the header's room added. `None` when
/// that overflows (the allocation then fails, as it would for a size that large).
#[inline(always)]
fn outer(layout: Layout) -> Option<Layout> {
    let off = offset(layout);
    Layout::from_size_align(layout.size().checked_add(off)?, off).ok()
}

/// The program's block in the inner allocator's block `q` (null stays null), its header
/// written as not yet recorded.
///
/// # Safety
/// `q` is null or a block of `outer(layout)`.
#[inline(always)]
unsafe fn headed(q: *mut u8, layout: Layout) -> *mut u8 {
    if q.is_null() {
        return q;
    }
    // SAFETY: per the contract, the block has `offset(layout) >= 16` bytes before the
    // program's part; `p` keeps the alignment asked for.
    unsafe {
        let p = q.add(offset(layout));
        header::write(p as u64, header::NONE, header::size32(layout.size() as u64));
        p
    }
}

// SAFETY: every method forwards to `inner` with the caller's layout grown by the header's
// room (`outer`), and hands out the address after the header, which keeps the alignment asked
// for and the size asked for; `dealloc` and `realloc` give `inner` back the block and layout
// it handed out. Recording only reads and writes the header.
unsafe impl<A: GlobalAlloc> GlobalAlloc for HeapdumpAlloc<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // Every block has a header, whatever the settings: `dealloc` finds the inner block
        // by the layout alone. Turned on before the first block is handed out.
        header::enable();
        let Some(o) = outer(layout) else {
            return std::ptr::null_mut();
        };
        // SAFETY: forwarded with a valid, larger layout of the same or a larger alignment.
        let p = unsafe { headed(self.inner.alloc(o), layout) };
        record(p, layout.size());
        record_modules_once();
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        header::enable();
        let Some(o) = outer(layout) else {
            return std::ptr::null_mut();
        };
        // SAFETY: as in alloc.
        let p = unsafe { headed(self.inner.alloc_zeroed(o), layout) };
        record(p, layout.size());
        p
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Every block has a header (in sampling mode too: no presence filter to consult).
        record_free_headed(ptr);
        // SAFETY: `ptr` came from `alloc` with this layout, so `outer(layout)` exists and the
        // inner block starts `offset(layout)` bytes before it.
        unsafe {
            header::clear(ptr as u64);
            let o = outer(layout).unwrap_unchecked();
            self.inner.dealloc(ptr.sub(offset(layout)), o)
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let off = offset(layout);
        let Some(new_total) = new_size.checked_add(off) else {
            return std::ptr::null_mut();
        };
        let old = record_free_headed(ptr);
        // SAFETY: as in dealloc; the inner block grows to the new size plus the header's room
        // (its alignment unchanged, as realloc keeps it).
        let q = unsafe {
            let o = outer(layout).unwrap_unchecked();
            self.inner.realloc(ptr.sub(off), o, new_total)
        };
        if !q.is_null() {
            // SAFETY: a block of `new_total` bytes aligned to `off`.
            let p = unsafe {
                headed(
                    q,
                    Layout::from_size_align_unchecked(new_size, layout.align()),
                )
            };
            record(p, new_size);
            return p;
        }
        if old.is_some() {
            // The old block is still valid, its header too: record it again.
            record(ptr, layout.size());
        }
        q
    }
}
