//! Stack capture by DWARF CFI (`.eh_frame`), for code built without frame pointers (glibc,
//! libstdc++, Debian's CPython, Rust's std).
//!
//! Uses framehop's in-process unwinder with the `MustNotAllocateDuringUnwind` policy: the module
//! list is built where allocating is safe (the preload constructor, after `dlopen`/`dlclose`, the
//! first allocation of a Rust program) and published through an atomic pointer; each thread
//! keeps a rule cache (created at its first capture), so the CFI of a return address is
//! evaluated once and then found in the cache.
//!
//! Module data are slices of the loaded objects' own memory (`.eh_frame_hdr`, `.eh_frame`, the
//! executable segment), found from `dl_iterate_phdr`. An unwinder replaced by a newer one is
//! leaked, not freed: another thread may still be walking with it.

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{
    ExplicitModuleSectionInfo, FrameAddress, Module, MustNotAllocateDuringUnwind, Unwinder,
};
use std::sync::atomic::{AtomicPtr, Ordering};
use vmo_layout::v1::MAX_FRAMES;

type Mem = &'static [u8];
type Dwarf = UnwinderX86_64<Mem, MustNotAllocateDuringUnwind>;
/// Number of framehop rule caches per thread. framehop's cache is direct-mapped with 509
/// entries (slot = address % 509); picking one of several caches by another hash of the
/// address multiplies its capacity, which CPython's many call sites need.
const CACHES: usize = 4;

/// A thread's rule caches.
pub struct Cache([CacheX86_64<MustNotAllocateDuringUnwind>; CACHES]);

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cache")
    }
}

impl Cache {
    #[inline]
    fn for_address(&mut self, a: u64) -> &mut CacheX86_64<MustNotAllocateDuringUnwind> {
        &mut self.0[((a / 509) ^ (a >> 13)) as usize % CACHES]
    }
}

static UNWINDER: AtomicPtr<Dwarf> = AtomicPtr::new(std::ptr::null_mut());

/// Whether an unwinder has been built.
pub fn ready() -> bool {
    !UNWINDER.load(Ordering::Acquire).is_null()
}

/// A new rule cache (allocates: call inside the reentrancy guard).
pub fn new_cache() -> *mut Cache {
    Box::into_raw(Box::new(Cache(std::array::from_fn(|_| {
        CacheX86_64::new_in()
    }))))
}

/// Frees a cache from [`new_cache`].
///
/// # Safety
/// `c` came from [`new_cache`] and is not used again.
pub unsafe fn free_cache(c: *mut Cache) {
    // SAFETY: per the contract.
    drop(unsafe { Box::from_raw(c) });
}

/// Rebuilds the unwinder from the objects loaded now (allocates; call where the loader lock is
/// not held and inside the reentrancy guard).
pub fn rebuild() {
    let mut u: Dwarf = UnwinderX86_64::new();
    // SAFETY: the callback receives `&mut Dwarf` through `data`, valid for the call.
    unsafe { libc::dl_iterate_phdr(Some(add_object), &mut u as *mut Dwarf as *mut libc::c_void) };
    UNWINDER.store(Box::into_raw(Box::new(u)), Ordering::Release);
}

unsafe extern "C" fn add_object(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: dl_iterate_phdr passes our unwinder and a valid info for this call.
    let (u, info) = unsafe { (&mut *(data as *mut Dwarf), &*info) };
    // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let base = info.dlpi_addr;
    let loads: Vec<&libc::Elf64_Phdr> =
        phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD).collect();
    let (Some(lo), Some(hi)) = (
        loads.iter().map(|p| p.p_vaddr).min(),
        loads.iter().map(|p| p.p_vaddr + p.p_memsz).max(),
    ) else {
        return 0;
    };
    let Some(hdr) = phdrs.iter().find(|p| p.p_type == libc::PT_GNU_EH_FRAME) else {
        return 0;
    };
    let mem = |svma: u64, len: u64| -> Mem {
        // SAFETY: the range lies in a PT_LOAD segment of a loaded object, mapped readable
        // while the object stays loaded.
        unsafe { std::slice::from_raw_parts((base + svma) as *const u8, len as usize) }
    };
    let hdr_data = mem(hdr.p_vaddr, hdr.p_memsz);
    let Some(eh_svma) =
        eh_frame_address(hdr_data, base + hdr.p_vaddr).map(|a| a.wrapping_sub(base))
    else {
        return 0;
    };
    let Some(seg) = loads
        .iter()
        .find(|p| eh_svma >= p.p_vaddr && eh_svma < p.p_vaddr + p.p_filesz)
    else {
        return 0;
    };
    let eh_len = seg.p_vaddr + seg.p_filesz - eh_svma;
    let text = loads.iter().find(|p| p.p_flags & libc::PF_X != 0);
    let section_info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: text.map(|t| t.p_vaddr..t.p_vaddr + t.p_filesz),
        text: text.map(|t| mem(t.p_vaddr, t.p_filesz)),
        eh_frame_svma: Some(eh_svma..eh_svma + eh_len),
        eh_frame: Some(mem(eh_svma, eh_len)),
        eh_frame_hdr_svma: Some(hdr.p_vaddr..hdr.p_vaddr + hdr.p_memsz),
        eh_frame_hdr: Some(hdr_data),
        ..Default::default()
    };
    // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }
        .to_string_lossy()
        .into_owned();
    u.add_module(Module::new(name, base + lo..base + hi, base, section_info));
    0
}

/// The `.eh_frame` address encoded in an `.eh_frame_hdr` at runtime address `hdr_avma`.
fn eh_frame_address(hdr: &[u8], hdr_avma: u64) -> Option<u64> {
    if hdr.len() < 8 || hdr[0] != 1 {
        return None;
    }
    let enc = hdr[1];
    let field = &hdr[4..];
    let field_avma = hdr_avma + 4;
    let raw: i64 = match enc & 0x0f {
        0x00 | 0x04 | 0x0c => i64::from_ne_bytes(field.get(..8)?.try_into().ok()?),
        0x03 => u32::from_ne_bytes(field.get(..4)?.try_into().ok()?) as i64,
        0x0b => i32::from_ne_bytes(field.get(..4)?.try_into().ok()?) as i64,
        _ => return None,
    };
    match enc & 0x70 {
        0x00 => Some(raw as u64),
        0x10 => Some(field_avma.wrapping_add(raw as u64)),
        _ => None,
    }
}

/// Walks the stack by CFI from the frame whose frame pointer is `fp` (the exported allocation
/// function's, compiled with frame pointers); writes return addresses (leaf first) into `out`.
/// Reads stack memory only within `[current sp, stack_hi)`. Returns the number of frames.
#[inline(never)]
pub fn walk(fp: usize, stack_hi: usize, cache: &mut Cache, out: &mut [u64; MAX_FRAMES]) -> usize {
    let marker = 0u8;
    let lo = &marker as *const u8 as u64;
    let fp = fp as u64;
    if stack_hi == 0 || fp < lo || fp + 16 > stack_hi as u64 || fp % 8 != 0 {
        return 0;
    }
    // SAFETY: fp and fp + 8 lie in this thread's stack above the stack pointer (checked).
    let (ret, caller_bp) = unsafe { (*((fp + 8) as *const u64), *(fp as *const u64)) };
    let Some(first) = FrameAddress::from_return_address(ret) else {
        return 0;
    };
    unwind(
        first,
        UnwindRegsX86_64::new(ret, fp + 16, caller_bp),
        lo,
        stack_hi as u64,
        cache,
        out,
    )
}

/// Walks the stack by CFI from the registers of the calling function (`pc`, `sp`, `bp`, read
/// where it runs), needing no frame pointer anywhere; the calling function's own frame is left
/// out, so the first frame is the return address into its caller.
#[inline(never)]
pub fn walk_from(
    pc: u64,
    sp: u64,
    bp: u64,
    stack_hi: usize,
    cache: &mut Cache,
    out: &mut [u64; MAX_FRAMES],
) -> usize {
    let marker = 0u8;
    let lo = &marker as *const u8 as u64;
    if stack_hi == 0 || sp < lo || sp >= stack_hi as u64 {
        return 0;
    }
    let mut all = [0u64; MAX_FRAMES];
    let n = unwind(
        FrameAddress::InstructionPointer(pc),
        UnwindRegsX86_64::new(pc, sp, bp),
        lo,
        stack_hi as u64,
        cache,
        &mut all,
    );
    let n = n.saturating_sub(1);
    out[..n].copy_from_slice(&all[1..=n]);
    n
}

fn unwind(
    mut addr: FrameAddress,
    mut regs: UnwindRegsX86_64,
    lo: u64,
    hi: u64,
    cache: &mut Cache,
    out: &mut [u64; MAX_FRAMES],
) -> usize {
    let mut read = |a: u64| -> Result<u64, ()> {
        if a >= lo && a.saturating_add(8) <= hi && a % 8 == 0 {
            // SAFETY: the address lies in this thread's mapped stack, above the stack pointer.
            Ok(unsafe { *(a as *const u64) })
        } else {
            Err(())
        }
    };
    let ptr = UNWINDER.load(Ordering::Acquire);
    if ptr.is_null() {
        return 0;
    }
    // SAFETY: published unwinders are never freed.
    let u = unsafe { &*ptr };
    let mut n = 0;
    while n < MAX_FRAMES {
        out[n] = addr.address();
        n += 1;
        match u.unwind_frame(
            addr,
            &mut regs,
            cache.for_address(addr.address()),
            &mut read,
        ) {
            Ok(Some(next)) => match FrameAddress::from_return_address(next) {
                Some(a) if next >= 4096 => addr = a,
                _ => break,
            },
            _ => break,
        }
    }
    n
}
