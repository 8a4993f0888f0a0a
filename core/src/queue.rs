//! The producer and admin API of one queue.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::{FromRedisValue, RedisResult, Value};
use serde::Serialize;

use crate::conn::{Conn, ConnSlot, ConnectOptions, Endpoint, Replay};
use crate::envelope;
use crate::error::{Error, Result};
use crate::keys::{Keys, Layout, MAX_PARTITIONS, partition_of, partition_tags, validate_name};
use crate::repeat::{self, RepeatInfo, RepeatOptions, Schedule};
use crate::scripts::repeat as repeat_script;
use crate::scripts::replies::{Count, Flag, Ids};
use crate::scripts::{self, LuaScript, MAX_BATCH, admin, dead, inspect, push};
use crate::time::{Due, MAX_DELAY, ceil_ms, seconds_text};

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

/// Where a message is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Waiting for its due time.
    Scheduled,
    /// Due, not yet claimed by a consumer.
    Ready,
    /// Claimed by a consumer under a lease.
    Inflight,
    /// Gave up on: in the dead-letter set.
    Dead,
    /// Acknowledged, and kept for a while (`QueueOptions::keep_completed`).
    Completed,
}

impl State {
    /// Its name, as the bindings and the `delayq` command show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Scheduled => "scheduled",
            Self::Ready => "ready",
            Self::Inflight => "inflight",
            Self::Dead => "dead",
            Self::Completed => "completed",
        }
    }
}

/// What `get` knows about a message.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageInfo {
    /// The message id.
    pub id: String,
    /// Where it is now.
    pub state: State,
    /// The payload as JSON text (or the raw stored text when it is not valid JSON).
    pub payload_json: String,
    /// Due time of the pending or current delivery (of a completed message: of the
    /// delivery that completed it), Unix ms; `None` once dead.
    pub due_at_ms: Option<i64>,
    /// Deliveries so far.
    pub attempts: u32,
    /// Its own `PushOptions::max_attempts`, when it was pushed with one (else the
    /// worker's applies).
    pub max_attempts: Option<u32>,
    /// The error of its latest failed delivery.
    pub last_error: Option<String>,
    /// The stack trace that came with the last error (a PHP exception as `(string)
    /// $e` gives it, a Python traceback), cut to the worker's `max_trace_bytes`; `None`
    /// when the failure gave none.
    pub error_trace: Option<String>,
    /// When it went to the dead-letter set (Unix ms, Redis clock), while it is there.
    pub dead_at_ms: Option<i64>,
    /// When it was pushed, Unix ms on the producer's clock (`None` in the seed layout).
    pub created_at_ms: Option<i64>,
    /// While in flight: when its lease runs out unless the pool's heartbeat extends
    /// it (Unix ms, Redis clock). A deadline in the past means its worker died or hung,
    /// and the next claim gives the message to another delivery.
    pub lease_until_ms: Option<i64>,
    /// With `PushOptions::expire_after`: the latest it may start (Unix ms, Redis clock).
    pub expires_at_ms: Option<i64>,
    /// When it was acknowledged (Unix ms, Redis clock), once completed.
    pub completed_at_ms: Option<i64>,
    /// `PushOptions::serial_key`, while the message waits, runs or is dead.
    pub serial_key: Option<String>,
}

/// Which messages `Queue::list` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Listing {
    /// Scheduled and ready, earliest due first: what consumers will take next.
    Waiting,
    /// Claimed and running, earliest lease deadline first (a deadline in the past is a
    /// delivery whose worker died or hung).
    Inflight,
    /// Kept after completion (`QueueOptions::keep_completed`), latest first.
    Completed,
}

impl Listing {
    /// Its name, as the `delayq` command takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Waiting => "waiting",
            Self::Inflight => "inflight",
            Self::Completed => "completed",
        }
    }
}

/// A consumer pool that is alive: it registered when it started and renews its entry
/// every heartbeat (`lease / 3`), and every second while it works; one that dies unannounced drops out after three
/// missed heartbeats.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[non_exhaustive]
pub struct WorkerInfo {
    /// `host:pid:n`, n counting the pools of that process.
    pub id: String,
    /// The host name of its machine.
    pub host: String,
    /// The process id on that host.
    pub pid: u32,
    /// Unix ms on the pool's clock.
    pub started_at_ms: i64,
    /// Its last heartbeat, Unix ms on the Redis server's clock.
    #[serde(skip)]
    pub last_seen_ms: i64,
    /// I/O threads.
    pub threads: usize,
    /// Deliveries it works on at once (handler threads, tasks or processes' share).
    pub handlers: usize,
    /// Totals since it started, as of its last heartbeat.
    pub handled: u64,
    /// Of those, acknowledged.
    pub acked: u64,
    /// Of those, failed (retried or dead-lettered).
    pub failed: u64,
    /// Deliveries it held (running or prefetched) at its last heartbeat.
    pub holding: u64,
    /// Handlers it started between its last two heartbeats, and how late they
    /// started after their due time (ms on the server's clock): the figure a delay
    /// queue is judged by, as its users see it.
    #[serde(default)]
    pub started_recently: u64,
    /// Their average lateness (ms), if any started.
    #[serde(default)]
    pub lateness_avg_ms: Option<f64>,
    /// Their largest lateness (ms), if any started.
    #[serde(default)]
    pub lateness_max_ms: Option<i64>,
    /// Moving average of one handler call (ms), once measured.
    #[serde(default)]
    pub handler_avg_ms: Option<f64>,
}

/// Longest text that `requeue_dead_with_error` and `delete_dead_with_error` look for.
pub const MAX_ERROR_TEXT_BYTES: usize = 4096;

/// A message in the dead-letter set.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    /// The message id.
    pub id: String,
    /// The payload as JSON text, as pushed.
    pub payload_json: String,
    /// Deliveries it had.
    pub attempts: u32,
    /// The error that sent it here.
    pub last_error: String,
    /// The stack trace that came with the last error, if any (see
    /// [`MessageInfo::error_trace`]).
    pub error_trace: Option<String>,
    /// When it died, Unix ms on the Redis clock.
    pub dead_at_ms: i64,
}

/// Queue depth and lifetime counters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stats {
    /// Waiting for a future due time.
    pub scheduled: u64,
    /// Due and waiting for a consumer.
    pub ready: u64,
    /// Claimed by a consumer, under a lease.
    pub inflight: u64,
    /// In the dead-letter set.
    pub dead: u64,
    /// Of the scheduled (and ready) ones, those due already that wait for another
    /// message of their serial key to finish (`PushOptions::serial_key`); they run as
    /// soon as it does.
    pub held: u64,
    /// Kept after their completion (`QueueOptions::keep_completed`).
    pub completed: u64,
    /// Due time of the earliest waiting message, Unix ms.
    pub next_due_ms: Option<i64>,
    /// When consumption was paused (Unix ms), while it is (see `Queue::pause`).
    pub paused_at_ms: Option<i64>,
    /// The rate limit in force (see `Queue::set_rate_limit`).
    pub rate_limit: Option<RateLimit>,
    /// Lifetime counters: pushed, delivered, acked, retried, dead, expired, released,
    /// cancelled, requeued, discarded, trimmed, purged, replaced, orphaned (absent ones
    /// are 0).
    pub totals: BTreeMap<String, u64>,
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

    fn validate(&self, partitions: usize) -> Result<()> {
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
    fn shares(&self, partitions: usize) -> impl Iterator<Item = u32> {
        let n = partitions as u32;
        let (each, extra) = (self.max / n, self.max % n);
        (0..n).map(move |i| each + u32::from(i < extra))
    }
}

/// The lifetime counters under the names the bindings show (`died` is the `dead`
/// counter, so it does not clash with the dead-letter depth).
pub const COUNTERS: [(&str, &str); 14] = [
    ("pushed", "pushed"),
    ("delivered", "delivered"),
    ("acked", "acked"),
    ("retried", "retried"),
    ("died", "dead"),
    ("expired", "expired"),
    ("released", "released"),
    ("cancelled", "cancelled"),
    ("requeued", "requeued"),
    ("discarded", "discarded"),
    ("trimmed", "trimmed"),
    ("purged", "purged"),
    ("replaced", "replaced"),
    ("moved", "moved"),
];

impl Stats {
    /// One lifetime counter by its stored name (`dead`, not `died`), 0 when absent.
    pub fn total(&self, name: &str) -> u64 {
        self.totals.get(name).copied().unwrap_or(0)
    }

    /// Every lifetime counter, named as in `COUNTERS`, in that order.
    pub fn named_totals(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        COUNTERS.iter().map(|(shown, stored)| (*shown, self.total(stored)))
    }
}

fn earliest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

pub(crate) fn to_json<T: Serialize + ?Sized>(payload: &T) -> Result<String> {
    serde_json::to_string(payload).map_err(|e| Error::PayloadNotSerializable(e.to_string()))
}

pub(crate) struct Inner {
    pub(crate) name: String,
    /// The keys of each partition.
    pub(crate) parts: Vec<Keys>,
    pub(crate) endpoint: Endpoint,
    pub(crate) opts: QueueOptions,
    pub(crate) conn: Mutex<ConnSlot>,
}

/// A handle on one queue. Cheap to clone; safe to share between threads; usable on
/// both sides of a `fork()` (each process opens its own connection).
#[derive(Clone)]
pub struct Queue {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("name", &self.inner.name)
            .field("url", &self.inner.endpoint.display)
            .field("layout", &self.inner.opts.layout)
            .finish()
    }
}

/// Longest caller-supplied id.
pub const MAX_ID_BYTES: usize = 200;

fn validate_id(id: &str) -> Result<()> {
    validate_key("id", id)
}

/// A serial key is enforced within one partition: it picks the partition, and a
/// partition key beside it must not pick another.
fn validate_serial_key(layout: &Layout, key: &str, partition_key: Option<&str>) -> Result<()> {
    validate_key("serial_key", key)?;
    if matches!(layout, Layout::Seed { .. }) {
        return Err(Error::invalid(
            "serial_key",
            "is not available in the seed layout (the recipe's own consumers would not respect it)",
        ));
    }
    if partition_key.is_some_and(|p| p != key) {
        return Err(Error::invalid(
            "partition_key",
            "differs from serial_key, which picks the partition: messages of one serial key must share one",
        ));
    }
    Ok(())
}

fn validate_key(what: &str, id: &str) -> Result<()> {
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return Err(Error::invalid(
            what,
            format!("must be 1 to {MAX_ID_BYTES} bytes, got {}", id.len()),
        ));
    }
    if let Some(c) = id.chars().find(|c| c.is_control()) {
        return Err(Error::invalid(
            what,
            format!("{id:?} contains the control character {c:?}"),
        ));
    }
    Ok(())
}

fn validate_repeat_name(name: &str) -> Result<()> {
    // The occurrence ids ("repeat:<name>:<due_ms>") must stay within the id limit.
    const ROOM: usize = MAX_ID_BYTES - "repeat::".len() - 20;
    if name.is_empty() || name.len() > ROOM || name.chars().any(char::is_control) {
        return Err(Error::invalid(
            "repeat name",
            format!("must be 1 to {ROOM} bytes without control characters, got {name:?}"),
        ));
    }
    Ok(())
}

/// A message's own `max_attempts` lives in its envelope: the seed layout stores the
/// bare payload, so it would be dropped without a word.
fn validate_max_attempts(layout: &Layout, n: Option<u32>) -> Result<()> {
    match n {
        Some(_) if matches!(layout, Layout::Seed { .. }) => Err(Error::invalid(
            "max_attempts",
            "needs the native layout: the seed layout stores the bare payload, with no room for it \
             (the worker's max_attempts applies)",
        )),
        Some(0) => Err(Error::invalid("max_attempts", "must be at least 1")),
        _ => Ok(()),
    }
}

/// `expire_after` in ms, once checked.
fn expire_after_ms(layout: &Layout, expire_after: Option<Duration>) -> Result<Option<u64>> {
    let Some(d) = expire_after else { return Ok(None) };
    if matches!(layout, Layout::Seed { .. }) {
        return Err(Error::invalid(
            "expire_after",
            "needs the native layout: the seed layout stores the bare payload, with no room for a deadline",
        ));
    }
    if d < Duration::from_millis(1) || d > MAX_DELAY {
        return Err(Error::invalid(
            "expire_after",
            format!("must be between 0.001 s and {} s, got {d:?}", MAX_DELAY.as_secs()),
        ));
    }
    Ok(Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
}

/// A pool's entry as beat.lua stored it ("<expires_ms>|<seen_ms>|<info JSON>"), unless
/// it has expired (or was written by a version that this one cannot read).
fn live_pool(entry: &str, now_ms: i64) -> Option<WorkerInfo> {
    let mut parts = entry.splitn(3, '|');
    let expires: i64 = parts.next()?.parse().ok()?;
    let seen: i64 = parts.next()?.parse().ok()?;
    if expires <= now_ms {
        return None;
    }
    let mut info: WorkerInfo = serde_json::from_str(parts.next()?).ok()?;
    info.last_seen_ms = seen;
    Some(info)
}

/// Queues kept by `Queue::shared`, oldest first.
static SHARED: Mutex<Vec<(String, Queue)>> = Mutex::new(Vec::new());

/// Distinct shared queues kept per process; past it the least recently asked for goes.
pub const MAX_SHARED_QUEUES: usize = 64;

impl Queue {
    /// The queue `new` would make, kept for the life of the process together with its
    /// connection: asking again with the same URL, name and options returns it, still
    /// connected. For processes that live longer than the code that pushes, such as a
    /// PHP-FPM worker, which would otherwise connect (and, over TLS, shake hands) once
    /// per request. At most `MAX_SHARED_QUEUES` are kept.
    pub fn shared(url: &str, name: &str, opts: QueueOptions) -> Result<Self> {
        let key = format!("{url}\n{name}\n{opts:?}");
        let mut shared = SHARED.lock();
        if let Some(at) = shared.iter().position(|(k, _)| *k == key) {
            let entry = shared.remove(at);
            let queue = entry.1.clone();
            shared.push(entry);
            return Ok(queue);
        }
        let queue = Self::new(url, name, opts)?;
        if shared.len() >= MAX_SHARED_QUEUES {
            shared.remove(0);
        }
        shared.push((key, queue.clone()));
        Ok(queue)
    }

    /// A handle on queue `name` at `url`. Validates everything; connects on first use.
    pub fn new(url: &str, name: &str, opts: QueueOptions) -> Result<Self> {
        if opts.max_payload_bytes == 0 {
            return Err(Error::invalid("max_payload_bytes", "must be greater than zero"));
        }
        if opts.dead_max == 0 {
            return Err(Error::invalid("dead_max", "must be at least 1"));
        }
        if opts.keep_completed > MAX_KEEP_COMPLETED {
            return Err(Error::invalid(
                "keep_completed",
                format!("must be at most {MAX_KEEP_COMPLETED}, got {}", opts.keep_completed),
            ));
        }
        if opts.keep_completed_for < Duration::from_secs(1) {
            return Err(Error::invalid(
                "keep_completed_for",
                format!("must be at least 1 s, got {:?}", opts.keep_completed_for),
            ));
        }
        if !(1..=MAX_PARTITIONS).contains(&opts.partitions) {
            return Err(Error::invalid(
                "partitions",
                format!("must be between 1 and {MAX_PARTITIONS}, got {}", opts.partitions),
            ));
        }
        if opts.wait_replicas > 0 && opts.wait_timeout.is_zero() {
            return Err(Error::invalid(
                "wait_timeout",
                "must be greater than zero (Redis would wait forever)",
            ));
        }
        let parts = match &opts.layout {
            Layout::Native => {
                validate_name("prefix", &opts.prefix)?;
                validate_name("queue name", name)?;
                partition_tags(&opts.prefix, name, opts.partitions)
                    .iter()
                    .map(|tag| Keys::new(tag, name, &opts.layout))
                    .collect::<Result<Vec<_>>>()?
            }
            Layout::Seed { .. } if opts.partitions > 1 => {
                return Err(Error::invalid(
                    "partitions",
                    "the seed layout is the recipe's one ZSET and HASH; it cannot be partitioned",
                ));
            }
            Layout::Seed { .. } => vec![Keys::new("", name, &opts.layout)?],
        };
        let endpoint = Endpoint::parse(url, opts.connect.clone())?;
        Ok(Self {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                parts,
                endpoint,
                opts,
                conn: Mutex::new(ConnSlot::new()),
            }),
        })
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The options it was made with.
    pub fn options(&self) -> &QueueOptions {
        &self.inner.opts
    }

    /// The URL with its password hidden.
    pub fn url(&self) -> &str {
        &self.inner.endpoint.display
    }

    /// How many partitions this queue is spread over.
    pub fn partitions(&self) -> usize {
        self.inner.parts.len()
    }

    /// The partition that holds (or will hold) a message: by its partition key when it
    /// has one, else by its id.
    pub fn partition_of(&self, id: &str, partition_key: Option<&str>) -> usize {
        partition_of(partition_key.unwrap_or(id), self.partitions())
    }

    /// The hash tag of partition `part` (`{...}` included), e.g. for ACL rules.
    pub fn hash_tag(&self, part: usize) -> Option<String> {
        let keys = self.inner.parts.get(part)?;
        let first = &keys.all[0];
        Some(
            first
                .split_once('}')
                .map_or_else(|| first.clone(), |(tag, _)| format!("{tag}}}")),
        )
    }

    /// Run `build` to add arguments, then the script on partition `part`, on the
    /// producer connection; its reply decoded as `R` (a reply that does not decode is
    /// `Error::Protocol`, naming the script).
    pub(crate) fn call<R: FromRedisValue>(
        &self,
        part: usize,
        operation: &str,
        replay: Replay,
        script: &LuaScript,
        build: impl Fn(&mut redis::ScriptInvocation<'_>),
    ) -> Result<R> {
        let inner = &*self.inner;
        let v: Value = inner.conn.lock().run(&inner.endpoint, operation, replay, |con| {
            let mut inv = self.invocation(part, script);
            build(&mut inv);
            inv.invoke(con)
        })?;
        scripts::read(script, v)
    }

    /// Run a by-id script on the id's own partition first, then on the others, until
    /// `found` accepts a reply (a message pushed with a partition key may live on any).
    fn call_by_id<R: FromRedisValue>(
        &self,
        id: &str,
        operation: &str,
        replay: Replay,
        script: &LuaScript,
        build: impl Fn(&mut redis::ScriptInvocation<'_>),
        found: impl Fn(&R) -> bool,
    ) -> Result<R> {
        let n = self.partitions();
        let home = partition_of(id, n);
        let mut last = self.call(home, operation, replay, script, &build)?;
        for part in (0..n).filter(|&p| p != home) {
            if found(&last) {
                break;
            }
            last = self.call(part, operation, replay, script, &build)?;
        }
        Ok(last)
    }

    /// A call of `script` on partition `part`: the keys its header declares, then the
    /// layout and the wake-up channel.
    pub(crate) fn invocation<'a>(&'a self, part: usize, script: &'a LuaScript) -> redis::ScriptInvocation<'a> {
        let keys = &self.inner.parts[part];
        let mut inv = script.script.prepare_invoke();
        for &k in &script.keys {
            inv.key(&keys.all[k]);
        }
        inv.arg(self.inner.opts.layout.script_name()).arg(&keys.wake_channel);
        inv
    }

    /// Ask Redis to confirm that `wait_replicas` replicas have the writes made so far
    /// on this connection to partition `part`'s master.
    fn confirm_replicated(&self, con: &mut Conn, part: usize) -> RedisResult<i64> {
        let o = &self.inner.opts;
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(o.wait_replicas).arg(o.wait_timeout.as_millis() as u64);
        con.query_on_key_node(&cmd, &self.inner.parts[part].all[0])
    }

    fn check_replicated(&self, confirmed: i64) -> Result<()> {
        let o = &self.inner.opts;
        if confirmed < i64::from(o.wait_replicas) {
            return Err(Error::NotReplicated {
                wanted: o.wait_replicas,
                confirmed: u32::try_from(confirmed).unwrap_or(0),
                timeout_ms: o.wait_timeout.as_millis() as u64,
            });
        }
        Ok(())
    }

    /// Check that Redis answers (connecting if needed).
    pub fn ping(&self) -> Result<()> {
        let inner = &*self.inner;
        inner.conn.lock().run(&inner.endpoint, "ping", Replay::Safe, |con| {
            redis::cmd("PING").query::<String>(con)
        })?;
        Ok(())
    }

    /// Schedule `payload` (any serialisable value) after `delay`. Returns its id.
    pub fn push<T: Serialize + ?Sized>(&self, payload: &T, due: impl Into<Due>) -> Result<String> {
        self.push_json(&to_json(payload)?, due.into(), &PushOptions::default())
    }

    /// Schedule `payload` at the Unix time `at`.
    pub fn push_at<T: Serialize + ?Sized>(&self, payload: &T, at: std::time::SystemTime) -> Result<String> {
        self.push_json(&to_json(payload)?, Due::at(at), &PushOptions::default())
    }

    /// Schedule a payload given as JSON text. One round trip.
    pub fn push_json(&self, payload_json: &str, due: Due, options: &PushOptions) -> Result<String> {
        let mut ids = self.push_many(&[NewMessage {
            payload_json: payload_json.to_owned(),
            due,
            options: options.clone(),
        }])?;
        Ok(ids.remove(0))
    }

    /// Schedule a batch in one round trip (scripts of at most 1000 messages each,
    /// pipelined). Every message is validated before anything is written.
    pub fn push_many(&self, batch: &[NewMessage]) -> Result<Vec<String>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let inner = &*self.inner;
        let created_ms = crate::time::now_unix_ms();
        let mut ids = Vec::with_capacity(batch.len());
        let mut envelopes = Vec::with_capacity(batch.len());
        for (i, m) in batch.iter().enumerate() {
            let at = |e: Error| -> Error {
                if batch.len() == 1 {
                    e
                } else {
                    match e {
                        Error::InvalidArgument { name, reason } => Error::InvalidArgument {
                            name: format!("{name} of item {i}"),
                            reason,
                        },
                        Error::PayloadNotSerializable(r) => Error::PayloadNotSerializable(format!("item {i}: {r}")),
                        other => other,
                    }
                }
            };
            envelope::validate_payload(&m.payload_json, inner.opts.max_payload_bytes).map_err(at)?;
            validate_max_attempts(&inner.opts.layout, m.options.max_attempts).map_err(at)?;
            let expire_after = expire_after_ms(&inner.opts.layout, m.options.expire_after).map_err(at)?;
            m.due.validate().map_err(at)?;
            if let Some(key) = &m.options.partition_key {
                validate_key("partition_key", key).map_err(at)?;
            }
            if let Some(key) = &m.options.serial_key {
                validate_serial_key(&inner.opts.layout, key, m.options.partition_key.as_deref()).map_err(at)?;
            }
            if m.options.replace && m.options.id.is_none() {
                return Err(at(Error::invalid(
                    "replace",
                    "needs an id: the message of that id is the one replaced",
                )));
            }
            let id = match &m.options.id {
                Some(id) => {
                    validate_id(id).map_err(at)?;
                    id.clone()
                }
                // Sortable by creation time and unique without coordination. Having the
                // id before the first send makes a retried push idempotent.
                None => crate::fork::new_message_id(),
            };
            envelopes.push(envelope::encode(
                &inner.opts.layout,
                &id,
                &m.payload_json,
                m.options.max_attempts,
                expire_after,
                created_ms,
            ));
            ids.push(id);
        }
        // Per partition, in push order, in scripts of at most MAX_BATCH messages.
        let n = self.partitions();
        let mut by_part: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, m) in batch.iter().enumerate() {
            let key = m.options.partition_key.as_deref().or(m.options.serial_key.as_deref());
            by_part[self.partition_of(&ids[i], key)].push(i);
        }
        let chunks: Vec<(usize, &[usize])> = by_part
            .iter()
            .enumerate()
            .flat_map(|(part, idx)| idx.chunks(MAX_BATCH).map(move |c| (part, c)))
            .collect();
        // An id that delayq generated cannot exist before its first send, so the script
        // skips looking it up; a resend (the first one may have run) and ids that the
        // caller chose are looked up. The cluster client resends on its own, so there
        // every send looks up.
        let sent = Cell::new(inner.endpoint.is_cluster());
        let args_of = |members: &[usize]| push::Args {
            check_existing: sent.get() || members.iter().any(|&i| batch[i].options.id.is_some()),
            messages: members
                .iter()
                .map(|&i| push::Message {
                    id: &ids[i],
                    due: batch[i].due,
                    replace: batch[i].options.replace,
                    expires: batch[i].options.expire_after.is_some(),
                    envelope: &envelopes[i],
                    serial_key: batch[i].options.serial_key.as_deref(),
                })
                .collect(),
        };
        let add_chunk = |inv: &mut redis::ScriptInvocation<'_>, members: &[usize]| {
            args_of(members).add_to(inv);
        };
        let waits = inner.opts.wait_replicas > 0;
        if inner.endpoint.is_cluster() {
            // Each partition may live on another master: one call per script, and the
            // WAIT on the connection to that master.
            for (part, members) in chunks {
                let confirmed = inner
                    .conn
                    .lock()
                    .run_conn(&inner.endpoint, "push", Replay::Safe, |con| {
                        let mut inv = self.invocation(part, push::script());
                        add_chunk(&mut inv, members);
                        inv.invoke::<push::Reply>(con.as_dyn())?;
                        if waits {
                            self.confirm_replicated(con, part)
                        } else {
                            Ok(i64::MAX)
                        }
                    })?;
                self.check_replicated(confirmed)?;
            }
        } else if chunks.len() == 1 && !waits {
            let (part, members) = chunks[0];
            let _: push::Reply = self.call(part, "push", Replay::Safe, push::script(), |inv| {
                add_chunk(inv, members);
                sent.set(true);
            })?;
        } else {
            // One round trip for the whole batch, the WAIT included.
            let confirmed = inner
                .conn
                .lock()
                .run_conn(&inner.endpoint, "push_many", Replay::Safe, |con| {
                    let mut pipe = redis::pipe();
                    pipe.load_script(&push::script().script).ignore();
                    for &(part, members) in &chunks {
                        let mut inv = self.invocation(part, push::script());
                        add_chunk(&mut inv, members);
                        pipe.invoke_script(&inv).ignore();
                    }
                    sent.set(true);
                    if waits {
                        pipe.cmd("WAIT")
                            .arg(inner.opts.wait_replicas)
                            .arg(inner.opts.wait_timeout.as_millis() as u64);
                        let (confirmed,): (i64,) = pipe.query(con.as_dyn())?;
                        Ok(confirmed)
                    } else {
                        pipe.query::<()>(con.as_dyn())?;
                        Ok(i64::MAX)
                    }
                })?;
            self.check_replicated(confirmed)?;
        }
        self.register_producer();
        Ok(ids)
    }

    /// Delete a message that has not been claimed yet. `false` when it is unknown,
    /// running or dead.
    pub fn cancel(&self, id: &str) -> Result<bool> {
        validate_id(id)?;
        let args = admin::Cancel {
            counter: "cancelled",
            ids: vec![id],
        };
        let Ids(removed) = self.call_by_id(
            id,
            "cancel",
            Replay::IfNotSent,
            admin::cancel(),
            |inv| args.add_to(inv),
            |Ids(removed): &Ids| !removed.is_empty(),
        )?;
        Ok(!removed.is_empty())
    }

    /// Delete those of `ids` that still wait, counted under `counter`; returns them.
    fn take_waiting(&self, ids: &[String], counter: &str) -> Result<BTreeSet<String>> {
        let n = self.partitions();
        let call = |part: usize, ids: &[&String]| -> Result<Vec<String>> {
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            let args = admin::Cancel {
                counter,
                ids: ids.iter().map(|id| id.as_str()).collect(),
            };
            let Ids(removed) = self.call(part, "move_waiting", Replay::IfNotSent, admin::cancel(), |inv| {
                args.add_to(inv);
            })?;
            Ok(removed)
        };
        // Each id in its home partition first: only one pushed with a partition key
        // lives elsewhere.
        let mut by_home: Vec<Vec<&String>> = vec![Vec::new(); n];
        for id in ids {
            by_home[partition_of(id, n)].push(id);
        }
        let mut taken = BTreeSet::new();
        for (part, ids) in by_home.iter().enumerate() {
            taken.extend(call(part, ids)?);
        }
        if n > 1 {
            for part in 0..n {
                let elsewhere: Vec<&String> = ids
                    .iter()
                    .filter(|id| partition_of(id, n) != part && !taken.contains(*id))
                    .collect();
                taken.extend(call(part, &elsewhere)?);
            }
        }
        Ok(taken)
    }

    /// Move every waiting message (scheduled or due, not yet claimed) to the queue
    /// `to`, which may differ in name, layout, partitions or Redis: to leave the seed
    /// layout once every consumer runs delayq, or to spread a queue over partitions.
    /// Each keeps its id, payload, due time, `max_attempts` and the deadline of
    /// `expire_after`; its attempts and last error start afresh. Messages that run
    /// finish where they are, dead letters stay (requeue them first to move them),
    /// and a message pushed to the old queue meanwhile is moved too, until a pass finds
    /// none. A message whose id `to` already holds is kept there as it is, as a second
    /// push of that id would be. Returns how many were moved.
    ///
    /// Batches of up to 1000: each is pushed to `to` first and then deleted here, so a
    /// crash or an error loses nothing (moving again pushes the rest). A message that a
    /// consumer of this queue claims between the two steps stays here and its copy is
    /// taken back from `to` unless `to` started it already: then it runs on both,
    /// which stopping this queue's pools for the move avoids. A message that `to`
    /// cannot hold (an id or payload past its limits, an `expire_after` for the seed
    /// layout) stops the move with an error naming it, before its batch is written.
    pub fn move_waiting(&self, to: &Queue) -> Result<u64> {
        if self.inner.endpoint.display == to.inner.endpoint.display && self.inner.parts[0].all == to.inner.parts[0].all
        {
            return Err(Error::invalid(
                "to",
                "names this very queue: a queue cannot move to itself",
            ));
        }
        let mut moved = 0;
        loop {
            let batch = self.list(Listing::Waiting, MAX_BATCH)?;
            if batch.is_empty() {
                return Ok(moved);
            }
            let copies = batch.iter().map(|m| to.copy_of(m)).collect::<Result<Vec<_>>>()?;
            to.push_many(&copies)?;
            let ids: Vec<String> = batch.iter().map(|m| m.id.clone()).collect();
            let taken = self.take_waiting(&ids, "moved")?;
            moved += taken.len() as u64;
            for m in batch.iter().filter(|m| !taken.contains(&m.id)) {
                // Claimed here (or cancelled) since the list: take the copy back, if
                // it is still the one this pass pushed and still waits.
                let ours = to.get(&m.id)?.is_some_and(|c| {
                    matches!(c.state, State::Scheduled | State::Ready) && c.payload_json == m.payload_json
                });
                if ours {
                    to.cancel(&m.id)?;
                }
            }
        }
    }

    /// `m`, read from another queue, as a push to this one.
    fn copy_of(&self, m: &MessageInfo) -> Result<NewMessage> {
        let refuse = |reason: String| {
            Error::invalid(
                "to",
                format!(
                    "the target queue cannot hold message {:?}: {reason}; cancel or change that message, then move again (its batch was not moved)",
                    m.id
                ),
            )
        };
        validate_id(&m.id).map_err(|e| refuse(e.to_string()))?;
        envelope::validate_payload(&m.payload_json, self.inner.opts.max_payload_bytes)
            .map_err(|e| refuse(e.to_string()))?;
        let due_ms = m.due_at_ms.unwrap_or(0);
        let expire_after = m
            .expires_at_ms
            .map(|deadline| Duration::from_millis(u64::try_from(deadline - due_ms).unwrap_or(0).max(1)));
        expire_after_ms(&self.inner.opts.layout, expire_after).map_err(|e| refuse(e.to_string()))?;
        Ok(NewMessage {
            payload_json: m.payload_json.clone(),
            due: Due::AtUnixMs(due_ms),
            options: PushOptions {
                id: Some(m.id.clone()),
                max_attempts: m.max_attempts,
                expire_after,
                serial_key: m.serial_key.clone(),
                ..PushOptions::default()
            },
        })
    }

    /// Move a waiting message to a new due time. `false` when it is not waiting.
    pub fn reschedule(&self, id: &str, due: impl Into<Due>) -> Result<bool> {
        validate_id(id)?;
        let args = admin::Reschedule {
            id,
            due: due.into().validate()?,
        };
        let admin::Moved(due) = self.call_by_id(
            id,
            "reschedule",
            Replay::Safe,
            admin::reschedule(),
            |inv| args.add_to(inv),
            |admin::Moved(due): &admin::Moved| due.is_some(),
        )?;
        Ok(due.is_some())
    }

    /// Everything known about one message, or `None` when the id is unknown.
    pub fn get(&self, id: &str) -> Result<Option<MessageInfo>> {
        validate_id(id)?;
        let args = inspect::Get { id };
        let inspect::Found(record) = self.call_by_id(
            id,
            "get",
            Replay::Safe,
            inspect::get(),
            |inv| args.add_to(inv),
            |inspect::Found(record): &inspect::Found| record.is_some(),
        )?;
        Ok(record.map(|r| self.message_info(id.to_owned(), r)))
    }

    /// The first `limit` (1 to 1000) messages of one state, from every partition, in
    /// the order consumers meet them: waiting ones by due time, running ones by lease
    /// deadline; completed ones (kept with `keep_completed`) latest first. For a look at a queue (what is next, what runs, what hangs), not for
    /// consuming it: the list is a snapshot and may be stale as soon as it returns.
    pub fn list(&self, which: Listing, limit: usize) -> Result<Vec<MessageInfo>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        if limit > MAX_BATCH {
            return Err(Error::invalid(
                "limit",
                format!("at most {MAX_BATCH} messages per call, got {limit}"),
            ));
        }
        let mut all = Vec::new();
        for part in 0..self.partitions() {
            let args = inspect::List {
                which: which.as_str(),
                limit,
            };
            let inspect::Listed(listed) = self.call(part, "list", Replay::Safe, inspect::list(), |inv| {
                args.add_to(inv);
            })?;
            all.extend(listed.into_iter().map(|(id, r)| self.message_info(id, r)));
        }
        // Each partition's list is in order already; merge them the same way.
        match which {
            Listing::Waiting => all.sort_by_key(|m| m.due_at_ms),
            Listing::Inflight => all.sort_by_key(|m| m.lease_until_ms),
            Listing::Completed => all.sort_by_key(|m| std::cmp::Reverse(m.completed_at_ms)),
        }
        all.truncate(limit);
        Ok(all)
    }

    /// Up to `limit` (0 to 1000) messages whose payload contains `text` (plain
    /// text, not a pattern), or whose id is `text`, in any state: waiting, running, dead, or completed and
    /// kept (`keep_completed`). For operators with an order number and a generated
    /// message id ("where is the job of order 10086?"): it scans the queue, in steps of
    /// 1000 entries so that Redis is never blocked for long, comparing on the server,
    /// so its cost grows with the queue; not for the hot path. Messages written or
    /// deleted during the scan may be missed.
    pub fn find(&self, text: &str, limit: usize) -> Result<Vec<MessageInfo>> {
        if text.is_empty() || text.len() > MAX_ID_BYTES {
            return Err(Error::invalid(
                "text",
                format!("must be 1 to {MAX_ID_BYTES} bytes, got {}", text.len()),
            ));
        }
        // What matched may be the envelope's metadata rather than the payload, the id
        // among it: a generated id is random hex, where an order number turns up by
        // chance.
        self.scan_for(text, limit, |info| info.id == text || info.payload_json.contains(text))
    }

    /// Up to `limit` (0 to 1000) messages whose payload is an object with the field
    /// `field` equal to `value` (a string, number, bool or null; `10086` is not
    /// `"10086"` nor `100861`), in any state, as [`find`](Self::find) looks: for an
    /// order number that is also a substring of others. It scans as `find` does, for
    /// `"field":value` as delayq writes JSON (without spaces), then compares exactly.
    pub fn find_field(&self, field: &str, value: &serde_json::Value, limit: usize) -> Result<Vec<MessageInfo>> {
        if field.is_empty() || field.len() > MAX_ID_BYTES {
            return Err(Error::invalid(
                "field",
                format!("must be 1 to {MAX_ID_BYTES} bytes, got {}", field.len()),
            ));
        }
        if value.is_array() || value.is_object() {
            return Err(Error::invalid(
                "value",
                "must be a string, a number, a bool or null (compare whole objects with find)",
            ));
        }
        let needle = format!("{}:{value}", serde_json::Value::String(field.to_owned()));
        if needle.len() > 2 * MAX_ID_BYTES {
            return Err(Error::invalid(
                "value",
                format!(
                    "must be at most {MAX_ID_BYTES} bytes as JSON, got {}",
                    value.to_string().len()
                ),
            ));
        }
        self.scan_for(&needle, limit, |info| {
            serde_json::from_str::<serde_json::Value>(&info.payload_json)
                .is_ok_and(|payload| payload.get(field) == Some(value))
        })
    }

    /// The scan behind `find` and `find_field`: messages whose stored text contains
    /// `text` (compared on the server), kept when `matches` says so.
    fn scan_for(&self, text: &str, limit: usize, matches: impl Fn(&MessageInfo) -> bool) -> Result<Vec<MessageInfo>> {
        if limit > MAX_BATCH {
            return Err(Error::invalid(
                "limit",
                format!("at most {MAX_BATCH} messages per call, got {limit}"),
            ));
        }
        let mut seen = BTreeSet::new();
        let mut found = Vec::new();
        for part in 0..self.partitions() {
            for which in ["messages", "completed"] {
                let mut cursor = "0".to_owned();
                loop {
                    if found.len() >= limit {
                        return Ok(found);
                    }
                    let args = inspect::Find {
                        which,
                        cursor: &cursor,
                        text,
                        count: MAX_BATCH,
                    };
                    let step: inspect::FindStep = self.call(part, "find", Replay::Safe, inspect::find(), |inv| {
                        args.add_to(inv);
                    })?;
                    cursor = step.cursor;
                    for id in step.ids {
                        // A re-pushed completed id shows its new message.
                        if found.len() < limit
                            && seen.insert(id.clone())
                            && let Some(info) = self.get(&id)?
                            && matches(&info)
                        {
                            found.push(info);
                        }
                    }
                    if cursor == "0" {
                        break;
                    }
                }
            }
        }
        Ok(found)
    }

    fn message_info(&self, id: String, r: inspect::Record) -> MessageInfo {
        let (payload_json, max_attempts, created_at_ms, expiry) =
            match envelope::decode(&self.inner.opts.layout, &r.stored) {
                Ok(d) => (d.payload_json, d.max_attempts, d.created_ms, d.expiry),
                Err(_) => (r.stored, None, None, None),
            };
        MessageInfo {
            id,
            state: r.state,
            payload_json,
            due_at_ms: r.due_ms,
            attempts: r.attempts,
            max_attempts,
            last_error: r.last_error,
            error_trace: r.error_trace,
            dead_at_ms: r.dead_at_ms,
            created_at_ms,
            lease_until_ms: r.lease_until_ms,
            expires_at_ms: expiry.map(|(_, deadline)| deadline),
            completed_at_ms: r.completed_at_ms,
            serial_key: r.serial_key,
        }
    }

    /// Depth by state and lifetime counters, summed over the partitions.
    pub fn stats(&self) -> Result<Stats> {
        self.stats_with(Replay::Safe)
    }

    pub(crate) fn stats_with(&self, replay: Replay) -> Result<Stats> {
        let mut total = Stats::default();
        for part in 0..self.partitions() {
            let s = self.partition_stats_with(part, replay)?;
            total.scheduled += s.scheduled;
            total.ready += s.ready;
            total.inflight += s.inflight;
            total.dead += s.dead;
            total.completed += s.completed;
            total.held += s.held;
            total.next_due_ms = earliest(total.next_due_ms, s.next_due_ms);
            total.paused_at_ms = earliest(total.paused_at_ms, s.paused_at_ms);
            // Every partition holds the queue's whole limit beside its own share.
            total.rate_limit = total.rate_limit.or(s.rate_limit);
            for (k, v) in s.totals {
                *total.totals.entry(k).or_insert(0) += v;
            }
        }
        Ok(total)
    }

    /// Depth and counters of one partition (0 for an unpartitioned queue).
    pub fn partition_stats(&self, part: usize) -> Result<Stats> {
        self.partition_stats_with(part, Replay::Safe)
    }

    fn partition_stats_with(&self, part: usize, replay: Replay) -> Result<Stats> {
        if part >= self.partitions() {
            return Err(Error::invalid(
                "partition",
                format!("this queue has partitions 0 to {}, not {part}", self.partitions() - 1),
            ));
        }
        let d: inspect::Depth = self.call(part, "stats", replay, inspect::stats(), |_| {})?;
        let rate_limit = d.rate_limit.map(|(max, per_ms)| RateLimit {
            max: u32::try_from(max).unwrap_or(u32::MAX),
            per: Duration::from_millis(per_ms),
        });
        Ok(Stats {
            scheduled: d.waiting.saturating_sub(d.ready),
            ready: d.ready,
            inflight: d.inflight,
            dead: d.dead,
            completed: d.completed,
            held: d.held,
            next_due_ms: d.next_due_ms,
            paused_at_ms: d.paused_at_ms,
            rate_limit,
            totals: d.counters.into_iter().collect(),
        })
    }

    /// Up to `limit` dead letters, newest first (from every partition).
    pub fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let limit = limit.min(self.inner.opts.dead_max.max(1));
        let mut all = Vec::new();
        for part in 0..self.partitions() {
            let args = dead::List { limit };
            let dead::Rows(rows) = self.call(part, "dead_letters", Replay::Safe, dead::list(), |inv| {
                args.add_to(inv);
            })?;
            all.extend(rows.into_iter().map(|r| {
                DeadLetter {
                    id: r.id,
                    payload_json: envelope::decode(&self.inner.opts.layout, &r.stored)
                        .map(|d| d.payload_json)
                        .unwrap_or(r.stored),
                    attempts: r.attempts,
                    last_error: r.last_error.unwrap_or_default(),
                    error_trace: r.error_trace,
                    dead_at_ms: r.dead_at_ms,
                }
            }));
        }
        // Each partition's list is newest first already; merge them the same way.
        all.sort_by_key(|d| std::cmp::Reverse(d.dead_at_ms));
        all.truncate(limit);
        Ok(all)
    }

    /// Send dead letters back to the queue, due now, with a fresh attempt budget: one
    /// (`Some(id)`) or all. Returns how many were requeued.
    pub fn requeue_dead(&self, id: Option<&str>) -> Result<u64> {
        self.on_dead("requeue_dead", dead::requeue(), id)
    }

    /// Delete dead letters for good, payload and all: one (`Some(id)`) or all. Returns
    /// how many were deleted. Waiting and running messages are not touched (see
    /// `cancel` and `purge`).
    pub fn delete_dead(&self, id: Option<&str>) -> Result<u64> {
        self.on_dead("delete_dead", dead::delete(), id)
    }

    /// Requeue the dead letters whose last error contains `text` (plain text, not a
    /// pattern), as `requeue_dead` does each: after the fix of one failure, the others
    /// stay dead. Returns how many were requeued. It reads the errors of the whole
    /// dead-letter set on the server, 1000 a call; a dead letter that arrives during
    /// the look may be left out.
    pub fn requeue_dead_with_error(&self, text: &str) -> Result<u64> {
        self.dead_with_error(text)?
            .iter()
            .try_fold(0, |n, id| Ok(n + self.requeue_dead(Some(id))?))
    }

    /// Delete the dead letters whose last error contains `text`, as `delete_dead` does
    /// each (see `requeue_dead_with_error`). Returns how many were deleted.
    pub fn delete_dead_with_error(&self, text: &str) -> Result<u64> {
        self.dead_with_error(text)?
            .iter()
            .try_fold(0, |n, id| Ok(n + self.delete_dead(Some(id))?))
    }

    /// The ids of the dead letters whose last error contains `text`, from every partition.
    fn dead_with_error(&self, text: &str) -> Result<Vec<String>> {
        if text.is_empty() || text.len() > MAX_ERROR_TEXT_BYTES {
            return Err(Error::invalid(
                "text",
                format!("must be 1 to {MAX_ERROR_TEXT_BYTES} bytes, got {}", text.len()),
            ));
        }
        let mut found = Vec::new();
        for part in 0..self.partitions() {
            let mut first = Some(0);
            while let Some(from) = first {
                let args = dead::Matching {
                    first: from,
                    count: MAX_BATCH,
                    text,
                };
                let step: dead::MatchStep =
                    self.call(part, "dead_with_error", Replay::Safe, dead::matching(), |inv| {
                        args.add_to(inv);
                    })?;
                first = step.next;
                found.extend(step.ids);
            }
        }
        Ok(found)
    }

    fn on_dead(&self, operation: &'static str, script: &LuaScript, id: Option<&str>) -> Result<u64> {
        if let Some(id) = id {
            validate_id(id)?;
            let Count(n) = self.call_by_id(
                id,
                operation,
                Replay::Safe,
                script,
                |inv| dead::Selection::One(id).add_to(inv),
                |Count(n): &Count| *n > 0,
            )?;
            return Ok(n);
        }
        let mut total = 0;
        for part in 0..self.partitions() {
            loop {
                // Batches keep each call short; a crash between batches leaves the rest as they were.
                let Count(n) = self.call(part, operation, Replay::Safe, script, |inv| {
                    dead::Selection::Oldest(MAX_BATCH).add_to(inv);
                })?;
                total += n;
                if n < MAX_BATCH as u64 {
                    break;
                }
            }
        }
        Ok(total)
    }

    /// The consumer pools working on this queue, from every host and language, oldest
    /// first. A pool renews its entry in the partition its claim goes to, so the
    /// partitions' lists are merged, each pool at its latest renewal.
    pub fn workers(&self) -> Result<Vec<WorkerInfo>> {
        let mut latest: BTreeMap<String, WorkerInfo> = BTreeMap::new();
        for part in 0..self.partitions() {
            let pools: inspect::Pools = self.call(part, "workers", Replay::Safe, inspect::workers(), |_| {})?;
            let now = pools.now_ms;
            for info in pools.entries.iter().filter_map(|(_, entry)| live_pool(entry, now)) {
                if latest
                    .get(&info.id)
                    .is_none_or(|seen| seen.last_seen_ms < info.last_seen_ms)
                {
                    latest.insert(info.id.clone(), info);
                }
            }
        }
        let mut out: Vec<WorkerInfo> = latest.into_values().collect();
        out.sort_by(|a, b| (a.started_at_ms, &a.id).cmp(&(b.started_at_ms, &b.id)));
        Ok(out)
    }

    /// Define a repeating message, or change one: `name` pushes `payload` once per
    /// occurrence of `schedule`, as an ordinary message with the id
    /// `repeat:<name>:<due_ms>` (retries, dead letters and the rest as usual). Calling
    /// it again with the same schedule and payload changes nothing, so a deploy may call
    /// it every time; a different one replaces the definition and its waiting
    /// occurrence. Consumer pools push each next occurrence (see the `repeat` module).
    /// Returns the due time (Unix ms) of the next occurrence.
    pub fn repeat<T: Serialize + ?Sized>(&self, name: &str, schedule: &Schedule, payload: &T) -> Result<i64> {
        self.repeat_json(name, schedule, &to_json(payload)?, &RepeatOptions::default())
    }

    /// `repeat` with the payload as JSON text and options for every occurrence.
    pub fn repeat_json(
        &self,
        name: &str,
        schedule: &Schedule,
        payload_json: &str,
        options: &RepeatOptions,
    ) -> Result<i64> {
        validate_repeat_name(name)?;
        envelope::validate_payload(payload_json, self.inner.opts.max_payload_bytes)?;
        validate_max_attempts(&self.inner.opts.layout, options.max_attempts)?;
        let expire_after = expire_after_ms(&self.inner.opts.layout, options.expire_after)?;
        let now = crate::time::now_unix_ms();
        let first = schedule
            .next_after(None, now)
            .ok_or_else(|| Error::invalid("schedule", format!("{} never occurs after now", schedule.describe())))?;
        let definition = repeat::definition(schedule, payload_json, options);
        let envelope = envelope::encode(
            &self.inner.opts.layout,
            &repeat::occurrence_id(name, first),
            payload_json,
            options.max_attempts,
            expire_after,
            now,
        );
        let args = repeat_script::Occurrence {
            name,
            definition: &definition,
            due_ms: first,
            envelope: &envelope,
        };
        self.call(
            self.repeat_partition(name),
            "repeat",
            Replay::Safe,
            repeat_script::set(),
            |inv| args.add_to(inv),
        )
    }

    /// Stop a repeating message; its occurrence that still waits is cancelled (one
    /// that runs finishes). Returns whether it existed.
    pub fn unrepeat(&self, name: &str) -> Result<bool> {
        validate_repeat_name(name)?;
        let Flag(existed) = self.call(
            self.repeat_partition(name),
            "unrepeat",
            Replay::Safe,
            repeat_script::delete(),
            |inv| repeat_script::Named { name }.add_to(inv),
        )?;
        Ok(existed)
    }

    /// Every repeating message of the queue, by name.
    pub fn repeats(&self) -> Result<Vec<RepeatInfo>> {
        let mut all = Vec::new();
        for part in 0..self.partitions() {
            for repeat_script::Definition { name, definition, mark } in self.repeat_definitions(part, "")? {
                let (schedule, payload_json, options) = repeat::parse_definition(&name, &definition)?;
                all.push(RepeatInfo {
                    name,
                    schedule,
                    payload_json,
                    max_attempts: options.max_attempts,
                    expire_after: options.expire_after,
                    next_due_ms: mark,
                });
            }
        }
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    pub(crate) fn repeat_partition(&self, name: &str) -> usize {
        partition_of(name, self.partitions())
    }

    /// (name, definition text, mark) of one repeat (`name`) or all (`""`).
    pub(crate) fn repeat_definitions(&self, part: usize, name: &str) -> Result<Vec<repeat_script::Definition>> {
        let repeat_script::Definitions(all) =
            self.call(part, "repeats", Replay::Safe, repeat_script::list(), |inv| {
                repeat_script::Named { name }.add_to(inv);
            })?;
        Ok(all)
    }

    /// Push the occurrence of a repeat that follows the one due at `previous_ms` (and
    /// now), computed from `definition` as read from Redis. Returns whether one was
    /// pushed (not when another pool was first, or the definition changed meanwhile).
    pub(crate) fn push_next_occurrence(
        &self,
        part: usize,
        name: &str,
        definition: &str,
        previous_ms: Option<i64>,
    ) -> Result<bool> {
        let (schedule, payload_json, options) = repeat::parse_definition(name, definition)?;
        let now = crate::time::now_unix_ms();
        let Some(due) = schedule.next_after(previous_ms, now) else {
            return Ok(false);
        };
        // Taken as stored: the definition was checked when it was written.
        let expire_after = options
            .expire_after
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let envelope = envelope::encode(
            &self.inner.opts.layout,
            &repeat::occurrence_id(name, due),
            &payload_json,
            options.max_attempts,
            expire_after,
            now,
        );
        let args = repeat_script::Occurrence {
            name,
            definition,
            due_ms: due,
            envelope: &envelope,
        };
        let Flag(pushed) = self.call(part, "repeat_next", Replay::Safe, repeat_script::next(), |inv| {
            args.add_to(inv);
        })?;
        Ok(pushed)
    }

    /// Stop consumption on every partition, for every consumer pool on any host, until
    /// `resume`: claims hand out nothing, so no handler starts a new message except
    /// those a pool had already prefetched (about 50 ms of work per handler). Running
    /// handlers finish and complete as usual, pushes keep being accepted, and idle
    /// pools keep their cost of one look per `idle_check`. Returns whether the queue
    /// was running (pausing a paused queue keeps the first pause's time).
    pub fn pause(&self) -> Result<bool> {
        self.set_paused(true)
    }

    /// Undo `pause`: consumers waiting since are woken at once. Returns whether the
    /// queue was paused.
    pub fn resume(&self) -> Result<bool> {
        self.set_paused(false)
    }

    /// Whether `pause` is in force (on any partition).
    pub fn is_paused(&self) -> Result<bool> {
        Ok(self.stats()?.paused_at_ms.is_some())
    }

    fn set_paused(&self, paused: bool) -> Result<bool> {
        let operation = if paused { "pause" } else { "resume" };
        let mut changed = false;
        for part in 0..self.partitions() {
            let Flag(changed_here) = self.call(part, operation, Replay::Safe, admin::pause(), |inv| {
                admin::Pause { paused }.add_to(inv);
            })?;
            changed |= changed_here;
        }
        Ok(changed)
    }

    /// Cap how fast consumers are handed this queue's messages: at most `limit.max` in
    /// any window of `limit.per` (sliding, not aligned to the clock), over every pool
    /// on every host and in every language, retries and re-deliveries included, e.g.
    /// to stay within a payment provider's quota. Kept in Redis, like `pause`, until
    /// changed or cleared; pools pick it up at their next claim and sleep until the
    /// window has room, with no extra commands. A partitioned queue splits `max` among
    /// its partitions (so it must be at least the partition count); each partition
    /// holds its share, so a partition with little traffic leaves its share unused.
    pub fn set_rate_limit(&self, limit: RateLimit) -> Result<()> {
        let parts = self.partitions();
        limit.validate(parts)?;
        let per_ms = u64::try_from(limit.per.as_millis()).unwrap_or(u64::MAX);
        for (part, share) in limit.shares(parts).enumerate() {
            let Flag(_) = self.call(part, "set_rate_limit", Replay::Safe, admin::limit(), |inv| {
                admin::Limit {
                    set: Some((share, per_ms, limit.max)),
                }
                .add_to(inv);
            })?;
        }
        Ok(())
    }

    /// Lift the rate limit; pools it held back are woken at once. Returns whether one
    /// was in force.
    pub fn clear_rate_limit(&self) -> Result<bool> {
        let mut had = false;
        for part in 0..self.partitions() {
            let Flag(had_here) = self.call(part, "clear_rate_limit", Replay::Safe, admin::limit(), |inv| {
                admin::Limit { set: None }.add_to(inv);
            })?;
            had |= had_here;
        }
        Ok(had)
    }

    /// The rate limit in force, if any.
    pub fn rate_limit(&self) -> Result<Option<RateLimit>> {
        Ok(self.partition_stats(0)?.rate_limit)
    }

    /// Ask every consumer pool running on this queue, on every host and in every
    /// language, to stop gracefully, e.g. after a deploy: each finishes its running
    /// handlers, releases what it had prefetched and returns from `run` with
    /// `Stopper::restart_requested`, so that its process manager starts the new code
    /// (Laravel's `queue:restart`). Idle pools are woken at once; workers started after
    /// the request are not affected. Returns how many pools were alive when asked.
    pub fn restart_workers(&self) -> Result<usize> {
        // A pool registers in every partition it serves: count each once.
        let mut asked = BTreeSet::new();
        for part in 0..self.partitions() {
            let Ids(pools) = self.call(part, "restart_workers", Replay::Safe, admin::restart(), |_| {})?;
            asked.extend(pools);
        }
        Ok(asked.len())
    }

    /// Delete every message in every state. Returns how many were deleted. A message
    /// that a pool holds already (running, or prefetched in its memory) may still reach
    /// a handler; its acknowledgement then finds it gone. Stop the pools first to run
    /// nothing more.
    pub fn purge(&self) -> Result<u64> {
        let mut total = 0;
        for part in 0..self.partitions() {
            let Count(n) = self.call(part, "purge", Replay::IfNotSent, admin::purge(), |_| {})?;
            total += n;
        }
        Ok(total)
    }
}
