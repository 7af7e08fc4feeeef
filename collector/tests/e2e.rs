//! End to end: real programs run under the shim (or the Rust allocator), snapshotted by pid,
//! read back with `go tool pprof -raw`, compared with what the programs allocated.

mod common;

use common::*;
use std::collections::HashSet;
use std::path::Path;
use std::process::Command;

const KIB: i64 = 1024;
const MIB: i64 = 1024 * 1024;

#[test]
fn c_program_exact_per_function_and_total() {
    let exe = compile_c("known_allocs", &[]);
    let dir = region_dir("c");
    let r = start(Command::new(&exe), &dir, true);
    let raw = pprof_raw(&snapshot(&dir, r.pid(), &[]));
    // [alloc_objects, alloc_space, inuse_objects, inuse_space]
    assert_eq!(
        raw.sum_with("alloc_small"),
        [1000, 1000 * KIB, 1000, 1000 * KIB]
    );
    assert_eq!(
        raw.sum_with("alloc_medium"),
        [100, 100 * 64 * KIB, 100, 100 * 64 * KIB]
    );
    // alloc_large: 10 mallocs of 512 KiB, each realloc'd to 1 MiB.
    assert_eq!(
        raw.sum_with("alloc_large"),
        [20, 10 * 512 * KIB + 10 * MIB, 10, 10 * MIB]
    );
    let t = raw.total();
    assert_eq!(
        (t[2], t[3]),
        (1110, 1000 * KIB + 6400 * KIB + 10 * MIB),
        "inuse totals"
    );
    // The shim's own frames never appear.
    for ls in raw.locations.values() {
        for l in ls {
            assert!(
                !l.starts_with("malloc ")
                    && !l.starts_with("calloc ")
                    && !l.contains("heapdump_instrumentation"),
                "shim frame {l}"
            );
        }
    }
    assert!(raw
        .comments
        .iter()
        .any(|c| c.contains(&format!("pid {}", r.pid()))));
    assert_eq!(r.finish(), 0);
    // A clean exit removes the region.
    let left: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "region left after clean exit: {left:?}");
}

#[test]
fn rust_global_allocator_exact() {
    let exe = target_dir().join("rust-alloc-example");
    assert!(
        exe.exists(),
        "{} missing: run cargo build --release first",
        exe.display()
    );
    let dir = region_dir("rust");
    let r = start(Command::new(&exe), &dir, false);
    let (blocks, bytes) = r.tally();
    let raw = pprof_raw(&snapshot(&dir, r.pid(), &[]));
    let f = |n: &str| raw.sum_with(&format!("rust_alloc_example::{n}"));
    assert_eq!(f("alloc_small")[2..], [1000, 1000 * KIB]);
    assert_eq!(f("alloc_medium")[2..], [100, 6400 * KIB]);
    assert_eq!(f("alloc_large")[2..], [10, 10 * MIB]);
    assert_eq!(f("churn")[2..], [0, 0]);
    // The program's own tally of every live block (runtime included) equals the snapshot.
    let t = raw.total();
    assert_eq!((t[2], t[3]), (blocks, bytes));
    // take_named_snapshot("before-large") ran between alloc_medium and alloc_large.
    let out = dir.with_extension("named.pb.gz");
    let pid = r.pid().to_string();
    let (ok, _, se) = heapdump_cmd(
        &dir,
        &[
            "snapshot",
            "--by-pid",
            &pid,
            "--named",
            "before-large",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert!(ok, "{se}");
    let named = pprof_raw(&out);
    let g = |n: &str| named.sum_with(&format!("rust_alloc_example::{n}"));
    assert_eq!(g("alloc_small")[2..], [1000, 1000 * KIB]);
    assert_eq!(g("alloc_medium")[2..], [100, 6400 * KIB]);
    assert_eq!(g("alloc_large")[2..], [0, 0]);
    let (ok, _, se) = heapdump_cmd(
        &dir,
        &[
            "snapshot",
            "--by-pid",
            &pid,
            "--since",
            "before-large",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert!(ok, "{se}");
    let since = pprof_raw(&out);
    let h = |n: &str| since.sum_with(&format!("rust_alloc_example::{n}"));
    assert_eq!(h("alloc_small")[2..], [0, 0]);
    assert_eq!(h("alloc_large")[2..], [10, 10 * MIB]);
    // Allocation sites are the program's functions, not the standard library's or the
    // shim's frames inlined into them (helper T, 2: with the workspace's line-tables-only
    // debug information the sites were `alloc`, `grow_impl_runtime` and
    // `alloc_zeroed<rust_alloc_example::Counting>`, heapdump's own allocator).
    let (ok, top, se) = heapdump_cmd(&dir, &["top", "--retained", "--by-pid", &pid]);
    assert!(ok, "{se}");
    let rows: Vec<Vec<&str>> = (top.lines())
        .take_while(|l| !l.trim().is_empty())
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    for (bytes, blocks, site) in [
        (10 * MIB, 10, "alloc_large"),
        (6400 * KIB, 100, "alloc_medium"),
        (1000 * KIB, 1000, "alloc_small"),
    ] {
        let want = [
            bytes.to_string(),
            blocks.to_string(),
            format!("rust_alloc_example::{site}"),
        ];
        assert!(rows.iter().any(|r| r[..] == want[..]), "{want:?} in\n{top}");
    }
    assert_eq!(r.finish(), 0);
}

#[test]
fn threads_exact_after_join() {
    let exe = compile_c("threads", &[]);
    let dir = region_dir("threads");
    let r = start(Command::new(&exe), &dir, true);
    let (blocks, bytes) = r.tally();
    let raw = pprof_raw(&snapshot(&dir, r.pid(), &[]));
    let w = raw.sum_with("worker");
    assert_eq!(
        (w[2], w[3]),
        (blocks, bytes),
        "live blocks left by the workers"
    );
    // Every allocation of the workers is counted: 4 × (20000 churn + 250 kept).
    assert_eq!(w[0], 4 * (20000 + 250));
    assert_eq!(r.finish(), 0);
}

#[test]
fn python_bytearray_under_cpython_functions() {
    let dir = region_dir("python");
    let mut cmd = Command::new("python3");
    cmd.args([
        "-c",
        "import os,sys\nb = bytearray(100*1024*1024)\nprint('ready', os.getpid(), flush=True)\nsys.stdin.read()\n",
    ]);
    let r = start(cmd, &dir, true);
    let raw = pprof_raw(&snapshot(&dir, r.pid(), &[]));
    // The 100 MiB block, attributed to symbolized CPython code.
    let big: Vec<&Sample> = raw
        .samples
        .iter()
        .filter(|s| s.values[3] >= 100 * MIB)
        .collect();
    assert_eq!(big.len(), 1, "one sample holds the bytearray");
    let leaf = &raw.locations[&big[0].locations[0]];
    assert!(
        leaf.iter()
            .any(|l| l.starts_with("Py") || l.starts_with("_Py") || l.contains("bytearray")),
        "leaf frame is not a CPython function: {leaf:?}"
    );
    // CPython has no frame pointers: the CFI unwinder gets the whole stack.
    let lines: Vec<&String> = big[0]
        .locations
        .iter()
        .flat_map(|l| &raw.locations[l])
        .collect();
    for f in [
        "PyByteArray_Resize",
        "_PyEval_EvalFrameDefault",
        "Py_BytesMain",
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(f)),
            "{f} missing from {lines:#?}"
        );
    }
    assert!(raw.total()[3] >= 100 * MIB);
    assert_eq!(r.finish(), 0);
}

#[test]
fn with_tags_one_sample_per_block() {
    let exe = compile_c("known_allocs", &[]);
    let dir = region_dir("tags");
    let r = start(Command::new(&exe), &dir, true);
    let raw = pprof_raw(&snapshot(&dir, r.pid(), &["--with-tags"]));
    let per_block: Vec<&Sample> = raw.samples.iter().filter(|s| s.values[2] == 1).collect();
    assert_eq!(per_block.len(), 1110);
    let mut seen = HashSet::new();
    for s in &per_block {
        let addr = &s.labels["address"];
        assert!(seen.insert(addr.clone()), "address {addr:?} twice");
        assert!(s.labels.contains_key("timestamp") && s.labels.contains_key("thread"));
        assert_eq!(s.labels["bytes"][0].parse::<i64>().unwrap(), s.values[3]);
    }
    assert_eq!(r.finish(), 0);
}

/// `heapdump run` of a program the loader will not preload the shim into says so on stderr
/// and still runs it: a statically linked one (and a static-pie), and as root one set-user-ID
/// to another user. A dynamically linked one, through PATH, gets no warning.
#[test]
fn run_warns_when_the_shim_cannot_be_preloaded() {
    let dir = region_dir("run-warn");
    let run = |exe: &Path| {
        let out = Command::new(heapdump())
            .arg("run")
            .arg("--")
            .arg(exe)
            .env("HEAPDUMP_DIR", &dir)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for flag in ["-static", "-static-pie"] {
        let exe = compile_c("nothing", &[flag]);
        let (code, err) = run(&exe);
        assert_eq!(code, Some(0), "{flag}: {err}");
        assert_eq!(
            err.trim_end(),
            format!(
                "heapdump: warning: {} is statically linked: no dynamic loader runs for it to \
                 load the shim (LD_PRELOAD), so nothing will be recorded (link it dynamically; \
                 a Rust program can use HeapdumpAlloc instead: README, \"Rust programs: \
                 linking the allocator\")",
                exe.display()
            ),
            "{flag}"
        );
    }
    let dynamic = compile_c("nothing", &[]);
    let (code, err) = run(&dynamic);
    assert_eq!((code, err.as_str()), (Some(0), ""));
    // Looked up in PATH like the spawn: `true` is dynamically linked on Debian.
    let (code, err) = run(Path::new("true"));
    assert_eq!((code, err.as_str()), (Some(0), ""));
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip_note("skipped: run_warns_when_the_shim_cannot_be_preloaded (set-user-ID): not root");
        return;
    }
    let suid = dir.with_extension("suid-nothing");
    std::fs::copy(&dynamic, &suid).unwrap();
    let path = std::ffi::CString::new(suid.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; 65534 is `nobody`.
    let owned = unsafe { libc::chown(path.as_ptr(), 65534, 65534) };
    assert_eq!(owned, 0);
    std::fs::set_permissions(&suid, std::os::unix::fs::PermissionsExt::from_mode(0o4755)).unwrap();
    let (code, err) = run(&suid);
    let _ = std::fs::remove_file(&suid);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        err.trim_end(),
        format!(
            "heapdump: warning: {} is set-user-ID: the loader ignores LD_PRELOAD for it, so \
             nothing will be recorded",
            suid.display()
        )
    );
    file_capabilities_warned_for_other_users(&dynamic);
}

/// A copy of `dynamic` with a file capability (`setcap cap_net_raw+p`): `heapdump run` by
/// `nobody` warns, and the warning is true (with `HEAPDUMP_KEEP=1` the shim would leave a
/// region behind: there is none); run by root it neither warns nor goes unrecorded (its
/// region is there). Needs root (`setcap`, `setpriv`).
fn file_capabilities_warned_for_other_users(dynamic: &Path) {
    let base = region_dir("run-caps");
    std::fs::create_dir_all(&base).unwrap();
    let mode = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(m)).unwrap()
    };
    mode(&base, 0o755);
    let exe = base.join("caps-nothing");
    std::fs::copy(dynamic, &exe).unwrap();
    mode(&exe, 0o755);
    match Command::new("setcap")
        .arg("cap_net_raw+p")
        .arg(&exe)
        .output()
    {
        Ok(o) if o.status.success() => {}
        other => {
            skip_note(&format!(
                "skipped: run_warns_when_the_shim_cannot_be_preloaded (file capabilities): \
                 setcap failed: {other:?}"
            ));
            return;
        }
    }
    // Region directories of their own, owned by the user who runs (the shim refuses others).
    let (theirs, ours) = (base.join("nobody"), base.join("root"));
    for d in [&theirs, &ours] {
        std::fs::create_dir(d).unwrap();
        mode(d, 0o700);
    }
    let path = std::ffi::CString::new(theirs.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; 65534 is `nobody`.
    assert_eq!(unsafe { libc::chown(path.as_ptr(), 65534, 65534) }, 0);
    let regions = |d: &Path| std::fs::read_dir(d).unwrap().count();
    // `heapdump run -- EXE` keeping its region in `dir`, as `nobody` (through setpriv) or as
    // root: (exit code, stderr).
    let run = |as_nobody: bool, dir: &Path| {
        let mut cmd = if as_nobody {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(heapdump());
            c
        } else {
            Command::new(heapdump())
        };
        let out = cmd
            .arg("run")
            .arg("--")
            .arg(&exe)
            .env("HEAPDUMP_DIR", dir)
            .env("HEAPDUMP_KEEP", "1")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(true, &theirs);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        err.trim_end(),
        format!(
            "heapdump: warning: {} has file capabilities (setcap): the loader ignores \
             LD_PRELOAD for it when run by a user other than root, so nothing will be recorded",
            exe.display()
        )
    );
    assert_eq!(
        regions(&theirs),
        0,
        "a region: the shim was loaded after all"
    );
    let (code, err) = run(false, &ours);
    assert_eq!((code, err.as_str()), (Some(0), ""));
    assert_eq!(regions(&ours), 1, "root's run of the file left no region");
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn list_shows_process_and_run_passes_status() {
    let exe = compile_c("known_allocs", &[]);
    let dir = region_dir("list");
    let mut cmd = Command::new(heapdump());
    cmd.arg("run").arg("--").arg(&exe);
    let r = start(cmd, &dir, false);
    let (ok, out, err) = heapdump_cmd(&dir, &["list", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let me = v
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["pid"] == r.pid())
        .expect("listed");
    assert_eq!(me["status"], "alive");
    assert_eq!(me["live_blocks"], 1110);
    assert_eq!(me["layout_version"], 1);
    assert_eq!(me["command"], "known_allocs");
    let (ok, out, _) = heapdump_cmd(&dir, &["list"]);
    assert!(ok && out.contains(&r.pid().to_string()) && out.contains("alive"));
    assert_eq!(r.finish(), 0);
    // `heapdump run` exits with the command's status.
    let st = Command::new(heapdump())
        .args(["run", "--", "sh", "-c", "exit 7"])
        .env("HEAPDUMP_DIR", &dir)
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(7));
}

#[test]
fn errors_are_one_line_and_nonzero() {
    let dir = region_dir("errors");
    std::fs::create_dir_all(&dir).unwrap();
    let check = |args: &[&str], needle: &str| {
        let (ok, _, err) = heapdump_cmd(&dir, args);
        assert!(!ok, "{args:?} succeeded");
        assert!(err.contains(needle), "{args:?}: {err:?} lacks {needle:?}");
        assert!(!err.contains("panicked"), "{err}");
    };
    check(
        &["snapshot", "--by-pid", "999999999", "-o", "/dev/null"],
        "no such process",
    );
    // This test process is alive and not instrumented.
    let me = std::process::id().to_string();
    check(
        &["snapshot", "--by-pid", &me, "-o", "/dev/null"],
        "not instrumented",
    );
    // … and told how to instrument it without a restart.
    check(
        &["snapshot", "--by-pid", &me, "-o", "/dev/null"],
        &format!("`heapdump attach --by-pid {me}`"),
    );
    check(
        &[
            "snapshot",
            "--by-name",
            "no-such-command",
            "-o",
            "/dev/null",
        ],
        "no instrumented process named",
    );
    // A running process of that name without the shim: its pid, and how to attach.
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pid = sleeper.id();
    check(
        &["snapshot", "--by-name", "sleep", "-o", "/dev/null"],
        "no instrumented process named \"sleep\"",
    );
    let (_, _, err) = heapdump_cmd(&dir, &["snapshot", "--by-name", "sleep", "-o", "/dev/null"]);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let listed = err
        .split("running without the shim: pid ")
        .nth(1)
        .and_then(|r| r.split(';').next())
        .unwrap_or_default();
    assert!(
        listed.split(", ").any(|p| p == pid.to_string()),
        "{err}: pid {pid} not listed"
    );
    assert!(err.contains("`heapdump attach --by-pid PID`"), "{err}");
    // Not a region.
    let junk = dir.join("junk");
    std::fs::write(&junk, vec![7u8; 8192]).unwrap();
    std::fs::set_permissions(&junk, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    check(
        &[
            "snapshot",
            "--region",
            junk.to_str().unwrap(),
            "-o",
            "/dev/null",
        ],
        "not a heapdump region",
    );
    // A region from the future.
    let mut bytes = std::fs::read(&junk).unwrap();
    bytes[..8].copy_from_slice(b"HEAPDUMP");
    bytes[8..12].copy_from_slice(&99u32.to_ne_bytes());
    std::fs::write(&junk, &bytes).unwrap();
    check(
        &[
            "snapshot",
            "--region",
            junk.to_str().unwrap(),
            "-o",
            "/dev/null",
        ],
        "v99 is not supported by this heapdump (reads v1)",
    );
    // Readable by others: refused.
    std::fs::set_permissions(&junk, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    check(
        &[
            "snapshot",
            "--region",
            junk.to_str().unwrap(),
            "-o",
            "/dev/null",
        ],
        "accessible to other users",
    );
    // A symlink: refused.
    let link = dir.join("link");
    std::os::unix::fs::symlink(&junk, &link).unwrap();
    check(
        &[
            "snapshot",
            "--region",
            link.to_str().unwrap(),
            "-o",
            "/dev/null",
        ],
        "symlink",
    );
}

/// A command line with a newline (or another control character) is one row of `list`, and
/// one line of the `--by-name` candidates: escaped.
#[test]
fn multi_line_command_lines_are_escaped() {
    let exe = compile_c("known_allocs", &[]);
    let dir = region_dir("multiline");
    let mut a = Command::new(&exe);
    a.arg("two\nlines\x1b[31m");
    let a = start(a, &dir, true);
    let mut b = Command::new(&exe);
    b.arg("two\nlines\x1b[31m");
    let b = start(b, &dir, true);
    let (ok, out, err) = heapdump_cmd(&dir, &["list"]);
    assert!(ok, "{err}");
    let rows: Vec<&str> = out.lines().collect();
    assert_eq!(rows.len(), 3, "a header and one row per process: {out:?}");
    for r in &rows[1..] {
        assert!(r.ends_with("known_allocs two\\nlines\\u{1b}[31m"), "{r:?}");
    }
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &["snapshot", "--by-name", "known_allocs", "-o", "/dev/null"],
    );
    assert!(!ok);
    let candidates: Vec<&str> = err.lines().filter(|l| l.starts_with("  pid ")).collect();
    assert_eq!(candidates.len(), 2, "{err:?}");
    for c in candidates {
        assert!(c.ends_with("two\\nlines\\u{1b}[31m"), "{c:?}");
    }
    assert!(!err.contains('\x1b'), "{err:?}");
    assert_eq!(a.finish(), 0);
    assert_eq!(b.finish(), 0);
}

/// What the profiled program chooses (its argv[0], a setting's value that comes back in a
/// warning, and so its process name) never reaches the terminal, or a viewer of the profile,
/// as control characters: `snapshot`'s and `watch`'s lines, `list`'s warnings and every string
/// of the profile (`go tool pprof -top` prints its comments and names) show them escaped.
#[test]
fn names_the_program_chose_are_escaped() {
    use std::os::unix::process::CommandExt;
    let exe = compile_c("known_allocs", &[]);
    let dir = region_dir("escaped-names");
    let evil = "\x1b]0;PWNED\x07\x1b[2J\nheapdump: pid 1 (sshd)";
    let mut cmd = Command::new(&exe);
    cmd.arg0(evil).env("HEAPDUMP_UNWIND", "\x1b[31mred\x07");
    let r = start(cmd, &dir, true);
    let pid = r.pid().to_string();
    let shown = "\\u{1b}]0;PWNED\\u{7}\\u{1b}[2J\\nheapdump: pid 1 (sshd)";
    let out = dir.join("escaped.pb.gz");
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &["snapshot", "--by-pid", &pid, "-o", out.to_str().unwrap()],
    );
    assert!(ok, "{err}");
    assert!(
        err.contains(&format!("pid {pid} ({shown}, alive): 1110 live blocks")),
        "{err:?}"
    );
    let (ok, list, err) = heapdump_cmd(&dir, &["list"]);
    assert!(ok, "{err}");
    assert!(
        list.contains("warning: HEAPDUMP_UNWIND=\\u{1b}[31mred\\u{7} is neither"),
        "{list:?}"
    );
    let wdir = dir.join("watched");
    let (ok, _, werr) = heapdump_cmd(
        &dir,
        &[
            "watch",
            "--by-pid",
            &pid,
            "--every",
            "1s",
            "--count",
            "1",
            "-o",
            wdir.to_str().unwrap(),
        ],
    );
    assert!(ok, "{werr}");
    assert!(
        werr.contains(&format!("pid {pid} ({shown}): watching")),
        "{werr:?}"
    );
    for text in [&err, &list, &werr] {
        assert!(!text.contains(['\x1b', '\x07']), "{text:?}");
    }
    let p = decode(&out);
    let bad: Vec<&String> = (p.string_table.iter())
        .filter(|s| s.chars().any(char::is_control))
        .collect();
    assert!(bad.is_empty(), "control characters in the profile: {bad:?}");
    let comments: Vec<&str> = p
        .comment
        .iter()
        .map(|&i| p.string_table[i as usize].as_str())
        .collect();
    assert!(
        comments.contains(&format!("heapdump snapshot of pid {pid} ({shown}), alive").as_str()),
        "{comments:?}"
    );
    assert_eq!(r.finish(), 0);
    // A thread name is the program's to choose too (PR_SET_NAME): it names the thread's stack
    // as a root in `top --retained`, `retainers` and captures.
    let mut py = Command::new("python3");
    py.args([
        "-c",
        "import ctypes, os, sys\n\
         ctypes.CDLL(None).prctl(15, b'\\x1b]2;T\\x07\\x1b[31mX', 0, 0, 0)\n\
         keep = [bytearray(5000) for i in range(10)]\n\
         print('ready', os.getpid(), flush=True)\n\
         sys.stdin.read()\n",
    ]);
    let r = start(py, &dir, true);
    let pid = r.pid().to_string();
    let (ok, top, err) = heapdump_cmd(&dir, &["top", "--retained", "--by-pid", &pid]);
    assert!(ok, "{err}");
    assert!(
        top.contains("stack of \\u{1b}]2;T\\u{7}\\u{1b}[31mX"),
        "{top:?}"
    );
    let capture = dir.join("escaped.hdsnap");
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &["graph", "--by-pid", &pid, "-o", capture.to_str().unwrap()],
    );
    assert!(ok, "{err}");
    let (ok, chains, err) = heapdump_cmd(
        &dir,
        &["retainers", capture.to_str().unwrap(), "--function", ".*"],
    );
    assert!(ok, "{err}");
    for text in [&top, &chains] {
        assert!(!text.contains(['\x1b', '\x07']), "{text:?}");
    }
    assert_eq!(r.finish(), 0);
}

/// Issue 22 D11: a kept region (`HEAPDUMP_KEEP=1`) of a process that exited without
/// allocating anything is left out of `list`'s table, which says so; `--json` has it.
#[test]
fn list_leaves_out_kept_regions_that_allocated_nothing() {
    let exe = compile_c("nothing", &[]);
    let dir = region_dir("nothing");
    for _ in 0..2 {
        let st = Command::new(&exe)
            .env("HEAPDUMP_DIR", &dir)
            .env("LD_PRELOAD", shim())
            .env("HEAPDUMP_KEEP", "1")
            .status()
            .unwrap();
        assert!(st.success());
    }
    let (ok, out, err) = heapdump_cmd(&dir, &["list", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let v = v.as_array().unwrap();
    assert_eq!(v.len(), 2, "{out}");
    assert!(
        v.iter()
            .all(|e| e["allocations"] == 0 && e["status"] == "exited"),
        "{out}"
    );
    let (ok, out, err) = heapdump_cmd(&dir, &["list"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[1..],
        ["(2 regions of exited processes that allocated nothing not shown; `heapdump gc` removes them)"],
        "{out}"
    );
}

/// `watch --help`'s one-line summary names both servers it pushes to.
#[test]
fn watch_summary_names_parca() {
    let (ok, out, _) = heapdump_cmd(std::path::Path::new("/nonexistent"), &["--help"]);
    assert!(ok);
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("watch"))
        .unwrap();
    assert!(line.contains("Pyroscope or Parca"), "{line}");
}

#[test]
fn ambiguous_name_lists_matches() {
    let exe = compile_c("known_allocs", &[]);
    let dir = region_dir("ambiguous");
    let a = start(Command::new(&exe), &dir, true);
    let b = start(Command::new(&exe), &dir, true);
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &["snapshot", "--by-name", "known_allocs", "-o", "/dev/null"],
    );
    assert!(!ok);
    assert!(
        err.contains(&a.pid().to_string()) && err.contains(&b.pid().to_string()),
        "{err}"
    );
    assert_eq!(a.finish(), 0);
    // Now only one is left: --by-name works.
    let out = dir.with_extension("byname.pb.gz");
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &[
            "snapshot",
            "--by-name",
            "known_allocs",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(pprof_raw(&out).total()[2], 1110);
    assert_eq!(b.finish(), 0);
}

#[test]
fn sampling_estimates_within_five_percent() {
    let exe = compile_c("sizes", &[]);
    let dir = region_dir("sampled");
    let mut cmd = Command::new(&exe);
    // 600,000 blocks (~630 MB): enough samples (~19,000) that the estimates' spread (about
    // 0.9% standard deviation) leaves the 5% bound far out of reach of chance.
    cmd.arg("600000").env("HEAPDUMP_SAMPLE_INTERVAL", "32768");
    let r = start(cmd, &dir, true);
    let (blocks, bytes) = r.tally();
    let (blocks, bytes) = (blocks as f64, bytes as f64);
    assert!(bytes >= 100.0 * MIB as f64 && blocks >= 100_000.0);
    let path = snapshot(&dir, r.pid(), &[]);
    let p = decode(&path);
    assert_eq!(p.period, 32768);
    assert_eq!(
        p.string_table[p.period_type.unwrap().r#type as usize],
        "space"
    );
    let v = sum_through(&p, "hold_blocks");
    let (est_blocks, est_bytes) = (v[2] as f64, v[3] as f64);
    eprintln!(
        "sampled at 32 KiB: inuse_space estimate {est_bytes} vs {bytes} ({:+.2}%), objects {est_blocks} vs {blocks} ({:+.2}%)",
        100.0 * (est_bytes / bytes - 1.0),
        100.0 * (est_blocks / blocks - 1.0)
    );
    assert!(
        (est_bytes / bytes - 1.0).abs() < 0.05,
        "inuse_space estimate off by more than 5%"
    );
    assert!(
        (est_blocks / blocks - 1.0).abs() < 0.05,
        "inuse_objects estimate off by more than 5%"
    );
    // The profile is readable by the reference client.
    assert!(pprof_raw(&path).total()[3] > 0);
    assert_eq!(r.finish(), 0);
}

/// Sampling with frees, reallocs and callocs: the estimates are of what is held, with block
/// headers on sampled blocks (the default) and with the address index alone. A free that left
/// a sampled block's record open would count every freed block again (about twice the bytes).
#[test]
fn sampling_estimates_with_frees_and_reallocs() {
    let exe = compile_c("sizes", &[]);
    for headers in ["1", "0"] {
        let dir = region_dir(&format!("sampled-churn-{headers}"));
        let mut cmd = Command::new(&exe);
        cmd.args(["600000", "churn"])
            .env("HEAPDUMP_SAMPLE_INTERVAL", "32768")
            .env("HEAPDUMP_BLOCK_HEADERS", headers);
        let r = start(cmd, &dir, true);
        let (blocks, bytes) = r.tally();
        let (blocks, bytes) = (blocks as f64, bytes as f64);
        let p = decode(&snapshot(&dir, r.pid(), &[]));
        let v = sum_through(&p, "hold_blocks");
        let (est_blocks, est_bytes) = (v[2] as f64, v[3] as f64);
        eprintln!(
            "HEAPDUMP_BLOCK_HEADERS={headers}, churn, sampled at 32 KiB: inuse_space {est_bytes} vs {bytes} ({:+.2}%), objects {est_blocks} vs {blocks} ({:+.2}%)",
            100.0 * (est_bytes / bytes - 1.0),
            100.0 * (est_blocks / blocks - 1.0)
        );
        assert!(
            (est_bytes / bytes - 1.0).abs() < 0.05,
            "inuse_space off by more than 5%"
        );
        assert!(
            (est_blocks / blocks - 1.0).abs() < 0.05,
            "inuse_objects off by more than 5%"
        );
        assert_eq!(r.finish(), 0);
    }
}

/// `#[global_allocator]` in the sampling mode: every block has a header, and a freed sampled
/// block's record is closed (`churn` frees all it allocates).
#[test]
fn rust_global_allocator_sampled_frees() {
    let exe = target_dir().join("rust-alloc-example");
    let dir = region_dir("rust-sampled");
    let mut cmd = Command::new(&exe);
    cmd.env("HEAPDUMP_SAMPLE_INTERVAL", "4096");
    let r = start(cmd, &dir, false);
    let raw = pprof_raw(&snapshot(&dir, r.pid(), &[]));
    let f = |n: &str| raw.sum_with(&format!("rust_alloc_example::{n}"));
    assert_eq!(f("churn")[2..], [0, 0], "freed blocks still recorded");
    // 10 blocks of 1 MiB are each sampled with probability 1 - exp(-256): all of them.
    assert_eq!(f("alloc_large")[2], 10);
    let small = f("alloc_small")[3] as f64;
    assert!(
        small > 0.5 * 1024.0 * 1024.0 && small < 1.5 * 1024.0 * 1024.0,
        "{small}"
    );
    assert_eq!(r.finish(), 0);
}

#[test]
fn cpp_without_frame_pointers_has_full_stacks() {
    let exe = target_dir().join("test-bins/containers");
    std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
    let st = Command::new("g++")
        .args(["-O2", "-g", "-o"])
        .arg(&exe)
        .arg(root().join("examples/c/containers.cc"))
        .status()
        .expect("g++ must be installed");
    assert!(st.success());
    let dir = region_dir("cpp");
    let r = start(Command::new(&exe), &dir, true);
    let raw = pprof_raw(&snapshot(&dir, r.pid(), &[]));
    // The map, 1000 map nodes and 1000 string buffers (201 bytes each), through operator new
    // in libstdc++ and fill_map, neither with frame pointers.
    let f = raw.sum_with("fill_map()");
    assert_eq!(f[2], 2001, "{f:?}");
    assert_eq!(raw.sum_with("main")[2], 2001);
    assert!(f[3] >= 1000 * 201, "{f:?}");
    assert_eq!(r.finish(), 0);
}

#[test]
fn rust_global_allocator_without_frame_pointers() {
    // The example and heapdump's rlib built with frame pointers off (a user's default build):
    // CFI unwinding from the recorder's own registers still finds every allocating function.
    let target = target_dir().parent().unwrap().join("nofp");
    let st = Command::new(env!("CARGO"))
        // Not the test's stdin: rustc's probe reads from a pipe cargo gives it, and a build
        // started with an odd stdin once failed with "couldn't read from stdin".
        .stdin(std::process::Stdio::null())
        .args([
            "build",
            "--release",
            "-q",
            "-p",
            "rust-alloc-example",
            "--bin",
            "rust-alloc-example",
        ])
        .current_dir(root())
        .env("CARGO_TARGET_DIR", &target)
        .env("RUSTFLAGS", "-C force-frame-pointers=no")
        .status()
        .unwrap();
    assert!(st.success(), "building the example without frame pointers");
    let dir = region_dir("rust-nofp");
    let r = start(
        Command::new(target.join("release/rust-alloc-example")),
        &dir,
        false,
    );
    let (blocks, bytes) = r.tally();
    let raw = pprof_raw(&snapshot(&dir, r.pid(), &[]));
    let f = |n: &str| raw.sum_with(&format!("rust_alloc_example::{n}"));
    assert_eq!(f("alloc_small")[2..], [1000, 1000 * KIB]);
    assert_eq!(f("alloc_medium")[2..], [100, 6400 * KIB]);
    assert_eq!(f("alloc_large")[2..], [10, 10 * MIB]);
    let t = raw.total();
    assert_eq!((t[2], t[3]), (blocks, bytes));
    assert_eq!(r.finish(), 0);
}

/// Function names of a sample's stack trace, innermost first (inlined frames included).
fn stack_names(raw: &common::Raw, s: &common::Sample) -> Vec<String> {
    s.locations
        .iter()
        .flat_map(|l| raw.locations.get(l).cloned().unwrap_or_default())
        .map(|line| line.split_whitespace().next().unwrap_or("").to_owned())
        .collect()
}

#[test]
fn stacks_through_code_with_and_without_frame_pointers() {
    let exe = compile_c("mixed_frames", &[]);
    let expected = ["fp_leaf", "nofp_d", "fp_c", "nofp_b", "fp_a", "main"];
    for (unwind, complete) in [("dwarf", true), ("fp", false)] {
        let dir = region_dir(&format!("mixed-{unwind}"));
        let mut cmd = Command::new(&exe);
        cmd.env("HEAPDUMP_UNWIND", unwind);
        let r = start(cmd, &dir, true);
        let raw = pprof_raw(&snapshot(&dir, r.pid(), &[]));
        assert_eq!(raw.sum_with("fp_leaf")[2..], [100, 100 * 100], "{unwind}");
        let ours: Vec<_> = raw
            .samples
            .iter()
            .filter(|s| s.values[2] > 0)
            .map(|s| stack_names(&raw, s))
            .filter(|names| names.iter().any(|n| n == "fp_leaf"))
            .collect();
        assert!(!ours.is_empty());
        for names in &ours {
            let seen: Vec<&str> = names
                .iter()
                .map(String::as_str)
                .filter(|n| expected.contains(n))
                .collect();
            if complete {
                assert_eq!(seen, expected, "{unwind}: {names:?}");
            } else {
                // A frame-pointer walk loses the frames below the first function that uses rbp
                // as an ordinary register: what the CFI walk exists for.
                assert_ne!(seen, expected, "{unwind}: {names:?}");
            }
        }
        assert_eq!(r.finish(), 0);
    }
}

#[test]
fn allocations_on_coroutine_and_signal_stacks() {
    // A coroutine stack with an unmapped page above it and a garbage rbp pointing into that
    // page, and a handler on a sigaltstack: the walk must stay within readable memory (a
    // shim that trusted [sp, top of the thread's stack) crashed this program).
    let exe = compile_c("foreign_stack", &[]);
    for unwind in ["dwarf", "fp"] {
        let dir = region_dir(&format!("foreign-{unwind}"));
        let mut cmd = Command::new(&exe);
        cmd.env("HEAPDUMP_UNWIND", unwind);
        let r = start(cmd, &dir, true);
        let raw = pprof_raw(&snapshot(&dir, r.pid(), &[]));
        assert_eq!(
            raw.sum_with("co_alloc")[2..],
            [1000, 1000 * 100],
            "{unwind}"
        );
        assert_eq!(raw.sum_with("on_signal")[2..], [10, 10 * 200], "{unwind}");
        assert_eq!(r.finish(), 0, "{unwind}");
    }
}

/// The live-bytes peak (`list`, profile comments, the report's "own peak") sees a burst of a
/// few large blocks freed again before the shim's routine refresh (every 1024th operation):
/// 10 blocks of 1 MB live at once gave a peak of 4 KiB.
#[test]
fn the_peak_sees_a_short_burst_of_large_blocks() {
    let exe = compile_c("peak_burst", &[]);
    let dir = region_dir("peak-burst");
    let r = start(Command::new(&exe), &dir, true);
    let (ok, out, err) = heapdump_cmd(&dir, &["list", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mine = (v.as_array().unwrap().iter())
        .find(|e| e["pid"].as_u64() == Some(r.pid() as u64))
        .unwrap();
    let peak = mine["peak_live_bytes"].as_u64().unwrap();
    assert!(peak >= 10_000_000, "peak {peak} B");
    assert_eq!(r.finish(), 0);
}
