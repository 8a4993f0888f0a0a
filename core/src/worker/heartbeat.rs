//! The heartbeat thread: renews the leases of what the pool holds, keeps the pool's
//! entry in the list of live pools (`Queue::workers`) and its counts fresh, adds what
//! its handlers did to the queue's per-minute records and renews the queue in the
//! registry of queues (`send_minutes`), and releases prefetched deliveries when every
//! handler is stuck.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::conn::ConnSlot;
use crate::scripts::complete::Status;
use crate::scripts::{MAX_BATCH, beat, complete, extend};

use super::delivery::Ticket;
use super::pool::{Outstanding, Pool, queue_now_ms};
use super::registration::{Lateness, Registration};
use super::release::{ReleaseReason, release_buffered};
use super::run_call;

impl Registration {
    /// The pool's entry in the list of pools; it reports the lateness of the handler
    /// starts since the last renewal that was sent. A renewal that no claim carried
    /// is replaced by the next, which reports its starts too.
    pub(super) fn info(&self, pool: &Pool) -> String {
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
    pub(super) fn take_pending(&self, pool: &Pool) -> Option<(&str, u64, String)> {
        let info = self.pending.lock().take()?;
        pool.lateness.lock().1 = Lateness::default();
        Some((&self.id, self.ttl_ms(), info))
    }

    /// On every heartbeat: prepare a renewal, and send the previous one if no claim
    /// took it.
    pub(super) fn on_heartbeat(&self, pool: &Pool, slot: &mut ConnSlot) {
        let info = self.info(pool);
        let untaken = self.pending.lock().replace(info).is_some();
        if untaken && let Some((_, ttl_ms, info)) = self.take_pending(pool) {
            self.send(pool, slot, 0, ttl_ms, &info);
        }
    }

    /// Send the renewal that waits for a claim, if one does: a pool that stopped
    /// working may claim nothing for a while.
    pub(super) fn send_pending(&self, pool: &Pool, slot: &mut ConnSlot) {
        if let Some((_, ttl_ms, info)) = self.take_pending(pool) {
            self.send(pool, slot, 0, ttl_ms, &info);
        }
    }

    /// Register now (the pool starts).
    pub(super) fn join(&self, pool: &Pool, slot: &mut ConnSlot) {
        self.send(pool, slot, 0, self.ttl_ms(), &self.info(pool));
    }

    /// Leave the list of every partition a claim may have renewed it in.
    pub(super) fn leave(&self, pool: &Pool, slot: &mut ConnSlot) {
        for part in 0..pool.queue.partitions() {
            self.send(pool, slot, part, 0, "");
        }
    }

    pub(super) fn send(&self, pool: &Pool, slot: &mut ConnSlot, part: usize, ttl_ms: u64, info: &str) {
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
pub(super) const COUNTS_FRESH: Duration = Duration::from_secs(1);

pub(super) fn heartbeat_loop(pool: &Pool, done: &Receiver<()>) {
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
        let mut detaching = Vec::new();
        // Of `running`, the detached ones: asked for their marks only.
        let mut overdue_asked = Vec::new();
        {
            let mut outstanding = pool.outstanding.lock();
            for (ticket, o) in outstanding.iter_mut() {
                let overdue = matches!((pool.opts.timeout, o.started), (Some(t), Some(s)) if now.duration_since(s) > t);
                if overdue {
                    // Its claim's other messages renew the claim: out of it, the lease
                    // of this one ends at the deadline it has now.
                    if !o.detached {
                        detaching.push((o.part, *ticket, o.id.clone(), Arc::clone(&o.lease)));
                    } else if now.saturating_duration_since(o.renewed) < pool.opts.lease {
                        // Its handler may still run until that deadline: asked with the
                        // others, it is not renewed (see extend.lua), and a cancel mark
                        // still reaches its handler.
                        overdue_asked.push(*ticket);
                        running.push((o.part, *ticket, o.id.clone(), Arc::clone(&o.lease)));
                    }
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
                running.push((o.part, *ticket, o.id.clone(), Arc::clone(&o.lease)));
            }
        }
        let q = &pool.queue;
        detach(pool, &mut slot, &mut detaching);
        // By partition, then in scripts of at most MAX_BATCH.
        running.sort_unstable_by_key(|(part, ..)| *part);
        for chunk in running
            .chunk_by(|a, b| a.0 == b.0)
            .flat_map(|same_part| same_part.chunks(MAX_BATCH))
        {
            let part = chunk[0].0;
            let args = extend::Args {
                lease_ms: pool.opts.lease.as_millis() as u64,
                detach: Vec::new(),
                deliveries: chunk
                    .iter()
                    .map(|(_, _, id, lease)| complete::Delivery { id, lease })
                    .collect(),
            };
            let renewed_at = Instant::now();
            match run_call(&mut slot, q, part, &args) {
                Ok(complete::Statuses(statuses)) => {
                    let mut outstanding = pool.outstanding.lock();
                    for ((_, ticket, ..), s) in chunk.iter().zip(&statuses) {
                        if let Some(o) = outstanding.get_mut(ticket) {
                            // A detached one keeps its deadline (see extend.lua).
                            if matches!(s, Status::Done | Status::Cancelled | Status::CancelledKill) && !o.detached {
                                o.renewed = renewed_at;
                            }
                            note_mark(o, *s);
                        }
                    }
                    drop(outstanding);
                    for ((_, ticket, id, _), s) in chunk.iter().zip(statuses) {
                        // A completion written since the snapshot above is no loss: its
                        // message is gone or it has left `outstanding` by now. A detached
                        // one's loss was foretold at its timeout.
                        if s == Status::LeaseLost
                            && !overdue_asked.contains(ticket)
                            && pool.outstanding.lock().contains_key(ticket)
                        {
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

/// Detach deliveries whose handlers ran past their timeout from their claims (see
/// extend.lua), by partition; a failed call leaves them to the next heartbeat.
fn detach(pool: &Pool, slot: &mut ConnSlot, detaching: &mut [(usize, Ticket, String, Arc<str>)]) {
    detaching.sort_unstable_by_key(|(part, ..)| *part);
    for chunk in detaching
        .chunk_by(|a, b| a.0 == b.0)
        .flat_map(|same_part| same_part.chunks(MAX_BATCH))
    {
        let args = extend::Args {
            lease_ms: pool.opts.lease.as_millis() as u64,
            detach: chunk
                .iter()
                .map(|(_, _, id, lease)| complete::Delivery { id, lease })
                .collect(),
            deliveries: Vec::new(),
        };
        match run_call(slot, &pool.queue, chunk[0].0, &args) {
            // Detached, lost or gone: there is nothing left to detach either way.
            Ok(complete::Statuses(statuses)) => {
                let mut outstanding = pool.outstanding.lock();
                for ((_, ticket, ..), s) in chunk.iter().zip(statuses) {
                    if let Some(o) = outstanding.get_mut(ticket) {
                        o.detached = true;
                        note_mark(o, s);
                    }
                }
            }
            Err(e) => log::warn!(
                "delayq[{}]: detaching a timed-out delivery failed: {e}",
                pool.queue_name
            ),
        }
    }
}

/// A heartbeat's status of a delivery that tells a cancel mark (cancel.lua): its
/// handler sees it from now on.
fn note_mark(o: &mut Outstanding, s: Status) {
    match s {
        Status::Cancelled => o.cancel.mark(1),
        Status::CancelledKill => o.cancel.mark(2),
        _ => {}
    }
}

/// Add what the handlers did to the queue's per-minute records, and let the first
/// pool of each minute sample the backlog: on a heartbeat, the records become due for
/// the next claim of each partition to carry, and those no claim took since the last
/// heartbeat are sent on their own; at stop (`flush_only`), every delta left is sent.
/// A failed call keeps its deltas for the next. Also renews the queue's entry in the
/// registry of queues when due (see registry.rs).
fn send_minutes(pool: &Pool, slot: &mut ConnSlot, flush_only: bool) {
    if !flush_only {
        pool.queue.register_pool(slot);
    }
    let now_ms = queue_now_ms(pool);
    let batches = if flush_only {
        pool.minutes.take(now_ms, true)
    } else {
        pool.minutes.heartbeat(now_ms)
    };
    for batch in batches {
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
