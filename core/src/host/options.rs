//! The worker's options, once: name, kind, range, default and doc line of each. The core's
//! `WorkerOptions`, PHP's `DelayQueueWorker` options and Python's `Worker` keywords (and
//! `delayq worker` flags) take their defaults and bounds from here, so they agree by
//! construction; a test checks the PHP stub, the `.pyi` and the docs against it.

use std::time::Duration;

use super::run::Recycle;
use super::supervisor::is_supervised;
use crate::error::{Error, Result};
use crate::options::{
    BOTH, Default, Kind, OptionRow, PHP, PYTHON, Value, count, find, other, positive_seconds, seconds,
};
use crate::scale::{MAX_PROCESSES, Scaler};
use crate::scripts::MAX_BATCH;
use crate::worker::MAX_TRACE_BYTES;
use crate::worker::WorkerOptions;
use crate::{DEFAULT_MAX_PAYLOAD_BYTES, MAX_PAYLOAD_BYTES};

/// Every worker option, in the order the docs list them.
pub static WORKER_OPTIONS: [OptionRow; 25] = [
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
        "max_payload_bytes",
        1,
        MAX_PAYLOAD_BYTES as i64,
        Default::Count(DEFAULT_MAX_PAYLOAD_BYTES as i64),
        BOTH,
        "largest payload handed to a handler; a larger one is dead-lettered unread",
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

/// The row of `name` in `WORKER_OPTIONS`.
///
/// # Panics
/// When `name` is not in it (see `options::find`).
pub fn worker_option(name: &str) -> &'static OptionRow {
    find(&WORKER_OPTIONS, name)
}

/// The worker options a binding read, by name, each checked against its row of
/// `WORKER_OPTIONS`; options not given keep the table's defaults. What only a binding
/// can hold (the hooks, `lower_queues`, `no_retry`) it keeps itself.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// The pool's own options.
    pub pool: WorkerOptions,
    /// A process's run ends after this many messages (see `recycle`).
    pub max_jobs: Option<u64>,
    /// A process's run ends after this long.
    pub max_time: Option<Duration>,
    /// A process's run ends once it uses this many MiB.
    pub max_memory_mb: Option<u64>,
    /// Handler processes at most.
    pub processes: usize,
    /// How many of them run, by the backlog (`min_processes`, `scale_cooldown`).
    pub scaler: Scaler,
    /// Coroutine handlers at once per process.
    pub concurrency: usize,
}

impl WorkerSettings {
    /// Settings from values by name, as a binding read them. An error names the option.
    pub fn from_values<'a>(values: impl IntoIterator<Item = (&'a str, Value)>) -> Result<Self> {
        let count_default = |name| worker_option(name).default_count().unwrap_or(1) as usize;
        let mut pool = WorkerOptions::default();
        let (mut max_jobs, mut max_time, mut max_memory_mb) = (None, None, None);
        let mut processes = count_default("processes");
        let mut min_processes = None;
        let mut scale_cooldown = worker_option("scale_cooldown").default_duration().unwrap_or_default();
        let mut concurrency = count_default("concurrency");
        for (name, value) in values {
            let Some(row) = WORKER_OPTIONS.iter().find(|r| r.name == name && r.kind.is_value()) else {
                return Err(Error::invalid(
                    name,
                    "is not a worker option its binding hands to the core",
                ));
            };
            let size = |n: i64| row.check_count(n).map(|n| n as usize);
            match (name, value) {
                ("threads", Value::Count(n)) => pool.threads = size(n)?,
                ("processes", Value::Count(n)) => processes = size(n)?,
                ("min_processes", Value::Count(n)) => min_processes = Some(size(n)?),
                ("scale_cooldown", Value::Seconds(s)) => scale_cooldown = row.check_seconds(s)?,
                ("batch", Value::Count(n)) => pool.batch = size(n)?,
                ("prefetch", Value::Count(n)) => pool.prefetch = size(n)?,
                ("lease", Value::Seconds(s)) => pool.lease = row.check_seconds(s)?,
                ("max_attempts", Value::Count(n)) => pool.max_attempts = size(n)? as u32,
                ("backoff_base", Value::Seconds(s)) => pool.backoff_base = row.check_seconds(s)?,
                ("backoff_max", Value::Seconds(s)) => pool.backoff_max = row.check_seconds(s)?,
                ("timeout", Value::Seconds(s)) => pool.timeout = Some(row.check_seconds(s)?),
                ("idle_check", Value::Seconds(s)) => pool.idle_check = row.check_seconds(s)?,
                ("stop_when_empty", Value::Flag(b)) => pool.stop_when_empty = b,
                ("max_trace_bytes", Value::Count(n)) => pool.max_trace_bytes = size(n)?,
                ("max_payload_bytes", Value::Count(n)) => pool.max_payload_bytes = size(n)?,
                ("concurrency", Value::Count(n)) => concurrency = size(n)?,
                ("max_jobs", Value::Count(n)) => max_jobs = Some(row.check_count(n)? as u64),
                ("max_time", Value::Seconds(s)) => max_time = Some(row.check_seconds(s)?),
                ("max_memory_mb", Value::Count(n)) => max_memory_mb = Some(row.check_count(n)? as u64),
                (_, value) => return Err(row.wrong_kind(&value)),
            }
        }
        let scaler = Scaler::new(min_processes.unwrap_or(processes), processes, scale_cooldown)?;
        Ok(Self {
            pool,
            max_jobs,
            max_time,
            max_memory_mb,
            processes,
            scaler,
            concurrency,
        })
    }

    /// A process's recycle limits, counted from now.
    pub fn recycle(&self) -> Recycle {
        let bytes = self.max_memory_mb.map(|mb| i64::try_from(mb << 20).unwrap_or(i64::MAX));
        Recycle::new(self.max_jobs, self.max_time, bytes)
    }

    /// Whether the handlers run in supervised processes (see `is_supervised`).
    pub fn is_supervised(&self) -> bool {
        is_supervised(self.processes, self.pool.timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WorkerOptions;

    #[test]
    fn names_are_unique_and_kinds_have_fitting_defaults() {
        crate::options::check_table(&WORKER_OPTIONS);
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
        assert_eq!(w.max_payload_bytes, crate::DEFAULT_MAX_PAYLOAD_BYTES);
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
        let e = worker_option("threads")
            .check_count(65)
            .expect_err("above the range")
            .to_string();
        assert!(e.contains("threads") && e.contains("between 1 and 64"), "{e}");
        assert!(worker_option("max_time").check_seconds(0.0).is_err());
        assert!(worker_option("lease").check_seconds(0.05).is_err());
        assert!(worker_option("idle_check").check_seconds(f64::NAN).is_err());
    }

    #[test]
    fn settings_come_from_values_by_name_with_the_table_for_the_rest() {
        let s = WorkerSettings::from_values([
            ("threads", Value::Count(3)),
            ("timeout", Value::Seconds(2.5)),
            ("stop_when_empty", Value::Flag(true)),
            ("max_memory_mb", Value::Count(64)),
            ("processes", Value::Count(4)),
        ])
        .expect("settings");
        assert_eq!((s.pool.threads, s.pool.timeout), (3, Some(Duration::from_millis(2500))));
        assert!(s.pool.stop_when_empty && s.is_supervised());
        assert_eq!((s.processes, s.max_memory_mb, s.max_jobs), (4, Some(64), None));
        assert_eq!(s.pool.batch, WorkerOptions::default().batch);
        assert_eq!(
            s.concurrency as i64,
            worker_option("concurrency").default_count().expect("count")
        );
        let plain = WorkerSettings::from_values([]).expect("defaults");
        assert!(!plain.is_supervised());
        assert_eq!(plain.processes, 1);
        let refused =
            |values: Vec<(&str, Value)>| WorkerSettings::from_values(values).expect_err("refused").to_string();
        assert!(refused(vec![("threads", Value::Count(0))]).contains("threads"));
        assert!(refused(vec![("lease", Value::Count(3))]).contains("lease"));
        assert!(refused(vec![("on_start", Value::Flag(true))]).contains("on_start"));
        assert!(
            refused(vec![("processes", Value::Count(2)), ("min_processes", Value::Count(3))]).contains("min_processes")
        );
    }

    #[test]
    #[should_panic(expected = "no option")]
    fn an_unknown_name_is_a_bug_of_ours() {
        worker_option("thread");
    }
}
