//! Finding and opening region files safely.
//!
//! Regions live in `$HEAPDUMP_DIR` or `/dev/shm/heapdump-UID`, named
//! `PID-STARTTICKS-CREATEDNS.heapdump` (the rule is `vmo_layout::name`'s). A region is opened
//! without following symlinks, must be a regular file owned by the caller (unless the caller is
//! root) and not readable by others; then mapped and validated by [`vmo_layout::Region`].

use anyhow::{bail, Context, Result};
use memmap2::{MmapOptions, MmapRaw};
use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use vmo_layout::{Region, RegionInfo};

/// The region directory for this user: `$HEAPDUMP_DIR`, else `/dev/shm/heapdump-UID`; when
/// that directory is not private to this user (another owner, or group/other permission bits,
/// as `/tmp`), its subdirectory `heapdump-UID`, as the shim chooses
/// (`instrumentation/src/region.rs`, `ensure_dir`): the shim never changes the mode of a
/// directory.
pub fn region_dir() -> PathBuf {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let d = match std::env::var_os("HEAPDUMP_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(format!("/dev/shm/heapdump-{uid}")),
    };
    match std::fs::symlink_metadata(&d) {
        Ok(m) if m.is_dir() && (m.uid() != uid || m.mode() & 0o077 != 0) => {
            d.join(format!("heapdump-{uid}"))
        }
        _ => d,
    }
}

/// A region file found by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionFile {
    /// Path of the file.
    pub path: PathBuf,
    /// Pid from the name.
    pub pid: u32,
    /// Process start time (clock ticks) from the name.
    pub start_ticks: u64,
    /// Creation time (CLOCK_MONOTONIC ns) from the name.
    pub created_ns: u64,
}

/// Checks that the region directory `dir` can be trusted, as the shim requires of the
/// directory it writes to: a directory (not a symlink to one), owned by the effective uid or
/// by root (any owner when the collector runs as root), writable by no one else (no group or
/// other write permission: the shim creates it 0700), in a parent directory owned by the
/// effective uid or root and writable by others only if sticky. Otherwise anyone could plant
/// files in it — a FIFO, a crafted region — or replace the ones there.
///
/// Returns `Ok(false)` when `dir` does not exist. Errors: any other problem, with the fix.
pub fn check_dir(dir: &Path) -> Result<bool> {
    let md = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("cannot stat {}", dir.display())),
    };
    if md.file_type().is_symlink() {
        bail!(
            "region directory {} is a symlink; refusing to follow it (set HEAPDUMP_DIR to the real directory)",
            dir.display()
        );
    }
    if !md.is_dir() {
        bail!("region directory {} is not a directory", dir.display());
    }
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    // A directory root did not name but heapdump chose — the default `/dev/shm/heapdump-0`,
    // or `heapdump-0` inside a shared HEAPDUMP_DIR (see `region_dir`) — that another user
    // created first: the shim refuses it (root's programs record nothing there) and its owner
    // controls what is in it. Another user's directory root names with HEAPDUMP_DIR itself is
    // read, as documented.
    let named = std::env::var_os("HEAPDUMP_DIR").filter(|d| !d.is_empty());
    let chosen = named.is_none_or(|d| Path::new(&d) != dir);
    if euid == 0 && chosen && md.uid() != 0 {
        bail!(
            "region directory {} is owned by uid {}, not by root: another user created it, \
             and root's programs cannot record there; remove it (`rm -r {}`) or set \
             HEAPDUMP_DIR",
            dir.display(),
            md.uid(),
            dir.display()
        );
    }
    if euid != 0 && md.uid() != euid && md.uid() != 0 {
        bail!(
            "region directory {} is owned by uid {}, not by you (uid {euid}); refusing to trust it",
            dir.display(),
            md.uid()
        );
    }
    if md.mode() & 0o022 != 0 {
        bail!(
            "region directory {} is writable by other users (mode {:o}); refusing to trust it \
             (the shim creates it with mode 700: `chmod 700 {}`, or set HEAPDUMP_DIR)",
            dir.display(),
            md.mode() & 0o7777,
            dir.display()
        );
    }
    // Whoever may rename entries of the parent can swap the directory itself (e.g. a
    // `heapdump-UID` subdirectory another user created in a shared directory): the parent
    // must be ours or root's, and others may write to it only if it is sticky (as /dev/shm,
    // /tmp).
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let pm =
        std::fs::metadata(parent).with_context(|| format!("cannot stat {}", parent.display()))?;
    let owner_ok = euid == 0 || pm.uid() == euid || pm.uid() == 0;
    let sticky = pm.mode() & libc::S_ISVTX != 0;
    if !owner_ok || (pm.mode() & 0o022 != 0 && !sticky) {
        bail!(
            "region directory {} is in {} (owner uid {}, mode {:o}), which other users may \
             write to: they could replace it; refusing to trust it (set HEAPDUMP_DIR to a \
             private directory)",
            dir.display(),
            parent.display(),
            pm.uid(),
            pm.mode() & 0o7777
        );
    }
    Ok(true)
}

/// Region files in `dir`, oldest first; an absent directory is an empty list.
///
/// Errors: the directory fails [`check_dir`], or cannot be read.
pub fn list_files(dir: &Path) -> Result<Vec<RegionFile>> {
    if !check_dir(dir)? {
        return Ok(Vec::new());
    }
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name();
        if let Some(n) = vmo_layout::name::parse(name.as_encoded_bytes()) {
            out.push(RegionFile {
                path: e.path(),
                pid: n.pid,
                start_ticks: n.start_ticks,
                created_ns: n.created_ns,
            });
        }
    }
    out.sort_by_key(|r| (r.created_ns, r.pid));
    Ok(out)
}

/// An open, mapped region file.
#[derive(Debug)]
pub struct Opened {
    /// Path it was opened from.
    pub path: PathBuf,
    /// The open file (kept for `flock`).
    pub file: File,
    map: MmapRaw,
    writable: bool,
    /// The mapping's slot in [`truncation`] (SIGBUS recovery), if one was free.
    guard: Option<usize>,
    /// The file's owner (uid) and mode, from `fstat` of the open file.
    owner: u32,
    mode: u32,
    /// Its directory's owner and mode, from `fstat` of the directory it was opened in.
    dir_owner: u32,
    dir_mode: u32,
    /// The process (pid, start ticks) the header named when [`trust`] accepted it
    /// ([`open_usable`]): the header is the writer's to change afterwards.
    checked: std::sync::OnceLock<(u32, u64)>,
}

impl Opened {
    /// The process (pid, start ticks) the header named when it was trusted ([`open_usable`]),
    /// if it was checked.
    pub fn checked(&self) -> Option<(u32, u64)> {
        self.checked.get().copied()
    }

    /// Whether the process the region was trusted for is still running as it was: not gone,
    /// not a zombie, its pid not reused. `true` when it was not checked.
    pub fn still_checked_process(&self) -> bool {
        self.checked().is_none_or(|(pid, ticks)| {
            proc_start_ticks(pid) == Some(ticks)
                && !matches!(proc_state(pid), None | Some('Z' | 'X'))
        })
    }

    /// The validated region view (reads only the parts of the file that hold data, see
    /// [`Region::with_file`]).
    pub fn region(&self) -> Result<Region<'_>> {
        use std::os::fd::AsFd;
        // SAFETY: the mapping lives as long as `self` (the borrow ties the view to it), is
        // page-aligned, and is writable exactly when `writable` is set.
        let r =
            unsafe { Region::from_raw(self.map.as_ptr(), self.map.len() as u64, self.writable) };
        Ok(r.with_context(|| format!("{}", self.path.display()))?
            .with_file(self.file.as_fd()))
    }

    /// Whether the file was truncated under the mapping since it was opened (the reads past
    /// the new end then saw zeros instead of killing the collector with SIGBUS, see
    /// [`truncation`]): the text of the error to report, or `None`.
    pub fn truncated(&self) -> Option<String> {
        let now = self.file.metadata().map(|m| m.len()).unwrap_or(0);
        let hit = self.guard.is_some_and(truncation::hit);
        (hit || now < self.map.len() as u64).then(|| {
            format!(
                "{}: the region was truncated while being read ({} bytes mapped, {now} now); \
                 nothing it showed can be trusted",
                self.path.display(),
                self.map.len()
            )
        })
    }
}

impl Opened {
    /// Whether the region could be mapped writable (needed for a live snapshot's lease).
    pub fn writable(&self) -> bool {
        self.writable
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        if let Some(slot) = self.guard.take() {
            truncation::unregister(slot);
        }
    }
}

/// Surviving a region file truncated while it is mapped (by its owner, or anyone who can write
/// it): touching a page past the new end of file raises SIGBUS, which would kill the
/// collector. Checking the size before and after a read cannot prevent that, and reading
/// everything with `pread` would lose the atomic loads the snapshot protocol needs, so a
/// SIGBUS handler recovers instead: when the faulting address lies in a registered region
/// mapping, it maps anonymous zero pages (`MAP_FIXED | MAP_NORESERVE`: no memory committed)
/// over the rest of that mapping from the faulting page on, marks the mapping, and returns;
/// the faulting load is retried and reads zeros (empty records, never live). The caller then
/// reports the truncation ([`Opened::truncated`]). A SIGBUS anywhere else gets the default
/// action (the process dies, as without the handler).
pub mod truncation {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    const SLOTS: usize = 8;
    static START: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
    static END: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
    static HIT: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];
    static PAGE: AtomicUsize = AtomicUsize::new(4096);
    static INSTALL: std::sync::Once = std::sync::Once::new();

    extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
        let addr = unsafe { (*info).si_addr() } as usize;
        let page = PAGE.load(Ordering::Relaxed);
        for i in 0..SLOTS {
            let (start, end) = (
                START[i].load(Ordering::SeqCst),
                END[i].load(Ordering::SeqCst),
            );
            if start == 0 || addr < start || addr >= end {
                continue;
            }
            let from = addr & !(page - 1);
            // SAFETY: replaces pages of our own mapping [from, end) (registered by `Opened`,
            // which unregisters before unmapping) with anonymous zero pages; mmap is a plain
            // system call, safe in a signal handler.
            let r = unsafe {
                libc::mmap(
                    from as *mut libc::c_void,
                    end - from,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if r != libc::MAP_FAILED {
                HIT[i].store(true, Ordering::SeqCst);
                return;
            }
        }
        // Not ours (or the remap failed): die of it as without this handler.
        // SAFETY: signal is async-signal-safe; returning retries the access, which faults
        // again with the default action.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }

    /// Registers the mapping `[start, start + len)`; installs the handler on first use.
    /// Returns the slot, or `None` when all are taken (the mapping is then unprotected).
    pub fn register(start: usize, len: usize) -> Option<usize> {
        INSTALL.call_once(|| {
            // SAFETY: sysconf has no preconditions.
            let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            if p > 0 {
                PAGE.store(p as usize, Ordering::Relaxed);
            }
            use crate::signals::{self, Handler};
            // SAFETY: the handler is async-signal-safe (atomics and mmap).
            let _ =
                unsafe { signals::set(libc::SIGBUS, Handler::Info(on_sigbus), libc::SA_NODEFER) };
        });
        for i in 0..SLOTS {
            if START[i]
                .compare_exchange(0, usize::MAX, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                HIT[i].store(false, Ordering::SeqCst);
                END[i].store(start + len, Ordering::SeqCst);
                START[i].store(start, Ordering::SeqCst);
                return Some(i);
            }
        }
        None
    }

    /// Whether a truncation was met in `slot`'s mapping.
    pub fn hit(slot: usize) -> bool {
        HIT[slot].load(Ordering::SeqCst)
    }

    /// Forgets `slot` (before its mapping is unmapped).
    pub fn unregister(slot: usize) {
        END[slot].store(0, Ordering::SeqCst);
        START[slot].store(0, Ordering::SeqCst);
    }
}

/// Opens and maps a region file, refusing symlinks, non-regular files, files owned by someone
/// else (unless we are root) and files others can read.
///
/// The directory is opened first and the file relative to it (`openat`), both `fstat`ed: the
/// owners and modes kept in [`Opened`] (for [`trust`]) are those of the objects actually read,
/// not of whatever a path names a moment later. The file is opened with
/// `O_NOFOLLOW | O_NONBLOCK` and checked before anything reads it: a FIFO or device planted
/// under a region's name is refused at once instead of blocking the open (or the first read)
/// forever.
pub fn open(path: &Path) -> Result<Opened> {
    use std::ffi::CString;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let Some(name) = path.file_name() else {
        bail!("{}: not a file name", path.display());
    };
    let cparent = CString::new(parent.as_os_str().as_encoded_bytes())
        .with_context(|| format!("{}: a path with a NUL byte", path.display()))?;
    let cname = CString::new(name.as_encoded_bytes())
        .with_context(|| format!("{}: a path with a NUL byte", path.display()))?;
    // SAFETY: a NUL-terminated path; O_PATH opens the directory without reading it.
    let dfd = unsafe {
        libc::open(
            cparent.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if dfd < 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("cannot open the directory {}", parent.display()));
    }
    // SAFETY: `dfd` was just opened and is owned by nothing else.
    let dir = unsafe { OwnedFd::from_raw_fd(dfd) };
    let dir_md =
        fstat(dir.as_raw_fd()).with_context(|| format!("cannot stat {}", parent.display()))?;
    let open = |write: bool| -> std::io::Result<File> {
        let acc = if write { libc::O_RDWR } else { libc::O_RDONLY };
        // SAFETY: `dir` is an open directory, `cname` a NUL-terminated name.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                cname.as_ptr(),
                acc | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        Ok(unsafe { File::from_raw_fd(fd) })
    };
    let (file, writable) = match open(true) {
        Ok(f) => (f, true),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            bail!(
                "{}: refusing to follow a symlink to a region",
                path.display()
            )
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("{}: no such region file", path.display())
        }
        Err(_) => match open(false) {
            Ok(f) => (f, false),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                bail!(
                    "{}: refusing to follow a symlink to a region",
                    path.display()
                )
            }
            Err(e) => return Err(e).with_context(|| format!("cannot open {}", path.display())),
        },
    };
    let md = file
        .metadata()
        .with_context(|| format!("cannot stat {}", path.display()))?;
    if !md.file_type().is_file() {
        bail!(
            "{}: not a regular file ({}); refusing to read it as a region",
            path.display(),
            file_kind(&md)
        );
    }
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if md.uid() != euid && euid != 0 {
        bail!(
            "{}: region owned by uid {}, not by you (uid {euid}); run as that user or as root",
            path.display(),
            md.uid()
        );
    }
    if md.mode() & 0o077 != 0 {
        bail!(
            "{}: region is accessible to other users (mode {:o}); refusing to trust it",
            path.display(),
            md.mode() & 0o777
        );
    }
    if md.len() < vmo_layout::v1::HEADER_SIZE as u64 {
        bail!(
            "{}: file is not a heapdump region (too small)",
            path.display()
        );
    }
    let map = if writable {
        MmapOptions::new().map_raw(&file)
    } else {
        MmapOptions::new().map_raw_read_only(&file)
    }
    .with_context(|| format!("cannot map {}", path.display()))?;
    let guard = truncation::register(map.as_ptr() as usize, map.len());
    Ok(Opened {
        path: path.to_owned(),
        file,
        map,
        writable,
        guard,
        owner: md.uid(),
        mode: md.mode(),
        dir_owner: dir_md.st_uid,
        dir_mode: dir_md.st_mode,
        checked: std::sync::OnceLock::new(),
    })
}

/// `fstat` of a descriptor.
fn fstat(fd: libc::c_int) -> std::io::Result<libc::stat> {
    // SAFETY: a zeroed stat is valid; fstat fills it for an open descriptor.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(st)
    }
}

/// The real, effective and saved user ids of a running process (the `Uid:` line of
/// `/proc/PID/status`), `None` when it is gone.
pub fn proc_uids(pid: u32) -> Option<[u32; 3]> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    let mut it = line.split_whitespace().map(|v| v.parse::<u32>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// `uid 1000 (alice)`: a uid with its name from `/etc/passwd` when it has one.
pub fn user(uid: u32) -> String {
    let name = std::fs::read_to_string("/etc/passwd").ok().and_then(|p| {
        p.lines().find_map(|l| {
            let mut f = l.split(':');
            let (n, _, u) = (f.next()?, f.next()?, f.next()?);
            (u.parse::<u32>().ok()? == uid).then(|| n.to_owned())
        })
    });
    match name {
        Some(n) => format!("uid {uid} ({n})"),
        None => format!("uid {uid}"),
    }
}

/// The trust rule (README, "Security model"): the memory of process P is read only through a
/// region that P's owner could have written. A region is *foreign* — refused by every
/// command, shown as `foreign` by `list` — when the process it names runs now (its pid and
/// start time) and
///
/// * its file name and header disagree on that identity (pid, start time), or
/// * the region file is not owned by P's uid (P's real, effective and saved uids all equal to
///   the file's owner; a root-owned region only for a process whose effective uid is root), or
/// * its directory is not owned by that same uid, or is writable by group or others, or
/// * P is not dumpable (its `/proc/PID/mem` is not owned by that uid): its owner could not
///   read its memory either.
///
/// So a region planted by one user, in a directory of theirs or in the one root uses, never
/// makes a root collector read another user's process. A region whose process is gone names
/// no memory: it is never foreign (read post-mortem as it is).
///
/// Returns `Err(one line)` naming the file, its owner and the process when foreign. `f`: the
/// region's file name, when it has one of the region's form.
pub fn trust(o: &Opened, info: &RegionInfo, f: Option<&RegionFile>) -> Result<(), String> {
    let refuse = |why: String| {
        Err(format!(
            "{}: foreign region ({why}); refusing to read pid {}'s memory through it \
             (see README, Security model)",
            o.path.display(),
            info.pid
        ))
    };
    if let Some(f) = f {
        if (f.pid, f.start_ticks) != (info.pid, info.start_ticks) {
            // Either identity may name a running process: check both.
            let running = |pid, ticks| proc_start_ticks(pid) == Some(ticks);
            if running(f.pid, f.start_ticks) || running(info.pid, info.start_ticks) {
                return refuse(format!(
                    "its name says pid {} started at {} but its header pid {} started at {}",
                    f.pid, f.start_ticks, info.pid, info.start_ticks
                ));
            }
        }
    }
    if proc_start_ticks(info.pid) != Some(info.start_ticks) {
        return Ok(()); // gone: nothing of it is read but the region
    }
    let Some([ruid, euid, suid]) = proc_uids(info.pid) else {
        return Ok(()); // gone meanwhile
    };
    let owner = o.owner;
    if owner != euid || (owner != 0 && (ruid != owner || suid != owner)) {
        return refuse(format!(
            "owned by {}, but pid {} runs as {}",
            user(owner),
            info.pid,
            user(euid)
        ));
    }
    if o.dir_owner != owner {
        return refuse(format!(
            "owned by {}, in a directory owned by {}",
            user(owner),
            user(o.dir_owner)
        ));
    }
    if o.dir_mode & 0o022 != 0 || o.mode & 0o022 != 0 {
        return refuse(format!(
            "owned by {}, but it or its directory is writable by other users",
            user(owner)
        ));
    }
    // A process that is not dumpable (it dropped privileges, or called
    // `prctl(PR_SET_DUMPABLE, 0)`: ssh-agent, a daemon's workers) keeps its memory from its
    // own uid: the kernel gives its `/proc/PID` files to root (proc(5), PR_SET_DUMPABLE). Its
    // owner could not read it, so a region of theirs does not make root read it (helper Q, 3:
    // a secret of a root daemon turned `nobody` was read into root's profile).
    if owner != 0 {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(format!("/proc/{}/mem", info.pid)) {
            Ok(m) if m.uid() == owner => {}
            Ok(_) => {
                return refuse(format!(
                    "owned by {}, but pid {} is not dumpable: its memory is closed to that user",
                    user(owner),
                    info.pid
                ))
            }
            Err(_) => return Ok(()), // gone meanwhile
        }
    }
    Ok(())
}

/// A region opened for a command: the file, its header, what became of its process.
#[derive(Debug)]
pub struct Usable {
    /// The open region.
    pub opened: Opened,
    /// Its header.
    pub info: RegionInfo,
    /// What became of its process.
    pub liveness: Liveness,
}

/// The one way every command opens the region it reads (`snapshot`, `leaks`, `retainers`,
/// `top`, `graph`, `watch`, `--multi-process`): [`open`], the header, [`liveness`] and the
/// trust rule ([`trust`]). `f`: the region as found in the region directory; `None` for
/// `--region FILE`, whose name is then parsed (a file without a region's name is read
/// post-mortem only).
///
/// Errors: the file cannot be opened or read as a region; it is foreign (one line naming
/// its owner and the process).
pub fn open_usable(path: &Path, f: Option<&RegionFile>) -> Result<Usable> {
    let opened = open(path)?;
    let info = opened.region()?.info();
    let file = match f {
        Some(f) => Some(f.clone()),
        None => path
            .file_name()
            .and_then(|n| vmo_layout::name::parse(n.as_encoded_bytes()))
            .map(|n| RegionFile {
                path: path.to_owned(),
                pid: n.pid,
                start_ticks: n.start_ticks,
                created_ns: n.created_ns,
            }),
    };
    if let Err(line) = trust(&opened, &info, file.as_ref()) {
        bail!("{line}");
    }
    let _ = opened.checked.set((info.pid, info.start_ticks));
    let liveness = match (&file, f) {
        (Some(rf), Some(_)) => {
            let files = list_files(&region_dir()).unwrap_or_default();
            liveness(&info, rf, has_newer(&files, rf))
        }
        (Some(rf), None) => liveness(&info, rf, false),
        (None, _) => Liveness::Exited,
    };
    Ok(Usable {
        opened,
        info,
        liveness,
    })
}

/// "FIFO", "directory", … for a message.
pub fn file_kind(md: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = md.file_type();
    if t.is_fifo() {
        "a FIFO"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_symlink() {
        "a symlink"
    } else {
        "not a regular file"
    }
}

/// Whether `path` names a regular file, checked without blocking and without reading it:
/// opened with `O_NONBLOCK` (a FIFO does not wait for a writer) and `fstat`ed. Symlinks are
/// followed (shared libraries are commonly reached through one, e.g. `libstdc++.so.6`); what
/// they lead to must be a regular file.
///
/// Returns `Ok(None)` for a regular file, `Ok(Some(kind))` ("a FIFO", …) otherwise. Errors:
/// it cannot be opened (absent, no permission).
pub fn non_regular(path: &Path) -> std::io::Result<Option<&'static str>> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)?;
    let md = f.metadata()?;
    Ok((!md.is_file()).then(|| file_kind(&md)))
}

/// The whole of `path` when it is a regular file of at most `max` bytes: opened without
/// blocking (a FIFO a profiled program put in a library's place would block for ever) and
/// read no further than its size said (a device such as `/dev/zero` would never end).
///
/// Errors: the open or read fails; not a regular file (`InvalidInput`); larger than `max`.
pub fn read_regular(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let f = open_regular(path)?;
    let md = f.metadata()?;
    if md.len() > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} bytes, more than the {max} read at most", md.len()),
        ));
    }
    let mut data = Vec::with_capacity(md.len() as usize);
    f.take(md.len()).read_to_end(&mut data)?;
    Ok(data)
}

/// Opens `path` for reading only if it is a regular file, without blocking: opened
/// `O_NONBLOCK` (a FIFO with no writer, or one another user swapped in for the file after a
/// check by name, does not hang the open) and checked on the descriptor (`fstat`), so what is
/// read is what was checked. The files heapdump reads as input (profiles, captures) go through
/// here.
///
/// Errors: the open's, or `InvalidInput` naming what it is instead ("a FIFO, not a regular
/// file").
pub fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)?;
    let md = f.metadata()?;
    if !md.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{}, not a regular file", file_kind(&md)),
        ));
    }
    Ok(f)
}

/// Most bytes of an object file (a library, an executable) heapdump reads whole.
pub const MAX_OBJECT_BYTES: u64 = 1 << 30;

/// What became of the process that wrote a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Running this image.
    Alive,
    /// Gone (crashed, killed, exited without cleanup, or exec'd another image).
    Exited,
    /// Exited but not yet reaped by its parent: its pid and `/proc` entry remain, its memory
    /// is gone (read post-mortem, as an exited one).
    Zombie,
    /// Running, but `heapdump detach` stopped its recording: the region holds the heap as it
    /// was at the detach (read as an exited one's), and `heapdump attach` may resume it.
    Detached,
}

impl Liveness {
    /// `"alive"`, `"exited"`, `"zombie"` or `"detached"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Liveness::Alive => "alive",
            Liveness::Exited => "exited",
            Liveness::Zombie => "zombie",
            Liveness::Detached => "detached",
        }
    }

    /// For "pid N ...": `"is running"`, `"has exited"`, `"is a zombie (exited, not reaped)"`,
    /// `"is detached (heapdump detach)"`.
    pub fn gone(self) -> &'static str {
        match self {
            Liveness::Alive => "is running",
            Liveness::Exited => "has exited",
            Liveness::Zombie => "is a zombie (exited, not reaped)",
            Liveness::Detached => "is detached (heapdump detach)",
        }
    }

    /// Why a command that reads the program's memory (the reference graph, block contents)
    /// cannot use this region: `"pid N has exited: a post-mortem region records blocks but
    /// not their contents, so WHAT"`, or for a detached process that its region is the heap
    /// of the detach.
    pub fn why_no_memory(self, pid: u32, what: &str) -> String {
        match self {
            Liveness::Detached => format!(
                "pid {pid} is detached (heapdump detach): its region holds the heap as it was \
                 at the detach, not the blocks live now, so {what}; attach again \
                 (heapdump attach --by-pid {pid}) first"
            ),
            _ => format!(
                "pid {pid} {}: a post-mortem region records blocks but not their contents, so \
                 {what}",
                self.gone()
            ),
        }
    }
}

/// The state letter (field 3 of `/proc/PID/stat`: `R`, `S`, `Z`, ...) of a process.
pub fn proc_state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s[s.rfind(')')? + 1..]
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// Start time (field 22 of `/proc/PID/stat`) of a running process.
pub fn proc_start_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the writer of a region (with header `info`, file `f`) still runs the same image.
pub fn liveness(info: &RegionInfo, f: &RegionFile, newer_same_process: bool) -> Liveness {
    if newer_same_process {
        return Liveness::Exited;
    }
    if proc_start_ticks(f.pid) != Some(f.start_ticks) {
        return Liveness::Exited;
    }
    if matches!(proc_state(f.pid), Some('Z' | 'X')) {
        return Liveness::Zombie;
    }
    if let Ok(md) = std::fs::metadata(format!("/proc/{}/exe", f.pid)) {
        if md.dev() != info.exe_dev || md.ino() != info.exe_ino {
            return Liveness::Exited;
        }
    }
    // `heapdump detach` marks the region so; the process runs on unrecorded. (An exit with
    // `HEAPDUMP_KEEP=1` marks it `STATE_EXITED` while exit handlers registered before the
    // shim's still run, recorded: the process is alive, its region current.)
    if info.state == vmo_layout::v1::STATE_DETACHED {
        return Liveness::Detached;
    }
    Liveness::Alive
}

/// Whether `files` holds a region of the same process (pid and start time) created after `f`.
pub fn has_newer(files: &[RegionFile], f: &RegionFile) -> bool {
    files
        .iter()
        .any(|o| o.pid == f.pid && o.start_ticks == f.start_ticks && o.created_ns > f.created_ns)
}

/// Short command name: the last path component of argv[0] (or of the executable).
pub fn command_name(info: &RegionInfo) -> String {
    let arg0 = info
        .cmdline
        .first()
        .map(String::as_str)
        .unwrap_or(&info.exe_path);
    Path::new(arg0)
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| arg0.to_owned())
}

/// Whether the process that wrote `info` is called `name`: the file name of its argv[0] (as
/// [`command_name`]) or of its executable.
pub fn matches_name(info: &RegionInfo, name: &str) -> bool {
    command_name(info) == name
        || Path::new(&info.exe_path)
            .file_name()
            .is_some_and(|f| f.to_string_lossy() == name)
}

/// When process `pid` is a `heapdump run` (this executable, its first argument `run`): its
/// child's pid, the program it runs (helper R, 4: `$!` after `heapdump run -- PROG &` is the
/// wrapper, and the error advised attaching to it).
pub fn run_wrapper_child(pid: u32) -> Option<u32> {
    let me = std::fs::read_link("/proc/self/exe").ok()?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    if exe != me {
        return None;
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    if cmdline.split(|b| *b == 0).nth(1) != Some(b"run".as_slice()) {
        return None;
    }
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

/// The pids of process `root` and of all its descendants, from the parent pid (field 4) of
/// every `/proc/PID/stat`, sorted. A process that exits while `/proc` is read is left out; an
/// orphan re-parented (to init or a subreaper) is no longer a descendant.
///
/// Errors: `root` is not a running process.
pub fn process_tree(root: u32) -> Result<Vec<u32>> {
    if proc_start_ticks(root).is_none() {
        bail!("no such process: {root}");
    }
    let mut children: std::collections::HashMap<u32, Vec<u32>> = Default::default();
    for e in std::fs::read_dir("/proc")
        .context("cannot read /proc")?
        .flatten()
    {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue; // gone meanwhile
        };
        // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses.
        let ppid = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        if let Some(c) = children.get(&out[i]) {
            out.extend(c.iter().copied().filter(|&c| c != root));
        }
        i += 1;
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_tree_holds_children_and_grandchildren() {
        use std::process::{Command, Stdio};
        // sh (a child) -> sleep (a grandchild); sh waits, so both stay put until killed.
        let mut sh = Command::new("sh")
            .args(["-c", "sleep 30 & echo $!; wait"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(sh.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let sleep: u32 = line.trim().parse().unwrap();
        let me = std::process::id();
        let tree = process_tree(me).unwrap();
        let sub = process_tree(sh.id()).unwrap();
        // SAFETY: ending the processes this test started.
        unsafe { libc::kill(sleep as i32, libc::SIGKILL) };
        let _ = sh.kill();
        let _ = sh.wait();
        assert!(tree.contains(&me) && tree.contains(&sh.id()) && tree.contains(&sleep));
        assert_eq!(sub, {
            let mut v = vec![sh.id(), sleep];
            v.sort_unstable();
            v
        });
        assert!(process_tree(u32::MAX).is_err());
    }
}

/// A command line on one line, for a table or a message: the arguments joined by spaces, each
/// control character (a newline, a tab, an escape sequence) written as Rust escapes it (`\n`,
/// `\t`, `\u{1b}`), so that one process is one row and nothing reaches the terminal as a
/// control sequence.
pub fn show_cmdline(cmdline: &[String]) -> String {
    let mut out = String::new();
    for (i, arg) in cmdline.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(&shown(arg));
    }
    out
}

/// `text` for a terminal, a table or a profile: each control character (a newline, a tab, an
/// escape sequence's ESC, a BEL) written as Rust escapes it (`\n`, `\t`, `\u{1b}`, `\u{7}`).
/// For every string the profiled program controls (its command line, the region's warnings,
/// function and file names from its binaries, perf map or Python code), so that what it
/// chose cannot move the cursor, retitle the window or forge a line of heapdump's output.
/// Borrowed when there is nothing to escape.
pub fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// What a profile of this region misses, one line each, for stderr: allocations and stack
/// traces the shim dropped (its counters), why recording stopped, and the shim's warnings
/// (another allocator's `malloc`, tables made smaller). The same lines are in the profile's
/// comments, but a user reading only the terminal would otherwise take a partial profile for
/// the whole heap. Empty when the recording is complete. Escaped ([`shown`]).
pub fn incomplete_lines(info: &RegionInfo) -> Vec<String> {
    let k = &info.counters;
    let mut v = Vec::new();
    if k.dropped_blocks > 0 || k.dropped_stacks > 0 {
        v.push(format!(
            "the recording is incomplete: {} allocations were not recorded and {} stack traces were dropped (missing from this profile; `heapdump list` shows the counts)",
            k.dropped_blocks, k.dropped_stacks
        ));
    }
    v.extend(
        info.stop_reasons()
            .iter()
            .map(|r| format!("recording stopped: {r}")),
    );
    v.extend(info.warnings.iter().map(|w| format!("shim: {}", shown(w))));
    v
}

/// [`shown`] for a message of several lines (an error heapdump exits with): control
/// characters escaped but its line breaks.
pub fn shown_lines(text: &str) -> String {
    text.split('\n')
        .map(|l| shown(l).into_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

/// [`command_name`] for a message or a table: control characters escaped ([`shown`]).
pub fn command_label(info: &RegionInfo) -> String {
    shown(&command_name(info)).into_owned()
}

/// A region file with its header read.
pub struct Entry {
    pub file: RegionFile,
    pub info: Option<vmo_layout::RegionInfo>,
    /// Named snapshots the program took.
    pub named: Vec<vmo_layout::NamedSnapshot>,
    pub error: Option<String>,
    pub liveness: Liveness,
    /// Why the region is foreign ([`trust`]): every command refuses it.
    pub foreign: Option<String>,
}

impl Entry {
    /// `list`'s STATUS: `foreign`, else its process's liveness.
    pub fn status(&self) -> &'static str {
        match self.foreign {
            Some(_) => "foreign",
            None => self.liveness.as_str(),
        }
    }
}

/// Every region file of [`region_dir`], its header read (an unreadable one with its error).
pub fn scan() -> Result<Vec<Entry>> {
    let dir = region_dir();
    let files = list_files(&dir)?;
    let mut out = Vec::new();
    for f in &files {
        let newer = has_newer(&files, f);
        // A region truncated while its header is read shows zeros instead of killing us
        // (see `truncation`): report it as unreadable.
        type Read = (
            vmo_layout::RegionInfo,
            Vec<vmo_layout::NamedSnapshot>,
            Option<String>,
        );
        let read = |o: Opened| -> Result<Read> {
            let r = o.region()?;
            let (info, named) = (r.info(), r.named_snapshots());
            let foreign = trust(&o, &info, Some(f)).err();
            match o.truncated() {
                Some(why) => bail!("{why}"),
                None => Ok((info, named, foreign)),
            }
        };
        match open(&f.path).and_then(read) {
            Ok((info, named, foreign)) => {
                let liveness = liveness(&info, f, newer);
                out.push(Entry {
                    file: f.clone(),
                    info: Some(info),
                    named,
                    error: None,
                    liveness,
                    foreign,
                });
            }
            Err(e) => out.push(Entry {
                file: f.clone(),
                info: None,
                named: Vec::new(),
                error: Some(format!("{e:#}")),
                liveness: Liveness::Exited,
                foreign: None,
            }),
        }
    }
    Ok(out)
}

/// Whether process `pid` maps a region file of the region directory that has been removed
/// (`/proc/PID/maps` names it `… (deleted)`): the shim's exit handler removes the region
/// of a process that exits without `HEAPDUMP_KEEP`, and the process maps it until it is
/// gone. False when the maps cannot be read.
fn maps_deleted_region(pid: u32) -> bool {
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return false;
    };
    let dir = region_dir();
    let prefix = format!("{}/{pid}-", dir.display());
    maps.lines().any(|l| {
        l.split_once('/')
            .is_some_and(|(_, p)| format!("/{p}").starts_with(&prefix) && l.ends_with(" (deleted)"))
    })
}

/// Running processes that map a region file, by the file's (device, inode) as
/// `/proc/PID/maps` gives them (major, minor, inode): the region of a process in another PID
/// namespace (a container) is named after its pid there, so by its name it looks like a dead
/// process's, while the process maps it. Processes whose maps cannot be read are left out.
pub fn region_mappers() -> std::collections::HashMap<(u32, u32, u64), u32> {
    let mut out = std::collections::HashMap::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        // Line by line: a process's maps may be hundreds of MB (helper J, 5).
        let Ok(f) = std::fs::File::open(format!("/proc/{pid}/maps")) else {
            continue;
        };
        use std::io::BufRead;
        for l in std::io::BufReader::new(f).lines() {
            let Ok(l) = l else { break };
            let path = l.trim_end().trim_end_matches(" (deleted)");
            if !(path.ends_with(".heapdump") || path.ends_with(".heapdump.exec")) {
                continue;
            }
            let mut f = l.split_whitespace().skip(3);
            let (Some(dev), Some(ino)) = (f.next(), f.next()) else {
                continue;
            };
            let Some((maj, min)) = dev.split_once(':') else {
                continue;
            };
            if let (Ok(maj), Ok(min), Ok(ino)) = (
                u32::from_str_radix(maj, 16),
                u32::from_str_radix(min, 16),
                ino.parse::<u64>(),
            ) {
                out.insert((maj, min, ino), pid);
            }
        }
    }
    out
}

/// The pid process `pid` has in its own PID namespace (the last field of `NSpid` in
/// `/proc/PID/status`), if it can be read.
pub fn innermost_pid(pid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// The (major, minor, inode) of file `md`, as `/proc/PID/maps` writes them (glibc's `dev_t`
/// encoding).
pub fn maps_id(md: &std::fs::Metadata) -> (u32, u32, u64) {
    use std::os::unix::fs::MetadataExt;
    maps_id_of(md.dev(), md.ino())
}

/// [`maps_id`] from a device number and an inode (a `stat`'s `st_dev`, `st_ino`).
pub fn maps_id_of(d: u64, ino: u64) -> (u32, u32, u64) {
    let major = ((d >> 8) & 0xfff) | ((d >> 32) & !0xfff);
    let minor = (d & 0xff) | ((d >> 12) & !0xff);
    (major as u32, minor as u32, ino)
}

/// The region file process `pid` maps and has not removed (`/proc/PID/maps`: a path ending in
/// `.heapdump`), if any: where it records when that is not the region directory of this
/// collector (helper I, 6: attached with another HEAPDUMP_DIR, the process was called not
/// instrumented and `attach` answered that it already was).
///
/// Only a region named for `pid` (or its pid in its own namespace) counts: a collector maps
/// the regions of the processes it reads (`heapdump watch`), which are not its own.
fn mapped_region_path(pid: u32) -> Option<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let inner = innermost_pid(pid).unwrap_or(pid);
    maps.lines().find_map(|l| {
        let path = &l[l.find('/')?..];
        let name = path.rsplit('/').next()?;
        let n = vmo_layout::name::parse(name.as_bytes())?;
        (n.pid == pid || n.pid == inner).then(|| path.to_owned())
    })
}

/// The region file `target` names: a pid's (the running image's, else the newest), a command
/// name's (unique, or the only running one), or a file given as is (its [`RegionFile`] then
/// unknown).
pub fn pick(target: &Target) -> Result<(PathBuf, Option<RegionFile>)> {
    match target {
        Target::File(p) => Ok((p.clone(), None)),
        Target::Many(_) => bail!("this command takes one process, not --multi-process"),
        Target::Pid(pid) => {
            let files = list_files(&region_dir())?;
            let mut mine: Vec<&RegionFile> = files.iter().filter(|f| f.pid == *pid).collect();
            if mine.is_empty() {
                if matches!(proc_state(*pid), Some('Z' | 'X')) {
                    bail!(
                        "process {pid} has exited (a zombie: its parent has not reaped it) and \
                         left no region in {}",
                        region_dir().display()
                    );
                }
                if proc_start_ticks(*pid).is_some() && maps_deleted_region(*pid) {
                    bail!(
                        "process {pid} is exiting: heapdump's exit handler has removed its \
                         region (it still maps it), and exit handlers registered before \
                         heapdump's are running; to read a process at its exit, run it with \
                         HEAPDUMP_KEEP=1 (the region then stays readable, and recording, until \
                         the process is gone)"
                    );
                }
                if let Some(file) = mapped_region_path(*pid) {
                    let name_pid = Path::new(&file)
                        .file_name()
                        .and_then(|n| vmo_layout::name::parse(n.as_encoded_bytes()))
                        .map(|n| n.pid);
                    if name_pid != Some(*pid) {
                        // Helper U, 3: a process in another PID namespace records under its pid
                        // there; its liveness cannot be judged from here (it was called exited).
                        bail!(
                            "process {pid} runs in another PID namespace (a container), where its \
                             pid is {}; its region is {}: run heapdump inside its namespaces \
                             (`nsenter --target {pid} --pid --mount -- heapdump snapshot \
                             --by-pid {} -o FILE`)",
                            name_pid.map_or("?".to_owned(), |p| p.to_string()),
                            shown(&file),
                            name_pid.map_or("?".to_owned(), |p| p.to_string()),
                        );
                    }
                    // Recording into another directory (attached or started with another
                    // HEAPDUMP_DIR, or by another user into its own default, as root's attach
                    // of a service run as nobody does): its region is read there, as with
                    // `--region`, and trusted or refused by the same checks (helper U, 2:
                    // every command by pid failed and sent the user to `--region`).
                    let elsewhere = Path::new(&file)
                        .parent()
                        .map(|d| d.display().to_string())
                        .unwrap_or_default();
                    eprintln!(
                        "heapdump: note: process {pid} records into {}, not {}: reading its \
                         region {}",
                        shown(&elsewhere),
                        region_dir().display(),
                        shown(&file)
                    );
                    return Ok((PathBuf::from(file), None));
                }
                if let Some(child) = run_wrapper_child(*pid) {
                    bail!(
                        "process {pid} is `heapdump run` itself, not instrumented; the program \
                         it runs is its child, pid {child} (in a shell, `$!` after `heapdump \
                         run -- PROG &` is the wrapper's pid)"
                    );
                }
                if proc_start_ticks(*pid).is_some() {
                    bail!(
                        "process {pid} is not instrumented (no region in {}); start it with \
                         `heapdump run` or LD_PRELOAD=libheapdump.so, or load the shim into it \
                         now with `heapdump attach --by-pid {pid}`",
                        region_dir().display()
                    );
                }
                bail!("no such process: {pid} (and no region left by it)");
            }
            // Prefer the region of the image running now; else the newest.
            let now = proc_start_ticks(*pid);
            mine.sort_by_key(|f| (Some(f.start_ticks) == now, f.created_ns));
            let f = mine.last().unwrap();
            Ok((f.path.clone(), Some((*f).clone())))
        }
        Target::Name(name) => {
            let entries = scan()?;
            let matches: Vec<&Entry> = entries
                .iter()
                .filter(|e| e.info.as_ref().is_some_and(|i| matches_name(i, name)))
                .collect();
            let alive: Vec<&&Entry> = matches
                .iter()
                .filter(|e| e.liveness == Liveness::Alive)
                .collect();
            let chosen: Vec<&Entry> = if alive.len() == 1 {
                vec![alive[0]]
            } else {
                matches.clone()
            };
            match chosen.as_slice() {
                [] => {
                    let running = running_named(name);
                    if running.is_empty() {
                        bail!("no instrumented process named {name:?} (see `heapdump list`)");
                    }
                    let pids: Vec<String> = running.iter().map(|p| p.to_string()).collect();
                    bail!(
                        "no instrumented process named {name:?} (see `heapdump list`); running \
                         without the shim: pid {}; `heapdump attach --by-pid PID` loads it \
                         into one now",
                        pids.join(", ")
                    )
                }
                [one] => Ok((one.file.path.clone(), Some(one.file.clone()))),
                many => {
                    let list: Vec<String> = many
                        .iter()
                        .map(|e| {
                            format!(
                                "  pid {} ({}): {}",
                                e.file.pid,
                                e.liveness.as_str(),
                                e.info
                                    .as_ref()
                                    .map(|i| show_cmdline(&i.cmdline))
                                    .unwrap_or_default()
                            )
                        })
                        .collect();
                    bail!(
                        "{name:?} matches {} processes; pick one with --by-pid:\n{}",
                        many.len(),
                        list.join("\n")
                    )
                }
            }
        }
    }
}

/// Running processes whose command name (`/proc/PID/comm`, 15 bytes at most) is `name` (its
/// first 15 bytes), this one excepted, in pid order: for the error of a `--by-name` that no
/// region matches.
fn running_named(name: &str) -> Vec<u32> {
    let want = &name.as_bytes()[..name.len().min(15)];
    let me = std::process::id();
    let mut out: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.strip_suffix(b"\n").unwrap_or(&c) == want)
        })
        .collect();
    out.sort_unstable();
    out
}

/// How to pick the region to snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// By process id.
    Pid(u32),
    /// By command name.
    Name(String),
    /// A region file.
    File(PathBuf),
    /// Several running processes (`--multi-process`).
    Many(Selection),
}

/// Which running processes a multi-process snapshot takes: those matching every filter given
/// (none: all of this user's).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selection {
    /// Command names (any of them); empty: any name.
    pub names: Vec<String>,
    /// Only this process and its descendants.
    pub tree: Option<u32>,
}
