//! The collector's scheduling priority while it holds the lease.
//!
//! While a live snapshot holds the lease, the target cannot recycle the records it frees, and
//! the snapshot waits for operations in flight on the target's threads: on a machine whose
//! cores are all busy with the target's threads, a collector at the same priority gets a
//! small share of a core (1/16 of one among 32 busy threads on 2 cores), and every sleep it
//! makes (waiting for a clock tick) costs a turn in the run queue. [`Boost::raise`] lowers
//! the calling thread's nice value to [`LEASE_NICE`] for that part — allowed to root, to a
//! process with `CAP_SYS_NICE`, or within `RLIMIT_NICE` — and silently keeps the normal
//! priority where it is not allowed (README: run the collector under `nice -n -10`, or give it
//! `CAP_SYS_NICE`). The nice value stays in the normal (CFS) class: a real-time collector
//! spinning for an operation in flight could keep the thread it waits for off its core.
//!
//! `heapdump snapshot` holds a [`Boost`] for the whole command, not only the lease: someone
//! waits for it, it uses a few tens of ms of CPU, and at nice 0 among 32 busy threads on 2
//! cores its symbolization and writing took 0.4–0.5 s of wall time instead of 0.1–0.2 s
//! (examples/c/churn.c 32 × 5000). `watch` raises only around the lease: over hours, its
//! work between snapshots should not come before the target's.

/// Nice value of the collector's thread while it holds the lease.
pub const LEASE_NICE: i32 = -10;

/// The calling thread's raised priority; dropping it restores the previous nice value.
#[derive(Debug)]
pub struct Boost {
    tid: libc::id_t,
    /// The nice value to restore; `None` when nothing was changed.
    old: Option<i32>,
}

impl Boost {
    /// Lowers the calling thread's nice value to [`LEASE_NICE`] if it is higher and that is
    /// allowed; otherwise changes nothing (never an error).
    pub fn raise() -> Boost {
        // SAFETY: gettid has no arguments and cannot fail.
        let tid = unsafe { libc::gettid() } as libc::id_t;
        let mut b = Boost { tid, old: None };
        // getpriority returns the nice value, which may be -1: errno tells an error apart.
        // SAFETY: errno is this thread's; getpriority on our own thread id.
        let old = unsafe {
            *libc::__errno_location() = 0;
            libc::getpriority(libc::PRIO_PROCESS, tid)
        };
        // SAFETY: reading this thread's errno.
        if old == -1 && unsafe { *libc::__errno_location() } != 0 || old <= LEASE_NICE {
            return b;
        }
        // SAFETY: setpriority on our own thread id; EPERM/EACCES leave it unchanged.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, LEASE_NICE) } == 0 {
            b.old = Some(old);
        }
        b
    }

    /// Whether the priority was raised.
    #[cfg(test)]
    pub fn raised(&self) -> bool {
        self.old.is_some()
    }
}

impl Drop for Boost {
    fn drop(&mut self) {
        if let Some(old) = self.old {
            // SAFETY: raising our own thread's nice value back is always allowed.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, self.tid, old) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nice() -> i32 {
        // SAFETY: getpriority on our own thread id.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    #[test]
    fn raised_while_held_and_restored() {
        let before = nice();
        {
            let b = Boost::raise();
            if b.raised() {
                assert_eq!(nice(), LEASE_NICE);
            } else {
                assert_eq!(nice(), before);
                eprintln!("skipped: raising the priority: not allowed here (no CAP_SYS_NICE)");
            }
        }
        assert_eq!(nice(), before);
    }
}
