//! Unwinding a stopped thread of the target by its call frame information (`.eh_frame`), from
//! its registers: the frames it is really inside, for the safe point (`super::unsafe_thread`).
//! Where the information is missing or not of the usual forms (generated code, PLT entries,
//! DWARF expressions), [`Step::Unknown`] says so and the caller falls back to the old
//! conservative scan of the stack from there.

use super::ptrace::Held;
use super::Map;
use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, LittleEndian, Register, RegisterRule,
    UnwindContext, UnwindSection, X86_64,
};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::Range;
use std::rc::Rc;

/// Registers by DWARF number (x86-64 psABI): 0 rax, 1 rdx, 2 rcx, 3 rbx, 4 rsi, 5 rdi, 6 rbp,
/// 7 rsp, 8–15 r8–r15, 16 the return address (the frame's pc); `None`: not known.
#[derive(Debug, Clone, Copy)]
pub(super) struct Regs(pub(super) [Option<u64>; 17]);

impl Regs {
    pub(super) fn of(r: &libc::user_regs_struct) -> Regs {
        Regs([
            Some(r.rax),
            Some(r.rdx),
            Some(r.rcx),
            Some(r.rbx),
            Some(r.rsi),
            Some(r.rdi),
            Some(r.rbp),
            Some(r.rsp),
            Some(r.r8),
            Some(r.r9),
            Some(r.r10),
            Some(r.r11),
            Some(r.r12),
            Some(r.r13),
            Some(r.r14),
            Some(r.r15),
            Some(r.rip),
        ])
    }
    pub(super) fn pc(&self) -> u64 {
        self.0[16].unwrap_or(0)
    }
    pub(super) fn sp(&self) -> u64 {
        self.0[7].unwrap_or(0)
    }
    fn get(&self, r: Register) -> Option<u64> {
        self.0.get(r.0 as usize).copied().flatten()
    }
}

/// One unwinding step.
#[derive(Debug)]
// One step a frame, returned by value: boxing the registers would allocate for each frame.
#[allow(clippy::large_enum_variant)]
pub(super) enum Step {
    /// The caller's registers; `true` when its pc is where a signal interrupted it (an
    /// instruction about to run, not a return address).
    Caller(Regs, bool),
    /// The outermost frame (its return address is undefined: `_start`, `clone3`).
    Outermost,
    /// No usable call frame information for this frame.
    Unknown,
}

/// glibc's `__restore_rt` (`mov $15, %rax; syscall`): the return address of a signal
/// handler's frame.
const SIGRETURN: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
/// Offset of `uc_mcontext.gregs` in the `ucontext_t` at the signal frame's stack pointer.
const GREGS: u64 = 40;

/// One object's `.eh_frame_hdr` and `.eh_frame`.
#[derive(Debug)]
struct Cfi {
    /// The object's ELF image: its file, or the vDSO's memory.
    data: Vec<u8>,
    hdr: Range<usize>,
    hdr_addr: u64,
    eh: Range<usize>,
    eh_addr: u64,
}

/// The target's objects' call frame information, read as unwinding first needs it.
#[derive(Debug)]
pub(super) struct Unwinder {
    pid: u32,
    maps: Vec<Map>,
    objects: RefCell<HashMap<String, Option<Rc<Cfi>>>>,
}

impl Unwinder {
    pub(super) fn new(pid: u32, maps: &[Map]) -> Unwinder {
        Unwinder {
            pid,
            maps: maps.to_vec(),
            objects: RefCell::new(HashMap::new()),
        }
    }

    fn cfi_for(&self, held: &Held, addr: u64) -> Option<Rc<Cfi>> {
        let m = self
            .maps
            .iter()
            .find(|m| m.perms.contains('x') && addr >= m.start && addr < m.end)?;
        if !m.path.starts_with('/') && m.path != "[vdso]" {
            return None;
        }
        self.objects
            .borrow_mut()
            .entry(m.path.clone())
            .or_insert_with(|| self.load(held, &m.path).map(Rc::new))
            .clone()
    }

    fn load(&self, held: &Held, path: &str) -> Option<Cfi> {
        use object::{Object as _, ObjectSection as _, ObjectSegment as _};
        let first = self
            .maps
            .iter()
            .filter(|m| m.path == path)
            .min_by_key(|m| m.start)?;
        let data = if path == "[vdso]" {
            let mut b = vec![0u8; (first.end - first.start) as usize];
            let n = held.read(first.start, &mut b);
            b.truncate(n);
            b
        } else {
            let read = |p: &std::path::Path| {
                crate::regions::read_regular(p, crate::regions::MAX_OBJECT_BYTES)
            };
            read(std::path::Path::new(&format!(
                "/proc/{}/root{path}",
                self.pid
            )))
            .or_else(|_| read(std::path::Path::new(path)))
            .ok()?
        };
        let elf = object::File::parse(&*data).ok()?;
        let low = elf.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
        let bias = first.start - first.offset - low;
        let range = |name: &str| {
            let s = elf.section_by_name(name)?;
            let (off, len) = s.file_range()?;
            Some((bias + s.address(), off as usize..(off + len) as usize))
        };
        let (hdr_addr, hdr) = range(".eh_frame_hdr")?;
        let (eh_addr, eh) = range(".eh_frame")?;
        drop(elf);
        (hdr.end <= data.len() && eh.end <= data.len()).then_some(Cfi {
            data,
            hdr,
            hdr_addr,
            eh,
            eh_addr,
        })
    }

    /// Unwinds one frame: `regs` are the frame's, `exact` when its pc is an instruction about
    /// to run (the innermost frame, or one a signal interrupted) rather than a return address.
    pub(super) fn step(&self, held: &Held, regs: &Regs, exact: bool) -> Step {
        let pc = regs.pc();
        let mut code = [0u8; 9];
        if !exact && held.read(pc, &mut code) == 9 && code == SIGRETURN {
            return sigreturn(held, regs.sp());
        }
        // A return address may follow a call that ends its function: looked up one byte back.
        let key = if exact { pc } else { pc.wrapping_sub(1) };
        let Some(cfi) = self.cfi_for(held, key) else {
            return Step::Unknown;
        };
        let bases = BaseAddresses::default()
            .set_eh_frame_hdr(cfi.hdr_addr)
            .set_eh_frame(cfi.eh_addr);
        let mut eh = EhFrame::new(&cfi.data[cfi.eh.clone()], LittleEndian);
        eh.set_address_size(8);
        let Ok(hdr) = EhFrameHdr::new(&cfi.data[cfi.hdr.clone()], LittleEndian).parse(&bases, 8)
        else {
            return Step::Unknown;
        };
        let mut ctx = UnwindContext::new();
        let row = match hdr.table() {
            Some(t) => {
                t.unwind_info_for_address(&eh, &bases, &mut ctx, key, EhFrame::cie_from_offset)
            }
            None => eh.unwind_info_for_address(&bases, &mut ctx, key, EhFrame::cie_from_offset),
        };
        let Ok(row) = row else { return Step::Unknown };
        let cfa = match row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } => match regs.get(*register) {
                Some(v) => v.wrapping_add_signed(*offset),
                None => return Step::Unknown,
            },
            _ => return Step::Unknown,
        };
        if cfa <= regs.sp() {
            return Step::Unknown;
        }
        // The callee-saved registers keep their values unless the CFI says where they were
        // saved; the others are not known in the caller.
        let mut next = Regs([None; 17]);
        for r in [3, 6, 12, 13, 14, 15] {
            next.0[r] = regs.0[r];
        }
        for (reg, rule) in row.registers() {
            let r = reg.0 as usize;
            if r > 16 {
                continue;
            }
            next.0[r] = match rule {
                RegisterRule::Undefined if r == 16 => return Step::Outermost,
                RegisterRule::Undefined => None,
                RegisterRule::SameValue => regs.0[r],
                RegisterRule::Offset(o) => held.word(cfa.wrapping_add_signed(*o)),
                RegisterRule::ValOffset(o) => Some(cfa.wrapping_add_signed(*o)),
                RegisterRule::Register(from) => regs.get(*from),
                _ if r == 16 => return Step::Unknown,
                _ => None,
            };
        }
        if row.register(X86_64::RA).is_none() || next.pc() == 0 {
            return Step::Unknown;
        }
        next.0[7] = Some(cfa);
        Step::Caller(next, false)
    }
}

/// The frame a signal interrupted, from the `ucontext_t` the kernel saved at `sp` (the
/// stack pointer of the frame whose pc is `__restore_rt`).
fn sigreturn(held: &Held, sp: u64) -> Step {
    let mut b = [0u8; 17 * 8];
    if held.read(sp + GREGS, &mut b) != b.len() {
        return Step::Unknown;
    }
    let g = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[i * 8..i * 8 + 8]);
        Some(u64::from_le_bytes(w))
    };
    // gregs: r8–r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip.
    let mut r = Regs([None; 17]);
    for i in 0..8 {
        r.0[8 + i] = g(i);
    }
    for (i, dwarf) in [5, 4, 6, 3, 1, 0, 2, 7, 16].into_iter().enumerate() {
        r.0[dwarf] = g(8 + i);
    }
    Step::Caller(r, true)
}
