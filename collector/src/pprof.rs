//! Building a pprof profile from a snapshot.
//!
//! Follows google/pprof `proto/profile.proto` and the conventions of Go's heap profiles
//! (`runtime/pprof/protomem.go`): sample types `alloc_objects/count`, `alloc_space/bytes`,
//! `inuse_objects/count`, `inuse_space/bytes` with `inuse_space` the default; one sample per
//! (stack, thread, block size) with a numeric label `bytes`, the block size;
//! `string_table[0] == ""`; ids from 1; locations at the call instruction (return address − 1).

use crate::snapshot::Collected;
use crate::symbolize::Resolved;
use heapdump_proto as pb;
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::HashMap;

/// Regex (pprof `drop_frames`) matching the shim's own frames; the collector also strips them
/// ([`is_shim_function`]).
pub const DROP_FRAMES: &str = r"(heapdump_instrumentation::.*|<heapdump_instrumentation::.*|(.*::)?__(rust|rg|rdl)_(alloc|alloc_zeroed|realloc|dealloc))";

/// How to build the profile.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// One sample per live block, labelled address, bytes, timestamp, thread.
    pub with_tags: bool,
    /// Resolve function names, files and lines (else pprof may do it from the mappings).
    pub symbolize: bool,
}

struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        Strings {
            table: vec![String::new()],
            index: HashMap::from([(String::new(), 0)]),
        }
    }
    /// The index of `s` in the string table, added if new. Control characters are escaped
    /// ([`crate::regions::shown`]): every string of a profile (function and file names, the
    /// command line in a comment, labels) is shown by a viewer such as `go tool pprof -top`,
    /// and many come from the profiled program.
    fn id(&mut self, s: &str) -> i64 {
        let s = &*crate::regions::shown(s);
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

/// Whether a resolved frame is the shim's own (in `libheapdump.so`, or a function of the
/// recording path): leaf frames like these are stripped from stack traces.
pub fn is_shim_frame(r: &Resolved, modules: &[vmo_layout::Module]) -> bool {
    // The single frame of the blocks found live at `heapdump attach`: it names them.
    if r.frames
        .last()
        .is_some_and(|f| f.function == vmo_layout::attach::BEFORE_ATTACH_FRAME)
    {
        return false;
    }
    if let Some(m) = r.module {
        if modules[m].path.ends_with("/libheapdump.so") {
            return true;
        }
    }
    r.frames
        .last()
        .is_some_and(|f| is_shim_function(&f.function))
}

/// A module's pprof mapping: (memory start, memory limit, file offset) of its executable
/// segments (its first segment if none is marked executable), page-aligned as pprof wants.
/// A file with several executable segments (node's three) is one mapping from the first to
/// the end of the last that lies as far from its file offset as the first (the same
/// address-to-offset rule holds across them; helper W, 1: node's mapping covered 7.8 KB of
/// its first segment, and 4,849 of 5,108 locations lay outside it).
pub fn mapping_of(m: &vmo_layout::Module) -> (u64, u64, u64) {
    let exec = |s: &&vmo_layout::v1::SegmentV1| (s.offset_flags >> 56) & 1 == 1;
    let offset = |s: &vmo_layout::v1::SegmentV1| s.offset_flags & ((1 << 56) - 1);
    let seg = (m.segments.iter().find(exec))
        .or(m.segments.first())
        .copied()
        .unwrap_or_default();
    let delta = seg.vaddr.wrapping_sub(offset(&seg));
    let end = (m.segments.iter())
        .filter(|s| exec(s) && s.vaddr.wrapping_sub(offset(s)) == delta && s.vaddr >= seg.vaddr)
        .map(|s| s.vaddr.wrapping_add(s.memsz))
        .max()
        .unwrap_or(seg.vaddr.wrapping_add(seg.memsz));
    let start = m.base.wrapping_add(seg.vaddr);
    (
        start & !0xfff,
        m.base.wrapping_add(end),
        offset(&seg) & !0xfff,
    )
}

/// An address of module `m` that has no function name, as every output spells it:
/// `FILE+0xOFFSET` (the file's name, and the offset in it that `addr2line -e FILE` takes),
/// as the flame graph of a profile names such a location ([`crate::flame::from_profile`]).
pub fn module_frame(m: &vmo_layout::Module, address: u64) -> String {
    let (start, _, file_offset) = mapping_of(m);
    let file = m.path.rsplit('/').next().unwrap_or(&m.path);
    format!(
        "{file}+{:#x}",
        address.wrapping_sub(start).wrapping_add(file_offset)
    )
}

/// Whether the (demangled) function `name` belongs to the recording path rather than to the
/// program: the instrumentation crate (`HeapdumpAlloc`'s methods, fully qualified), and the
/// global-allocator shims rustc generates (`__rust_alloc`, `__rg_alloc`, `__rdl_alloc` and
/// their zeroed/realloc/dealloc forms, also under a path such as `__rustc::__rust_alloc`).
pub fn is_shim_function(name: &str) -> bool {
    const SHIMS: [&str; 12] = [
        "__rust_alloc",
        "__rust_alloc_zeroed",
        "__rust_realloc",
        "__rust_dealloc",
        "__rg_alloc",
        "__rg_alloc_zeroed",
        "__rg_realloc",
        "__rg_dealloc",
        "__rdl_alloc",
        "__rdl_alloc_zeroed",
        "__rdl_realloc",
        "__rdl_dealloc",
    ];
    name.starts_with("heapdump_instrumentation::")
        || name.starts_with("<heapdump_instrumentation::")
        || SHIMS
            .iter()
            .any(|s| name == *s || name.strip_suffix(s).is_some_and(|p| p.ends_with("::")))
}

/// The sample types of Go's heap profiles (`alloc_objects/count`, `alloc_space/bytes`,
/// `inuse_objects/count`, `inuse_space/bytes`), `inuse_space` the default.
fn heap_sample_types(s: &mut Strings, p: &mut pb::Profile) {
    for (t, u) in [
        ("alloc_objects", "count"),
        ("alloc_space", "bytes"),
        ("inuse_objects", "count"),
        ("inuse_space", "bytes"),
    ] {
        p.sample_type.push(pb::ValueType {
            r#type: s.id(t),
            unit: s.id(u),
        });
    }
    p.default_sample_type = s.id("inuse_space");
}

/// Builds the profile.
pub fn build(c: &Collected, opts: Options) -> (pb::Profile, Option<BlockSamples<'_>>) {
    let mut s = Strings::new();
    let mut p = pb::Profile::default();
    heap_sample_types(&mut s, &mut p);
    p.period_type = Some(pb::ValueType {
        r#type: s.id("space"),
        unit: s.id("bytes"),
    });
    p.period = c.info.sample_interval.max(1) as i64;
    p.time_nanos = c.time_realtime_ns as i64;
    p.drop_frames = s.id(DROP_FRAMES);

    // Addresses to resolve: call sites (return address - 1).
    // Deduplicated through a set first: the stacks of a CPython process hold millions of
    // frames but a few tens of thousands of distinct addresses.
    let mut addrs: Vec<u64> = (c.stacks.values().flatten())
        .map(|pc| pc.wrapping_sub(1))
        .collect::<FxHashSet<u64>>()
        .into_iter()
        .collect();
    addrs.sort_unstable();
    let resolved: HashMap<u64, Resolved> = crate::python::resolve(
        &c.modules,
        &c.jit,
        &c.python,
        &addrs,
        opts.symbolize,
        c.read_as.as_ref(),
    );

    // Mappings: the main executable first, then modules in table order.
    let mut order: Vec<usize> = (0..c.modules.len()).collect();
    order.sort_by_key(|&i| c.modules[i].path != c.info.exe_path);
    let mut mapping_id: HashMap<usize, u64> = HashMap::new();
    let mut symbolized_module: HashMap<usize, bool> = HashMap::new();
    for r in resolved.values() {
        if let Some(m) = r.module {
            *symbolized_module.entry(m).or_default() |= !r.frames.is_empty();
        }
    }
    for i in order {
        let Some(&has) = symbolized_module.get(&i) else {
            continue;
        };
        let m = &c.modules[i];
        let (memory_start, memory_limit, file_offset) = mapping_of(m);
        let id = p.mapping.len() as u64 + 1;
        p.mapping.push(pb::Mapping {
            id,
            memory_start,
            memory_limit,
            file_offset,
            filename: s.id(&m.path),
            build_id: s.id(&hex(&m.build_id)),
            has_functions: has,
            has_filenames: has,
            has_line_numbers: has,
            has_inline_frames: has,
        });
        mapping_id.insert(i, id);
    }

    // Locations and functions.
    let mut loc_id: FxHashMap<u64, u64> = FxHashMap::default();
    let mut fn_id: HashMap<(String, String), u64> = HashMap::new();
    for &a in &addrs {
        let r = &resolved[&a];
        let mut lines = Vec::with_capacity(r.frames.len());
        // Generated code's system name is the JIT's own (`py::<module>:app.py`,
        // `JS:*makeBuffers app.js:1:21`): pprof then shows the name as it is, where it would
        // take `<module>` for a C++ template argument list and drop it.
        let system_name = match r.module {
            None => c.jit.name(a),
            Some(_) => None,
        };
        for f in &r.frames {
            let key = (f.function.clone(), f.file.clone());
            let next = fn_id.len() as u64 + 1;
            let fid = *fn_id.entry(key).or_insert_with(|| {
                // A Python function's system name is the one CPython's perf maps give it
                // (`py::QUALNAME:FILE`): pprof takes a name equal to its system name for a
                // linkage name to demangle, and would cut `<module>` to nothing.
                let system = if a.wrapping_add(1) & vmo_layout::v1::PYTHON_FRAME != 0 {
                    format!("py::{}:{}", f.function, f.file)
                } else {
                    f.function.clone()
                };
                p.function.push(pb::Function {
                    id: next,
                    name: s.id(&f.function),
                    system_name: s.id(system_name.unwrap_or(&system)),
                    filename: s.id(&f.file),
                    start_line: 0,
                });
                next
            });
            lines.push(pb::Line {
                function_id: fid,
                line: f.line as i64,
            });
        }
        let id = p.location.len() as u64 + 1;
        p.location.push(pb::Location {
            id,
            mapping_id: r
                .module
                .and_then(|m| mapping_id.get(&m).copied())
                .unwrap_or(0),
            address: a,
            line: lines,
            is_folded: false,
        });
        loc_id.insert(a, id);
    }

    // Stack id -> location ids with the shim's own leaf frames stripped.
    let locations_of = |stack: u32| -> Vec<u64> {
        let Some(frames) = c.stacks.get(&stack) else {
            return Vec::new();
        };
        let skip = (frames.iter())
            .take_while(|pc| is_shim_frame(&resolved[&pc.wrapping_sub(1)], &c.modules))
            .count();
        (frames[skip..].iter())
            .map(|pc| loc_id[&pc.wrapping_sub(1)])
            .collect()
    };
    let thread_names: HashMap<u32, &str> =
        c.threads.iter().map(|t| (t.tid, t.name.as_str())).collect();
    let thread_label = |s: &mut Strings, tid: u32| -> pb::Label {
        // A thread whose slot another thread took since: it has exited (helper G, 6: the
        // label was " (13116)").
        let name = thread_names.get(&tid).copied().unwrap_or("exited thread");
        pb::Label {
            key: s.id("thread"),
            str: s.id(&format!("{name} ({tid})")),
            ..Default::default()
        }
    };
    let bytes_label = |s: &mut Strings, n: u64| pb::Label {
        key: s.id("bytes"),
        num: n as i64,
        num_unit: s.id("bytes"),
        ..Default::default()
    };

    // Live blocks grouped per stack. Like Go's heap profiles (whose runtime keeps one bucket
    // per stack and block size), each sample holds blocks of one size, its `bytes` label. The
    // cumulative alloc_* counters are kept per stack only, with no sizes: they ride on the
    // stack's live sample when that is exact — a single (thread, size) group holding every
    // block ever allocated from the stack — and otherwise go on a sample of their own, with no
    // `bytes` label.
    let mut inuse_by_stack: HashMap<u32, Vec<(u32, u64, f64, f64)>> = HashMap::new();
    for (&(stack, tid, size), &(n, b)) in &c.inuse {
        inuse_by_stack
            .entry(stack)
            .or_default()
            .push((tid, size, n, b));
    }
    let mut stacks: Vec<u32> = c
        .alloc_totals
        .keys()
        .chain(inuse_by_stack.keys())
        .copied()
        .collect();
    stacks.sort_unstable();
    stacks.dedup();
    for stack in stacks {
        let locs = locations_of(stack);
        let (an, ab) = c.alloc_totals.get(&stack).copied().unwrap_or((0.0, 0.0));
        let (an, ab) = (an.round() as i64, ab.round() as i64);
        let mut live = inuse_by_stack.remove(&stack).unwrap_or_default();
        live.sort_unstable_by_key(|e| (e.0, e.1));
        if opts.with_tags {
            // Per-block samples carry inuse; one untagged sample carries alloc_*.
            if an > 0 {
                p.sample.push(pb::Sample {
                    location_id: locs.clone(),
                    value: vec![an, ab, 0, 0],
                    label: vec![],
                });
            }
            continue;
        }
        let merged = matches!(live.as_slice(), [(_, _, n, b)]
            if n.round() as i64 == an && b.round() as i64 == ab);
        if !merged && an > 0 {
            p.sample.push(pb::Sample {
                location_id: locs.clone(),
                value: vec![an, ab, 0, 0],
                label: vec![],
            });
        }
        for (tid, size, n, b) in live {
            let (a0, a1) = if merged { (an, ab) } else { (0, 0) };
            let labels = vec![bytes_label(&mut s, size), thread_label(&mut s, tid)];
            p.sample.push(pb::Sample {
                location_id: locs.clone(),
                value: vec![a0, a1, n.round() as i64, b.round() as i64],
                label: labels,
            });
        }
    }
    // Per-block samples (--with-tags) are encoded while writing, not held in memory: a
    // profile of 10 M blocks would otherwise need gigabytes.
    let blocks = c.blocks.as_ref().map(|blocks| {
        let mut tids: Vec<u32> = blocks.iter().map(|b| b.thread).collect();
        tids.sort_unstable();
        tids.dedup();
        let thread_labels = tids
            .into_iter()
            .map(|t| (t, thread_label(&mut s, t)))
            .collect();
        let mut stacks: Vec<u32> = blocks.iter().map(|b| b.stack).collect();
        stacks.sort_unstable();
        stacks.dedup();
        BlockSamples {
            blocks,
            locations: stacks
                .into_iter()
                .map(|st| (st, locations_of(st)))
                .collect(),
            thread_labels,
            key_address: s.id("address"),
            bytes: bytes_label(&mut s, 0),
            key_timestamp: s.id("timestamp"),
            unit_ns: s.id("nanoseconds"),
            interval: c.info.sample_interval,
            // Header values (untrusted): wrapping, never an overflow.
            wall_offset: (c.info.created_realtime_ns as i64)
                .wrapping_sub(c.info.created_monotonic_ns as i64),
            extra: Vec::new(),
            strings: HashMap::new(),
            key_string: 0,
        }
    });

    let k = &c.info.counters;
    let comments = [
        format!(
            "heapdump snapshot of pid {} ({}), {}",
            c.info.pid,
            c.info.cmdline.join(" "),
            if c.alive { "alive" } else { "exited" }
        ),
        format!("region layout v{}, executable {}", c.info.version, c.info.exe_path),
        if c.info.sample_interval > 0 {
            format!(
                "sampled: one byte in {} on average (Poisson); values are unbiased estimates",
                c.info.sample_interval
            )
        } else {
            "every allocation recorded (not sampled)".to_owned()
        },
        match &c.stopped {
            Some((how, threads)) => format!(
                "snapshot: {} live blocks, {} bytes; {} nodes scanned; target stopped ({how}, \
                 {threads} threads) for the whole scan: records read as they were, no operation \
                 in flight was awaited ({} thread(s) stopped inside an operation, each counted \
                 by its record)",
                c.meta.blocks, c.meta.bytes, c.meta.nodes_scanned, c.meta.stopped_in_operation
            ),
            None => format!(
                "snapshot: {} live blocks, {} bytes; {} nodes scanned; waited {} ns for in-flight operations ({} read after the scan); lease held {} ns",
                c.meta.blocks, c.meta.bytes, c.meta.nodes_scanned, c.meta.max_wait_ns, c.meta.resolved_after_scan, c.meta.lease_ns
            ),
        },
        format!(
            "counters: live_bytes={} live_blocks={} allocations={} frees={} peak_live_bytes={} dropped_blocks={} dropped_stacks={} threads={}",
            k.live_bytes, k.live_blocks, k.allocs, k.frees, k.peak_live_bytes, k.dropped_blocks, k.dropped_stacks, k.threads
        ),
    ];
    let recording: Vec<String> = (c.info.stop_reasons().into_iter())
        .map(|r| format!("recording stopped: {r}"))
        .chain(c.info.warnings.iter().map(|w| format!("shim warning: {w}")))
        .collect();
    // The snapshot's instant on the region's clock, for `snapshot --since PROFILE` later.
    let instant = format!(
        "heapdump-instant pid={} start_ticks={} region_ns={}",
        c.info.pid, c.info.start_ticks, c.meta.time_ns
    );
    for cm in comments
        .iter()
        .chain(c.notes.iter())
        .chain(std::iter::once(&instant))
        .chain(c.meta.warnings.iter())
        .chain(recording.iter())
    {
        let i = s.id(cm);
        p.comment.push(i);
    }
    p.string_table = s.table;
    (p, blocks)
}

/// One sample per live block (`--with-tags`), produced while the profile is written.
#[derive(Debug)]
pub struct BlockSamples<'a> {
    blocks: &'a [vmo_layout::Block],
    locations: HashMap<u32, Vec<u64>>,
    thread_labels: HashMap<u32, pb::Label>,
    key_address: i64,
    /// A `bytes` label (its `num` is set per block).
    bytes: pb::Label,
    key_timestamp: i64,
    unit_ns: i64,
    interval: u64,
    /// Realtime minus monotonic clock at region creation (ns).
    wall_offset: i64,
    /// Labels every sample also carries (`process_name`, `pid` in a merged profile).
    extra: Vec<pb::Label>,
    /// Block address → string id of its `string` label (`--with-strings`).
    strings: HashMap<u64, i64>,
    /// String id of the key `string`.
    key_string: i64,
}

impl BlockSamples<'_> {
    /// Follows [`merge`]'s renumbering of the profile these samples belong to: location ids
    /// shifted by `location_base`, string ids mapped by `string`, and `extra` labels added to
    /// every sample.
    fn renumber(&mut self, location_base: u64, string: impl Fn(i64) -> i64, extra: [pb::Label; 2]) {
        for locs in self.locations.values_mut() {
            for l in locs.iter_mut() {
                *l += location_base;
            }
        }
        for t in self.thread_labels.values_mut() {
            t.key = string(t.key);
            t.str = string(t.str);
        }
        self.key_address = string(self.key_address);
        self.bytes.key = string(self.bytes.key);
        self.bytes.num_unit = string(self.bytes.num_unit);
        self.key_timestamp = string(self.key_timestamp);
        self.unit_ns = string(self.unit_ns);
        self.key_string = string(self.key_string);
        for v in self.strings.values_mut() {
            *v = string(*v);
        }
        self.extra.extend(extra);
    }

    /// Gives the sample of each block in `strings` (block address → text) the string label
    /// `string` with that text; the texts are added to `p`'s string table (`p` is the profile
    /// [`build`] returned these samples with).
    pub fn add_strings(&mut self, p: &mut pb::Profile, strings: &HashMap<u64, String>) {
        let table = &mut p.string_table;
        table.push("string".to_owned());
        self.key_string = table.len() as i64 - 1;
        let mut ids: HashMap<&str, i64> = HashMap::new();
        for (&address, text) in strings {
            let i = *ids.entry(text.as_str()).or_insert_with(|| {
                table.push(text.clone());
                table.len() as i64 - 1
            });
            self.strings.insert(address, i);
        }
    }
    /// Appends every per-block sample to `out` as repeated field 2 of `Profile` (protobuf
    /// merges a repeated field encoded in several pieces), calling `flush` every few MiB.
    fn encode(
        &self,
        out: &mut Vec<u8>,
        mut flush: impl FnMut(&mut Vec<u8>) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        use prost::Message;
        let mut sample = pb::Sample::default();
        for b in self.blocks {
            let w = crate::snapshot::weight(b.size as f64, self.interval);
            sample.location_id.clear();
            sample
                .location_id
                .extend_from_slice(self.locations.get(&b.stack).map_or(&[][..], |v| v));
            sample.value.clear();
            sample.value.extend_from_slice(&[
                0,
                0,
                w.round() as i64,
                (w * b.size as f64).round() as i64,
            ]);
            sample.label.clear();
            sample.label.push(pb::Label {
                key: self.key_address,
                num: b.address as i64,
                ..Default::default()
            });
            sample.label.push(pb::Label {
                num: b.size as i64,
                ..self.bytes
            });
            sample.label.push(pb::Label {
                key: self.key_timestamp,
                num: (b.t_alloc as i64).wrapping_add(self.wall_offset),
                num_unit: self.unit_ns,
                ..Default::default()
            });
            if let Some(t) = self.thread_labels.get(&b.thread) {
                sample.label.push(*t);
            }
            if let Some(&text) = self.strings.get(&b.address) {
                sample.label.push(pb::Label {
                    key: self.key_string,
                    str: text,
                    ..Default::default()
                });
            }
            sample.label.extend_from_slice(&self.extra);
            prost::encoding::encode_key(2, prost::encoding::WireType::LengthDelimited, out);
            prost::encoding::encode_varint(sample.encoded_len() as u64, out);
            sample.encode_raw(out);
            if out.len() >= 4 << 20 {
                flush(out)?;
            }
        }
        flush(out)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Adds `text` to `p`'s comments (`go tool pprof -comments`).
pub fn add_comment(p: &mut pb::Profile, text: &str) {
    p.string_table.push(text.to_owned());
    p.comment.push(p.string_table.len() as i64 - 1);
}

/// Writes `p` (and the per-block samples, if any) gzip-compressed to `path`; `-` means
/// standard output.
///
/// A file is written atomically and exclusively: the data goes to a fresh temporary file
/// created with `O_EXCL | O_NOFOLLOW` (so a planted symlink or file is never followed or
/// reused) and mode 0600 in `path`'s directory, opened once without following a link
/// ([`crate::outdir::Dir`]), which is then renamed over `path`. The
/// profile is therefore never world-readable (it holds the command line).
///
/// Errors: `path` is a directory, its directory cannot be written, or an I/O error (the
/// temporary file is removed).
pub fn write(
    p: &pb::Profile,
    blocks: Option<&BlockSamples<'_>>,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    write_parts(p, blocks.as_slice(), path)
}

/// [`write`] with the per-block samples of several processes (those of a merged profile,
/// renumbered by [`merge`]).
pub fn write_parts(
    p: &pb::Profile,
    blocks: &[&BlockSamples<'_>],
    path: &std::path::Path,
) -> anyhow::Result<()> {
    crate::output::write_with(path, |out| encode_parts(p, blocks, out))
}

/// Encodes `p` and the per-block samples gzip-compressed into `out` (what [`write_parts`]
/// writes).
fn encode_parts(
    p: &pb::Profile,
    blocks: &[&BlockSamples<'_>],
    out: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    use std::io::Write;
    // Large per-block profiles favour speed over size.
    let level = if blocks.iter().map(|b| b.blocks.len()).sum::<usize>() > 100_000 {
        flate2::Compression::fast()
    } else {
        flate2::Compression::default()
    };
    use prost::Message;
    let mut gz = flate2::write::GzEncoder::new(std::io::BufWriter::new(out), level);
    gz.write_all(&p.encode_to_vec())?;
    for b in blocks {
        let mut buf = Vec::with_capacity(5 << 20);
        b.encode(&mut buf, |buf| {
            gz.write_all(buf)?;
            buf.clear();
            Ok(())
        })?;
    }
    gz.finish()?.flush()
}

/// `p` as the bytes of a gzip-compressed pprof file (what [`write`] writes without per-block
/// samples).
///
/// Errors: none in practice (compression into memory); reported as I/O errors.
pub fn encode_gz(p: &pb::Profile) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    encode_parts(p, &[], &mut out)?;
    Ok(out)
}

/// A profile of live blocks named by function only (no addresses or mappings): what a
/// reference-graph capture (`.hdsnap`) holds, which records each stack trace as function
/// names. `stacks`: names per stack id, innermost first; `samples`: (stack id, blocks, bytes).
/// Sample types `inuse_objects` and `inuse_space` only: a capture, a leak report or a
/// difference has no cumulative counts, and `alloc_*` equal to the live values (as written
/// before) read as wrong numbers (helper G, 4: 5,001 "allocations" for 10,001);
/// `comments` become the profile's comments.
pub fn from_names(
    stacks: &HashMap<u32, Vec<String>>,
    samples: impl Iterator<Item = (u32, u64, u64)>,
    comments: &[String],
) -> pb::Profile {
    let mut s = Strings::new();
    let mut p = pb::Profile::default();
    for (t, u) in [("inuse_objects", "count"), ("inuse_space", "bytes")] {
        p.sample_type.push(pb::ValueType {
            r#type: s.id(t),
            unit: s.id(u),
        });
    }
    p.default_sample_type = s.id("inuse_space");
    let mut functions: HashMap<String, u64> = HashMap::new();
    let mut locations_of: HashMap<u32, Vec<u64>> = HashMap::new();
    for (stack, blocks, bytes) in samples {
        let locs = locations_of.entry(stack).or_insert_with(|| {
            let names = stacks.get(&stack).cloned().unwrap_or_default();
            names
                .iter()
                .map(|n| {
                    let next = functions.len() as u64 + 1;
                    *functions.entry(n.clone()).or_insert_with(|| {
                        let name = s.id(n);
                        // pprof takes a name equal to its system name for one to demangle or
                        // simplify, which cuts `<module>` or `<lambda>` to nothing: only a
                        // C++-like name (`ns::f(int)`) gets that, as in [`build`]'s profiles;
                        // the others have no system name and are shown as they are.
                        let system_name = if n.contains("::") { name } else { 0 };
                        p.function.push(pb::Function {
                            id: next,
                            name,
                            system_name,
                            ..Default::default()
                        });
                        p.location.push(pb::Location {
                            id: next,
                            line: vec![pb::Line {
                                function_id: next,
                                line: 0,
                            }],
                            ..Default::default()
                        });
                        next
                    })
                })
                .collect()
        });
        let (b, n) = (blocks as i64, bytes as i64);
        p.sample.push(pb::Sample {
            location_id: locs.clone(),
            value: vec![b, n],
            label: Vec::new(),
        });
    }
    for c in comments {
        let i = s.id(c);
        p.comment.push(i);
    }
    p.string_table = s.table;
    p
}

/// One process's profile (built by [`build`]) in a multi-process snapshot, with the labels
/// that tell its samples apart there.
#[derive(Debug)]
pub struct Part<'a> {
    /// The process's own profile.
    pub profile: pb::Profile,
    /// Its per-block samples (`--with-tags`), renumbered by [`merge`] to follow the profile.
    pub blocks: Option<BlockSamples<'a>>,
    /// Its command name: the string label `process_name` of its samples.
    pub process_name: String,
    /// Its pid: the string label `pid` of its samples.
    pub pid: u32,
}

/// Merges the profiles of several processes into one: every sample keeps its stack, values
/// and labels and gains the string labels `process_name` and `pid` (strings, so that
/// `go tool pprof -tagroot process_name,pid` prints them exactly as written — a numeric label
/// goes through pprof's unit scaling — and `-tagfocus pid=1234` matches one process). Each process keeps mappings, locations and functions of its own
/// (their ids are renumbered, never shared between processes: the same address means
/// different code in two processes). Sample types, default sample type and `drop_frames` are
/// the first part's (all parts come from [`build`], which gives them all the same);
/// `time_nanos` is the earliest; `period` the largest (the values are already unbiased
/// estimates). `comments` come first, then each part's comments prefixed `pid PID: `. Each
/// part's per-block samples, if any, are renumbered in place to match; write them with
/// [`write_parts`].
pub fn merge(parts: &mut [Part<'_>], comments: &[String]) -> pb::Profile {
    let mut s = Strings::new();
    let mut p = pb::Profile::default();
    let str_of = |q: &pb::Profile, i: i64| -> String {
        q.string_table.get(i as usize).cloned().unwrap_or_default()
    };
    if let Some(first) = parts.first() {
        let q = &first.profile;
        for t in &q.sample_type {
            p.sample_type.push(pb::ValueType {
                r#type: s.id(&str_of(q, t.r#type)),
                unit: s.id(&str_of(q, t.unit)),
            });
        }
        p.period_type = q.period_type.map(|t| pb::ValueType {
            r#type: s.id(&str_of(q, t.r#type)),
            unit: s.id(&str_of(q, t.unit)),
        });
        p.default_sample_type = s.id(&str_of(q, q.default_sample_type));
        p.drop_frames = s.id(&str_of(q, q.drop_frames));
        p.keep_frames = s.id(&str_of(q, q.keep_frames));
    }
    for c in comments {
        let i = s.id(c);
        p.comment.push(i);
    }
    let key_name = s.id("process_name");
    let key_pid = s.id("pid");
    for part in parts.iter_mut() {
        let q = &part.profile;
        let ids: Vec<i64> = q.string_table.iter().map(|x| s.id(x)).collect();
        let st = |i: i64| ids.get(i as usize).copied().unwrap_or(0);
        // New ids start above every id so far: no two processes share one.
        let mapping_base = p.mapping.iter().map(|m| m.id).max().unwrap_or(0);
        let location_base = p.location.iter().map(|l| l.id).max().unwrap_or(0);
        let function_base = p.function.iter().map(|f| f.id).max().unwrap_or(0);
        p.mapping.extend(q.mapping.iter().map(|m| pb::Mapping {
            id: m.id + mapping_base,
            filename: st(m.filename),
            build_id: st(m.build_id),
            ..*m
        }));
        p.function.extend(q.function.iter().map(|f| pb::Function {
            id: f.id + function_base,
            name: st(f.name),
            system_name: st(f.system_name),
            filename: st(f.filename),
            start_line: f.start_line,
        }));
        p.location.extend(q.location.iter().map(|l| {
            pb::Location {
                id: l.id + location_base,
                mapping_id: if l.mapping_id == 0 {
                    0
                } else {
                    l.mapping_id + mapping_base
                },
                address: l.address,
                line: l
                    .line
                    .iter()
                    .map(|x| pb::Line {
                        function_id: x.function_id + function_base,
                        line: x.line,
                    })
                    .collect(),
                is_folded: l.is_folded,
            }
        }));
        let name = pb::Label {
            key: key_name,
            str: s.id(&part.process_name),
            ..Default::default()
        };
        let pid = pb::Label {
            key: key_pid,
            str: s.id(&part.pid.to_string()),
            ..Default::default()
        };
        if let Some(b) = part.blocks.as_mut() {
            b.renumber(location_base, st, [name, pid]);
        }
        p.sample.extend(q.sample.iter().map(|x| {
            pb::Sample {
                location_id: x.location_id.iter().map(|l| l + location_base).collect(),
                value: x.value.clone(),
                label: x
                    .label
                    .iter()
                    .map(|l| pb::Label {
                        key: st(l.key),
                        str: st(l.str),
                        num: l.num,
                        num_unit: st(l.num_unit),
                    })
                    .chain([name, pid])
                    .collect(),
            }
        }));
        // Each process's comments, prefixed with its pid (pprof shows identical comments once).
        let prefix = format!("pid {}: ", part.pid);
        for &c in &q.comment {
            let i = s.id(&(prefix.clone() + &str_of(q, c)));
            p.comment.push(i);
        }
        if q.time_nanos != 0 && (p.time_nanos == 0 || q.time_nanos < p.time_nanos) {
            p.time_nanos = q.time_nanos;
        }
        p.period = p.period.max(q.period);
    }
    p.string_table = s.table;
    p
}

/// Whether the file at `path` starts as a gzip stream does (bytes `1f 8b`): a pprof profile
/// as heapdump and Go write them.
pub fn is_gzip(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut m = [0u8; 2];
    crate::regions::open_regular(path)
        .and_then(|mut f| f.read_exact(&mut m))
        .is_ok()
        && m == [0x1f, 0x8b]
}

/// Largest decompressed profile [`read`] accepts (bytes).
pub const MAX_PROFILE_BYTES: u64 = 1 << 30;

/// Largest decoded size [`read`] accepts, as [`scan`] estimates it (bytes): a profile of
/// 10 million per-block samples with their labels takes ~3 GiB.
pub const MAX_DECODED_BYTES: u64 = 4 << 30;

/// Reads a gzip-compressed pprof profile (as [`write`] writes it).
///
/// A crafted file cannot make this take more memory than is free: the decompressed bytes stop
/// at [`MAX_PROFILE_BYTES`] or half the memory free for this process (`MemAvailable` of
/// `/proc/meminfo`, and what `RLIMIT_AS` leaves), whichever is less; then, before decoding,
/// [`scan`] checks the string table and sample types and estimates the decoded size (a
/// 2-byte empty sample decodes to ~80 bytes), which must fit in that half too.
///
/// Errors, naming the file: it cannot be read, is not gzip, decompresses to more than that,
/// would need more memory than that or than [`MAX_DECODED_BYTES`], or is not a pprof profile (does not decode, or its string
/// table does not start with `""`, or it has no sample types).
pub fn read(path: &std::path::Path) -> anyhow::Result<pb::Profile> {
    use anyhow::{bail, Context};
    use prost::Message;
    use std::io::Read;
    // Not blocking, and checked on the descriptor: a FIFO put there (or swapped in after the
    // caller looked) is an error, not a hang.
    let f = crate::regions::open_regular(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let budget = memory_budget();
    let limit = MAX_PROFILE_BYTES.min(budget);
    let mut buf = Vec::new();
    flate2::read::GzDecoder::new(std::io::BufReader::new(f))
        .take(limit + 1)
        .read_to_end(&mut buf)
        .with_context(|| format!("{}: not a readable gzip file", path.display()))?;
    if buf.len() as u64 > limit {
        bail!(
            "{}: decompresses to more than {limit} bytes ({}); refusing to read it",
            path.display(),
            if limit < MAX_PROFILE_BYTES {
                "half the memory free for heapdump"
            } else {
                "the most heapdump reads"
            }
        );
    }
    let shape = scan(&buf).with_context(|| format!("{}: not a pprof profile", path.display()))?;
    if !shape.first_string_empty || !shape.sample_types {
        bail!(
            "{}: not a pprof profile (no string table or no sample types)",
            path.display()
        );
    }
    let need = shape.decoded_bytes.saturating_add(buf.len() as u64);
    if need > MAX_DECODED_BYTES {
        bail!(
            "{}: decoding it would take about {} MiB, more than heapdump reads ({} MiB); \
             refusing to read it",
            path.display(),
            need >> 20,
            MAX_DECODED_BYTES >> 20
        );
    }
    if need > budget {
        bail!(
            "{}: decoding it would take about {} MiB, more than half the memory free for \
             heapdump ({} MiB); refusing to read it",
            path.display(),
            need >> 20,
            budget >> 20
        );
    }
    let p = pb::Profile::decode(buf.as_slice())
        .with_context(|| format!("{}: not a pprof profile", path.display()))?;
    if !matches!(p.string_table.first(), Some(s) if s.is_empty()) || p.sample_type.is_empty() {
        bail!(
            "{}: not a pprof profile (no string table or no sample types)",
            path.display()
        );
    }
    Ok(p)
}

/// Half the memory this process may still take (bytes): the lesser of `MemAvailable` and
/// what `RLIMIT_AS` leaves above the current address space (`VmSize`); `u64::MAX` when
/// neither is known.
fn memory_budget() -> u64 {
    let kib = |text: &str, key: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(key))?;
        let n: u64 = line[key.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(n.saturating_mul(1024))
    };
    let mut free = u64::MAX;
    if let Ok(m) = std::fs::read_to_string("/proc/meminfo") {
        if let Some(a) = kib(&m, "MemAvailable:") {
            free = free.min(a);
        }
    }
    // SAFETY: a zeroed rlimit is a valid value to receive the limit into.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: getrlimit writes the limit into `rl`, which we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut rl) } == 0
        && rl.rlim_cur != libc::RLIM_INFINITY
    {
        let used = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|st| kib(&st, "VmSize:"))
            .unwrap_or(0);
        free = free.min((rl.rlim_cur as u64).saturating_sub(used));
    }
    if free == u64::MAX {
        free
    } else {
        free / 2
    }
}

/// What [`scan`] learnt of an encoded profile without decoding it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Shape {
    /// The string table's first entry is present and empty.
    pub first_string_empty: bool,
    /// It has at least one sample type.
    pub sample_types: bool,
    /// An upper estimate of the memory its decoded form takes (bytes), beyond the encoding.
    pub decoded_bytes: u64,
}

/// Walks the protobuf wire format of a `perftools.profiles.Profile` (`proto/profile.proto`)
/// without building it: its top-level fields and those of each sample and location, where
/// small encodings become large structures (an empty sample, 2 bytes, is a struct of three
/// vectors; a packed id, 1 byte, is 8). Errors: the bytes are not well-formed protobuf.
pub fn scan(buf: &[u8]) -> anyhow::Result<Shape> {
    use anyhow::bail;
    // One field: (number, wire type, payload of a length-delimited field).
    fn fields(
        mut b: &[u8],
        mut each: impl FnMut(u64, u8, &[u8]) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        fn varint(b: &mut &[u8]) -> anyhow::Result<u64> {
            let mut v = 0u64;
            for shift in (0..64).step_by(7) {
                let Some((&x, rest)) = b.split_first() else {
                    bail!("truncated varint");
                };
                *b = rest;
                v |= u64::from(x & 0x7f) << shift;
                if x & 0x80 == 0 {
                    return Ok(v);
                }
            }
            bail!("varint too long")
        }
        while !b.is_empty() {
            let key = varint(&mut b)?;
            let (field, wire) = (key >> 3, (key & 7) as u8);
            let payload: &[u8] = match wire {
                0 => {
                    varint(&mut b)?;
                    &[]
                }
                1 | 5 => {
                    let n = if wire == 1 { 8 } else { 4 };
                    if b.len() < n {
                        bail!("truncated fixed field");
                    }
                    b = &b[n..];
                    &[]
                }
                2 => {
                    let n = varint(&mut b)?;
                    if n > b.len() as u64 {
                        bail!("truncated field");
                    }
                    let (p, rest) = b.split_at(n as usize);
                    b = rest;
                    p
                }
                _ => bail!("wire type {wire}"),
            };
            each(field, wire, payload)?;
        }
        Ok(())
    }
    let mut shape = Shape::default();
    let mut strings = 0u64;
    let mut total = 0u64;
    fields(buf, |field, wire, payload| {
        // Per entry: the decoded struct's size, rounded up (a Vec is 24 bytes, a String 24).
        let add = match (field, wire) {
            // sample_type
            (1, _) => {
                shape.sample_types = true;
                32
            }
            // sample: location_id (1) and value (2), packed or not; label (3).
            (2, 2) => {
                let mut n = 80u64;
                fields(payload, |f, w, p| {
                    n += match (f, w) {
                        (1 | 2, 2) => 8 * p.len() as u64,
                        (1 | 2, _) => 8,
                        (3, _) => 48,
                        _ => 0,
                    };
                    Ok(())
                })?;
                n
            }
            // mapping
            (3, _) => 96,
            // location: line (4)
            (4, 2) => {
                let mut n = 64u64;
                fields(payload, |f, _, _| {
                    n += if f == 4 { 32 } else { 0 };
                    Ok(())
                })?;
                n
            }
            // function
            (5, _) => 48,
            // string_table
            (6, _) => {
                if strings == 0 {
                    shape.first_string_empty = payload.is_empty() && wire == 2;
                }
                strings += 1;
                24
            }
            // comment, packed or not
            (13, 2) => 8 * payload.len() as u64,
            _ => 0,
        };
        total = total
            .saturating_add(add)
            .saturating_add(payload.len() as u64);
        Ok(())
    })?;
    shape.decoded_bytes = total;
    Ok(shape)
}

/// What to write a profile as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A gzip-compressed pprof profile.
    Pprof,
    /// An interactive SVG flame graph of one sample type.
    Svg,
}

/// Writes profile `p` (with its per-block samples, if any) to `out` as `format` says.
///
/// `sample_index` names the sample type (`inuse_space`, …): the flame graph's widths, and the
/// pprof profile's default sample type; `None` keeps the profile's default. `what` describes
/// the profile in the flame graph's title (`pid 1234 (server)`).
///
/// Errors: the profile has no such sample type; a flame graph of per-block samples (they are
/// only streamed into pprof); nothing to draw; or writing fails.
pub fn write_as(
    p: &mut pb::Profile,
    blocks: &[&BlockSamples<'_>],
    out: &std::path::Path,
    format: Format,
    sample_index: Option<&str>,
    what: &str,
) -> anyhow::Result<()> {
    let index = crate::flame::sample_index(p, sample_index)?;
    let type_name = p
        .string_table
        .get(p.sample_type[index].r#type as usize)
        .cloned()
        .unwrap_or_default();
    match format {
        Format::Pprof => {
            if sample_index.is_some() {
                p.default_sample_type = p.sample_type[index].r#type;
            }
            write_parts(p, blocks, out)
        }
        Format::Svg => {
            if !blocks.is_empty() {
                anyhow::bail!(
                    "--with-tags writes one sample per block into a pprof profile: a flame \
                     graph does not need it (leave it out, or write FILE.pb.gz)"
                );
            }
            let folded = crate::flame::from_profile(p, index);
            let title = format!("Heap profile: {type_name} of {what}");
            let count = crate::flame::count_name(p, index);
            if !crate::flame::write_svg(&folded, &title, &count, out)? {
                eprintln!(
                    "heapdump: nothing to draw: no stack has a nonzero {type_name} (the SVG says \
                     so)"
                );
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_mapping_spans_every_executable_segment() {
        // /usr/bin/node (Debian 12): three executable segments 0x400000 from their offsets.
        let seg = |vaddr: u64, memsz: u64, offset: u64, x: bool| vmo_layout::v1::SegmentV1 {
            vaddr,
            memsz,
            offset_flags: offset | (u64::from(x) << 56),
        };
        let node = vmo_layout::Module {
            path: "/usr/bin/node".into(),
            base: 0,
            build_id: Vec::new(),
            segments: vec![
                seg(0x400000, 0x76e5d8, 0, false),
                seg(0xb6f000, 0x1e90, 0x76f000, true),
                seg(0xb72000, 0x1a8bca0, 0x772000, true),
                seg(0x2600000, 0x1f1, 0x2200000, true),
                seg(0x2601000, 0x3038cae, 0x2201000, false),
            ],
            loaded: true,
        };
        assert_eq!(super::mapping_of(&node), (0xb6f000, 0x26001f1, 0x76f000));
    }

    use super::*;

    /// The wire-format scan sees a real profile's string table and sample types, estimates
    /// at least its encoded size, refuses malformed bytes, and prices 1,000,000 empty samples
    /// (2 bytes each) at their decoded size.
    #[test]
    fn scan_estimates_before_decoding() {
        use prost::Message;
        let mut p = pb::Profile {
            string_table: vec![String::new(), "space".into(), "bytes".into()],
            ..Default::default()
        };
        p.sample_type.push(pb::ValueType { r#type: 1, unit: 2 });
        for i in 0..3 {
            p.sample.push(pb::Sample {
                location_id: vec![1, 2, 3],
                value: vec![i],
                label: Vec::new(),
            });
        }
        let buf = p.encode_to_vec();
        let shape = scan(&buf).unwrap();
        assert!(shape.first_string_empty && shape.sample_types, "{shape:?}");
        assert!(
            shape.decoded_bytes >= buf.len() as u64 + 3 * 80,
            "{shape:?}"
        );
        let bomb: Vec<u8> = [0x12u8, 0x00].repeat(1_000_000);
        let shape = scan(&bomb).unwrap();
        assert!(!shape.first_string_empty && !shape.sample_types);
        assert!(shape.decoded_bytes >= 80_000_000, "{shape:?}");
        assert!(
            scan(&[0x12, 0x05, 0x00]).is_err(),
            "a field longer than the rest"
        );
        assert!(scan(&[0x0b]).is_err(), "a group (wire type 3)");
        assert!(scan(&[0x08, 0xff]).is_err(), "a truncated varint");
    }

    /// `top`, `leaks`, `retainers` and `graph` name an unsymbolized address as the flame graph
    /// of a profile names its location: `FILE+0xOFFSET`, the offset `addr2line -e FILE` takes.
    #[test]
    fn an_unsymbolized_frame_is_spelled_alike_everywhere() {
        let m = vmo_layout::Module {
            path: "/usr/lib/libsqlite3.so.0".into(),
            base: 0x7f77_b0e0_0000,
            build_id: Vec::new(),
            segments: vec![
                vmo_layout::v1::SegmentV1 {
                    vaddr: 0,
                    memsz: 0x1_0000,
                    offset_flags: 4 << 56,
                },
                vmo_layout::v1::SegmentV1 {
                    vaddr: 0x1_0000,
                    memsz: 0x20_0000,
                    offset_flags: (5 << 56) | 0x1_0000,
                },
            ],
            loaded: true,
        };
        let a = 0x7f77_b0f2_d502;
        assert_eq!(module_frame(&m, a), "libsqlite3.so.0+0x12d502");
        let (memory_start, memory_limit, file_offset) = mapping_of(&m);
        let p = pb::Profile {
            sample_type: vec![pb::ValueType { r#type: 1, unit: 2 }],
            sample: vec![pb::Sample {
                location_id: vec![1],
                value: vec![7],
                label: vec![],
            }],
            mapping: vec![pb::Mapping {
                id: 1,
                memory_start,
                memory_limit,
                file_offset,
                filename: 3,
                ..Default::default()
            }],
            location: vec![pb::Location {
                id: 1,
                mapping_id: 1,
                address: a,
                ..Default::default()
            }],
            string_table: ["", "space", "bytes", m.path.as_str()]
                .map(String::from)
                .to_vec(),
            ..Default::default()
        };
        let folded = crate::flame::from_profile(&p, 0);
        assert_eq!(folded.keys().collect::<Vec<_>>(), [&module_frame(&m, a)]);
    }

    #[test]
    fn merge_keeps_processes_apart_and_labels_them() {
        let stacks = |f: &str| HashMap::from([(7u32, vec![f.to_owned(), "main".to_owned()])]);
        let a = from_names(&stacks("alloc_a"), [(7, 2, 200)].into_iter(), &["a".into()]);
        let b = from_names(&stacks("alloc_b"), [(7, 3, 30)].into_iter(), &["b".into()]);
        let m = merge(
            &mut [
                Part {
                    profile: a.clone(),
                    blocks: None,
                    process_name: "prog".into(),
                    pid: 10,
                },
                Part {
                    profile: b,
                    blocks: None,
                    process_name: "other".into(),
                    pid: 11,
                },
            ],
            &["both".into()],
        );
        let s = |i: i64| m.string_table[i as usize].as_str();
        assert_eq!(m.string_table[0], "");
        assert_eq!(m.sample_type.len(), 2);
        assert_eq!(s(m.default_sample_type), "inuse_space");
        // Ids are unique, and each sample's stack names its own process's functions.
        let mut ids: Vec<u64> = m.location.iter().map(|l| l.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), a.location.len() * 2);
        let fname = |loc: u64| {
            let l = m.location.iter().find(|l| l.id == loc).unwrap();
            let f = m
                .function
                .iter()
                .find(|f| f.id == l.line[0].function_id)
                .unwrap();
            s(f.name).to_owned()
        };
        let got: Vec<(String, String, String, i64)> = m
            .sample
            .iter()
            .map(|x| {
                let label = |k: &str| {
                    x.label
                        .iter()
                        .find(|l| s(l.key) == k)
                        .map(|l| s(l.str).to_owned())
                        .unwrap()
                };
                (
                    fname(x.location_id[0]),
                    label("process_name"),
                    label("pid"),
                    x.value[1],
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("alloc_a".into(), "prog".into(), "10".into(), 200),
                ("alloc_b".into(), "other".into(), "11".into(), 30)
            ]
        );
        let comments: Vec<&str> = m.comment.iter().map(|&c| s(c)).collect();
        assert_eq!(comments, ["both", "pid 10: a", "pid 11: b"]);
    }
}
