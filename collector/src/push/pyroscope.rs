//! Grafana Pyroscope's push API: one Connect unary call per profile,
//! `POST {URL}/push.v1.PusherService/Push` (`proto/pyroscope.proto`), over `ureq` (rustls for
//! https).

use super::{one_line, Failure, Item, PushProps};
use heapdump_proto::pyroscope as pb;

/// `ureq`'s connection pool and the Connect endpoint, with what every push sends.
#[derive(Debug)]
pub struct Pyroscope {
    agent: ureq::Agent,
    endpoint: String,
    props: PushProps,
}

impl Pyroscope {
    /// A client for `props.url` (no connection is made yet).
    pub fn new(props: &PushProps) -> Pyroscope {
        Pyroscope {
            agent: ureq::Agent::config_builder()
                .timeout_global(Some(props.timeout))
                .http_status_as_error(false)
                .user_agent(concat!("heapdump/", env!("CARGO_PKG_VERSION")))
                .build()
                .into(),
            endpoint: format!("{}/push.v1.PusherService/Push", props.url),
            props: props.clone(),
        }
    }

    /// The body of the Pyroscope push of `item`: a `PushRequest` whose one series has the
    /// item's labels and `__delta__=false` (the `alloc_*` values are deltas already: the
    /// server must not subtract the previous profile).
    pub fn body(item: &Item) -> Vec<u8> {
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
    /// Errors: the server cannot be reached or refuses the profile (an HTTP status other than
    /// 2xx: the text gives it and the start of the server's message).
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
        let body = Self::body(item);
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
