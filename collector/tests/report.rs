//! `heapdump report` and `watch --report`, on `report_mix` (a steady cache, a slow leak, a
//! 1 MiB burst each second): the growth ranking puts the leak first; the timeline's totals
//! and the leak's series equal the profiles' exactly; the page loads nothing from the network;
//! headless Chromium renders it without an error, with the flame graph's frames and the
//! timeline's series in the DOM.

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// What one `watch --every 1s --count 8 --report` run of `report_mix` left, then `report`.
struct Run {
    /// The `watch -o` directory.
    dir: PathBuf,
    /// `heapdump report DIR -o ...`.
    page: PathBuf,
    /// What `watch --report` wrote after its last beat.
    live: PathBuf,
    pid: u32,
}

/// Runs it once for the tests of this file (`None`: no C compiler; the reason printed).
fn run(test: &str) -> Option<&'static Run> {
    static RUN: OnceLock<Option<Run>> = OnceLock::new();
    if !can_run(test) {
        return None;
    }
    RUN.get_or_init(|| {
        let regions = region_dir("report");
        std::fs::create_dir_all(&regions).unwrap();
        let exe = compile_c("report_mix", &["-fno-optimize-sibling-calls"]);
        let prog = start(Command::new(&exe), &regions, true);
        let pid = prog.pid();
        let out = regions.join("out");
        let live_dir = regions.join("live");
        std::fs::create_dir_all(&live_dir).unwrap();
        let live = live_dir.join("live.html");
        let (ok, _, err) = heapdump_cmd(
            &regions,
            &[
                "watch",
                "--by-pid",
                &pid.to_string(),
                "--every",
                "1s",
                "--count",
                "8",
                "-o",
                out.to_str().unwrap(),
                "--report",
                live.to_str().unwrap(),
            ],
        );
        assert!(ok, "watch: {err}");
        drop(prog);
        let page = regions.join("report.html");
        let (ok, _, err) = heapdump_cmd(
            &regions,
            &[
                "report",
                out.to_str().unwrap(),
                "-o",
                page.to_str().unwrap(),
            ],
        );
        assert!(ok, "report: {err}");
        assert!(err.contains("report of 8 snapshot(s)"), "{err}");
        Some(Run {
            dir: out,
            page,
            live,
            pid,
        })
    })
    .as_ref()
}

/// The JSON the page carries (`<script type="application/json" id="heapdump-data">`).
fn data(page: &str) -> Value {
    let open = r#"<script type="application/json" id="heapdump-data">"#;
    let start = page.find(open).expect("the data element") + open.len();
    let len = page[start..].find("</script>").expect("its end");
    serde_json::from_str(&page[start..start + len]).expect("JSON")
}

/// The profiles `watch` wrote, oldest first (their names sort by time).
fn profiles(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".pb.gz"))
        .collect();
    v.sort();
    v
}

fn i64s(v: &Value) -> Vec<i64> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_i64().expect("an integer"))
        .collect()
}

#[test]
fn the_leak_ranks_first_and_the_timeline_equals_the_profiles() {
    let Some(r) = run("the_leak_ranks_first_and_the_timeline_equals_the_profiles") else {
        return;
    };
    let page = std::fs::read_to_string(&r.page).unwrap();
    let d = data(&page);
    let procs = d["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1);
    let p = &procs[0];
    assert_eq!(p["pid"].as_u64(), Some(r.pid as u64));
    assert!(
        p["command"].as_str().unwrap().ends_with("report_mix"),
        "{}",
        p["command"]
    );

    // The timeline: one point per profile, each total the profile's inuse_space exactly,
    // and the leak's series its samples' through leak_some.
    let files = profiles(&r.dir);
    assert_eq!(files.len(), 8);
    let tl = &p["timeline"];
    let total = i64s(&tl["total"]);
    assert_eq!(total.len(), 8);
    let sites: Vec<&str> = (tl["sites"].as_array().unwrap().iter())
        .map(|s| s.as_str().unwrap())
        .collect();
    let leak_at = sites
        .iter()
        .position(|s| *s == "leak_some")
        .expect("leak_some stacked");
    let leak = i64s(&tl["series"][leak_at]);
    for (i, f) in files.iter().enumerate() {
        let prof = decode(f);
        let inuse: i64 = prof.sample.iter().map(|s| s.value[3]).sum();
        assert_eq!(total[i], inuse, "{}", f.display());
        assert_eq!(
            leak[i],
            sum_through(&prof, "leak_some")[3],
            "{}",
            f.display()
        );
    }
    // Files named by time are ordered by time; the page by the recorded instants: the same.
    let names: Vec<String> = (p["files"].as_array().unwrap().iter())
        .map(|s| s.as_str().unwrap().to_owned())
        .collect();
    let want: Vec<String> = (files.iter())
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, want);
    // The leak (50 × 128 B every 10 ms) grows through all 8 snapshots.
    assert!(leak.windows(2).all(|w| w[1] > w[0]), "{leak:?}");
    let alloc_bytes = i64s(&p["alloc_bytes"]);
    assert!(
        alloc_bytes.windows(2).all(|w| w[1] > w[0]),
        "{alloc_bytes:?}"
    );

    // The growth ranking: the leak first, with a straight line; the cache (flat) and the
    // burst (at most a few snapshots) far below.
    let growth = p["growth"].as_array().unwrap();
    assert_eq!(growth[0]["site"], "leak_some", "{growth:#?}");
    assert!(growth[0]["r2"].as_f64().unwrap() > 0.95, "{:#}", growth[0]);
    let score = |site: &str| {
        growth
            .iter()
            .find(|g| g["site"] == site)
            .map_or(0.0, |g| g["score"].as_f64().unwrap())
    };
    let leak_score = score("leak_some");
    assert!(leak_score > 100_000.0, "{leak_score}");
    assert!(score("cache_put") < leak_score / 10.0, "{growth:#?}");
    assert!(score("burst") < leak_score / 10.0, "{growth:#?}");
    // The summary.
    let s = &p["summary"];
    assert_eq!(s["snapshots"], 8);
    assert_eq!(s["last_bytes"].as_i64(), total.last().copied());
    assert_eq!(s["peak_bytes"].as_i64(), total.iter().max().copied());
    assert!(s["alloc_bytes_per_s"].as_f64().unwrap() > 0.0);

    // `watch --report` wrote the same data after its last beat, and left no temporary file.
    let live = std::fs::read_to_string(&r.live).unwrap();
    let ld = data(&live);
    assert_eq!(ld["processes"][0]["timeline"], p["timeline"]);
    assert_eq!(ld["processes"][0]["growth"], p["growth"]);
    let left: Vec<_> = std::fs::read_dir(r.live.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left, [std::ffi::OsString::from("live.html")]);
}

#[test]
fn the_page_loads_nothing_from_the_network() {
    let Some(r) = run("the_page_loads_nothing_from_the_network") else {
        return;
    };
    let page = std::fs::read_to_string(&r.page).unwrap();
    let lower = page.to_ascii_lowercase();
    // No element loads anything (no src= at all, no <link>, no <iframe>, <img>, <object>),
    // and no script or style fetches (fetch, XMLHttpRequest, import(), url(), @import).
    for needle in [
        "src=",
        "<link",
        "<iframe",
        "<img",
        "<object",
        "<embed",
        "fetch(",
        "xmlhttprequest",
        "import(",
        "url(",
        "@import",
        "navigator.sendbeacon",
        "new websocket",
        "new eventsource",
    ] {
        assert!(!lower.contains(needle), "the page contains {needle:?}");
    }
    // Every script is inline; everything is in the one file.
    assert_eq!(
        page.matches("<script").count(),
        page.matches("<script>").count() + 1
    );
    // The size stays small: 8 snapshots of a few stacks.
    let size = page.len();
    assert!(size < 1 << 20, "{size} bytes");
}

/// Headless Chromium: `chromium` on PATH (Debian's package), or `None` with `skipped:`
/// printed (a failure under CI=true, where `.ci/run` installs it).
fn chromium(test: &str) -> Option<PathBuf> {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(out) = Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
        {
            if out.status.success() {
                let p = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                if !p.is_empty() {
                    return Some(PathBuf::from(p));
                }
            }
        }
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test}: chromium is not installed (`.ci/run` installs it)"
    );
    println!("skipped: {test}: no chromium (apt-get install chromium)");
    None
}

/// Runs headless Chromium on `page` with `args` (network off, a profile of its own);
/// returns (stdout, stderr).
fn headless(browser: &Path, page: &Path, args: &[&str]) -> (String, String) {
    headless_at(browser, &format!("file://{}", page.display()), args)
}

/// [`headless`] on a URL.
fn headless_at(browser: &Path, url: &str, args: &[&str]) -> (String, String) {
    let profile = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(browser);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--enable-logging=stderr",
        "--v=0",
        // Every host name fails: a load from the network would show as an error.
        "--host-resolver-rules=MAP * ~NOTFOUND",
        "--virtual-time-budget=5000",
        "--window-size=1400,1400",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .args(args)
    .arg(url);
    let t = run_timeout(&mut cmd, std::time::Duration::from_secs(120));
    (t.stdout, t.stderr)
}

/// The width of the rect of the flame graph's frame named `frame` in `dom` (the first one).
fn frame_width(dom: &str, frame: &str) -> Option<f64> {
    let at = dom.find(&format!(r#"name="{frame}" class="frame""#))?;
    let rect = &dom[at..at + dom[at..].find("</rect>")?];
    let w = rect.split(r#"width=""#).nth(1)?;
    w[..w.find('"')?].parse().ok()
}

#[test]
fn chromium_renders_it_without_an_error() {
    let test = "chromium_renders_it_without_an_error";
    let Some(r) = run(test) else { return };
    let Some(browser) = chromium(test) else {
        return;
    };
    let (dom, err) = headless(&browser, &r.page, &["--dump-dom"]);
    // The page's script ran to its end and caught no error (window.onerror and console.error
    // write into #report-errors, which stays empty and hidden).
    assert!(dom.contains(r#"data-ready="1""#), "{err}\n{dom}");
    assert!(
        dom.contains(r#"<pre id="report-errors" class="errors" hidden=""></pre>"#),
        "{dom}"
    );
    let console: Vec<&str> = err.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(console.is_empty(), "console messages: {console:#?}");
    // The timeline's series (uPlot's legend) and the flame graph's frames (d3-flame-graph's
    // labels) are in the DOM.
    for series in ["total", "leak_some", "cache_put"] {
        assert!(
            dom.contains(&format!(r#"<div class="u-label">{series}</div>"#)),
            "timeline series {series} missing"
        );
    }
    assert!(dom.contains("<canvas"), "no chart drawn");
    assert!(
        dom.contains(r#"class="partition d3-flame-graph""#),
        "no flame graph"
    );
    // Each frame drawn with its width: at the last snapshot the leak (over 3 MiB) is wider
    // than the cache (1.2 MiB), and both fit in main.
    let width = |frame: &str| frame_width(&dom, frame).expect(frame);
    let (leak, cache, main) = (width("leak_some"), width("cache_put"), width("main"));
    assert!(cache > 10.0, "{cache}");
    assert!(leak > cache, "{leak} {cache}");
    assert!(leak + cache <= main + 1.0, "{leak} {cache} {main}");
    // What is new between the first and the last snapshot (`#new`): the leak's stack grew,
    // the cache's (same blocks count, same size) did not.
    let (dom, err) = headless_at(
        &browser,
        &format!("file://{}#new", r.page.display()),
        &["--dump-dom"],
    );
    assert!(dom.contains(r#"data-ready="1""#), "{err}");
    assert!(
        dom.contains(r#"name="new between #1 and #8" class="frame""#),
        "{dom}"
    );
    let leak = frame_width(&dom, "leak_some").expect("leak_some");
    // The cache may differ by the one block being replaced at an instant (64 B).
    let cache = frame_width(&dom, "cache_put").unwrap_or(0.0);
    assert!(leak > 100.0 && cache < leak / 1000.0, "{leak} {cache}");
    // A screenshot, to look at (kept in the target directory).
    let shot = target_dir().join("test-bins").join("report-screenshot.png");
    let _ = std::fs::remove_file(&shot);
    let (_, err) = headless(
        &browser,
        &r.page,
        &[&format!("--screenshot={}", shot.display())],
    );
    let png = std::fs::read(&shot).unwrap_or_else(|e| panic!("{}: {e}\n{err}", shot.display()));
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    println!("screenshot: {}", shot.display());
}

#[test]
fn bad_inputs_are_refused_clearly() {
    let test = "bad_inputs_are_refused_clearly";
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("r.html");
    let o = out.to_str().unwrap();
    // A missing input.
    let missing = d.path().join("nope");
    let (ok, _, err) = heapdump_cmd(d.path(), &["report", missing.to_str().unwrap(), "-o", o]);
    assert!(!ok && err.contains("nope"), "{err}");
    // A directory with no profiles; a broken profile in it is skipped with a warning.
    let empty = d.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::write(empty.join("broken.pb.gz"), b"\x1f\x8bnot really").unwrap();
    std::fs::write(empty.join("broken.hdsnap"), b"not a capture").unwrap();
    let (ok, _, err) = heapdump_cmd(d.path(), &["report", empty.to_str().unwrap(), "-o", o]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("skipped") && err.contains("broken.pb.gz"),
        "{err}"
    );
    assert!(
        err.contains("skipped") && err.contains("broken.hdsnap"),
        "{err}"
    );
    assert!(err.contains("no heapdump profiles"), "{err}");
    // A name another user chose, with terminal escapes (helper E, F7): escaped in the warning
    // of a directory's skipped file and in the error of a file named.
    let esc = d.path().join("esc");
    std::fs::create_dir(&esc).unwrap();
    let evil = esc.join("b\x1b[2J\x1b]0;PWN\x07.pb.gz");
    std::fs::write(&evil, b"\x1f\x8bnot really").unwrap();
    let (ok, _, err) = heapdump_cmd(d.path(), &["report", esc.to_str().unwrap(), "-o", o]);
    assert!(
        !ok && err.contains("skipped") && err.contains("\\u{1b}[2J"),
        "{err}"
    );
    assert!(!err.contains('\x1b') && !err.contains('\x07'), "{err:?}");
    let svg = d.path().join("r.svg");
    for cmd in [&["report"][..], &["convert"][..]] {
        let mut args = cmd.to_vec();
        let out = if cmd == ["convert"] {
            svg.to_str().unwrap()
        } else {
            o
        };
        args.extend([evil.to_str().unwrap(), "-o", out]);
        let (ok, _, err) = heapdump_cmd(d.path(), &args);
        assert!(!ok && err.contains("PWN"), "{cmd:?}: {err}");
        assert!(
            !err.contains('\x1b') && !err.contains('\x07'),
            "{cmd:?}: {err:?}"
        );
    }
    // The same broken files named: an error.
    for name in ["broken.pb.gz", "broken.hdsnap"] {
        let broken = empty.join(name);
        let (ok, _, err) = heapdump_cmd(d.path(), &["report", broken.to_str().unwrap(), "-o", o]);
        assert!(!ok && err.contains(name), "{err}");
    }
    assert!(!out.exists());
    // --pid of a process not among the inputs.
    let Some(r) = run(test) else { return };
    let (ok, _, err) = heapdump_cmd(
        d.path(),
        &["report", r.dir.to_str().unwrap(), "--pid", "1", "-o", o],
    );
    assert!(!ok, "{err}");
    assert!(
        err.contains("--pid 1") && err.contains(&format!("pid {} (report_mix)", r.pid)),
        "{err}"
    );
    // --pid of the one there: that section only.
    let (ok, _, err) = heapdump_cmd(
        d.path(),
        &[
            "report",
            r.dir.to_str().unwrap(),
            "--pid",
            &r.pid.to_string(),
            "-o",
            o,
        ],
    );
    assert!(ok, "{err}");
    let page = std::fs::read_to_string(&out).unwrap();
    assert_eq!(data(&page)["processes"].as_array().unwrap().len(), 1);
    // A directory whose profile has a name that is not UTF-8 is read; a symbolic link and a
    // FIFO named like profiles are skipped with a warning naming them (not followed, not
    // opened: a FIFO would block the report for ever).
    use std::os::unix::ffi::OsStrExt;
    let odd = d.path().join("odd");
    std::fs::create_dir(&odd).unwrap();
    let first = profiles(&r.dir).into_iter().next().unwrap();
    let latin1 = odd.join(std::ffi::OsStr::from_bytes(b"caf\xe9-1.pb.gz"));
    std::fs::copy(&first, &latin1).unwrap();
    std::os::unix::fs::symlink(&first, odd.join("link.pb.gz")).unwrap();
    let fifo = odd.join("fifo.pb.gz");
    let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string; mkfifo only creates the file.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (ok, _, err) = heapdump_cmd(d.path(), &["report", odd.to_str().unwrap(), "-o", o]);
    assert!(ok, "{err}");
    assert!(err.contains("report of 1 snapshot(s)"), "{err}");
    assert!(err.contains("link.pb.gz: a symbolic link"), "{err}");
    assert!(err.contains("fifo.pb.gz: not a regular file"), "{err}");
}

#[test]
fn watch_keep_bounds_the_report_as_it_bounds_the_directory() {
    if !can_run("watch_keep_bounds_the_report_as_it_bounds_the_directory") {
        return;
    }
    let regions = region_dir("report-keep");
    std::fs::create_dir_all(&regions).unwrap();
    let prog = hold_sized(&regions, 100, 1000);
    let out = regions.join("out");
    let page = regions.join("keep.html");
    let (ok, _, err) = heapdump_cmd(
        &regions,
        &[
            "watch",
            "--by-pid",
            &prog.pid().to_string(),
            "--every",
            "1s",
            "--count",
            "3",
            "--keep",
            "2",
            "-o",
            out.to_str().unwrap(),
            "--report",
            page.to_str().unwrap(),
        ],
    );
    assert!(ok, "{err}");
    let files = profiles(&out);
    assert_eq!(files.len(), 2);
    let d = data(&std::fs::read_to_string(&page).unwrap());
    let p = &d["processes"][0];
    let names: Vec<String> = (p["files"].as_array().unwrap().iter())
        .map(|s| s.as_str().unwrap().to_owned())
        .collect();
    let want: Vec<String> = (files.iter())
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, want);
    // hold_sized holds 100 blocks of 1000 B and their array of pointers, no more, no less.
    let total = i64s(&p["timeline"]["total"]);
    for (t, f) in total.iter().zip(&files) {
        let prof = decode(f);
        assert_eq!(*t, prof.sample.iter().map(|s| s.value[3]).sum::<i64>());
        assert_eq!(sum_through(&prof, "hold_blocks")[3], 100 * 1000 + 100 * 8);
    }
}

/// The (bytes, blocks) of each kind ("Direct", "Indirect") `heapdump leaks` printed.
fn leak_totals(text: &str) -> [(u64, u64); 2] {
    let mut t = [(0, 0); 2];
    for l in text.lines() {
        let k = if l.starts_with("Direct leak of ") {
            0
        } else if l.starts_with("Indirect leak of ") {
            1
        } else {
            continue;
        };
        let w: Vec<&str> = l.split_whitespace().collect();
        t[k].0 += w[3].parse::<u64>().unwrap();
        t[k].1 += w[6].parse::<u64>().unwrap();
    }
    t
}

#[test]
fn leaks_profiles_and_graph_captures_get_sections_of_their_own() {
    let test = "leaks_profiles_and_graph_captures_get_sections_of_their_own";
    if !can_run(test) {
        return;
    }
    let dir = region_dir("report-sections");
    std::fs::create_dir_all(&dir).unwrap();
    let lib = compile_lib("leaky_lib.c", "libleaky.so", &[]);
    let exe = compile_c("leaky", &["-fno-optimize-sibling-calls", "-ldl"]);
    let mut cmd = Command::new(&exe);
    cmd.arg(&lib);
    let prog = start(cmd, &dir, true);
    let pid = prog.pid().to_string();
    let inputs = dir.join("inputs");
    std::fs::create_dir_all(&inputs).unwrap();
    let at = |name: &str| inputs.join(name).to_str().unwrap().to_owned();

    // Two snapshots, a `leaks -o` profile and a graph capture of the same process.
    for name in ["a.pb.gz", "c.pb.gz"] {
        let (ok, _, err) = heapdump_cmd(&dir, &["snapshot", "--by-pid", &pid, "-o", &at(name)]);
        assert!(ok, "snapshot: {err}");
        if name == "a.pb.gz" {
            let (ok, text, err) = heapdump_cmd(
                &dir,
                &["leaks", "--by-pid", &pid, "-o", &at("b-leaks.pb.gz")],
            );
            assert!(ok, "leaks: {err}");
            let (ok, _, err) =
                heapdump_cmd(&dir, &["graph", "--by-pid", &pid, "-o", &at("g.hdsnap")]);
            assert!(ok, "graph: {err}");
            std::fs::write(dir.join("leaks.txt"), text).unwrap();
        }
    }
    drop(prog);
    let printed = std::fs::read_to_string(dir.join("leaks.txt")).unwrap();
    let [(direct, direct_blocks), (indirect, indirect_blocks)] = leak_totals(&printed);
    // What leaky.c plants (tests/graph.rs checks `leaks` finds exactly that).
    assert_eq!(
        (direct, direct_blocks),
        (48 + 24 + 216, 1 + 1 + 3),
        "{printed}"
    );
    assert_eq!((indirect, indirect_blocks), (432 + 80, 9 + 2), "{printed}");
    let (ok, top, err) = heapdump_cmd(&dir, &["top", "--retained", "--json", &at("g.hdsnap")]);
    assert!(ok, "top: {err}");
    let top: Value = serde_json::from_str(&top).unwrap();

    let page = dir.join("sections.html");
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &[
            "report",
            inputs.to_str().unwrap(),
            "-o",
            page.to_str().unwrap(),
        ],
    );
    assert!(ok, "report: {err}");
    assert!(
        err.contains("report of 2 snapshot(s) and 2 leaks/reference-graph section(s)"),
        "{err}"
    );
    let d = data(&std::fs::read_to_string(&page).unwrap());
    let procs = d["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{d}");
    let p = &procs[0];

    // The timeline: the two snapshots only.
    assert_eq!(p["files"], serde_json::json!(["a.pb.gz", "c.pb.gz"]));
    assert_eq!(p["timeline"]["total"].as_array().unwrap().len(), 2);

    // Leaks: what `leaks` printed, by kind and by site.
    let leaks = p["leaks"].as_array().unwrap();
    assert_eq!(leaks.len(), 1);
    let l = &leaks[0];
    assert_eq!(l["file"], "b-leaks.pb.gz");
    assert!(l["t_ns"].as_i64().unwrap() > 0, "{l}");
    assert_eq!(l["direct_bytes"].as_u64(), Some(direct));
    assert_eq!(l["direct_blocks"].as_u64(), Some(direct_blocks));
    assert_eq!(l["indirect_bytes"].as_u64(), Some(indirect));
    assert_eq!(l["indirect_blocks"].as_u64(), Some(indirect_blocks));
    let sites: Vec<(String, i64, i64)> = (l["sites"].as_array().unwrap().iter())
        .map(|s| {
            (
                s["site"].as_str().unwrap().to_owned(),
                s["bytes"].as_i64().unwrap(),
                s["blocks"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        sites,
        vec![
            ("make_list".to_owned(), 480, 10),
            ("make_lost".to_owned(), 216, 3),
            ("make_cycle".to_owned(), 80, 2),
            ("make_masked".to_owned(), 24, 1),
        ]
    );

    // Reference graph: the capture's size and `top --retained`'s ranking.
    let graphs = p["graphs"].as_array().unwrap();
    assert_eq!(graphs.len(), 1);
    let g = &graphs[0];
    assert_eq!(g["file"], "g.hdsnap");
    assert!(g["blocks"].as_u64().unwrap() > 20, "{g}");
    assert!(g["roots"].as_u64().unwrap() > 0, "{g}");
    let top_sites = top["sites"].as_array().unwrap();
    assert_eq!(g["sites"][0], top_sites[0], "{g}\n{top}");
    let n = top_sites.len().min(g["sites"].as_array().unwrap().len());
    assert_eq!(g["sites"].as_array().unwrap()[..n], top_sites[..n]);

    // Without snapshots (the capture and the leaks profile given by name): the process has
    // its two sections and no summary, timeline or flame graph.
    let only = dir.join("only-sections.html");
    let (ok, _, err) = heapdump_cmd(
        &dir,
        &[
            "report",
            &at("g.hdsnap"),
            &at("b-leaks.pb.gz"),
            "-o",
            only.to_str().unwrap(),
        ],
    );
    assert!(ok, "report: {err}");
    assert!(
        err.contains("report of 0 snapshot(s) and 2 leaks/reference-graph section(s)"),
        "{err}"
    );
    let d = data(&std::fs::read_to_string(&only).unwrap());
    let q = &d["processes"][0];
    assert_eq!(q["pid"].as_u64(), p["pid"].as_u64(), "{d}");
    assert!(q["summary"].is_null() && q.get("timeline").is_none(), "{q}");
    assert_eq!(q["leaks"], p["leaks"]);
    assert_eq!(q["graphs"], p["graphs"]);

    // Both pages render in Chromium without an error, the sections' tables in the DOM.
    let Some(browser) = chromium(test) else {
        return;
    };
    for page in [&page, &only] {
        let (dom, err) = headless(&browser, page, &["--dump-dom"]);
        assert!(dom.contains(r#"data-ready="1""#), "{err}\n{dom}");
        assert!(
            dom.contains(r#"<pre id="report-errors" class="errors" hidden=""></pre>"#),
            "{dom}"
        );
        let console: Vec<&str> = err.lines().filter(|l| l.contains(":CONSOLE")).collect();
        assert!(console.is_empty(), "console messages: {console:#?}");
        assert!(
            dom.contains(r#"<td class="site" title="make_list">make_list</td>"#),
            "{dom}"
        );
        let top_site = top_sites[0]["site"].as_str().unwrap();
        assert!(
            dom.contains(&format!(
                r#"<td class="site" title="{top_site}">{top_site}</td>"#
            )),
            "{dom}"
        );
        assert!(
            dom.contains("Reference graph: what retains the most"),
            "{dom}"
        );
    }
}
