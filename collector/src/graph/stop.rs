//! `--stop`: freezing the target while its graph is built, so that the leak report is exact
//! (no pointer moves while the contents are read) and the threads' registers count as roots.
//!
//! Every thread is attached with `PTRACE_SEIZE` and stopped with `PTRACE_INTERRUPT` (a thread
//! blocked in a system call is interrupted; the call is restarted when it resumes), its
//! general-purpose registers read with `PTRACE_GETREGS`. [`Stopped`]'s drop detaches every
//! thread, which resumes it; if the collector dies instead, the kernel detaches its tracees
//! and they resume too — the target is never left stopped. Threads created while attaching are
//! attached in further rounds.

use anyhow::{anyhow, Result};
use std::time::Instant;

/// One stopped thread.
#[derive(Debug, Clone)]
pub struct StoppedThread {
    /// Thread id.
    pub tid: u32,
    /// Its stack pointer.
    pub sp: u64,
    /// Its general-purpose registers' values (x86-64: rax … r15, rip).
    pub registers: Vec<u64>,
}

/// A target held stopped; resumed when dropped.
#[derive(Debug)]
pub struct Stopped {
    /// The stopped threads, by thread id.
    pub threads: Vec<StoppedThread>,
    attached: Vec<u32>,
    since: Instant,
}

impl Stopped {
    /// How long the target has been stopped, seconds.
    pub fn seconds(&self) -> f64 {
        self.since.elapsed().as_secs_f64()
    }
}

/// Whether thread `tid` of `pid` is a zombie (`Z` in its `stat`).
fn zombie(pid: u32, tid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('Z')))
        .unwrap_or(false)
}

/// The thread ids of `pid`, sorted.
pub fn tids(pid: u32) -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// Stops every thread of `pid` and reads their registers.
///
/// Errors: the process cannot be traced (another tracer, ptrace not permitted: the message
/// says what to do), or it is gone. Threads attached before an error are resumed.
pub fn stop(pid: u32) -> Result<Stopped> {
    stop_some(pid, None)
}

/// Threads of `pid` that can be stopped for a moment without the program noticing: blocked
/// (state `S`) in a system call the kernel restarts transparently after a ptrace stop —
/// `read`/`write` family on a pipe, a terminal or a file, `poll`/`select` family, `wait4`,
/// `waitid`, `nanosleep`, `clock_nanosleep`, `futex`, `pause`. Not those that fail with `EINTR`
/// after a stop (signal(7): `epoll_wait`, `sigtimedwait`, `semop`, socket calls with
/// timeouts, `read` of an inotify descriptor): helper Y, 2, an event loop that treats `EINTR`
/// as fatal died of one `heapdump leaks`. Running threads are left alone too (one may enter
/// such a call before the stop reaches it).
pub fn quietly_stoppable(pid: u32) -> Vec<u32> {
    const RW: [u64; 8] = [0, 1, 17, 18, 19, 20, 295, 296]; // read write pread64 pwrite64 readv writev preadv pwritev
    const OTHERS: [u64; 11] = [7, 23, 34, 35, 61, 202, 230, 247, 270, 271, 73]; // poll select pause nanosleep wait4 futex clock_nanosleep waitid pselect6 ppoll flock
    tids(pid)
        .into_iter()
        .filter(|&tid| {
            let state = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('S')));
            if state != Some(true) {
                return false;
            }
            let Ok(sc) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")) else {
                return false;
            };
            let mut f = sc.split_whitespace();
            let Some(nr) = f.next().and_then(|n| n.parse::<u64>().ok()) else {
                return false; // "running", or "-1": not in a system call
            };
            if OTHERS.contains(&nr) {
                return true;
            }
            if !RW.contains(&nr) {
                return false;
            }
            let fd = f
                .next()
                .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok());
            let Some(fd) = fd else { return false };
            let Ok(target) = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")) else {
                return false;
            };
            let t = target.to_string_lossy();
            // Sockets (a receive timeout makes them fail with EINTR) and anonymous inodes
            // (inotify, eventfd, timerfd, …) are left alone.
            !(t.starts_with("socket:") || t.starts_with("anon_inode:"))
        })
        .collect()
}

/// [`stop`] of the threads `only` lists (every thread when `None`).
pub fn stop_some(pid: u32, only: Option<&[u32]>) -> Result<Stopped> {
    if pid == std::process::id() {
        anyhow::bail!("cannot stop pid {pid}: it is this heapdump process itself");
    }
    let mut s = Stopped {
        threads: Vec::new(),
        attached: Vec::new(),
        since: Instant::now(),
    };
    let mut interrupted: Vec<u32> = Vec::new();
    let mut failed = None;
    for _round in 0..100 {
        if failed.is_some() {
            break;
        }
        let new: Vec<u32> = tids(pid)
            .into_iter()
            .filter(|t| !s.attached.contains(t) && only.is_none_or(|o| o.contains(t)))
            // A main thread that called pthread_exit stays a zombie while the others run:
            // it cannot be traced, and has no registers to read.
            .filter(|t| !zombie(pid, *t))
            .collect();
        if new.is_empty() {
            break;
        }
        for tid in new {
            // SAFETY: ptrace requests on a thread id with no pointers passed.
            let r = unsafe {
                libc::ptrace(
                    libc::PTRACE_SEIZE,
                    tid as libc::pid_t,
                    std::ptr::null_mut::<libc::c_void>(),
                    std::ptr::null_mut::<libc::c_void>(),
                )
            };
            if r != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ESRCH) {
                    continue; // the thread exited meanwhile
                }
                // Reported once the threads interrupted so far are in their stop (only a
                // stopped tracee can be detached, which resumes it).
                failed = Some(anyhow!(
                    "cannot stop pid {pid} (thread {tid}): {e}; --stop attaches with ptrace: \
                     the process must not be traced already (a debugger), and ptrace must be \
                     allowed (same user with /proc/sys/kernel/yama/ptrace_scope 0, or root)"
                ));
                break;
            }
            s.attached.push(tid);
            // SAFETY: as above.
            unsafe {
                libc::ptrace(
                    libc::PTRACE_INTERRUPT,
                    tid as libc::pid_t,
                    std::ptr::null_mut::<libc::c_void>(),
                    std::ptr::null_mut::<libc::c_void>(),
                )
            };
            interrupted.push(tid);
        }
        // Every thread of the round is interrupted before any is waited for: a busy thread
        // stops only when it next gets a CPU, and with many threads per core those delays
        // overlap instead of adding up (33 churning threads on 2 cores: 0.5-1.3 s one by one).
        for tid in interrupted.drain(..) {
            let mut status = 0;
            // SAFETY: waiting for our tracee; `status` is writable.
            let w = unsafe { libc::waitpid(tid as libc::pid_t, &mut status, libc::__WALL) };
            if w != tid as libc::pid_t {
                continue;
            }
            // SAFETY: a zeroed user_regs_struct is valid; GETREGS fills it for a stopped
            // tracee.
            let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
            // SAFETY: as above; the pointer is to our own struct.
            let r = unsafe {
                libc::ptrace(
                    libc::PTRACE_GETREGS,
                    tid as libc::pid_t,
                    std::ptr::null_mut::<libc::c_void>(),
                    &mut regs as *mut libc::user_regs_struct as *mut libc::c_void,
                )
            };
            if r == 0 {
                s.threads.push(StoppedThread {
                    tid,
                    sp: regs.rsp,
                    registers: vec![
                        regs.rax,
                        regs.rbx,
                        regs.rcx,
                        regs.rdx,
                        regs.rsi,
                        regs.rdi,
                        regs.rbp,
                        regs.r8,
                        regs.r9,
                        regs.r10,
                        regs.r11,
                        regs.r12,
                        regs.r13,
                        regs.r14,
                        regs.r15,
                        regs.fs_base,
                        regs.gs_base,
                    ],
                });
            }
        }
    }
    if let Some(e) = failed {
        return Err(e); // dropping `s` detaches (resumes) every thread attached
    }
    s.threads.sort_by_key(|t| t.tid);
    Ok(s)
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for &tid in &self.attached {
            // SAFETY: detaching our tracee resumes it; no pointers passed.
            unsafe {
                libc::ptrace(
                    libc::PTRACE_DETACH,
                    tid as libc::pid_t,
                    std::ptr::null_mut::<libc::c_void>(),
                    std::ptr::null_mut::<libc::c_void>(),
                )
            };
        }
    }
}
