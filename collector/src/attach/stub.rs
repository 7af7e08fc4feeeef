//! The code `heapdump attach` makes one stopped thread of the target run: a position-
//! independent stub, copied into a page mapped in the target, that saves every register
//! (general-purpose, flags, and the whole extended state with `xsave`), calls
//! `dlopen(path, mode)`, `dlsym(handle, entry)` and `entry(args)`, sets a "done" word, restores
//! everything and jumps back to where the thread was interrupted. The thread needs nothing
//! from `heapdump` once it runs the stub: if `heapdump` is killed meanwhile, the thread still
//! finishes and returns correctly.
//!
//! The stub ends with its parameters ([`Slots`]), written by the collector before the page
//! is copied. The data page it is given ([`DATA_*`] offsets) holds the strings, the answer
//! (`vmo_layout::attach::AttachArgs`) and the stub's progress.

use std::arch::global_asm;

global_asm!(
    ".pushsection .text.heapdump_attach_stub,\"ax\",@progbits",
    ".balign 64",
    ".globl hd_attach_stub_start",
    "hd_attach_stub_start:",
    // Below the interrupted code's red zone.
    "lea rsp, [rsp - 128]",
    "pushfq",
    "push rax",
    "push rcx",
    "push rdx",
    "push rbx",
    "push rbp",
    "push rsi",
    "push rdi",
    "push r8",
    "push r9",
    "push r10",
    "push r11",
    "push r12",
    "push r13",
    "push r14",
    "push r15",
    "mov rbp, rsp",
    "and rsp, -64",
    "sub rsp, qword ptr [rip + hd_slot_xsave]",
    // xsave needs a zeroed header; DF was saved with the flags.
    "cld",
    "mov rdi, rsp",
    "mov rcx, qword ptr [rip + hd_slot_xsave]",
    "xor eax, eax",
    "rep stosb",
    "mov eax, -1",
    "mov edx, -1",
    "xsave64 [rsp]",
    "mov rbx, qword ptr [rip + hd_slot_data]",
    "mov qword ptr [rbx + 16], 1",
    "lea rdi, [rbx + 64]",
    "mov rsi, qword ptr [rip + hd_slot_mode]",
    "call qword ptr [rip + hd_slot_dlopen]",
    "test rax, rax",
    "jz 2f",
    "mov qword ptr [rbx + 16], 2",
    "mov rdi, rax",
    "lea rsi, [rbx + 576]",
    "call qword ptr [rip + hd_slot_dlsym]",
    "test rax, rax",
    "jz 2f",
    "mov qword ptr [rbx + 16], 3",
    "lea rdi, [rbx + 1024]",
    "call rax",
    "mov qword ptr [rbx + 16], 4",
    "jmp 3f",
    "2:",
    "call qword ptr [rip + hd_slot_dlerror]",
    "mov qword ptr [rbx + 8], rax",
    "3:",
    "mov qword ptr [rbx], 1",
    "mov eax, -1",
    "mov edx, -1",
    "xrstor64 [rsp]",
    "mov rsp, rbp",
    "pop r15",
    "pop r14",
    "pop r13",
    "pop r12",
    "pop r11",
    "pop r10",
    "pop r9",
    "pop r8",
    "pop rdi",
    "pop rsi",
    "pop rbp",
    "pop rbx",
    "pop rdx",
    "pop rcx",
    "pop rax",
    "popfq",
    "lea rsp, [rsp + 128]",
    "jmp qword ptr [rip + hd_slot_ret]",
    ".balign 8",
    ".globl hd_slot_ret",
    "hd_slot_ret: .quad 0",
    ".globl hd_slot_data",
    "hd_slot_data: .quad 0",
    ".globl hd_slot_dlopen",
    "hd_slot_dlopen: .quad 0",
    ".globl hd_slot_dlsym",
    "hd_slot_dlsym: .quad 0",
    ".globl hd_slot_dlerror",
    "hd_slot_dlerror: .quad 0",
    ".globl hd_slot_xsave",
    "hd_slot_xsave: .quad 0",
    ".globl hd_slot_mode",
    "hd_slot_mode: .quad 0",
    ".globl hd_attach_stub_end",
    "hd_attach_stub_end:",
    ".popsection",
);

extern "C" {
    static hd_attach_stub_start: u8;
    static hd_attach_stub_end: u8;
    static hd_slot_ret: u8;
    static hd_slot_data: u8;
    static hd_slot_dlopen: u8;
    static hd_slot_dlsym: u8;
    static hd_slot_dlerror: u8;
    static hd_slot_xsave: u8;
    static hd_slot_mode: u8;
}

/// Data page: the word the stub sets to 1 when it is about to return.
pub const DATA_DONE: usize = 0;
/// Data page: `dlerror()`'s string (an address in the target) when `dlopen` or `dlsym`
/// failed.
pub const DATA_DLERROR: usize = 8;
/// Data page: how far the stub got: 1 in `dlopen`, 2 in `dlsym`, 3 in the entry, 4 returned.
pub const DATA_STAGE: usize = 16;
/// Data page: the library's path, NUL-terminated (at most 511 bytes).
pub const DATA_PATH: usize = 64;
/// Data page: the entry's name, NUL-terminated (at most 63 bytes).
pub const DATA_SYMBOL: usize = 576;
/// Data page: the entry's argument (`vmo_layout::attach::AttachArgs`).
pub const DATA_ARGS: usize = 1024;
const _: () = assert!(DATA_ARGS + std::mem::size_of::<vmo_layout::attach::AttachArgs>() <= 4096);

/// The stub's parameters.
#[derive(Debug, Clone, Copy)]
pub struct Slots {
    /// Where the thread resumes after the stub.
    pub ret: u64,
    /// The data page's address in the target.
    pub data: u64,
    /// `dlopen`, `dlsym`, `dlerror` in the target.
    pub dlopen: u64,
    /// See `dlopen`.
    pub dlsym: u64,
    /// See `dlopen`.
    pub dlerror: u64,
    /// Bytes of the `xsave` area (a multiple of 64).
    pub xsave: u64,
    /// `dlopen`'s mode.
    pub mode: u64,
}

/// The stub's bytes with `s` filled in.
pub fn code(s: &Slots) -> Vec<u8> {
    // SAFETY: the symbols are labels of the global_asm block above, in one section, start
    // before end; the bytes between them are the stub's (read, never executed here).
    unsafe {
        let start = std::ptr::addr_of!(hd_attach_stub_start) as usize;
        let end = std::ptr::addr_of!(hd_attach_stub_end) as usize;
        let mut v = std::slice::from_raw_parts(start as *const u8, end - start).to_vec();
        let mut put = |label: *const u8, value: u64| {
            let off = label as usize - start;
            v[off..off + 8].copy_from_slice(&value.to_le_bytes());
        };
        put(std::ptr::addr_of!(hd_slot_ret), s.ret);
        put(std::ptr::addr_of!(hd_slot_data), s.data);
        put(std::ptr::addr_of!(hd_slot_dlopen), s.dlopen);
        put(std::ptr::addr_of!(hd_slot_dlsym), s.dlsym);
        put(std::ptr::addr_of!(hd_slot_dlerror), s.dlerror);
        put(std::ptr::addr_of!(hd_slot_xsave), s.xsave);
        put(std::ptr::addr_of!(hd_slot_mode), s.mode);
        v
    }
}

/// Bytes the `xsave` of this machine writes for every state component the OS enabled,
/// rounded up to 64 (CPUID leaf 0xD: EBX); `None` without `xsave`.
pub fn xsave_size() -> Option<u64> {
    if !std::arch::is_x86_feature_detected!("xsave") {
        return None;
    }
    // CPUID leaf 0xD exists when xsave is supported (checked above).
    let r = std::arch::x86_64::__cpuid_count(0xD, 0);
    Some((r.ebx as u64).div_ceil(64) * 64)
}
