//! Grafana Pyroscope's push API (`push.v1.PushRequest`) as prost messages.
//!
//! Field names, numbers and types follow `proto/pyroscope.proto` (written for heapdump from the
//! field list of Pyroscope's public `push.proto` and `types.proto`), with
//! `#[derive(prost::Message)]` so building needs no `protoc`. The transport (Connect unary
//! `POST {URL}/push.v1.PusherService/Push`, `Content-Type: application/proto`) is described
//! there; the client is `collector/src/push.rs`. The test below pins the wire tags.

/// One push: series of profiles with their labels.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PushRequest {
    /// The series.
    #[prost(message, repeated, tag = "1")]
    pub series: Vec<RawProfileSeries>,
}

/// Profiles that share one set of labels.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawProfileSeries {
    /// `__name__`, `service_name`, …
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<LabelPair>,
    /// The profiles.
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<RawSample>,
}

/// A label (`types.v1.LabelPair`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct LabelPair {
    /// Label name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Label value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// One profile.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawSample {
    /// A pprof profile, gzip-compressed or not.
    #[prost(bytes = "vec", tag = "1")]
    pub raw_profile: Vec<u8>,
    /// An identifier of the profile (the proto's `ID`).
    #[prost(string, tag = "2")]
    pub id: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn wire_tags_match_pyroscope_proto() {
        let r = PushRequest {
            series: vec![RawProfileSeries {
                labels: vec![LabelPair {
                    name: "a".into(),
                    value: "b".into(),
                }],
                samples: vec![RawSample {
                    raw_profile: vec![0x1f],
                    id: "i".into(),
                }],
            }],
        };
        let bytes = r.encode_to_vec();
        #[rustfmt::skip]
        let want = vec![
            0x0a, 16, // PushRequest.series (1), 16 bytes
            0x0a, 6, // RawProfileSeries.labels (1), 6 bytes
            0x0a, 1, b'a', // LabelPair.name (1)
            0x12, 1, b'b', // LabelPair.value (2)
            0x12, 6, // RawProfileSeries.samples (2), 6 bytes
            0x0a, 1, 0x1f, // RawSample.raw_profile (1)
            0x12, 1, b'i', // RawSample.ID (2)
        ];
        assert_eq!(bytes, want);
        assert_eq!(PushRequest::decode(bytes.as_slice()).unwrap(), r);
    }
}
