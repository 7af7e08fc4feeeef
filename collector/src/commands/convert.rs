//! `heapdump convert`: a capture, or a saved pprof profile, into another format.

use super::graph::{check_output_kind, write_graph};
use super::stages;
use crate::analysis::{analysis, Source};
use crate::{cli, graph, pprof};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;

/// What `convert` reads and writes.
#[derive(Debug, Clone)]
pub struct Options {
    /// A graph capture or a gzip pprof profile (told by content).
    pub capture: PathBuf,
    /// The output; its name says the format.
    pub output: PathBuf,
    /// From a pprof profile: the sample type the flame graph shows.
    pub sample_index: Option<&'static str>,
}

impl From<cli::ConvertArgs> for Options {
    fn from(a: cli::ConvertArgs) -> Self {
        Options {
            capture: a.capture,
            output: a.output,
            sample_index: a.sample_index.map(cli::SampleIndex::as_str),
        }
    }
}

/// `heapdump convert INPUT -o OUT`: a capture, or a gzip pprof profile (told by content).
pub fn run(a: Options) -> Result<()> {
    if !graph::capture::is_capture(&a.capture) {
        if pprof::is_gzip(&a.capture) {
            return convert_profile(&a);
        }
        crate::regions::open_regular(&a.capture)
            .with_context(|| format!("cannot open {}", a.capture.display()))?;
        bail!(
            "{}: neither a graph capture (written by `heapdump graph --by-pid PID -o \
             FILE.hdsnap`) nor a gzip-compressed pprof profile (written by `heapdump snapshot`)",
            a.capture.display()
        );
    }
    if a.sample_index.is_some() {
        // Helper W, 3: the message spoke of flame graphs when a profile was asked for.
        bail!(
            "--sample-index applies to a pprof profile given as input; from a capture, the \
             profile holds live blocks only (inuse_space, then inuse_objects: choose with \
             `go tool pprof -sample_index=inuse_objects`) and its flame graph shows bytes"
        );
    }
    check_output_kind(&a.output)?;
    let stage = stages();
    let t = Source::Capture(a.capture.clone());
    let an = analysis(&t, &stage)?;
    write_graph(&an, &a.output, &stage)
}

/// `heapdump convert PROFILE.pb.gz -o OUT.{svg,pb.gz}`: a flame graph of a saved profile.
fn convert_profile(a: &Options) -> Result<()> {
    let name = a.output.to_string_lossy();
    let format = if name.ends_with(".svg") {
        pprof::Format::Svg
    } else if name.ends_with(".pb.gz") || a.output.as_os_str() == "-" {
        pprof::Format::Pprof
    } else {
        bail!(
            "{}: from a pprof profile, convert writes FILE.svg (a flame graph) or FILE.pb.gz; \
             the reference graph (.heapsnapshot, .hdsnap) needs a capture \
             (`heapdump graph --by-pid PID -o FILE.hdsnap`)",
            a.output.display()
        )
    };
    let mut p = pprof::read(&a.capture)?;
    let what = a
        .capture
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    pprof::write_as(&mut p, &[], &a.output, format, a.sample_index, &what)?;
    eprintln!(
        "heapdump: {}: {} samples -> {}",
        a.capture.display(),
        p.sample.len(),
        a.output.display()
    );
    Ok(())
}
