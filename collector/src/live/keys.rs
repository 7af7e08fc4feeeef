//! Keys of the live view, read from the terminal directly.
//!
//! Not through crossterm's event reader: crossterm 0.29 reads a terminal that hung up (read
//! returns 0, end of file) in a loop that never returns, at full CPU, so a dropped SSH
//! connection left the view spinning; and its edge-triggered poll drops keys that arrive in
//! the same wake-up as a SIGWINCH. The view needs a dozen keys, all single bytes or the
//! common `ESC [` sequences every terminal (xterm, VT100, tmux, screen) sends in raw mode.

use std::io::IsTerminal;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// A key the view acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// `q`, `Q`, Esc, Ctrl-C.
    Quit,
    /// A letter or control key; `l`, `s`, `i`, `b` sort, Tab cycles the sort, `j`/`k` scroll.
    Char(char),
    /// Arrow up.
    Up,
    /// Arrow down.
    Down,
    /// Page up.
    PageUp,
    /// Page down.
    PageDown,
    /// Home.
    Home,
}

/// The keys in `input`, one read's worth of bytes. A lone ESC is Esc (a terminal sends an
/// escape sequence in one write); unknown sequences are skipped.
pub fn parse(input: &[u8]) -> Vec<Key> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < input.len() {
        let b = input[i];
        i += 1;
        match b {
            b'q' | b'Q' | 0x03 => out.push(Key::Quit),
            0x1b => {
                // ESC [ or ESC O, parameters, then a final byte in 0x40..=0x7e.
                match input.get(i) {
                    Some(b'[') | Some(b'O') => {
                        let start = i + 1;
                        let end = input[start..]
                            .iter()
                            .position(|c| (0x40..=0x7e).contains(c))
                            .map(|p| start + p);
                        let Some(end) = end else {
                            break; // cut short: dropped
                        };
                        let key = match (&input[start..end], input[end]) {
                            (b"", b'A') => Some(Key::Up),
                            (b"", b'B') => Some(Key::Down),
                            (b"", b'H') | (b"1", b'~') | (b"7", b'~') => Some(Key::Home),
                            (b"5", b'~') => Some(Key::PageUp),
                            (b"6", b'~') => Some(Key::PageDown),
                            _ => None,
                        };
                        out.extend(key);
                        i = end + 1;
                    }
                    Some(0x1b) | None => out.push(Key::Quit),
                    Some(_) => {
                        // Alt+key: the key alone.
                    }
                }
            }
            b'\t' => out.push(Key::Char('\t')),
            c if c.is_ascii_graphic() => out.push(Key::Char(c as char)),
            _ => {}
        }
    }
    out
}

/// The terminal the keys come from: stdin when it is a terminal, else `/dev/tty`.
#[derive(Debug)]
pub struct Keys {
    fd: RawFd,
    _tty: Option<std::fs::File>,
}

/// What [`Keys::wait`] got.
#[derive(Debug)]
pub enum Input {
    /// Nothing within the time (or a signal interrupted the wait).
    Nothing,
    /// Keys.
    Keys(Vec<Key>),
    /// The terminal is gone (hung up, or end of file).
    HungUp,
}

impl Keys {
    /// Errors: stdin is not a terminal and `/dev/tty` cannot be opened.
    pub fn open() -> std::io::Result<Keys> {
        if std::io::stdin().is_terminal() {
            return Ok(Keys { fd: 0, _tty: None });
        }
        let tty = std::fs::File::open("/dev/tty")?;
        Ok(Keys {
            fd: tty.as_raw_fd(),
            _tty: Some(tty),
        })
    }

    /// Waits at most `timeout` for keys and reads them.
    ///
    /// Errors: poll or read failed otherwise than by a signal.
    pub fn wait(&self, timeout: Duration) -> std::io::Result<Input> {
        let mut p = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(60_000) as libc::c_int;
        // SAFETY: one valid pollfd, and its count, 1.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return match e.kind() {
                std::io::ErrorKind::Interrupted => Ok(Input::Nothing),
                _ => Err(e),
            };
        }
        if p.revents & libc::POLLIN == 0 {
            return Ok(
                if p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
                    Input::HungUp
                } else {
                    Input::Nothing
                },
            );
        }
        let mut buf = [0u8; 256];
        // SAFETY: reads at most buf.len() bytes into buf, which lives across the call.
        let r = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) };
        match r {
            0 => Ok(Input::HungUp),
            r if r > 0 => Ok(Input::Keys(parse(&buf[..r as usize]))),
            _ => {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock => {
                        Ok(Input::Nothing)
                    }
                    // EIO: the terminal hung up.
                    _ if e.raw_os_error() == Some(libc::EIO) => Ok(Input::HungUp),
                    _ => Err(e),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_sequences() {
        use Key::*;
        assert_eq!(parse(b"q"), [Quit]);
        assert_eq!(parse(b"\x03"), [Quit]);
        assert_eq!(parse(b"\x1b"), [Quit]);
        assert_eq!(
            parse(b"ls\tb"),
            [Char('l'), Char('s'), Char('\t'), Char('b')]
        );
        assert_eq!(parse(b"\x1b[A\x1b[B\x1bOA"), [Up, Down, Up]);
        assert_eq!(
            parse(b"\x1b[5~\x1b[6~\x1b[H\x1b[1~"),
            [PageUp, PageDown, Home, Home]
        );
        // Unknown or cut-short sequences are skipped, not read as Esc.
        assert_eq!(parse(b"\x1b[15~i"), [Char('i')]);
        assert_eq!(parse(b"\x1b[1;5"), []);
        assert_eq!(parse(b"\x1bxl"), [Char('x'), Char('l')]);
    }
}
