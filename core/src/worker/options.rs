//! `WorkerOptions`: a consumer pool's settings, their defaults and their checks.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::host::worker_option;

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
    /// Longest an idle pool sleeps before asking Redis again. Producers and every
    /// other write of delayq's wake idle pools at once, and a claim reports the next
    /// due time and lease deadline; this bounds the wait for what announces nothing (a
    /// Redis restarted empty, a key written by hand). On the seed layout, whose old
    /// producers announce nothing, a pool looks at least every second.
    pub idle_check: Duration,
    /// Stop once no message is due (ready) and none runs: for cron-driven batches and
    /// for tests of handlers. Messages due later do not keep the pool running.
    pub stop_when_empty: bool,
    /// Longest stack trace kept with a failure's error (see [`Consumer::fail_traced`]),
    /// in bytes; a longer one keeps its start and its end, where the frames that matter
    /// are (PHP lists the innermost frame first, Python last). 0 keeps none.
    pub max_trace_bytes: usize,
    /// Largest payload, as JSON text, handed to a handler (the producers' option of the
    /// same name bounds what a push writes). A message past it is dead-lettered at its
    /// claim, unrun: the pool reads each envelope's size first (HSTRLEN) and never
    /// reads one past the bound, so a message written around a producer's limit cannot
    /// take the pool's memory. At [`MAX_PAYLOAD_BYTES`](crate::MAX_PAYLOAD_BYTES) it
    /// reads every envelope without a look at its size, which costs Redis less.
    pub max_payload_bytes: usize,
}

/// Upper bound of `WorkerOptions::max_trace_bytes`: a trace is kept per failed message,
/// dead letters included (10 000 of them by default).
pub const MAX_TRACE_BYTES: usize = 1 << 20;

impl Default for WorkerOptions {
    /// The defaults of the options table (`host::WORKER_OPTIONS`).
    fn default() -> Self {
        let count = |name| worker_option(name).default_count().unwrap_or_default();
        let span = |name| worker_option(name).default_duration().unwrap_or_default();
        Self {
            threads: count("threads") as usize,
            batch: count("batch") as usize,
            prefetch: count("prefetch") as usize,
            lease: span("lease"),
            max_attempts: count("max_attempts") as u32,
            backoff_base: span("backoff_base"),
            backoff_max: span("backoff_max"),
            timeout: None,
            idle_check: span("idle_check"),
            stop_when_empty: false,
            max_trace_bytes: count("max_trace_bytes") as usize,
            max_payload_bytes: count("max_payload_bytes") as usize,
        }
    }
}

impl WorkerOptions {
    /// Refuse values that cannot work, naming the option.
    pub fn validate(&self) -> Result<()> {
        let range = |name: &str, v: usize| worker_option(name).check_count(v.try_into().unwrap_or(i64::MAX));
        range("threads", self.threads)?;
        range("batch", self.batch)?;
        range("prefetch", self.prefetch)?;
        range("max_trace_bytes", self.max_trace_bytes)?;
        range("max_payload_bytes", self.max_payload_bytes)?;
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
