//! `WorkerOptions`: a consumer pool's settings, their defaults and their checks.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::scripts::MAX_BATCH;

/// Settings of a consumer pool.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Fetch threads (each with its own Redis connection).
    pub threads: usize,
    /// Most messages claimed per round trip (1..=1000).
    pub batch: usize,
    /// Upper bound of messages claimed and not yet completed; 0 means
    /// `batch * threads`. Within it the pool holds about 50 ms of work per handler at
    /// the measured handler speed (one per handler until measured), so slow handlers
    /// leave due messages to idle consumers instead of hoarding them.
    pub prefetch: usize,
    /// How long a claimed message stays reserved without a heartbeat; the pool
    /// extends it while the handler runs, so it need not exceed the slowest handler.
    pub lease: Duration,
    /// Deliveries before a message goes to the dead-letter set (a message's own
    /// `max_attempts` wins).
    pub max_attempts: u32,
    /// First retry delay; doubles with each attempt, with jitter.
    pub backoff_base: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Longest a handler may run: after it the lease is no longer extended and the
    /// message is handed to another consumer when the lease ends.
    pub timeout: Option<Duration>,
    /// Longest an idle pool sleeps before asking Redis again. Producers wake idle
    /// pools at once; this only bounds the wait for writers that do not publish
    /// (the seed recipe's own producers) and for lost wake-ups.
    pub idle_check: Duration,
    /// Stop once no message is due (ready) and none runs: for cron-driven batches and
    /// for tests of handlers. Messages due later do not keep the pool running.
    pub stop_when_empty: bool,
    /// Longest stack trace kept with a failure's error (see [`Consumer::fail_traced`]),
    /// in bytes; a longer one keeps its start and its end, where the frames that matter
    /// are (PHP lists the innermost frame first, Python last). 0 keeps none.
    pub max_trace_bytes: usize,
}

/// Upper bound of `WorkerOptions::max_trace_bytes`: a trace is kept per failed message,
/// dead letters included (10 000 of them by default).
pub const MAX_TRACE_BYTES: usize = 1 << 20;

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            threads: 2,
            batch: 50,
            prefetch: 0,
            lease: Duration::from_secs(30),
            max_attempts: 5,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            timeout: None,
            idle_check: Duration::from_secs(1),
            stop_when_empty: false,
            max_trace_bytes: 8192,
        }
    }
}

impl WorkerOptions {
    /// Refuse values that cannot work, naming the option.
    pub fn validate(&self) -> Result<()> {
        let range = |name: &str, v: usize, lo: usize, hi: usize| {
            if v < lo || v > hi {
                Err(Error::invalid(name, format!("must be between {lo} and {hi}, got {v}")))
            } else {
                Ok(())
            }
        };
        range("threads", self.threads, 1, 64)?;
        range("batch", self.batch, 1, MAX_BATCH)?;
        range("prefetch", self.prefetch, 0, 100_000)?;
        range("max_trace_bytes", self.max_trace_bytes, 0, MAX_TRACE_BYTES)?;
        if self.lease < Duration::from_millis(100) {
            return Err(Error::invalid(
                "lease",
                format!("must be at least 0.1 s, got {:?}", self.lease),
            ));
        }
        if self.max_attempts == 0 {
            return Err(Error::invalid("max_attempts", "must be at least 1"));
        }
        if self.backoff_max < self.backoff_base {
            return Err(Error::invalid("backoff_max", "must not be smaller than backoff_base"));
        }
        if self.timeout.is_some_and(|t| t.is_zero()) {
            return Err(Error::invalid("timeout", "must be greater than zero"));
        }
        if self.idle_check < Duration::from_millis(10) {
            return Err(Error::invalid("idle_check", "must be at least 0.01 s"));
        }
        Ok(())
    }

    pub(super) fn prefetch_limit(&self) -> usize {
        if self.prefetch == 0 {
            self.batch * self.threads
        } else {
            self.prefetch.max(1)
        }
    }

    pub(super) fn heartbeat(&self) -> Duration {
        (self.lease / 3).max(Duration::from_millis(30))
    }
}
