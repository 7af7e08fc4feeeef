//! Names of generated code — JIT compilers (V8 with `--perf-basic-prof` or `--perf-prof`,
//! Java's perf-map-agent, .NET's `DOTNET_PerfMapEnabled`, LuaJIT) and CPython's perf
//! trampolines (`-X perf`, `-X perf_jit`) — from the files such programs publish for `perf`,
//! and executable file mappings the module table does not list (V8's remapped embedded
//! builtins), from `/proc/PID/maps`.
//!
//! Sources (Linux `tools/perf/Documentation/jit-interface.txt` and
//! `jitdump-specification.txt`):
//! - the perf map `/tmp/perf-PID.map`: text, one `START SIZE name` line per code range, START
//!   and SIZE hexadecimal; later lines win where ranges overlap (code moved or freed, its
//!   addresses reused);
//! - jitdump `jit-PID.dump` (in `/tmp`, or wherever the process mapped it, which it does so
//!   that `perf` finds it): a binary header, then records; `JIT_CODE_LOAD` names a range,
//!   `JIT_CODE_MOVE` moves a loaded one. A file cut short (CPython buffers it until exit) is
//!   read up to its last whole record.
//!
//! The collector may run as root and read files a less privileged target wrote: a file is
//! read only when it is a regular file (opened without following a symbolic link) with one
//! link, owned by the target's user or root, not writable by others, and not older than the
//! target (a file left by an earlier process with the same pid is not it).

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::symbolize::Frame;
use vmo_layout::v1::SegmentV1;
use vmo_layout::Module;

/// Largest perf map or jitdump read (a long-running node's perf map grows without bound).
const MAX_FILE_BYTES: u64 = 1 << 30;

/// jitdump's magic number as read in the file's byte order when it matches ours ("JiTD").
const JITDUMP_MAGIC: u32 = 0x4A69_5444;
/// Size of the jitdump file header (version 1 of the format).
const JITDUMP_HEADER: usize = 40;
const JIT_CODE_LOAD: u32 = 0;
const JIT_CODE_MOVE: u32 = 1;
const JIT_CODE_CLOSE: u32 = 3;

/// The process whose files are read.
#[derive(Debug, Clone)]
pub struct Target {
    /// Its pid, as in the files' names.
    pub pid: u32,
    /// The user that owns its files (the owner of its region file); files owned by this user
    /// or by root are trusted.
    pub uid: u32,
    /// When it started (or created its region, a little later), ns since the Unix epoch: a
    /// file last modified before this is another process's.
    pub started_realtime_ns: u64,
    /// Whether it is running (then `/proc/PID` is read too).
    pub alive: bool,
}

/// Code ranges and their names, from a process's perf map and jitdump files.
#[derive(Debug, Default, Clone)]
pub struct JitSymbols {
    /// Non-overlapping ranges: start → (end, index into `names`).
    ranges: BTreeMap<u64, (u64, u32)>,
    names: Vec<String>,
    /// The files read, for the profile's comments.
    pub sources: Vec<String>,
}

impl JitSymbols {
    /// Number of ranges known.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether any range's name starts with `prefix` (a cheap test before a lookup per frame).
    pub fn any_name_starts_with(&self, prefix: &str) -> bool {
        self.names.iter().any(|n| n.starts_with(prefix))
    }

    /// The raw name of the range holding `addr`.
    pub fn name(&self, addr: u64) -> Option<&str> {
        let (_, &(end, name)) = self.ranges.range(..=addr).next_back()?;
        (addr < end).then(|| self.names[name as usize].as_str())
    }

    /// The frame of the code at `addr` (see [`frame_of`]).
    pub fn lookup(&self, addr: u64) -> Option<Frame> {
        self.name(addr).map(frame_of)
    }

    /// Names `[start, start + size)` `name`, replacing what overlapped it.
    fn insert(&mut self, start: u64, size: u64, name: u32) {
        let Some(end) = start.checked_add(size).filter(|_| size > 0) else {
            return;
        };
        // A range starting before `start` and running into the new one keeps its head (and its
        // tail, if it runs past `end`).
        if let Some((&s, &(e, n))) = self.ranges.range(..start).next_back() {
            if e > start {
                self.ranges.insert(s, (start, n));
                if e > end {
                    self.ranges.insert(end, (e, n));
                }
            }
        }
        // Ranges starting inside the new one go, except for a tail past `end`.
        let inside: Vec<u64> = self.ranges.range(start..end).map(|(&s, _)| s).collect();
        for s in inside {
            if let Some((e, n)) = self.ranges.remove(&s) {
                if e > end {
                    self.ranges.insert(end, (e, n));
                }
            }
        }
        self.ranges.insert(start, (end, name));
    }

    fn intern(&mut self, name: &str) -> u32 {
        self.names.push(name.to_owned());
        (self.names.len() - 1) as u32
    }

    /// Reads a perf map's text: `START SIZE name` lines; malformed lines are skipped. Returns
    /// the number of ranges read.
    pub fn add_perf_map(&mut self, text: &str) -> usize {
        let mut n = 0;
        for line in text.lines() {
            let mut parts = line.splitn(3, ' ');
            let (Some(start), Some(size), Some(name)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
            let (Some(start), Some(size)) = (hex(start), hex(size)) else {
                continue;
            };
            let name = name.trim_end();
            if name.is_empty() {
                continue;
            }
            let id = self.intern(name);
            self.insert(start, size, id);
            n += 1;
        }
        n
    }

    /// Reads a jitdump file's bytes (of process `pid`): its `JIT_CODE_LOAD` and
    /// `JIT_CODE_MOVE` records, up to the last whole record. Returns the number of ranges
    /// read.
    ///
    /// Errors: not a jitdump file, written in the other byte order, or of another process.
    pub fn add_jitdump(&mut self, data: &[u8], pid: u32) -> Result<usize, String> {
        let u32_at = |o: usize| -> Option<u32> {
            Some(u32::from_ne_bytes(data.get(o..o + 4)?.try_into().ok()?))
        };
        let u64_at = |o: usize| -> Option<u64> {
            Some(u64::from_ne_bytes(data.get(o..o + 8)?.try_into().ok()?))
        };
        match u32_at(0) {
            Some(JITDUMP_MAGIC) => {}
            Some(m) if m.swap_bytes() == JITDUMP_MAGIC => {
                return Err("jitdump of the other byte order".into())
            }
            _ => return Err("not a jitdump file (bad magic)".into()),
        }
        let header = u32_at(8).ok_or("jitdump header cut short")? as usize;
        let file_pid = u32_at(20).ok_or("jitdump header cut short")?;
        if file_pid != pid {
            return Err(format!("jitdump of pid {file_pid}, not {pid}"));
        }
        let mut by_index: std::collections::HashMap<u64, u32> = Default::default();
        let mut at = header.max(JITDUMP_HEADER);
        let mut n = 0;
        while let (Some(id), Some(size)) = (u32_at(at), u32_at(at + 4)) {
            let size = size as usize;
            let Some(end) = at
                .checked_add(size)
                .filter(|&e| size >= 16 && e <= data.len())
            else {
                break;
            };
            let body = at + 16;
            match id {
                JIT_CODE_LOAD => {
                    // pid, tid, vma, code_addr, code_size, code_index, name.
                    let (Some(addr), Some(len), Some(index)) =
                        (u64_at(body + 16), u64_at(body + 24), u64_at(body + 32))
                    else {
                        break;
                    };
                    let name_at = body + 40;
                    if name_at > end {
                        break;
                    }
                    let raw = &data[name_at..end];
                    let raw = &raw[..raw.iter().position(|&c| c == 0).unwrap_or(raw.len())];
                    let name = String::from_utf8_lossy(raw);
                    if !name.is_empty() {
                        let idx = self.intern(&name);
                        by_index.insert(index, idx);
                        self.insert(addr, len, idx);
                        n += 1;
                    }
                }
                JIT_CODE_MOVE => {
                    // pid, tid, vma, old_code_addr, new_code_addr, code_size, code_index.
                    let (Some(new), Some(len), Some(index)) =
                        (u64_at(body + 24), u64_at(body + 32), u64_at(body + 40))
                    else {
                        break;
                    };
                    if let Some(&idx) = by_index.get(&index) {
                        self.insert(new, len, idx);
                        n += 1;
                    }
                }
                JIT_CODE_CLOSE => break,
                _ => {}
            }
            at = end;
        }
        Ok(n)
    }
}

/// The frame a JIT's name for a code range stands for:
/// - CPython's `py::QUALNAME:FILENAME` → function QUALNAME in file FILENAME;
/// - V8's `JS:*name file:line:column` (tiers `~` interpreted, `^` Sparkplug, `+` Maglev, `*`
///   TurboFan; also `LazyCompile:`, `Function:`, `Script:`, `Eval:`) → function `name`
///   (`(anonymous)` when empty), file and line; the tier is left out so that a function is one
///   function whichever tier ran it;
/// - anything else (V8's `Builtin:…`, Java, .NET, LuaJIT) → the name as written, no file.
pub fn frame_of(name: &str) -> Frame {
    if let Some(rest) = name.strip_prefix("py::") {
        if let Some((qualname, file)) = rest.split_once(':') {
            return Frame {
                function: qualname.to_owned(),
                file: file.to_owned(),
                line: 0,
            };
        }
    }
    for kind in ["JS:", "LazyCompile:", "Function:", "Script:", "Eval:"] {
        let Some(rest) = name.strip_prefix(kind) else {
            continue;
        };
        let rest = rest.trim_start_matches(['~', '^', '+', '*']);
        // The location, `file:line:column`, follows the name after a space; both may hold
        // spaces (`get size`; a script in `/srv/my app/`; a worker's `[worker eval]`): the
        // first space followed by what starts a location and ends in `:digits` splits them,
        // else the last space.
        let number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let located = |l: &str| {
            ["/", "node:", "file:", "[", "webpack", "evalmachine"]
                .iter()
                .any(|p| l.starts_with(p))
                && l.rsplit_once(':').is_some_and(|(_, n)| number(n))
        };
        let first = (rest.match_indices(' ').map(|(i, _)| i)).find(|&i| located(&rest[i + 1..]));
        let (func, loc) = match first.map(|i| (&rest[..i], &rest[i + 1..])) {
            Some(split) => split,
            None => match rest.rsplit_once(' ') {
                Some((f, l)) => (f, l),
                None if rest.contains(':') && rest.contains('/') => ("", rest),
                None => (rest, ""),
            },
        };
        let func = if func.is_empty() { "(anonymous)" } else { func };
        // `file:line:column` (V8 since 2021) or `file:line` (older).
        if let Some((head, last)) = loc.rsplit_once(':').filter(|(_, l)| number(l)) {
            let (file, line) = match head.rsplit_once(':') {
                Some((f, l)) if number(l) => (f, l),
                _ => (head, last),
            };
            if let (false, Ok(line)) = (file.is_empty(), line.parse::<u32>()) {
                return Frame {
                    function: func.to_owned(),
                    file: file.to_owned(),
                    line,
                };
            }
        }
        return Frame {
            function: if loc.is_empty() {
                func.to_owned()
            } else {
                format!("{func} {loc}")
            },
            file: String::new(),
            line: 0,
        };
    }
    Frame {
        function: name.to_owned(),
        file: String::new(),
        line: 0,
    }
}

/// What [`read_trusted`] read.
#[derive(Debug)]
struct Contents {
    /// The bytes from `from` to the end.
    data: Vec<u8>,
    /// The file's device and inode.
    id: (u64, u64),
    /// Offset of `data[0]` in the file.
    from: u64,
}

/// Opens `path` for reading if it can be trusted as `target`'s (see the module docs); reads
/// it whole, or only past `skip.1` when the file is still the one `skip.0` names (device and
/// inode) and at least that long. Errors say why it was not read (`None`: there is no such
/// file).
fn read_trusted(
    path: &Path,
    target: &Target,
    skip: Option<((u64, u64), u64)>,
) -> Option<Result<Contents, String>> {
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Some(Err(format!(
                "{} is a symbolic link: not read",
                path.display()
            )))
        }
        Err(e) => return Some(Err(format!("{}: {e}", path.display()))),
    };
    let check = || -> Result<Contents, String> {
        let md = f
            .metadata()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if !md.is_file() {
            return Err(format!(
                "{} is not a regular file: not read",
                path.display()
            ));
        }
        if md.uid() != target.uid && md.uid() != 0 {
            return Err(format!(
                "{} belongs to uid {}, not the target's ({}) or root: not read",
                path.display(),
                md.uid(),
                target.uid
            ));
        }
        // A second name of a file (a hard link someone made to a file they do not own, where
        // the kernel allows it) is not the target's own file.
        if md.nlink() != 1 {
            return Err(format!(
                "{} has {} links: not read",
                path.display(),
                md.nlink()
            ));
        }
        if md.mode() & 0o002 != 0 {
            return Err(format!(
                "{} is writable by anyone: not read",
                path.display()
            ));
        }
        let mtime_ns = (md.mtime() as i128) * 1_000_000_000 + md.mtime_nsec() as i128;
        // One second of slack: the target's start is known to the tick, its region is
        // created a little after it.
        if mtime_ns + 1_000_000_000 < target.started_realtime_ns as i128 {
            return Err(format!(
                "{} is older than the process: another process's, not read",
                path.display()
            ));
        }
        if md.len() > MAX_FILE_BYTES {
            return Err(format!(
                "{} is larger than {} bytes: not read",
                path.display(),
                MAX_FILE_BYTES
            ));
        }
        let id = (md.dev(), md.ino());
        let from = match skip {
            Some((i, at)) if i == id && at <= md.len() => at,
            _ => 0,
        };
        if from > 0 {
            use std::io::Seek;
            (&f).seek(std::io::SeekFrom::Start(from))
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        let mut data = Vec::with_capacity((md.len() - from) as usize);
        (&f).take(MAX_FILE_BYTES)
            .read_to_end(&mut data)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Contents { data, id, from })
    };
    Some(check())
}

/// Reads `target`'s perf map and jitdump files: `/tmp/perf-PID.map`, `/tmp/jit-PID.dump`, and
/// any file named `jit-PID.dump` among `modules` or (when it is alive) mapped in the process.
/// What could not be read, and why, is added to `warnings`.
///
/// A perf map only grows (lines are appended): what was parsed of it is kept for the next
/// snapshot in this process (`watch`), which reads only the lines added since, as long as the
/// file is the same one (device and inode) and not shorter.
pub fn load(target: &Target, modules: &[Module], warnings: &mut Vec<String>) -> JitSymbols {
    let map = PathBuf::from(format!("/tmp/perf-{}.map", target.pid));
    let mut syms = perf_map(&map, target, warnings);
    let dump_name = format!("jit-{}.dump", target.pid);
    let mut dumps = vec![PathBuf::from("/tmp").join(&dump_name)];
    let named = |p: &str| {
        Path::new(p)
            .file_name()
            .is_some_and(|f| f == dump_name.as_str())
    };
    dumps.extend(
        modules
            .iter()
            .filter(|m| named(&m.path))
            .map(|m| PathBuf::from(&m.path)),
    );
    if target.alive {
        dumps.extend(
            proc_maps(target.pid)
                .into_iter()
                .filter(|m| named(&m.path))
                .map(|m| PathBuf::from(m.path)),
        );
    }
    dumps.sort();
    dumps.dedup();
    for d in dumps {
        match read_trusted(&d, target, None) {
            None => {}
            Some(Err(why)) => warnings.push(why),
            Some(Ok(c)) => match syms.add_jitdump(&c.data, target.pid) {
                Ok(n) => syms
                    .sources
                    .push(format!("{}: {n} code ranges", d.display())),
                Err(why) => warnings.push(format!("{}: {why}: not read", d.display())),
            },
        }
    }
    syms
}

/// Perf maps whose parsed ranges are kept between snapshots (see [`perf_map`]).
const MAX_CACHED_MAPS: usize = 16;

/// What was parsed of a perf map: its (device, inode), the bytes parsed (whole lines), the
/// ranges and how many lines gave them.
type Parsed = ((u64, u64), u64, JitSymbols, usize);

/// The ranges of the perf map at `path` (see [`load`]), with the file named in `sources`.
fn perf_map(path: &Path, target: &Target, warnings: &mut Vec<String>) -> JitSymbols {
    // Keyed by the process too: another process with the same pid writes another map.
    type Key = (PathBuf, u64);
    static CACHE: std::sync::Mutex<Option<std::collections::HashMap<Key, Parsed>>> =
        std::sync::Mutex::new(None);
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let cache = cache.get_or_insert_with(Default::default);
    let key = (path.to_owned(), target.started_realtime_ns);
    let prev = cache.remove(&key);
    let skip = prev.as_ref().map(|(id, at, _, _)| (*id, *at));
    let c = match read_trusted(path, target, skip) {
        None => return JitSymbols::default(),
        Some(Err(why)) => {
            warnings.push(why);
            return JitSymbols::default();
        }
        Some(Ok(c)) => c,
    };
    let (mut syms, mut n) = match prev {
        Some((id, at, syms, n)) if id == c.id && at == c.from && c.from > 0 => (syms, n),
        _ => (JitSymbols::default(), 0),
    };
    // Whole lines only: the writer may be in the middle of one.
    let whole = c
        .data
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    n += syms.add_perf_map(&String::from_utf8_lossy(&c.data[..whole]));
    let mut out = syms.clone();
    out.sources = vec![format!("{}: {n} code ranges", path.display())];
    // Bounded: a `watch` of processes that come and go keeps the maps of the last few.
    if cache.len() >= MAX_CACHED_MAPS {
        cache.clear();
    }
    cache.insert(key, (c.id, c.from + whole as u64, syms, n));
    out
}

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// `[start, end)`.
    pub start: u64,
    pub end: u64,
    /// `r-xp` and the like.
    pub perms: String,
    /// File offset of `start`.
    pub offset: u64,
    /// Path (empty for anonymous memory).
    pub path: String,
}

/// Parses `/proc/PID/maps` text.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut it = line.splitn(6, ' ');
        let (Some(range), Some(perms), Some(offset), Some(_dev), Some(_inode)) =
            (it.next(), it.next(), it.next(), it.next(), it.next())
        else {
            continue;
        };
        let path = it.next().unwrap_or("").trim_start().to_owned();
        let Some((s, e)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end), Ok(offset)) = (
            u64::from_str_radix(s, 16),
            u64::from_str_radix(e, 16),
            u64::from_str_radix(offset, 16),
        ) else {
            continue;
        };
        out.push(Mapping {
            start,
            end,
            perms: perms.to_owned(),
            offset,
            path,
        });
    }
    out
}

/// The mappings of a running process (empty when they cannot be read).
pub fn proc_maps(pid: u32) -> Vec<Mapping> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map(|t| parse_maps(&t))
        .unwrap_or_default()
}

/// Modules for the executable file mappings in `maps` that lie in no module of `modules`
/// (V8's second mapping of its own executable, holding the embedded builtins; a JIT mapping
/// an ELF file by hand): each named by its file, with the load bias that puts the mapping's
/// file offset at the virtual address the file's program headers give it, so that it is
/// symbolized like any module. Files that are not ELF, or whose program headers do not cover
/// the offset, are left out.
pub fn unlisted_modules(maps: &[Mapping], modules: &[Module]) -> Vec<Module> {
    let listed =
        |a: u64| crate::symbolize::module_of(modules, a).is_some_and(|i| modules[i].loaded);
    let mut out: Vec<Module> = Vec::new();
    for m in maps {
        if !m.perms.contains('x')
            || !m.path.starts_with('/')
            || m.path.ends_with(" (deleted)")
            || m.end <= m.start
            || listed(m.start)
        {
            continue;
        }
        let Some((vaddr, flags)) = vaddr_of_offset(Path::new(&m.path), m.offset) else {
            continue;
        };
        let build_id = blazesym::helper::read_elf_build_id(Path::new(&m.path))
            .ok()
            .flatten()
            .map(|b| b.to_vec())
            .unwrap_or_default();
        out.push(Module {
            path: m.path.clone(),
            base: m.start.wrapping_sub(vaddr),
            build_id,
            segments: vec![SegmentV1 {
                vaddr,
                memsz: m.end - m.start,
                offset_flags: (m.offset & ((1 << 56) - 1)) | ((flags as u64) << 56),
            }],
            loaded: true,
        });
    }
    out
}

/// The ELF virtual address and segment flags of file offset `offset` of the ELF file at
/// `path` (from its PT_LOAD program headers); `None` when it is not a regular ELF file or no
/// PT_LOAD holds the offset.
fn vaddr_of_offset(path: &Path, offset: u64) -> Option<(u64, u32)> {
    use object::read::elf::{FileHeader, ProgramHeader};
    // Not even opened unless it is a regular file: opening a device can have effects.
    if !std::fs::metadata(path).ok()?.is_file() {
        return None;
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    // The ELF header and program headers lie in the first pages of the file.
    let mut head = Vec::new();
    (&f).take(64 * 1024).read_to_end(&mut head).ok()?;
    let hdr = object::elf::FileHeader64::<object::Endianness>::parse(head.as_slice()).ok()?;
    let endian = hdr.endian().ok()?;
    let phdrs = hdr.program_headers(endian, head.as_slice()).ok()?;
    phdrs.iter().find_map(|p| {
        let (off, filesz) = (p.p_offset(endian), p.p_filesz(endian));
        (p.p_type(endian) == object::elf::PT_LOAD && offset >= off && offset < off + filesz)
            .then(|| (p.p_vaddr(endian) + (offset - off), p.p_flags(endian).0))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_map_later_lines_win() {
        let mut s = JitSymbols::default();
        let n = s.add_perf_map(
            "1000 100 first\n\
             bad line\n\
             1080 10 second\n\
             0x2000 8 py::outer.<locals>.inner:/srv/app.py\n\
             1050 0 empty\n",
        );
        assert_eq!(n, 4);
        assert_eq!(s.name(0xfff), None);
        assert_eq!(s.name(0x1000), Some("first"));
        assert_eq!(s.name(0x107f), Some("first"));
        assert_eq!(s.name(0x1080), Some("second"));
        assert_eq!(s.name(0x108f), Some("second"));
        assert_eq!(s.name(0x1090), Some("first"));
        assert_eq!(s.name(0x10ff), Some("first"));
        assert_eq!(s.name(0x1100), None);
        assert_eq!(
            s.lookup(0x2003),
            Some(Frame {
                function: "outer.<locals>.inner".into(),
                file: "/srv/app.py".into(),
                line: 0
            })
        );
        // A range covering several older ones replaces them all.
        s.add_perf_map("f00 300 all\n");
        assert_eq!(s.name(0x1000), Some("all"));
        assert_eq!(s.name(0x1085), Some("all"));
        assert_eq!(s.name(0x11ff), Some("all"));
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn v8_names() {
        let f = frame_of("JS:*makeBuffers /tmp/x/bufs.js:1:21");
        assert_eq!(
            (f.function.as_str(), f.file.as_str(), f.line),
            ("makeBuffers", "/tmp/x/bufs.js", 1)
        );
        let f = frame_of("JS:~get size file:///srv/a.mjs:12:3");
        assert_eq!(
            (f.function.as_str(), f.file.as_str(), f.line),
            ("get size", "file:///srv/a.mjs", 12)
        );
        let f = frame_of("LazyCompile:*makeBuffers /tmp/x/bufs.js:3");
        assert_eq!(
            (f.function.as_str(), f.file.as_str(), f.line),
            ("makeBuffers", "/tmp/x/bufs.js", 3)
        );
        let f = frame_of("JS:~f file:///srv/a.mjs:7");
        assert_eq!(
            (f.function.as_str(), f.file.as_str(), f.line),
            ("f", "file:///srv/a.mjs", 7)
        );
        let f = frame_of("JS:*g native array.js");
        assert_eq!(
            (f.function.as_str(), f.file.as_str()),
            ("g native array.js", "")
        );
        let f = frame_of("JS:^ node:internal/main/run_main_module:1:1");
        assert_eq!(
            (f.function.as_str(), f.file.as_str(), f.line),
            ("(anonymous)", "node:internal/main/run_main_module", 1)
        );
        // A script in a directory with a space, an anonymous function there, and a worker's
        // code evaluated from a string (helper D, 4: split at the last space before).
        let f = frame_of("JS:*makeBuffers /tmp/my app/sp.js:3:4");
        assert_eq!(
            (f.function.as_str(), f.file.as_str(), f.line),
            ("makeBuffers", "/tmp/my app/sp.js", 3)
        );
        let f = frame_of("JS:~ /tmp/my app/sp.js:1:1");
        assert_eq!(
            (f.function.as_str(), f.file.as_str(), f.line),
            ("(anonymous)", "/tmp/my app/sp.js", 1)
        );
        let f = frame_of("JS:~workerAlloc [worker eval]:3:23");
        assert_eq!(
            (f.function.as_str(), f.file.as_str(), f.line),
            ("workerAlloc", "[worker eval]", 3)
        );
        let f = frame_of("JS:*get size /srv/my app/a.js:12:3");
        assert_eq!(
            (f.function.as_str(), f.file.as_str(), f.line),
            ("get size", "/srv/my app/a.js", 12)
        );
        assert_eq!(
            frame_of("Builtin:ArrayPrototypePush").function,
            "Builtin:ArrayPrototypePush"
        );
        assert_eq!(
            frame_of("Lcom/example/Foo;::bar").function,
            "Lcom/example/Foo;::bar"
        );
    }

    /// A jitdump in this machine's byte order with the given records.
    fn jitdump(pid: u32, records: &[(u32, Vec<u8>)], cut: usize) -> Vec<u8> {
        let mut d = Vec::new();
        d.extend(JITDUMP_MAGIC.to_ne_bytes());
        d.extend(1u32.to_ne_bytes());
        d.extend((JITDUMP_HEADER as u32).to_ne_bytes());
        d.extend(62u32.to_ne_bytes());
        d.extend(0u32.to_ne_bytes());
        d.extend(pid.to_ne_bytes());
        d.extend(0u64.to_ne_bytes());
        d.extend(0u64.to_ne_bytes());
        for (id, body) in records {
            d.extend(id.to_ne_bytes());
            d.extend((16 + body.len() as u32).to_ne_bytes());
            d.extend(7u64.to_ne_bytes());
            d.extend(body);
        }
        d.truncate(d.len() - cut);
        d
    }

    fn load_record(addr: u64, size: u64, index: u64, name: &str) -> (u32, Vec<u8>) {
        let mut b = Vec::new();
        b.extend(5u32.to_ne_bytes());
        b.extend(5u32.to_ne_bytes());
        b.extend(addr.to_ne_bytes());
        b.extend(addr.to_ne_bytes());
        b.extend(size.to_ne_bytes());
        b.extend(index.to_ne_bytes());
        b.extend(name.as_bytes());
        b.push(0);
        b.extend([0xcc; 11]);
        (JIT_CODE_LOAD, b)
    }

    #[test]
    fn jitdump_loads_moves_and_cut_tail() {
        let mut mv = Vec::new();
        for v in [5u32, 5] {
            mv.extend(v.to_ne_bytes());
        }
        for v in [0x1000u64, 0x1000, 0x9000, 0x20, 1] {
            mv.extend(v.to_ne_bytes());
        }
        let recs = vec![
            load_record(0x1000, 0x20, 1, "py::f:/a.py"),
            (2, vec![0; 24]),
            load_record(0x3000, 0x10, 2, "py::g:/a.py"),
            (JIT_CODE_MOVE, mv),
            load_record(0x5000, 0x10, 3, "cut"),
        ];
        let d = jitdump(42, &recs, 5);
        let mut s = JitSymbols::default();
        assert_eq!(s.add_jitdump(&d, 42), Ok(3));
        assert_eq!(s.name(0x1010), Some("py::f:/a.py"));
        assert_eq!(s.name(0x300f), Some("py::g:/a.py"));
        assert_eq!(s.name(0x9001), Some("py::f:/a.py"));
        assert_eq!(s.name(0x5000), None);
        assert!(s.add_jitdump(&d, 43).unwrap_err().contains("pid 42"));
        assert!(s.add_jitdump(b"JUNKJUNKJUNK", 42).is_err());
        assert!(s.add_jitdump(&[], 42).is_err());
    }

    #[test]
    fn perf_map_read_again_from_where_it_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("perf-1.map");
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        let t = Target {
            pid: 1,
            uid,
            started_realtime_ns: 1,
            alive: true,
        };
        let mut w = Vec::new();
        // The writer is in the middle of its second line.
        std::fs::write(&path, "1000 10 a\n2000 10 b").unwrap();
        let s = perf_map(&path, &t, &mut w);
        assert_eq!((s.name(0x1000), s.name(0x2000)), (Some("a"), None));
        assert_eq!(
            s.sources,
            vec![format!("{}: 1 code ranges", path.display())]
        );
        // The line completed, another appended (overriding part of the first).
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"0\n1008 8 c\n").unwrap();
        let s = perf_map(&path, &t, &mut w);
        assert_eq!(s.name(0x1000), Some("a"));
        assert_eq!(s.name(0x1009), Some("c"));
        assert_eq!(s.name(0x200f), Some("b0"));
        assert_eq!(
            s.sources,
            vec![format!("{}: 3 code ranges", path.display())]
        );
        // A new file under the same name: read from its start.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "3000 10 d\n").unwrap();
        let s = perf_map(&path, &t, &mut w);
        assert_eq!((s.name(0x1000), s.name(0x3000)), (None, Some("d")));
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn maps_lines() {
        let m = parse_maps(
            "00400000-00b6f000 r--p 00000000 fe:00 247584                             /usr/bin/node\n\
             7ff19be40000-7ff19bfd2000 r-xp 014c4000 fe:00 247584                     /usr/bin/node\n\
             7ff19c000000-7ff19c001000 rwxp 00000000 00:00 0 \n",
        );
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].start, 0x7ff19be40000);
        assert_eq!(m[1].offset, 0x14c4000);
        assert_eq!(m[1].path, "/usr/bin/node");
        assert_eq!(m[2].path, "");
    }

    #[test]
    fn trust_rules() {
        let dir = tempfile::tempdir().unwrap();
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let t = Target {
            pid: 1,
            uid: me,
            started_realtime_ns: 0,
            alive: false,
        };
        let good = dir.path().join("good.map");
        std::fs::write(&good, "1000 10 x\n").unwrap();
        assert!(read_trusted(&good, &t, None).unwrap().is_ok());
        assert!(read_trusted(&dir.path().join("none"), &t, None).is_none());
        // Writable by anyone.
        use std::os::unix::fs::PermissionsExt;
        let open = dir.path().join("open.map");
        std::fs::write(&open, "1000 10 x\n").unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(read_trusted(&open, &t, None)
            .unwrap()
            .unwrap_err()
            .contains("anyone"));
        // A symbolic link is not followed.
        let link = dir.path().join("link.map");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert!(read_trusted(&link, &t, None)
            .unwrap()
            .unwrap_err()
            .contains("symbolic"));
        // Another user's: a file of ours (or, as root, one given to uid 4242) read for a
        // target of uid 1000.
        let theirs = dir.path().join("theirs.map");
        std::fs::write(&theirs, "1000 10 x\n").unwrap();
        if me == 0 {
            std::os::unix::fs::chown(&theirs, Some(4242), None).unwrap();
        }
        let other = Target {
            uid: if me == 1000 { 1001 } else { 1000 },
            ..t.clone()
        };
        assert!(read_trusted(&theirs, &other, None)
            .unwrap()
            .unwrap_err()
            .contains("uid"));
        // Older than the process.
        let later = Target {
            started_realtime_ns: vmo_layout::clock::realtime_ns() + 60_000_000_000,
            ..t.clone()
        };
        assert!(read_trusted(&good, &later, None)
            .unwrap()
            .unwrap_err()
            .contains("older"));
        // Not a regular file.
        assert!(read_trusted(dir.path(), &t, None).unwrap().is_err());
        // A hard link.
        let linked = dir.path().join("linked.map");
        std::fs::hard_link(&good, &linked).unwrap();
        assert!(read_trusted(&linked, &t, None)
            .unwrap()
            .unwrap_err()
            .contains("2 links"));
    }
}
