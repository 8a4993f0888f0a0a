//! The completer thread: writes acks, nacks and releases in batches per partition,
//! retries them while their lease lasts, and counts what was lost or gone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TryRecvError};

use crate::conn::ConnSlot;
use crate::error::Error;
use crate::scripts::complete::Status;
use crate::scripts::{Call, MAX_BATCH, complete};

use super::delivery::Ticket;
use super::pool::Pool;
use super::summary::Counters;
use super::{Delivery, is_setup_fault, run_call};

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
    let mut refusals = Refusals::default();
    while let Ok(first) = outcomes.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match outcomes.try_recv() {
                Ok(o) => batch.push(o),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        write_outcomes(pool, &mut slot, &mut refusals, batch);
    }
}

/// A fault that the completer's writes meet, from the first try it refused to the
/// first write that goes through: it is logged when it begins and when it ends, not
/// at every try of every batch.
#[derive(Default)]
pub(super) struct Refusals {
    /// When it began, how many tries it refused, and whether it is a setup fault.
    since: Option<(Instant, u64, bool)>,
}

impl Refusals {
    fn refused(&mut self, queue: &str, operation: &str, e: &Error, setup: bool) {
        match &mut self.since {
            // A new kind of fault is news; more of the same is not.
            Some((_, tries, was_setup)) if *was_setup == setup => *tries += 1,
            since => {
                *since = Some((Instant::now(), 1, setup));
                if setup {
                    log::error!(
                        "delayq[{queue}]: {operation} refused: {e}; acks, nacks and releases are tried again \
                         with backoff while their leases last (the heartbeat renews them), and logged again \
                         when they go through or are given up"
                    );
                } else {
                    log::warn!(
                        "delayq[{queue}]: {operation} failed: {e}; acks, nacks and releases are tried again \
                         with backoff while their leases last, and logged again when they go through or are \
                         given up"
                    );
                }
            }
        }
    }

    fn written(&mut self, queue: &str) {
        if let Some((since, tries, _)) = self.since.take() {
            log::warn!(
                "delayq[{queue}]: acks, nacks and releases go through again, after {tries} failed {} \
                 over {:.1} s",
                if tries == 1 { "try" } else { "tries" },
                since.elapsed().as_secs_f64()
            );
        }
    }
}

/// A refusal that wrote nothing and that an operator may mend while the lease lives:
/// a permission taken away, or a key of the queue holding a stray type. Redis 7.0 and
/// later refuse those in the scripts' preflight (include/base.lua), before the first
/// write, or refuse the call itself; Redis 6 refuses a command inside a script where
/// it comes ("the user executing the script ..."), maybe after writes, so that one is
/// not tried again.
fn refused_unwritten(e: &Error) -> bool {
    is_setup_fault(e) && !e.to_string().contains("executing the script")
}

pub(super) fn write_outcomes(pool: &Pool, slot: &mut ConnSlot, refusals: &mut Refusals, batch: Vec<Outcome>) {
    if pool.queue.partitions() == 1 {
        return write_part_outcomes(pool, slot, refusals, 0, batch);
    }
    let mut by_part: Vec<Vec<Outcome>> = (0..pool.queue.partitions()).map(|_| Vec::new()).collect();
    for o in batch {
        by_part[o.part()].push(o);
    }
    for (part, outcomes) in by_part.into_iter().enumerate() {
        if !outcomes.is_empty() {
            write_part_outcomes(pool, slot, refusals, part, outcomes);
        }
    }
}

pub(super) fn write_part_outcomes(
    pool: &Pool,
    slot: &mut ConnSlot,
    refusals: &mut Refusals,
    part: usize,
    batch: Vec<Outcome>,
) {
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
        let written = write_with_retry(pool, slot, refusals, part, acks.len(), &args)
            .map_err(|e| note_unwritten(pool, &acks, e))
            .ok()
            .map(|(acked, maybe_applied)| (acked.statuses(acks.len()), maybe_applied));
        if let Some((Err(e), _)) = &written {
            // Written, but what became of each delivery is unknown: the counters skip
            // them rather than guess.
            log::error!("delayq[{}]: {e}", pool.queue_name);
            note_not_applied(
                pool,
                acks.iter().map(Outcome::ticket),
                Error::Redis(format!("the ack was sent, but what became of it is unknown: {e}")),
            );
        }
        if let Some((Ok(statuses), maybe_applied)) = written {
            for (o, s) in acks.iter().zip(statuses) {
                match s {
                    Status::Done => Counters::add(&c.acked, 1),
                    Status::Cancelled => cancelled(pool, o),
                    // After a try whose reply was lost, "gone" means that try went through
                    // before the connection broke.
                    Status::Gone if maybe_applied => Counters::add(&c.acked, 1),
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
        if let Ok((complete::Statuses(statuses), _)) = write_with_retry(pool, slot, refusals, part, nacks.len(), &args)
            .map_err(|e| note_unwritten(pool, &nacks, e))
        {
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
                    Status::Cancelled => {
                        // A failure of a message cancelled before the pool heard of
                        // it: the message ends as cancelled, not as a failure.
                        if counted {
                            Counters::sub(&c.failed, 1);
                        }
                        cancelled(pool, o);
                    }
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
        if let Ok((released, _)) = write_with_retry(pool, slot, refusals, part, releases.len(), &args)
            .map_err(|e| note_unwritten(pool, &releases, e))
        {
            count_released(pool, released);
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

/// A release's counts: those it deleted as marked cancelled (the pool had not heard of
/// the mark yet) end as the pool's other cancelled deliveries do.
pub(super) fn count_released(pool: &Pool, r: complete::Released) {
    Counters::add(&pool.counters.released, r.released);
    Counters::add(&pool.counters.cancelled, r.cancelled);
    if r.cancelled > 0 {
        log::info!(
            "delayq[{}]: {} messages given back unstarted were cancelled; deleted",
            pool.queue_name,
            r.cancelled
        );
    }
}

/// The message of a completion was cancelled while the pool held it (`Queue::cancel`):
/// deleted, neither retried nor dead-lettered.
fn cancelled(pool: &Pool, o: &Outcome) {
    Counters::add(&pool.counters.cancelled, 1);
    let (Outcome::Ack { id, .. } | Outcome::Nack { id, .. } | Outcome::Release { id, .. }) = o;
    log::info!("delayq[{}]: message {id} was cancelled; deleted", pool.queue_name);
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
    let e = Error::LeaseLost {
        id: id.clone(),
        reason: "the lease expired and the message went to another delivery, or it was completed already; \
                 raise `lease` or `timeout` if handlers run this long"
            .into(),
    };
    log::warn!("delayq[{}]: {e}", pool.queue_name);
    note_not_applied(pool, std::iter::once(o.ticket()), e);
}

pub(super) fn forget(pool: &Pool, done: &[Outcome]) {
    let mut outstanding = pool.outstanding.lock();
    for o in done {
        outstanding.remove(&o.ticket());
    }
    drop(outstanding);
    pool.settled.notify_all();
    pool.control.slots.release(done.len());
    if pool.quarantine_waits() {
        // A handler is free: the fetchers may take what waits in the quarantine now.
        pool.control.wake.kick();
    }
}

/// Completions given up on, kept for a caller waiting on one (`Consumer::wait_written`).
pub(super) const UNWRITTEN_KEPT: usize = 1024;

fn note_unwritten(pool: &Pool, done: &[Outcome], e: Error) {
    note_not_applied(pool, done.iter().map(Outcome::ticket), e);
}

/// The completions of `tickets` did not take effect as decided, for `e`: kept for a
/// caller waiting on one (`Consumer::wait_written`).
pub(super) fn note_not_applied(pool: &Pool, tickets: impl Iterator<Item = Ticket>, e: Error) {
    let e = Arc::new(e);
    let mut kept = pool.unwritten.lock();
    for ticket in tickets {
        if kept.len() == UNWRITTEN_KEPT {
            kept.pop_front();
        }
        kept.push_back((ticket, Arc::clone(&e)));
    }
}

/// Write one script call, trying again with backoff while it fails on the network
/// (reconnecting) or is refused by a fault that wrote nothing (`refused_unwritten`),
/// until the lease would have run out: the heartbeat renews it meanwhile, and past it
/// the message is due for another delivery and the write is moot. Returns the
/// script's reply and whether an earlier try may have been applied (its reply lost),
/// or the error it gave up on.
pub(super) fn write_with_retry<C: Call>(
    pool: &Pool,
    slot: &mut ConnSlot,
    refusals: &mut Refusals,
    part: usize,
    count: usize,
    call: &C,
) -> Result<(C::Reply, bool), Error> {
    let operation = call.script().name;
    let q = &pool.queue;
    let give_up = Instant::now() + pool.opts.lease;
    let mut pause = Duration::from_millis(20);
    let mut maybe_applied = false;
    loop {
        let res = run_call(slot, q, part, call);
        let e = match res {
            Ok(reply) => {
                refusals.written(&pool.queue_name);
                return Ok((reply, maybe_applied));
            }
            Err(e) => e,
        };
        let unwritten = refused_unwritten(&e);
        if (unwritten || e.is_retryable()) && Instant::now() + pause < give_up {
            // A refused call ran no write; a broken connection may have lost the reply
            // of one that did.
            maybe_applied |= !unwritten;
            refusals.refused(&pool.queue_name, operation, &e, unwritten);
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(1));
            continue;
        }
        log::error!(
            "delayq[{}]: could not write {count} {operation}(s): {e}; they will be delivered again",
            pool.queue_name
        );
        Counters::add(&pool.counters.unwritten, count as u64);
        return Err(e);
    }
}
