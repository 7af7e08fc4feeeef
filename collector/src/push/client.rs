//! A client of one server ([`Client`]), whatever its API: Pyroscope ([`super::pyroscope`])
//! or Parca ([`super::parca`]).

use super::parca::Parca;
use super::pyroscope::Pyroscope;
use super::{Failure, Item, PushFormat, PushProps};

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
    /// Pyroscope: Connect over HTTP/1.1.
    Pyroscope(Pyroscope),
    /// Parca: a gRPC channel.
    Parca(Parca),
}

impl Client {
    /// A client for `props.url` in `props.format` (no connection is made yet).
    ///
    /// Errors (Parca only): the URL is not valid, the token is not ASCII, the client's runtime
    /// cannot be created.
    pub fn new(props: &PushProps) -> anyhow::Result<Client> {
        let api = match props.format {
            PushFormat::Pyroscope => Api::Pyroscope(Pyroscope::new(props)),
            PushFormat::Parca => Api::Parca(Parca::new(
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

    /// Pushes `item` once.
    ///
    /// Errors: the server cannot be reached or refuses the profile (Pyroscope: an HTTP status
    /// other than 2xx, the text giving it and the start of the server's message; Parca: a
    /// gRPC status other than OK, or a request past its 64 MiB message limit).
    pub fn send(&self, item: &Item) -> Result<(), Failure> {
        match &self.api {
            Api::Pyroscope(p) => p.send(item),
            Api::Parca(c) => c.send(&item.labels, &item.profile, &item.what),
        }
    }
}

/// A random UUID (version 4), as text.
fn uuid_v4() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_is_version_4() {
        let u = uuid_v4();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!("89ab".contains(&u[19..20]), "{u}");
        assert_ne!(u, uuid_v4());
    }
}
