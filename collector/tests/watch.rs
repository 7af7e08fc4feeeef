//! `heapdump watch`: snapshots every interval of `hold_sized` programs (known blocks), checked
//! exactly; `--keep`; a process that exits is reported once and dropped, one started later is
//! picked up (`--by-name`); SIGTERM ends the watch with status 0 and no temporary file.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// (blocks, bytes) `hold_sized N SIZE` holds through `hold_blocks`: N blocks of SIZE bytes and
/// the array of N pointers.
fn held(n: i64, size: i64) -> (i64, i64) {
    (n + 1, n * size + n * 8)
}

/// `hold_sized N SIZE` under the shim, its tally checked.
fn hold(dir: &Path, n: i64, size: i64) -> Running {
    let r = hold_sized(dir, n, size);
    assert_eq!(r.tally(), (n, n * size));
    r
}

/// The files in `dir`, sorted by name.
fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().into_string().unwrap())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The profiles of process `pid` in `dir` (`hold_sized-PID-YYYYMMDDTHHMMSSZ.pb.gz`).
fn profiles_of(dir: &Path, pid: u32) -> Vec<PathBuf> {
    let prefix = format!("hold_sized-{pid}-");
    files(dir)
        .into_iter()
        .filter(|f| {
            f.strip_prefix(&prefix)
                .and_then(|r| r.strip_suffix(".pb.gz"))
                .is_some_and(|t| t.len() == 16 && t.as_bytes()[8] == b'T' && t.ends_with('Z'))
        })
        .map(|f| dir.join(f))
        .collect()
}

/// Asserts that the profile at `path` holds exactly what `hold_sized n size` holds.
fn assert_exact(path: &Path, n: i64, size: i64) {
    let (blocks, bytes) = held(n, size);
    let p = decode(path);
    // [alloc_objects, alloc_space, inuse_objects, inuse_space]: nothing was freed.
    assert_eq!(
        sum_through(&p, "hold_blocks"),
        [blocks, bytes, blocks, bytes],
        "{}",
        path.display()
    );
}

/// Now, in ns since the Unix epoch (the clock of a profile's `time_nanos`).
fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// Waits (at most 60 s: a hang, not a time limit under test) until `cond` holds.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < until, "gave up waiting: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn every_second_five_times_gives_five_exact_files_a_second_apart() {
    if !can_run("every_second_five_times_gives_five_exact_files_a_second_apart") {
        return;
    }
    let dir = region_dir("watch-count");
    let r = hold(&dir, 100, 1000);
    let out = dir.with_extension("out");
    let pid = r.pid().to_string();
    let t = heapdump_timeout(
        &dir,
        &[
            "watch",
            "--by-pid",
            &pid,
            "--every",
            "1s",
            "--count",
            "5",
            "-o",
            out.join("sub").to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    let out = out.join("sub");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
        0o700,
        "the directory is created 0700"
    );
    let all = files(&out);
    let mine = profiles_of(&out, r.pid());
    assert_eq!(mine.len(), 5, "{all:?}");
    assert_eq!(all.len(), 5, "nothing else in the directory: {all:?}");
    for f in &mine {
        assert_exact(f, 100, 1000);
    }
    // Beats are aligned to the second: the names' UTC times are consecutive seconds.
    let seconds = |f: &PathBuf| -> i64 {
        let name = f.file_name().unwrap().to_str().unwrap();
        let t = &name[name.len() - 13..name.len() - 7]; // HHMMSS of …THHMMSSZ.pb.gz
        let n = |r: std::ops::Range<usize>| t[r].parse::<i64>().unwrap();
        n(0..2) * 3600 + n(2..4) * 60 + n(4..6)
    };
    let mtime = |f: &PathBuf| -> f64 {
        let m = std::fs::metadata(f).unwrap().modified().unwrap();
        m.duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    for w in mine.windows(2) {
        assert_eq!(
            (seconds(&w[1]) - seconds(&w[0])).rem_euclid(86_400),
            1,
            "beats a second apart: {all:?}"
        );
    }
    // Each file is written at or after its beat, never before (a loaded machine may write it
    // late; how late is not a property of `watch`, so no upper bound is asserted here).
    for f in &mine {
        let beat = seconds(f);
        let written = mtime(f) as i64 % 86_400;
        assert!(
            (written - beat).rem_euclid(86_400) < 3_600,
            "{} written at second {written}, before its beat {beat}",
            f.display()
        );
    }
    assert!(
        t.stderr.contains("watch ended: 5 beats") && t.stderr.contains("peak RSS"),
        "{}",
        t.stderr
    );
}

#[test]
fn keep_leaves_the_newest_files() {
    if !can_run("keep_leaves_the_newest_files") {
        return;
    }
    let dir = region_dir("watch-keep");
    let r = hold(&dir, 50, 2000);
    let out = dir.with_extension("out");
    let pid = r.pid().to_string();
    let t = heapdump_timeout(
        &dir,
        &[
            "watch",
            "--by-pid",
            &pid,
            "--every",
            "1s",
            "--count",
            "4",
            "--keep",
            "2",
            "-o",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    // Every file written, in order, from the summary lines.
    let written: Vec<String> = t
        .stderr
        .lines()
        .filter_map(|l| l.split(" -> ").nth(1))
        .map(|p| {
            Path::new(p)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(written.len(), 4, "{}", t.stderr);
    assert_eq!(files(&out), written[2..].to_vec());
    for f in profiles_of(&out, r.pid()) {
        assert_exact(&f, 50, 2000);
    }
}

#[test]
fn by_name_follows_processes_and_sigterm_ends_cleanly() {
    if !can_run("by_name_follows_processes_and_sigterm_ends_cleanly") {
        return;
    }
    let dir = region_dir("watch-follow");
    let a = hold(&dir, 100, 1000);
    let a_pid = a.pid();
    let out = dir.with_extension("out");
    let log = dir.with_extension("log");
    let mut watch = Command::new(heapdump())
        .args(["watch", "--by-name", "hold_sized", "--every", "1s", "-o"])
        .arg(&out)
        .env("HEAPDUMP_DIR", &dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let stderr = || std::fs::read_to_string(&log).unwrap_or_default();

    wait_until("a profile of the first process", || {
        !profiles_of(&out, a_pid).is_empty()
    });
    assert_eq!(a.finish(), 0);
    let gone = format!("pid {a_pid} (hold_sized): exited; no longer watched");
    wait_until("the exit reported", || stderr().contains(&gone));

    // A second instance started later is picked up at a following beat.
    let b = hold(&dir, 200, 3000);
    let b_pid = b.pid();
    // A beat may find `b` before it has made its blocks (its region exists from start-up); the
    // profiles taken from now on must be exact.
    let b_ready_ns = now_ns();
    wait_until(
        "a profile of the second process taken after it was ready",
        || {
            profiles_of(&out, b_pid)
                .iter()
                .any(|f| decode(f).time_nanos >= b_ready_ns)
        },
    );
    // SAFETY: kill has no memory preconditions; the pid is our own child, not yet reaped.
    assert_eq!(unsafe { libc::kill(watch.id() as i32, libc::SIGTERM) }, 0);
    let status = watch.wait().unwrap();
    let text = stderr();
    assert_eq!(status.code(), Some(0), "{text}");
    assert_eq!(text.matches(&gone).count(), 1, "reported once: {text}");
    assert!(text.contains("watch ended"), "{text}");

    // Only complete profiles: no temporary file left, each profile exact.
    let all = files(&out);
    assert!(
        all.iter().all(|f| !f.starts_with('.')),
        "temporary file left: {all:?}"
    );
    let (pa, pb) = (profiles_of(&out, a_pid), profiles_of(&out, b_pid));
    assert_eq!(pa.len() + pb.len(), all.len(), "{all:?}");
    for f in &pa {
        assert_exact(f, 100, 1000);
    }
    for f in &pb {
        let p = decode(f);
        if p.time_nanos >= b_ready_ns {
            assert_exact(f, 200, 3000);
        } else {
            // Taken while `b` was still allocating: a part of what it holds, never more.
            let (blocks, bytes) = held(200, 3000);
            let got = sum_through(&p, "hold_blocks");
            assert!(
                got[0] <= blocks && got[1] <= bytes && got[2] == got[0] && got[3] == got[1],
                "{}: {got:?}",
                f.display()
            );
        }
    }
    // Beats are whole seconds apart: every name distinct per process.
    let stamps: BTreeSet<&str> = all.iter().map(|f| &f[f.len() - 22..]).collect();
    assert!(stamps.len() >= pb.len().max(pa.len()));
    drop(b);
}

#[test]
fn bad_arguments_fail_before_watching() {
    let dir = region_dir("watch-args");
    std::fs::create_dir_all(&dir).unwrap();
    for (args, want) in [
        (
            vec!["watch", "--by-pid", "1", "--every", "500ms"],
            "at least 1s",
        ),
        (
            vec![
                "watch",
                "--multi-process",
                "--every",
                "1s",
                "--push",
                "ftp://x",
            ],
            "http:// or https://",
        ),
        (
            vec![
                "watch",
                "--by-pid",
                "999999999",
                "--every",
                "1s",
                "-o",
                "/dev/null/x",
            ],
            "cannot create the directory",
        ),
    ] {
        let t = heapdump_timeout(&dir, &args, Duration::from_secs(30));
        assert_eq!(t.code, Some(1), "{args:?}: {t:?}");
        assert!(t.stderr.contains(want), "{args:?}: {}", t.stderr);
    }
}

/// A watch that keeps nothing — every snapshot failed (here: the region's lock held by
/// someone else past `--lock-timeout`) — exits 1 and says so, where it exited 0; and no beat
/// prints a "->" line without a destination.
#[test]
fn a_watch_that_kept_nothing_fails() {
    if !can_run("a_watch_that_kept_nothing_fails") {
        return;
    }
    let dir = region_dir("watch-kept-nothing");
    let r = hold(&dir, 100, 1000);
    let pid = r.pid();
    let (ok, list, err) = heapdump_cmd(&dir, &["list", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&list).unwrap();
    let region = (v.as_array().unwrap().iter())
        .find(|e| e["pid"].as_u64() == Some(pid as u64))
        .and_then(|e| e["region"].as_str())
        .unwrap()
        .to_owned();
    let f = std::fs::File::open(&region).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor we own.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
    let out = dir.join("out");
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &[
            "watch",
            "--by-pid",
            &pid.to_string(),
            "--every",
            "1s",
            "--count",
            "2",
            "--lock-timeout",
            "1",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert!(!ok, "{err}");
    assert!(err.contains("nothing was kept"), "{err}");
    assert!(!err.lines().any(|l| l.ends_with("-> ")), "{err}");
    drop(f);
    drop(r);
}

/// Helper R, 1: `watch --multi-process --tree ROOT` keeps the processes it follows when ROOT
/// exits — a launcher that starts a service in the background and leaves — snapshotting them
/// until they exit, then ends by itself. Before: the service was called "detached" and no
/// longer snapshotted, and "cannot list the processes: no such process" came every beat until
/// the watch was stopped.
#[test]
fn a_tree_watch_keeps_what_it_follows_when_the_root_exits() {
    let exe = compile_c("hold_for", &[]);
    let dir = region_dir("watch-tree-root-exits");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("out");
    let mut sh = Command::new("sh")
        .arg("-c")
        .arg(format!("{} 4 & sleep 1", exe.display()))
        .env("HEAPDUMP_DIR", &dir)
        .env("LD_PRELOAD", shim())
        .spawn()
        .unwrap();
    // The launcher records too: wait for its region (and its child's).
    let root = sh.id();
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::read_dir(dir.join(format!("heapdump-{euid}")))
        .or_else(|_| std::fs::read_dir(&dir))
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".heapdump"))
                .count()
        })
        .unwrap_or(0)
        < 2
    {
        assert!(Instant::now() < deadline, "no regions");
        std::thread::sleep(Duration::from_millis(20));
    }
    let t = heapdump_timeout(
        &dir,
        &[
            "watch",
            "--multi-process",
            "--tree",
            &root.to_string(),
            "--every",
            "1s",
            "-o",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(30),
    );
    let _ = sh.wait();
    assert!(!t.timed_out && t.code == Some(0), "{t:?}");
    assert!(
        t.stderr.contains(&format!(
            "pid {root} and the processes followed from it have exited: watch ends"
        )),
        "{}",
        t.stderr
    );
    assert!(
        !t.stderr.contains("detached") && !t.stderr.contains("cannot list"),
        "{}",
        t.stderr
    );
    let held: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("hold_for-"))
        .collect();
    // Beats at about 0, 1, 2, 3 s: at least two after the launcher's exit at 1 s.
    assert!(held.len() >= 3, "{held:?}\n{}", t.stderr);
}
