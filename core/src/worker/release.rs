//! Releasing deliveries that were claimed but not started: `Releaser` (at a stop or
//! before a kill) and the pool's own release while stalled or outranked.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use redis::Value;

use crate::conn::{ConnSlot, Replay};
use crate::error::Error;
use crate::scripts::{self, Call, MAX_BATCH, complete};

use super::complete::{count_released, note_not_applied};
use super::pool::{Outstanding, Pool};
use super::{Delivery, Summary, run_call};

/// See [`Consumer::releaser`].
pub struct Releaser(pub(super) Vec<Arc<Pool>>);

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
        self.stop_and_release(None)
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

    /// Stop claiming and release every delivery but one to the queue at once,
    /// uncounted: for a process about to be killed for a handler that blocks all its
    /// others (a coroutine blocking its event loop), so that only that handler's
    /// delivery, of queue `member` (0: the worker's own) under `lease`, stays held for
    /// the supervisor to fail. Returns how many went back.
    pub fn stop_and_release_all_but(&self, member: usize, lease: &str, id: &str) -> usize {
        let waiting = self.stop_and_release_waiting();
        let running = self.stop_and_release(Some((member, lease, id)));
        if running > 0 {
            log::warn!(
                "delayq: a handler blocked the other handlers of its process past the timeout; {running} of their \
                 deliveries went back to the queue before the kill"
            );
        }
        waiting + running
    }

    /// Stop and release every delivery the pools hold but `spared` (the index of its
    /// queue in the worker, its lease and its id).
    fn stop_and_release(&self, spared: Option<(usize, &str, &str)>) -> usize {
        let mut total = 0;
        for (member, pool) in self.0.iter().enumerate() {
            pool.control.stop();
            let held: Vec<Outstanding> = {
                let mut outstanding = pool.outstanding.lock();
                let kept = match spared {
                    Some((m, lease, id)) if m == member => outstanding
                        .iter()
                        .find(|(_, o)| &*o.lease == lease && o.id == id)
                        .map(|(ticket, _)| *ticket),
                    _ => None,
                };
                let (tickets, held): (Vec<_>, Vec<_>) =
                    outstanding.extract_if(|ticket, _| Some(*ticket) != kept).unzip();
                note_not_applied(
                    pool,
                    tickets.into_iter(),
                    Error::State("the pool gave the message back at a stop at once; it runs again".into()),
                );
                held
            };
            pool.settled.notify_all();
            let q = &pool.queue;
            let mut slot = ConnSlot::new();
            let mut released = 0;
            for part in 0..q.partitions() {
                let mine: Vec<&Outstanding> = held.iter().filter(|o| o.part == part).collect();
                for chunk in mine.chunks(MAX_BATCH) {
                    let args = complete::Release {
                        deliveries: chunk
                            .iter()
                            .map(|o| complete::Delivery {
                                id: &o.id,
                                lease: &o.lease,
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
                        Ok(r) => {
                            count_released(pool, r);
                            released += usize::try_from(r.released).unwrap_or(usize::MAX);
                        }
                        Err(e) => log::warn!(
                            "delayq[{}]: could not give {} deliveries back; they run again after their lease: {e}",
                            pool.queue_name,
                            chunk.len()
                        ),
                    }
                }
            }
            total += released;
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

/// While every handler is stuck, prefetched deliveries would only wait behind them
/// (their leases renewed): release them so that other consumers run them now.
/// Why a pool releases its prefetched deliveries (see `release_buffered`).
#[derive(Clone, Copy)]
pub(super) enum ReleaseReason {
    /// Every handler is past its timeout.
    Stalled,
    /// A lower queue's deliveries wait behind higher queues' work.
    Outranked,
    /// The process's supervisor is about to kill it for a hung handler.
    Killing,
}

pub(super) fn release_buffered(pool: &Pool, slot: &mut ConnSlot, why: ReleaseReason) {
    let waiting: Vec<Delivery> = pool.buffered.try_iter().collect();
    if waiting.is_empty() {
        return;
    }
    let q = &pool.queue;
    let mut by_part: Vec<Vec<&Delivery>> = vec![Vec::new(); q.partitions()];
    for d in &waiting {
        by_part[d.part].push(d);
    }
    let res = by_part.iter().enumerate().filter(|(_, ds)| !ds.is_empty()).try_fold(
        complete::Released::default(),
        |total, (part, ds)| {
            let args = complete::Release {
                deliveries: ds
                    .iter()
                    .map(|d| complete::Delivery {
                        id: &d.id,
                        lease: &d.token,
                    })
                    .collect(),
            };
            run_call(slot, q, part, &args).map(|r: complete::Released| complete::Released {
                released: total.released + r.released,
                cancelled: total.cancelled + r.cancelled,
            })
        },
    );
    match res {
        Ok(r) => {
            count_released(pool, r);
            let n = r.released;
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
        outstanding.remove(&d.ticket);
    }
    drop(outstanding);
    pool.settled.notify_all();
    pool.control.slots.release(waiting.len());
}
