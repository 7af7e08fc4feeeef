//! `watch`'s pushes: the [`Queue`] of what waits to be sent (in memory, or in the
//! [`super::spool`]) and the [`Pusher`] thread that sends it.

use super::client::Client;
use super::spool::{Spool, Stored};
use super::{Failure, Item};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Most profiles waiting to be pushed again.
pub const QUEUE_ITEMS: usize = 100;
/// Most bytes (encoded requests) waiting to be pushed again.
pub const QUEUE_BYTES: usize = 64 << 20;
/// First wait after a failed push.
pub const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// Longest wait between two tries.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

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
                eprintln!("heapdump: {}", crate::regions::shown(&format!("{e:#}")));
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
                    eprintln!(
                        "heapdump: {} (the next watch may send it again)",
                        crate::regions::shown(&format!("{e:#}"))
                    );
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
                        eprintln!(
                            "heapdump: {}: not a profile to push (removed)",
                            crate::regions::shown(&format!("{e:#}"))
                        );
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
