//! The hung-handler clock of a supervisor, on a monotonic clock, and the errors a
//! message gets when its handler ran past its `timeout`.

use std::time::{Duration, Instant};

/// How long a coroutine handler cancelled at its timeout may take to end (cleaning up
/// after its cancellation) before its delivery fails all the same.
pub const CANCEL_GRACE: Duration = Duration::from_secs(1);

/// Time past the timeout a supervisor allows a process whose handlers are coroutines:
/// their own event loop cancels them first (and gives them `CANCEL_GRACE`), so only a
/// loop that a handler blocks keeps one running past this.
pub const COROUTINE_GRACE: Duration = Duration::from_secs(2);

/// How long one process's handler has run, on the supervisor's monotonic clock: a busy
/// period is timed from the first look that saw it, so a clock step changes nothing
/// and no process's clock needs to be trusted (a look comes at most a turn late, which
/// only delays a kill).
#[derive(Debug, Clone, Default)]
pub struct HungClock {
    seen: Option<(u64, Instant)>,
}

impl HungClock {
    /// Look at a slot at `now`; returns how long its handler has run, None if idle.
    pub fn observe(&mut self, starts: u64, busy: bool, now: Instant) -> Option<Duration> {
        if !busy {
            self.seen = None;
            return None;
        }
        match self.seen {
            Some((seen, since)) if seen == starts => Some(now.saturating_duration_since(since)),
            _ => {
                self.seen = Some((starts, now));
                Some(Duration::ZERO)
            }
        }
    }

    /// Whether a handler that ran `ran` with `grace` is past `timeout`.
    pub fn is_hung(ran: Duration, timeout: Duration, grace: Duration) -> bool {
        ran > timeout + grace
    }
}

/// The seconds of `d` as people write them: "2", "0.5".
pub(super) fn secs(d: Duration) -> String {
    format!("{}", d.as_secs_f64())
}

/// The error a message gets when its handler's process was killed at the timeout.
pub fn timeout_error(timeout: Duration) -> String {
    format!("handler exceeded its {} s timeout; process killed", secs(timeout))
}

/// The error a message gets when its coroutine handler was cancelled at the timeout.
pub fn cancel_error(timeout: Duration) -> String {
    format!("handler exceeded its {} s timeout; coroutine cancelled", secs(timeout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hung_clock_times_each_busy_period_from_when_it_was_first_seen() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut clock = HungClock::default();
        assert_eq!(clock.observe(0, false, at(0)), None);
        assert_eq!(clock.observe(1, true, at(100)), Some(Duration::ZERO));
        assert_eq!(clock.observe(1, true, at(600)), Some(Duration::from_millis(500)));
        // Another handler started between two looks: a new period, timed afresh.
        assert_eq!(clock.observe(3, true, at(700)), Some(Duration::ZERO));
        assert_eq!(clock.observe(3, false, at(800)), None);
        assert_eq!(clock.observe(3, true, at(900)), Some(Duration::ZERO), "idle in between");
        let t = Duration::from_secs(2);
        assert!(!HungClock::is_hung(Duration::from_secs(2), t, Duration::ZERO));
        assert!(HungClock::is_hung(Duration::from_millis(2001), t, Duration::ZERO));
        assert!(
            !HungClock::is_hung(Duration::from_millis(2001), t, Duration::from_secs(1)),
            "grace"
        );
    }

    #[test]
    fn the_timeout_error_names_the_configured_seconds() {
        assert_eq!(
            timeout_error(Duration::from_secs(2)),
            "handler exceeded its 2 s timeout; process killed"
        );
        assert_eq!(
            timeout_error(Duration::from_millis(500)),
            "handler exceeded its 0.5 s timeout; process killed"
        );
        assert_eq!(
            cancel_error(Duration::from_millis(200)),
            "handler exceeded its 0.2 s timeout; coroutine cancelled"
        );
    }
}
