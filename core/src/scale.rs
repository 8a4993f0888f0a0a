//! Auto-balancing of supervised worker processes, as Laravel Horizon's `balance =>
//! 'auto'` does it: between a minimum and a maximum number of processes, one more while
//! messages wait for a free handler, one fewer while some stand idle, at most one change
//! per cooldown so a burst does not make the pool thrash. The bindings' supervisors
//! start and stop the processes; the decision is made here, the same in every language.

use std::time::{Duration, Instant};

use crate::conn::Replay;
use crate::error::{Error, Result};
use crate::queue::Queue;

/// Most processes one supervisor may run.
pub const MAX_PROCESSES: usize = 256;

/// What the supervisor sees at one look: its processes and the queues' backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Load {
    /// Processes running now (started and not yet ended).
    pub running: usize,
    /// Of those, the ones inside a handler call.
    pub busy: usize,
    /// Messages due and not yet claimed, summed over the worker's queues.
    pub ready: u64,
}

/// Decides how many worker processes a supervisor runs.
#[derive(Debug, Clone)]
pub struct Scaler {
    min: usize,
    max: usize,
    cooldown: Duration,
    last_change: Option<Instant>,
    /// After a failed look, none until then (see [`look`](Self::look)).
    quiet_until: Option<Instant>,
    quiet: Duration,
}

/// The first pause in reading the backlog after a failed look; it doubles with each
/// failure in a row up to [`MAX_QUIET`].
const FIRST_QUIET: Duration = Duration::from_secs(2);
const MAX_QUIET: Duration = Duration::from_secs(30);

impl Scaler {
    /// Between `min` (at least 1) and `max` (at most [`MAX_PROCESSES`]) processes; at
    /// most one change per `cooldown`.
    pub fn new(min: usize, max: usize, cooldown: Duration) -> Result<Self> {
        if min == 0 || min > max {
            return Err(Error::invalid(
                "min_processes",
                format!("must be between 1 and the number of processes ({max}), got {min}"),
            ));
        }
        if max > MAX_PROCESSES {
            return Err(Error::invalid(
                "processes",
                format!("must be at most {MAX_PROCESSES}, got {max}"),
            ));
        }
        if cooldown < Duration::from_millis(100) {
            return Err(Error::invalid(
                "scale_cooldown",
                format!("must be at least 0.1 s, got {:.3} s", cooldown.as_secs_f64()),
            ));
        }
        Ok(Self {
            min,
            max,
            cooldown,
            last_change: None,
            quiet_until: None,
            quiet: Duration::ZERO,
        })
    }

    /// Processes to start with.
    pub fn initial(&self) -> usize {
        self.min
    }

    /// Processes kept at least (`min_processes`).
    pub fn min(&self) -> usize {
        self.min
    }

    /// Processes run at most (`processes`).
    pub fn max(&self) -> usize {
        self.max
    }

    /// Whether the number of processes can change at all (`min` < `max`).
    pub fn is_auto(&self) -> bool {
        self.min < self.max
    }

    /// How many processes should run after this look at `load` at `now`. A waiting
    /// message means every running handler is taken (an idle one would have claimed
    /// it), so the pool grows; with nothing waiting it shrinks towards the processes
    /// that are busy, never below `min`. A process that stops finishes its handler
    /// first, so the supervisor stops idle ones.
    pub fn target(&mut self, now: Instant, load: Load) -> usize {
        let running = load.running.clamp(self.min, self.max);
        if load.running != running {
            // Below min (a process just died, or the start) or above max: no cooldown.
            return running;
        }
        let wanted = if load.ready > 0 {
            self.max
        } else {
            load.busy.clamp(self.min, self.max)
        };
        if wanted == running || self.last_change.is_some_and(|t| now.duration_since(t) < self.cooldown) {
            return running;
        }
        self.last_change = Some(now);
        if wanted > running { running + 1 } else { running - 1 }
    }

    /// [`target`](Self::target) for `running` processes of which `busy` are in a
    /// handler, reading the backlog of `queues` now (one `stats` call each, so call it
    /// every second or so, not in a tight loop). While Redis cannot be read the pool
    /// keeps its size: the processes' own reconnects are what matters then.
    ///
    /// The caller is a supervisor with other duties (reaping, killing hung handlers,
    /// passing signals on), so a look never waits out a Redis that is down: each read
    /// is tried once, and after a failure the next looks keep the size without reading
    /// for 2 s, doubling with each failure in a row up to 30 s. A Redis that hangs
    /// costs one read timeout per such pause instead of every look.
    pub fn look<'a>(&mut self, queues: impl IntoIterator<Item = &'a Queue>, running: usize, busy: usize) -> usize {
        let unchanged = running.clamp(self.min, self.max);
        if self.quiet_until.is_some_and(|t| Instant::now() < t) {
            return unchanged;
        }
        let mut ready = 0u64;
        for q in queues {
            match q.stats_with(Replay::Once) {
                Ok(s) => ready += s.ready,
                Err(e) => {
                    self.quiet = (self.quiet * 2).clamp(FIRST_QUIET, MAX_QUIET);
                    self.quiet_until = Some(Instant::now() + self.quiet);
                    log::debug!(
                        "delayq[{}]: cannot read the backlog to balance processes ({e}); next look in {:?}",
                        q.name(),
                        self.quiet
                    );
                    return unchanged;
                }
            }
        }
        self.quiet = Duration::ZERO;
        self.quiet_until = None;
        self.target(Instant::now(), Load { running, busy, ready })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    #[test]
    fn a_backlog_grows_the_pool_one_process_per_cooldown_up_to_max() {
        let mut s = Scaler::new(1, 3, Duration::from_secs(3)).expect("valid");
        let t0 = Instant::now();
        let busy = |running| Load {
            running,
            busy: running,
            ready: 500,
        };
        assert_eq!(s.initial(), 1);
        assert_eq!(s.target(t0, busy(1)), 2);
        assert_eq!(s.target(at(t0, 1000), busy(2)), 2, "within the cooldown");
        assert_eq!(s.target(at(t0, 3000), busy(2)), 3);
        assert_eq!(s.target(at(t0, 9000), busy(3)), 3, "at max");
    }

    #[test]
    fn idle_processes_are_let_go_down_to_min_but_busy_ones_stay() {
        let mut s = Scaler::new(2, 6, Duration::from_secs(1)).expect("valid");
        let t0 = Instant::now();
        let load = |running, busy| Load {
            running,
            busy,
            ready: 0,
        };
        assert_eq!(s.target(t0, load(6, 4)), 5);
        assert_eq!(s.target(at(t0, 500), load(5, 4)), 5, "within the cooldown");
        assert_eq!(s.target(at(t0, 1000), load(5, 4)), 4);
        assert_eq!(s.target(at(t0, 2000), load(4, 4)), 4, "all four are busy");
        assert_eq!(s.target(at(t0, 3000), load(4, 0)), 3);
        assert_eq!(s.target(at(t0, 4000), load(3, 0)), 2);
        assert_eq!(s.target(at(t0, 5000), load(2, 0)), 2, "at min");
    }

    #[test]
    fn outside_the_bounds_the_pool_is_brought_back_at_once() {
        let mut s = Scaler::new(2, 4, Duration::from_secs(60)).expect("valid");
        let t0 = Instant::now();
        assert_eq!(
            s.target(
                t0,
                Load {
                    running: 0,
                    busy: 0,
                    ready: 0
                }
            ),
            2
        );
        assert_eq!(
            s.target(
                t0,
                Load {
                    running: 1,
                    busy: 1,
                    ready: 9
                }
            ),
            2
        );
        assert_eq!(
            s.target(
                t0,
                Load {
                    running: 2,
                    busy: 2,
                    ready: 9
                }
            ),
            3
        );
        assert_eq!(
            s.target(
                t0,
                Load {
                    running: 5,
                    busy: 5,
                    ready: 9
                }
            ),
            4
        );
    }

    #[test]
    fn fixed_pools_never_change_and_bad_bounds_are_named() {
        let mut s = Scaler::new(3, 3, Duration::from_secs(1)).expect("valid");
        assert!(!s.is_auto());
        assert_eq!(
            s.target(
                Instant::now(),
                Load {
                    running: 3,
                    busy: 0,
                    ready: 99
                }
            ),
            3
        );
        for (min, max, cooldown, named) in [
            (0, 3, 1000, "min_processes"),
            (4, 3, 1000, "min_processes"),
            (1, MAX_PROCESSES + 1, 1000, "processes"),
            (1, 3, 10, "scale_cooldown"),
        ] {
            let err = Scaler::new(min, max, Duration::from_millis(cooldown)).expect_err("refused");
            assert!(err.to_string().contains(named), "{err}");
        }
    }
}
