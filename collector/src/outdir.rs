//! Output directories opened once, without following a link, and written through their
//! descriptor: `--contents-dir`, `watch -o DIR`, its spool (`DIR/.spool`) and the directory of
//! `-o FILE`.
//!
//! A path is checked once, when [`Dir::open`] opens it with `O_DIRECTORY | O_NOFOLLOW`: its
//! last component must be a directory, not a symbolic link (trailing slashes and `/.` are
//! removed first: the kernel follows a link named `LINK/` whatever `O_NOFOLLOW` says). Every
//! file is then created, renamed, listed and removed relative to that descriptor (`openat`,
//! `renameat`, `unlinkat`, `fstatat`), so swapping the path for a link afterwards changes
//! nothing. Files are created `O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600.

use anyhow::{bail, Context, Result};
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// An open output directory.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

/// Whether [`Dir::open`] creates a missing directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Create {
    /// It must exist.
    No,
    /// Created with mode 0700 (its parent must exist).
    Last,
    /// Created with mode 0700, missing parents too.
    WithParents,
}

/// `path` without trailing slashes and `/.` components at its end (`"dir/./"` → `"dir"`);
/// `"/"` and `"."` stay as they are.
pub fn strip_trailing(path: &Path) -> PathBuf {
    let mut b = path.as_os_str().as_bytes();
    loop {
        if b.len() > 1 && b.ends_with(b"/") {
            b = &b[..b.len() - 1];
        } else if b.len() > 2 && b.ends_with(b"/.") {
            b = &b[..b.len() - 2];
        } else {
            break;
        }
    }
    PathBuf::from(OsStr::from_bytes(b))
}

fn cstr(s: &OsStr, what: &Path) -> Result<CString> {
    CString::new(s.as_bytes())
        .with_context(|| format!("{}: a path with a NUL byte", what.display()))
}

impl Dir {
    /// Opens the directory `path` (creating it as `create` says) without following a symbolic
    /// link in its last component, trailing slash or not.
    ///
    /// Errors: it is a symbolic link, exists and is not a directory, is absent (with
    /// [`Create::No`]), or cannot be created or opened.
    pub fn open(path: &Path, create: Create) -> Result<Dir> {
        let p = strip_trailing(path);
        let c = cstr(p.as_os_str(), path)?;
        if create != Create::No {
            if create == Create::WithParents {
                if let Some(parent) = p.parent().filter(|q| !q.as_os_str().is_empty()) {
                    use std::os::unix::fs::DirBuilderExt;
                    std::fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o700)
                        .create(parent)
                        .with_context(|| {
                            format!("cannot create the directory {}", parent.display())
                        })?;
                }
            }
            // SAFETY: a NUL-terminated path. mkdir never follows a link in the last component
            // (a link there, dangling or not, is EEXIST and refused by the open below).
            if unsafe { libc::mkdir(c.as_ptr(), 0o700) } != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EEXIST) {
                    return Err(e).with_context(|| {
                        format!("cannot create the directory {}", path.display())
                    });
                }
            }
        }
        // SAFETY: a NUL-terminated path; the last component is not followed if a link.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            let link = std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink());
            if link {
                bail!(
                    "{}: is a symbolic link; refusing to write through it (give the directory \
                     it leads to)",
                    path.display()
                );
            }
            if e.raw_os_error() == Some(libc::ENOTDIR) {
                bail!("{}: exists and is not a directory", path.display());
            }
            return Err(e).with_context(|| format!("cannot open the directory {}", path.display()));
        }
        Ok(Dir {
            // SAFETY: `fd` was just opened and is owned by nothing else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            path: path.to_owned(),
        })
    }

    /// The path it was opened by (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The descriptor.
    pub fn fd(&self) -> libc::c_int {
        self.fd.as_raw_fd()
    }

    /// The subdirectory `name` (created, mode 0700, when `create`), opened as [`Dir::open`]
    /// does: a link there is refused.
    pub fn subdir(&self, name: &str, create: bool) -> Result<Dir> {
        let path = self.path.join(name);
        let c = cstr(OsStr::new(name), &path)?;
        if create {
            // SAFETY: an open directory and a NUL-terminated name.
            if unsafe { libc::mkdirat(self.fd(), c.as_ptr(), 0o700) } != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EEXIST) {
                    return Err(e).with_context(|| {
                        format!("cannot create the directory {}", path.display())
                    });
                }
            }
        }
        // SAFETY: as above; the name is not followed if a link.
        let fd = unsafe {
            libc::openat(
                self.fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) {
                bail!(
                    "{} is not a directory (a symbolic link is not followed)",
                    path.display()
                );
            }
            return Err(e).with_context(|| format!("cannot open the directory {}", path.display()));
        }
        Ok(Dir {
            // SAFETY: `fd` was just opened and is owned by nothing else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            path,
        })
    }

    /// `fstat` of the directory itself.
    pub fn stat(&self) -> Result<libc::stat> {
        // SAFETY: a zeroed stat is valid; fstat fills it for an open descriptor.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(self.fd(), &mut st) != 0 {
                return Err(std::io::Error::last_os_error())
                    .with_context(|| format!("cannot stat {}", self.path.display()));
            }
            Ok(st)
        }
    }

    /// `fstatat` of `name` without following a link; `None` when absent.
    pub fn stat_at(&self, name: &OsStr) -> Result<Option<libc::stat>> {
        let c = cstr(name, &self.path.join(name))?;
        // SAFETY: a zeroed stat is valid; fstatat fills it; the name is NUL-terminated.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstatat(self.fd(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ENOENT) {
                    return Ok(None);
                }
                return Err(e)
                    .with_context(|| format!("cannot stat {}", self.path.join(name).display()));
            }
            Ok(Some(st))
        }
    }

    /// The names in the directory (not `.` and `..`), read through its descriptor.
    pub fn names(&self) -> Result<Vec<OsString>> {
        Ok(std::fs::read_dir(format!("/proc/self/fd/{}", self.fd()))
            .with_context(|| format!("cannot list {}", self.path.display()))?
            .flatten()
            .map(|e| e.file_name())
            .collect())
    }

    /// Opens the file `name` with `flags` (`O_NOFOLLOW | O_CLOEXEC` added) and `mode`.
    pub fn open_at(&self, name: &OsStr, flags: libc::c_int, mode: u32) -> Result<std::fs::File> {
        let c = cstr(name, &self.path.join(name))?;
        // SAFETY: an open directory, a NUL-terminated name; a link there is refused.
        let fd = unsafe {
            libc::openat(
                self.fd(),
                c.as_ptr(),
                flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("cannot open {}", self.path.join(name).display()));
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        Ok(unsafe { std::fs::File::from_raw_fd(fd) })
    }

    /// Creates the new file `name`: `O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600 (nothing planted
    /// under that name is ever followed or reused).
    pub fn create(&self, name: &str) -> Result<std::fs::File> {
        self.open_at(
            OsStr::new(name),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o600,
        )
    }

    /// Removes the file `name`; an absent one is not an error.
    pub fn remove(&self, name: &OsStr) -> Result<()> {
        let c = cstr(name, &self.path.join(name))?;
        // SAFETY: an open directory, a NUL-terminated name.
        if unsafe { libc::unlinkat(self.fd(), c.as_ptr(), 0) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOENT) {
                return Err(e)
                    .with_context(|| format!("cannot remove {}", self.path.join(name).display()));
            }
        }
        Ok(())
    }

    /// Writes the file `name` atomically: `encode` writes a new temporary file
    /// (`.NAME.RANDOM.tmp`, [`Dir::create`]) which is then renamed over `name` (`renameat`);
    /// on failure the temporary file is removed.
    pub fn write_atomic(
        &self,
        name: &OsStr,
        encode: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
    ) -> Result<()> {
        use std::io::Write;
        let target = self.path.join(name);
        let mut tmp = None;
        for _ in 0..100 {
            let t = format!(".{}.{:016x}.tmp", name.to_string_lossy(), random_u64());
            match self.create(&t) {
                Ok(f) => {
                    tmp = Some((t, f));
                    break;
                }
                Err(e)
                    if e.downcast_ref::<std::io::Error>()
                        .is_some_and(|e| e.kind() == std::io::ErrorKind::AlreadyExists) =>
                {
                    continue
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("cannot create a temporary file in {}", self.path.display())
                    })
                }
            }
        }
        let Some((t, f)) = tmp else {
            bail!("cannot create a temporary file in {}", self.path.display());
        };
        let mut w = std::io::BufWriter::new(f);
        let written = encode(&mut w).and_then(|()| w.flush());
        drop(w);
        if let Err(e) = written {
            let _ = self.remove(OsStr::new(&t));
            return Err(e).with_context(|| format!("cannot write {}", target.display()));
        }
        let (ct, cn) = (cstr(OsStr::new(&t), &target)?, cstr(name, &target)?);
        // SAFETY: both names are NUL-terminated and relative to our open directory.
        if unsafe { libc::renameat(self.fd(), ct.as_ptr(), self.fd(), cn.as_ptr()) } != 0 {
            let e = std::io::Error::last_os_error();
            let _ = self.remove(OsStr::new(&t));
            return Err(e)
                .with_context(|| format!("cannot rename the file to {}", target.display()));
        }
        Ok(())
    }
}

/// A random number for temporary names (`getrandom`; the time as a fallback).
fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: `b` is writable for its length.
    let n = unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, b.len(), 0) };
    if n == 8 {
        u64::from_ne_bytes(b)
    } else {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            ^ u64::from(std::process::id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailing_slashes_and_dots_are_stripped() {
        let s = |p: &str| strip_trailing(Path::new(p)).display().to_string();
        assert_eq!(s("a/"), "a");
        assert_eq!(s("a//"), "a");
        assert_eq!(s("a/./"), "a");
        assert_eq!(s("a/."), "a");
        assert_eq!(s("/"), "/");
        assert_eq!(s("."), ".");
        assert_eq!(s("./"), ".");
        assert_eq!(s("/a/b"), "/a/b");
    }

    #[test]
    fn links_are_refused_with_or_without_a_slash() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("target");
        std::fs::create_dir(&target).unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        for p in ["link", "link/", "link//", "link/."] {
            let e = Dir::open(&d.path().join(p), Create::WithParents).unwrap_err();
            assert!(e.to_string().contains("symbolic link"), "{p}: {e}");
        }
        let dir = Dir::open(&d.path().join("new/sub/"), Create::WithParents).unwrap();
        dir.write_atomic(OsStr::new("f"), |w| w.write_all(b"x"))
            .unwrap();
        assert_eq!(std::fs::read(d.path().join("new/sub/f")).unwrap(), b"x");
        assert_eq!(dir.names().unwrap(), [OsString::from("f")]);
        assert!(std::fs::read_dir(&target).unwrap().next().is_none());
    }
}
