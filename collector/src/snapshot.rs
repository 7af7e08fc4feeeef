//! Taking a snapshot of a region and aggregating it for output.

use crate::regions::{Liveness, Opened};
use anyhow::{Context, Result};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::time::Duration;
use vmo_layout::{Block, Module, RegionInfo, SnapshotMeta, SnapshotOptions, ThreadInfo};

/// Everything read from a region at one instant, aggregated.
#[derive(Debug, Default)]
pub struct Collected {
    /// Header facts and counters.
    pub info: RegionInfo,
    /// Whether the writer was alive.
    pub alive: bool,
    /// What the snapshot reported.
    pub meta: SnapshotMeta,
    /// Wall-clock time of the snapshot, ns since the Unix epoch.
    pub time_realtime_ns: u64,
    /// Frames (return addresses, leaf first) of every stack used below.
    pub stacks: HashMap<u32, Vec<u64>>,
    /// Cumulative (allocations, bytes) per stack, unbiased when the region was sampled.
    pub alloc_totals: HashMap<u32, (f64, f64)>,
    /// Live (blocks, bytes) per (stack, thread id, block size), unbiased when the region was
    /// sampled.
    pub inuse: HashMap<(u32, u32, u64), (f64, f64)>,
    /// Every live block, when asked for (`--with-tags`).
    pub blocks: Option<Vec<Block>>,
    /// Thread slots.
    pub threads: Vec<ThreadInfo>,
    /// Module table (with the executable file mappings it lacks, for a live target).
    pub modules: Vec<Module>,
    /// Names of generated code (JIT compilers, CPython's perf trampolines).
    pub jit: crate::perfmap::JitSymbols,
    /// The Python code records the stacks name.
    pub python: crate::python::Codes,
    /// What the snapshot is of, when not simply "now" (a named snapshot, born since …): lines
    /// for the profile's comments.
    pub notes: Vec<String>,
    /// The target was stopped for the whole scan (records read as they were, nothing waited
    /// for): how ("SIGSTOP", "ptrace", "cgroup freezer") and its number of threads.
    pub stopped: Option<(String, usize)>,
    /// Whose rights the module files are opened with, when the region is someone else's
    /// ([`crate::symbolize::ReadAs`]).
    pub read_as: Option<crate::symbolize::ReadAs>,
}

impl Collected {
    /// The shim's private memory of the running threads that keeps copies of the program's
    /// words (`vmo_layout::v1::ThreadSlotV1::private`): (start, bytes), not roots of the
    /// reference graph.
    ///
    /// Also the stacks of the threads that exited (glibc keeps them mapped for later threads,
    /// stale words and all: helper K, 1, leaks of joined threads went unreported), unless a
    /// running thread's stack overlaps one now, and only while it still lies where glibc puts
    /// a thread stack (just above a guard mapping, `---p`, in `/proc/PID/maps`): memory
    /// mapped there since is the program's again.
    pub fn private_ranges(&self) -> Vec<(u64, u64)> {
        let live_stacks: Vec<(u64, u64)> = (self.threads.iter())
            .filter(|t| t.running)
            .filter_map(|t| t.stack)
            .collect();
        let overlaps = |a: u64, n: u64| {
            (live_stacks.iter()).any(|&(b, m)| a < b.saturating_add(m) && b < a.saturating_add(n))
        };
        let mut out: Vec<(u64, u64)> = (self.threads.iter())
            .filter(|t| t.running)
            .flat_map(|t| t.private.iter().copied())
            .collect();
        let dead: Vec<(u64, u64)> = (self.threads.iter())
            .filter(|t| !t.running)
            .flat_map(|t| t.private.iter().copied())
            .filter(|&(a, n)| !overlaps(a, n))
            .collect();
        if !dead.is_empty() {
            // (start, end, guard) of each mapping.
            let maps: Vec<(u64, u64, bool)> =
                std::fs::read_to_string(format!("/proc/{}/maps", self.info.pid))
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| {
                        let mut f = l.split_whitespace();
                        let (a, b) = f.next()?.split_once('-')?;
                        let perms = f.next()?;
                        Some((
                            u64::from_str_radix(a, 16).ok()?,
                            u64::from_str_radix(b, 16).ok()?,
                            perms.starts_with("---"),
                        ))
                    })
                    .collect();
            for (a, n) in dead {
                let inside = maps.iter().any(|&(s, e, g)| !g && s == a && a + n <= e);
                let guarded = maps.iter().any(|&(_, e, g)| g && e == a);
                if inside && guarded {
                    out.push((a, n));
                }
            }
        }
        out
    }
}

/// Exit status of a command that wrote its output but read a damaged region (see
/// [`vmo_layout::check`]): 3, distinct from 1 (an error, nothing written).
pub const EXIT_DAMAGED: i32 = 3;

/// Set once any snapshot of this process found a damaged region: `main` then exits with
/// [`EXIT_DAMAGED`] instead of 0.
pub static DAMAGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How many blocks of `size` bytes one sampled block stands for at mean `interval`: the shared
/// formula, [`vmo_layout::sampling::weight`].
pub use vmo_layout::sampling::weight;

/// Snapshots the region in `opened`.
///
/// For a live writer the snapshot holds an exclusive `flock` on the file (one live snapshot at a
/// time per region; the target never takes it) and uses the lease protocol. The lock is waited
/// for at most `lock_timeout`.
///
/// Errors: the lock is still held by another collector after `lock_timeout` (the message names
/// the holder), or the region cannot be read.
pub fn collect(
    opened: &Opened,
    liveness: Liveness,
    with_blocks: bool,
    lock_timeout: Duration,
) -> Result<Collected> {
    collect_at(
        opened,
        liveness,
        with_blocks,
        lock_timeout,
        &Moment::default(),
    )
}

/// Which blocks a snapshot keeps, when not "every block live now".
#[derive(Debug, Clone, Default)]
pub struct Moment {
    /// The blocks live at this earlier instant (region-clock ns: a named snapshot's).
    pub at: Option<u64>,
    /// Only blocks allocated after this instant (region-clock ns; 0: all).
    pub born_after: u64,
    /// Wall-clock time of `at`, ns since the Unix epoch (the profile's time).
    pub at_realtime_ns: Option<u64>,
    /// Lines for the profile's comments saying what the snapshot is of.
    pub notes: Vec<String>,
}

/// [`collect`] of the blocks `moment` selects: live at a named snapshot's instant, and/or born
/// after an instant.
pub fn collect_at(
    opened: &Opened,
    liveness: Liveness,
    with_blocks: bool,
    lock_timeout: Duration,
    moment: &Moment,
) -> Result<Collected> {
    let region = opened.region()?;
    let alive = liveness == Liveness::Alive;
    let live = alive && opened.writable();
    if live {
        lock_exclusive(opened, lock_timeout)?;
    }
    // The pid checked when the region was trusted, not the header's now (its writer may have
    // changed it since); and that process must still be the one running under it (the
    // region's owner can hold the lock while its pid is reused).
    let target_pid = opened.checked().map_or(region.info().pid, |(pid, _)| pid);
    if live && !opened.still_checked_process() {
        anyhow::bail!("pid {target_pid} exited while the snapshot waited for the region's lock");
    }
    // A stopped target is read as it is (no lease, no wait), when `/proc` shows every thread
    // stopped before the scan and again, none having run, after it; one that ran meanwhile is
    // snapshotted again (a few times, then with the live protocol).
    let can_freeze = alive && crate::frozen::same_pid_namespace(target_pid);
    // Tests only: pause inside the scan, while holding the lock and the lease.
    let mut pause = heapdump_testhooks::ScanPause::from_env();
    let interval = region.info().sample_interval;
    // Every live block is kept until it has been validated (`check::validate`), also when
    // the caller does not want them: the totals are summed over valid blocks only.
    // Reserved for the live count the header reports (plus what may be allocated meanwhile),
    // so that a list of 10 M blocks is not grown by doubling (512 MB for 320 MB of blocks); at
    // most one block per 32 bytes of the region file, whatever a damaged header says.
    let mut blocks: Vec<Block> = {
        let live = region.info().counters.live_blocks;
        let file_len = opened.file.metadata().map(|m| m.len()).unwrap_or(0);
        Vec::with_capacity(live.saturating_add(live / 16 + 1024).min(file_len / 32) as usize)
    };
    let (lease_pid, lease_start_ticks) = if live {
        lease::identity(region.info().pid)
    } else {
        (0, 0)
    };
    // SIGTERM, SIGINT and SIGHUP release the lease before the collector dies (SIGKILL cannot:
    // writers then find the holder dead, see `RegionWriter::lease_holder_gone`).
    let _release = live.then(|| region.lease_word().map(lease::Guard::arm));
    // The most the target has mapped, before and after the scan: no live block is larger.
    let mapped = || alive.then(|| vm_size(target_pid)).flatten();
    let mapped_before = mapped();
    let mut stopped = None;
    let mut meta = SnapshotMeta::default();
    for attempt in 0.. {
        let frozen = (can_freeze && attempt < FROZEN_ATTEMPTS)
            .then(|| crate::frozen::check(target_pid))
            .flatten();
        if attempt > 0 {
            blocks.clear();
        }
        // The lease holds back the target's recycling until the scan ends: get the CPU for it
        // (restored when dropped). A stopped target competes for nothing.
        let _boost = (live && frozen.is_none()).then(crate::priority::Boost::raise);
        meta = region.snapshot(
            &SnapshotOptions {
                live: alive,
                wait_timeout: Duration::from_millis(200),
                lease_pid,
                lease_start_ticks,
                at: moment.at,
                born_after: moment.born_after,
                frozen: frozen.is_some(),
            },
            |b| {
                pause.at_first_block();
                blocks.push(*b);
            },
        );
        match frozen {
            // Not stopped throughout: a thread ran during the scan, records may have changed
            // under it. Never reported: take it again.
            Some(f) if !f.still() => continue,
            Some(f) => stopped = Some(f),
            None => {}
        }
        // The target released our lease mid-scan (it judged the collector dead): take it
        // again, once; a second loss is reported with the warning the reader added.
        if meta.lease_lost && attempt == 0 {
            continue;
        }
        break;
    }
    drop(_release);
    // What a real heap could hold at one instant; the totals are of that only.
    let live_records = blocks.len() as u64;
    let max_size = match (mapped_before, mapped()) {
        (Some(a), Some(b)) => a.max(b),
        _ => vmo_layout::check::USER_END,
    };
    let damage = vmo_layout::check::validate_within(&mut blocks, max_size);
    let mut inuse: HashMap<(u32, u32, u64), (f64, f64)> = HashMap::new();
    meta.blocks = blocks.len() as u64;
    meta.bytes = 0;
    for b in &blocks {
        let w = weight(b.size as f64, interval);
        let e = inuse.entry((b.stack, b.thread, b.size)).or_default();
        e.0 += w;
        e.1 += w * b.size as f64;
        // Below USER_END in all: valid blocks do not overlap.
        meta.bytes = meta.bytes.saturating_add(b.size);
    }
    if !damage.is_empty() {
        meta.warnings.push(damage.describe(live_records));
    }
    let counters = region.info().counters;
    if counters.live_bytes >= vmo_layout::check::USER_END {
        // Not a skipped block, but a header that cannot be true all the same.
        meta.warnings.push(format!(
            "region damaged: its counters claim {} live bytes, more than the address space \
             holds (the profile's totals are summed from the blocks instead)",
            counters.live_bytes
        ));
    }
    // A read that may have missed blocks (the lease lost twice, or a scan that outlasted it:
    // a collector stopped for 30 s) is not a complete profile either: the same status, so
    // that a script notices (helper U, 4: exit 0 with only a warning).
    let incomplete = (meta.warnings.iter()).any(|w| w.contains("blocks may be missing"));
    let damaged =
        !damage.is_empty() || counters.live_bytes >= vmo_layout::check::USER_END || incomplete;
    if damaged {
        DAMAGED.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let blocks = with_blocks.then_some(blocks);
    let time_realtime_ns = moment
        .at_realtime_ns
        .unwrap_or_else(vmo_layout::clock::realtime_ns);
    if live {
        // SAFETY: as above.
        unsafe { libc::flock(opened.file.as_raw_fd(), libc::LOCK_UN) };
    }
    if liveness == Liveness::Alive && !opened.writable() && stopped.is_none() {
        meta.warnings.push(
            "region is read-only to us: snapshot taken without the consistency protocol".into(),
        );
    }
    let info = region.info();
    if let Some(w) = go_program(&info.exe_path) {
        meta.warnings.push(w);
    }
    let mut alloc_totals = HashMap::new();
    let mut wanted = std::collections::HashSet::new();
    for (id, (n, b)) in region.all_stack_totals() {
        if n > 0 {
            let w = weight(b as f64 / n as f64, interval);
            alloc_totals.insert(id, (n as f64 * w, b as f64 * w));
            wanted.insert(id);
        }
    }
    wanted.extend(inuse.keys().map(|&(s, _, _)| s));
    wanted.remove(&u32::MAX);
    // Invalid or unpublished stacks are kept as empty ones.
    let mut stacks = region.stacks(wanted.iter().copied());
    for id in wanted {
        stacks.entry(id).or_default();
    }
    // Symbolization opens the module files: a module path that is not a regular file (a FIFO
    // would block the open forever) is marked so that it is left alone, with a warning.
    let mut modules = region.modules();
    for m in &mut modules {
        if !m.path.starts_with('/') {
            continue;
        }
        if let Ok(Some(kind)) = crate::regions::non_regular(std::path::Path::new(&m.path)) {
            meta.warnings.push(format!(
                "module {} is {kind}, not a regular file: not symbolized",
                m.path
            ));
            m.path = format!("[not a regular file] {}", m.path);
        }
    }
    // Generated code: names from the perf map and jitdump files the target wrote, and
    // executable file mappings its module table lacks (read from /proc while it runs).
    let same_ns = !alive || crate::frozen::same_pid_namespace(target_pid);
    // The executable mappings of the running target: a return address in none of them is no
    // code at all (None: not known, post-mortem or in another namespace).
    let mut exec: Option<Vec<(u64, u64)>> = None;
    let jit = if same_ns {
        use std::os::unix::fs::MetadataExt;
        if alive {
            let maps = crate::perfmap::proc_maps(target_pid);
            let extra = crate::perfmap::unlisted_modules(&maps, &modules);
            modules.extend(extra);
            if !maps.is_empty() {
                let mut x: Vec<(u64, u64)> = maps
                    .iter()
                    .filter(|m| m.perms.contains('x'))
                    .map(|m| (m.start, m.end))
                    .collect();
                x.sort_unstable();
                exec = Some(x);
            }
        }
        let target = crate::perfmap::Target {
            pid: target_pid,
            uid: opened.file.metadata().map(|m| m.uid()).unwrap_or(u32::MAX),
            started_realtime_ns: info.created_realtime_ns,
            alive,
        };
        crate::perfmap::load(&target, &modules, &mut meta.warnings)
    } else {
        crate::perfmap::JitSymbols::default()
    };
    let mut notes = moment.notes.clone();
    notes.extend(jit.sources.iter().map(|s| format!("JIT code names: {s}")));
    let threads = region.threads();
    let python = crate::python::Codes::read(&region, stacks.values());
    crate::python::drop_perf_trampolines(&mut stacks, &python, &jit, &modules);
    if let Some(w) = unnamed_code_warning(
        &stacks,
        &inuse,
        &modules,
        &jit,
        exec.as_deref(),
        &info.exe_path,
    ) {
        meta.warnings.push(w);
    }
    if let Some(why) = opened.truncated() {
        anyhow::bail!("{why}");
    }
    let read_as = {
        use std::os::unix::fs::MetadataExt;
        match opened.file.metadata() {
            Ok(md) => crate::symbolize::ReadAs::for_region(
                md.uid(),
                md.gid(),
                target_pid,
                alive && same_ns,
            ),
            // Not known whose: nobody's rights (no module read beyond what all may read).
            Err(_) => Some(crate::symbolize::ReadAs {
                uid: 65534,
                gid: 65534,
                groups: Vec::new(),
            }),
        }
    };
    Ok(Collected {
        info,
        alive: liveness == Liveness::Alive,
        meta,
        time_realtime_ns,
        stacks,
        alloc_totals,
        inuse,
        blocks,
        threads,
        modules,
        jit,
        python,
        notes,
        stopped: stopped.map(|f| (f.how.clone(), f.threads())),
        read_as,
    })
}

/// Live bytes below which [`unnamed_code_warning`] says nothing: 1 in 100.
const UNNAMED_CODE_SHARE: f64 = 0.01;

/// A warning when at least 1% of the live bytes (`inuse`: (blocks, bytes) per stack, thread,
/// size) were allocated under generated code that nothing names: a return address in no
/// module of the table (`modules`) and no range of the JIT's perf map or jitdump (`jit`),
/// which the profile shows as `<unknown>`. It says what would name it: for node (an executable
/// named `node*`) its flags, `--perf-basic-prof --interpreted-frames-native-stack` (README,
/// "Node.js and other JITs"), else a perf map or jitdump from the JIT. CPython's frames spliced
/// in by the shim ([`vmo_layout::v1::PYTHON_FRAME`], `PYTHON_EVAL_FRAME`) are names, not
/// addresses: never counted. With `exec` (the running target's executable mappings, sorted),
/// an unnamed address in none of them is no code at all — a word past the end of a stack the
/// walk took for a return address (greenlet and coroutine stacks: helper P, 2, a gevent
/// program was told its JIT published no names) — and is said to be that instead.
fn unnamed_code_warning(
    stacks: &HashMap<u32, Vec<u64>>,
    inuse: &HashMap<(u32, u32, u64), (f64, f64)>,
    modules: &[Module],
    jit: &crate::perfmap::JitSymbols,
    exec: Option<&[(u64, u64)]>,
    exe_path: &str,
) -> Option<String> {
    use vmo_layout::v1::{PYTHON_EVAL_FRAME, PYTHON_FRAME};
    /// What an unnamed frame's address is.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Unnamed {
        No,
        Code,
        NotCode,
    }
    let in_exec = |a: u64| {
        exec.is_none_or(|x| {
            let i = x.partition_point(|r| r.0 <= a);
            i > 0 && a < x[i - 1].1
        })
    };
    // Looked up for every frame of every stack (a CPython process: millions): a fast hash.
    let mut nameless: rustc_hash::FxHashMap<u64, Unnamed> = Default::default();
    let mut stack_nameless: rustc_hash::FxHashMap<u32, Unnamed> = Default::default();
    let (mut all, mut under, mut not_code) = (0f64, 0f64, 0f64);
    for (&(stack, _, _), &(_, bytes)) in inuse {
        all += bytes;
        let hit = *stack_nameless.entry(stack).or_insert_with(|| {
            let Some(frames) = stacks.get(&stack) else {
                return Unnamed::No;
            };
            let mut seen = Unnamed::No;
            for &pc in frames {
                if pc & (PYTHON_FRAME | PYTHON_EVAL_FRAME) != 0 {
                    continue;
                }
                let u = *nameless.entry(pc).or_insert_with(|| {
                    // The call site: return address - 1, as the profile's locations.
                    let a = pc.wrapping_sub(1);
                    if crate::symbolize::module_of(modules, a).is_some() || jit.name(a).is_some() {
                        Unnamed::No
                    } else if in_exec(a) {
                        Unnamed::Code
                    } else {
                        Unnamed::NotCode
                    }
                });
                if u == Unnamed::Code {
                    return u;
                }
                if u == Unnamed::NotCode {
                    seen = u;
                }
            }
            seen
        });
        match hit {
            Unnamed::Code => under += bytes,
            Unnamed::NotCode => not_code += bytes,
            Unnamed::No => {}
        }
    }
    if all <= 0.0 {
        return None;
    }
    if under < all * UNNAMED_CODE_SHARE {
        if not_code < all * UNNAMED_CODE_SHARE {
            return None;
        }
        return Some(format!(
            "{:.0}% of the live bytes ({} of {}) have stacks with `<unknown>` frames at \
             addresses no executable mapping of the process holds: not code, but words past \
             the end of a stack that the unwinder took for return addresses (a coroutine or \
             greenlet stack); the frames inside them are right",
            not_code * 100.0 / all,
            not_code.round() as u64,
            all.round() as u64
        ));
    }
    // The bytes under any `<unknown>` frame, as the profile shows them (a stack of generated
    // code may also hold words that are no code).
    let under = under + not_code;
    let what = format!(
        "{:.0}% of the live bytes ({} of {}) were allocated under generated code that has no \
         name (`<unknown>` frames)",
        under * 100.0 / all,
        under.round() as u64,
        all.round() as u64
    );
    let node = std::path::Path::new(exe_path)
        .file_name()
        .is_some_and(|f| f.to_string_lossy().starts_with("node"));
    Some(if node {
        format!(
            "{what}: node names its JavaScript functions for profilers only when run with \
             --perf-basic-prof --interpreted-frames-native-stack (or with them in \
             NODE_OPTIONS, as `heapdump run` starts it); heapdump then reads the \
             /tmp/perf-PID.map it writes (README: Node.js and other JITs)"
        )
    } else {
        format!(
            "{what}: the JIT that made it published no names for it (a /tmp/perf-PID.map or a \
             jitdump file; README: Node.js and other JITs)"
        )
    })
}

/// `VmSize` of process `pid` in bytes (`/proc/PID/statm`, first field, in pages); `None`
/// when it cannot be read (gone, another pid namespace's number, no permission).
fn vm_size(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = s.split_whitespace().next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages.checked_mul(u64::try_from(page).ok()?)
}

/// Snapshots of a target found stopped that are tried before falling back to the live
/// protocol, when it turns out to have run during the scan.
const FROZEN_ATTEMPTS: u32 = 3;

/// Takes the exclusive `flock` of a live snapshot, waiting at most `timeout` for another
/// collector to release it (after 1 s, says on stderr who holds it).
///
/// Errors: still held after `timeout` (the message names the holding process and its state,
/// e.g. stopped), or `flock` failed otherwise.
fn lock_exclusive(opened: &Opened, timeout: Duration) -> Result<()> {
    let fd = opened.file.as_raw_fd();
    let started = std::time::Instant::now();
    let mut told = false;
    loop {
        // SAFETY: flock on our own open descriptor.
        if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => {}
            Some(libc::EINTR) => continue,
            _ => return Err(e).with_context(|| format!("cannot lock {}", opened.path.display())),
        }
        let waited = started.elapsed();
        if waited >= timeout {
            anyhow::bail!(
                "{}: another snapshot of this region is in progress ({}); gave up after {:.1} s \
                 (--lock-timeout SECS to wait longer)",
                opened.path.display(),
                lock_holder(opened),
                waited.as_secs_f64()
            );
        }
        if !told && waited >= Duration::from_secs(1) {
            eprintln!(
                "heapdump: waiting up to {:.0} s for the region's lock ({})",
                timeout.as_secs_f64(),
                lock_holder(opened)
            );
            told = true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Who holds a lock on `opened`'s file, from `/proc/locks` (`flock` locks carry the pid of
/// the process that took them): "held by pid N (COMMAND, stopped)", or a vaguer text when the
/// holder cannot be named.
fn lock_holder(opened: &Opened) -> String {
    use std::os::unix::fs::MetadataExt;
    let Ok(md) = opened.file.metadata() else {
        return "holder unknown".into();
    };
    let (major, minor) = (libc::major(md.dev()), libc::minor(md.dev()));
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    // "1: FLOCK  ADVISORY  WRITE 1234 00:1a:5678 0 EOF"; waiters have "->" after the number.
    let holders: Vec<u32> = locks
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.get(1) == Some(&"->") || w.len() < 6 {
                return None;
            }
            let mut id = w[5].split(':');
            let maj = u32::from_str_radix(id.next()?, 16).ok()?;
            let min = u32::from_str_radix(id.next()?, 16).ok()?;
            let ino: u64 = id.next()?.parse().ok()?;
            (maj == major && min == minor && ino == md.ino())
                .then(|| w[4].parse().ok())
                .flatten()
        })
        .filter(|p| *p != std::process::id())
        .collect();
    if holders.is_empty() {
        return "its holder is not visible in /proc/locks".into();
    }
    let describe = |pid: u32| {
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| {
                c.split(|b| *b == 0)
                    .filter(|a| !a.is_empty())
                    .map(String::from_utf8_lossy)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .map(|c| crate::regions::shown(&c).into_owned())
            .unwrap_or_default();
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                let rest = &s[s.rfind(')')? + 1..];
                rest.split_whitespace().next().map(str::to_owned)
            });
        let state = match state.as_deref() {
            Some("T") => ", stopped (SIGSTOP): resume it with kill -CONT, or kill it",
            Some("t") => ", stopped by a debugger",
            Some("Z") => ", exiting",
            Some(_) => "",
            None => ", in another pid namespace or gone",
        };
        format!("held by pid {pid} ({cmd}{state})")
    };
    holders
        .into_iter()
        .map(describe)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The collector's side of the lease's lifetime: who holds it, and releasing it on a
/// terminating signal.
mod lease {
    use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

    /// The identity stored with the lease for the writer whose pid is `target_pid`: this
    /// process's pid and start ticks when both run in the same pid namespace (the writer
    /// checks the pid with `kill(pid, 0)` and `/proc/PID/stat`), else `(0, 0)`: unknown, the
    /// lease then only expires after `LEASE_NS`.
    pub fn identity(target_pid: u32) -> (u32, u64) {
        use std::os::unix::fs::MetadataExt;
        let ns = |p: &str| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
        let mine = ns("/proc/self/ns/pid");
        if mine.is_none() || mine != ns(&format!("/proc/{target_pid}/ns/pid")) {
            return (0, 0);
        }
        let pid = std::process::id();
        match crate::regions::proc_start_ticks(pid) {
            Some(t) => (pid, t),
            None => (0, 0),
        }
    }

    /// The lease word of the region being snapshotted, null when no lease is held.
    static LEASE: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());
    /// Signals that release the lease before the collector dies of them.
    const SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

    extern "C" fn on_signal(sig: libc::c_int) {
        let p = LEASE.swap(std::ptr::null_mut(), Ordering::SeqCst);
        if !p.is_null() {
            // SAFETY: `p` points into the region mapping, which outlives the `Guard` that
            // published it (the guard clears LEASE before the mapping can go); an atomic store
            // is async-signal-safe. We hold the region's flock: the lease is ours.
            unsafe { (*p).store(0, Ordering::SeqCst) };
        }
        // Die of the signal as if no handler had been installed.
        // SAFETY: signal and raise are async-signal-safe.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }

    /// While alive, a terminating signal clears the lease first.
    pub struct Guard(());

    impl Guard {
        /// Publishes `lease` to the signal handler and installs it for SIGTERM, SIGINT and
        /// SIGHUP where they still have their default action: signals already ignored stay
        /// ignored, and those the collector handles itself stay handled (`watch`'s handler
        /// only asks it to stop after the snapshot, which then releases the lease as usual).
        pub fn arm(lease: &AtomicU64) -> Guard {
            LEASE.store(
                lease as *const AtomicU64 as *mut AtomicU64,
                Ordering::SeqCst,
            );
            use crate::signals::{self, Handler};
            for sig in SIGNALS {
                if !signals::is_default_or(sig, Handler::Simple(on_signal)) {
                    continue;
                }
                // SAFETY: the handler only uses atomics and async-signal-safe calls.
                let _ = unsafe { signals::set(sig, Handler::Simple(on_signal), 0) };
            }
            Guard(())
        }
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            // The snapshot has cleared the lease itself; from here a signal just kills us.
            LEASE.store(std::ptr::null_mut(), Ordering::SeqCst);
        }
    }
}

/// A warning when the executable at `path` is a Go program (its ELF file has Go's
/// `.go.buildinfo` or `.note.go.buildid` section): Go allocates its own heap from the kernel
/// (`runtime.mallocgc`), so only its C allocations (cgo, C libraries) are recorded — helper G,
/// 7: a 10 MB Go heap showed as 501 KB, without a word. Read only when no other user can
/// change the file or its path (`symbolize::trusted_path`), opened without blocking and
/// checked on the descriptor; `None` for anything else, or no such section.
fn go_program(path: &str) -> Option<String> {
    use object::{Object, ObjectSection};
    // The path comes from the region, which the target's user writes: only a file whose
    // path others cannot change is read (a FUSE file of theirs could block the read).
    let path = std::path::Path::new(path);
    if !crate::symbolize::trusted_path(path) {
        return None;
    }
    let f = crate::regions::open_regular(path).ok()?;
    if !crate::symbolize::elf_bounded(&f) {
        return None;
    }
    // Read, not mapped (a file truncated meanwhile would fault a mapping): only the header
    // and section table are read.
    let cache = object::ReadCache::new(f);
    let elf = object::File::parse(&cache).ok()?;
    let go = elf
        .sections()
        .any(|s| matches!(s.name(), Ok(".go.buildinfo" | ".note.go.buildid")));
    go.then(|| {
        "a Go program: Go's own heap (runtime.mallocgc) is not recorded, only its C allocations \
         (cgo, C libraries); Go's heap profile (net/http/pprof, runtime/pprof) shows the rest"
            .to_owned()
    })
}
