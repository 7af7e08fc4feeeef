//! `--push URL --push-format parca`: what heapdump sends to Parca, received by a fake server on
//! 127.0.0.1 (gRPC over HTTP/2 without TLS, served with `h2` directly, the gRPC framing decoded
//! here) and decoded with message definitions written here from Parca's public field list (not
//! heapdump's own types): the call, the labels (`__name__`, `service_name`, `hostname`, `pid`,
//! `--label`), the bearer token, `normalized`, and the embedded pprof profile as Parca's
//! validator wants it (string 0 "", ids sequential from 1, `time_nanos` set, `duration_nanos`
//! 0, at most 16,000 samples), read back by `go tool pprof` with the program's exact blocks.
//! A server down for 3 intervals gets every profile of a watch, in order, none twice; a watch
//! stopped while the server is down leaves its profiles in `DIR/.spool`, and the next watch on
//! DIR sends them first.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `parca.profilestore.v1alpha1.WriteRawRequest`, written for this test.
#[derive(Clone, PartialEq, prost::Message)]
struct TestWriteRaw {
    #[prost(string, tag = "1")]
    tenant: String,
    #[prost(message, repeated, tag = "2")]
    series: Vec<TestSeries>,
    #[prost(bool, tag = "3")]
    normalized: bool,
}

/// `RawProfileSeries`.
#[derive(Clone, PartialEq, prost::Message)]
struct TestSeries {
    #[prost(message, optional, tag = "1")]
    labels: Option<TestLabelSet>,
    #[prost(message, repeated, tag = "2")]
    samples: Vec<TestSample>,
}

/// `LabelSet`.
#[derive(Clone, PartialEq, prost::Message)]
struct TestLabelSet {
    #[prost(message, repeated, tag = "1")]
    labels: Vec<TestLabel>,
}

/// `Label`.
#[derive(Clone, PartialEq, prost::Message)]
struct TestLabel {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    value: String,
}

/// `RawSample`.
#[derive(Clone, PartialEq, prost::Message)]
struct TestSample {
    #[prost(bytes = "vec", tag = "1")]
    raw_profile: Vec<u8>,
}

/// One call the fake server received.
#[derive(Debug, Clone)]
struct Call {
    path: String,
    /// Header names in lower case (HTTP/2 sends them so).
    headers: BTreeMap<String, String>,
    /// The gRPC message (the 5-byte frame header checked and removed).
    message: Vec<u8>,
    /// The gRPC status it was answered with (0: OK).
    status: u32,
}

/// What the fake server answers.
struct State {
    calls: Mutex<Vec<Call>>,
    /// Calls still to refuse (`usize::MAX`: all), with `code`.
    refuse: AtomicUsize,
    code: AtomicU32,
}

/// A fake Parca: an HTTP/2 server (prior knowledge, no TLS) answering gRPC calls.
struct FakeParca {
    url: String,
    state: Arc<State>,
}

impl FakeParca {
    /// Refuses the first `refuse` calls with gRPC status `code`, then answers OK.
    fn start(refuse: usize, code: u32) -> FakeParca {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(State {
            calls: Mutex::new(Vec::new()),
            refuse: AtomicUsize::new(refuse),
            code: AtomicU32::new(code),
        });
        let st = state.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let Ok((sock, _)) = listener.accept().await else {
                        continue;
                    };
                    let st = st.clone();
                    tokio::spawn(async move {
                        let Ok(mut conn) = h2::server::handshake(sock).await else {
                            return;
                        };
                        while let Some(Ok((req, respond))) = conn.accept().await {
                            let st = st.clone();
                            tokio::spawn(async move {
                                let _ = answer(req, respond, &st).await;
                            });
                        }
                    });
                }
            });
        });
        FakeParca { url, state }
    }

    fn calls(&self) -> Vec<Call> {
        self.state.calls.lock().unwrap().clone()
    }

    /// From now on, refuse every call with `code` (`0`: take every call).
    fn refuse_all(&self, code: u32) {
        let n = if code == 0 { 0 } else { usize::MAX };
        self.state.code.store(code, Ordering::SeqCst);
        self.state.refuse.store(n, Ordering::SeqCst);
    }
}

/// Reads one gRPC call and answers it (an empty `WriteRawResponse` and `grpc-status: 0`, or a
/// refusal's status and message in the trailers).
async fn answer(
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<bytes::Bytes>,
    st: &State,
) -> Result<(), h2::Error> {
    let (parts, mut body) = req.into_parts();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    // gRPC framing: compressed flag, 4-byte big-endian length, the message.
    assert!(data.len() >= 5, "a gRPC frame");
    assert_eq!(
        data[0], 0,
        "not compressed by gRPC (the profile is gzip already)"
    );
    let len = u32::from_be_bytes(data[1..5].try_into().unwrap()) as usize;
    assert_eq!(data.len(), 5 + len, "one message");
    let status = match st
        .refuse
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| match n {
            0 => None,
            usize::MAX => Some(usize::MAX),
            n => Some(n - 1),
        }) {
        Ok(_) => st.code.load(Ordering::SeqCst),
        Err(_) => 0,
    };
    let headers = (parts.headers.iter())
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    st.calls.lock().unwrap().push(Call {
        path: parts.uri.path().to_owned(),
        headers,
        message: data[5..].to_vec(),
        status,
    });
    let resp = http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let mut send = respond.send_response(resp, false)?;
    if status == 0 {
        send.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), false)?;
    }
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", status.to_string().parse().unwrap());
    if status != 0 {
        trailers.insert("grpc-message", "the store is down".parse().unwrap());
    }
    send.send_trailers(trailers)
}

/// What one call carried.
struct Pushed {
    labels: BTreeMap<String, String>,
    normalized: bool,
    /// The raw profile as received.
    raw: Vec<u8>,
    profile: heapdump_proto::Profile,
}

/// Decodes a call with the test's own message types; checks the call's shape and what Parca's
/// validator checks of the profile.
fn decode_call(c: &Call) -> Pushed {
    use prost::Message;
    assert_eq!(
        c.path,
        "/parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw"
    );
    assert!(
        c.headers["content-type"].starts_with("application/grpc"),
        "{:?}",
        c.headers
    );
    assert_eq!(c.headers.get("te").map(String::as_str), Some("trailers"));
    let req = TestWriteRaw::decode(c.message.as_slice()).unwrap();
    assert_eq!(req.tenant, "", "the deprecated tenant field is not sent");
    assert_eq!(req.series.len(), 1, "one series per call");
    let s = &req.series[0];
    let list = &s.labels.as_ref().expect("a label set").labels;
    let labels: BTreeMap<String, String> = (list.iter())
        .map(|l| (l.name.clone(), l.value.clone()))
        .collect();
    assert_eq!(labels.len(), list.len(), "a label twice: {list:?}");
    assert_eq!(s.samples.len(), 1, "one profile per call");
    let raw = s.samples[0].raw_profile.clone();
    let mut pprof = Vec::new();
    if raw[..2] == [0x1f, 0x8b] {
        flate2::read::GzDecoder::new(raw.as_slice())
            .read_to_end(&mut pprof)
            .unwrap();
    } else {
        pprof = raw.clone();
    }
    let profile = heapdump_proto::Profile::decode(pprof.as_slice()).unwrap();
    assert_valid_for_parca(&profile);
    Pushed {
        labels,
        normalized: req.normalized,
        raw,
        profile,
    }
}

/// Parca's validator's rules (`pkg/normalizer/validate.go`), written out again here: string 0
/// is ""; mapping, location and function ids sequential from 1; one value per sample type;
/// location, mapping and function ids in range. Also: at most 16,000 samples, a time, no
/// duration (a live-heap gauge, not a delta).
fn assert_valid_for_parca(p: &heapdump_proto::Profile) {
    assert_eq!(p.string_table[0], "", "string 0");
    for (i, m) in p.mapping.iter().enumerate() {
        assert_eq!(m.id, i as u64 + 1, "mapping ids sequential from 1");
    }
    for (i, l) in p.location.iter().enumerate() {
        assert_eq!(l.id, i as u64 + 1, "location ids sequential from 1");
        assert!(l.mapping_id <= p.mapping.len() as u64);
        for line in &l.line {
            assert!(line.function_id >= 1 && line.function_id <= p.function.len() as u64);
        }
    }
    for (i, f) in p.function.iter().enumerate() {
        assert_eq!(f.id, i as u64 + 1, "function ids sequential from 1");
        assert!((f.name as usize) < p.string_table.len());
    }
    assert!(!p.mapping.is_empty(), "mappings are sent");
    for s in &p.sample {
        assert_eq!(s.value.len(), p.sample_type.len(), "one value per type");
        for &l in &s.location_id {
            assert!(l >= 1 && l <= p.location.len() as u64, "location {l}");
        }
    }
    assert!(p.sample.len() <= 16_000, "{} samples", p.sample.len());
    assert_eq!(p.duration_nanos, 0, "a gauge, not a delta");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    assert!(
        p.time_nanos > now - 600_000_000_000 && p.time_nanos <= now,
        "time_nanos {} (now {now})",
        p.time_nanos
    );
}

/// `heapdump HEAD... --push URL --push-format parca EXTRA...`.
fn parca_push(dir: &Path, head: &[&str], url: &str, extra: &[&str], limit: Duration) -> Timed {
    let mut args = head.to_vec();
    args.extend_from_slice(&["--push", url, "--push-format", "parca"]);
    args.extend_from_slice(extra);
    heapdump_timeout(dir, &args, limit)
}

/// `heapdump snapshot --by-pid PID --push URL --push-format parca EXTRA...`.
fn snapshot_push(dir: &Path, pid: &str, url: &str, extra: &[&str], limit: Duration) -> Timed {
    parca_push(dir, &["snapshot", "--by-pid", pid], url, extra, limit)
}

/// `go tool pprof -raw` of the pushed profile (as received, gzip or not).
fn raw_of(p: &Pushed, dir: &Path, name: &str) -> Raw {
    let f = dir.with_extension(format!("{name}.pb"));
    std::fs::write(&f, &p.raw).unwrap();
    pprof_raw(&f)
}

#[test]
fn snapshot_push_parca_sends_labels_token_and_the_exact_profile() {
    if !can_run("snapshot_push_parca_sends_labels_token_and_the_exact_profile") {
        return;
    }
    let server = FakeParca::start(0, 0);
    let dir = region_dir("parca-snapshot");
    let r = hold_sized(&dir, 150, 600);
    let pid = r.pid().to_string();
    let token = dir.with_extension("token");
    std::fs::write(&token, "  polar-s3cret\n").unwrap();
    let t = snapshot_push(
        &dir,
        &pid,
        &server.url,
        &[
            "--bearer-token-file",
            token.to_str().unwrap(),
            "--label",
            "env=test",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    let calls = server.calls();
    assert_eq!(calls.len(), 1, "one call");
    assert_eq!(
        calls[0].headers.get("authorization").map(String::as_str),
        Some("Bearer polar-s3cret")
    );
    assert!(
        calls[0].headers["user-agent"].contains("heapdump/"),
        "{:?}",
        calls[0].headers
    );
    let p = decode_call(&calls[0]);
    let want: BTreeMap<String, String> = [
        ("__name__", "memory"),
        ("service_name", "hold_sized"),
        ("hostname", hostname().as_str()),
        ("pid", pid.as_str()),
        ("env", "test"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    assert_eq!(p.labels, want, "no __delta__ for Parca");
    assert!(!p.normalized);
    assert_eq!(&p.raw[..2], &[0x1f, 0x8b], "gzip magic");
    // The reference reader sees the program's exact blocks (alloc_* 0: a first push).
    let raw = raw_of(&p, &dir, "pushed");
    assert_eq!(
        raw.sum_with("hold_blocks"),
        [0, 0, 151, 150 * 600 + 150 * 8],
        "{}",
        t.stderr
    );
    // Series key types: Go's heap names, period space/bytes.
    let s = |i: i64| p.profile.string_table[i as usize].as_str();
    let types: Vec<&str> = (p.profile.sample_type.iter())
        .map(|t| s(t.r#type))
        .collect();
    assert_eq!(
        types,
        [
            "alloc_objects",
            "alloc_space",
            "inuse_objects",
            "inuse_space"
        ]
    );
    let period = p.profile.period_type.as_ref().unwrap();
    assert_eq!((s(period.r#type), s(period.unit)), ("space", "bytes"));

    // A refusal of the profile (INVALID_ARGUMENT) is one line, not retried.
    server.refuse_all(3);
    let t = snapshot_push(&dir, &pid, &server.url, &[], Duration::from_secs(60));
    assert_eq!(t.code, Some(1), "{t:?}");
    assert_eq!(server.calls().len(), 2, "not retried");
    assert_eq!(t.stderr.trim().lines().count(), 1, "{}", t.stderr);
    assert!(
        t.stderr
            .contains("gRPC INVALID_ARGUMENT: the store is down"),
        "{}",
        t.stderr
    );
}

#[test]
fn a_profile_of_32768_stacks_is_pushed_as_16000_samples_with_the_rest_accounted() {
    if !can_run("a_profile_of_32768_stacks_is_pushed_as_16000_samples_with_the_rest_accounted") {
        return;
    }
    let server = FakeParca::start(0, 0);
    let dir = region_dir("parca-trim");
    let exe = compile_c("many_stacks", &["-fno-optimize-sibling-calls"]);
    let mut cmd = Command::new(exe);
    cmd.arg("15");
    let r = start(cmd, &dir, true);
    let (n, bytes) = r.tally();
    assert_eq!(n, 32_768);
    let pid = r.pid().to_string();
    let out = dir.with_extension("file.pb.gz");
    let t = snapshot_push(
        &dir,
        &pid,
        &server.url,
        &["-o", out.to_str().unwrap()],
        Duration::from_secs(120),
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    // The file: every stack, exact.
    let file = decode(&out);
    assert_eq!(sum_through(&file, "hold_one"), [n, bytes, n, bytes]);
    let stacks = locations_of(&file, "hold_one");
    let through: usize = (file.sample.iter())
        .filter(|s| s.location_id.iter().any(|l| stacks.contains(l)))
        .count();
    assert!(
        through >= 32_768,
        "one sample per stack at least: {through}"
    );
    // The push: 16,000 samples, the others folded into one whose bytes make up the total.
    let calls = server.calls();
    assert_eq!(calls.len(), 1);
    let p = decode_call(&calls[0]);
    assert_eq!(p.profile.sample.len(), 16_000);
    let raw = raw_of(&p, &dir, "pushed");
    let file_total = pprof_raw(&out).total();
    let pushed_total = raw.total();
    assert_eq!(
        [pushed_total[2], pushed_total[3]],
        [file_total[2], file_total[3]],
        "every byte in use is in the pushed profile"
    );
    let kept = raw.sum_with("hold_one");
    assert!(kept[3] < bytes, "some stacks were folded");
    let comment = (raw.comments.iter())
        .find(|c| c.contains("trimmed to 16000 samples"))
        .unwrap_or_else(|| panic!("{:?}", raw.comments));
    let folded = file.sample.len() - 15_999;
    assert!(
        comment.contains(&format!("{folded} samples")),
        "{comment} ({} samples in the file)",
        file.sample.len()
    );
}

/// `heapdump watch` of `pid` every second, pushing to `url` in Parca's format, with `extra`.
fn watch(dir: &Path, pid: &str, url: &str, extra: &[&str], limit: Duration) -> Timed {
    parca_push(
        dir,
        &["watch", "--by-pid", pid, "--every", "1s"],
        url,
        extra,
        limit,
    )
}

#[test]
fn watch_push_parca_retries_until_the_server_takes_every_profile_in_order() {
    if !can_run("watch_push_parca_retries_until_the_server_takes_every_profile_in_order") {
        return;
    }
    // UNAVAILABLE for the first three calls, then up.
    let server = FakeParca::start(3, 14);
    let dir = region_dir("parca-watch");
    let r = hold_sized(&dir, 90, 1200);
    let pid = r.pid().to_string();
    let t = watch(
        &dir,
        &pid,
        &server.url,
        &["--count", "4"],
        Duration::from_secs(120),
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    let calls = server.calls();
    assert_eq!(
        calls.iter().filter(|c| c.status == 14).count(),
        3,
        "{}",
        t.stderr
    );
    let taken: Vec<Pushed> = (calls.iter().filter(|c| c.status == 0))
        .map(decode_call)
        .collect();
    assert_eq!(taken.len(), 4, "every profile arrives: {}", t.stderr);
    for w in taken.windows(2) {
        assert!(
            w[0].profile.time_nanos < w[1].profile.time_nanos,
            "in order, none twice"
        );
    }
    for p in &taken {
        assert_eq!(p.labels["pid"], pid);
        assert_eq!(
            sum_through(&p.profile, "hold_blocks"),
            [0, 0, 91, 90 * 1200 + 90 * 8]
        );
    }
    let failures: Vec<&str> = (t.stderr.lines())
        .filter(|l| l.contains("failed: gRPC UNAVAILABLE: the store is down"))
        .collect();
    assert_eq!(failures.len(), 3, "{}", t.stderr);
    assert!(t.stderr.contains("4 pushed, 0 not pushed"), "{}", t.stderr);
}

/// The `.hdpush` files in DIR/.spool.
fn spooled(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir.join(".spool"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.ends_with(".hdpush"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn a_watch_restarted_sends_what_the_previous_one_spooled_first_in_order() {
    if !can_run("a_watch_restarted_sends_what_the_previous_one_spooled_first_in_order") {
        return;
    }
    let server = FakeParca::start(usize::MAX, 14);
    let dir = region_dir("parca-spool");
    let out = dir.with_extension("out");
    let r = hold_sized(&dir, 40, 2000);
    let pid = r.pid().to_string();

    // The first watch, the server down: its profiles wait in OUT/.spool; stopped with SIGTERM
    // once three are there.
    let err = dir.with_extension("watch1.err");
    let mut w1 = Command::new(heapdump())
        .args(["watch", "--by-pid", &pid, "--every", "1s", "-o"])
        .arg(&out)
        .args(["--push", &server.url, "--push-format", "parca"])
        .env("HEAPDUMP_DIR", &dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while spooled(&out).len() < 3 {
        assert!(t0.elapsed() < Duration::from_secs(60), "nothing spooled");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on the child this test started.
    unsafe { libc::kill(w1.id() as i32, libc::SIGTERM) };
    let status = w1.wait().unwrap();
    let stderr1 = std::fs::read_to_string(&err).unwrap();
    assert!(status.success(), "{stderr1}");
    let left = spooled(&out);
    assert!(left.len() >= 3, "{left:?}: {stderr1}");
    assert!(stderr1.contains("spooled"), "{stderr1}");
    let refused = server.calls().len();
    assert!(refused >= 1, "the first watch tried");
    assert!(server.calls().iter().all(|c| c.status == 14));
    // Each spooled profile is also an -o file of its own.
    let files = (std::fs::read_dir(&out).unwrap().flatten())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pb.gz"))
        .count();
    assert!(files >= left.len(), "{files} files, {} spooled", left.len());
    let mode = std::fs::metadata(out.join(".spool").join(&left[0]))
        .unwrap()
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );

    // The second watch, the server up: what was spooled goes first, then its own two.
    server.refuse_all(0);
    let t = run_timeout(
        Command::new(heapdump())
            .args([
                "watch", "--by-pid", &pid, "--every", "1s", "--count", "2", "-o",
            ])
            .arg(&out)
            .args(["--push", &server.url, "--push-format", "parca"])
            .env("HEAPDUMP_DIR", &dir),
        Duration::from_secs(120),
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    assert!(
        t.stderr.contains(&format!(
            "{} profile(s) an earlier watch could not push",
            left.len()
        )),
        "{}",
        t.stderr
    );
    let calls = server.calls();
    let taken: Vec<Pushed> = (calls[refused..].iter())
        .inspect(|c| assert_eq!(c.status, 0))
        .map(decode_call)
        .collect();
    assert_eq!(
        taken.len(),
        left.len() + 2,
        "every profile arrives, none twice: {}",
        t.stderr
    );
    for w in taken.windows(2) {
        assert!(
            w[0].profile.time_nanos < w[1].profile.time_nanos,
            "in order, none twice"
        );
    }
    for p in &taken {
        assert_eq!(p.labels["pid"], pid);
        assert_eq!(
            sum_through(&p.profile, "hold_blocks"),
            [0, 0, 41, 40 * 2000 + 40 * 8]
        );
    }
    assert_eq!(spooled(&out), Vec::<String>::new(), "sent ones are removed");
    assert!(
        t.stderr
            .contains(&format!("{} pushed, 0 not pushed", left.len() + 2)),
        "{}",
        t.stderr
    );

    // A third watch finds nothing to send again.
    let t = watch(
        &dir,
        &pid,
        &server.url,
        &["--count", "1", "-o", out.to_str().unwrap()],
        Duration::from_secs(60),
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    assert!(!t.stderr.contains("earlier watch"), "{}", t.stderr);
    assert_eq!(server.calls().len(), refused + left.len() + 3);
}

#[test]
fn profiles_spooled_for_pyroscope_are_sent_to_parca_by_the_next_watch() {
    if !can_run("profiles_spooled_for_pyroscope_are_sent_to_parca_by_the_next_watch") {
        return;
    }
    // A Pyroscope that cannot be reached: a port bound, then closed.
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let dir = region_dir("parca-spool-format");
    let out = dir.with_extension("out");
    let r = hold_sized(&dir, 30, 500);
    let pid = r.pid().to_string();
    let t = heapdump_timeout(
        &dir,
        &[
            "watch",
            "--by-pid",
            &pid,
            "--every",
            "1s",
            "--count",
            "2",
            "-o",
            out.to_str().unwrap(),
            "--push",
            &down,
        ],
        Duration::from_secs(60),
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    assert!(t.stderr.contains("(2 spooled)"), "{}", t.stderr);
    assert!(
        t.elapsed < Duration::from_secs(20),
        "no 30 s drain: {:?}",
        t.elapsed
    );
    assert_eq!(spooled(&out).len(), 2);
    // The spool holds no format: a Parca watch sends them, with Parca's labels.
    let server = FakeParca::start(0, 0);
    let t = watch(
        &dir,
        &pid,
        &server.url,
        &["--count", "1", "-o", out.to_str().unwrap()],
        Duration::from_secs(60),
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    let got: Vec<Pushed> = server.calls().iter().map(decode_call).collect();
    assert_eq!(got.len(), 3, "{}", t.stderr);
    for p in &got {
        assert_eq!(p.labels["__name__"], "memory");
        assert_eq!(p.labels["pid"], pid);
        assert!(!p.labels.contains_key("__delta__"), "{:?}", p.labels);
        assert_eq!(
            sum_through(&p.profile, "hold_blocks"),
            [0, 0, 31, 30 * 500 + 30 * 8]
        );
    }
    assert!(got[0].profile.time_nanos < got[1].profile.time_nanos);
    assert!(got[1].profile.time_nanos < got[2].profile.time_nanos);
    assert_eq!(spooled(&out), Vec::<String>::new());
}

#[test]
fn the_spool_is_bounded_oldest_dropped_first() {
    if !can_run("the_spool_is_bounded_oldest_dropped_first") {
        return;
    }
    let server = FakeParca::start(usize::MAX, 14);
    let dir = region_dir("parca-spool-bound");
    let out = dir.with_extension("out");
    let r = hold_sized(&dir, 40, 2000);
    let pid = r.pid().to_string();
    // One profile is a few KiB: a bound of 1 byte keeps none on disk (held in memory
    // instead), a bound of a profile and a half keeps one.
    let probe = watch(
        &dir,
        &pid,
        &server.url,
        &["--count", "1", "-o", out.to_str().unwrap()],
        Duration::from_secs(90),
    );
    assert_eq!(probe.code, Some(0), "{probe:?}");
    let one = spooled(&out);
    assert_eq!(one.len(), 1, "{}", probe.stderr);
    let size = std::fs::metadata(out.join(".spool").join(&one[0]))
        .unwrap()
        .len();
    let bound = (size * 3 / 2).to_string();
    let t = watch(
        &dir,
        &pid,
        &server.url,
        &[
            "--count",
            "2",
            "-o",
            out.to_str().unwrap(),
            "--spool-max-bytes",
            &bound,
        ],
        Duration::from_secs(120),
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    let drops: Vec<&str> = (t.stderr.lines())
        .filter(|l| l.contains("push spool full"))
        .collect();
    // The probe's profile (sent first, so oldest) and then the first of this watch.
    assert_eq!(drops.len(), 2, "{}", t.stderr);
    assert!(drops[0].contains(&one[0]), "{}", drops[0]);
    assert!(drops[1].contains("2 dropped so far"), "{}", drops[1]);
    let left = spooled(&out);
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0] > one[0], "the newest is kept");
}

/// Not a check: the size and time of a Parca push of a 1 M-block process, for
/// bench/RESULTS.md ("Fleet"). `cargo test --release --test parca -- --ignored --nocapture`.
#[test]
#[ignore]
fn measure_parca_push_of_a_million_blocks() {
    let server = FakeParca::start(0, 0);
    for (what, exe, arg, flags) in [
        (
            "bench/hold.c 1,000,000 blocks, 4 call paths",
            "bench/hold.c",
            "1000000",
            &[][..],
        ),
        (
            "many_stacks 20: 1,048,576 blocks, one stack each",
            "examples/c/many_stacks.c",
            "20",
            &["-fno-optimize-sibling-calls"][..],
        ),
    ] {
        let dir = region_dir("parca-measure");
        let bin = target_dir().join("test-bins").join("fleet-measure");
        let st = Command::new("cc")
            .args(["-O2", "-g", "-fno-omit-frame-pointer", "-pthread", "-o"])
            .arg(&bin)
            .arg(root().join(exe))
            .args(flags)
            .status()
            .unwrap();
        assert!(st.success());
        let mut cmd = Command::new(&bin);
        cmd.arg(arg);
        let r = start(cmd, &dir, true);
        let pid = r.pid().to_string();
        let out = dir.with_extension("pb.gz");
        let mut files = Vec::new();
        let mut pushes = Vec::new();
        for _ in 0..3 {
            let t = heapdump_timeout(
                &dir,
                &["snapshot", "--by-pid", &pid, "-o", out.to_str().unwrap()],
                Duration::from_secs(120),
            );
            assert_eq!(t.code, Some(0), "{t:?}");
            files.push(t.elapsed.as_secs_f64());
            let t = snapshot_push(&dir, &pid, &server.url, &[], Duration::from_secs(120));
            assert_eq!(t.code, Some(0), "{t:?}");
            pushes.push(t.elapsed.as_secs_f64());
        }
        let calls = server.calls();
        let last = calls.last().unwrap();
        let median = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v[v.len() / 2]
        };
        let (f, p) = (median(&mut files), median(&mut pushes));
        println!(
            "| {what} | {} (gRPC message) | {} | {f:.2} | {p:.2} | {:+.2} |",
            last.message.len(),
            std::fs::metadata(&out).unwrap().len(),
            p - f
        );
        drop(r);
    }
}
