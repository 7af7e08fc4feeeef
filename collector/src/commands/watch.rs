//! `heapdump watch`: a snapshot of each followed process every interval, written to
//! `DIR/NAME-PID-YYYYMMDDTHHMMSSZ.pb.gz` and/or pushed ([`crate::push`]).
//!
//! Beats fall on multiples of the interval since the Unix epoch (wall clock), so `--every 30s`
//! snapshots at :00 and :30 whenever it was started. A round (every followed process, one
//! after the other, each as `snapshot --by-pid` takes it: [`crate::multi::one`],
//! [`crate::pprof::build`]) never overlaps the next: when it ends past the next beat, the
//! beats it overlapped are skipped with one warning line. Files are written through a
//! temporary file in DIR renamed into place ([`crate::output::write_bytes`]), so SIGINT or
//! SIGTERM, which end the watch after the current file, never leave a partial one.

use crate::cli::{WatchProps, WatchTarget};
use crate::regions::Entry;
use crate::regions::{self, Liveness};
use crate::{multi, pprof, push};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a watch that ends (`--count`, or its `--by-pid` process exited) keeps trying to
/// push what waits in memory (what waits in the spool is left there for the next watch).
pub const DRAIN: Duration = Duration::from_secs(30);

/// Set by SIGINT and SIGTERM.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Makes the first SIGINT or SIGTERM set [`STOP`]; the handler is then reset, so a second one
/// ends the process at once (SA_RESETHAND).
fn install_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        use crate::signals::{self, Handler};
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        let _ = unsafe {
            signals::set(
                sig,
                Handler::Simple(on_signal),
                libc::SA_RESTART | libc::SA_RESETHAND,
            )
        };
    }
}

fn stopped() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// A process being followed.
#[derive(Debug)]
struct Followed {
    name: String,
    /// Its image's start time (clock ticks since boot): tells a reused pid apart.
    start_ticks: u64,
    /// The `alloc_*` values of its last pushed profile (`None`: not pushed yet).
    pushed: Option<push::delta::AllocState>,
    /// Running but detached (`heapdump detach`): not snapshotted (its region no longer
    /// changes) until it is attached again.
    detached: bool,
    /// Running, not listed at the last beat: said only if so again at the next (a process
    /// that exits removes its region first).
    missing: bool,
}

/// What the watch did, for the report at exit.
#[derive(Debug, Default)]
struct Tally {
    beats: u64,
    skipped_beats: u64,
    files: u64,
    failed: u64,
    /// Processes followed at some point.
    followed: u64,
}

/// Runs `heapdump watch` until `--count` beats, SIGINT or SIGTERM, or (with `--by-pid`) the
/// process's exit; then prints what it did and its own CPU time and peak RSS on stderr.
///
/// Errors (before the first beat only): DIR cannot be created or is not a directory; the
/// `--by-pid` process is not instrumented; `--tree PID` names no process. Later failures (a
/// snapshot, a file, a push) are reported on stderr in one line each and the watch goes on;
/// at the end, a watch that kept nothing (every snapshot failed or was not written, and
/// nothing was to be pushed) is an error.
pub fn watch(w: &WatchProps) -> Result<()> {
    let out = match &w.dir {
        // Opened once, not through a link; every file is written relative to it.
        Some(dir) => Some(
            crate::outdir::Dir::open(dir, crate::outdir::Create::WithParents)
                .with_context(|| format!("-o {}", dir.display()))?,
        ),
        None => None,
    };
    match &w.target {
        WatchTarget::Pid(pid) => {
            let entries = regions::scan()?;
            let alive: Vec<&Entry> = (entries.iter())
                .filter(|e| e.file.pid == *pid && e.liveness == Liveness::Alive)
                .collect();
            if let Some(why) = alive.iter().find_map(|e| e.foreign.as_ref()) {
                bail!("{why}");
            }
            let alive = !alive.is_empty();
            if !alive {
                regions::pick(&crate::cli::Target::Pid(*pid))?;
                bail!(
                    "pid {pid} has exited: nothing to watch (`heapdump snapshot --by-pid {pid}` \
                     reads what its region kept)"
                );
            }
        }
        WatchTarget::Many(sel) => {
            multi::select(sel)?;
        }
    }
    let client = (w.push.as_ref())
        .map(push::client::Client::new)
        .transpose()?
        .map(std::sync::Arc::new);
    let queue = match (&out, &client) {
        (Some(dir), Some(_)) if w.spool_max_bytes > 0 => {
            match push::spool::Spool::open(dir, w.spool_max_bytes) {
                Ok((spool, left)) => {
                    if !left.is_empty() {
                        eprintln!(
                            "heapdump: {} profile(s) an earlier watch could not push are in {}: \
                             sending them first",
                            left.len(),
                            spool.dir().display()
                        );
                    }
                    push::queue::Queue::with_spool(spool, left)
                }
                Err(e) => {
                    eprintln!(
                        "heapdump: warning: {}; unsent profiles wait in memory only",
                        crate::regions::shown(&format!("{e:#}"))
                    );
                    push::queue::Queue::default()
                }
            }
        }
        _ => push::queue::Queue::default(),
    };
    install_signals();
    // Pushing runs beside the snapshots: a slow server never delays a beat.
    let pusher = match &client {
        Some(c) => Some(push::queue::Pusher::start(c.clone(), queue, stopped)?),
        None => None,
    };
    let mut followed: BTreeMap<u32, Followed> = BTreeMap::new();
    let mut tally = Tally::default();
    // `--report`: every beat's profiles, the page rewritten after each round.
    let mut page = (w.report.as_ref()).map(|_| crate::report::Report::new(Default::default()));
    let every = w.every.as_nanos();
    let mut beat = next_beat(now_ns(), every);
    let mut ended = false;
    while !ended && !stopped() {
        // Wait for the beat.
        loop {
            if stopped() {
                break;
            }
            let now = now_ns();
            if now >= beat {
                break;
            }
            let left = Duration::from_nanos((beat - now).min(u64::MAX as u128) as u64);
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
        if stopped() {
            break;
        }
        let sink = Sink {
            dir: out.as_ref(),
            client: client.as_deref(),
            pusher: pusher.as_ref(),
        };
        ended = round(w, beat, &mut followed, &mut tally, &sink, page.as_mut())?;
        if let (Some(r), Some(path)) = (page.as_ref(), &w.report) {
            if r.len() > 0 {
                if let Err(e) = crate::report::write(r, None, path) {
                    tally.failed += 1;
                    eprintln!(
                        "heapdump: --report {}: {}",
                        path.display(),
                        crate::regions::shown(&format!("{e:#}"))
                    );
                }
            }
        }
        tally.beats += 1;
        if w.count.is_some_and(|k| tally.beats >= k) {
            break;
        }
        let after = next_beat(now_ns(), every);
        let missed = ((after - beat) / every).saturating_sub(1);
        if missed > 0 {
            eprintln!(
                "heapdump: warning: the snapshots of {} took longer than --every {}: \
                 skipping {missed} beat(s)",
                utc(beat),
                humantime::format_duration(w.every)
            );
            tally.skipped_beats += missed as u64;
        }
        beat = after;
    }
    // What waits only in memory gets tries with the same backoff for at most DRAIN (none
    // when asked to stop); what is in the spool waits there for the next watch.
    let queue = pusher.map(|p| p.finish(DRAIN, stopped));
    if let Some(queue) = &queue {
        if queue.len() > 0 {
            let kept = match queue.spool_dir() {
                Some(d) if queue.spooled() > 0 => format!(
                    "; {} kept in {} for the next watch with this -o",
                    queue.spooled(),
                    d.display()
                ),
                _ => String::new(),
            };
            eprintln!(
                "heapdump: {} profile(s) not pushed: the server did not take them before the \
                 watch ended{kept}",
                queue.len()
            );
        }
    }
    report(&tally, queue.as_ref());
    // Scripts and service managers read the status: a watch that kept nothing (every beat
    // failed to snapshot or to write, nothing pushed) failed.
    if tally.failed > 0 && tally.files == 0 && queue.is_none() {
        bail!(
            "nothing was kept: every one of the {} snapshot(s) failed or could not be written",
            tally.failed
        );
    }
    // Nor did one that never found a process to watch (helper I, 8: `--by-name` with a
    // misspelt name ended "0 files written" with status 0).
    if tally.followed == 0 && tally.files == 0 {
        bail!(
            "nothing was kept: no instrumented process matched during the watch (`heapdump \
             list` shows those there are)"
        );
    }
    Ok(())
}

/// Where a round's profiles go.
struct Sink<'a> {
    /// `-o DIR`, opened.
    dir: Option<&'a crate::outdir::Dir>,
    /// `--push`: the client (for the items' labels) and the thread that sends them.
    client: Option<&'a push::client::Client>,
    pusher: Option<&'a push::queue::Pusher>,
}

/// One beat: a snapshot of each followed process (each also added to `report`, when given).
/// Returns whether the watch should end (the `--by-pid` process exited).
fn round(
    w: &WatchProps,
    beat: u128,
    followed: &mut BTreeMap<u32, Followed>,
    tally: &mut Tally,
    sink: &Sink<'_>,
    mut report: Option<&mut crate::report::Report>,
) -> Result<bool> {
    let entries: Vec<Entry> = match &w.target {
        WatchTarget::Pid(pid) => regions::scan()
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.file.pid == *pid && e.liveness == Liveness::Alive)
            .collect(),
        WatchTarget::Many(sel) => {
            let following: Vec<u32> = followed.keys().copied().collect();
            match multi::select_following(sel, &following) {
                Ok(v) => v,
                // The tree's root is gone, and what it started with it: ended below.
                Err(_) if sel.tree.is_some_and(|r| !running(r)) => Vec::new(),
                Err(e) => {
                    eprintln!(
                        "heapdump: cannot list the processes: {}",
                        crate::regions::shown(&format!("{e:#}"))
                    );
                    Vec::new()
                }
            }
        }
    };
    // Processes gone since the last beat, then new ones. A process still running whose region
    // is not listed was detached (`heapdump detach`): it stays followed, not snapshotted
    // (helper I, 2: the watch said it exited, and a `--by-pid` watch ended).
    let gone: Vec<u32> = followed
        .iter()
        .filter(|(pid, f)| {
            !entries
                .iter()
                .any(|e| e.file.pid == **pid && e.file.start_ticks == f.start_ticks)
        })
        .map(|(pid, _)| *pid)
        .collect();
    let mut listed = None;
    for pid in gone {
        let f = followed.get_mut(&pid).expect("followed");
        if regions::proc_start_ticks(pid) == Some(f.start_ticks) && running(pid) {
            if !f.detached && !f.missing {
                f.missing = true;
            } else if !f.detached {
                f.detached = true;
                // Detached, or its region set aside (it exec'd a program without the shim).
                let listed = listed.get_or_insert_with(|| regions::scan().unwrap_or_default());
                let detached = listed.iter().any(|e| {
                    e.file.pid == pid
                        && e.file.start_ticks == f.start_ticks
                        && e.liveness == Liveness::Detached
                });
                if detached {
                    eprintln!(
                        "heapdump: pid {pid} ({}): detached (heapdump detach); not \
                         snapshotted until it is attached again",
                        regions::shown(&f.name)
                    );
                } else {
                    eprintln!(
                        "heapdump: pid {pid} ({}): runs on without a region (it exec'd a \
                         program without the shim?); not snapshotted",
                        regions::shown(&f.name)
                    );
                }
            }
            continue;
        }
        let f = followed.remove(&pid).expect("followed");
        eprintln!(
            "heapdump: pid {pid} ({}): exited; no longer watched",
            regions::shown(&f.name)
        );
    }
    // The tree's root has exited and so has everything followed from it: nothing is left to
    // watch (helper R, 1: an error every beat, for ever).
    if let WatchTarget::Many(sel) = &w.target {
        if let Some(root) = sel.tree {
            if entries.is_empty() && followed.is_empty() && !running(root) {
                eprintln!(
                    "heapdump: pid {root} and the processes followed from it have exited: \
                     watch ends"
                );
                return Ok(true);
            }
        }
    }
    if let WatchTarget::Pid(pid) = w.target {
        if entries.is_empty() && !followed.get(&pid).is_some_and(|f| f.detached || f.missing) {
            eprintln!("heapdump: pid {pid} is no longer running: watch ends");
            return Ok(true);
        }
    }
    for e in &entries {
        if stopped() {
            break;
        }
        let name = e
            .info
            .as_ref()
            .map(regions::command_name)
            .unwrap_or_default();
        // In messages: the name with control characters escaped (the file name has its own).
        let label = regions::shown(&name);
        match followed.entry(e.file.pid) {
            std::collections::btree_map::Entry::Vacant(v) => {
                eprintln!("heapdump: pid {} ({label}): watching", e.file.pid);
                tally.followed += 1;
                v.insert(Followed {
                    name: name.clone(),
                    start_ticks: e.file.start_ticks,
                    pushed: None,
                    detached: false,
                    missing: false,
                });
            }
            std::collections::btree_map::Entry::Occupied(mut o) if o.get().detached => {
                eprintln!(
                    "heapdump: pid {} ({label}): attached again; watching",
                    e.file.pid
                );
                o.get_mut().detached = false;
            }
            std::collections::btree_map::Entry::Occupied(mut o) => o.get_mut().missing = false,
        }
        let c = match multi::one(e, false, w.lock_timeout) {
            Ok(c) => c,
            Err(err) => {
                let why = format!("{err:#}").replace('\n', "; ");
                // Gone, or exiting: the shim removes its region at a clean exit, possibly
                // before the process is (helper M, 5: a pre-fork server's worker that exited
                // between the listing and its snapshot was counted a failure).
                if process_gone(&e.file) {
                    followed.remove(&e.file.pid);
                    eprintln!(
                        "heapdump: pid {} ({label}): exited; no longer watched",
                        e.file.pid
                    );
                } else {
                    tally.failed += 1;
                    eprintln!(
                        "heapdump: pid {} ({label}): snapshot failed: {why}",
                        e.file.pid
                    );
                }
                continue;
            }
        };
        for warning in &c.meta.warnings {
            eprintln!(
                "heapdump: pid {} ({label}): warning: {}",
                e.file.pid,
                regions::shown(warning)
            );
        }
        let (profile, _) = pprof::build(
            &c,
            pprof::Options {
                with_tags: false,
                symbolize: w.symbolize,
            },
        );
        let mut dest = Vec::new();
        let fname = file_name(&name, e.file.pid, beat);
        if let Some(r) = report.as_deref_mut() {
            // A profile `pprof::build` made always has inuse_space.
            let _ = r.add(&profile, &fname.to_string_lossy());
            if let Some(keep) = w.keep {
                r.keep_last(keep as usize);
            }
        }
        if let Some(dir) = sink.dir {
            let gz = pprof::encode_gz(&profile)?;
            match dir.write_atomic(fname.as_os_str(), |o| o.write_all(&gz)) {
                Ok(()) => {
                    tally.files += 1;
                    dest.push(dir.path().join(&fname).display().to_string());
                    if let Some(keep) = w.keep {
                        prune(dir, &name, e.file.pid, keep);
                    }
                }
                Err(err) => {
                    tally.failed += 1;
                    eprintln!(
                        "heapdump: pid {} ({label}): {}",
                        e.file.pid,
                        crate::regions::shown(&format!("{err:#}"))
                    );
                }
            }
        }
        if let (Some(client), Some(pusher)) = (sink.client, sink.pusher) {
            // alloc_* as deltas since this process's previous push (pid and start time: a
            // reused pid is a new entry of `followed`).
            let f = followed.get_mut(&e.file.pid);
            let (pushed, state) =
                push::delta::for_push(&profile, f.as_ref().and_then(|f| f.pushed.as_ref()));
            if let Some(f) = f {
                f.pushed = Some(state);
            }
            match pprof::encode_gz(&pushed) {
                Ok(gz) => pusher.push(client.item(&name, e.file.pid, &gz)),
                Err(err) => {
                    tally.failed += 1;
                    eprintln!(
                        "heapdump: pid {} ({label}): {}",
                        e.file.pid,
                        crate::regions::shown(&format!("{err:#}"))
                    );
                }
            }
            dest.push(format!("push to {}", w.push.as_ref().expect("push").url));
        }
        if let Some(path) = &w.report {
            dest.push(format!("report {}", path.display()));
        }
        eprintln!(
            "heapdump: pid {} ({label}): {} live blocks, {} bytes -> {}",
            e.file.pid,
            c.meta.blocks,
            c.meta.bytes,
            if dest.is_empty() {
                "not written (above)".to_owned()
            } else {
                dest.join(", ")
            }
        );
    }
    Ok(false)
}

/// Wall-clock time, ns since the Unix epoch.
fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

/// The first multiple of `every` (ns) after `now` (ns).
fn next_beat(now: u128, every: u128) -> u128 {
    (now / every + 1) * every
}

/// `t` (ns since the epoch) as `2024-01-02T03:04:05Z`.
fn utc(t: u128) -> String {
    let t = UNIX_EPOCH + Duration::from_secs((t / 1_000_000_000) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// A file name part for a process name: letters, digits, `.`, `_` and `+` kept, others `_`.
fn safe_name(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+') {
                c
            } else {
                '_'
            }
        })
        .collect();
    match s.trim_start_matches('.') {
        "" => "process".to_owned(),
        t => t.to_owned(),
    }
}

/// `NAME-PID-YYYYMMDDTHHMMSSZ.pb.gz` for the beat at `t` (ns since the epoch).
/// Whether the process of region `file`, whose snapshot just failed, is gone or exiting
/// rather than failing: another process has its pid now, or its region file is no longer
/// there (the shim removes it at a clean exit, possibly before the process is gone).
/// Whether process `pid` runs: neither gone nor a zombie (exited, its parent has not reaped
/// it yet).
fn running(pid: u32) -> bool {
    regions::proc_state(pid).is_some_and(|s| s != 'Z' && s != 'X')
}

fn process_gone(file: &regions::RegionFile) -> bool {
    regions::proc_start_ticks(file.pid) != Some(file.start_ticks)
        || std::fs::symlink_metadata(&file.path).is_err()
}

fn file_name(name: &str, pid: u32, t: u128) -> PathBuf {
    let stamp: String = utc(t).chars().filter(|c| *c != '-' && *c != ':').collect();
    PathBuf::from(format!("{}-{pid}-{stamp}.pb.gz", safe_name(name)))
}

/// Removes all but the newest `keep` files of process `pid` in `dir` (by the time in their
/// names, which sorts as text). A file that cannot be removed is reported.
fn prune(dir: &crate::outdir::Dir, name: &str, pid: u32, keep: u64) {
    let prefix = format!("{}-{pid}-", safe_name(name));
    let Ok(names) = dir.names() else {
        return;
    };
    let mut mine: Vec<String> = names
        .into_iter()
        .filter_map(|e| e.into_string().ok())
        .filter(|n| {
            n.strip_prefix(&prefix)
                .and_then(|r| r.strip_suffix(".pb.gz"))
                .is_some_and(|stamp| {
                    stamp.len() == 16
                        && stamp.ends_with('Z')
                        && stamp.as_bytes()[8] == b'T'
                        && stamp[..8].bytes().all(|b| b.is_ascii_digit())
                })
        })
        .collect();
    mine.sort();
    let excess = mine.len().saturating_sub(keep as usize);
    for old in &mine[..excess] {
        if let Err(e) = dir.remove(std::ffi::OsStr::new(old)) {
            eprintln!("heapdump: {}", crate::regions::shown(&format!("{e:#}")));
        }
    }
}

/// Prints what the watch did and what it cost: user and system CPU time and peak RSS
/// (`getrusage(RUSAGE_SELF)`).
fn report(t: &Tally, queue: Option<&push::queue::Queue>) {
    // SAFETY: a zeroed rusage is valid; getrusage fills it.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let secs = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    let pushed = match queue {
        Some(q) => format!(
            ", {} pushed, {} not pushed{}",
            q.sent,
            q.dropped + q.len() as u64,
            match q.spooled() {
                0 => String::new(),
                n => format!(" ({n} spooled)"),
            }
        ),
        None => String::new(),
    };
    eprintln!(
        "heapdump: watch ended: {} beats ({} more skipped), {} files written{pushed}, {} failures; \
         own CPU time {:.2} s (user {:.2} s, system {:.2} s), peak RSS {:.1} MiB",
        t.beats,
        t.skipped_beats,
        t.files,
        t.failed,
        secs(ru.ru_utime) + secs(ru.ru_stime),
        secs(ru.ru_utime),
        secs(ru.ru_stime),
        ru.ru_maxrss as f64 / 1024.0
    );
}

#[cfg(test)]
mod tests {
    /// Helper M, 5: a worker whose region its clean exit removed, still running (as its pid
    /// and start time say), is gone; with its region there, a failed snapshot is a failure.
    #[test]
    fn a_process_whose_region_is_removed_is_gone_not_failed() {
        let me = std::process::id();
        let ticks = crate::regions::proc_start_ticks(me).expect("own start time");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("region");
        std::fs::write(&path, b"x").unwrap();
        let file = |path: &std::path::Path, start_ticks| crate::regions::RegionFile {
            path: path.to_path_buf(),
            pid: me,
            start_ticks,
            created_ns: 0,
        };
        assert!(!process_gone(&file(&path, ticks)), "running, region there");
        assert!(
            process_gone(&file(&path, ticks + 1)),
            "another process has the pid"
        );
        std::fs::remove_file(&path).unwrap();
        assert!(process_gone(&file(&path, ticks)), "running, region removed");
    }

    use super::*;

    #[test]
    fn beats_are_multiples_of_the_interval() {
        let s = 1_000_000_000u128;
        assert_eq!(next_beat(0, 30 * s), 30 * s);
        assert_eq!(next_beat(30 * s, 30 * s), 60 * s);
        assert_eq!(next_beat(31 * s + 5, 30 * s), 60 * s);
    }

    #[test]
    fn file_names_sort_by_time() {
        let s = 1_000_000_000u128;
        let a = file_name("my server", 12, 1_700_000_000 * s);
        assert_eq!(a, PathBuf::from("my_server-12-20231114T221320Z.pb.gz"));
        assert_eq!(safe_name("../x"), "_x");
        assert_eq!(safe_name(""), "process");
    }

    #[test]
    fn prune_keeps_the_newest_of_one_process() {
        let d = tempfile::tempdir().unwrap();
        let s = 1_000_000_000u128;
        for i in 0..5 {
            std::fs::write(
                d.path().join(file_name("a", 1, (1_700_000_000 + i) * s)),
                b"",
            )
            .unwrap();
        }
        std::fs::write(d.path().join(file_name("a", 2, 1_600_000_000 * s)), b"").unwrap();
        std::fs::write(d.path().join("a-1-other.pb.gz"), b"").unwrap();
        let dir = crate::outdir::Dir::open(d.path(), crate::outdir::Create::No).unwrap();
        prune(&dir, "a", 1, 2);
        let mut left: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "a-1-20231114T221323Z.pb.gz",
                "a-1-20231114T221324Z.pb.gz",
                "a-1-other.pb.gz",
                "a-2-20200913T122640Z.pb.gz"
            ]
        );
    }
}
