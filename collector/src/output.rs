//! Writing an output file atomically (`-o FILE`, `watch`'s files, the flame graphs, captures):
//! a temporary file in the same directory renamed into place, or standard output for `-`.

/// Writes `bytes` to `path` as [`write_with`] does.
pub fn write_bytes(bytes: &[u8], path: &std::path::Path) -> anyhow::Result<()> {
    write_with(path, |out| {
        out.write_all(bytes)?;
        out.flush()
    })
}

/// Writes an output file safely: `-` is standard output; otherwise a temporary file created
/// exclusively (no symlink followed), mode 0600, in the same directory (opened with
/// `O_DIRECTORY | O_NOFOLLOW`: a directory reached through a link in its last component is
/// refused), renamed into place when `encode` succeeded. A directory is refused with a clear
/// message.
pub fn write_with(
    path: &std::path::Path,
    encode: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    use anyhow::Context;
    if path.as_os_str() == "-" {
        let mut out = std::io::stdout().lock();
        return encode(&mut out).context("cannot write to standard output");
    }
    if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        anyhow::bail!(
            "{}: is a directory; -o takes a file name (e.g. {}) or - for standard output",
            path.display(),
            // Not a profile's name for every command: `report` writes HTML (helper W, 4).
            path.join("FILE").display()
        );
    }
    // A device or a FIFO (`/dev/null`, `/dev/stdout`, a named pipe) is written to, not
    // replaced: renaming a file over it would turn `/dev/null` into a regular file for every
    // program on the machine (a test run as root did exactly that). Not followed if a link.
    if let Ok(m) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        let t = m.file_type();
        if t.is_char_device() || t.is_fifo() {
            let mut f = open_special(path)?;
            return encode(&mut f).with_context(|| format!("cannot write {}", path.display()));
        }
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let name = path
        .file_name()
        .with_context(|| format!("{}: not a file name", path.display()))?;
    // The directory opened once, not through a link (`crate::outdir`); the file created
    // and renamed relative to it.
    let dir = crate::outdir::Dir::open(dir, crate::outdir::Create::No)?;
    dir.write_atomic(name, encode)
}

/// Opens the FIFO or character device at `path` for writing, if it is the collector's user's
/// or root's: a FIFO another user planted where root writes (`mkfifo /tmp/heap.pb.gz` before
/// root's `snapshot -o /tmp/heap.pb.gz`) would hand them root's profile, block contents
/// included. Opened without following a link and without blocking (a FIFO nobody reads fails
/// at once instead of hanging the command), then set blocking for the write; the checks are
/// made on the descriptor opened, not on the path.
fn open_special(path: &std::path::Path) -> anyhow::Result<std::fs::File> {
    use anyhow::Context;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
    use std::os::unix::io::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ENXIO) {
                anyhow::anyhow!("cannot open {}: a FIFO that nobody reads", path.display())
            } else {
                anyhow::Error::new(e).context(format!("cannot open {}", path.display()))
            }
        })?;
    let m = f
        .metadata()
        .with_context(|| format!("cannot open {}", path.display()))?;
    let t = m.file_type();
    if !(t.is_char_device() || t.is_fifo()) {
        anyhow::bail!(
            "{}: changed while being opened (no longer a FIFO or device): not written",
            path.display()
        );
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if m.uid() != me && m.uid() != 0 {
        anyhow::bail!(
            "{} is a {} owned by uid {}, not by you or root: refusing to write the profile into \
             it (another user may have planted it to read what heapdump writes); remove it or \
             choose another name",
            path.display(),
            if t.is_fifo() { "FIFO" } else { "device" },
            m.uid()
        );
    }
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own.
    unsafe {
        let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
    Ok(f)
}

/// JSON text `s` (as `serde_json` writes it) for a terminal: the C1 control characters
/// (U+0080–U+009F: U+009B is a terminal's control sequence introducer) escaped as `\u00XX`
/// too, as `serde_json` escapes the C0 ones (helper Q, 5: a command line or snapshot name
/// could carry them raw to the terminal; the tables escape them). Only strings can hold such
/// characters in JSON, so the escape is valid wherever it lands.
pub fn json_for_terminal(s: String) -> String {
    if !s.chars().any(|c| ('\u{80}'..='\u{9f}').contains(&c)) {
        return s;
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if ('\u{80}'..='\u{9f}').contains(&c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod json_tests {
    #[test]
    fn c1_controls_are_escaped() {
        let v = serde_json::json!({"cmdline": "a\u{9b}31mb\u{85}", "plain": "é"});
        let s = super::json_for_terminal(serde_json::to_string_pretty(&v).unwrap());
        assert!(s.contains("a\\u009b31mb\\u0085"), "{s}");
        assert!(s.contains("é"));
        let back: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(back, v);
    }
}
