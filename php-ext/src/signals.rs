//! SIGTERM and SIGINT stop a running worker gracefully. While `run()` blocks, PHP's
//! own async signal handlers cannot run, so the extension installs a handler that only
//! sets a flag; the run loop turns it into a stop. The previous handlers come back
//! when `run()` returns.
//!
//! A second signal, half a second or more after the first, stops at once: the PHP
//! thread may be inside a handler that nothing can interrupt, so a watcher thread of
//! the worker process releases every message the pool holds and ends the process by
//! that signal, as if the extension had installed no handler. Closer signals are one
//! stop arriving twice: a terminal's Ctrl+C reaches every process of its group, and the
//! supervisor passes it on as SIGTERM.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

static SIGNALLED: AtomicBool = AtomicBool::new(false);
/// The last stop signal's number (0 none yet).
static LAST: AtomicI32 = AtomicI32::new(0);
/// Whether the run acted on a stop signal (`take` saw one).
static ACTED: AtomicBool = AtomicBool::new(false);
/// When the first stop signal came (CLOCK_MONOTONIC ms; 0 none yet).
static FIRST_MS: AtomicU64 = AtomicU64::new(0);
/// The second signal's number once one came (0 none).
static URGENT: AtomicI32 = AtomicI32::new(0);
/// The write end of this process's watcher pipe, -1 without a watcher.
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
/// The core's `URGENT_AFTER`, in the unit of this module's clock.
const URGENT_AFTER_MS: u64 = delayq::host::URGENT_AFTER.as_millis() as u64;

fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime is async-signal-safe and writes only `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1000 + u64::try_from(ts.tv_nsec).unwrap_or(0) / 1_000_000 + 1
}

extern "C" fn on_signal(signal: libc::c_int) {
    // Only async-signal-safe work here: atomics, clock_gettime and write.
    let now = monotonic_ms();
    if let Err(first) = FIRST_MS.compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire)
        && now.saturating_sub(first) >= URGENT_AFTER_MS
        && URGENT.swap(signal, Ordering::AcqRel) == 0
    {
        let fd = WAKE_FD.load(Ordering::Acquire);
        if fd >= 0 {
            // SAFETY: write(2) is async-signal-safe; the fd stays open while stored.
            unsafe { libc::write(fd, [1u8].as_ptr().cast(), 1) };
        }
    }
    LAST.store(signal, Ordering::Release);
    SIGNALLED.store(true, Ordering::Release);
}

/// Whether SIGTERM/SIGINT arrived since the last call; clears the flag.
pub(crate) fn take() -> bool {
    let came = SIGNALLED.swap(false, Ordering::AcqRel);
    if came {
        ACTED.store(true, Ordering::Release);
    }
    came
}

/// The number of a second stop signal, once one came.
pub(crate) fn urgent() -> Option<libc::c_int> {
    Some(URGENT.load(Ordering::Acquire)).filter(|&s| s != 0)
}

/// Forget signals that the parent received before a fork.
pub(crate) fn clear() {
    SIGNALLED.store(false, Ordering::Release);
    LAST.store(0, Ordering::Release);
    ACTED.store(false, Ordering::Release);
    FIRST_MS.store(0, Ordering::Release);
    URGENT.store(0, Ordering::Release);
}

/// The thread that acts on a second signal in a worker process; ended on drop.
pub(crate) struct Watcher {
    thread: Option<std::thread::JoinHandle<()>>,
    read_fd: libc::c_int,
    write_fd: libc::c_int,
}

/// Start this process's watcher: on a second signal it runs `release` (which returns
/// how many messages went back) and ends the process by that signal. `None` if the
/// pipe or the thread cannot be made: a second signal is then one more graceful stop.
pub(crate) fn watch(release: impl FnOnce() -> usize + Send + 'static) -> Option<Watcher> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    let [read_fd, write_fd] = fds;
    let thread = delayq::threads::spawn("delayq-signal".into(), move || {
        let mut byte = 0u8;
        // SAFETY: reads one byte into `byte` from our own pipe.
        while unsafe { libc::read(read_fd, (&raw mut byte).cast(), 1) } < 0
            && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {}
        if let Some(signal) = urgent() {
            let given = release();
            // Written directly: the process ends before the PHP thread could flush
            // the log.
            eprintln!("[delayq warning] a second stop signal: stopping now; {given} messages went back to the queue");
            die_by(signal);
        }
    });
    let Ok(thread) = thread else {
        // SAFETY: closing the descriptors made above.
        unsafe {
            libc::close(read_fd);
            libc::close(write_fd);
        }
        return None;
    };
    WAKE_FD.store(write_fd, Ordering::Release);
    // A second signal may have come before the watcher listened.
    if urgent().is_some() {
        // SAFETY: our own pipe's write end.
        unsafe { libc::write(write_fd, [1u8].as_ptr().cast(), 1) };
    }
    Some(Watcher {
        thread: Some(thread),
        read_fd,
        write_fd,
    })
}

/// End the process by `signal`, as without the extension's handler.
fn die_by(signal: libc::c_int) -> ! {
    // SAFETY: restores the default action and sends the signal to this process; the
    // _exit after it is for a signal that is blocked or ignored after all.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        libc::kill(libc::getpid(), signal);
        libc::_exit(128 + signal)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        WAKE_FD.store(-1, Ordering::Release);
        // SAFETY: wakes the thread (it ends unless a second signal came); then the
        // descriptors are ours to close.
        unsafe { libc::write(self.write_fd, [0u8].as_ptr().cast(), 1) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // SAFETY: as above.
        unsafe {
            libc::close(self.read_fd);
            libc::close(self.write_fd);
        }
    }
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
        // A signal that came as the run ended for another reason (max_jobs, empty)
        // was not acted on: it goes to the handler that was there before (a script's
        // pcntl handler, or the default action), as without the extension. One that
        // the run stopped for, and its echoes, are done with.
        let signal = LAST.load(Ordering::Acquire);
        if SIGNALLED.swap(false, Ordering::AcqRel) && !ACTED.load(Ordering::Acquire) && signal != 0 {
            // SAFETY: sends a signal to this process.
            unsafe { libc::raise(signal) };
        }
    }
}
