//! The entries `heapdump attach` and `heapdump detach` call in a running process (after
//! `dlopen`ing this library there, with every other thread stopped outside the allocator and
//! the loader): [`heapdump_attach_start`] starts recording (see
//! `heapdump_instrumentation::attach`) and points every loaded object's malloc-family GOT
//! slots at this library's functions (libc's own slots too); [`heapdump_attach_stop`] puts
//! them back and stops recording. Both answer in the [`AttachArgs`] they are given.

use crate::got;
use heapdump_instrumentation::attach as core;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use vmo_layout::attach::{
    AttachArgs, ENV_BYTES, MAGIC, SHIM_ATTACHED, SHIM_DETACHED, SHIM_LOADED, SHIM_PRELOADED,
    STATUS_FAILED, STATUS_OK,
};

/// Where this library stands, for the collector to read from outside before it changes
/// anything (`vmo_layout::attach::STATE_SYMBOL`): `SHIM_LOADED`, `SHIM_ATTACHED`,
/// `SHIM_DETACHED` or `SHIM_PRELOADED`.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static heapdump_attach_state: AtomicU8 = AtomicU8::new(SHIM_LOADED);

/// The settings the collector passed, kept for the life of the process (the region module
/// reads them instead of the environment).
static mut ENV: [u8; ENV_BYTES] = [0; ENV_BYTES];
/// Whether this library was loaded by `LD_PRELOAD` (decided by its constructor).
pub(crate) static PRELOADED: AtomicBool = AtomicBool::new(true);

/// The dynamic loader's code (start, end), set by the first attach: 0 when preloaded.
static LOADER: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// Whether the malloc-family function whose frame pointer is `fp` was called by the dynamic
/// loader (its return address in ld.so's code), when attached. Such a call is not recorded:
/// in a thread started after the attach, the shim's first use of its thread-local state
/// makes the loader allocate that state (a `dlopen`ed library's TLS is allocated lazily), and
/// where the loader's `malloc` is the executable's PLT entry (a non-PIE executable that takes
/// `malloc`'s address), whose GOT slot the attach pointed at the shim, recording that call
/// would use the thread-local state again: an endless recursion.
#[inline(always)]
pub(crate) fn from_loader(fp: usize) -> bool {
    let start = LOADER[0].load(Ordering::Relaxed);
    if start == 0 {
        return false;
    }
    // SAFETY: `fp` is the frame pointer of the calling exported function (frame pointers are
    // kept): the word above it is that function's return address.
    let ra = unsafe { ((fp + 8) as *const usize).read() };
    ra >= start && ra < LOADER[1].load(Ordering::Relaxed)
}

/// Finds the loader's executable segment into [`LOADER`].
fn find_loader() {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        _data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info for this call.
        let info = unsafe { &*info };
        // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
        let name = unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }.to_bytes();
        let file = name.rsplit(|b| *b == b'/').next().unwrap_or(name);
        if !file.starts_with(b"ld-linux") && !file.starts_with(b"ld.so") {
            return 0;
        }
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers of a loaded object.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        for ph in phdrs {
            if ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_X != 0 {
                let start = info.dlpi_addr as usize + ph.p_vaddr as usize;
                LOADER[1].store(start + ph.p_memsz as usize, Ordering::Relaxed);
                LOADER[0].store(start, Ordering::Release);
            }
        }
        1
    }
    // SAFETY: the callback has the right signature; it uses no data.
    unsafe { libc::dl_iterate_phdr(Some(each), std::ptr::null_mut()) };
}

/// The single frame of the blocks that were live before the attach: the collector names
/// them by this function's name. Never called.
#[no_mangle]
#[inline(never)]
pub extern "C" fn heapdump_live_before_attach() -> u64 {
    std::hint::black_box(0x6865_6170_6475_6d70)
}

/// Starts recording in this (running) process: see the module docs. Answers in `args`.
///
/// # Safety
/// `args` points to a writable [`AttachArgs`]; every other thread of the process is stopped
/// outside the allocator and the loader.
#[no_mangle]
pub unsafe extern "C" fn heapdump_attach_start(args: *mut AttachArgs) {
    // The interrupted thread's errno is put back: the stub restores its registers, not its
    // thread-local memory.
    // SAFETY: __errno_location returns this thread's errno.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: per the contract.
    unsafe { attach_start(&mut *args) };
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

fn attach_start(a: &mut AttachArgs) {
    if a.magic != MAGIC {
        return;
    }
    if PRELOADED.load(Ordering::Acquire) {
        a.set_message(&[b"the process records already (libheapdump.so is preloaded)"]);
        a.status = STATUS_FAILED;
        return;
    }
    let n = (a.env_len as usize).min(ENV_BYTES);
    // SAFETY: written only here, by the one thread that runs now, and only before the first
    // attach (a re-attach keeps the settings, and the region, of the first): the region
    // module reads it only from then on.
    let env: &'static [u8] = unsafe {
        let env = &mut *std::ptr::addr_of_mut!(ENV);
        if !core::attached_before() {
            env[..n].copy_from_slice(&a.env[..n]);
        }
        &env[..n]
    };
    if LOADER[0].load(Ordering::Acquire) == 0 {
        find_loader();
    }
    let marker = crate::own_symbol(c"heapdump_live_before_attach").unwrap_or(0) as u64 + 1;
    match core::start(env, marker) {
        Ok(s) => {
            // Children made by `fork` get regions of their own, as under the preload (without
            // the handlers a child was taken for one made by a raw clone: not recorded, and
            // the parent's region flagged). Every other thread is stopped outside `fork` and
            // `pthread_atfork` (the collector's safe point), so the handler list is free.
            heapdump_instrumentation::state::register_fork_handlers();
            heapdump_instrumentation::refresh_modules();
            heapdump_instrumentation::python::detect();
            a.blocks = s.blocks;
            a.bytes = s.bytes;
            a.reattached = s.reattached as u64;
            a.kept = s.kept;
            a.closed = s.closed;
            a.own = s.own;
            a.mallinfo = s.mallinfo;
            a.slots = got::rebind_attached(&crate::rebind_table()) as u64;
            a.pymalloc = s.pymalloc;
            if let Some(why) = s.heap_not_walked {
                a.set_message(&[
                    b"the blocks live before the attach are not recorded: ",
                    why.as_bytes(),
                ]);
            } else if let Some(why) = s.pymalloc_not_walked {
                a.set_message(&[b"CPython: ", why.as_bytes()]);
            }
            a.status = STATUS_OK;
            heapdump_attach_state.store(SHIM_ATTACHED, Ordering::Release);
        }
        Err(e) => {
            a.set_message(&[e.message()]);
            a.status = STATUS_FAILED;
        }
    }
}

/// Stops recording in a process this library was attached to: restores the GOT slots the
/// attach changed, then marks the region as a process that is gone (it stays readable).
///
/// # Safety
/// As [`heapdump_attach_start`].
#[no_mangle]
pub unsafe extern "C" fn heapdump_attach_stop(args: *mut AttachArgs) {
    // SAFETY: __errno_location returns this thread's errno (put back as in the start).
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: per the contract.
    unsafe { attach_stop(&mut *args) };
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

fn attach_stop(a: &mut AttachArgs) {
    if a.magic != MAGIC {
        return;
    }
    if !core::attached() {
        a.set_message(&[b"heapdump is not attached to this process"]);
        a.status = STATUS_FAILED;
        return;
    }
    match got::restore_all() {
        Ok(n) => a.slots = n as u64,
        Err(got::Busy) => {
            a.set_message(&[b"a thread was rebinding the GOT after a dlopen: try again"]);
            a.status = STATUS_FAILED;
            return;
        }
    }
    core::stop();
    heapdump_attach_state.store(SHIM_DETACHED, Ordering::Release);
    a.status = STATUS_OK;
}

/// Called by the constructor: whether this library was preloaded rather than `dlopen`ed by
/// `heapdump attach` (then recording starts only when the attach entry is called). Decided by
/// the loader's list of objects, in load order: a preloaded library comes before libc, a
/// `dlopen`ed one after. (Comparing the global `malloc` with ours does not work: in a non-PIE
/// executable that takes `malloc`'s address, the lookup finds the executable's PLT entry.)
/// Allocates nothing: the first allocation, which starts recording, is still the program's.
pub(crate) fn decide_preloaded() -> bool {
    struct Seen {
        own: usize,
        libc_seen: bool,
        preloaded: Option<bool>,
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes our `Seen` and a valid info for this call.
        let (seen, info) = unsafe { (&mut *(data as *mut Seen), &*info) };
        if info.dlpi_addr as usize == seen.own {
            seen.preloaded = Some(!seen.libc_seen);
            return 1;
        }
        // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
        let name = unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }.to_bytes();
        let file = name.rsplit(|b| *b == b'/').next().unwrap_or(name);
        if file.starts_with(b"libc.so") {
            seen.libc_seen = true;
        }
        0
    }
    // SAFETY: a zeroed Dl_info is valid; dladdr only looks the address up.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe {
        libc::dladdr(
            decide_preloaded as *const () as *const libc::c_void,
            &mut info,
        )
    };
    let mut seen = Seen {
        own: info.dli_fbase as usize,
        libc_seen: false,
        preloaded: None,
    };
    // SAFETY: the callback has the right signature and receives our `Seen`.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut seen as *mut Seen as *mut libc::c_void) };
    // dli_fbase is the mapping's start, dlpi_addr the load bias: equal for a shared library
    // linked at 0, as this one is. Not found: assume preloaded (the behaviour before attach).
    let preloaded = seen.preloaded.unwrap_or(true);
    PRELOADED.store(preloaded, Ordering::Release);
    if preloaded {
        heapdump_attach_state.store(SHIM_PRELOADED, Ordering::Release);
    }
    preloaded
}
