//! SIGTERM and SIGINT stop a running worker gracefully. While `run()` blocks, PHP's
//! own async signal handlers cannot run, so the extension installs a handler that only
//! sets a flag; the run loop turns it into a stop. The previous handlers come back
//! when `run()` returns.

use std::sync::atomic::{AtomicBool, Ordering};

static SIGNALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    // Only async-signal-safe work here: one atomic store.
    SIGNALLED.store(true, Ordering::Release);
}

/// Whether SIGTERM/SIGINT arrived since the last call; clears the flag.
pub(crate) fn take() -> bool {
    SIGNALLED.swap(false, Ordering::AcqRel)
}

/// Forget a signal that the parent received before a fork.
pub(crate) fn clear() {
    SIGNALLED.store(false, Ordering::Release);
}

/// Handlers installed for the duration of a run.
pub(crate) struct Installed {
    previous: [(libc::c_int, libc::sigaction); 2],
}

pub(crate) fn install() -> Installed {
    clear();
    let mut previous = [(libc::SIGTERM, zeroed()), (libc::SIGINT, zeroed())];
    for (signal, old) in &mut previous {
        let mut action = zeroed();
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        // SA_RESTART: a handler's blocking calls (sleep, I/O) are not cut short.
        action.sa_flags = libc::SA_RESTART;
        // SAFETY: valid sigaction structs; the handler is async-signal-safe.
        unsafe {
            libc::sigemptyset(&raw mut action.sa_mask);
            libc::sigaction(*signal, &raw const action, old);
        }
    }
    Installed { previous }
}

fn zeroed() -> libc::sigaction {
    // SAFETY: sigaction is a plain C struct for which all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

impl Drop for Installed {
    fn drop(&mut self) {
        for (signal, old) in &self.previous {
            // SAFETY: restores the handler that sigaction reported earlier.
            unsafe {
                libc::sigaction(*signal, old, std::ptr::null_mut());
            }
        }
    }
}
