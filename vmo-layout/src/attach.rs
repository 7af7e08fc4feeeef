//! What `heapdump attach` / `detach` and the shim's attach entries exchange, in a page the
//! collector maps in the target (see `collector/src/attach/`): the collector writes the
//! request, the shim the answer; both sides are this crate's layout.

/// Names the page's layout version: "HDATTAC1".
pub const MAGIC: u64 = u64::from_le_bytes(*b"HDATTAC1");

/// The entry `heapdump attach` calls: `void heapdump_attach_start(AttachArgs *)`.
pub const ATTACH_ENTRY: &[u8] = b"heapdump_attach_start\0";
/// The entry `heapdump detach` calls: `void heapdump_attach_stop(AttachArgs *)`.
pub const DETACH_ENTRY: &[u8] = b"heapdump_attach_stop\0";
/// The shim's exported byte saying where it stands (`static heapdump_attach_state: u8`),
/// which the collector reads before changing anything: one of the `SHIM_*` values.
pub const STATE_SYMBOL: &str = "heapdump_attach_state";
/// [`STATE_SYMBOL`]: loaded by `dlopen`, never attached (or the attach failed).
pub const SHIM_LOADED: u8 = 0;
/// [`STATE_SYMBOL`]: attached (recording).
pub const SHIM_ATTACHED: u8 = 1;
/// [`STATE_SYMBOL`]: attached, then detached: it may be attached again.
pub const SHIM_DETACHED: u8 = 2;
/// [`STATE_SYMBOL`]: preloaded (`LD_PRELOAD`, `heapdump run`): not attachable.
pub const SHIM_PRELOADED: u8 = 3;

/// The function whose address is the single frame of the blocks live before the attach.
pub const BEFORE_ATTACH_FRAME: &str = "heapdump_live_before_attach";

/// [`AttachArgs::status`]: not answered (the entry did not run or did not return).
pub const STATUS_PENDING: u64 = 0;
/// [`AttachArgs::status`]: done.
pub const STATUS_OK: u64 = 1;
/// [`AttachArgs::status`]: refused or failed; [`AttachArgs::message`] says why.
pub const STATUS_FAILED: u64 = 2;

/// Bytes of [`AttachArgs::env`].
pub const ENV_BYTES: usize = 2048;
/// Bytes of [`AttachArgs::message`].
pub const MESSAGE_BYTES: usize = 512;

/// The request and the answer (`#[repr(C)]`, 2,688 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AttachArgs {
    /// [`MAGIC`], written by the collector.
    pub magic: u64,
    /// `STATUS_*`, written by the shim.
    pub status: u64,
    /// Blocks live before the attach that were recorded (attach).
    pub blocks: u64,
    /// Their usable bytes.
    pub bytes: u64,
    /// GOT slots pointed at the shim (attach) or restored (detach).
    pub slots: u64,
    /// glibc's own count when the heap was walked (`mallinfo2`): bytes of chunks in use in
    /// its arenas (`uordblks`: the walk's blocks plus their 8-byte headers, plus chunks in the
    /// per-thread caches), and of its mmapped chunks (`hblkhd`), and how many (`hblks`).
    pub mallinfo: [u64; 3],
    /// Bytes used in [`Self::env`].
    pub env_len: u64,
    /// A line for the user: why it failed, or a note (the heap was not walked, and why);
    /// NUL-terminated.
    pub message: [u8; MESSAGE_BYTES],
    /// The settings, `NAME=VALUE` entries each ended by a NUL byte (the collector's
    /// `HEAPDUMP_*` variables), read instead of the target's environment.
    pub env: [u8; ENV_BYTES],
    /// 1 when this attach followed a detach (the shim was loaded): then [`Self::blocks`] and
    /// [`Self::bytes`] are the blocks made while detached, added now.
    pub reattached: u64,
    /// Re-attach: records from before the detach whose blocks are still live.
    pub kept: u64,
    /// Re-attach: records from before the detach closed (their blocks were freed meanwhile).
    pub closed: u64,
    /// Objects of CPython's small-object allocator (pymalloc) live before the attach that
    /// were recorded, and their bytes (their size classes'); included in [`Self::blocks`]
    /// and [`Self::bytes`].
    pub pymalloc: [u64; 2],
    /// Re-attach: glibc blocks left out as heapdump's own (allocated unrecorded by the shim
    /// while it was attached, found again unchanged), and their usable bytes.
    pub own: [u64; 2],
}

const _: () = assert!(std::mem::size_of::<AttachArgs>() == 2688);

impl AttachArgs {
    /// A request carrying `env` (truncated to [`ENV_BYTES`] at an entry's end).
    pub fn new(env: &[u8]) -> Self {
        let mut a = AttachArgs {
            magic: MAGIC,
            status: STATUS_PENDING,
            blocks: 0,
            bytes: 0,
            slots: 0,
            mallinfo: [0; 3],
            env_len: 0,
            message: [0; MESSAGE_BYTES],
            env: [0; ENV_BYTES],
            reattached: 0,
            kept: 0,
            closed: 0,
            pymalloc: [0; 2],
            own: [0; 2],
        };
        let mut n = env.len().min(ENV_BYTES);
        while n > 0 && n < env.len() && env[n - 1] != 0 {
            n -= 1;
        }
        a.env[..n].copy_from_slice(&env[..n]);
        a.env_len = n as u64;
        a
    }

    /// Sets [`Self::message`] (truncated).
    pub fn set_message(&mut self, parts: &[&[u8]]) {
        let mut n = 0;
        for p in parts {
            let k = p.len().min(MESSAGE_BYTES - 1 - n);
            self.message[n..n + k].copy_from_slice(&p[..k]);
            n += k;
        }
        self.message[n] = 0;
    }

    /// [`Self::message`] up to its NUL.
    pub fn message(&self) -> &[u8] {
        let n = self
            .message
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(MESSAGE_BYTES);
        &self.message[..n]
    }
}
