//! A queue's settings and a push's: `QueueOptions` (and its table, `QUEUE_OPTIONS`,
//! that both bindings read), `PushOptions`, `NewMessage`, `RateLimit`, with their
//! defaults and bounds.

use std::time::Duration;

use serde::Serialize;

use crate::conn::ConnectOptions;
use crate::error::{Error, Result};
use crate::keys::{Layout, MAX_PARTITIONS};
use crate::options::{
    BOTH, Default as OptionDefault, Kind as OptionKind, OptionRow, PHP, Value, count, find, other, positive_seconds,
    seconds, text,
};
use crate::payload::{PayloadJson, to_json};
use crate::time::{Due, ceil_ms, seconds_text};

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

/// Every queue option, in the order the docs list them: `DelayQueue`'s options array
/// and `delayq.DelayQueue`'s keywords.
pub static QUEUE_OPTIONS: [OptionRow; 17] = [
    text(
        "prefix",
        &[],
        OptionDefault::Text("dq"),
        BOTH,
        "first part of every key's hash tag: `{prefix:queue}:…`",
    ),
    text(
        "layout",
        &["native", "seed"],
        OptionDefault::Text("native"),
        BOTH,
        "delayq's own keys, or the recipe's ZSET and HASH (`seed`)",
    ),
    text(
        "zset_key",
        &[],
        OptionDefault::Unset,
        BOTH,
        "the seed layout's ZSET (`delay_queue:zset` unless given)",
    ),
    text(
        "payload_key",
        &[],
        OptionDefault::Unset,
        BOTH,
        "the seed layout's HASH of payloads (`delay_queue:payload` unless given)",
    ),
    count(
        "max_payload_bytes",
        1,
        MAX_PAYLOAD_BYTES as i64,
        OptionDefault::Count(DEFAULT_MAX_PAYLOAD_BYTES as i64),
        BOTH,
        "largest payload, as JSON text, that a push accepts",
    ),
    positive_seconds(
        "connect_timeout",
        OptionDefault::Seconds(2.0),
        BOTH,
        "longest wait for a connection to Redis",
    ),
    positive_seconds(
        "read_timeout",
        OptionDefault::Seconds(5.0),
        BOTH,
        "longest wait for a reply from Redis",
    ),
    seconds(
        "retry_timeout",
        0.0,
        OptionDefault::Seconds(5.0),
        BOTH,
        "how long a call retries a lost connection before it fails",
    ),
    text(
        "tls_ca_file",
        &[],
        OptionDefault::Unset,
        BOTH,
        "CA certificates (PEM) that a `rediss://` server's certificate must chain to",
    ),
    count(
        "partitions",
        1,
        MAX_PARTITIONS as i64,
        OptionDefault::Count(1),
        BOTH,
        "hash tags the queue is spread over (one per Cluster master); changing it moves the queue",
    ),
    count(
        "wait_replicas",
        0,
        MAX_WAIT_REPLICAS,
        OptionDefault::Count(0),
        BOTH,
        "replicas that must have each push before it returns (Redis `WAIT`)",
    ),
    seconds(
        "wait_timeout",
        0.0,
        OptionDefault::Seconds(1.0),
        BOTH,
        "longest wait for those replicas",
    ),
    count(
        "dead_max",
        1,
        MAX_DEAD,
        OptionDefault::Count(10_000),
        BOTH,
        "dead letters kept at most; the oldest go first",
    ),
    seconds(
        "dead_ttl",
        0.0,
        OptionDefault::Seconds(2_592_000.0),
        BOTH,
        "dead letters older than this are deleted",
    ),
    count(
        "keep_completed",
        0,
        MAX_KEEP_COMPLETED as i64,
        OptionDefault::Count(0),
        BOTH,
        "acknowledged messages kept for `get()` and `completed()`; 0 keeps none",
    ),
    seconds(
        "keep_completed_for",
        1.0,
        OptionDefault::Seconds(86_400.0),
        BOTH,
        "kept completed messages older than this are deleted",
    ),
    other(
        "persistent",
        OptionKind::Flag,
        OptionDefault::Flag(false),
        PHP,
        "keep the queue and its connection for the life of the process (PHP-FPM)",
    ),
];

/// Largest `max_payload_bytes`: Redis's longest string.
pub const MAX_PAYLOAD_BYTES: usize = 512 << 20;
/// Largest `wait_replicas`.
const MAX_WAIT_REPLICAS: i64 = 64;
/// Largest `dead_max`.
const MAX_DEAD: i64 = 100_000_000;

/// The row of `name` in `QUEUE_OPTIONS`.
///
/// # Panics
/// When `name` is not in it (see `options::find`).
pub fn queue_option(name: &str) -> &'static OptionRow {
    find(&QUEUE_OPTIONS, name)
}

impl QueueOptions {
    /// Options from values by name, as a binding read them (options not given keep
    /// their defaults): each checked against its row of `QUEUE_OPTIONS`, then the
    /// layout's rules. An error names the option. `persistent` is the binding's own.
    pub fn from_values<'a>(values: impl IntoIterator<Item = (&'a str, Value)>) -> Result<Self> {
        let mut o = Self::default();
        let (mut layout, mut zset_key, mut payload_key) = (None, None, None);
        for (name, value) in values {
            let Some(row) = QUEUE_OPTIONS.iter().find(|r| r.name == name && r.name != "persistent") else {
                return Err(Error::invalid(name, "is not a queue option"));
            };
            let size = |n: i64| row.check_count(n).map(|n| n as usize);
            match (name, value) {
                ("prefix", Value::Text(t)) => o.prefix = t,
                ("layout", Value::Text(t)) => layout = Some(row.check_text(t)?),
                ("zset_key", Value::Text(t)) => zset_key = Some(t),
                ("payload_key", Value::Text(t)) => payload_key = Some(t),
                ("max_payload_bytes", Value::Count(n)) => o.max_payload_bytes = size(n)?,
                ("connect_timeout", Value::Seconds(s)) => o.connect.connect_timeout = row.check_seconds(s)?,
                ("read_timeout", Value::Seconds(s)) => o.connect.read_timeout = row.check_seconds(s)?,
                ("retry_timeout", Value::Seconds(s)) => o.connect.retry_timeout = row.check_seconds(s)?,
                ("tls_ca_file", Value::Text(t)) => o.connect.tls_ca_file = Some(t.into()),
                ("partitions", Value::Count(n)) => o.partitions = size(n)? as u32,
                ("wait_replicas", Value::Count(n)) => o.wait_replicas = size(n)? as u32,
                ("wait_timeout", Value::Seconds(s)) => o.wait_timeout = row.check_seconds(s)?,
                ("dead_max", Value::Count(n)) => o.dead_max = size(n)?,
                ("dead_ttl", Value::Seconds(s)) => o.dead_ttl = row.check_seconds(s)?,
                ("keep_completed", Value::Count(n)) => o.keep_completed = size(n)?,
                ("keep_completed_for", Value::Seconds(s)) => o.keep_completed_for = row.check_seconds(s)?,
                (_, value) => return Err(row.wrong_kind(&value)),
            }
        }
        o.layout = match layout.as_deref() {
            None | Some("native") if zset_key.is_some() || payload_key.is_some() => {
                let name = if zset_key.is_some() { "zset_key" } else { "payload_key" };
                return Err(Error::invalid(name, "applies only with layout 'seed'"));
            }
            None | Some("native") => Layout::Native,
            _ => match Layout::seed() {
                Layout::Seed {
                    zset_key: z,
                    payload_key: p,
                } => Layout::Seed {
                    zset_key: zset_key.unwrap_or(z),
                    payload_key: payload_key.unwrap_or(p),
                },
                Layout::Native => Layout::Native,
            },
        };
        o.check()?;
        Ok(o)
    }

    /// Every setting within its row's bounds, whether it came from a binding or was set
    /// in Rust.
    pub(crate) fn check(&self) -> Result<()> {
        let row = queue_option;
        row("max_payload_bytes").check_size(self.max_payload_bytes as u64)?;
        row("connect_timeout").check_duration(self.connect.connect_timeout)?;
        row("read_timeout").check_duration(self.connect.read_timeout)?;
        row("retry_timeout").check_duration(self.connect.retry_timeout)?;
        row("partitions").check_size(u64::from(self.partitions))?;
        row("wait_replicas").check_size(u64::from(self.wait_replicas))?;
        row("wait_timeout").check_duration(self.wait_timeout)?;
        row("dead_max").check_size(self.dead_max as u64)?;
        row("dead_ttl").check_duration(self.dead_ttl)?;
        row("keep_completed").check_size(self.keep_completed as u64)?;
        row("keep_completed_for").check_duration(self.keep_completed_for)?;
        if self.wait_replicas > 0 && self.wait_timeout.is_zero() {
            return Err(Error::invalid(
                "wait_timeout",
                "must be greater than zero (Redis would wait forever)",
            ));
        }
        Ok(())
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
    /// The group it belongs to (a merchant, a tenant, a partner's API): at most the
    /// group's concurrency limit of its messages run at once, on every pool and host
    /// (`Queue::set_group_limit`); the others wait in the group's line, in due order,
    /// and start as running ones end. A group without a limit of its own takes the
    /// queue's default for groups, and runs without bound while there is none. It
    /// picks the partition of a partitioned queue, as a serial key does (serial keys
    /// are groups of limit 1); a message has one or the other. Native layout only.
    pub group: Option<String>,
}

/// A group's limits (`Queue::set_group_limit`): a group with limits of its own ignores
/// the queue's default for groups, whole.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupLimit {
    /// At most this many of the group's messages run at once.
    pub concurrency: Option<u32>,
    /// At most `max` of the group's messages start in any window of `per`, on every
    /// pool: the window is exact, as the queue's rate limit's is.
    pub rate: Option<RateLimit>,
}

impl GroupLimit {
    /// At most `n` (1 or more) of a group's messages run at once.
    pub fn concurrency(n: u32) -> Result<Self> {
        if n == 0 {
            return Err(Error::invalid(
                "concurrency",
                "must be at least 1 (pause the queue to hold every message)",
            ));
        }
        Ok(Self {
            concurrency: Some(n),
            rate: None,
        })
    }

    /// At most `limit.max` of a group's messages start in any window of `limit.per`.
    pub fn rate(limit: RateLimit) -> Self {
        Self {
            rate: Some(limit),
            ..Self::default()
        }
    }

    /// These limits and a rate limit.
    pub fn with_rate(self, limit: RateLimit) -> Self {
        Self {
            rate: Some(limit),
            ..self
        }
    }

    /// No limits: the group's own are cleared (the default applies), or the default is.
    pub fn none() -> Self {
        Self::default()
    }

    /// Limits from a binding's arguments, each named in an error: a concurrency limit,
    /// and a rate limit of `max` per `per_secs` seconds (1 unless given). None of them
    /// is `none()`; `per_secs` without `max` is refused rather than ignored.
    pub fn from_args(concurrency: Option<i64>, max: Option<i64>, per_secs: Option<f64>) -> Result<Self> {
        let whole = |name: &str, n: i64| {
            u32::try_from(n).map_err(|_| Error::invalid(name, format!("must be from 1 to {}, got {n}", u32::MAX)))
        };
        let limit = match concurrency {
            Some(n) => Self::concurrency(whole("concurrency", n)?)?,
            None => Self::none(),
        };
        match (max, per_secs) {
            (Some(max), per) => Ok(limit.with_rate(RateLimit::new(whole("max", max)?, per.unwrap_or(1.0))?)),
            (None, Some(_)) => Err(Error::invalid(
                "per",
                "applies only with max (the rate limit is max messages per per seconds)",
            )),
            (None, None) => Ok(limit),
        }
    }
}

/// One message of a `push_many` batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewMessage {
    /// The payload as JSON text: any text (`"…".into()`, checked at push) or what a
    /// `PayloadWriter` wrote.
    pub payload_json: PayloadJson,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::check_table;

    #[test]
    fn group_limits_from_arguments_name_the_bad_one() {
        let rate = RateLimit::new(10, 60.0).expect("rate");
        assert_eq!(
            GroupLimit::from_args(None, None, None).expect("none"),
            GroupLimit::none()
        );
        assert_eq!(
            GroupLimit::from_args(Some(3), Some(10), Some(60.0)).expect("both"),
            GroupLimit::concurrency(3).expect("3").with_rate(rate)
        );
        assert_eq!(
            GroupLimit::from_args(None, Some(10), None).expect("max").rate,
            Some(RateLimit::new(10, 1.0).expect("rate"))
        );
        let named = |c, m, p| match GroupLimit::from_args(c, m, p) {
            Err(Error::InvalidArgument { name, .. }) => name,
            other => panic!("expected an invalid argument, got {other:?}"),
        };
        assert_eq!(named(Some(0), None, None), "concurrency");
        assert_eq!(named(Some(-1), None, None), "concurrency");
        assert_eq!(named(Some(1 << 40), None, None), "concurrency");
        assert_eq!(named(None, Some(0), None), "max");
        assert_eq!(named(None, None, Some(2.0)), "per");
        assert_eq!(named(Some(1), Some(1), Some(0.0)), "per");
    }

    #[test]
    fn the_table_is_the_defaults() {
        check_table(&QUEUE_OPTIONS);
        let d = QueueOptions::default();
        let from = QueueOptions::from_values([]).expect("the defaults");
        assert_eq!(format!("{d:?}"), format!("{from:?}"));
        let count = |name| queue_option(name).default_count().expect("a count");
        let span = |name| queue_option(name).default_duration().expect("seconds");
        assert_eq!(d.max_payload_bytes as i64, count("max_payload_bytes"));
        assert_eq!(i64::from(d.partitions), count("partitions"));
        assert_eq!(i64::from(d.wait_replicas), count("wait_replicas"));
        assert_eq!(d.dead_max as i64, count("dead_max"));
        assert_eq!(d.keep_completed as i64, count("keep_completed"));
        assert_eq!(d.connect.connect_timeout, span("connect_timeout"));
        assert_eq!(d.connect.read_timeout, span("read_timeout"));
        assert_eq!(d.connect.retry_timeout, span("retry_timeout"));
        assert_eq!(d.wait_timeout, span("wait_timeout"));
        assert_eq!(d.dead_ttl, span("dead_ttl"));
        assert_eq!(d.keep_completed_for, span("keep_completed_for"));
        assert_eq!(queue_option("prefix").default, OptionDefault::Text("dq"));
        assert_eq!(d.prefix, "dq");
        assert_eq!(queue_option("layout").default, OptionDefault::Text("native"));
        assert_eq!(d.layout, Layout::Native);
    }

    #[test]
    fn values_are_checked_by_their_rows() {
        let err = |values: Vec<(&str, Value)>| QueueOptions::from_values(values).expect_err("refused").to_string();
        let e = err(vec![("dead_max", Value::Count(0))]);
        assert!(e.contains("dead_max") && e.contains("between 1 and"), "{e}");
        let e = err(vec![("max_payload_bytes", Value::Count((512 << 20) + 1))]);
        assert!(e.contains("max_payload_bytes"), "{e}");
        let e = err(vec![("wait_replicas", Value::Count(65))]);
        assert!(e.contains("wait_replicas") && e.contains("between 0 and 64"), "{e}");
        let e = err(vec![("layout", Value::Text("Seed".into()))]);
        assert!(e.contains("'native' or 'seed'"), "{e}");
        let e = err(vec![("zset_key", Value::Text("z".into()))]);
        assert!(e.contains("zset_key") && e.contains("only with layout 'seed'"), "{e}");
        let e = err(vec![("partitions", Value::Seconds(2.0))]);
        assert!(e.contains("partitions") && e.contains("takes count"), "{e}");
        let e = err(vec![("persistent", Value::Flag(true))]);
        assert!(e.contains("not a queue option"), "{e}");
        let e = err(vec![("read_timeout", Value::Seconds(0.0))]);
        assert!(e.contains("read_timeout") && e.contains("above 0"), "{e}");
        let e = err(vec![
            ("wait_replicas", Value::Count(1)),
            ("wait_timeout", Value::Seconds(0.0)),
        ]);
        assert!(e.contains("wait_timeout"), "{e}");
    }

    #[test]
    fn the_seed_layout_takes_its_keys_or_the_recipes() {
        let seed = |values: Vec<(&str, Value)>| QueueOptions::from_values(values).expect("seed").layout;
        assert_eq!(seed(vec![("layout", Value::Text("seed".into()))]), Layout::seed());
        assert_eq!(
            seed(vec![
                ("layout", Value::Text("seed".into())),
                ("zset_key", Value::Text("z".into())),
            ]),
            Layout::Seed {
                zset_key: "z".into(),
                payload_key: "delay_queue:payload".into(),
            }
        );
    }
}
