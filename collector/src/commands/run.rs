//! `heapdump run`: starts a command with the shim preloaded and forwards signals to it.

use crate::cli;
use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// What `run` starts.
#[derive(Debug, Clone)]
pub struct Options {
    /// `HEAPDUMP_KEEP=1`: keep the region after a clean exit.
    pub keep: bool,
    /// The shim to preload (`None`: next to this executable, or `$HEAPDUMP_LIB`).
    pub lib: Option<PathBuf>,
    /// `--no-jit-names`: never add node's perf-map flags to `NODE_OPTIONS`.
    pub no_jit_names: bool,
    /// The command and its arguments (at least one element: clap requires it).
    pub command: Vec<OsString>,
}

impl From<cli::RunArgs> for Options {
    fn from(a: cli::RunArgs) -> Self {
        Options {
            keep: a.keep,
            lib: a.lib,
            no_jit_names: a.no_jit_names,
            command: a.command,
        }
    }
}

/// The shim to load: `explicit` (`--lib`), else `HEAPDUMP_LIB`, else `libheapdump.so` beside
/// the heapdump executable (or in `../lib/`, `../`), canonicalized.
///
/// # Errors
/// The given file does not exist, or none is found beside the executable.
pub(crate) fn shim_path(explicit: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = explicit.or_else(|| std::env::var_os("HEAPDUMP_LIB").map(PathBuf::from)) {
        if !p.exists() {
            bail!("shim {} does not exist", p.display());
        }
        return Ok(std::fs::canonicalize(&p)?);
    }
    let exe = std::env::current_exe().context("cannot find the heapdump executable")?;
    let dir = exe
        .parent()
        .context("heapdump executable has no directory")?;
    for cand in [
        dir.join("libheapdump.so"),
        dir.join("../lib/libheapdump.so"),
        dir.join("../libheapdump.so"),
    ] {
        if cand.exists() {
            return Ok(std::fs::canonicalize(cand)?);
        }
    }
    bail!(
        "cannot find libheapdump.so next to {} (build it with `cargo build --release`, or pass --lib)",
        exe.display()
    )
}

pub fn run(a: Options) -> Result<()> {
    // An audit library moves the shim's thread-local word out of the static TLS block, where
    // its first read allocates through the shim itself: the program would die of the
    // recursion (helper X, 2; README, Limitations).
    if std::env::var_os("LD_AUDIT").is_some_and(|v| !v.is_empty()) {
        anyhow::bail!(
            "LD_AUDIT is set: the shim cannot record beside an audit library (the program would \
             crash); unset LD_AUDIT, or start the program without heapdump and use `heapdump \
             attach`"
        );
    }
    let lib = shim_path(a.lib)?;
    let mut preload = lib.as_os_str().to_owned();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    if let Some(why) = preload_ignored(&a.command[0]) {
        eprintln!("heapdump: warning: {why}");
    }
    let mut cmd = std::process::Command::new(&a.command[0]);
    cmd.args(&a.command[1..]).env("LD_PRELOAD", preload);
    if a.keep {
        cmd.env("HEAPDUMP_KEEP", "1");
    }
    // A relative HEAPDUMP_DIR names the directory `heapdump list` run here reads: made
    // absolute, so that a process of the command that changes directory (`make -C`, a
    // daemon's `chdir("/")`) writes its region there too, not under its new directory.
    if let Some(d) = std::env::var_os("HEAPDUMP_DIR").filter(|d| !d.is_empty()) {
        let d = std::path::PathBuf::from(d);
        if d.is_relative() {
            if let Ok(here) = std::env::current_dir() {
                cmd.env("HEAPDUMP_DIR", here.join(d));
            }
        }
    }
    let keep = a.keep || std::env::var_os("HEAPDUMP_KEEP").is_some_and(|v| v == "1");
    let node_options = if a.no_jit_names {
        None
    } else {
        node_options(&a.command, std::env::var_os("NODE_OPTIONS"))
    };
    // The perf map is node's because of the flags added here (not one the user asked for).
    let map_ours = node_options.as_ref().is_some_and(|o| o.1 == NODE_FLAGS);
    if let Some((opts, added)) = &node_options {
        eprintln!(
            "heapdump: node: NODE_OPTIONS gains {added}, so that its JavaScript functions \
             have names (node writes /tmp/perf-PID.map{}; --no-jit-names leaves NODE_OPTIONS \
             alone)",
            if keep || !map_ours {
                ""
            } else {
                ", removed at a normal exit"
            }
        );
        cmd.env("NODE_OPTIONS", opts);
        if map_ours {
            // Node's child processes inherit both: each removes its own map as its region goes.
            cmd.env("HEAPDUMP_REMOVE_PERF_MAP", "1");
        }
    }
    // Handlers first (a signal that arrives before the child exists is forwarded once it
    // does); caught dispositions are reset to the default in the child by `execve`.
    forward::install();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let (code, what) = forward::exec_failure(&a.command[0], &e);
            eprintln!("heapdump: {}: {what}", a.command[0].to_string_lossy());
            std::process::exit(code);
        }
    };
    forward::set_child(child.id());
    // `wait` retries when interrupted by a forwarded signal.
    let status = child.wait()?;
    // The perf map node wrote because of the flags added here: its names serve snapshots of
    // the running process, and post-mortem ones of a region that outlives it (kept, or left
    // by a process killed by a signal): removed only when the region is, at a normal exit.
    if map_ours && !keep && status.code().is_some() {
        remove_perf_map(child.id());
    }
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = status.signal() {
        std::process::exit(128 + sig);
    }
    std::process::exit(status.code().unwrap_or(1));
}

/// The V8 flags that make node publish the names of the code it generates in the perf map
/// `/tmp/perf-PID.map`, which the collector reads (`perfmap.rs`): `--perf-basic-prof`, and
/// `--interpreted-frames-native-stack` so that interpreted (Ignition) functions get a code
/// range of their own too. Both are among the V8 options node accepts in `NODE_OPTIONS`.
const NODE_FLAGS: &str = "--perf-basic-prof --interpreted-frames-native-stack";

/// `NODE_OPTIONS` for `command` with [`NODE_FLAGS`] added, when it runs node (see
/// [`runs_node`]) and neither `current` nor its arguments already ask node for a perf map or a
/// jitdump (`--perf-basic-prof…`, `--perf-prof…`); with only
/// `--interpreted-frames-native-stack` added when they ask for one but not for that flag
/// (without it 70% of a program's Buffers were charged to V8's C++, helper D, 8); else `None`.
/// Returns the new value and what was added.
fn node_options(
    command: &[OsString],
    current: Option<OsString>,
) -> Option<(OsString, &'static str)> {
    if !runs_node(command.first()?) {
        return None;
    }
    let current = current.unwrap_or_default();
    let text = current.to_string_lossy();
    let given = |f: &dyn Fn(&str) -> bool| {
        text.split_ascii_whitespace().any(f) || command[1..].iter().any(|a| f(&a.to_string_lossy()))
    };
    let add = if !given(&|s| s.starts_with("--perf-basic-prof") || s.starts_with("--perf-prof")) {
        NODE_FLAGS
    } else if !given(&|s| s.starts_with("--interpreted-frames-native-stack")) {
        "--interpreted-frames-native-stack"
    } else {
        return None;
    };
    let mut out = OsString::from(text.trim());
    if !out.is_empty() {
        out.push(" ");
    }
    out.push(add);
    Some((out, add))
}

/// Whether `command` runs node: its file name is node's (`node`, `nodejs`, `node22`), or it is
/// a script whose `#!` line runs node (`#!/usr/bin/env node`: npm, npx, yarn, an executable
/// `.js` file), looked up in `PATH` as `execvp` does.
fn runs_node(command: &std::ffi::OsStr) -> bool {
    use std::io::Read;
    if Path::new(command).file_name().is_some_and(is_node_name) {
        return true;
    }
    use std::os::unix::fs::OpenOptionsExt;
    let Some(path) = resolve(command).filter(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file()))
    else {
        return false;
    };
    // Non-blocking, as `preload_ignored` opens it: a file replaced by a FIFO meanwhile must not
    // hang `run` before its `exec` fails.
    let mut head = Vec::with_capacity(256);
    let read = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(&path)
        .and_then(|f| f.take(256).read_to_end(&mut head));
    read.is_ok() && shebang_runs_node(&head)
}

/// Whether a file starting with `head` is a script whose `#!` line names node as its
/// interpreter or, through `env` (`-S` and its options allowed), its command.
fn shebang_runs_node(head: &[u8]) -> bool {
    let Some(rest) = head.strip_prefix(b"#!") else {
        return false;
    };
    let line = rest.split(|&b| b == b'\n').next().unwrap_or(rest);
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_ascii_whitespace();
    let base = |w: &str| w.rsplit('/').next().unwrap_or(w).to_owned();
    match words.next().map(base) {
        Some(first) if first == "env" => words
            .find(|w| !w.starts_with('-'))
            .is_some_and(|w| is_node_name(std::ffi::OsStr::new(&base(w)))),
        Some(first) => is_node_name(std::ffi::OsStr::new(&first)),
        None => false,
    }
}

/// Whether an executable's file name is node's: `node`, `nodejs`, or `node` and a version's
/// digits (`node22`); not `nodemon` or `node-gyp`.
fn is_node_name(name: &std::ffi::OsStr) -> bool {
    name.to_str().is_some_and(|n| {
        n == "nodejs"
            || n.strip_prefix("node")
                .is_some_and(|v| v.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// The file `command` names: itself when it has a slash, else the first executable file of
/// that name in `PATH` (as `execvp` looks it up); `None` when there is none.
fn resolve(command: &std::ffi::OsStr) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    if command.as_encoded_bytes().contains(&b'/') {
        return Some(PathBuf::from(command));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(command))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0))
}

/// Removes `/tmp/perf-PID.map` if it is a regular file of ours (node's, written because of
/// [`NODE_FLAGS`]); anything else there is left alone.
fn remove_perf_map(pid: u32) {
    use std::os::unix::fs::MetadataExt;
    let path = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && m.uid() == me) {
        let _ = std::fs::remove_file(&path);
    }
}

/// Why the dynamic loader will not load the shim into `command` (looked up in `PATH` as
/// `execvp` does when it has no slash), when its file says so:
/// * an ELF executable without `PT_INTERP` — statically linked (static-pie included): no
///   dynamic loader runs, and only the loader reads `LD_PRELOAD`;
/// * a set-user-ID or set-group-ID file whose owner or group is not ours: the kernel marks
///   the process secure (`AT_SECURE`), and glibc's loader then ignores `LD_PRELOAD` entries
///   with a slash, as ours has (ld.so(8), "Secure-execution mode");
/// * a file with capabilities (`setcap`: a `security.capability` extended attribute) run by a
///   user other than root: the kernel marks the process secure as its permitted capabilities
///   grow (capabilities(7); for a real user ID of 0 they do not count), with the same effect.
///
/// `None` when none holds or the file cannot be read (not found: the spawn reports it);
/// a script (`#!`) is not followed to its interpreter. Reads the first 64 KiB at most, where
/// the ELF header and program headers lie (the layout `object` parses).
fn preload_ignored(command: &std::ffi::OsStr) -> Option<String> {
    use object::read::elf::{FileHeader, ProgramHeader};
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let path = resolve(command)?;
    let meta = std::fs::metadata(&path).ok()?;
    if !meta.is_file() {
        return None;
    }
    // SAFETY: getuid and getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mode = meta.mode();
    if mode & libc::S_ISUID != 0 && meta.uid() != uid {
        return Some(format!(
            "{} is set-user-ID: the loader ignores LD_PRELOAD for it, so nothing will be \
             recorded",
            path.display()
        ));
    }
    if mode & libc::S_ISGID != 0 && meta.gid() != gid {
        return Some(format!(
            "{} is set-group-ID: the loader ignores LD_PRELOAD for it, so nothing will be \
             recorded",
            path.display()
        ));
    }
    if uid != 0 && has_file_capabilities(&path) {
        return Some(format!(
            "{} has file capabilities (setcap): the loader ignores LD_PRELOAD for it when run \
             by a user other than root, so nothing will be recorded",
            path.display()
        ));
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(&path)
        .ok()?;
    let mut head = Vec::new();
    f.take(64 * 1024).read_to_end(&mut head).ok()?;
    let hdr = object::elf::FileHeader64::<object::Endianness>::parse(head.as_slice()).ok()?;
    let endian = hdr.endian().ok()?;
    if hdr.e_type(endian) != object::elf::ET_EXEC && hdr.e_type(endian) != object::elf::ET_DYN {
        return None;
    }
    let phdrs = hdr.program_headers(endian, head.as_slice()).ok()?;
    if phdrs.is_empty()
        || phdrs
            .iter()
            .any(|p| p.p_type(endian) == object::elf::PT_INTERP)
    {
        return None;
    }
    Some(format!(
        "{} is statically linked: no dynamic loader runs for it to load the shim \
         (LD_PRELOAD), so nothing will be recorded (link it dynamically; a Rust program can \
         use HeapdumpAlloc instead: README, \"Rust programs: linking the allocator\")",
        path.display()
    ))
}

/// Whether `path` carries file capabilities: a non-empty `security.capability` extended
/// attribute (what `setcap` writes and the kernel reads at `execve`).
fn has_file_capabilities(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(p) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: both names are NUL-terminated; a null buffer of size 0 asks only for the
    // attribute's size (getxattr(2)).
    let n = unsafe {
        libc::getxattr(
            p.as_ptr(),
            c"security.capability".as_ptr(),
            std::ptr::null_mut(),
            0,
        )
    };
    n > 0
}

/// `heapdump run`'s signal forwarding: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2
/// sent to `heapdump` are sent on to the command, and `heapdump` stays to report its status.
mod forward {
    use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

    /// The signals forwarded to the child.
    pub const SIGNALS: [libc::c_int; 6] = [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
    ];
    /// The child's pid, 0 before it exists.
    static CHILD: AtomicI32 = AtomicI32::new(0);
    /// Signals received before the child existed (bit = signal number).
    static PENDING: AtomicU64 = AtomicU64::new(0);

    extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
        // A signal the terminal generated (Ctrl-C, Ctrl-\) went to the whole foreground
        // process group, the child included: sending it again would deliver it twice.
        // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
        if !info.is_null() && unsafe { (*info).si_code } == libc::SI_KERNEL {
            return;
        }
        let pid = CHILD.load(Ordering::SeqCst);
        if pid > 0 {
            // SAFETY: kill is async-signal-safe; pid is our own child (not yet reaped: we
            // reap it only after the last signal could matter).
            unsafe { libc::kill(pid, sig) };
        } else {
            PENDING.fetch_or(1 << sig, Ordering::SeqCst);
        }
    }

    /// Installs the forwarding handler for [`SIGNALS`] (SA_RESTART, SA_SIGINFO), but for
    /// those `heapdump run` was started with ignored (`nohup`, a shell's `trap ''`, a
    /// background job's SIGINT): they stay ignored, here and in the command, which inherits
    /// an ignored signal through `execve` as it would have without heapdump (a caught one
    /// would be reset to the default action).
    pub fn install() {
        for sig in SIGNALS {
            use crate::signals::{self, Handler};
            if signals::is_ignored(sig) {
                continue;
            }
            // SAFETY: the handler only uses async-signal-safe calls and atomics.
            let _ = unsafe { signals::set(sig, Handler::Info(handler), libc::SA_RESTART) };
        }
    }

    /// Records the child's pid and forwards what arrived before it existed.
    pub fn set_child(pid: u32) {
        CHILD.store(pid as i32, Ordering::SeqCst);
        let pending = PENDING.swap(0, Ordering::SeqCst);
        for sig in SIGNALS {
            if pending & (1 << sig) != 0 {
                // SAFETY: sending a signal to our own child.
                unsafe { libc::kill(pid as i32, sig) };
            }
        }
    }

    /// Exit code and message for a command that could not be started, as shells report
    /// them: 127 when it does not exist, 126 when it exists but cannot be executed.
    pub fn exec_failure(cmd: &std::ffi::OsStr, e: &std::io::Error) -> (i32, String) {
        let has_slash = cmd.as_encoded_bytes().contains(&b'/');
        match e.kind() {
            std::io::ErrorKind::NotFound if has_slash => (127, "No such file or directory".into()),
            std::io::ErrorKind::NotFound => (127, "command not found".into()),
            _ if std::path::Path::new(cmd).is_dir() && has_slash => (126, "Is a directory".into()),
            std::io::ErrorKind::PermissionDenied => (126, "Permission denied".into()),
            _ => (126, e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(command: &[&str], current: Option<&str>) -> Option<String> {
        let command: Vec<OsString> = command.iter().map(OsString::from).collect();
        node_options(&command, current.map(OsString::from)).map(|o| o.0.into_string().unwrap())
    }

    /// Which commands are node, and what their `NODE_OPTIONS` become.
    #[test]
    fn node_options_for_node_only_and_after_the_users() {
        let flags = Some(NODE_FLAGS.to_owned());
        for node in ["node", "nodejs", "node22", "/usr/local/bin/node"] {
            assert_eq!(opts(&[node, "app.js"], None), flags, "{node}");
        }
        for other in ["nodemon", "node-gyp", "python3", "/opt/node/bin/deno"] {
            assert_eq!(opts(&[other, "app.js"], None), None, "{other}");
        }
        // Scripts run by node, through env or not; not those of another interpreter.
        for head in [
            "#!/usr/bin/env node\n",
            "#!/usr/bin/node",
            "#! /usr/bin/env -S node --max-old-space-size=300\nx",
            "#!/opt/n/bin/node22 --harmony\n",
        ] {
            assert!(shebang_runs_node(head.as_bytes()), "{head:?}");
        }
        for head in [
            "#!/bin/sh\nexec node app.js\n",
            "#!/usr/bin/env python3\n",
            "#!/usr/bin/env nodemon\n",
            "console.log(1)",
            "#!",
            "\x7fELF",
        ] {
            assert!(!shebang_runs_node(head.as_bytes()), "{head:?}");
        }
        assert_eq!(
            opts(&["node", "app.js"], Some("  --max-old-space-size=300 ")),
            Some(format!("--max-old-space-size=300 {NODE_FLAGS}"))
        );
        assert_eq!(opts(&["node", "app.js"], Some("")), flags);
        // node asked for a perf map or a jitdump already: only the interpreted frames' flag
        // added, when missing.
        let native = Some("--interpreted-frames-native-stack".to_owned());
        assert_eq!(
            opts(&["node", "app.js"], Some("--perf-basic-prof")),
            Some("--perf-basic-prof --interpreted-frames-native-stack".to_owned())
        );
        assert_eq!(opts(&["node", "--perf-prof", "app.js"], None), native);
        assert_eq!(
            opts(
                &["node", "--perf-basic-prof-only-functions", "app.js"],
                None
            ),
            native
        );
        assert_eq!(
            opts(
                &["node", "--perf-basic-prof", "app.js"],
                Some("--interpreted-frames-native-stack")
            ),
            None
        );
        assert_eq!(
            opts(
                &[
                    "node",
                    "--perf-basic-prof",
                    "--interpreted-frames-native-stack",
                    "app.js"
                ],
                None
            ),
            None
        );
    }
}
