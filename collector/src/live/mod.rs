//! `heapdump top --live`: a live terminal view of a running process's heap, like `top`.
//!
//! A sampler thread ([`sampler`]) snapshots the target every `--every` and sums its live
//! blocks per allocation site; the main thread draws them ([`view`], with ratatui on
//! crossterm: plain ANSI sequences, so it works over SSH and in any terminal of 80×24 or more)
//! and reads keys. The terminal is put back as it was (raw mode off, main screen, cursor
//! shown) on every way out: `q`/Esc/Ctrl-C, an error, a panic (a hook restores it first), and
//! SIGTERM, SIGHUP or SIGINT (handled as `q`). Anchor: memray's live mode (`memray run
//! --live`), which shows the same table of sites over time.

mod keys;
mod sampler;
mod view;

use crate::cli::{Target, TopArgs};
use crate::regions;
use anyhow::{bail, Context, Result};
use keys::{Input, Key, Keys};
use ratatui::crossterm::{cursor, execute, terminal};
use ratatui::prelude::CrosstermBackend;
use sampler::Msg;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use view::{Model, SortKey};

/// Exit status when stdout is not a terminal (a usage error, as clap's).
const EXIT_NOT_A_TERMINAL: i32 = 2;

/// `--every` when not given.
const DEFAULT_EVERY: Duration = Duration::from_secs(1);

/// Shortest `--every`.
const MIN_EVERY: Duration = Duration::from_millis(100);

/// How often keys and signals are looked at while no sample arrives.
const TICK: Duration = Duration::from_millis(50);

/// Runs the live view of `heapdump top --live` until `q`, Esc, Ctrl-C or a terminating
/// signal.
///
/// Exits the process with status 2 (one line on stderr) when stdout is not a terminal.
/// Errors: the target cannot be found or opened (before the screen is taken); the terminal
/// cannot be set up or read. A failed refresh is shown on the screen and the view goes on;
/// the target's exit is shown, with the last screen kept until `q`.
pub fn run(a: &TopArgs) -> Result<()> {
    if !std::io::stdout().is_terminal() {
        eprintln!(
            "heapdump: top --live draws on a terminal and stdout is not one; for a file use \
             `heapdump snapshot` or `heapdump watch`"
        );
        std::process::exit(EXIT_NOT_A_TERMINAL);
    }
    let target = match (&a.target.by_pid, &a.target.by_name) {
        (Some(pid), _) => Target::Pid(*pid),
        (None, Some(name)) => Target::Name(name.clone()),
        (None, None) => bail!("top --live follows a running process: pass --by-pid or --by-name"),
    };
    let every = a.every.unwrap_or(DEFAULT_EVERY);
    if every < MIN_EVERY {
        bail!(
            "--every {}: the interval is at least {}",
            humantime::format_duration(every),
            humantime::format_duration(MIN_EVERY)
        );
    }
    let (path, file) = crate::regions::pick(&target)?;
    let usable = regions::open_usable(&path, file.as_ref())?;
    let pid = usable.info.pid;
    let label = format!("{pid} ({})", regions::command_label(&usable.info));
    drop(usable);
    let src = sampler::Source {
        path,
        file,
        pid,
        every,
        lock_timeout: Duration::from_secs_f64(a.target.lock_timeout.clamp(0.0, 1e6)),
    };
    install_signals();
    let mut screen = Screen::enter().context("cannot set up the terminal")?;
    let (tx, rx) = std::sync::mpsc::channel();
    let sampler = sampler::start(src, tx).context("cannot start the sampler thread")?;
    let mut model = Model::new(label, every);
    let r = event_loop(&mut screen, &mut model, &rx);
    // The shell's screen back at once; then wait out a snapshot in progress (milliseconds),
    // so that no lease is left behind.
    drop(screen);
    sampler.stop();
    r
}

/// Draws on every sample and key until asked to quit.
fn event_loop(
    screen: &mut Screen,
    model: &mut Model,
    rx: &std::sync::mpsc::Receiver<Msg>,
) -> Result<()> {
    let keys = Keys::open().context(
        "no terminal to read keys from (stdin is not one, and /dev/tty cannot be opened)",
    )?;
    let mut dirty = true;
    let mut last_second = u64::MAX;
    let mut last_size = ratatui::layout::Size::default();
    loop {
        while let Ok(m) = rx.try_recv() {
            match m {
                Msg::Sample(s) => model.push(*s),
                Msg::Error(e) => model.error = Some(e),
                Msg::Exited(why) => model.exited = Some(why),
            }
            dirty = true;
        }
        // The uptime in the title moves once a second, until the target is gone.
        let second = model.uptime().as_secs();
        if second != last_second && model.exited.is_none() {
            last_second = second;
            dirty = true;
        }
        // A resize is seen here, within a tick; `draw` then fits the new size.
        let size = screen
            .terminal
            .size()
            .context("cannot read the terminal's size")?;
        if size != last_size {
            last_size = size;
            dirty = true;
        }
        if dirty {
            screen
                .terminal
                .draw(|f| view::draw(f, model))
                .context("cannot draw on the terminal")?;
            dirty = false;
        }
        if SIGNALLED.load(Ordering::SeqCst) {
            return Ok(());
        }
        if model.refreshes > 0 {
            test_failure()?;
        }
        let keys = match keys.wait(TICK).context("cannot read the terminal")? {
            Input::Nothing => continue,
            Input::HungUp => return Ok(()),
            Input::Keys(k) => k,
        };
        for k in keys {
            match k {
                Key::Quit => return Ok(()),
                Key::Char('l') => model.sort = SortKey::Live,
                Key::Char('s') => model.sort = SortKey::SinceStart,
                Key::Char('i') => model.sort = SortKey::LastInterval,
                Key::Char('b') => model.sort = SortKey::Blocks,
                Key::Char('\t') => model.sort = model.sort.next(),
                Key::Down | Key::Char('j') => model.offset += 1,
                Key::Up | Key::Char('k') => model.offset = model.offset.saturating_sub(1),
                Key::PageDown => model.offset += 10,
                Key::PageUp => model.offset = model.offset.saturating_sub(10),
                Key::Home => model.offset = 0,
                Key::Char(_) => continue,
            }
            // Scrolling past the end is clamped when drawn; keep the offset there too.
            model.offset = model.offset.min(model.rows().len().saturating_sub(1));
            dirty = true;
        }
    }
}

/// Tests only: with `HEAPDUMP_TEST_LIVE_FAIL=panic` the view panics once the first sample is
/// on the screen, with `=error` it fails with an error: the terminal must be restored either
/// way.
fn test_failure() -> Result<()> {
    match std::env::var("HEAPDUMP_TEST_LIVE_FAIL").as_deref() {
        Ok("panic") => panic!("HEAPDUMP_TEST_LIVE_FAIL=panic"),
        Ok("error") => bail!("HEAPDUMP_TEST_LIVE_FAIL=error"),
        _ => Ok(()),
    }
}

/// Set by SIGTERM, SIGHUP and SIGINT: the view ends as on `q`.
static SIGNALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    SIGNALLED.store(true, Ordering::SeqCst);
}

/// Handles SIGTERM, SIGHUP (the SSH connection dropped) and SIGINT (raw mode turns Ctrl-C
/// into a key, but `kill -INT` still sends it) by asking the view to end, so that the terminal
/// is restored. A second one kills at once (SA_RESETHAND). The snapshot's lease guard leaves
/// handlers it finds installed alone.
fn install_signals() {
    for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT] {
        // SAFETY: a zeroed sigaction is valid; the handler only stores to an atomic, which is
        // async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            sa.sa_flags = libc::SA_RESTART | libc::SA_RESETHAND;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// The terminal while the view owns it: raw mode, alternate screen, cursor hidden. Dropping
/// it restores all three.
struct Screen {
    terminal: ratatui::Terminal<CrosstermBackend<std::io::Stdout>>,
}

/// Whether the terminal is in the view's state (what the panic hook restores).
static ENTERED: AtomicBool = AtomicBool::new(false);

impl Screen {
    fn enter() -> std::io::Result<Screen> {
        // A panic (the release profile aborts on one) restores the terminal before the
        // message is printed, so that the message is readable and the shell usable.
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
        ENTERED.store(true, Ordering::SeqCst);
        let set_up = || -> std::io::Result<Screen> {
            terminal::enable_raw_mode()?;
            execute!(
                std::io::stdout(),
                terminal::EnterAlternateScreen,
                cursor::Hide
            )?;
            let mut terminal = ratatui::Terminal::new(CrosstermBackend::new(std::io::stdout()))?;
            terminal.clear()?;
            Ok(Screen { terminal })
        };
        set_up().inspect_err(|_| restore())
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        restore();
    }
}

/// Puts the terminal back (once): raw mode off, the main screen, the cursor shown. Errors
/// are ignored: the terminal may be gone (SIGHUP).
fn restore() {
    if ENTERED.swap(false, Ordering::SeqCst) {
        let _ = terminal::disable_raw_mode();
        let _ = execute!(
            std::io::stdout(),
            terminal::LeaveAlternateScreen,
            cursor::Show
        );
    }
}
