//! Flame graphs without Go: `heapdump snapshot -o FILE.svg` (and `--format svg`,
//! `--sample-index`) and `heapdump convert PROFILE.pb.gz -o FILE.svg`, checked by parsing the
//! SVG as XML: the frames of `known_allocs`'s allocation functions with their exact widths
//! (inferno writes each frame's count in its `<title>`), root-first.

mod common;

use common::*;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

/// One frame of a flame graph: its function, count, and the top edge of its rectangle (the
/// root is drawn at the bottom: callers have larger `y` than their callees).
#[derive(Debug, Clone)]
struct Frame {
    function: String,
    count: u64,
    unit: String,
    y: f64,
}

/// The frames of an inferno SVG (the XML must parse): each `<g>` holds `<title>NAME (COUNT
/// UNIT, PCT%)</title>` then its `<rect>`. Also returns whether the SVG has its script (the
/// interactive part: zoom and search).
fn frames(svg: &str) -> (Vec<Frame>, bool) {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_str(svg);
    let mut out = Vec::new();
    let mut in_title = false;
    let mut title = String::new();
    let mut pending: Option<String> = None;
    let mut script = false;
    loop {
        match reader.read_event().expect("the SVG is well-formed XML") {
            Event::Start(e) if e.name().as_ref() == b"title" => {
                in_title = true;
                title.clear();
            }
            Event::End(e) if e.name().as_ref() == b"title" => {
                in_title = false;
                pending = Some(title.clone());
            }
            Event::Text(t) if in_title => title.push_str(&t.decode().unwrap()),
            Event::GeneralRef(r) if in_title => {
                let entity = format!("&{};", r.decode().unwrap());
                title.push_str(&quick_xml::escape::unescape(&entity).unwrap());
            }
            Event::Start(e) | Event::Empty(e) if e.name().as_ref() == b"script" => script = true,
            Event::Start(e) | Event::Empty(e) if e.name().as_ref() == b"rect" => {
                let Some(t) = pending.take() else { continue };
                let y = e.try_get_attribute("y").unwrap().expect("rect has y");
                // A number: no entity to resolve.
                let y: f64 = std::str::from_utf8(&y.value).unwrap().parse().unwrap();
                // "NAME (1,024,000 bytes, 5.75%)"
                let (function, rest) = t.rsplit_once(" (").expect("title: NAME (COUNT UNIT, P%)");
                let mut w = rest.split_whitespace();
                let count = w.next().unwrap().replace(',', "").parse().unwrap();
                let unit = w.next().unwrap().trim_end_matches(',').to_owned();
                out.push(Frame {
                    function: function.to_owned(),
                    count,
                    unit,
                    y,
                });
            }
            Event::Eof => break,
            _ => {}
        }
    }
    (out, script)
}

/// The frames of the SVG at `path`, by function (all frames of that name).
fn frames_of(path: &Path) -> HashMap<String, Vec<Frame>> {
    let svg = std::fs::read_to_string(path).unwrap();
    by_function(&svg)
}

fn by_function(svg: &str) -> HashMap<String, Vec<Frame>> {
    let (fs, script) = frames(svg);
    assert!(script, "the flame graph has no script: not interactive");
    let mut m: HashMap<String, Vec<Frame>> = HashMap::new();
    for f in fs {
        m.entry(f.function.clone()).or_default().push(f);
    }
    m
}

/// The one frame of `function`: (count, unit).
fn one(m: &HashMap<String, Vec<Frame>>, function: &str) -> (u64, String) {
    let f = m
        .get(function)
        .unwrap_or_else(|| panic!("no frame {function}: {:?}", m.keys()));
    assert_eq!(f.len(), 1, "{function}: {f:?}");
    (f[0].count, f[0].unit.clone())
}

fn run(dir: &Path, args: &[&str]) -> Timed {
    heapdump_timeout(dir, args, std::time::Duration::from_secs(60))
}

#[test]
fn snapshot_and_convert_write_flame_graphs() {
    let exe = compile_c("known_allocs", &[]);
    let dir = region_dir("flame");
    let r = start(Command::new(&exe), &dir, true);
    let pid = r.pid().to_string();
    let svg = dir.with_extension("svg");
    let t = run(
        &dir,
        &["snapshot", "--by-pid", &pid, "-o", svg.to_str().unwrap()],
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    let m = frames_of(&svg);
    // inuse_space by default.
    assert_eq!(one(&m, "alloc_small"), (1000 * KIB, "bytes".into()));
    assert_eq!(one(&m, "alloc_medium"), (100 * 64 * KIB, "bytes".into()));
    assert_eq!(one(&m, "alloc_large"), (10 * MIB, "bytes".into()));
    let all = one(&m, "all").0;
    assert_eq!(
        all,
        sum_inuse(&decode(&snapshot(&dir, r.pid(), &[]))),
        "the whole graph is the profile's inuse_space"
    );
    // Root-first: main is drawn below (larger y) the functions it calls, and holds them.
    let main = &m["main"];
    assert_eq!(main.len(), 1);
    for f in ["alloc_small", "alloc_medium", "alloc_large"] {
        assert!(main[0].y > m[f][0].y, "main above {f}: {main:?} {:?}", m[f]);
    }
    assert!(main[0].count >= 1000 * KIB + 6400 * KIB + 10 * MIB);
    // The shim's own frames are not drawn.
    assert!(
        !m.keys()
            .any(|k| k == "malloc" || k == "calloc" || k == "realloc"),
        "{:?}",
        m.keys()
    );

    // --sample-index: the other sample types.
    for (index, unit, want) in [
        ("inuse_objects", "blocks", [1000, 100, 10]),
        ("alloc_objects", "blocks", [1000, 100, 20]),
        (
            "alloc_space",
            "bytes",
            [1000 * KIB, 6400 * KIB, 10 * 512 * KIB + 10 * MIB],
        ),
    ] {
        let out = dir.with_extension(format!("{index}.svg"));
        let t = run(
            &dir,
            &[
                "snapshot",
                "--by-pid",
                &pid,
                "--sample-index",
                index,
                "-o",
                out.to_str().unwrap(),
            ],
        );
        assert_eq!(t.code, Some(0), "{t:?}");
        let m = frames_of(&out);
        for (f, w) in ["alloc_small", "alloc_medium", "alloc_large"]
            .iter()
            .zip(want)
        {
            assert_eq!(one(&m, f), (w, unit.to_owned()), "{index}: {f}");
        }
    }

    // With pprof output, --sample-index sets the default sample type.
    let pb = dir.with_extension("alloc.pb.gz");
    let t = run(
        &dir,
        &[
            "snapshot",
            "--by-pid",
            &pid,
            "--sample-index",
            "alloc_space",
            "-o",
            pb.to_str().unwrap(),
        ],
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    let p = decode(&pb);
    assert_eq!(
        p.string_table[p.default_sample_type as usize],
        "alloc_space"
    );

    // --format svg to standard output.
    let t = run(
        &dir,
        &["snapshot", "--by-pid", &pid, "--format", "svg", "-o", "-"],
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    assert_eq!(one(&by_function(&t.stdout), "alloc_large").0, 10 * MIB);

    // convert: a saved profile, told by its content (not its name), draws the same graph.
    let saved = snapshot(&dir, r.pid(), &[]);
    let renamed = dir.with_extension("profile.bin");
    std::fs::copy(&saved, &renamed).unwrap();
    for (input, index, (large, small)) in [
        (&saved, None, (10 * MIB, 1000 * KIB)),
        (&renamed, None, (10 * MIB, 1000 * KIB)),
        (&saved, Some("inuse_objects"), (10, 1000)),
    ] {
        let out = dir.with_extension("converted.svg");
        let mut args = vec![
            "convert",
            input.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ];
        if let Some(i) = index {
            args.extend(["--sample-index", i]);
        }
        let t = run(&dir, &args);
        assert_eq!(t.code, Some(0), "{t:?}");
        let m = frames_of(&out);
        assert_eq!(one(&m, "alloc_large").0, large, "{input:?} {index:?}");
        assert_eq!(one(&m, "alloc_small").0, small, "{input:?} {index:?}");
    }
    // A profile has no reference graph to convert into a heap snapshot.
    let t = run(
        &dir,
        &[
            "convert",
            saved.to_str().unwrap(),
            "-o",
            dir.with_extension("x.heapsnapshot").to_str().unwrap(),
        ],
    );
    assert_eq!(t.code, Some(1), "{t:?}");
    assert!(t.stderr.contains("needs a capture"), "{}", t.stderr);
    // Neither a capture nor a profile: said so.
    let text = dir.with_extension("text.pb.gz");
    std::fs::write(&text, "not a profile\n").unwrap();
    let out = dir.with_extension("text.svg");
    let t = run(
        &dir,
        &[
            "convert",
            text.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(t.code, Some(1), "{t:?}");
    assert!(
        t.stderr.contains("neither a graph capture")
            && t.stderr.contains("nor a gzip-compressed pprof profile"),
        "{}",
        t.stderr
    );

    // Not symbolized: frames are module+offset, the allocation functions' among them.
    let raw = dir.with_extension("nosym.svg");
    let t = run(
        &dir,
        &[
            "snapshot",
            "--by-pid",
            &pid,
            "--no-symbolize",
            "-o",
            raw.to_str().unwrap(),
        ],
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    let m = frames_of(&raw);
    assert!(!m.contains_key("alloc_small"), "{:?}", m.keys());
    let mut exe_frames: Vec<u64> = m
        .iter()
        .filter(|(k, _)| k.starts_with("known_allocs+0x"))
        .flat_map(|(_, v)| v.iter().map(|f| f.count))
        .collect();
    exe_frames.sort_unstable();
    // The three leaf call sites, and main's frame above them (whole stacks are in the exe).
    for w in [1000 * KIB, 6400 * KIB, 10 * MIB] {
        assert!(
            exe_frames.contains(&w),
            "{w} not in {exe_frames:?}: {:?}",
            m.keys()
        );
    }
    assert_eq!(r.finish(), 0);
}

/// The sum of a profile's inuse_space values.
fn sum_inuse(p: &heapdump_proto::Profile) -> u64 {
    p.sample.iter().map(|s| s.value[3] as u64).sum()
}

/// A multi-process snapshot drawn as a flame graph roots each process's stacks at a frame
/// `NAME (pid PID)`.
#[test]
fn multi_process_flame_graph_has_a_root_per_process() {
    let exe = compile_c("known_allocs", &[]);
    let dir = region_dir("flame-multi");
    let a = start(Command::new(&exe), &dir, true);
    let b = start(Command::new(&exe), &dir, true);
    let svg = dir.with_extension("svg");
    let t = run(
        &dir,
        &[
            "snapshot",
            "--multi-process",
            "--by-name",
            "known_allocs",
            "-o",
            svg.to_str().unwrap(),
        ],
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    let m = frames_of(&svg);
    for r in [&a, &b] {
        let root = &m[&format!("known_allocs (pid {})", r.pid())];
        assert_eq!(root.len(), 1);
        assert!(
            root[0].count >= 1000 * KIB + 6400 * KIB + 10 * MIB,
            "{root:?}"
        );
    }
    let small: Vec<u64> = m["alloc_small"].iter().map(|f| f.count).collect();
    assert_eq!(small, [1000 * KIB, 1000 * KIB]);
    assert_eq!(a.finish(), 0);
    assert_eq!(b.finish(), 0);
}

/// A crafted profile that decodes into far more memory than its size (a valid header, then
/// 10,485,760 empty samples of 2 bytes: ~20 MB, ~860 MB decoded) is refused before decoding
/// when heapdump has less memory than that to spare (here `RLIMIT_AS` of 1 GiB), with one
/// line, not an abort on a failed allocation; and a file that decompresses to more than
/// heapdump reads at all is refused as it decompresses.
#[test]
fn crafted_profiles_are_refused_before_decoding() {
    use std::io::Write;
    let dir = region_dir("crafted-pprof");
    std::fs::create_dir_all(&dir).unwrap();
    let write_gz = |name: &str, head: &[u8], chunk: &[u8], n: usize| {
        let path = dir.join(name);
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&path).unwrap(),
            flate2::Compression::fast(),
        );
        gz.write_all(head).unwrap();
        for _ in 0..n {
            gz.write_all(chunk).unwrap();
        }
        gz.finish().unwrap();
        path
    };
    // sample_type {type: 1, unit: 2}; string_table "", "space", "bytes".
    let head = b"\x0a\x04\x08\x01\x10\x02\x32\x00\x32\x05space\x32\x05bytes";
    let samples = write_gz("samples.pb.gz", head, &[0x12, 0x00].repeat(1 << 20), 10);
    let out = dir.join("out.svg");
    let run_limited = |input: &Path| {
        let mut cmd = Command::new(heapdump());
        cmd.args(["convert"]).arg(input).arg("-o").arg(&out);
        limit_address_space(&mut cmd, 1 << 30);
        run_timeout(&mut cmd, std::time::Duration::from_secs(60))
    };
    let t = run_limited(&samples);
    assert_eq!(t.code, Some(1), "{}", t.stderr);
    assert!(
        t.stderr
            .contains("more than half the memory free for heapdump")
            && t.stderr.contains("refusing to read it")
            && t.stderr.lines().count() == 1,
        "{}",
        t.stderr
    );
    assert!(!out.exists());
    // 1 GiB and a byte of zeros in 16 MiB strings: refused at 1 GiB decompressed.
    let mut string = vec![0x32u8];
    let len = 16u64 << 20;
    let mut v = len;
    while v >= 0x80 {
        string.push((v as u8) | 0x80);
        v >>= 7;
    }
    string.push(v as u8);
    let body: Vec<u8> = string
        .iter()
        .copied()
        .chain(std::iter::repeat_n(0, len as usize))
        .collect();
    let big = write_gz("strings.pb.gz", head, &body, 65);
    let t = run(
        &dir,
        &[
            "convert",
            big.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(t.code, Some(1), "{}", t.stderr);
    assert!(
        t.stderr
            .contains("decompresses to more than 1073741824 bytes"),
        "{}",
        t.stderr
    );
    assert!(!out.exists());
}
