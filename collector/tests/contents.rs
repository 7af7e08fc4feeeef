//! Block contents: `heapdump snapshot --contents-dir DIR` and `--with-strings` on
//! `examples/c/contents.c`, whose blocks hold known bytes: every file compared byte for byte,
//! exact file counts and sizes under both caps, exact string labels, blocks freed while being
//! read skipped and counted, post-mortem and unsafe directories refused.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn skip(test: &str, reason: &str) {
    skip_note(&format!("skipped: {test}: {reason}"));
}

/// Why the tests cannot run here, if they cannot.
fn missing() -> Option<String> {
    let cc = Command::new("cc").arg("--version").output();
    if !cc.is_ok_and(|o| o.status.success()) {
        return Some("no C compiler (cc): install gcc".into());
    }
    None
}

/// A known block of contents.c: its name and size.
#[derive(Debug, Clone)]
struct Known {
    name: String,
    size: u64,
}

/// The bytes contents.c writes into block `name` of `size` bytes (see its header).
fn expected(name: &str, size: usize) -> Vec<u8> {
    let mut b = vec![0u8; size];
    match name {
        n if n.starts_with("text") => {
            let s = format!("hello heapdump {}", &n[4..]);
            b[..s.len()].copy_from_slice(s.as_bytes());
        }
        "long" => {
            for (j, x) in b.iter_mut().enumerate().take(199) {
                *x = b'a' + (j % 26) as u8;
            }
        }
        "utf8" => b[..13].copy_from_slice("héllo wörld".as_bytes()),
        "short" => b[..3].copy_from_slice(b"abc"),
        "big" => {
            for (j, x) in b.iter_mut().enumerate() {
                *x = ((j * 7 + 3) % 251) as u8;
            }
        }
        "huge" => {
            for (j, x) in b.iter_mut().enumerate() {
                *x = ((j * 13 + 5) % 253) as u8;
            }
        }
        n if n.starts_with("bin") => {
            let k: usize = n[3..].parse().unwrap();
            for (j, x) in b.iter_mut().enumerate() {
                *x = ((k * 31 + j * 17 + 1) & 0xff) as u8;
            }
            b[0] = 1;
        }
        other => panic!("unknown block {other}"),
    }
    b
}

/// Starts contents.c under the shim; returns it with its blocks by address.
fn start_contents(dir: &Path, keep: bool) -> (Running, BTreeMap<u64, Known>) {
    let exe = compile_c("contents", &[]);
    let mut cmd = Command::new(&exe);
    if keep {
        cmd.env("HEAPDUMP_KEEP", "1");
    }
    // The "block" lines come first; `start_until` keeps only the line it waits for, so read
    // them all from the first and collect the rest.
    let mut r = start_until(cmd, dir, true, "block");
    let mut known = BTreeMap::new();
    let mut add = |w: &[String]| {
        let addr = u64::from_str_radix(w[1].trim_start_matches("0x"), 16).unwrap();
        known.insert(
            addr,
            Known {
                name: w[0].clone(),
                size: w[2].parse().unwrap(),
            },
        );
    };
    add(&r.ready);
    for _ in 1..18 {
        let w = r.wait_line("block");
        add(&w);
    }
    r.ready = r.wait_line("ready");
    assert_eq!(known.len(), 18);
    (r, known)
}

/// A new output directory path (not created).
fn out_dir(name: &str) -> PathBuf {
    let d = region_dir(name).with_extension("out");
    let _ = std::fs::remove_dir_all(&d);
    let _ = std::fs::remove_file(&d);
    d
}

/// Per-block samples of a `--with-tags`/`--with-strings` profile: address → (bytes, string).
fn per_block(profile: &Path) -> BTreeMap<u64, (u64, Option<String>)> {
    let p = decode(profile);
    let s = |i: i64| p.string_table[i as usize].as_str();
    let mut out = BTreeMap::new();
    for x in &p.sample {
        let get = |k: &str| x.label.iter().find(|l| s(l.key) == k);
        let Some(a) = get("address") else { continue };
        let bytes = get("bytes").expect("bytes label").num as u64;
        let string = get("string").map(|l| s(l.str).to_owned());
        assert!(
            out.insert(a.num as u64, (bytes, string)).is_none(),
            "two samples for one block"
        );
    }
    out
}

fn comments(profile: &Path) -> Vec<String> {
    let p = decode(profile);
    p.comment
        .iter()
        .map(|&i| p.string_table[i as usize].clone())
        .collect()
}

/// The files of `dir`: name → bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            let name = e.file_name().into_string().unwrap();
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            assert!(meta.is_file(), "{name} is not a regular file");
            assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{name} mode");
            (name, std::fs::read(e.path()).unwrap())
        })
        .collect()
}

/// Runs a snapshot; `None` (after printing why) when this machine cannot read the target's
/// memory.
fn snap(test: &str, regions: &Path, pid: u32, profile: &Path, extra: &[&str]) -> Option<String> {
    let pid = pid.to_string();
    let mut args = vec![
        "snapshot",
        "--by-pid",
        &pid,
        "-o",
        profile.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (ok, out, err) = heapdump_cmd(regions, &args);
    if !ok && err.contains("cannot read the memory") {
        skip(
            test,
            &format!("cannot read another process's memory here: {err}"),
        );
        return None;
    }
    assert!(ok, "snapshot failed: {out}{err}");
    Some(err)
}

#[test]
fn every_live_block_has_a_file_with_its_bytes() {
    const T: &str = "every_live_block_has_a_file_with_its_bytes";
    if let Some(why) = missing() {
        return skip(T, &why);
    }
    let regions = region_dir("contents");
    let (r, known) = start_contents(&regions, false);
    let dir = out_dir("contents-all");
    let profile = regions.with_extension("pb.gz");
    let Some(err) = snap(
        T,
        &regions,
        r.pid(),
        &profile,
        &["--with-tags", "--contents-dir", dir.to_str().unwrap()],
    ) else {
        return;
    };
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "a new directory is private");
    let blocks = per_block(&profile);
    let files = files(&dir);
    // One file per live block, named by its address, min(size, 64 KiB) bytes long.
    let names: Vec<String> = blocks.keys().map(|a| format!("{a:#x}")).collect();
    assert_eq!(
        files.keys().cloned().collect::<Vec<_>>(),
        {
            let mut n = names.clone();
            n.sort();
            n
        },
        "file names = live block addresses"
    );
    for (a, (size, _)) in &blocks {
        assert_eq!(
            files[&format!("{a:#x}")].len() as u64,
            (*size).min(64 << 10),
            "file of block {a:#x}"
        );
    }
    // Every known block, byte for byte.
    for (a, k) in &known {
        let want = expected(&k.name, k.size as usize);
        let got = &files[&format!("{a:#x}")];
        assert_eq!(got.len(), want.len().min(64 << 10), "{}", k.name);
        assert!(got[..] == want[..got.len()], "contents of {}", k.name);
        assert_eq!(blocks[a].0, k.size, "{} size", k.name);
    }
    // big (100 KiB) and huge (1 MiB) were cut at 64 KiB: said on stderr and in the comments.
    let truncated = blocks.values().filter(|(s, _)| *s > 64 << 10).count();
    assert_eq!(truncated, 2, "only big and huge exceed 64 KiB");
    let line = "contents: caps reached: 2 file(s) truncated (--contents-max-block 65536 bytes \
                per block, --contents-max-total 268435456 bytes in all), 0 block(s) without a file";
    assert!(err.contains(line), "{err}");
    assert_eq!(err.matches("caps reached").count(), 1, "said once: {err}");
    let written = format!("contents: {} block(s) written to", blocks.len());
    assert!(err.contains(&written), "{err}");
    assert!(
        comments(&profile).iter().any(|c| c.starts_with(line)),
        "comments"
    );
    assert!(!err.contains("skipped"), "nothing freed meanwhile: {err}");
    assert_eq!(r.finish(), 0);
}

#[test]
fn caps_cut_files_and_stop_the_writing_as_documented() {
    const T: &str = "caps_cut_files_and_stop_the_writing_as_documented";
    if let Some(why) = missing() {
        return skip(T, &why);
    }
    let regions = region_dir("contents-caps");
    let (r, known) = start_contents(&regions, false);
    // The live blocks, from a first profile.
    let first = regions.with_extension("first.pb.gz");
    if snap(T, &regions, r.pid(), &first, &["--with-tags"]).is_none() {
        return;
    }
    let blocks = per_block(&first);
    // Per block 40 bytes at most; in all, what the blocks up to bin1 take (in address order)
    // plus 10 bytes: the next block's file is cut to 10 bytes, the rest get none.
    let max_block = 40u64;
    let bin1 = *known.iter().find(|(_, k)| k.name == "bin1").unwrap().0;
    let before: u64 = blocks
        .range(..=bin1)
        .map(|(_, (s, _))| (*s).min(max_block))
        .sum();
    let max_total = before + 10;
    // The expected directory, from the documented rule.
    let mut want: BTreeMap<u64, u64> = BTreeMap::new();
    let (mut left, mut full, mut cut, mut none) = (max_total, false, 0, 0);
    for (a, (s, _)) in &blocks {
        if full {
            none += 1;
            continue;
        }
        let n = (*s).min(max_block).min(left);
        left -= n;
        full = left == 0;
        cut += (n < *s) as u32;
        want.insert(*a, n);
    }
    assert!(none >= 8, "bin2..bin9 and huge come after bin1: {none}");
    let dir = out_dir("contents-caps");
    let profile = regions.with_extension("pb.gz");
    let (mb, mt) = (max_block.to_string(), max_total.to_string());
    let Some(err) = snap(
        T,
        &regions,
        r.pid(),
        &profile,
        &[
            "--contents-dir",
            dir.to_str().unwrap(),
            "--contents-max-block",
            &mb,
            "--contents-max-total",
            &mt,
        ],
    ) else {
        return;
    };
    let files = files(&dir);
    let got: BTreeMap<u64, u64> = files
        .iter()
        .map(|(n, b)| {
            (
                u64::from_str_radix(n.trim_start_matches("0x"), 16).unwrap(),
                b.len() as u64,
            )
        })
        .collect();
    assert_eq!(got, want, "file lengths under the caps");
    assert_eq!(
        got.values().sum::<u64>(),
        max_total,
        "the total cap is used up"
    );
    for (a, k) in &known {
        if let Some(b) = files.get(&format!("{a:#x}")) {
            assert!(
                b[..] == expected(&k.name, k.size as usize)[..b.len()],
                "{}",
                k.name
            );
        }
    }
    let line = format!(
        "contents: caps reached: {cut} file(s) truncated (--contents-max-block 40 bytes per \
         block, --contents-max-total {max_total} bytes in all), {none} block(s) without a file \
         (--contents-max-total reached)"
    );
    assert!(err.contains(&line), "want {line:?} in {err}");
    assert!(
        err.contains(&format!(
            "contents: {} block(s) written to {} ({max_total} bytes)",
            want.len(),
            dir.display()
        )),
        "{err}"
    );
    // Without --with-tags or --with-strings the profile keeps its aggregated samples.
    assert!(per_block(&profile).is_empty(), "no per-block samples asked");
    assert_eq!(r.finish(), 0);
}

#[test]
fn with_strings_labels_exactly_the_text_blocks() {
    const T: &str = "with_strings_labels_exactly_the_text_blocks";
    if let Some(why) = missing() {
        return skip(T, &why);
    }
    let regions = region_dir("contents-strings");
    let (r, known) = start_contents(&regions, false);
    let profile = regions.with_extension("pb.gz");
    let Some(err) = snap(T, &regions, r.pid(), &profile, &["--with-strings"]) else {
        return;
    };
    let blocks = per_block(&profile);
    for a in known.keys() {
        assert!(blocks.contains_key(a), "one sample per live block");
    }
    let labelled: BTreeMap<String, String> = blocks
        .iter()
        .filter_map(|(a, (_, s))| {
            let name = known.get(a).map_or(format!("{a:#x}"), |k| k.name.clone());
            s.clone().map(|s| (name, s))
        })
        .collect();
    let letters: String = (0..64).map(|j| (b'a' + (j % 26) as u8) as char).collect();
    let want: BTreeMap<String, String> = [
        ("text0", "hello heapdump 0"),
        ("text1", "hello heapdump 1"),
        ("text2", "hello heapdump 2"),
        ("long", letters.as_str()),
        ("utf8", "héllo wörld"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_owned(), b.to_owned()))
    .collect();
    assert_eq!(labelled, want, "labels: text blocks only, exact prefixes");
    assert!(
        err.contains("contents: 5 block(s) labelled with the string they start with"),
        "{err}"
    );
    assert_eq!(r.finish(), 0);
}

#[test]
fn blocks_freed_while_being_read_are_skipped_and_counted() {
    const T: &str = "blocks_freed_while_being_read_are_skipped_and_counted";
    if let Some(why) = missing() {
        return skip(T, &why);
    }
    let regions = region_dir("contents-freed");
    let (mut r, known) = start_contents(&regions, false);
    let dir = out_dir("contents-freed");
    let profile = regions.with_extension("pb.gz");
    let pause = regions.with_extension("pause");
    let _ = std::fs::remove_file(&pause);
    let pid = r.pid().to_string();
    // heapdump snapshots, then waits (the pause file) before reading: the program frees
    // bin0..bin4 (kept mapped by malloc) and huge (unmapped) meanwhile.
    let child = Command::new(heapdump())
        .args(["snapshot", "--by-pid", &pid, "-o"])
        .arg(&profile)
        .args(["--with-strings", "--contents-dir"])
        .arg(&dir)
        .env("HEAPDUMP_DIR", &regions)
        .env("HEAPDUMP_TEST_CONTENTS_PAUSE", &pause)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !pause.exists() {
        assert!(t0.elapsed().as_secs() < 60, "heapdump never paused");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    {
        use std::io::Write;
        let stdin = r.stdin.as_mut().unwrap();
        stdin.write_all(b"free\n").unwrap();
        stdin.flush().unwrap();
    }
    r.wait_line("freed");
    std::fs::remove_file(&pause).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() && err.contains("cannot read the memory") {
        return skip(
            T,
            &format!("cannot read another process's memory here: {err}"),
        );
    }
    assert!(out.status.success(), "{err}");
    let line = "contents: 6 block(s) freed since the snapshot skipped (no file, no string): 1 \
                unmapped, 5 found freed by a second look at the region";
    assert!(err.contains(line), "want {line:?} in {err}");
    assert!(comments(&profile).iter().any(|c| c == line), "comments");
    // The profile is of the snapshot's instant: every block, freed ones included.
    let blocks = per_block(&profile);
    let files = files(&dir);
    assert_eq!(files.len(), blocks.len() - 6);
    for (a, k) in &known {
        let freed = k.name == "huge"
            || matches!(k.name.as_str(), "bin0" | "bin1" | "bin2" | "bin3" | "bin4");
        assert!(blocks.contains_key(a), "{} in the profile", k.name);
        assert_eq!(
            files.contains_key(&format!("{a:#x}")),
            !freed,
            "{}: a file unless freed",
            k.name
        );
    }
    assert_eq!(
        blocks.values().filter(|(_, s)| s.is_some()).count(),
        5,
        "the text blocks, not freed, keep their labels"
    );
    assert_eq!(r.finish(), 0);
}

/// The target's pid goes to another process while heapdump reads its blocks' contents (the
/// region's owner can hold the region's lock while it makes that happen): what was read is
/// not kept — no files, no profile — and the error says why, where heapdump used to write the
/// new process's memory into the profile under the old one's name. The pid is handed on
/// deterministically through `/proc/sys/kernel/ns_last_pid` (root only).
#[test]
fn a_pid_reused_during_the_read_keeps_nothing() {
    const T: &str = "a_pid_reused_during_the_read_keeps_nothing";
    if let Some(why) = missing() {
        return skip(T, &why);
    }
    let last_pid = Path::new("/proc/sys/kernel/ns_last_pid");
    if std::fs::OpenOptions::new()
        .write(true)
        .open(last_pid)
        .is_err()
    {
        return skip(T, "cannot write /proc/sys/kernel/ns_last_pid (not root)");
    }
    let regions = region_dir("contents-reused");
    let (mut r, _known) = start_contents(&regions, false);
    let dir = out_dir("contents-reused");
    let profile = regions.with_extension("pb.gz");
    let pause = regions.with_extension("pause");
    let _ = std::fs::remove_file(&pause);
    let pid = r.pid();
    let child = Command::new(heapdump())
        .args(["snapshot", "--by-pid", &pid.to_string(), "-o"])
        .arg(&profile)
        .args(["--with-strings", "--contents-dir"])
        .arg(&dir)
        .env("HEAPDUMP_DIR", &regions)
        .env("HEAPDUMP_TEST_CONTENTS_PAUSE", &pause)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !pause.exists() {
        assert!(t0.elapsed().as_secs() < 60, "heapdump never paused");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    r.child.kill().unwrap();
    r.child.wait().unwrap();
    // Another process (not instrumented) under the same pid: other tests start processes
    // too, so try until this one gets it. One of theirs may take the pid meanwhile (its fork
    // coming between our write and our spawn) and keep it: wait until it is free again (the
    // collector waits up to 60 s at its pause).
    let mut other = None;
    let started = std::time::Instant::now();
    while other.is_none() && started.elapsed() < std::time::Duration::from_secs(40) {
        if Path::new(&format!("/proc/{pid}")).exists() {
            std::thread::sleep(std::time::Duration::from_millis(10));
            continue;
        }
        std::fs::write(last_pid, (pid - 1).to_string()).unwrap();
        let mut c = Command::new("sleep").arg("60").spawn().unwrap();
        if c.id() == pid {
            other = Some(c);
            break;
        }
        let _ = c.kill();
        let _ = c.wait();
    }
    let Some(mut other) = other else {
        std::fs::remove_file(&pause).unwrap();
        let _ = child.wait_with_output();
        return skip(T, "the pid was taken by other processes for 40 s");
    };
    std::fs::remove_file(&pause).unwrap();
    let out = child.wait_with_output().unwrap();
    let _ = other.kill();
    let _ = other.wait();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("pid {pid} exited during the read")),
        "{err}"
    );
    assert!(!profile.exists(), "a profile was written");
    assert_eq!(files(&dir).len(), 0, "block files were kept");
}

#[test]
fn post_mortem_contents_are_a_clear_error() {
    const T: &str = "post_mortem_contents_are_a_clear_error";
    if let Some(why) = missing() {
        return skip(T, &why);
    }
    let regions = region_dir("contents-exited");
    let (r, _) = start_contents(&regions, true);
    let pid = r.pid();
    assert_eq!(r.finish(), 0);
    let dir = out_dir("contents-exited");
    let profile = regions.with_extension("pb.gz");
    let p = pid.to_string();
    for extra in [
        vec!["--contents-dir", dir.to_str().unwrap()],
        vec!["--with-strings"],
    ] {
        let mut args = vec!["snapshot", "--by-pid", &p, "-o", profile.to_str().unwrap()];
        args.extend(extra.iter().copied());
        let (ok, _, err) = heapdump_cmd(&regions, &args);
        assert!(!ok, "{extra:?} post-mortem must fail");
        assert!(
            err.contains(&format!("pid {pid} has exited"))
                && err.contains("not their contents")
                && err.contains("need a running process"),
            "{err}"
        );
        assert!(!dir.exists(), "nothing created");
        assert!(!profile.exists(), "no profile written");
    }
    // The same snapshot without the contents works (the region was kept).
    let (ok, _, err) = heapdump_cmd(
        &regions,
        &["snapshot", "--by-pid", &p, "-o", profile.to_str().unwrap()],
    );
    assert!(ok, "{err}");
}

#[test]
fn unsafe_or_used_directories_are_refused() {
    const T: &str = "unsafe_or_used_directories_are_refused";
    if let Some(why) = missing() {
        return skip(T, &why);
    }
    let regions = region_dir("contents-dirs");
    let (r, _) = start_contents(&regions, false);
    let profile = regions.with_extension("pb.gz");
    let p = r.pid().to_string();
    let run = |dir: &Path| {
        heapdump_cmd(
            &regions,
            &[
                "snapshot",
                "--by-pid",
                &p,
                "-o",
                profile.to_str().unwrap(),
                "--contents-dir",
                dir.to_str().unwrap(),
            ],
        )
    };
    // Not empty: refused, its file untouched.
    let used = out_dir("contents-used");
    std::fs::create_dir(&used).unwrap();
    std::fs::write(used.join("0x1234"), b"mine").unwrap();
    let (ok, _, err) = run(&used);
    assert!(!ok && err.contains("is not empty (1 entries)"), "{err}");
    assert_eq!(std::fs::read(used.join("0x1234")).unwrap(), b"mine");
    assert_eq!(std::fs::read_dir(&used).unwrap().count(), 1);
    // A symbolic link to an empty directory: refused, nothing written through it.
    let target = out_dir("contents-target");
    std::fs::create_dir(&target).unwrap();
    let link = out_dir("contents-link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let (ok, _, err) = run(&link);
    assert!(!ok && err.contains("is a symbolic link"), "{err}");
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);
    // A regular file: refused, unchanged.
    let file = out_dir("contents-file");
    std::fs::write(&file, b"x").unwrap();
    let (ok, _, err) = run(&file);
    assert!(
        !ok && err.contains("exists and is not a directory"),
        "{err}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
    assert!(!profile.exists(), "no profile written when refused");
    // An existing empty directory is taken as it is.
    let empty = out_dir("contents-empty");
    std::fs::create_dir(&empty).unwrap();
    let (ok, _, err) = run(&empty);
    if !ok && err.contains("cannot read the memory") {
        return skip(T, "cannot read another process's memory here");
    }
    assert!(ok, "{err}");
    assert!(std::fs::read_dir(&empty).unwrap().count() >= 18);
    // Caps without --contents-dir are refused by the argument parser.
    let (ok, _, err) = heapdump_cmd(
        &regions,
        &[
            "snapshot",
            "--by-pid",
            &p,
            "-o",
            profile.to_str().unwrap(),
            "--contents-max-block",
            "1K",
        ],
    );
    assert!(!ok && err.contains("--contents-dir"), "{err}");
    for d in [&used, &target, &empty] {
        let _ = std::fs::remove_dir_all(d);
    }
    let _ = std::fs::remove_file(&link);
    let _ = std::fs::remove_file(&file);
    assert_eq!(r.finish(), 0);
}
