//! A queue's settings and a push's: `QueueOptions`, `PushOptions`, `NewMessage`,
//! `RateLimit`, with their defaults and bounds.

use std::time::Duration;

use serde::Serialize;

use crate::conn::ConnectOptions;
use crate::error::{Error, Result};
use crate::keys::Layout;
use crate::time::{Due, ceil_ms, seconds_text};

use super::to_json;

/// Settings of one queue. The defaults are the same in every binding, so PHP and
/// Python address the same keys given the same URL, queue name and prefix.
#[derive(Debug, Clone)]
pub struct QueueOptions {
    /// First part of the hash tag: keys are `{prefix:queue}:...`.
    pub prefix: String,
    /// delayq's own keys, or the recipe's (see [`Layout`]).
    pub layout: Layout,
    /// Largest payload, as JSON text, that `push` accepts.
    pub max_payload_bytes: usize,
    /// Timeouts, retries and TLS of the connection to Redis.
    pub connect: ConnectOptions,
    /// Dead letters kept at most (the oldest go first).
    pub dead_max: usize,
    /// Dead letters older than this are deleted.
    pub dead_ttl: Duration,
    /// Completed messages kept after their acknowledgement, for `get` and
    /// `list(Listing::Completed)` to show ("did order 10086 close, and when?"); the
    /// oldest go first (on a partitioned queue, in each partition). 0, the default,
    /// keeps none: an acknowledged message is deleted at once. Applied by the consumer
    /// pools as they acknowledge.
    pub keep_completed: usize,
    /// Kept completed messages older than this are deleted.
    pub keep_completed_for: Duration,
    /// Sub-queues one logical queue is spread over, each under its own hash tag, so
    /// that on Redis Cluster one hot queue uses several masters (see `partition_tags`).
    /// Changing it moves the queue to other keys: drain the queue first.
    pub partitions: u32,
    /// Replicas that must confirm each push (Redis `WAIT`) before it returns; 0 (the
    /// default) returns once the master has it. For pushes that must survive a
    /// failover.
    pub wait_replicas: u32,
    /// Longest wait for those replicas.
    pub wait_timeout: Duration,
}

/// Most completed messages a queue keeps (`QueueOptions::keep_completed`): each holds
/// its payload, so the cap bounds Redis memory.
pub const MAX_KEEP_COMPLETED: usize = 1_000_000;

/// Default `max_payload_bytes`: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1 << 20;

impl Default for QueueOptions {
    fn default() -> Self {
        Self {
            prefix: "dq".to_owned(),
            layout: Layout::Native,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            connect: ConnectOptions::default(),
            dead_max: 10_000,
            dead_ttl: Duration::from_secs(30 * 24 * 3600),
            keep_completed: 0,
            keep_completed_for: Duration::from_secs(24 * 3600),
            partitions: 1,
            wait_replicas: 0,
            wait_timeout: Duration::from_secs(1),
        }
    }
}

/// Per-message options of a push.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushOptions {
    /// Caller-chosen id: pushing the same id again while the message exists creates
    /// nothing and returns the same id.
    pub id: Option<String>,
    /// Deliveries allowed before the message goes to the dead-letter set (overrides
    /// the worker's `max_attempts`).
    pub max_attempts: Option<u32>,
    /// On a partitioned queue, messages with the same key go to the same partition
    /// (claimed in due-time order); by default the id picks the partition.
    pub partition_key: Option<String>,
    /// With an `id`: a message of that id that still waits (or is dead) is replaced,
    /// payload, due time and all, with its attempts and last error reset, instead of
    /// being kept: "close the cart 30 minutes after its last change". One that is
    /// running is left alone.
    pub replace: bool,
    /// Not to be started later than this after its due time (Celery's `expires`,
    /// Sidekiq's `expires_in`): a reminder two hours late helps nobody. A message
    /// still waiting then goes to the dead-letter set, unrun, with the reason as its
    /// error. The deadline counts from the due time of the push (or of `reschedule`);
    /// retries do not move it, and `requeue_dead` gives a fresh one. Native layout
    /// only.
    pub expire_after: Option<Duration>,
    /// Messages sharing a serial key never run at the same time, and start in due
    /// order (Laravel's `WithoutOverlapping`, BullMQ's groups with concurrency 1): the
    /// payment callback and the timeout close of one order, say. While one runs, the
    /// next waits in its key's line and starts as soon as the running one's lease ends
    /// (acknowledged, failed, released or expired); a failure frees the key, so its
    /// retry may start after a later message of the key. It also picks the partition
    /// of a partitioned queue. Native layout only.
    pub serial_key: Option<String>,
}

/// One message of a `push_many` batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewMessage {
    /// The payload as JSON text.
    pub payload_json: String,
    /// When it is due: after a delay or at a time.
    pub due: Due,
    /// Its id, attempts, expiry and keys.
    pub options: PushOptions,
}

impl NewMessage {
    /// A message from any serialisable value.
    pub fn new<T: Serialize + ?Sized>(payload: &T, due: impl Into<Due>) -> Result<Self> {
        Ok(Self {
            payload_json: to_json(payload)?,
            due: due.into(),
            options: PushOptions::default(),
        })
    }
}

/// A cap on how fast a queue's messages are handed to consumers: at most `max` in any
/// window of `per`, counted over every consumer pool on every host (see
/// `Queue::set_rate_limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Messages handed out at most in any window of `per`.
    pub max: u32,
    /// The window.
    pub per: Duration,
}

/// Longest window a rate limit may have: a daily quota fits, and the log of grants
/// that the claim keeps for the window stays short.
pub const MAX_RATE_LIMIT_PERIOD: Duration = Duration::from_secs(31 * 24 * 3600);

impl RateLimit {
    /// `max` messages per `per` seconds (fractions allowed, down to a millisecond).
    pub fn new(max: u32, per_secs: f64) -> Result<Self> {
        let per = crate::time::delay_from_secs("per", per_secs)?;
        let limit = Self { max, per };
        limit.validate(1)?;
        Ok(limit)
    }

    pub(super) fn validate(&self, partitions: usize) -> Result<()> {
        if self.max == 0 {
            return Err(Error::invalid(
                "max",
                "must be at least 1 (pause() stops consumption altogether)",
            ));
        }
        if self.per < Duration::from_millis(1) || self.per > MAX_RATE_LIMIT_PERIOD {
            return Err(Error::invalid(
                "per",
                format!(
                    "must be from 0.001 to {} seconds, got {:?}",
                    MAX_RATE_LIMIT_PERIOD.as_secs(),
                    self.per
                ),
            ));
        }
        if (self.max as usize) < partitions {
            // The same rate over a longer period, rounded up to what `per` can express so
            // that the suggestion never allows more than the limit asked for.
            let per = self.per * partitions as u32 / self.max;
            let advice = if per <= MAX_RATE_LIMIT_PERIOD {
                format!(
                    "raise max and per together, e.g. {partitions} per {} s",
                    seconds_text(ceil_ms(per))
                )
            } else {
                format!("raise max to at least {partitions}")
            };
            return Err(Error::invalid(
                "max",
                format!(
                    "{} cannot be shared by this queue's {partitions} partitions (each needs at least 1): {advice}",
                    self.max
                ),
            ));
        }
        Ok(())
    }

    /// Each partition's share of `max`: they add up to `max`.
    pub(super) fn shares(&self, partitions: usize) -> impl Iterator<Item = u32> {
        let n = partitions as u32;
        let (each, extra) = (self.max / n, self.max % n);
        (0..n).map(move |i| each + u32::from(i < extra))
    }
}
