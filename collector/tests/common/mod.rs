//! Helpers for end-to-end tests: build example programs, run them under the shim, snapshot them
//! with the `heapdump` binary and read the profile back with `go tool pprof -raw`.
#![allow(dead_code)]

pub mod crafted;

use std::collections::{HashMap, HashSet};
use std::io::Lines;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// The `heapdump` binary under test.
pub fn heapdump() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_heapdump"))
}

/// Directory of the artifacts of the profile under test (target/release or target/debug).
pub fn target_dir() -> PathBuf {
    heapdump().parent().unwrap().to_owned()
}

/// `libheapdump.so` built next to the binary under test.
///
/// `HEAPDUMP_TEST_SHIM=FILE` tests another build instead (e.g. an older one, to see a test fail
/// without the fix it checks).
pub fn shim() -> PathBuf {
    if let Some(p) = std::env::var_os("HEAPDUMP_TEST_SHIM") {
        return PathBuf::from(p);
    }
    let p = target_dir().join("libheapdump.so");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --release` (or `cargo build` for debug tests) before the tests",
        p.display()
    );
    p
}

/// A fresh, private region directory for one test.
///
/// The first call of a test process removes what earlier test processes left in the temporary
/// directory (`heapdump-test-NAME-PID-N` directories, with kept regions, and the files named
/// after them) when that process is gone: a machine that runs the tests again and again must
/// not fill its disk.
pub fn region_dir(name: &str) -> PathBuf {
    static CLEAN: std::sync::Once = std::sync::Once::new();
    CLEAN.call_once(remove_stale_test_files);
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "heapdump-test-{}-{}-{}",
        name,
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Compiles `examples/c/NAME.c` (frame pointers, debug info) and returns the executable.
///
/// Compiled once per run: a build is reused while it is newer than its source (and the
/// examples' headers) and this test binary; each set of `extra` flags has its own directory
/// (`test-bins/FLAGS-HASH/NAME`: the file keeps its name, which tests look for). Tests run in
/// parallel: each build goes to a unique file that is renamed into place, and a process-wide
/// lock keeps one compiler at a time.
pub fn compile_c(name: &str, extra: &[&str]) -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let flags = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        extra.hash(&mut h);
        format!("{:016x}", h.finish())
    };
    let out_dir = target_dir().join("test-bins").join(flags);
    std::fs::create_dir_all(&out_dir).unwrap();
    let exe = out_dir.join(name);
    let tmp = out_dir.join(format!(".{name}.{}", std::process::id()));
    let src = root().join("examples/c").join(format!("{name}.c"));
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let inputs = std::fs::read_dir(root().join("examples/c"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "h"))
        .chain([src.clone(), std::env::current_exe().unwrap()]);
    let newest = inputs.filter_map(|p| mtime(&p)).max();
    if let (Some(built), Some(newest)) = (mtime(&exe), newest) {
        if built > newest {
            return exe;
        }
    }
    let st = Command::new("cc")
        .args(["-O1", "-g", "-fno-omit-frame-pointer", "-pthread", "-o"])
        .arg(&tmp)
        .arg(&src)
        .args(extra)
        .status()
        .expect("cc (gcc) must be installed");
    assert!(st.success(), "compiling {}", src.display());
    std::fs::rename(&tmp, &exe).unwrap();
    exe
}

/// A program started under the shim, waiting on stdin.
pub struct Running {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    /// Words after "ready" on its first stdout line.
    pub ready: Vec<String>,
    pub dir: PathBuf,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.ready[0].parse().unwrap()
    }
    /// The program's own tally from its "ready PID BLOCKS BYTES" line: (blocks, bytes).
    pub fn tally(&self) -> (i64, i64) {
        tally(&self.ready)
    }

    /// Waits for the next stdout line starting with `prefix`; returns the words after it.
    pub fn wait_line(&mut self, prefix: &str) -> Vec<String> {
        wait_for(&mut self.lines, prefix)
    }
    /// Closes stdin and waits; returns the exit code.
    pub fn finish(mut self) -> i32 {
        drop(self.stdin.take());
        self.child.wait().unwrap().code().unwrap_or(-1)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for(lines: &mut Lines<BufReader<ChildStdout>>, prefix: &str) -> Vec<String> {
    loop {
        match lines.next() {
            Some(Ok(l)) if l.starts_with(prefix) => {
                break l
                    .split_whitespace()
                    .skip(1)
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            }
            Some(Ok(_)) => continue,
            other => panic!("program ended before printing {prefix:?}: {other:?}"),
        }
    }
}

/// Starts `cmd` with `env` (plus HEAPDUMP_DIR=`dir`) and waits for its "ready ..." line.
pub fn start(cmd: Command, dir: &Path, preload: bool) -> Running {
    start_until(cmd, dir, preload, "ready")
}

/// Starts `cmd` and waits for its first line starting with `prefix` (stored in `ready`).
pub fn start_until(mut cmd: Command, dir: &Path, preload: bool, prefix: &str) -> Running {
    cmd.env("HEAPDUMP_DIR", dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if preload {
        cmd.env("LD_PRELOAD", shim());
    }
    // A program copied or written by a test is briefly "busy" (ETXTBSY) while a child that
    // another test thread forked still holds the writing descriptor until its exec: retry.
    let mut tries = 0;
    let mut child = loop {
        match cmd.spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => break r.expect("spawn"),
        }
    };
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let ready = wait_for(&mut lines, prefix);
    let stdin = child.stdin.take();
    Running {
        child,
        stdin,
        ready,
        dir: dir.to_owned(),
        lines,
    }
}

/// Runs `heapdump ARGS` with HEAPDUMP_DIR=`dir`; returns (success, stdout, stderr).
pub fn heapdump_cmd(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(heapdump())
        .args(args)
        .env("HEAPDUMP_DIR", dir)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A profile decoded directly (for checks too many to run through `go tool pprof`).
pub fn decode(path: &Path) -> heapdump_proto::Profile {
    use prost::Message;
    use std::io::Read;
    let mut gz = flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap());
    let mut buf = Vec::new();
    gz.read_to_end(&mut buf).unwrap();
    heapdump_proto::Profile::decode(buf.as_slice()).unwrap()
}

/// Ids of locations whose lines include function `name`.
pub fn locations_of(p: &heapdump_proto::Profile, name: &str) -> HashSet<u64> {
    let fns: HashSet<u64> = p
        .function
        .iter()
        .filter(|f| p.string_table[f.name as usize] == name)
        .map(|f| f.id)
        .collect();
    p.location
        .iter()
        .filter(|l| l.line.iter().any(|x| fns.contains(&x.function_id)))
        .map(|l| l.id)
        .collect()
}

/// Sums [alloc_objects, alloc_space, inuse_objects, inuse_space] over samples through `name`.
pub fn sum_through(p: &heapdump_proto::Profile, name: &str) -> [i64; 4] {
    let locs = locations_of(p, name);
    // By sample type: [alloc_objects, alloc_space, inuse_objects, inuse_space], 0 for a type
    // the profile lacks (a leak report's or a capture's has inuse_* only).
    let at: Vec<Option<usize>> = [
        "alloc_objects",
        "alloc_space",
        "inuse_objects",
        "inuse_space",
    ]
    .iter()
    .map(|t| {
        p.sample_type
            .iter()
            .position(|st| p.string_table[st.r#type as usize] == *t)
    })
    .collect();
    let mut out = [0i64; 4];
    for s in &p.sample {
        if s.location_id.iter().any(|l| locs.contains(l)) {
            for (o, i) in out.iter_mut().zip(&at) {
                *o += i.and_then(|i| s.value.get(i)).copied().unwrap_or(0);
            }
        }
    }
    out
}

/// Snapshots `pid` into a temporary file and returns its path.
pub fn snapshot(dir: &Path, pid: u32, extra: &[&str]) -> PathBuf {
    let out = dir.with_extension(format!("{pid}.pb.gz"));
    let pid_s = pid.to_string();
    let mut args = vec!["snapshot", "--by-pid", &pid_s, "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let (ok, so, se) = heapdump_cmd(dir, &args);
    assert!(ok, "snapshot failed: {so}{se}");
    out
}

/// One sample of a profile as `go tool pprof -raw` prints it.
#[derive(Debug, Clone)]
pub struct Sample {
    /// alloc_objects, alloc_space, inuse_objects, inuse_space.
    pub values: [i64; 4],
    pub locations: Vec<u64>,
    /// label key → values (as printed, e.g. "1024 bytes").
    pub labels: HashMap<String, Vec<String>>,
}

/// A profile read back by the reference client.
#[derive(Debug, Clone)]
pub struct Raw {
    pub samples: Vec<Sample>,
    /// location id → the text of its lines (function name, file:line), innermost first.
    pub locations: HashMap<u64, Vec<String>>,
    pub comments: Vec<String>,
}

/// Reads `profile` with `go tool pprof -raw`.
pub fn pprof_raw(profile: &Path) -> Raw {
    let out = Command::new("go")
        .args(["tool", "pprof", "-raw"])
        .arg(profile)
        .output()
        .expect(
            "`go` must be installed (Debian package golang-go): it is the reference pprof reader",
        );
    assert!(
        out.status.success(),
        "go tool pprof failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse_raw(&String::from_utf8_lossy(&out.stdout))
}

fn parse_raw(text: &str) -> Raw {
    let mut raw = Raw {
        samples: Vec::new(),
        locations: HashMap::new(),
        comments: Vec::new(),
    };
    let mut section = "";
    let mut cur_loc: Option<u64> = None;
    for line in text.lines() {
        if let Some(c) = line.strip_prefix("Comment: ") {
            raw.comments.push(c.to_owned());
            continue;
        }
        match line.trim_end() {
            "Samples:" => {
                section = "samples";
                continue;
            }
            "Locations" => {
                section = "locations";
                continue;
            }
            "Mappings" => {
                section = "mappings";
                continue;
            }
            _ => {}
        }
        match section {
            "samples" => {
                if let Some((vals, locs)) = line.split_once(':').filter(|(v, _)| {
                    let w: Vec<&str> = v.split_whitespace().collect();
                    w.len() == 4 && w.iter().all(|x| x.parse::<i64>().is_ok())
                }) {
                    let v: Vec<i64> = vals
                        .split_whitespace()
                        .map(|x| x.parse().unwrap())
                        .collect();
                    raw.samples.push(Sample {
                        values: [v[0], v[1], v[2], v[3]],
                        locations: locs
                            .split_whitespace()
                            .map(|x| x.parse().unwrap())
                            .collect(),
                        labels: HashMap::new(),
                    });
                } else if let Some(s) = raw.samples.last_mut() {
                    // One or more `key:[v v ...]` groups per line.
                    let mut rest = line.trim();
                    while let Some((k, after)) = rest.split_once(":[") {
                        let Some((v, tail)) = after.split_once(']') else {
                            break;
                        };
                        s.labels
                            .entry(k.trim().to_owned())
                            .or_default()
                            .extend(v.split(' ').filter(|x| !x.is_empty()).map(str::to_owned));
                        rest = tail.trim();
                    }
                }
            }
            "locations" => {
                let t = line.trim();
                let head = t
                    .split_once(": 0x")
                    .and_then(|(id, rest)| Some((id.parse::<u64>().ok()?, rest)));
                if let Some((id, rest)) = head {
                    cur_loc = Some(id);
                    // "ADDR M=N fn file:line s=0"
                    let text = rest.split_once(' ').map(|x| x.1).unwrap_or("");
                    let text = text.trim_start_matches(|c: char| c != ' ').trim();
                    let e = raw.locations.entry(id).or_default();
                    if !text.is_empty() {
                        e.push(text.to_owned());
                    }
                } else if let Some(id) = cur_loc {
                    if !t.is_empty() {
                        raw.locations.entry(id).or_default().push(t.to_owned());
                    }
                }
            }
            _ => {}
        }
    }
    raw
}

impl Raw {
    /// Whether location `id` has a line whose function name is `f`.
    fn loc_has(&self, id: u64, f: &str) -> bool {
        self.locations
            .get(&id)
            .is_some_and(|ls| ls.iter().any(|l| l == f || l.starts_with(&format!("{f} "))))
    }

    /// Sum of the values of samples whose stack contains function `f`.
    pub fn sum_with(&self, f: &str) -> [i64; 4] {
        let mut out = [0i64; 4];
        for s in &self.samples {
            if s.locations.iter().any(|l| self.loc_has(*l, f)) {
                for (o, v) in out.iter_mut().zip(s.values) {
                    *o += v;
                }
            }
        }
        out
    }

    /// Sum of all samples' values.
    pub fn total(&self) -> [i64; 4] {
        let mut out = [0i64; 4];
        for s in &self.samples {
            for (o, v) in out.iter_mut().zip(s.values) {
                *o += v;
            }
        }
        out
    }
}

/// (blocks, bytes) from the words after "ready": PID BLOCKS BYTES.
pub fn tally(ready: &[String]) -> (i64, i64) {
    (ready[1].parse().unwrap(), ready[2].parse().unwrap())
}

/// Output of a command run with a time limit.
#[derive(Debug)]
pub struct Timed {
    /// `None`: killed by a signal (including the time limit's SIGKILL).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Whether the time limit was reached (the command was then killed).
    pub timed_out: bool,
    pub elapsed: std::time::Duration,
}

/// Runs `cmd` (stdin null, stdout and stderr captured in temporary files) for at most `limit`;
/// a command still running then is killed with SIGKILL.
pub fn run_timeout(cmd: &mut Command, limit: std::time::Duration) -> Timed {
    let out = tempfile::tempfile().unwrap();
    let err = tempfile::tempfile().unwrap();
    let started = std::time::Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(err.try_clone().unwrap())
        .spawn()
        .expect("spawn");
    let mut timed_out = false;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if started.elapsed() > limit {
            timed_out = true;
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let elapsed = started.elapsed();
    // Lossy: a crafted region's strings may reach the output as they are.
    let read = |mut f: std::fs::File| {
        use std::io::{Read, Seek};
        let mut b = Vec::new();
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        f.read_to_end(&mut b).unwrap();
        String::from_utf8(b)
            .unwrap_or_else(|e| format!("[not UTF-8] {}", String::from_utf8_lossy(e.as_bytes())))
    };
    Timed {
        code: status.code(),
        stdout: read(out),
        stderr: read(err),
        timed_out,
        elapsed,
    }
}

/// `heapdump ARGS` with HEAPDUMP_DIR=`dir`, killed after `limit`.
pub fn heapdump_timeout(dir: &Path, args: &[&str], limit: std::time::Duration) -> Timed {
    run_timeout(
        Command::new(heapdump()).args(args).env("HEAPDUMP_DIR", dir),
        limit,
    )
}

/// The one region file in `dir`.
pub fn region_file(dir: &Path) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "heapdump"))
        .collect();
    assert_eq!(
        files.len(),
        1,
        "expected one region in {}: {files:?}",
        dir.display()
    );
    files[0].clone()
}

/// Builds the C++ program `examples/c/SRC` as `target/.../test-bins/NAME` with g++ (-O1,
/// debug information, frame pointers, no sibling calls, threads), then `extra` (given last:
/// a later -O2 overrides, a library's path is linked).
pub fn compile_cxx(src: &str, name: &str, extra: &[&str]) -> PathBuf {
    let exe = target_dir().join("test-bins").join(name);
    std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
    let st = Command::new("g++")
        .args([
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-fno-optimize-sibling-calls",
        ])
        .args(["-pthread", "-o"])
        .arg(&exe)
        .arg(root().join("examples/c").join(src))
        .args(extra)
        .status()
        .expect("g++ must be installed");
    assert!(st.success(), "compiling {src}");
    exe
}

/// Builds `examples/c/SRC` as the shared library `target/.../test-bins/NAME` with `extra` flags
/// (given last, so they override the defaults: frame pointers, -O1, no sibling calls).
pub fn compile_lib(src: &str, name: &str, extra: &[&str]) -> PathBuf {
    let lib = target_dir().join("test-bins").join(name);
    std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
    let tmp = lib.with_extension(format!("tmp{}", std::process::id()));
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer"])
        .arg("-fno-optimize-sibling-calls")
        .args(extra)
        .arg("-o")
        .arg(&tmp)
        .arg(root().join("examples/c").join(src))
        .status()
        .expect("cc (gcc) must be installed");
    assert!(st.success(), "compiling {src}");
    std::fs::rename(&tmp, &lib).unwrap();
    lib
}

/// Removes `heapdump-test-*` directories and files of test processes that are gone.
fn remove_stale_test_files() {
    let Ok(dir) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("heapdump-test-") else {
            continue;
        };
        // NAME-PID-N, possibly followed by ".ext…"
        let stem = rest.split('.').next().unwrap_or(rest);
        let mut parts = stem.rsplit('-');
        let (_n, pid) = (
            parts.next(),
            parts.next().and_then(|p| p.parse::<u32>().ok()),
        );
        let Some(pid) = pid else { continue };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let p = e.path();
        let _ = if p.is_dir() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
    }
}

/// Waits until `pid` holds a lock listed in /proc/locks (at most 10 s).
pub fn wait_for_lock(pid: u32) {
    let t0 = std::time::Instant::now();
    while !std::fs::read_to_string("/proc/locks")
        .unwrap()
        .lines()
        .any(|l| l.split_whitespace().nth(4) == Some(&pid.to_string()) && !l.contains("->"))
    {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "collector {pid} never took the region's lock"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Asserts that no address labels two per-block samples (`--with-tags`) of profile `p`;
/// `what` names the snapshot in the message.
pub fn assert_addresses_distinct(p: &heapdump_proto::Profile, what: &str) {
    let key = p
        .string_table
        .iter()
        .position(|s| s == "address")
        .expect("an address label") as i64;
    let mut seen = HashSet::new();
    for s in p.sample.iter().filter(|s| s.value[2] == 1) {
        let a = s.label.iter().find(|l| l.key == key).unwrap().num;
        assert!(seen.insert(a), "{what}: address {a:#x} appears twice");
    }
}

/// Whether a C compiler (`cc`) runs; prints the test as skipped when not (tests that build C
/// examples return early then, and say so).
pub fn can_run(test: &str) -> bool {
    let ok = Command::new("cc")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        skip_note(&format!("skipped: {test}: no C compiler (cc)"));
    }
    ok
}

/// This machine's host name, as push labels carry it.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_owned()
}

/// `examples/c/hold_sized.c N SIZE` under the shim with its regions in `dir`: N+1 blocks,
/// N*SIZE + N*8 bytes through `hold_blocks`, held until stdin closes.
pub fn hold_sized(dir: &Path, n: i64, size: i64) -> Running {
    let exe = compile_c("hold_sized", &[]);
    let mut cmd = Command::new(exe);
    cmd.arg(n.to_string()).arg(size.to_string());
    start(cmd, dir, true)
}

/// The file handshake of the collector's test hooks (`heapdump-testhooks`): `var` (e.g.
/// `HEAPDUMP_TEST_PAUSE_FILE`) names a file the collector creates when it reaches the hook,
/// then waits until the test removes it. Set [`Handshake::env`] on the command, call
/// [`Handshake::reached`] to wait for the collector (at most 60 s), act, then
/// [`Handshake::release`].
pub struct Handshake {
    var: &'static str,
    pub file: PathBuf,
}

impl Handshake {
    pub fn new(var: &'static str, dir: &Path) -> Handshake {
        let file = dir.with_extension(format!("{}.handshake", var.to_lowercase()));
        let _ = std::fs::remove_file(&file);
        Handshake { var, file }
    }
    /// The environment variable to set on the collector.
    pub fn env(&self) -> (&'static str, &Path) {
        (self.var, &self.file)
    }
    /// Waits until the collector is at the hook; panics past 60 s.
    pub fn reached(&self) {
        let t = std::time::Instant::now();
        while !self.file.exists() {
            assert!(
                t.elapsed() < std::time::Duration::from_secs(60),
                "the collector never reached its {} hook",
                self.var
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
    /// Lets the collector go on.
    pub fn release(&self) {
        std::fs::remove_file(&self.file).unwrap();
    }
}

/// Says a test is skipped: prints `LINE` ("skipped: TEST: REASON") straight to the process's
/// stderr, where `cargo test` shows it. With `CI=true` (a machine with everything installed) a
/// test that would skip fails instead.
pub fn skip_note(line: &str) {
    use std::io::Write;
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{line} (CI=true: every test must run here)");
    }
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Sets `cmd`'s address-space limit (`RLIMIT_AS`, soft and hard, as `ulimit -v` does) to
/// `bytes` in the child, before it runs.
pub fn limit_address_space(cmd: &mut Command, bytes: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: only setrlimit between fork and exec (async-signal-safe).
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            libc::setrlimit(libc::RLIMIT_AS, &lim);
            Ok(())
        })
    };
}
