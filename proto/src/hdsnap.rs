//! heapdump's capture format (`.hdsnap`) as prost messages.
//!
//! Field names, numbers and types follow `proto/hdsnap.proto` (package `heapdump.hdsnap`),
//! written out with `#[derive(prost::Message)]` so building needs no `protoc`. The file layout
//! (an 8-byte magic `HDSNAP\0\n`, the major and minor format versions as two little-endian
//! `u16`, then one gzip member holding varint-length-delimited [`Record`]s: one [`Header`],
//! [`Stack`]s, [`Blocks`] batches, [`Root`]s, one [`Footer`]) and the meaning of every field are
//! documented there; `heapdump`'s reader and writer are in `collector/src/graph/capture.rs`.
//! The tests below pin the wire tags.

/// One framed record of the stream: exactly one kind is set; `None` is a kind this version
/// does not know (a reader skips it).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Record {
    /// The record.
    #[prost(oneof = "record::Kind", tags = "1, 2, 3, 4, 5")]
    pub kind: Option<record::Kind>,
}

/// The kinds of [`Record`].
pub mod record {
    /// The record's kind and content.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        /// The first record.
        #[prost(message, tag = "1")]
        Header(super::Header),
        /// A symbolized stack.
        #[prost(message, tag = "2")]
        Stack(super::Stack),
        /// A batch of blocks with their edges.
        #[prost(message, tag = "3")]
        Blocks(super::Blocks),
        /// A root.
        #[prost(message, tag = "4")]
        Root(super::Root),
        /// The last record.
        #[prost(message, tag = "5")]
        Footer(super::Footer),
    }
}

/// What was captured, and the counts of what follows (see `hdsnap.proto`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Header {
    /// Format major version (the file prefix's).
    #[prost(uint32, tag = "1")]
    pub format_major: u32,
    /// Format minor version (the file prefix's).
    #[prost(uint32, tag = "2")]
    pub format_minor: u32,
    /// The writing program, e.g. `heapdump 0.1.0`.
    #[prost(string, tag = "3")]
    pub writer: String,
    /// Target pid.
    #[prost(uint32, tag = "4")]
    pub pid: u32,
    /// Target command line.
    #[prost(string, repeated, tag = "5")]
    pub cmdline: Vec<String>,
    /// Target executable path.
    #[prost(string, tag = "6")]
    pub executable: String,
    /// Snapshot instant, ns since the Unix epoch.
    #[prost(uint64, tag = "7")]
    pub time_unix_ns: u64,
    /// Blocks that follow.
    #[prost(uint64, tag = "8")]
    pub block_count: u64,
    /// Edges that follow.
    #[prost(uint64, tag = "9")]
    pub edge_count: u64,
    /// Roots that follow.
    #[prost(uint64, tag = "10")]
    pub root_count: u64,
    /// Stacks that follow.
    #[prost(uint64, tag = "11")]
    pub stack_count: u64,
    /// Sum of the blocks' sizes, bytes.
    #[prost(uint64, tag = "12")]
    pub block_bytes: u64,
    /// Allocation sampling interval, bytes (0: every block recorded).
    #[prost(uint64, tag = "13")]
    pub sample_interval: u64,
    /// Pointer size of the target, bytes.
    #[prost(uint32, tag = "14")]
    pub pointer_size: u32,
    /// The target's threads.
    #[prost(message, repeated, tag = "15")]
    pub threads: Vec<Thread>,
    /// The target's loaded modules.
    #[prost(message, repeated, tag = "16")]
    pub modules: Vec<Module>,
    /// Problems that may make the capture inexact.
    #[prost(string, repeated, tag = "17")]
    pub warnings: Vec<String>,
}

/// A thread of the target.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Thread {
    /// OS thread id.
    #[prost(uint32, tag = "1")]
    pub tid: u32,
    /// Thread name.
    #[prost(string, tag = "2")]
    pub name: String,
}

/// A loaded module (ELF object) of the target.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Module {
    /// Path of the ELF file.
    #[prost(string, tag = "1")]
    pub path: String,
    /// Load bias: runtime address = base + ELF virtual address.
    #[prost(uint64, tag = "2")]
    pub base: u64,
    /// GNU build ID bytes (may be empty).
    #[prost(bytes = "vec", tag = "3")]
    pub build_id: Vec<u8>,
}

/// A symbolized allocation stack.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Stack {
    /// Stack id (`u32::MAX` is never used: it means "no stack").
    #[prost(uint32, tag = "1")]
    pub id: u32,
    /// Function names, innermost first, the recorder's frames left out.
    #[prost(string, repeated, tag = "2")]
    pub function: Vec<String>,
    /// Optional, parallel to `function`: source files ("" unknown).
    #[prost(string, repeated, tag = "3")]
    pub file: Vec<String>,
    /// Optional, parallel to `function`: source lines (0 unknown).
    #[prost(uint32, repeated, tag = "4")]
    pub line: Vec<u32>,
    /// A stack with script frames (Python's, JavaScript's): the index of the innermost one (minor version 1).
    #[prost(uint32, optional, tag = "5")]
    pub script_innermost: Option<u32>,
    /// With `script_innermost`: the indices of the frames inside it that are the interpreter's
    /// own code (minor version 1).
    #[prost(uint32, repeated, tag = "6")]
    pub interpreter: Vec<u32>,
    /// With `script_innermost`: the site's name when it is that frame, `FUNCTION (FILE)`
    /// (minor version 1; empty: its function name).
    #[prost(string, tag = "7")]
    pub script_site: String,
    /// With `script_innermost`: the stack's other script frames of the program's own code,
    /// outside it (minor version 1).
    #[prost(uint32, repeated, tag = "8")]
    pub script_outer: Vec<u32>,
    /// Parallel to `script_outer`: their names as sites (minor version 1).
    #[prost(string, repeated, tag = "9")]
    pub script_outer_sites: Vec<String>,
}

/// A batch of consecutive blocks in address order with their edges (one element per block in
/// every field but `target_delta`; delta encodings in `hdsnap.proto`).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Blocks {
    /// Index of the batch's first block.
    #[prost(uint64, tag = "1")]
    pub first_index: u64,
    /// First address, then differences to the previous block's address.
    #[prost(uint64, repeated, tag = "2")]
    pub address_delta: Vec<u64>,
    /// Requested sizes, bytes.
    #[prost(uint64, repeated, tag = "3")]
    pub size: Vec<u64>,
    /// Stack ids (`u32::MAX`: none).
    #[prost(uint32, repeated, tag = "4")]
    pub stack: Vec<u32>,
    /// Allocating OS thread ids.
    #[prost(uint32, repeated, tag = "5")]
    pub thread: Vec<u32>,
    /// Edges per block.
    #[prost(uint32, repeated, tag = "6")]
    pub edge_count: Vec<u32>,
    /// Per block: first target minus the block's index, then differences to the previous target.
    #[prost(sint64, repeated, tag = "7")]
    pub target_delta: Vec<i64>,
}

/// Where a root is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum RootKind {
    /// Never written.
    Unspecified = 0,
    /// A writable segment of a loaded module: globals and statics.
    Global = 1,
    /// A thread's stack (with its static TLS).
    Stack = 2,
    /// A writable mapping holding no heap block.
    Mapping = 3,
    /// A thread's registers (when the threads were frozen).
    Registers = 4,
}

/// A root: a named place outside the heap and the blocks it points to.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Root {
    /// A [`RootKind`] value.
    #[prost(enumeration = "RootKind", tag = "1")]
    pub kind: i32,
    /// The root's name.
    #[prost(string, tag = "2")]
    pub name: String,
    /// Targets: the first as is, then differences to the previous one.
    #[prost(uint32, repeated, tag = "3")]
    pub target_delta: Vec<u32>,
}

/// The last record: the counts again.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Footer {
    /// Records before the footer (header included).
    #[prost(uint64, tag = "1")]
    pub record_count: u64,
    /// Blocks written.
    #[prost(uint64, tag = "2")]
    pub block_count: u64,
    /// Edges written.
    #[prost(uint64, tag = "3")]
    pub edge_count: u64,
    /// Roots written.
    #[prost(uint64, tag = "4")]
    pub root_count: u64,
    /// Stacks written.
    #[prost(uint64, tag = "5")]
    pub stack_count: u64,
    /// Sum of the blocks' sizes, bytes.
    #[prost(uint64, tag = "6")]
    pub block_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn blocks_wire_tags_match_hdsnap_proto() {
        let r = Record {
            kind: Some(record::Kind::Blocks(Blocks {
                first_index: 2,
                address_delta: vec![0x1000, 0x20],
                size: vec![16, 300],
                stack: vec![7, u32::MAX],
                thread: vec![5, 5],
                edge_count: vec![1, 0],
                target_delta: vec![-1],
            })),
        };
        let bytes = r.encode_to_vec();
        #[rustfmt::skip]
        let want = vec![
            0x1a, 31, // Record.blocks (3, length-delimited), 31 bytes
            0x08, 2, // first_index (1) = 2
            0x12, 3, 0x80, 0x20, 0x20, // address_delta (2), packed: 0x1000, 0x20
            0x1a, 3, 16, 0xac, 0x02, // size (3), packed: 16, 300
            0x22, 6, 7, 0xff, 0xff, 0xff, 0xff, 0x0f, // stack (4), packed: 7, u32::MAX
            0x2a, 2, 5, 5, // thread (5), packed
            0x32, 2, 1, 0, // edge_count (6), packed
            0x3a, 1, 1, // target_delta (7), packed sint64: zigzag(-1) = 1
        ];
        assert_eq!(bytes, want);
        assert_eq!(Record::decode(bytes.as_slice()).unwrap(), r);
    }

    #[test]
    fn other_records_wire_tags_match_hdsnap_proto() {
        let root = Record {
            kind: Some(record::Kind::Root(Root {
                kind: RootKind::Mapping as i32,
                name: "g".into(),
                target_delta: vec![3, 1],
            })),
        };
        assert_eq!(
            root.encode_to_vec(),
            vec![0x22, 9, 0x08, 3, 0x12, 1, b'g', 0x1a, 2, 3, 1]
        );
        let stack = Record {
            kind: Some(record::Kind::Stack(Stack {
                id: 1,
                function: vec!["f".into()],
                file: vec![],
                line: vec![9],
                script_innermost: None,
                interpreter: vec![],
                script_site: String::new(),
                script_outer: vec![],
                script_outer_sites: vec![],
            })),
        };
        assert_eq!(
            stack.encode_to_vec(),
            vec![0x12, 8, 0x08, 1, 0x12, 1, b'f', 0x22, 1, 9]
        );
        let header = Header {
            format_major: 1,
            pointer_size: 8,
            threads: vec![Thread {
                tid: 4,
                name: "w".into(),
            }],
            warnings: vec!["x".into()],
            ..Default::default()
        };
        let rec = Record {
            kind: Some(record::Kind::Header(header.clone())),
        };
        let bytes = rec.encode_to_vec();
        #[rustfmt::skip]
        let want = vec![
            0x0a, 15,
            0x08, 1, // format_major (1)
            0x70, 8, // pointer_size (14)
            0x7a, 5, 0x08, 4, 0x12, 1, b'w', // threads (15)
            0x8a, 0x01, 1, b'x', // warnings (17): two-byte tag
        ];
        assert_eq!(bytes, want);
        assert_eq!(Record::decode(bytes.as_slice()).unwrap(), rec);
        let footer = Record {
            kind: Some(record::Kind::Footer(Footer {
                record_count: 4,
                block_bytes: 1,
                ..Default::default()
            })),
        };
        assert_eq!(footer.encode_to_vec(), vec![0x2a, 4, 0x08, 4, 0x30, 1]);
    }

    #[test]
    fn unknown_fields_and_record_kinds_are_skipped() {
        // A Record of kind 9 (unknown) decodes as no kind; a Footer with an unknown field 20
        // (varint) decodes as its known fields.
        let r = Record::decode(&[0x4a, 2, 0x08, 1][..]).unwrap();
        assert_eq!(r.kind, None);
        let r = Record::decode(&[0x2a, 5, 0xa0, 0x01, 7, 0x08, 3][..]).unwrap();
        assert_eq!(
            r.kind,
            Some(record::Kind::Footer(Footer {
                record_count: 3,
                ..Default::default()
            }))
        );
    }
}
