//! The ptrace side of `heapdump attach`: holding every thread of a process stopped, reading
//! and writing its memory and registers, and letting one thread run a while.
//!
//! Every thread is attached with `PTRACE_SEIZE` and stopped with `PTRACE_INTERRUPT` (a thread
//! blocked in a system call is interrupted; the kernel restarts the call when it resumes
//! with the registers it stopped with). A signal that arrives meanwhile is kept and delivered
//! when the thread is detached. [`Held`]'s drop detaches every thread, which resumes it; if
//! `heapdump` dies instead, the kernel detaches its tracees and they resume too.

use anyhow::{anyhow, bail, Result};
use std::os::unix::fs::FileExt;

/// One thread held stopped.
#[derive(Debug)]
pub struct Thread {
    /// Thread id.
    pub tid: u32,
    /// Its registers as it stopped.
    pub regs: libc::user_regs_struct,
    /// A signal it received while held (delivered at the detach), 0 if none.
    pub pending: i32,
    /// Whether it is running (resumed by [`Held::resume`], not yet stopped again).
    running: bool,
}

/// A process whose threads are attached (and stopped, unless resumed).
#[derive(Debug)]
pub struct Held {
    /// Process id.
    pub pid: u32,
    /// Its threads, by thread id.
    pub threads: Vec<Thread>,
    mem: std::fs::File,
}

fn tids(pid: u32) -> Vec<u32> {
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

fn ptrace(req: libc::c_uint, tid: u32, addr: usize, data: usize) -> std::io::Result<i64> {
    // SAFETY: requests whose pointers (when any) point to our own live structs.
    let r = unsafe {
        libc::ptrace(
            req,
            tid as libc::pid_t,
            addr as *mut libc::c_void,
            data as *mut libc::c_void,
        )
    };
    if r == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Waits (at most 5 s) for the tracee `tid` to stop; returns the stop signal (`SIGTRAP` for
/// the stops heapdump asks for). Errors: it exited, or is a zombie (a process that exits while
/// held: its leader is reported only once every other thread was reaped, so a blocking wait
/// could hang), or did not stop in time.
fn wait_stop(tid: u32) -> Result<i32> {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut nap = 20u64;
    loop {
        let mut status = 0;
        // SAFETY: polling our tracee; `status` is writable.
        let w = unsafe {
            libc::waitpid(
                tid as libc::pid_t,
                &mut status,
                libc::__WALL | libc::WNOHANG,
            )
        };
        if w == tid as libc::pid_t {
            if libc::WIFSTOPPED(status) {
                return Ok(libc::WSTOPSIG(status));
            }
            bail!("thread {tid} exited");
        }
        if w == -1 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                bail!("waiting for thread {tid}: {e}");
            }
        }
        let state = std::fs::read_to_string(format!("/proc/{tid}/stat")).unwrap_or_default();
        let state = state
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().next());
        if matches!(state, None | Some("Z") | Some("X")) {
            bail!("thread {tid} exited");
        }
        if std::time::Instant::now() >= until {
            bail!("thread {tid} did not stop within 5 s");
        }
        std::thread::sleep(std::time::Duration::from_micros(nap));
        nap = (nap * 2).min(2000);
    }
}

/// Whether a stop with `sig` is one heapdump asked for (`PTRACE_INTERRUPT`'s event stop, a
/// single step), rather than a signal for the program.
fn ours(sig: i32) -> bool {
    sig == libc::SIGTRAP || sig == libc::SIGSTOP
}

/// The message for a `PTRACE_SEIZE` refused with `e`.
fn denied(pid: u32, e: &std::io::Error) -> anyhow::Error {
    // Not a matter of rights: the process is gone, or exited and waits to be reaped.
    if matches!(crate::regions::proc_state(pid), Some('Z' | 'X')) {
        return anyhow!(
            "cannot attach to pid {pid}: the process has exited (a zombie: its parent has not \
             reaped it); nothing was changed"
        );
    }
    if e.raw_os_error() == Some(libc::ESRCH) {
        return anyhow!("cannot attach to pid {pid}: the process has exited; nothing was changed");
    }
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "absent".into());
    anyhow!(
        "cannot attach to pid {pid}: ptrace refused ({e}); nothing was changed. heapdump attach \
         needs the same user and kernel.yama.ptrace_scope 0 (it is {scope}; 1 allows only \
         descendants), or CAP_SYS_PTRACE; and no debugger may trace the process already"
    )
}

impl Held {
    /// Attaches to every thread of `pid` and stops them all.
    ///
    /// Errors: ptrace refused (the message names `kernel.yama.ptrace_scope` and
    /// `CAP_SYS_PTRACE`), the process is gone. Threads attached before an error are resumed.
    pub fn stop(pid: u32) -> Result<Held> {
        if pid == std::process::id() {
            bail!("cannot attach to pid {pid}: it is this heapdump process itself");
        }
        let mem = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    anyhow!("no process {pid}")
                } else {
                    denied(pid, &e)
                }
            })?;
        let mut h = Held {
            pid,
            threads: Vec::new(),
            mem,
        };
        for _round in 0..100 {
            let new: Vec<u32> = tids(pid)
                .into_iter()
                .filter(|t| !h.threads.iter().any(|x| x.tid == *t))
                .collect();
            if new.is_empty() {
                break;
            }
            let mut round = Vec::new();
            for tid in new {
                if let Err(e) = ptrace(libc::PTRACE_SEIZE, tid, 0, 0) {
                    if e.raw_os_error() == Some(libc::ESRCH) {
                        continue;
                    }
                    // Dropping `h` detaches those stopped so far; the others in this round
                    // are stopped first (only a stopped tracee can be detached).
                    h.wait_all(&round);
                    return Err(denied(pid, &e));
                }
                let _ = ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0);
                round.push(tid);
            }
            h.wait_all(&round);
        }
        if h.threads.is_empty() {
            bail!("no process {pid}");
        }
        Ok(h)
    }

    /// Waits for each of `tids` (attached and interrupted) to stop, reads its registers, and
    /// adds it to the held threads.
    fn wait_all(&mut self, tids: &[u32]) {
        for &tid in tids {
            let mut pending = 0;
            let mut ok = false;
            for _ in 0..64 {
                match wait_stop(tid) {
                    Ok(sig) if ours(sig) => {
                        ok = true;
                        break;
                    }
                    Ok(sig) => {
                        // A signal for the program: kept for the detach; the interrupt's
                        // stop follows once the thread is let go on.
                        pending = sig;
                        let _ = ptrace(libc::PTRACE_CONT, tid, 0, 0);
                    }
                    Err(_) => break,
                }
            }
            if !ok {
                continue;
            }
            if let Ok(regs) = getregs(tid) {
                self.threads.push(Thread {
                    tid,
                    regs,
                    pending,
                    running: false,
                });
            }
        }
    }

    /// Lets every thread run (the safe point was not reached), then stops them all again
    /// after `pause`; threads created meanwhile are attached too.
    pub fn let_run(&mut self, pause: std::time::Duration) -> Result<()> {
        let all: Vec<u32> = self.threads.iter().map(|t| t.tid).collect();
        self.let_run_only(&all, pause)
    }

    /// Lets the threads `tids` run (the others stay stopped), then stops them again after
    /// `pause`; threads they created meanwhile are attached too.
    pub fn let_run_only(&mut self, tids: &[u32], pause: std::time::Duration) -> Result<()> {
        // A signal kept from an earlier stop is delivered now, as it would have been; a
        // thread running already (resumed) keeps it for the detach.
        let mut kept = Vec::new();
        for t in self.threads.iter().filter(|t| tids.contains(&t.tid)) {
            if ptrace(libc::PTRACE_CONT, t.tid, 0, t.pending as usize).is_err() && t.pending != 0 {
                kept.push((t.tid, t.pending));
            }
        }
        std::thread::sleep(pause);
        self.threads.retain(|t| !tids.contains(&t.tid));
        for &tid in tids {
            let _ = ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0);
        }
        self.wait_all(tids);
        for (tid, sig) in kept {
            if let Ok(t) = self.thread_mut(tid) {
                if t.pending == 0 {
                    t.pending = sig;
                }
            }
        }
        // New threads.
        for _round in 0..100 {
            let new: Vec<u32> = tids_of(self.pid)
                .into_iter()
                .filter(|t| !self.threads.iter().any(|x| x.tid == *t))
                .collect();
            if new.is_empty() {
                break;
            }
            let mut round = Vec::new();
            for tid in new {
                if ptrace(libc::PTRACE_SEIZE, tid, 0, 0).is_ok() {
                    let _ = ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0);
                    round.push(tid);
                }
            }
            self.wait_all(&round);
        }
        if self.threads.is_empty() {
            bail!("process {} exited", self.pid);
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes at `addr`; returns how many could be read.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> usize {
        let mut done = 0;
        while done < buf.len() {
            match self.mem.read_at(&mut buf[done..], addr + done as u64) {
                Ok(0) | Err(_) => break,
                Ok(n) => done += n,
            }
        }
        done
    }

    /// Writes `data` at `addr` (also into pages mapped without write permission, as a
    /// debugger writes breakpoints).
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<()> {
        self.mem.write_all_at(data, addr).map_err(|e| {
            anyhow!(
                "writing {} bytes at {addr:#x} in pid {}: {e}",
                data.len(),
                self.pid
            )
        })
    }

    /// Reads the word at `addr`.
    pub fn word(&self, addr: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        (self.read(addr, &mut b) == 8).then(|| u64::from_le_bytes(b))
    }

    /// Makes the stopped thread `tid` run the system call `nr(args)` by pointing it at a
    /// `syscall` instruction (`gadget`) for one step; its registers are put back after.
    /// Returns the call's result (a negative errno on failure).
    pub fn syscall(&mut self, tid: u32, gadget: u64, nr: u64, args: [u64; 6]) -> Result<i64> {
        let saved = self.thread(tid)?.regs;
        let mut r = saved;
        r.rip = gadget;
        r.rax = nr;
        r.orig_rax = u64::MAX;
        (r.rdi, r.rsi, r.rdx, r.r10, r.r8, r.r9) =
            (args[0], args[1], args[2], args[3], args[4], args[5]);
        // From here until the registers are put back, the thread depends on heapdump: if it
        // were killed now, the thread would go on after the gadget. A few microseconds.
        setregs(tid, &r)?;
        let mut result = None;
        for _ in 0..16 {
            ptrace(libc::PTRACE_SINGLESTEP, tid, 0, 0)
                .map_err(|e| anyhow!("single-stepping thread {tid}: {e}"))?;
            let sig = wait_stop(tid)?;
            let now = getregs(tid)?;
            if now.rip == gadget + 2 {
                result = Some(now.rax as i64);
                break;
            }
            if !ours(sig) {
                self.thread_mut(tid)?.pending = sig;
            }
        }
        setregs(tid, &saved)?;
        result.ok_or_else(|| anyhow!("thread {tid} did not run the system call"))
    }

    /// The held thread `tid`.
    pub fn thread(&self, tid: u32) -> Result<&Thread> {
        self.threads
            .iter()
            .find(|t| t.tid == tid)
            .ok_or_else(|| anyhow!("thread {tid} is not held"))
    }

    fn thread_mut(&mut self, tid: u32) -> Result<&mut Thread> {
        self.threads
            .iter_mut()
            .find(|t| t.tid == tid)
            .ok_or_else(|| anyhow!("thread {tid} is not held"))
    }

    /// Sets the registers of the stopped thread `tid` and lets it run (the others stay
    /// stopped).
    pub fn resume(&mut self, tid: u32, regs: &libc::user_regs_struct) -> Result<()> {
        setregs(tid, regs)?;
        ptrace(libc::PTRACE_CONT, tid, 0, 0).map_err(|e| anyhow!("resuming thread {tid}: {e}"))?;
        self.thread_mut(tid)?.running = true;
        Ok(())
    }

    /// Checks the running thread `tid` without waiting: a signal it stopped for is passed on
    /// (it runs on). Errors: it exited.
    pub fn poll(&mut self, tid: u32) -> Result<()> {
        let mut status = 0;
        // SAFETY: waiting for our tracee without blocking; `status` is writable.
        let w = unsafe {
            libc::waitpid(
                tid as libc::pid_t,
                &mut status,
                libc::__WALL | libc::WNOHANG,
            )
        };
        if w == tid as libc::pid_t {
            if libc::WIFSTOPPED(status) {
                let sig = libc::WSTOPSIG(status);
                let pass = if ours(sig) { 0 } else { sig };
                let _ = ptrace(libc::PTRACE_CONT, tid, 0, pass as usize);
            } else {
                self.threads.retain(|t| t.tid != tid);
                bail!("process {} exited during the attach", self.pid);
            }
        }
        Ok(())
    }
}

fn tids_of(pid: u32) -> Vec<u32> {
    tids(pid)
}

/// The registers of the stopped thread `tid`.
pub fn getregs(tid: u32) -> Result<libc::user_regs_struct> {
    // SAFETY: a zeroed user_regs_struct is valid; GETREGS fills it.
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    ptrace(
        libc::PTRACE_GETREGS,
        tid,
        0,
        &mut regs as *mut libc::user_regs_struct as usize,
    )
    .map_err(|e| anyhow!("reading the registers of thread {tid}: {e}"))?;
    Ok(regs)
}

fn setregs(tid: u32, regs: &libc::user_regs_struct) -> Result<()> {
    ptrace(
        libc::PTRACE_SETREGS,
        tid,
        0,
        regs as *const libc::user_regs_struct as usize,
    )
    .map_err(|e| anyhow!("setting the registers of thread {tid}: {e}"))?;
    Ok(())
}

impl Drop for Held {
    fn drop(&mut self) {
        for t in &self.threads {
            if t.running {
                // Only a stopped tracee can be detached.
                if ptrace(libc::PTRACE_INTERRUPT, t.tid, 0, 0).is_err() {
                    continue;
                }
                let mut pending = 0;
                for _ in 0..64 {
                    match wait_stop(t.tid) {
                        Ok(sig) if ours(sig) => break,
                        Ok(sig) => {
                            pending = sig;
                            let _ = ptrace(libc::PTRACE_CONT, t.tid, 0, 0);
                        }
                        Err(_) => break,
                    }
                }
                let _ = ptrace(libc::PTRACE_DETACH, t.tid, 0, pending as usize);
            } else {
                let _ = ptrace(libc::PTRACE_DETACH, t.tid, 0, t.pending as usize);
            }
        }
    }
}
