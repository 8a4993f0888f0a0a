//! `Consumer`: the caller's side of a running pool. Hands deliveries out in priority
//! order and takes their acks, failures and releases; shuts the pool down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Select, Sender, TryRecvError};

use crate::backoff::retry_delay;
use crate::error::{Category, Error};
use crate::time::MAX_DELAY;

use super::complete::Outcome;
use super::control::{Control, group_stopped};
use super::pool::{Pool, YIELD_RECHECK, queue_now_ms};
use super::summary::Counters;
use super::{Delivery, Fate, Receipt, Received, Releaser, Retry, Stopper, Summary};

/// `trace` within `max` bytes: its start and its end around a note of what was left
/// out, cut on character boundaries.
pub(super) fn cut_trace(trace: &str, max: usize) -> String {
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

/// The caller's side of a running pool.
pub struct Consumer {
    pub(super) pool: Arc<Pool>,
    pub(super) deliveries: Receiver<Delivery>,
    pub(super) outcomes: Option<Sender<Outcome>>,
    pub(super) fetchers: Vec<JoinHandle<()>>,
    pub(super) others: Vec<JoinHandle<()>>,
    pub(super) done: Option<Sender<()>>,
    pub(super) running: Arc<AtomicBool>,
    pub(super) finished: bool,
    /// The pools of the worker's lower queues, in priority order.
    pub(super) lower: Vec<Consumer>,
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
        let deadline = Instant::now() + timeout;
        loop {
            if self.pool.control.stopped() {
                return Received::Stopped;
            }
            match self.deliveries.recv_deadline(deadline) {
                Ok(d) => match self.accept(d) {
                    Some(received) => return received,
                    // Its lease ended unstarted: the next one, within the same wait.
                    None => continue,
                },
                Err(RecvTimeoutError::Timeout) => {
                    return if self.pool.control.stopped() {
                        Received::Stopped
                    } else {
                        Received::Idle
                    };
                }
                Err(RecvTimeoutError::Disconnected) => return Received::Stopped,
            }
        }
    }

    pub(super) fn recv_by_priority(&self, timeout: Duration) -> Received {
        let deadline = Instant::now() + timeout;
        'turn: loop {
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
                        Some(Received::Message(d)) => return Received::Message(d),
                        // Its lease ended unstarted: this queue may hold more.
                        None => continue 'turn,
                        // Stopped meanwhile: its delivery went back; look further.
                        Some(_) => continue,
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

    /// Hand `d`, just taken from this pool's buffer, to the caller; `None` when it is
    /// not to start: cancelled while it waited in the buffer (ended as cancelled), or
    /// its lease may have ended (the pool was frozen, or could not renew it): another
    /// consumer may run it already, so it is given back unstarted.
    pub(super) fn accept(&self, mut d: Delivery) -> Option<Received> {
        if self.pool.control.stopped() {
            // Not started: give it back at once rather than after its lease.
            self.send(Outcome::release(d));
            return Some(Received::Stopped);
        }
        if d.is_cancelled() {
            self.send(cancelled(d));
            return None;
        }
        let now = Instant::now();
        let live = match self.pool.outstanding.lock().get_mut(&d.ticket) {
            Some(o) if self.pool.lease_live_at(o.renewed, now) => {
                if self.pool.reads_starts() {
                    o.started = Some(now);
                }
                true
            }
            _ => false,
        };
        if !live {
            self.give_back_unstarted(d);
            return None;
        }
        Counters::add(&self.pool.counters.handled, 1);
        self.pool.record_start(&d, now);
        d.handed_out = Some(now);
        Some(Received::Message(d))
    }

    /// Give back `d`, whose lease may have ended before its handler started: another
    /// consumer may run it already.
    fn give_back_unstarted(&self, d: Delivery) {
        log::warn!(
            "delayq[{}]: message {} was not started: its lease may have ended while the pool was paused \
             or could not reach Redis; given back for another delivery",
            self.pool.queue_name,
            d.id
        );
        self.send(Outcome::release(d));
    }

    pub(super) fn members(&self) -> impl Iterator<Item = &Consumer> {
        std::iter::once(self).chain(&self.lower)
    }

    pub(super) fn controls(&self) -> Vec<Arc<Control>> {
        self.members().map(|m| Arc::clone(&m.pool.control)).collect()
    }

    /// The pool that handed out `d`.
    pub(super) fn owner(&self, d: &Delivery) -> &Consumer {
        self.members().nth(d.member).unwrap_or(self)
    }

    /// The handler succeeded: delete the message (written in the background, batched).
    pub fn ack(&self, d: Delivery) {
        let owner = self.owner(&d);
        owner.pool.record_handler_time(&d);
        if d.is_cancelled() {
            return owner.send(cancelled(d));
        }
        owner.send(Outcome::Ack {
            part: d.part,
            id: d.id,
            token: d.token,
            ticket: d.ticket,
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

    /// A delivery whose payload the binding cannot turn into a value of its language
    /// (`error` says why): the same text decodes no better next time, so it goes to the
    /// dead letters now, counted as an attempt.
    pub fn unreadable(&self, d: Delivery, error: &str) -> Fate {
        self.fail_with(d, error, Retry::Never)
    }

    /// As [`fail_with`](Self::fail_with), keeping `trace` (a stack trace, a chain of
    /// causes) beside the error until the message's next failure or its end, cut to
    /// `max_trace_bytes`: what `Queue::get` and the dead letters show as `error_trace`,
    /// for whoever looks into a failure after the worker's log is gone.
    pub fn fail_traced(&self, d: Delivery, error: &str, trace: &str, retry: Retry) -> Fate {
        let owner = self.owner(&d);
        owner.pool.record_handler_time(&d);
        if d.is_cancelled() {
            owner.send(cancelled(d));
            return Fate::Cancelled;
        }
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
            ticket: d.ticket,
            delay_ms,
            error,
            trace: cut_trace(trace, owner.pool.opts.max_trace_bytes),
            counted: true,
            past_max_attempts: false,
        });
        fate
    }

    /// Whether `d`'s lease is still live by the pool's clock, as `recv_timeout` checked
    /// it when it handed `d` out. A caller that starts the handler later asks
    /// [`begin`](Self::begin), which reads the clock at the start.
    pub fn lease_live(&self, d: &Delivery) -> bool {
        let pool = &self.owner(d).pool;
        pool.outstanding
            .lock()
            .get(&d.ticket)
            .is_some_and(|o| !o.timed_out && pool.lease_live_at(o.renewed, Instant::now()))
    }

    /// `d` back to start its handler now, while its lease lives by the pool's clock read
    /// here; else `None`, `d` given back unstarted (as `recv_timeout` gives back one
    /// whose lease ended in the buffer), or ended as cancelled if it was marked since
    /// its hand-out. For a caller that starts the handler some time
    /// after the hand-out (an asyncio task, started when the event loop gets to it):
    /// called in the same step as the handler's first code, with nothing between the
    /// two that could wait, so that a freeze or a stall before the start is seen. A
    /// freeze after it is one of a running handler: its lease lost, its ack refused.
    pub fn begin(&self, d: Delivery) -> Option<Delivery> {
        let owner = self.owner(&d);
        if d.is_cancelled() {
            owner.send(cancelled(d));
        } else if self.lease_live(&d) {
            return Some(d);
        } else {
            owner.give_back_unstarted(d);
        }
        // Counted at its hand-out; no handler started it after all.
        Counters::sub(&owner.pool.counters.handled, 1);
        None
    }

    /// Wait until the completion of the delivery named by `receipt` (an ack, a failure,
    /// a release) is written to Redis: for a caller that must not go on before its
    /// decision is stored, such as a framework's worker that may kill its own process
    /// next. The completer tries while the lease lasts; an error says it gave up (the
    /// message runs again after its lease), that the lease was lost meanwhile (another
    /// delivery has the message), or that the pool gave the message back (a stop at
    /// once).
    pub fn wait_written(&self, receipt: Receipt) -> crate::error::Result<()> {
        if self.in_forked_child() {
            return Err(Error::State(
                "a process forked from the worker cannot complete its deliveries: the parent does".into(),
            ));
        }
        let pool = &self.members().nth(receipt.member).unwrap_or(self).pool;
        let mut outstanding = pool.outstanding.lock();
        while outstanding.contains_key(&receipt.ticket) {
            pool.settled.wait(&mut outstanding);
        }
        drop(outstanding);
        let mut unwritten = pool.unwritten.lock();
        let Some(at) = unwritten.iter().position(|(t, _)| *t == receipt.ticket) else {
            return Ok(());
        };
        let (_, cause) = unwritten.remove(at).unwrap_or_else(|| unreachable!());
        drop(unwritten);
        Err(match &*cause {
            Error::LeaseLost { id, reason } => Error::LeaseLost {
                id: id.clone(),
                reason: reason.clone(),
            },
            cause => {
                let text =
                    format!("the decision was not written to Redis ({cause}); the message runs again after its lease");
                match cause.category() {
                    Category::Connection | Category::Timeout => Error::ConnectionLost(text),
                    Category::Auth => Error::AuthFailed(text),
                    _ => Error::Redis(text),
                }
            }
        })
    }

    /// How soon a message of its queues may next be taken, as far as the pool knows
    /// (from its last claims and producers' wake-ups): the next due message, or a lease
    /// that ends sooner; zero when one is due now, `None` when none is known. For a caller that waits a while before it asks again (a
    /// framework's idle sleep), and keeps waiting instead when a message comes sooner.
    pub fn next_due_in(&self) -> Option<Duration> {
        let now = Instant::now();
        self.members()
            .filter(|m| !m.pool.control.stopped())
            .filter_map(|m| {
                let st = m.pool.control.wake.state.lock();
                (0..st.next_due.len()).filter_map(|part| st.due_at(part)).min()
            })
            .min()
            .map(|at| at.saturating_duration_since(now))
    }

    /// Why the pool's last claim failed, while its claims fail (Redis cannot be
    /// reached, a permission was taken away); `None` once a claim goes through. The
    /// pool keeps trying with a backoff meanwhile.
    pub fn claim_failure(&self) -> Option<Arc<Error>> {
        self.members().find_map(|m| {
            m.pool
                .claim_failures
                .iter()
                .find_map(|f| f.lock().as_ref().map(|f| Arc::clone(&f.error)))
        })
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

    pub(super) fn send(&self, outcome: Outcome) {
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

    pub(super) fn shutdown(&mut self) {
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
    pub(super) fn leave_to_parent(&mut self) {
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

/// The completion of a delivery its pool knows was cancelled, run or not: nack.lua
/// deletes a marked message whatever the failure asks (see cancel.lua).
fn cancelled(d: Delivery) -> Outcome {
    Outcome::Nack {
        part: d.part,
        id: d.id,
        token: d.token,
        ticket: d.ticket,
        delay_ms: -1,
        error: "cancelled while it ran".to_owned(),
        trace: String::new(),
        counted: false,
        past_max_attempts: false,
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
