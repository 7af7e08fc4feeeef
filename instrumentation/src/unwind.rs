//! Stack capture by frame-pointer walk.
//!
//! Starts at the frame of the exported allocation function (whose frame pointer the caller
//! passes), so the shim's own frames never appear: frame 0 is the return address into the code
//! that called `malloc`. Each step reads `[fp]` (the caller's frame pointer) and `[fp + 8]` (the
//! return address) only after checking `fp` lies between the current stack pointer and the top
//! of this thread's stack, so a garbage `rbp` in code built without frame pointers ends the walk
//! instead of faulting.

use vmo_layout::v1::MAX_FRAMES;

/// Reads the frame pointer of the calling function.
///
/// Must be expanded inside the function whose frame the walk starts from (compiled with frame
/// pointers, as the workspace's `.cargo/config.toml` and the shim's build force).
#[macro_export]
macro_rules! frame_pointer {
    () => {{
        let fp: usize;
        #[cfg(target_arch = "x86_64")]
        // SAFETY: reading rbp has no side effects.
        unsafe {
            ::core::arch::asm!("mov {}, rbp", out(reg) fp, options(nomem, nostack, preserves_flags))
        };
        #[cfg(target_arch = "aarch64")]
        // SAFETY: reading x29 has no side effects.
        unsafe {
            ::core::arch::asm!("mov {}, x29", out(reg) fp, options(nomem, nostack, preserves_flags))
        };
        fp
    }};
}

/// Reads the program counter and stack pointer where it is expanded: `(pc, sp)`, for
/// [`crate::dwarf::walk_from`].
#[macro_export]
macro_rules! here {
    () => {{
        let (pc, sp): (u64, u64);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: reading rip (via lea) and rsp has no side effects.
        unsafe {
            ::core::arch::asm!(
                "lea {pc}, [rip]",
                "mov {sp}, rsp",
                pc = out(reg) pc,
                sp = out(reg) sp,
                options(nomem, nostack, preserves_flags)
            )
        };
        #[cfg(not(target_arch = "x86_64"))]
        let (pc, sp) = (0u64, 0u64);
        (pc, sp)
    }};
}

/// Where a stack capture starts.
#[derive(Debug, Clone, Copy)]
pub enum Start {
    /// The frame pointer of the exported allocation function (compiled with frame pointers):
    /// frames start at its return address.
    FramePointer(usize),
    /// The registers of a recording function that may lack a frame pointer: CFI unwinding
    /// starts there and drops that function's own frame; `fp` is its `rbp`, used only by the
    /// frame-pointer fallback.
    Here {
        /// Program counter inside the function.
        pc: u64,
        /// Stack pointer inside the function.
        sp: u64,
        /// `rbp` inside the function.
        fp: usize,
    },
}

/// Walks frame pointers from `fp`; writes return addresses (leaf first) into `out`.
///
/// `stack_hi` is the highest address of this thread's stack (0 when unknown: then only the
/// first frame, which lies in the shim's own frame, is read). Returns the number of frames.
#[inline(never)]
pub fn walk(mut fp: usize, stack_hi: usize, out: &mut [u64; MAX_FRAMES]) -> usize {
    let marker = 0u8;
    let lo = &marker as *const u8 as usize;
    let hi = if stack_hi == 0 {
        fp.saturating_add(16)
    } else {
        stack_hi
    };
    let mut n = 0;
    while n < MAX_FRAMES {
        if fp < lo || fp & 7 != 0 || fp.saturating_add(16) > hi {
            break;
        }
        // SAFETY: lo <= fp and fp + 16 <= hi: both words lie inside this thread's stack,
        // which is mapped from the current stack pointer up to its top.
        let (next, ret) = unsafe { (*(fp as *const usize), *((fp + 8) as *const usize)) };
        if ret < 4096 {
            break;
        }
        out[n] = ret as u64;
        n += 1;
        if next <= fp {
            break;
        }
        fp = next;
    }
    n
}

/// The calling thread's stack as `(lowest, highest)` address (`(0, 0)` if unknown). May
/// allocate (inside the reentrancy guard, so those allocations go straight to glibc).
///
/// For the main thread the top is `__libc_stack_end` and the bottom the top minus the stack
/// size limit (`RLIMIT_STACK`, at most 1 GiB when unlimited): the main stack grows down on
/// demand within it. For other threads, `pthread_getattr_np`.
pub fn current_stack_bounds(is_main: bool) -> (usize, usize) {
    if is_main {
        extern "C" {
            static __libc_stack_end: *const libc::c_void;
        }
        // SAFETY: ld.so defines __libc_stack_end before any user code runs; reading it is a
        // plain load of a pointer-sized value.
        let end = unsafe { __libc_stack_end } as usize;
        // The initial stack extends a little above __libc_stack_end (argv, envp, auxv);
        // frames live below it.
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `rl` is a valid, writable rlimit.
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut rl) } == 0;
        let limit = if ok && rl.rlim_cur != libc::RLIM_INFINITY {
            (rl.rlim_cur as usize).min(1 << 30)
        } else {
            1 << 30
        };
        return (end.saturating_sub(limit), end);
    }
    // SAFETY: a zeroed pthread_attr_t is filled by pthread_getattr_np; destroyed below.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            // Refused (a seccomp filter failing its `sched_getaffinity` with EPERM): the
            // mapping of this frame, if it is the thread's own stack.
            let marker = 0u8;
            let sp = std::hint::black_box(&marker) as *const u8 as usize;
            return crate::modules::thread_stack_from_maps(sp, libc::pthread_self() as usize)
                .unwrap_or((0, 0));
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let ok = libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0;
        libc::pthread_attr_destroy(&mut attr);
        if ok {
            (addr as usize, addr as usize + size)
        } else {
            (0, 0)
        }
    }
}

/// Whether the calling thread may be inside glibc's `pthread_getattr_np`: a word of its stack
/// within [`GETATTR_SCAN`] bytes above `sp` points into that function's code (at most
/// [`GETATTR_CODE`] bytes from its start; 1004 in glibc 2.36). For a thread other than the
/// main one, `pthread_getattr_np(pthread_self())` takes the thread's own descriptor lock and,
/// holding it, calls `realloc` for its CPU set: when that `realloc` is the thread's first
/// recorded call (Ruby's, the JVM's and Rust's std's new threads ask for their stack first
/// thing), asking `pthread_getattr_np` for the stack bounds from there waits on that lock
/// for ever. A stale word matching only delays the question (see `Tls::stack_limit`), so a
/// false positive costs nothing but a shorter walk.
pub fn inside_getattr(sp: usize) -> bool {
    let start = libc::pthread_getattr_np as *const () as usize;
    let end = sp.saturating_add(GETATTR_SCAN);
    let mut at = (sp + 7) & !7;
    // Read through the kernel, not by plain loads: a new thread's `sp` lies a few KiB below
    // the end of its stack, so the scan runs on into whatever is mapped next, which another
    // thread may unmap at any moment (helper M, 1: a Python thread's first `free` faulted on
    // the shim's own per-thread memo that an exiting thread had just released; threaded
    // CPython servers died with SIGSEGV within seconds).
    let mut buf = [0u64; GETATTR_CHUNK / 8];
    while at < end {
        let want = (end - at).min(GETATTR_CHUNK) & !7;
        if want == 0 {
            break;
        }
        // One remote iovec per page: the kernel stops at the first page it cannot read and
        // never splits an iovec, so what it copies is the readable start of the range.
        let mut remote = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; GETATTR_CHUNK / 4096 + 2];
        let (mut k, mut a) = (0, at);
        while a < at + want {
            let next = ((a & !4095) + 4096).min(at + want);
            remote[k] = libc::iovec {
                iov_base: a as *mut libc::c_void,
                iov_len: next - a,
            };
            k += 1;
            a = next;
        }
        let local = [libc::iovec {
            iov_base: buf.as_mut_ptr() as *mut libc::c_void,
            iov_len: want,
        }];
        // SAFETY: `local` describes `buf` (`want` ≤ its size, writable); the kernel checks
        // every remote address. errno is kept.
        let n = unsafe { vm_read_self(&local, &remote[..k]) };
        if n <= 0 {
            return false;
        }
        let n = n as usize;
        if buf[..n / 8]
            .iter()
            .any(|&w| (w as usize) > start && (w as usize) - start < GETATTR_CODE)
        {
            return true;
        }
        if n < want {
            return false;
        }
        at += want;
    }
    false
}

/// Bytes [`inside_getattr`] copies at a time (a buffer on the registering thread's stack:
/// 8 KiB made a thread's first allocation need 9.5 KiB of stack, and a thread made with
/// `PTHREAD_STACK_MIN` ran off its stack, helper P, 1; 32 reads of 1 KiB at a thread's start
/// cost ~20 µs).
const GETATTR_CHUNK: usize = 1024;

/// Bytes of stack [`inside_getattr`] searches: the shim's frames between the allocator entry
/// and the question (a few KiB) and `pthread_getattr_np`'s own.
const GETATTR_SCAN: usize = 32 << 10;
/// Bytes of `pthread_getattr_np`'s code a return address may point into.
const GETATTR_CODE: usize = 4096;

/// Whether `pc` is the start of the kernel's signal-return trampoline (glibc's `__restore_rt`
/// on x86-64: `mov $15, %rax; syscall`), i.e. the return address of a signal handler's frame.
/// The code is read through the kernel ([`read_checked`]): `pc` may come from a frame-pointer
/// walk through garbage.
pub fn is_sigreturn(pc: u64) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        const RT_SIGRETURN: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
        let mut code = [0u8; 9];
        pc >= 4096 && read_checked(pc as usize, &mut code) && code == RT_SIGRETURN
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = pc;
        false
    }
}

/// Set once `process_vm_readv` on this process was refused (`EPERM` or `ENOSYS`: a seccomp
/// filter returning an error, a kernel without it): it is not called again, its callers
/// taking the answer it gave (nothing readable). A program that forbids it would otherwise
/// pay a failing system call on every stack walk of a thread whose stack bounds are unknown
/// (helper H, 1: 350,000 of them for a million operations, 1.8 times the run time).
static VM_READ_REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `process_vm_readv(getpid(), local, remote)` unless [`VM_READ_REFUSED`]; errno kept.
///
/// # Safety
/// As `process_vm_readv`: the local iovecs describe writable memory.
unsafe fn vm_read_self(local: &[libc::iovec], remote: &[libc::iovec]) -> isize {
    use std::sync::atomic::Ordering;
    if VM_READ_REFUSED.load(Ordering::Relaxed) {
        return -1;
    }
    // SAFETY: per the contract; errno is restored.
    unsafe {
        let saved = *libc::__errno_location();
        let n = libc::process_vm_readv(
            libc::getpid(),
            local.as_ptr(),
            local.len() as libc::c_ulong,
            remote.as_ptr(),
            remote.len() as libc::c_ulong,
            0,
        );
        let e = *libc::__errno_location();
        if n < 0 && (e == libc::EPERM || e == libc::ENOSYS) {
            VM_READ_REFUSED.store(true, Ordering::Relaxed);
        }
        *libc::__errno_location() = saved;
        n
    }
}

/// Copies `buf.len()` bytes at `addr` of this process into `buf` through the kernel
/// (`process_vm_readv`), which reports an unreadable address instead of faulting. False when
/// not all of it could be read (or the call is refused). Allocates nothing; keeps errno.
pub fn read_checked(addr: usize, buf: &mut [u8]) -> bool {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` describes `buf`, writable; the kernel checks `remote`.
    unsafe { vm_read_self(&[local], &[remote]) == buf.len() as isize }
}

/// Pages above the stack pointer probed on a stack that is not the thread's own.
const PROBE_PAGES: usize = 16;
/// Scratch the kernel copies probed pages into; never read.
static mut PROBE_SCRATCH: [u8; 4096] = [0; 4096];

/// The end of the readable memory starting at `sp`'s page, up to [`PROBE_PAGES`] pages: for a
/// stack walk on a stack that is not the thread's own (a coroutine stack, a `sigaltstack`),
/// where the memory between `sp` and the thread's stack may have unmapped gaps. One
/// `process_vm_readv` of this process, one remote iovec per page (the kernel stops at the
/// first page it cannot read and never splits an iovec); 0 when the call fails (e.g. forbidden
/// by a seccomp filter) or nothing is readable. Allocates nothing.
pub fn readable_above(sp: usize) -> usize {
    if sp == 0 {
        return 0;
    }
    let page = sp & !4095;
    // Only the address of the scratch buffer is taken: the kernel writes into it and nothing
    // ever reads it.
    let scratch = (&raw mut PROBE_SCRATCH) as *mut libc::c_void;
    let local = [libc::iovec {
        iov_base: scratch,
        iov_len: 4096,
    }; PROBE_PAGES];
    let mut remote = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 4096,
    }; PROBE_PAGES];
    for (i, r) in remote.iter_mut().enumerate() {
        r.iov_base = (page + i * 4096) as *mut libc::c_void;
    }
    // SAFETY: both iovec arrays are valid for the call; the local ones all point at the
    // scratch buffer (4096 writable bytes each); the remote ones are only read by the kernel,
    // which reports unreadable pages instead of faulting. errno is restored.
    let n = unsafe { vm_read_self(&local, &remote) };
    if n <= 0 {
        0
    } else {
        page + n as usize
    }
}

/// 64-bit hash of a stack trace: four independent multiply–rotate lanes over frames
/// `4k..4k+3` (so the dependency chain is a quarter of the frame count), combined with the
/// length and finished with MurmurHash3's fmix64.
#[inline]
pub fn hash_frames(frames: &[u64]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut lanes: [u64; 4] = [
        0x243F_6A88_85A3_08D3,
        0x1319_8A2E_0370_7344,
        0xA409_3822_299F_31D0,
        0x082E_FA98_EC4E_6C89,
    ];
    let mut chunks = frames.chunks_exact(4);
    for c in &mut chunks {
        for (l, f) in lanes.iter_mut().zip(c) {
            *l = (*l ^ f).wrapping_mul(K).rotate_left(29);
        }
    }
    for (l, f) in lanes.iter_mut().zip(chunks.remainder()) {
        *l = (*l ^ f).wrapping_mul(K).rotate_left(29);
    }
    let mut h = (frames.len() as u64).wrapping_mul(K)
        ^ lanes[0]
        ^ lanes[1].rotate_left(16)
        ^ lanes[2].rotate_left(32)
        ^ lanes[3].rotate_left(48);
    h ^= h >> 33;
    h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    h ^= h >> 33;
    h = h.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn depth3(out: &mut [u64; MAX_FRAMES]) -> usize {
        let fp = crate::frame_pointer!();
        walk(fp, current_stack_bounds(false).1, out)
    }

    #[test]
    fn walks_this_thread() {
        let mut out = [0u64; MAX_FRAMES];
        let n = std::thread::spawn(move || depth3(&mut out)).join().unwrap();
        assert!(n >= 2, "only {n} frames");
    }

    #[test]
    fn readable_above_stops_at_an_unmapped_page() {
        // SAFETY: a fresh private anonymous mapping of 4 pages; the last two are unmapped
        // again, and the mapping is released at the end.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                4 * 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            ) as usize;
            assert_ne!(base as *mut libc::c_void, libc::MAP_FAILED);
            libc::munmap((base + 2 * 4096) as *mut libc::c_void, 2 * 4096);
            assert_eq!(readable_above(base + 100), base + 2 * 4096);
            assert_eq!(readable_above(base + 4096 + 8), base + 2 * 4096);
            libc::munmap(base as *mut libc::c_void, 2 * 4096);
            assert_eq!(readable_above(base + 8), 0);
        }
    }

    #[test]
    fn hash_differs_by_order() {
        assert_ne!(hash_frames(&[1, 2]), hash_frames(&[2, 1]));
        assert_ne!(hash_frames(&[1]), hash_frames(&[1, 0]));
        assert_ne!(hash_frames(&[1, 2, 3, 4, 5]), hash_frames(&[5, 2, 3, 4, 1]));
        assert_ne!(hash_frames(&[0; 4]), hash_frames(&[0; 8]));
    }

    #[test]
    fn hash_has_no_collisions_on_similar_stacks() {
        // Stacks that differ in one frame, by one return-address offset, at any depth.
        let mut seen = std::collections::HashSet::new();
        let base: Vec<u64> = (0..24).map(|i| 0x5555_5555_0000 + i * 0x40).collect();
        for depth in 1..=base.len() {
            for pos in 0..depth {
                for delta in 1..64u64 {
                    let mut s = base[..depth].to_vec();
                    s[pos] += delta;
                    assert!(
                        seen.insert(hash_frames(&s)),
                        "collision at {depth}/{pos}/{delta}"
                    );
                }
            }
        }
    }
}
