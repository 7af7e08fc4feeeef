//! Regions that cannot be true (issue 19, B4–B6): records with impossible sizes and addresses,
//! overlapping blocks, and a region rewritten while it is read. Every command must end within
//! a bound, skip what cannot be true, say so on stderr and in the profile's comments, and exit
//! with the damaged-region status (3) — never wrap a total, allocate gigabytes, panic or hang.

mod common;

use common::crafted::*;
use common::*;
use std::path::Path;
use std::time::Duration;

/// Exit status of a command that wrote its output from a damaged region.
const DAMAGED: i32 = 3;
/// Longest any command may take against a crafted region (they take well under a second; the
/// unfixed collector took over 15 s or never ended).
const LIMIT: Duration = Duration::from_secs(60);

/// Runs `heapdump ARGS` against a crafted region and checks it ends within [`LIMIT`] with
/// the damaged status, saying `expect` on stderr; returns the stderr.
fn damaged(dir: &Path, args: &[&str], expect: &str) -> String {
    let t = heapdump_timeout(dir, args, LIMIT);
    assert!(!t.timed_out, "{args:?} did not end within {LIMIT:?}");
    assert_eq!(t.code, Some(DAMAGED), "{args:?}: {t:?}");
    assert!(
        t.stderr.contains(expect),
        "{args:?}: no {expect:?} in {}",
        t.stderr
    );
    t.stderr
}

/// The comments of a profile that say it was read from a damaged region.
fn damage_comments(profile: &Path) -> Vec<String> {
    pprof_raw(profile)
        .comments
        .into_iter()
        .filter(|c| c.contains("region damaged"))
        .collect()
}

/// B4, B5: sizes of u64::MAX, 2^63 and 1 TiB (more than the process has mapped) and a block
/// at 0xfffffffffffffff8 in a live process's region: the four records are skipped and
/// counted, the other 1,998 blocks are exact, no
/// total wraps, `--contents-dir` writes the valid blocks only, and `leaks`, `top` and `graph`
/// end at once — all with exit status 3.
#[test]
fn impossible_sizes_and_addresses_are_skipped_and_reported() {
    let dir = region_dir("damaged-sizes");
    let r = hold_sized(&dir, 2002, 64);
    let pid = r.pid().to_string();
    let region = region_file(&dir);
    let nodes: Vec<Node> = live_nodes(&region)
        .into_iter()
        .filter(|n| n.size == 64)
        .collect();
    assert_eq!(nodes.len(), 2002);
    nodes[0].set_size(&region, u64::MAX);
    nodes[1].set_size(&region, 1 << 63);
    nodes[2].set_address(&region, 0xffff_ffff_ffff_fff8);
    // Inside the address space, but larger than all the process has mapped.
    nodes[3].set_size(&region, 1 << 40);

    let out = dir.join("sizes.pb.gz");
    let err = damaged(
        &dir,
        &["snapshot", "--by-pid", &pid, "-o", out.to_str().unwrap()],
        "region damaged: 4 of ",
    );
    assert!(
        err.contains("4 outside the user address space or of impossible size"),
        "{err}"
    );
    let raw = pprof_raw(&out);
    // 1,998 blocks of 64 bytes and the array of 2,002 pointers.
    assert_eq!(
        raw.sum_with("hold_blocks")[2..],
        [1999, 1998 * 64 + 2002 * 8]
    );
    assert!(
        raw.total()[3] < 1 << 30,
        "a total wrapped: {:?}",
        raw.total()
    );
    let summary = err.lines().last().unwrap();
    let bytes: u64 = summary
        .split(" bytes")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no byte total in {summary:?}"));
    assert_eq!(bytes as i64, raw.total()[3], "{summary}");
    assert_eq!(damage_comments(&out).len(), 1, "{:?}", raw.comments);

    let contents = dir.join("contents");
    let out2 = dir.join("contents.pb.gz");
    damaged(
        &dir,
        &[
            "snapshot",
            "--by-pid",
            &pid,
            "--contents-dir",
            contents.to_str().unwrap(),
            "-o",
            out2.to_str().unwrap(),
        ],
        "region damaged: 4 of ",
    );
    let files: Vec<String> = std::fs::read_dir(&contents)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        files.len() as i64,
        raw.total()[2],
        "one file per valid block"
    );
    assert!(!files.contains(&"0xfffffffffffffff8".to_owned()));
    for n in [&nodes[0], &nodes[1], &nodes[3]] {
        assert!(!files.contains(&format!("{:#x}", n.address)));
    }

    let snap = dir.join("g.heapsnapshot");
    for args in [
        vec!["leaks", "--by-pid", &pid],
        vec!["top", "--retained", "--by-pid", &pid],
        vec!["graph", "--by-pid", &pid, "-o", snap.to_str().unwrap()],
    ] {
        damaged(&dir, &args, "region damaged: 4 of ");
    }

    // `watch` writes its files, says so in each, and ends with the same status.
    let watched = dir.join("watch");
    damaged(
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
            watched.to_str().unwrap(),
        ],
        "region damaged: 4 of ",
    );
    let files: Vec<std::path::PathBuf> = std::fs::read_dir(&watched)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".pb.gz"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(damage_comments(&files[0]).len(), 1);
    drop(r);
}

/// B4, B5: 2,002 live records that all claim the same 1 GiB at one address: one is kept, the
/// other 2,001 are counted as overlapping, the live total is 1 GiB (not 2,002 GiB), and
/// `leaks`, `top` and `graph` end at once (the block is not mapped: nothing to read).
#[test]
fn overlapping_blocks_are_counted_once() {
    let dir = region_dir("damaged-overlap");
    let r = hold_sized(&dir, 2002, 64);
    let pid = r.pid().to_string();
    let region = region_file(&dir);
    let nodes: Vec<Node> = live_nodes(&region)
        .into_iter()
        .filter(|n| n.size == 64)
        .collect();
    assert_eq!(nodes.len(), 2002);
    for n in &nodes {
        n.set_address(&region, 0x10_0000_0000);
        n.set_size(&region, 1 << 30);
    }
    let out = dir.join("overlap.pb.gz");
    let err = damaged(
        &dir,
        &["snapshot", "--by-pid", &pid, "-o", out.to_str().unwrap()],
        "region damaged: 2001 of ",
    );
    assert!(err.contains("2001 overlapping another block"), "{err}");
    let raw = pprof_raw(&out);
    assert_eq!(raw.sum_with("hold_blocks")[2..], [2, (1 << 30) + 2002 * 8]);
    assert_eq!(damage_comments(&out).len(), 1);

    let out = dir.join("overlap-tags.pb.gz");
    damaged(
        &dir,
        &[
            "snapshot",
            "--by-pid",
            &pid,
            "--with-tags",
            "-o",
            out.to_str().unwrap(),
        ],
        "region damaged: 2001 of ",
    );
    assert_addresses_distinct(&decode(&out), "a damaged region's blocks");

    let snap = dir.join("g.heapsnapshot");
    for args in [
        vec!["leaks", "--by-pid", &pid],
        vec!["top", "--retained", "--by-pid", &pid],
        vec!["graph", "--by-pid", &pid, "-o", snap.to_str().unwrap()],
    ] {
        damaged(&dir, &args, "region damaged: 2001 of ");
    }
    drop(r);
}

/// `examples/c/named_churn.c`: named snapshots "before" and "after", records held for them.
fn named_churn() -> std::path::PathBuf {
    let include = root().join("instrumentation/include");
    compile_c(
        "named_churn",
        &[
            "-fno-optimize-sibling-calls",
            "-I",
            include.to_str().unwrap(),
        ],
    )
}

/// Runs each of `commands` against `dir`'s region while it is being rewritten, `rounds`
/// times: each must end within [`LIMIT`] with 0, 1 (a clean error) or 3 (damaged), never a
/// panic (101), a signal or a hang. Returns the outcome counts per command, for the report.
fn survive(
    dir: &Path,
    commands: &[(String, Vec<String>)],
    rounds: usize,
) -> std::collections::BTreeMap<String, [u32; 3]> {
    let mut seen = std::collections::BTreeMap::new();
    for round in 0..rounds {
        for (name, args) in commands {
            let args: Vec<String> = args
                .iter()
                .map(|a| a.replace("{round}", &round.to_string()))
                .collect();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let t = heapdump_timeout(dir, &args, LIMIT);
            for (what, text) in [("stdout", &t.stdout), ("stderr", &t.stderr)] {
                if text.starts_with("[not UTF-8]") {
                    eprintln!(
                        "{args:?}: {what} not UTF-8: {}",
                        &text[..text.len().min(300)]
                    );
                }
            }
            assert!(!t.timed_out, "{args:?} hung: {}", t.stderr);
            assert!(
                !t.stderr.contains("panicked"),
                "{args:?} panicked: {}",
                t.stderr
            );
            let k = match t.code {
                Some(0) => 0,
                Some(1) => 1,
                Some(3) => 2,
                _ => panic!("{args:?} ended with {:?}: {}", t.code, t.stderr),
            };
            seen.entry(name.to_string()).or_insert([0u32; 3])[k] += 1;
        }
    }
    seen
}

/// The commands of the rewrite test against pid `pid`, writing under `out`: all of them for a
/// live process, those that read only the region for an exited one.
fn commands(pid: &str, out: &Path, live: bool) -> Vec<(String, Vec<String>)> {
    let profile = out.join("p.pb.gz").to_str().unwrap().to_owned();
    let contents = out.join("contents-{round}").to_str().unwrap().to_owned();
    let heap = out.join("g.heapsnapshot").to_str().unwrap().to_owned();
    let snap = |extra: &[&str]| {
        let mut v = vec!["snapshot", "--by-pid", pid, "-o", &profile];
        v.extend_from_slice(extra);
        v.iter().map(|a| a.to_string()).collect::<Vec<String>>()
    };
    let mut c = vec![
        ("snapshot".to_owned(), snap(&[])),
        ("snapshot --with-tags".to_owned(), snap(&["--with-tags"])),
        (
            "snapshot --named before".to_owned(),
            snap(&["--named", "before"]),
        ),
        ("snapshot --since 1h".to_owned(), snap(&["--since", "1h"])),
        (
            "list".to_owned(),
            vec!["list".to_owned(), "--json".to_owned()],
        ),
    ];
    if live {
        let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<String>>();
        c.extend([
            (
                "snapshot --contents-dir --with-strings".to_owned(),
                snap(&["--contents-dir", &contents, "--with-strings"]),
            ),
            ("leaks".to_owned(), s(&["leaks", "--by-pid", pid])),
            (
                "top --retained".to_owned(),
                s(&["top", "--retained", "--by-pid", pid]),
            ),
            (
                "graph -o .heapsnapshot".to_owned(),
                s(&["graph", "--by-pid", pid, "-o", &heap]),
            ),
        ]);
    }
    c
}

/// B6: a region whose owner rewrites its live parts (header counters and cursors, records,
/// stack entries and frames, thread slots, module table, named snapshots) continuously while
/// every command reads it — a live process's region, and an exited process's kept one.
#[test]
fn region_rewritten_while_read_never_crashes_or_hangs() {
    let dir = region_dir("rewritten");
    let out = dir.with_extension("out");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir(&out).unwrap();
    let exe = named_churn();
    let rounds: usize = std::env::var("HEAPDUMP_TEST_REWRITE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);

    // A live process: every command.
    let r = start(std::process::Command::new(&exe), &dir, true);
    let pid = r.pid().to_string();
    let region = region_file(&dir);
    let nodes = peek_u64(&region, NODE_CURSOR_AT);
    let rw = Rewriter::start(&region, live_parts(&region, nodes), 0x9e37_79b9_7f4a_7c15);
    let live = survive(&dir, &commands(&pid, &out, true), rounds);
    let mut writes = rw.stop();
    drop(r);
    std::fs::remove_file(&region).unwrap();

    // An exited process's kept region: what can be read post-mortem.
    let mut cmd = std::process::Command::new(&exe);
    cmd.env("HEAPDUMP_KEEP", "1");
    let r = start(cmd, &dir, true);
    let pid = r.pid().to_string();
    assert_eq!(r.finish(), 0);
    let region = region_file(&dir);
    let nodes = peek_u64(&region, NODE_CURSOR_AT);
    let rw = Rewriter::start(&region, live_parts(&region, nodes), 0x2545_f491_4f6c_dd1d);
    let dead = survive(&dir, &commands(&pid, &out, false), rounds);
    writes += rw.stop();
    eprintln!("rewritten region: {writes} words written; outcomes [exit 0, exit 1, exit 3]:");
    for (k, v) in live {
        eprintln!("  live process, {k}: {v:?}");
    }
    for (k, v) in dead {
        eprintln!("  exited process, {k}: {v:?}");
    }
    std::fs::remove_file(&region).unwrap();
    let _ = std::fs::remove_dir_all(&out);
    assert!(writes > 10_000, "the rewriter hardly ran: {writes} writes");
}
