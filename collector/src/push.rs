//! Sending profiles to Grafana Pyroscope (`--push URL`).
//!
//! One profile is one Connect unary call, `POST {URL}/push.v1.PusherService/Push` with
//! `Content-Type: application/proto` and a `push.v1.PushRequest` body (`proto/pyroscope.proto`):
//! one series whose labels are `__name__=memory`, `__delta__=false` (the profile's `alloc_*`
//! values are sent as they are, not subtracted from the previous profile by the server),
//! `service_name` (default: the process name), `hostname`, `pid` and the user's `--label`s,
//! holding the gzip-compressed pprof profile. HTTP goes through `ureq` (rustls for https).
//!
//! `watch` queues what it could not send ([`Queue`]): at most [`QUEUE_ITEMS`] profiles and
//! [`QUEUE_BYTES`] bytes in memory, oldest dropped first (counted on stderr), retried in order
//! with exponential backoff from [`BACKOFF_MIN`] to [`BACKOFF_MAX`].

use crate::cli::PushProps;
use heapdump_proto::pyroscope as pb;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Most profiles waiting to be pushed again.
pub const QUEUE_ITEMS: usize = 100;
/// Most bytes (encoded requests) waiting to be pushed again.
pub const QUEUE_BYTES: usize = 64 << 20;
/// First wait after a failed push.
pub const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// Longest wait between two tries.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// A connection pool to one server, with what every push sends.
#[derive(Debug)]
pub struct Client {
    agent: ureq::Agent,
    props: PushProps,
    endpoint: String,
    hostname: String,
}

/// One encoded push of one profile.
#[derive(Debug, Clone)]
pub struct Item {
    /// The `PushRequest`, encoded.
    pub body: Vec<u8>,
    /// What it is, for messages: `pid 1234 (server)`.
    pub what: String,
}

/// Why a push failed.
#[derive(Debug)]
pub struct Failure {
    /// One line: what failed and why.
    pub text: String,
    /// Whether trying again may succeed (network errors, 408, 429, 5xx); other refusals
    /// (bad request, authentication) will not.
    pub retry: bool,
}

impl Client {
    /// A client for `props.url` (no connection is made yet).
    pub fn new(props: &PushProps) -> Client {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(props.timeout))
            .http_status_as_error(false)
            .user_agent(concat!("heapdump/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        Client {
            agent,
            endpoint: format!("{}/push.v1.PusherService/Push", props.url),
            props: props.clone(),
            hostname,
        }
    }

    /// The labels of a profile of process `pid` named `name`, sorted by name.
    pub fn labels(&self, name: &str, pid: u32) -> Vec<(String, String)> {
        let mut l: Vec<(String, String)> = vec![
            ("__name__".into(), "memory".into()),
            ("__delta__".into(), "false".into()),
            ("service_name".into(), name.into()),
            ("hostname".into(), self.hostname.clone()),
            ("pid".into(), pid.to_string()),
        ];
        for (k, v) in &self.props.labels {
            match l.iter_mut().find(|(n, _)| n == k) {
                Some(e) => e.1 = v.clone(),
                None => l.push((k.clone(), v.clone())),
            }
        }
        l.sort();
        l
    }

    /// The push of `gz` (a gzip-compressed pprof profile) of process `pid` named `name`.
    pub fn item(&self, name: &str, pid: u32, gz: &[u8]) -> Item {
        use prost::Message;
        let req = pb::PushRequest {
            series: vec![pb::RawProfileSeries {
                labels: (self.labels(name, pid).into_iter())
                    .map(|(name, value)| pb::LabelPair { name, value })
                    .collect(),
                samples: vec![pb::RawSample {
                    raw_profile: gz.to_vec(),
                    id: uuid_v4(),
                }],
            }],
        };
        Item {
            body: req.encode_to_vec(),
            what: format!("pid {pid} ({name})"),
        }
    }

    /// Pushes `item` once.
    ///
    /// Errors: the server cannot be reached or answers with a status other than 2xx (the text
    /// gives the status and the start of the server's message).
    pub fn send(&self, item: &Item) -> Result<(), Failure> {
        let mut req = self
            .agent
            .post(&self.endpoint)
            .header("Content-Type", "application/proto")
            .header("Connect-Protocol-Version", "1");
        if let Some(a) = &self.props.authorization {
            req = req.header("Authorization", a);
        }
        if let Some(t) = &self.props.tenant {
            req = req.header("X-Scope-OrgID", t);
        }
        let fail = |text: String, retry: bool| Failure {
            text: format!("push of {} to {} failed: {text}", item.what, self.props.url),
            retry,
        };
        let mut resp = match req.send(&item.body[..]) {
            Ok(r) => r,
            Err(e) => return Err(fail(one_line(&e.to_string()), true)),
        };
        let status = resp.status().as_u16();
        if (200..300).contains(&status) {
            // Read the (empty) answer so that the connection can be reused.
            let _ = resp.body_mut().read_to_vec();
            return Ok(());
        }
        let body = resp
            .body_mut()
            .with_config()
            .limit(4096)
            .read_to_string()
            .unwrap_or_default();
        let retry = status == 408 || status == 429 || status >= 500;
        let mut text = format!("HTTP {status}");
        let body = one_line(&body);
        if !body.is_empty() {
            text.push_str(": ");
            text.extend(body.chars().take(200));
        }
        Err(fail(text, retry))
    }
}

/// `text` on one line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A random UUID (version 4) from the kernel's random source; from the time and pid if that
/// cannot be read.
fn uuid_v4() -> String {
    let mut b = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b));
    if read.is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        b[..8].copy_from_slice(&t.to_le_bytes());
        b[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// Standard base64 (RFC 4648, with padding) of `data`, for HTTP Basic authentication.
pub fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16
            | (c.get(1).copied().unwrap_or(0) as u32) << 8
            | c.get(2).copied().unwrap_or(0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Pushes waiting to be sent, oldest first, bounded by [`QUEUE_ITEMS`] and [`QUEUE_BYTES`].
#[derive(Debug)]
pub struct Queue {
    items: VecDeque<Item>,
    bytes: usize,
    /// Failed tries in a row.
    failures: u32,
    /// When the next try is due.
    next_try: Instant,
    /// Profiles dropped: the queue was full, or the server refused them for good.
    pub dropped: u64,
    /// Profiles sent.
    pub sent: u64,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            items: VecDeque::new(),
            bytes: 0,
            failures: 0,
            next_try: Instant::now(),
            dropped: 0,
            sent: 0,
        }
    }
}

impl Queue {
    /// Profiles waiting.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// When the next try is due (`None`: nothing waits).
    pub fn due(&self) -> Option<Instant> {
        (!self.items.is_empty()).then_some(self.next_try)
    }

    /// Makes the next try due now (whatever the backoff).
    pub fn retry_now(&mut self) {
        self.next_try = Instant::now();
    }

    /// Appends `item`, dropping the oldest ones (one line each) past the bounds.
    pub fn push(&mut self, item: Item) {
        self.bytes += item.body.len();
        self.items.push_back(item);
        while self.items.len() > QUEUE_ITEMS || (self.bytes > QUEUE_BYTES && self.items.len() > 1) {
            let old = self.items.pop_front().expect("not empty");
            self.bytes -= old.body.len();
            self.dropped += 1;
            eprintln!(
                "heapdump: push queue full ({} profiles, {} bytes at most): dropped the oldest, \
                 of {} ({} dropped so far)",
                QUEUE_ITEMS, QUEUE_BYTES, old.what, self.dropped
            );
        }
    }

    /// Sends the waiting profiles in order while tries are due, stopping at the first failure
    /// (one line on stderr; the next try waits twice as long as the last, from
    /// [`BACKOFF_MIN`] to [`BACKOFF_MAX`]). A profile the server refuses for good is dropped
    /// with one line. `stop` is checked between profiles.
    pub fn pump(&mut self, client: &Client, stop: &dyn Fn() -> bool) {
        while let Some(item) = self.items.front() {
            if Instant::now() < self.next_try || stop() {
                return;
            }
            match client.send(item) {
                Ok(()) => {
                    if self.failures > 0 {
                        eprintln!(
                            "heapdump: push of {} succeeded after {} failed tries",
                            item.what, self.failures
                        );
                    }
                    self.failures = 0;
                    self.sent += 1;
                }
                Err(f) if !f.retry => {
                    self.failures = 0;
                    self.dropped += 1;
                    eprintln!("heapdump: {}; not retried (profile dropped)", f.text);
                }
                Err(f) => {
                    self.failures += 1;
                    let wait = BACKOFF_MIN
                        .saturating_mul(1 << (self.failures - 1).min(16))
                        .min(BACKOFF_MAX);
                    self.next_try = Instant::now() + wait;
                    eprintln!(
                        "heapdump: {}; retrying in {} ({} queued)",
                        f.text,
                        humantime::format_duration(wait),
                        self.items.len()
                    );
                    return;
                }
            }
            let done = self.items.pop_front().expect("not empty");
            self.bytes -= done.body.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_examples() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(i.as_bytes()), o, "{i:?}");
        }
    }

    #[test]
    fn uuid_is_version_4() {
        let u = uuid_v4();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!("89ab".contains(&u[19..20]), "{u}");
        assert_ne!(u, uuid_v4());
    }
}
