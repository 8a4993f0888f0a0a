//! The completer thread: writes acks, nacks and releases in batches per partition,
//! retries them while their lease lasts, and counts what was lost or gone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TryRecvError};

use crate::conn::ConnSlot;
use crate::error::Error;
use crate::scripts::complete::Status;
use crate::scripts::{Call, MAX_BATCH, complete};

use super::pool::{Pool, Ticket};
use super::summary::Counters;
use super::{Delivery, run_call};

pub(super) enum Outcome {
    Ack {
        part: usize,
        id: String,
        token: Arc<str>,
        ticket: Ticket,
    },
    /// `delay_ms` < 0 buries the message in the dead-letter set.
    Nack {
        part: usize,
        id: String,
        token: Arc<str>,
        ticket: Ticket,
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
        token: Arc<str>,
        ticket: Ticket,
    },
}

impl Outcome {
    /// The delivery it completes, as the scripts take it.
    pub(super) fn delivery(&self) -> complete::Delivery<'_> {
        match self {
            Self::Ack { id, token, .. } | Self::Nack { id, token, .. } | Self::Release { id, token, .. } => {
                complete::Delivery { id, lease: token }
            }
        }
    }

    pub(super) fn token(&self) -> &str {
        match self {
            Self::Ack { token, .. } | Self::Nack { token, .. } | Self::Release { token, .. } => token,
        }
    }

    pub(super) fn ticket(&self) -> Ticket {
        match self {
            Self::Ack { ticket, .. } | Self::Nack { ticket, .. } | Self::Release { ticket, .. } => *ticket,
        }
    }

    pub(super) fn part(&self) -> usize {
        match self {
            Self::Ack { part, .. } | Self::Nack { part, .. } | Self::Release { part, .. } => *part,
        }
    }

    pub(super) fn release(d: Delivery) -> Self {
        Self::Release {
            part: d.part,
            id: d.id,
            token: d.token,
            ticket: d.ticket,
        }
    }
}

pub(super) fn complete_loop(pool: &Pool, outcomes: &Receiver<Outcome>) {
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

pub(super) fn write_outcomes(pool: &Pool, slot: &mut ConnSlot, batch: Vec<Outcome>) {
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

pub(super) fn write_part_outcomes(pool: &Pool, slot: &mut ConnSlot, part: usize, batch: Vec<Outcome>) {
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
        // Completions of several claims arrive interleaved: side by side, each claim's
        // are one run of its lease (the statuses come back in this order).
        acks.sort_by(|a, b| a.token().cmp(b.token()));
        let args = complete::Ack {
            keep: qo.keep_completed,
            keep_ms: qo.keep_completed_for.as_millis() as u64,
            deliveries: acks.iter().map(Outcome::delivery).collect(),
        };
        let written = write_with_retry(pool, slot, part, acks.len(), &args)
            .map(|(acked, retried)| (acked.statuses(acks.len()), retried));
        if let Some((Err(e), _)) = &written {
            // Written, but what became of each delivery is unknown: the counters skip
            // them rather than guess.
            log::error!("delayq[{}]: {e}", pool.queue_name);
        }
        if let Some((Ok(statuses), retried)) = written {
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
pub(super) fn lease_was_live(pool: &Pool, o: &Outcome) -> bool {
    pool.outstanding
        .lock()
        .get(&o.ticket())
        .is_some_and(|held| !held.timed_out && pool.lease_live_at(held.renewed, Instant::now()))
}

/// The message of a completion was deleted while it ran: no lease was lost, and no
/// setting of the pool's would change it.
pub(super) fn gone(pool: &Pool, o: &Outcome) {
    Counters::add(&pool.counters.gone, 1);
    log::info!(
        "delayq[{}]: message {} was deleted while it ran (cancel, purge or a flush of Redis); nothing to complete",
        pool.queue_name,
        o.delivery().id
    );
}

pub(super) fn lease_lost(pool: &Pool, o: &Outcome) {
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

pub(super) fn forget(pool: &Pool, done: &[Outcome]) {
    let mut outstanding = pool.outstanding.lock();
    for o in done {
        outstanding.remove(&o.ticket());
    }
    drop(outstanding);
    pool.control.slots.release(done.len());
}

/// Write one script call, reconnecting with backoff. Gives up once the lease has run
/// out: by then the message is due for another delivery and the write is moot.
/// Returns the script's reply and whether the call had to be sent again.
pub(super) fn write_with_retry<C: Call>(
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
