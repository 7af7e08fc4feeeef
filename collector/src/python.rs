//! Python frames: the shim stores each frame of CPython's eval loop as a tagged word
//! ([`vmo_layout::v1::PYTHON_FRAME`]: code record, instruction index) among the return
//! addresses; here they become source-level frames (qualified name, file, line) next to the
//! native ones that blazesym resolves. Everything that names frames (pprof, flame graphs,
//! `top`, `leaks`, `retainers`, DevTools, captures) goes through [`resolve`].
//!
//! Lines come from the code object's line table, recorded with the name, in the format of
//! the record's CPython version ([`line_in`]): the location table of 3.11 to 3.13
//! (`co_linetable`, CPython's `Objects/locations.md`), 3.10's `co_linetable` and 3.6–3.9's
//! `co_lnotab` (both in that version's `Objects/lnotab_notes.txt`).

use crate::symbolize::{self, Frame, Resolved};
use std::collections::HashMap;
use vmo_layout::v1::{PYTHON_EVAL_FRAME, PYTHON_FRAME};
use vmo_layout::{Module, PythonCode, Region};

/// The Python code records a set of stacks names, by record index.
#[derive(Debug, Clone, Default)]
pub struct Codes(pub rustc_hash::FxHashMap<u64, PythonCode>);

/// The record index of a Python frame word, `None` for a return address.
pub fn record_of(frame: u64) -> Option<u64> {
    (frame & PYTHON_FRAME != 0).then_some((frame & !PYTHON_FRAME) >> 32)
}

impl Codes {
    /// Reads the code records that the Python frames of `stacks` name.
    pub fn read<'s>(region: &Region<'_>, stacks: impl Iterator<Item = &'s Vec<u64>>) -> Self {
        let mut out = rustc_hash::FxHashMap::default();
        if !region.has_python_frames() {
            return Codes(out);
        }
        for &f in stacks.flatten() {
            let Some(id) = record_of(f) else { continue };
            if id == 0 || out.contains_key(&id) {
                continue;
            }
            if let Some(c) = region.python_code(f) {
                out.insert(id, c);
            }
        }
        Codes(out)
    }

    /// The source-level frame of Python frame word `frame`.
    pub fn frame(&self, frame: u64) -> Frame {
        let id = record_of(frame).unwrap_or(0);
        let index = (frame & 0xffff_ffff) as u32;
        match self.0.get(&id) {
            Some(c) => Frame {
                function: if c.qualname.is_empty() {
                    "(unnamed Python code)".to_owned()
                } else {
                    c.qualname.clone()
                },
                file: c.filename.clone(),
                line: line_in(c, index).unwrap_or(c.first_line),
            },
            None => Frame {
                function: "(unknown Python code)".to_owned(),
                file: String::new(),
                line: 0,
            },
        }
    }
}

/// Drops CPython's `-X perf` trampolines from the stacks that have Python frames.
///
/// With `-X perf` (3.12+) each run of the eval loop is entered through a trampoline that the
/// interpreter's perf map names `py::QUALNAME:FILE`; the unwinder steps over it, so a stack
/// holds both the trampoline's return address and the Python frame the shim spliced in from
/// the interpreter's state (same function, with its line). In a stack with Python frames of
/// the region's code records, return addresses outside every module that `jit` names
/// `py::…` are removed, so that each Python function appears once. A stack without such
/// frames (3.12 whose region has no Python section, an older heapdump's region) keeps them:
/// they are its only Python names.
pub fn drop_perf_trampolines(
    stacks: &mut HashMap<u32, Vec<u64>>,
    codes: &Codes,
    jit: &crate::perfmap::JitSymbols,
    modules: &[Module],
) {
    let has_python = |frames: &[u64]| {
        frames
            .iter()
            .any(|&f| record_of(f).is_some_and(|id| codes.0.contains_key(&id)))
    };
    let trampoline = |f: u64| {
        let a = f.wrapping_sub(1);
        f & (PYTHON_FRAME | PYTHON_EVAL_FRAME) == 0
            && symbolize::module_of(modules, a).is_none()
            && jit.name(a).is_some_and(|n| n.starts_with("py::"))
    };
    // Without a perf map naming Python trampolines (CPython's `-X perf`) there is nothing to
    // drop: no lookup per frame (a CPython process's stacks run to a hundred frames).
    if !jit.any_name_starts_with("py::") {
        return;
    }
    for frames in stacks.values_mut() {
        if has_python(frames) {
            frames.retain(|&f| !trampoline(f));
        }
    }
}

/// Resolves call-site addresses (return address − 1, as the callers compute them) and Python
/// frames (their word − 1, likewise) alike: Python frames from `codes`, the rest with
/// [`symbolize::symbolize`] when `symbolize` is set (else only their module).
pub fn resolve(
    modules: &[Module],
    jit: &crate::perfmap::JitSymbols,
    codes: &Codes,
    addrs: &[u64],
    symbolize: bool,
    read_as: Option<&symbolize::ReadAs>,
) -> HashMap<u64, Resolved> {
    let (py, tagged): (Vec<u64>, Vec<u64>) = addrs
        .iter()
        .partition(|&&a| a.wrapping_add(1) & PYTHON_FRAME != 0);
    // Eval-loop frames with Python frames below them: resolved as their plain address, then
    // cut to the outermost function.
    let plain = |a: u64| {
        if a.wrapping_add(1) & PYTHON_EVAL_FRAME != 0 {
            a & !PYTHON_EVAL_FRAME
        } else {
            a
        }
    };
    let mut native: Vec<u64> = tagged.iter().map(|&a| plain(a)).collect();
    native.sort_unstable();
    native.dedup();
    let by_plain = if symbolize {
        symbolize::symbolize(modules, &|a| jit.lookup(a), &native, read_as)
    } else {
        native
            .iter()
            .map(|&a| {
                (
                    a,
                    Resolved {
                        module: symbolize::module_of(modules, a),
                        frames: Vec::new(),
                    },
                )
            })
            .collect()
    };
    let mut out: HashMap<u64, Resolved> = HashMap::with_capacity(addrs.len());
    for a in tagged {
        let Some(r) = by_plain.get(&plain(a)) else {
            continue;
        };
        let mut r = r.clone();
        if a != plain(a) {
            let outer = r.frames.pop();
            r.frames = outer.into_iter().collect();
        }
        out.insert(a, r);
    }
    for a in py {
        out.insert(
            a,
            Resolved {
                module: None,
                frames: vec![codes.frame(a.wrapping_add(1))],
            },
        );
    }
    // Names from the program's binaries, perf map and Python code are shown in tables and
    // messages: no control character of theirs reaches a terminal.
    for f in out.values_mut().flat_map(|r| r.frames.iter_mut()) {
        for s in [&mut f.function, &mut f.file] {
            if let std::borrow::Cow::Owned(e) = crate::regions::shown(s) {
                *s = e;
            }
        }
    }
    out
}

/// The line of code unit `index` of code record `c`, decoded as its CPython version wrote its
/// table; `None` for an instruction without a line, an index past the table (or `u32::MAX`:
/// none known), or a malformed table.
pub fn line_in(c: &PythonCode, index: u32) -> Option<u32> {
    if index == u32::MAX {
        return None;
    }
    match c.minor {
        6..=9 => lnotab_line(&c.linetable, c.first_line, index),
        10 => linetable_310_line(&c.linetable, c.first_line, index),
        _ => line_of(&c.linetable, c.first_line, index),
    }
}

/// CPython 3.6–3.9's `co_lnotab`: pairs of (bytecode offset increment, line increment as a
/// signed byte), offsets in bytes (two a code unit); the line of an offset is the first line
/// plus the line increments of every pair whose offset is at or before it (`PyCode_Addr2Line`).
fn lnotab_line(table: &[u8], first_line: u32, index: u32) -> Option<u32> {
    let at = u64::from(index) * 2;
    let mut line = i64::from(first_line);
    let mut offset = 0u64;
    for pair in table.chunks_exact(2) {
        offset += u64::from(pair[0]);
        if offset > at {
            break;
        }
        line += i64::from(pair[1] as i8);
    }
    u32::try_from(line).ok()
}

/// CPython 3.10's `co_linetable`: pairs of (length in bytes, line increment as a signed byte,
/// -128: no line), each describing the next range of bytecode; the line of a range is the
/// first line plus the increments so far (`Objects/lnotab_notes.txt`, `_PyCode_CheckLineNumber`).
fn linetable_310_line(table: &[u8], first_line: u32, index: u32) -> Option<u32> {
    let at = u64::from(index) * 2;
    let mut line = i64::from(first_line);
    let mut end = 0u64;
    for pair in table.chunks_exact(2) {
        let start = end;
        end += u64::from(pair[0]);
        let delta = pair[1] as i8;
        let here = if delta == -128 {
            None
        } else {
            line += i64::from(delta);
            Some(line)
        };
        if at >= start && at < end {
            return here.and_then(|l| u32::try_from(l).ok());
        }
    }
    None
}

/// The line of code unit `index` in a CPython 3.11+ location table starting at `first_line`;
/// `None` for an instruction without a location, an index past the table, or a malformed
/// table.
pub fn line_of(table: &[u8], first_line: u32, index: u32) -> Option<u32> {
    let mut line = first_line as i64;
    let mut unit = 0u64;
    let mut i = 0usize;
    let mut byte = |i: &mut usize| -> Option<u8> {
        let b = *table.get(*i)?;
        *i += 1;
        Some(b)
    };
    fn varint(byte: &mut impl FnMut(&mut usize) -> Option<u8>, i: &mut usize) -> Option<u64> {
        let mut b = byte(i)?;
        let mut v = (b & 63) as u64;
        let mut shift = 6;
        while b & 64 != 0 {
            b = byte(i)?;
            if shift > 60 {
                return None;
            }
            v |= ((b & 63) as u64) << shift;
            shift += 6;
        }
        Some(v)
    }
    fn svarint(byte: &mut impl FnMut(&mut usize) -> Option<u8>, i: &mut usize) -> Option<i64> {
        let v = varint(byte, i)?;
        Some(if v & 1 != 0 {
            -((v >> 1) as i64)
        } else {
            (v >> 1) as i64
        })
    }
    while i < table.len() {
        let b = byte(&mut i)?;
        if b & 0x80 == 0 {
            return None;
        }
        let code = (b >> 3) & 15;
        let len = (b & 7) as u64 + 1;
        let here = match code {
            15 => None,
            14 => {
                line += svarint(&mut byte, &mut i)?;
                for _ in 0..3 {
                    varint(&mut byte, &mut i)?;
                }
                Some(line)
            }
            13 => {
                line += svarint(&mut byte, &mut i)?;
                Some(line)
            }
            10..=12 => {
                line += (code - 10) as i64;
                byte(&mut i)?;
                byte(&mut i)?;
                Some(line)
            }
            _ => {
                byte(&mut i)?;
                Some(line)
            }
        };
        if (index as u64) < unit + len {
            return here.and_then(|l| u32::try_from(l).ok());
        }
        unit += len;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `-X perf` stack: trampolines (named `py::…` by the perf map, outside every module)
    /// between the eval loop's runs go when the stack has Python frames of known records;
    /// a stack without them keeps its trampolines, and a module's code is never dropped even
    /// if a perf map names its address.
    #[test]
    fn perf_trampolines_dropped_only_beside_python_frames() {
        let mut jit = crate::perfmap::JitSymbols::default();
        jit.add_perf_map(
            "7000 b py::build:/a.py\n7100 b py::caller:/a.py\n400100 10 py::odd:/a.py\n",
        );
        let modules = vec![Module {
            path: "/usr/bin/python3.12".into(),
            base: 0x400000,
            build_id: Vec::new(),
            segments: vec![vmo_layout::v1::SegmentV1 {
                vaddr: 0,
                memsz: 0x100000,
                offset_flags: 1 << 56,
            }],
            loaded: true,
        }];
        let mut codes = Codes::default();
        codes.0.insert(
            1,
            PythonCode {
                address: 0x9000,
                qualname: "build".into(),
                filename: "/a.py".into(),
                first_line: 1,
                linetable: Vec::new(),
                minor: 12,
                truncated: false,
            },
        );
        let py = |id: u64| PYTHON_FRAME | (id << 32) | 3;
        let eval = 0x400050 | PYTHON_EVAL_FRAME;
        let with_python = vec![
            0x400010,
            py(1),
            eval,
            0x7006,
            0x400108,
            py(1),
            eval,
            0x7106,
            0x400020,
        ];
        let unknown_record = vec![py(9), eval, 0x7006, 0x400020];
        let native_only = vec![0x400010, 0x400050, 0x7006, 0x400050, 0x7106, 0x400020];
        let mut stacks: HashMap<u32, Vec<u64>> = [
            (1, with_python),
            (2, unknown_record.clone()),
            (3, native_only.clone()),
        ]
        .into_iter()
        .collect();
        drop_perf_trampolines(&mut stacks, &codes, &jit, &modules);
        assert_eq!(
            stacks[&1],
            vec![0x400010, py(1), eval, 0x400108, py(1), eval, 0x400020]
        );
        assert_eq!(stacks[&2], unknown_record);
        assert_eq!(stacks[&3], native_only);
    }

    /// The tables CPython 3.6, 3.8 and 3.10 compiled for
    /// `def f(n):\n    x = []\n    for i in range(n):\n        x.append(i)\n\n    y = [\n        1,\n        2]\n    return x\n`
    /// (first line 2), against the line of each code unit that the interpreter itself gives
    /// (`dis.findlinestarts` on 3.6–3.9, `co_lines()` on 3.10): 3.8 and 3.10 go back from
    /// line 9 to 7 (a negative increment).
    #[test]
    fn lines_of_older_tables() {
        let record = |minor: u8, table: &[u8]| PythonCode {
            address: 0x9000,
            qualname: "f".into(),
            filename: "/t.py".into(),
            first_line: 2,
            linetable: table.to_vec(),
            minor,
            truncated: false,
        };
        let cases: [(u8, &[u8], &[u32]); 3] = [
            (
                6,
                &[0, 1, 4, 1, 14, 1, 14, 3, 2, 1, 6, 1],
                &[
                    3, 3, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 8, 9, 9, 9, 10, 10,
                ],
            ),
            (
                8,
                &[0, 1, 4, 1, 12, 1, 12, 3, 2, 1, 2, 254, 4, 3],
                &[3, 3, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 8, 9, 7, 7, 10, 10],
            ),
            (
                10,
                &[4, 1, 12, 1, 12, 1, 2, 3, 2, 1, 4, 254, 4, 3],
                &[3, 3, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 8, 9, 7, 7, 10, 10],
            ),
        ];
        for (minor, table, lines) in cases {
            let c = record(minor, table);
            let got: Vec<u32> = (0..lines.len() as u32)
                .map(|i| line_in(&c, i).unwrap())
                .collect();
            assert_eq!(got, lines, "3.{minor}");
            assert_eq!(line_in(&c, u32::MAX), None, "3.{minor}");
        }
        // 3.10: past the table, and a range without a line (-128).
        assert_eq!(line_in(&record(10, &[4, 1]), 2), None);
        assert_eq!(line_in(&record(10, &[4, 1, 2, 0x80]), 2), None);
        assert_eq!(line_in(&record(10, &[4, 1, 2, 0x80, 2, 1]), 3), Some(4));
    }

    /// The table CPython 3.11 compiles for
    /// `def f():\n    x = 1\n    return x\n` (firstlineno 1): RESUME on line 1, then two
    /// instructions on line 2, two on line 3 (short and one-line forms).
    #[test]
    fn lines_of_a_small_table() {
        // RESUME: one-line form, delta 0 (code 10), 1 unit, columns 0..0.
        // line 2: code 11 (delta 1), 2 units; line 3: code 11, 2 units.
        let t = [
            0x80 | (10 << 3),
            0,
            0,
            0x80 | (11 << 3) | 1,
            4,
            9,
            0x80 | (11 << 3) | 1,
            4,
            12,
        ];
        assert_eq!(line_of(&t, 1, 0), Some(1));
        assert_eq!(line_of(&t, 1, 1), Some(2));
        assert_eq!(line_of(&t, 1, 2), Some(2));
        assert_eq!(line_of(&t, 1, 3), Some(3));
        assert_eq!(line_of(&t, 1, 4), Some(3));
        assert_eq!(line_of(&t, 1, 5), None);
        // No location (15), then a long form with a negative delta (-1 as svarint 3) and a
        // no-column form with +300 (svarint 600 = 0b1001011000: chunks 0b011000 | 64, 0b1001).
        let t = [
            0x80 | (15 << 3),
            0x80 | (14 << 3),
            3,
            0,
            1,
            2,
            0x80 | (13 << 3),
            24 | 64,
            9,
        ];
        assert_eq!(line_of(&t, 10, 0), None);
        assert_eq!(line_of(&t, 10, 1), Some(9));
        assert_eq!(line_of(&t, 10, 2), Some(309));
        // Malformed: a continuation byte where an entry should start; truncated varint.
        assert_eq!(line_of(&[5], 1, 0), None);
        assert_eq!(line_of(&[0x80 | (13 << 3), 64], 1, 0), None);
    }
}
