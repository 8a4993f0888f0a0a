//! The stop signals of a supervisor: the first stops gracefully, a second one, at
//! least [`URGENT_AFTER`] later, stops at once.

use std::time::{Duration, Instant};

/// A stop signal this long after the first stops at once; closer ones are one stop
/// arriving twice (a terminal's Ctrl+C reaches every process of its group).
pub const URGENT_AFTER: Duration = Duration::from_millis(500);

/// In a worker process: SIGTERM (a graceful stop) once its supervisor `parent` is gone,
/// even if it was SIGKILLed, so that no orphaned process goes on consuming
/// unsupervised (Linux; elsewhere an orphan runs on until stopped).
pub fn stop_with_supervisor(parent: libc::pid_t) {
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscalls on this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
        // It died before prctl took effect.
        if libc::getppid() != parent {
            libc::raise(libc::SIGTERM);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = parent;
}

/// The stop signals a supervisor got: the first stops gracefully, one at least
/// [`URGENT_AFTER`] later stops at once (for a binding whose signal handler runs in
/// its own language, Python's; PHP's runs in signal context and keeps its own atomics).
#[derive(Debug, Clone, Default)]
pub struct StopSignals {
    first: Option<Instant>,
    urgent: bool,
}

impl StopSignals {
    /// A signal came at `now`; returns true if it made the stop urgent just now.
    pub fn received(&mut self, now: Instant) -> bool {
        match self.first {
            None => {
                self.first = Some(now);
                false
            }
            Some(first) if !self.urgent && now.saturating_duration_since(first) >= URGENT_AFTER => {
                self.urgent = true;
                true
            }
            Some(_) => false,
        }
    }

    /// Whether a signal came.
    pub fn stopping(&self) -> bool {
        self.first.is_some()
    }

    /// Whether a second signal came.
    pub fn urgent(&self) -> bool {
        self.urgent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_signal_is_urgent_only_after_a_pause() {
        let t0 = Instant::now();
        let mut s = StopSignals::default();
        assert!(!s.received(t0));
        assert!(!s.received(t0 + Duration::from_millis(100)), "the same stop, twice");
        assert!(!s.urgent());
        assert!(s.received(t0 + URGENT_AFTER));
        assert!(!s.received(t0 + URGENT_AFTER * 3), "urgent once");
        assert!(s.stopping() && s.urgent());
    }
}
