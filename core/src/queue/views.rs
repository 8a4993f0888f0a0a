//! What the read calls return: `MessageInfo`, `State`, `Listing`, `Stats` and its
//! counters, `DeadLetter`, `WorkerInfo` (and reading a pool's entry).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{Queue, RateLimit};

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
    /// The payload as JSON text (or the raw stored text when it is not valid JSON);
    /// "" when a listing left it out (see `payload_omitted_bytes`).
    pub payload_json: String,
    /// Set when a listing (`list`, `find`) left the payload out because the stored
    /// message is larger than its bound ([`Queue::LISTED_PAYLOAD_BYTES`] by default):
    /// its stored size in bytes (the payload and delayq's few dozen bytes of metadata
    /// around it, which is not read either: `max_attempts`, `created_at_ms` and
    /// `expires_at_ms` are then `None`, and so is an inflight message's `due_at_ms`).
    /// `get` of its id reads it whole. `None` when the payload is there.
    pub payload_omitted_bytes: Option<u64>,
    /// Due time of the pending or current delivery (of a completed message: of the
    /// delivery that completed it), Unix ms; `None` once dead, and for a running or
    /// completed message whose envelope has no stamp (one edited by hand: nothing
    /// tells it).
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
    /// when the failure gave none. A listing cuts it further, to
    /// [`Queue::LISTED_TRACE_BYTES`], and the last error to [`MAX_ERROR_TEXT_BYTES`],
    /// as the worker cuts a trace: the start and the end around a note of how many
    /// bytes were left out (`get` shows both whole).
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
    /// `PushOptions::group`, while the message waits, runs or is dead.
    pub group: Option<String>,
    /// Why a due message waits in its serial key's or group's line (`get` and the
    /// waiting listings), e.g.
    /// "group merchant-42 runs 3 of its concurrency limit of 3".
    pub held: Option<String>,
    /// It runs and was cancelled meanwhile (`Queue::cancel`): its delivery ends as
    /// cancelled whatever its handler does. The mark is read from the stored message,
    /// so a listing that left the payload out (`payload_omitted_bytes`) shows `false`;
    /// `get` always tells.
    pub cancelled: bool,
}

impl Queue {
    /// Largest stored message (payload and envelope) that the listings (`list`,
    /// `dead_letters`, `find`) show whole by default; a larger one comes with
    /// `payload_omitted_bytes` instead of its payload, so that a producer that writes
    /// huge payloads past its own `max_payload_bytes` (or straight into Redis) cannot
    /// make a listing too slow or too large to show its queue.
    pub const LISTED_PAYLOAD_BYTES: usize = 64 * 1024;

    /// Longest error trace a listing shows whole: a longer one keeps its start and
    /// its end. Twice a worker's default `max_trace_bytes`, so that only a trace kept
    /// past that default (or written by hand) is cut, and more than the dashboard
    /// shows, which then still points at the whole trace.
    pub const LISTED_TRACE_BYTES: usize = 16 * 1024;
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

/// Longest text that `requeue_dead_with_error` and `delete_dead_with_error` look for,
/// and the longest last error a listing shows whole.
pub const MAX_ERROR_TEXT_BYTES: usize = 4096;

/// A message in the dead-letter set.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    /// The message id.
    pub id: String,
    /// The payload as JSON text, as pushed; "" when the listing left it out (see
    /// `payload_omitted_bytes`).
    pub payload_json: String,
    /// Set when the listing left the payload out, as [`MessageInfo::payload_omitted_bytes`]
    /// says: the stored size in bytes.
    pub payload_omitted_bytes: Option<u64>,
    /// Deliveries it had.
    pub attempts: u32,
    /// The error that sent it here (cut as [`MessageInfo::error_trace`] says).
    pub last_error: String,
    /// The stack trace that came with the last error, if any (see
    /// [`MessageInfo::error_trace`], which says how a listing cuts it).
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

/// A pool's entry as beat.lua stored it ("<expires_ms>|<seen_ms>|<info JSON>"), unless
/// it has expired (or was written by a version that this one cannot read).
pub(super) fn live_pool(entry: &str, now_ms: i64) -> Option<WorkerInfo> {
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
