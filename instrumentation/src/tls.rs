//! The calling thread's state without `__tls_get_addr`: one TLS word read through a TLS
//! descriptor.
//!
//! Rust's `thread_local!` in a shared object (the preload shim) uses the traditional
//! general-dynamic TLS model: every access calls `__tls_get_addr` through the PLT (~7 ns a
//! malloc/free pair on the storm). Stable Rust cannot ask for another model, so on x86-64
//! this module declares one pointer-sized `.tbss` word itself (`global_asm!`) and reads it
//! with the TLS-descriptor sequence (`@TLSDESC`/`@TLSCALL`, the "gnu2" dialect): for a library
//! in the static TLS block (preloaded) the descriptor's function only returns a constant
//! offset, and the word is read through `fs:`. The word holds the address of the thread's
//! [`crate::state::Tls`] (which stays a `thread_local!`), set at the thread's first call.
//!
//! Why not initial-exec (`@gottpoff`): one initial-exec access marks the whole module
//! `STATIC_TLS`, and glibc must then place all of its TLS (the 5 KiB thread state included)
//! in the small static-TLS surplus it keeps for libraries loaded by `dlopen` (512 bytes by
//! default): `dlopen` of the shim (`heapdump attach`) failed with "cannot allocate memory in
//! static TLS block". Descriptors keep the module's TLS dynamic: it still loads by `dlopen`.
//! On other architectures the accessor falls back to `thread_local!` alone.

#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 3",
    ".globl heapdump_self",
    ".hidden heapdump_self",
    ".type heapdump_self, @object",
    ".size heapdump_self, 8",
    "heapdump_self:",
    ".zero 8",
    ".popsection",
);

/// The pointer stored in this thread's word (null until [`set`] on this thread).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn get() -> *const u8 {
    let p: *const u8;
    // SAFETY: the TLS descriptor sequence of the x86-64 ABI (`lea` of the descriptor, `call`
    // through it; the linker relaxes it in an executable): rax receives the word's offset from
    // the thread pointer, read through `fs:`. The resolver preserves every register but rax
    // in the ABI; glibc before 2.40 may clobber vector registers on its slow path (a thread's
    // first access to a dlopened module), hence `clobber_abi("C")`. The call uses the stack
    // (no `nostack`), which the compiler keeps aligned and clear of the red zone. The word is
    // only ever written by its own thread.
    unsafe {
        core::arch::asm!(
            "lea rax, [rip + heapdump_self@TLSDESC]",
            "call qword ptr [rax + heapdump_self@TLSCALL]",
            "mov rax, qword ptr fs:[rax]",
            out("rax") p,
            clobber_abi("C"),
        );
    }
    p
}

/// Stores `p` into this thread's word.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
pub(crate) fn set(p: *const u8) {
    let word: *mut *const u8;
    // SAFETY: as in `get`; then the thread pointer (`fs:0` holds its own address on x86-64
    // glibc) plus the offset is the word's address in this thread's TLS.
    unsafe {
        core::arch::asm!(
            "lea rax, [rip + heapdump_self@TLSDESC]",
            "call qword ptr [rax + heapdump_self@TLSCALL]",
            "add rax, qword ptr fs:[0]",
            out("rax") word,
            clobber_abi("C"),
        );
    }
    // SAFETY: `word` is the address of this thread's 8-byte, 8-aligned TLS word.
    unsafe { *word = p };
}
