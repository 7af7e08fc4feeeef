//! Interactive SVG flame graphs (drawn by `inferno`), from folded stacks: the ownership graph
//! (`heapdump graph -o FILE.svg`) and any heap profile (`heapdump snapshot -o FILE.svg`,
//! `heapdump convert PROFILE.pb.gz -o FILE.svg`).
//!
//! Folded stacks are Brendan Gregg's `stackcollapse` format: one line per stack, frames
//! root-first joined by `;`, then a space and the count. Frame widths are counts (bytes or
//! blocks): `inferno` writes each frame's exact total in its `<title>`
//! (`alloc_small (1,024,000 bytes, 5.75%)`).

use anyhow::{bail, Context, Result};
use heapdump_proto as pb;
use std::collections::{BTreeMap, HashMap};

/// Folded stacks: key = frames root-first joined by `;` (see [`key`]), value = count.
pub type Folded = BTreeMap<String, u64>;

/// The folded-stack key of `frames` (root first): a `;` inside a name, which would split the
/// frame, becomes `:`.
pub fn key<'a>(frames: impl IntoIterator<Item = &'a str>) -> String {
    let mut k = String::new();
    for (i, f) in frames.into_iter().enumerate() {
        if i > 0 {
            k.push(';');
        }
        k.push_str(&f.replace(';', ":"));
    }
    k
}

/// Draws `folded` as an interactive SVG flame graph (click to zoom, Ctrl-F to search) titled
/// `title`, frame widths counted in `count_name` (e.g. `bytes`), and writes it to `out` (`-`:
/// standard output) as [`crate::output::write_with`] does.
///
/// When no stack has a nonzero count, the SVG is still written, a valid one that says there
/// is nothing to draw (`false` is returned: the caller says why on stderr).
///
/// Errors: writing fails.
pub fn write_svg(
    folded: &Folded,
    title: &str,
    count_name: &str,
    out: &std::path::Path,
) -> Result<bool> {
    if folded.values().all(|&v| v == 0) {
        let svg = empty_svg(
            title,
            &format!("Nothing to draw: no stack has a nonzero count of {count_name}."),
        );
        crate::output::write_bytes(svg.as_bytes(), out)?;
        return Ok(false);
    }
    let lines: Vec<String> = folded
        .iter()
        .filter(|(_, &v)| v > 0)
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_owned();
    opts.count_name = count_name.to_owned();
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut svg)
        .context("drawing the flame graph")?;
    crate::output::write_bytes(&svg, out)?;
    Ok(true)
}

/// A flame graph's SVG without frames: `title`, and `text` under it.
fn empty_svg(title: &str, text: &str) -> String {
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    };
    format!(
        "<?xml version=\"1.0\" standalone=\"no\"?>\n\
         <svg version=\"1.1\" width=\"1200\" height=\"80\" viewBox=\"0 0 1200 80\" \
         xmlns=\"http://www.w3.org/2000/svg\">\n\
         <title>{t}</title>\n\
         <rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"#eeeeee\"/>\n\
         <text x=\"600\" y=\"30\" text-anchor=\"middle\" font-family=\"Verdana\" \
         font-size=\"17\">{t}</text>\n\
         <text id=\"nothing\" x=\"600\" y=\"60\" text-anchor=\"middle\" font-family=\"Verdana\" \
         font-size=\"12\">{x}</text>\n\
         </svg>\n",
        t = esc(title),
        x = esc(text)
    )
}

/// The index (into `p.sample_type` and each sample's values) of the sample type named `name`
/// (e.g. `inuse_space`), or of the profile's default sample type (its last one if it names
/// none, as pprof does) when `name` is `None`.
///
/// Errors: the profile has no sample type `name` (the message lists those it has).
pub fn sample_index(p: &pb::Profile, name: Option<&str>) -> Result<usize> {
    let s = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
    let types: Vec<&str> = p.sample_type.iter().map(|t| s(t.r#type)).collect();
    if types.is_empty() {
        bail!("the profile has no sample types");
    }
    let want = match name {
        Some(n) => n,
        None if p.default_sample_type != 0 => s(p.default_sample_type),
        None => return Ok(types.len() - 1),
    };
    types.iter().position(|t| *t == want).with_context(|| {
        format!(
            "the profile has no sample type {want:?}; it has {}",
            types.join(", ")
        )
    })
}

/// The unit of sample type `index` (`bytes`, `count`, …), as the flame graph counts it:
/// `count` is shown as `blocks`.
pub fn count_name(p: &pb::Profile, index: usize) -> String {
    let unit = p
        .sample_type
        .get(index)
        .and_then(|t| p.string_table.get(t.unit as usize))
        .map_or("", String::as_str);
    match unit {
        "count" | "" => "blocks".to_owned(),
        u => u.to_owned(),
    }
}

/// The frame names of each location of profile `p` (location id → names, innermost first: a
/// location's inlined functions expanded, as its `line`s list them). A location without
/// function names (not symbolized) is named `MODULE+0xOFFSET` (the file offset in its
/// mapping's file, as `addr2line -e MODULE` takes it) or, outside any mapping, its address.
/// What [`from_profile`] and `heapdump report` name frames by.
pub fn location_frames(p: &pb::Profile) -> HashMap<u64, Vec<String>> {
    let s = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
    let functions: HashMap<u64, &str> = p.function.iter().map(|f| (f.id, s(f.name))).collect();
    let mappings: HashMap<u64, &pb::Mapping> = p.mapping.iter().map(|m| (m.id, m)).collect();
    p.location
        .iter()
        .map(|l| {
            let named: Vec<String> = l
                .line
                .iter()
                .filter_map(|x| functions.get(&x.function_id))
                .filter(|n| !n.is_empty())
                .map(|n| (*n).to_owned())
                .collect();
            if !named.is_empty() {
                return (l.id, named);
            }
            let mapping = mappings.get(&l.mapping_id).copied().or_else(|| {
                p.mapping
                    .iter()
                    .find(|m| (m.memory_start..m.memory_limit).contains(&l.address))
            });
            let name = match mapping {
                Some(m) if !s(m.filename).is_empty() && l.address >= m.memory_start => {
                    let file = s(m.filename);
                    format!(
                        "{}+{:#x}",
                        file.rsplit('/').next().unwrap_or(file),
                        l.address - m.memory_start + m.file_offset
                    )
                }
                _ => format!("{:#x}", l.address),
            };
            (l.id, vec![name])
        })
        .collect()
}

/// What each location of `p` is, for [`crate::sites::script_hint`]: a script frame (one line,
/// in no mapping, whose function's system name [`crate::sites::script_kind`] knows: how
/// `pprof.rs` writes CPython's frames and node's JavaScript) with its function's name and
/// file, or native code in its mapping's file (`None`: no mapping).
pub fn location_kinds(p: &pb::Profile) -> HashMap<u64, LocationKind<'_>> {
    use crate::sites::FrameKind;
    let s = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
    let functions: HashMap<u64, &pb::Function> = p.function.iter().map(|f| (f.id, f)).collect();
    let files: HashMap<u64, &str> = (p.mapping.iter())
        .filter(|m| !s(m.filename).is_empty())
        .map(|m| (m.id, s(m.filename)))
        .collect();
    (p.location.iter())
        .map(|l| {
            let script = match l.line.as_slice() {
                [x] if l.mapping_id == 0 => functions.get(&x.function_id).and_then(|f| {
                    let kind = crate::sites::script_kind(s(f.system_name), s(f.filename))?;
                    Some((kind, s(f.name), s(f.filename)))
                }),
                _ => None,
            };
            let native = (FrameKind::Native(files.get(&l.mapping_id).copied()), "", "");
            (l.id, script.unwrap_or(native))
        })
        .collect()
}

/// What [`location_kinds`] says of a location: its kind, and a script frame's function name
/// and file (empty for native code).
pub type LocationKind<'p> = (crate::sites::FrameKind<'p>, &'p str, &'p str);

/// The [`crate::sites::ScriptHint`] of a sample's stack (with its label), its locations
/// innermost first; `frames(l)`: how many frames location `l` has in the names used for its
/// site (those of [`location_frames`]; `None`: left out), their kinds in `kinds` (from
/// [`location_kinds`]).
pub fn sample_hint(
    locations: &[u64],
    frames: impl Fn(&u64) -> Option<usize>,
    kinds: &HashMap<u64, LocationKind<'_>>,
) -> Option<crate::sites::ScriptHint> {
    use crate::sites::FrameKind;
    let mut each = Vec::new();
    let mut at = Vec::new();
    for l in locations {
        let Some(n) = frames(l) else { continue };
        let k = kinds
            .get(l)
            .copied()
            .unwrap_or((FrameKind::Native(None), "", ""));
        each.extend(std::iter::repeat_n(k.0, n));
        at.extend(std::iter::repeat_n(k, n));
    }
    let mut h = crate::sites::script_hint(&each)?;
    let (_, function, file) = at[h.innermost as usize];
    h.label = crate::sites::script_label(function, file);
    for (i, label) in &mut h.outer {
        let (_, function, file) = at[*i as usize];
        *label = crate::sites::script_label(function, file);
    }
    Some(h)
}

/// The folded stacks of profile `p`, valued by sample type `index` (see [`sample_index`]).
///
/// Frames are root-first; a location's inlined functions are expanded (callers first), named
/// as in the profile. A location without function names (not symbolized) is shown as
/// `MODULE+0xOFFSET` (the file offset in its mapping's file, as `addr2line -e MODULE` takes
/// it) or, outside any mapping, as its address. A sample with no locations is
/// `(no stack trace)`. When samples carry the string labels `process_name` and `pid` (a
/// multi-process snapshot), each stack is rooted at a frame `NAME (pid PID)`, so that the
/// processes stand side by side.
pub fn from_profile(p: &pb::Profile, index: usize) -> Folded {
    let s = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
    let frames = location_frames(p);
    let key_process_name = p.string_table.iter().position(|x| x == "process_name");
    let key_pid = p.string_table.iter().position(|x| x == "pid");
    let label = |sample: &pb::Sample, k: Option<usize>| -> Option<&str> {
        let k = k? as i64;
        sample
            .label
            .iter()
            .find(|l| l.key == k && l.str != 0)
            .map(|l| s(l.str))
    };
    let mut out = Folded::new();
    for sample in &p.sample {
        let v = sample.value.get(index).copied().unwrap_or(0);
        if v <= 0 {
            continue;
        }
        let mut names: Vec<&str> = Vec::new();
        let root = match (label(sample, key_process_name), label(sample, key_pid)) {
            (Some(n), Some(pid)) => Some(format!("{n} (pid {pid})")),
            (None, Some(pid)) => Some(format!("pid {pid}")),
            _ => None,
        };
        if let Some(r) = &root {
            names.push(r);
        }
        let before = names.len();
        for id in sample.location_id.iter().rev() {
            if let Some(f) = frames.get(id) {
                names.extend(f.iter().rev().map(String::as_str));
            }
        }
        if names.len() == before {
            names.push("(no stack trace)");
        }
        *out.entry(key(names.iter().copied())).or_default() += v as u64;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> pb::Profile {
        let strings = [
            "",
            "inuse_objects",
            "count",
            "inuse_space",
            "bytes",
            "main",
            "alloc;it",
            "inlined",
            "/usr/lib/libfoo.so",
            "process_name",
            "pid",
            "prog",
            "42",
        ];
        pb::Profile {
            sample_type: vec![
                pb::ValueType { r#type: 1, unit: 2 },
                pb::ValueType { r#type: 3, unit: 4 },
            ],
            function: (1..=3)
                .map(|i| pb::Function {
                    id: i,
                    name: [5, 6, 7][i as usize - 1],
                    ..Default::default()
                })
                .collect(),
            mapping: vec![pb::Mapping {
                id: 1,
                memory_start: 0x7000,
                memory_limit: 0x9000,
                file_offset: 0x1000,
                filename: 8,
                ..Default::default()
            }],
            location: vec![
                // main
                pb::Location {
                    id: 1,
                    line: vec![pb::Line {
                        function_id: 1,
                        line: 0,
                    }],
                    ..Default::default()
                },
                // "inlined" inlined into "alloc;it"
                pb::Location {
                    id: 2,
                    line: vec![
                        pb::Line {
                            function_id: 3,
                            line: 0,
                        },
                        pb::Line {
                            function_id: 2,
                            line: 0,
                        },
                    ],
                    ..Default::default()
                },
                // unsymbolized, in libfoo.so at file offset 0x1000 + 0x234
                pb::Location {
                    id: 3,
                    mapping_id: 1,
                    address: 0x7234,
                    ..Default::default()
                },
                // unsymbolized, in no mapping
                pb::Location {
                    id: 4,
                    address: 0x55,
                    ..Default::default()
                },
            ],
            sample: vec![
                pb::Sample {
                    location_id: vec![2, 1],
                    value: vec![2, 200],
                    label: vec![],
                },
                pb::Sample {
                    location_id: vec![3, 1],
                    value: vec![1, 30],
                    label: vec![],
                },
                pb::Sample {
                    location_id: vec![4],
                    value: vec![1, 7],
                    label: vec![
                        pb::Label {
                            key: 9,
                            str: 11,
                            ..Default::default()
                        },
                        pb::Label {
                            key: 10,
                            str: 12,
                            ..Default::default()
                        },
                    ],
                },
                pb::Sample {
                    location_id: vec![],
                    value: vec![1, 5],
                    label: vec![],
                },
                pb::Sample {
                    location_id: vec![1],
                    value: vec![0, 0],
                    label: vec![],
                },
            ],
            string_table: strings.iter().map(|s| s.to_string()).collect(),
            default_sample_type: 3,
            ..Default::default()
        }
    }

    #[test]
    fn folded_frames_are_root_first_and_named() {
        let p = profile();
        let f = from_profile(&p, 1);
        let want: Folded = [
            ("main;alloc:it;inlined", 200),
            ("main;libfoo.so+0x1234", 30),
            ("prog (pid 42);0x55", 7),
            ("(no stack trace)", 5),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(f, want);
        assert_eq!(from_profile(&p, 0).values().sum::<u64>(), 5);
    }

    #[test]
    fn sample_index_by_name_and_default() {
        let mut p = profile();
        assert_eq!(sample_index(&p, None).unwrap(), 1);
        assert_eq!(sample_index(&p, Some("inuse_objects")).unwrap(), 0);
        let e = sample_index(&p, Some("alloc_space"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("inuse_objects, inuse_space"), "{e}");
        p.default_sample_type = 0;
        assert_eq!(sample_index(&p, None).unwrap(), 1);
        assert_eq!(count_name(&p, 0), "blocks");
        assert_eq!(count_name(&p, 1), "bytes");
    }
}
