//! Sending profiles to Parca (`--push URL --push-format parca`).
//!
//! One profile is one gRPC unary call, `parca.profilestore.v1alpha1.ProfileStoreService/
//! WriteRaw` (`proto/parca.proto`): one series whose labels are those of
//! [`super::client::Client::labels`] (`__name__=memory`, `service_name`, `hostname`, `pid`, the
//! user's `--label`s), holding the gzip-compressed pprof profile, `normalized=false`. The
//! profile's `time_nanos` is its instant and `duration_nanos` 0, so Parca files it as a gauge
//! (`memory:inuse_space:bytes:space:bytes`), and its ids are sequential from 1 with string 0
//! `""`, as Parca's validator requires ([`crate::pprof::build`] writes them so; [`check_ids`]
//! says why a profile would be refused).
//!
//! The call goes through `tonic` over HTTP/2: h2c with prior knowledge for `http://` URLs
//! (Parca's port 7070 serves gRPC and its UI on one port), TLS (rustls, ring, the Mozilla
//! roots) with ALPN `h2` for `https://`. tonic is asynchronous; the client owns a tokio
//! current-thread runtime and blocks on each call, so the rest of the collector stays
//! synchronous and no thread is started.

use super::Failure;
use anyhow::Context;
use heapdump_proto as pp;
use heapdump_proto::parca as pb;
use std::time::Duration;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::Code;

/// Largest gRPC message Parca takes, bytes (its server's `MaxRecvMsgSize`).
pub const MAX_MESSAGE: usize = 64 << 20;

/// A connection to one Parca server (made at the first call, remade after a failure).
#[derive(Debug)]
pub struct Parca {
    rt: tokio::runtime::Runtime,
    channel: Channel,
    url: String,
    authorization: Option<tonic::metadata::AsciiMetadataValue>,
}

impl Parca {
    /// A client of the server at `url` (`http://HOST:PORT`: h2c; `https://…`: TLS with ALPN
    /// h2), sending `authorization` (e.g. `Bearer TOKEN`) as the call's `authorization`
    /// metadata, each call given at most `timeout` (connection included). No connection is made
    /// yet.
    ///
    /// Errors: `url` is not a valid http(s) URL; the authorization is not ASCII; the runtime
    /// cannot be created (out of file descriptors).
    pub fn new(url: &str, authorization: Option<&str>, timeout: Duration) -> anyhow::Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot create the runtime of the gRPC client")?;
        let mut ep = Endpoint::from_shared(url.to_owned())
            .with_context(|| format!("--push {url}: not a valid URL"))?
            .user_agent(concat!("heapdump/", env!("CARGO_PKG_VERSION")))
            .context("user agent")?
            .timeout(timeout)
            .connect_timeout(timeout);
        if url.starts_with("https://") {
            ep = ep
                .tls_config(ClientTlsConfig::new().with_webpki_roots())
                .with_context(|| format!("--push {url}: cannot set up TLS"))?;
        }
        // The channel's background task is spawned on this runtime; it runs while a call
        // blocks on it.
        let channel = {
            let _guard = rt.enter();
            ep.connect_lazy()
        };
        let authorization = authorization
            .map(|a| a.parse())
            .transpose()
            .context("the authorization token must be printable ASCII")?;
        Ok(Parca {
            rt,
            channel,
            url: url.to_owned(),
            authorization,
        })
    }

    /// The `WriteRaw` request for `profile` (pprof, gzip-compressed or not) with `labels`.
    pub fn request(labels: &[(String, String)], profile: &[u8]) -> pb::WriteRawRequest {
        pb::WriteRawRequest {
            series: vec![pb::RawProfileSeries {
                labels: Some(pb::LabelSet {
                    labels: (labels.iter())
                        .map(|(name, value)| pb::Label {
                            name: name.clone(),
                            value: value.clone(),
                        })
                        .collect(),
                }),
                samples: vec![pb::RawSample {
                    raw_profile: profile.to_vec(),
                }],
            }],
            normalized: false,
        }
    }

    /// Sends `profile` with `labels` once; `what` names it in messages (`pid 12 (server)`).
    ///
    /// Errors: a request past [`MAX_MESSAGE`] (not retried: it would never be taken); the
    /// server cannot be reached or answers with a gRPC status other than OK ([`retryable`]
    /// says which are tried again).
    pub fn send(
        &self,
        labels: &[(String, String)],
        profile: &[u8],
        what: &str,
    ) -> Result<(), Failure> {
        use prost::Message;
        let fail = |text: String, retry: bool| Failure {
            text: format!("push of {what} to {} failed: {text}", self.url),
            retry,
        };
        let req = Self::request(labels, profile);
        let len = req.encoded_len();
        if len > MAX_MESSAGE {
            return Err(fail(
                format!(
                    "the request is {len} bytes, past the {} MiB a gRPC message to Parca may \
                     be (a profile this large cannot be sent; write it with -o)",
                    MAX_MESSAGE >> 20
                ),
                false,
            ));
        }
        let mut request = tonic::Request::new(req);
        if let Some(a) = &self.authorization {
            request.metadata_mut().insert("authorization", a.clone());
        }
        let mut grpc = tonic::client::Grpc::new(self.channel.clone())
            .max_encoding_message_size(MAX_MESSAGE + 5);
        let result = self.rt.block_on(async move {
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            let codec =
                tonic::codec::ProstCodec::<pb::WriteRawRequest, pb::WriteRawResponse>::default();
            grpc.unary(
                request,
                http::uri::PathAndQuery::from_static(pb::WRITE_RAW),
                codec,
            )
            .await
        });
        match result {
            Ok(_) => Ok(()),
            Err(status) => Err(fail(describe(&status), retryable(status.code()))),
        }
    }
}

/// Whether a call that ended with `code` may succeed if tried again: the server is down or
/// overloaded (`UNAVAILABLE`, which is also what a refused or broken connection gives,
/// `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `ABORTED`), the call timed out on our side
/// (`CANCELLED`), or the server failed (`INTERNAL`, `UNKNOWN`: e.g. a proxy's error page). A
/// refusal of the profile or of the credentials (`INVALID_ARGUMENT`, `UNAUTHENTICATED`,
/// `PERMISSION_DENIED`, …) would be refused again.
pub fn retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::Cancelled
            | Code::Internal
            | Code::Unknown
    )
}

/// `status` on one line: `gRPC UNAVAILABLE: message (cause)`.
fn describe(status: &tonic::Status) -> String {
    let name = format!("{:?}", status.code());
    // CamelCase to the protocol's SHOUTING_CASE.
    let mut code = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            code.push('_');
        }
        code.push(c.to_ascii_uppercase());
    }
    let mut text = format!("gRPC {code}");
    let mut message = status.message().to_owned();
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        let s = e.to_string();
        if !message.contains(&s) {
            message = if message.is_empty() {
                s
            } else {
                format!("{message}: {s}")
            };
        }
        source = e.source();
    }
    let message = message.split_whitespace().collect::<Vec<_>>().join(" ");
    if !message.is_empty() {
        text.push_str(": ");
        text.extend(message.chars().take(300));
    }
    text
}

/// What Parca's validator (`pkg/normalizer/validate.go`) would refuse in `p`, if anything:
/// string 0 not `""`; mapping, location or function ids not sequential from 1; a sample with
/// not one value per sample type or a location id out of range; a location's mapping id or a
/// line's function id out of range.
pub fn check_ids(p: &pp::Profile) -> Result<(), String> {
    if p.string_table.first().map(String::as_str) != Some("") {
        return Err("string 0 is not \"\"".into());
    }
    let seq = |ids: &mut dyn Iterator<Item = u64>, what: &str| -> Result<(), String> {
        for (i, id) in ids.enumerate() {
            if id != i as u64 + 1 {
                return Err(format!("{what} {} has id {id}", i + 1));
            }
        }
        Ok(())
    };
    seq(&mut p.mapping.iter().map(|m| m.id), "mapping")?;
    seq(&mut p.location.iter().map(|l| l.id), "location")?;
    seq(&mut p.function.iter().map(|f| f.id), "function")?;
    let (nm, nl, nf) = (
        p.mapping.len() as u64,
        p.location.len() as u64,
        p.function.len() as u64,
    );
    for l in &p.location {
        if l.mapping_id > nm {
            return Err(format!("location {} has mapping {}", l.id, l.mapping_id));
        }
        if let Some(line) = l
            .line
            .iter()
            .find(|x| x.function_id == 0 || x.function_id > nf)
        {
            return Err(format!(
                "location {} has function {}",
                l.id, line.function_id
            ));
        }
    }
    for (i, s) in p.sample.iter().enumerate() {
        if s.value.len() != p.sample_type.len() {
            return Err(format!("sample {i} has {} values", s.value.len()));
        }
        if let Some(id) = s.location_id.iter().find(|&&id| id == 0 || id > nl) {
            return Err(format!("sample {i} has location {id}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_retried_or_not() {
        for c in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::ResourceExhausted,
        ] {
            assert!(retryable(c), "{c:?}");
        }
        for c in [
            Code::InvalidArgument,
            Code::Unauthenticated,
            Code::PermissionDenied,
            Code::Unimplemented,
        ] {
            assert!(!retryable(c), "{c:?}");
        }
        assert_eq!(
            describe(&tonic::Status::new(Code::ResourceExhausted, "too\nmany")),
            "gRPC RESOURCE_EXHAUSTED: too many"
        );
    }

    #[test]
    fn check_ids_finds_gaps() {
        let mut p = pp::Profile {
            string_table: vec![String::new(), "f".into()],
            ..Default::default()
        };
        for id in [1, 2] {
            p.function.push(pp::Function {
                id,
                name: 1,
                ..Default::default()
            });
            p.location.push(pp::Location {
                id,
                line: vec![pp::Line {
                    function_id: id,
                    line: 0,
                }],
                ..Default::default()
            });
        }
        assert_eq!(check_ids(&p), Ok(()));
        p.location[1].id = 3;
        assert_eq!(check_ids(&p), Err("location 2 has id 3".into()));
        p.location[1].id = 2;
        p.string_table[0] = "x".into();
        assert!(check_ids(&p).is_err());
    }

    #[test]
    fn a_request_past_64_mib_is_refused_for_good() {
        let c = Parca::new("http://127.0.0.1:9", None, Duration::from_secs(1)).unwrap();
        let big = vec![0u8; MAX_MESSAGE + 1];
        let f = c.send(&[], &big, "pid 1 (x)").unwrap_err();
        assert!(!f.retry);
        assert!(f.text.contains("64 MiB"), "{}", f.text);
    }
}
