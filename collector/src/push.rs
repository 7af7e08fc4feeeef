//! Sending profiles to a continuous-profiling server (`--push URL`): Grafana Pyroscope
//! (`--push-format pyroscope`, the default) or Parca (`--push-format parca`, [`crate::parca`]).
//!
//! Pyroscope: one profile is one Connect unary call, `POST {URL}/push.v1.PusherService/Push`
//! with `Content-Type: application/proto` and a `push.v1.PushRequest` body
//! (`proto/pyroscope.proto`): one series whose labels are `__name__=memory`, `__delta__=false`
//! (the profile's `alloc_*` values are already deltas, made here: the server must not subtract
//! the previous profile), `service_name` (default: the process name), `hostname`, `pid` and the
//! user's `--label`s, holding the gzip-compressed pprof profile. HTTP goes through `ureq`
//! (rustls for https). Parca gets the same labels but `__delta__` in a gRPC `WriteRaw` call.
//!
//! `watch` queues what it could not send ([`Queue`]), retried in order with exponential backoff
//! from [`BACKOFF_MIN`] to [`BACKOFF_MAX`]: at most [`QUEUE_ITEMS`] profiles and
//! [`QUEUE_BYTES`] bytes in memory, or, with `-o DIR`, in `DIR/.spool` ([`crate::spool`]) up to
//! `--spool-max-bytes`, where the next watch finds what this one could not send; the oldest are
//! dropped first (counted on stderr).
//!
//! What is pushed is not quite the profile `-o` writes ([`for_push`]): `alloc_*` are deltas
//! since the previous push of the same process ([`AllocState`]; the first push sends them as
//! 0), and a profile past the servers' limits ([`MAX_SAMPLES`], [`MAX_PROFILE_BYTES`]) is
//! aggregated by stack and, if still too many samples, trimmed ([`trim`]).

use crate::cli::{PushFormat, PushProps};
use crate::spool::{Spool, Stored};
use heapdump_proto as pp;
use heapdump_proto::pyroscope as pb;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Most profiles waiting to be pushed again.
pub const QUEUE_ITEMS: usize = 100;
/// Most bytes (encoded requests) waiting to be pushed again.
pub const QUEUE_BYTES: usize = 64 << 20;
/// First wait after a failed push.
pub const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// Longest wait between two tries.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Most samples in one pushed profile (Pyroscope's default `max_profile_size_samples`).
pub const MAX_SAMPLES: usize = 16_000;
/// Most bytes of one pushed profile, uncompressed (Pyroscope's default `max_profile_size_bytes`).
pub const MAX_PROFILE_BYTES: usize = 4 << 20;

/// The cumulative `alloc_objects` and `alloc_space` of each stack in the last profile pushed
/// of one process, by the [`stack_key`] of its locations' addresses (leaf first).
pub type AllocState = HashMap<u128, [i64; 2]>;

/// A 128-bit hash of a stack's addresses: two SipHash-1-3 (std's `DefaultHasher`, fixed keys)
/// of them, told apart by a first word. 16 bytes per stack instead of 8 per frame; two of 1 M
/// stacks collide with a probability of about 2^-89.
pub fn stack_key(addresses: impl Iterator<Item = u64> + Clone) -> u128 {
    use std::hash::Hasher;
    let half = |seed: u64| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        h.write_u64(seed);
        for a in addresses.clone() {
            h.write_u64(a);
        }
        h.finish() as u128
    };
    half(0x6865_6170_6475_6d70) << 64 | half(0x7075_7368_5f6b_6579)
}

/// The index of the sample type named `name` in `p`.
fn value_index(p: &pp::Profile, name: &str) -> Option<usize> {
    (p.sample_type.iter())
        .position(|t| p.string_table.get(t.r#type as usize).map(String::as_str) == Some(name))
}

/// The profile to push instead of `p`, and the state for the next push of the same process.
///
/// `alloc_*` become deltas since `prev` (the state the previous push of this process returned)
/// per stack: never negative, a stack absent from `prev` counting from 0; with no `prev` (the
/// first push) they are 0. Samples left with only zeros are dropped. Then, past
/// [`MAX_SAMPLES`] samples or [`MAX_PROFILE_BYTES`] bytes, samples are aggregated by stack
/// (labels dropped) and, if still more than [`MAX_SAMPLES`], trimmed ([`trim`]).
pub fn for_push(p: &pp::Profile, prev: Option<&AllocState>) -> (pp::Profile, AllocState) {
    use prost::Message;
    let mut p = p.clone();
    let mut state = AllocState::new();
    let address: HashMap<u64, u64> = p.location.iter().map(|l| (l.id, l.address)).collect();
    if let (Some(an), Some(ab)) = (
        value_index(&p, "alloc_objects"),
        value_index(&p, "alloc_space"),
    ) {
        let keys: Vec<u128> = (p.sample.iter())
            .map(|s| {
                stack_key((s.location_id.iter()).map(|id| address.get(id).copied().unwrap_or(0)))
            })
            .collect();
        // Cumulative values per stack, over all its samples.
        state.reserve(p.sample.len());
        for (s, &k) in p.sample.iter().zip(&keys) {
            let e = state.entry(k).or_default();
            e[0] += s.value.get(an).copied().unwrap_or(0);
            e[1] += s.value.get(ab).copied().unwrap_or(0);
        }
        // The delta goes on the stack's first sample carrying alloc_* values.
        let mut done: std::collections::HashSet<u128> = Default::default();
        for (s, &k) in p.sample.iter_mut().zip(&keys) {
            if s.value.len() <= an.max(ab) || (s.value[an] == 0 && s.value[ab] == 0) {
                continue;
            }
            let (n, b) = if done.contains(&k) {
                (0, 0)
            } else {
                let now = state[&k];
                let before = prev.map(|m| m.get(&k).copied().unwrap_or([0, 0]));
                done.insert(k);
                match before {
                    Some(b) => ((now[0] - b[0]).max(0), (now[1] - b[1]).max(0)),
                    None => (0, 0),
                }
            };
            s.value[an] = n;
            s.value[ab] = b;
        }
        p.sample.retain(|s| s.value.iter().any(|&v| v != 0));
    }
    if p.sample.len() > MAX_SAMPLES || p.encoded_len() > MAX_PROFILE_BYTES {
        aggregate(&mut p);
        if p.sample.len() > MAX_SAMPLES {
            trim(&mut p, MAX_SAMPLES);
        }
    }
    // Parca refuses a profile whose ids have gaps: pprof::build numbers them from 1, and
    // neither the deltas nor trimming leave one.
    debug_assert_eq!(crate::parca::check_ids(&p), Ok(()));
    (p, state)
}

/// Merges the samples of `p` with the same locations (values summed, labels dropped), in the
/// order of their first sample. Exact (samples are sorted by their locations, not hashed),
/// and nothing is copied but the samples' indexes.
pub fn aggregate(p: &mut pp::Profile) {
    let samples = std::mem::take(&mut p.sample);
    // Indexes sorted by locations, then by index: each stack's first sample leads its run.
    let mut order: Vec<usize> = (0..samples.len()).collect();
    order.sort_unstable_by(|&a, &b| {
        (samples[a].location_id.cmp(&samples[b].location_id)).then(a.cmp(&b))
    });
    // For each sample, the first sample of its stack.
    let mut first: Vec<usize> = (0..samples.len()).collect();
    for w in order.windows(2) {
        if samples[w[0]].location_id == samples[w[1]].location_id {
            first[w[1]] = first[w[0]];
        }
    }
    let mut slot: Vec<Option<usize>> = vec![None; samples.len()];
    let mut out: Vec<pp::Sample> = Vec::new();
    for (i, s) in samples.into_iter().enumerate() {
        match slot[first[i]] {
            Some(o) => {
                let v = &mut out[o].value;
                if v.len() < s.value.len() {
                    v.resize(s.value.len(), 0);
                }
                for (a, b) in v.iter_mut().zip(&s.value) {
                    *a += b;
                }
            }
            None => {
                slot[first[i]] = Some(out.len());
                out.push(pp::Sample {
                    location_id: s.location_id,
                    value: s.value,
                    label: vec![],
                });
            }
        }
    }
    p.sample = out;
}

/// Keeps the `max - 1` largest samples of `p` by `inuse_space` (ties: by location ids, then
/// the other values, largest first) and folds the others into one sample whose only location
/// is a function named `(other: N stacks trimmed)`, with a comment saying how many samples and
/// bytes were trimmed. Nothing changes if `p` has at most `max` samples.
pub fn trim(p: &mut pp::Profile, max: usize) {
    if p.sample.len() <= max || max == 0 {
        return;
    }
    let inuse = value_index(p, "inuse_space").unwrap_or(p.sample_type.len().saturating_sub(1));
    let width = p.sample_type.len();
    let v = |s: &pp::Sample| s.value.get(inuse).copied().unwrap_or(0);
    let mut samples = std::mem::take(&mut p.sample);
    samples.sort_by(|a, b| {
        v(b).cmp(&v(a))
            .then_with(|| a.location_id.cmp(&b.location_id))
            .then_with(|| b.value.cmp(&a.value))
    });
    let dropped = samples.split_off(max - 1);
    let mut other = vec![0i64; width];
    for s in &dropped {
        for (a, b) in other.iter_mut().zip(&s.value) {
            *a += b;
        }
    }
    let name = format!("(other: {} stacks trimmed)", dropped.len());
    let mut string = |text: &str| -> i64 {
        p.string_table.push(text.to_owned());
        p.string_table.len() as i64 - 1
    };
    let name_id = string(&name);
    let comment = string(&format!(
        "pushed profile trimmed to {max} samples: {} samples ({} bytes in use) folded into {name:?}",
        dropped.len(),
        other.get(inuse).copied().unwrap_or(0)
    ));
    p.comment.push(comment);
    let fid = p.function.iter().map(|f| f.id).max().unwrap_or(0) + 1;
    p.function.push(pp::Function {
        id: fid,
        name: name_id,
        system_name: name_id,
        filename: 0,
        start_line: 0,
    });
    let lid = p.location.iter().map(|l| l.id).max().unwrap_or(0) + 1;
    p.location.push(pp::Location {
        id: lid,
        mapping_id: 0,
        address: 0,
        line: vec![pp::Line {
            function_id: fid,
            line: 0,
        }],
        is_folded: false,
    });
    samples.push(pp::Sample {
        location_id: vec![lid],
        value: other,
        label: vec![],
    });
    p.sample = samples;
}

/// A client of one server, with what every push sends.
#[derive(Debug)]
pub struct Client {
    api: Api,
    props: PushProps,
    hostname: String,
}

/// The server's API.
#[derive(Debug)]
enum Api {
    /// Pyroscope: `ureq`'s connection pool and the Connect endpoint.
    Pyroscope {
        agent: ureq::Agent,
        endpoint: String,
    },
    /// Parca: a gRPC channel.
    Parca(crate::parca::Parca),
}

/// One profile to push, whatever the server's API.
#[derive(Debug, Clone)]
pub struct Item {
    /// Its labels ([`Client::labels`]), sorted by name; the API's own (Pyroscope's
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

impl Client {
    /// A client for `props.url` in `props.format` (no connection is made yet).
    ///
    /// Errors (Parca only): the URL is not valid, the token is not ASCII, the client's runtime
    /// cannot be created.
    pub fn new(props: &PushProps) -> anyhow::Result<Client> {
        let api = match props.format {
            PushFormat::Pyroscope => Api::Pyroscope {
                agent: ureq::Agent::config_builder()
                    .timeout_global(Some(props.timeout))
                    .http_status_as_error(false)
                    .user_agent(concat!("heapdump/", env!("CARGO_PKG_VERSION")))
                    .build()
                    .into(),
                endpoint: format!("{}/push.v1.PusherService/Push", props.url),
            },
            PushFormat::Parca => Api::Parca(crate::parca::Parca::new(
                &props.url,
                props.authorization.as_deref(),
                props.timeout,
            )?),
        };
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        Ok(Client {
            api,
            props: props.clone(),
            hostname,
        })
    }

    /// The labels of a profile of process `pid` named `name`, sorted by name:
    /// `__name__=memory`, `service_name` (`name`), `hostname`, `pid` and the user's `--label`s
    /// (which may override the last three).
    pub fn labels(&self, name: &str, pid: u32) -> Vec<(String, String)> {
        let mut l: Vec<(String, String)> = vec![
            ("__name__".into(), "memory".into()),
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
        Item {
            labels: self.labels(name, pid),
            profile: gz.to_vec(),
            id: uuid_v4(),
            what: format!("pid {pid} ({name})"),
        }
    }

    /// The body of the Pyroscope push of `item`: a `PushRequest` whose one series has the
    /// item's labels and `__delta__=false` (the `alloc_*` values are deltas already: the
    /// server must not subtract the previous profile).
    pub fn pyroscope_body(item: &Item) -> Vec<u8> {
        use prost::Message;
        let mut labels = item.labels.clone();
        labels.retain(|(n, _)| n != "__delta__");
        labels.push(("__delta__".into(), "false".into()));
        labels.sort();
        pb::PushRequest {
            series: vec![pb::RawProfileSeries {
                labels: (labels.into_iter())
                    .map(|(name, value)| pb::LabelPair { name, value })
                    .collect(),
                samples: vec![pb::RawSample {
                    raw_profile: item.profile.clone(),
                    id: item.id.clone(),
                }],
            }],
        }
        .encode_to_vec()
    }

    /// Pushes `item` once.
    ///
    /// Errors: the server cannot be reached or refuses the profile (Pyroscope: an HTTP status
    /// other than 2xx, the text giving it and the start of the server's message; Parca: a
    /// gRPC status other than OK, or a request past its 64 MiB message limit).
    pub fn send(&self, item: &Item) -> Result<(), Failure> {
        match &self.api {
            Api::Pyroscope { agent, endpoint } => self.send_pyroscope(agent, endpoint, item),
            Api::Parca(c) => c.send(&item.labels, &item.profile, &item.what),
        }
    }

    fn send_pyroscope(
        &self,
        agent: &ureq::Agent,
        endpoint: &str,
        item: &Item,
    ) -> Result<(), Failure> {
        let mut req = agent
            .post(endpoint)
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
        let body = Self::pyroscope_body(item);
        let mut resp = match req.send(&body[..]) {
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

/// A profile waiting to be pushed.
#[derive(Debug)]
enum Waiting {
    /// Held in memory.
    Memory(Item),
    /// In the spool ([`Spool`]), read back when it is sent; `what` for messages.
    Spooled { file: Stored, what: String },
}

/// Pushes waiting to be sent, oldest first. Without a spool they are held in memory, bounded by
/// [`QUEUE_ITEMS`] and [`QUEUE_BYTES`]; with one ([`Queue::with_spool`]) each is written to it
/// when queued and removed once the server took it, the spool bounded by its `max_bytes`. The
/// oldest are dropped first past a bound, with one line each.
#[derive(Debug)]
pub struct Queue {
    /// Each with its number (to find it again after a send made without the lock).
    items: VecDeque<(u64, Waiting)>,
    /// The number of the next profile queued.
    next_id: u64,
    /// Bytes and count of the profiles held in memory.
    memory_bytes: usize,
    memory_items: usize,
    /// Bytes of the spooled ones.
    spool_bytes: u64,
    spool: Option<Spool>,
    /// Failed tries in a row.
    failures: u32,
    /// When the next try is due.
    next_try: Instant,
    /// Profiles dropped: the queue or spool was full, or the server refused them for good.
    pub dropped: u64,
    /// Profiles sent.
    pub sent: u64,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            items: VecDeque::new(),
            next_id: 0,
            memory_bytes: 0,
            memory_items: 0,
            spool_bytes: 0,
            spool: None,
            failures: 0,
            next_try: Instant::now(),
            dropped: 0,
            sent: 0,
        }
    }
}

impl Queue {
    /// A queue kept in `spool`, starting with `left` (what an earlier watch left there, oldest
    /// first: sent before anything new), the oldest of them dropped past the spool's bound.
    pub fn with_spool(spool: Spool, left: Vec<Stored>) -> Queue {
        let mut q = Queue {
            spool: Some(spool),
            ..Default::default()
        };
        for file in left {
            q.spool_bytes += file.bytes;
            let what = format!("{}", file.path.display());
            q.add(Waiting::Spooled { file, what });
        }
        q.shrink_spool(0);
        q
    }

    /// Profiles waiting.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Profiles waiting in the spool.
    pub fn spooled(&self) -> usize {
        (self.items.iter())
            .filter(|(_, w)| matches!(w, Waiting::Spooled { .. }))
            .count()
    }

    /// The spool's directory, if the queue has one.
    pub fn spool_dir(&self) -> Option<&std::path::Path> {
        self.spool.as_ref().map(Spool::dir)
    }

    /// When the next try is due (`None`: nothing waits).
    pub fn due(&self) -> Option<Instant> {
        (!self.items.is_empty()).then_some(self.next_try)
    }

    /// Makes the next try due now (whatever the backoff).
    pub fn retry_now(&mut self) {
        self.next_try = Instant::now();
    }

    /// Drops the oldest spooled profiles until `more` bytes fit in the spool's bound.
    fn shrink_spool(&mut self, more: u64) {
        let Some(max) = self.spool.as_ref().map(Spool::max_bytes) else {
            return;
        };
        while self.spool_bytes + more > max {
            let Some(i) =
                (self.items.iter()).position(|(_, w)| matches!(w, Waiting::Spooled { .. }))
            else {
                return;
            };
            let Some((_, Waiting::Spooled { file, what })) = self.items.remove(i) else {
                unreachable!("a spooled profile")
            };
            self.spool_bytes -= file.bytes;
            self.dropped += 1;
            if let Err(e) = Spool::remove(&file) {
                eprintln!("heapdump: {e:#}");
            }
            eprintln!(
                "heapdump: push spool full ({max} bytes at most, --spool-max-bytes): dropped the \
                 oldest, of {what} ({} dropped so far)",
                self.dropped
            );
        }
    }

    /// Appends `item`: to the spool if the queue has one (the oldest spooled dropped past its
    /// bound), else (or if it cannot be written there) in memory, the oldest dropped past
    /// [`QUEUE_ITEMS`] and [`QUEUE_BYTES`]; one line for each dropped.
    pub fn push(&mut self, item: Item) {
        if self.spool.is_some() {
            let bytes = Spool::encode(&item);
            let max = self.spool.as_ref().map_or(0, Spool::max_bytes);
            if bytes.len() as u64 <= max {
                self.shrink_spool(bytes.len() as u64);
                match self.spool.as_mut().expect("spool").store(&bytes) {
                    Ok(file) => {
                        self.spool_bytes += file.bytes;
                        self.add(Waiting::Spooled {
                            file,
                            what: item.what,
                        });
                        return;
                    }
                    Err(e) => eprintln!(
                        "heapdump: cannot spool the profile of {}: {e:#}; held in memory",
                        item.what
                    ),
                }
            } else {
                eprintln!(
                    "heapdump: the profile of {} ({} bytes) is larger than --spool-max-bytes \
                     {max}: held in memory only",
                    item.what,
                    bytes.len()
                );
            }
        }
        self.memory_bytes += item.profile.len();
        self.memory_items += 1;
        self.add(Waiting::Memory(item));
        while self.memory_items > QUEUE_ITEMS
            || (self.memory_bytes > QUEUE_BYTES && self.memory_items > 1)
        {
            let i = (self.items.iter())
                .position(|(_, w)| matches!(w, Waiting::Memory(_)))
                .expect("an item in memory");
            let Some((_, Waiting::Memory(old))) = self.items.remove(i) else {
                unreachable!("an item in memory")
            };
            self.memory_bytes -= old.profile.len();
            self.memory_items -= 1;
            self.dropped += 1;
            eprintln!(
                "heapdump: push queue full ({} profiles, {} bytes at most): dropped the oldest, \
                 of {} ({} dropped so far)",
                QUEUE_ITEMS, QUEUE_BYTES, old.what, self.dropped
            );
        }
    }

    /// Appends `w` with the next number.
    fn add(&mut self, w: Waiting) {
        self.items.push_back((self.next_id, w));
        self.next_id += 1;
    }

    /// Removes the profile numbered `id` (sent or dropped), and its spool file; nothing if it
    /// was dropped meanwhile.
    fn remove_id(&mut self, id: u64) {
        let Some(i) = self.items.iter().position(|(n, _)| *n == id) else {
            return;
        };
        match self.items.remove(i) {
            Some((_, Waiting::Memory(i))) => {
                self.memory_bytes -= i.profile.len();
                self.memory_items -= 1;
            }
            Some((_, Waiting::Spooled { file, .. })) => {
                self.spool_bytes -= file.bytes;
                if let Err(e) = Spool::remove(&file) {
                    eprintln!("heapdump: {e:#} (the next watch may send it again)");
                }
            }
            None => {}
        }
    }

    /// The first profile if a try is due: its number, and the profile (read back from the
    /// spool if it is there; one that cannot be is dropped with one line). `None`: nothing
    /// due.
    fn take_due(&mut self) -> Option<(u64, Item)> {
        loop {
            let (id, front) = self.items.front()?;
            if Instant::now() < self.next_try {
                return None;
            }
            let id = *id;
            match front {
                Waiting::Memory(i) => return Some((id, i.clone())),
                Waiting::Spooled { file, .. } => match Spool::load(file) {
                    Ok(i) => return Some((id, i)),
                    Err(e) => {
                        self.dropped += 1;
                        eprintln!("heapdump: {e:#}: not a profile to push (removed)");
                        self.remove_id(id);
                    }
                },
            }
        }
    }

    /// Records the outcome of the try of profile `id` ([`Queue::take_due`]): removed when sent
    /// or refused for good; else the next try waits twice as long as the last, from
    /// [`BACKOFF_MIN`] to [`BACKOFF_MAX`]. One line on stderr for a failure. Returns whether
    /// to go on with the next profile.
    fn outcome(&mut self, id: u64, what: &str, r: Result<(), Failure>) -> bool {
        match r {
            Ok(()) => {
                if self.failures > 0 {
                    eprintln!(
                        "heapdump: push of {what} succeeded after {} failed tries",
                        self.failures
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
                return false;
            }
        }
        self.remove_id(id);
        true
    }
}

/// `watch`'s pushes, sent beside its snapshots: a thread owns the sending, and the watch only
/// appends to the [`Queue`] (bounded in memory; with a spool, on disk), so a slow or stalled
/// server never delays a beat. The queue is locked only to append, to take the next profile
/// and to record how its send went, never during a send.
pub struct Pusher {
    shared: std::sync::Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    queue: std::sync::Mutex<Queue>,
    wake: std::sync::Condvar,
    /// When set: the watch ended; what waits in memory gets tries until this instant.
    finish: std::sync::Mutex<Option<Instant>>,
}

impl Pusher {
    /// Starts the thread sending `queue`'s profiles with `client`; `stop` (SIGINT/SIGTERM) is
    /// checked between profiles.
    ///
    /// Errors: the thread cannot be started.
    pub fn start(
        client: std::sync::Arc<Client>,
        queue: Queue,
        stop: fn() -> bool,
    ) -> anyhow::Result<Pusher> {
        let shared = std::sync::Arc::new(Shared {
            queue: std::sync::Mutex::new(queue),
            wake: std::sync::Condvar::new(),
            finish: std::sync::Mutex::new(None),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("heapdump-push".into())
            .spawn(move || Self::run(&s, &client, stop))?;
        Ok(Pusher {
            shared,
            thread: Some(thread),
        })
    }

    fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Queue> {
        s.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn run(s: &Shared, client: &Client, stop: fn() -> bool) {
        let tick = Duration::from_millis(50);
        loop {
            let until = *s.finish.lock().unwrap_or_else(|e| e.into_inner());
            let mut q = Self::lock(s);
            if let Some(until) = until {
                // Ending: what is due now is tried; then only what waits in memory gets
                // tries with the backoff (the spool keeps the rest for the next watch); none
                // once asked to stop.
                match q.due() {
                    None => return,
                    Some(due)
                        if stop()
                            || due > until
                            || (q.len() == q.spooled() && due > Instant::now()) =>
                    {
                        return
                    }
                    _ => {}
                }
            } else if stop() {
                return;
            }
            match q.due() {
                Some(due) if due <= Instant::now() => {}
                due => {
                    let wait = due.map_or(tick, |d| d.saturating_duration_since(Instant::now()));
                    let _ = s.wake.wait_timeout(q, wait.min(tick));
                    continue;
                }
            }
            // Send in order while tries are due, without the lock during each send.
            loop {
                if stop() {
                    break;
                }
                let Some((id, item)) = q.take_due() else {
                    break;
                };
                drop(q);
                let r = client.send(&item);
                q = Self::lock(s);
                if !q.outcome(id, &item.what, r) {
                    break;
                }
            }
        }
    }

    /// Appends `item` to the queue (never waits for the network).
    pub fn push(&self, item: Item) {
        Self::lock(&self.shared).push(item);
        self.shared.wake.notify_one();
    }

    /// Ends the thread: what waits in memory gets tries with the same backoff until `drain`
    /// from now (none when `stop()` is set); what is in the spool is left for the next watch.
    /// Returns the queue, with what was not sent.
    pub fn finish(mut self, drain: Duration, stop: fn() -> bool) -> Queue {
        {
            let mut q = Self::lock(&self.shared);
            if q.len() > q.spooled() && !stop() {
                q.retry_now();
            }
        }
        *self.shared.finish.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Instant::now() + drain);
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *Self::lock(&self.shared))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile with Go's heap sample types and one location (its own function `f{i}`, at
    /// address `0x1000 + i`) per entry of `samples` (location indexes, values).
    fn synthetic(locations: usize, samples: &[(Vec<usize>, [i64; 4])]) -> pp::Profile {
        let mut p = pp::Profile {
            string_table: vec![String::new()],
            ..Default::default()
        };
        let string = |p: &mut pp::Profile, t: &str| {
            p.string_table.push(t.to_owned());
            p.string_table.len() as i64 - 1
        };
        for (t, u) in [
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
            ("inuse_objects", "count"),
            ("inuse_space", "bytes"),
        ] {
            let (t, u) = (string(&mut p, t), string(&mut p, u));
            p.sample_type.push(pp::ValueType { r#type: t, unit: u });
        }
        let key = string(&mut p, "bytes");
        for i in 0..locations {
            let name = string(&mut p, &format!("f{i}"));
            p.function.push(pp::Function {
                id: i as u64 + 1,
                name,
                system_name: name,
                filename: 0,
                start_line: 0,
            });
            p.location.push(pp::Location {
                id: i as u64 + 1,
                mapping_id: 0,
                address: 0x1000 + i as u64,
                line: vec![pp::Line {
                    function_id: i as u64 + 1,
                    line: 0,
                }],
                is_folded: false,
            });
        }
        for (locs, v) in samples {
            p.sample.push(pp::Sample {
                location_id: locs.iter().map(|&l| l as u64 + 1).collect(),
                value: v.to_vec(),
                label: vec![pp::Label {
                    key,
                    num: v[3],
                    ..Default::default()
                }],
            });
        }
        p
    }

    #[test]
    fn a_profile_of_20000_stacks_is_trimmed_to_16000_samples() {
        // Sample i: inuse_space i/2 + 1 (pairs tie), alloc twice that.
        let samples: Vec<(Vec<usize>, [i64; 4])> = (0..20_000)
            .map(|i| {
                let b = i as i64 / 2 + 1;
                (vec![i], [1, 2 * b, 1, b])
            })
            .collect();
        let p = synthetic(20_000, &samples);
        let (q, state) = for_push(&p, None);
        assert_eq!(state.len(), 20_000);
        assert_eq!(q.sample.len(), 16_000);
        assert_eq!(q.sample.len(), MAX_SAMPLES);
        // Kept: inuse_space 10000 down to 2002 (both of each pair), and of the pair at 2001
        // the one with the lower location id (sample 4000, location 4001).
        let kept: std::collections::HashSet<u64> = (q.sample[..15_999].iter())
            .map(|s| s.location_id[0])
            .collect();
        assert!(kept.contains(&4001) && !kept.contains(&4002));
        assert!((4003..=20_000).all(|l| kept.contains(&l)));
        assert!((1..=4000).all(|l| !kept.contains(&l)));
        assert_eq!(q.sample[0].value, [0, 0, 1, 10_000], "largest first");
        assert!(q.sample.iter().all(|s| s.label.is_empty()));
        // Dropped: samples 0..4000 (1..=2000, twice) and 4001 (2001): 4001 samples.
        let trimmed = 2 * (2000 * 2001 / 2) + 2001;
        assert_eq!(trimmed, 4_004_001);
        let other = &q.sample[15_999];
        assert_eq!(other.value, [0, 0, 4001, trimmed], "first push: alloc_* 0");
        let total_in = (samples.iter()).map(|s| s.1[3]).sum::<i64>();
        let total_out = q.sample.iter().map(|s| s.value[3]).sum::<i64>();
        assert_eq!(total_in, total_out);
        // The "other" location and function: ids next in sequence, named in the string table.
        assert_eq!(other.location_id, [20_001]);
        let loc = q.location.last().unwrap();
        assert_eq!((loc.id, loc.line.len()), (20_001, 1));
        assert_eq!(loc.line[0].function_id, 20_001);
        let f = q.function.last().unwrap();
        assert_eq!(f.id, 20_001);
        assert_eq!(
            q.string_table[f.name as usize],
            "(other: 4001 stacks trimmed)"
        );
        for (i, l) in q.location.iter().enumerate() {
            assert_eq!(l.id, i as u64 + 1);
        }
        for (i, f) in q.function.iter().enumerate() {
            assert_eq!(f.id, i as u64 + 1);
        }
        assert_eq!(crate::parca::check_ids(&q), Ok(()), "what Parca validates");
        let comments: Vec<&str> = (q.comment.iter())
            .map(|&c| q.string_table[c as usize].as_str())
            .collect();
        assert_eq!(
            comments,
            [
                "pushed profile trimmed to 16000 samples: 4001 samples (4004001 bytes in use) \
              folded into \"(other: 4001 stacks trimmed)\""
            ]
        );
        // A profile within the limits is left as it is (but for the first push's alloc_*).
        let small = synthetic(3, &samples[..3]);
        let (q, _) = for_push(&small, None);
        assert_eq!(q.sample.len(), 3);
        assert!(q.sample.iter().all(|s| s.label.len() == 1));
    }

    #[test]
    fn alloc_values_are_deltas_per_stack_since_the_previous_push() {
        // Stack [0, 1] in two samples (sizes), the alloc_* on the first; stack [1]; stack [2]
        // freed entirely (alloc only).
        let first = synthetic(
            4,
            &[
                (vec![0, 1], [10, 1000, 3, 300]),
                (vec![0, 1], [0, 0, 1, 50]),
                (vec![1], [5, 500, 5, 500]),
                (vec![2], [7, 70, 0, 0]),
            ],
        );
        let (q, s1) = for_push(&first, None);
        let values: Vec<&[i64]> = q.sample.iter().map(|s| s.value.as_slice()).collect();
        // First push: alloc_* 0; the alloc-only sample of stack [2] is then empty and dropped.
        assert_eq!(
            values,
            [&[0, 0, 3, 300][..], &[0, 0, 1, 50], &[0, 0, 5, 500]]
        );
        assert_eq!(s1[&stack_key([0x1000, 0x1001].into_iter())], [10, 1000]);
        // Second: [0, 1] grew by 4 / 400, [1] did not, [2] absent, [3] new (counts from 0);
        // a counter that went down gives 0, never a negative value.
        let second = synthetic(
            4,
            &[
                (vec![0, 1], [14, 1400, 4, 400]),
                (vec![1], [5, 500, 5, 500]),
                (vec![3], [2, 64, 2, 64]),
            ],
        );
        let (q, s2) = for_push(&second, Some(&s1));
        let values: Vec<&[i64]> = q.sample.iter().map(|s| s.value.as_slice()).collect();
        assert_eq!(
            values,
            [&[4, 400, 4, 400][..], &[0, 0, 5, 500], &[2, 64, 2, 64]]
        );
        let third = synthetic(4, &[(vec![0, 1], [12, 1200, 1, 100])]);
        let (q, _) = for_push(&third, Some(&s2));
        assert_eq!(q.sample[0].value, [0, 0, 1, 100]);
    }

    #[test]
    fn aggregate_merges_samples_of_one_stack() {
        let mut p = synthetic(
            2,
            &[
                (vec![0, 1], [1, 10, 1, 10]),
                (vec![1], [2, 20, 2, 20]),
                (vec![0, 1], [3, 30, 0, 0]),
            ],
        );
        aggregate(&mut p);
        let got: Vec<(&[u64], &[i64], usize)> = (p.sample.iter())
            .map(|s| (s.location_id.as_slice(), s.value.as_slice(), s.label.len()))
            .collect();
        assert_eq!(
            got,
            [
                (&[1, 2][..], &[4, 40, 1, 10][..], 0),
                (&[2], &[2, 20, 2, 20], 0)
            ]
        );
    }

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
