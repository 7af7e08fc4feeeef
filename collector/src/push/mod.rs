//! Sending profiles to a continuous-profiling server (`--push URL`): Grafana Pyroscope
//! (`--push-format pyroscope`, the default) or Parca (`--push-format parca`, [`parca`]).
//!
//! Pyroscope: one profile is one Connect unary call, `POST {URL}/push.v1.PusherService/Push`
//! with `Content-Type: application/proto` and a `push.v1.PushRequest` body
//! (`proto/pyroscope.proto`): one series whose labels are `__name__=memory`, `__delta__=false`
//! (the profile's `alloc_*` values are already deltas, made here: the server must not subtract
//! the previous profile), `service_name` (default: the process name), `hostname`, `pid` and the
//! user's `--label`s, holding the gzip-compressed pprof profile. HTTP goes through `ureq`
//! (rustls for https). Parca gets the same labels but `__delta__` in a gRPC `WriteRaw` call.
//!
//! `watch` queues what it could not send ([`queue::Queue`]), retried in order with exponential backoff
//! from [`queue::BACKOFF_MIN`] to [`queue::BACKOFF_MAX`]: at most [`queue::QUEUE_ITEMS`] profiles and
//! [`queue::QUEUE_BYTES`] bytes in memory, or, with `-o DIR`, in `DIR/.spool` ([`spool`]) up to
//! `--spool-max-bytes`, where the next watch finds what this one could not send; the oldest are
//! dropped first (counted on stderr).
//!
//! What is pushed is not quite the profile `-o` writes ([`delta::for_push`]): `alloc_*` are deltas
//! since the previous push of the same process ([`delta::AllocState`]; the first push sends them as
//! 0), and a profile past the servers' limits ([`delta::MAX_SAMPLES`], [`delta::MAX_PROFILE_BYTES`]) is
//! aggregated by stack and, if still too many samples, trimmed ([`delta::trim`]).
//!
//! Modules: [`client`] (one server, whatever its API), [`pyroscope`] and [`parca`] (the two
//! APIs), [`delta`] (what is pushed of a profile), [`queue`] (`watch`'s queue and sending
//! thread), [`spool`] (the queue on disk). This module holds what they share: the options
//! ([`PushProps`]), one push ([`Item`]) and why it failed ([`Failure`]); it imports none of them.

pub mod client;
pub mod delta;
pub mod parca;
pub mod pyroscope;
pub mod queue;
pub mod spool;

use std::time::Duration;

/// `--push-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PushFormat {
    /// Grafana Pyroscope: Connect `push.v1.PusherService/Push` over HTTP/1.1.
    Pyroscope,
    /// Parca (and Polar Signals Cloud): gRPC
    /// `parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw` over HTTP/2.
    Parca,
}

/// Where and how to push profiles.
#[derive(Debug, Clone)]
pub struct PushProps {
    /// The server's base URL, without a trailing `/`.
    pub url: String,
    /// The server's API.
    pub format: PushFormat,
    /// The user's labels (`--label`), in order.
    pub labels: Vec<(String, String)>,
    /// `Authorization` header value, if any (`Bearer …` or `Basic …`).
    pub authorization: Option<String>,
    /// `X-Scope-OrgID`.
    pub tenant: Option<String>,
    /// Longest time per push.
    pub timeout: Duration,
}

/// One profile to push, whatever the server's API.
#[derive(Debug, Clone)]
pub struct Item {
    /// Its labels ([`client::Client::labels`]), sorted by name; the API's own (Pyroscope's
    /// `__delta__`) are added when it is sent.
    pub labels: Vec<(String, String)>,
    /// The gzip-compressed pprof profile.
    pub profile: Vec<u8>,
    /// An identifier of this push (a random UUID): Pyroscope's `RawSample.ID`.
    pub id: String,
    /// What it is, for messages: `pid 1234 (server)`.
    pub what: String,
}

/// Why a push failed.
#[derive(Debug)]
pub struct Failure {
    /// One line: what failed and why.
    pub text: String,
    /// Whether trying again may succeed (network errors, HTTP 408, 429, 5xx, gRPC
    /// `UNAVAILABLE`, ...); other refusals (bad request, authentication) will not.
    pub retry: bool,
}

/// `text` on one line.
pub fn one_line(text: &str) -> String {
    // The server's text: its control characters escaped (terminal escapes in an error body).
    crate::regions::shown(&text.split_whitespace().collect::<Vec<_>>().join(" ")).into_owned()
}

#[cfg(test)]
mod tests {
    /// A push server's error body (helper E, F6) reaches the terminal on one line, its terminal
    /// escapes escaped.
    #[test]
    fn a_servers_text_is_one_line_without_escapes() {
        assert_eq!(
            super::one_line("bad\x1b[2J\x1b]0;owned\x07 request\n  here"),
            "bad\\u{1b}[2J\\u{1b}]0;owned\\u{7} request here"
        );
    }
}
