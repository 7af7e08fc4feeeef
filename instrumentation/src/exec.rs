//! The region across `exec`: removed when the exec succeeds, kept when it fails.
//!
//! A process that `exec`s a program without the shim (a static binary, a cleared environment)
//! would leave the region of its image behind: nothing runs in that process that could remove
//! it afterwards. So the exec wrappers of the preload library call [`before_exec`], which
//!
//! 1. renames the region aside (`….heapdump` → `….heapdump.exec`: the collector and the
//!    dead-region bound only look at `*.heapdump`, so it is not listed meanwhile);
//! 2. starts a helper that removes the aside file once the exec succeeded. It is told by a
//!    pipe whose only writer is this process, with `O_CLOEXEC`: a successful exec closes it,
//!    and the helper reads end-of-file. The helper is a grandchild made with raw `clone`
//!    calls whose exit signal is none (the program gets no `SIGCHLD` and `wait` does not see
//!    it): its parent exits at once and is reaped here (`__WCLONE`), so it is reparented to
//!    init (or the nearest subreaper), which reaps it. It closes every other descriptor,
//!    blocks every signal, and only reads, unlinks and exits;
//!
//! and, when the exec call returns (it failed), [`after_failed_exec`] renames the region back
//! and writes one byte to the pipe, so the helper exits without removing anything. The same
//! inode stays mapped throughout: nothing the other threads write is lost.
//!
//! Nothing is done in a `vfork` child (another pid than the region's: its memory is the
//! parent's) or before recording started. `HEAPDUMP_KEEP=1` keeps the region of a process
//! that exits, not of one that `exec`s away: behind a wrapper script (pyenv's shims, a
//! launcher) every helper that `exec`s would otherwise leave a region, and push the regions
//! that matter out of the dead-region bound; the program exec'd, if it runs with the shim,
//! records into a region of its own, kept at its exit. If the helper cannot be made (no `clone` under a sandbox), the region is renamed
//! back at once and left to the dead-region bound, as before.

use crate::state::global;

/// What [`before_exec`] did, for [`after_failed_exec`].
#[derive(Debug)]
pub struct ExecGuard {
    /// The region was renamed aside and a helper waits on `pipe`.
    active: bool,
    /// Write end of the helper's pipe.
    pipe: libc::c_int,
    /// The aside name, NUL-terminated.
    aside: [u8; 648],
}

/// Suffix of the aside name.
const ASIDE: &[u8] = b".exec";

/// Prepares an `exec` of this process: see the module documentation. Never fails: a guard
/// that did nothing is returned when nothing can be done. errno is left as it was.
pub fn before_exec() -> ExecGuard {
    let mut guard = ExecGuard {
        active: false,
        pipe: -1,
        aside: [0; 648],
    };
    let Some(g) = global() else { return guard };
    // SAFETY: getpid has no preconditions.
    if unsafe { libc::getpid() } as u32 != g.pid {
        return guard;
    }
    let Some(len) = g.path.iter().position(|b| *b == 0) else {
        return guard;
    };
    if len + ASIDE.len() + 1 > guard.aside.len() {
        return guard;
    }
    // SAFETY: errno is this thread's.
    let errno = unsafe { *libc::__errno_location() };
    guard.aside[..len].copy_from_slice(&g.path[..len]);
    guard.aside[len..len + ASIDE.len()].copy_from_slice(ASIDE);
    let path = g.path.as_ptr() as *const libc::c_char;
    let aside = guard.aside.as_ptr() as *const libc::c_char;
    // SAFETY: both paths are NUL-terminated.
    if unsafe { libc::rename(path, aside) } != 0 {
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = errno };
        return guard;
    }
    let mut fds = [-1 as libc::c_int; 2];
    // SAFETY: `fds` has room for two descriptors.
    let piped = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == 0;
    if piped && spawn_helper(fds[0], fds[1], aside) {
        // SAFETY: our copy of the read end; the helper has its own.
        unsafe { libc::close(fds[0]) };
        guard.active = true;
        guard.pipe = fds[1];
    } else {
        if piped {
            // SAFETY: the pipe made above, unused.
            unsafe {
                libc::close(fds[0]);
                libc::close(fds[1]);
            }
        }
        // SAFETY: both paths are NUL-terminated.
        unsafe { libc::rename(aside, path) };
    }
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = errno };
    guard
}

/// After an exec call returned (it failed): the region is renamed back and the helper told to
/// leave it. errno (the exec's error) is left as it was.
pub fn after_failed_exec(guard: ExecGuard) {
    if !guard.active {
        return;
    }
    let Some(g) = global() else { return };
    // SAFETY: errno is this thread's.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: both paths are NUL-terminated; the pipe is ours; one byte from a local.
    unsafe {
        libc::rename(
            guard.aside.as_ptr() as *const libc::c_char,
            g.path.as_ptr() as *const libc::c_char,
        );
        let b = 1u8;
        libc::write(guard.pipe, &b as *const u8 as *const libc::c_void, 1);
        libc::close(guard.pipe);
        *libc::__errno_location() = errno;
    }
}

/// Raw `clone` with no flags and no exit signal: a copy of this thread's process (as `fork`,
/// without the `pthread_atfork` handlers), invisible to `wait` without `__WCLONE`. Returns
/// the child's pid in the parent, 0 in the child, -1 on failure.
fn clone_quiet() -> libc::pid_t {
    // SAFETY: clone without CLONE_VM and with a null stack behaves as fork: the child runs on
    // a copy of this stack. The child only makes system calls (see `helper`).
    unsafe {
        libc::syscall(
            libc::SYS_clone,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        ) as libc::pid_t
    }
}

/// Starts the grandchild that waits on `read_end` (closing its copy of `write_end`) and unlinks
/// `aside` at end-of-file; true when it runs.
fn spawn_helper(read_end: libc::c_int, write_end: libc::c_int, aside: *const libc::c_char) -> bool {
    let child = clone_quiet();
    if child < 0 {
        return false;
    }
    if child == 0 {
        // The intermediate child: start the helper and leave at once.
        let helper = clone_quiet();
        if helper == 0 {
            // SAFETY: only system calls on our own descriptors and the NUL-terminated path.
            unsafe { helper_main(read_end, write_end, aside) };
        }
        loop {
            // SAFETY: exit ends this (single-threaded) child.
            unsafe { libc::syscall(libc::SYS_exit, if helper > 0 { 0 } else { 1 }) };
        }
    }
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child (made with no exit signal: __WCLONE).
        let r = unsafe { libc::waitpid(child, &mut status, libc::__WCLONE) };
        if r == child {
            break;
        }
        // SAFETY: errno is this thread's.
        if r < 0 && unsafe { *libc::__errno_location() } != libc::EINTR {
            return false;
        }
    }
    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
}

/// The helper: every signal blocked, its copy of `write_end` closed (else it would never see
/// end-of-file) and, where `close_range` exists (Linux 5.9), every other descriptor but
/// `read_end`; waits for end-of-file (the exec succeeded, or the process is gone) and unlinks
/// `aside`, or for a byte (the exec failed) and leaves it. Never returns.
///
/// # Safety
/// Runs in a fresh child of a possibly multithreaded process: system calls only.
unsafe fn helper_main(
    read_end: libc::c_int,
    write_end: libc::c_int,
    aside: *const libc::c_char,
) -> ! {
    // SAFETY: a full signal set, then system calls on this process's own state.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &all as *const libc::sigset_t,
            std::ptr::null_mut::<libc::sigset_t>(),
            8usize,
        );
        libc::close(write_end);
        if read_end > 0 {
            libc::syscall(libc::SYS_close_range, 0u32, (read_end - 1) as u32, 0u32);
        }
        libc::syscall(libc::SYS_close_range, (read_end + 1) as u32, u32::MAX, 0u32);
        let mut b = 0u8;
        let n = loop {
            let n = libc::read(read_end, &mut b as *mut u8 as *mut libc::c_void, 1);
            if n >= 0 || *libc::__errno_location() != libc::EINTR {
                break n;
            }
        };
        if n == 0 {
            libc::unlink(aside);
        }
        loop {
            libc::syscall(libc::SYS_exit, 0);
        }
    }
}
