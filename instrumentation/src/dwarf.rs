//! Stack capture by DWARF CFI (`.eh_frame`), for code built without frame pointers (glibc,
//! libstdc++, Debian's CPython, Rust's std) as well as code built with them.
//!
//! Each frame is unwound by a *rule*: where the canonical frame address (CFA) is (`rsp` or
//! `rbp` plus an offset), where the caller's `rbp` was saved (if it was), and the return
//! address at CFA − 8 (the x86-64 psABI's call convention). A thread keeps a direct-mapped
//! cache of rules keyed by code address ([`Cache`], 4,096 entries of 16 bytes, about 70 KiB with the evaluation context), so in steady
//! state unwinding a frame costs one cache probe and one or two reads of the stack — about what
//! a frame-pointer walk costs. On a miss the rule is computed with gimli from the object's
//! `.eh_frame_hdr` binary-search table and `.eh_frame` (DWARF 5 §6.4, "Call Frame
//! Information"; LSB "Exception Frames"), into an unwind context that lives in the cache, so
//! nothing is allocated while unwinding.
//!
//! The object list (executable ranges and their unwind sections, found with
//! `dl_iterate_phdr`) is built where allocating is safe (the preload constructor, after
//! `dlopen`/`dlclose`, the first allocation of a Rust program) and published through an atomic
//! pointer with a generation number; a thread's cache drops its rules when it sees a newer
//! generation. A list replaced by a newer one is freed once no thread may still walk with it:
//! each cache publishes the list it uses (a hazard pointer, stored only when the list
//! changes, so a walk costs one extra comparison), and a rebuild frees the replaced lists no
//! registered cache names. So memory stays at the current list plus at most one old list per
//! idle thread, not one list per `dlopen` (Python importing 500 extension modules).
//!
//! Each walk also looks in a memo of the thread's recent whole walks ([`Memo`]) and, failing
//! that, reuses the outer frames of its previous one ([`Capture`]): both copy frames only after
//! re-reading every stack word they depend on.
//!
//! Caches live in anonymous mappings, not in the program's heap (about 70 KiB per thread that
//! allocates, and up to 78 KiB more of captures and memo, committed as they are first used),
//! and are released at thread exit; a thread that allocates after its exit
//! handler ran (another TLS destructor) walks by frame pointers instead of making a new one.
//!
//! Code with no CFI (generated code, objects without `.eh_frame_hdr`) is unwound as if it kept
//! frame pointers, except CPython's perf trampolines (`-X perf`), recognised by their code
//! bytes and stepped over (see [`trampoline_rule`]). CFI that is not of the simple forms above
//! (DWARF expressions, as in signal trampolines) ends the stack trace there.

use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, EndianSlice, NativeEndian, ParsedEhFrameHdr,
    Register, RegisterRule, UnwindContext, UnwindContextStorage, UnwindSection, UnwindTableRow,
    X86_64,
};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use vmo_layout::v1::MAX_FRAMES;

type Reader = EndianSlice<'static, NativeEndian>;

/// Fixed-size storage for gimli's CFI evaluation (no allocation while unwinding): up to 32
/// register rules per row (x86-64 functions save at most the 7 callee-saved registers and the
/// return address) and 4 levels of `DW_CFA_remember_state`. CFI needing more is treated as
/// having no CFI.
struct Fixed;

impl UnwindContextStorage<usize> for Fixed {
    type Rules = [(Register, RegisterRule<usize>); 32];
    type Stack = [UnwindTableRow<usize, Self>; 4];
}

/// One loaded object's unwind tables.
struct Object {
    /// Executable range `[lo, hi)` (runtime addresses).
    lo: u64,
    hi: u64,
    bases: BaseAddresses,
    eh_frame: EhFrame<Reader>,
    hdr: ParsedEhFrameHdr<Reader>,
}

/// The loaded objects, sorted by `lo`, and the generation they belong to.
struct Objects {
    list: Vec<Object>,
    generation: u64,
    /// The loader's counts of objects loaded and unloaded so far (`dlpi_adds`, `dlpi_subs`)
    /// when the list was built: a code address outside every object means the list is stale
    /// only if these changed since (a library being initialized inside `dlopen`, before the
    /// `dlopen` hook's rebuild), not when it is generated code.
    adds: u64,
    subs: u64,
}

impl Objects {
    fn find(&self, address: u64) -> Option<&Object> {
        let i = self.list.partition_point(|o| o.lo <= address);
        let o = self.list.get(i.checked_sub(1)?)?;
        (address < o.hi).then_some(o)
    }
}

static OBJECTS: AtomicPtr<Objects> = AtomicPtr::new(std::ptr::null_mut());

/// Every live cache (to find the object lists they use), and the replaced object lists not
/// freed yet; both behind [`REGISTRY`]'s lock, touched only where allocating is allowed.
struct Registry {
    caches: Vec<usize>,
    retired: Vec<usize>,
}
static REGISTRY: crate::sys::SpinLock<Registry> = crate::sys::SpinLock::new(Registry {
    caches: Vec::new(),
    retired: Vec::new(),
});

/// Runs `f` on the registry under its lock.
fn with_registry<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    f(&mut REGISTRY.lock())
}

/// Takes the registry lock across `fork` (a fork racing a thread's first unwind would leave
/// the child's copy locked).
pub(crate) fn lock_for_fork() {
    REGISTRY.lock_for_fork();
}

/// Releases what [`lock_for_fork`] took.
///
/// # Safety
/// [`lock_for_fork`] took the lock (no guard exists).
pub(crate) unsafe fn unlock_after_fork() {
    // SAFETY: per the contract.
    unsafe { REGISTRY.unlock_after_fork() };
}
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// How a frame is unwound (see the module docs). 8 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
struct Rule {
    /// CFA = base register + `cfa_offset` bytes.
    cfa_offset: i32,
    /// With [`BP_AT`]: the caller's `rbp` is at CFA + `bp_offset` bytes.
    bp_offset: i16,
    /// [`CFA_SP`], [`CFA_BP`] or [`STOP`].
    kind: u8,
    /// [`BP_SAME`], [`BP_AT`] or [`BP_LOST`].
    bp: u8,
}

const CFA_SP: u8 = 1;
const CFA_BP: u8 = 2;
/// End of the stack (return address undefined) or CFI this unwinder does not evaluate.
const STOP: u8 = 3;
const BP_SAME: u8 = 0;
const BP_AT: u8 = 1;
/// The caller's `rbp` is not recoverable: later frames must not depend on it.
const BP_LOST: u8 = 2;

const RULE_STOP: Rule = Rule {
    cfa_offset: 0,
    bp_offset: 0,
    kind: STOP,
    bp: BP_SAME,
};
/// The rule of a function that keeps a frame pointer: CFA = rbp + 16, caller's rbp at CFA − 16.
const RULE_FRAME_POINTER: Rule = Rule {
    cfa_offset: 16,
    bp_offset: -16,
    kind: CFA_BP,
    bp: BP_AT,
};

const SLOTS: usize = 4096;
/// Entries of [`Cache::fp_keys`]: 4 KiB, small enough to stay in the L1 cache next to the stack
/// being walked (the 64 KiB of `slots` do not: a lookup there was the walk's main stall).
const FP_KEYS: usize = 512;

#[derive(Clone, Copy)]
#[repr(C)]
struct Slot {
    /// The code address looked up (a return address − 1, or the first frame's pc); 0 = empty.
    key: u64,
    rule: Rule,
}

/// A thread's rule cache and CFI evaluation context (about 70 KiB, in its own anonymous
/// mapping).
pub struct Cache {
    generation: u64,
    /// The object list this cache's walks use (hazard pointer; see the module docs).
    in_use: AtomicPtr<Objects>,
    /// A rule was computed for a code address in no known object since the last
    /// [`take_stale`].
    missed: bool,
    slots: [Slot; SLOTS],
    /// Code addresses whose rule is [`RULE_FRAME_POINTER`] (direct-mapped, 0 = empty): the rule
    /// of nearly every frame of code built with frame pointers, checked here first.
    fp_keys: [u64; FP_KEYS],
    ctx: UnwindContext<usize, Fixed>,
    /// The last two captures and the memo (see [`Captures`]), in a mapping of their own; null
    /// when it could not be mapped (every walk is then a full one).
    captures: *mut Captures,
    /// The caller of the next walks needs only the stack id when the memo has one
    /// ([`Self::set_id_only`]).
    id_only: bool,
    /// The last walk recorded itself whole in the thread's last capture (see
    /// [`Self::last_walk_words`]).
    made: bool,
    /// The lowest address of the thread's cold stack (see [`ColdStack`]): a guard page, then
    /// [`COLD_BYTES`] of stack; null when it could not be mapped (rules are then computed on
    /// the program's stack).
    cold: *mut u8,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cache")
    }
}

impl Cache {
    /// The stack id stored (by [`Self::set_memo_stack`]) for the frames of this thread's
    /// last walk, when that walk found them in its memo; `None` otherwise.
    pub fn memo_stack(&self) -> Option<u32> {
        if self.captures.is_null() {
            return None;
        }
        // SAFETY: the thread's own captures, not used by a walk now.
        let m = unsafe { &(*self.captures).memo };
        let e = m.entries.get(m.last)?;
        (e.n != 0 && e.stack != u32::MAX).then_some(e.stack)
    }

    /// Stores `id` as the stack id of the frames of this thread's last walk, if its memo holds
    /// them (found or just kept there): the next walk that finds them gives it back.
    pub fn set_memo_stack(&mut self, id: u32) {
        if self.captures.is_null() {
            return;
        }
        // SAFETY: as in `memo_stack`.
        let m = unsafe { &mut (*self.captures).memo };
        let last = m.last;
        if let Some(e) = m.entries.get_mut(last) {
            e.stack = id;
        }
    }

    /// Whether the walks that follow may leave their frames unwritten when they find them in
    /// the memo with a stack id (the caller then takes only [`Self::memo_stack`]): copying
    /// the frames out was a fifth of a memo hit's instructions on bench/storm.c.
    pub fn set_id_only(&mut self, on: bool) {
        self.id_only = on;
    }

    /// The stack words the thread's last walk read, when it recorded itself whole (a full
    /// walk, or one that reused the previous capture's outer frames, of a complete stack):
    /// per frame its return-address slot and, where the rule read one, its saved-`rbp` slot,
    /// then the words that ended the walk, as (address, value) into `out`. Returns how many,
    /// with the stack top the walk read below and the object list generation of its rules;
    /// `None` when the walk did not record itself, ended on a word out of bounds, or `out` is
    /// too short.
    ///
    /// A walk from the same registers, below the same stack top and with rules of the same
    /// generation, that finds every one of these words holding the same value finds the same
    /// frames (see [`Capture`]): what a memo of whole stacks checks instead of walking.
    pub fn last_walk_words(&self, out: &mut [[u64; 2]]) -> Option<(usize, u64, u64)> {
        if !self.made || self.captures.is_null() {
            return None;
        }
        // SAFETY: the thread's own captures, not used by a walk now.
        let caps = unsafe { &*self.captures };
        let c = &caps.pair[caps.last & 1];
        if c.n == 0 || c.n >= MAX_FRAMES {
            return None;
        }
        // A saved `rbp` read for frame `f` matters only when a later frame was unwound from
        // `rbp` before another was read (or the walk's end, which may have used it): in code
        // without frame pointers `rbp` is an ordinary register whose saved value changes from
        // call to call, and checking it would miss every time. Bit `f` of `live`: frame `f`'s
        // saved `rbp` matters.
        // (`c.n` < 64: the bits fit a `u64`.)
        let uses = c.uses_bp as u64;
        let n = c.n;
        let mut live = 0u64;
        let mut used = true; // by the end
        for f in (0..n).rev() {
            live |= ((used && c.bp_at[f] != 0) as u64) << f;
            used = (uses >> f) & 1 != 0 || (c.bp_at[f] == 0 && used);
        }
        let ends = c.ends.min(2);
        if n + live.count_ones() as usize + ends > out.len() {
            return None;
        }
        let mut k = 0;
        for f in 0..n {
            out[k] = [c.sp[f].wrapping_sub(8), c.out[f]];
            k += 1;
            if (live >> f) & 1 != 0 {
                out[k] = [c.bp_at[f], c.bp[f]];
                k += 1;
            }
        }
        for e in 0..ends {
            out[k] = [c.end_at[e], c.end_val[e]?];
            k += 1;
        }
        Some((k, c.hi, c.generation))
    }

    /// Forgets which memo entry the last walk used (every walk starts with this).
    #[inline(always)]
    fn forget_memo(&mut self) {
        self.made = false;
        if !self.captures.is_null() {
            // SAFETY: as in `memo_stack`.
            unsafe { (*self.captures).memo.last = usize::MAX };
        }
    }

    /// Whether the code at `key` keeps a frame pointer (its rule is [`RULE_FRAME_POINTER`]).
    #[inline(always)]
    fn keeps_frame_pointer(&mut self, objects: &Objects, key: u64) -> bool {
        let i = (key ^ (key >> 9)) as usize % FP_KEYS;
        if self.fp_keys[i] == key {
            return true;
        }
        if self.rule(objects, key) != RULE_FRAME_POINTER {
            return false;
        }
        self.fp_keys[i] = key;
        true
    }

    #[inline]
    fn rule(&mut self, objects: &Objects, key: u64) -> Rule {
        // Return addresses differ in their low bits; folding in the page number spreads code
        // that repeats at page-aligned offsets. No multiply: this is on the frame-to-frame
        // dependency chain.
        let set = ((key ^ (key >> 12)) as usize % (SLOTS / 2)) * 2;
        if self.slots[set].key == key {
            return self.slots[set].rule;
        }
        self.rule_other_way(objects, key, set)
    }

    /// The second way of `set` (two-way set associative: code addresses whose slots collide,
    /// such as call sites in a large interpreter loop, no longer evict each other), or a
    /// computed rule; the entry found or computed moves to the first way, the first way's to
    /// the second.
    #[inline(never)]
    fn rule_other_way(&mut self, objects: &Objects, key: u64, set: usize) -> Rule {
        let first = self.slots[set];
        let rule = if self.slots[set + 1].key == key {
            self.slots[set + 1].rule
        } else {
            compute_cold(self.cold, objects, &mut self.ctx, key, &mut self.missed)
        };
        self.slots[set + 1] = first;
        self.slots[set] = Slot { key, rule };
        rule
    }
}

/// Whether a walk may reuse the outer part of the thread's previous capture
/// (`HEAPDUMP_STACK_REUSE`, on by default; see [`Captures`]).
static REUSE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Turns reusing the previous capture's outer frames on or off (process-wide; a full walk of
/// every frame when off, the reference the reuse is tested against).
pub fn set_stack_reuse(on: bool) {
    REUSE.store(on, Ordering::Relaxed);
}

/// One walk, as needed to reuse its outer frames: every frame's return address, the
/// registers of the frame it returns into (`sp` = that frame's CFA, `bp` as restored) and
/// where that `bp` was read from, and the stack words whose values ended the walk.
///
/// Why reuse is exact: a walk is a function of the registers it starts from, the rules of the
/// code addresses it meets (fixed for an object list generation), the bounds of the stack, and
/// the words it reads — for each frame the return address at CFA − 8 and, when the rule says
/// so, the saved `rbp`; at the end the words that stopped it. So when a new walk reaches a
/// frame whose return address and registers (`sp`, `bp`) equal those of frame `c` of the
/// previous capture, with the same stack top and object list, and every word the previous walk
/// read for the frames after `c` (and to end) still holds the value read then (re-read now, at
/// the same address), the rest of the new walk would read the same words, apply the same
/// rules and find the same frames: they are copied. Any difference (a `longjmp` or exception
/// that left other frames there, a coroutine's other stack, a signal frame, another object
/// list) means a full walk. Nothing in the program's stack is changed (unlike a shadow stack
/// that patches return addresses).
#[repr(C)]
struct Capture {
    /// Frames captured; 0: nothing reusable; [`MAX_FRAMES`]: truncated, not reusable.
    n: usize,
    /// The stack top the walk read below.
    hi: u64,
    /// The object list generation of its rules.
    generation: u64,
    /// Words read by the step that ended the walk: how many (0–2), their addresses and
    /// values (`None`: the address was outside the readable stack).
    ends: usize,
    end_at: [u64; 2],
    end_val: [Option<u64>; 2],
    out: [u64; MAX_FRAMES],
    sp: [u64; MAX_FRAMES],
    bp: [u64; MAX_FRAMES],
    /// Where `bp[i]` was read from; 0: not read (kept from the frame below, or lost).
    bp_at: [u64; MAX_FRAMES],
    /// Bit `i`: frame `i` was unwound from its `rbp` (its CFA is `rbp`-based: a frame-pointer
    /// frame), so the `rbp` value it started from decided where it read.
    uses_bp: u128,
}

/// A thread's last capture and the one being made (they alternate), and its memo of whole
/// walks (see [`Memo`]).
#[repr(C)]
struct Captures {
    pair: [Capture; 2],
    /// Which of `pair` is the last capture.
    last: usize,
    /// Walks, frames found and frames reused in the current window of [`WINDOW`] walks.
    window: (u32, u32, u32),
    /// Walks left that neither record nor reuse (see [`WINDOW`]).
    pause: u32,
    /// Walks and memo hits in the memo's current window of [`WINDOW`] walks.
    memo_window: (u32, u32),
    /// Walks left that do not use the memo (see [`MEMO_KEEP`]).
    memo_pause: u32,
    /// Windows in a row that paused the memo (at most [`MEMO_BACKOFF`]): each pause is twice
    /// the one before.
    memo_paused: u32,
    memo: Memo,
    /// Walks found in the memo (tests only: that the memo is used at all).
    #[cfg(test)]
    hits: u64,
}

/// Stacks the memo keeps at most this deep; deeper ones are walked (reusing the last capture's
/// outer frames where they can).
const MEMO_FRAMES: usize = 32;
/// Sets of the memo, each of [`MEMO_WAYS`] entries: 64 walks in all, about 102 KiB of the
/// captures' mapping (committed as entries are first used).
const MEMO_SETS: usize = 16;
const MEMO_WAYS: usize = 4;

/// A stack word a walk read: where, and the value it held.
#[derive(Clone, Copy)]
#[repr(C)]
struct Word {
    at: u64,
    val: u64,
}

/// The two words at `at` a walk read together: a saved `rbp` and, above it, the return
/// address (every frame that keeps a frame pointer, and most others that save `rbp` first).
/// Aligned so that the check compares both with one 16-byte operation.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Pair([u64; 2]);

/// Most single words (return addresses without a saved `rbp` below them, saved `rbp`s
/// elsewhere, the words that ended the walk) a memo entry keeps; a walk that read more is not
/// kept.
const MEMO_SINGLES: usize = MEMO_FRAMES + 2;
// The sizes the documentation gives (1,632 bytes an entry, 102 KiB for the 64).
const _: () = assert!(std::mem::size_of::<MemoEntry>() == 1632);

/// One whole walk, as needed to know it would give the same frames again: the registers it
/// started from, its bounds and object list, and every stack word it read (per frame the
/// return address at CFA − 8 and the saved `rbp` where the rule said so, then the words that
/// ended it). Words read in adjacent pairs (saved `rbp`, return address: every frame-pointer
/// frame) are kept as [`Pair`]s and checked 16 bytes at a time; the others one by one.
#[repr(C)]
struct MemoEntry {
    /// The first frame's code address (0: a frame known to keep a frame pointer), `sp`, `bp`.
    start: [u64; 3],
    lo: u64,
    hi: u64,
    generation: u64,
    /// Frames; 0: empty.
    n: u32,
    /// The stack id these frames were interned as (see [`Cache::memo_stack`]); `u32::MAX`:
    /// not known.
    stack: u32,
    /// Pairs and single words kept. The words that ended the walk are singles; one it found
    /// out of bounds is not kept (the bounds being the same, it still is).
    pairs: u32,
    singles: u32,
    /// Where each pair was read, then what it held.
    pair_at: [u64; MEMO_FRAMES],
    pair_val: [Pair; MEMO_FRAMES],
    single: [Word; MEMO_SINGLES],
    /// The frames (return addresses), leaf first: read only when they are copied out.
    rets: [u64; MEMO_FRAMES],
}

/// The memo of a thread's recent walks (bench/storm.c's 16 call paths, an interpreter's few
/// allocation sites), looked up by the registers a walk starts from.
///
/// Why a hit is exact: as for [`Capture`], a walk is a function of its start registers, its
/// stack bounds, the rules of its object list and the words it reads. An entry with the same
/// start, bounds and object list generation, each of whose words still holds the value read
/// then, gives the same frames, so they are copied without a rule looked up — and with them
/// the stack id they were interned as, so the stack is neither hashed nor looked up either.
/// Nothing is assumed of the program: a `longjmp`, an exception, another coroutine or a signal
/// frame that left other words in any of those slots fails the check and the walk is made.
#[repr(C)]
struct Memo {
    /// The entry the thread's last walk found or filled; `usize::MAX`: none. First: written
    /// by every walk, it shares a cache line with the captures' counters, not with entries.
    last: usize,
    /// Per set, a hash of each way's start (0: empty way).
    tags: [[u64; MEMO_WAYS]; MEMO_SETS],
    /// Per set, the way the next new entry replaces (round robin).
    next: [u8; MEMO_SETS],
    entries: [MemoEntry; MEMO_SETS * MEMO_WAYS],
}

/// A start's tag (never 0) and set in the memo.
#[inline(always)]
fn memo_tag(start: &[u64; 3]) -> (u64, usize) {
    let h = (start[0] ^ start[1].rotate_left(17) ^ start[2].rotate_left(31))
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h | 1, (h >> 58) as usize % MEMO_SETS)
}

impl Memo {
    /// The entry whose walk a walk from `start` with these bounds and object list would
    /// repeat (every word it read checked again), if any.
    #[inline(always)]
    fn find(&self, start: &[u64; 3], lo: u64, hi: u64, generation: u64) -> Option<usize> {
        let (tag, set) = memo_tag(start);
        for way in 0..MEMO_WAYS {
            if self.tags[set][way] != tag {
                continue;
            }
            let i = set * MEMO_WAYS + way;
            let e = &self.entries[i];
            if e.n != 0
                && e.start == *start
                && e.lo == lo
                && e.hi == hi
                && e.generation == generation
                && e.holds(lo, hi)
            {
                return Some(i);
            }
        }
        None
    }

    /// Keeps capture `c` (complete, 1 to [`MEMO_FRAMES`] frames) of a walk from `start`;
    /// returns its entry, or `None` when its words do not fit one.
    fn insert(
        &mut self,
        start: &[u64; 3],
        lo: u64,
        hi: u64,
        generation: u64,
        c: &Capture,
    ) -> Option<usize> {
        let n = c.n.min(MEMO_FRAMES);
        // Words that are not in a pair: a frame whose rule read no `rbp` has its return
        // address alone, one that read it elsewhere than just below, both.
        let ends = &c.end_val[..c.ends.min(2)];
        let singles: usize = (0..n)
            .map(|k| match c.bp_at[k] {
                0 => 1,
                at if at.wrapping_add(8) == c.sp[k].wrapping_sub(8) => 0,
                _ => 2,
            })
            .sum::<usize>()
            + ends.iter().filter(|v| v.is_some()).count();
        if singles > MEMO_SINGLES {
            return None;
        }
        let (tag, set) = memo_tag(start);
        let way = self.next[set] as usize % MEMO_WAYS;
        self.next[set] = ((way + 1) % MEMO_WAYS) as u8;
        let i = set * MEMO_WAYS + way;
        let e = &mut self.entries[i];
        e.start = *start;
        e.lo = lo;
        e.hi = hi;
        e.generation = generation;
        e.n = n as u32;
        e.stack = u32::MAX;
        let (mut np, mut ns) = (0, 0);
        for (at, val) in c.end_at.iter().zip(ends) {
            if let Some(val) = *val {
                e.single[ns] = Word { at: *at, val };
                ns += 1;
            }
        }
        for k in 0..n {
            let ret = Word {
                at: c.sp[k].wrapping_sub(8),
                val: c.out[k],
            };
            e.rets[k] = ret.val;
            match c.bp_at[k] {
                0 => {
                    e.single[ns] = ret;
                    ns += 1;
                }
                at if at.wrapping_add(8) == ret.at => {
                    e.pair_at[np] = at;
                    e.pair_val[np] = Pair([c.bp[k], ret.val]);
                    np += 1;
                }
                at => {
                    e.single[ns] = ret;
                    e.single[ns + 1] = Word { at, val: c.bp[k] };
                    ns += 2;
                }
            }
        }
        e.pairs = np as u32;
        e.singles = ns as u32;
        self.tags[set][way] = tag;
        Some(i)
    }
}

impl MemoEntry {
    /// Whether every stack word this walk read still holds the value read then (reads bounded
    /// as the walk's were: within `[lo, hi)`, 8-aligned; an address found out of bounds still
    /// is, the bounds being the same).
    #[inline(always)]
    fn holds(&self, lo: u64, hi: u64) -> bool {
        // Every word was read by the walk that made the entry (or checked by the reuse that
        // stood in for it) within its bounds, which `find` has found equal to this walk's:
        // they are read again without a bounds check, and compared all at once.
        let (np, ns) = (
            (self.pairs as usize).min(MEMO_FRAMES),
            (self.singles as usize).min(MEMO_SINGLES),
        );
        let pairs_differ = {
            #[cfg(target_arch = "x86_64")]
            {
                use core::arch::x86_64::*;
                // SAFETY: SSE2 is part of the x86-64 baseline; the vector operations read
                // nothing but their operands.
                unsafe {
                    let pair = |i: usize| {
                        let at = self.pair_at[i];
                        debug_assert!(stack_word(at, lo, hi).is_some());
                        debug_assert!(stack_word(at + 8, lo, hi).is_some());
                        // SAFETY: both words at `at` lie in `[lo, hi)` (see above), this
                        // thread's mapped stack above its stack pointer; `pair_val` is aligned.
                        let now = _mm_loadu_si128(at as *const __m128i);
                        let then =
                            _mm_load_si128(&self.pair_val[i] as *const Pair as *const __m128i);
                        _mm_xor_si128(now, then)
                    };
                    // Four pairs a step into two accumulators: fewer loop instructions a
                    // frame, and no chain through one register (issue 20: this loop is most
                    // of a memo hit).
                    let (mut d0, mut d1) = (_mm_setzero_si128(), _mm_setzero_si128());
                    let mut i = 0;
                    while i + 4 <= np {
                        d0 = _mm_or_si128(d0, _mm_or_si128(pair(i), pair(i + 1)));
                        d1 = _mm_or_si128(d1, _mm_or_si128(pair(i + 2), pair(i + 3)));
                        i += 4;
                    }
                    while i < np {
                        d0 = _mm_or_si128(d0, pair(i));
                        i += 1;
                    }
                    let diff = _mm_or_si128(d0, d1);
                    _mm_movemask_epi8(_mm_cmpeq_epi8(diff, _mm_setzero_si128())) != 0xffff
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                let mut diff = 0;
                for (at, val) in self.pair_at[..np].iter().zip(&self.pair_val[..np]) {
                    // SAFETY: as above.
                    diff |= unsafe {
                        (*(*at as *const u64) ^ val.0[0]) | (*((*at + 8) as *const u64) ^ val.0[1])
                    };
                }
                diff != 0
            }
        };
        let mut diff = 0;
        for w in &self.single[..ns] {
            debug_assert!(stack_word(w.at, lo, hi).is_some());
            // SAFETY: `w.at` lies in `[lo, hi)` and is 8-aligned (see above), this thread's
            // mapped stack above its stack pointer.
            diff |= unsafe { *(w.at as *const u64) } ^ w.val;
        }
        !pairs_differ && diff == 0
    }
}

/// The stack word at `a` when it lies in `[lo, hi)` and is 8-aligned, else `None` (nothing
/// read): every stack read of a walk, and of the checks that stand in for one, goes through
/// here. `[lo, hi)` must be mapped: the walking thread's stack from its current stack pointer
/// up (see [`walk`]).
#[inline(always)]
fn stack_word(a: u64, lo: u64, hi: u64) -> Option<u64> {
    if a >= lo && a <= hi.wrapping_sub(8) && a.is_multiple_of(8) {
        // SAFETY: the address lies in the mapped range `[lo, hi)` (the callers' contract: this
        // thread's stack, above the stack pointer).
        Some(unsafe { *(a as *const u64) })
    } else {
        None
    }
}

/// Counts a walk that used the memo in its window; when fewer than [`MEMO_KEEP`] of the
/// window's walks were found there, the memo is left alone for the next [`PAUSE`] walks,
/// twice as many after each such window in a row (up to 16 × [`PAUSE`]): a window in which
/// the memo is tried and does not pay rewrites most of its 102 KiB of entries, which evicts the
/// program's own data (CPython: 1.6 M more L1 misses with a pause of [`PAUSE`] walks every
/// time, 0.13 M with the doubling).
#[inline(always)]
fn memo_account(caps: &mut Captures, hit: bool) {
    let (walks, hits) = caps.memo_window;
    let (walks, hits) = (walks + 1, hits + hit as u32);
    caps.memo_window = (walks, hits);
    if walks == WINDOW {
        if hits < MEMO_KEEP {
            caps.memo_pause = PAUSE << caps.memo_paused;
            caps.memo_paused = (caps.memo_paused + 1).min(MEMO_BACKOFF);
        } else {
            caps.memo_paused = 0;
        }
        caps.memo_window = (0, 0);
    }
}

/// See [`memo_account`].
const MEMO_BACKOFF: u32 = 4;

/// Memo hits a window of [`WINDOW`] walks needs for the memo to stay in use (three quarters):
/// a miss costs a lookup and keeping the new walk (up to 1.6 KiB written), which many varied
/// stacks do not repay (CPython 3.11, 57% hits: 9% more CPU with the memo than without).
const MEMO_KEEP: u32 = WINDOW * 3 / 4;

/// Counts a walk of `frames` frames, `reused` of them not walked, in the thread's window, and
/// pauses recording captures when the window reused too little (see [`WINDOW`]).
fn account(caps: &mut Captures, frames: usize, reused: usize) {
    let (walks, found, kept) = caps.window;
    let (found, kept) = (found + frames as u32, kept + reused as u32);
    caps.window = (walks + 1, found, kept);
    if walks + 1 == WINDOW {
        if kept * 8 < found {
            caps.pause = PAUSE;
            // The capture is stale once walks stop recording.
            caps.pair[caps.last & 1].n = 0;
        }
        caps.window = (0, 0, 0);
    }
}

/// Walks per window over which a thread's reuse is judged: when under an eighth of the frames
/// found in a window were reused (a program whose consecutive allocations share few outer
/// frames, such as bench/storm.c's 16 random call paths), the next [`PAUSE`] walks are plain
/// ones, without the cost of recording a capture and looking for a match (measured on the
/// storm: +25 ns a malloc/free pair recording, +15 ns more matching, for nothing).
const WINDOW: u32 = 256;
/// See [`WINDOW`].
const PAUSE: u32 = 16 * WINDOW;

impl Capture {
    #[inline(always)]
    fn end(&mut self, at: u64, val: Option<u64>) {
        let k = self.ends;
        if k < 2 {
            self.end_at[k] = at;
            self.end_val[k] = val;
            self.ends = k + 1;
        }
    }
}

/// The loader's (objects loaded, objects unloaded) counts so far. Takes the loader's list
/// lock briefly (`dl_iterate_phdr`, stopped at the first object); allocates nothing.
fn loader_counts() -> (u64, u64) {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes our pair and a valid info for this call.
        let (out, info) = unsafe { (&mut *(data as *mut (u64, u64)), &*info) };
        *out = (info.dlpi_adds, info.dlpi_subs);
        1
    }
    let mut counts = (0u64, 0u64);
    // SAFETY: the callback receives `&mut (u64, u64)` through `data`, valid for the call.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut counts as *mut (u64, u64) as *mut _) };
    counts
}

/// After a walk with `cache`: whether it met code in no known object while objects were
/// loaded since the list was built (call [`rebuild`], where allocating is allowed, and walk
/// again). Clears the cache's rules for those addresses so that the next walk looks again.
#[inline(always)]
pub fn take_stale(cache: &mut Cache) -> bool {
    // Read first: most walks find nothing new, and a store would dirty the line every time.
    cache.missed && take_stale_missed(cache)
}

/// [`take_stale`] after a walk that met unknown code (out of line: rare).
#[cold]
#[inline(never)]
fn take_stale_missed(cache: &mut Cache) -> bool {
    cache.missed = false;
    let used = cache.in_use.load(Ordering::Acquire);
    if used.is_null() {
        return false;
    }
    // SAFETY: the list published as in use by this cache during its last walk: not freed
    // meanwhile (see `rebuild`).
    let o = unsafe { &*used };
    let stale = loader_counts() != (o.adds, o.subs);
    if stale {
        cache.slots.iter_mut().for_each(|s| s.key = 0);
        cache.fp_keys.fill(0);
    }
    stale
}

/// The generation of the newest object list (a rebuild numbers its list before publishing
/// it: a list of this generation may not be the one in use yet, never the other way round).
pub fn newest_generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// Whether the object list has been built.
#[inline]
pub fn ready() -> bool {
    !OBJECTS.load(Ordering::Acquire).is_null()
}

/// A new rule cache, or null when out of memory (allocates: call inside the reentrancy
/// guard). Built in place on the heap: the cache is too large for a caller's stack frame.
#[cold]
#[inline(never)]
pub fn new_cache() -> *mut Cache {
    // An anonymous mapping, zero-filled: all-zero bytes are a valid `generation`, a null
    // `in_use`, valid empty slots (key 0, a rule of plain integers) and `id_only` off.
    let c = crate::sys::map_anon(std::mem::size_of::<Cache>()) as *mut Cache;
    if !c.is_null() {
        // SAFETY: `c` is a fresh mapping for a Cache; the context is written without reading
        // (or dropping) the zeroed bytes there.
        unsafe { std::ptr::addr_of_mut!((*c).ctx).write(UnwindContext::new_in()) };
        // Zero-filled too: no capture to reuse yet. None when reuse is off.
        let caps = if REUSE.load(Ordering::Relaxed) {
            crate::sys::map_anon(std::mem::size_of::<Captures>()) as *mut Captures
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: as above; a plain pointer field.
        unsafe { std::ptr::addr_of_mut!((*c).captures).write(caps) };
        let cold = map_cold_stack();
        // SAFETY: as above; a plain pointer field.
        unsafe { std::ptr::addr_of_mut!((*c).cold).write(cold) };
        with_registry(|r| r.caches.push(c as usize));
    }
    c
}

/// The mappings of cache `c` and of its captures (start, bytes; (0, 0) without captures):
/// the unwinder's context (register values of walks) and the thread's memo of walks, which
/// keep copies of stack words (saved `rbp` values: heap pointers in code built without frame
/// pointers), so not roots of the reference graph (see `state::note_private`).
///
/// # Safety
/// `c` came from [`new_cache`] and is not freed.
pub unsafe fn private_ranges(c: *mut Cache) -> [(u64, u64); 2] {
    // SAFETY: per the contract; a plain pointer field.
    let caps = unsafe { (*c).captures };
    [
        (c as u64, std::mem::size_of::<Cache>() as u64),
        if caps.is_null() {
            (0, 0)
        } else {
            (caps as u64, std::mem::size_of::<Captures>() as u64)
        },
    ]
}

/// Frees a cache from [`new_cache`].
///
/// # Safety
/// `c` came from [`new_cache`] and is not used again.
pub unsafe fn free_cache(c: *mut Cache) {
    with_registry(|r| r.caches.retain(|x| *x != c as usize));
    // SAFETY: per the contract, `c` is a mapping of a Cache's size from `new_cache`, fully
    // initialized there, and nothing uses it after this. The context is dropped in place
    // (its storage is fixed-size, but drop it properly all the same).
    unsafe {
        std::ptr::drop_in_place(std::ptr::addr_of_mut!((*c).ctx));
        let caps = (*c).captures;
        if !caps.is_null() {
            crate::sys::unmap(caps as *mut u8, std::mem::size_of::<Captures>());
        }
        let cold = (*c).cold;
        if !cold.is_null() {
            crate::sys::unmap(cold, COLD_GUARD + COLD_BYTES);
        }
        crate::sys::unmap(c as *mut u8, std::mem::size_of::<Cache>());
    }
}

/// Rebuilds the object list from the objects loaded now (allocates; call where the loader
/// lock is not held and inside the reentrancy guard).
pub fn rebuild() {
    let (adds, subs) = loader_counts();
    let mut list: Vec<Object> = Vec::new();
    // SAFETY: the callback receives `&mut Vec<Object>` through `data`, valid for the call.
    unsafe { libc::dl_iterate_phdr(Some(add_object), &mut list as *mut Vec<Object> as *mut _) };
    list.sort_by_key(|o| o.lo);
    let generation = GENERATION.fetch_add(1, Ordering::Relaxed) + 1;
    let objects = Box::new(Objects {
        list,
        generation,
        adds,
        subs,
    });
    let old = OBJECTS.swap(Box::into_raw(objects), Ordering::SeqCst);
    with_registry(|r| {
        if !old.is_null() {
            r.retired.push(old as usize);
        }
        // Free the replaced lists no cache uses any more. A walker publishes its list before
        // it checks that it is still current (both SeqCst), so a list it may use is seen here.
        let in_use: Vec<usize> = r
            .caches
            .iter()
            .map(|c| {
                // SAFETY: registered caches are live (unregistered before they are unmapped).
                unsafe { &*(*c as *const Cache) }
                    .in_use
                    .load(Ordering::SeqCst) as usize
            })
            .collect();
        r.retired.retain(|o| {
            if in_use.contains(o) {
                return true;
            }
            // SAFETY: a replaced list (never current again) that no walker can reach: every
            // walker that could still use it would have published it.
            drop(unsafe { Box::from_raw(*o as *mut Objects) });
            false
        });
    });
}

unsafe extern "C" fn add_object(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: dl_iterate_phdr passes our list and a valid info for this call.
    let (list, info) = unsafe { (&mut *(data as *mut Vec<Object>), &*info) };
    if info.dlpi_phdr.is_null() {
        return 0;
    }
    // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    if let Some(o) = object(info.dlpi_addr, phdrs) {
        list.push(o);
    }
    0
}

/// The unwind tables of the object loaded at `base` with program headers `phdrs`.
fn object(base: u64, phdrs: &[libc::Elf64_Phdr]) -> Option<Object> {
    let text = phdrs
        .iter()
        .find(|p| p.p_type == libc::PT_LOAD && p.p_flags & libc::PF_X != 0)?;
    let hdr = phdrs.iter().find(|p| p.p_type == libc::PT_GNU_EH_FRAME)?;
    let mem = |avma: u64, len: u64| -> &'static [u8] {
        // SAFETY: the range lies in a PT_LOAD segment of a loaded object (checked by the
        // callers below), mapped readable while the object stays loaded.
        unsafe { std::slice::from_raw_parts(avma as *const u8, len as usize) }
    };
    let in_load = |avma: u64, len: u64| {
        phdrs.iter().any(|p| {
            p.p_type == libc::PT_LOAD
                && avma >= base + p.p_vaddr
                && avma + len <= base + p.p_vaddr + p.p_filesz
        })
    };
    let hdr_avma = base + hdr.p_vaddr;
    if !in_load(hdr_avma, hdr.p_memsz) {
        return None;
    }
    let bases = BaseAddresses::default()
        .set_eh_frame_hdr(hdr_avma)
        .set_text(base + text.p_vaddr);
    let parsed = EhFrameHdr::new(mem(hdr_avma, hdr.p_memsz), NativeEndian)
        .parse(&bases, 8)
        .ok()?;
    let gimli::Pointer::Direct(eh_avma) = parsed.eh_frame_ptr() else {
        return None;
    };
    // `.eh_frame` runs to the end of its segment's file-backed part at most.
    let seg = phdrs.iter().find(|p| {
        p.p_type == libc::PT_LOAD
            && eh_avma >= base + p.p_vaddr
            && eh_avma < base + p.p_vaddr + p.p_filesz
    })?;
    let eh_len = base + seg.p_vaddr + seg.p_filesz - eh_avma;
    let bases = bases.set_eh_frame(eh_avma);
    let mut eh_frame = EhFrame::new(mem(eh_avma, eh_len), NativeEndian);
    eh_frame.set_address_size(8);
    Some(Object {
        lo: base + text.p_vaddr,
        hi: base + text.p_vaddr + text.p_memsz,
        bases,
        eh_frame,
        hdr: parsed,
    })
}

/// Bytes of a thread's cold stack, on which rules are computed (see [`compute_cold`]).
///
/// Computing a rule with gimli takes ~6 KiB of stack (`UnwindTable::next_row` 2,168 bytes,
/// `unwind_info_for_address` 1,416, …), on top of the program's frames: a thread created with
/// `PTHREAD_STACK_MIN` (16 KiB, less the static TLS of every object) or a signal handler on a
/// `SIGSTKSZ` (8 KiB) alternate stack that reached new code ran off its stack — a SIGSEGV, or,
/// with an alternate stack that is a heap block, glibc's heap overwritten below it (helper P,
/// 1). The computation reads no word of the program (only the code address and the objects'
/// unwind sections), so nothing of the program's is left on this stack. A program's signal
/// handler that interrupts it runs here too (unless the program gave it an alternate stack),
/// with the rest of this room.
pub const COLD_BYTES: usize = 128 * 1024;

/// The guard page below a cold stack (no access: an overflow faults instead of writing into
/// whatever lies below).
const COLD_GUARD: usize = 4096;

/// Maps a cold stack with its guard page (lazily committed: a rule computation touches a few
/// pages); null on failure.
fn map_cold_stack() -> *mut u8 {
    let p = crate::sys::map_anon(COLD_GUARD + COLD_BYTES);
    if p.is_null() {
        return p;
    }
    // SAFETY: the first page of the mapping just made.
    if unsafe { libc::mprotect(p as *mut libc::c_void, COLD_GUARD, libc::PROT_NONE) } != 0 {
        // SAFETY: the mapping just made, unused.
        unsafe { crate::sys::unmap(p, COLD_GUARD + COLD_BYTES) };
        return std::ptr::null_mut();
    }
    p
}

/// What [`compute`] takes and gives, passed through [`on_stack`].
struct ComputeCall<'a> {
    objects: &'a Objects,
    ctx: &'a mut UnwindContext<usize, Fixed>,
    key: u64,
    missed: &'a mut bool,
    rule: Option<Rule>,
}

/// [`compute`] on the thread's cold stack `cold` (from [`map_cold_stack`]; null: on this one).
#[inline(never)]
fn compute_cold(
    cold: *mut u8,
    objects: &Objects,
    ctx: &mut UnwindContext<usize, Fixed>,
    key: u64,
    missed: &mut bool,
) -> Rule {
    let here = 0u8;
    let sp = std::hint::black_box(&here) as *const u8 as usize;
    let top = cold as usize + COLD_GUARD + COLD_BYTES;
    // Already on it (never, as nothing computes rules reentrantly; but then stay).
    if cold.is_null() || (sp > cold as usize && sp <= top) {
        return compute(objects, ctx, key, missed);
    }
    let mut call = ComputeCall {
        objects,
        ctx,
        key,
        missed,
        rule: None,
    };
    extern "C" fn run(p: *mut u8) {
        // SAFETY: `p` is the `ComputeCall` on `compute_cold`'s frame, which waits for this
        // call to return; nothing else refers to it meanwhile.
        let call = unsafe { &mut *(p as *mut ComputeCall<'_>) };
        call.rule = Some(compute(call.objects, call.ctx, call.key, call.missed));
    }
    // SAFETY: `top` is the 16-byte aligned end of this thread's cold stack, mapped until the
    // thread's exit handler, and not in use (see above); `run` returns normally (a panic
    // aborts: `extern "C"`).
    unsafe {
        on_stack(
            &mut call as *mut ComputeCall<'_> as *mut u8,
            run,
            top as *mut u8,
        )
    };
    call.rule.unwrap_or(RULE_FRAME_POINTER)
}

/// Calls `f(arg)` with the stack pointer at `top`, and returns when it returns, on the stack
/// it came from. The frame is an `rbp` frame, and the CFI says so: a debugger or a crash
/// handler's unwinder goes from `f`'s frames back to the caller's stack.
///
/// Written here rather than taken from a crate (psm) because it is six instructions on the
/// recording path's cold side, next to the shim's other naked entry points.
///
/// # Safety
/// `top` is the 16-byte aligned end of a mapped stack nothing else uses, large enough for
/// `f`; `f` returns normally.
#[unsafe(naked)]
unsafe extern "C" fn on_stack(arg: *mut u8, f: extern "C" fn(*mut u8), top: *mut u8) {
    // rustc gives a naked function no CFI of its own: the directives are written here.
    core::arch::naked_asm!(
        ".cfi_startproc",
        "push rbp",
        ".cfi_adjust_cfa_offset 8",
        ".cfi_offset rbp, -16",
        "mov rbp, rsp",
        ".cfi_def_cfa_register rbp",
        "mov rsp, rdx",
        "call rsi",
        "mov rsp, rbp",
        "pop rbp",
        ".cfi_def_cfa rsp, 8",
        "ret",
        ".cfi_endproc",
    )
}

/// The rule for code address `key`, from its object's CFI.
#[cold]
fn compute(
    objects: &Objects,
    ctx: &mut UnwindContext<usize, Fixed>,
    key: u64,
    missed: &mut bool,
) -> Rule {
    let Some(o) = objects.find(key) else {
        if let Some(rule) = trampoline_rule(key) {
            return rule;
        }
        // In no known object: the list may be stale (see `take_stale`), or the code is
        // generated or in a mapping the loader does not report.
        *missed = true;
        crate::modules::note_unknown_code();
        return RULE_FRAME_POINTER;
    };
    let Some(table) = o.hdr.table() else {
        return RULE_FRAME_POINTER;
    };
    match table.unwind_info_for_address(&o.eh_frame, &o.bases, ctx, key, EhFrame::cie_from_offset) {
        Ok(row) => rule_of(row),
        Err(_) => RULE_FRAME_POINTER,
    }
}

/// CPython's perf trampoline as built from the old x86-64 template (`Python/asm_trampoline.S`
/// up to 3.13.0): `sub $8,%rsp; call *%rcx; add $8,%rsp; ret`. No frame pointer and no CFI.
const TRAMPOLINE_OLD: [u8; 11] = [
    0x48, 0x83, 0xec, 0x08, 0xff, 0xd1, 0x48, 0x83, 0xc4, 0x08, 0xc3,
];
/// Offset of the return address (after `call *%rcx`) in [`TRAMPOLINE_OLD`].
const TRAMPOLINE_OLD_RET: usize = 6;
/// The current template (`asm_trampoline_x86_64.S`): `push %rbp; mov %rsp,%rbp; call *%rcx;
/// pop %rbp; ret`, which keeps a frame pointer.
const TRAMPOLINE_NEW: [u8; 8] = [0x55, 0x48, 0x89, 0xe5, 0xff, 0xd1, 0x5d, 0xc3];
/// Offset of the return address in [`TRAMPOLINE_NEW`].
const TRAMPOLINE_NEW_RET: usize = 6;

/// The rule of the old-template trampoline's frame: on entry `rsp` points at the return
/// address; after `sub $8` it is 8 lower, so in the frame CFA = rsp + 16, the return address
/// at CFA − 8, `rbp` untouched.
const RULE_TRAMPOLINE_OLD: Rule = Rule {
    cfa_offset: 16,
    bp_offset: 0,
    kind: CFA_SP,
    bp: BP_SAME,
};

/// The rule of a frame whose code address `key` (a return address − 1) lies in no loaded
/// object, when that code is a copy of CPython's perf trampoline (`-X perf`, `-X perf_jit`,
/// `PYTHONPERFSUPPORT=1`: one copy per Python function, in anonymous executable mappings):
/// [`RULE_TRAMPOLINE_OLD`] or, for the current template, [`RULE_FRAME_POINTER`]. `None` for
/// any other code.
///
/// The code bytes around the return address are read through the kernel
/// ([`crate::unwind::read_checked`]: an address from a walk through garbage, or a mapping
/// without read permission, makes the read fail instead of faulting). One system call; the
/// caller caches the rule per code address.
#[cold]
fn trampoline_rule(key: u64) -> Option<Rule> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    // Both templates put the return address 6 bytes after their start.
    const _: () = assert!(TRAMPOLINE_OLD_RET == TRAMPOLINE_NEW_RET);
    let start = (key.checked_add(1)? as usize).checked_sub(TRAMPOLINE_OLD_RET)?;
    let mut code = [0u8; TRAMPOLINE_OLD.len()];
    if crate::unwind::read_checked(start, &mut code) {
        if code == TRAMPOLINE_OLD {
            return Some(RULE_TRAMPOLINE_OLD);
        }
        return (code[..TRAMPOLINE_NEW.len()] == TRAMPOLINE_NEW).then_some(RULE_FRAME_POINTER);
    }
    // The longer read may run into an unreadable page after a new-template copy.
    let mut code = [0u8; TRAMPOLINE_NEW.len()];
    (crate::unwind::read_checked(start, &mut code) && code == TRAMPOLINE_NEW)
        .then_some(RULE_FRAME_POINTER)
}

/// Reduces a CFI row to a [`Rule`] ([`RULE_STOP`] when it is not of a supported form).
fn rule_of(row: &UnwindTableRow<usize, Fixed>) -> Rule {
    match row.register(X86_64::RA) {
        None | Some(RegisterRule::Offset(-8)) => {}
        _ => return RULE_STOP,
    }
    let (kind, cfa_offset) = match *row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let kind = match register {
                X86_64::RSP => CFA_SP,
                X86_64::RBP => CFA_BP,
                _ => return RULE_STOP,
            };
            match i32::try_from(offset) {
                Ok(o) => (kind, o),
                Err(_) => return RULE_STOP,
            }
        }
        CfaRule::Expression(_) => return RULE_STOP,
    };
    let (bp, bp_offset) = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue) => (BP_SAME, 0),
        Some(RegisterRule::Offset(o)) => match i16::try_from(o) {
            Ok(o) if o % 8 == 0 => (BP_AT, o),
            _ => (BP_LOST, 0),
        },
        Some(_) => (BP_LOST, 0),
    };
    Rule {
        cfa_offset,
        bp_offset,
        kind,
        bp,
    }
}

/// Walks the stack by CFI from the frame whose frame pointer is `fp` (the exported allocation
/// function's, compiled with frame pointers); writes return addresses (leaf first) into `out`.
/// Reads stack memory only within `[current sp, stack_hi)`. Returns the number of frames.
///
/// A walk found in the thread's memo is answered here, in a small frame; any other goes on
/// to the full unwinder out of line (bench/phases.c, 4 threads × 100,000 blocks, every walk a
/// memo hit: the hit's fixed cost was most of its ~230 instructions).
#[inline(never)]
pub fn walk(fp: usize, stack_hi: usize, cache: &mut Cache, out: &mut [u64; MAX_FRAMES]) -> usize {
    cache.forget_memo();
    let marker = 0u8;
    let lo = &marker as *const u8 as u64;
    if stack_hi == 0 || (fp as u64) < lo {
        return 0;
    }
    let (lo, fp, hi) = (lo, fp as u64, stack_hi as u64);
    // The exported function keeps a frame pointer: its frame is unwound by the frame-pointer
    // rule without looking it up. `sp` is only a lower bound for the first CFA here.
    let looked = match memo_lookup(&[0, lo, fp], lo, hi, cache, out) {
        Lookup::Hit(n) => return n,
        Lookup::Missed => true,
        Lookup::NotLooked => false,
    };
    unwind(None, lo, fp, lo, hi, cache, out, looked)
}

/// The stack id of the walk from the exported function's frame pointer `fp` that [`walk`]
/// would find in the thread's memo together with its id (see [`Cache::memo_stack`]), with
/// none of a walk's set-up: `lo` is the caller's stack pointer, which [`walk_at`] is then
/// given too (the memo is keyed by it). `None`: not there (nothing was changed but the
/// memo's notion of the last entry, as a walk's start changes it); the caller then walks.
///
/// The hit path of every allocation of bench/storm.c: the same checks as [`walk`]'s memo
/// look-up ([`Memo::find`], every stack word the walk read compared again) without the out of
/// line call, the look-up's outcome passed around, or the entry read twice (issue 20).
#[inline(always)]
pub fn memo_id(fp: usize, lo: u64, stack_hi: usize, cache: &mut Cache) -> Option<u32> {
    let caps = cache.captures;
    cache.made = false;
    if caps.is_null() {
        return None;
    }
    // SAFETY: the thread's own captures, used by this look-up only (the caller holds the
    // thread's cache exclusively, see `walk`).
    let c = unsafe { &mut *caps };
    c.memo.last = usize::MAX;
    let ptr = OBJECTS.load(Ordering::Acquire);
    if c.memo_pause > 0
        || ptr.is_null()
        || ptr != cache.in_use.load(Ordering::Relaxed)
        || !REUSE.load(Ordering::Relaxed)
        || stack_hi == 0
        || (fp as u64) < lo
    {
        return None;
    }
    // SAFETY: as in `memo_lookup`.
    let generation = unsafe { (*ptr).generation };
    let hi = stack_hi as u64;
    let i = c.memo.find(&[0, lo, fp as u64], lo, hi, generation)?;
    let stack = c.memo.entries[i].stack;
    if stack == u32::MAX {
        return None;
    }
    c.memo.last = i;
    #[cfg(test)]
    {
        c.hits += 1;
    }
    memo_account(c, true);
    Some(stack)
}

/// [`walk`] with the lower bound of stack reads, and the memo's key, given by the caller:
/// its own stack pointer, as given to [`memo_id`] just before (`lo` ≤ `fp`).
#[inline(never)]
pub fn walk_at(
    fp: usize,
    lo: u64,
    stack_hi: usize,
    cache: &mut Cache,
    out: &mut [u64; MAX_FRAMES],
) -> usize {
    cache.forget_memo();
    if stack_hi == 0 || (fp as u64) < lo {
        return 0;
    }
    let (fp, hi) = (fp as u64, stack_hi as u64);
    let looked = match memo_lookup(&[0, lo, fp], lo, hi, cache, out) {
        Lookup::Hit(n) => return n,
        Lookup::Missed => true,
        Lookup::NotLooked => false,
    };
    unwind(None, lo, fp, lo, hi, cache, out, looked)
}

/// What [`memo_lookup`] found.
enum Lookup {
    /// The walk, found in the memo: this many frames (written to `out` unless only the id is
    /// wanted, see [`Cache::set_id_only`]).
    Hit(usize),
    /// Not in the memo (the walk that follows keeps it there and counts the miss).
    Missed,
    /// The memo was not looked at: paused, off, or the object list not yet published as in
    /// use by this cache (the full walk publishes it and looks).
    NotLooked,
}

/// Looks for a walk from `start` (within `[lo, hi)`) in the thread's memo, as [`unwind`]
/// does, with nothing else of a walk's set-up: no rule looked up, the object list only read
/// (it must be the one this cache already uses).
#[inline(always)]
fn memo_lookup(
    start: &[u64; 3],
    lo: u64,
    hi: u64,
    cache: &mut Cache,
    out: &mut [u64; MAX_FRAMES],
) -> Lookup {
    let caps = cache.captures;
    if caps.is_null() || !REUSE.load(Ordering::Relaxed) {
        return Lookup::NotLooked;
    }
    // SAFETY: the thread's own captures, used by this walk only.
    let c = unsafe { &mut *caps };
    let ptr = OBJECTS.load(Ordering::Acquire);
    if c.memo_pause > 0 || ptr.is_null() || ptr != cache.in_use.load(Ordering::Relaxed) {
        return Lookup::NotLooked;
    }
    // SAFETY: published as in use by this cache (by an earlier walk), so not freed (see
    // `rebuild`); whether it is still the current list was checked just above, as `unwind`
    // checks it when nothing needs publishing.
    let generation = unsafe { (*ptr).generation };
    match c.memo.find(start, lo, hi, generation) {
        Some(i) => Lookup::Hit(take_hit(c, i, cache.id_only, out)),
        None => Lookup::Missed,
    }
}

/// Takes memo entry `i`, just found for this walk: its frames into `out` (unless only the id
/// is wanted and the entry has one, see [`Cache::set_id_only`]), counted as a hit. Returns
/// the number of frames.
#[inline(always)]
fn take_hit(c: &mut Captures, i: usize, id_only: bool, out: &mut [u64; MAX_FRAMES]) -> usize {
    let e = &c.memo.entries[i];
    let n = e.n as usize;
    if !(id_only && e.stack != u32::MAX) {
        out[..n].copy_from_slice(&e.rets[..n]);
    }
    c.memo.last = i;
    #[cfg(test)]
    {
        c.hits += 1;
    }
    memo_account(c, true);
    n
}

/// Walks the stack by CFI from the registers of the calling function (`pc`, `sp`, `bp`, read
/// where it runs), needing no frame pointer anywhere; the calling function's own frame is left
/// out, so the first frame is the return address into its caller.
#[inline(never)]
pub fn walk_from(
    pc: u64,
    sp: u64,
    bp: u64,
    stack_hi: usize,
    cache: &mut Cache,
    out: &mut [u64; MAX_FRAMES],
) -> usize {
    cache.forget_memo();
    let marker = 0u8;
    let lo = &marker as *const u8 as u64;
    if stack_hi == 0 || sp < lo || sp >= stack_hi as u64 {
        return 0;
    }
    unwind(Some(pc), sp, bp, lo, stack_hi as u64, cache, out, false)
}

/// Unwinds from the frame executing at code address `key` (`None`: a frame known to keep a
/// frame pointer) with registers `sp`, `bp`, writing return addresses to `out`; stack reads
/// stay within `[lo, hi)`. Returns the number of frames.
///
/// Runs of frames that keep frame pointers — most frames of most C, C++ and Rust code built
/// with them — are walked in two passes: first along the `rbp` chain, a dependent load per
/// frame, as a frame-pointer walk would; then the rule of each frame found is looked up, the
/// lookups independent of each other, to confirm that its caller keeps a frame pointer too.
/// At the first frame whose code does not, the walk goes back to evaluating rules one frame at
/// a time from the registers that frame had. The result is exactly what evaluating every rule
/// in turn gives, at nearly the cost of a frame-pointer walk.
///
/// `looked`: the memo was already looked in for this walk and did not have it
/// ([`memo_lookup`]).
///
/// Out of line: its frame (the walk's arrays, every register saved) is paid only by walks the
/// memo does not answer in [`walk`].
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn unwind(
    key: Option<u64>,
    mut sp: u64,
    mut bp: u64,
    lo: u64,
    hi: u64,
    cache: &mut Cache,
    out: &mut [u64; MAX_FRAMES],
    looked: bool,
) -> usize {
    let mut ptr = OBJECTS.load(Ordering::Acquire);
    if ptr.is_null() {
        return 0;
    }
    if ptr != cache.in_use.load(Ordering::Relaxed) {
        // Publish the list we are about to use, then make sure it is still the current one:
        // a rebuild that replaced it after this check sees our hazard and keeps it.
        loop {
            cache.in_use.store(ptr, Ordering::SeqCst);
            let now = OBJECTS.load(Ordering::SeqCst);
            if now == ptr {
                break;
            }
            ptr = now;
        }
    }
    // SAFETY: the list is current or published as in use by this cache, so not freed (see
    // `rebuild`).
    let objects = unsafe { &*ptr };
    if cache.generation != objects.generation {
        cache.slots.iter_mut().for_each(|s| s.key = 0);
        cache.fp_keys.fill(0);
        cache.generation = objects.generation;
    }
    // The registers this walk starts from: the memo's key.
    let start = [key.unwrap_or(0), sp, bp];
    // The previous capture (to reuse from) and the one this walk records. Looking for the
    // previous capture (`matching`) and using the memo (`memo_on`) are paused apart, each
    // where it does not pay; either needs this walk recorded.
    let mut caps = cache.captures;
    let (mut matching, mut memo_on) = (false, false);
    if !caps.is_null() {
        // SAFETY: the thread's own captures, used by this walk only.
        let c = unsafe { &mut *caps };
        if REUSE.load(Ordering::Relaxed) {
            if looked {
                memo_on = true;
            } else if c.memo_pause > 0 {
                c.memo_pause -= 1;
            } else {
                memo_on = true;
                if let Some(i) = c.memo.find(&start, lo, hi, objects.generation) {
                    return take_hit(c, i, cache.id_only, out);
                }
            }
            if c.pause > 0 {
                c.pause -= 1;
            } else {
                matching = true;
            }
        }
        if !matching && !memo_on {
            caps = std::ptr::null_mut();
        }
    }
    let (last, cur): (*const Capture, *mut Capture) = if caps.is_null() {
        (std::ptr::null(), std::ptr::null_mut())
    } else {
        // SAFETY: the thread's own captures (see `Captures`); nothing else refers to them
        // during this walk. Raw pointers to the two distinct elements.
        unsafe {
            let l = (*caps).last & 1;
            (
                std::ptr::addr_of!((*caps).pair[l]),
                std::ptr::addr_of_mut!((*caps).pair[1 - l]),
            )
        }
    };
    let mut m8 = Matcher {
        on: matching && !last.is_null() && {
            // SAFETY: `last` is not null here, and a capture no one writes during this walk.
            let l = unsafe { &*last };
            l.n > 0 && l.n < MAX_FRAMES && l.hi == hi && l.generation == objects.generation
        },
        cursor: 0,
        last,
        cur,
        lo,
        hi,
        reused: 0,
        changed: 0,
        same_depth: usize::MAX,
    };
    if !cur.is_null() {
        // SAFETY: the capture being recorded, written by this walk only.
        unsafe {
            (*cur).ends = 0;
            (*cur).uses_bp = 0;
        }
    }
    let read = |a: u64| stack_word(a, lo, hi);
    // Records a word read by the step that ends the walk.
    let end = |at: u64, val: Option<u64>| {
        if !cur.is_null() {
            // SAFETY: as above.
            unsafe { (*cur).end(at, val) };
        }
    };
    let mut n = 0;
    let mut key = key;
    'walk: while n < MAX_FRAMES {
        let rule = match key {
            Some(k) => cache.rule(objects, k),
            None => RULE_FRAME_POINTER,
        };
        if rule == RULE_FRAME_POINTER {
            // Pass 1: the rbp chain. fs[j] is the frame pointer of frame n + j.
            // Not zeroed: entries 0..=m are written before they are read.
            let mut fs = [std::mem::MaybeUninit::<u64>::uninit(); MAX_FRAMES + 1];
            let mut m = 0;
            let mut f = bp;
            let mut floor = sp;
            // Whether the chain ended on the words at `f` (not on its own order or the limit).
            let mut ended_on_read = false;
            while n + m < MAX_FRAMES {
                let cfa = f.wrapping_add(16);
                if cfa <= floor {
                    break;
                }
                let (Some(ret), Some(next)) = (read(f.wrapping_add(8)), read(f)) else {
                    ended_on_read = true;
                    break;
                };
                if ret < 4096 {
                    ended_on_read = true;
                    break;
                }
                fs[m].write(f);
                out[n + m] = ret;
                m += 1;
                floor = cfa;
                f = next;
            }
            fs[m].write(f);
            if m == 0 {
                if ended_on_read {
                    end(f.wrapping_add(8), read(f.wrapping_add(8)));
                    end(f, read(f));
                }
                break;
            }
            // Pass 2: frame n + j is right if the code returned to by frame n + j - 1 keeps a
            // frame pointer; j = m asks whether the chain's end is the stack's end.
            let mut good = m + 1;
            for j in 1..=m {
                if !cache.keeps_frame_pointer(objects, out[n + j - 1] - 1) {
                    good = j;
                    break;
                }
            }
            // Frames n .. n + min(good, m) - 1 are right: the frame each returns into has sp
            // just above its frame record and rbp as that record saved it.
            // Only the run's last frame is matched against the last capture: frames that keep
            // frame pointers walk about as fast as they would be checked, and a match looked
            // for at every frame costs branch mispredictions of its own.
            let run = good.min(m);
            m8.mark_bp(n, run);
            for j in 0..run - 1 {
                // SAFETY: j + 1 <= m, and pass 1 wrote fs[0..=m].
                let (fp, fbp) = unsafe { (fs[j].assume_init(), fs[j + 1].assume_init()) };
                m8.record(n + j, fp + 16, fbp, fp);
            }
            // SAFETY: as above, j = run - 1.
            let (fp, fbp) = unsafe { (fs[run - 1].assume_init(), fs[run].assume_init()) };
            if let Some(total) = m8.found(n + run - 1, fp + 16, fbp, fp, out) {
                n = total;
                break 'walk;
            }
            if good > m {
                n += m;
                if ended_on_read {
                    end(f.wrapping_add(8), read(f.wrapping_add(8)));
                    end(f, read(f));
                }
                break;
            }
            // The code of the next frame is unwound by its own rule, with the registers it
            // had: sp above the last frame, rbp as restored.
            let j = good;
            key = Some(out[n + j - 1] - 1);
            // SAFETY: 1 <= j <= m, and pass 1 wrote fs[0..=m].
            (sp, bp) = unsafe { (fs[j - 1].assume_init() + 16, fs[j].assume_init()) };
            n += j;
            continue;
        }
        let base = match rule.kind {
            CFA_SP => sp,
            CFA_BP => {
                m8.mark_bp(n, 1);
                bp
            }
            _ => break,
        };
        let cfa = base.wrapping_add(rule.cfa_offset as i64 as u64);
        // Each frame lies above the one it called: no progress means bad CFI or a bad rbp.
        if cfa <= sp {
            break;
        }
        let ret_at = cfa.wrapping_sub(8);
        let Some(ret) = read(ret_at) else {
            end(ret_at, None);
            break;
        };
        let mut bp_at = 0;
        match rule.bp {
            BP_SAME => {}
            BP_AT => {
                bp_at = cfa.wrapping_add(rule.bp_offset as i64 as u64);
                match read(bp_at) {
                    Some(v) => bp = v,
                    None => {
                        end(ret_at, Some(ret));
                        end(bp_at, None);
                        break;
                    }
                }
            }
            _ => bp = 0,
        }
        sp = cfa;
        if ret < 4096 {
            end(ret_at, Some(ret));
            if bp_at != 0 {
                end(bp_at, Some(bp));
            }
            break;
        }
        out[n] = ret;
        if let Some(total) = m8.found(n, sp, bp, bp_at, out) {
            n = total;
            break;
        }
        n += 1;
        key = Some(ret - 1);
    }
    if !cur.is_null() {
        // SAFETY: as above; `last` and `cur` are distinct captures of `caps`.
        unsafe {
            let c = &mut *cur;
            if m8.same_depth != usize::MAX {
                // Reused at the same depth: the last capture stays, its frames up to the one
                // matched replaced by this walk's (usually a few, against the copied rest).
                let l = &mut *(last as *mut Capture);
                let k = m8.same_depth + 1;
                l.out[..k].copy_from_slice(&out[..k]);
                l.sp[..k].copy_from_slice(&c.sp[..k]);
                l.bp[..k].copy_from_slice(&c.bp[..k]);
                l.bp_at[..k].copy_from_slice(&c.bp_at[..k]);
                let mask = (1u128 << k) - 1;
                l.uses_bp = (l.uses_bp & !mask) | (c.uses_bp & mask);
                if cache.missed {
                    l.n = 0;
                }
            } else {
                // A walk that met code in no known object may be walked again on a newer
                // object list (see `take_stale`): such a capture is not reused.
                c.n = if cache.missed { 0 } else { n };
                c.hi = hi;
                c.generation = objects.generation;
                c.out[..n].copy_from_slice(&out[..n]);
                (*caps).last ^= 1;
            }
            let caps = &mut *caps;
            cache.made = caps.pair[caps.last & 1].n == n && n > 0;
            if memo_on {
                // The capture just made (or updated in place) is complete: keep it in the memo.
                let made = &caps.pair[caps.last & 1];
                if made.n > 0 && made.n <= MEMO_FRAMES {
                    caps.memo.last = caps
                        .memo
                        .insert(&start, lo, hi, objects.generation, made)
                        .unwrap_or(usize::MAX);
                }
                memo_account(caps, false);
            }
            if matching {
                account(caps, n, m8.reused as usize);
            }
        }
    }
    n
}

/// Fewest frames worth reusing: a shorter rest is walked (checking and copying it costs about
/// as much).
const MIN_REUSED: usize = 6;

/// A walk's view of the thread's captures (see [`Capture`]).
struct Matcher {
    /// Whether the walk may still meet the last capture.
    on: bool,
    /// Frames of the last capture below the walk's current stack pointer.
    cursor: usize,
    last: *const Capture,
    cur: *mut Capture,
    lo: u64,
    hi: u64,
    /// Frames this walk copied.
    reused: u64,
    /// The lowest frame of the last capture found changed: frames below it are not reused.
    changed: usize,
    /// The frame matched when it was at the same index in both walks (the last capture is then
    /// kept and updated in place); `usize::MAX` otherwise.
    same_depth: usize,
}

impl Matcher {
    /// Marks frames `i .. i + k` as unwound from their `rbp` (see [`Capture::uses_bp`]).
    #[inline(always)]
    fn mark_bp(&mut self, i: usize, k: usize) {
        if self.cur.is_null() {
            return;
        }
        // SAFETY: the capture being recorded, written by this walk only.
        let cur = unsafe { &mut *self.cur };
        cur.uses_bp |= ((1u128 << k) - 1) << i;
    }

    /// Records frame `i`'s registers (see [`Self::found`]) without looking for a match.
    #[inline(always)]
    fn record(&mut self, i: usize, sp: u64, bp: u64, bp_at: u64) {
        if self.cur.is_null() {
            return;
        }
        // SAFETY: the capture being recorded, written by this walk only.
        let cur = unsafe { &mut *self.cur };
        cur.sp[i] = sp;
        cur.bp[i] = bp;
        cur.bp_at[i] = bp_at;
    }

    /// Frame `i` (return address `out[i]`) was found; the frame it returns into has registers
    /// `sp`, `bp`, the latter read from `bp_at` (0: not read). Records them and, while the walk
    /// may still meet the last capture, looks for it there: returns the total frame count when
    /// the rest was copied from it.
    #[inline(always)]
    fn found(
        &mut self,
        i: usize,
        sp: u64,
        bp: u64,
        bp_at: u64,
        out: &mut [u64; MAX_FRAMES],
    ) -> Option<usize> {
        if self.cur.is_null() {
            return None;
        }
        self.record(i, sp, bp, bp_at);
        // SAFETY: the capture being recorded, written by this walk only.
        let cur = unsafe { &mut *self.cur };
        if !self.on {
            return None;
        }
        // SAFETY: non-null when `on`; read only, distinct from `cur`.
        let l = unsafe { &*self.last };
        let mut c = self.cursor;
        while c < l.n && l.sp[c] < sp {
            c += 1;
        }
        self.cursor = c;
        // A short rest is walked as fast as it would be checked and copied.
        if c + MIN_REUSED >= l.n
            || c < self.changed
            || l.sp[c] != sp
            || l.out[c] != out[i]
            || l.bp[c] != bp
        {
            return None;
        }
        // Most candidates differ right above (the same call site reached from elsewhere):
        // look at the next frame's return address first.
        let next_at = l.sp[c + 1].wrapping_sub(8);
        if next_at < self.lo
            || next_at > self.hi.wrapping_sub(8)
            // SAFETY: read only when inside this thread's mapped stack (checked just above),
            // as the walk's reads are.
            || unsafe { *(next_at as *const u64) } != l.out[c + 1]
        {
            self.changed = c + 1;
            return None;
        }
        match reuse(l, c, i, self.lo, self.hi, out, cur) {
            Ok(total) => {
                self.on = false;
                self.reused = (total - i - 1) as u64;
                if i == c {
                    self.same_depth = i;
                }
                Some(total)
            }
            Err(k) => {
                // Frame k of the last capture changed: a frame below it cannot be reused.
                self.changed = k;
                None
            }
        }
    }
}

/// Frame `i` of a walk matched frame `c` of the last capture `l` (same return address and
/// registers): if every stack word `l` read for its frames after `c` and at its end still
/// holds what it read (and every address found out of bounds still is), copies those frames
/// into `out` after `i`, and their registers and end into `cur`. Returns the walk's frame
/// count, or the first frame of `l` found changed (`l.n`: its end), and the full walk goes on.
#[inline(never)]
fn reuse(
    l: &Capture,
    c: usize,
    i: usize,
    lo: u64,
    hi: u64,
    out: &mut [u64; MAX_FRAMES],
    cur: &mut Capture,
) -> Result<usize, usize> {
    let read = |a: u64| stack_word(a, lo, hi);
    // The return-address slots `l.sp[k] - 8`: every one was read through `stack_word` when
    // `l` was walked (8-aligned, below the same stack top `hi`, which the caller checked),
    // and `l.sp` strictly increases (each frame lies above the one it called), so one check
    // of the range's ends bounds them all. That range starts at or above the walk's stack
    // pointer: `l.sp[c]` is the walk's `sp` at frame `i`.
    let first = l.sp[c + 1].wrapping_sub(8);
    let last = l.sp[l.n - 1].wrapping_sub(8);
    if first < lo || last > hi.wrapping_sub(8) || first > last {
        return Err(c + 1);
    }
    // Where a frame's rbp was saved: aligned as read before, but not ordered; in bounds when
    // `at - lo` is at most `span`.
    let span = hi.wrapping_sub(8).wrapping_sub(lo);
    for k in c + 1..l.n {
        debug_assert!(l.sp[k] > l.sp[k - 1] && l.sp[k].is_multiple_of(8));
        // SAFETY: in `[first, last]`, inside this thread's mapped stack (above).
        if unsafe { *(l.sp[k].wrapping_sub(8) as *const u64) } != l.out[k] {
            return Err(k);
        }
        let at = l.bp_at[k];
        if at != 0
            && (at.wrapping_sub(lo) > span
                // SAFETY: inside `[lo, hi - 8]` (checked just above) and 8-aligned (it was
                // read through `stack_word` when `l` was walked).
                || unsafe { *(at as *const u64) } != l.bp[k])
        {
            return Err(k);
        }
    }
    for k in 0..l.ends.min(2) {
        if read(l.end_at[k]) != l.end_val[k] {
            return Err(l.n);
        }
    }
    let tail = l.n - c - 1;
    let total = (i + 1 + tail).min(MAX_FRAMES);
    out[i + 1..total].copy_from_slice(&l.out[c + 1..c + 1 + (total - i - 1)]);
    if i == c {
        // The caller keeps `l` as the last capture (see `Matcher::same_depth`).
        return Ok(total);
    }
    let from = c + 1..c + 1 + (total - i - 1);
    let len = total - i - 1;
    cur.uses_bp |= ((l.uses_bp >> (c + 1)) & ((1u128 << len) - 1)) << (i + 1);
    cur.sp[i + 1..total].copy_from_slice(&l.sp[from.clone()]);
    cur.bp[i + 1..total].copy_from_slice(&l.bp[from.clone()]);
    cur.bp_at[i + 1..total].copy_from_slice(&l.bp_at[from]);
    cur.ends = l.ends;
    cur.end_at = l.end_at;
    cur.end_val = l.end_val;
    Ok(total)
}

#[cfg(test)]
mod tests {
    //! The rules are checked against an independent oracle: libgcc's own unwinder
    //! (`_Unwind_Backtrace`, the one C++ exceptions and Rust panics use), which reports for
    //! each frame its pc, its stack pointer (`_Unwind_GetCFA` of a frame's context is the CFA
    //! of the frame it called, i.e. this frame's `rsp`) and the value `rbp` had in it. A rule
    //! computed by this module for a frame's pc, applied to the registers that frame had, must
    //! give the caller's stack pointer and return address as libgcc reports them, and the
    //! `rbp` libgcc restored for the caller.

    use super::*;
    use std::ffi::{c_int, c_void};

    extern "C" {
        fn _Unwind_Backtrace(
            trace: unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int,
            arg: *mut c_void,
        ) -> c_int;
        fn _Unwind_GetIP(ctx: *mut c_void) -> usize;
        fn _Unwind_GetCFA(ctx: *mut c_void) -> usize;
        fn _Unwind_GetGR(ctx: *mut c_void, index: c_int) -> usize;
    }

    /// What libgcc reports for one frame.
    #[derive(Debug, Clone, Copy)]
    struct Oracle {
        ip: u64,
        cfa: u64,
        rbp: u64,
    }

    unsafe extern "C" fn collect(ctx: *mut c_void, arg: *mut c_void) -> c_int {
        // SAFETY: `arg` is the Vec handed to _Unwind_Backtrace below; `ctx` is libgcc's
        // context for the frame being reported, valid during this call. DWARF register 6 is
        // rbp on x86-64.
        unsafe {
            let out = &mut *(arg as *mut Vec<Oracle>);
            out.push(Oracle {
                ip: _Unwind_GetIP(ctx) as u64,
                cfa: _Unwind_GetCFA(ctx) as u64,
                rbp: _Unwind_GetGR(ctx, 6) as u64,
            });
        }
        0
    }

    /// Takes libgcc's view of the current stack and checks the rule of every frame against
    /// it. Returns how many frames were checked with a CFA based on rsp and on rbp, and whether
    /// the check went on to libgcc's end of the stack.
    #[inline(never)]
    fn check_against_libgcc() -> (usize, usize, bool) {
        let mut frames: Vec<Oracle> = Vec::with_capacity(64);
        // SAFETY: `collect` matches the callback signature and gets our Vec.
        unsafe { _Unwind_Backtrace(collect, &mut frames as *mut Vec<Oracle> as *mut c_void) };
        let c = new_cache();
        assert!(!c.is_null());
        // SAFETY: fresh cache, used only here.
        let cache = unsafe { &mut *c };
        // Publish the list we use, as a walk does, so a concurrent rebuild does not free it.
        let objects = loop {
            let p = OBJECTS.load(Ordering::SeqCst);
            cache.in_use.store(p, Ordering::SeqCst);
            if OBJECTS.load(Ordering::SeqCst) == p {
                assert!(!p.is_null(), "no object list");
                // SAFETY: published as in use by our cache: not freed while it stays so.
                break unsafe { &*p };
            }
        };
        let (mut by_sp, mut by_bp, mut to_the_end) = (0, 0, false);
        for i in 0..frames.len().saturating_sub(1) {
            let (f, caller) = (frames[i], frames[i + 1]);
            if f.ip == 0 {
                break;
            }
            let key = f.ip - 1;
            assert!(
                objects.find(key).is_some_and(|o| o.lo <= key && key < o.hi),
                "frame {i} ({:#x}) in no known object",
                f.ip
            );
            let rule = cache.rule(objects, key);
            if caller.ip == 0 {
                // libgcc's end of stack (the thread's first function: its return address is
                // undefined in the CFI): ours must end there too.
                assert_eq!(
                    rule.kind, STOP,
                    "frame {i} ({:#x}) is the last: {rule:?}",
                    f.ip
                );
                to_the_end = true;
                break;
            }
            let sp = f.cfa;
            let cfa = match rule.kind {
                CFA_SP => {
                    by_sp += 1;
                    sp
                }
                CFA_BP => {
                    by_bp += 1;
                    f.rbp
                }
                _ => panic!(
                    "frame {i} ({:#x}): no rule, libgcc unwinds it: {rule:?}",
                    f.ip
                ),
            }
            .wrapping_add(rule.cfa_offset as i64 as u64);
            assert_eq!(
                cfa, caller.cfa,
                "frame {i} ({:#x}): CFA (the caller's rsp), rule {rule:?}, rsp {sp:#x}",
                f.ip
            );
            // SAFETY: CFA − 8 of a frame of this thread that is still running (this function
            // or a caller of it), above its stack pointer: mapped stack memory.
            let ret = unsafe { *((cfa - 8) as *const u64) };
            assert_eq!(ret, caller.ip, "frame {i} ({:#x}): return address", f.ip);
            match rule.bp {
                BP_SAME => assert_eq!(caller.rbp, f.rbp, "frame {i} ({:#x}): rbp kept", f.ip),
                BP_AT => {
                    let at = cfa.wrapping_add(rule.bp_offset as i64 as u64);
                    // SAFETY: a slot of the same live frame (CFA + a small negative offset).
                    let saved = unsafe { *(at as *const u64) };
                    assert_eq!(saved, caller.rbp, "frame {i} ({:#x}): saved rbp", f.ip);
                }
                _ => {}
            }
        }
        // SAFETY: from new_cache, not used again.
        unsafe { free_cache(c) };
        (by_sp, by_bp, to_the_end)
    }

    #[inline(never)]
    fn nested(depth: u32) -> (usize, usize, bool) {
        if depth == 0 {
            check_against_libgcc()
        } else {
            std::hint::black_box(nested(std::hint::black_box(depth - 1)))
        }
    }

    thread_local! {
        /// What the walk inside [`through_trampoline`] saw on this thread: frames and how
        /// many.
        static SEEN: std::cell::Cell<([u64; MAX_FRAMES], usize)> =
            const { std::cell::Cell::new(([0; MAX_FRAMES], 0)) };
    }

    /// Called by a trampoline copy; walks from here (CFI, from this function's registers).
    #[inline(never)]
    extern "C" fn walk_here(_a: usize, _b: usize, _c: usize) {
        let (pc, sp) = crate::here!();
        let bp = crate::frame_pointer!() as u64;
        let hi = crate::unwind::current_stack_bounds(false).1;
        let c = new_cache();
        if c.is_null() {
            // No panic across the C ABI: the test sees no frames.
            return;
        }
        let mut out = [0u64; MAX_FRAMES];
        // SAFETY: fresh cache, used only here and freed below.
        let n = walk_from(pc, sp, bp, hi, unsafe { &mut *c }, &mut out);
        // SAFETY: from new_cache, not used again.
        unsafe { free_cache(c) };
        SEEN.set((out, n));
    }

    /// Copies `template` into a fresh executable mapping and calls `walk_here` through it
    /// (the trampoline calls `*%rcx`, the fourth argument); returns the copy's address and
    /// the return address into this function.
    #[inline(never)]
    fn through_trampoline(template: &[u8]) -> (u64, [u64; MAX_FRAMES], usize) {
        // SAFETY: a fresh anonymous mapping, written then made executable, unmapped below;
        // the code is a complete function of the C ABI (it calls its fourth argument with
        // the first three and returns).
        unsafe {
            let m = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(m, libc::MAP_FAILED);
            // Not at the start of the page, as copies in CPython's arenas are not.
            let at = (m as *mut u8).add(11 * 7);
            std::ptr::copy_nonoverlapping(template.as_ptr(), at, template.len());
            assert_eq!(
                libc::mprotect(m, 4096, libc::PROT_READ | libc::PROT_EXEC),
                0
            );
            let f: extern "C" fn(usize, usize, usize, extern "C" fn(usize, usize, usize)) =
                std::mem::transmute(at);
            f(1, 2, 3, walk_here);
            std::hint::black_box(());
            libc::munmap(m, 4096);
            let (out, n) = SEEN.get();
            (at as u64, out, n)
        }
    }

    #[inline(never)]
    fn check_trampoline(template: &[u8]) {
        rebuild();
        let (at, frames, n) = std::thread::spawn({
            let t = template.to_vec();
            move || through_trampoline(&t)
        })
        .join()
        .unwrap();
        let frames = &frames[..n];
        // walk_here's caller is the trampoline copy (return address at +6); the next frame is
        // in through_trampoline, and the walk goes on to the thread's start.
        let i = frames
            .iter()
            .position(|&f| f == at + 6)
            .unwrap_or_else(|| panic!("no return into the trampoline at {at:#x}: {frames:x?}"));
        assert_eq!(i, 0, "{frames:x?}");
        assert!(
            n >= 4,
            "the walk stopped at or just after the trampoline: {frames:x?}"
        );
        let f = through_trampoline as *const () as u64;
        assert!(
            frames[1] > f && frames[1] < f + 4096,
            "frame after the trampoline is not in through_trampoline ({f:#x}): {frames:x?}"
        );
    }

    #[test]
    fn steps_over_old_python_trampoline() {
        check_trampoline(&TRAMPOLINE_OLD);
    }

    #[test]
    fn steps_over_new_python_trampoline() {
        check_trampoline(&TRAMPOLINE_NEW);
    }

    #[test]
    fn trampoline_rule_only_for_the_template() {
        assert_eq!(trampoline_rule(5), None);
        // This function's own code is not a trampoline.
        let f = trampoline_rule_only_for_the_template as *const () as u64;
        assert_eq!(trampoline_rule(f + 5), None);
        // An unmapped page reads as nothing.
        // SAFETY: map then unmap one page; only its address is used afterwards.
        let gone = unsafe {
            let m = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            libc::munmap(m, 4096);
            m as u64
        };
        assert_eq!(trampoline_rule(gone + 5), None);
    }

    #[test]
    fn rules_agree_with_libgcc() {
        rebuild();
        // A thread of our own: its stack runs through this test's code (frame pointers),
        // std's thread start (none) and glibc's start_thread and clone3, to the stack's end.
        let (by_sp, by_bp, to_the_end) = std::thread::spawn(|| nested(5)).join().unwrap();
        assert!(to_the_end, "libgcc's stack has no end (a frame with pc 0)");
        // check_against_libgcc and the six `nested` frames keep frame pointers; std's thread
        // start does not.
        assert!(by_bp >= 7, "{by_bp} frames with an rbp-based CFA checked");
        assert!(by_sp >= 1, "{by_sp} frames with an rsp-based CFA checked");
    }

    /// Walks from here with `reusing` (a cache kept across walks) and with a fresh cache (a
    /// full walk); the two must agree.
    #[inline(never)]
    fn compare_here(reusing: *mut Cache) -> usize {
        let (pc, sp) = crate::here!();
        let bp = crate::frame_pointer!() as u64;
        let hi = crate::unwind::current_stack_bounds(false).1;
        let fresh = new_cache();
        assert!(!fresh.is_null());
        let (mut a, mut b) = ([0u64; MAX_FRAMES], [0u64; MAX_FRAMES]);
        // SAFETY: both caches are this thread's, one walk at a time.
        let (na, nb) = unsafe {
            (
                walk_from(pc, sp, bp, hi, &mut *reusing, &mut a),
                walk_from(pc, sp, bp, hi, &mut *fresh, &mut b),
            )
        };
        // SAFETY: made above, not used again.
        unsafe { free_cache(fresh) };
        assert_eq!(&a[..na], &b[..nb]);
        na
    }

    #[inline(never)]
    fn nest(depth: u32, c: *mut Cache, f: fn(*mut Cache) -> usize) -> usize {
        if depth == 0 {
            std::hint::black_box(f(c))
        } else {
            std::hint::black_box(nest(std::hint::black_box(depth - 1), c, f))
        }
    }

    /// Walks that record captures and look for the previous one give what full walks give.
    /// (Rust code here keeps frame pointers, so little is reused: the reuse itself is tested
    /// on C++ built without them, collector/tests/hotpath.rs.)
    #[test]
    fn walks_with_captures_equal_full_walks() {
        rebuild();
        set_stack_reuse(true);
        let depths = std::thread::spawn(|| {
            let c = new_cache();
            assert!(!c.is_null());
            let mut depths = std::collections::BTreeSet::new();
            for i in 0..200u32 {
                // Same site at several depths, repeated: consecutive walks share outer frames.
                depths.insert(nest(i % 7 + (i / 50), c, compare_here));
            }
            // SAFETY: made above, not used again.
            unsafe { free_cache(c) };
            depths
        })
        .join()
        .unwrap();
        assert!(depths.len() >= 7, "depths seen: {depths:?}");
    }

    #[inline(never)]
    fn via_a(c: *mut Cache) -> usize {
        std::hint::black_box(nest(std::hint::black_box(4), c, compare_here)) + 1
    }

    #[inline(never)]
    fn via_b(c: *mut Cache) -> usize {
        std::hint::black_box(nest(std::hint::black_box(4), c, compare_here)) + 2
    }

    /// Walks found in the memo give what full walks give, also when two callers reach the same
    /// allocation site with the same registers (the same depth, frames of the same size): the
    /// memo's entry for one caller fails its check for the other. And the memo is used: most
    /// walks of a few repeated stacks are found there.
    #[test]
    fn memo_hits_equal_full_walks() {
        rebuild();
        set_stack_reuse(true);
        let hits = std::thread::spawn(|| {
            let c = new_cache();
            assert!(!c.is_null());
            for i in 0..400u32 {
                match i % 4 {
                    0 | 1 => via_a(c),
                    2 => via_b(c),
                    _ => nest(i % 3, c, compare_here),
                };
            }
            // SAFETY: this thread's cache, made above; captures mapped since reuse is on.
            let hits = unsafe { (*(*c).captures).hits };
            // SAFETY: made above, not used again.
            unsafe { free_cache(c) };
            hits
        })
        .join()
        .unwrap();
        assert!(hits >= 300, "memo hits: {hits} of 400 walks");
    }
}
