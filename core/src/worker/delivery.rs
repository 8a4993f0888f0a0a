//! What a handler gets and what its failure leads to: `Delivery`, `Retry`, `Fate`,
//! `Received`, and `fail_lease` for a delivery whose process was killed; the
//! `Ticket` that names a delivery in its pool.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use redis::Value;
use serde::de::DeserializeOwned;

use crate::conn::ConnSlot;
use crate::error::Result;
use crate::queue::Queue;
use crate::scripts::complete::Status;
use crate::scripts::{Call, complete};
use crate::time::MAX_DELAY;
use crate::{envelope, scripts};

/// A delivery in `Pool::outstanding`: the number its claim gave it, unique in its pool.
/// Completions find their delivery by it without comparing text.
pub(super) type Ticket = u64;

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
    /// Deleted: it was cancelled while it ran (`Queue::cancel`), so it is neither
    /// retried nor dead-lettered.
    Cancelled,
}

/// Names a delivery after it was handed back to its consumer, to wait for its
/// completion to be written (`Consumer::wait_written`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    pub(super) member: usize,
    pub(super) ticket: Ticket,
}

/// One delivery of a message to a handler.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The message id.
    pub id: String,
    /// 1 for the first delivery.
    pub attempt: u32,
    /// When this delivery was due, Unix ms (the requested time, or the retry's; for an
    /// envelope without the stamp that tells it, such as one edited by hand, its
    /// claim's time).
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
    /// With `PushOptions::group`: the group, which runs at most its limit at once.
    pub group: Option<String>,
    /// The stored envelope, and where in it the payload lies.
    pub(super) stored: String,
    pub(super) payload: std::ops::Range<usize>,
    /// Its claim's lease, shared by that claim's deliveries.
    pub(super) token: Arc<str>,
    pub(super) part: usize,
    /// Its entry in its pool's `outstanding`.
    pub(super) ticket: Ticket,
    /// Which of its worker's queues (0: the worker's own, then its lower queues).
    pub(super) member: usize,
    pub(super) handed_out: Option<Instant>,
    /// Its cancel mark as its pool's heartbeat learned it (shared with its entry in
    /// `outstanding`).
    pub(super) cancel: CancelFlag,
}

/// Whether a delivery was cancelled while it ran (`Queue::cancel`), as its pool's
/// heartbeat learned it: cloned, it is the same flag, for a handler's thread to read.
#[derive(Debug, Clone, Default)]
pub struct CancelFlag(Arc<AtomicU8>);

impl CancelFlag {
    /// Cancelled (`Queue::cancel`).
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire) > 0
    }

    /// Cancelled with `CancelOptions::kill`: a supervised process that runs it is to
    /// be killed, as past its timeout.
    pub fn kill_asked(&self) -> bool {
        self.0.load(Ordering::Acquire) > 1
    }

    /// Note a mark a heartbeat read: 1 cancelled, 2 cancelled and kill.
    pub(super) fn mark(&self, mark: u8) {
        self.0.fetch_max(mark, Ordering::AcqRel);
    }
}

impl Delivery {
    /// The payload as JSON text, byte for byte as pushed.
    pub fn payload_json(&self) -> &str {
        &self.stored[self.payload.clone()]
    }

    /// The payload decoded into `T`.
    pub fn payload<T: DeserializeOwned>(&self) -> Result<T> {
        self.decode_payload_with(std::marker::PhantomData::<T>)
    }

    /// The payload decoded through `seed`, as [`decode_payload_with`](crate::decode_payload_with)
    /// does, in one pass: the claim checked its shape already.
    pub fn decode_payload_with<'de, S: serde::de::DeserializeSeed<'de>>(&'de self, seed: S) -> Result<S::Value> {
        envelope::decode_checked_with(self.payload_json(), seed)
    }

    /// The fencing token of this delivery: a later delivery of the same message has
    /// another one, and only the current one may complete it.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// What names it once it is completed, for `Consumer::wait_written`.
    pub fn receipt(&self) -> Receipt {
        Receipt {
            member: self.member,
            ticket: self.ticket,
        }
    }

    /// Whether it was cancelled while it ran ([`Queue::cancel`]): its pool learns of
    /// it at a heartbeat. Whatever its handler does next, the message ends as
    /// cancelled: not retried, not dead-lettered.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// The flag behind [`is_cancelled`](Self::is_cancelled), for another thread (an
    /// event loop's) to read, or to wait on by polling.
    pub fn cancel_flag(&self) -> CancelFlag {
        self.cancel.clone()
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
            group: None,
            stored: "null".to_owned(),
            payload: 0..4,
            token: Arc::from(lease),
            part,
            ticket: 0,
            member,
            handed_out: None,
            cancel: CancelFlag::default(),
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
        Some(Status::Cancelled | Status::CancelledKill) => Some(Fate::Cancelled),
        _ => None,
    })
}

/// What a consumer's `recv_timeout` returns.
#[derive(Debug)]
// Moved once per delivery: a box would cost an allocation per message.
#[allow(clippy::large_enum_variant)]
pub enum Received {
    /// A delivery to handle, then `ack` or `fail`.
    Message(Delivery),
    /// Nothing arrived within the timeout.
    Idle,
    /// The pool is stopping: hand out nothing more, then call `finish`.
    Stopped,
}
