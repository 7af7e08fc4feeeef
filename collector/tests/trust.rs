//! Snapshots users can trust: point-in-time consistency under churn, threads, fork/exec,
//! dlopen/dlclose, post-mortem, full tables, permissions, real programs unchanged.

mod common;

use common::*;
use std::collections::HashSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Command, Stdio};

const CHURN_SIZE: i64 = 48;

/// Snapshots a program whose N threads keep K blocks each by "allocate new, free old":
/// every snapshot must see between N·K and N·K+N blocks from `churn_alloc`, and with
/// `--with-tags` no address twice. The region must not grow with the number of snapshots:
/// the records of blocks freed while a snapshot runs are reused once it ends.
fn churn(n: i64, k: i64, snapshots: usize) -> (i64, i64, u64) {
    let exe = compile_c("churn", &[]);
    let dir = region_dir(&format!("churn{n}"));
    let mut cmd = Command::new(&exe);
    cmd.args([n.to_string(), k.to_string(), CHURN_SIZE.to_string()]);
    let r = start(cmd, &dir, true);
    let (mut lo, mut hi, mut max_wait) = (i64::MAX, 0i64, 0u64);
    let region_bytes = || -> u64 {
        let f = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().ends_with(".heapdump"))
            .expect("the region file");
        f.metadata().unwrap().blocks() * 512
    };
    let mut first_size = 0;
    let mut gave_up = 0;
    for i in 0..snapshots {
        let tags = i % 10 == 0;
        let path = snapshot(&dir, r.pid(), if tags { &["--with-tags"] } else { &[] });
        let p = decode(&path);
        if i == 0 {
            first_size = region_bytes();
        }
        let v = sum_through(&p, "churn_alloc");
        let count = v[2];
        // A thread descheduled inside its operation window for longer than the collector's
        // wait budget (200 ms: possible with 32 threads on 2 cores beside other tests) is
        // given up on with a warning in the comments, and its operation may be missing:
        // such snapshots are counted, not checked (and may be at most a tenth of them).
        let comment =
            |needle: &str| (p.comment.iter()).any(|c| p.string_table[*c as usize].contains(needle));
        if comment("stayed inside the allocator past") {
            gave_up += 1;
            eprintln!("snapshot {i}: gave up on an operation in flight; {count} live blocks");
            continue;
        }
        lo = lo.min(count);
        hi = hi.max(count);
        if !(count >= n * k && count <= n * k + n) {
            // What else the snapshot holds (a block recorded under another stack would show
            // here), and its comments.
            let total: i64 = p.sample.iter().map(|s| s.value[2]).sum();
            let names = |s: &heapdump_proto::Sample| -> Vec<String> {
                s.location_id
                    .iter()
                    .filter_map(|l| p.location.iter().find(|x| x.id == *l))
                    .flat_map(|l| l.line.iter())
                    .filter_map(|ln| p.function.iter().find(|f| f.id == ln.function_id))
                    .map(|f| p.string_table[f.name as usize].clone())
                    .collect()
            };
            let others: Vec<(i64, Vec<String>)> = (p.sample.iter())
                .filter(|s| s.value[2] != 0 && !names(s).iter().any(|n| n == "churn_alloc"))
                .map(|s| (s.value[2], names(s)))
                .collect();
            let comments: Vec<&String> = (p.comment.iter())
                .map(|c| &p.string_table[*c as usize])
                .collect();
            panic!(
                "snapshot {i}: {count} live blocks from churn_alloc, outside [{}, {}]; \
                 {total} live blocks in all; others: {others:?}; comments: {comments:?}",
                n * k,
                n * k + n
            );
        }
        assert_eq!(
            v[3],
            count * CHURN_SIZE,
            "snapshot {i}: inuse_space != count × size"
        );
        if tags {
            assert_addresses_distinct(&p, &format!("snapshot {i}"));
        }
        for c in &p.comment {
            let c = &p.string_table[*c as usize];
            if let Some(w) = c.split("waited ").nth(1) {
                max_wait = max_wait.max(w.split(' ').next().unwrap().parse().unwrap());
            }
        }
    }
    assert!(
        gave_up <= snapshots / 10,
        "{gave_up} of {snapshots} snapshots gave up on operations in flight"
    );
    let grown = region_bytes() - first_size;
    // Records handed out (the header's node_cursor, at offset 192): the live blocks, the
    // records freed and not yet reused, and what snapshots kept from reuse. Reuse resumes as
    // each scan passes a record, so continuous snapshots stay within twice the live set; the
    // slack is what threads hold in their caches (a ring of 64 and a stash of 32 each, and a
    // batch of 32 fresh records being handed out) and the other allocations of the program.
    let records = {
        use std::io::{Read, Seek};
        let mut f = std::fs::File::open(region_file(&dir)).unwrap();
        f.seek(std::io::SeekFrom::Start(192)).unwrap();
        let mut b = [0u8; 8];
        f.read_exact(&mut b).unwrap();
        u64::from_le_bytes(b) as i64
    };
    eprintln!(
        "churn N={n} K={k}: {records} records after {snapshots} snapshots of {} live blocks ({:.2} per block)",
        n * k,
        records as f64 / (n * k) as f64
    );
    let slack = n * 4 * 32 + 1024;
    assert!(
        records <= 2 * n * k + slack,
        "{records} records after {snapshots} snapshots of {} live blocks (at most {} expected)",
        n * k,
        2 * n * k + slack
    );
    // The shim reserves the region's storage ahead of use, by chunks of at most 1 MiB per
    // section (so that a full file system cannot raise SIGBUS), growing by up to 512 KiB
    // ahead of what it has when less than that is left, and up to 8 MiB more of the
    // allocations table once threads have had to wait for a grower (vmo-layout's
    // `Backing::boost`: likely with 32 threads on 2 cores, at any moment of the run). A
    // thread may grow ahead of a grower's progress it read just before that grower finished:
    // at most twice that beyond the records handed out since the first snapshot (the CI run
    // of e60562e: 18 MiB, with the boost, against a bound that left it out).
    assert!(
        grown < ((n * k + slack) * 40) as u64 + 2 * ((8 << 20) + (512 << 10)) + (1 << 20),
        "region grew by {grown} bytes over {snapshots} snapshots of {} live blocks",
        n * k
    );
    assert_eq!(r.finish(), 0);
    (lo, hi, max_wait)
}

/// [`churn`], run a second time (a fresh process) when the first run fails. The defect this
/// was for — about one run in four of the 2- and 4-thread cases had one snapshot one block
/// short (99,999 of 100,000, no warning), early in the run — was found on 2026-11-25: the
/// reader stored `lease_last` before the lease, so a free could be stamped after `T` while the
/// same thread's next allocation still saw no lease and rewrote that record (ARCHITECTURE.md,
/// point 2 of the claim). 0 of 20 loaded runs since, against 5 of 34 before; the retry stays
/// until more runs confirm it. A first failure is printed, so it stays visible; a second one
/// fails the test.
fn churn_twice(n: i64, k: i64, snapshots: usize) -> (i64, i64, u64) {
    match std::panic::catch_unwind(|| churn(n, k, snapshots)) {
        Ok(r) => r,
        Err(e) => {
            let why = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            eprintln!("KNOWN FLAKE (retrying once): churn N={n} K={k}: {why}");
            churn(n, k, snapshots)
        }
    }
}

#[test]
fn consistent_under_churn_two_threads() {
    let (lo, hi, wait) = churn_twice(2, 50_000, 100);
    eprintln!("churn N=2 K=50000: 100 snapshots, live count in [{lo}, {hi}], longest wait for an in-flight operation {wait} ns");
}

#[test]
fn consistent_under_churn_four_threads() {
    let (lo, hi, wait) = churn_twice(4, 50_000, 100);
    eprintln!("churn N=4 K=50000: 100 snapshots, live count in [{lo}, {hi}], longest wait for an in-flight operation {wait} ns");
}

/// A busy server's case on this 2-core machine: 32 threads churning, each far more often
/// preempted inside its operation window than the 2- and 4-thread cases.
#[test]
fn consistent_under_churn_thirty_two_threads() {
    let (lo, hi, wait) = churn(32, 1_000, 100);
    eprintln!("churn N=32 K=1000: 100 snapshots, live count in [{lo}, {hi}], longest wait for an in-flight operation {wait} ns");
}

#[test]
fn eight_threads_mixed_exact_after_join() {
    let exe = compile_c("mixed", &[]);
    let dir = region_dir("mixed");
    let mut r = start_until(Command::new(&exe), &dir, true, "started");
    let pid: u32 = r.ready[0].parse().unwrap();
    // Snapshots while the threads run (they must succeed and never see an address twice).
    for _ in 0..5 {
        let p = decode(&snapshot(&dir, pid, &["--with-tags"]));
        let Some(key) = p.string_table.iter().position(|s| s == "address") else {
            continue;
        };
        let key = key as i64;
        let mut seen = HashSet::new();
        for s in p.sample.iter().filter(|s| s.value[2] == 1) {
            let a = s.label.iter().find(|l| l.key == key).unwrap().num;
            assert!(seen.insert(a), "address {a:#x} twice during churn");
        }
    }
    let ready = r.wait_line("ready");
    let (blocks, bytes) = tally(&ready);
    let raw = pprof_raw(&snapshot(&dir, pid, &[]));
    let w = raw.sum_with("mixed_worker");
    assert_eq!(
        (w[2], w[3]),
        (blocks, bytes),
        "live blocks of the workers vs the program's tally"
    );
    assert_eq!(r.finish(), 0);
}

#[test]
fn fork_child_has_own_region_with_inherited_blocks() {
    let exe = compile_c("forker", &[]);
    let dir = region_dir("fork");
    let mut r = start(Command::new(&exe), &dir, true);
    let child: u32 = r.pid();
    let parent: u32 = r.wait_line("ready")[0].parse().unwrap();
    assert_ne!(child, parent);
    let c = pprof_raw(&snapshot(&dir, child, &[]));
    assert_eq!(
        c.sum_with("parent_alloc")[2..],
        [90, 90 * 4096],
        "inherited, minus 10 freed"
    );
    assert_eq!(c.sum_with("child_alloc")[2..], [50, 50 * 8192]);
    // The child's alloc_* count from what it inherited, as its counters do
    // (`allocations` = 100 inherited + 50): not the parent's 120 (20 freed before the fork).
    assert_eq!(
        c.sum_with("parent_alloc")[..2],
        [100, 100 * 4096],
        "the child's alloc_* of inherited blocks"
    );
    assert_eq!(c.sum_with("child_alloc")[..2], [50, 50 * 8192]);
    let p = pprof_raw(&snapshot(&dir, parent, &[]));
    assert_eq!(
        p.sum_with("parent_alloc"),
        [120, 120 * 4096, 100, 100 * 4096],
        "the parent's history; the child's frees not in parent"
    );
    assert_eq!(
        p.sum_with("child_alloc"),
        [0; 4],
        "child's blocks not in parent"
    );
    assert_eq!(r.finish(), 0);
    assert!(
        std::fs::read_dir(&dir).unwrap().next().is_none(),
        "both regions removed at exit"
    );
}

/// The same with block headers and `process_vm_readv` refused by a seccomp filter (as in a
/// container without CAP_SYS_PTRACE): the child confirms the blocks it inherited through its
/// fallback, and inherits exactly the same.
#[test]
fn fork_child_inherits_exactly_without_process_vm_readv() {
    let exe = compile_c("forker", &[]);
    let deny = compile_c("deny_vm_readv", &[]);
    let dir = region_dir("fork-seccomp");
    let mut cmd = Command::new(&deny);
    cmd.arg(&exe);
    let mut r = start(cmd, &dir, true);
    let child: u32 = r.pid();
    let parent: u32 = r.wait_line("ready")[0].parse().unwrap();
    assert_ne!(child, parent);
    let c = pprof_raw(&snapshot(&dir, child, &[]));
    assert_eq!(c.sum_with("parent_alloc")[2..], [90, 90 * 4096]);
    assert_eq!(c.sum_with("child_alloc")[2..], [50, 50 * 8192]);
    assert_eq!(r.finish(), 0);
}

#[test]
fn exec_gets_fresh_region_and_run_tracks_the_tree() {
    let exe = compile_c("known_allocs", &[]);
    let dir = region_dir("exec");
    // sh execs into the program: same pid, new image, new region.
    let mut cmd = Command::new(heapdump());
    cmd.args(["run", "--", "sh", "-c"])
        .arg(format!("exec {}", exe.display()));
    let r = start(cmd, &dir, false);
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    let mine: Vec<_> = files
        .iter()
        .filter(|f| {
            f.file_name()
                .to_string_lossy()
                .starts_with(&format!("{}-", r.pid()))
        })
        .collect();
    assert_eq!(
        mine.len(),
        1,
        "one region for the pid after exec: {files:?}"
    );
    let t = pprof_raw(&snapshot(&dir, r.pid(), &[])).total();
    assert_eq!(
        (t[2], t[3]),
        (1110, 18063360),
        "only the new image's blocks"
    );
    assert_eq!(r.finish(), 0);

    // A shell running two instrumented programs: every process is tracked and listed.
    let dir = region_dir("tree");
    let mut cmd = Command::new(heapdump());
    cmd.args(["run", "--", "sh", "-c"])
        .arg(format!("exec 3<&0; {0} <&3 & {0} <&3; wait", exe.display()));
    let mut r = start(cmd, &dir, false);
    let a = r.pid();
    let b: u32 = r.wait_line("ready")[0].parse().unwrap();
    let (ok, out, _) = heapdump_cmd(&dir, &["list", "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let alive: Vec<(u64, String)> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["status"] == "alive")
        .map(|e| {
            (
                e["pid"].as_u64().unwrap(),
                e["command"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for pid in [a, b] {
        assert!(
            alive.contains(&(pid as u64, "known_allocs".into())),
            "{pid} not listed: {alive:?}"
        );
    }
    assert!(
        alive.iter().any(|(_, c)| c == "sh"),
        "the shell is listed too: {alive:?}"
    );
    assert_eq!(r.finish(), 0);
}

#[test]
fn dlopened_library_symbolized_after_dlclose() {
    let lib = target_dir().join("test-bins/libplugin.so");
    std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
    let st = Command::new("cc")
        .args([
            "-shared",
            "-fPIC",
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-o",
        ])
        .arg(&lib)
        .arg(root().join("examples/c/plugin.c"))
        .status()
        .unwrap();
    assert!(st.success());
    let exe = compile_c("dlopener", &["-ldl"]);
    let dir = region_dir("dlopen");
    let mut cmd = Command::new(&exe);
    cmd.arg(&lib);
    let r = start(cmd, &dir, true);
    let raw = pprof_raw(&snapshot(&dir, r.pid(), &[]));
    assert_eq!(raw.sum_with("plugin_alloc"), [100, 300_000, 100, 300_000]);
    assert_eq!(r.finish(), 0);
}

#[test]
fn post_mortem_after_kill_and_gc() {
    let exe = compile_c("known_allocs", &[]);
    let dir = region_dir("kill");
    let mut r = start(Command::new(&exe), &dir, true);
    let pid = r.pid();
    r.child.kill().unwrap(); // SIGKILL
    r.child.wait().unwrap();
    let (ok, out, _) = heapdump_cmd(&dir, &["list", "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let me = v
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["pid"] == pid)
        .expect("still listed");
    assert_eq!(me["status"], "exited");
    let raw = pprof_raw(&snapshot(&dir, pid, &[]));
    assert_eq!(
        raw.sum_with("alloc_small")[2..],
        [1000, 1_024_000],
        "symbolized post-mortem"
    );
    assert_eq!(raw.total()[2], 1110);
    // --region reads the file directly.
    let file = me["region"].as_str().unwrap().to_owned();
    let out = dir.with_extension("region.pb.gz");
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &["snapshot", "--region", &file, "-o", out.to_str().unwrap()],
    );
    assert!(ok, "{err}");
    assert_eq!(pprof_raw(&out).total()[2], 1110);
    // gc removes it.
    let (ok, _, _) = heapdump_cmd(&dir, &["gc"]);
    assert!(ok);
    assert!(!std::path::Path::new(&file).exists());
}

/// `gc` leaves a directory with a region's name alone, saying so, and still removes the
/// regions after it (before, it stopped at the first entry it could not remove: "Is a
/// directory", exit 1, the rest left).
#[test]
fn gc_goes_on_past_what_it_cannot_remove() {
    let dir = region_dir("gc-goes-on");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    // Names sort the directory first; pids that do not exist.
    let sub = dir.join("1-1-1.heapdump");
    std::fs::create_dir(&sub).unwrap();
    let junk = dir.join("999999999-2-2.heapdump");
    std::fs::write(&junk, b"not a region").unwrap();
    std::fs::set_permissions(&junk, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (ok, out, err) = heapdump_cmd(&dir, &["gc", "--dry-run"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("would remove") && out.contains("999999999-2-2"),
        "{out}"
    );
    assert!(!out.contains("1-1-1.heapdump"), "{out}");
    let (ok, out, err) = heapdump_cmd(&dir, &["gc"]);
    assert!(ok, "{err}");
    assert!(
        err.contains("1-1-1.heapdump: a directory, not a region file: left alone"),
        "{err}"
    );
    assert!(out.contains("removed") && !junk.exists(), "{out}");
    assert!(sub.is_dir());
}

#[test]
fn keep_shows_leaks_after_clean_exit() {
    let exe = compile_c("known_allocs", &[]);
    let dir = region_dir("keep");
    let mut cmd = Command::new(&exe);
    cmd.arg("leak").env("HEAPDUMP_KEEP", "1");
    let r = start(cmd, &dir, true);
    let pid = r.pid();
    assert_eq!(r.finish(), 0);
    let (_, out, _) = heapdump_cmd(&dir, &["list", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["status"], "exited");
    let raw = pprof_raw(&snapshot(&dir, pid, &[]));
    assert_eq!(raw.total()[2], 1110, "blocks leaked at exit");
}

#[test]
fn full_tables_drop_and_count_without_blocking() {
    let exe = compile_c("known_allocs", &[]);
    let dir = region_dir("full");
    let mut cmd = Command::new(&exe);
    cmd.env("HEAPDUMP_MAX_BLOCKS", "256");
    let r = start(cmd, &dir, true);
    let (_, out, _) = heapdump_cmd(&dir, &["list", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let dropped = v[0]["dropped_blocks"].as_u64().unwrap();
    let live = v[0]["live_blocks"].as_u64().unwrap();
    assert!(dropped > 0, "nothing dropped: {out}");
    assert!(live <= 256 && live + dropped >= 1110, "{out}");
    let raw = pprof_raw(&snapshot(&dir, r.pid(), &[]));
    assert!(raw
        .comments
        .iter()
        .any(|c| c.contains(&format!("dropped_blocks={dropped}"))));
    assert_eq!(r.finish(), 0, "the program runs to completion");
}

#[test]
fn region_permissions_and_foreign_regions() {
    let exe = compile_c("known_allocs", &[]);
    let dir = region_dir("perm");
    let r = start(Command::new(&exe), &dir, true);
    assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
    let file = std::fs::read_dir(&dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let md = std::fs::symlink_metadata(&file).unwrap();
    assert_eq!(md.mode() & 0o777, 0o600);
    // SAFETY: getuid has no preconditions.
    assert_eq!(md.uid(), unsafe { libc::getuid() });
    // SAFETY: as above.
    if unsafe { libc::geteuid() } == 0 {
        // A region owned by another user is refused by a non-root collector.
        let foreign = region_dir("foreign");
        std::fs::create_dir_all(&foreign).unwrap();
        std::fs::set_permissions(&foreign, std::fs::Permissions::from_mode(0o755)).unwrap();
        let copy = foreign.join("1-1-1.heapdump");
        std::fs::copy(&file, &copy).unwrap();
        std::os::unix::fs::chown(&copy, Some(1), Some(1)).unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o600)).unwrap();
        // The collector, run as `nobody`, on that file.
        let as_nobody = || {
            let out = Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(heapdump())
                .args([
                    "snapshot",
                    "--region",
                    copy.to_str().unwrap(),
                    "-o",
                    "/tmp/never.pb.gz",
                ])
                .output()
                .unwrap();
            assert!(!out.status.success());
            String::from_utf8_lossy(&out.stderr).into_owned()
        };
        let err = as_nobody();
        assert!(
            err.contains("Permission denied") || err.contains("not by you"),
            "{err}"
        );
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o604)).unwrap();
        let err = as_nobody();
        assert!(err.contains("owned by uid 1, not by you"), "{err}");
        // The shim refuses a region directory owned by someone else, and the program runs on.
        let theirs = region_dir("theirs");
        std::fs::create_dir_all(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(1), Some(1)).unwrap();
        let out = Command::new(&exe)
            .env("LD_PRELOAD", shim())
            .env("HEAPDUMP_DIR", &theirs)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("not recording"));
        assert!(std::fs::read_dir(&theirs).unwrap().next().is_none());
    }
    assert_eq!(r.finish(), 0);
}

/// Runs `cmd` (in `cwd`) bare, under the shim, and under the shim with `HEAPDUMP_KEEP=1`:
/// same stdout, same status each time. The second run must leave no region behind; the
/// regions the third one kept (`heapdump list --json` of every process of the tree) are
/// handed to `check`, which asserts what the shim recorded.
fn same_with_shim(
    name: &str,
    cwd_setup: impl Fn(&std::path::Path),
    cmd: &[&str],
    check: impl Fn(&[serde_json::Value]),
) {
    let mut results = Vec::new();
    for (preload, keep) in [(false, false), (true, false), (true, true)] {
        let cwd = region_dir(&format!("{name}-cwd-{preload}-{keep}"));
        std::fs::create_dir_all(&cwd).unwrap();
        cwd_setup(&cwd);
        let dir = region_dir(name);
        let mut c = Command::new(cmd[0]);
        c.args(&cmd[1..])
            .current_dir(&cwd)
            .env("HEAPDUMP_DIR", &dir)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.com")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.com")
            .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
            .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z")
            .env("HOME", &cwd)
            .stdin(Stdio::null());
        if preload {
            c.env("LD_PRELOAD", shim());
        }
        if keep {
            c.env("HEAPDUMP_KEEP", "1");
        }
        let out = c.output().unwrap_or_else(|e| panic!("{name}: {e}"));
        results.push((
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        ));
        if !preload {
            continue;
        }
        let (_, out, _) = heapdump_cmd(&dir, &["list", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let regions = v.as_array().unwrap();
        if keep {
            // Every process of the tree kept its region; a detached daemon such as
            // `git maintenance` may still be running.
            assert!(
                regions.iter().all(|e| e.get("error").is_none()),
                "{name}: unreadable regions: {regions:?}"
            );
            for e in regions {
                assert_eq!(
                    (e["dropped_blocks"].as_u64(), e["dropped_stacks"].as_u64()),
                    (Some(0), Some(0)),
                    "{name}: dropped records in {e}"
                );
            }
            check(regions);
        } else {
            // Every process of the tree that has exited removed its region.
            let dead: Vec<_> = regions.iter().filter(|e| e["status"] != "alive").collect();
            assert!(
                dead.is_empty(),
                "{name}: regions left after clean exit: {dead:?}"
            );
        }
    }
    assert_eq!(
        results[0], results[1],
        "{name} behaves differently under the shim"
    );
    assert_eq!(
        results[0], results[2],
        "{name} behaves differently under the shim with HEAPDUMP_KEEP=1"
    );
    assert_eq!(results[0].0, Some(0), "{name} failed: {}", results[0].1);
}

/// The kept regions whose command (argv[0]'s file name) is `cmd`.
fn regions_of<'a>(regions: &'a [serde_json::Value], cmd: &str) -> Vec<&'a serde_json::Value> {
    regions.iter().filter(|e| e["command"] == cmd).collect()
}

/// (allocations, frees) recorded in a region, from `heapdump list --json`.
fn recorded(e: &serde_json::Value) -> (u64, u64) {
    (
        e["allocations"].as_u64().unwrap(),
        e["frees"].as_u64().unwrap(),
    )
}

#[test]
fn real_programs_unchanged() {
    let py = r#"
import json, re, threading, subprocess, sys
data = [{"k": i, "v": "x" * (i % 50)} for i in range(20000)]
s = json.dumps(data)
assert json.loads(s) == data
words = re.findall(r"[a-z]+", "the quick brown fox " * 1000)
out = []
def work(n): out.append(sum(len(w) * n for w in words))
ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
r = subprocess.run([sys.executable, "-c", "print(6*7)"], capture_output=True, text=True)
print(len(s), len(words), sorted(out)[-1], r.stdout.strip())
"#;
    same_with_shim(
        "python",
        |_| {},
        &["python3", "-c", py],
        |regions| {
            // The script and the interpreter it starts (`python3` may be a wrapper script that
            // runs more processes first). Every object is recorded once the interpreter is
            // initialized (its allocator domains are wrapped), pymalloc's small ones too.
            let pythons: Vec<_> = regions
                .iter()
                .filter(|e| e["cmdline"].get(1).and_then(|a| a.as_str()) == Some("-c"))
                .filter(|e| {
                    e["executable"]
                        .as_str()
                        .is_some_and(|p| p.rsplit('/').next().unwrap().starts_with("python"))
                })
                .collect();
            assert_eq!(pythons.len(), 2, "python regions: {regions:?}");
            for e in pythons {
                let (a, f) = recorded(e);
                assert!(a >= 1000 && f <= a, "python: {a} allocations, {f} frees");
            }
        },
    );
    same_with_shim(
        "git",
        |_| {},
        &["sh", "-c", "git init -q r && cd r && for i in 1 2 3; do echo $i > f$i; git add f$i; git commit -qm c$i; done && git log --oneline && git count-objects"],
        |regions| {
            let mut subcommands: Vec<&str> = regions_of(regions, "git")
                .iter()
                .filter_map(|e| e["cmdline"].get(1).and_then(|a| a.as_str()))
                // Helpers git may start on its own (`maintenance`, `gc`) are not counted.
                .filter(|a| ["init", "add", "commit", "log", "count-objects"].contains(a))
                .collect();
            subcommands.sort();
            assert_eq!(
                subcommands,
                ["add", "add", "add", "commit", "commit", "commit", "count-objects", "init", "log"]
            );
            for e in regions_of(regions, "git") {
                let (a, f) = recorded(e);
                assert!(a >= 50 && f <= a, "git {}: {a} allocations, {f} frees", e["cmdline"]);
            }
        },
    );
    same_with_shim(
        "gcc",
        |d| {
            std::fs::write(
                d.join("h.c"),
                "#include <stdio.h>\nint main(void){printf(\"%d\\n\", 6*7);return 0;}\n",
            )
            .unwrap()
        },
        &["sh", "-c", "gcc -O2 -o h h.c && ./h"],
        |regions| {
            // The driver, the compiler proper, the assembler and the linker each recorded.
            for exe in ["gcc", "cc1", "as", "collect2", "ld"] {
                let r = regions_of(regions, exe);
                assert_eq!(r.len(), 1, "{exe}: {regions:?}");
                let (a, _) = recorded(r[0]);
                assert!(a >= 100, "{exe}: {a} allocations");
            }
            assert!(recorded(regions_of(regions, "cc1")[0]).0 >= 1000);
            // The program built: one allocation, stdout's buffer for printf, never freed.
            let h = regions_of(regions, "h");
            assert_eq!(h.len(), 1, "{regions:?}");
            assert_eq!(recorded(h[0]), (1, 0));
        },
    );
    same_with_shim(
        "perl",
        |_| {},
        &[
            "perl",
            "-e",
            "my %h; $h{$_} = $_ x 3 for 1..50000; print scalar(keys %h), \"\\n\";",
        ],
        |regions| {
            // 50,000 hash entries, each with a malloc'd key and value string.
            let r = regions_of(regions, "perl");
            assert_eq!(r.len(), 1, "{regions:?}");
            let (a, f) = recorded(r[0]);
            assert!(
                a >= 2 * 50_000 && f <= a,
                "perl: {a} allocations, {f} frees"
            );
        },
    );
    same_with_shim(
        "sqlite3",
        |_| {},
        &["sqlite3", ":memory:", "create table t(a, b); with recursive c(x) as (select 1 union all select x+1 from c limit 50000) insert into t select x, printf('%08d', x) from c; select count(*), sum(a), max(b) from t;"],
        |regions| {
            // printf() returns a string of its own for each of the 50,000 rows.
            let r = regions_of(regions, "sqlite3");
            assert_eq!(r.len(), 1, "{regions:?}");
            let (a, f) = recorded(r[0]);
            assert!(a >= 50_000 && f <= a, "sqlite3: {a} allocations, {f} frees");
        },
    );
    let channels = target_dir().join("channels");
    same_with_shim(
        "rust-channels",
        |_| {},
        &[channels.to_str().unwrap()],
        |regions| {
            // 4 workers × 1968 non-empty vectors, all dropped by the receiver, plus the 124
            // formatted strings.
            let r = regions_of(regions, "channels");
            assert_eq!(r.len(), 1, "{regions:?}");
            let (a, f) = recorded(r[0]);
            assert!(
                a >= 4 * 1968 + 124 && f >= 4 * 1968,
                "channels: {a} allocations, {f} frees"
            );
        },
    );
}

/// Prints "skipped: TEST: REASON" where `cargo test` shows it (straight to the process's
/// standard error: `eprintln!` output is captured for passing tests).
fn skip(test: &str, reason: &str) {
    skip_note(&format!("skipped: {test}: {reason}"));
}

/// A memory cgroup limited to `limit` bytes (swap included where the kernel allows), removed
/// when dropped. Works with cgroup v2 (the unified hierarchy at /sys/fs/cgroup, or at
/// /sys/fs/cgroup/unified when it has the memory controller) and with cgroup v1's memory
/// hierarchy. `Err` says why none can be made here.
struct MemoryCgroup {
    dir: std::path::PathBuf,
}

impl MemoryCgroup {
    fn new(limit: u64) -> Result<MemoryCgroup, String> {
        use std::path::Path;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("needs root to create a memory cgroup".into());
        }
        let name = format!("heapdump-test-{}", std::process::id());
        let is_v2 = |p: &Path| {
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a zeroed statfs is a valid out-buffer; `c` is NUL-terminated.
            let mut st: libc::statfs = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            let ok = unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0;
            ok && st.f_type == libc::CGROUP2_SUPER_MAGIC
        };
        let v2_root = [
            Path::new("/sys/fs/cgroup"),
            Path::new("/sys/fs/cgroup/unified"),
        ]
        .into_iter()
        .find(|p| {
            is_v2(p)
                && std::fs::read_to_string(p.join("cgroup.controllers"))
                    .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"))
        });
        if let Some(root) = v2_root {
            // The new group is made beside this process's own group, whose parent already
            // delegates the memory controller when this process has it: a group holding
            // processes cannot delegate controllers to children ("no internal processes"),
            // only the root can. At the root, the controller is delegated if it is not yet.
            let own = std::fs::read_to_string("/proc/self/cgroup")
                .unwrap_or_default()
                .lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
                .unwrap_or_else(|| "/".to_owned());
            let own_dir = root.join(own.trim_start_matches('/'));
            let has_memory = |d: &Path| {
                std::fs::read_to_string(d.join("cgroup.controllers"))
                    .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"))
            };
            let parent = match own_dir.parent() {
                Some(p) if own != "/" && p.starts_with(root) && has_memory(&own_dir) => p,
                _ => root,
            };
            let sub =
                std::fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap_or_default();
            if !sub.split_whitespace().any(|x| x == "memory") {
                std::fs::write(parent.join("cgroup.subtree_control"), "+memory").map_err(|e| {
                    format!(
                        "cgroup v2 at {}: cannot delegate the memory controller: {e}",
                        parent.display()
                    )
                })?;
            }
            let dir = parent.join(&name);
            std::fs::create_dir(&dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            let cg = MemoryCgroup { dir };
            std::fs::write(cg.dir.join("memory.max"), limit.to_string())
                .map_err(|e| format!("cannot set {}/memory.max: {e}", cg.dir.display()))?;
            let _ = std::fs::write(cg.dir.join("memory.swap.max"), "0");
            return Ok(cg);
        }
        let v1 = Path::new("/sys/fs/cgroup/memory");
        if v1.join("memory.limit_in_bytes").exists() {
            let dir = v1.join(&name);
            std::fs::create_dir(&dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            let cg = MemoryCgroup { dir };
            std::fs::write(cg.dir.join("memory.limit_in_bytes"), limit.to_string())
                .map_err(|e| format!("cannot set memory.limit_in_bytes: {e}"))?;
            let _ = std::fs::write(
                cg.dir.join("memory.memsw.limit_in_bytes"),
                limit.to_string(),
            );
            return Ok(cg);
        }
        Err(
            "no cgroup v2 hierarchy with the memory controller and no cgroup v1 memory hierarchy"
                .into(),
        )
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Empty once its only process was killed; the kernel may take a moment to let go.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

#[test]
fn post_mortem_after_oom_kill() {
    let cg = match MemoryCgroup::new(64 << 20) {
        Ok(cg) => cg,
        Err(reason) => return skip("post_mortem_after_oom_kill", &reason),
    };
    let exe = compile_c("oom", &[]);
    let dir = region_dir("oom");
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {}/cgroup.procs && exec {}",
            cg.dir.display(),
            exe.display()
        ))
        .env("LD_PRELOAD", shim())
        .env("HEAPDUMP_DIR", &dir)
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(9),
        "expected an OOM kill: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, list, _) = heapdump_cmd(&dir, &["list", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&list).unwrap();
    let regions = v.as_array().unwrap();
    assert_eq!(regions.len(), 1, "{regions:?}");
    let me = &regions[0];
    assert_eq!(me["status"], "exited");
    let pid = me["pid"].as_u64().unwrap() as u32;
    let raw = pprof_raw(&snapshot(&dir, pid, &[]));
    let g = raw.sum_with("grow");
    // The kill came after at least a few dozen blocks (more if the kernel could swap).
    assert!(
        g[2] >= 16 && g[3] == g[2] << 20,
        "blocks from grow() after the OOM kill: {g:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fork_from_a_worker_thread() {
    let exe = compile_c("thread_fork", &[]);
    let dir = region_dir("thread-fork");
    let r = start(Command::new(&exe), &dir, true);
    let raw = pprof_raw(&snapshot(&dir, r.pid(), &[]));
    assert_eq!(raw.sum_with("child_alloc_in_thread")[2..], [100, 100 * 100]);
    assert_eq!(r.finish(), 0);
}

// ---- Issue 8, C/B items: the collector's own trust boundary ----

/// C1: `-o` creates its temporary file exclusively (a planted symlink is never followed), the
/// profile is mode 0600 whatever the umask, `-o -` writes to stdout, `-o DIR` fails cleanly.
#[test]
fn output_is_exclusive_private_and_goes_to_stdout() {
    use std::io::Read;
    let exe = compile_c("known_allocs", &[]);
    let dir = region_dir("output");
    let r = start(Command::new(&exe), &dir, true);
    let pid = r.pid().to_string();
    let out_dir = region_dir("output-dir");
    std::fs::create_dir_all(&out_dir).unwrap();
    let victim = out_dir.join("victim");
    std::fs::write(&victim, "precious").unwrap();
    // The old temporary name was `.NAME.tmpPID`: plant a symlink for every pid the collector
    // may get (pids are handed out in order; other tests run meanwhile).
    let last_pid = Command::new("true").spawn().unwrap().id();
    for p in last_pid..last_pid + 3000 {
        std::os::unix::fs::symlink(&victim, out_dir.join(format!(".s.pb.gz.tmp{p}"))).unwrap();
    }
    let out = out_dir.join("s.pb.gz");
    let (ok, so, se) = heapdump_cmd(
        &dir,
        &["snapshot", "--by-pid", &pid, "-o", out.to_str().unwrap()],
    );
    assert!(ok, "{so}{se}");
    assert_eq!(
        std::fs::read(&victim).unwrap(),
        b"precious",
        "the file a planted symlink points to was overwritten"
    );
    let md = std::fs::symlink_metadata(&out).unwrap();
    assert!(md.file_type().is_file(), "the profile is a regular file");
    assert_eq!(md.mode() & 0o777, 0o600, "profile mode");
    assert_eq!(pprof_raw(&out).total()[2], 1110);

    // `-o -`: the profile on stdout, nothing else there.
    let o = Command::new(heapdump())
        .args(["snapshot", "--by-pid", &pid, "-o", "-"])
        .env("HEAPDUMP_DIR", &dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(o.stdout.as_slice())
        .read_to_end(&mut raw)
        .expect("stdout is a gzip stream");
    let p = <heapdump_proto::Profile as prost::Message>::decode(raw.as_slice()).unwrap();
    assert_eq!(
        p.sample.iter().map(|s| s.value[2]).sum::<i64>(),
        1110,
        "blocks in the profile written to stdout"
    );
    assert!(!out_dir.join("-").exists());

    // `-o DIR`: a clear error, no temporary file left behind.
    let before = std::fs::read_dir(&out_dir).unwrap().count();
    let (ok, _, se) = heapdump_cmd(
        &dir,
        &[
            "snapshot",
            "--by-pid",
            &pid,
            "-o",
            out_dir.to_str().unwrap(),
        ],
    );
    assert!(!ok);
    assert!(se.contains("is a directory"), "{se}");
    assert_eq!(std::fs::read_dir(&out_dir).unwrap().count(), before);
    assert_eq!(r.finish(), 0);
    let _ = std::fs::remove_dir_all(&out_dir);
}

/// Waits up to `limit` for `child` (started with `process_group(0)`) to exit; kills its
/// process group and panics on timeout.
fn wait_exit(child: &mut std::process::Child, limit: std::time::Duration, what: &str) -> i32 {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            use std::os::unix::process::ExitStatusExt;
            return st.code().unwrap_or_else(|| 128 + st.signal().unwrap());
        }
        if t0.elapsed() > limit {
            // The child leads its own process group (`process_group(0)`): end it all, so that
            // no orphan keeps the test's output open.
            // SAFETY: signalling a process group we created.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            panic!("{what}: still running after {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// `nohup heapdump run -- CMD` (or a shell's `trap '' HUP INT`): the signals the caller
/// ignored stay ignored in the command, as without heapdump (the same `SigIgn` mask), and a
/// SIGHUP sent to `heapdump run` then harms neither: the command runs to its end.
#[test]
fn run_keeps_the_signals_its_caller_ignored_ignored() {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let dir = region_dir("run-ignored");
    let script = "grep '^SigIgn' /proc/$$/status; echo ready; sleep 0.5; echo done";
    let ignoring = |cmd: &mut Command| {
        // SAFETY: only sigaction between fork and exec (async-signal-safe).
        unsafe {
            cmd.pre_exec(|| {
                for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM] {
                    libc::signal(sig, libc::SIG_IGN);
                }
                Ok(())
            })
        };
    };
    let mut bare = Command::new("sh");
    bare.args(["-c", script]);
    ignoring(&mut bare);
    let bare = bare.output().unwrap();
    let bare = String::from_utf8_lossy(&bare.stdout).into_owned();
    let mask = bare.lines().next().unwrap().to_owned();
    let bits = u64::from_str_radix(mask.trim_start_matches("SigIgn:").trim(), 16).unwrap();
    assert_eq!(bits & 0x4003, 0x4003, "the caller's mask: {mask}");

    let mut cmd = Command::new(heapdump());
    cmd.args(["run", "--", "sh", "-c", script])
        .env("HEAPDUMP_DIR", &dir)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    ignoring(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    // Signals 1 to 31: glibc's own real-time signals (32, 33) may differ with the shim.
    let theirs = lines.next().unwrap().unwrap();
    let their_bits = u64::from_str_radix(theirs.trim_start_matches("SigIgn:").trim(), 16).unwrap();
    assert_eq!(
        their_bits & 0x7fff_ffff,
        bits & 0x7fff_ffff,
        "the command's {theirs} against {mask} without heapdump"
    );
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    // SAFETY: signalling the heapdump process we started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGHUP) }, 0);
    let got = wait_exit(
        &mut child,
        std::time::Duration::from_secs(10),
        "heapdump run after an ignored SIGHUP",
    );
    assert_eq!(lines.next().map(|l| l.unwrap()), Some("done".to_owned()));
    assert_eq!(got, 0, "heapdump run and its command outlive the SIGHUP");
}

/// `HEAPDUMP_DIR=regions heapdump run -- sh -c 'cd / && exec PROGRAM'`: the relative
/// directory is the one beside the caller, where `heapdump list` run there looks, for the
/// process that changed directory too (it was `/regions`, or nothing when that could not be
/// made).
#[test]
fn run_makes_a_relative_region_directory_absolute() {
    let exe = compile_c("known_allocs", &[]);
    let dir = region_dir("run-relative");
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!("cd / && exec {} leak < /dev/null", exe.display());
    let t = run_timeout(
        Command::new(heapdump())
            .args(["run", "--keep", "--", "sh", "-c", &script])
            .env("HEAPDUMP_DIR", "regions")
            .current_dir(&dir)
            .stdin(Stdio::null()),
        std::time::Duration::from_secs(60),
    );
    assert_eq!(t.code, Some(0), "{}", t.stderr);
    let pid: u32 = t
        .stdout
        .trim()
        .strip_prefix("ready ")
        .unwrap()
        .parse()
        .unwrap();
    let out = Command::new(heapdump())
        .args(["list", "--json"])
        .env("HEAPDUMP_DIR", "regions")
        .current_dir(&dir)
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(
        list.contains(&format!("\"pid\": {pid},")),
        "the region of pid {pid} (which changed directory to /) listed beside the caller: {list}"
    );
}

/// C6: signals sent to `heapdump run` reach the command, `heapdump run` exits with the
/// command's status, and a command that cannot be started exits 127/126 as in a shell.
#[test]
fn run_forwards_signals_and_reports_exec_errors() {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let dir = region_dir("run-signals");
    for (sig, name, code) in [
        (libc::SIGINT, "INT", 3),
        (libc::SIGTERM, "TERM", 4),
        (libc::SIGHUP, "HUP", 5),
        (libc::SIGQUIT, "QUIT", 6),
        (libc::SIGUSR1, "USR1", 7),
        (libc::SIGUSR2, "USR2", 8),
    ] {
        let script = format!(
            "trap 'echo got {name}; exit {code}' {name}; echo ready; \
             while :; do sleep 0.02; done"
        );
        let mut child = Command::new(heapdump())
            .args(["run", "--", "sh", "-c", &script])
            .env("HEAPDUMP_DIR", &dir)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        assert_eq!(lines.next().unwrap().unwrap(), "ready");
        // SAFETY: signalling the heapdump process we started (not its process group).
        assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
        let got = wait_exit(
            &mut child,
            std::time::Duration::from_secs(10),
            &format!("heapdump run after SIG{name}"),
        );
        assert_eq!(
            lines.next().map(|l| l.unwrap()),
            Some(format!("got {name}")),
            "SIG{name} reached the command"
        );
        assert_eq!(got, code, "heapdump run exits with the command's status");
    }
    // The command killed by a signal: 128 + signal. No orphan is left: the command's exit
    // is what ends `heapdump run`.
    let mut child = Command::new(heapdump())
        .args(["run", "--", "sh", "-c", "echo ready; exec sleep 30"])
        .env("HEAPDUMP_DIR", &dir)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let got = wait_exit(
        &mut child,
        std::time::Duration::from_secs(10),
        "heapdump run after SIGTERM",
    );
    assert_eq!(got, 128 + libc::SIGTERM);
    assert!(
        lines.next().is_none(),
        "stdout closed: the command (sleep) is gone too"
    );

    // Start-up failures, as a shell reports them.
    let not_exec = dir.with_extension("not-executable");
    std::fs::write(&not_exec, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&not_exec, std::fs::Permissions::from_mode(0o644)).unwrap();
    for (cmd, code, msg) in [
        ("no-such-command-heapdump-test", 127, "command not found"),
        (
            "/nonexistent/heapdump-test",
            127,
            "No such file or directory",
        ),
        (not_exec.to_str().unwrap(), 126, "Permission denied"),
        ("/", 126, "Is a directory"),
    ] {
        let t = heapdump_timeout(
            &dir,
            &["run", "--", cmd],
            std::time::Duration::from_secs(10),
        );
        assert_eq!(t.code, Some(code), "{cmd}: {}", t.stderr);
        assert!(
            t.stderr.contains(&format!("{cmd}: {msg}")),
            "{cmd}: {}",
            t.stderr
        );
    }
    let _ = std::fs::remove_file(&not_exec);
}

/// C4: a collector stopped (SIGSTOP) while holding the region's lock makes the next one wait
/// at most --lock-timeout, then fail naming the stopped process.
#[test]
fn stopped_collector_lock_times_out_and_is_named() {
    use std::os::unix::process::CommandExt;
    let exe = compile_c("known_allocs", &[]);
    let dir = region_dir("lock");
    let r = start(Command::new(&exe), &dir, true);
    let pid = r.pid().to_string();
    let out = dir.with_extension("lock.pb.gz");
    let mut a = Command::new(heapdump())
        .args(["snapshot", "--by-pid", &pid, "-o", out.to_str().unwrap()])
        .env("HEAPDUMP_DIR", &dir)
        .env("HEAPDUMP_TEST_PAUSE_MS", "60000")
        .process_group(0)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_lock(a.id());
    // SAFETY: stopping the collector we started.
    unsafe { libc::kill(a.id() as i32, libc::SIGSTOP) };
    let t = heapdump_timeout(
        &dir,
        &[
            "snapshot",
            "--by-pid",
            &pid,
            "-o",
            out.to_str().unwrap(),
            "--lock-timeout",
            "1",
        ],
        std::time::Duration::from_secs(30),
    );
    // SAFETY: ending the collector we started.
    unsafe { libc::kill(a.id() as i32, libc::SIGKILL) };
    let _ = a.wait();
    assert!(!t.timed_out, "the second snapshot hung: {t:?}");
    assert_eq!(t.code, Some(1), "{t:?}");
    assert!(
        t.elapsed < std::time::Duration::from_secs(5),
        "waited {:?} with --lock-timeout 1",
        t.elapsed
    );
    assert!(
        t.stderr.contains(&format!("held by pid {}", a.id())) && t.stderr.contains("stopped"),
        "{}",
        t.stderr
    );
    // The lock dies with its holder: the next snapshot is exact.
    let raw = pprof_raw(&snapshot(&dir, r.pid(), &[]));
    assert_eq!(raw.total()[2], 1110);
    assert_eq!(r.finish(), 0);
}

/// Makes a FIFO at `path` with `mode`.
fn mkfifo(path: &std::path::Path, mode: u32) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), mode) }, 0, "mkfifo");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// C2: the collector checks the region directory's owner and mode, and a FIFO planted in the
/// directory, passed as --region or named as a module path never makes `list`, `gc` or
/// `snapshot` hang.
#[test]
fn fifos_and_untrusted_directories_never_hang_the_collector() {
    let limit = std::time::Duration::from_secs(20);
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    // A FIFO its owner cannot write: opening it for reading only waits for a writer. As root
    // (who may open anything read-write), the collector runs as `nobody` to meet that case.
    let dir = region_dir("fifo");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let fifo = dir.join("999999-1-1.heapdump");
    mkfifo(&fifo, 0o400);
    if root {
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        std::os::unix::fs::chown(&fifo, Some(65534), Some(65534)).unwrap();
    }
    let collector = |args: &[&str]| {
        let mut c = if root {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(heapdump());
            c
        } else {
            Command::new(heapdump())
        };
        c.args(args).env("HEAPDUMP_DIR", &dir);
        run_timeout(&mut c, limit)
    };
    let t = collector(&["list", "--json"]);
    assert!(!t.timed_out, "list hung on a FIFO in the region directory");
    assert_eq!(t.code, Some(0), "{t:?}");
    assert!(t.stdout.contains("a FIFO"), "{}", t.stdout);
    let never = std::env::temp_dir().join("heapdump-never.pb.gz");
    for args in [
        vec![
            "snapshot",
            "--by-pid",
            "999999",
            "-o",
            never.to_str().unwrap(),
        ],
        vec![
            "snapshot",
            "--region",
            fifo.to_str().unwrap(),
            "-o",
            never.to_str().unwrap(),
        ],
    ] {
        let t = collector(&args);
        assert!(!t.timed_out, "{args:?} hung on a FIFO");
        assert_eq!(t.code, Some(1), "{args:?}: {t:?}");
        assert!(t.stderr.contains("not a regular file"), "{}", t.stderr);
    }
    let t = collector(&["gc"]);
    assert!(!t.timed_out, "gc hung on a FIFO");
    assert_eq!(t.code, Some(0), "{t:?}");
    assert!(!fifo.exists(), "gc removes what cannot be read as a region");
    assert!(!never.exists());

    let _ = std::fs::remove_dir_all(&dir);

    // A region directory others may write to, or in a directory others may write to, is
    // refused by every command that reads it. Here the region directory is shared (mode 777)
    // so the collector looks in its `heapdump-UID` subdirectory, as the shim would, and
    // someone else made that first.
    let shared = region_dir("shared");
    // SAFETY: getuid has no preconditions.
    let sub = shared.join(format!("heapdump-{}", unsafe { libc::getuid() }));
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    for (mode, msg) in [
        (0o777, "writable by other users (mode 777)"),
        (0o700, "which other users may write to"),
    ] {
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(mode)).unwrap();
        for args in [
            vec!["list"],
            vec!["gc", "--dry-run"],
            vec!["snapshot", "--by-pid", "1", "-o", never.to_str().unwrap()],
        ] {
            let t = heapdump_timeout(&shared, &args, limit);
            assert_eq!(t.code, Some(1), "{args:?}: {t:?}");
            assert!(t.stderr.contains(msg), "{args:?}: {}", t.stderr);
        }
    }
    let _ = std::fs::remove_dir_all(&shared);

    // A module path that became a FIFO: the snapshot warns and leaves it unsymbolized.
    let dir = region_dir("fifo-module");
    let exe_dir = dir.with_extension("bin");
    std::fs::create_dir_all(&exe_dir).unwrap();
    let exe = exe_dir.join("known_allocs_fifo");
    std::fs::copy(compile_c("known_allocs", &[]), &exe).unwrap();
    let mut cmd = Command::new(&exe);
    cmd.arg("leak").env("HEAPDUMP_KEEP", "1");
    let r = start(cmd, &dir, true);
    let pid = r.pid().to_string();
    assert_eq!(r.finish(), 0);
    std::fs::remove_file(&exe).unwrap();
    mkfifo(&exe, 0o600);
    let out = dir.with_extension("fifo.pb.gz");
    let t = heapdump_timeout(
        &dir,
        &["snapshot", "--by-pid", &pid, "-o", out.to_str().unwrap()],
        limit,
    );
    assert!(
        !t.timed_out,
        "snapshot hung on a module path that is a FIFO"
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    assert!(
        t.stderr
            .contains(&format!("module {} is a FIFO", exe.display())),
        "{}",
        t.stderr
    );
    assert_eq!(pprof_raw(&out).total()[2], 1110);
    let _ = std::fs::remove_dir_all(&exe_dir);
}

/// A u64 of the region header at `offset` (layout v1: `lease` at 128, `node_cursor` at 192).
fn header_u64(region: &std::path::Path, offset: u64) -> u64 {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 8];
    std::fs::File::open(region)
        .unwrap()
        .read_exact_at(&mut b, offset)
        .unwrap();
    u64::from_ne_bytes(b)
}

/// Starts `heapdump snapshot --by-pid PID` paused inside its scan (holding lock and lease) and
/// returns it once the lease is set.
fn paused_collector(
    dir: &std::path::Path,
    pid: u32,
    region: &std::path::Path,
) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let out = dir.with_extension("paused.pb.gz");
    let mut cmd = Command::new(heapdump());
    cmd.args([
        "snapshot",
        "--by-pid",
        &pid.to_string(),
        "-o",
        out.to_str().unwrap(),
    ])
    .env("HEAPDUMP_DIR", dir)
    .env("HEAPDUMP_TEST_PAUSE_MS", "60000")
    .process_group(0)
    .stderr(Stdio::null());
    // The collector leaves a signal the test runner ignores ignored (under `nohup`, SIGHUP;
    // in a background job without job control, SIGINT): give it the default dispositions a
    // user's shell gives it, which is what the test is about.
    // SAFETY: `signal` is async-signal-safe, as required between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    let c = cmd.spawn().unwrap();
    wait_for_lock(c.id());
    let t0 = std::time::Instant::now();
    while header_u64(region, 128) == 0 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "no lease taken"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    c
}

/// B1: a lease does not outlive its collector. SIGTERM (and SIGINT, SIGHUP) make the
/// collector clear it before dying; after a SIGKILL the writers find the holder dead and
/// clear it themselves, so the allocations table of a churning program stops growing at once
/// instead of for 30 s, and the next snapshot is exact.
#[test]
fn lease_does_not_outlive_a_killed_collector() {
    // SIGTERM: an idle target (no allocation after "ready") never checks the lease, so only
    // the collector's handler can have cleared it.
    let exe = compile_c("known_allocs", &[]);
    let dir = region_dir("lease-term");
    let r = start(Command::new(&exe), &dir, true);
    let region = region_file(&dir);
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        let mut c = paused_collector(&dir, r.pid(), &region);
        // SAFETY: signalling the collector we started.
        unsafe { libc::kill(c.id() as i32, sig) };
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(c.wait().unwrap().signal(), Some(sig), "dies of the signal");
        assert_eq!(
            header_u64(&region, 128),
            0,
            "lease released on signal {sig}"
        );
    }
    // SIGKILL cannot be caught: the lease stays while nobody allocates.
    let mut c = paused_collector(&dir, r.pid(), &region);
    let _ = c.kill();
    let _ = c.wait();
    assert_ne!(
        header_u64(&region, 128),
        0,
        "a SIGKILLed collector leaves its lease"
    );
    assert_eq!(r.finish(), 0);

    // SIGKILL under churn: 2 threads replacing 20,000 blocks each at full speed.
    let (n, k) = (2i64, 20_000i64);
    let exe = compile_c("churn", &[]);
    let dir = region_dir("lease-kill");
    let mut cmd = Command::new(&exe);
    cmd.args([n.to_string(), k.to_string(), CHURN_SIZE.to_string()]);
    let r = start(cmd, &dir, true);
    let region = region_file(&dir);
    let mut c = paused_collector(&dir, r.pid(), &region);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let _ = c.kill();
    let _ = c.wait();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let c0 = header_u64(&region, 192);
    std::thread::sleep(std::time::Duration::from_secs(3));
    let c1 = header_u64(&region, 192);
    assert!(
        c1 - c0 < 100_000,
        "the allocations table grew from {c0} to {c1} records in 3 s after the collector was killed"
    );
    assert_eq!(
        header_u64(&region, 128),
        0,
        "the dead collector's lease was cleared"
    );
    let p = decode(&snapshot(&dir, r.pid(), &[]));
    let count = sum_through(&p, "churn_alloc")[2];
    assert!(
        count >= n * k && count <= n * k + n,
        "{count} live blocks from churn_alloc after the kill, outside [{}, {}]",
        n * k,
        n * k + n
    );
    assert_eq!(r.finish(), 0);
}

/// (offset, capacity) of section `kind` of a v1 region file.
fn section_of(region: &std::path::Path, kind: u32) -> (u64, u64) {
    for i in 0..8u64 {
        let at = 384 + 32 * i;
        let k = header_u64(region, at) as u32;
        if k == kind {
            return (header_u64(region, at + 8), header_u64(region, at + 16));
        }
    }
    panic!("no section {kind} in {}", region.display());
}

/// Writes a u64 into a region file at `offset`.
fn poke_u64(region: &std::path::Path, offset: u64, v: u64) {
    use std::os::unix::fs::FileExt;
    std::fs::OpenOptions::new()
        .write(true)
        .open(region)
        .unwrap()
        .write_all_at(&v.to_ne_bytes(), offset)
        .unwrap();
}

/// A region directory on tmpfs (/dev/shm), where reading a hole through a mapping allocates.
fn shm_dir(name: &str) -> Option<std::path::PathBuf> {
    let d = std::path::Path::new("/dev/shm")
        .join(format!("heapdump-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir(&d).ok()?;
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    Some(d)
}

/// C3: a crafted or changing region costs the collector nothing it cannot hold: counts at
/// u64::MAX commit no memory of the file system (reading the holes of a sparse tmpfs file
/// through a mapping would), every thread slot busy costs one bounded wait, and a region
/// truncated during the snapshot is an error, not a SIGBUS.
#[test]
fn crafted_and_truncated_regions_are_bounded() {
    let limit = std::time::Duration::from_secs(60);
    let Some(dir) = shm_dir("crafted") else {
        skip_note("skipped: cannot create a directory in /dev/shm (the test needs tmpfs)");
        return;
    };
    /// Removes the test's files from RAM-backed /dev/shm, also when the test fails.
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
            let _ = std::fs::remove_file(self.0.with_extension("crafted.pb.gz"));
        }
    }
    let _cleanup = Cleanup(dir.clone());
    let exe = compile_c("known_allocs", &[]);

    // Counts at u64::MAX in an exited process's region (default capacities: 64 M records).
    let mut cmd = Command::new(&exe);
    cmd.arg("leak").env("HEAPDUMP_KEEP", "1");
    let r = start(cmd, &dir, true);
    let pid = r.pid().to_string();
    assert_eq!(r.finish(), 0);
    let region = region_file(&dir);
    for off in [192u64, 256, 264, 320, 328] {
        // node_cursor, stack_count, frame_cursor, thread_count, module_count
        poke_u64(&region, off, u64::MAX);
    }
    let blocks = || std::fs::metadata(&region).unwrap().blocks() * 512;
    let before = blocks();
    let out = dir.with_extension("crafted.pb.gz");
    let t = heapdump_timeout(
        &dir,
        &["snapshot", "--by-pid", &pid, "-o", out.to_str().unwrap()],
        limit,
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    let grown = blocks() - before;
    assert!(
        grown < 1 << 20,
        "the snapshot committed {grown} bytes of tmpfs reading a region of {before} bytes"
    );
    assert_eq!(
        pprof_raw(&out).total()[2],
        1110,
        "the real blocks still read"
    );
    let t = heapdump_timeout(&dir, &["list", "--json"], limit);
    assert_eq!(t.code, Some(0), "{t:?}");
    assert!(blocks() - before < 1 << 20, "list committed tmpfs");
    std::fs::remove_file(&region).unwrap();

    // Every thread slot of a live process inside an operation (odd op_seq).
    let r = start(Command::new(&exe), &dir, true);
    let pid = r.pid().to_string();
    let region = region_file(&dir);
    let (threads_at, threads) = section_of(&region, 5);
    for i in 0..threads {
        poke_u64(&region, threads_at + i * 128, 1);
    }
    poke_u64(&region, 320, threads);
    let t = heapdump_timeout(
        &dir,
        &["snapshot", "--by-pid", &pid, "-o", out.to_str().unwrap()],
        limit,
    );
    assert!(!t.timed_out, "the snapshot waited on {threads} busy slots");
    assert_eq!(t.code, Some(0), "{t:?}");
    assert!(
        t.elapsed < std::time::Duration::from_secs(5),
        "{threads} busy slots took {:?}",
        t.elapsed
    );
    assert!(
        t.stderr
            .contains(&format!("{threads} thread(s) stayed inside the allocator")),
        "{}",
        t.stderr
    );
    drop(r); // killed: its region is not usable any more
    std::fs::remove_file(&region).unwrap();

    // Truncated while the snapshot reads it (paused at its first live block).
    let mut cmd = Command::new(&exe);
    cmd.arg("leak").env("HEAPDUMP_KEEP", "1");
    let r = start(cmd, &dir, true);
    let pid = r.pid().to_string();
    assert_eq!(r.finish(), 0);
    let region = region_file(&dir);
    let (nodes_at, _) = section_of(&region, 1);
    let pause = Handshake::new("HEAPDUMP_TEST_PAUSE_FILE", &dir);
    let (k, v) = pause.env();
    let c = Command::new(heapdump())
        .args(["snapshot", "--by-pid", &pid, "-o", out.to_str().unwrap()])
        .env("HEAPDUMP_DIR", &dir)
        .env(k, v)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    pause.reached();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&region)
        .unwrap()
        .set_len(nodes_at + 4096)
        .unwrap();
    pause.release();
    let o = c.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        o.status.signal(),
        None,
        "the collector died: {:?} {err}",
        o.status
    );
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("truncated while being read"), "{err}");
}

/// Helper R, 4: `$!` after `heapdump run -- PROG &` is the wrapper's pid. `snapshot` of it says
/// so and names the program's pid (before: "not instrumented … heapdump attach"), and `attach`
/// refuses it (before: it attached to `heapdump run` itself and profiled the wrapper).
#[test]
fn the_run_wrapper_is_named_not_attached() {
    let exe = compile_c("hold_for", &[]);
    let dir = region_dir("run-wrapper");
    std::fs::create_dir_all(&dir).unwrap();
    let mut w = Command::new(heapdump())
        .args(["run", "--"])
        .arg(&exe)
        .arg("20")
        .env("HEAPDUMP_DIR", &dir)
        .spawn()
        .unwrap();
    let pid = w.id();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let child: u32 = loop {
        let c =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(c) = c.split_whitespace().next() {
            break c.parse().unwrap();
        }
        assert!(std::time::Instant::now() < deadline, "no child");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let out = dir.join("s.pb.gz");
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &[
            "snapshot",
            "--by-pid",
            &pid.to_string(),
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert!(
        !ok && err.contains("is `heapdump run` itself")
            && err.contains(&format!("pid {child}"))
            && !err.contains("heapdump attach --by-pid"),
        "{err}"
    );
    let (ok, _, err) = heapdump_cmd(&dir, &["attach", "--by-pid", &pid.to_string()]);
    assert!(!ok && err.contains("is `heapdump run` itself"), "{err}");
    // SAFETY: our own child's child, by pid.
    unsafe { libc::kill(child as i32, libc::SIGTERM) };
    let _ = w.wait();
}

/// Helper X, 2: with `LD_AUDIT` set the shim's thread-local word is not in the static TLS
/// block, and every program died of a recursion in its first allocation (SIGSEGV, exit 139).
/// `heapdump run` refuses to start the command then, in one line that says what to do.
#[test]
fn run_refuses_an_audit_library() {
    let dir = region_dir("run-audit");
    let out = Command::new(heapdump())
        .args(["run", "--", "true"])
        .env("HEAPDUMP_DIR", &dir)
        .env("LD_AUDIT", "/nonexistent/audit.so")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("LD_AUDIT is set")
            && err.contains("unset LD_AUDIT")
            && err.lines().filter(|l| l.starts_with("heapdump:")).count() == 1,
        "{err}"
    );
}
