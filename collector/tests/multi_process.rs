//! `heapdump snapshot --multi-process`: a process tree started by `heapdump run -- sh -c …`
//! (three `hold_sized` programs holding known blocks, and the shell), snapshotted into one
//! profile; per-process counts checked exactly through the `pid` labels, and against single
//! snapshots of each process.

mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::process::{Command, Stdio};

/// (blocks, bytes) each `hold_sized N SIZE` holds through `hold_blocks`: N blocks of SIZE
/// bytes and the array of N pointers that holds them.
fn held(n: i64, size: i64) -> (i64, i64) {
    (n + 1, n * size + n * 8)
}

/// The three programs: (N, SIZE).
const PROGRAMS: [(i64, i64); 3] = [(100, 1000), (200, 3000), (300, 5000)];

/// `heapdump run -- sh -c '…'` starting the three programs in the background (their stdin is
/// the test's pipe, so they all end when it closes); returns the run and pid -> (N, SIZE).
fn start_tree(dir: &Path) -> (Running, BTreeMap<u32, (i64, i64)>) {
    let exe = compile_c("hold_sized", &[]);
    let exe = exe.to_str().unwrap();
    // "exec 3<&0; P 100 1000 <&3 & P 200 3000 <&3 & P 300 5000 <&3 & wait": a background
    // command's stdin would be /dev/null without the explicit redirection.
    let script = format!(
        "exec 3<&0; {} wait",
        PROGRAMS
            .iter()
            .map(|(n, s)| format!("{exe} {n} {s} <&3 &"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut cmd = Command::new(heapdump());
    cmd.arg("run")
        .arg("--lib")
        .arg(shim())
        .args(["--", "sh", "-c", &script]);
    let mut r = start(cmd, dir, false);
    let mut lines = vec![r.ready.clone()];
    for _ in 1..PROGRAMS.len() {
        lines.push(r.wait_line("ready"));
    }
    let mut pids = BTreeMap::new();
    for w in lines {
        let pid: u32 = w[0].parse().unwrap();
        let n: i64 = w[1].parse().unwrap();
        let size = PROGRAMS.iter().find(|p| p.0 == n).unwrap().1;
        assert_eq!(w[2].parse::<i64>().unwrap(), n * size);
        pids.insert(pid, (n, size));
    }
    (r, pids)
}

/// Per `pid` label: (process_name, [alloc_objects, alloc_space, inuse_objects, inuse_space]
/// of all its samples, the same through `hold_blocks`).
fn per_process(p: &heapdump_proto::Profile) -> BTreeMap<u32, (String, [i64; 4], [i64; 4])> {
    let s = |i: i64| p.string_table[i as usize].as_str();
    let through = locations_of(p, "hold_blocks");
    let mut out: BTreeMap<u32, (String, [i64; 4], [i64; 4])> = BTreeMap::new();
    for x in &p.sample {
        let label = |k: &str| {
            let l: Vec<&str> = x
                .label
                .iter()
                .filter(|l| s(l.key) == k)
                .map(|l| s(l.str))
                .collect();
            assert_eq!(l.len(), 1, "sample without one string label {k}: {x:?}");
            l[0].to_owned()
        };
        let pid: u32 = label("pid").parse().unwrap();
        let e = out
            .entry(pid)
            .or_insert_with(|| (label("process_name"), [0; 4], [0; 4]));
        assert_eq!(e.0, label("process_name"), "pid {pid} named twice");
        let hit = x.location_id.iter().any(|l| through.contains(l));
        for i in 0..4 {
            e.1[i] += x.value[i];
            if hit {
                e.2[i] += x.value[i];
            }
        }
    }
    out
}

/// Each process keeps locations and mappings of its own: no location or mapping is used by
/// samples of two processes, and there are `n` executable mappings of `hold_sized`.
fn processes_kept_apart(p: &heapdump_proto::Profile, n: usize) {
    let s = |i: i64| p.string_table[i as usize].as_str();
    let mut owner: HashMap<u64, &str> = HashMap::new();
    for x in &p.sample {
        let pid = s(x.label.iter().find(|l| s(l.key) == "pid").unwrap().str);
        for l in &x.location_id {
            if let Some(o) = owner.insert(*l, pid) {
                assert_eq!(o, pid, "location {l} in two processes");
            }
        }
    }
    let mapping_of: HashMap<u64, u64> = p.location.iter().map(|l| (l.id, l.mapping_id)).collect();
    let mut mapping_owner: HashMap<u64, &str> = HashMap::new();
    for (l, pid) in &owner {
        let m = mapping_of[l];
        if m != 0 {
            if let Some(o) = mapping_owner.insert(m, pid) {
                assert_eq!(o, *pid, "mapping {m} in two processes");
            }
        }
    }
    let exe_mappings = p
        .mapping
        .iter()
        .filter(|m| s(m.filename).ends_with("/hold_sized"))
        .count();
    assert_eq!(exe_mappings, n, "one executable mapping per process");
}

/// The parent pid of `pid` (/proc/PID/stat field 4).
fn ppid(pid: u32) -> u32 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &s[s.rfind(')').unwrap() + 1..];
    rest.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn multi(dir: &Path, out: &Path, extra: &[&str]) -> Timed {
    let mut args = vec!["snapshot", "--multi-process", "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    heapdump_timeout(dir, &args, std::time::Duration::from_secs(60))
}

#[test]
fn multi_process_snapshot_of_a_process_tree() {
    let dir = region_dir("multi");
    let (r, programs) = start_tree(&dir);
    let run_pid = r.child.id();

    // --by-name: exactly the three programs, each with its own exact counts.
    let by_name = dir.with_extension("byname.pb.gz");
    let t = multi(&dir, &by_name, &["--by-name", "hold_sized"]);
    assert_eq!(t.code, Some(0), "{t:?}");
    let p = decode(&by_name);
    let procs = per_process(&p);
    assert_eq!(
        procs.keys().copied().collect::<Vec<_>>(),
        programs.keys().copied().collect::<Vec<_>>()
    );
    for (pid, (n, size)) in &programs {
        let (name, _, through) = &procs[pid];
        assert_eq!(name, "hold_sized");
        let (blocks, bytes) = held(*n, *size);
        // [alloc_objects, alloc_space, inuse_objects, inuse_space]: nothing was freed.
        assert_eq!(*through, [blocks, bytes, blocks, bytes], "pid {pid}");
    }
    processes_kept_apart(&p, 3);

    // --with-tags: one sample per block, each labelled with its process too.
    let tagged = dir.with_extension("tags.pb.gz");
    let t = multi(&dir, &tagged, &["--by-name", "hold_sized", "--with-tags"]);
    assert_eq!(t.code, Some(0), "{t:?}");
    let tp = decode(&tagged);
    let tprocs = per_process(&tp);
    processes_kept_apart(&tp, 3);
    let ts = |i: i64| tp.string_table[i as usize].as_str();
    for (pid, (n, size)) in &programs {
        let (blocks, bytes) = held(*n, *size);
        assert_eq!(
            tprocs[pid].2,
            [blocks, bytes, blocks, bytes],
            "tags: pid {pid}"
        );
        // Per-block samples of this process: one per live block, distinct addresses.
        let mut addresses: Vec<i64> = tp
            .sample
            .iter()
            .filter(|x| x.value[2] == 1)
            .filter(|x| {
                x.label
                    .iter()
                    .any(|l| ts(l.key) == "pid" && ts(l.str) == pid.to_string())
            })
            .map(|x| x.label.iter().find(|l| ts(l.key) == "address").unwrap().num)
            .collect();
        let live = procs[pid].1[2];
        assert_eq!(addresses.len() as i64, live, "tags: pid {pid}");
        addresses.sort_unstable();
        addresses.dedup();
        assert_eq!(
            addresses.len() as i64,
            live,
            "tags: pid {pid}: an address twice"
        );
    }

    // The same as a single snapshot of each process (they are idle).
    for (pid, (_, total, _)) in &procs {
        let single = decode(&snapshot(&dir, *pid, &[]));
        let mut want = [0i64; 4];
        for x in &single.sample {
            for (w, v) in want.iter_mut().zip(&x.value) {
                *w += v;
            }
        }
        assert_eq!(*total, want, "pid {pid}: multi-process vs single snapshot");
    }

    // --tree PID: the run's descendants (the shell and the three programs; `heapdump run`
    // itself is not instrumented). Without a filter: every process, here the same four.
    for (what, extra) in [
        ("tree", vec!["--tree".to_owned(), run_pid.to_string()]),
        ("all", vec![]),
    ] {
        let out = dir.with_extension(format!("{what}.pb.gz"));
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let t = multi(&dir, &out, &extra);
        assert_eq!(t.code, Some(0), "{what}: {t:?}");
        let procs = per_process(&decode(&out));
        let shells: Vec<u32> = procs
            .iter()
            .filter(|(_, (name, _, _))| name == "sh")
            .map(|(pid, _)| *pid)
            .collect();
        assert_eq!(shells.len(), 1, "{what}: {procs:?}");
        assert_eq!(
            ppid(shells[0]),
            run_pid,
            "{what}: the shell is the run's child"
        );
        let mut want: BTreeSet<u32> = programs.keys().copied().collect();
        want.insert(shells[0]);
        assert_eq!(
            procs.keys().copied().collect::<BTreeSet<_>>(),
            want,
            "{what}"
        );
        for (pid, (n, size)) in &programs {
            let (blocks, bytes) = held(*n, *size);
            assert_eq!(
                procs[pid].2,
                [blocks, bytes, blocks, bytes],
                "{what}: pid {pid}"
            );
        }
        // One summary line per process, then the total.
        let summaries = t
            .stderr
            .lines()
            .filter(|l| l.starts_with("heapdump: pid "))
            .count();
        assert_eq!(summaries, 4, "{what}: {}", t.stderr);
        assert!(
            t.stderr.contains("heapdump: 4 processes: "),
            "{what}: {}",
            t.stderr
        );
    }
    // A tree holding no instrumented process: an error, not an empty profile.
    let t = multi(
        &dir,
        &dir.with_extension("none.pb.gz"),
        &[
            "--tree",
            &std::process::id().to_string(),
            "--by-name",
            "nosuch",
        ],
    );
    assert_eq!(t.code, Some(1), "{t:?}");
    assert!(
        t.stderr
            .contains("no running instrumented process named nosuch"),
        "{}",
        t.stderr
    );

    // The reference reader separates the processes with -tagroot process_name,pid.
    pprof_tagroot_shows_processes(&by_name, &programs);
    assert_eq!(r.finish(), 0);
}

/// `go tool pprof -tagroot process_name,pid -top` of `profile`: one node per pid, whose
/// cumulative bytes are that process's, and one `hold_sized` node holding them all.
fn pprof_tagroot_shows_processes(profile: &Path, programs: &BTreeMap<u32, (i64, i64)>) {
    let out = match Command::new("go")
        .args([
            "tool",
            "pprof",
            "-tagroot",
            "process_name,pid",
            "-top",
            "-nodefraction=0",
            "-nodecount=100000",
            "-unit=B",
        ])
        .arg(profile)
        .stderr(Stdio::piped())
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            skip_note(&format!(
                "skipped: go tool pprof -tagroot check (go is not installed: {e})"
            ));
            return;
        }
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // "      flat  flat%   sum%        cum   cum%  NAME"
    let cum: HashMap<String, i64> = text
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 6 && w[3].ends_with('B'))
                .then(|| (w[5].to_owned(), w[3].trim_end_matches('B').parse().ok()))
                .and_then(|(k, v)| Some((k, v?)))
        })
        .collect();
    let mut all = 0;
    for (pid, (n, size)) in programs {
        let bytes = held(*n, *size).1;
        assert_eq!(
            cum.get(&pid.to_string()),
            Some(&bytes),
            "pid {pid} in:\n{text}"
        );
        all += bytes;
    }
    assert_eq!(cum.get("hold_sized"), Some(&all), "{text}");
}

/// A process whose snapshot fails (its region's lock is held by another collector past
/// --lock-timeout) is reported in one line and left out; the others are in the profile. When
/// none succeeds, the command fails.
#[test]
fn multi_process_skips_a_process_whose_snapshot_fails() {
    use std::os::unix::process::CommandExt;
    let dir = region_dir("multi-skip");
    let (r, programs) = start_tree(&dir);
    let busy = *programs.keys().next().unwrap();
    let held_out = dir.with_extension("held.pb.gz");
    let mut holder = Command::new(heapdump())
        .args(["snapshot", "--by-pid", &busy.to_string(), "-o"])
        .arg(&held_out)
        .env("HEAPDUMP_DIR", &dir)
        .env("HEAPDUMP_TEST_PAUSE_MS", "60000")
        .process_group(0)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_lock(holder.id());

    let out = dir.with_extension("skip.pb.gz");
    let t = multi(
        &dir,
        &out,
        &["--by-name", "hold_sized", "--lock-timeout", "0.3"],
    );
    let alone = multi(
        &dir,
        &dir.with_extension("alone.pb.gz"),
        &["--tree", &busy.to_string(), "--lock-timeout", "0.3"],
    );
    // SAFETY: ending the collector this test started.
    unsafe { libc::kill(holder.id() as i32, libc::SIGKILL) };
    let _ = holder.wait();

    assert_eq!(t.code, Some(0), "{t:?}");
    let skipped: Vec<&str> = t.stderr.lines().filter(|l| l.contains("skipped")).collect();
    assert_eq!(skipped.len(), 2, "{}", t.stderr); // the line, and the total's "(1 skipped)"
    assert!(
        skipped[0].starts_with(&format!("heapdump: pid {busy} (hold_sized): skipped: ")),
        "{}",
        t.stderr
    );
    assert!(
        skipped[1].contains("2 processes (1 skipped)"),
        "{}",
        t.stderr
    );
    let procs = per_process(&decode(&out));
    let want: Vec<u32> = programs.keys().copied().filter(|&p| p != busy).collect();
    assert_eq!(procs.keys().copied().collect::<Vec<_>>(), want);
    for pid in want {
        let (n, size) = programs[&pid];
        let (blocks, bytes) = held(n, size);
        assert_eq!(procs[&pid].2, [blocks, bytes, blocks, bytes], "pid {pid}");
    }

    // Only the busy process selected: nothing succeeded, so the command fails.
    assert_eq!(alone.code, Some(1), "{alone:?}");
    assert!(
        alone
            .stderr
            .contains(&format!("pid {busy} (hold_sized): skipped: "))
            && alone
                .stderr
                .contains("none of the 1 selected processes could be snapshotted"),
        "{}",
        alone.stderr
    );
    assert_eq!(r.finish(), 0);
}

/// A process that is gone by its turn (killed while the collector snapshots another one) is
/// reported in one line and left out; the others are in the profile.
#[test]
fn multi_process_skips_a_process_that_vanishes() {
    let dir = region_dir("multi-vanish");
    let (r, programs) = start_tree(&dir);
    let pids: Vec<u32> = programs.keys().copied().collect();
    let (first, last) = (pids[0], pids[2]);
    let out = dir.with_extension("vanish.pb.gz");
    // Each process's snapshot pauses 1 s (at its first block, holding its lock): the last
    // process is killed while the first one's snapshot is paused.
    let collector = Command::new(heapdump())
        .args([
            "snapshot",
            "--multi-process",
            "--by-name",
            "hold_sized",
            "-o",
        ])
        .arg(&out)
        .env("HEAPDUMP_DIR", &dir)
        .env("HEAPDUMP_TEST_PAUSE_MS", "1000")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_lock(collector.id());
    // SAFETY: killing a program this test started (through `heapdump run` and sh).
    unsafe { libc::kill(last as i32, libc::SIGKILL) };
    let done = collector.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success(), "{stderr}");
    let skipped: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(": skipped: "))
        .collect();
    assert_eq!(
        skipped,
        [format!(
            "heapdump: pid {last} (hold_sized): skipped: exited before its snapshot"
        )],
        "{stderr}"
    );
    let procs = per_process(&decode(&out));
    assert_eq!(procs.keys().copied().collect::<Vec<_>>(), [first, pids[1]]);
    for pid in [first, pids[1]] {
        let (n, size) = programs[&pid];
        let (blocks, bytes) = held(n, size);
        assert_eq!(procs[&pid].2, [blocks, bytes, blocks, bytes], "pid {pid}");
    }
    assert_eq!(r.finish(), 0);
}
