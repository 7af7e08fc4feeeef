//! `--push URL`: what heapdump sends to Grafana Pyroscope, received by a fake server on
//! 127.0.0.1 (HTTP/1.1, Connect unary) and decoded with message definitions written here from
//! Pyroscope's public field list (not heapdump's own types): the call, the labels (`__name__`,
//! `__delta__=false`, `service_name`, `hostname`, `pid`, `--label`), the authentication headers,
//! and the embedded gzip pprof profile with the program's exact blocks. A server that refuses
//! the first pushes gets every profile of a watch, in order, none twice; one that cannot be
//! reached gives one line, never a panic.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `push.v1.PushRequest`, written for this test.
#[derive(Clone, PartialEq, prost::Message)]
struct TestPushRequest {
    #[prost(message, repeated, tag = "1")]
    series: Vec<TestSeries>,
}

/// `push.v1.RawProfileSeries`.
#[derive(Clone, PartialEq, prost::Message)]
struct TestSeries {
    #[prost(message, repeated, tag = "1")]
    labels: Vec<TestLabel>,
    #[prost(message, repeated, tag = "2")]
    samples: Vec<TestSample>,
}

/// `types.v1.LabelPair`.
#[derive(Clone, PartialEq, prost::Message)]
struct TestLabel {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    value: String,
}

/// `push.v1.RawSample`.
#[derive(Clone, PartialEq, prost::Message)]
struct TestSample {
    #[prost(bytes = "vec", tag = "1")]
    raw_profile: Vec<u8>,
    #[prost(string, tag = "2")]
    id: String,
}

/// One HTTP request the fake server received.
#[derive(Debug, Clone)]
struct Received {
    method: String,
    path: String,
    /// Header names in lower case.
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
    /// The status it was answered with.
    status: u16,
}

/// A fake Pyroscope: answers `503 Service Unavailable` to the first `refuse` requests, then
/// `200` with an empty `PushResponse`.
struct FakePyroscope {
    url: String,
    received: Arc<Mutex<Vec<Received>>>,
}

impl FakePyroscope {
    fn start(refuse: usize) -> FakePyroscope {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(Vec::new()));
        let count = Arc::new(AtomicUsize::new(0));
        let r = received.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (r, count) = (r.clone(), count.clone());
                std::thread::spawn(move || serve(conn, &r, &count, refuse));
            }
        });
        FakePyroscope { url, received }
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// Serves the requests of one connection (keep-alive) until it closes.
fn serve(conn: TcpStream, out: &Mutex<Vec<Received>>, count: &AtomicUsize, refuse: usize) {
    let mut w = conn.try_clone().unwrap();
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut words = line.split_whitespace();
        let (method, path) = (
            words.next().unwrap_or("").to_owned(),
            words.next().unwrap_or("").to_owned(),
        );
        let mut headers = BTreeMap::new();
        loop {
            let mut h = String::new();
            r.read_line(&mut h).unwrap();
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap();
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
        let len: usize = headers
            .get("content-length")
            .expect("the push has a Content-Length")
            .parse()
            .unwrap();
        let mut body = vec![0; len];
        r.read_exact(&mut body).unwrap();
        let n = count.fetch_add(1, Ordering::SeqCst);
        let status = if n < refuse { 503 } else { 200 };
        out.lock().unwrap().push(Received {
            method,
            path,
            headers,
            body,
            status,
        });
        let reply = if status == 200 {
            "HTTP/1.1 200 OK\r\nContent-Type: application/proto\r\nContent-Length: 0\r\n\r\n"
                .to_owned()
        } else {
            let msg = r#"{"code":"unavailable","message":"ingester is down"}"#;
            format!(
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\n\r\n{msg}",
                msg.len()
            )
        };
        if w.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// What one push carried: its labels and the pprof profile (gunzipped, decoded).
struct Pushed {
    labels: BTreeMap<String, String>,
    id: String,
    profile: heapdump_proto::Profile,
}

/// Decodes a push with the test's own message types; checks the call's shape.
fn decode_push(r: &Received) -> Pushed {
    use prost::Message;
    assert_eq!(r.method, "POST");
    assert_eq!(r.path, "/push.v1.PusherService/Push");
    assert_eq!(
        r.headers.get("content-type").map(String::as_str),
        Some("application/proto")
    );
    let req = TestPushRequest::decode(r.body.as_slice()).unwrap();
    assert_eq!(req.series.len(), 1, "one series per push");
    let s = &req.series[0];
    let labels: BTreeMap<String, String> = s
        .labels
        .iter()
        .map(|l| (l.name.clone(), l.value.clone()))
        .collect();
    assert_eq!(
        labels.len(),
        s.labels.len(),
        "a label twice: {:?}",
        s.labels
    );
    assert_eq!(s.samples.len(), 1, "one profile per push");
    let raw = &s.samples[0].raw_profile;
    assert_eq!(&raw[..2], &[0x1f, 0x8b], "gzip magic");
    let mut pprof = Vec::new();
    flate2::read::GzDecoder::new(raw.as_slice())
        .read_to_end(&mut pprof)
        .unwrap();
    Pushed {
        labels,
        id: s.samples[0].id.clone(),
        profile: heapdump_proto::Profile::decode(pprof.as_slice()).unwrap(),
    }
}

/// Asserts the profile holds exactly `hold_sized n size`'s blocks, with Go's heap sample types;
/// `alloc`: whether alloc_* hold the cumulative counts (a file) or 0 (a push: deltas since the
/// process's previous push, 0 on the first and while the program allocates nothing).
fn assert_exact(p: &heapdump_proto::Profile, n: i64, size: i64, alloc: bool) {
    let s = |i: i64| p.string_table[i as usize].as_str();
    let types: Vec<&str> = p.sample_type.iter().map(|t| s(t.r#type)).collect();
    assert_eq!(
        types,
        [
            "alloc_objects",
            "alloc_space",
            "inuse_objects",
            "inuse_space"
        ]
    );
    let period = p.period_type.as_ref().unwrap();
    assert_eq!((s(period.r#type), s(period.unit)), ("space", "bytes"));
    let (blocks, bytes) = (n + 1, n * size + n * 8);
    let (an, ab) = if alloc { (blocks, bytes) } else { (0, 0) };
    assert_eq!(sum_through(p, "hold_blocks"), [an, ab, blocks, bytes]);
}

#[test]
fn snapshot_push_sends_labels_auth_and_the_exact_profile() {
    if !can_run("snapshot_push_sends_labels_auth_and_the_exact_profile") {
        return;
    }
    let server = FakePyroscope::start(0);
    let dir = region_dir("push-snapshot");
    let r = hold_sized(&dir, 120, 700);
    let pid = r.pid().to_string();
    let token = dir.with_extension("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();

    // Bearer token and tenant from the command line, a label of our own; no -o.
    let t = heapdump_timeout(
        &dir,
        &[
            "snapshot",
            "--by-pid",
            &pid,
            "--push",
            &server.url,
            "--bearer-token-file",
            token.to_str().unwrap(),
            "--tenant",
            "team-a",
            "--label",
            "env=test",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    let got = server.received();
    assert_eq!(got.len(), 1, "one push");
    assert_eq!(
        got[0].headers.get("authorization").map(String::as_str),
        Some("Bearer s3cret-token")
    );
    assert_eq!(
        got[0].headers.get("x-scope-orgid").map(String::as_str),
        Some("team-a")
    );
    let p = decode_push(&got[0]);
    let want: BTreeMap<String, String> = [
        ("__name__", "memory"),
        ("__delta__", "false"),
        ("service_name", "hold_sized"),
        ("hostname", hostname().as_str()),
        ("pid", pid.as_str()),
        ("env", "test"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    assert_eq!(p.labels, want);
    assert_eq!(p.id.len(), 36, "a UUID: {:?}", p.id);
    assert_exact(&p.profile, 120, 700, false);

    // Basic authentication and the tenant from the environment, service_name overridden.
    let auth = dir.with_extension("auth");
    std::fs::write(&auth, "12345:glc_token\n").unwrap();
    let out = dir.with_extension("pb.gz");
    let t = run_timeout(
        Command::new(heapdump())
            .args(["snapshot", "--by-pid", &pid, "-o"])
            .arg(&out)
            .args(["--push", &server.url, "--label", "service_name=billing"])
            .env("HEAPDUMP_DIR", &dir)
            .env("HEAPDUMP_PUSH_BASIC_AUTH_FILE", &auth)
            .env("HEAPDUMP_PUSH_TENANT", "team-b"),
        Duration::from_secs(60),
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    let got = server.received();
    assert_eq!(got.len(), 2);
    // base64("12345:glc_token")
    assert_eq!(
        got[1].headers.get("authorization").map(String::as_str),
        Some("Basic MTIzNDU6Z2xjX3Rva2Vu")
    );
    assert_eq!(
        got[1].headers.get("x-scope-orgid").map(String::as_str),
        Some("team-b")
    );
    let p = decode_push(&got[1]);
    assert_eq!(p.labels["service_name"], "billing");
    assert_eq!(p.labels["__delta__"], "false");
    assert_exact(&p.profile, 120, 700, false);
    // The file written alongside is the same profile.
    assert_exact(&decode(&out), 120, 700, true);
}

#[test]
fn watch_push_retries_until_the_server_takes_every_profile_in_order() {
    if !can_run("watch_push_retries_until_the_server_takes_every_profile_in_order") {
        return;
    }
    // Down for the first three pushes, then up.
    let server = FakePyroscope::start(3);
    let dir = region_dir("push-watch");
    let r = hold_sized(&dir, 80, 1500);
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
            "4",
            "--push",
            &server.url,
        ],
        Duration::from_secs(120),
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    let got = server.received();
    let refused: Vec<&Received> = got.iter().filter(|r| r.status == 503).collect();
    let taken: Vec<Pushed> = got
        .iter()
        .filter(|r| r.status == 200)
        .map(decode_push)
        .collect();
    assert_eq!(refused.len(), 3, "{}", t.stderr);
    assert_eq!(taken.len(), 4, "every profile arrives: {}", t.stderr);
    // In order (each profile's instant later than the one before), none twice.
    for w in taken.windows(2) {
        assert!(
            w[0].profile.time_nanos < w[1].profile.time_nanos,
            "out of order"
        );
        assert_ne!(w[0].id, w[1].id);
    }
    for p in &taken {
        assert_eq!(p.labels["pid"], pid);
        assert_eq!(p.labels["__name__"], "memory");
        assert_exact(&p.profile, 80, 1500, false);
    }
    // Each failure is one line naming the status and the server's message.
    let failures: Vec<&str> = t
        .stderr
        .lines()
        .filter(|l| l.contains("failed: HTTP 503"))
        .collect();
    assert_eq!(failures.len(), 3, "{}", t.stderr);
    assert!(failures[0].contains("ingester is down"), "{}", failures[0]);
    assert!(t.stderr.contains("4 pushed, 0 not pushed"), "{}", t.stderr);
}

#[test]
fn watch_push_sends_alloc_values_as_deltas_since_the_previous_push() {
    if !can_run("watch_push_sends_alloc_values_as_deltas_since_the_previous_push") {
        return;
    }
    let server = FakePyroscope::start(0);
    let dir = region_dir("push-delta");
    // grower: 100 blocks of 100 B from old_alloc; on a line on stdin, 50 of 200 B from new_alloc.
    let exe = compile_c("grower", &["-fno-optimize-sibling-calls"]);
    let mut r = start(Command::new(exe), &dir, true);
    let pid = r.pid().to_string();
    let out = dir.with_extension("watch.err");
    let mut watch = Command::new(heapdump())
        .args(["watch", "--by-pid", &pid, "--every", "1s", "--count", "4"])
        .args(["--push", &server.url])
        .env("HEAPDUMP_DIR", &dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&out).unwrap())
        .spawn()
        .unwrap();
    // Grow once the first profile has arrived.
    let t0 = std::time::Instant::now();
    while server.received().is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(60), "no push arrived");
        std::thread::sleep(Duration::from_millis(20));
    }
    r.stdin.as_mut().unwrap().write_all(b"\n").unwrap();
    r.wait_line("grown");
    let status = watch.wait().unwrap();
    let stderr = std::fs::read_to_string(&out).unwrap();
    assert!(status.success(), "{stderr}");
    let got: Vec<Pushed> = server.received().iter().map(decode_push).collect();
    assert_eq!(got.len(), 4, "{stderr}");
    let mut before = [0i64; 4];
    for (i, p) in got.iter().enumerate() {
        assert_eq!(p.labels["__delta__"], "false");
        // The blocks held from the start: in use in every profile, allocated before the
        // first push, so never in an alloc_* delta.
        assert_eq!(
            sum_through(&p.profile, "old_alloc"),
            [0, 0, 100, 10_000],
            "push {i}: {stderr}"
        );
        let new = sum_through(&p.profile, "new_alloc");
        if i == 0 {
            assert_eq!(new, [0, 0, 0, 0], "the first push was before the growth");
        } else {
            // Nothing is freed: what was allocated since the previous push is what it holds
            // more than then.
            assert_eq!(
                [new[0], new[1]],
                [new[2] - before[2], new[3] - before[3]],
                "push {i}: {new:?} after {before:?}"
            );
        }
        before = new;
    }
    assert_eq!(
        before,
        [0, 0, 50, 10_000],
        "the last push: all held, none new"
    );
    let total: [i64; 2] = got.iter().fold([0, 0], |t, p| {
        let n = sum_through(&p.profile, "new_alloc");
        [t[0] + n[0], t[1] + n[1]]
    });
    assert_eq!(total, [50, 10_000], "each allocation in exactly one push");
    assert_eq!(r.finish(), 0);
}

#[test]
fn an_unreachable_server_is_one_line_not_a_panic() {
    if !can_run("an_unreachable_server_is_one_line_not_a_panic") {
        return;
    }
    // A port nothing listens on: bound, then closed.
    let url = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let dir = region_dir("push-down");
    let r = hold_sized(&dir, 10, 100);
    let pid = r.pid().to_string();
    let t = heapdump_timeout(
        &dir,
        &["snapshot", "--by-pid", &pid, "--push", &url],
        Duration::from_secs(60),
    );
    assert_eq!(t.code, Some(1), "{t:?}");
    assert!(!t.stderr.contains("panicked"), "{}", t.stderr);
    assert_eq!(t.stderr.trim().lines().count(), 1, "{}", t.stderr);
    assert!(t.stderr.contains("push of pid"), "{}", t.stderr);

    // watch goes on and ends normally, saying what it could not send.
    let t = heapdump_timeout(
        &dir,
        &[
            "watch", "--by-pid", &pid, "--every", "1s", "--count", "2", "--push", &url,
        ],
        Duration::from_secs(120),
    );
    assert_eq!(t.code, Some(0), "{t:?}");
    assert!(!t.stderr.contains("panicked"), "{}", t.stderr);
    assert!(t.stderr.contains("retrying in"), "{}", t.stderr);
    assert!(t.stderr.contains("0 pushed, 2 not pushed"), "{}", t.stderr);
}
