//! SIGINT and SIGTERM during `mha train`: the first finishes the step and saves a checkpoint,
//! then the process exits with 128 + the signal's number (130, 143), so that a script can tell
//! an interrupted run from a finished one; a second signal exits at once.

use std::sync::atomic::{AtomicI32, Ordering};

/// The first signal caught (0: none).
static CAUGHT: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    if CAUGHT.swap(sig, Ordering::SeqCst) != 0 {
        // Only async-signal-safe calls here.
        unsafe { libc::_exit(128 + sig) };
    }
}

/// Installs the handler for SIGINT and SIGTERM.
pub fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only touches an atomic and calls `_exit`.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

/// The signal that asked the run to stop, if one did.
pub fn caught() -> Option<i32> {
    match CAUGHT.load(Ordering::Relaxed) {
        0 => None,
        sig => Some(sig),
    }
}

/// The exit status of a run stopped by `sig`: 128 + its number, as a shell reports it.
pub fn exit_status(sig: i32) -> u8 {
    (128 + sig).clamp(0, 255) as u8
}
