//! Block contents: `heapdump snapshot --contents-dir DIR` (each live block's bytes in
//! `DIR/0xADDRESS`, as Fuchsia's `heapdump --output-contents-dir` writes them) and
//! `--with-strings` (the printable prefix of each block that starts with text, as a `string`
//! label of its per-block sample).
//!
//! Contents are read from the running target with `process_vm_readv`
//! ([`crate::graph::scan::Memory`]) after the snapshot's instant, in runs of neighbouring
//! blocks (one call for up to [`RUN_MAX`] bytes, gaps under [`RUN_GAP`] read along), one call
//! per block where a run comes back short. A block that cannot be read (freed and unmapped
//! since the snapshot) gets no file and no label, and is counted; so is a block that a second
//! look at the region ([`Outcome::drop_freed`]) finds freed since the snapshot, even if its
//! memory could still be read (its file is removed).

use anyhow::{bail, Context, Result};
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Longest `process_vm_readv` of contents, bytes (as the reference scan's).
pub const RUN_MAX: u64 = 8 << 20;
/// Blocks closer than this many bytes are read in one run (the gap is read too).
pub const RUN_GAP: u64 = 64 << 10;
/// Longest `string` label, bytes.
pub const STRING_MAX: usize = 64;
/// Fewest printable bytes a block must start with to get a `string` label.
pub const STRING_MIN: usize = 4;

/// What to do with the live blocks' contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Write each block's bytes to `DIR/0xADDRESS` (a new or empty directory).
    pub dir: Option<PathBuf>,
    /// Longest file, bytes: a larger block's file holds its first `max_block` bytes.
    pub max_block: u64,
    /// Most bytes written in all, in address order: the block that reaches it is cut, the
    /// blocks after it get no file.
    pub max_total: u64,
    /// Label per-block samples with the block's printable prefix.
    pub strings: bool,
}

/// The printable text a block starts with, if at least [`STRING_MIN`] bytes of it: the longest
/// prefix of at most [`STRING_MAX`] bytes that is valid UTF-8 without control characters
/// (so it ends at the first NUL, newline, other control byte, invalid or cut UTF-8 sequence).
pub fn printable_prefix(bytes: &[u8]) -> Option<String> {
    let head = &bytes[..bytes.len().min(STRING_MAX)];
    let valid = match std::str::from_utf8(head) {
        Ok(s) => s,
        // The first `valid_up_to` bytes are valid UTF-8 by definition.
        Err(e) => std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or(""),
    };
    let end = valid
        .char_indices()
        .find(|(_, c)| c.is_control())
        .map_or(valid.len(), |(i, _)| i);
    (end >= STRING_MIN).then(|| valid[..end].to_owned())
}

/// The output directory, held open: every file is created relative to it.
#[derive(Debug)]
pub struct OutDir {
    fd: crate::outdir::Dir,
    path: PathBuf,
}

impl OutDir {
    /// Creates `path` (mode 0700; its parent must exist) or takes it if it is an empty
    /// directory, and opens it (`O_DIRECTORY | O_NOFOLLOW`).
    ///
    /// Errors: `path` is a symbolic link, exists and is not a directory, is not empty (every
    /// file in it must be a block of this snapshot), or cannot be created or opened.
    pub fn prepare(path: &Path) -> Result<OutDir> {
        // Opened once without following a link, trailing slash or not (`crate::outdir`).
        let dir = crate::outdir::Dir::open(path, crate::outdir::Create::Last)
            .with_context(|| "--contents-dir takes a new or empty directory")?;
        // The directory opened, not the path (which could have been swapped meanwhile).
        let entries = dir.names()?.len();
        if entries > 0 {
            bail!(
                "{}: is not empty ({entries} entries); --contents-dir takes a new or empty \
                 directory, so that every file in it is a block of this snapshot",
                path.display()
            );
        }
        Ok(OutDir {
            fd: dir,
            path: path.to_owned(),
        })
    }

    /// Creates the file `name` in the directory: `O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600
    /// (nothing planted under that name is ever followed or reused).
    fn create(&self, name: &str) -> Result<std::fs::File> {
        self.fd.create(name)
    }

    /// Removes the file `name` that [`Self::create`] made.
    fn remove(&self, name: &str) -> Result<()> {
        self.fd.remove(std::ffi::OsStr::new(name))
    }
}

/// A block's file name: its address in hex, `0x55d0c0a012a0`.
pub fn file_name(address: u64) -> String {
    format!("{address:#x}")
}

/// What reading the contents gave.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Block address → its printable prefix (with `--with-strings`).
    pub strings: HashMap<u64, String>,
    /// Files written.
    pub files: u64,
    /// Bytes written in all.
    pub bytes: u64,
    /// Files shorter than their block (a cap cut them).
    pub truncated: u64,
    /// Blocks without a file because `max_total` was reached.
    pub not_written: u64,
    /// Blocks that could not be read (unmapped since the snapshot): no file, no label.
    pub unreadable: u64,
    /// Blocks read but found freed since the snapshot by a second look at the region: their
    /// file removed, no label.
    pub freed: u64,
    /// Blocks read: (address, allocation time, size, file length if one was written).
    read: Vec<(u64, u64, u64, Option<u64>)>,
}

/// A block to read: where, how much, and how long its file is.
#[derive(Debug, Clone, Copy)]
struct Item {
    address: u64,
    size: u64,
    t_alloc: u64,
    /// Bytes to read (the file's, and the string's prefix).
    read: u64,
    /// The file's length, `None`: no file.
    file: Option<u64>,
}

/// Reads the contents of `blocks` (live blocks of one snapshot of the running process `pid`,
/// any order) as `req` says, writing files into `dir` (which must be given when `req.dir` is).
///
/// Errors: the target's memory cannot be read at all (the message names the fix: the right
/// to ptrace it), `/proc/PID/maps` cannot be read (the process is gone), or a file cannot be
/// written (disk full…). A block freed meanwhile is never an error (see [`Outcome`]).
pub fn read(
    pid: u32,
    blocks: &[vmo_layout::Block],
    req: &Request,
    dir: Option<&OutDir>,
) -> Result<Outcome> {
    // The snapshot validated them (`vmo_layout::check`); kept here too so that no address
    // arithmetic below can overflow, whoever calls this.
    let mut order: Vec<&vmo_layout::Block> = blocks
        .iter()
        .filter(|b| vmo_layout::check::in_range(b))
        .collect();
    order.sort_unstable_by_key(|b| b.address);
    order.dedup_by_key(|b| b.address);
    let mut out = Outcome::default();
    // Plan, in address order: each file's length under both caps.
    let mut remaining = req.max_total;
    let mut full = false;
    let mut items = Vec::with_capacity(order.len());
    for b in order {
        let file = match dir {
            None => None,
            Some(_) if full => {
                out.not_written += 1;
                None
            }
            Some(_) => {
                let want = b.size.min(req.max_block);
                let n = want.min(remaining);
                remaining -= n;
                full = remaining == 0;
                Some(n)
            }
        };
        let label = if req.strings {
            b.size.min(STRING_MAX as u64)
        } else {
            0
        };
        let read = file.unwrap_or(0).max(label);
        if file.is_none() && read == 0 {
            continue;
        }
        items.push(Item {
            address: b.address,
            size: b.size,
            t_alloc: b.t_alloc,
            read,
            file,
        });
    }
    if items.is_empty() {
        return Ok(out);
    }
    let maps = crate::graph::scan::read_maps(pid)
        .with_context(|| format!("pid {pid} exited before its blocks' contents could be read"))?;
    let probe = maps
        .iter()
        .find(|m| m.read && m.write)
        .map(|m| m.start)
        .unwrap_or(items[0].address);
    let mem = crate::graph::scan::Memory::open(pid, probe)?;

    let mut buf: Vec<u8> = Vec::new();
    let mut one: Vec<u8> = Vec::new();
    let mut k = 0;
    while k < items.len() {
        let it = items[k];
        if it.read > RUN_MAX {
            big(&mem, &it, req, dir, &mut out)?;
            k += 1;
            continue;
        }
        // A run of neighbouring blocks, read with one call.
        let start = it.address;
        let mut end = start.saturating_add(it.read);
        let mut j = k + 1;
        while j < items.len() {
            let n = &items[j];
            let n_end = n.address.saturating_add(n.read);
            if n.read > RUN_MAX
                || n.address >= end.saturating_add(RUN_GAP)
                || n_end - start > RUN_MAX
            {
                break;
            }
            end = end.max(n_end);
            j += 1;
        }
        buf.resize((end - start) as usize, 0);
        let got = start + mem.read(start, &mut buf) as u64;
        for it in &items[k..j] {
            let bytes = if it.address + it.read <= got {
                let off = (it.address - start) as usize;
                &buf[off..off + it.read as usize]
            } else {
                // Past what the run could read: this block alone.
                one.resize(it.read as usize, 0);
                if mem.read(it.address, &mut one) != one.len() {
                    out.unreadable += 1;
                    continue;
                }
                &one[..]
            };
            take(it, bytes, req, dir, &mut out)?;
        }
        k = j;
    }
    Ok(out)
}

/// Records a block read in full: its string label, its file.
fn take(
    it: &Item,
    bytes: &[u8],
    req: &Request,
    dir: Option<&OutDir>,
    out: &mut Outcome,
) -> Result<()> {
    if req.strings {
        if let Some(s) = printable_prefix(&bytes[..bytes.len().min(it.size as usize)]) {
            out.strings.insert(it.address, s);
        }
    }
    if let (Some(n), Some(dir)) = (it.file, dir) {
        let name = file_name(it.address);
        let mut f = dir.create(&name)?;
        if let Err(e) = f.write_all(&bytes[..n as usize]) {
            // No partial file is left to pass for the block's bytes (helper U, 6: a full file
            // system left an empty one).
            drop(f);
            let _ = dir.remove(&name);
            return Err(e)
                .with_context(|| format!("cannot write {}", dir.path.join(&name).display()));
        }
        out.count_file(it);
    }
    out.read.push((it.address, it.t_alloc, it.size, it.file));
    Ok(())
}

/// A block whose file is longer than one run: read and written piece by piece.
fn big(
    mem: &crate::graph::scan::Memory,
    it: &Item,
    req: &Request,
    dir: Option<&OutDir>,
    out: &mut Outcome,
) -> Result<()> {
    let (Some(n), Some(dir)) = (it.file, dir) else {
        unreachable!("only a file is read past RUN_MAX (a label needs 64 bytes)")
    };
    let name = file_name(it.address);
    let mut f = dir.create(&name)?;
    let mut piece = vec![0u8; RUN_MAX as usize];
    let mut done = 0u64;
    while done < n {
        let len = (n - done).min(RUN_MAX) as usize;
        if mem.read(it.address + done, &mut piece[..len]) != len {
            drop(f);
            dir.remove(&name)?;
            out.unreadable += 1;
            return Ok(());
        }
        if done == 0 && req.strings {
            if let Some(s) = printable_prefix(&piece[..len]) {
                out.strings.insert(it.address, s);
            }
        }
        if let Err(e) = f.write_all(&piece[..len]) {
            drop(f);
            let _ = dir.remove(&name);
            return Err(e)
                .with_context(|| format!("cannot write {}", dir.path.join(&name).display()));
        }
        done += len as u64;
    }
    out.count_file(it);
    out.read.push((it.address, it.t_alloc, it.size, it.file));
    Ok(())
}

impl Outcome {
    fn count_file(&mut self, it: &Item) {
        let n = it.file.unwrap_or(0);
        self.files += 1;
        self.bytes += n;
        if n < it.size {
            self.truncated += 1;
        }
    }

    /// Forgets the blocks read that `live` (the (address, allocation time, size) of the blocks
    /// of a second snapshot, taken after the reading) no longer has: freed since the first
    /// snapshot, their memory may hold anything. Their files are removed from `dir`.
    ///
    /// A block freed and its address reused by a block of the same size within one tick of
    /// the region's clock (1–4 ms) is not told apart.
    ///
    /// Errors: a file cannot be removed.
    pub fn drop_freed(
        &mut self,
        live: &HashSet<(u64, u64, u64)>,
        dir: Option<&OutDir>,
    ) -> Result<()> {
        let read = std::mem::take(&mut self.read);
        for (address, t_alloc, size, file) in read {
            if live.contains(&(address, t_alloc, size)) {
                continue;
            }
            self.freed += 1;
            self.strings.remove(&address);
            if let (Some(n), Some(dir)) = (file, dir) {
                dir.remove(&file_name(address))?;
                self.files -= 1;
                self.bytes -= n;
                if n < size {
                    self.truncated -= 1;
                }
            }
        }
        Ok(())
    }

    /// One line per thing to say (for stderr and the profile's comments): what was written,
    /// what the caps cut, what was skipped. Nothing is left unsaid: every cap that cut and
    /// every block skipped is counted.
    pub fn report(&self, req: &Request, dir: Option<&OutDir>) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some(d) = dir {
            lines.push(format!(
                "contents: {} block(s) written to {} ({} bytes)",
                self.files,
                d.path.display(),
                self.bytes
            ));
            if self.truncated > 0 || self.not_written > 0 {
                lines.push(format!(
                    "contents: caps reached: {} file(s) truncated (--contents-max-block {} bytes \
                     per block, --contents-max-total {} bytes in all), {} block(s) without a \
                     file (--contents-max-total reached)",
                    self.truncated, req.max_block, req.max_total, self.not_written
                ));
            }
        }
        if req.strings {
            lines.push(format!(
                "contents: {} block(s) labelled with the string they start with",
                self.strings.len()
            ));
        }
        if self.unreadable + self.freed > 0 {
            lines.push(format!(
                "contents: {} block(s) freed since the snapshot skipped (no file, no string): \
                 {} unmapped, {} found freed by a second look at the region",
                self.unreadable + self.freed,
                self.unreadable,
                self.freed
            ));
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_prefixes() {
        assert_eq!(printable_prefix(b"hello\0world").as_deref(), Some("hello"));
        assert_eq!(printable_prefix(b"abc\0"), None, "3 bytes: too short");
        assert_eq!(printable_prefix(b"abcd"), Some("abcd".into()));
        assert_eq!(printable_prefix(b"\x01hello"), None);
        assert_eq!(printable_prefix(b"line\nnext").as_deref(), Some("line"));
        assert_eq!(
            printable_prefix("héllo wörld\0".as_bytes()).as_deref(),
            Some("héllo wörld")
        );
        // Invalid UTF-8 ends the prefix.
        assert_eq!(printable_prefix(b"abcde\xff\xfe").as_deref(), Some("abcde"));
        // At most 64 bytes, and a character cut at the limit is left out.
        let long = [b'x'; 100];
        assert_eq!(printable_prefix(&long).unwrap().len(), 64);
        let mut cut = vec![b'y'; 63];
        cut.extend_from_slice("é".as_bytes());
        assert_eq!(printable_prefix(&cut).unwrap(), "y".repeat(63));
    }

    #[test]
    fn file_names_are_hex_addresses() {
        assert_eq!(file_name(0x55d0c0a012a0), "0x55d0c0a012a0");
    }
}
