//! Is the target stopped? Establishing, before a snapshot, that no thread of the target can
//! run (SIGSTOP, a debugger's or `--stop`'s ptrace stop, a cgroup freezer), and checking after
//! it that none ran, so that the region can be read as it is ([`vmo_layout::SnapshotOptions`]
//! `frozen`): nothing waited for, nothing left out.
//!
//! The check is made per thread from `/proc/PID/task/TID`: its state (`status`: `T` stopped,
//! `t` traced, `Z`/`X` exited; any state when the process's freezer cgroup says it is frozen),
//! its context switches (`status`: voluntary + involuntary) and the time it has run
//! (`schedstat`, ns, including the slice it is running now). A thread that runs at all between
//! two looks either schedules out again (one more context switch) or is still on a CPU at the
//! second look (more run time, or a state other than stopped): equal numbers and a stopped
//! state at both looks mean it ran no instruction in between. The thread list is read before
//! and after the first look and at the second: a thread created meanwhile shows there (only a
//! running thread creates one, and none ran).

use std::fs;

/// One thread at the first look.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    tid: u32,
    /// Voluntary plus involuntary context switches.
    switches: u64,
    /// Time run, ns (`schedstat` field 1).
    runtime_ns: u64,
}

/// A target found stopped: every thread, with what [`Frozen::still`] compares.
#[derive(Debug, Clone)]
pub struct Frozen {
    pid: u32,
    threads: Vec<Seen>,
    /// How it is stopped, for the profile's comments: "SIGSTOP", "ptrace", "cgroup freezer"
    /// (several joined with "+").
    pub how: String,
}

impl Frozen {
    /// Threads of the target.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Whether the target is still stopped and none of its threads ran since [`check`] (same
    /// threads, each still stopped with the same context switches and run time).
    pub fn still(&self) -> bool {
        let Some(now) = look(self.pid) else {
            return false;
        };
        now.0 == self.threads
    }
}

/// The target `pid` if every one of its threads is stopped now, else `None` (also when
/// `/proc` does not tell: another pid namespace, a kernel without `schedstat`).
pub fn check(pid: u32) -> Option<Frozen> {
    let (threads, how) = look(pid)?;
    Some(Frozen { pid, threads, how })
}

/// Whether `pid` (as a region records it: in the writer's pid namespace) names the same
/// process here: the collector and the target share a pid namespace.
pub fn same_pid_namespace(pid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let ns = |p: &str| fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let mine = ns("/proc/self/ns/pid");
    mine.is_some() && mine == ns(&format!("/proc/{pid}/ns/pid"))
}

/// Every thread of `pid`, if all are stopped, with how.
fn look(pid: u32) -> Option<(Vec<Seen>, String)> {
    let before = tids(pid)?;
    let cgroup = cgroup_frozen(pid);
    let mut how: Vec<&'static str> = Vec::new();
    let mut seen = Vec::with_capacity(before.len());
    for &tid in &before {
        let dir = format!("/proc/{pid}/task/{tid}");
        let status = fs::read_to_string(format!("{dir}/status")).ok()?;
        let mut state = None;
        let mut switches = 0u64;
        for l in status.lines() {
            if let Some(v) = l.strip_prefix("State:") {
                state = v.trim().chars().next();
            } else if let Some(v) = l
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                switches += v.trim().parse::<u64>().ok()?;
            }
        }
        let kind = match state? {
            'T' => "SIGSTOP",
            't' => "ptrace",
            'Z' | 'X' => "exited",
            _ if cgroup => "cgroup freezer",
            _ => return None,
        };
        if kind != "exited" && !how.contains(&kind) {
            how.push(kind);
        }
        let sched = fs::read_to_string(format!("{dir}/schedstat")).ok()?;
        let runtime_ns = sched.split_whitespace().next()?.parse().ok()?;
        seen.push(Seen {
            tid,
            switches,
            runtime_ns,
        });
    }
    if tids(pid)? != before || how.is_empty() {
        return None;
    }
    Some((seen, how.join("+")))
}

/// The thread ids of `pid`, sorted; `None` if there are none (gone, not visible).
fn tids(pid: u32) -> Option<Vec<u32>> {
    let mut v: Vec<u32> = fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
        .collect();
    v.sort_unstable();
    (!v.is_empty()).then_some(v)
}

/// Whether the process's freezer cgroup reports it frozen: cgroup v2 `cgroup.events` has
/// `frozen 1`, or cgroup v1 `freezer.state` is `FROZEN`. (A frozen task's state is `S` or `D`,
/// not `T`; the per-thread run checks still apply.)
fn cgroup_frozen(pid: u32) -> bool {
    let Ok(groups) = fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return false;
    };
    for l in groups.lines() {
        let mut f = l.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
                let events = fs::read_to_string(format!("{root}/{path}/cgroup.events"));
                if events.is_ok_and(|e| e.lines().any(|l| l.trim() == "frozen 1")) {
                    return true;
                }
            }
        } else if controllers.split(',').any(|c| c == "freezer") {
            let state = fs::read_to_string(format!("/sys/fs/cgroup/freezer/{path}/freezer.state"));
            if state.is_ok_and(|s| s.trim() == "FROZEN") {
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_process_is_not_frozen() {
        // This test process is running (state R or S): never taken as stopped.
        assert!(check(std::process::id()).is_none());
    }

    #[test]
    fn a_stopped_child_is_frozen_until_it_runs() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        let mut frozen = None;
        for _ in 0..200 {
            frozen = check(pid);
            if frozen.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let f = frozen.expect("a SIGSTOPped child is found stopped");
        assert_eq!((f.threads(), f.how.as_str()), (1, "SIGSTOP"));
        assert!(f.still());
        // Resumed and stopped again: it ran in between, so it is no longer "still" stopped.
        // SAFETY: as above.
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        std::thread::sleep(std::time::Duration::from_millis(20));
        // SAFETY: as above.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(check(pid).is_some());
        assert!(!f.still(), "a stop, run, stop again must be seen");
        let _ = child.kill();
        let _ = child.wait();
    }
}
