//! The heap reference graph (issue 9): leaks found in a running process, compared with the
//! planted truth and with LeakSanitizer's report of the same program.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::process::{Command, Stdio};

/// (kind, site) -> (blocks, bytes)
type Table = BTreeMap<(String, String), (u64, u64)>;

fn add(t: &mut Table, kind: &str, site: &str, blocks: u64, bytes: u64) {
    let e = t.entry((kind.to_owned(), site.to_owned())).or_default();
    e.0 += blocks;
    e.1 += bytes;
}

/// What leaky.c plants, by allocation site: (kind, site, blocks, bytes).
const PLANTED: [(&str, &str, u64, u64); 5] = [
    ("direct", "make_list", 1, 48),
    ("indirect", "make_list", 9, 432),
    ("indirect", "make_cycle", 2, 80),
    ("direct", "make_masked", 1, 24),
    ("direct", "make_lost", 3, 216),
];

/// Parses LeakSanitizer's report: "Direct leak of B byte(s) in N object(s) allocated from:"
/// followed by frames "#0 … in malloc …", "#1 … in SITE …".
fn parse_lsan(report: &str) -> Table {
    let mut t = Table::new();
    let mut lines = report.lines();
    while let Some(l) = lines.next() {
        let l = l.trim();
        let kind = if l.starts_with("Direct leak of ") {
            "direct"
        } else if l.starts_with("Indirect leak of ") {
            "indirect"
        } else {
            continue;
        };
        let w: Vec<&str> = l.split_whitespace().collect();
        let bytes: u64 = w[3].parse().unwrap();
        let blocks: u64 = w[6].parse().unwrap();
        let site = lines
            .by_ref()
            .map(str::trim)
            .find(|f| f.starts_with("#1 "))
            .and_then(|f| f.split(" in ").nth(1))
            .and_then(|f| f.split_whitespace().next())
            .unwrap_or("?")
            .to_owned();
        add(&mut t, kind, &site, blocks, bytes);
    }
    t
}

#[test]
fn planted_leaks_found_exactly_and_as_leaksanitizer_reports_them() {
    let lib = compile_lib("leaky_lib.c", "libleaky.so", &[]);
    let exe = compile_c("leaky", &["-fno-optimize-sibling-calls", "-ldl"]);
    let dir = region_dir("leaks");
    let mut cmd = Command::new(&exe);
    cmd.arg(&lib);
    let r = start(cmd, &dir, true);
    let out_pb = dir.with_extension("leaks.pb.gz");
    let (ok, json, err) = heapdump_cmd(
        &dir,
        &[
            "leaks",
            "--by-pid",
            &r.pid().to_string(),
            "--json",
            "-o",
            out_pb.to_str().unwrap(),
        ],
    );
    assert!(ok, "heapdump leaks: {err}");
    let groups: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    let mut ours = Table::new();
    for g in &groups {
        let site = g["frames"][0].as_str().unwrap_or("?");
        add(
            &mut ours,
            g["kind"].as_str().unwrap(),
            site,
            g["blocks"].as_u64().unwrap(),
            g["bytes"].as_u64().unwrap(),
        );
    }
    let mut planted = Table::new();
    for (k, s, n, b) in PLANTED {
        add(&mut planted, k, s, n, b);
    }
    println!("site / kind: planted | heapdump");
    for (k, v) in &planted {
        println!("  {} {}: {:?} | {:?}", k.1, k.0, v, ours.get(k));
    }
    assert_eq!(ours, planted, "heapdump leaks (left) vs planted (right)");
    // The text report says the same.
    let (ok, text, _) = heapdump_cmd(&dir, &["leaks", "--by-pid", &r.pid().to_string()]);
    assert!(ok);
    assert!(
        text.contains("SUMMARY: heapdump: 800 byte(s) leaked in 16 allocation(s) (288 direct bytes, 512 indirect)"),
        "{text}"
    );
    // The pprof profile of the leaked blocks.
    let p = decode(&out_pb);
    let total: [i64; 2] = inuse_totals(&p);
    assert_eq!(total, [16, 800]);
    assert_eq!(r.finish(), 0);

    // LeakSanitizer on the same program, at its exit.
    let lsan = target_dir().join("test-bins/leaky-lsan");
    let built = Command::new("cc")
        .args([
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-fno-optimize-sibling-calls",
        ])
        .args(["-fsanitize=leak", "-pthread", "-o"])
        .arg(&lsan)
        .arg(root().join("examples/c/leaky.c"))
        .arg("-ldl")
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !built {
        skip_note("skipped: the LeakSanitizer comparison (cc -fsanitize=leak is not available)");
        return;
    }
    let out = Command::new(&lsan)
        .arg(&lib)
        .env("LSAN_OPTIONS", "exitcode=0")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stderr);
    let theirs = parse_lsan(&report);
    assert!(!theirs.is_empty(), "no LeakSanitizer report: {report}");
    println!("site / kind: planted | heapdump | LeakSanitizer");
    let mut all: Vec<&(String, String)> = planted.keys().chain(theirs.keys()).collect();
    all.sort();
    all.dedup();
    for k in all {
        println!(
            "  {} {}: {:?} | {:?} | {:?}",
            k.1,
            k.0,
            planted.get(k),
            ours.get(k),
            theirs.get(k)
        );
    }
    // LeakSanitizer does not scan memory the program maps itself: it reports the block only
    // such a mapping holds, which is not leaked (heapdump scans that mapping).
    let mut theirs_known = theirs.clone();
    assert_eq!(
        theirs_known.remove(&("direct".to_owned(), "make_mmap".to_owned())),
        Some((1, 66)),
        "{report}"
    );
    assert_eq!(
        theirs_known, ours,
        "LeakSanitizer (left) vs heapdump (right)"
    );
}

#[test]
fn leaks_of_an_exited_process_is_a_clear_error() {
    let exe = compile_c("known_allocs", &[]);
    let dir = region_dir("leaks-exited");
    let mut cmd = Command::new(&exe);
    cmd.env("HEAPDUMP_KEEP", "1");
    let r = start(cmd, &dir, true);
    let pid = r.pid();
    assert_eq!(r.finish(), 0);
    let (ok, _, err) = heapdump_cmd(&dir, &["leaks", "--by-pid", &pid.to_string()]);
    assert!(!ok);
    assert!(
        err.contains("has exited") && err.contains("contents"),
        "{err}"
    );
}

/// Retainers and the ownership flame graph on a known ownership tree (owners.c: a global table
/// → 3 buckets → 1000 entries each with a 1 KiB payload): exact chains and bytes.
#[test]
fn retainers_and_ownership_flame_graph_of_a_known_tree() {
    let exe = compile_c("owners", &["-fno-optimize-sibling-calls"]);
    let dir = region_dir("owners");
    let r = start(Command::new(&exe), &dir, true);
    let pid = r.pid().to_string();
    let (ok, json, err) = heapdump_cmd(
        &dir,
        &[
            "retainers",
            "--by-pid",
            &pid,
            "--function",
            "^make_(payload|entry)$",
            "--json",
        ],
    );
    assert!(ok, "{err}");
    let v: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    let chain = |i: usize| -> Vec<String> {
        v[i]["chain"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(v.len(), 2, "{json}");
    let top = [
        "g_table (owners)",
        "make_table",
        "make_bucket",
        "make_entries",
        "make_entry",
    ];
    assert_eq!(chain(0), [&top[..], &["make_payload"]].concat());
    assert_eq!(
        (v[0]["blocks"].as_u64(), v[0]["bytes"].as_u64()),
        (Some(3000), Some(3_072_000))
    );
    assert_eq!(chain(1), top);
    assert_eq!(
        (v[1]["blocks"].as_u64(), v[1]["bytes"].as_u64()),
        (Some(3000), Some(96_000))
    );
    let (ok, text, _) = heapdump_cmd(
        &dir,
        &["retainers", "--by-pid", &pid, "--function", "make_payload"],
    );
    assert!(ok);
    assert!(
        text.starts_with("g_table (owners) → make_table → make_bucket → make_entries → make_entry → make_payload → 3072000 bytes in 3000 blocks"),
        "{text}"
    );

    // The flame graph: each level's width is the bytes held through it.
    let svg = dir.with_extension("own.svg");
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &["graph", "--by-pid", &pid, "-o", svg.to_str().unwrap()],
    );
    assert!(ok, "{err}");
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<?xml") && text.trim_end().ends_with("</svg>"));
    for (name, bytes) in [
        ("g_table (owners)", "3,192,072"),
        ("make_table", "3,192,072"),
        ("make_bucket", "3,192,048"),
        ("make_entries", "3,192,000"),
        ("make_entry", "3,168,000"),
        ("make_payload", "3,072,000"),
    ] {
        let title = format!("<title>{name} ({bytes} bytes, ");
        assert!(text.contains(&title), "{title} not in the flame graph");
    }
    let (ok, _, err) = heapdump_cmd(&dir, &["graph", "--by-pid", &pid, "-o", "x.png"]);
    assert!(!ok && err.contains("FILE.svg"), "{err}");
    assert_eq!(r.finish(), 0);
}

/// Helper Q, 1: a linked list of 20,000 nodes is one chain — its root, then `push` once, a
/// run — for `retainers` and the ownership flame graph. Every node's chain was materialized
/// before (memory quadratic in the list: 2.7 GB at 10,000 nodes, more than 6 GB at 20,000).
#[test]
fn a_linked_list_is_one_chain() {
    let exe = compile_c("linked_list", &["-fno-optimize-sibling-calls"]);
    let dir = region_dir("linked-list");
    let r = start(Command::new(&exe), &dir, true);
    let pid = r.pid().to_string();
    let (ok, text, err) = heapdump_cmd(
        &dir,
        &["retainers", "--by-pid", &pid, "--function", "^push$"],
    );
    assert!(ok, "{err}");
    assert_eq!(
        text.lines().next().unwrap_or(""),
        "head (linked_list) → push (up to 20000 in a row) → 320000 bytes in 20000 blocks",
        "{text}"
    );
    let svg = dir.with_extension("list.svg");
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &["graph", "--by-pid", &pid, "-o", svg.to_str().unwrap()],
    );
    assert!(ok, "{err}");
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("<title>push (up to 20000 in a row) (320,000 bytes, "),
        "the list is one level of the flame graph"
    );
    assert_eq!(r.finish(), 0);
}

/// A real program: python3 holding a dict of 100,000 objects in a global. Nothing Python
/// still holds is reported leaked, and the objects' chains start at the interpreter's own
/// globals (data of libpython, the python executable or its extension modules).
#[test]
fn python_objects_are_held_by_the_interpreters_globals() {
    let dir = region_dir("python-graph");
    let mut cmd = Command::new("python3");
    cmd.env("PYTHONMALLOC", "malloc").args([
        "-c",
        "import os,sys\nclass Item:\n    __slots__ = ('v',)\n    def __init__(self, v): self.v = v\nHOLD = {i: Item(i) for i in range(100000)}\nprint('ready', os.getpid(), flush=True)\nsys.stdin.read()\n",
    ]);
    let r = start(cmd, &dir, true);
    let pid = r.pid().to_string();
    let (ok, json, err) = heapdump_cmd(&dir, &["leaks", "--by-pid", &pid, "--json"]);
    assert!(ok, "{err}");
    let leaks: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    assert!(leaks.is_empty(), "python3 leaks? {json}");
    let args = [
        "retainers",
        "--by-pid",
        &pid,
        "--function",
        "^_PyType_AllocNoTrack$",
        "--json",
        "--top",
        "1000000",
    ];
    let (ok, json, err) = heapdump_cmd(&dir, &args);
    assert!(ok, "{err}");
    let v: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    let interpreters = |c: &serde_json::Value| {
        let root = c["chain"][0].as_str().unwrap();
        // libpython, the python executable, or one of its extension modules
        // (`_bisect.cpython-311-x86_64-linux-gnu.so`): which global is reached first by the
        // breadth-first search depends on where blocks landed.
        !root.starts_with("stack of") && !root.starts_with("mapping") && root.contains("python")
    };
    // The 100,000 objects (and the interpreter's own few hundred) hang from its globals.
    assert!(
        interpreters(&v[0]),
        "the largest chain starts at {}",
        v[0]["chain"][0]
    );
    let held: u64 = v
        .iter()
        .filter(|c| interpreters(c))
        .map(|c| c["blocks"].as_u64().unwrap())
        .sum();
    assert!(
        (100_000..=120_000).contains(&held),
        "{held} blocks held by the globals"
    );
    assert_eq!(r.finish(), 0);
}

/// Runs DevTools' own parser (heap-snapshot-toolkit, installed by `.ci/run` into
/// target/devtools-node) on `file`: its view of the snapshot, or `None` when node is missing.
fn devtools_view(file: &std::path::Path) -> Option<serde_json::Value> {
    let node = std::env::var_os("HEAPDUMP_NODE").unwrap_or_else(|| "node".into());
    if Command::new(&node).arg("--version").output().is_err() {
        return None;
    }
    let toolkit = target_dir().parent().unwrap().join("devtools-node");
    if !toolkit
        .join("node_modules/heap-snapshot-toolkit/index.js")
        .exists()
    {
        let st = Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(&toolkit)
            .arg("heap-snapshot-toolkit@1.1.3")
            .status();
        assert!(matches!(st, Ok(s) if s.success()), "npm install: {st:?}");
    }
    let out = Command::new(&node)
        .arg(root().join("collector/tests/devtools/check.mjs"))
        .arg(&toolkit)
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

/// Retained sizes on the known ownership tree (owners.c): exact per site, per block and per
/// root from `top --retained`, and the same numbers from Chrome DevTools' own parser loading
/// `graph -o FILE.heapsnapshot`.
#[test]
fn retained_sizes_exact_and_as_devtools_computes_them() {
    let exe = compile_c("owners", &["-fno-optimize-sibling-calls"]);
    let dir = region_dir("owners-retained");
    let r = start(Command::new(&exe), &dir, true);
    let pid = r.pid().to_string();
    let (ok, json, err) = heapdump_cmd(&dir, &["top", "--retained", "--by-pid", &pid, "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let sites: Vec<(String, u64, u64)> = v["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["site"].as_str().unwrap().to_owned(),
                s["retained"].as_u64().unwrap(),
                s["blocks"].as_u64().unwrap(),
            )
        })
        .collect();
    let bucket = 16 + 8000 + 1000 * (32 + 1024);
    let want = [
        ("make_table", 24 + 3 * bucket, 1),
        ("make_bucket", 3 * bucket, 3),
        ("make_entries", 3 * (8000 + 1000 * (32 + 1024)), 3),
        ("make_entry", 3000 * (32 + 1024), 3000),
        ("make_payload", 3000 * 1024, 3000),
    ];
    let want: Vec<(String, u64, u64)> = want
        .iter()
        .map(|(s, r, b)| (s.to_string(), *r as u64, *b as u64))
        .collect();
    assert_eq!(sites, want);
    let blocks: Vec<u64> = v["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .take(4)
        .map(|b| b["retained"].as_u64().unwrap())
        .collect();
    assert_eq!(
        blocks,
        [24 + 3 * bucket, bucket, bucket, bucket].map(|x| x as u64)
    );
    assert_eq!(v["roots"][0]["root"], "g_table (owners)");
    assert_eq!(
        v["roots"][0]["retained"].as_u64(),
        Some(24 + 3 * bucket as u64)
    );

    let snap = dir.with_extension("heapsnapshot");
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &["graph", "--by-pid", &pid, "-o", snap.to_str().unwrap()],
    );
    assert!(ok, "{err}");
    assert_eq!(r.finish(), 0);
    let Some(dt) = devtools_view(&snap) else {
        skip_note("skipped: the DevTools cross-check (node is not installed)");
        return;
    };
    // 6007 blocks, 1 root, 1 root group, the synthetic root.
    assert_eq!(dt["node_count"].as_u64(), Some(6007 + 3));
    let mut retained: Vec<u64> = dt["retained"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    retained.sort_unstable_by(|a, b| b.cmp(a));
    // The synthetic root, the group, g_table and the table retain everything; then the
    // buckets.
    let total = (24 + 3 * bucket) as u64;
    assert_eq!(
        retained[..7],
        [
            total,
            total,
            total,
            total,
            bucket as u64,
            bucket as u64,
            bucket as u64
        ]
    );
    let summary = &dt["summary"];
    assert_eq!(summary["make_payload"]["count"].as_u64(), Some(3000));
    assert_eq!(summary["make_payload"]["self"].as_u64(), Some(3_072_000));
}

/// A leaked block's stale pointer into a block a global owns takes nothing from the owner:
/// `g_owner` and `make_owner` retain the 100,000 B block they alone keep alive (they retained
/// 16 B: the leak, hung off the super-root, counted as a second way to it), and DevTools,
/// loading the `.heapsnapshot` (the leak's pointer exported as a `weak` edge), computes the
/// same.
#[test]
fn a_leak_pointing_into_owned_blocks_takes_nothing_from_the_owner() {
    let exe = compile_c("leak_points_in", &["-fno-optimize-sibling-calls"]);
    let dir = region_dir("leak-points-in");
    let r = start(Command::new(&exe), &dir, true);
    let pid = r.pid().to_string();
    let (ok, json, err) = heapdump_cmd(&dir, &["top", "--retained", "--by-pid", &pid, "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let root = (v["roots"].as_array().unwrap().iter())
        .find(|x| x["root"] == "g_owner (leak_points_in)")
        .unwrap_or_else(|| panic!("{json}"));
    assert_eq!(root["retained"].as_u64(), Some(100_016), "{json}");
    let owner = (v["sites"].as_array().unwrap().iter())
        .find(|x| x["site"] == "make_owner")
        .unwrap();
    assert_eq!(owner["retained"].as_u64(), Some(100_016), "{json}");
    let (ok, leaks, err) = heapdump_cmd(&dir, &["leaks", "--by-pid", &pid]);
    assert!(ok, "{err}");
    assert!(
        leaks.contains("64 byte(s) leaked in 1 allocation(s)"),
        "{leaks}"
    );
    let snap = dir.with_extension("heapsnapshot");
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &["graph", "--by-pid", &pid, "-o", snap.to_str().unwrap()],
    );
    assert!(ok, "{err}");
    assert_eq!(r.finish(), 0);
    let Some(dt) = devtools_view(&snap) else {
        skip_note("skipped: the DevTools cross-check (node is not installed)");
        return;
    };
    let retained: Vec<u64> = (dt["retained"].as_array().unwrap().iter())
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(
        retained.iter().filter(|&&x| x == 100_016).count(),
        2,
        "g_owner and its block: {retained:?}"
    );
}

/// `--stop`: the same exact report with the program frozen (its registers are roots too),
/// the pause reported; the program resumes afterwards — also when heapdump is killed while
/// it holds the program stopped.
#[test]
fn stop_mode_is_exact_and_the_program_resumes_even_if_heapdump_is_killed() {
    let lib = compile_lib("leaky_lib.c", "libleaky.so", &[]);
    let exe = compile_c("leaky", &["-fno-optimize-sibling-calls", "-ldl"]);
    let dir = region_dir("leaks-stop");
    let mut cmd = Command::new(&exe);
    cmd.arg(&lib);
    let r = start(cmd, &dir, true);
    let pid = r.pid();
    let (ok, json, err) = heapdump_cmd(
        &dir,
        &["leaks", "--by-pid", &pid.to_string(), "--json", "--stop"],
    );
    assert!(ok, "{err}");
    assert!(
        err.contains(&format!("pid {pid} was stopped for ")),
        "{err}"
    );
    let groups: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    let mut ours = Table::new();
    for g in &groups {
        add(
            &mut ours,
            g["kind"].as_str().unwrap(),
            g["frames"][0].as_str().unwrap_or("?"),
            g["blocks"].as_u64().unwrap(),
            g["bytes"].as_u64().unwrap(),
        );
    }
    let mut planted = Table::new();
    for (k, s, n, b) in PLANTED {
        add(&mut planted, k, s, n, b);
    }
    assert_eq!(ours, planted);
    // "t (tracing stop)" while frozen by ptrace, "T (stopped)" for SIGSTOP.
    let state = || {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find(|l| l.starts_with("State:"))
            .unwrap()
            .replace("tracing stop", "stopped")
    };
    assert!(!state().contains("stopped"), "{}", state());

    // Killed while the program is stopped (paused inside the snapshot): the kernel detaches
    // the program, which runs on.
    let mut hd = Command::new(heapdump())
        .args(["leaks", "--by-pid", &pid.to_string(), "--stop"])
        .env("HEAPDUMP_DIR", &dir)
        .env("HEAPDUMP_TEST_PAUSE_MS", "3000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !state().contains("stopped") {
        assert!(
            std::time::Instant::now() < deadline,
            "never stopped: {}",
            state()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    hd.kill().unwrap();
    hd.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while state().contains("stopped") {
        assert!(
            std::time::Instant::now() < deadline,
            "left stopped: {}",
            state()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(r.finish(), 0, "the program ran on to its normal end");
}

/// Capture once, analyse many times: `graph -o FILE.hdsnap` of a running process, then
/// A profile's (inuse_objects, inuse_space) totals, found by sample type.
fn inuse_totals(p: &heapdump_proto::Profile) -> [i64; 2] {
    let at = |t: &str| {
        (p.sample_type.iter())
            .position(|st| p.string_table[st.r#type as usize] == t)
            .expect("sample type")
    };
    let (o, b) = (at("inuse_objects"), at("inuse_space"));
    (p.sample.iter()).fold([0, 0], |a, s| [a[0] + s.value[o], a[1] + s.value[b]])
}

/// `leaks`, `retainers`, `top` and `convert` on the file give what they give on the process.
#[test]
fn a_capture_file_answers_as_the_live_process_does() {
    let lib = compile_lib("leaky_lib.c", "libleaky.so", &[]);
    let exe = compile_c("leaky", &["-fno-optimize-sibling-calls", "-ldl"]);
    let dir = region_dir("capture");
    let mut cmd = Command::new(&exe);
    cmd.arg(&lib);
    let r = start(cmd, &dir, true);
    let pid = r.pid().to_string();
    let cap = dir.with_extension("hdsnap");
    let capf = cap.to_str().unwrap();
    let (ok, _, err) = heapdump_cmd(&dir, &["graph", "--by-pid", &pid, "--stop", "-o", capf]);
    assert!(ok, "{err}");
    let (ok, live, err) = heapdump_cmd(&dir, &["leaks", "--by-pid", &pid, "--stop", "--json"]);
    assert!(ok, "{err}");
    assert_eq!(r.finish(), 0);
    // The process is gone: the file alone answers.
    let (ok, from_file, err) = heapdump_cmd(&dir, &["leaks", capf, "--json"]);
    assert!(ok, "{err}");
    let parse = |s: &str| -> Vec<serde_json::Value> { serde_json::from_str(s).unwrap() };
    assert_eq!(parse(&from_file), parse(&live));
    // make_list's direct and indirect, make_cycle's two blocks (two call sites of one line
    // of names: one group), make_masked, make_lost.
    assert_eq!(parse(&from_file).len(), 5, "{from_file}");
    // Leaked blocks of the capture as pprof, and the whole capture converted.
    let pb = dir.with_extension("capture-leaks.pb.gz");
    let (ok, _, err) = heapdump_cmd(&dir, &["leaks", capf, "-o", pb.to_str().unwrap()]);
    assert!(ok, "{err}");
    // Every output says where it went.
    assert!(
        err.contains(&format!("800 leaked bytes -> {}", pb.display())),
        "{err}"
    );
    let p = decode(&pb);
    let t = inuse_totals(&p);
    assert_eq!(t, [16, 800]);
    let (ok, _, err) = heapdump_cmd(&dir, &["convert", capf, "-o", pb.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(err.contains("28 live blocks, "), "{err}");
    assert!(
        err.trim_end().ends_with(&format!("-> {}", pb.display())),
        "{err}"
    );
    let p = decode(&pb);
    // inuse_objects, inuse_space: a capture has no cumulative counts (helper G, 4).
    assert_eq!(p.sample_type.len(), 2);
    assert_eq!(p.sample.iter().map(|s| s.value[0]).sum::<i64>(), 28);
    assert_eq!(sum_through(&p, "make_lost")[2..], [3, 216]);
    let svg = dir.with_extension("capture.svg");
    let (ok, _, err) = heapdump_cmd(&dir, &["convert", capf, "-o", svg.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(std::fs::read_to_string(&svg)
        .unwrap()
        .contains("<title>g_kept (leaky) (88 bytes"));
    let (ok, _, err) = heapdump_cmd(&dir, &["leaks", "/etc/hostname"]);
    assert!(!ok && err.contains("not a heapdump graph capture"), "{err}");
}

/// Retainers and retained sizes from a capture equal those of the live process.
#[test]
fn retainers_and_top_from_a_capture() {
    let exe = compile_c("owners", &["-fno-optimize-sibling-calls"]);
    let dir = region_dir("owners-capture");
    let r = start(Command::new(&exe), &dir, true);
    let pid = r.pid().to_string();
    let cap = dir.with_extension("hdsnap");
    let capf = cap.to_str().unwrap();
    let (ok, _, err) = heapdump_cmd(&dir, &["graph", "--by-pid", &pid, "-o", capf]);
    assert!(ok, "{err}");
    let run = |target: &[&str], cmd: &[&str]| -> String {
        let args: Vec<&str> = cmd.iter().chain(target).copied().collect();
        let (ok, out, err) = heapdump_cmd(&dir, &args);
        assert!(ok, "{args:?}: {err}");
        out
    };
    for cmd in [
        &["top", "--retained", "--json"][..],
        &["retainers", "--function", "make_payload", "--json"][..],
    ] {
        let live = run(&["--by-pid", &pid], cmd);
        let file = run(&[capf], cmd);
        let a: serde_json::Value = serde_json::from_str(&live).unwrap();
        let b: serde_json::Value = serde_json::from_str(&file).unwrap();
        assert_eq!(a, b, "{cmd:?}");
    }
    assert_eq!(r.finish(), 0);
}

/// `graph --baseline BASE.hdsnap -o FILE.svg`: only what is new since the baseline capture, and
/// who holds it; `--since`, its former name, still works and is no longer shown in `--help`.
#[test]
fn ownership_flame_graph_of_what_is_new_since_a_capture() {
    use std::io::Write;
    let exe = compile_c("grower", &["-fno-optimize-sibling-calls"]);
    let dir = region_dir("grower");
    let mut r = start(Command::new(&exe), &dir, true);
    let pid = r.pid().to_string();
    let base = dir.with_extension("base.hdsnap");
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &["graph", "--by-pid", &pid, "-o", base.to_str().unwrap()],
    );
    assert!(ok, "{err}");
    // Nothing new yet: a valid SVG that says so, exit 0, and why on stderr.
    let empty = dir.with_extension("empty.svg");
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &[
            "graph",
            "--by-pid",
            &pid,
            "--baseline",
            base.to_str().unwrap(),
            "-o",
            empty.to_str().unwrap(),
        ],
    );
    assert!(ok, "{err}");
    assert!(
        err.contains("nothing to draw: every live block was already in the baseline"),
        "{err}"
    );
    let text = std::fs::read_to_string(&empty).unwrap();
    assert!(
        text.starts_with("<?xml") && text.trim_end().ends_with("</svg>"),
        "{text}"
    );
    assert!(text.contains("Nothing to draw: no stack has a nonzero count of bytes."));
    let mut xml = quick_xml::Reader::from_str(&text);
    loop {
        match xml.read_event() {
            Ok(quick_xml::events::Event::Eof) => break,
            Ok(_) => {}
            Err(e) => panic!("not XML: {e}: {text}"),
        }
    }
    r.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    r.wait_line("grown");
    let svg = dir.with_extension("new.svg");
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &[
            "graph",
            "--by-pid",
            &pid,
            "--baseline",
            base.to_str().unwrap(),
            "-o",
            svg.to_str().unwrap(),
        ],
    );
    assert!(ok, "{err}");
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("<title>all (10,000 bytes, 100%)</title>"),
        "only the new blocks"
    );
    let old_name = dir.with_extension("new-since.svg");
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &[
            "graph",
            "--by-pid",
            &pid,
            "--since",
            base.to_str().unwrap(),
            "-o",
            old_name.to_str().unwrap(),
        ],
    );
    assert!(ok, "{err}");
    assert!(std::fs::read_to_string(&old_name)
        .unwrap()
        .contains("<title>all (10,000 bytes, 100%)</title>"));
    let (ok, help, _) = heapdump_cmd(&dir, &["graph", "--help"]);
    assert!(
        ok && help.contains("--baseline <CAPTURE>") && !help.contains("--since"),
        "{help}"
    );
    // All of them from g_new: glibc's malloc state in libc's data points at the header of the
    // chunk after a new block (a free chunk, the top chunk) and must not count.
    assert!(
        text.contains("<title>g_new (grower) (10,000 bytes, 100.00%)</title>"),
        "{text}"
    );
    assert!(text.contains("<title>new_alloc (10,000 bytes, 100.00%)</title>"));
    assert!(!text.contains("old_alloc"));
    // --drop-frames: old_alloc is skipped like an allocator wrapper, its blocks named by its
    // caller, in `top` and in the flame graph.
    let (ok, out, err) = heapdump_cmd(
        &dir,
        &[
            "top",
            "--retained",
            "--by-pid",
            &pid,
            "--json",
            "--drop-frames",
            "old_.*",
        ],
    );
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let sites: BTreeMap<String, (u64, u64)> = (v["sites"].as_array().unwrap().iter())
        .map(|s| {
            let n = |k: &str| s[k].as_u64().unwrap();
            (
                s["site"].as_str().unwrap().to_owned(),
                (n("retained"), n("blocks")),
            )
        })
        .collect();
    assert_eq!(sites.get("main"), Some(&(10_000, 100)), "{sites:?}");
    assert_eq!(sites.get("new_alloc"), Some(&(10_000, 50)), "{sites:?}");
    assert!(!sites.contains_key("old_alloc"), "{sites:?}");
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &[
            "graph",
            "--by-pid",
            &pid,
            "--drop-frames",
            "old_.*|new_.*",
            "-o",
            svg.to_str().unwrap(),
        ],
    );
    assert!(ok, "{err}");
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("<title>main (10,000 bytes"), "{text}");
    assert!(!text.contains("old_alloc") && !text.contains("new_alloc"));
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &["top", "--retained", "--by-pid", &pid, "--drop-frames", "("],
    );
    assert!(
        !ok && err.contains("--drop-frames \"(\" is not a regular expression"),
        "{err}"
    );
    // Without --baseline, both.
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &["graph", "--by-pid", &pid, "-o", svg.to_str().unwrap()],
    );
    assert!(ok, "{err}");
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("<title>old_alloc (10,000 bytes"),
        "{}",
        &text[..200]
    );
    assert_eq!(r.finish(), 0);
}

/// A capture that cannot be read is reported as the file system says (missing, a
/// directory), not as "not a heapdump graph capture", by each command that reads one.
#[test]
fn unreadable_captures_say_why() {
    let dir = region_dir("capture-errors");
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("missing.hdsnap");
    for args in [
        vec!["top", "--retained"],
        vec!["leaks"],
        vec!["retainers", "--function", "main"],
    ] {
        let mut a = args.clone();
        a.push(missing.to_str().unwrap());
        let (ok, _, err) = heapdump_cmd(&dir, &a);
        assert!(!ok);
        assert!(
            err.contains("cannot open") && err.contains("No such file or directory"),
            "{args:?}: {err}"
        );
        let mut a = args.clone();
        a.push(dir.to_str().unwrap());
        let (ok, _, err) = heapdump_cmd(&dir, &a);
        assert!(!ok);
        assert!(
            err.contains("a directory, not a graph capture"),
            "{args:?}: {err}"
        );
    }
}
