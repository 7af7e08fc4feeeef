//! Captures (`.hdsnap`): a self-contained, versioned file holding one snapshot's reference
//! graph, so that `leaks`, `retainers`, `top` and `convert` can analyse it later, elsewhere,
//! any number of times.
//!
//! The format is described for other languages in `proto/hdsnap.proto`; in short:
//!
//! ```text
//! offset 0   8 bytes   magic "HDSNAP\0\n"                          (MAGIC)
//! offset 8   u16 LE    format major version                       (FORMAT_MAJOR = 1)
//! offset 10  u16 LE    format minor version                       (FORMAT_MINOR = 1)
//! offset 12  one gzip member, then nothing, whose content is varint-length-delimited
//!            `hdsnap.Record`s: Header, Stack × stack_count (ascending id),
//!            Blocks × ⌈blocks / batch⌉ (address order, ≤ 65,536 blocks and about 2^20 edges
//!            per batch), Root × root_count, Footer.
//! ```
//!
//! Blocks are stored column-wise per batch (address deltas, sizes, stack ids, threads, edge
//! counts, then the batch's edges as deltas), so the whole file is about 5 bytes per block
//! plus 1–3 per edge once compressed. Readers accept a higher *minor* version (unknown fields
//! and record kinds are skipped) and refuse a higher *major* one with "capture format vN is
//! newer than this heapdump (reads v1); upgrade heapdump".
//!
//! Memory: [`write`] encodes one record at a time into the gzip stream, so besides the graph it
//! is given it holds one batch (a few MiB at most). [`read`] holds the graph it builds plus one
//! record; it never allocates from a count it has not checked against what the file's size can
//! hold (deflate expands at most 1032-fold), and a truncated, corrupt or inconsistent file is an
//! error ("capture is truncated …", "capture is corrupt: …"), never a panic. The gzip trailer's
//! CRC-32 is checked, and nothing may follow it.

use super::{Block, Graph, Root, RootKind};
use crate::sites::ScriptHint;
use anyhow::{anyhow, bail, Context, Result};
use flate2::write::GzEncoder;
use flate2::Compression;
use heapdump_proto::hdsnap as pb;
use pb::record::Kind;
use prost::Message;
use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::Path;

/// The first 8 bytes of every capture.
pub const MAGIC: [u8; 8] = *b"HDSNAP\0\n";
/// Format major version written, and the only one read.
pub const FORMAT_MAJOR: u32 = 1;
/// Format minor version written (any minor version of [`FORMAT_MAJOR`] is read).
pub const FORMAT_MINOR: u32 = 1;
/// Most blocks in one `Blocks` record.
pub const BATCH_BLOCKS: usize = 65_536;
/// A `Blocks` record is closed once it holds this many edges (a block's edges are never split,
/// so one block with more edges makes a batch of its own).
pub const BATCH_EDGES: usize = 1 << 20;
/// Length of the uncompressed prefix: magic, major, minor.
const PREFIX_LEN: usize = 12;
/// gzip compression level: zlib's default (6) for graphs of up to [`FAST_ABOVE`] blocks, 1
/// above (on the 1 M-block random graph, release build: 6 writes 9.97 bytes a block in 0.33 s,
/// 1 writes 11.84 in 0.18 s; the scan of 10 M blocks already takes seconds), as `pprof::write`.
const LEVEL: u32 = 6;
/// Graphs of more blocks than this are compressed with level 1.
const FAST_ABOVE: usize = 100_000;
/// Deflate's largest expansion (2 bits can stand for 258 bytes): bounds the records a file of
/// a given size can hold.
const MAX_INFLATE_RATIO: u64 = 1032;
/// Largest record read when the file's size is unknown.
const MAX_RECORD: u64 = 1 << 32;

/// What a capture says about the process it was taken from (everything but the graph and the
/// stacks). Counts are not here: the writer computes them, the reader checks them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaptureHeader {
    /// The writing program and its version, e.g. `heapdump 0.1.0`.
    pub writer: String,
    /// Target pid.
    pub pid: u32,
    /// Target command line (argv).
    pub cmdline: Vec<String>,
    /// Target executable path.
    pub executable: String,
    /// Snapshot instant, ns since the Unix epoch.
    pub time_unix_ns: u64,
    /// The recorder's sampling interval, bytes (0: every block recorded).
    pub sample_interval: u64,
    /// The target's threads (tid, name), when known.
    pub threads: Vec<pb::Thread>,
    /// The target's loaded modules (path, load bias, build id), when known.
    pub modules: Vec<pb::Module>,
    /// Problems that may make the capture inexact, one sentence each.
    pub warnings: Vec<String>,
}

/// A capture read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capture {
    /// Format version of the file: (major, minor).
    pub format: (u32, u32),
    /// The process and the snapshot.
    pub header: CaptureHeader,
    /// The reference graph, exactly as written.
    pub graph: Graph,
    /// Function names of each stack id, innermost first (the recorder's frames left out).
    pub stacks: HashMap<u32, Vec<String>>,
    /// Where the script frames are in the stacks that have some (for their sites; empty in
    /// a capture written before minor version 1).
    pub hints: HashMap<u32, ScriptHint>,
}

/// What [`write`] did (for the tests: records and the largest one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct WriteStats {
    /// Records written, footer included.
    records: u64,
    /// `Blocks` records among them.
    block_records: u64,
    /// Largest encoded record, bytes (its length prefix included).
    max_record: usize,
    /// Bytes before compression (records with their length prefixes).
    plain: u64,
}

/// Writes `graph` with `header`, `stacks` and their script `hints` (`Stack`'s
/// `script_innermost` and `interpreter`) as a capture to `out`, streaming: the records are
/// encoded one at a time into a gzip stream over `out` (memory: one batch of at most
/// [`BATCH_BLOCKS`] blocks and about [`BATCH_EDGES`] edges). Stacks are written in ascending id
/// order, so equal inputs give equal files. `out` is not flushed beyond what gzip's `finish`
/// writes; a partial file is left on error (write to a temporary file and rename it).
///
/// Errors: `out`'s own, and `InvalidInput` if the graph breaks [`Graph`]'s invariants (blocks
/// not strictly increasing by address, edges or root targets not sorted and unique or out of
/// range, `edge_start` inconsistent) or a stack id is `u32::MAX` — a reader would refuse such
/// a file.
pub fn write(
    out: &mut dyn Write,
    header: &CaptureHeader,
    graph: &Graph,
    stacks: &HashMap<u32, Vec<String>>,
    hints: &HashMap<u32, ScriptHint>,
) -> io::Result<()> {
    write_counted(out, header, graph, stacks, hints).map(|_| ())
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// One record at a time into the gzip stream, through one reused buffer.
struct RecordWriter<W: Write> {
    out: W,
    buf: Vec<u8>,
    stats: WriteStats,
}

impl<W: Write> RecordWriter<W> {
    fn record(&mut self, kind: Kind) -> io::Result<Kind> {
        let rec = pb::Record { kind: Some(kind) };
        self.buf.clear();
        rec.encode_length_delimited(&mut self.buf)
            .map_err(|e| io::Error::other(e.to_string()))?;
        self.out.write_all(&self.buf)?;
        self.stats.records += 1;
        self.stats.max_record = self.stats.max_record.max(self.buf.len());
        self.stats.plain += self.buf.len() as u64;
        Ok(rec.kind.unwrap_or(Kind::Footer(pb::Footer::default())))
    }
}

fn check_graph(graph: &Graph) -> io::Result<()> {
    let n = graph.blocks.len();
    if n > u32::MAX as usize
        || graph.edge_start.len() != n + 1
        || graph.edge_start[0] != 0
        || graph.edge_start[n] as usize != graph.targets.len()
        || graph.edge_start.windows(2).any(|w| w[0] > w[1])
    {
        return Err(invalid(format!(
            "graph of {n} blocks has inconsistent edge offsets ({} offsets, {} targets)",
            graph.edge_start.len(),
            graph.targets.len()
        )));
    }
    if let Some(i) = graph
        .blocks
        .windows(2)
        .position(|w| w[0].address >= w[1].address)
    {
        return Err(invalid(format!(
            "blocks {i} and {} are not in increasing address order",
            i + 1
        )));
    }
    let sorted =
        |t: &[u32]| t.windows(2).all(|w| w[0] < w[1]) && t.iter().all(|&x| (x as usize) < n);
    if let Some(i) = (0..n).find(|&i| !sorted(graph.edges(i as u32))) {
        return Err(invalid(format!(
            "edges of block {i} are not sorted, unique block indices"
        )));
    }
    if let Some(r) = graph.roots.iter().find(|r| !sorted(&r.targets)) {
        return Err(invalid(format!(
            "targets of root {:?} are not sorted, unique block indices",
            r.name
        )));
    }
    Ok(())
}

fn write_counted(
    out: &mut dyn Write,
    header: &CaptureHeader,
    graph: &Graph,
    stacks: &HashMap<u32, Vec<String>>,
    hints: &HashMap<u32, ScriptHint>,
) -> io::Result<WriteStats> {
    check_graph(graph)?;
    if stacks.contains_key(&u32::MAX) {
        return Err(invalid("stack id u32::MAX means \"no stack\"".into()));
    }
    let n = graph.blocks.len();
    let block_bytes = graph
        .blocks
        .iter()
        .fold(0u64, |s, b| s.saturating_add(b.size));
    out.write_all(&MAGIC)?;
    out.write_all(&(FORMAT_MAJOR as u16).to_le_bytes())?;
    out.write_all(&(FORMAT_MINOR as u16).to_le_bytes())?;
    let mut w = RecordWriter {
        out: GzEncoder::new(
            out,
            Compression::new(if n > FAST_ABOVE { 1 } else { LEVEL }),
        ),
        buf: Vec::new(),
        stats: WriteStats::default(),
    };
    w.record(Kind::Header(pb::Header {
        format_major: FORMAT_MAJOR,
        format_minor: FORMAT_MINOR,
        writer: header.writer.clone(),
        pid: header.pid,
        cmdline: header.cmdline.clone(),
        executable: header.executable.clone(),
        time_unix_ns: header.time_unix_ns,
        block_count: n as u64,
        edge_count: graph.targets.len() as u64,
        root_count: graph.roots.len() as u64,
        stack_count: stacks.len() as u64,
        block_bytes,
        sample_interval: header.sample_interval,
        pointer_size: 8,
        threads: header.threads.clone(),
        modules: header.modules.clone(),
        warnings: header.warnings.clone(),
    }))?;

    let mut ids: Vec<u32> = stacks.keys().copied().collect();
    ids.sort_unstable();
    for id in ids {
        let hint = hints.get(&id);
        w.record(Kind::Stack(pb::Stack {
            id,
            function: stacks[&id].clone(),
            file: Vec::new(),
            line: Vec::new(),
            script_innermost: hint.map(|h| h.innermost),
            interpreter: hint.map_or_else(Vec::new, |h| h.interpreter.clone()),
            script_site: hint.map_or_else(String::new, |h| h.label.clone()),
            script_outer: hint.map_or_else(Vec::new, |h| h.outer.iter().map(|o| o.0).collect()),
            script_outer_sites: (hint
                .map_or_else(Vec::new, |h| h.outer.iter().map(|o| o.1.clone()).collect())),
        }))?;
    }

    // One reused batch; its vectors keep their capacity from batch to batch.
    let mut batch = pb::Blocks::default();
    let mut i = 0usize;
    while i < n {
        batch.first_index = i as u64;
        batch.address_delta.clear();
        batch.size.clear();
        batch.stack.clear();
        batch.thread.clear();
        batch.edge_count.clear();
        batch.target_delta.clear();
        let mut prev = 0u64;
        while i < n && batch.size.len() < BATCH_BLOCKS && batch.target_delta.len() < BATCH_EDGES {
            let b = &graph.blocks[i];
            batch.address_delta.push(b.address - prev);
            prev = b.address;
            batch.size.push(b.size);
            batch.stack.push(b.stack);
            batch.thread.push(b.thread);
            let t = graph.edges(i as u32);
            batch.edge_count.push(t.len() as u32);
            let mut p = i as i64;
            for &x in t {
                batch.target_delta.push(x as i64 - p);
                p = x as i64;
            }
            i += 1;
        }
        if let Kind::Blocks(b) = w.record(Kind::Blocks(batch))? {
            batch = b;
        } else {
            unreachable!("record() gives back what it was given")
        }
        w.stats.block_records += 1;
    }

    for r in &graph.roots {
        let mut p = 0u32;
        let target_delta = r
            .targets
            .iter()
            .map(|&t| {
                let d = t - p;
                p = t;
                d
            })
            .collect();
        w.record(Kind::Root(pb::Root {
            kind: match r.kind {
                RootKind::Global => pb::RootKind::Global,
                RootKind::Stack => pb::RootKind::Stack,
                RootKind::Mapping => pb::RootKind::Mapping,
                RootKind::Registers => pb::RootKind::Registers,
            } as i32,
            name: r.name.clone(),
            target_delta,
        }))?;
    }

    let record_count = w.stats.records;
    w.record(Kind::Footer(pb::Footer {
        record_count,
        block_count: n as u64,
        edge_count: graph.targets.len() as u64,
        root_count: graph.roots.len() as u64,
        stack_count: stacks.len() as u64,
        block_bytes,
    }))?;
    let stats = w.stats;
    w.out.finish()?.flush()?;
    Ok(stats)
}

/// Whether the file at `path` starts with the capture magic (so the CLI can tell a capture
/// from a process name). Unreadable or short files are not captures.
pub fn is_capture(path: &Path) -> bool {
    let mut m = [0u8; 8];
    crate::regions::open_regular(path)
        .and_then(|mut f| f.read_exact(&mut m))
        .is_ok()
        && m == MAGIC
}

/// Reads the capture at `path`. Errors name the file: `PATH: capture format v3 is newer than
/// this heapdump (reads v1); upgrade heapdump`, `PATH: capture is truncated (…)`, `PATH:
/// capture is corrupt: …`, `PATH: not a heapdump capture …`, or the open error.
pub fn read(path: &Path) -> Result<Capture> {
    // Not blocking, and checked on the descriptor (see `regions::open_regular`).
    let f = crate::regions::open_regular(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let len = f.metadata().map(|m| m.len()).ok();
    read_from(BufReader::with_capacity(1 << 16, f), len).with_context(|| path.display().to_string())
}

/// An I/O error of the decompressed stream, in the reader's words.
fn stream_error(e: io::Error) -> anyhow::Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        anyhow!("capture is truncated (its gzip stream ends early)")
    } else {
        anyhow!("capture is corrupt: {e}")
    }
}

/// Framed records out of the decompressed stream.
struct RecordReader<R: Read> {
    z: BufReader<R>,
    /// Largest record accepted, bytes.
    max_record: u64,
    buf: Vec<u8>,
    /// Records read.
    count: u64,
}

impl<R: Read> RecordReader<R> {
    /// The next record's bytes; `None` at the end of the stream (before a length).
    fn next(&mut self) -> Result<Option<&[u8]>> {
        let mut len = 0u64;
        for i in 0..10 {
            let mut byte = [0u8; 1];
            if self.z.read(&mut byte).map_err(stream_error)? == 0 {
                if i == 0 {
                    return Ok(None);
                }
                bail!(
                    "capture is truncated (in the length of record {})",
                    self.count
                );
            }
            len |= u64::from(byte[0] & 0x7f) << (7 * i);
            if byte[0] & 0x80 == 0 {
                break;
            }
            if i == 9 {
                bail!(
                    "capture is corrupt: record {} has no valid length",
                    self.count
                );
            }
        }
        if len > self.max_record {
            bail!(
                "capture is corrupt: record {} claims {len} bytes, more than the file can hold",
                self.count
            );
        }
        self.buf.clear();
        // Grows with the bytes actually there, not with the length claimed.
        (&mut self.z)
            .take(len)
            .read_to_end(&mut self.buf)
            .map_err(stream_error)?;
        if self.buf.len() as u64 != len {
            bail!(
                "capture is truncated (record {} has {} of its {len} bytes)",
                self.count,
                self.buf.len()
            );
        }
        self.count += 1;
        Ok(Some(&self.buf))
    }
}

/// Checks that `count` items of at least `min_bytes` encoded bytes each fit in `max_plain`
/// decompressed bytes, and gives the capacity to reserve for them: at most one per byte of
/// the file (`file_len`; 2^20 when unknown), so that what is reserved ahead of the data stays
/// proportional to the file (vectors grow past it as the data arrives).
fn claimed(
    count: u64,
    min_bytes: u64,
    max_plain: u64,
    file_len: Option<u64>,
    what: &str,
) -> Result<usize> {
    if count.saturating_mul(min_bytes) > max_plain {
        bail!("capture is corrupt: its header claims {count} {what}, more than the file can hold");
    }
    Ok(count.min(file_len.unwrap_or(1 << 20)) as usize)
}

/// Reads a capture from `r`, positioned at its first byte; `file_len` (the file's size, when
/// known) bounds what the header's counts may claim. `r` must end where the capture ends.
/// Errors as [`read`]'s, without the path.
pub fn read_from(mut r: impl BufRead, file_len: Option<u64>) -> Result<Capture> {
    let mut prefix = [0u8; PREFIX_LEN];
    if let Err(e) = r.read_exact(&mut prefix) {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            bail!("not a heapdump capture (shorter than the {PREFIX_LEN}-byte prefix)");
        }
        return Err(e.into());
    }
    if prefix[..8] != MAGIC {
        bail!("not a heapdump capture (no HDSNAP magic)");
    }
    let major = u32::from(u16::from_le_bytes([prefix[8], prefix[9]]));
    let minor = u32::from(u16::from_le_bytes([prefix[10], prefix[11]]));
    if major > FORMAT_MAJOR {
        bail!(
            "capture format v{major} is newer than this heapdump (reads v{FORMAT_MAJOR}); upgrade heapdump"
        );
    }
    if major != FORMAT_MAJOR {
        bail!("capture is corrupt: format v{major} was never written");
    }
    let max_plain = match file_len {
        Some(l) => l.saturating_mul(MAX_INFLATE_RATIO).saturating_add(1 << 10),
        None => u64::MAX,
    };
    let mut rr = RecordReader {
        z: BufReader::with_capacity(1 << 16, flate2::bufread::GzDecoder::new(r)),
        max_record: max_plain.min(MAX_RECORD),
        buf: Vec::new(),
        count: 0,
    };

    let h = match rr.next()? {
        None => bail!("capture is truncated (no header)"),
        Some(bytes) => match pb::Record::decode(bytes) {
            Ok(pb::Record {
                kind: Some(Kind::Header(h)),
            }) => h,
            Ok(_) => bail!("capture is corrupt: its first record is not a header"),
            Err(e) => bail!("capture is corrupt: header: {e}"),
        },
    };
    if h.format_major != major {
        bail!(
            "capture is corrupt: its header says format v{} but its prefix v{major}",
            h.format_major
        );
    }
    // Least encoded bytes: a block has one varint in each of its 6 columns, an edge one, a root
    // or a stack at least a tag and a length.
    let n_blocks = claimed(h.block_count, 6, max_plain, file_len, "blocks")?;
    let n_edges = claimed(h.edge_count, 1, max_plain, file_len, "edges")?;
    let n_roots = claimed(h.root_count, 2, max_plain, file_len, "roots")?;
    let n_stacks = claimed(h.stack_count, 2, max_plain, file_len, "stacks")?;
    if h.block_count > u64::from(u32::MAX) || h.edge_count > u64::from(u32::MAX) {
        bail!(
            "capture is corrupt: {} blocks and {} edges do not fit 32-bit indices",
            h.block_count,
            h.edge_count
        );
    }

    // No record is larger than a batch of blocks with its edges (at most all of them, for a
    // block pointing to every block) or a root pointing to every block (5 bytes a target), plus
    // 64 MiB for names: a corrupt length cannot make a record (and its decoding) larger.
    rr.max_record = rr
        .max_record
        .min((64 << 20) + 64 * BATCH_BLOCKS as u64 + 11 * (h.block_count + h.edge_count));
    let mut g = Graph {
        blocks: Vec::with_capacity(n_blocks),
        edge_start: Vec::with_capacity(n_blocks + 1),
        targets: Vec::with_capacity(n_edges),
        roots: Vec::with_capacity(n_roots),
    };
    g.edge_start.push(0);
    let mut stacks: HashMap<u32, Vec<String>> = HashMap::with_capacity(n_stacks);
    let mut hints: HashMap<u32, ScriptHint> = HashMap::new();
    let mut block_bytes = 0u64;
    let footer = loop {
        let at = rr.count;
        let Some(bytes) = rr.next()? else {
            bail!(
                "capture is truncated (it ends before its footer, after {} of {} blocks)",
                g.blocks.len(),
                h.block_count
            );
        };
        let rec = pb::Record::decode(bytes)
            .map_err(|e| anyhow!("capture is corrupt: record {at}: {e}"))?;
        match rec.kind {
            None => {} // a record kind of a later minor version
            Some(Kind::Header(_)) => bail!("capture is corrupt: a second header (record {at})"),
            Some(Kind::Footer(f)) => break f,
            Some(Kind::Stack(s)) => {
                if stacks.len() as u64 >= h.stack_count {
                    bail!(
                        "capture is corrupt: more stacks than its header's {}",
                        h.stack_count
                    );
                }
                if s.id == u32::MAX {
                    bail!("capture is corrupt: a stack has the id meaning \"no stack\"");
                }
                // Kept only when it fits its stack: the runtime's frames sorted, unique and
                // inside the innermost script frame (so no longer than the stack).
                if let Some(innermost) = s.script_innermost {
                    if (innermost as usize) < s.function.len() {
                        let mut interpreter = s.interpreter;
                        interpreter.retain(|&i| i < innermost);
                        interpreter.sort_unstable();
                        interpreter.dedup();
                        let mut labels = s.script_outer_sites.into_iter();
                        let mut outer: Vec<(u32, String)> = (s.script_outer.iter())
                            .map(|&i| (i, labels.next().unwrap_or_default()))
                            .filter(|(i, _)| *i > innermost && (*i as usize) < s.function.len())
                            .collect();
                        outer.sort_by_key(|o| o.0);
                        outer.dedup_by_key(|o| o.0);
                        let hint = ScriptHint {
                            innermost,
                            interpreter,
                            label: s.script_site,
                            outer,
                        };
                        hints.insert(s.id, hint);
                    }
                }
                if stacks.insert(s.id, s.function).is_some() {
                    bail!("capture is corrupt: stack {} appears twice", s.id);
                }
            }
            Some(Kind::Blocks(b)) => add_blocks(&mut g, &b, &h, &mut block_bytes)?,
            Some(Kind::Root(r)) => {
                if g.roots.len() as u64 >= h.root_count {
                    bail!(
                        "capture is corrupt: more roots than its header's {}",
                        h.root_count
                    );
                }
                g.roots.push(root(r, h.block_count)?);
            }
        }
    };
    let got = (
        g.blocks.len() as u64,
        g.targets.len() as u64,
        g.roots.len() as u64,
        stacks.len() as u64,
        block_bytes,
    );
    let announced = (
        h.block_count,
        h.edge_count,
        h.root_count,
        h.stack_count,
        h.block_bytes,
    );
    let summed = (
        footer.block_count,
        footer.edge_count,
        footer.root_count,
        footer.stack_count,
        footer.block_bytes,
    );
    if got != announced || summed != announced || footer.record_count != rr.count - 1 {
        bail!(
            "capture is corrupt: (blocks, edges, roots, stacks, bytes) read {got:?}, announced \
             {announced:?}, summed up {summed:?}; {} records before the footer, which says {}",
            rr.count - 1,
            footer.record_count
        );
    }
    // The end of the gzip stream (its CRC-32 and length are checked when it is reached), then
    // the end of the file.
    let mut extra = [0u8; 1];
    if rr.z.read(&mut extra).map_err(stream_error)? != 0 {
        bail!("capture is corrupt: data after its footer");
    }
    let mut rest = rr.z.into_inner().into_inner();
    if !rest.fill_buf()?.is_empty() {
        bail!("capture is corrupt: data after its gzip stream");
    }
    Ok(Capture {
        format: (major, minor),
        header: CaptureHeader {
            writer: h.writer,
            pid: h.pid,
            cmdline: h.cmdline,
            executable: h.executable,
            time_unix_ns: h.time_unix_ns,
            sample_interval: h.sample_interval,
            threads: h.threads,
            modules: h.modules,
            warnings: h.warnings,
        },
        graph: g,
        stacks,
        hints,
    })
}

/// Appends a `Blocks` batch to `g`, checking it against what was read and announced.
fn add_blocks(g: &mut Graph, b: &pb::Blocks, h: &pb::Header, block_bytes: &mut u64) -> Result<()> {
    let first = g.blocks.len();
    if b.first_index != first as u64 {
        bail!(
            "capture is corrupt: a batch starts at block {} after {first} blocks",
            b.first_index
        );
    }
    let k = b.size.len();
    if [
        b.address_delta.len(),
        b.stack.len(),
        b.thread.len(),
        b.edge_count.len(),
    ] != [k; 4]
    {
        bail!("capture is corrupt: the batch at block {first} has columns of unequal lengths");
    }
    if (first + k) as u64 > h.block_count {
        bail!(
            "capture is corrupt: more blocks than its header's {}",
            h.block_count
        );
    }
    let edges: u64 = b.edge_count.iter().map(|&c| u64::from(c)).sum();
    if edges != b.target_delta.len() as u64 {
        bail!(
            "capture is corrupt: the batch at block {first} counts {edges} edges but holds {}",
            b.target_delta.len()
        );
    }
    if g.targets.len() as u64 + edges > h.edge_count {
        bail!(
            "capture is corrupt: more edges than its header's {}",
            h.edge_count
        );
    }
    let n = h.block_count as i64;
    let mut deltas = b.target_delta.iter();
    for j in 0..k {
        let index = first + j;
        let address = if j == 0 {
            Some(b.address_delta[0])
        } else {
            g.blocks[index - 1].address.checked_add(b.address_delta[j])
        };
        match (address, g.blocks.last()) {
            (Some(a), Some(last)) if a <= last.address => {
                bail!(
                    "capture is corrupt: block {index} is not above block {}",
                    index - 1
                )
            }
            (None, _) => bail!("capture is corrupt: the address of block {index} overflows"),
            _ => {}
        }
        let size = b.size[j];
        *block_bytes = block_bytes.saturating_add(size);
        g.blocks.push(Block {
            address: address.unwrap_or(0),
            size,
            stack: b.stack[j],
            thread: b.thread[j],
        });
        let mut p = index as i64;
        for e in 0..b.edge_count[j] {
            let d = *deltas.next().unwrap_or(&0);
            let t = p.checked_add(d).unwrap_or(-1);
            if (e > 0 && d <= 0) || t < 0 || t >= n {
                bail!("capture is corrupt: block {index} has an edge to {t}, not a block after its previous edge");
            }
            g.targets.push(t as u32);
            p = t;
        }
        g.edge_start.push(g.targets.len() as u32);
    }
    Ok(())
}

/// A root record as a [`Root`], its targets checked against the `n` blocks announced.
fn root(r: pb::Root, n: u64) -> Result<Root> {
    let kind = match pb::RootKind::try_from(r.kind) {
        Ok(pb::RootKind::Global) => RootKind::Global,
        Ok(pb::RootKind::Stack) => RootKind::Stack,
        Ok(pb::RootKind::Mapping) => RootKind::Mapping,
        Ok(pb::RootKind::Registers) => RootKind::Registers,
        Ok(pb::RootKind::Unspecified) => {
            bail!("capture is corrupt: root {:?} has no kind", r.name)
        }
        // A kind added by a later minor version: read as the generic one.
        Err(_) => RootKind::Mapping,
    };
    let mut targets = Vec::with_capacity(r.target_delta.len());
    let mut p = 0u64;
    for (i, &d) in r.target_delta.iter().enumerate() {
        let t = p + u64::from(d);
        if (i > 0 && d == 0) || t >= n {
            bail!(
                "capture is corrupt: root {:?} has a target {t}, not a block after its previous target",
                r.name
            );
        }
        targets.push(t as u32);
        p = t;
    }
    // A capture may come from anyone: its names reach the terminal (see `regions::shown`).
    let name = match crate::regions::shown(&r.name) {
        std::borrow::Cow::Owned(s) => s,
        std::borrow::Cow::Borrowed(_) => r.name,
    };
    Ok(Root {
        kind,
        name,
        targets,
    })
}

#[cfg(test)]
mod tests {
    use super::super::dominators::tests::{graph, root as mk_root};
    use super::*;

    fn header() -> CaptureHeader {
        CaptureHeader {
            writer: "heapdump test".into(),
            pid: 4242,
            cmdline: vec!["./owners".into(), "--n=3".into(), "ünï".into()],
            executable: "/usr/bin/owners".into(),
            time_unix_ns: 1_790_000_000_123_456_789,
            sample_interval: 0,
            threads: vec![
                pb::Thread {
                    tid: 4242,
                    name: "owners".into(),
                },
                pb::Thread {
                    tid: 4243,
                    name: "worker".into(),
                },
            ],
            modules: vec![pb::Module {
                path: "/usr/lib/libc.so.6".into(),
                base: 0x7f00_0000_0000,
                build_id: vec![0xde, 0xad, 0xbe, 0xef],
            }],
            warnings: vec!["3 blocks freed meanwhile could not be read".into()],
        }
    }

    fn stacks_of(g: &Graph) -> HashMap<u32, Vec<String>> {
        let mut s: HashMap<u32, Vec<String>> = g
            .blocks
            .iter()
            .filter(|b| b.stack != u32::MAX)
            .map(|b| (b.stack, vec![format!("site{}", b.stack), "main".into()]))
            .collect();
        s.insert(77, vec![]); // a stack no block uses, with no frames
        s
    }

    /// Writes, checking the stats, and returns the bytes.
    fn encode(
        h: &CaptureHeader,
        g: &Graph,
        s: &HashMap<u32, Vec<String>>,
    ) -> (Vec<u8>, WriteStats) {
        let mut out = Vec::new();
        let stats = write_counted(&mut out, h, g, s, &HashMap::new()).unwrap();
        (out, stats)
    }

    fn decode(bytes: &[u8]) -> Result<Capture> {
        read_from(bytes, Some(bytes.len() as u64))
    }

    /// A small graph with every feature: a self edge, a cycle, an edge backwards, a block with
    /// no stack, huge addresses and sizes, roots of each kind (one with no targets).
    fn small() -> Graph {
        let mut g = graph(
            &[16, 0, 1 << 40, 24, 8],
            &[&[1, 0, 4], &[], &[3], &[2, 3], &[0]],
            vec![
                mk_root(RootKind::Global, "g_table (owners)", &[0, 2]),
                mk_root(RootKind::Stack, "stack of worker (4243)", &[4]),
                mk_root(RootKind::Mapping, "[anon 0x7f0000]", &[]),
                mk_root(RootKind::Registers, "registers of worker (4243)", &[1, 3]),
            ],
        );
        g.blocks[1].stack = u32::MAX;
        g.blocks[3].thread = 4243;
        g.blocks[4].address = u64::MAX - 7;
        g
    }

    fn assert_same(c: &Capture, h: &CaptureHeader, g: &Graph, s: &HashMap<u32, Vec<String>>) {
        assert_eq!(c.format.0, 1);
        assert_eq!(&c.header, h);
        assert_eq!(c.graph.blocks, g.blocks);
        assert_eq!(c.graph.edge_start, g.edge_start);
        assert_eq!(c.graph.targets, g.targets);
        assert_eq!(c.graph.roots, g.roots);
        assert_eq!(&c.stacks, s);
    }

    #[test]
    fn hand_made_graphs_round_trip_field_by_field() {
        let h = header();
        let g = small();
        let s = stacks_of(&g);
        let (bytes, stats) = encode(&h, &g, &s);
        assert_eq!(&bytes[..12], b"HDSNAP\0\n\x01\x00\x01\x00");
        assert_eq!(decode(&bytes).unwrap().format, (1, FORMAT_MINOR));
        // Header, 5 stacks (4 used + 1 unused), 1 batch, 4 roots, footer.
        assert_eq!(
            stats,
            WriteStats {
                records: 12,
                block_records: 1,
                ..stats
            }
        );
        let c = decode(&bytes).unwrap();
        assert_same(&c, &h, &g, &s);
        assert_eq!(c.graph.edges(0), &[0, 1, 4]);
        assert_eq!(c.graph.blocks[4].address, u64::MAX - 7);

        // The empty graph, with an empty header.
        let (h0, g0, s0) = (
            CaptureHeader::default(),
            Graph::from_lists(vec![], &[], vec![]),
            HashMap::new(),
        );
        let (bytes, stats) = encode(&h0, &g0, &s0);
        assert_eq!((stats.records, stats.block_records), (2, 0));
        assert_same(&decode(&bytes).unwrap(), &h0, &g0, &s0);

        // Through a file, and the magic check.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.hdsnap");
        let mut f = std::fs::File::create(&p).unwrap();
        write(&mut f, &h, &g, &s, &HashMap::new()).unwrap();
        drop(f);
        assert!(is_capture(&p));
        assert_same(&read(&p).unwrap(), &h, &g, &s);
        std::fs::write(dir.path().join("short"), b"HDSNAP").unwrap();
        assert!(!is_capture(&dir.path().join("short")));
        assert!(!is_capture(&dir.path().join("missing")));
        std::fs::write(dir.path().join("gz"), &bytes[12..]).unwrap();
        assert!(!is_capture(&dir.path().join("gz")));

        // The script frames' positions come back as written; indices at or past the innermost
        // script frame are dropped, the rest sorted and unique; a hint past its stack is not
        // kept.
        let id = *s.keys().find(|&&k| s[&k].len() == 2).unwrap();
        let hint = ScriptHint {
            innermost: 1,
            interpreter: vec![0, 1, 0, 5],
            label: "main (app.py)".into(),
            outer: vec![(7, "far".into()), (1, "in".into())],
        };
        let past = ScriptHint {
            innermost: 0,
            interpreter: vec![],
            label: String::new(),
            outer: vec![],
        };
        let mut out = Vec::new();
        write(
            &mut out,
            &h,
            &g,
            &s,
            &HashMap::from([(id, hint), (77, past)]),
        )
        .unwrap();
        let back = decode(&out).unwrap();
        assert_same(&back, &h, &g, &s);
        let want = ScriptHint {
            innermost: 1,
            interpreter: vec![0],
            label: "main (app.py)".into(),
            outer: vec![],
        };
        assert_eq!(back.hints, HashMap::from([(id, want)]));
        assert!(read(&p).unwrap().hints.is_empty());
    }

    #[test]
    fn the_writer_refuses_graphs_a_reader_would_refuse() {
        let (h, s) = (header(), HashMap::new());
        let mut g = small();
        g.blocks.swap(0, 1);
        let e = write(&mut Vec::new(), &h, &g, &s, &HashMap::new()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "blocks 0 and 1 are not in increasing address order"
        );
        let mut g = small();
        g.targets.swap(0, 1);
        let e = write(&mut Vec::new(), &h, &g, &s, &HashMap::new()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "edges of block 0 are not sorted, unique block indices"
        );
        let mut g = small();
        g.roots[0].targets = vec![5];
        let e = write(&mut Vec::new(), &h, &g, &s, &HashMap::new()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "targets of root \"g_table (owners)\" are not sorted, unique block indices"
        );
        let s = HashMap::from([(u32::MAX, vec![])]);
        assert!(write(&mut Vec::new(), &h, &small(), &s, &HashMap::new()).is_err());
    }

    /// xorshift64*: reproducible pseudo-random numbers.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// `n` blocks of 16–128 bytes 16–160 bytes apart from 0x5555_0000_0000, 1000 stacks, 8
    /// threads, 0–4 random edges each (2 on average), 100 roots of 0–9 targets.
    fn random(n: usize, seed: u64) -> Graph {
        let mut r = Rng(seed);
        let mut a = 0x5555_0000_0000u64;
        let blocks: Vec<Block> = (0..n)
            .map(|_| {
                let size = 16 + r.below(113);
                let b = Block {
                    address: a,
                    size,
                    stack: r.below(1000) as u32,
                    thread: 100 + r.below(8) as u32,
                };
                a += size + r.below(33);
                b
            })
            .collect();
        let mut edge_start = Vec::with_capacity(n + 1);
        let mut targets = Vec::with_capacity(2 * n);
        edge_start.push(0);
        for _ in 0..n {
            let k = r.below(5) as usize;
            let at = targets.len();
            for _ in 0..k {
                targets.push(r.below(n as u64) as u32);
            }
            targets[at..].sort_unstable();
            let mut w = at;
            for i in at..targets.len() {
                if w == at || targets[i] != targets[w - 1] {
                    targets[w] = targets[i];
                    w += 1;
                }
            }
            targets.truncate(w);
            edge_start.push(targets.len() as u32);
        }
        let roots = (0..100)
            .map(|i| {
                let mut t: Vec<u32> = (0..r.below(10)).map(|_| r.below(n as u64) as u32).collect();
                t.sort_unstable();
                t.dedup();
                Root {
                    kind: [RootKind::Global, RootKind::Stack, RootKind::Mapping][i % 3],
                    name: format!("root {i}"),
                    targets: t,
                }
            })
            .collect();
        Graph {
            blocks,
            edge_start,
            targets,
            roots,
        }
    }

    #[test]
    fn a_million_blocks_round_trip_written_batch_by_batch() {
        let g = random(1_000_000, 7);
        let s: HashMap<u32, Vec<String>> = (0..1000)
            .map(|i| {
                (
                    i,
                    vec![
                        format!("alloc_{i}"),
                        format!("caller_{}", i % 37),
                        "main".into(),
                    ],
                )
            })
            .collect();
        let h = header();
        let t = std::time::Instant::now();
        let (bytes, stats) = encode(&h, &g, &s);
        let wrote = t.elapsed();
        // Header, 1000 stacks, ⌈1,000,000 / 65,536⌉ = 16 batches, 100 roots, footer.
        assert_eq!(
            (stats.records, stats.block_records),
            (1 + 1000 + 16 + 100 + 1, 16)
        );
        // The largest record is one batch: bounded by the batch size, not the graph's.
        assert!(stats.max_record < 2 << 20, "{}", stats.max_record);
        let t = std::time::Instant::now();
        let c = decode(&bytes).unwrap();
        eprintln!(
            "1 M blocks, {} edges: {} bytes ({:.2} per block; {:.2} before gzip), largest record {} bytes, write {:?}, read {:?}",
            g.targets.len(),
            bytes.len(),
            bytes.len() as f64 / 1e6,
            stats.plain as f64 / 1e6,
            stats.max_record,
            wrote,
            t.elapsed()
        );
        assert_same(&c, &h, &g, &s);
    }

    #[test]
    fn batches_close_at_65536_blocks_or_2_pow_20_edges() {
        // 200,000 blocks; blocks 0..6 point to every block: 6 × 200,000 edges.
        let n = 200_000u32;
        let all: Vec<u32> = (0..n).collect();
        let mut edges = vec![Vec::new(); n as usize];
        for e in edges.iter_mut().take(6) {
            e.clone_from(&all);
        }
        let sizes = vec![8u64; n as usize];
        let blocks = super::super::dominators::tests::blocks(&sizes);
        let g = Graph::from_lists(blocks, &edges, vec![]);
        let (bytes, stats) = encode(&CaptureHeader::default(), &g, &HashMap::new());
        // Batch 1: blocks 0..6 (1.2 M edges ≥ 2^20 after the 6th); then 199,994 blocks in
        // batches of 65,536: 4 more.
        assert_eq!((stats.records, stats.block_records), (1 + 5 + 1, 5));
        let batches: Vec<(u64, usize, usize)> = records_of(&bytes)
            .iter()
            .filter_map(|r| match pb::Record::decode(&r[..]).unwrap().kind {
                Some(Kind::Blocks(b)) => Some((b.first_index, b.size.len(), b.target_delta.len())),
                _ => None,
            })
            .collect();
        assert_eq!(
            batches,
            vec![
                (0, 6, 1_200_000),
                (6, 65_536, 0),
                (65_542, 65_536, 0),
                (131_078, 65_536, 0),
                (196_614, 3_386, 0)
            ]
        );
        let c = decode(&bytes).unwrap();
        assert_eq!(c.graph, g);
    }

    #[test]
    fn truncated_files_are_errors_at_every_offset() {
        let g = small();
        let (bytes, _) = encode(&header(), &g, &stacks_of(&g));
        for cut in 0..bytes.len() {
            let e = decode(&bytes[..cut]).unwrap_err().to_string();
            assert!(
                e.starts_with("capture is truncated")
                    || e.starts_with("capture is corrupt")
                    || e.starts_with("not a heapdump capture"),
                "cut at {cut}: {e}"
            );
            if cut < 12 {
                assert!(e.starts_with("not a heapdump capture"), "{e}");
            }
            // Without the size hint too.
            assert!(read_from(&bytes[..cut], None).is_err());
        }
        // And trailing bytes.
        let mut more = bytes.clone();
        more.push(0);
        assert_eq!(
            decode(&more).unwrap_err().to_string(),
            "capture is corrupt: data after its gzip stream"
        );
    }

    #[test]
    fn flipped_bytes_are_errors_or_harmless() {
        let (h, g) = (header(), small());
        let s = stacks_of(&g);
        let (bytes, _) = encode(&h, &g, &s);
        let mut harmless = Vec::new();
        for pos in 0..bytes.len() {
            for mask in [0x01u8, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[pos] ^= mask;
                if let Ok(c) = decode(&b) {
                    // Only bytes no checksum covers: the minor version (read as a later
                    // minor) and the gzip header's MTIME, XFL and OS fields.
                    let mut same = c.clone();
                    same.format.1 = 0;
                    assert_same(&same, &h, &g, &s);
                    harmless.push(pos);
                }
            }
        }
        harmless.dedup();
        // 10–11: minor version; 12 + 3: gzip FLG's FTEXT bit (a hint); 12 + 4..12 + 10: gzip
        // MTIME (4), XFL, OS; the last byte of the deflate data (before the 8-byte trailer),
        // whose high bits pad the final block.
        let last = bytes.len() - 9;
        assert_eq!(harmless, vec![10, 11, 15, 16, 17, 18, 19, 20, 21, last]);

        // Random flips of 1–4 bytes in a larger capture: never a panic, never a wrong graph.
        let g = random(3000, 11);
        let s: HashMap<u32, Vec<String>> = (0..1000).map(|i| (i, vec![format!("f{i}")])).collect();
        let (bytes, _) = encode(&h, &g, &s);
        let mut r = Rng(3);
        let mut errors = 0;
        for _ in 0..3000 {
            let mut b = bytes.clone();
            for _ in 0..1 + r.below(4) {
                let pos = 22 + r.below(bytes.len() as u64 - 22) as usize;
                b[pos] ^= 1 + r.below(255) as u8;
            }
            match decode(&b) {
                Ok(c) => assert_same(&c, &h, &g, &s),
                Err(_) => errors += 1,
            }
        }
        assert_eq!(errors, 3000);
    }

    /// A file of the given prefix version holding the given records (any bytes: encoded
    /// `Record`s or not).
    fn raw(major: u16, minor: u16, records: &[Vec<u8>]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&major.to_le_bytes());
        out.extend_from_slice(&minor.to_le_bytes());
        let mut gz = GzEncoder::new(out, Compression::fast());
        for r in records {
            let mut framed = Vec::new();
            prost::encoding::encode_varint(r.len() as u64, &mut framed);
            framed.extend_from_slice(r);
            gz.write_all(&framed).unwrap();
        }
        gz.finish().unwrap()
    }

    fn rec(kind: Kind) -> Vec<u8> {
        pb::Record { kind: Some(kind) }.encode_to_vec()
    }

    /// The records of a valid capture of `small()`.
    fn records() -> Vec<Vec<u8>> {
        let g = small();
        let (bytes, _) = encode(&header(), &g, &stacks_of(&g));
        records_of(&bytes)
    }

    /// The records of a capture, undecoded.
    fn records_of(bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&bytes[12..])
            .read_to_end(&mut plain)
            .unwrap();
        let mut out = Vec::new();
        let mut p = &plain[..];
        while !p.is_empty() {
            let len = prost::encoding::decode_varint(&mut p).unwrap() as usize;
            out.push(p[..len].to_vec());
            p = &p[len..];
        }
        out
    }

    fn header_of(records: &[Vec<u8>]) -> pb::Header {
        match pb::Record::decode(&records[0][..]).unwrap().kind {
            Some(Kind::Header(h)) => h,
            _ => panic!("no header"),
        }
    }

    #[test]
    fn a_newer_major_version_is_refused_with_the_upgrade_message() {
        let mut bytes = raw(999, 0, &records());
        let e = decode(&bytes).unwrap_err();
        assert_eq!(
            e.to_string(),
            "capture format v999 is newer than this heapdump (reads v1); upgrade heapdump"
        );
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("new.hdsnap");
        std::fs::write(&p, &bytes).unwrap();
        assert!(is_capture(&p));
        assert_eq!(
            format!("{:#}", read(&p).unwrap_err()),
            format!(
                "{}: capture format v999 is newer than this heapdump (reads v1); upgrade heapdump",
                p.display()
            )
        );
        bytes[8] = 2;
        bytes[9] = 0;
        assert_eq!(
            decode(&bytes).unwrap_err().to_string(),
            "capture format v2 is newer than this heapdump (reads v1); upgrade heapdump"
        );
    }

    #[test]
    fn a_later_minor_version_is_read_skipping_what_it_adds() {
        let mut r = records();
        // An unknown header field (40, varint 5), an unknown record kind (12) after the
        // header, an unknown field (9, varint 1) in the Blocks record.
        let wrap = |tag: u8, mut body: Vec<u8>, extra: &[u8]| {
            body.extend_from_slice(extra);
            let mut out = vec![tag];
            prost::encoding::encode_varint(body.len() as u64, &mut out);
            out.extend_from_slice(&body);
            out
        };
        r[0] = wrap(0x0a, header_of(&r).encode_to_vec(), &[0xc0, 0x02, 5]);
        r.insert(1, vec![0x62, 2, 0x08, 1]);
        let blocks = r.iter().position(|x| x[0] == 0x1a).unwrap();
        let b = match pb::Record::decode(&r[blocks][..]).unwrap().kind {
            Some(Kind::Blocks(b)) => b,
            _ => panic!("no blocks"),
        };
        r[blocks] = wrap(0x1a, b.encode_to_vec(), &[0x48, 1]);
        let mut footer = match pb::Record::decode(&r.last().unwrap()[..]).unwrap().kind {
            Some(Kind::Footer(f)) => f,
            _ => panic!(),
        };
        footer.record_count += 1;
        *r.last_mut().unwrap() = rec(Kind::Footer(footer));
        let c = decode(&raw(1, 7, &r)).unwrap();
        assert_eq!(c.format, (1, 7));
        let g = small();
        assert_eq!(c.graph, g);
        assert_eq!(c.header, header());
    }

    #[test]
    fn inconsistent_records_are_refused() {
        let ok = records();
        assert!(decode(&raw(1, 0, &ok)).is_ok());
        let err = |r: &[Vec<u8>]| decode(&raw(1, 0, r)).unwrap_err().to_string();
        let with_header = |f: &dyn Fn(&mut pb::Header)| {
            let mut r = ok.clone();
            let mut h = header_of(&r);
            f(&mut h);
            r[0] = rec(Kind::Header(h));
            r
        };
        // Counts no file of this size can hold: refused before any allocation.
        assert_eq!(
            err(&with_header(&|h| h.block_count = u64::MAX / 2)),
            format!(
                "capture is corrupt: its header claims {} blocks, more than the file can hold",
                u64::MAX / 2
            )
        );
        assert!(
            err(&with_header(&|h| h.edge_count = 1 << 40)).contains("claims 1099511627776 edges")
        );
        assert_eq!(
            err(&with_header(&|h| h.format_major = 2)),
            "capture is corrupt: its header says format v2 but its prefix v1"
        );
        // Fewer blocks announced than written.
        assert_eq!(
            err(&with_header(&|h| h.block_count = 4)),
            "capture is corrupt: more blocks than its header's 4"
        );
        assert_eq!(
            err(&with_header(&|h| h.stack_count = 4)),
            "capture is corrupt: more stacks than its header's 4"
        );
        // A batch with a decreasing address, an edge out of order, a wrong first index.
        let batch = ok.iter().position(|x| x[0] == 0x1a).unwrap();
        let mut b = match pb::Record::decode(&ok[batch][..]).unwrap().kind {
            Some(Kind::Blocks(b)) => b,
            _ => panic!(),
        };
        let with_batch = |b: &pb::Blocks| {
            let mut r = ok.clone();
            r[batch] = rec(Kind::Blocks(b.clone()));
            r
        };
        let orig = b.clone();
        b.address_delta[2] = 0;
        assert_eq!(
            err(&with_batch(&b)),
            "capture is corrupt: block 2 is not above block 1"
        );
        b = orig.clone();
        b.address_delta[4] = u64::MAX;
        assert_eq!(
            err(&with_batch(&b)),
            "capture is corrupt: the address of block 4 overflows"
        );
        b = orig.clone();
        b.target_delta[1] = 0; // a duplicate edge
        assert_eq!(
            err(&with_batch(&b)),
            "capture is corrupt: block 0 has an edge to 0, not a block after its previous edge"
        );
        b = orig.clone();
        b.first_index = 1;
        assert_eq!(
            err(&with_batch(&b)),
            "capture is corrupt: a batch starts at block 1 after 0 blocks"
        );
        b = orig.clone();
        b.edge_count[0] = 2;
        assert_eq!(
            err(&with_batch(&b)),
            "capture is corrupt: the batch at block 0 counts 6 edges but holds 7"
        );
        b = orig.clone();
        b.thread.pop();
        assert_eq!(
            err(&with_batch(&b)),
            "capture is corrupt: the batch at block 0 has columns of unequal lengths"
        );
        // Records missing, repeated, or not records at all.
        let mut r = ok.clone();
        r.pop();
        assert_eq!(
            err(&r),
            "capture is truncated (it ends before its footer, after 5 of 5 blocks)"
        );
        let mut r = ok.clone();
        r.insert(1, ok[0].clone());
        assert_eq!(err(&r), "capture is corrupt: a second header (record 1)");
        let mut r = ok.clone();
        r.remove(batch);
        assert_eq!(
            err(&r),
            "capture is corrupt: (blocks, edges, roots, stacks, bytes) read (0, 0, 4, 5, 0), \
             announced (5, 7, 4, 5, 1099511627824), summed up (5, 7, 4, 5, 1099511627824); \
             10 records before the footer, which says 11"
        );
        let mut r = ok.clone();
        let mut footer = match pb::Record::decode(&ok[ok.len() - 1][..]).unwrap().kind {
            Some(Kind::Footer(f)) => f,
            _ => panic!("no footer"),
        };
        footer.record_count -= 1;
        *r.last_mut().unwrap() = rec(Kind::Footer(footer));
        assert_eq!(
            err(&r),
            "capture is corrupt: (blocks, edges, roots, stacks, bytes) read (5, 7, 4, 5, \
             1099511627824), announced (5, 7, 4, 5, 1099511627824), summed up (5, 7, 4, 5, \
             1099511627824); 11 records before the footer, which says 10"
        );
        let mut r = ok.clone();
        r.push(ok[1].clone());
        assert_eq!(err(&r), "capture is corrupt: data after its footer");
        assert!(err(&[vec![0xff; 3]]).starts_with("capture is corrupt: header: "));
        assert_eq!(
            err(&[ok[1].clone()]),
            "capture is corrupt: its first record is not a header"
        );
        assert_eq!(err(&[]), "capture is truncated (no header)");
        // A complete gzip stream whose content ends inside a record.
        let mut gz = GzEncoder::new(raw(1, 0, &[])[..12].to_vec(), Compression::fast());
        gz.write_all(&[10, 0x0a, 1, 0x08]).unwrap();
        assert_eq!(
            decode(&gz.finish().unwrap()).unwrap_err().to_string(),
            "capture is truncated (record 0 has 3 of its 10 bytes)"
        );
        // A length prefix claiming more than the file can hold.
        let mut plain = vec![0xff, 0xff, 0xff, 0xff, 0x0f];
        plain.extend_from_slice(&[0; 8]);
        let mut gz = GzEncoder::new(raw(1, 0, &[])[..12].to_vec(), Compression::fast());
        gz.write_all(&plain).unwrap();
        assert_eq!(
            decode(&gz.finish().unwrap()).unwrap_err().to_string(),
            "capture is corrupt: record 0 claims 4294967295 bytes, more than the file can hold"
        );
        // A root of no kind, of an unknown (later) kind, with a target out of range.
        let root_at = ok.iter().position(|x| x[0] == 0x22).unwrap();
        let with_root = |kind: i32, targets: Vec<u32>| {
            let mut r = ok.clone();
            r[root_at] = rec(Kind::Root(pb::Root {
                kind,
                name: "r".into(),
                target_delta: targets,
            }));
            r
        };
        assert_eq!(
            err(&with_root(0, vec![])),
            "capture is corrupt: root \"r\" has no kind"
        );
        assert_eq!(
            err(&with_root(1, vec![1, 4])),
            "capture is corrupt: root \"r\" has a target 5, not a block after its previous target"
        );
        let c = decode(&raw(1, 0, &with_root(9, vec![1, 3]))).unwrap();
        assert_eq!(c.graph.roots[0], mk_root(RootKind::Mapping, "r", &[1, 4]));
    }

    /// The golden v1 capture: a small graph with every feature, written by [`write_golden_v1`].
    fn golden() -> (CaptureHeader, Graph, HashMap<u32, Vec<String>>) {
        let g = small();
        let s = stacks_of(&g);
        let mut h = header();
        h.writer = "heapdump golden v1.0".into();
        (h, g, s)
    }

    const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/v1.hdsnap");

    /// Writes `tests/data/v1.hdsnap` (run once, by hand: `cargo test ... write_golden_v1 --
    /// --ignored`; the file is committed and must stay readable by every later version).
    #[test]
    #[ignore]
    fn write_golden_v1() {
        let (h, g, s) = golden();
        std::fs::create_dir_all(Path::new(GOLDEN).parent().unwrap()).unwrap();
        let mut f = std::fs::File::create(GOLDEN).unwrap();
        write(&mut f, &h, &g, &s, &HashMap::new()).unwrap();
    }

    #[test]
    fn the_golden_v1_capture_is_read() {
        let (h, g, s) = golden();
        let c = read(Path::new(GOLDEN)).unwrap();
        // Written by minor version 0, before the script frames' positions.
        assert_eq!(c.format, (1, 0));
        assert_same(&c, &h, &g, &s);
        assert!(is_capture(Path::new(GOLDEN)));
    }
}
