//! One module per command. Each converts its clap arguments ([`crate::cli`]) into a plain
//! options struct and runs with it (`run`); `main` only dispatches.

pub mod convert;
pub mod gc;
pub mod graph;
pub mod leaks;
pub mod list;
pub mod retainers;
pub mod run;
pub mod snapshot;
pub mod top;
pub mod watch;

use crate::analysis::{Live, Source};
use crate::cli;
use crate::regions::Target;

impl From<cli::LiveTarget> for Source {
    fn from(t: cli::LiveTarget) -> Self {
        let target = match (t.file, t.by_pid, t.by_name) {
            (Some(file), _, _) => return Source::Capture(file),
            (None, Some(p), _) => Target::Pid(p),
            (None, None, Some(n)) => Target::Name(n),
            (None, None, None) => unreachable!("clap requires a capture, a pid or a name here"),
        };
        Source::Live(Live {
            target,
            stop: t.stop,
            lock_timeout: t.lock_timeout,
        })
    }
}

/// How allocation sites are named: the default allocator wrappers and `--drop-frames`.
///
/// Errors: `drop_frames` is not a regular expression.
pub fn site_rule(drop_frames: Option<&str>) -> anyhow::Result<crate::sites::Sites> {
    check_regex(drop_frames)?;
    Ok(crate::sites::Sites::new(drop_frames)?)
}

/// Checks `--drop-frames` alone, for an error that names it and nothing else.
pub fn check_regex(drop_frames: Option<&str>) -> anyhow::Result<()> {
    use anyhow::Context;
    if let Some(d) = drop_frames {
        regex::Regex::new(d)
            .with_context(|| format!("--drop-frames {d:?} is not a regular expression"))?;
    }
    Ok(())
}

/// Stage messages on stderr when it is a terminal.
pub fn stages() -> impl Fn(&str) {
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let started = std::time::Instant::now();
    move |what: &str| {
        if progress {
            eprintln!(
                "heapdump: [{:>6.2} s] {what}",
                started.elapsed().as_secs_f64()
            );
        }
    }
}
