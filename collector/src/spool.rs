//! The on-disk spool of `heapdump watch -o DIR --push URL`: each profile to push is kept in
//! `DIR/.spool/NNNNNNNNNNNN.hdpush` (a sequence number, so names sort in the order the
//! profiles were taken) until the server has taken it, so that a server that is down longer
//! than the in-memory queue lasts, or a watch that is stopped or restarted, loses nothing: the
//! next watch on the same DIR sends what is left first, oldest first.
//!
//! A file is one [`Record`] (protobuf, version [`VERSION`]): the labels, the gzip-compressed
//! pprof profile, the push's id and a description for messages; it is not tied to a push
//! format, so a watch restarted with another `--push`/`--push-format` sends it there. Files are
//! written as `-o` files are ([`crate::pprof::write_bytes`]: a temporary file created
//! exclusively, mode 0600, renamed into place), read without following a symlink, and removed
//! once the server acknowledged them. The total size is bounded by `--spool-max-bytes`
//! (the caller, [`crate::push::Queue`], drops the oldest). One watch at a time uses a spool:
//! `DIR/.spool/lock` is held with `flock` while it runs.

use crate::push::Item;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// The spool's directory inside `-o DIR`.
pub const SPOOL_DIR: &str = ".spool";
/// Default bound of the spool's files, bytes (`--spool-max-bytes`).
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;
/// Version of the [`Record`] format this heapdump writes and reads.
pub const VERSION: u32 = 1;
/// Largest spool file read back, bytes (a larger one is not a profile heapdump wrote).
const MAX_FILE: u64 = 1 << 30;

/// One spooled profile, as stored.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Record {
    /// [`VERSION`].
    #[prost(uint32, tag = "1")]
    pub version: u32,
    /// The push's labels, without the format's own (`__delta__`).
    #[prost(message, repeated, tag = "2")]
    pub labels: Vec<RecordLabel>,
    /// The gzip-compressed pprof profile.
    #[prost(bytes = "vec", tag = "3")]
    pub profile: Vec<u8>,
    /// The push's id (a UUID).
    #[prost(string, tag = "4")]
    pub id: String,
    /// What the profile is, for messages (`pid 12 (server)`).
    #[prost(string, tag = "5")]
    pub what: String,
}

/// A label of a [`Record`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct RecordLabel {
    /// Name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// A profile in the spool.
#[derive(Debug, Clone)]
pub struct Stored {
    /// Its file.
    pub path: PathBuf,
    /// The file's size, bytes.
    pub bytes: u64,
}

/// An open spool (its lock held).
#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    max_bytes: u64,
    next_seq: u64,
    _lock: std::fs::File,
}

/// The sequence number of a spool file name (`NNNNNNNNNNNN.hdpush`).
fn seq_of(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".hdpush")?;
    (digits.len() == 12 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

impl Spool {
    /// Opens the spool of `-o DIR` (creating `DIR/.spool`, mode 0700), bounded to
    /// `max_bytes`, and returns it with the profiles an earlier watch left there, oldest first.
    ///
    /// Errors: `DIR/.spool` is not a directory (a symlink is refused) or cannot be created;
    /// another watch holds its lock (it sends them); the lock file cannot be opened.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<(Spool, Vec<Stored>)> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        use std::os::unix::io::AsRawFd;
        let dir = dir.join(SPOOL_DIR);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => bail!(
                "{} is not a directory (a symlink is not followed): remove it to spool there",
                dir.display()
            ),
            Err(_) => std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?,
        }
        let lock_path = dir.join("lock");
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&lock_path)
            .with_context(|| format!("cannot open {}", lock_path.display()))?;
        // SAFETY: flock on a descriptor this function owns; it only takes an advisory lock.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            bail!(
                "{} is in use by another heapdump watch (it sends what is spooled there)",
                dir.display()
            );
        }
        let mut left: Vec<(u64, Stored)> = Vec::new();
        for e in std::fs::read_dir(&dir)
            .with_context(|| format!("cannot list {}", dir.display()))?
            .flatten()
        {
            let Some(seq) = e.file_name().to_str().and_then(seq_of) else {
                continue;
            };
            // Regular files only (file_type does not follow symlinks).
            let Ok(m) = e.metadata() else { continue };
            if !e.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            left.push((
                seq,
                Stored {
                    path: e.path(),
                    bytes: m.len(),
                },
            ));
        }
        left.sort_by_key(|(s, _)| *s);
        let next_seq = left.last().map_or(1, |(s, _)| s + 1);
        let spool = Spool {
            dir,
            max_bytes,
            next_seq,
            _lock: lock,
        };
        Ok((spool, left.into_iter().map(|(_, s)| s).collect()))
    }

    /// The directory (`DIR/.spool`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The bound on the files' total size, bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The encoded [`Record`] of `item`.
    pub fn encode(item: &Item) -> Vec<u8> {
        use prost::Message;
        Record {
            version: VERSION,
            labels: (item.labels.iter())
                .map(|(name, value)| RecordLabel {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect(),
            profile: item.profile.clone(),
            id: item.id.clone(),
            what: item.what.clone(),
        }
        .encode_to_vec()
    }

    /// Writes `bytes` (an [`encode`](Self::encode)d item) as the next file.
    ///
    /// Errors: the file cannot be written (disk full, permissions).
    pub fn store(&mut self, bytes: &[u8]) -> Result<Stored> {
        let path = self.dir.join(format!("{:012}.hdpush", self.next_seq));
        self.next_seq += 1;
        crate::pprof::write_bytes(bytes, &path)?;
        Ok(Stored {
            path,
            bytes: bytes.len() as u64,
        })
    }

    /// Reads a spooled profile back.
    ///
    /// Errors: the file cannot be read (or is a symlink), is larger than 1 GiB, is not a
    /// [`Record`], or is of another version.
    pub fn load(s: &Stored) -> Result<Item> {
        use prost::Message;
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&s.path)
            .with_context(|| format!("cannot open {}", s.path.display()))?;
        let mut bytes = Vec::new();
        f.take(MAX_FILE + 1)
            .read_to_end(&mut bytes)
            .with_context(|| format!("cannot read {}", s.path.display()))?;
        if bytes.len() as u64 > MAX_FILE {
            bail!("{}: larger than 1 GiB", s.path.display());
        }
        let r = Record::decode(bytes.as_slice())
            .with_context(|| format!("{}: not a spooled profile", s.path.display()))?;
        if r.version != VERSION {
            bail!(
                "{}: spool format version {} (this heapdump reads {VERSION})",
                s.path.display(),
                r.version
            );
        }
        Ok(Item {
            labels: r.labels.into_iter().map(|l| (l.name, l.value)).collect(),
            profile: r.profile,
            id: r.id,
            what: r.what,
        })
    }

    /// Removes a spooled profile (sent, or dropped).
    ///
    /// Errors: the file cannot be removed (it would be sent again by the next watch).
    pub fn remove(s: &Stored) -> Result<()> {
        match std::fs::remove_file(&s.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("cannot remove {}", s.path.display()))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(n: u8) -> Item {
        Item {
            labels: vec![("pid".into(), n.to_string())],
            profile: vec![0x1f, 0x8b, n],
            id: format!("id{n}"),
            what: format!("pid {n} (x)"),
        }
    }

    #[test]
    fn a_second_spool_reads_what_the_first_left_in_order() {
        let d = tempfile::tempdir().unwrap();
        {
            let (mut s, left) = Spool::open(d.path(), 1 << 20).unwrap();
            assert!(left.is_empty());
            // Held: a second watch cannot use it meanwhile.
            let e = Spool::open(d.path(), 1 << 20).unwrap_err();
            assert!(e.to_string().contains("in use"), "{e}");
            for n in 1..=11 {
                s.store(&Spool::encode(&item(n))).unwrap();
            }
            let first = d.path().join(".spool/000000000001.hdpush");
            Spool::remove(&Stored {
                path: first,
                bytes: 0,
            })
            .unwrap();
        }
        std::fs::write(d.path().join(".spool/notes.txt"), b"x").unwrap();
        let (mut s, left) = Spool::open(d.path(), 1 << 20).unwrap();
        let got: Vec<Item> = left.iter().map(|l| Spool::load(l).unwrap()).collect();
        let ids: Vec<&str> = got.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(
            ids,
            ["id2", "id3", "id4", "id5", "id6", "id7", "id8", "id9", "id10", "id11"]
        );
        assert_eq!(got[0].labels, [("pid".to_owned(), "2".to_owned())]);
        assert_eq!(got[0].profile, [0x1f, 0x8b, 2]);
        // New files come after the old ones.
        let next = s.store(&Spool::encode(&item(12))).unwrap();
        assert!(next.path.ends_with("000000000012.hdpush"), "{next:?}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&next.path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_symlinked_spool_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), d.path().join(SPOOL_DIR)).unwrap();
        let e = Spool::open(d.path(), 1 << 20).unwrap_err();
        assert!(e.to_string().contains("symlink"), "{e}");
    }
}
