//! Setting signal dispositions: the one `sigaction` helper of the collector (`run`'s
//! forwarding, `watch`'s stop, the snapshot's lease release, the SIGBUS guard of mapped
//! regions, SIGPIPE).

/// What a signal does.
#[derive(Debug, Clone, Copy)]
pub enum Handler {
    /// The default action (`SIG_DFL`).
    Default,
    /// A handler taking the signal number.
    Simple(extern "C" fn(libc::c_int)),
    /// A handler taking the signal's `siginfo_t` too (`SA_SIGINFO` is added to the flags).
    Info(extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)),
}

impl Handler {
    /// The `sa_sigaction` value.
    fn address(self) -> libc::sighandler_t {
        match self {
            Handler::Default => libc::SIG_DFL,
            Handler::Simple(f) => f as *const () as libc::sighandler_t,
            Handler::Info(f) => f as *const () as libc::sighandler_t,
        }
    }
}

/// Sets the disposition of `sig` to `handler` with `flags` (`SA_RESTART`, `SA_RESETHAND`, ...;
/// `SA_SIGINFO` added for [`Handler::Info`]) and an empty mask.
///
/// Errors: `sig` is not a signal whose disposition can be set (`EINVAL`).
///
/// # Safety
/// The handler must only make async-signal-safe calls and touch only atomics (or memory it
/// owns exclusively), as any signal handler.
pub unsafe fn set(sig: libc::c_int, handler: Handler, flags: libc::c_int) -> std::io::Result<()> {
    // SAFETY: a zeroed sigaction is a valid value; sigemptyset initialises its mask.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = handler.address();
    sa.sa_flags = flags
        | match handler {
            Handler::Info(_) => libc::SA_SIGINFO,
            _ => 0,
        };
    // SAFETY: `sa.sa_mask` is a sigset_t we own.
    unsafe { libc::sigemptyset(&mut sa.sa_mask) };
    // SAFETY: `sa` is initialised; the old action is not asked for. The caller vouches for
    // the handler.
    if unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `sig`'s disposition is the default action or `handler` (not ignored, not another
/// handler the program installed). `false` for an invalid signal.
pub fn is_default_or(sig: libc::c_int, handler: Handler) -> bool {
    current(sig).is_some_and(|h| h == libc::SIG_DFL || h == handler.address())
}

/// Whether `sig` is ignored (`SIG_IGN`), as a parent such as `nohup` or a shell's `trap ''`
/// leaves it for the programs it starts. `false` for an invalid signal.
pub fn is_ignored(sig: libc::c_int) -> bool {
    current(sig) == Some(libc::SIG_IGN)
}

/// `sig`'s current disposition (`sa_sigaction`); `None` for an invalid signal.
fn current(sig: libc::c_int) -> Option<libc::sighandler_t> {
    // SAFETY: a zeroed sigaction is a valid value to receive the current action into.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: only reads the current action into `old`.
    if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
        return None;
    }
    Some(old.sa_sigaction)
}
