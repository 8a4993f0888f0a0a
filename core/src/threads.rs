//! Threads the core (and a binding) starts, with every asynchronous signal blocked.
//!
//! A signal sent to the process goes to any thread that does not block it. The host
//! language's handlers (PHP's pcntl, Python's `signal`) and its blocking calls live
//! on its own thread: a `sleep()` that a timeout's SIGALRM must interrupt, a pull
//! consumer's wait that a SIGTERM must end. Blocked in the core's threads, signals
//! reach that thread only.

use std::io;
use std::thread::JoinHandle;

/// `std::thread::Builder::spawn` with a thread name; the thread starts with every
/// asynchronous signal blocked (the mask is inherited, so none can reach it before it
/// runs), and the caller's own mask is kept. A fault of the thread's own (SIGSEGV,
/// SIGBUS, SIGFPE, SIGILL) stays deliverable, so that it is reported as one.
pub fn spawn<T: Send + 'static>(name: String, f: impl FnOnce() -> T + Send + 'static) -> io::Result<JoinHandle<T>> {
    // SAFETY: sigset_t is plain data, filled by sigfillset; pthread_sigmask changes
    // only this thread's mask, and the old one is put back before returning.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&raw mut all);
        for fault in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL] {
            libc::sigdelset(&raw mut all, fault);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &raw const all, &raw mut old);
        let spawned = std::thread::Builder::new().name(name).spawn(f);
        libc::pthread_sigmask(libc::SIG_SETMASK, &raw const old, std::ptr::null_mut());
        spawned
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_spawned_thread_blocks_signals_and_the_caller_keeps_its_mask() {
        let blocked = |signal| {
            // SAFETY: reads this thread's mask into a zeroed set.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &raw mut set);
                libc::sigismember(&raw const set, signal) == 1
            }
        };
        let before = blocked(libc::SIGTERM);
        let inside = super::spawn("t".into(), move || (blocked(libc::SIGTERM), blocked(libc::SIGALRM)))
            .expect("spawn")
            .join()
            .expect("join");
        assert_eq!(inside, (true, true));
        let fault = super::spawn("t".into(), move || blocked(libc::SIGSEGV))
            .expect("spawn")
            .join()
            .expect("join");
        assert!(!fault, "a thread's own fault stays deliverable");
        assert_eq!(blocked(libc::SIGTERM), before);
    }
}
