//! The region across `exec`: removed once the exec succeeded, kept when it fails.
//!
//! A process that `exec`s a program without the shim (a static binary, a cleared environment)
//! would leave the region of its image behind: nothing runs in that process that could remove
//! it afterwards. So the exec wrappers of the preload library call [`before_exec`], which
//! renames the region aside (`….heapdump` → `….heapdump.exec`: the collector and the
//! dead-region bound only look at `*.heapdump`, so it is not listed meanwhile), and, when the
//! exec call returns (it failed), [`after_failed_exec`], which renames it back. The same inode
//! stays mapped throughout: nothing the other threads write is lost.
//!
//! An aside file whose process no longer maps it is one whose exec succeeded (a successful
//! exec replaces the address space; a failed one renames the file back while still mapping
//! it), or whose process died: it is removed by
//!
//! * the new image, when it runs with the shim (`region.rs`, `remove_stale`: the files of this
//!   pid and start time), at its start-up;
//! * any process starting to record into the directory (`region.rs`, `bound_dead_regions`),
//!   and `heapdump gc`, when the process is gone or no longer maps it.
//!
//! Until then an image without the shim leaves the file in the directory (not listed, not
//! counted). Earlier builds removed it at once from a helper process made for each exec; the
//! helper, a grandchild whose parent exited at once, was reparented to the nearest child
//! subreaper or PID 1, which got a `SIGCHLD` and a child it never made (`wait` in tini, a
//! container's PID 1, supervisors: helper N, 5). No process is made now.
//!
//! Nothing is done in a `vfork` child (another pid than the region's: its memory is the
//! parent's) or before recording started. `HEAPDUMP_KEEP=1` keeps the region of a process
//! that exits, not of one that `exec`s away: behind a wrapper script (pyenv's shims, a
//! launcher) every helper that `exec`s would otherwise leave a region, and push the regions
//! that matter out of the dead-region bound; the program exec'd, if it runs with the shim,
//! records into a region of its own, kept at its exit.

use crate::state::global;

/// What [`before_exec`] did, for [`after_failed_exec`].
#[derive(Debug)]
pub struct ExecGuard {
    /// The region was renamed aside.
    active: bool,
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
    guard.active = true;
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = errno };
    guard
}

/// After an exec call returned (it failed): the region is renamed back. errno (the exec's error) is left as it was.
pub fn after_failed_exec(guard: ExecGuard) {
    if !guard.active {
        return;
    }
    let Some(g) = global() else { return };
    // SAFETY: errno is this thread's.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: both paths are NUL-terminated.
    unsafe {
        libc::rename(
            guard.aside.as_ptr() as *const libc::c_char,
            g.path.as_ptr() as *const libc::c_char,
        );
        *libc::__errno_location() = errno;
    }
}
