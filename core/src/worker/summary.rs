//! The counts of one run of a pool (`Summary`) and the atomics they are read from.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Counts of one run of the pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Deliveries whose handler started (one handed out and then not started, see
    /// `Consumer::begin`, is not counted).
    pub handled: u64,
    /// Successful handler calls whose ack was written.
    pub acked: u64,
    /// Handler calls that failed (retried or dead-lettered; not those whose message
    /// was cancelled: see `cancelled`).
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
    /// Prefetched, never-started deliveries given back: at stop, and those whose
    /// lease may have ended before a handler could start them (the pool was paused or
    /// cut off from Redis). Those another delivery held already are not counted, nor
    /// those whose message was cancelled meanwhile: deleted, they count as `cancelled`.
    pub released: u64,
    /// Completions that could not be written before their lease ran out (Redis
    /// unreachable); those messages will be delivered again.
    pub unwritten: u64,
    /// Deliveries whose message was cancelled while the pool held it (`cancel`), ended
    /// as cancelled whatever their handler returned, or never started when the mark
    /// came before their handler's start (given back at a stop included).
    pub cancelled: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) handled: AtomicU64,
    pub(super) acked: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) retried: AtomicU64,
    pub(super) dead: AtomicU64,
    pub(super) lease_lost: AtomicU64,
    pub(super) gone: AtomicU64,
    pub(super) released: AtomicU64,
    pub(super) unwritten: AtomicU64,
    pub(super) cancelled: AtomicU64,
}

impl Summary {
    /// How many counts `counts` gives: what a supervised process's slot holds.
    pub const FIELDS: usize = 10;

    /// Every count by name, in one order: what the bindings report (PHP's summary
    /// array, Python's dict) and what a supervised process sends its parent.
    pub fn counts(&self) -> [(&'static str, u64); Self::FIELDS] {
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
            ("cancelled", self.cancelled),
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
                "cancelled" => &mut s.cancelled,
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
        self.cancelled += other.cancelled;
    }
}

impl Counters {
    pub(super) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn sub(c: &AtomicU64, n: u64) {
        c.fetch_sub(n, Ordering::Relaxed);
    }

    pub(super) fn summary(&self) -> Summary {
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
            cancelled: g(&self.cancelled),
        }
    }
}
