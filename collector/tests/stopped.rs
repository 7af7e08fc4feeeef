//! Snapshots of a stopped target (SIGSTOP, `--stop`'s ptrace): read as the records are, fast
//! and exact, never by waiting for operations the stopped threads cannot finish.
//!
//! The target is `examples/c/churn.c`: N threads each keep K blocks from `churn_alloc`,
//! replacing them at full speed ("allocate the new block, then free the old one"), so the
//! blocks live at any one instant number between N·K and N·K+N.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const N: i64 = 32;
const K: i64 = 5000;
const SIZE: i64 = 48;

/// Whether every thread of `pid` is in state `T` (stopped).
fn all_stopped(pid: u32) -> bool {
    let Ok(d) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    d.flatten().all(|e| {
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        stat.rsplit(')')
            .next()
            .map(str::trim_start)
            .is_some_and(|s| s.starts_with('T'))
    })
}

/// CPU time (ns) every thread of `pid` has run, from `/proc/PID/task/*/schedstat`.
fn run_time_ns(pid: u32) -> u64 {
    let mut sum = 0;
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        if let Ok(s) = std::fs::read_to_string(e.path().join("schedstat")) {
            sum += s
                .split_whitespace()
                .next()
                .and_then(|x| x.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    sum
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

/// Every live block a profile's "snapshot: N live blocks" comment counts.
fn total(comments: &[String]) -> i64 {
    comments
        .iter()
        .find_map(|c| c.strip_prefix("snapshot: "))
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .expect("the snapshot comment")
}

fn comments(p: &heapdump_proto::Profile) -> Vec<String> {
    p.comment
        .iter()
        .map(|c| p.string_table[*c as usize].clone())
        .collect()
}

/// The churn target, churning at full speed. Tests of this file take turns (a lock held while
/// the target lives): each target keeps the machine's cores busy.
fn churn(name: &str) -> (Running, std::sync::MutexGuard<'static, ()>) {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let exe = compile_c("churn", &[]);
    let dir = region_dir(name);
    let mut cmd = Command::new(&exe);
    cmd.args([N.to_string(), K.to_string(), SIZE.to_string()]);
    let r = start(cmd, &dir, true);
    std::thread::sleep(Duration::from_millis(300));
    (r, turn)
}

/// Why the frozen path cannot work here, if it cannot.
fn unsupported() -> Option<&'static str> {
    (!Path::new("/proc/self/task")
        .join(std::process::id().to_string())
        .join("schedstat")
        .exists())
    .then_some("this kernel has no /proc/PID/task/TID/schedstat (CONFIG_SCHED_INFO)")
}

/// Snapshots `pid`; checks the churn invariant (and, with tags, no address twice); returns
/// (live blocks from churn_alloc, the profile's comments, stderr, seconds).
fn snap(dir: &Path, pid: u32, tags: bool, i: usize) -> (i64, Vec<String>, String, f64) {
    let out = dir.with_extension(format!("{i}.pb.gz"));
    let pid_s = pid.to_string();
    let mut args = vec!["snapshot", "--by-pid", &pid_s, "-o", out.to_str().unwrap()];
    if tags {
        args.push("--with-tags");
    }
    let started = Instant::now();
    let (ok, so, se) = heapdump_cmd(dir, &args);
    let secs = started.elapsed().as_secs_f64();
    assert!(ok, "snapshot {i} failed: {so}{se}");
    let p = decode(&out);
    let v = sum_through(&p, "churn_alloc");
    let count = v[2];
    assert!(
        (N * K..=N * K + N).contains(&count),
        "snapshot {i}: {count} live blocks from churn_alloc, outside [{}, {}]",
        N * K,
        N * K + N
    );
    assert_eq!(
        v[3],
        count * SIZE,
        "snapshot {i}: inuse_space != count × size"
    );
    if tags {
        assert_addresses_distinct(&p, &format!("snapshot {i}"));
    }
    (count, comments(&p), se, secs)
}

#[test]
fn stopped_target_is_exact_without_waiting() {
    if let Some(why) = unsupported() {
        skip_note(&format!(
            "skipped: stopped_target_is_exact_without_waiting: {why}"
        ));
        return;
    }
    let (r, _turn) = churn("stopped");
    let pid = r.pid();
    signal(pid, libc::SIGSTOP);
    let t = Instant::now();
    while !all_stopped(pid) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "pid {pid} never stopped"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut counts = Vec::new();
    let mut in_operation = 0u64;
    for i in 0..10 {
        let (count, comments, stderr, secs) = snap(&r.dir, pid, i % 3 == 0, i);
        assert!(
            !stderr.contains("may be missing") && !comments.iter().any(|c| c.contains("may be missing")),
            "snapshot {i} of a stopped target gave up on operations in flight: {stderr}{comments:?}"
        );
        let line = comments
            .iter()
            .find(|c| c.starts_with("snapshot:"))
            .expect("the snapshot comment");
        assert!(
            line.contains(&format!("target stopped (SIGSTOP, {} threads)", N + 1))
                && line.contains("no operation in flight was awaited"),
            "snapshot {i}: the comments must say the target was stopped: {line}"
        );
        let stuck: u64 = line
            .split(" thread(s) stopped inside an operation")
            .next()
            .and_then(|s| s.rsplit('(').next())
            .and_then(|s| s.parse().ok())
            .expect("the count of threads stopped inside an operation");
        in_operation = in_operation.max(stuck);
        eprintln!(
            "stopped snapshot {i}: {count} live blocks in {secs:.3} s ({stuck} thread(s) \
             stopped inside an operation)"
        );
        counts.push(count);
    }
    // Nothing runs while the target is stopped: every snapshot reads the same records.
    assert!(
        counts.iter().all(|&c| c == counts[0]),
        "snapshots of a stopped target differ: {counts:?}"
    );
    eprintln!("most threads stopped inside an operation in one snapshot: {in_operation}");
    signal(pid, libc::SIGCONT);
    for i in 10..15 {
        let (count, comments, stderr, secs) = snap(&r.dir, pid, i % 2 == 0, i);
        assert!(
            comments
                .iter()
                .any(|c| c.contains("waited ") && c.contains("for in-flight operations"))
                && !comments.iter().any(|c| c.contains("target stopped")),
            "snapshot {i} of the resumed target must use the live protocol: {comments:?}"
        );
        // (A running target's snapshot may still give up on a thread descheduled inside its
        // operation on this overloaded machine; the live protocol's count is checked above.)
        let gave_up = if stderr.contains("may be missing") {
            "; gave up waiting"
        } else {
            ""
        };
        eprintln!("running snapshot {i}: {count} live blocks in {secs:.3} s{gave_up}");
    }
    assert_eq!(r.finish(), 0);
}

/// A target that resumes while a snapshot reads it as stopped is never reported from that
/// read: the collector sees that it ran and snapshots it again, with the live protocol.
#[test]
fn resumed_during_the_scan_is_taken_again() {
    if let Some(why) = unsupported() {
        skip_note(&format!(
            "skipped: resumed_during_the_scan_is_taken_again: {why}"
        ));
        return;
    }
    let (r, _turn) = churn("resumed");
    let pid = r.pid();
    signal(pid, libc::SIGSTOP);
    let t = Instant::now();
    while !all_stopped(pid) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "pid {pid} never stopped"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let out = r.dir.with_extension("resumed.pb.gz");
    // The collector pauses at the first block of its scan (test hook, file handshake); the
    // target is resumed during that pause, and the pause ends once it has run.
    let pause = Handshake::new("HEAPDUMP_TEST_PAUSE_FILE", &r.dir);
    let (k, v) = pause.env();
    let child = Command::new(heapdump())
        .args(["snapshot", "--by-pid", &pid.to_string(), "-o"])
        .arg(&out)
        .env("HEAPDUMP_DIR", &r.dir)
        .env(k, v)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    pause.reached();
    let ran_before = run_time_ns(pid);
    signal(pid, libc::SIGCONT);
    let t = Instant::now();
    while run_time_ns(pid) == ran_before {
        assert!(t.elapsed() < Duration::from_secs(10), "pid {pid} never ran");
        std::thread::sleep(Duration::from_millis(1));
    }
    pause.release();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p = decode(&out);
    let count = sum_through(&p, "churn_alloc")[2];
    let comments = comments(&p);
    assert!(
        !comments.iter().any(|c| c.contains("target stopped")),
        "a target that ran during the scan was reported as stopped: {comments:?}"
    );
    assert!(
        (N * K..=N * K + N).contains(&count),
        "{count} live blocks from churn_alloc, outside [{}, {}]",
        N * K,
        N * K + N
    );
    eprintln!("resumed during the scan: taken again with the live protocol, {count} live blocks");
    assert_eq!(r.finish(), 0);
}

/// `leaks --stop` stops the target itself (ptrace): its snapshot is read as stopped, exact,
/// with no wait for the operations its threads were stopped in.
#[test]
fn stop_flag_reads_the_stopped_target() {
    if let Some(why) = unsupported() {
        skip_note(&format!(
            "skipped: stop_flag_reads_the_stopped_target: {why}"
        ));
        return;
    }
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").unwrap_or_default();
    // SAFETY: geteuid has no arguments.
    if unsafe { libc::geteuid() } != 0 && !matches!(scope.trim(), "" | "0") {
        skip_note(&format!(
            "skipped: stop_flag_reads_the_stopped_target: ptrace not allowed (ptrace_scope {})",
            scope.trim()
        ));
        return;
    }
    let (r, _turn) = churn("stopflag");
    let pid = r.pid();
    // The program's own blocks besides the churn's (slot arrays, stdio): fixed once it is
    // ready. A snapshot counts both; the churn's part is in [N·K, N·K+N].
    let (churned, comments0, _, _) = snap(&r.dir, pid, false, 0);
    let own = total(&comments0) - churned;
    for i in 0..3 {
        let out = r.dir.with_extension(format!("leaks{i}.pb.gz"));
        let started = Instant::now();
        let (ok, so, se) = heapdump_cmd(
            &r.dir,
            &[
                "leaks",
                "--by-pid",
                &pid.to_string(),
                "--stop",
                "-o",
                out.to_str().unwrap(),
            ],
        );
        let secs = started.elapsed().as_secs_f64();
        assert!(ok, "leaks --stop failed: {so}{se}");
        assert!(
            !se.contains("may be missing"),
            "leaks --stop waited for stopped threads: {se}"
        );
        let pause = se
            .lines()
            .find(|l| l.contains("was stopped for"))
            .unwrap_or_else(|| panic!("the pause is reported: {se}"))
            .to_owned();
        let comments = comments(&decode(&out));
        let line = comments
            .iter()
            .find(|c| c.starts_with("snapshot:"))
            .expect("the snapshot comment");
        assert!(
            line.contains(&format!("target stopped (ptrace, {} threads)", N + 1)),
            "leaks --stop must read the target as stopped: {line}"
        );
        let count = total(&comments);
        assert!(
            (N * K + own..=N * K + N + own).contains(&count),
            "leaks --stop {i}: {count} live blocks, outside [{}, {}]",
            N * K + own,
            N * K + N + own
        );
        eprintln!("leaks --stop {i}: {count} live blocks in {secs:.3} s; {pause}");
    }
    assert_eq!(r.finish(), 0);
}
