//! The consumer pool: native threads that claim, extend, acknowledge and reap, and a
//! hand-off so that handlers can run on the caller's own thread (what PHP and Python
//! need) or on the pool's threads (pure Rust).
//!
//! Threads of one running pool, each with its own connection:
//! - `threads` fetchers: claim due messages in batches into a bounded prefetch buffer,
//!   then sleep on a client-side timer until the next due time (no polling);
//! - one subscriber: listens for producers' wake-ups on the queue's channel;
//! - one completer: writes acks, nacks and releases in batches;
//! - one heartbeat: extends the leases of everything claimed and not yet completed.
//!
//! A worker with lower-priority queues runs one such pool per queue and hands the
//! caller a delivery of a lower queue only when no higher one has a delivery waiting;
//! a lower pool claims nothing while a higher one holds unstarted deliveries, is
//! claiming or knows of due messages (see `Pool::yields_to_higher`).

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Select, Sender, TryRecvError};
use parking_lot::{Condvar, Mutex};
use redis::Value;
use serde::de::DeserializeOwned;

use crate::backoff::retry_delay;
use crate::conn::{ConnSlot, Replay};
use crate::envelope;
use crate::error::{Category, Error, Result};
use crate::queue::Queue;
use crate::repeat;
use crate::scripts::complete::{self, Status};
use crate::scripts::{self, Call, MAX_BATCH, beat, claim, extend};
use crate::time::MAX_DELAY;

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

    fn prefetch_limit(&self) -> usize {
        if self.prefetch == 0 {
            self.batch * self.threads
        } else {
            self.prefetch.max(1)
        }
    }

    fn heartbeat(&self) -> Duration {
        (self.lease / 3).max(Duration::from_millis(30))
    }
}

/// How a failed delivery goes on (see [`Consumer::fail_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Retry {
    /// After the worker's exponential backoff (what a plain failure does).
    Backoff,
    /// After this delay, measured on the Redis server's clock (at most `MAX_DELAY`).
    After(Duration),
    /// Not at all: to the dead-letter set now.
    Never,
}

/// Where a failed delivery sends its message (the write follows at once; it changes
/// nothing if the lease passed to another delivery meanwhile).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fate {
    /// Due again after this delay.
    Retry(Duration),
    /// To the dead-letter set, with this last error: its attempts are used up, or the
    /// handler gave up on it. A death handler (Sidekiq's name) alerts on it.
    Dead(String),
}

/// One delivery of a message to a handler.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The message id.
    pub id: String,
    /// 1 for the first delivery.
    pub attempt: u32,
    /// When this delivery was due, Unix ms (the requested time, or the retry's).
    pub due_at_ms: i64,
    /// The name of the queue it came from (with lower queues, which one).
    pub queue: Arc<str>,
    /// Deliveries allowed in all (the message's own limit, else the worker's).
    pub max_attempts: u32,
    /// With `PushOptions::expire_after`: the latest it may start, Unix ms on the Redis
    /// clock (this delivery started in time; a re-delivery after it would not).
    pub expires_at_ms: Option<i64>,
    /// With `PushOptions::serial_key`: no other message of this key runs meanwhile.
    pub serial_key: Option<String>,
    payload_json: String,
    token: String,
    part: usize,
    /// Which of its worker's queues (0: the worker's own, then its lower queues).
    member: usize,
    handed_out: Option<Instant>,
}

impl Delivery {
    /// The payload as JSON text, byte for byte as pushed.
    pub fn payload_json(&self) -> &str {
        &self.payload_json
    }

    /// The payload decoded into `T`.
    pub fn payload<T: DeserializeOwned>(&self) -> Result<T> {
        envelope::decode_payload(&self.payload_json)
    }

    /// The fencing token of this delivery: a later delivery of the same message has
    /// another one, and only the current one may complete it.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The partition of the queue it came from (0 on an unpartitioned queue).
    pub fn partition(&self) -> usize {
        self.part
    }

    /// Which of its worker's queues it came from (0: the worker's own).
    pub(crate) fn member(&self) -> usize {
        self.member
    }

    #[cfg(test)]
    pub(crate) fn for_test(id: &str, lease: &str, attempt: u32, max_attempts: u32, part: usize, member: usize) -> Self {
        Self {
            id: id.to_owned(),
            attempt,
            due_at_ms: 0,
            queue: Arc::from("test"),
            max_attempts,
            expires_at_ms: None,
            serial_key: None,
            payload_json: "null".to_owned(),
            token: lease.to_owned(),
            part,
            member,
            handed_out: None,
        }
    }
}

/// Fail a delivery that its own process can no longer complete (the supervisor killed
/// it): counted as an attempt, due again after `delay`, or to the dead letters once its
/// attempts are used up, as `Consumer::fail_with` would. The lease fences it: a
/// delivery completed meanwhile is left alone (`Ok(None)`).
pub(crate) fn fail_lease(
    queue: &Queue,
    held: &crate::host::Held,
    error: &str,
    delay: Duration,
) -> Result<Option<Fate>> {
    let crate::host::Held {
        part,
        id,
        lease,
        attempt,
        max_attempts,
        ..
    } = held;
    let (part, attempt, max_attempts) = (*part, *attempt, *max_attempts);
    let qo = queue.options();
    let retry = attempt < max_attempts;
    let error = if !retry && max_attempts > 1 {
        format!("{error} (gave up after {attempt} attempts)")
    } else {
        error.to_owned()
    };
    let args = complete::Nack {
        dead_max: qo.dead_max,
        dead_ttl_ms: qo.dead_ttl.as_millis() as u64,
        failures: vec![complete::Failure {
            delivery: complete::Delivery { id, lease },
            retry_in_ms: retry.then(|| u64::try_from(delay.min(MAX_DELAY).as_millis()).unwrap_or(u64::MAX)),
            error: &error,
            trace: "",
            keep_last_error: false,
            unrun: false,
        }],
    };
    // One try: the supervisor that calls this must not stand still while Redis is away
    // (processes tend to die then, one after another); the lease brings the message
    // back all the same.
    let mut slot = ConnSlot::new();
    let res = slot
        .run_once(&queue.inner.endpoint, "nack", |con| {
            let mut inv = queue.invocation(part, complete::nack());
            args.add_to(&mut inv);
            inv.invoke::<Value>(con)
        })
        .and_then(|v| scripts::read::<complete::Statuses>(complete::nack(), v))?;
    Ok(match res.0.first() {
        Some(Status::Done) if retry => Some(Fate::Retry(delay)),
        Some(Status::Done | Status::Buried) => Some(Fate::Dead(error)),
        _ => None,
    })
}

/// What a consumer's `recv_timeout` returns.
#[derive(Debug)]
pub enum Received {
    /// A delivery to handle, then `ack` or `fail`.
    Message(Delivery),
    /// Nothing arrived within the timeout.
    Idle,
    /// The pool is stopping: hand out nothing more, then call `finish`.
    Stopped,
}

/// Counts of one run of the pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Deliveries handed to the handler.
    pub handled: u64,
    /// Successful handler calls whose ack was written.
    pub acked: u64,
    /// Handler calls that failed (retried or dead-lettered).
    pub failed: u64,
    /// Of the failures, scheduled for another attempt.
    pub retried: u64,
    /// Of the failures, sent to the dead-letter set.
    pub dead: u64,
    /// Completions refused because the lease had passed to another delivery.
    pub lease_lost: u64,
    /// Completions of messages deleted while they ran (`cancel`, `purge`, a flush of
    /// Redis): nothing was left to complete.
    pub gone: u64,
    /// Prefetched, never-started deliveries released at stop.
    pub released: u64,
    /// Completions that could not be written before their lease ran out (Redis
    /// unreachable); those messages will be delivered again.
    pub unwritten: u64,
}

#[derive(Default)]
struct Counters {
    handled: AtomicU64,
    acked: AtomicU64,
    failed: AtomicU64,
    retried: AtomicU64,
    dead: AtomicU64,
    lease_lost: AtomicU64,
    gone: AtomicU64,
    released: AtomicU64,
    unwritten: AtomicU64,
}

impl Summary {
    /// Every count by name, in one order: what the bindings report (PHP's summary
    /// array, Python's dict) and what a supervised process sends its parent.
    pub fn counts(&self) -> [(&'static str, u64); 9] {
        [
            ("handled", self.handled),
            ("acked", self.acked),
            ("failed", self.failed),
            ("retried", self.retried),
            ("dead", self.dead),
            ("lease_lost", self.lease_lost),
            ("gone", self.gone),
            ("released", self.released),
            ("unwritten", self.unwritten),
        ]
    }

    /// A summary from counts by name, as `counts` gives them (a count named twice is
    /// summed); a name it does not know is an error naming it (a process of another
    /// version reporting).
    pub fn from_counts<'a>(counts: impl IntoIterator<Item = (&'a str, u64)>) -> Result<Self> {
        let mut s = Self::default();
        for (name, n) in counts {
            let field = match name {
                "handled" => &mut s.handled,
                "acked" => &mut s.acked,
                "failed" => &mut s.failed,
                "retried" => &mut s.retried,
                "dead" => &mut s.dead,
                "lease_lost" => &mut s.lease_lost,
                "gone" => &mut s.gone,
                "released" => &mut s.released,
                "unwritten" => &mut s.unwritten,
                other => return Err(Error::invalid("summary", format!("no count is named {other:?}"))),
            };
            *field += n;
        }
        Ok(s)
    }
}

/// Sums runs: a worker's queues, or the processes of a supervised pool.
impl std::ops::AddAssign<&Summary> for Summary {
    fn add_assign(&mut self, other: &Self) {
        self.handled += other.handled;
        self.acked += other.acked;
        self.failed += other.failed;
        self.retried += other.retried;
        self.dead += other.dead;
        self.lease_lost += other.lease_lost;
        self.gone += other.gone;
        self.released += other.released;
        self.unwritten += other.unwritten;
    }
}

impl Counters {
    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    fn summary(&self) -> Summary {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Summary {
            handled: g(&self.handled),
            acked: g(&self.acked),
            failed: g(&self.failed),
            retried: g(&self.retried),
            dead: g(&self.dead),
            lease_lost: g(&self.lease_lost),
            gone: g(&self.gone),
            released: g(&self.released),
            unwritten: g(&self.unwritten),
        }
    }
}

/// When each partition should next be looked at, shared by the fetchers; wakes them
/// on stop, when a producer publishes an earlier due time, and when a fetcher finds
/// more work than it can take.
struct Wake {
    state: Mutex<WakeState>,
    cv: Condvar,
}

struct WakeState {
    epoch: u64,
    /// A moment on the local monotonic clock and the Redis clock reading for it, so
    /// that due times (server ms) become local deadlines.
    clock: Option<(Instant, i64)>,
    /// Per partition: the earliest due time producers announced, or "now" after a
    /// kick, as a local deadline. A claim of the partition clears a passed one.
    announced: Vec<Option<Instant>>,
    /// Per partition: when the last claim said its next message is due; `None` when
    /// it found the partition empty.
    next_due: Vec<Option<Instant>>,
}

impl WakeState {
    fn due_at(&self, part: usize) -> Option<Instant> {
        match (self.announced[part], self.next_due[part]) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// What a fetcher should do next.
enum Pick {
    /// Claim from this partition now; `due` partitions are due in all.
    Claim { part: usize, due: usize },
    /// Nothing is due before this moment (`None`: nothing known to be due at all).
    Sleep(Option<Instant>),
}

impl Wake {
    fn new(partitions: usize) -> Self {
        Self {
            state: Mutex::new(WakeState {
                epoch: 0,
                clock: None,
                announced: vec![None; partitions],
                next_due: vec![None; partitions],
            }),
            cv: Condvar::new(),
        }
    }

    /// Look at every partition now (start, a new subscription, the end of a stall).
    fn kick(&self) {
        let now = Instant::now();
        let mut st = self.state.lock();
        st.announced.iter_mut().for_each(|a| *a = Some(now));
        st.epoch += 1;
        drop(st);
        self.cv.notify_all();
    }

    /// Wake every waiter without changing what is due (stop).
    fn interrupt(&self) {
        self.state.lock().epoch += 1;
        self.cv.notify_all();
    }

    fn epoch(&self) -> u64 {
        self.state.lock().epoch
    }

    fn set_clock(&self, local: Instant, server_ms: i64) {
        self.state.lock().clock = Some((local, server_ms));
    }

    /// The Redis server's clock now, from the last claim's reading.
    fn server_now_ms(&self) -> Option<i64> {
        let (local, server_ms) = self.state.lock().clock?;
        Some(server_ms + i64::try_from(local.elapsed().as_millis()).unwrap_or(i64::MAX))
    }

    fn local_deadline(st: &WakeState, server_ms: i64) -> Option<Instant> {
        let (local, server_now) = st.clock?;
        let ahead = server_ms - server_now;
        Some(if ahead <= 0 {
            local
        } else {
            local + Duration::from_millis(u64::try_from(ahead).unwrap_or(0))
        })
    }

    /// A producer announced a message due at `server_ms` on partition `part`.
    fn offer_due(&self, part: usize, server_ms: Option<i64>) {
        let mut st = self.state.lock();
        if part >= st.announced.len() {
            return;
        }
        let at = server_ms
            .and_then(|ms| Self::local_deadline(&st, ms))
            .unwrap_or_else(Instant::now);
        if st.announced[part].is_none_or(|e| at < e) {
            st.announced[part] = Some(at);
            st.epoch += 1;
            drop(st);
            self.cv.notify_all();
        }
    }

    /// Whether some partition is known to have a message due (announced, or the last
    /// claim filled its batch), or is to be looked at now.
    fn due_now(&self) -> bool {
        let st = self.state.lock();
        let now = Instant::now();
        (0..st.announced.len()).any(|part| st.due_at(part).is_some_and(|t| t <= now))
    }

    /// The first partition from `cursor` on that is due now, and the epoch this
    /// answer was read in (for `wait`).
    fn pick(&self, cursor: usize, now: Instant) -> (Pick, u64) {
        let st = self.state.lock();
        let n = st.announced.len();
        let mut earliest: Option<Instant> = None;
        let mut first_due = None;
        let mut due = 0;
        for part in (cursor..n).chain(0..cursor) {
            match st.due_at(part) {
                Some(t) if t <= now => {
                    first_due.get_or_insert(part);
                    due += 1;
                }
                Some(t) => earliest = Some(earliest.map_or(t, |e| e.min(t))),
                None => {}
            }
        }
        let pick = match first_due {
            Some(part) => Pick::Claim { part, due },
            None => Pick::Sleep(earliest),
        };
        (pick, st.epoch)
    }

    /// A claim of `part` starts: announcements it answers are spent.
    fn begin_claim(&self, part: usize, now: Instant) {
        let mut st = self.state.lock();
        if st.announced[part].is_some_and(|a| a <= now) {
            st.announced[part] = None;
        }
    }

    /// A claim of `part` ended: it filled its batch (`more`, so look again now and let
    /// idle siblings join in), or the partition's next message is due at `next_ms`
    /// (server clock; negative when it is empty).
    fn end_claim(&self, part: usize, more: bool, next_ms: i64) {
        let mut st = self.state.lock();
        st.next_due[part] = if more {
            Some(Instant::now())
        } else if next_ms >= 0 {
            Self::local_deadline(&st, next_ms)
        } else {
            None
        };
        if more {
            st.epoch += 1;
            drop(st);
            self.cv.notify_all();
        }
    }

    /// A claim of `part` failed: look again once the caller's pause is over.
    fn retry_claim(&self, part: usize) {
        self.state.lock().announced[part] = Some(Instant::now());
    }

    /// Sleep until `deadline`, a change after `seen` (an announcement, a kick), or
    /// stop.
    fn wait(&self, deadline: Option<Instant>, seen: u64, stop: &AtomicBool) {
        let mut st = self.state.lock();
        loop {
            if stop.load(Ordering::Acquire) || st.epoch != seen {
                return;
            }
            match deadline {
                Some(t) if t <= Instant::now() => return,
                Some(t) => {
                    self.cv.wait_until(&mut st, t);
                }
                None => self.cv.wait(&mut st),
            }
        }
    }
}

/// Room in the prefetch buffer: claimed but not yet completed deliveries.
struct Slots {
    free: Mutex<usize>,
    cv: Condvar,
}

impl Slots {
    fn acquire_up_to(&self, want: usize, stop: &AtomicBool) -> usize {
        let mut free = self.free.lock();
        while *free == 0 {
            if stop.load(Ordering::Acquire) {
                return 0;
            }
            self.cv.wait(&mut free);
        }
        let got = want.min(*free);
        *free -= got;
        got
    }

    fn wait_for_release(&self, limit: Duration) {
        let mut free = self.free.lock();
        self.cv.wait_for(&mut free, limit);
    }

    fn release(&self, n: usize) {
        if n > 0 {
            *self.free.lock() += n;
            self.cv.notify_all();
        }
    }
}

/// Shared by a `Worker` and the pool it runs, so `stop` works before and during `run`.
struct Control {
    stop: AtomicBool,
    /// The stop came from `Queue::restart_workers` (see `Stopper::restart_requested`).
    restart: AtomicBool,
    /// The stop came from `stop_when_empty` (see `Stopper::found_empty`).
    empty: AtomicBool,
    wake: Wake,
    slots: Slots,
    /// Each partition's restart generation when this worker started (see restart.lua):
    /// set once, by the first start, and inherited by processes forked after it.
    restart_baseline: Vec<std::sync::OnceLock<u64>>,
    /// `fork::generation() + 1` of the process whose threads run the pool, 0 while
    /// none runs: a process forked meanwhile (by a handler) tells itself apart by it.
    pool_process: AtomicU64,
}

impl Control {
    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if self.in_forked_child() {
            // Nobody here waits on these, and a lock that a pool thread held at the
            // fork stays held in this process for ever.
            return;
        }
        self.wake.interrupt();
        let _free = self.slots.free.lock();
        self.slots.cv.notify_all();
    }

    /// Whether this process was forked while the pool ran: the pool's threads stayed
    /// in the parent, and what this process holds of it is a copy frozen at the fork.
    fn in_forked_child(&self) -> bool {
        let owner = self.pool_process.load(Ordering::Acquire);
        owner != 0 && owner != crate::fork::generation() + 1
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

/// Whether the pools of one worker (its own queue's and its lower queues') are done.
/// A queue found empty (`stop_when_empty`) ends only its own pool; any other stop (a
/// call, a signal, a restart request) ends them all.
fn group_stopped(controls: &[Arc<Control>]) -> bool {
    let (mut all, mut ending) = (true, false);
    for c in controls {
        if c.stopped() {
            ending |= !c.empty.load(Ordering::Acquire);
        } else {
            all = false;
        }
    }
    if ending && !all {
        controls.iter().for_each(|c| c.stop());
        return true;
    }
    all
}

/// Stops a running (or about to run) pool from any thread or a signal handler's
/// thread; the pool finishes the running handlers and returns the prefetched rest.
#[derive(Clone)]
pub struct Stopper(Arc<[Arc<Control>]>);

impl std::fmt::Debug for Stopper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Stopper").field(&self.is_stopped()).finish()
    }
}

impl Stopper {
    /// Stop gracefully: running handlers finish and are acknowledged, prefetched
    /// deliveries go back to the queue at once. Returns at once.
    pub fn stop(&self) {
        self.0.iter().for_each(|c| c.stop());
    }

    /// Whether a stop was asked for.
    pub fn is_stopped(&self) -> bool {
        group_stopped(&self.0)
    }

    /// Whether the pool stopped because `Queue::restart_workers` asked every pool
    /// started before it to stop (the caller's process should exit and be started
    /// anew by its process manager); with lower queues, a request on any of them.
    pub fn restart_requested(&self) -> bool {
        self.0.iter().any(|c| c.restart.load(Ordering::Acquire))
    }

    /// Whether the pool stopped because, with `stop_when_empty`, no message was due
    /// and none ran (with lower queues: on every one of them).
    pub fn found_empty(&self) -> bool {
        self.0.iter().all(|c| c.empty.load(Ordering::Acquire))
    }
}

enum Outcome {
    Ack {
        part: usize,
        id: String,
        token: String,
    },
    /// `delay_ms` < 0 buries the message in the dead-letter set.
    Nack {
        part: usize,
        id: String,
        token: String,
        delay_ms: i64,
        error: String,
        /// Empty when there is none.
        trace: String,
        counted: bool,
        /// Buried at its claim because earlier deliveries used up `max_attempts`: this
        /// one did not run (no attempt is counted) and the stored last error is kept
        /// beside `error`.
        past_max_attempts: bool,
    },
    Release {
        part: usize,
        id: String,
        token: String,
    },
}

impl Outcome {
    /// The delivery it completes, as the scripts take it.
    fn delivery(&self) -> complete::Delivery<'_> {
        match self {
            Self::Ack { id, token, .. } | Self::Nack { id, token, .. } | Self::Release { id, token, .. } => {
                complete::Delivery { id, lease: token }
            }
        }
    }

    fn token(&self) -> &str {
        match self {
            Self::Ack { token, .. } | Self::Nack { token, .. } | Self::Release { token, .. } => token,
        }
    }

    fn part(&self) -> usize {
        match self {
            Self::Ack { part, .. } | Self::Nack { part, .. } | Self::Release { part, .. } => *part,
        }
    }

    fn release(d: Delivery) -> Self {
        Self::Release {
            part: d.part,
            id: d.id,
            token: d.token,
        }
    }
}

struct Outstanding {
    part: usize,
    id: String,
    claimed: Instant,
    started: Option<Instant>,
    timed_out: bool,
    /// When its lease was last known live: the claim, then each renewal.
    renewed: Instant,
}

struct Pool {
    queue: Queue,
    queue_name: Arc<str>,
    opts: WorkerOptions,
    control: Arc<Control>,
    counters: Counters,
    /// Claimed, not yet completed, by token.
    outstanding: Mutex<HashMap<String, Outstanding>>,
    /// Deliveries the caller works on at once (its handler threads or tasks).
    handlers: usize,
    /// Every handler is past `timeout`: claim nothing, and give prefetched deliveries
    /// back so that other consumers run them instead of waiting behind a hung handler.
    stalled: AtomicBool,
    /// The hand-off buffer, for giving prefetched deliveries back while stalled.
    buffered: Receiver<Delivery>,
    /// Moving average of one handler call, in microseconds (0 until measured).
    handler_us: AtomicU64,
    /// Handler starts and how late they were: since the last renewal built, and in
    /// the renewal waiting to be sent (see `Registration`).
    lateness: Mutex<(Lateness, Lateness)>,
    registration: Registration,
    /// The last claim found the queue paused (see `note_paused`).
    paused: AtomicBool,
    /// Per partition: when a claim next asks for broken repeats.
    repeat_checks: Mutex<Vec<Instant>>,
    /// Per partition: its last claim found a rate limit in force.
    rate_limited: Vec<AtomicBool>,
    /// When its `Worker` was made, locally and on the server's clock (learnt from the
    /// first claim): restart requests before it are not meant for it.

    /// Deliveries that claims under way may bring (see `reserve_room`).
    reserved: Mutex<usize>,
    /// Claims sent and not yet counted as outstanding (for `stop_when_empty`).
    claiming: AtomicUsize,
    /// Its place among its worker's queues: 0 for the worker's own, then the lower
    /// queues in priority order.
    member: usize,
    /// The pools of every queue of its worker, in priority order (itself included),
    /// set before any thread starts.
    group: OnceLock<Vec<Weak<Pool>>>,
    /// Handlers of its deliveries past `timeout` at the last heartbeat.
    overdue: AtomicUsize,
    /// Its last claim failed (see `yields_to_higher`).
    claims_failing: AtomicBool,
    /// What its handlers did by minute, for the queue's per-minute records.
    minutes: crate::metrics::Tally,
}

/// Room reserved for one claim, released once the claimed deliveries are counted as
/// outstanding (or the claim failed).
struct Reservation<'a> {
    reserved: &'a Mutex<usize>,
    n: usize,
}

/// Counts a claim as under way until the deliveries it brought are outstanding.
struct ClaimUnderWay<'a>(&'a AtomicUsize);

impl<'a> ClaimUnderWay<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Self(count)
    }
}

impl Drop for ClaimUnderWay<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        *self.reserved.lock() -= self.n;
    }
}

/// How much work the prefetch buffer may hold per handler: enough to hide a claim's
/// round trip, little enough that slow handlers do not hoard due messages that idle
/// consumers elsewhere could run.
const PREFETCH_WINDOW: Duration = Duration::from_millis(50);

/// How often a `stop_when_empty` pool looks (locally) whether its last handler is done.
const EMPTY_POLL: Duration = Duration::from_millis(20);

/// How often a lower queue's pool looks (locally) whether the higher ones still have
/// work, while they have.
const YIELD_RECHECK: Duration = Duration::from_millis(5);

/// claim.lua's `next_ms` when the queue is paused.
const PAUSED: i64 = -2;

/// How often a pool's claims ask for repeats with no occurrence pending: the bound on
/// how long a broken chain stays broken (a pushed occurrence is not affected).
const REPEAT_CHECK: Duration = Duration::from_secs(60);
/// How soon after a failed push of an occurrence it is tried again.
const REPEAT_RETRY: Duration = Duration::from_secs(5);

impl Pool {
    /// A claim on `part` reported its restart generation: one past what the pool saw
    /// at its start means a restart was requested since, and stops it. A generation,
    /// not a time: a step of the Redis clock can neither fake nor hide a request.
    fn note_restart_request(&self, part: usize, generation: u64) {
        let Some(baseline) = self.control.restart_baseline.get(part) else {
            return;
        };
        let started = *baseline.get_or_init(|| generation);
        if generation > started && !self.control.restart.swap(true, Ordering::AcqRel) {
            log::info!(
                "delayq[{}]: a restart of the workers was requested; finishing the running handlers and stopping",
                self.queue_name
            );
            self.control.stop();
        }
    }

    /// Nothing claimed is running or waiting for a handler, and no claim is under way.
    fn holds_nothing(&self) -> bool {
        self.claiming.load(Ordering::Acquire) == 0 && self.outstanding.lock().is_empty()
    }

    /// `stop_when_empty`: the pool holds nothing and Redis has nothing due for it.
    fn stop_if_empty(&self) -> bool {
        match self.queue.stats() {
            Ok(s) if s.ready == 0 && self.holds_nothing() => {
                log::info!(
                    "delayq[{}]: nothing is due and nothing runs: stopping (stop_when_empty)",
                    self.queue_name
                );
                self.control.empty.store(true, Ordering::Release);
                self.control.stop();
                true
            }
            Ok(_) => false,
            Err(e) => {
                log::warn!(
                    "delayq[{}]: cannot tell whether the queue is empty: {e}",
                    self.queue_name
                );
                false
            }
        }
    }

    /// The pools of its worker's queues above this one in priority.
    fn higher(&self) -> impl Iterator<Item = Arc<Pool>> + '_ {
        self.group
            .get()
            .map_or(&[][..], |g| &g[..self.member.min(g.len())])
            .iter()
            .filter_map(Weak::upgrade)
    }

    /// A higher queue's pool has work for the handlers: deliveries the caller has not
    /// taken yet, a claim under way, or messages known to be due. This pool's
    /// deliveries would wait behind them, so it leaves its due messages to other
    /// consumers for now. (Those it holds already wait too, and go back to the queue
    /// for other consumers once kept waiting a heartbeat long: see
    /// `kept_waiting_by_higher`.) A higher pool whose claims fail (its Redis is down)
    /// holds nobody back.
    fn yields_to_higher(&self) -> bool {
        self.higher().any(|p| p.has_work_for_handlers())
    }

    /// Deliveries the caller has not taken yet, a claim under way, or messages known to
    /// be due, unless it is stopped or its claims fail (its Redis is down).
    fn has_work_for_handlers(&self) -> bool {
        !self.control.stopped()
            && !self.claims_failing.load(Ordering::Acquire)
            && (!self.buffered.is_empty() || self.claiming.load(Ordering::Acquire) > 0 || self.control.wake.due_now())
    }

    /// Deliveries it claimed before `since` still wait unstarted while the higher
    /// queues keep the handlers busy: consumers of this queue elsewhere could run them.
    fn kept_waiting_by_higher(&self, since: Instant) -> bool {
        self.member > 0
            && !self.buffered.is_empty()
            && self
                .outstanding
                .lock()
                .values()
                .any(|o| o.started.is_none() && o.claimed < since)
            && self.yields_to_higher()
    }

    /// Handlers past `timeout`, over every queue of its worker (they share the
    /// handlers).
    fn overdue_handlers(&self) -> usize {
        match self.group.get() {
            Some(group) => group
                .iter()
                .filter_map(Weak::upgrade)
                .map(|p| p.overdue.load(Ordering::Acquire))
                .sum(),
            None => self.overdue.load(Ordering::Acquire),
        }
    }

    fn is_rate_limited(&self) -> bool {
        self.rate_limited.iter().any(|l| l.load(Ordering::Relaxed))
    }

    /// Reserve room for a claim of up to `want` deliveries, counting those that other
    /// fetchers' claims under way may bring: without that, fetchers that look at the
    /// same moment each claim the whole room, and a pool holds a multiple of its
    /// prefetch (and hands out, from claims that overlap, messages out of due order).
    /// Under a rate limit the limit counts hand-outs, so a message should start as it
    /// is handed out, not wait in the prefetch buffer while the window moves on (the
    /// next window's messages would then start close behind it): the room is then one
    /// message per idle handler.
    fn reserve_room(&self, want: usize, limited: bool) -> Reservation<'_> {
        let room = if limited { self.handlers } else { self.prefetch_now() };
        let mut reserved = self.reserved.lock();
        let held = self.outstanding.lock().len();
        let n = want.min(room.saturating_sub(held + *reserved));
        *reserved += n;
        Reservation {
            reserved: &self.reserved,
            n,
        }
    }

    /// Deliveries to hold (running and waiting) at the measured handler speed, within
    /// `prefetch`. Until the first measurement, one per handler.
    fn prefetch_now(&self) -> usize {
        let max = self.opts.prefetch_limit();
        let us = self.handler_us.load(Ordering::Relaxed);
        if us == 0 {
            return self.handlers.min(max).max(1);
        }
        let per_handler = PREFETCH_WINDOW.as_micros() as u64 / us + 1;
        usize::try_from(per_handler.saturating_mul(self.handlers as u64))
            .unwrap_or(max)
            .clamp(1, max)
    }

    /// Whether this claim of `part` should ask for repeats whose chain of occurrences
    /// broke (see claim.lua): at the pool's first claim of it, then every
    /// `REPEAT_CHECK`.
    fn repeat_check_due(&self, part: usize) -> bool {
        let mut checks = self.repeat_checks.lock();
        let now = Instant::now();
        match checks.get_mut(part) {
            Some(next) if *next <= now => {
                *next = now + REPEAT_CHECK;
                true
            }
            _ => false,
        }
    }

    fn recheck_repeats_soon(&self, part: usize) {
        if let Some(next) = self.repeat_checks.lock().get_mut(part) {
            *next = (*next).min(Instant::now() + REPEAT_RETRY);
        }
    }

    /// Say once that the queue is paused (a pool started on a paused queue seems
    /// hung otherwise), and once that it goes on again.
    fn note_paused(&self, paused: bool) {
        if self.paused.swap(paused, Ordering::AcqRel) == paused {
            return;
        }
        if paused {
            log::warn!(
                "delayq[{}]: the queue is paused: this pool takes no messages until resume() \
                 (or `delayq resume`)",
                self.queue_name
            );
        } else {
            log::info!("delayq[{}]: the queue was resumed", self.queue_name);
        }
    }

    /// A handler starts `d`: how late after its due time, on the server's clock.
    fn record_start(&self, d: &Delivery) {
        if let Some(now) = self.control.wake.server_now_ms() {
            self.lateness.lock().0.add((now - d.due_at_ms).max(0));
            self.minutes.record_start(d.part, now, now - d.due_at_ms);
        }
    }

    fn record_handler_time(&self, d: &Delivery) {
        let Some(start) = d.handed_out else { return };
        let sample = (start.elapsed().as_micros() as u64).max(1);
        let old = self.handler_us.load(Ordering::Relaxed);
        let new = if old == 0 { sample } else { (old * 4 + sample) / 5 };
        self.handler_us.store(new, Ordering::Relaxed);
    }
}

/// A consumer pool on one queue.
pub struct Worker {
    queue: Queue,
    opts: WorkerOptions,
    control: Arc<Control>,
    running: Arc<AtomicBool>,
    /// What a restart request compares with: a worker made before it runs old code.
    /// (PHP makes the worker before forking its processes, so a process forked later
    /// by an old supervisor is old too; the monotonic clock is shared across fork.)

    /// Queues consumed only when the ones before them have nothing for the handlers,
    /// in priority order; each runs its own pool (never nested further).
    lower: Vec<Worker>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("queue", &self.queue)
            .field("lower_queues", &self.lower.iter().map(|w| &w.queue).collect::<Vec<_>>())
            .field("opts", &self.opts)
            .finish()
    }
}

/// Most queues one worker consumes (its own and its lower queues).
pub const MAX_WORKER_QUEUES: usize = 16;

impl Worker {
    /// A pool for `queue`. Validates the options; starts no thread.
    pub fn new(queue: Queue, opts: WorkerOptions) -> Result<Self> {
        opts.validate()?;
        let partitions = queue.partitions();
        Ok(Self {
            queue,
            opts,
            control: Arc::new(Control {
                stop: AtomicBool::new(false),
                restart: AtomicBool::new(false),
                empty: AtomicBool::new(false),
                wake: Wake::new(partitions),
                slots: Slots {
                    free: Mutex::new(0),
                    cv: Condvar::new(),
                },
                restart_baseline: (0..partitions).map(|_| std::sync::OnceLock::new()).collect(),
                pool_process: AtomicU64::new(0),
            }),
            running: Arc::new(AtomicBool::new(false)),
            lower: Vec::new(),
        })
    }

    /// A pool for `queue` first and, in this order, the `lower` queues: a handler gets
    /// a message of a lower queue only when no queue before it has one due (Laravel's
    /// `--queue=high,default`, strict priority). Every queue keeps its own leases,
    /// retries, pause, rate limit and registration; the options apply to each.
    pub fn with_lower_queues(queue: Queue, lower: Vec<Queue>, opts: WorkerOptions) -> Result<Self> {
        if lower.len() >= MAX_WORKER_QUEUES {
            return Err(Error::invalid(
                "lower_queues",
                format!(
                    "a worker consumes at most {MAX_WORKER_QUEUES} queues, got {}",
                    lower.len() + 1
                ),
            ));
        }
        let same = |a: &Queue, b: &Queue| a.url() == b.url() && a.inner.parts[0].all[0] == b.inner.parts[0].all[0];
        for (i, q) in lower.iter().enumerate() {
            if same(q, &queue) || lower[..i].iter().any(|earlier| same(q, earlier)) {
                return Err(Error::invalid(
                    "lower_queues",
                    format!("queue {:?} on {} is listed twice", q.name(), q.url()),
                ));
            }
        }
        let mut worker = Self::new(queue, opts)?;
        worker.lower = lower
            .into_iter()
            .map(|q| Self::new(q, worker.opts.clone()))
            .collect::<Result<_>>()?;
        Ok(worker)
    }

    /// The options it was made with.
    pub fn options(&self) -> &WorkerOptions {
        &self.opts
    }

    /// Its own queue (the first in priority).
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// Every queue it consumes, highest priority first.
    pub fn queues(&self) -> impl Iterator<Item = &Queue> {
        self.members().map(|w| &w.queue)
    }

    fn members(&self) -> impl Iterator<Item = &Worker> {
        std::iter::once(self).chain(&self.lower)
    }

    /// Record which restart requests (`Queue::restart_workers`) came before now, as a
    /// start of `run` does: a supervisor calls it before it forks its processes, so
    /// that a process forked later stops for a request made after this call. Fails
    /// as a start would on an auth or permission error, or a stray key.
    pub fn mark_start(&self) -> Result<()> {
        for w in self.members() {
            check_access(&w.queue, w.opts.lease, &w.control)?;
        }
        Ok(())
    }

    /// A handle that stops this worker's current or next run.
    pub fn stopper(&self) -> Stopper {
        Stopper(self.members().map(|w| Arc::clone(&w.control)).collect())
    }

    /// Ask the pool to stop; `run` / `finish` return once everything is written.
    pub fn stop(&self) {
        self.members().for_each(|w| w.control.stop());
    }

    /// Whether a pool of this worker is running now (threads exist).
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// Start the pool's threads and return the hand-off through which the caller's
    /// thread receives deliveries and reports their outcome, one at a time.
    pub fn start(&self) -> Result<Consumer> {
        self.start_with(1)
    }

    /// Like `start`, for a caller that works on up to `handlers` deliveries at once
    /// (threads or async tasks).
    pub fn start_with(&self, handlers: usize) -> Result<Consumer> {
        if handlers == 0 {
            return Err(Error::invalid("handlers", "must be at least 1"));
        }
        if self.running.swap(true, Ordering::AcqRel) {
            return Err(Error::State("this worker is already running".into()));
        }
        let prepared: Vec<_> = self
            .members()
            .enumerate()
            .map(|(member, w)| w.prepare(handlers, member))
            .collect();
        let group: Vec<Weak<Pool>> = prepared.iter().map(|(pool, _, _)| Arc::downgrade(pool)).collect();
        for (pool, _, _) in &prepared {
            let _ = pool.group.set(group.clone());
        }
        let mut consumers = Vec::with_capacity(prepared.len());
        for (w, (pool, tx, rx)) in self.members().zip(prepared) {
            match w.spawn_pool(pool, tx, rx) {
                Ok(c) => consumers.push(c),
                Err(e) => {
                    consumers.iter().for_each(|c: &Consumer| c.pool.control.stop());
                    for c in consumers {
                        let _ = c.finish();
                    }
                    self.running.store(false, Ordering::Release);
                    return Err(e);
                }
            }
        }
        let mut members = consumers.into_iter();
        let mut top = members
            .next()
            .ok_or_else(|| Error::State("a worker without a queue".into()))?;
        top.lower = members.collect();
        Ok(top)
    }

    /// The pool of this worker's own queue, the `member`-th of its group; no thread
    /// yet.
    fn prepare(&self, handlers: usize, member: usize) -> (Arc<Pool>, Sender<Delivery>, Receiver<Delivery>) {
        self.running.store(true, Ordering::Release);
        // Also registers the fork counter, before a handler can fork.
        let process = crate::fork::generation() + 1;
        self.control.pool_process.store(process, Ordering::Release);
        *self.control.slots.free.lock() = self.opts.prefetch_limit();
        // Look at every partition at once, whatever an earlier run left behind.
        self.control.wake.kick();
        let (deliver_tx, deliver_rx) = crossbeam_channel::unbounded();
        let pool = Arc::new(Pool {
            queue: self.queue.clone(),
            queue_name: Arc::from(self.queue.name()),
            opts: self.opts.clone(),
            control: Arc::clone(&self.control),
            counters: Counters::default(),
            outstanding: Mutex::new(HashMap::new()),
            handlers,
            stalled: AtomicBool::new(false),
            buffered: deliver_rx.clone(),
            handler_us: AtomicU64::new(0),
            lateness: Mutex::new((Lateness::default(), Lateness::default())),
            registration: Registration::new(&self.opts),
            paused: AtomicBool::new(false),
            repeat_checks: Mutex::new(vec![Instant::now(); self.queue.partitions()]),
            rate_limited: (0..self.queue.partitions()).map(|_| AtomicBool::new(false)).collect(),
            reserved: Mutex::new(0),
            claiming: AtomicUsize::new(0),
            member,
            group: OnceLock::new(),
            overdue: AtomicUsize::new(0),
            claims_failing: AtomicBool::new(false),
            minutes: crate::metrics::Tally::new(self.queue.partitions()),
        });
        (pool, deliver_tx, deliver_rx)
    }

    /// Start the threads of a prepared pool.
    fn spawn_pool(
        &self,
        pool: Arc<Pool>,
        deliver_tx: Sender<Delivery>,
        deliver_rx: Receiver<Delivery>,
    ) -> Result<Consumer> {
        let (outcome_tx, outcome_rx) = crossbeam_channel::unbounded();
        let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(0);
        let mut fetchers = Vec::new();
        let mut others = Vec::new();
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name)
                .spawn(f)
                .map_err(|e| Error::State(format!("cannot start a pool thread: {e}")))
        };
        check_access(&pool.queue, pool.opts.lease, &pool.control)?;
        let result = (|| -> Result<()> {
            for index in 0..self.opts.threads {
                let (pool, tx, otx) = (Arc::clone(&pool), deliver_tx.clone(), outcome_tx.clone());
                fetchers.push(spawn(
                    format!("delayq-fetch-{index}"),
                    Box::new(move || fetch_loop(&pool, index, &tx, &otx)),
                )?);
            }
            let p = Arc::clone(&pool);
            others.push(spawn(
                "delayq-complete".into(),
                Box::new(move || complete_loop(&p, &outcome_rx)),
            )?);
            let p = Arc::clone(&pool);
            others.push(spawn(
                "delayq-heartbeat".into(),
                Box::new(move || heartbeat_loop(&p, &done_rx)),
            )?);
            let p = Arc::clone(&pool);
            others.push(spawn("delayq-wake".into(), Box::new(move || subscribe_loop(&p)))?);
            if pool.queue.inner.endpoint.sentinel_service().is_some() {
                let p = Arc::clone(&pool);
                others.push(spawn("delayq-sentinel".into(), Box::new(move || watch_sentinels(&p)))?);
            }
            Ok(())
        })();
        let consumer = Consumer {
            pool,
            deliveries: deliver_rx,
            outcomes: Some(outcome_tx),
            fetchers,
            others,
            done: Some(done_tx),
            running: Arc::clone(&self.running),
            finished: false,
            lower: Vec::new(),
        };
        drop(deliver_tx);
        match result {
            Ok(()) => Ok(consumer),
            Err(e) => {
                consumer.finish();
                Err(e)
            }
        }
    }

    /// Run `handler` on `handler_threads` threads of the pool until stopped. A handler
    /// that returns `Err` or panics fails the delivery (retry, then dead letter); a
    /// panic's place and backtrace are kept as the message's `error_trace`. A child
    /// process that a handler forks ends (`_exit`) as soon as the handler returns in
    /// it, with status 0, 1 for `Err` or 101 for a panic; only the parent completes
    /// the delivery.
    pub fn run<F>(&self, handler_threads: usize, handler: F) -> Result<Summary>
    where
        F: Fn(&Delivery) -> std::result::Result<(), String> + Sync,
    {
        if handler_threads == 0 {
            return Err(Error::invalid("handler_threads", "must be at least 1"));
        }
        let consumer = self.start_with(handler_threads)?;
        record_handler_panics();
        std::thread::scope(|s| {
            for _ in 0..handler_threads {
                s.spawn(|| {
                    loop {
                        match consumer.recv_timeout(Duration::from_millis(200)) {
                            Received::Message(d) => {
                                IN_HANDLER.set(true);
                                let result = catch_unwind(AssertUnwindSafe(|| handler(&d)));
                                IN_HANDLER.set(false);
                                if consumer.in_forked_child() {
                                    end_forked_child(&result);
                                }
                                match result {
                                    Ok(Ok(())) => consumer.ack(d),
                                    Ok(Err(e)) => {
                                        consumer.fail(d, &e);
                                    }
                                    Err(panic) => {
                                        let error = format!("handler panicked: {}", panic_text(&panic));
                                        let trace = PANIC_TRACE.take().unwrap_or_default();
                                        consumer.fail_traced(d, &error, &trace, Retry::Backoff);
                                    }
                                }
                            }
                            Received::Idle => {}
                            Received::Stopped => break,
                        }
                    }
                });
            }
        });
        Ok(consumer.finish())
    }
}

/// A process that a handler forked came back from it: it ends here, before it could
/// run, wait on or write through the pool it inherited (whose threads stayed in the
/// parent), with 0 for `Ok`, 1 for `Err` and 101 (Rust's) for a panic.
fn end_forked_child(result: &std::thread::Result<std::result::Result<(), String>>) -> ! {
    let (status, error) = match result {
        Ok(Ok(())) => (0, None),
        Ok(Err(e)) => (1, Some(e.clone())),
        Err(panic) => (101, Some(format!("handler panicked: {}", panic_text(panic)))),
    };
    if let Some(error) = error {
        // write(2), not eprintln!: a pool thread may have held stderr's lock at the fork.
        let line = format!("delayq: a process forked by a handler ended with an error: {error}\n");
        // SAFETY: writes our own buffer to fd 2.
        unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
    }
    crate::fork::exit_child(status)
}

/// `trace` within `max` bytes: its start and its end around a note of what was left
/// out, cut on character boundaries.
fn cut_trace(trace: &str, max: usize) -> String {
    if trace.len() <= max {
        return trace.to_owned();
    }
    let note = |left_out: usize| format!("\n[... {left_out} bytes left out ...]\n");
    let room = max.saturating_sub(note(trace.len()).len());
    if room == 0 {
        return String::new();
    }
    let mut head_end = room / 2;
    while !trace.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = trace.len() - (room - room / 2);
    while !trace.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    format!(
        "{}{}{}",
        &trace[..head_end],
        note(tail_start - head_end),
        &trace[tail_start..]
    )
}

thread_local! {
    /// Set while this thread runs a handler of `Worker::run`.
    static IN_HANDLER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Where that handler panicked, with the backtrace there (unwinding loses it).
    static PANIC_TRACE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Chains a panic hook, once per process, that keeps the place and backtrace of a
/// handler's panic for its `error_trace`. The previous hook still runs, so what the
/// application's hook does (or the default message on stderr) is unchanged; a hook
/// that the application sets later replaces this one, and panics then keep no trace.
fn record_handler_panics() {
    static CHAINED: std::sync::Once = std::sync::Once::new();
    CHAINED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_HANDLER.get() {
                let trace = format!(
                    "{info}\nstack backtrace:\n{}",
                    std::backtrace::Backtrace::force_capture()
                );
                PANIC_TRACE.set(Some(trace));
            }
            previous(info);
        }));
    });
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-text panic".to_owned())
}

/// See [`Consumer::releaser`].
pub struct Releaser(Vec<Arc<Pool>>);

impl std::fmt::Debug for Releaser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Releaser").field(&self.0.len()).finish()
    }
}

impl Releaser {
    /// Stop the pool and release every delivery it holds, running ones included, to
    /// the queue at once (due where it was, its attempt uncounted): another consumer
    /// runs it now instead of after its lease. A handler still running finds its
    /// completion refused as lease lost. For a stop that cannot wait for the handlers
    /// (a second signal): the process is expected to end right after. Returns how many
    /// went back.
    pub fn release_all(&self) -> usize {
        let mut total = 0;
        for pool in &self.0 {
            pool.control.stop();
            let held: Vec<(String, Outstanding)> = pool.outstanding.lock().drain().collect();
            let q = &pool.queue;
            let mut slot = ConnSlot::new();
            let mut released = 0;
            for part in 0..q.partitions() {
                let mine: Vec<&(String, Outstanding)> = held.iter().filter(|(_, o)| o.part == part).collect();
                for chunk in mine.chunks(MAX_BATCH) {
                    let args = complete::Release {
                        deliveries: chunk
                            .iter()
                            .map(|(token, o)| complete::Delivery {
                                id: &o.id,
                                lease: token,
                            })
                            .collect(),
                    };
                    let res = slot
                        .run(&q.inner.endpoint, "release", Replay::Safe, |con| {
                            let mut inv = q.invocation(part, complete::release());
                            args.add_to(&mut inv);
                            inv.invoke::<Value>(con)
                        })
                        .and_then(|v| scripts::read::<complete::Released>(complete::release(), v));
                    match res {
                        Ok(complete::Released(n)) => released += usize::try_from(n).unwrap_or(usize::MAX),
                        Err(e) => log::warn!(
                            "delayq[{}]: could not give {} deliveries back; they run again after their lease: {e}",
                            pool.queue_name,
                            chunk.len()
                        ),
                    }
                }
            }
            Counters::add(&pool.counters.released, released as u64);
            total += released;
        }
        total
    }

    /// Stop claiming and release the prefetched deliveries that no handler started
    /// to the queue at once (the running ones stay held): for a process whose handler
    /// is past its timeout and is about to be killed by its supervisor, so that only
    /// the hung message waits on it. Returns how many went back.
    pub fn stop_and_release_waiting(&self) -> usize {
        let mut total = 0;
        for pool in &self.0 {
            pool.control.stop();
            let before = pool.counters.released.load(Ordering::Relaxed);
            let mut slot = ConnSlot::new();
            release_buffered(pool, &mut slot, ReleaseReason::Killing);
            total += pool.counters.released.load(Ordering::Relaxed).saturating_sub(before) as usize;
        }
        total
    }

    /// The counts so far, summed over the worker's queues, as `Consumer::finish` would
    /// return them: for a process that ends at once to report what it did.
    pub fn summary(&self) -> Summary {
        let mut summary = Summary::default();
        for pool in &self.0 {
            summary += &pool.counters.summary();
        }
        summary
    }
}

/// The caller's side of a running pool.
pub struct Consumer {
    pool: Arc<Pool>,
    deliveries: Receiver<Delivery>,
    outcomes: Option<Sender<Outcome>>,
    fetchers: Vec<JoinHandle<()>>,
    others: Vec<JoinHandle<()>>,
    done: Option<Sender<()>>,
    running: Arc<AtomicBool>,
    finished: bool,
    /// The pools of the worker's lower queues, in priority order.
    lower: Vec<Consumer>,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field(
                "queues",
                &self.members().map(|m| &*m.pool.queue_name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Consumer {
    /// The next delivery, waiting at most `timeout`. Returns `Stopped` once a stop was
    /// asked for, even if prefetched deliveries remain (`finish` gives them back).
    /// With lower queues: the waiting delivery of the highest queue that has one.
    pub fn recv_timeout(&self, timeout: Duration) -> Received {
        if self.in_forked_child() {
            return Received::Stopped;
        }
        if !self.lower.is_empty() {
            return self.recv_by_priority(timeout);
        }
        if self.pool.control.stopped() {
            return Received::Stopped;
        }
        match self.deliveries.recv_timeout(timeout) {
            Ok(d) => self.accept(d),
            Err(RecvTimeoutError::Timeout) => {
                if self.pool.control.stopped() {
                    Received::Stopped
                } else {
                    Received::Idle
                }
            }
            Err(RecvTimeoutError::Disconnected) => Received::Stopped,
        }
    }

    fn recv_by_priority(&self, timeout: Duration) -> Received {
        let deadline = Instant::now() + timeout;
        loop {
            if group_stopped(&self.controls()) {
                return Received::Stopped;
            }
            let mut select = Select::new();
            // A higher queue with messages due or a claim under way: its deliveries are
            // about to come, and lower queues' deliveries wait for them (those kept
            // waiting a heartbeat long go back to other consumers, see
            // `kept_waiting_by_higher`). Otherwise the first delivery of a flood would
            // let every prefetched lower one through while the next claim is under way.
            let mut higher_coming = false;
            for m in self.members() {
                if higher_coming {
                    break;
                }
                if m.pool.control.stopped() {
                    continue;
                }
                match m.deliveries.try_recv() {
                    Ok(d) => match m.accept(d) {
                        Received::Message(d) => return Received::Message(d),
                        // Stopped meanwhile: its delivery went back; look further.
                        _ => continue,
                    },
                    Err(TryRecvError::Empty) => {
                        select.recv(&m.deliveries);
                        higher_coming = m.pool.has_work_for_handlers();
                    }
                    Err(TryRecvError::Disconnected) => m.pool.control.stop(),
                }
            }
            // Whichever arrives first, the next turn takes the highest waiting one. While
            // a higher queue's work is coming, look again shortly: its claim may find
            // nothing after all.
            let until = if higher_coming {
                deadline.min(Instant::now() + YIELD_RECHECK)
            } else {
                deadline
            };
            if select.ready_deadline(until).is_err() && Instant::now() >= deadline {
                return if group_stopped(&self.controls()) {
                    Received::Stopped
                } else {
                    Received::Idle
                };
            }
        }
    }

    /// Hand `d`, just taken from this pool's buffer, to the caller.
    fn accept(&self, mut d: Delivery) -> Received {
        if self.pool.control.stopped() {
            // Not started: give it back at once rather than after its lease.
            self.send(Outcome::release(d));
            return Received::Stopped;
        }
        if let Some(o) = self.pool.outstanding.lock().get_mut(&d.token) {
            o.started = Some(Instant::now());
        }
        Counters::add(&self.pool.counters.handled, 1);
        self.pool.record_start(&d);
        d.handed_out = Some(Instant::now());
        Received::Message(d)
    }

    fn members(&self) -> impl Iterator<Item = &Consumer> {
        std::iter::once(self).chain(&self.lower)
    }

    fn controls(&self) -> Vec<Arc<Control>> {
        self.members().map(|m| Arc::clone(&m.pool.control)).collect()
    }

    /// The pool that handed out `d`.
    fn owner(&self, d: &Delivery) -> &Consumer {
        self.members().nth(d.member).unwrap_or(self)
    }

    /// The handler succeeded: delete the message (written in the background, batched).
    pub fn ack(&self, d: Delivery) {
        let owner = self.owner(&d);
        owner.pool.record_handler_time(&d);
        owner.send(Outcome::Ack {
            part: d.part,
            id: d.id,
            token: d.token,
        });
    }

    /// The handler failed with `error`: retry after a backoff, or move the message to
    /// the dead-letter set once its attempts are used up.
    pub fn fail(&self, d: Delivery, error: &str) -> Fate {
        self.fail_with(d, error, Retry::Backoff)
    }

    /// The handler failed with `error` and says how to go on: after the worker's
    /// backoff, after a delay of its own (a rate limit's "try again in 60 s"), or never
    /// (the order no longer exists: straight to the dead-letter set). Either way it
    /// counts as an attempt, and a retry past `max_attempts` goes to the dead letters.
    pub fn fail_with(&self, d: Delivery, error: &str, retry: Retry) -> Fate {
        self.fail_traced(d, error, "", retry)
    }

    /// As [`fail_with`](Self::fail_with), keeping `trace` (a stack trace, a chain of
    /// causes) beside the error until the message's next failure or its end, cut to
    /// `max_trace_bytes`: what `Queue::get` and the dead letters show as `error_trace`,
    /// for whoever looks into a failure after the worker's log is gone.
    pub fn fail_traced(&self, d: Delivery, error: &str, trace: &str, retry: Retry) -> Fate {
        let owner = self.owner(&d);
        owner.pool.record_handler_time(&d);
        Counters::add(&owner.pool.counters.failed, 1);
        owner.pool.minutes.record_failure(d.part, queue_now_ms(&owner.pool));
        let delay = match retry {
            Retry::Never => None,
            _ if d.attempt >= d.max_attempts => None,
            Retry::After(delay) => Some(delay.min(MAX_DELAY)),
            Retry::Backoff => {
                let o = &owner.pool.opts;
                Some(retry_delay(d.attempt, o.backoff_base, o.backoff_max))
            }
        };
        let delay_ms = delay.map_or(-1, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let error = if delay.is_none() && retry != Retry::Never && d.max_attempts > 1 {
            format!("{error} (gave up after {} attempts)", d.attempt)
        } else {
            error.to_owned()
        };
        let fate = match delay {
            Some(after) => Fate::Retry(after),
            None => Fate::Dead(error.clone()),
        };
        owner.send(Outcome::Nack {
            part: d.part,
            id: d.id,
            token: d.token,
            delay_ms,
            error,
            trace: cut_trace(trace, owner.pool.opts.max_trace_bytes),
            counted: true,
            past_max_attempts: false,
        });
        fate
    }

    /// Give a delivery back unstarted: due again at once, the attempt not counted.
    pub fn release(&self, d: Delivery) {
        self.owner(&d).send(Outcome::release(d));
    }

    /// Whether this process is a child forked while the pool ran, by a handler: its
    /// copy of the pool has no threads, so it delivers nothing, writes nothing (the
    /// parent completes the delivery) and `finish` returns at once. A binding ends such
    /// a child when it returns from the handler, before it runs anything else of the
    /// worker's.
    pub fn in_forked_child(&self) -> bool {
        self.pool.control.in_forked_child()
    }

    fn send(&self, outcome: Outcome) {
        if self.in_forked_child() {
            return;
        }
        if let Some(tx) = &self.outcomes {
            // The completer lives until `finish` drops this sender, so this cannot fail.
            let _ = tx.send(outcome);
        }
    }

    /// A handle to stop this pool from another thread.
    pub fn stopper(&self) -> Stopper {
        Stopper(self.controls().into())
    }

    /// A handle that gives everything this pool holds back to the queue from another
    /// thread, for a process that ends without waiting for its handlers.
    pub fn releaser(&self) -> Releaser {
        Releaser(self.members().map(|m| Arc::clone(&m.pool)).collect())
    }

    /// Ask the pool to stop (same as `Stopper::stop`).
    pub fn stop(&self) {
        self.members().for_each(|m| m.pool.control.stop());
    }

    /// Stop, release prefetched deliveries, write every pending completion, join
    /// the threads, and return the counts (summed over the worker's queues).
    pub fn finish(mut self) -> Summary {
        self.shutdown();
        let mut summary = self.pool.counters.summary();
        for m in &self.lower {
            summary += &m.pool.counters.summary();
        }
        summary
    }

    fn shutdown(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        if self.in_forked_child() {
            self.leave_to_parent();
            return;
        }
        // Every queue's pool winds down at once, then each is joined.
        self.stop();
        for m in &mut self.lower {
            m.shutdown();
        }
        for t in self.fetchers.drain(..) {
            let _ = t.join();
        }
        while let Ok(d) = self.deliveries.try_recv() {
            self.send(Outcome::release(d));
        }
        // The completer ends once every sender (ours, the fetchers') is gone and it
        // has written what they sent; then the heartbeat may end too.
        self.outcomes = None;
        let mut others = self.others.drain(..);
        if let Some(completer) = others.next() {
            let _ = completer.join();
        }
        // Leases were extended until the last completion was written.
        self.done = None;
        for t in others {
            let _ = t.join();
        }
        self.pool.control.stop.store(false, Ordering::Release);
        self.pool.control.pool_process.store(0, Ordering::Release);
        self.running.store(false, Ordering::Release);
    }
}

impl Consumer {
    /// Shutdown in a forked child: no thread of the pool runs here to be joined (a
    /// join waits for ever), and dropping the last end of a channel takes a lock that
    /// a pool thread may have held at the fork. Leaked instead, for the process's end.
    fn leave_to_parent(&mut self) {
        self.fetchers.drain(..).for_each(std::mem::forget);
        self.others.drain(..).for_each(std::mem::forget);
        std::mem::forget(self.outcomes.take());
        std::mem::forget(self.done.take());
        std::mem::forget(std::mem::replace(&mut self.deliveries, crossbeam_channel::never()));
        for m in &mut self.lower {
            m.finished = true;
            m.leave_to_parent();
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn pause_unless_stopped(pool: &Pool, pause: Duration) {
    let w = &pool.control.wake;
    w.wait(Some(Instant::now() + pause), w.epoch(), &pool.control.stop);
}

/// Send one script call over `slot` (no retry) and decode its reply.
fn run_call<C: Call>(slot: &mut ConnSlot, queue: &Queue, part: usize, call: &C) -> Result<C::Reply> {
    let script = call.script();
    let v = slot.run_once(&queue.inner.endpoint, script.name, |con| {
        let mut inv = queue.invocation(part, script);
        call.add_to(&mut inv);
        inv.invoke::<Value>(con)
    })?;
    scripts::read(script, v)
}

/// A fault that retrying cannot mend: the user may not run the scripts, or a key of
/// the queue holds a stray type. The scripts stop before their first write on it.
fn is_setup_fault(e: &Error) -> bool {
    e.category() == Category::Auth || matches!(e, Error::WrongType(_))
}

/// Before a pool starts: a claim of nothing on each partition, so that a user who
/// may not run the scripts, or a stray key, fails the start with that error instead
/// of a retry loop, and the worker learns which restart requests came before it
/// (unless an earlier start, `Worker::mark_start`, did). Other errors (Redis
/// unreachable) are left to the fetchers, which retry.
fn check_access(queue: &Queue, lease: Duration, control: &Control) -> Result<()> {
    let qo = queue.options();
    let mut slot = ConnSlot::new();
    for part in 0..queue.partitions() {
        let args = claim::Args {
            batch: 0,
            lease_ms: lease.as_millis() as u64,
            dead_max: qo.dead_max,
            dead_ttl_ms: qo.dead_ttl.as_millis() as u64,
            check_repeats: false,
            heartbeat: None,
        };
        match run_call(&mut slot, queue, part, &args) {
            Ok(reply) => {
                let _ = control.restart_baseline[part].set(reply.restart_generation);
            }
            Err(e) if is_setup_fault(&e) => return Err(e),
            // Unreachable: the other partitions would each wait out the same timeout.
            Err(e) if e.is_connection() || e.is_timeout() => break,
            Err(_) => {}
        }
    }
    Ok(())
}

/// One claim of up to `want` messages on partition `part`, its heartbeat carried.
fn claim(pool: &Pool, slot: &mut ConnSlot, part: usize, want: usize) -> Result<claim::Reply> {
    let q = &pool.queue;
    let qo = q.options();
    let beat = pool.registration.take_pending(pool);
    let args = claim::Args {
        batch: want,
        lease_ms: pool.opts.lease.as_millis() as u64,
        dead_max: qo.dead_max,
        dead_ttl_ms: qo.dead_ttl.as_millis() as u64,
        check_repeats: pool.repeat_check_due(part),
        heartbeat: beat.as_ref().map(|(id, ttl, info)| (*id, *ttl, info.as_str())),
    };
    let res = run_call(slot, q, part, &args);
    if res.is_err()
        && let Some((_, _, info)) = beat
    {
        pool.registration.put_back(info);
    }
    res
}

/// Claims due messages into the prefetch buffer. Partitions are taken in rotation
/// among those due; when none is due the fetcher sleeps until the earliest known due
/// time or an announcement, so an idle pool sends Redis nothing but the periodic look.
fn fetch_loop(pool: &Pool, index: usize, deliveries: &Sender<Delivery>, outcomes: &Sender<Outcome>) {
    let control = &*pool.control;
    let wake = &control.wake;
    let parts = pool.queue.partitions();
    let mut slot = ConnSlot::new();
    let mut cursor = index % parts;
    // One fetcher looks periodically for writers that never publish (the recipe's own
    // producers) and lost wake-ups, one partition per look; the others only rarely.
    let look_every = if index == 0 {
        pool.opts.idle_check
    } else {
        Duration::from_secs(60)
    };
    let mut look_cursor = index % parts;
    let mut last_look = Instant::now();
    let mut next_empty_check = Instant::now();
    let mut error_pause = Duration::from_millis(50);
    loop {
        if control.stopped() {
            return;
        }
        if pool.stalled.load(Ordering::Acquire) {
            // The heartbeat clears the stall and kicks the fetchers.
            wake.wait(None, wake.epoch(), &control.stop);
            continue;
        }
        // Two statements: one lock at a time (`reserve_room` takes them the other way).
        let outstanding = pool.outstanding.lock().len();
        let held = outstanding + *pool.reserved.lock();
        let want = pool.opts.batch.min(pool.prefetch_now().saturating_sub(held));
        if want == 0 {
            // Enough work in hand: wait for a completion (local, no Redis call).
            control.slots.wait_for_release(Duration::from_millis(100));
            continue;
        }
        let now = Instant::now();
        let (part, share) = match wake.pick(cursor, now) {
            // Rotation alone is fair by claims, not by messages: room freed in bursts
            // would give one partition the big claims and the next the leftovers. An
            // equal share of the room per due partition keeps it fair by messages.
            (Pick::Claim { part, due }, _) => (part, want.div_ceil(due)),
            (Pick::Sleep(_), _) if now >= last_look + look_every => {
                let part = look_cursor;
                look_cursor = (look_cursor + 1) % parts;
                (part, want)
            }
            (Pick::Sleep(due), seen) => {
                let look = last_look + look_every;
                let mut until = due.map_or(look, |d| d.min(look));
                if pool.opts.stop_when_empty && index == 0 {
                    if !pool.holds_nothing() {
                        // Handlers still run: look again soon (locally) to stop once
                        // the last one is done.
                        until = until.min(now + EMPTY_POLL);
                    } else if now >= next_empty_check {
                        // Redis decides: a message due now that no wake-up announced
                        // (or that a pause or rate limit holds back) keeps the pool on.
                        next_empty_check = now + pool.opts.idle_check;
                        if pool.stop_if_empty() {
                            return;
                        }
                        wake.kick();
                        continue;
                    } else {
                        until = until.min(next_empty_check);
                    }
                }
                wake.wait(Some(until), seen, &control.stop);
                continue;
            }
        };
        if pool.yields_to_higher() {
            // Local only: look again shortly, or at an announcement or a stop.
            wake.wait(Some(now + YIELD_RECHECK), wake.epoch(), &control.stop);
            continue;
        }
        cursor = (part + 1) % parts;
        let reservation = pool.reserve_room(share, pool.is_rate_limited());
        let share = reservation.n;
        if share == 0 {
            drop(reservation);
            control.slots.wait_for_release(Duration::from_millis(100));
            continue;
        }
        let room = control.slots.acquire_up_to(share, &control.stop);
        if room == 0 {
            return;
        }
        let under_way = ClaimUnderWay::new(&pool.claiming);
        let started = Instant::now();
        last_look = started;
        wake.begin_claim(part, started);
        let claimed = match claim(pool, &mut slot, part, room) {
            Ok(c) => c,
            Err(e) => {
                control.slots.release(room);
                pool.claims_failing.store(true, Ordering::Release);
                // A permission taken away or a stray key: nothing was written, and only
                // an operator can mend it, so it is an error and the pool asks less often.
                let most = if is_setup_fault(&e) {
                    log::error!(
                        "delayq[{}]: claim failed: {e}; retrying in {error_pause:?}",
                        pool.queue_name
                    );
                    Duration::from_secs(30)
                } else {
                    log::warn!(
                        "delayq[{}]: claim failed: {e}; retrying in {error_pause:?}",
                        pool.queue_name
                    );
                    Duration::from_secs(2)
                };
                pause_unless_stopped(pool, error_pause);
                error_pause = (error_pause * 2).min(most);
                wake.retry_claim(part);
                continue;
            }
        };
        error_pause = Duration::from_millis(50);
        pool.claims_failing.store(false, Ordering::Release);
        // Halfway through the round trip is the best local estimate of the server's
        // reading of TIME.
        wake.set_clock(started + started.elapsed() / 2, claimed.server_now_ms);
        let paused = claimed.next_ms == PAUSED;
        pool.note_paused(paused);
        pool.rate_limited[part].store(claimed.rate_limited, Ordering::Relaxed);
        pool.note_restart_request(part, claimed.restart_generation);
        let got = claimed.items.len();
        control.slots.release(room - got);
        {
            let mut outstanding = pool.outstanding.lock();
            let now = Instant::now();
            for item in &claimed.items {
                outstanding.insert(
                    item.lease.clone(),
                    Outstanding {
                        part,
                        id: item.id.clone(),
                        claimed: now,
                        started: None,
                        timed_out: false,
                        renewed: now,
                    },
                );
            }
        }
        // The claimed deliveries count as held from here on.
        drop(reservation);
        drop(under_way);
        let occurrences: Vec<(String, i64)> = claimed
            .items
            .iter()
            .filter_map(|item| repeat::occurrence_of(&item.id).map(|(name, due)| (name.to_owned(), due)))
            .collect();
        hand_out(pool, part, claimed.server_now_ms, claimed.items, deliveries, outcomes);
        wake.end_claim(part, got == room, if paused { -1 } else { claimed.next_ms });
        // After the hand-out, so that handlers need not wait for it.
        push_next_occurrences(pool, part, &occurrences, &claimed.broken_repeats);
    }
}

/// Keep repeating messages going: the occurrences just claimed get their successor
/// now, and repeats whose chain broke (see claim.lua) get theirs. A failure is logged
/// and retried at the partition's next check.
fn push_next_occurrences(pool: &Pool, part: usize, occurrences: &[(String, i64)], broken: &[claim::BrokenRepeat]) {
    let q = &pool.queue;
    let mut failed = false;
    for (name, due) in occurrences {
        let result = q.repeat_definitions(part, name).and_then(|found| match found.first() {
            Some(found) => q.push_next_occurrence(part, name, &found.definition, Some(*due)),
            // Stopped with unrepeat(): this occurrence was the last.
            None => Ok(false),
        });
        if let Err(e) = result {
            failed = true;
            log::warn!(
                "delayq[{}]: the next occurrence of repeat {name:?} could not be pushed: {e}; retrying soon",
                pool.queue_name
            );
        }
    }
    for claim::BrokenRepeat { name, definition, mark } in broken {
        match q.push_next_occurrence(part, name, definition, *mark) {
            Ok(_) => {}
            Err(e) => {
                failed = true;
                log::warn!(
                    "delayq[{}]: repeat {name:?} has no occurrence pending and its next could not be pushed: {e}",
                    pool.queue_name
                );
            }
        }
    }
    if failed {
        pool.recheck_repeats_soon(part);
    }
}

/// Pass claimed messages to the handlers; bury the unreadable and the over-tried.
/// Messages past their `expire_after` deadline (at `server_now_ms`, the claim's reading
/// of the Redis clock) are buried unrun.
fn hand_out(
    pool: &Pool,
    part: usize,
    server_now_ms: i64,
    items: Vec<claim::Claimed>,
    deliveries: &Sender<Delivery>,
    outcomes: &Sender<Outcome>,
) {
    let layout = &pool.queue.options().layout;
    let mut expired = 0;
    // Straight to the dead letters, without counting as a failed handler call.
    let bury = |id, token, error, past_max_attempts| {
        let _ = outcomes.send(Outcome::Nack {
            part,
            id,
            token,
            delay_ms: -1,
            error,
            trace: String::new(),
            counted: false,
            past_max_attempts,
        });
    };
    for item in items {
        let claim::Claimed {
            id,
            lease: token,
            score,
            attempt,
            envelope: stored,
            serial_key,
        } = item;
        let due_at_ms = layout.due_ms_of_score(score);
        let decoded = envelope::decode(layout, &stored);
        let max_attempts = decoded
            .as_ref()
            .ok()
            .and_then(|d| d.max_attempts)
            .unwrap_or(pool.opts.max_attempts);
        match decoded {
            Err(reason) => {
                log::error!(
                    "delayq[{}]: message {id} is unreadable, dead-lettered: {reason}",
                    pool.queue_name
                );
                bury(id, token, format!("poison message: {reason}"), false);
            }
            // Its earlier deliveries failed or ended with an expired lease (the worker
            // died or hung), or this pool allows fewer than the one before: running it
            // again would exceed the limit. The last error stays in the dead letter.
            Ok(_) if attempt > max_attempts => {
                log::warn!(
                    "delayq[{}]: message {id} moved to the dead-letter set: {} deliveries ended unfinished, \
                     max_attempts is {max_attempts}",
                    pool.queue_name,
                    attempt - 1
                );
                bury(
                    id,
                    token,
                    format!("gave up after {} attempts (max_attempts {max_attempts})", attempt - 1),
                    true,
                );
            }
            Ok(d) if d.expiry.is_some_and(|(_, deadline)| server_now_ms > deadline) => {
                let (after_ms, deadline) = d.expiry.unwrap_or_default();
                expired += 1;
                bury(
                    id,
                    token,
                    format!(
                        "expired: not started within {} of its due time (expire_after); the deadline passed {} ago",
                        crate::time::human_ms(i64::try_from(after_ms).unwrap_or(i64::MAX)),
                        crate::time::human_ms(server_now_ms - deadline)
                    ),
                    false,
                );
            }
            Ok(d) => {
                let _ = deliveries.send(Delivery {
                    id,
                    attempt,
                    due_at_ms,
                    queue: Arc::clone(&pool.queue_name),
                    max_attempts,
                    expires_at_ms: d.expiry.map(|(_, deadline)| deadline),
                    serial_key,
                    payload_json: d.payload_json,
                    token,
                    part,
                    member: pool.member,
                    handed_out: None,
                });
            }
        }
    }
    if expired > 0 {
        // One line per claim: after an outage, thousands may expire at once.
        log::warn!(
            "delayq[{}]: {expired} message(s) passed their expire_after deadline before they could start; \
             moved to the dead-letter set unrun",
            pool.queue_name
        );
    }
}

fn complete_loop(pool: &Pool, outcomes: &Receiver<Outcome>) {
    let mut slot = ConnSlot::new();
    while let Ok(first) = outcomes.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match outcomes.try_recv() {
                Ok(o) => batch.push(o),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        write_outcomes(pool, &mut slot, batch);
    }
}

fn write_outcomes(pool: &Pool, slot: &mut ConnSlot, batch: Vec<Outcome>) {
    if pool.queue.partitions() == 1 {
        return write_part_outcomes(pool, slot, 0, batch);
    }
    let mut by_part: Vec<Vec<Outcome>> = (0..pool.queue.partitions()).map(|_| Vec::new()).collect();
    for o in batch {
        by_part[o.part()].push(o);
    }
    for (part, outcomes) in by_part.into_iter().enumerate() {
        if !outcomes.is_empty() {
            write_part_outcomes(pool, slot, part, outcomes);
        }
    }
}

fn write_part_outcomes(pool: &Pool, slot: &mut ConnSlot, part: usize, batch: Vec<Outcome>) {
    let (mut acks, mut nacks, mut releases) = (Vec::new(), Vec::new(), Vec::new());
    for o in batch {
        match o {
            Outcome::Ack { .. } => acks.push(o),
            Outcome::Nack { .. } => nacks.push(o),
            Outcome::Release { .. } => releases.push(o),
        }
    }
    let q = &pool.queue;
    let qo = q.options();
    let c = &pool.counters;
    if !acks.is_empty() {
        let args = complete::Ack {
            keep: qo.keep_completed,
            keep_ms: qo.keep_completed_for.as_millis() as u64,
            deliveries: acks.iter().map(Outcome::delivery).collect(),
        };
        if let Some((complete::Statuses(statuses), retried)) = write_with_retry(pool, slot, part, acks.len(), &args) {
            for (o, s) in acks.iter().zip(statuses) {
                match s {
                    Status::Done => Counters::add(&c.acked, 1),
                    // After a retried write, "gone" means the first try went through
                    // before the connection broke.
                    Status::Gone if retried => Counters::add(&c.acked, 1),
                    Status::Gone if lease_was_live(pool, o) => gone(pool, o),
                    _ => lease_lost(pool, o),
                }
            }
        }
        forget(pool, &acks);
    }
    if !nacks.is_empty() {
        let args = complete::Nack {
            dead_max: qo.dead_max,
            dead_ttl_ms: qo.dead_ttl.as_millis() as u64,
            failures: nacks
                .iter()
                .filter_map(|o| match o {
                    Outcome::Nack {
                        delay_ms,
                        error,
                        trace,
                        past_max_attempts,
                        ..
                    } => Some(complete::Failure {
                        delivery: o.delivery(),
                        retry_in_ms: u64::try_from(*delay_ms).ok(),
                        error,
                        trace,
                        keep_last_error: *past_max_attempts,
                        unrun: *past_max_attempts,
                    }),
                    _ => None,
                })
                .collect(),
        };
        if let Some((complete::Statuses(statuses), _)) = write_with_retry(pool, slot, part, nacks.len(), &args) {
            for (o, s) in nacks.iter().zip(statuses) {
                let counted = matches!(o, Outcome::Nack { counted: true, .. });
                match s {
                    Status::Done => {
                        Counters::add(&c.retried, 1);
                        if let Outcome::Nack {
                            id,
                            error,
                            delay_ms,
                            counted: true,
                            ..
                        } = o
                        {
                            log::warn!(
                                "delayq[{}]: message {id} failed, retrying in {}: {error}",
                                pool.queue_name,
                                crate::time::human_ms(*delay_ms)
                            );
                        }
                    }
                    Status::Buried if counted => {
                        Counters::add(&c.dead, 1);
                        if let Outcome::Nack { id, error, .. } = o {
                            log::warn!(
                                "delayq[{}]: message {id} moved to the dead-letter set: {error}",
                                pool.queue_name
                            );
                        }
                    }
                    Status::Buried => {}
                    Status::Gone if lease_was_live(pool, o) => gone(pool, o),
                    _ => lease_lost(pool, o),
                }
            }
        }
        forget(pool, &nacks);
    }
    if !releases.is_empty() {
        let args = complete::Release {
            deliveries: releases.iter().map(Outcome::delivery).collect(),
        };
        if let Some((complete::Released(n), _)) = write_with_retry(pool, slot, part, releases.len(), &args) {
            Counters::add(&c.released, n);
        }
        forget(pool, &releases);
    }
}

/// Whether the lease of a completion whose message is gone was still live as far as
/// the pool knows (claimed or renewed within a lease): then the message was deleted
/// under it (cancel, purge, a flush). Otherwise the lease may have expired, and
/// another delivery completed the message: a lost lease.
fn lease_was_live(pool: &Pool, o: &Outcome) -> bool {
    pool.outstanding
        .lock()
        .get(o.token())
        .is_some_and(|held| !held.timed_out && held.renewed.elapsed() < pool.opts.lease)
}

/// The message of a completion was deleted while it ran: no lease was lost, and no
/// setting of the pool's would change it.
fn gone(pool: &Pool, o: &Outcome) {
    Counters::add(&pool.counters.gone, 1);
    log::info!(
        "delayq[{}]: message {} was deleted while it ran (cancel, purge or a flush of Redis); nothing to complete",
        pool.queue_name,
        o.delivery().id
    );
}

fn lease_lost(pool: &Pool, o: &Outcome) {
    Counters::add(&pool.counters.lease_lost, 1);
    let id = match o {
        Outcome::Ack { id, .. } | Outcome::Nack { id, .. } | Outcome::Release { id, .. } => id,
    };
    log::warn!(
        "delayq[{}]: {}",
        pool.queue_name,
        Error::LeaseLost {
            id: id.clone(),
            reason: "the lease expired and the message went to another delivery, or it was completed already; \
                     raise `lease` or `timeout` if handlers run this long"
                .into(),
        }
    );
}

fn forget(pool: &Pool, done: &[Outcome]) {
    let mut outstanding = pool.outstanding.lock();
    for o in done {
        outstanding.remove(o.token());
    }
    drop(outstanding);
    pool.control.slots.release(done.len());
}

/// Write one script call, reconnecting with backoff. Gives up once the lease has run
/// out: by then the message is due for another delivery and the write is moot.
/// Returns the script's reply and whether the call had to be sent again.
fn write_with_retry<C: Call>(
    pool: &Pool,
    slot: &mut ConnSlot,
    part: usize,
    count: usize,
    call: &C,
) -> Option<(C::Reply, bool)> {
    let operation = call.script().name;
    let q = &pool.queue;
    let give_up = Instant::now() + pool.opts.lease;
    let mut pause = Duration::from_millis(20);
    let mut retried = false;
    loop {
        let res = run_call(slot, q, part, call);
        match res {
            Ok(reply) => return Some((reply, retried)),
            Err(e) if e.is_retryable() && Instant::now() + pause < give_up => {
                retried = true;
                log::warn!(
                    "delayq[{}]: {operation} failed: {e}; retrying in {pause:?}",
                    pool.queue_name
                );
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(e) => {
                log::error!(
                    "delayq[{}]: could not write {count} {operation}(s): {e}; they will be delivered again",
                    pool.queue_name
                );
                Counters::add(&pool.counters.unwritten, count as u64);
                return None;
            }
        }
    }
}

/// While every handler is stuck, prefetched deliveries would only wait behind them
/// (their leases renewed): release them so that other consumers run them now.
/// Why a pool releases its prefetched deliveries (see `release_buffered`).
#[derive(Clone, Copy)]
enum ReleaseReason {
    /// Every handler is past its timeout.
    Stalled,
    /// A lower queue's deliveries wait behind higher queues' work.
    Outranked,
    /// The process's supervisor is about to kill it for a hung handler.
    Killing,
}

fn release_buffered(pool: &Pool, slot: &mut ConnSlot, why: ReleaseReason) {
    let waiting: Vec<Delivery> = pool.buffered.try_iter().collect();
    if waiting.is_empty() {
        return;
    }
    let q = &pool.queue;
    let mut by_part: Vec<Vec<&Delivery>> = vec![Vec::new(); q.partitions()];
    for d in &waiting {
        by_part[d.part].push(d);
    }
    let res = by_part
        .iter()
        .enumerate()
        .filter(|(_, ds)| !ds.is_empty())
        .try_fold(0, |total, (part, ds)| {
            let args = complete::Release {
                deliveries: ds
                    .iter()
                    .map(|d| complete::Delivery {
                        id: &d.id,
                        lease: &d.token,
                    })
                    .collect(),
            };
            run_call(slot, q, part, &args).map(|complete::Released(n)| total + n)
        });
    match res {
        Ok(n) => {
            Counters::add(&pool.counters.released, n);
            match why {
                ReleaseReason::Stalled => log::warn!(
                    "delayq[{}]: every handler is past its timeout; gave {n} waiting deliveries back to the queue",
                    pool.queue_name
                ),
                ReleaseReason::Killing => log::info!(
                    "delayq[{}]: a handler is past its timeout and its process is about to be killed; gave {n} \
                     waiting deliveries back to the queue",
                    pool.queue_name
                ),
                ReleaseReason::Outranked => log::info!(
                    "delayq[{}]: higher-priority queues keep the handlers busy; gave {n} prefetched deliveries \
                     back to the queue for other consumers",
                    pool.queue_name
                ),
            }
        }
        // Their leases are no longer renewed either way: they expire and are delivered again.
        Err(e) => log::warn!(
            "delayq[{}]: could not give waiting deliveries back: {e}",
            pool.queue_name
        ),
    }
    let mut outstanding = pool.outstanding.lock();
    for d in &waiting {
        outstanding.remove(&d.token);
    }
    drop(outstanding);
    pool.control.slots.release(waiting.len());
}

/// This pool's entry in the queue's list of live pools (`Queue::workers`). The
/// heartbeat prepares each renewal and the next claim carries it (a claim runs at
/// least every `idle_check`, so an idle pool sends Redis nothing more); one that no
/// claim took within a heartbeat is sent on its own.
struct Registration {
    id: String,
    host: String,
    started_at_ms: i64,
    ttl: Duration,
    /// The renewal waiting for a claim to carry it: its info JSON.
    pending: Mutex<Option<String>>,
}

/// Handler starts and their lateness (ms).
#[derive(Clone, Copy, Default)]
struct Lateness {
    started: u64,
    sum_ms: i64,
    max_ms: i64,
}

impl Lateness {
    fn add(&mut self, ms: i64) {
        self.started += 1;
        self.sum_ms = self.sum_ms.saturating_add(ms);
        self.max_ms = self.max_ms.max(ms);
    }

    fn merge(&mut self, other: Self) {
        self.started += other.started;
        self.sum_ms = self.sum_ms.saturating_add(other.sum_ms);
        self.max_ms = self.max_ms.max(other.max_ms);
    }
}

static POOLS_STARTED: AtomicU64 = AtomicU64::new(0);

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

impl Registration {
    fn new(opts: &WorkerOptions) -> Self {
        let host = host_name();
        let n = POOLS_STARTED.fetch_add(1, Ordering::Relaxed) + 1;
        Self {
            id: format!("{host}:{}:{n}", std::process::id()),
            host,
            started_at_ms: crate::time::now_unix_ms(),
            // A renewal can wait up to two heartbeats (one for a claim to carry it);
            // one more, and a margin for a slow Redis.
            ttl: opts.heartbeat() * 3 + Duration::from_secs(1),
            pending: Mutex::new(None),
        }
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// The pool's entry in the list of pools; it reports the lateness of the handler
    /// starts since the last renewal that was sent. A renewal that no claim carried
    /// is replaced by the next, which reports its starts too.
    fn info(&self, pool: &Pool) -> String {
        let c = &pool.counters;
        let late = {
            let mut windows = pool.lateness.lock();
            let (current, reported) = &mut *windows;
            reported.merge(std::mem::take(current));
            *reported
        };
        let handler_us = pool.handler_us.load(Ordering::Relaxed);
        serde_json::json!({
            "id": self.id,
            "host": self.host,
            "pid": std::process::id(),
            "started_at_ms": self.started_at_ms,
            "threads": pool.opts.threads,
            "handlers": pool.handlers,
            "handled": c.handled.load(Ordering::Relaxed),
            "acked": c.acked.load(Ordering::Relaxed),
            "failed": c.failed.load(Ordering::Relaxed),
            "holding": pool.outstanding.lock().len(),
            "started_recently": late.started,
            "lateness_avg_ms": (late.started > 0).then(|| late.sum_ms as f64 / late.started as f64),
            "lateness_max_ms": (late.started > 0).then_some(late.max_ms),
            "handler_avg_ms": (handler_us > 0).then(|| handler_us as f64 / 1000.0),
        })
        .to_string()
    }

    /// The renewal for a claim to carry, if one is waiting: (id, ttl_ms, info).
    fn take_pending(&self, pool: &Pool) -> Option<(&str, u64, String)> {
        let info = self.pending.lock().take()?;
        pool.lateness.lock().1 = Lateness::default();
        Some((&self.id, self.ttl_ms(), info))
    }

    /// A claim that was to carry `info` failed: the next one carries it.
    fn put_back(&self, info: String) {
        self.pending.lock().get_or_insert(info);
    }

    /// On every heartbeat: prepare a renewal, and send the previous one if no claim
    /// took it.
    fn on_heartbeat(&self, pool: &Pool, slot: &mut ConnSlot) {
        let info = self.info(pool);
        let untaken = self.pending.lock().replace(info).is_some();
        if untaken && let Some((_, ttl_ms, info)) = self.take_pending(pool) {
            self.send(pool, slot, 0, ttl_ms, &info);
        }
    }

    /// Send the renewal that waits for a claim, if one does: a pool that stopped
    /// working may claim nothing for a while.
    fn send_pending(&self, pool: &Pool, slot: &mut ConnSlot) {
        if let Some((_, ttl_ms, info)) = self.take_pending(pool) {
            self.send(pool, slot, 0, ttl_ms, &info);
        }
    }

    /// Register now (the pool starts).
    fn join(&self, pool: &Pool, slot: &mut ConnSlot) {
        self.send(pool, slot, 0, self.ttl_ms(), &self.info(pool));
    }

    /// Leave the list of every partition a claim may have renewed it in.
    fn leave(&self, pool: &Pool, slot: &mut ConnSlot) {
        for part in 0..pool.queue.partitions() {
            self.send(pool, slot, part, 0, "");
        }
    }

    fn send(&self, pool: &Pool, slot: &mut ConnSlot, part: usize, ttl_ms: u64, info: &str) {
        let q = &pool.queue;
        let args = beat::Args {
            pool_id: &self.id,
            ttl_ms,
            info,
        };
        let res = run_call(slot, q, part, &args);
        // Only the list of pools misses this beat; the queue works on.
        if let Err(e) = res {
            log::debug!(
                "delayq[{}]: could not renew the pool's registration: {e}",
                pool.queue_name
            );
        }
    }
}

/// How old a working pool's counters in the list of pools may grow (`workers()`,
/// `delayq workers`): between heartbeats, its entry is refreshed this often while it
/// holds deliveries or has handled one since; an idle pool's stays as it is.
const COUNTS_FRESH: Duration = Duration::from_secs(1);

fn heartbeat_loop(pool: &Pool, done: &Receiver<()>) {
    let mut slot = ConnSlot::new();
    let every = pool.opts.heartbeat();
    pool.registration.join(pool, &mut slot);
    let mut beat_at = Instant::now();
    let (mut handled_seen, mut was_working) = (0, false);
    loop {
        match done.recv_timeout(every.min(COUNTS_FRESH)) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                send_minutes(pool, &mut slot, true);
                pool.registration.leave(pool, &mut slot);
                return;
            }
        }
        let handled = pool.counters.handled.load(Ordering::Relaxed);
        let working = handled != handled_seen || !pool.outstanding.lock().is_empty();
        handled_seen = handled;
        if beat_at.elapsed() < every {
            if working {
                // A claim carries it, as a heartbeat's; sent by itself only when no
                // claim took the last one.
                pool.registration.on_heartbeat(pool, &mut slot);
            } else if was_working {
                pool.registration.on_heartbeat(pool, &mut slot);
                pool.registration.send_pending(pool, &mut slot);
            }
            was_working = working;
            continue;
        }
        was_working = working;
        beat_at = Instant::now();
        pool.registration.on_heartbeat(pool, &mut slot);
        send_minutes(pool, &mut slot, false);
        slot.recheck_eviction(&pool.queue.inner.endpoint);
        let now = Instant::now();
        let overdue_count = pool
            .outstanding
            .lock()
            .values()
            .filter(|o| matches!((pool.opts.timeout, o.started), (Some(t), Some(s)) if now.duration_since(s) > t))
            .count();
        pool.overdue.store(overdue_count, Ordering::Release);
        let stalled = pool.overdue_handlers() >= pool.handlers;
        if stalled {
            pool.stalled.store(true, Ordering::Release);
            release_buffered(pool, &mut slot, ReleaseReason::Stalled);
        } else if pool.stalled.swap(false, Ordering::AcqRel) {
            pool.control.wake.kick();
        } else if let Some(since) = now.checked_sub(every)
            && pool.kept_waiting_by_higher(since)
        {
            release_buffered(pool, &mut slot, ReleaseReason::Outranked);
        }
        let mut running = Vec::new();
        {
            let mut outstanding = pool.outstanding.lock();
            for (token, o) in outstanding.iter_mut() {
                let overdue = matches!((pool.opts.timeout, o.started), (Some(t), Some(s)) if now.duration_since(s) > t);
                if overdue {
                    if !o.timed_out {
                        o.timed_out = true;
                        log::warn!(
                            "delayq[{}]: handler of {} exceeded its timeout; its lease is left to expire so \
                             another consumer gets the message",
                            pool.queue_name,
                            o.id
                        );
                    }
                    continue;
                }
                running.push((o.part, o.id.clone(), token.clone()));
            }
        }
        // By partition, then in scripts of at most MAX_BATCH.
        running.sort_unstable_by_key(|(part, ..)| *part);
        let q = &pool.queue;
        for chunk in running
            .chunk_by(|a, b| a.0 == b.0)
            .flat_map(|same_part| same_part.chunks(MAX_BATCH))
        {
            let part = chunk[0].0;
            let args = extend::Args {
                lease_ms: pool.opts.lease.as_millis() as u64,
                deliveries: chunk
                    .iter()
                    .map(|(_, id, token)| complete::Delivery { id, lease: token })
                    .collect(),
            };
            match run_call(&mut slot, q, part, &args) {
                Ok(complete::Statuses(statuses)) => {
                    let renewed_at = Instant::now();
                    let mut outstanding = pool.outstanding.lock();
                    for ((_, _, token), s) in chunk.iter().zip(&statuses) {
                        if *s == Status::Done
                            && let Some(o) = outstanding.get_mut(token)
                        {
                            o.renewed = renewed_at;
                        }
                    }
                    drop(outstanding);
                    for ((_, id, token), s) in chunk.iter().zip(statuses) {
                        // A completion written since the snapshot above is no loss: its
                        // message is gone or it has left `outstanding` by now.
                        if s == Status::LeaseLost && pool.outstanding.lock().contains_key(token) {
                            log::warn!(
                                "delayq[{}]: lease of {id} was lost before the handler finished",
                                pool.queue_name
                            );
                        }
                    }
                }
                Err(e) => log::warn!("delayq[{}]: lease extension failed: {e}", pool.queue_name),
            }
        }
    }
}

/// The queue's clock as the pool knows it (its own until a claim told it).
fn queue_now_ms(pool: &Pool) -> i64 {
    pool.control
        .wake
        .server_now_ms()
        .unwrap_or_else(crate::time::now_unix_ms)
}

/// Add what the handlers did to the queue's per-minute records, and let the first
/// pool of each minute sample the backlog (`flush_only`: at stop, deltas only). A
/// failed call keeps its deltas for the next heartbeat. Also renews the queue's entry
/// in the registry of queues when due (see registry.rs).
fn send_minutes(pool: &Pool, slot: &mut ConnSlot, flush_only: bool) {
    if !flush_only {
        pool.queue.register_pool(slot);
    }
    let now_ms = queue_now_ms(pool);
    for batch in pool.minutes.take(now_ms, flush_only) {
        let args = crate::scripts::minutes::Add {
            keep_minutes: crate::metrics::KEEP_MINUTES,
            deltas: batch.encoded(),
        };
        match run_call(slot, &pool.queue, batch.part, &args) {
            Ok(crate::scripts::minutes::Minute(minute)) => pool.minutes.sent(batch.part, minute),
            Err(e) => {
                log::debug!(
                    "delayq[{}]: could not add to the per-minute records: {e}",
                    pool.queue_name
                );
                pool.minutes.put_back(batch, now_ms);
            }
        }
    }
}

/// Listens for producers' announcements on every partition's channel. On a cluster
/// it subscribes on one seed node (a cluster forwards every PUBLISH to every node) and
/// moves to the next seed when that node fails.
fn subscribe_loop(pool: &Pool) {
    let control = &*pool.control;
    let channels: HashMap<&str, usize> = pool
        .queue
        .inner
        .parts
        .iter()
        .enumerate()
        .map(|(part, keys)| (keys.wake_channel.as_str(), part))
        .collect();
    let mut pause = Duration::from_millis(50);
    let mut attempt = 0;
    let endpoint = &pool.queue.inner.endpoint;
    while !control.stopped() {
        let epoch = endpoint.master_epoch();
        let mut conn = match endpoint.pubsub_connection(attempt) {
            Ok(c) => c,
            Err(e) => {
                log::debug!("delayq[{}]: wake-up subscription: {e}", pool.queue_name);
                attempt += 1;
                pause_unless_stopped(pool, pause);
                pause = (pause * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        let mut pubsub = conn.as_pubsub();
        // The read timeout only lets this thread notice a stop; it sends nothing.
        if pubsub.subscribe(channels.keys().copied().collect::<Vec<_>>()).is_err()
            || pubsub.set_read_timeout(Some(Duration::from_millis(250))).is_err()
        {
            attempt += 1;
            pause_unless_stopped(pool, pause);
            continue;
        }
        pause = Duration::from_millis(50);
        // Announcements published while we were not subscribed are lost: look now.
        control.wake.kick();
        // After a failover, producers publish on the new master.
        while !control.stopped() && endpoint.master_epoch() == epoch {
            match pubsub.get_message() {
                Ok(msg) => {
                    let Some(&part) = channels.get(msg.get_channel_name()) else {
                        continue;
                    };
                    let due = msg.get_payload::<String>().ok().and_then(|p| p.parse::<i64>().ok());
                    control.wake.offer_due(part, due);
                }
                Err(e) if e.is_timeout() => {}
                Err(e) => {
                    log::debug!("delayq[{}]: wake-up subscription lost: {e}", pool.queue_name);
                    attempt += 1;
                    break;
                }
            }
        }
    }
}

/// Under Sentinel: listens for `+switch-master` and moves the whole process to the new
/// master at once. Until Sentinel demotes it (seconds later, or never while it is cut
/// off), the old master still takes writes, which it then throws away: claims there
/// would run messages twice and acks there would be lost.
fn watch_sentinels(pool: &Pool) {
    let control = &*pool.control;
    let endpoint = &pool.queue.inner.endpoint;
    let Some(service) = endpoint.sentinel_service() else {
        return;
    };
    let mut pause = Duration::from_millis(50);
    let mut attempt = 0;
    while !control.stopped() {
        let (host, mut conn) = match endpoint.sentinel_connection(attempt) {
            Some(Ok(c)) => c,
            Some(Err(e)) => {
                log::debug!("delayq[{}]: sentinel watch: {e}", pool.queue_name);
                attempt += 1;
                pause_unless_stopped(pool, pause);
                pause = (pause * 2).min(Duration::from_secs(2));
                continue;
            }
            None => return,
        };
        let mut pubsub = conn.as_pubsub();
        if pubsub.subscribe("+switch-master").is_err()
            || pubsub.set_read_timeout(Some(Duration::from_millis(250))).is_err()
        {
            attempt += 1;
            pause_unless_stopped(pool, pause);
            continue;
        }
        pause = Duration::from_millis(50);
        while !control.stopped() {
            match pubsub.get_message() {
                Ok(msg) => {
                    // "<name> <old ip> <old port> <new ip> <new port>"
                    let text = msg.get_payload::<String>().unwrap_or_default();
                    if text.split(' ').next() == Some(service) {
                        log::warn!(
                            "delayq[{}]: sentinel {host} announced a new master: {text}",
                            pool.queue_name
                        );
                        endpoint.master_switched();
                        control.wake.kick();
                    }
                }
                Err(e) if e.is_timeout() => {}
                Err(e) => {
                    log::debug!("delayq[{}]: sentinel watch on {host} lost: {e}", pool.queue_name);
                    attempt += 1;
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::cut_trace;

    #[test]
    fn a_long_trace_keeps_its_start_and_end_within_the_limit() {
        let trace: String = (0..500).map(|i| format!("#{i} frame ü\n")).collect();
        let cut = cut_trace(&trace, 1000);
        assert!(cut.len() <= 1000, "{}", cut.len());
        assert!(cut.starts_with("#0 frame ü\n#1 "), "{cut}");
        assert!(cut.ends_with("#499 frame ü\n"), "{cut}");
        assert!(cut.contains(" bytes left out ...]"), "{cut}");
        let left_out: usize = cut
            .split("[... ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .expect("a count");
        let note = format!("\n[... {left_out} bytes left out ...]\n");
        assert_eq!(cut.len() - note.len() + left_out, trace.len());
    }

    #[test]
    fn a_short_trace_is_kept_whole_and_zero_keeps_none() {
        assert_eq!(cut_trace("#0 {main}", 9), "#0 {main}");
        assert_eq!(cut_trace("#0 {main}", 0), "");
        assert_eq!(cut_trace("#0 {main} and more", 5), "");
    }
}
