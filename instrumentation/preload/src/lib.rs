//! `libheapdump.so`: load it with `LD_PRELOAD` (or `heapdump run`) to record every live
//! allocation of a dynamically linked program.
//!
//! Exports `malloc free calloc realloc reallocarray posix_memalign aligned_alloc memalign valloc
//! pvalloc malloc_usable_size`, forwarding to glibc's allocator through its `__libc_*` entry
//! points (no `dlsym` during start-up), and `dlopen`/`dlclose`, forwarding to the next definition
//! and then refreshing the module table. C++ `new`/`delete` reach these through libstdc++.
//! A constructor starts recording as soon as the library is loaded.

#![deny(unsafe_op_in_unsafe_fn)]

use heapdump_instrumentation::frame_pointer;
use heapdump_instrumentation::hooks::{
    record_alloc, record_free, record_free_deferrable, record_realloc,
};
use libc::{c_char, c_int, c_void, size_t};
use std::sync::atomic::{AtomicUsize, Ordering};

pub mod exec;
mod got;

extern "C" {
    fn __libc_malloc(size: size_t) -> *mut c_void;
    fn __libc_free(ptr: *mut c_void);
    fn __libc_calloc(n: size_t, size: size_t) -> *mut c_void;
    fn __libc_realloc(ptr: *mut c_void, size: size_t) -> *mut c_void;
    fn __libc_memalign(align: size_t, size: size_t) -> *mut c_void;
    fn __libc_valloc(size: size_t) -> *mut c_void;
    fn __libc_pvalloc(size: size_t) -> *mut c_void;
}

/// `malloc(3)`.
///
/// # Safety
/// As `malloc(3)`.
#[cfg_attr(not(test), no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn malloc(size: size_t) -> *mut c_void {
    let fp = frame_pointer!();
    // SAFETY: forwarding to glibc with the caller's arguments.
    let p = unsafe { __libc_malloc(size) };
    record_alloc(p as *mut u8, size, fp);
    p
}

/// `free(3)`.
///
/// # Safety
/// As `free(3)`.
#[cfg_attr(not(test), no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    // glibc >= 2.33 keeps errno across free (POSIX.1-2024 requires it); so does the recording:
    // its own work that may fail a system call (start-up, thread registration) restores errno.
    // A signal handler that interrupted this thread's recording: the shim frees the block
    // when the interrupted operation ends, after closing its record.
    if !record_free_deferrable(ptr as *mut u8) {
        // SAFETY: forwarding to glibc with the caller's argument.
        unsafe { __libc_free(ptr) };
    }
}

/// `calloc(3)`.
///
/// # Safety
/// As `calloc(3)`.
#[cfg_attr(not(test), no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn calloc(n: size_t, size: size_t) -> *mut c_void {
    let fp = frame_pointer!();
    // SAFETY: forwarding to glibc (which checks n * size for overflow).
    let p = unsafe { __libc_calloc(n, size) };
    record_alloc(p as *mut u8, n.wrapping_mul(size), fp);
    p
}

/// `realloc(3)`: the old block's record is closed before glibc may hand its address to another
/// thread, and the new block recorded after.
///
/// # Safety
/// As `realloc(3)`.
#[cfg_attr(not(test), no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: size_t) -> *mut c_void {
    let fp = frame_pointer!();
    // SAFETY: the caller's contract for realloc.
    unsafe { realloc_impl(ptr, size, fp) }
}

/// # Safety
/// As `realloc(3)`; `fp` is the exported function's frame pointer.
#[inline(always)]
unsafe fn realloc_impl(ptr: *mut c_void, size: size_t, fp: usize) -> *mut c_void {
    let old = record_free(ptr as *mut u8);
    // SAFETY: forwarding to glibc with the caller's arguments.
    let q = unsafe { __libc_realloc(ptr, size) };
    if !q.is_null() {
        if old.is_some() {
            record_realloc(q as *mut u8, size, fp);
        } else {
            record_alloc(q as *mut u8, size, fp);
        }
    } else if let (Some(old_size), false) = (old, size == 0) {
        // Failure leaves the old block valid: record it again.
        record_realloc(ptr as *mut u8, old_size as usize, fp);
    }
    q
}

/// `reallocarray(3)`.
///
/// # Safety
/// As `reallocarray(3)`.
#[cfg_attr(not(test), no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn reallocarray(ptr: *mut c_void, n: size_t, size: size_t) -> *mut c_void {
    let fp = frame_pointer!();
    let Some(total) = n.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    // SAFETY: the caller's contract for reallocarray, with the product checked.
    unsafe { realloc_impl(ptr, total, fp) }
}

/// `memalign(3)`.
///
/// # Safety
/// As `memalign(3)`.
#[cfg_attr(not(test), no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    let fp = frame_pointer!();
    // SAFETY: forwarding to glibc with the caller's arguments.
    let p = unsafe { __libc_memalign(align, size) };
    record_alloc(p as *mut u8, size, fp);
    p
}

/// `aligned_alloc(3)`: glibc has no `__libc_aligned_alloc`; built on `__libc_memalign`, which
/// is what glibc's own `aligned_alloc` is before 2.38: any alignment is accepted (rounded up
/// to a power of two; 0 means none), as the program would see without the shim.
///
/// # Safety
/// As `aligned_alloc(3)`.
#[cfg_attr(not(test), no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    let fp = frame_pointer!();
    // SAFETY: forwarding to glibc with the caller's arguments (memalign checks them).
    let p = unsafe { __libc_memalign(align, size) };
    record_alloc(p as *mut u8, size, fp);
    p
}

/// `posix_memalign(3)`: built on `__libc_memalign`, with its argument checks.
///
/// # Safety
/// As `posix_memalign(3)`: `memptr` must be writable.
#[cfg_attr(not(test), no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn posix_memalign(
    memptr: *mut *mut c_void,
    align: size_t,
    size: size_t,
) -> c_int {
    let fp = frame_pointer!();
    if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<*mut c_void>()) {
        return libc::EINVAL;
    }
    // SAFETY: forwarding to glibc with a valid alignment. On failure errno is left as the
    // allocator set it (ENOMEM), as glibc's posix_memalign does.
    let p = unsafe { __libc_memalign(align, size) };
    if p.is_null() {
        return libc::ENOMEM;
    }
    record_alloc(p as *mut u8, size, fp);
    // SAFETY: the caller guarantees memptr is writable.
    unsafe { *memptr = p };
    0
}

/// `valloc(3)`.
///
/// # Safety
/// As `valloc(3)`.
#[cfg_attr(not(test), no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn valloc(size: size_t) -> *mut c_void {
    let fp = frame_pointer!();
    // SAFETY: forwarding to glibc.
    let p = unsafe { __libc_valloc(size) };
    record_alloc(p as *mut u8, size, fp);
    p
}

/// `pvalloc(3)`.
///
/// # Safety
/// As `pvalloc(3)`.
#[cfg_attr(not(test), no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn pvalloc(size: size_t) -> *mut c_void {
    let fp = frame_pointer!();
    // SAFETY: forwarding to glibc.
    let p = unsafe { __libc_pvalloc(size) };
    record_alloc(p as *mut u8, size, fp);
    p
}

static REAL_USABLE: AtomicUsize = AtomicUsize::new(0);
static REAL_DLOPEN: AtomicUsize = AtomicUsize::new(0);
static REAL_DLCLOSE: AtomicUsize = AtomicUsize::new(0);

/// The next definition of `name` (NUL-terminated) after this library, cached in `cache`.
fn next_symbol(cache: &AtomicUsize, name: &[u8]) -> usize {
    let mut f = cache.load(Ordering::Acquire);
    if f == 0 {
        // SAFETY: `name` is NUL-terminated; RTLD_NEXT lookups have no other preconditions.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr() as *const c_char) } as usize;
        cache.store(f, Ordering::Release);
    }
    f
}

/// `malloc_usable_size(3)`, forwarded to glibc's.
///
/// # Safety
/// As `malloc_usable_size(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn malloc_usable_size(ptr: *mut c_void) -> size_t {
    let f = next_symbol(&REAL_USABLE, b"malloc_usable_size\0");
    if f == 0 || ptr.is_null() {
        return 0;
    }
    // SAFETY: `f` is glibc's malloc_usable_size, of this signature.
    unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void) -> size_t>(f)(ptr) }
}

/// `dlopen(3)`, then a refresh of the module table.
///
/// # Safety
/// As `dlopen(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
    let f = next_symbol(&REAL_DLOPEN, b"dlopen\0");
    if f == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: `f` is the loader's dlopen, of this signature.
    let h = unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void>(f)(
            file, mode,
        )
    };
    if !h.is_null() {
        if mode & libc::RTLD_DEEPBIND != 0 {
            rebind_deepbound();
        }
        heapdump_instrumentation::refresh_modules();
        heapdump_instrumentation::python::detect();
    }
    h
}

/// After a `dlopen(…, RTLD_DEEPBIND)`: the new library (and its dependencies) bound the
/// allocation functions to glibc's; point them at ours (see [`got`]).
fn rebind_deepbound() {
    // SAFETY: dlopen of an already loaded library with RTLD_NOLOAD only returns its handle.
    let libc_h = unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if libc_h.is_null() {
        return;
    }
    let glibc = |name: &std::ffi::CStr| -> usize {
        // SAFETY: a valid handle and a NUL-terminated name.
        unsafe { libc::dlsym(libc_h, name.as_ptr()) as usize }
    };
    let table = [
        got::Rebind {
            name: b"malloc",
            libc: glibc(c"malloc"),
            ours: malloc as *const () as usize,
        },
        got::Rebind {
            name: b"free",
            libc: glibc(c"free"),
            ours: free as *const () as usize,
        },
        got::Rebind {
            name: b"calloc",
            libc: glibc(c"calloc"),
            ours: calloc as *const () as usize,
        },
        got::Rebind {
            name: b"realloc",
            libc: glibc(c"realloc"),
            ours: realloc as *const () as usize,
        },
        got::Rebind {
            name: b"reallocarray",
            libc: glibc(c"reallocarray"),
            ours: reallocarray as *const () as usize,
        },
        got::Rebind {
            name: b"posix_memalign",
            libc: glibc(c"posix_memalign"),
            ours: posix_memalign as *const () as usize,
        },
        got::Rebind {
            name: b"aligned_alloc",
            libc: glibc(c"aligned_alloc"),
            ours: aligned_alloc as *const () as usize,
        },
        got::Rebind {
            name: b"memalign",
            libc: glibc(c"memalign"),
            ours: memalign as *const () as usize,
        },
        got::Rebind {
            name: b"valloc",
            libc: glibc(c"valloc"),
            ours: valloc as *const () as usize,
        },
        got::Rebind {
            name: b"pvalloc",
            libc: glibc(c"pvalloc"),
            ours: pvalloc as *const () as usize,
        },
    ];
    // SAFETY: the handle came from dlopen above.
    unsafe { libc::dlclose(libc_h) };
    let table: Vec<got::Rebind> = table.into_iter().filter(|r| r.libc != 0).collect();
    got::rebind_all(&table);
}

/// `dlclose(3)`, then a refresh of the module table.
///
/// # Safety
/// As `dlclose(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    let f = next_symbol(&REAL_DLCLOSE, b"dlclose\0");
    if f == 0 {
        return -1;
    }
    // SAFETY: `f` is the loader's dlclose, of this signature.
    let r = unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void) -> c_int>(f)(handle)
    };
    heapdump_instrumentation::refresh_modules();
    heapdump_instrumentation::python::forget_if_unloaded();
    r
}

/// `_exit(2)`: removes the region (as a clean exit does), then ends the process. Shells such
/// as dash leave through `_exit`, skipping `atexit` handlers.
///
/// # Safety
/// As `_exit(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    heapdump_instrumentation::state::exit_cleanup();
    // SAFETY: exit_group ends every thread of the process; it does not return.
    unsafe { libc::syscall(libc::SYS_exit_group, status as libc::c_long) };
    unreachable_exit()
}

/// `heapdump_take_named_snapshot(3)` (instrumentation/include/heapdump.h): records a named
/// snapshot — the blocks live now, retrievable later with `heapdump snapshot --named NAME`.
/// Returns 1 when recorded, 0 when not (not recording, NULL name, or the table is full).
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn heapdump_take_named_snapshot(name: *const libc::c_char) -> c_int {
    if name.is_null() {
        return 0;
    }
    // SAFETY: the caller passes a NUL-terminated string; at most 4096 bytes are looked at.
    let len = unsafe { libc::strnlen(name, 4096) };
    // SAFETY: `len` bytes at `name` are readable (strnlen just read them).
    let bytes = unsafe { std::slice::from_raw_parts(name as *const u8, len) };
    heapdump_instrumentation::state::take_named_snapshot(bytes) as c_int
}

static REAL_QUICK_EXIT: AtomicUsize = AtomicUsize::new(0);

/// `quick_exit(3)`: removes the region (as a clean exit does: `quick_exit` skips `atexit`
/// handlers), then runs the program's `at_quick_exit` handlers through glibc's.
///
/// # Safety
/// As `quick_exit(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn quick_exit(status: c_int) -> ! {
    heapdump_instrumentation::state::exit_cleanup();
    let f = next_symbol(&REAL_QUICK_EXIT, b"quick_exit\0");
    if f != 0 {
        // SAFETY: `f` is glibc's quick_exit, of this signature; it does not return.
        unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(c_int) -> !>(f)(status) }
    }
    // SAFETY: as in `_exit`.
    unsafe { libc::syscall(libc::SYS_exit_group, status as libc::c_long) };
    unreachable_exit()
}

/// `_Exit(3)`: as `_exit`.
///
/// # Safety
/// As `_Exit(3)`.
#[cfg_attr(not(test), no_mangle)]
#[allow(non_snake_case)]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    // SAFETY: same contract.
    unsafe { _exit(status) }
}

fn unreachable_exit() -> ! {
    loop {
        // SAFETY: only reached if exit_group returned, which it does not.
        unsafe { libc::syscall(libc::SYS_exit_group, 127 as libc::c_long) };
    }
}

fn set_errno(v: c_int) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = v };
}

extern "C" fn constructor() {
    heapdump_instrumentation::state::set_real_free(__libc_free);
    heapdump_instrumentation::init();
    heapdump_instrumentation::state::register_fork_handlers();
    heapdump_instrumentation::refresh_modules();
    heapdump_instrumentation::python::detect();
}

#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: extern "C" fn() = constructor;
