//! Parca's ingestion API (`parca.profilestore.v1alpha1.WriteRawRequest`) as prost messages.
//!
//! Field names, numbers and types follow `proto/parca.proto` (written for heapdump from the
//! field list of Parca's public, Apache-2.0 `profilestore.proto`), with
//! `#[derive(prost::Message)]` so building needs no `protoc`. The transport (gRPC unary call
//! [`WRITE_RAW`] over HTTP/2) is described there; the client is `collector/src/parca.rs`. The
//! test below pins the wire tags.

/// The gRPC service heapdump calls.
pub const SERVICE: &str = "parca.profilestore.v1alpha1.ProfileStoreService";
/// The path of the `WriteRaw` call.
pub const WRITE_RAW: &str = "/parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw";

/// One call: series of profiles with their labels.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteRawRequest {
    /// The series (field 1, the deprecated `tenant`, is not sent).
    #[prost(message, repeated, tag = "2")]
    pub series: Vec<RawProfileSeries>,
    /// Whether the profiles' addresses are already normalized (heapdump: `false`).
    #[prost(bool, tag = "3")]
    pub normalized: bool,
}

/// The answer to [`WriteRawRequest`] (empty).
#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteRawResponse {}

/// Profiles that share one set of labels.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawProfileSeries {
    /// `__name__`, `service_name`, …
    #[prost(message, optional, tag = "1")]
    pub labels: Option<LabelSet>,
    /// The profiles.
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<RawSample>,
}

/// A set of labels.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LabelSet {
    /// The labels.
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
}

/// A label.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn wire_tags_match_parca_proto() {
        let r = WriteRawRequest {
            series: vec![RawProfileSeries {
                labels: Some(LabelSet {
                    labels: vec![Label {
                        name: "a".into(),
                        value: "b".into(),
                    }],
                }),
                samples: vec![RawSample {
                    raw_profile: vec![0x1f],
                }],
            }],
            normalized: true,
        };
        let bytes = r.encode_to_vec();
        #[rustfmt::skip]
        let want = vec![
            0x12, 15, // WriteRawRequest.series (2), 15 bytes
            0x0a, 8, // RawProfileSeries.labels (1), 8 bytes
            0x0a, 6, // LabelSet.labels (1), 6 bytes
            0x0a, 1, b'a', // Label.name (1)
            0x12, 1, b'b', // Label.value (2)
            0x12, 3, // RawProfileSeries.samples (2), 3 bytes
            0x0a, 1, 0x1f, // RawSample.raw_profile (1)
            0x18, 1, // WriteRawRequest.normalized (3)
        ];
        assert_eq!(bytes, want);
        assert_eq!(WriteRawRequest::decode(bytes.as_slice()).unwrap(), r);
    }
}
