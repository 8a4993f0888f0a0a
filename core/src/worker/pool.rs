//! The state one running pool shares among its threads: what it holds, its
//! counters, the prefetch room, the priority rules between a worker's queues, and
//! the queue's clock as the pool knows it (`queue_now_ms`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use parking_lot::{Condvar, Mutex};

use crate::error::Error;
use crate::queue::Queue;
use crate::scripts::claim;

use super::control::Control;
use super::delivery::{CancelFlag, Delivery, Ticket};
use super::options::WorkerOptions;
use super::registration::{Lateness, Registration};
use super::summary::Counters;

/// The next claim's first ticket. One count for the whole process, not one per pool:
/// a delivery completed on another consumer than its own (a stale one kept past
/// `finish`, another worker's) then names no entry there, where a per-pool count
/// could name a live delivery of that pool and stop its heartbeats.
static TICKETS: AtomicU64 = AtomicU64::new(0);

/// `n` fresh tickets, the first returned.
pub(super) fn take_tickets(n: usize) -> Ticket {
    TICKETS.fetch_add(n as u64, Ordering::Relaxed)
}

pub(super) type HeldMap = hashbrown::HashMap<Ticket, Outstanding>;

pub(super) struct Outstanding {
    pub(super) part: usize,
    /// Its lease (its claim's deliveries share the text) and message id.
    pub(super) lease: Arc<str>,
    pub(super) id: String,
    pub(super) claimed: Instant,
    /// When its handler started; kept only where it is read (`Pool::reads_starts`).
    pub(super) started: Option<Instant>,
    pub(super) timed_out: bool,
    /// Detached from its claim once it timed out (see extend.lua): its deadline is its
    /// own, which no heartbeat renews.
    pub(super) detached: bool,
    /// Claimed alone ("q<token>"): from the quarantine, or a single message for a free
    /// handler (see claim.lua); its expiry counts as an attempt.
    pub(super) alone: bool,
    /// When the call that last set its lease's deadline was sent (the claim, then
    /// each renewal): Redis counted the lease from a moment after it.
    pub(super) renewed: Instant,
    /// Its cancel mark, as a heartbeat learned it (shared with its `Delivery`).
    pub(super) cancel: CancelFlag,
}

pub(super) struct Pool {
    pub(super) queue: Queue,
    pub(super) queue_name: Arc<str>,
    pub(super) opts: WorkerOptions,
    pub(super) control: Arc<Control>,
    pub(super) counters: Counters,
    /// Claimed, not yet completed, by ticket.
    pub(super) outstanding: Mutex<HeldMap>,
    /// Notified when completions leave `outstanding` (see `Consumer::wait_written`).
    pub(super) settled: Condvar,
    /// The last completions that did not take effect as decided (given up on, a lost
    /// lease, a stop at once), and why (see `complete::note_not_applied`).
    pub(super) unwritten: Mutex<std::collections::VecDeque<(Ticket, Arc<Error>)>>,
    /// Deliveries the caller works on at once (its handler threads or tasks).
    pub(super) handlers: usize,
    /// Every handler is past `timeout`: claim nothing, and give prefetched deliveries
    /// back so that other consumers run them instead of waiting behind a hung handler.
    pub(super) stalled: AtomicBool,
    /// The hand-off buffer, for giving prefetched deliveries back while stalled.
    pub(super) buffered: Receiver<Delivery>,
    /// Moving average of one handler call, in microseconds (0 until measured).
    pub(super) handler_us: AtomicU64,
    /// Handler starts and how late they were: since the last renewal built, and in
    /// the renewal waiting to be sent (see `Registration`).
    pub(super) lateness: Mutex<(Lateness, Lateness)>,
    pub(super) registration: Registration,
    /// The last claim found the queue paused (see `note_paused`).
    pub(super) paused: AtomicBool,
    /// Per partition: when a claim next asks for broken repeats.
    pub(super) repeat_checks: Mutex<Vec<Instant>>,
    /// Per partition: its last claim found a rate limit in force.
    pub(super) rate_limited: Vec<AtomicBool>,
    /// Per partition: its last claim passed over a quarantined message due (see
    /// `waits_for_alone_turn`).
    pub(super) quarantine_due: Vec<AtomicBool>,
    /// When its `Worker` was made, locally and on the server's clock (learnt from the
    /// first claim): restart requests before it are not meant for it.

    /// Deliveries that claims under way may bring (see `reserve_room`).
    pub(super) reserved: Mutex<usize>,
    /// A claim that may take a quarantined message alone is under way (see
    /// `quarantine_turn`); the worker's first pool's flag stands for all its queues.
    pub(super) claiming_alone: AtomicBool,
    /// Claims sent and not yet counted as outstanding (for `stop_when_empty`).
    pub(super) claiming: AtomicUsize,
    /// Its place among its worker's queues: 0 for the worker's own, then the lower
    /// queues in priority order.
    pub(super) member: usize,
    /// The pools of every queue of its worker, in priority order (itself included),
    /// set before any thread starts.
    pub(super) group: OnceLock<Vec<Weak<Pool>>>,
    /// Handlers of its deliveries past `timeout` at the last heartbeat.
    pub(super) overdue: AtomicUsize,
    /// Per partition: why its claims fail, while they do (see `yields_to_higher`,
    /// `Consumer::claim_failure`).
    pub(super) claim_failures: Vec<Mutex<Option<ClaimFailure>>>,
    /// How many of `claim_failures` hold one: read on the hand-out's path, locked never.
    pub(super) failing_parts: AtomicUsize,
    /// What its handlers did by minute, for the queue's per-minute records.
    pub(super) minutes: crate::metrics::Tally,
}

/// A partition's claims fail: since when, how many tries, and the last error.
pub(super) struct ClaimFailure {
    pub(super) error: Arc<Error>,
    pub(super) since: Instant,
    pub(super) tries: u64,
}

impl Pool {
    /// Some partition's claims fail (its Redis is down, a permission was taken away).
    pub(super) fn claims_fail(&self) -> bool {
        self.failing_parts.load(Ordering::Acquire) > 0
    }

    /// A claim of `part` failed with `e`: logged when the outage begins and when its
    /// error changes, not at every retry (a caller of the consumer hears of each
    /// through `Consumer::claim_failure`).
    pub(super) fn note_claim_failed(&self, part: usize, e: Error, at: Instant, setup_fault: bool) {
        let mut failure = self.claim_failures[part].lock();
        let text = e.to_string();
        if failure.as_ref().is_none_or(|f| f.error.to_string() != text) {
            let line = format!(
                "delayq[{}]: claim failed: {text}; retrying with backoff, logged again when it changes or ends",
                self.queue_name
            );
            if setup_fault {
                log::error!("{line}");
            } else {
                log::warn!("{line}");
            }
        }
        if failure.is_none() {
            self.failing_parts.fetch_add(1, Ordering::AcqRel);
        }
        let (since, tries) = failure.as_ref().map_or((at, 0), |f| (f.since, f.tries));
        *failure = Some(ClaimFailure {
            error: Arc::new(e),
            since,
            tries: tries + 1,
        });
    }

    /// A claim of `part` went through: the end of its outage, if it had one.
    pub(super) fn note_claim_went_through(&self, part: usize) {
        let mut failure = self.claim_failures[part].lock();
        if let Some(f) = failure.take() {
            self.failing_parts.fetch_sub(1, Ordering::AcqRel);
            log::warn!(
                "delayq[{}]: claims work again, after {} failed over {}",
                self.queue_name,
                f.tries,
                crate::time::human_ms(i64::try_from(f.since.elapsed().as_millis()).unwrap_or(i64::MAX))
            );
        }
    }
}

/// Room reserved for one claim, released once the claimed deliveries are counted as
/// outstanding (or the claim failed).
pub(super) struct Reservation<'a> {
    pub(super) reserved: &'a Mutex<usize>,
    pub(super) n: usize,
}

/// Which quarantined messages one claim may take (see `Pool::quarantine_turn`); the
/// right to take one alone is its worker's until the deliveries it brought are
/// outstanding.
pub(super) struct QuarantineTurn {
    pub(super) mode: claim::Quarantine,
    /// The pool whose flag this turn holds (its worker's first), if it may take one alone.
    alone: Option<Arc<Pool>>,
}

impl Drop for QuarantineTurn {
    fn drop(&mut self) {
        if let Some(leader) = &self.alone {
            leader.claiming_alone.store(false, Ordering::Release);
        }
    }
}

/// Counts a claim as under way until the deliveries it brought are outstanding.
pub(super) struct ClaimUnderWay<'a>(&'a AtomicUsize);

impl<'a> ClaimUnderWay<'a> {
    pub(super) fn new(count: &'a AtomicUsize) -> Self {
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
pub(super) const PREFETCH_WINDOW: Duration = Duration::from_millis(50);

/// How often a `stop_when_empty` pool looks (locally) whether its last handler is done.
pub(super) const EMPTY_POLL: Duration = Duration::from_millis(20);

/// How often a lower queue's pool looks (locally) whether the higher ones still have
/// work, while they have.
pub(super) const YIELD_RECHECK: Duration = Duration::from_millis(5);

/// A delivery is not started within the last 1/50 of its lease (see `lease_live_at`):
/// room for clocks that run at different rates and a deadline set a little late.
pub(super) const LEASE_MARGIN_DIVISOR: u32 = 50;

/// How soon a pool looks again at a partition where quarantined messages are due that
/// it could not take (a completion, which may let it, makes it look at once).
pub(super) const QUARANTINE_RECHECK: Duration = Duration::from_millis(250);

/// claim.lua's `next_ms` when the queue is paused.
pub(super) const PAUSED: i64 = -2;

/// How often a pool's claims ask for repeats with no occurrence pending: the bound on
/// how long a broken chain stays broken (a pushed occurrence is not affected).
pub(super) const REPEAT_CHECK: Duration = Duration::from_secs(60);
/// How soon after a failed push of an occurrence it is tried again.
pub(super) const REPEAT_RETRY: Duration = Duration::from_secs(5);

/// The queue's clock as the pool knows it (its own until a claim told it).
pub(super) fn queue_now_ms(pool: &Pool) -> i64 {
    pool.control
        .wake
        .server_now_ms()
        .unwrap_or_else(crate::time::now_unix_ms)
}

impl Pool {
    /// A claim on `part` reported its restart generation: one past what the pool saw
    /// at its start means a restart was requested since, and stops it. A generation,
    /// not a time: a step of the Redis clock can neither fake nor hide a request.
    pub(super) fn note_restart_request(&self, part: usize, generation: u64) {
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

    /// Whether a lease whose deadline was last set by a call sent at `renewed` still
    /// runs at `at`, by this process's monotonic clock, with a margin for the rates of
    /// Redis's clock and ours. A frozen process, or one cut off from Redis, finds its
    /// prefetched deliveries' leases over when it resumes: the reaper may have given
    /// them to another consumer.
    pub(super) fn lease_live_at(&self, renewed: Instant, at: Instant) -> bool {
        let lease = self.opts.lease;
        at.saturating_duration_since(renewed) + lease / LEASE_MARGIN_DIVISOR < lease
    }

    /// Which quarantined messages the next claim may take (see claim.lua): none while
    /// its worker holds a message claimed alone (a death then would charge it for
    /// another's); one alone too when a handler is free to start it at once (its worker,
    /// over all its queues, holds fewer deliveries than handlers, counting those claims
    /// under way may bring) and no other claim may take one, else groups. The expiry of
    /// a message claimed alone counts as an attempt: one that waited in a buffer would
    /// be charged for a start it never had.
    pub(super) fn quarantine_turn(&self) -> QuarantineTurn {
        let (holds_alone, handler_free) = self.alone_room();
        let without = |mode| QuarantineTurn { mode, alone: None };
        if holds_alone {
            return without(claim::Quarantine::None);
        }
        let Some(leader) = self.group_pools().into_iter().next() else {
            return without(claim::Quarantine::Groups);
        };
        if handler_free
            && leader
                .claiming_alone
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            return QuarantineTurn {
                mode: claim::Quarantine::Alone,
                alone: Some(leader),
            };
        }
        without(claim::Quarantine::Groups)
    }

    /// The pools of every queue of its worker (itself included): they share the handlers.
    fn group_pools(&self) -> Vec<Arc<Pool>> {
        self.group
            .get()
            .map(|g| g.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default()
    }

    /// Whether its worker holds a message claimed alone, and whether a handler is free
    /// (fewer deliveries held over its queues than handlers, counting those claims
    /// under way may bring).
    fn alone_room(&self) -> (bool, bool) {
        let (mut held, mut holds_alone) = (0, false);
        for p in self.group_pools() {
            held += *p.reserved.lock();
            let outstanding = p.outstanding.lock();
            held += outstanding.len();
            holds_alone |= outstanding.values().any(|o| o.alone);
        }
        (holds_alone, held < self.handlers)
    }

    /// A quarantined message waits for a pool to take it alone (see claim.lua), and
    /// this pool could once a handler is free: it claims nothing more until then, or
    /// under a steady backlog its prefetch would keep every handler busy, and the
    /// message would wait for the backlog to drain.
    pub(super) fn waits_for_alone_turn(&self, part: usize) -> bool {
        self.quarantine_due.get(part).is_some_and(|d| d.load(Ordering::Relaxed))
            && matches!(self.alone_room(), (false, false))
    }

    /// Whether a quarantined message was due and passed over at the last claim of any
    /// partition: a completion may now let this pool take it.
    pub(super) fn quarantine_waits(&self) -> bool {
        self.quarantine_due.iter().any(|d| d.load(Ordering::Relaxed))
    }

    /// Nothing claimed is running or waiting for a handler, and no claim is under way.
    pub(super) fn holds_nothing(&self) -> bool {
        self.claiming.load(Ordering::Acquire) == 0 && self.outstanding.lock().is_empty()
    }

    /// `stop_when_empty`: the pool holds nothing and Redis has nothing due for it.
    pub(super) fn stop_if_empty(&self) -> bool {
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
    pub(super) fn higher(&self) -> impl Iterator<Item = Arc<Pool>> + '_ {
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
    pub(super) fn yields_to_higher(&self) -> bool {
        self.higher().any(|p| p.has_work_for_handlers())
    }

    /// Deliveries the caller has not taken yet, a claim under way, or messages known to
    /// be due, unless it is stopped or its claims fail (its Redis is down).
    pub(super) fn has_work_for_handlers(&self) -> bool {
        !self.control.stopped()
            && !self.claims_fail()
            && (!self.buffered.is_empty() || self.claiming.load(Ordering::Acquire) > 0 || self.control.wake.due_now())
    }

    /// Whether anything reads when handlers started (`Outstanding::started`): the
    /// timeout, and a lower queue's check for deliveries kept waiting. Elsewhere the
    /// hand-out skips a lookup in `outstanding` per delivery.
    pub(super) fn reads_starts(&self) -> bool {
        self.opts.timeout.is_some() || self.member > 0
    }

    /// Deliveries it claimed before `since` still wait unstarted while the higher
    /// queues keep the handlers busy: consumers of this queue elsewhere could run them.
    pub(super) fn kept_waiting_by_higher(&self, since: Instant) -> bool {
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
    pub(super) fn overdue_handlers(&self) -> usize {
        match self.group.get() {
            Some(group) => group
                .iter()
                .filter_map(Weak::upgrade)
                .map(|p| p.overdue.load(Ordering::Acquire))
                .sum(),
            None => self.overdue.load(Ordering::Acquire),
        }
    }

    pub(super) fn is_rate_limited(&self) -> bool {
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
    pub(super) fn reserve_room(&self, want: usize, limited: bool) -> Reservation<'_> {
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
    pub(super) fn prefetch_now(&self) -> usize {
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
    pub(super) fn repeat_check_due(&self, part: usize) -> bool {
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

    pub(super) fn recheck_repeats_soon(&self, part: usize) {
        if let Some(next) = self.repeat_checks.lock().get_mut(part) {
            *next = (*next).min(Instant::now() + REPEAT_RETRY);
        }
    }

    /// Say once that the queue is paused (a pool started on a paused queue seems
    /// hung otherwise), and once that it goes on again.
    pub(super) fn note_paused(&self, paused: bool) {
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
    /// `d` was handed to its handler at `at`.
    pub(super) fn record_start(&self, d: &Delivery, at: Instant) {
        if let Some(now) = self.control.wake.server_ms_at(at) {
            self.lateness.lock().0.add((now - d.due_at_ms).max(0));
            self.minutes.record_start(d.part, now, now - d.due_at_ms);
        }
    }

    pub(super) fn record_handler_time(&self, d: &Delivery) {
        let Some(start) = d.handed_out else { return };
        let sample = (start.elapsed().as_micros() as u64).max(1);
        let old = self.handler_us.load(Ordering::Relaxed);
        let new = if old == 0 { sample } else { (old * 4 + sample) / 5 };
        self.handler_us.store(new, Ordering::Relaxed);
    }
}
