//! `heapdump top --live`, driven in a real terminal: tmux runs it in an 80×24 pane, `send-keys`
//! types, `capture-pane -p` reads the screen. Every wait is a bounded poll of the pane.

mod common;

use common::*;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A tmux server of this test's own (its own socket), killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// A detached 80×24 session running a plain `sh` (no rc files: a predictable screen).
    fn start(name: &str) -> Tmux {
        let t = Tmux {
            socket: format!("heapdump-test-{name}-{}", std::process::id()),
        };
        let st = t
            .cmd()
            .args([
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-x",
                "80",
                "-y",
                "24",
            ])
            .args(["-s", "t", "sh"])
            .env("TERM", "xterm")
            .env("PS1", "$ ")
            .status()
            .unwrap();
        assert!(st.success(), "tmux new-session");
        t
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket]).stdin(Stdio::null());
        c
    }

    /// Types `keys` (tmux key names or literal text with `-l`).
    fn send(&self, args: &[&str]) {
        let st = self
            .cmd()
            .args(["send-keys", "-t", "t"])
            .args(args)
            .status()
            .unwrap();
        assert!(st.success(), "tmux send-keys {args:?}");
    }

    /// The pane's screen, one string per line.
    fn screen(&self) -> Vec<String> {
        let out = self
            .cmd()
            .args(["capture-pane", "-p", "-t", "t"])
            .output()
            .unwrap();
        assert!(out.status.success(), "tmux capture-pane");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// A pane format (`#{alternate_on}`, `#{cursor_flag}`, …).
    fn format(&self, f: &str) -> String {
        let out = self
            .cmd()
            .args(["display-message", "-p", "-t", "t", f])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Polls the screen until `ok` holds (returns it) or `limit` passes (panics, showing the
    /// last screen).
    fn wait(&self, what: &str, limit: Duration, ok: impl Fn(&[String]) -> bool) -> Vec<String> {
        let started = Instant::now();
        loop {
            let s = self.screen();
            if ok(&s) {
                return s;
            }
            assert!(
                started.elapsed() < limit,
                "waited {limit:?} for {what}; the screen:\n{}",
                s.join("\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").status();
    }
}

/// Whether tmux runs; prints the test as skipped when not (a failure under CI=true, where
/// `.ci/run` installs it).
fn have_tmux(test: &str) -> bool {
    let ok = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{test}: tmux is not installed (.ci/run installs it)"
        );
        println!("skipped: {test}: tmux is not installed");
    }
    ok
}

/// The sites table's rows: (site, line) for each line under the header (LIVE … SITE).
fn table(screen: &[String]) -> Vec<(String, String)> {
    let Some(h) = screen
        .iter()
        .position(|l| l.contains("LIVE") && l.contains("SITE"))
    else {
        return Vec::new();
    };
    screen[h + 1..]
        .iter()
        .take_while(|l| !l.trim().is_empty() && !l.contains(" · "))
        .map(|l| {
            (
                l.split_whitespace().last().unwrap_or("").to_owned(),
                l.clone(),
            )
        })
        .collect()
}

fn first_site(screen: &[String]) -> Option<String> {
    table(screen).first().map(|r| r.0.clone())
}

/// A shell command line that runs the live view on `pid` and then prints its exit status.
fn command_line(dir: &Path, pid: u32) -> String {
    command_line_with(dir, pid, "")
}

/// [`command_line`] with `env` (`NAME=VALUE `) before the command.
fn command_line_with(dir: &Path, pid: u32, env: &str) -> String {
    format!(
        "echo BEFORE-$((40+2)); {env}HEAPDUMP_DIR={} {} top --live --by-pid {pid}; echo EXIT=$?",
        dir.display(),
        heapdump().display()
    )
}

#[test]
fn live_view_shows_the_leak_rising_and_restores_the_terminal() {
    let test = "live_view_shows_the_leak_rising_and_restores_the_terminal";
    if !can_run(test) || !have_tmux(test) {
        return;
    }
    let dir = region_dir("live");
    let exe = compile_c("live_leak", &["-fno-optimize-sibling-calls"]);
    let mut prog = start(Command::new(exe), &dir, true);
    let pid = prog.pid();
    let tmux = Tmux::start("live");
    tmux.wait("the shell", Duration::from_secs(10), |s| {
        s.iter().any(|l| !l.trim().is_empty())
    });
    tmux.send(&["-l", &command_line(&dir, pid)]);
    tmux.send(&["Enter"]);

    // The first screen: the cache (2,000 blocks of 1,024 B) on top, sorted by live bytes; all
    // four columns fit 80 columns.
    // (A snapshot taken between the free and the malloc of a replacement shows 1,999: the
    // next one shows 2,000 again.)
    let s = tmux.wait("the first sample", Duration::from_secs(30), |s| {
        let t = table(s);
        t.first().is_some_and(|r| {
            r.0 == "fill_cache" && r.1.contains("2.0 MiB") && r.1.contains(" 2,000 ")
        }) && t.iter().any(|r| r.0 == "leak_more")
    });
    let header = s.iter().find(|l| l.contains("SITE")).unwrap();
    for col in ["LIVE", "Δ START", "Δ LAST", "BLOCKS"] {
        assert!(header.contains(col), "column {col} missing: {header}");
    }
    assert!(
        s[0].contains(&format!("pid {pid} (live_leak)")),
        "title: {}",
        s[0]
    );
    // Sorted by change since start, the slow leak (64 B every 100 ms) leads: the cache is flat.
    tmux.send(&["s"]);
    tmux.wait(
        "the leak first by Δ since start",
        Duration::from_secs(10),
        |s| first_site(s).as_deref() == Some("leak_more"),
    );
    // Back to live bytes: the cache leads again.
    tmux.send(&["l"]);
    tmux.wait(
        "the cache first by live bytes",
        Duration::from_secs(5),
        |s| first_site(s).as_deref() == Some("fill_cache"),
    );
    // The leak speeds up (6.25 MiB/s): it passes the cache's 2 MB within a refresh or two.
    let fast = Instant::now();
    writeln!(prog.stdin.as_mut().unwrap(), "fast").unwrap();
    let s = tmux.wait("the leak rising to the top", Duration::from_secs(5), |s| {
        first_site(s).as_deref() == Some("leak_more")
    });
    println!(
        "leak on top {:.1} s after it sped up:\n{}",
        fast.elapsed().as_secs_f64(),
        s.join("\n")
    );
    // The sparkline's range grew with it.
    assert!(
        s[2].contains("MiB") && s[3].contains("MiB"),
        "{}",
        s.join("\n")
    );

    // The target exits (left a zombie: not reaped until `finish`): said on the status line,
    // the last screen kept.
    drop(prog.stdin.take());
    let s = tmux.wait("the exit", Duration::from_secs(10), |s| {
        s.iter()
            .any(|l| l.contains(&format!("pid {pid} has exited")) && l.contains("q to quit"))
    });
    assert_eq!(prog.finish(), 0);
    assert_eq!(
        first_site(&s).as_deref(),
        Some("leak_more"),
        "{}",
        s.join("\n")
    );

    // q: exit status 0, the shell's screen back (alternate screen left), the cursor shown.
    tmux.send(&["q"]);
    let s = tmux.wait("the shell after q", Duration::from_secs(10), |s| {
        s.iter().any(|l| l == "EXIT=0") || s.iter().any(|l| l.starts_with("EXIT="))
    });
    assert!(s.iter().any(|l| l == "EXIT=0"), "{}", s.join("\n"));
    assert!(s.iter().any(|l| l == "BEFORE-42"), "{}", s.join("\n"));
    assert!(!s.iter().any(|l| l.contains("SITE")), "{}", s.join("\n"));
    assert_eq!(tmux.format("#{alternate_on} #{cursor_flag}"), "0 1");
}

#[test]
fn live_view_quits_on_escape_and_on_sigterm() {
    let test = "live_view_quits_on_escape_and_on_sigterm";
    if !can_run(test) || !have_tmux(test) {
        return;
    }
    let dir = region_dir("live-keys");
    let prog = hold_sized(&dir, 10, 80);
    let pid = prog.pid();
    let tmux = Tmux::start("live-keys");
    tmux.wait("the shell", Duration::from_secs(10), |s| {
        s.iter().any(|l| !l.trim().is_empty())
    });
    for quit in ["Escape", "C-c", "SIGTERM"] {
        tmux.send(&["-l", &command_line(&dir, pid)]);
        tmux.send(&["Enter"]);
        let s = tmux.wait("the table", Duration::from_secs(30), |s| {
            first_site(s).as_deref() == Some("hold_blocks")
        });
        let row = &table(&s)[0].1;
        // hold_sized 10 80: 10 blocks of 80 B and their array of 10 pointers.
        assert!(
            row.contains(" 880 B ") && row.ends_with(" 11 hold_blocks"),
            "{row}"
        );
        if quit == "Escape" {
            // A narrower terminal: the columns that do not fit go, least useful first; the
            // site stays.
            let st = tmux
                .cmd()
                .args(["resize-window", "-t", "t", "-x", "50", "-y", "24"])
                .status()
                .unwrap();
            assert!(st.success());
            let s = tmux.wait("two columns at 50", Duration::from_secs(10), |s| {
                s.iter().any(|l| {
                    l.contains("LIVE")
                        && l.contains("Δ START")
                        && !l.contains("Δ LAST")
                        && !l.contains("BLOCKS")
                })
            });
            assert_eq!(first_site(&s).as_deref(), Some("hold_blocks"));
            assert!(s.iter().all(|l| l.chars().count() <= 50));
            // And back.
            let st = tmux
                .cmd()
                .args(["resize-window", "-t", "t", "-x", "80", "-y", "24"])
                .status()
                .unwrap();
            assert!(st.success());
            tmux.wait("four columns at 80", Duration::from_secs(10), |s| {
                s.iter().any(|l| l.contains("BLOCKS") && l.contains("SITE"))
            });
        }
        if quit == "SIGTERM" {
            // The shell's child: the heapdump it runs.
            let shell = tmux.format("#{pane_pid}");
            let children =
                std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).unwrap();
            let p: i32 = children
                .split_whitespace()
                .next()
                .expect("a child")
                .parse()
                .unwrap();
            // SAFETY: kill has no memory-safety preconditions; p is the heapdump we started.
            assert_eq!(unsafe { libc::kill(p, libc::SIGTERM) }, 0);
        } else {
            tmux.send(&[quit]);
        }
        let s = tmux.wait("the shell", Duration::from_secs(10), |s| {
            s.iter().any(|l| l.starts_with("EXIT="))
        });
        assert!(s.iter().any(|l| l == "EXIT=0"), "{quit}: {}", s.join("\n"));
        assert_eq!(
            tmux.format("#{alternate_on} #{cursor_flag}"),
            "0 1",
            "{quit}"
        );
        tmux.send(&["-l", "clear"]);
        tmux.send(&["Enter"]);
        tmux.wait("a clear screen", Duration::from_secs(10), |s| {
            !s.iter().any(|l| l.starts_with("EXIT="))
        });
    }
    drop(prog);
}

#[test]
fn live_view_refuses_a_stdout_that_is_not_a_terminal() {
    // Refused before the target is looked for: any pid does.
    let dir = region_dir("live-pipe");
    let t = heapdump_timeout(
        &dir,
        &["top", "--live", "--by-pid", "1"],
        Duration::from_secs(30),
    );
    assert_eq!(t.code, Some(2), "{t:?}");
    assert_eq!(t.stdout, "");
    assert_eq!(t.stderr.lines().count(), 1, "{}", t.stderr);
    assert!(
        t.stderr.contains("not") && t.stderr.contains("terminal"),
        "{}",
        t.stderr
    );
}

/// The terminal goes away under the view (the SSH connection drops, the terminal window is
/// closed): the view ends by itself instead of spinning on a terminal that reads as empty.
#[test]
fn live_view_ends_when_its_terminal_hangs_up() {
    let test = "live_view_ends_when_its_terminal_hangs_up";
    if !can_run(test) || !have_tmux(test) {
        return;
    }
    let dir = region_dir("live-hangup");
    let prog = hold_sized(&dir, 10, 80);
    let pid = prog.pid();
    let tmux = Tmux::start("live-hangup");
    tmux.wait("the shell", Duration::from_secs(10), |s| {
        s.iter().any(|l| !l.trim().is_empty())
    });
    tmux.send(&["-l", &command_line(&dir, pid)]);
    tmux.send(&["Enter"]);
    tmux.wait("the table", Duration::from_secs(30), |s| {
        first_site(s).as_deref() == Some("hold_blocks")
    });
    let shell = tmux.format("#{pane_pid}");
    let children = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).unwrap();
    let view: u32 = children
        .split_whitespace()
        .next()
        .expect("a child")
        .parse()
        .unwrap();
    drop(tmux); // kill-server: the pane's terminal hangs up
    let started = Instant::now();
    let gone = |p: u32| {
        std::fs::read_to_string(format!("/proc/{p}/stat")).map_or(true, |s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    };
    while !gone(view) {
        if started.elapsed() > Duration::from_secs(10) {
            // SAFETY: kill has no memory-safety preconditions; `view` is the heapdump we started.
            unsafe { libc::kill(view as i32, libc::SIGKILL) };
            panic!("the live view (pid {view}) still runs 10 s after its terminal hung up");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(prog);
}

/// An error or a panic inside the view: the message is printed on the shell's screen, the
/// terminal restored (main screen, cursor shown), the exit status 1 (error) or 134 (the
/// release profile aborts on a panic).
#[test]
fn live_view_restores_the_terminal_on_error_and_on_panic() {
    let test = "live_view_restores_the_terminal_on_error_and_on_panic";
    if !can_run(test) || !have_tmux(test) {
        return;
    }
    let dir = region_dir("live-fail");
    let prog = hold_sized(&dir, 10, 80);
    let pid = prog.pid();
    let tmux = Tmux::start("live-fail");
    tmux.wait("the shell", Duration::from_secs(10), |s| {
        s.iter().any(|l| !l.trim().is_empty())
    });
    for (how, status, message) in [
        ("error", "EXIT=1", "heapdump: HEAPDUMP_TEST_LIVE_FAIL=error"),
        ("panic", "EXIT=134", "HEAPDUMP_TEST_LIVE_FAIL=panic"),
    ] {
        tmux.send(&["-l", "clear"]);
        tmux.send(&["Enter"]);
        tmux.wait("a clear screen", Duration::from_secs(10), |s| {
            !s.iter().any(|l| l.starts_with("EXIT="))
        });
        let env = format!("RUST_BACKTRACE=0 HEAPDUMP_TEST_LIVE_FAIL={how} ");
        let line = command_line_with(&dir, pid, &env);
        tmux.send(&["-l", &line]);
        tmux.send(&["Enter"]);
        let s = tmux.wait("the shell", Duration::from_secs(30), |s| {
            s.iter().any(|l| l.starts_with("EXIT="))
        });
        assert!(s.iter().any(|l| l == status), "{how}: {}", s.join("\n"));
        assert!(
            s.iter().any(|l| l.contains(message) && !l.contains("EXIT")),
            "{how}: {}",
            s.join("\n")
        );
        assert!(
            !s.iter().any(|l| l.contains("SITE")),
            "{how}: {}",
            s.join("\n")
        );
        assert_eq!(
            tmux.format("#{alternate_on} #{cursor_flag}"),
            "0 1",
            "{how}"
        );
        // The terminal is out of raw mode: a typed line is echoed and run by the shell.
        tmux.send(&["-l", "echo COOKED-$((6*7))"]);
        tmux.send(&["Enter"]);
        tmux.wait("the shell's echo", Duration::from_secs(10), |s| {
            s.iter().any(|l| l == "COOKED-42")
        });
    }
    drop(prog);
}

/// A target that execs: the view follows the new image's region (same pid, a newer file).
#[test]
fn live_view_follows_an_exec() {
    let test = "live_view_follows_an_exec";
    if !can_run(test) || !have_tmux(test) {
        return;
    }
    let dir = region_dir("live-exec");
    let hold = compile_c("hold_sized", &[]);
    // bash under the shim until a line on stdin, then hold_sized (the shim still preloaded).
    let mut cmd = Command::new("bash");
    cmd.arg("-c").arg(format!(
        "echo ready $$; read line; exec {} 10 80",
        hold.display()
    ));
    let mut prog = start(cmd, &dir, true);
    let pid = prog.pid();
    let tmux = Tmux::start("live-exec");
    tmux.wait("the shell", Duration::from_secs(10), |s| {
        s.iter().any(|l| !l.trim().is_empty())
    });
    tmux.send(&["-l", &command_line(&dir, pid)]);
    tmux.send(&["Enter"]);
    tmux.wait("bash's sites", Duration::from_secs(30), |s| {
        !table(s).is_empty() && !table(s).iter().any(|r| r.0 == "hold_blocks")
    });
    writeln!(prog.stdin.as_mut().unwrap(), "go").unwrap();
    let s = tmux.wait("hold_sized's sites", Duration::from_secs(30), |s| {
        table(s)
            .first()
            .is_some_and(|r| r.0 == "hold_blocks" && r.1.contains(" 880 B "))
    });
    assert!(
        !s.iter().any(|l| l.contains("refresh failed")),
        "{}",
        s.join("\n")
    );
    tmux.send(&["q"]);
    let s = tmux.wait("the shell", Duration::from_secs(10), |s| {
        s.iter().any(|l| l.starts_with("EXIT="))
    });
    assert!(s.iter().any(|l| l == "EXIT=0"), "{}", s.join("\n"));
}
