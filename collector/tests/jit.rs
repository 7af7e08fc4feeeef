//! Generated code by name (issue 18, items 2 and 3): CPython's perf trampolines (`-X perf`,
//! `PYTHONPERFSUPPORT=1`, `-X perf_jit`) stepped over by the unwinder and named from the perf
//! map or jitdump; node with `--perf-basic-prof`, whose JS functions are named from the perf
//! map and whose embedded builtins run from a mapping `dl_iterate_phdr` does not report; and
//! post-mortem snapshots that still have the names.

mod common;

use common::*;
use heapdump_proto::Profile;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Buffers of examples/jit/make_buffers.js: 2,000 of 20,000 + (i % 7) bytes.
const NODE_BYTES: i64 = 40_006_000;
/// Bytearray buffers of examples/jit/perf_items.py: 20,000 of 1,000 + (i % 7) bytes.
const PY_BYTES: i64 = 20_060_000;

/// Live bytes (inuse_space) in all, and in samples with a frame that has no name (a location
/// with no function).
fn unnamed_bytes(p: &Profile) -> (i64, i64) {
    let unnamed: std::collections::HashSet<u64> = p
        .location
        .iter()
        .filter(|l| {
            l.line.is_empty()
                || l.line.iter().all(|x| {
                    p.function
                        .iter()
                        .find(|f| f.id == x.function_id)
                        .is_none_or(|f| p.string_table[f.name as usize].is_empty())
                })
        })
        .map(|l| l.id)
        .collect();
    let (mut all, mut bad) = (0, 0);
    for s in &p.sample {
        all += s.value[3];
        if s.location_id.iter().any(|l| unnamed.contains(l)) {
            bad += s.value[3];
        }
    }
    (all, bad)
}

/// Live bytes in samples where function `inner` is called (at some depth) by `outer`.
fn bytes_with_caller(p: &Profile, inner: &str, outer: &str) -> i64 {
    let (i, o) = (locations_of(p, inner), locations_of(p, outer));
    p.sample
        .iter()
        .filter(|s| {
            let at = |set: &std::collections::HashSet<u64>| {
                s.location_id.iter().position(|l| set.contains(l))
            };
            matches!((at(&i), at(&o)), (Some(a), Some(b)) if a < b)
        })
        .map(|s| s.value[3])
        .sum()
}

/// The file names of functions named `name`.
fn files_of(p: &Profile, name: &str) -> Vec<String> {
    let mut v: Vec<String> = p
        .function
        .iter()
        .filter(|f| p.string_table[f.name as usize] == name)
        .map(|f| p.string_table[f.filename as usize].clone())
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Removes the perf map and jitdump files a target left in /tmp.
fn remove_jit_files(pid: u32) {
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    let _ = std::fs::remove_file(format!("/tmp/jit-{pid}.dump"));
}

fn node() -> Option<PathBuf> {
    let ok = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then(|| PathBuf::from("node"))
}

/// `pythonX.Y` from PATH or pyenv (`$PYENV_ROOT` or `~/.pyenv`), if it runs.
fn python(version: &str) -> Option<PathBuf> {
    let mut candidates = vec![PathBuf::from(format!("python{version}"))];
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")));
    if let Some(versions) = root.map(|r| r.join("versions")) {
        let mut found: Vec<PathBuf> = std::fs::read_dir(versions)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                n == version || n.starts_with(&format!("{version}."))
            })
            .map(|e| e.path().join("bin").join(format!("python{version}")))
            .collect();
        found.sort();
        candidates.extend(found.into_iter().rev());
    }
    candidates.into_iter().find(|p| {
        Command::new(p)
            .args(["-c", "import sys; print(sys.version)"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

fn script(name: &str) -> PathBuf {
    root().join("examples/jit").join(name)
}

/// Node with `--perf-basic-prof` (and `--interpreted-frames-native-stack`, which gives each
/// interpreted function a frame of its own): every Buffer under makeBuffers, under
/// `__libc_start_call_main`, no byte under a frame without a name. Without the perf map and the
/// remapped builtins, 43 % of the bytes were under unnamed frames.
#[test]
fn node_js_functions_named_from_the_perf_map() {
    let Some(node) = node() else {
        skip_note("skipped: node_js_functions_named_from_the_perf_map: node is not installed");
        return;
    };
    for flags in [
        &["--perf-basic-prof", "--interpreted-frames-native-stack"][..],
        &["--perf-basic-prof"][..],
    ] {
        let dir = region_dir("jit-node");
        // node may write logs (isolate-*-v8.log) into its working directory.
        let cwd = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(&node);
        cmd.args(flags)
            .arg(script("make_buffers.js"))
            .current_dir(cwd.path());
        let r = start(cmd, &dir, true);
        let pid = r.pid();
        let profile = snapshot(&dir, pid, &[]);
        drop(r);
        remove_jit_files(pid);
        let p = decode(&profile);
        let (all, unnamed) = unnamed_bytes(&p);
        assert!(all >= NODE_BYTES, "{flags:?}: {all} live bytes");
        assert_eq!(
            unnamed_code_warnings(&p),
            Vec::<String>::new(),
            "{flags:?}: named code reported as unnamed"
        );
        assert!(
            unnamed * 100 <= all,
            "{flags:?}: {unnamed} of {all} live bytes under unnamed frames"
        );
        let under = sum_through(&p, "makeBuffers")[3];
        let files = files_of(&p, "makeBuffers");
        assert_eq!(
            files,
            vec![script("make_buffers.js").display().to_string()],
            "{flags:?}"
        );
        if flags.len() == 2 {
            // Every Buffer, whichever tier ran makeBuffers.
            assert!(
                under >= NODE_BYTES * 9 / 10,
                "{flags:?}: {under} bytes under makeBuffers"
            );
            assert!(
                bytes_with_caller(&p, "makeBuffers", "__libc_start_call_main")
                    >= NODE_BYTES * 9 / 10
            );
        } else {
            // Interpreted frames run in the shared InterpreterEntryTrampoline builtin: only
            // what ran compiled (Sparkplug, Maglev, TurboFan) is under the function's name.
            assert!(under > 0, "{flags:?}: nothing under makeBuffers");
        }
    }
}

/// `heapdump run -- node …` names JavaScript functions without being asked: it adds the
/// perf-map flags to `NODE_OPTIONS` (after what the user had there), says so once on stderr,
/// and removes the perf map at a normal exit. The live profile has every Buffer under
/// `makeBuffers` and no unnamed-code warning; `--no-jit-names`, or node asked for a perf map
/// already, leave `NODE_OPTIONS` alone.
#[test]
fn heapdump_run_names_node_code_unasked() {
    let Some(node) = node() else {
        skip_note("skipped: heapdump_run_names_node_code_unasked: node is not installed");
        return;
    };
    const FLAGS: &str = "--perf-basic-prof --interpreted-frames-native-stack";
    let dir = region_dir("jit-node-run");
    let cwd = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(heapdump());
    cmd.arg("run")
        .arg("--")
        .arg(&node)
        .arg(script("make_buffers.js"))
        .env("NODE_OPTIONS", "--max-old-space-size=300")
        .current_dir(cwd.path());
    let r = start(cmd, &dir, false);
    let pid = r.pid();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let options: Vec<&[u8]> = environ
        .split(|&b| b == 0)
        .filter_map(|v| v.strip_prefix(b"NODE_OPTIONS="))
        .collect();
    assert_eq!(
        options,
        vec![format!("--max-old-space-size=300 {FLAGS}").as_bytes()]
    );
    let p = decode(&snapshot(&dir, pid, &[]));
    let (all, unnamed) = unnamed_bytes(&p);
    assert!(all >= NODE_BYTES, "{all} live bytes");
    assert_eq!(unnamed_code_warnings(&p), Vec::<String>::new());
    assert!(unnamed * 100 <= all, "{unnamed} of {all} bytes unnamed");
    let under = sum_through(&p, "makeBuffers")[3];
    assert!(
        under >= NODE_BYTES * 9 / 10,
        "{under} bytes under makeBuffers"
    );
    // The Buffers' site is the program's function, not node's C++ or node's own `Buffer.alloc`
    // (`node:buffer`): each is one calloc'd backing store, held from V8's heap.
    let (ok, json, err) = heapdump_cmd(
        &dir,
        &[
            "top",
            "--retained",
            "--json",
            "--top",
            "100000",
            "--by-pid",
            &pid.to_string(),
        ],
    );
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let make = (v["sites"].as_array().unwrap().iter())
        .find(|s| s["site"] == "makeBuffers (make_buffers.js)")
        .map(|s| {
            (
                s["blocks"].as_u64().unwrap(),
                s["retained"].as_u64().unwrap(),
            )
        });
    let (blocks, retained) = make.unwrap_or_default();
    assert!(
        blocks >= 2000 && retained >= NODE_BYTES as u64 * 9 / 10,
        "makeBuffers: {blocks} blocks, {retained} bytes: {json}"
    );
    let map = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    assert!(map.exists(), "node wrote no perf map");
    assert_eq!(r.finish(), 0);
    assert!(
        !map.exists(),
        "{} left behind after a normal exit",
        map.display()
    );
    remove_jit_files(pid);

    // What it says, and when it leaves NODE_OPTIONS alone.
    let run = |args: &[&str], js: &str| {
        let out = Command::new(heapdump())
            .arg("run")
            .args(args)
            .arg("--")
            .arg(&node)
            .args(["-e", js])
            .env("HEAPDUMP_DIR", &dir)
            .env_remove("NODE_OPTIONS")
            .current_dir(cwd.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        (
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (said, err) = run(&[], "console.log(process.pid, process.env.NODE_OPTIONS)");
    assert_eq!(
        err.trim_end(),
        format!(
            "heapdump: node: NODE_OPTIONS gains {FLAGS}, so that its JavaScript functions have \
             names (node writes /tmp/perf-PID.map, removed at a normal exit; --no-jit-names \
             leaves NODE_OPTIONS alone)"
        )
    );
    let (pid, options) = said.split_once(' ').unwrap();
    assert_eq!(options, FLAGS);
    assert!(!Path::new(&format!("/tmp/perf-{pid}.map")).exists());
    // Node started by node inherits the flags, and removes its own map at a normal exit
    // (with --keep, both maps stay, as both regions do).
    // The child's exit status is printed too: a child that died of a signal would keep its map
    // and must fail here as what it is.
    let spawn = "const c = require('child_process').spawnSync(process.execPath, \
                 ['-e', 'Buffer.alloc(1000); console.log(process.pid)']); \
                 console.log(process.pid, String(c.stdout).trim(), c.status, c.signal)";
    for keep in [false, true] {
        let args: &[&str] = if keep { &["--keep"] } else { &[] };
        // Once in one CI run (of many) the child's map was left behind by a child that
        // exited normally (cause not found; README's "Limitations" does not promise it): a
        // map left behind is retried once, and said.
        for attempt in 0..2 {
            let (said, _) = run(args, spawn);
            let words: Vec<&str> = said.split(' ').collect();
            assert_eq!(words.len(), 4, "{said}");
            assert_eq!(words[2..], ["0", "null"], "the child's exit: {said}");
            let pids: Vec<u32> = words[..2].iter().map(|p| p.parse().unwrap()).collect();
            let left: Vec<String> = (pids.iter())
                .map(|pid| format!("/tmp/perf-{pid}.map"))
                .filter(|m| Path::new(m).exists() != keep)
                .collect();
            pids.iter().for_each(|&pid| remove_jit_files(pid));
            if left.is_empty() {
                break;
            }
            assert!(attempt == 0, "{left:?} (--keep: {keep})");
            eprintln!("KNOWN FLAKE (retrying once): {left:?} (--keep: {keep})");
        }
    }
    // A script node runs (`#!/usr/bin/env node`, as npm's and yarn's are) gets the flags too,
    // and its map goes at exit.
    let app = cwd.path().join("app.js");
    std::fs::write(
        &app,
        "#!/usr/bin/env node\nconsole.log(process.pid, process.env.NODE_OPTIONS)\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&app, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(heapdump())
        .args(["run", "--"])
        .arg(&app)
        .env("HEAPDUMP_DIR", &dir)
        .env_remove("NODE_OPTIONS")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    let (pid, options) = said.trim().split_once(' ').unwrap();
    assert_eq!(options, FLAGS);
    assert!(!Path::new(&format!("/tmp/perf-{pid}.map")).exists());
    // A process that is not node keeps a perf map of its own (the shell writes one and exits).
    let (said, _) = run(
        &[],
        "const c = require('child_process').spawnSync('sh', \
         ['-c', 'echo x > /tmp/perf-$$.map; echo $$']); console.log(String(c.stdout).trim())",
    );
    let map = format!("/tmp/perf-{said}.map");
    assert!(Path::new(&map).exists(), "{map} of a shell removed");
    remove_jit_files(said.parse().unwrap());
    let (said, err) = run(&["--no-jit-names"], "console.log(process.env.NODE_OPTIONS)");
    assert_eq!((said.as_str(), err.as_str()), ("undefined", ""));
    let (said, err) = run(
        &["--keep"],
        "console.log(process.pid, process.env.NODE_OPTIONS)",
    );
    let (pid, options) = said.split_once(' ').unwrap();
    assert_eq!(options, FLAGS);
    assert!(
        err.contains("(node writes /tmp/perf-PID.map; --no-jit-names"),
        "{err}"
    );
    // Kept for the kept region's post-mortem snapshots.
    assert!(Path::new(&format!("/tmp/perf-{pid}.map")).exists());
    remove_jit_files(pid.parse().unwrap());
}

/// The profile's comments that report bytes under generated code without names.
fn unnamed_code_warnings(p: &Profile) -> Vec<String> {
    p.comment
        .iter()
        .map(|&i| p.string_table[i as usize].clone())
        .filter(|c| c.contains("generated code that has no name"))
        .collect()
}

/// Node without its flags names none of its JavaScript functions: the snapshot says how many
/// live bytes are under that unnamed code — as many as the profile has under frames in no
/// mapping and without a name, of all its live bytes — and which flags name it, on stderr and in the profile's
/// comments. (With the flags, `node_js_functions_named_from_the_perf_map` finds no such
/// comment.)
#[test]
fn node_without_flags_is_told_how_to_name_its_code() {
    let Some(node) = node() else {
        skip_note(
            "skipped: node_without_flags_is_told_how_to_name_its_code: node is not installed",
        );
        return;
    };
    let dir = region_dir("jit-node-bare");
    let cwd = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(&node);
    cmd.arg(script("make_buffers.js")).current_dir(cwd.path());
    let r = start(cmd, &dir, true);
    let pid = r.pid();
    let out = dir.with_extension(format!("{pid}.pb.gz"));
    let pid_s = pid.to_string();
    let (ok, so, se) = heapdump_cmd(
        &dir,
        &["snapshot", "--by-pid", &pid_s, "-o", out.to_str().unwrap()],
    );
    drop(r);
    remove_jit_files(pid);
    assert!(ok, "snapshot failed: {so}{se}");
    let p = decode(&out);
    let (all, _) = unnamed_bytes(&p);
    assert!(all >= NODE_BYTES, "{all} live bytes");
    // Frames in no mapping (no module, no JIT range) and without a name: generated code.
    let generated: std::collections::HashSet<u64> = p
        .location
        .iter()
        .filter(|l| l.mapping_id == 0 && l.line.is_empty())
        .map(|l| l.id)
        .collect();
    let unnamed: i64 = p
        .sample
        .iter()
        .filter(|s| s.location_id.iter().any(|l| generated.contains(l)))
        .map(|s| s.value[3])
        .sum();
    // make_buffers.js: every Buffer is made under JS code, interpreted or compiled.
    assert!(
        unnamed >= NODE_BYTES * 9 / 10,
        "{unnamed} of {all} bytes unnamed"
    );
    let warned = unnamed_code_warnings(&p);
    assert_eq!(warned.len(), 1, "{warned:?}");
    let w = &warned[0];
    assert!(
        w.contains(&format!("({unnamed} of {all})")),
        "{w}: the profile has {unnamed} of {all} live bytes under unnamed frames"
    );
    assert!(
        w.contains("--perf-basic-prof --interpreted-frames-native-stack"),
        "{w}"
    );
    assert!(
        se.contains(&format!("heapdump: warning: {w}")),
        "stderr: {se}"
    );
}

/// A post-mortem snapshot of node (`HEAPDUMP_KEEP=1`, taken after exit) still names the JS
/// function (the perf map stays) and the embedded builtins (the shim recorded their mapping).
#[test]
fn node_post_mortem_keeps_the_names() {
    let Some(node) = node() else {
        skip_note("skipped: node_post_mortem_keeps_the_names: node is not installed");
        return;
    };
    let dir = region_dir("jit-node-pm");
    let cwd = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(&node);
    cmd.current_dir(cwd.path());
    cmd.args(["--perf-basic-prof", "--interpreted-frames-native-stack"])
        .arg(script("make_buffers.js"))
        .env("HEAPDUMP_KEEP", "1");
    let r = start(cmd, &dir, true);
    let pid = r.pid();
    assert_eq!(r.finish(), 0);
    let profile = snapshot(&dir, pid, &[]);
    remove_jit_files(pid);
    let p = decode(&profile);
    let (all, unnamed) = unnamed_bytes(&p);
    assert!(
        unnamed * 100 <= all,
        "{unnamed} of {all} live bytes under unnamed frames"
    );
    let under = sum_through(&p, "makeBuffers")[3];
    assert!(
        under >= NODE_BYTES * 9 / 10,
        "{under} bytes under makeBuffers"
    );
}

/// Runs perf_items.py under `python` with `args` before the script and `env`; returns the
/// live profile, or with `post_mortem` the one taken after it exited (script mode `thread`).
fn python_profile(
    python: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    post_mortem: bool,
) -> Profile {
    let dir = region_dir("jit-python");
    let mut cmd = Command::new(python);
    cmd.args(args).arg(script("perf_items.py"));
    cmd.envs(env.iter().copied());
    if post_mortem {
        cmd.arg("thread").env("HEAPDUMP_KEEP", "1");
    }
    let r = start(cmd, &dir, true);
    let pid = r.pid();
    let profile = if post_mortem {
        assert_eq!(r.finish(), 0);
        snapshot(&dir, pid, &[])
    } else {
        let p = snapshot(&dir, pid, &[]);
        drop(r);
        p
    };
    remove_jit_files(pid);
    decode(&profile)
}

/// CPython 3.12 and 3.13 with `-X perf` (and 3.12 with `PYTHONPERFSUPPORT=1`): stacks walk
/// through the trampolines to `Py_BytesMain` for ≥ 95 % of the live bytes (4.6 % before the
/// unwinder stepped over them) and name the Python functions, in call order, with their file,
/// each once: the Python frames the shim splices in (with their line) stand for the
/// trampolines beside them, which the perf map names `py::make_items:FILE`.
#[test]
fn python_perf_trampolines_walked_and_named() {
    for (version, args, env) in [
        ("3.12", &["-X", "perf"][..], &[][..]),
        ("3.12", &[][..], &[("PYTHONPERFSUPPORT", "1")][..]),
        ("3.13", &["-X", "perf"][..], &[][..]),
    ] {
        let Some(py) = python(version) else {
            skip_note(&format!(
                "skipped: python_perf_trampolines_walked_and_named: python{version} not found"
            ));
            continue;
        };
        let p = python_profile(&py, args, env, false);
        let what = format!("python{version} {args:?} {env:?}");
        let (all, unnamed) = unnamed_bytes(&p);
        let to_main = sum_through(&p, "Py_BytesMain")[3];
        assert!(
            to_main * 100 >= all * 95,
            "{what}: {to_main} of {all} live bytes reach Py_BytesMain"
        );
        assert!(
            unnamed * 100 <= all,
            "{what}: {unnamed} of {all} live bytes under unnamed frames"
        );
        let chain = bytes_with_caller(&p, "make_items", "outer");
        assert!(
            chain >= PY_BYTES,
            "{what}: {chain} bytes under make_items called by outer"
        );
        assert!(
            bytes_with_caller(&p, "outer", "<module>") >= PY_BYTES,
            "{what}"
        );
        assert!(
            bytes_with_caller(&p, "<module>", "Py_BytesMain") >= PY_BYTES,
            "{what}"
        );
        assert_eq!(
            files_of(&p, "make_items"),
            vec![script("perf_items.py").display().to_string()],
            "{what}"
        );
        assert_once_with_lines(&p, &["make_items", "outer", "<module>"], &what);
    }
}

/// In every sample through `names[0]`, each of `names` appears once (the Python frame from
/// the interpreter's state, not also the trampoline's perf-map name), and always with a line
/// (a trampoline's name has none).
fn assert_once_with_lines(p: &Profile, names: &[&str], what: &str) {
    let first = locations_of(p, names[0]);
    for name in names {
        let locs = locations_of(p, name);
        for s in &p.sample {
            if !s.location_id.iter().any(|l| first.contains(l)) {
                continue;
            }
            let n = s.location_id.iter().filter(|l| locs.contains(l)).count();
            assert_eq!(
                n, 1,
                "{what}: {name} {n} times in a stack under {}",
                names[0]
            );
            for l in p.location.iter().filter(|l| s.location_id.contains(&l.id)) {
                let f = l.line.iter().find(|x| {
                    p.function
                        .iter()
                        .any(|f| f.id == x.function_id && p.string_table[f.name as usize] == *name)
                });
                assert!(
                    f.is_none_or(|x| x.line > 0),
                    "{what}: {name} without a line (a trampoline's name)"
                );
            }
        }
    }
}

/// Post-mortem: `-X perf` (perf map, 3.12) and `-X perf_jit` (jitdump, 3.13, written only
/// at exit) name the functions in a snapshot taken after the process exited.
#[test]
fn python_post_mortem_names_from_perf_map_and_jitdump() {
    for (version, mode) in [("3.12", "perf"), ("3.13", "perf_jit")] {
        let Some(py) = python(version) else {
            skip_note(&format!(
                "skipped: python_post_mortem_names_from_perf_map_and_jitdump: python{version} not found"
            ));
            continue;
        };
        let p = python_profile(&py, &["-X", mode], &[], true);
        let what = format!("python{version} -X {mode}");
        let (all, unnamed) = unnamed_bytes(&p);
        assert!(
            unnamed * 100 <= all,
            "{what}: {unnamed} of {all} live bytes under unnamed frames"
        );
        let chain = bytes_with_caller(&p, "make_items", "outer");
        assert!(
            chain >= PY_BYTES,
            "{what}: {chain} bytes under make_items called by outer"
        );
        assert!(
            bytes_with_caller(&p, "outer", "holder") >= PY_BYTES,
            "{what}"
        );
        assert_once_with_lines(&p, &["make_items", "outer", "holder"], &what);
    }
}

/// Code run from a second mapping of the executable, which `dl_iterate_phdr` does not
/// report (examples/c/remap_exec.c, as node runs V8's builtins): named from the file at that
/// mapping's offset — live from `/proc/PID/maps`, post-mortem from the module table the shim
/// completed at exit. Before, these 100 blocks were under an unnamed frame.
#[test]
fn second_mapping_of_the_executable_is_symbolized() {
    if !can_run("second_mapping_of_the_executable_is_symbolized") {
        return;
    }
    let exe = compile_c("remap_exec", &["-fno-optimize-sibling-calls"]);
    for post_mortem in [false, true] {
        let dir = region_dir("jit-remap");
        let mut cmd = Command::new(&exe);
        if post_mortem {
            cmd.env("HEAPDUMP_KEEP", "1");
        }
        let r = start(cmd, &dir, true);
        let pid = r.pid();
        let profile = if post_mortem {
            assert_eq!(r.finish(), 0);
            snapshot(&dir, pid, &[])
        } else {
            snapshot(&dir, pid, &[])
        };
        let p = decode(&profile);
        let through = sum_through(&p, "alloc_in_copy");
        assert_eq!(
            through[2..],
            [100, 100_000],
            "post-mortem {post_mortem}: blocks and bytes under alloc_in_copy"
        );
        assert_eq!(bytes_with_caller(&p, "alloc_in_copy", "main"), 100_000);
        // The frames lie in the second mapping, not in the executable's own text: their
        // mapping is a different one, of the same file.
        let locs = locations_of(&p, "alloc_in_copy");
        let main_locs = locations_of(&p, "main");
        let mapping = |ids: &std::collections::HashSet<u64>| -> Vec<u64> {
            let mut v: Vec<u64> = p
                .location
                .iter()
                .filter(|l| ids.contains(&l.id))
                .map(|l| l.mapping_id)
                .collect();
            v.sort();
            v.dedup();
            v
        };
        let (m1, m2) = (mapping(&locs), mapping(&main_locs));
        assert_eq!(m1.len(), 1, "{m1:?}");
        assert_ne!(m1, m2, "alloc_in_copy ran from the executable's own text?");
        let file = |id: u64| {
            let m = p.mapping.iter().find(|m| m.id == id).unwrap();
            p.string_table[m.filename as usize].clone()
        };
        assert_eq!(file(m1[0]), file(m2[0]));
    }
}
