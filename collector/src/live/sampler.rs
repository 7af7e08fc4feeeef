//! The live view's sampler: a thread that snapshots the target every interval
//! ([`crate::snapshot::collect`]), sums its live blocks per allocation site
//! ([`crate::sites::Sites::site`]) and sends the sums to the screen.
//!
//! Stack traces are interned in the region and never change once published, so each is named
//! once: a stack id → site cache lives as long as the view, and a refresh symbolizes only the
//! stacks it has not seen before ([`crate::analysis::stack_names_hinted`] of those alone). A refresh of a target
//! whose stacks are all known costs the snapshot and the sums, not a symbolization.

use crate::regions::{self, Liveness, RegionFile};
use crate::sites::{Sites, NO_STACK};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Live bytes and blocks of one allocation site, unbiased when the region was sampled
/// (rounded to whole bytes and blocks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Live {
    /// Bytes of the site's live blocks.
    pub bytes: u64,
    /// Number of the site's live blocks.
    pub blocks: u64,
}

/// One refresh: the target's live heap at one instant, by allocation site.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Totals over every live block.
    pub total: Live,
    /// Per allocation site (function name, or [`NO_STACK`]).
    pub sites: HashMap<Arc<str>, Live>,
    /// CPU time (user + system) this whole process used since the previous sample: the cost
    /// of one refresh, drawing included.
    pub cpu: Duration,
    /// Stacks named so far (the size of the cache).
    pub known_stacks: usize,
    /// The snapshot's warnings (a damaged region, a read-only region, …).
    pub warnings: Vec<String>,
}

/// What the sampler tells the screen.
#[derive(Debug)]
pub enum Msg {
    /// A refresh.
    Sample(Box<Sample>),
    /// A refresh failed (the view keeps the last sample and the sampler goes on).
    Error(String),
    /// The target is gone: the sampler has stopped. The text says so (one line).
    Exited(String),
}

/// Where the sampler reads from, and how often.
#[derive(Debug, Clone)]
pub struct Source {
    /// The region file.
    pub path: PathBuf,
    /// The region as found in the region directory (its process's pid and start time).
    pub file: Option<RegionFile>,
    /// Process id of the target.
    pub pid: u32,
    /// Time between refreshes.
    pub every: Duration,
    /// Longest wait for another collector's snapshot of the region to finish.
    pub lock_timeout: Duration,
}

/// Longest wait, when the view ends, for a snapshot in progress to finish.
pub const STOP_WAIT: Duration = Duration::from_secs(2);

/// The sampler's handle: stopping it, and waiting out a snapshot in progress (whose lease the
/// region's writer honours until it is released).
#[derive(Debug)]
pub struct Handle {
    stop: Arc<AtomicBool>,
    wake: Option<Sender<()>>,
    scanning: Arc<Mutex<()>>,
}

impl Handle {
    /// Stops the sampler: returns once no snapshot is in progress and none will start, so the
    /// process can exit without leaving a lease behind, or after [`STOP_WAIT`] (a snapshot
    /// still waiting for another collector's lock holds no lease; one that holds it past
    /// then is released by the writer when it sees this process gone). A symbolization in
    /// progress is abandoned (it holds nothing of the target's).
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        drop(self.wake.take());
        let started = Instant::now();
        while started.elapsed() < STOP_WAIT {
            match self.scanning.try_lock() {
                Ok(_) | Err(std::sync::TryLockError::Poisoned(_)) => return,
                Err(std::sync::TryLockError::WouldBlock) => {
                    std::thread::sleep(Duration::from_millis(5))
                }
            }
        }
    }
}

/// Starts the sampler thread: a first sample at once, then one every `src.every` (on a fixed
/// schedule from the first; a refresh that overruns its slot is followed by the next at once,
/// the slots it overlapped skipped).
pub fn start(src: Source, tx: Sender<Msg>) -> std::io::Result<Handle> {
    let stop = Arc::new(AtomicBool::new(false));
    let scanning = Arc::new(Mutex::new(()));
    let (wake_tx, wake_rx) = std::sync::mpsc::channel();
    let (s, m) = (stop.clone(), scanning.clone());
    std::thread::Builder::new()
        .name("live-sampler".into())
        .spawn(move || run(src, &tx, &wake_rx, &s, &m))?;
    Ok(Handle {
        stop,
        wake: Some(wake_tx),
        scanning,
    })
}

fn run(
    mut src: Source,
    tx: &Sender<Msg>,
    wake: &Receiver<()>,
    stop: &AtomicBool,
    scanning: &Mutex<()>,
) {
    let mut namer = Namer::new();
    let mut cpu_before = cpu_time();
    let start = Instant::now();
    let mut slot: u32 = 0;
    loop {
        let msg = match refresh(&src, &mut namer, stop, scanning) {
            Ok(Some((mut s, last))) => {
                let cpu = cpu_time();
                s.cpu = cpu.saturating_sub(cpu_before);
                cpu_before = cpu;
                if let Some(why) = last {
                    let _ = tx.send(Msg::Sample(Box::new(s)));
                    let _ = tx.send(Msg::Exited(why));
                    return;
                }
                Msg::Sample(Box::new(s))
            }
            Ok(None) => return, // stopped
            Err(Gone(why)) => {
                let _ = tx.send(Msg::Exited(why));
                return;
            }
            Err(Failed(e)) => Msg::Error(e),
            Err(Moved(path, file)) => {
                // Another image: other stack ids. Sampled again at once.
                src.path = path;
                src.file = file;
                namer = Namer::new();
                continue;
            }
        };
        if tx.send(msg).is_err() {
            return;
        }
        // The next slot after now.
        let elapsed = start.elapsed();
        let every = src.every.max(Duration::from_millis(1));
        slot = slot
            .saturating_add(1)
            .max((elapsed.as_nanos() / every.as_nanos()) as u32 + 1);
        let due = start + every.saturating_mul(slot);
        match wake.recv_timeout(due.saturating_duration_since(Instant::now())) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return, // stopped
        }
        if stop.load(Ordering::SeqCst) {
            return;
        }
    }
}

/// Why a refresh produced no sample.
enum Failure {
    /// The target exited (or its region is gone): no sample will follow.
    Gone(String),
    /// This refresh failed; the next may not.
    Failed(String),
    /// The process exec'd: its new image's region, to follow from now on.
    Moved(PathBuf, Option<RegionFile>),
}
use Failure::{Failed, Gone, Moved};

/// One refresh: open the region, snapshot it, name new stacks, sum by site. `Ok(None)` when
/// stopped before the snapshot; with the sample, why it is the last one (a post-mortem
/// region).
fn refresh(
    src: &Source,
    namer: &mut Namer,
    stop: &AtomicBool,
    scanning: &Mutex<()>,
) -> Result<Option<(Sample, Option<String>)>, Failure> {
    // Gone: no such process, another process under its pid, or a zombie (exited, not reaped
    // yet; its region removed at its exit).
    let gone = || {
        regions::proc_state(src.pid) == Some('Z')
            || match &src.file {
                Some(f) => regions::proc_start_ticks(f.pid) != Some(f.start_ticks),
                None => regions::proc_start_ticks(src.pid).is_none(),
            }
    };
    let usable = match regions::open_usable(&src.path, src.file.as_ref()) {
        Ok(u) => u,
        Err(_) if gone() => {
            return Err(Gone(format!("pid {} has exited", src.pid)));
        }
        Err(e) => {
            // The process runs on without this region: it exec'd a new image, which made a
            // region of its own (the same pid, a newer file).
            if let Ok((path, file)) = crate::regions::pick(&crate::cli::Target::Pid(src.pid)) {
                if path != src.path {
                    return Err(Moved(path, file));
                }
            }
            return Err(Failed(format!("{e:#}")));
        }
    };
    let c = {
        let _g = scanning.lock().unwrap_or_else(|e| e.into_inner());
        if stop.load(Ordering::SeqCst) {
            return Ok(None);
        }
        crate::snapshot::collect(&usable.opened, usable.liveness, false, src.lock_timeout)
    };
    let c = match c {
        Ok(c) => c,
        Err(_) if gone() => return Err(Gone(format!("pid {} has exited", src.pid))),
        Err(e) => return Err(Failed(format!("{e:#}"))),
    };
    if stop.load(Ordering::SeqCst) {
        return Ok(None);
    }
    namer.learn(&c);
    let mut sums: HashMap<Arc<str>, (f64, f64)> = HashMap::new();
    let (mut blocks, mut bytes) = (0.0, 0.0);
    for (&(stack, _, _), &(n, b)) in &c.inuse {
        let e = sums.entry(namer.site(stack)).or_default();
        e.0 += n;
        e.1 += b;
        blocks += n;
        bytes += b;
    }
    let live = |n: f64, b: f64| Live {
        bytes: b.round() as u64,
        blocks: n.round() as u64,
    };
    let sample = Sample {
        total: live(blocks, bytes),
        sites: sums
            .into_iter()
            .map(|(k, (n, b))| (k, live(n, b)))
            .collect(),
        cpu: Duration::ZERO,
        known_stacks: namer.known(),
        warnings: c.meta.warnings.clone(),
    };
    // A post-mortem region (the target crashed or was killed, and its region stayed): its
    // last state is this sample, and nothing more will come.
    let last = (usable.liveness != Liveness::Alive).then(|| {
        format!(
            "pid {} {} (its region's last state shown)",
            src.pid,
            usable.liveness.gone()
        )
    });
    Ok(Some((sample, last)))
}

/// Stack id → allocation site, learnt once per stack.
struct Namer {
    rule: Sites,
    by_stack: HashMap<u32, Arc<str>>,
    /// Each site's name once, shared by every stack that ends in it.
    names: HashMap<String, Arc<str>>,
    no_stack: Arc<str>,
}

impl Namer {
    fn new() -> Namer {
        Namer {
            rule: Sites::default(),
            by_stack: HashMap::new(),
            names: HashMap::new(),
            no_stack: Arc::from(NO_STACK),
        }
    }

    /// Names the stacks of `c`'s live blocks not named yet; returns how many. A stack the
    /// snapshot could not read (no frames: unpublished, or invalid) is not cached, so that it
    /// is named once it can be read.
    fn learn(&mut self, c: &crate::snapshot::Collected) -> usize {
        let mut new: Vec<u32> = c
            .inuse
            .keys()
            .map(|&(s, _, _)| s)
            .filter(|s| !self.by_stack.contains_key(s))
            .filter(|s| c.stacks.get(s).is_some_and(|f| !f.is_empty()))
            .collect();
        new.sort_unstable();
        new.dedup();
        if new.is_empty() {
            return 0;
        }
        let (named, hints) = crate::analysis::stack_names_hinted(c, new.iter().copied());
        for s in &new {
            let site = named
                .get(s)
                .map(|frames| self.rule.site_hinted(frames, hints.get(s)))
                .unwrap_or(NO_STACK);
            let name = match self.names.get(site) {
                Some(n) => n.clone(),
                None => {
                    let n: Arc<str> = Arc::from(site);
                    self.names.insert(site.to_owned(), n.clone());
                    n
                }
            };
            self.by_stack.insert(*s, name);
        }
        new.len()
    }

    /// The site of a stack: learnt, or [`NO_STACK`].
    fn site(&self, stack: u32) -> Arc<str> {
        self.by_stack
            .get(&stack)
            .cloned()
            .unwrap_or_else(|| self.no_stack.clone())
    }

    fn known(&self) -> usize {
        self.by_stack.len()
    }
}

/// CPU time (user + system) of this process so far.
fn cpu_time() -> Duration {
    // SAFETY: a zeroed rusage is a valid value; getrusage fills it for RUSAGE_SELF.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}
