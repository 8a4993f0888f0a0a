//! The handler-run policy, the same for every binding: what a handler call comes to
//! (`Outcome`, as the binding saw it), what that does to its message (`settle`: the
//! message's own decision beats a return or an exception, `no_retry` buries, `exit`
//! counts an attempt and stops the pool), and when a process's run ends (`Recycle`:
//! `max_jobs`, `max_time`, `max_memory_mb`, restart requests, an empty queue).
//!
//! The bindings keep only what is theirs: calling the handler on their thread, telling
//! an exception's class and text, and running the hooks that `after_settle` names, in
//! its order.

use std::time::{Duration, Instant};

use super::StopReason;
use crate::worker::{Consumer, Delivery, Fate, Retry, Stopper};

/// What a handler call came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It returned.
    Returned,
    /// It returned something whose body never ran (a PHP `Generator`, an awaitable
    /// nobody awaited): failing it is the only way not to lose that work.
    NotRun(String),
    /// It raised (threw) `error`, with its stack `trace`; `no_retry` when its class is
    /// one of the worker's `no_retry` ones.
    Raised {
        /// One line: the exception's class and message.
        error: String,
        /// Its stack trace ("" when none).
        trace: String,
        /// Its class is one of the worker's `no_retry` ones.
        no_retry: bool,
    },
    /// It ended its process (`exit()`, `sys.exit()`): `error` says so.
    Exited(String),
    /// Its process is being torn down under it (a PHP Fiber destroyed while suspended,
    /// Ctrl-C in Python): nothing decided the message and no code may run.
    Abandoned,
}

/// What `settle` did to the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Acknowledged.
    Ack,
    /// Failed with `error` (and `trace`), going on as `retry` says.
    Fail {
        /// The error kept with the message.
        error: String,
        /// The stack trace kept beside it.
        trace: String,
        /// How it goes on.
        retry: Retry,
    },
    /// Given back uncounted.
    Release,
}

impl Verdict {
    /// The verdict for `outcome`, given the message's own decision if the handler made
    /// one (`retry_later`, `dead_letter`). The decision wins over a return or an
    /// exception, not over an exit or a teardown (the process is going away) nor over a
    /// body that never ran.
    pub fn of(outcome: Outcome, decision: Option<(Retry, String)>) -> Self {
        match (outcome, decision) {
            (Outcome::Exited(error), _) => Self::Fail {
                error,
                trace: String::new(),
                retry: Retry::After(Duration::ZERO),
            },
            (Outcome::Abandoned, _) => Self::Release,
            (Outcome::NotRun(error), _) => Self::Fail {
                error,
                trace: String::new(),
                retry: Retry::Backoff,
            },
            (Outcome::Returned, None) => Self::Ack,
            (Outcome::Returned, Some((retry, error))) => Self::Fail {
                error,
                trace: String::new(),
                retry,
            },
            (Outcome::Raised { trace, .. }, Some((retry, error))) => Self::Fail { error, trace, retry },
            (Outcome::Raised { error, trace, no_retry }, None) => Self::Fail {
                error,
                trace,
                retry: if no_retry { Retry::Never } else { Retry::Backoff },
            },
        }
    }
}

/// Complete `delivery` as `outcome` and the message's `decision` say, and return its
/// fate (`None` when acknowledged or released) and the stop the outcome asks for
/// (`Exit` after an exit, `Stop` after a teardown).
pub fn settle(
    consumer: &Consumer,
    delivery: Delivery,
    outcome: Outcome,
    decision: Option<(Retry, String)>,
) -> (Option<Fate>, Option<StopReason>) {
    let stop = match outcome {
        Outcome::Exited(_) => Some(StopReason::Exit),
        Outcome::Abandoned => Some(StopReason::Stop),
        _ => None,
    };
    let fate = match Verdict::of(outcome, decision) {
        Verdict::Ack => {
            consumer.ack(delivery);
            None
        }
        Verdict::Release => {
            consumer.release(delivery);
            None
        }
        Verdict::Fail { error, trace, retry } => Some(consumer.fail_traced(delivery, &error, &trace, retry)),
    };
    if stop.is_some() {
        consumer.stop();
    }
    (fate, stop)
}

/// What follows a settled delivery, in the run policy's order: a stop ends the run
/// before any hook (an exit goes on once the run returns, a teardown as it unwinds);
/// otherwise `on_failure` when the handler raised, then `on_dead` when the message went
/// to the dead letters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterSettle {
    /// The run ends now, for this reason; no hook runs.
    Stop(StopReason),
    /// The run goes on, after these hooks.
    Hooks {
        /// Call `on_failure` with what the handler raised.
        on_failure: bool,
        /// Call `on_dead` with this last error.
        on_dead: Option<String>,
    },
}

/// What follows `settle`'s `fate` and `stop` for a handler that `raised` or not.
pub fn after_settle(fate: Option<Fate>, stop: Option<StopReason>, raised: bool) -> AfterSettle {
    match stop {
        Some(why) => AfterSettle::Stop(why),
        None => AfterSettle::Hooks {
            on_failure: raised,
            on_dead: match fate {
                Some(Fate::Dead(error)) => Some(error),
                _ => None,
            },
        },
    }
}

/// When a process's run ends by its own limits (`max_jobs`, `max_time`,
/// `max_memory_mb`); the supervisor then starts a fresh process in its place.
#[derive(Debug, Clone)]
pub struct Recycle {
    max_jobs: Option<u64>,
    max_time: Option<Duration>,
    max_memory_bytes: Option<i64>,
    started: Instant,
    jobs: u64,
}

impl Recycle {
    /// Limits counted from now.
    pub fn new(max_jobs: Option<u64>, max_time: Option<Duration>, max_memory_bytes: Option<i64>) -> Self {
        Self {
            max_jobs,
            max_time,
            max_memory_bytes,
            started: Instant::now(),
            jobs: 0,
        }
    }

    /// Before taking the next message: `MaxTime` once the run is that old.
    pub fn before_next(&self) -> Option<StopReason> {
        self.max_time
            .is_some_and(|t| self.started.elapsed() >= t)
            .then_some(StopReason::MaxTime)
    }

    /// After each handled message: `MaxJobs` at the limit, else `MaxMemory` once the
    /// process uses that much (`memory_bytes` is asked only when that limit is set).
    pub fn after_job(&mut self, memory_bytes: impl FnOnce() -> i64) -> Option<StopReason> {
        self.jobs += 1;
        if self.max_jobs.is_some_and(|m| self.jobs >= m) {
            return Some(StopReason::MaxJobs);
        }
        self.max_memory_bytes
            .is_some_and(|m| memory_bytes() >= m)
            .then_some(StopReason::MaxMemory)
    }

    /// Messages handled so far.
    pub fn jobs(&self) -> u64 {
        self.jobs
    }
}

/// Why a run ended: the first reason the binding knew of (`asked`: a signal, a limit,
/// an exit), else a restart request or an empty queue (`stop_when_empty`), which the
/// pool's own threads act on, else a plain stop. A claim under way at a stop may still
/// note a restart: it does not change a reason already given.
pub fn ended_by(stopper: &Stopper, asked: Option<StopReason>) -> Option<StopReason> {
    if asked.is_some_and(|why| why != StopReason::Stop) {
        asked
    } else if stopper.restart_requested() {
        Some(StopReason::Restart)
    } else if stopper.found_empty() {
        Some(StopReason::Empty)
    } else {
        asked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raised(no_retry: bool) -> Outcome {
        Outcome::Raised {
            error: "RuntimeException: boom".into(),
            trace: "#0 {main}".into(),
            no_retry,
        }
    }

    #[test]
    fn a_stop_runs_no_hook_and_the_hooks_follow_the_fate() {
        let dead = Some(Fate::Dead("boom".into()));
        assert_eq!(
            after_settle(dead.clone(), Some(StopReason::Exit), true),
            AfterSettle::Stop(StopReason::Exit)
        );
        assert_eq!(
            after_settle(dead, None, true),
            AfterSettle::Hooks {
                on_failure: true,
                on_dead: Some("boom".into())
            }
        );
        assert_eq!(
            after_settle(Some(Fate::Retry(Duration::from_secs(1))), None, true),
            AfterSettle::Hooks {
                on_failure: true,
                on_dead: None
            }
        );
        // A message's own decision can bury it without an exception.
        assert_eq!(
            after_settle(Some(Fate::Dead("gave up".into())), None, false),
            AfterSettle::Hooks {
                on_failure: false,
                on_dead: Some("gave up".into())
            }
        );
        assert_eq!(
            after_settle(None, None, false),
            AfterSettle::Hooks {
                on_failure: false,
                on_dead: None
            }
        );
    }

    #[test]
    fn a_return_acks_and_an_exception_retries_or_buries() {
        assert_eq!(Verdict::of(Outcome::Returned, None), Verdict::Ack);
        let fail = |retry| Verdict::Fail {
            error: "RuntimeException: boom".into(),
            trace: "#0 {main}".into(),
            retry,
        };
        assert_eq!(Verdict::of(raised(false), None), fail(Retry::Backoff));
        assert_eq!(Verdict::of(raised(true), None), fail(Retry::Never));
    }

    #[test]
    fn the_messages_own_decision_wins_over_a_return_or_an_exception() {
        let later = Some((Retry::After(Duration::from_secs(60)), "rate limited".to_owned()));
        assert_eq!(
            Verdict::of(Outcome::Returned, later.clone()),
            Verdict::Fail {
                error: "rate limited".into(),
                trace: String::new(),
                retry: Retry::After(Duration::from_secs(60)),
            }
        );
        // The exception's trace stays beside the decision's reason.
        assert_eq!(
            Verdict::of(raised(true), later),
            Verdict::Fail {
                error: "rate limited".into(),
                trace: "#0 {main}".into(),
                retry: Retry::After(Duration::from_secs(60)),
            }
        );
    }

    #[test]
    fn an_exit_counts_an_attempt_due_at_once_and_a_teardown_releases() {
        let dead = Some((Retry::Never, "decided".to_owned()));
        assert_eq!(
            Verdict::of(Outcome::Exited("exit(3) in the handler".into()), dead.clone()),
            Verdict::Fail {
                error: "exit(3) in the handler".into(),
                trace: String::new(),
                retry: Retry::After(Duration::ZERO),
            }
        );
        assert_eq!(Verdict::of(Outcome::Abandoned, dead.clone()), Verdict::Release);
        assert_eq!(
            Verdict::of(Outcome::NotRun("a Generator".into()), dead),
            Verdict::Fail {
                error: "a Generator".into(),
                trace: String::new(),
                retry: Retry::Backoff,
            }
        );
    }

    #[test]
    fn recycle_limits_end_a_run_in_order() {
        let mut r = Recycle::new(Some(2), None, Some(100));
        assert_eq!(r.before_next(), None);
        assert_eq!(r.after_job(|| 10), None);
        assert_eq!(r.after_job(|| 1000), Some(StopReason::MaxJobs));
        let mut r = Recycle::new(None, Some(Duration::ZERO), Some(100));
        assert_eq!(r.before_next(), Some(StopReason::MaxTime));
        assert_eq!(r.after_job(|| 100), Some(StopReason::MaxMemory));
        let mut unlimited = Recycle::new(None, Some(Duration::from_secs(3600)), None);
        assert_eq!(unlimited.before_next(), None);
        assert_eq!(
            unlimited.after_job(|| panic!("memory is not asked without a limit")),
            None
        );
        assert_eq!(unlimited.jobs(), 1);
    }
}
