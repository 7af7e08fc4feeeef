//! The security model (README, "Security model"): regions another user planted, output
//! directories reached through links, spool files planted in `-o DIR`, slow push servers, and
//! messages about targets that exit or are zombies.

mod common;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The uid and gid a planted region belongs to: `nobody`.
const NOBODY: u32 = 65534;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
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
        println!("skipped: {test}: needs root (to give a region to another user with chown)");
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
        assert!(
            lines[0].contains("foreign region")
                && lines[0].contains("owned by uid 65534")
                && lines[0].contains(&format!("pid {pid} runs as uid 0")),
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
    let skipped: Vec<&str> = (t.stderr.lines())
        .filter(|l| l.contains("skipped") && l.contains("foreign region"))
        .collect();
    assert_eq!(skipped.len(), 1, "{}", t.stderr);
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
    assert!(t.stderr.contains("foreign region"), "{t:?}");
    // Nothing was written: no profile, no block contents.
    let mut written: Vec<String> = walk(&out);
    written.retain(|f| !f.ends_with("/w") && !f.ends_with("/wm"));
    assert!(written.is_empty(), "written: {written:?}");
    // `list` says so.
    let (ok, stdout, _) = heapdump_cmd(&shared, &["list", "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let e = (v.as_array().unwrap().iter())
        .find(|e| e["pid"] == pid)
        .expect("listed");
    assert_eq!(e["status"], "foreign", "{e}");
    assert!(e["foreign"].as_str().unwrap().contains("uid 65534"), "{e}");
    let (ok, stdout, _) = heapdump_cmd(&shared, &["list"]);
    assert!(ok);
    let line = (stdout.lines())
        .find(|l| l.split_whitespace().next() == Some(p.as_str()))
        .unwrap();
    assert_eq!(line.split_whitespace().nth(1), Some("foreign"), "{stdout}");
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
