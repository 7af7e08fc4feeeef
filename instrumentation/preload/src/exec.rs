//! The `exec` family: the region is renamed aside before the call and removed by a helper once
//! the exec succeeded, or renamed back when the call returns (it failed): see
//! `heapdump_instrumentation::exec`. `posix_spawn` does not replace the caller, and glibc's
//! `system`/`popen` go through it: not wrapped.
//!
//! `execl`, `execle` and `execlp` are variadic, which stable Rust cannot define: on x86-64 they
//! are naked functions that store the register arguments next to the stacked ones' address
//! and call [`execl_impl`], which builds the argument vector (as glibc's do) and calls the
//! vector form. Elsewhere glibc's own are used (their exec is not followed).

use heapdump_instrumentation::exec::{after_failed_exec, before_exec};
use libc::{c_char, c_int};
use std::sync::atomic::AtomicUsize;

static REAL_EXECVE: AtomicUsize = AtomicUsize::new(0);
static REAL_EXECV: AtomicUsize = AtomicUsize::new(0);
static REAL_EXECVP: AtomicUsize = AtomicUsize::new(0);
static REAL_EXECVPE: AtomicUsize = AtomicUsize::new(0);
static REAL_FEXECVE: AtomicUsize = AtomicUsize::new(0);
static REAL_EXECVEAT: AtomicUsize = AtomicUsize::new(0);

type Argv = *const *const c_char;

/// Sets errno to ENOSYS and returns -1 (the next definition could not be found).
fn no_symbol() -> c_int {
    super::set_errno(libc::ENOSYS);
    -1
}

/// `execve(2)`.
///
/// # Safety
/// As `execve(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execve(path: *const c_char, argv: Argv, envp: Argv) -> c_int {
    let f = super::next_symbol(&REAL_EXECVE, b"execve\0");
    if f == 0 {
        return no_symbol();
    }
    let g = before_exec();
    // SAFETY: `f` is the next execve, of this signature; the arguments are the caller's.
    let r = unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(*const c_char, Argv, Argv) -> c_int>(f)(
            path, argv, envp,
        )
    };
    after_failed_exec(g);
    r
}

/// `execv(3)`.
///
/// # Safety
/// As `execv(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execv(path: *const c_char, argv: Argv) -> c_int {
    let f = super::next_symbol(&REAL_EXECV, b"execv\0");
    if f == 0 {
        return no_symbol();
    }
    let g = before_exec();
    // SAFETY: `f` is the next execv, of this signature.
    let r = unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(*const c_char, Argv) -> c_int>(f)(
            path, argv,
        )
    };
    after_failed_exec(g);
    r
}

/// `execvp(3)`: the whole search of `PATH` happens between the rename and its undoing, so a
/// candidate that fails on the way does not matter; only the call's result does.
///
/// # Safety
/// As `execvp(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: Argv) -> c_int {
    let f = super::next_symbol(&REAL_EXECVP, b"execvp\0");
    if f == 0 {
        return no_symbol();
    }
    let g = before_exec();
    // SAFETY: `f` is the next execvp, of this signature.
    let r = unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(*const c_char, Argv) -> c_int>(f)(
            file, argv,
        )
    };
    after_failed_exec(g);
    r
}

/// `execvpe(3)`.
///
/// # Safety
/// As `execvpe(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execvpe(file: *const c_char, argv: Argv, envp: Argv) -> c_int {
    let f = super::next_symbol(&REAL_EXECVPE, b"execvpe\0");
    if f == 0 {
        return no_symbol();
    }
    let g = before_exec();
    // SAFETY: `f` is the next execvpe, of this signature.
    let r = unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(*const c_char, Argv, Argv) -> c_int>(f)(
            file, argv, envp,
        )
    };
    after_failed_exec(g);
    r
}

/// `fexecve(3)`.
///
/// # Safety
/// As `fexecve(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fexecve(fd: c_int, argv: Argv, envp: Argv) -> c_int {
    let f = super::next_symbol(&REAL_FEXECVE, b"fexecve\0");
    if f == 0 {
        return no_symbol();
    }
    let g = before_exec();
    // SAFETY: `f` is the next fexecve, of this signature.
    let r = unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(c_int, Argv, Argv) -> c_int>(f)(
            fd, argv, envp,
        )
    };
    after_failed_exec(g);
    r
}

/// `execveat(2)` (glibc 2.34+).
///
/// # Safety
/// As `execveat(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execveat(
    dirfd: c_int,
    path: *const c_char,
    argv: Argv,
    envp: Argv,
    flags: c_int,
) -> c_int {
    let f = super::next_symbol(&REAL_EXECVEAT, b"execveat\0");
    if f == 0 {
        return no_symbol();
    }
    let g = before_exec();
    // SAFETY: `f` is the next execveat, of this signature.
    let r = unsafe {
        std::mem::transmute::<
            usize,
            unsafe extern "C" fn(c_int, *const c_char, Argv, Argv, c_int) -> c_int,
        >(f)(dirfd, path, argv, envp, flags)
    };
    after_failed_exec(g);
    r
}

/// Which list form called [`execl_impl`].
const EXECL: c_int = 0;
const EXECLE: c_int = 1;
const EXECLP: c_int = 2;

/// Most arguments taken from a list call (glibc has no limit but memory; the kernel's is
/// lower): more is refused with E2BIG.
const LIST_MAX: usize = 1 << 21;

/// The list forms' common part: the arguments after `path` are the five register ones at
/// `regs`, then the stacked ones at `stack`, up to a null pointer (then, for `execle`, the
/// environment). Builds the vector on its own frame (in an anonymous mapping past
/// [`ON_STACK`] arguments) and calls the vector form.
///
/// # Safety
/// Called only by the naked functions below, with their caller's arguments.
unsafe extern "C" fn execl_impl(
    path: *const c_char,
    regs: Argv,
    stack: Argv,
    kind: c_int,
) -> c_int {
    // SAFETY: the first five list arguments were stored at `regs`, the rest follow at
    // `stack`, as the x86-64 calling convention passes them; the list ends with a null
    // pointer (the caller's contract).
    let arg = |i: usize| unsafe {
        if i < 5 {
            *regs.add(i)
        } else {
            *stack.add(i - 5)
        }
    };
    let mut n = 0usize;
    while !arg(n).is_null() {
        n += 1;
        if n >= LIST_MAX {
            super::set_errno(libc::E2BIG);
            return -1;
        }
    }
    // On this frame when it fits, as glibc's own `execl` builds it (`alloca`): a `vfork`
    // child shares its parent's memory, and a mapping made here was the parent's for good once
    // the exec succeeded (helper N, 6: 4 KiB per `vfork` + `execl`, 80 MB after 20,000).
    let mut on_stack = [std::ptr::null::<c_char>(); ON_STACK];
    let bytes = (n + 1) * std::mem::size_of::<*const c_char>();
    let mapped = n + 1 > ON_STACK;
    let v = if mapped {
        // SAFETY: a fresh private anonymous mapping, released below.
        let v = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if v == libc::MAP_FAILED {
            super::set_errno(libc::ENOMEM);
            return -1;
        }
        v
    } else {
        on_stack.as_mut_ptr() as *mut libc::c_void
    };
    let argv = v as *mut *const c_char;
    for i in 0..=n {
        // SAFETY: `argv` has room for n + 1 pointers.
        unsafe { *argv.add(i) = arg(i) };
    }
    // SAFETY: glibc's `environ`, read as its own execl/execlp do.
    let env = unsafe { *std::ptr::addr_of!(environ) };
    // SAFETY: a vector as the vector forms expect, null-terminated.
    let r = unsafe {
        match kind {
            EXECLE => execve(path, argv, arg(n + 1) as Argv),
            EXECLP => execvp(path, argv),
            _ => execve(path, argv, env),
        }
    };
    if mapped {
        // SAFETY: the mapping made above; errno kept for the caller.
        unsafe {
            let e = *libc::__errno_location();
            libc::munmap(v, bytes);
            *libc::__errno_location() = e;
        }
    }
    r
}

/// Arguments a list form builds its vector for on its own frame (4 KiB, the stack a vfork
/// child may use of its parent's); longer lists go to a mapping of their own.
const ON_STACK: usize = 512;

extern "C" {
    static environ: *const *const c_char;
}

/// Stores the register arguments 2–6 in a 48-byte frame, then calls [`execl_impl`] with the
/// path, that frame, the address of the stacked arguments and the kind.
macro_rules! list_form {
    ($name:ident, $kind:expr, $doc:literal) => {
        #[doc = $doc]
        ///
        /// # Safety
        /// As the C function: a list of arguments ending with a null pointer.
        #[cfg(target_arch = "x86_64")]
        #[unsafe(naked)]
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name() -> c_int {
            std::arch::naked_asm!(
                "push rbp",
                "mov rbp, rsp",
                "sub rsp, 48",
                "mov [rsp], rsi",
                "mov [rsp + 8], rdx",
                "mov [rsp + 16], rcx",
                "mov [rsp + 24], r8",
                "mov [rsp + 32], r9",
                "mov rsi, rsp",
                "lea rdx, [rbp + 16]",
                "mov ecx, {kind}",
                "call {imp}",
                "leave",
                "ret",
                kind = const $kind,
                imp = sym execl_impl,
            )
        }
    };
}

list_form!(execl, EXECL, "`execl(3)`.");
list_form!(execle, EXECLE, "`execle(3)`.");
list_form!(execlp, EXECLP, "`execlp(3)`.");
