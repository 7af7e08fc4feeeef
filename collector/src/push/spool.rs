//! The on-disk spool of `heapdump watch -o DIR --push URL`: each profile to push is kept in
//! `DIR/.spool/NNNNNNNNNNNN.hdpush` (a sequence number, so names sort in the order the
//! profiles were taken) until the server has taken it, so that a server that is down longer
//! than the in-memory queue lasts, or a watch that is stopped or restarted, loses nothing: the
//! next watch on the same DIR sends what is left first, oldest first.
//!
//! A file is one [`Record`] (protobuf, version [`VERSION`]): the labels, the gzip-compressed
//! pprof profile, the push's id and a description for messages; it is not tied to a push
//! format, so a watch restarted with another `--push`/`--push-format` sends it there. Files are
//! written as `-o` files are ([`crate::output::write_bytes`]: a temporary file created
//! exclusively, mode 0600, renamed into place), read without following a symlink, and removed
//! once the server acknowledged them. The total size is bounded by `--spool-max-bytes`
//! (the caller, [`super::queue::Queue`], drops the oldest). One watch at a time uses a spool:
//! `DIR/.spool/lock` is held with `flock` while it runs.

use super::Item;
use crate::outdir::Dir;
use anyhow::{bail, Context, Result};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
    /// Its file (for messages).
    pub path: PathBuf,
    /// The spool's directory, which holds it.
    dir: Arc<Dir>,
    /// Its name in `dir`.
    name: String,
    /// The file's size, bytes.
    pub bytes: u64,
}

/// An open spool (its lock held).
#[derive(Debug)]
pub struct Spool {
    dir: Arc<Dir>,
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
    /// Opens the spool of `-o DIR` (`out`; creating `DIR/.spool`, mode 0700), bounded to
    /// `max_bytes`, and returns it with the profiles an earlier watch left there, oldest first.
    ///
    /// Only what this collector's own writer could have made is ever pushed (README,
    /// "Security model"): `DIR/.spool` must be a directory (not a link) owned by the
    /// collector's effective uid and writable by no one else; each file must be a regular
    /// file named `NNNNNNNNNNNN.hdpush`, owned by that uid and not writable by group or
    /// others. Any other file is skipped with one warning line each and left in place.
    ///
    /// Errors: `DIR/.spool` is not a directory (a symlink is refused), is another user's or
    /// writable by others, or cannot be created; another watch holds its lock (it sends
    /// them); the lock file cannot be opened.
    pub fn open(out: &Dir, max_bytes: u64) -> Result<(Spool, Vec<Stored>)> {
        use std::os::unix::io::AsRawFd;
        let dir = out.subdir(SPOOL_DIR, true)?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let st = dir.stat()?;
        if st.st_uid != me || st.st_mode & 0o022 != 0 {
            bail!(
                "{} is owned by uid {} with mode {:o}: not a spool of yours alone (another \
                 user could plant profiles there for you to push); remove it",
                dir.path().display(),
                st.st_uid,
                st.st_mode & 0o7777
            );
        }
        let lock = dir
            .open_at(OsStr::new("lock"), libc::O_RDWR | libc::O_CREAT, 0o600)
            .context("cannot open the spool's lock")?;
        // SAFETY: flock on a descriptor this function owns; it only takes an advisory lock.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            bail!(
                "{} is in use by another heapdump watch (it sends what is spooled there)",
                dir.path().display()
            );
        }
        let dir = Arc::new(dir);
        let mut left: Vec<(u64, Stored)> = Vec::new();
        // New files are numbered past every spool name there, skipped ones included (never
        // renamed over one).
        let mut last_seq = 0;
        for name in dir.names()? {
            let Some(name) = name.to_str().map(str::to_owned) else {
                continue;
            };
            let Some(seq) = seq_of(&name) else {
                continue;
            };
            last_seq = last_seq.max(seq);
            let Ok(Some(st)) = dir.stat_at(OsStr::new(&name)) else {
                continue;
            };
            let path = dir.path().join(&name);
            if let Err(why) = ours(&st, me) {
                eprintln!(
                    "heapdump: warning: {}: {why}: not written by this heapdump's spool, so \
                     never pushed (left in place)",
                    path.display()
                );
                continue;
            }
            left.push((
                seq,
                Stored {
                    path,
                    dir: dir.clone(),
                    name,
                    bytes: st.st_size as u64,
                },
            ));
        }
        left.sort_by_key(|(s, _)| *s);
        let next_seq = last_seq + 1;
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
        self.dir.path()
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
        let name = format!("{:012}.hdpush", self.next_seq);
        self.next_seq += 1;
        self.dir
            .write_atomic(OsStr::new(&name), |w| w.write_all(bytes))?;
        Ok(Stored {
            path: self.dir.path().join(&name),
            dir: self.dir.clone(),
            name,
            bytes: bytes.len() as u64,
        })
    }

    /// Reads a spooled profile back (through the spool's descriptor, without following a
    /// link), checking again that it is this collector's own ([`Spool::open`]'s rule).
    ///
    /// Errors: the file cannot be read (or is a symlink), is not ours, is larger than 1 GiB,
    /// is not a [`Record`], or is of another version.
    pub fn load(s: &Stored) -> Result<Item> {
        use prost::Message;
        use std::io::Read;
        use std::os::unix::fs::MetadataExt;
        let f = s
            .dir
            .open_at(OsStr::new(&s.name), libc::O_RDONLY | libc::O_NONBLOCK, 0)?;
        let md = f
            .metadata()
            .with_context(|| format!("cannot stat {}", s.path.display()))?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if !md.is_file() || md.uid() != me || md.mode() & 0o022 != 0 {
            bail!(
                "{}: not a regular file of yours alone (uid {}, mode {:o}): never pushed",
                s.path.display(),
                md.uid(),
                md.mode() & 0o7777
            );
        }
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
        s.dir.remove(OsStr::new(&s.name))
    }
}

/// Whether a spool file (its `fstatat`) is one this collector (effective uid `me`) wrote: a
/// regular file, owned by `me`, not writable by group or others. `Err`: why not.
fn ours(st: &libc::stat, me: u32) -> Result<(), String> {
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err("not a regular file".into());
    }
    if st.st_uid != me {
        return Err(format!("owned by uid {}, not by you (uid {me})", st.st_uid));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(format!(
            "writable by other users (mode {:o})",
            st.st_mode & 0o7777
        ));
    }
    Ok(())
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
        let out = Dir::open(d.path(), crate::outdir::Create::No).unwrap();
        {
            let (mut s, left) = Spool::open(&out, 1 << 20).unwrap();
            assert!(left.is_empty());
            // Held: a second watch cannot use it meanwhile.
            let e = Spool::open(&out, 1 << 20).unwrap_err();
            assert!(e.to_string().contains("in use"), "{e}");
            for n in 1..=11 {
                s.store(&Spool::encode(&item(n))).unwrap();
            }
            std::fs::remove_file(d.path().join(".spool/000000000001.hdpush")).unwrap();
        }
        std::fs::write(d.path().join(".spool/notes.txt"), b"x").unwrap();
        let (mut s, left) = Spool::open(&out, 1 << 20).unwrap();
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
        let out = Dir::open(d.path(), crate::outdir::Create::No).unwrap();
        let e = Spool::open(&out, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
    }
}
