//! The security model (README, "Security model"): regions another user planted, output
//! directories reached through links, spool files planted in `-o DIR`, slow push servers, and
//! messages about targets that exit or are zombies.

mod common;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

/// The uid and gid a planted region belongs to: `nobody`.
const NOBODY: u32 = 65534;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Makes a FIFO at `p` with permissions `m`; panics when it cannot.
fn mkfifo(p: &Path, m: u32) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; mkfifo only creates the file.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), m as libc::mode_t) }, 0);
}

fn mode(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

/// Root's region directory taken by `nobody` before root used it (as `/dev/shm/heapdump-0`
/// created by another user), holding a copy of the region of a root process: every command
/// run as root refuses it, in one line naming the owner, and writes nothing; `list` shows it
/// as foreign. The same region in root's own directory is read as usual.
#[test]
fn a_region_planted_by_another_user_is_refused_by_every_command() {
    let test = "a_region_planted_by_another_user_is_refused_by_every_command";
    if !can_run(test) {
        return;
    }
    if !is_root() {
        skip_note(&format!(
            "skipped: {test}: needs root (to give a region to another user with chown)"
        ));
        return;
    }
    let own = region_dir("planted-own");
    let r = hold_sized(&own, 10, 64);
    let pid = r.pid();
    let real = region_file(&own);
    // A shared directory like /dev/shm (root's, sticky, writable by all): root's region
    // directory in it is then `heapdump-0`, which `nobody` created first.
    let shared = region_dir("planted-shared");
    std::fs::create_dir(&shared).unwrap();
    mode(&shared, 0o1777);
    let planted = shared.join("heapdump-0");
    std::fs::create_dir(&planted).unwrap();
    std::os::unix::fs::chown(&planted, Some(NOBODY), Some(NOBODY)).unwrap();
    mode(&planted, 0o700);
    let forged = planted.join(real.file_name().unwrap());
    std::fs::copy(&real, &forged).unwrap();
    std::os::unix::fs::chown(&forged, Some(NOBODY), Some(NOBODY)).unwrap();
    mode(&forged, 0o600);
    // The same file in a directory of nobody's given with --region.
    let theirs = region_dir("planted-theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).unwrap();
    mode(&theirs, 0o700);
    let loose = theirs.join("secrets.heapdump");
    std::fs::copy(&real, &loose).unwrap();
    std::os::unix::fs::chown(&loose, Some(NOBODY), Some(NOBODY)).unwrap();
    mode(&loose, 0o600);

    let out = region_dir("planted-out");
    std::fs::create_dir(&out).unwrap();
    let o = |n: &str| out.join(n).to_str().unwrap().to_owned();
    let p = pid.to_string();
    let commands: Vec<Vec<String>> = vec![
        vec!["snapshot", "--by-pid", &p, "-o", &o("s.pb.gz")],
        vec![
            "snapshot",
            "--by-pid",
            &p,
            "-o",
            &o("c.pb.gz"),
            "--contents-dir",
            &o("contents"),
            "--with-strings",
        ],
        vec![
            "snapshot",
            "--region",
            forged.to_str().unwrap(),
            "-o",
            &o("r.pb.gz"),
        ],
        vec![
            "snapshot",
            "--region",
            loose.to_str().unwrap(),
            "-o",
            &o("l.pb.gz"),
        ],
        vec!["snapshot", "--by-name", "hold_sized", "-o", &o("n.pb.gz")],
        vec!["leaks", "--by-pid", &p],
        vec!["retainers", "--by-pid", &p, "--function", "hold"],
        vec!["top", "--retained", "--by-pid", &p],
        vec!["graph", "--by-pid", &p, "-o", &o("g.svg")],
        vec![
            "watch",
            "--by-pid",
            &p,
            "--every",
            "1s",
            "--count",
            "1",
            "-o",
            &o("w"),
        ],
    ]
    .into_iter()
    .map(|v| v.into_iter().map(str::to_owned).collect())
    .collect();
    for args in &commands {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let t = heapdump_timeout(&shared, &args, std::time::Duration::from_secs(60));
        assert!(!t.timed_out && t.code == Some(1), "{args:?}: {t:?}");
        let lines: Vec<&str> = t.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: one line: {}", t.stderr);
        // Named with --region, the file is refused as another user's region of root's
        // process; reached through the directory, the directory itself is (helper H, 3).
        assert!(
            (lines[0].contains("foreign region")
                && lines[0].contains("owned by uid 65534")
                && lines[0].contains(&format!("pid {pid} runs as uid 0")))
                || (!args.contains(&"--region")
                    && lines[0].contains("is owned by uid 65534, not by root")),
            "{args:?}: {}",
            t.stderr
        );
    }
    // Several processes: the foreign one is skipped in one line, and nothing is left.
    let t = heapdump_timeout(
        &shared,
        &["snapshot", "--multi-process", "-o", &o("m.pb.gz")],
        std::time::Duration::from_secs(60),
    );
    assert_eq!(t.code, Some(1), "{t:?}");
    assert!(t.stderr.contains("not by root"), "{}", t.stderr);
    let t = heapdump_timeout(
        &shared,
        &[
            "watch",
            "--multi-process",
            "--every",
            "1s",
            "--count",
            "1",
            "-o",
            &o("wm"),
        ],
        std::time::Duration::from_secs(60),
    );
    assert!(t.stderr.contains("not by root"), "{t:?}");
    // Nothing was written: no profile, no block contents.
    let mut written: Vec<String> = walk(&out);
    written.retain(|f| !f.ends_with("/w") && !f.ends_with("/wm"));
    assert!(written.is_empty(), "written: {written:?}");
    // `list` refuses the directory too, saying why.
    let (ok, _, err) = heapdump_cmd(&shared, &["list", "--json"]);
    assert!(
        !ok && err.contains("is owned by uid 65534, not by root"),
        "{err}"
    );
    // The real region, in root's own directory, is read as usual.
    let (ok, _, err) = heapdump_cmd(&own, &["snapshot", "--by-pid", &p, "-o", &o("ok.pb.gz")]);
    assert!(ok, "{err}");
    let (ok, _, err) = heapdump_cmd(&own, &["list"]);
    assert!(ok && !err.contains("foreign"), "{err}");
    drop(r);
}

/// Every file under `dir` (paths as strings), directories included.
fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        out.push(e.path().display().to_string());
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        }
    }
    out
}

/// A directory reached through a symbolic link, with or without a trailing slash, is never
/// written to: `--contents-dir`, `watch -o`, and the directory of `-o FILE`.
#[test]
fn output_directories_reached_through_a_link_are_refused() {
    let test = "output_directories_reached_through_a_link_are_refused";
    if !can_run(test) {
        return;
    }
    let dir = region_dir("links");
    let r = hold_sized(&dir, 10, 64);
    let p = r.pid().to_string();
    let base = region_dir("links-out");
    let target = base.join("target");
    std::fs::create_dir_all(&target).unwrap();
    let link = base.join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let l = link.to_str().unwrap().to_owned();
    for l in [
        l.clone(),
        format!("{l}/"),
        format!("{l}//"),
        format!("{l}/."),
    ] {
        let runs: Vec<Vec<String>> = vec![
            vec![
                "snapshot",
                "--by-pid",
                &p,
                "-o",
                "/dev/null",
                "--contents-dir",
                &l,
            ],
            vec!["snapshot", "--by-pid", &p, "-o", &format!("{l}/x.pb.gz")],
            vec![
                "watch", "--by-pid", &p, "--every", "1s", "--count", "1", "-o", &l,
            ],
        ]
        .into_iter()
        .map(|v| v.into_iter().map(str::to_owned).collect())
        .collect();
        for args in &runs {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let t = heapdump_timeout(&dir, &args, std::time::Duration::from_secs(60));
            assert_eq!(t.code, Some(1), "{args:?}: {t:?}");
            assert!(t.stderr.contains("symbolic link"), "{args:?}: {}", t.stderr);
        }
    }
    let left: Vec<_> = std::fs::read_dir(&target).unwrap().collect();
    assert!(left.is_empty(), "written through the link: {left:?}");
    // The real directory is written to.
    let t = target.to_str().unwrap();
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &[
            "snapshot",
            "--by-pid",
            &p,
            "-o",
            "/dev/null",
            "--contents-dir",
            &format!("{t}/"),
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 11);
    drop(r);
}

/// A minimal HTTP/1.1 server on 127.0.0.1 taking every request with 200 (keep-alive); each
/// request's body is sent on the channel. `delay`: answer one byte a second instead (a slow
/// server: the answer never completes in a push's time).
fn http_server(slow: bool) -> (String, std::sync::mpsc::Receiver<Vec<u8>>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { return };
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut w = c.try_clone().unwrap();
                let mut r = BufReader::new(c);
                loop {
                    let mut len = 0usize;
                    loop {
                        let mut line = String::new();
                        if r.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let line = line.trim_end();
                        if line.is_empty() {
                            break;
                        }
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0u8; len];
                    if r.read_exact(&mut body).is_err() {
                        return;
                    }
                    let _ = tx.send(body);
                    let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
                    if slow {
                        for b in answer {
                            if w.write_all(&[*b]).is_err() {
                                return;
                            }
                            std::thread::sleep(std::time::Duration::from_secs(1));
                        }
                    } else if w.write_all(answer).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, rx)
}

/// A spooled profile (the spool's format: protobuf `Record`, field 1 version 1, field 2 a
/// label, field 3 the profile, field 4 the id) whose label value is `marker`.
fn record(marker: &str) -> Vec<u8> {
    fn field(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
        out.push(tag << 3 | 2);
        let mut n = bytes.len();
        loop {
            let b = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(b);
                break;
            }
            out.push(b | 0x80);
        }
        out.extend_from_slice(bytes);
    }
    let mut label = Vec::new();
    field(&mut label, 1, b"service_name");
    field(&mut label, 2, marker.as_bytes());
    let mut out = vec![1 << 3, 1];
    field(&mut out, 2, &label);
    field(&mut out, 3, &[0x1f, 0x8b]);
    field(&mut out, 4, marker.as_bytes());
    out
}

/// Spool files that this collector's writer did not make — another user's, or writable by
/// others — are skipped with a warning and never pushed; its own are.
#[test]
fn planted_spool_files_are_never_pushed() {
    let test = "planted_spool_files_are_never_pushed";
    if !can_run(test) {
        return;
    }
    let dir = region_dir("spool-planted");
    let r = hold_sized(&dir, 10, 64);
    let out = region_dir("spool-planted-out");
    let spool = out.join(".spool");
    std::fs::create_dir_all(&spool).unwrap();
    mode(&spool, 0o700);
    let own = spool.join("000000000001.hdpush");
    std::fs::write(&own, record("OWN-MARKER")).unwrap();
    mode(&own, 0o600);
    let open = spool.join("000000000002.hdpush");
    std::fs::write(&open, record("WRITABLE-MARKER")).unwrap();
    mode(&open, 0o666);
    if is_root() {
        let theirs = spool.join("000000000003.hdpush");
        std::fs::write(&theirs, record("NOBODY-MARKER")).unwrap();
        mode(&theirs, 0o600);
        std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).unwrap();
    } else {
        skip_note(&format!(
            "skipped: {test}: (part) a spool file of another user needs root to chown"
        ));
    }
    let (url, rx) = http_server(false);
    let p = r.pid().to_string();
    let t = heapdump_timeout(
        &dir,
        &[
            "watch",
            "--by-pid",
            &p,
            "--every",
            "1s",
            "--count",
            "1",
            "-o",
            out.to_str().unwrap(),
            "--push",
            &url,
        ],
        std::time::Duration::from_secs(60),
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    let bodies: Vec<String> = rx
        .try_iter()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect();
    assert_eq!(bodies.len(), 2, "own spooled + the new one: {}", t.stderr);
    assert!(bodies[0].contains("OWN-MARKER"));
    assert!(!bodies
        .iter()
        .any(|b| b.contains("WRITABLE-MARKER") || b.contains("NOBODY-MARKER")));
    let warned = |f: &str| {
        t.stderr
            .lines()
            .any(|l| l.contains("warning") && l.contains(f) && l.contains("never pushed"))
    };
    assert!(warned("000000000002.hdpush"), "{}", t.stderr);
    assert!(
        !is_root() || warned("000000000003.hdpush") && t.stderr.contains("owned by uid 65534"),
        "{}",
        t.stderr
    );
    // Skipped, not removed.
    let left: Vec<_> = std::fs::read_dir(&spool)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(open.exists() && !own.exists(), "{left:?}: {}", t.stderr);
    drop(r);
}

/// A server that answers one byte a second does not stop `watch` from taking its snapshots:
/// `--every 1s --count 4` writes 4 files, for 4 consecutive beats, none skipped.
#[test]
fn a_slow_push_server_never_delays_a_beat() {
    let test = "a_slow_push_server_never_delays_a_beat";
    if !can_run(test) {
        return;
    }
    let dir = region_dir("slow-push");
    let r = hold_sized(&dir, 10, 64);
    let out = region_dir("slow-push-out");
    let (url, _rx) = http_server(true);
    let p = r.pid().to_string();
    let t = heapdump_timeout(
        &dir,
        &[
            "watch",
            "--by-pid",
            &p,
            "--every",
            "1s",
            "--count",
            "4",
            "-o",
            out.to_str().unwrap(),
            "--push",
            &url,
            "--push-timeout",
            "4s",
        ],
        std::time::Duration::from_secs(120),
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    assert!(
        t.stderr
            .contains("4 beats (0 more skipped), 4 files written"),
        "{}",
        t.stderr
    );
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".pb.gz"))
        .collect();
    names.sort();
    assert_eq!(names.len(), 4, "{names:?}");
    // NAME-PID-YYYYMMDDTHHMMSSZ.pb.gz: consecutive seconds.
    let secs: Vec<u32> = names
        .iter()
        .map(|n| {
            let s = &n[n.len() - 13..n.len() - 7];
            let v: u32 = s.parse().unwrap();
            (v / 10000) * 3600 + (v / 100 % 100) * 60 + v % 100
        })
        .collect();
    for w in secs.windows(2) {
        assert_eq!((w[1] + 86400 - w[0]) % 86400, 1, "{names:?}");
    }
    drop(r);
}

/// Waits until `pid` is a zombie (state `Z` in /proc/PID/stat).
fn wait_zombie(pid: u32) {
    let t0 = std::time::Instant::now();
    loop {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        if s[s.rfind(')').unwrap() + 1..].trim_start().starts_with('Z') {
            return;
        }
        assert!(
            t0.elapsed().as_secs() < 10,
            "pid {pid} never became a zombie"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A zombie is listed as `zombie`, and `leaks` (and reading its contents) on it says so, not
/// that ptrace is not allowed.
#[test]
fn exited_and_zombie_targets_are_named_as_such() {
    let test = "exited_and_zombie_targets_are_named_as_such";
    if !can_run(test) {
        return;
    }
    // Killed but not reaped (the test is its parent and does not wait for it).
    let dir = region_dir("zombie");
    let r = hold_sized(&dir, 10, 64);
    let pid = r.pid();
    // SAFETY: killing the process this test started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    wait_zombie(pid);
    let (ok, stdout, _) = heapdump_cmd(&dir, &["list", "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v[0]["pid"], pid);
    assert_eq!(v[0]["status"], "zombie", "{stdout}");
    let (_, stdout, _) = heapdump_cmd(&dir, &["list"]);
    assert!(
        stdout.lines().any(|l| l
            .split_whitespace()
            .take(2)
            .eq([pid.to_string().as_str(), "zombie"])),
        "{stdout}"
    );
    let p = pid.to_string();
    for args in [
        vec!["leaks", "--by-pid", &p],
        vec![
            "snapshot",
            "--by-pid",
            &p,
            "--with-strings",
            "-o",
            "/dev/null",
        ],
    ] {
        let (ok, _, err) = heapdump_cmd(&dir, &args);
        assert!(!ok);
        assert!(
            err.contains("zombie (exited, not reaped)") && !err.contains("ptrace"),
            "{args:?}: {err}"
        );
    }
    // The post-mortem profile is still there.
    let (ok, _, err) = heapdump_cmd(&dir, &["snapshot", "--by-pid", &p, "-o", "/dev/null"]);
    assert!(ok, "{err}");
    drop(r);
}

/// A target that exits between the snapshot and the reading of its memory (the test pause),
/// and stays a zombie: `leaks` and `--with-strings` say it exited during the read, not that
/// ptrace is not allowed.
#[test]
fn a_target_exiting_during_the_read_is_named_as_such() {
    let test = "a_target_exiting_during_the_read_is_named_as_such";
    if !can_run(test) {
        return;
    }
    for args in [
        vec!["snapshot", "--with-strings", "-o", "/dev/null"],
        vec!["leaks"],
    ] {
        let dir = region_dir("exits");
        let r = hold_sized(&dir, 10, 64);
        let pid = r.pid();
        let pause = dir.with_extension("pause");
        let mut cmd = Command::new(heapdump());
        cmd.args(&args)
            .args(["--by-pid", &pid.to_string()])
            .env("HEAPDUMP_DIR", &dir)
            .env("HEAPDUMP_TEST_CONTENTS_PAUSE", &pause)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let child = cmd.spawn().unwrap();
        let t0 = std::time::Instant::now();
        while !pause.exists() {
            assert!(t0.elapsed().as_secs() < 30, "{args:?}: never paused");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // SAFETY: killing the process this test started.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        wait_zombie(pid);
        std::fs::remove_file(&pause).unwrap();
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}: {err}");
        assert!(
            err.contains(&format!("pid {pid} exited during the read")) && !err.contains("ptrace"),
            "{args:?}: {err}"
        );
        drop(r);
    }
}

/// A region whose file name names one running process and whose header names another (the
/// same program, so the executable matches) is foreign: no command reads either process
/// through it.
#[test]
fn a_region_whose_name_and_header_disagree_is_refused() {
    let test = "a_region_whose_name_and_header_disagree_is_refused";
    if !can_run(test) {
        return;
    }
    let da = region_dir("disagree-a");
    let db = region_dir("disagree-b");
    // One executable for both (each `hold_sized` call builds a new file).
    let exe = compile_c("hold_sized", &[]);
    let run = |dir: &Path, n: &str| {
        let mut cmd = Command::new(&exe);
        cmd.args([n, "64"]);
        start(cmd, dir, true)
    };
    let a = run(&da, "10");
    let b = run(&db, "20");
    let ra = region_file(&da);
    let rb = region_file(&db);
    // A's region under B's name, in a directory of its own.
    let dir = region_dir("disagree");
    std::fs::create_dir(&dir).unwrap();
    mode(&dir, 0o700);
    let forged = dir.join(rb.file_name().unwrap());
    std::fs::copy(&ra, &forged).unwrap();
    mode(&forged, 0o600);
    let p = b.pid().to_string();
    for args in [
        vec![
            "snapshot",
            "--by-pid",
            &p,
            "-o",
            "/dev/null",
            "--with-strings",
        ],
        vec!["leaks", "--by-pid", &p],
    ] {
        let (ok, _, err) = heapdump_cmd(&dir, &args);
        assert!(!ok, "{args:?}: {err}");
        assert!(
            err.trim().lines().count() == 1
                && err.contains("foreign region")
                && err.contains(&format!("its name says pid {}", b.pid()))
                && err.contains(&format!("its header pid {}", a.pid())),
            "{args:?}: {err}"
        );
    }
    let (ok, stdout, _) = heapdump_cmd(&dir, &["list", "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v[0]["status"], "foreign", "{stdout}");
    drop((a, b));
}

/// Moves `exe`'s DWARF into `EXE.debug` beside it, which `exe` then names in its
/// `.gnu_debuglink` (`objcopy --only-keep-debug`, then `--strip-debug --add-gnu-debuglink`).
/// Returns the debug file's path.
fn move_dwarf_to_debug_link(exe: &Path) -> std::path::PathBuf {
    let debug = exe.with_extension("debug");
    let objcopy = |args: &[&std::ffi::OsStr]| {
        let st = Command::new("objcopy").args(args).status();
        assert!(st.is_ok_and(|s| s.success()), "objcopy {args:?}");
    };
    objcopy(&[
        "--only-keep-debug".as_ref(),
        exe.as_os_str(),
        debug.as_os_str(),
    ]);
    let link = format!("--add-gnu-debuglink={}", debug.display());
    objcopy(&["--strip-debug".as_ref(), link.as_ref(), exe.as_os_str()]);
    debug
}

/// The profiled program's binary names its debug file (`.gnu_debuglink`) and lies in a
/// directory it controls: a FIFO there under that name made `snapshot` (root's, a watch
/// daemon's) block for ever in blazesym's open. Now the link is followed only when every file
/// it may lead to is absent or regular; the functions are named from the symbol table.
#[test]
fn a_debug_link_to_a_fifo_does_not_hang_the_snapshot() {
    if !can_run("a_debug_link_to_a_fifo_does_not_hang_the_snapshot") {
        return;
    }
    let dir = region_dir("debuglink-fifo");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("known_allocs");
    std::fs::copy(compile_c("known_allocs", &[]), &exe).unwrap();
    let debug = move_dwarf_to_debug_link(&exe);
    std::fs::remove_file(&debug).unwrap();
    mkfifo(&debug, 0o600);
    let r = start(Command::new(&exe), &dir, true);
    let out = dir.join("s.pb.gz");
    let done = Command::new("timeout")
        .args(["60", heapdump().to_str().unwrap(), "snapshot", "--by-pid"])
        .arg(r.pid().to_string())
        .arg("-o")
        .arg(&out)
        .env("HEAPDUMP_DIR", &dir)
        .output()
        .unwrap();
    assert!(
        done.status.success(),
        "snapshot: {:?} {}",
        done.status,
        String::from_utf8_lossy(&done.stderr)
    );
    let p = decode(&out);
    // known_allocs: 1000 × 1 KiB from alloc_small, named from the symbol table.
    assert_eq!(sum_through(&p, "alloc_small")[3], 1000 * 1024);
    drop(r);
}

/// Helper E, F1: a FIFO another user planted at `-o`'s path (`mkfifo /tmp/heap.pb.gz` before
/// root's snapshot) is refused: nothing is written into it (before: root's profile, block
/// contents included, went to the planted FIFO's reader; with no reader the command hung in
/// `open`). The user's own FIFO is still written to, and one nobody reads fails at once.
#[test]
fn a_fifo_planted_at_the_output_path_is_refused() {
    if !is_root() {
        skip_note("skipped: a_fifo_planted_at_the_output_path_is_refused needs root (chown)");
        return;
    }
    let dir = region_dir("planted-fifo");
    std::fs::create_dir_all(&dir).unwrap();
    let r = hold_sized(&dir, 4, 1000);
    let pid = r.pid().to_string();
    let mkfifo = |p: &Path| mkfifo(p, 0o666);
    // Planted by `nobody`, with a reader that would receive whatever is written.
    let planted = dir.join("planted.pb.gz");
    mkfifo(&planted);
    std::os::unix::fs::chown(&planted, Some(NOBODY), Some(NOBODY)).unwrap();
    let reader = {
        let p = planted.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&p)
                .unwrap();
            let mut got = Vec::new();
            let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while std::time::Instant::now() < end {
                let mut b = [0u8; 4096];
                match f.read(&mut b) {
                    Ok(n) if n > 0 => got.extend_from_slice(&b[..n]),
                    _ => std::thread::sleep(std::time::Duration::from_millis(20)),
                }
            }
            got
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    let t = heapdump_timeout(
        &dir,
        &[
            "snapshot",
            "--by-pid",
            &pid,
            "-o",
            planted.to_str().unwrap(),
        ],
        std::time::Duration::from_secs(30),
    );
    assert!(t.code == Some(1) && !t.timed_out, "{t:?}");
    assert!(
        t.stderr
            .contains("is a FIFO owned by uid 65534, not by you or root"),
        "{t:?}"
    );
    assert_eq!(
        reader.join().unwrap(),
        Vec::<u8>::new(),
        "written into the FIFO"
    );
    // The user's own FIFO, nobody reading it: an error at once, not a hang.
    let own = dir.join("own.pb.gz");
    mkfifo(&own);
    let t = heapdump_timeout(
        &dir,
        &["snapshot", "--by-pid", &pid, "-o", own.to_str().unwrap()],
        std::time::Duration::from_secs(30),
    );
    assert!(t.code == Some(1) && !t.timed_out, "{t:?}");
    assert!(t.stderr.contains("a FIFO that nobody reads"), "{t:?}");
    // ... and read: the profile arrives.
    let p = own.clone();
    let reader = std::thread::spawn(move || std::fs::read(&p).unwrap());
    // The reader waits in its open: a writer's open then finds it.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let t = heapdump_timeout(
        &dir,
        &["snapshot", "--by-pid", &pid, "-o", own.to_str().unwrap()],
        std::time::Duration::from_secs(30),
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    let got = reader.join().unwrap();
    assert_eq!(&got[..2], &[0x1f, 0x8b], "a gzip stream");
    assert_eq!(r.finish(), 0);
}

/// Helper E, F5: `gc` removes files through the region directory it listed, not by path: its
/// owner renaming the directory away and putting a link to another directory in its place
/// (between the listing and the removals) makes gc remove nothing outside it (before: root's
/// gc removed the same-named file in the directory the link led to).
/// Files heapdump reads as input (`convert`'s, `report`'s, a capture given to `leaks` or
/// `top`) are opened without blocking and checked on the descriptor: a FIFO there — planted,
/// or swapped in by another user after `report` listed a shared directory (helper H, 2) — is
/// refused at once, where a blocking open waited for a writer for ever.
#[test]
fn a_fifo_given_as_input_is_refused_not_waited_on() {
    let dir = region_dir("input-fifo");
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("in.pb.gz");
    mkfifo(&fifo, 0o600);
    let f = fifo.to_str().unwrap();
    let out = dir.join("out");
    let o = out.to_str().unwrap();
    for (args, says) in [
        (vec!["convert", f, "-o", o], true),
        (vec!["report", f, "-o", o], true),
        (vec!["leaks", f], false),
        (vec!["top", f], false),
    ] {
        let t = heapdump_timeout(&dir, &args, std::time::Duration::from_secs(20));
        assert!(
            !t.timed_out && t.code.is_some_and(|c| c != 0),
            "{args:?}: {t:?}"
        );
        if says {
            assert!(
                t.stderr.contains("a FIFO, not a regular file"),
                "{args:?}: {t:?}"
            );
        }
    }
    assert!(!out.exists(), "an output was written");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gc_removes_nothing_through_a_directory_swapped_for_a_link() {
    let base = region_dir("gc-swap");
    let hd = base.join("hd");
    let away = base.join("hd-away");
    let victim = base.join("victim");
    for d in [&hd, &victim] {
        std::fs::create_dir_all(d).unwrap();
        mode(d, 0o700);
    }
    let name = "4242-777-999999.heapdump";
    std::fs::write(hd.join(name), b"not a region").unwrap();
    std::fs::write(victim.join(name), b"someone's file").unwrap();
    let pause = Handshake::new("HEAPDUMP_TEST_GC_PAUSE", &base);
    let mut gc = Command::new(heapdump());
    let (var, file) = pause.env();
    gc.arg("gc")
        .env("HEAPDUMP_DIR", &hd)
        .env(var, file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = gc.spawn().unwrap();
    pause.reached();
    std::fs::rename(&hd, &away).unwrap();
    std::os::unix::fs::symlink(&victim, &hd).unwrap();
    pause.release();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        victim.join(name).exists(),
        "removed through the link: {err}"
    );
    assert!(!away.join(name).exists(), "the listed file stays: {err}");
}

/// Helper H, 3: with HEAPDUMP_DIR a shared directory (mode 1777, not root's), root's
/// collector uses `DIR/heapdump-0`; another user who created that first decided what root's
/// `list` showed and `gc` removed there (root's shim refuses it: root's programs record
/// nothing). Root now refuses it as it refuses a squatted default directory.
#[test]
fn root_refuses_a_heapdump_0_another_user_made_in_a_shared_dir() {
    if !is_root() {
        skip_note("skipped: root_refuses_a_heapdump_0_another_user_made_in_a_shared_dir needs root (chown)");
        return;
    }
    let shared = region_dir("shared-squat");
    std::fs::create_dir_all(&shared).unwrap();
    mode(&shared, 0o1777);
    let squat = shared.join("heapdump-0");
    std::fs::create_dir_all(&squat).unwrap();
    mode(&squat, 0o700);
    std::fs::write(squat.join("4242-777-999999.heapdump"), b"planted").unwrap();
    std::os::unix::fs::chown(&squat, Some(NOBODY), Some(NOBODY)).unwrap();
    for args in [vec!["list"], vec!["gc"]] {
        let t = heapdump_timeout(&shared, &args, std::time::Duration::from_secs(30));
        assert_eq!(t.code, Some(1), "{args:?}: {t:?}");
        assert!(
            t.stderr.contains("is owned by uid 65534, not by root"),
            "{args:?}: {t:?}"
        );
    }
    assert!(squat.join("4242-777-999999.heapdump").exists());
    std::fs::remove_dir_all(&shared).unwrap();
}

/// Helper E, F4: a module file in a directory another user owns, swapped for a FIFO after the
/// symbolizer checked it (a `renameat2` exchange by the directory's owner), hung root's
/// snapshot in blazesym's blocking open. Now such a file is opened once, without blocking,
/// and read through that descriptor: the swap changes nothing, and the functions are named.
#[test]
fn a_module_swapped_for_a_fifo_after_its_check_does_not_hang_the_snapshot() {
    if !is_root() {
        skip_note("skipped: a_module_swapped_for_a_fifo_after_its_check_does_not_hang_the_snapshot needs root (chown)");
        return;
    }
    let dir = region_dir("module-swap");
    let app = dir.join("app");
    std::fs::create_dir_all(&app).unwrap();
    let exe = app.join("known_allocs");
    std::fs::copy(compile_c("known_allocs", &[]), &exe).unwrap();
    // Its DWARF moved to a debug file it links to: the link is not followed for a file
    // others can change, and the functions are named from its symbol table, read through
    // the descriptor too.
    move_dwarf_to_debug_link(&exe);
    std::os::unix::fs::chown(&app, Some(NOBODY), Some(NOBODY)).unwrap();
    std::os::unix::fs::chown(&exe, Some(NOBODY), Some(NOBODY)).unwrap();
    let r = start(Command::new(&exe), &dir, true);
    let pause = Handshake::new("HEAPDUMP_TEST_SYMBOLIZE_PAUSE", &dir);
    let out = dir.join("s.pb.gz");
    let (var, file) = pause.env();
    let child = Command::new("timeout")
        .args(["60", heapdump().to_str().unwrap(), "snapshot", "--by-pid"])
        .arg(r.pid().to_string())
        .arg("-o")
        .arg(&out)
        .env("HEAPDUMP_DIR", &dir)
        .env(var, file)
        .env("HEAPDUMP_TEST_SYMBOLIZE_MODULE", &exe)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    pause.reached();
    std::fs::rename(&exe, app.join("moved")).unwrap();
    mkfifo(&exe, 0o666);
    pause.release();
    let done = child.wait_with_output().unwrap();
    assert!(
        done.status.success(),
        "snapshot: {:?} {}",
        done.status,
        String::from_utf8_lossy(&done.stderr)
    );
    let p = decode(&out);
    // known_allocs: 1000 × 1 KiB from alloc_small.
    assert_eq!(sum_through(&p, "alloc_small")[3], 1000 * 1024);
    drop(r);
}

/// Helper Q, 3: a process that is not dumpable (`prctl(PR_SET_DUMPABLE, 0)`, or a daemon that
/// dropped its privileges) keeps its memory from its own user; a region of that user's must
/// not make root read it. Run as `nobody` under the shim: root's `snapshot --with-strings` of
/// the region reads the dumpable one (its secret string lands in the profile) and refuses the
/// other in one line (before: the secret was read into root's profile).
#[test]
fn a_process_that_is_not_dumpable_is_not_read_through_its_owners_region() {
    let test = "a_process_that_is_not_dumpable_is_not_read_through_its_owners_region";
    if !can_run(test) {
        return;
    }
    let setpriv = Command::new("setpriv").arg("--version").output();
    if !is_root() || !setpriv.is_ok_and(|o| o.status.success()) {
        skip_note(&format!(
            "skipped: {test}: needs root and setpriv (to run a process as nobody)"
        ));
        return;
    }
    let exe = compile_c("undumpable", &[]);
    for dumpable in [true, false] {
        let dir = region_dir(&format!("undumpable-{dumpable}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
        mode(&dir, 0o700);
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&exe);
        if dumpable {
            cmd.arg("dumpable");
        }
        let r = start(cmd, &dir, true);
        let pid = r.pid();
        let region = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                let n = p.file_name().unwrap().to_string_lossy().into_owned();
                n.starts_with(&format!("{pid}-")) && n.ends_with(".heapdump")
            })
            .expect("the region of the process run as nobody");
        let out = std::env::temp_dir().join(format!(
            "undumpable-{}-{dumpable}.pb.gz",
            std::process::id()
        ));
        let t = heapdump_timeout(
            &dir,
            &[
                "snapshot",
                "--region",
                region.to_str().unwrap(),
                "--with-strings",
                "-o",
                out.to_str().unwrap(),
            ],
            std::time::Duration::from_secs(60),
        );
        if dumpable {
            assert_eq!(t.code, Some(0), "{t:?}");
            let bytes = std::fs::read(&out).unwrap();
            let mut text = Vec::new();
            use std::io::Read;
            flate2::read::GzDecoder::new(&bytes[..])
                .read_to_end(&mut text)
                .unwrap();
            assert!(
                text.windows(22).any(|w| w == b"UNDUMPABLE-SECRET-7c1e"),
                "the dumpable process's strings are read"
            );
        } else {
            assert_eq!(t.code, Some(1), "{t:?}");
            assert!(
                t.stderr.contains(&format!("pid {pid} is not dumpable"))
                    && t.stderr.lines().count() == 1,
                "{t:?}"
            );
            assert!(!out.exists(), "nothing written");
        }
        let _ = std::fs::remove_file(&out);
        assert_eq!(r.finish(), 0);
    }
}

/// Helper Q, 4: the module paths of a region are its owner's to choose; root collecting a
/// user's region must not show the names of an ELF file that user cannot read. A program run
/// as nobody loads a plugin from a directory of nobody's (`dlopener`: 100 blocks of 3,000
/// bytes from `plugin_alloc`, the plugin closed again); root's snapshot names the function.
/// Then the plugin's path is given a copy only root may read (mode 600), as an owner could
/// point a module's path at any file: root's next snapshot counts the same blocks but names
/// no function of it (before: `plugin_alloc`, read with root's rights).
#[test]
fn module_files_are_read_with_the_region_owners_rights() {
    let test = "module_files_are_read_with_the_region_owners_rights";
    if !can_run(test) {
        return;
    }
    let setpriv = Command::new("setpriv").arg("--version").output();
    if !is_root() || !setpriv.is_ok_and(|o| o.status.success()) {
        skip_note(&format!(
            "skipped: {test}: needs root and setpriv (to run a process as nobody)"
        ));
        return;
    }
    let exe = compile_c("dlopener", &[]);
    let built = compile_lib("plugin.c", "libplugin-rights.so", &[]);
    let dir = region_dir("module-rights");
    let libdir = dir.with_extension("lib");
    for (d, m) in [(&dir, 0o700), (&libdir, 0o755)] {
        std::fs::create_dir_all(d).unwrap();
        std::os::unix::fs::chown(d, Some(NOBODY), Some(NOBODY)).unwrap();
        mode(d, m);
    }
    let lib = libdir.join("libplugin.so");
    std::fs::copy(&built, &lib).unwrap();
    mode(&lib, 0o644);
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&exe)
        .arg(&lib);
    let r = start(cmd, &dir, true);
    let region = region_file(&dir);
    let snap = |name: &str| {
        let out = dir.with_extension(format!("{name}.pb.gz"));
        let t = heapdump_timeout(
            &dir,
            &[
                "snapshot",
                "--region",
                region.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
            ],
            std::time::Duration::from_secs(60),
        );
        assert_eq!(t.code, Some(0), "{t:?}");
        decode(&out)
    };
    let p = snap("readable");
    assert_eq!(
        sum_through(&p, "plugin_alloc")[2..],
        [100, 300_000],
        "the plugin nobody may read is symbolized"
    );
    // The same file, now root's only: nobody could no longer open it.
    std::fs::remove_file(&lib).unwrap();
    std::fs::copy(&built, &lib).unwrap();
    mode(&lib, 0o600);
    let p = snap("root-only");
    let names: Vec<&String> = (p.function.iter())
        .map(|f| &p.string_table[f.name as usize])
        .collect();
    assert!(
        !names.iter().any(|n| n.contains("plugin_")),
        "a file the region's owner cannot read is not symbolized: {names:?}"
    );
    let in_blocks_of_3000: i64 = (p.sample.iter())
        .filter(|s| s.value[2] > 0 && s.value[3] == s.value[2] * 3000)
        .map(|s| s.value[2])
        .sum();
    assert_eq!(in_blocks_of_3000, 100, "the blocks are still counted");
    assert_eq!(r.finish(), 0);
    let _ = std::fs::remove_dir_all(&libdir);
}
