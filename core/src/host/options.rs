//! The worker's options, once: name, kind, range, default and doc line of each. The core's
//! `WorkerOptions`, PHP's `DelayQueueWorker` options and Python's `Worker` keywords (and
//! `delayq worker` flags) take their defaults and bounds from here, so they agree by
//! construction; a test checks the PHP stub, the `.pyi` and the docs against it.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::scale::MAX_PROCESSES;
use crate::scripts::MAX_BATCH;
use crate::time::delay_from_secs;
use crate::worker::MAX_TRACE_BYTES;

/// What an option holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A whole number within `min..=max`.
    Count,
    /// Seconds (a number) within `min..=max`.
    Seconds,
    /// True or false.
    Flag,
    /// A callable (a hook).
    Callable,
    /// A list of queues.
    Queues,
    /// A list of exception classes.
    Classes,
}

impl Kind {
    /// The name the docs and errors use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Count => "count",
            Self::Seconds => "seconds",
            Self::Flag => "flag",
            Self::Callable => "callable",
            Self::Queues => "queues",
            Self::Classes => "classes",
        }
    }
}

/// An option's value when it is not given.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Default {
    /// A whole number.
    Count(i64),
    /// Seconds.
    Seconds(f64),
    /// True or false.
    Flag(bool),
    /// Not set: no limit, no hook, an empty list.
    Unset,
}

/// Which bindings take an option (the core's `WorkerOptions` holds the pool's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Takers {
    /// `DelayQueueWorker` takes it.
    pub php: bool,
    /// `delayq.Worker` takes it.
    pub python: bool,
}

const BOTH: Takers = Takers {
    php: true,
    python: true,
};
const PHP: Takers = Takers {
    php: true,
    python: false,
};
const PYTHON: Takers = Takers {
    php: false,
    python: true,
};

/// One row of the table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkerOption {
    /// As both bindings spell it.
    pub name: &'static str,
    /// What it holds.
    pub kind: Kind,
    /// Bounds for counts and seconds (inclusive; seconds may also be excluded at 0, see
    /// `above_zero`).
    pub min: f64,
    /// Upper bound (inclusive).
    pub max: f64,
    /// Seconds that must be above zero (`min` is then 0, excluded).
    pub above_zero: bool,
    /// Its value when not given.
    pub default: Default,
    /// Which bindings take it.
    pub takers: Takers,
    /// One line for the docs.
    pub doc: &'static str,
}

const fn count(
    name: &'static str,
    min: i64,
    max: i64,
    default: Default,
    takers: Takers,
    doc: &'static str,
) -> WorkerOption {
    WorkerOption {
        name,
        kind: Kind::Count,
        min: min as f64,
        max: max as f64,
        above_zero: false,
        default,
        takers,
        doc,
    }
}

const fn seconds(name: &'static str, min: f64, default: Default, takers: Takers, doc: &'static str) -> WorkerOption {
    WorkerOption {
        name,
        kind: Kind::Seconds,
        min,
        max: MAX_SECONDS,
        above_zero: false,
        default,
        takers,
        doc,
    }
}

/// Seconds that must be above zero.
const fn positive_seconds(name: &'static str, default: Default, takers: Takers, doc: &'static str) -> WorkerOption {
    WorkerOption {
        name,
        kind: Kind::Seconds,
        min: 0.0,
        max: MAX_SECONDS,
        above_zero: true,
        default,
        takers,
        doc,
    }
}

const fn other(name: &'static str, kind: Kind, default: Default, takers: Takers, doc: &'static str) -> WorkerOption {
    WorkerOption {
        name,
        kind,
        min: 0.0,
        max: 0.0,
        above_zero: false,
        default,
        takers,
        doc,
    }
}

/// Longest span an option in seconds takes (what a delay takes, `MAX_DELAY`).
const MAX_SECONDS: f64 = crate::time::MAX_DELAY.as_secs() as f64;

/// Every worker option, in the order the docs list them.
pub static WORKER_OPTIONS: [WorkerOption; 24] = [
    count(
        "threads",
        1,
        64,
        Default::Count(2),
        BOTH,
        "native threads per process doing the Redis I/O (claims)",
    ),
    count(
        "processes",
        1,
        MAX_PROCESSES as i64,
        Default::Count(1),
        PHP,
        "handler processes, forked and supervised (Python: `delayq worker --processes`)",
    ),
    count(
        "min_processes",
        1,
        MAX_PROCESSES as i64,
        Default::Unset,
        PHP,
        "with fewer than `processes`, the supervisor scales between the two by the backlog",
    ),
    seconds(
        "scale_cooldown",
        0.0,
        Default::Seconds(3.0),
        PHP,
        "at most one scaling step per this many seconds",
    ),
    count(
        "batch",
        1,
        MAX_BATCH as i64,
        Default::Count(50),
        BOTH,
        "messages claimed per Redis call",
    ),
    count(
        "prefetch",
        0,
        100_000,
        Default::Count(0),
        BOTH,
        "deliveries held ahead of the handlers; 0 sizes it by the handlers' speed",
    ),
    seconds(
        "lease",
        0.1,
        Default::Seconds(30.0),
        BOTH,
        "a claimed message's reservation, renewed while its handler runs",
    ),
    count(
        "max_attempts",
        1,
        u32::MAX as i64,
        Default::Count(5),
        BOTH,
        "deliveries before the dead-letter set (a message's own wins)",
    ),
    seconds(
        "backoff_base",
        0.0,
        Default::Seconds(1.0),
        BOTH,
        "first retry delay; doubles per attempt, with jitter",
    ),
    seconds("backoff_max", 0.0, Default::Seconds(300.0), BOTH, "longest retry delay"),
    positive_seconds(
        "timeout",
        Default::Unset,
        BOTH,
        "longest a handler may run; past it, its process is killed (a coroutine cancelled)",
    ),
    seconds(
        "idle_check",
        0.01,
        Default::Seconds(5.0),
        BOTH,
        "longest an idle pool sleeps before asking Redis again (seed layout: at most 1 s)",
    ),
    other(
        "stop_when_empty",
        Kind::Flag,
        Default::Flag(false),
        BOTH,
        "return once no message is due and none runs",
    ),
    count(
        "max_trace_bytes",
        0,
        MAX_TRACE_BYTES as i64,
        Default::Count(8192),
        BOTH,
        "bytes of a failure's stack trace kept with its error; 0 keeps none",
    ),
    count(
        "concurrency",
        1,
        100_000,
        Default::Count(10),
        PYTHON,
        "async handlers at once per process",
    ),
    count(
        "max_jobs",
        1,
        i64::MAX,
        Default::Unset,
        BOTH,
        "a process's run ends after this many messages",
    ),
    positive_seconds(
        "max_time",
        Default::Unset,
        BOTH,
        "a process's run ends after this many seconds",
    ),
    count(
        "max_memory_mb",
        1,
        1 << 30,
        Default::Unset,
        BOTH,
        "a process's run ends once it uses this much memory",
    ),
    other(
        "on_start",
        Kind::Callable,
        Default::Unset,
        PHP,
        "runs once in each worker process, after the fork",
    ),
    other(
        "on_stop",
        Kind::Callable,
        Default::Unset,
        PHP,
        "runs in each worker process after its pool stopped",
    ),
    other(
        "on_dead",
        Kind::Callable,
        Default::Unset,
        BOTH,
        "runs after a failure sent a message to the dead letters",
    ),
    other(
        "on_failure",
        Kind::Callable,
        Default::Unset,
        BOTH,
        "runs after each exception a handler raised",
    ),
    other(
        "lower_queues",
        Kind::Queues,
        Default::Unset,
        BOTH,
        "queues consumed only when the ones before them have nothing due",
    ),
    other(
        "no_retry",
        Kind::Classes,
        Default::Unset,
        BOTH,
        "exception classes that send a message to the dead letters at once",
    ),
];

/// The row of `name`.
///
/// # Panics
/// When `name` is not in the table: the bindings ask for their own literal names, and a
/// unit test asks for every one of them.
pub fn worker_option(name: &str) -> &'static WorkerOption {
    WORKER_OPTIONS
        .iter()
        .find(|o| o.name == name)
        .unwrap_or_else(|| panic!("no worker option {name:?} in the table"))
}

impl WorkerOption {
    /// The default of a count.
    pub fn default_count(&self) -> Option<i64> {
        match self.default {
            Default::Count(n) => Some(n),
            _ => None,
        }
    }

    /// The default of a span.
    pub fn default_duration(&self) -> Option<Duration> {
        match self.default {
            Default::Seconds(s) => Some(Duration::from_secs_f64(s)),
            _ => None,
        }
    }

    /// Lower and upper bound of a count.
    pub fn count_range(&self) -> (i64, i64) {
        (self.min as i64, self.max as i64)
    }

    /// `value` if within the bounds, or an error naming the option and its range.
    pub fn check_count(&self, value: i64) -> Result<i64> {
        let (lo, hi) = self.count_range();
        if value < lo || value > hi {
            return Err(Error::invalid(
                self.name,
                format!("must be between {lo} and {hi}, got {value}"),
            ));
        }
        Ok(value)
    }

    /// `secs` as a span if within the bounds, or an error naming the option and its range.
    pub fn check_seconds(&self, secs: f64) -> Result<Duration> {
        let span = delay_from_secs(self.name, secs)?;
        if self.above_zero && span.is_zero() {
            return Err(Error::invalid(
                self.name,
                format!("must be above 0 seconds, got {secs}"),
            ));
        }
        if !self.above_zero && secs < self.min {
            return Err(Error::invalid(
                self.name,
                format!("must be at least {} s, got {secs}", self.min),
            ));
        }
        Ok(span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WorkerOptions;

    #[test]
    fn names_are_unique_and_kinds_have_fitting_defaults() {
        for (i, o) in WORKER_OPTIONS.iter().enumerate() {
            assert!(WORKER_OPTIONS[..i].iter().all(|p| p.name != o.name), "{} twice", o.name);
            assert!(o.takers.php || o.takers.python, "{} is taken by nobody", o.name);
            match (o.kind, o.default) {
                (Kind::Count, Default::Count(n)) => assert!(o.check_count(n).is_ok(), "{}", o.name),
                (Kind::Seconds, Default::Seconds(s)) => assert!(o.check_seconds(s).is_ok(), "{}", o.name),
                (Kind::Flag, Default::Flag(_)) | (_, Default::Unset) => {}
                (kind, default) => panic!("{}: a {kind:?} with default {default:?}", o.name),
            }
        }
    }

    #[test]
    fn the_core_defaults_are_the_table() {
        let w = WorkerOptions::default();
        let count = |name| worker_option(name).default_count().expect("a count");
        let span = |name| worker_option(name).default_duration().expect("seconds");
        assert_eq!(w.threads as i64, count("threads"));
        assert_eq!(w.batch as i64, count("batch"));
        assert_eq!(w.prefetch as i64, count("prefetch"));
        assert_eq!(i64::from(w.max_attempts), count("max_attempts"));
        assert_eq!(w.max_trace_bytes as i64, count("max_trace_bytes"));
        assert_eq!(w.lease, span("lease"));
        assert_eq!(w.backoff_base, span("backoff_base"));
        assert_eq!(w.backoff_max, span("backoff_max"));
        assert_eq!(w.idle_check, span("idle_check"));
        assert_eq!(w.timeout, None);
        assert_eq!(worker_option("timeout").default, Default::Unset);
        assert!(!w.stop_when_empty);
    }

    #[test]
    fn bounds_are_checked_by_name() {
        let threads = worker_option("threads");
        assert_eq!(threads.check_count(64).ok(), Some(64));
        let e = threads.check_count(65).expect_err("above the range").to_string();
        assert!(
            e.contains("threads") && e.contains("between 1 and 64") && e.contains("65"),
            "{e}"
        );
        let max_time = worker_option("max_time");
        let e = max_time.check_seconds(0.0).expect_err("zero").to_string();
        assert!(e.contains("max_time") && e.contains("above 0"), "{e}");
        let lease = worker_option("lease");
        assert!(lease.check_seconds(0.05).is_err());
        assert_eq!(lease.check_seconds(0.1).ok(), Some(Duration::from_millis(100)));
        assert!(worker_option("idle_check").check_seconds(f64::NAN).is_err());
    }

    #[test]
    #[should_panic(expected = "no worker option")]
    fn an_unknown_name_is_a_bug_of_ours() {
        worker_option("thread");
    }
}
