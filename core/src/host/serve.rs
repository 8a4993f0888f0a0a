//! The receive loop of one process, the same for every binding. Between messages it
//! lets the binding run its language's signal handlers and applies the recycle limits;
//! it takes the next delivery, has the binding call the handler on its own thread,
//! ends a process a handler forked, settles the message by the run policy
//! ([`settle`]), runs the hooks, and tells why the run ended.
//!
//! The binding implements [`Handler`]: making the handler's arguments, calling it,
//! telling what the call came to, the hooks, and waiting (Python lets go of the GIL).
//! It keeps the consumer (PHP guards it against a bailout) and finishes it after.

use std::time::Duration;

use super::run::{AfterSettle, Outcome, Recycle, after_settle, ended_by, settle};
use super::{Slot, StopReason};
use crate::worker::{Consumer, Delivery, Received, Retry};

/// How long one wait for a delivery lasts before the loop looks at signals and limits
/// again.
const RECEIVE_SLICE: Duration = Duration::from_millis(100);

/// What a handler call came to, as the binding tells it.
#[derive(Debug)]
pub struct Called<Thrown, Raise> {
    /// For the run policy.
    pub outcome: Outcome,
    /// What the handler threw, for `on_failure` (when it raised).
    pub thrown: Option<Thrown>,
    /// An error to raise from the run once it has ended (Python's `SystemExit`).
    pub raise: Option<Raise>,
}

/// A binding's side of the loop; every method runs on the handler's thread.
pub trait Handler {
    /// The handler's arguments for one delivery (payload and message object), kept
    /// for the hooks.
    type Call;
    /// What calling the handler returned, as the language gives it.
    type Return;
    /// What a handler threw, for `on_failure`.
    type Thrown;
    /// An error that the run raises once it has ended.
    type Raise;

    /// Between messages: run the language's own signal handlers. A stop they ask for,
    /// or an error that ends the run at once. `ending`: the run has its reason to end
    /// already; a signal that comes now is not the run's to take (PHP passes it on to
    /// the handler that was there before the run).
    fn between(&mut self, ending: bool) -> Result<Option<StopReason>, Self::Raise>;

    /// A stop the binding's own code asked for (its `stop()`), if any.
    fn asked(&mut self) -> Option<StopReason>;

    /// Run `wait` (Python lets go of the GIL meanwhile).
    fn wait<T: Send>(&mut self, wait: impl FnOnce() -> T + Send) -> T;

    /// Pass on what the pool's threads logged, on this thread.
    fn flush_logs(&mut self);

    /// The handler's arguments for `delivery`; `Err` with the reason when its stored
    /// payload cannot be decoded.
    fn prepare(&mut self, delivery: &Delivery) -> Result<Self::Call, String>;

    /// Call the handler.
    fn call(&mut self, call: &Self::Call) -> Self::Return;

    /// What the call came to.
    fn outcome(&mut self, returned: Self::Return) -> Called<Self::Thrown, Self::Raise>;

    /// The message's own decision (`retry_later`, `dead_letter`), taken.
    fn decision(&mut self, call: &Self::Call) -> Option<(Retry, String)>;

    /// In a process that a handler or a hook forked: end it, before it can run, wait
    /// on or write through the pool it inherited. PHP exits here; Python may only
    /// raise, and the loop ends with that error.
    fn leave_forked_child(&mut self, returned: Option<Self::Return>) -> Self::Raise;

    /// The `on_failure` hook, once the message's fate is decided.
    fn on_failure(&mut self, call: &Self::Call, thrown: Self::Thrown);

    /// The `on_dead` hook.
    fn on_dead(&mut self, call: &Self::Call, error: &str);

    /// The process's memory, as `max_memory_mb` counts it.
    fn memory_bytes(&mut self) -> i64;
}

/// How a run ended.
#[derive(Debug)]
pub struct Served<Raise> {
    /// Why (see [`ended_by`]).
    pub stopped_by: Option<StopReason>,
    /// An error to raise once the consumer is finished.
    pub raise: Option<Raise>,
}

/// The first reason given wins; the binding's own `stop()` may have come first.
fn note(ended: &mut Option<StopReason>, asked: Option<StopReason>, why: StopReason) {
    if ended.is_none() {
        *ended = asked.or(Some(why));
    }
}

/// Hand `consumer`'s deliveries to `handler` one at a time until the pool stops.
/// `slot`: a supervised process's slot, told of each handler call and the delivery it
/// holds.
pub fn serve<H: Handler>(
    consumer: &Consumer,
    handler: &mut H,
    slot: Option<&Slot>,
    mut recycle: Recycle,
) -> Served<H::Raise> {
    let stopper = consumer.stopper();
    let mut ended = None;
    let mut raise = None;
    loop {
        match handler.between(ended.is_some()) {
            Ok(None) => {}
            Ok(Some(why)) => {
                note(&mut ended, handler.asked(), why);
                consumer.stop();
            }
            Err(e) => {
                consumer.stop();
                raise = Some(e);
                break;
            }
        }
        if ended.is_none()
            && let Some(why) = recycle.before_next()
        {
            note(&mut ended, handler.asked(), why);
            consumer.stop();
        }
        if consumer.in_forked_child() {
            // Forked by a hook or a signal handler, which returned.
            raise = Some(handler.leave_forked_child(None));
            break;
        }
        let received = handler.wait(|| consumer.recv_timeout(RECEIVE_SLICE));
        handler.flush_logs();
        let delivery = match received {
            Received::Message(d) => d,
            Received::Idle => continue,
            Received::Stopped => break,
        };
        let call = match handler.prepare(&delivery) {
            Ok(call) => call,
            Err(error) => {
                consumer.unreadable(delivery, &error);
                continue;
            }
        };
        // The lease read again after the arguments were built, with nothing that
        // waits between it and the call: a freeze before it gives the delivery back.
        let Some(delivery) = consumer.begin(delivery) else {
            continue;
        };
        if let Some(s) = slot {
            s.started(Some(&delivery), Duration::ZERO, true);
        }
        let returned = handler.call(&call);
        if consumer.in_forked_child() {
            // Before the slot hears of it: the slot is shared with the parent, whose
            // handler the supervisor times.
            raise = Some(handler.leave_forked_child(Some(returned)));
            break;
        }
        if let Some(s) = slot {
            s.finished();
        }
        let called = handler.outcome(returned);
        let decision = handler.decision(&call);
        let (fate, stop) = settle(consumer, delivery, called.outcome, decision);
        match after_settle(fate, stop, called.thrown.is_some()) {
            AfterSettle::Stop(why) => {
                note(&mut ended, handler.asked(), why);
                raise = called.raise;
                break;
            }
            AfterSettle::Hooks { on_failure, on_dead } => {
                if let (true, Some(thrown)) = (on_failure, called.thrown) {
                    handler.on_failure(&call, thrown);
                }
                if let Some(error) = on_dead {
                    handler.on_dead(&call, &error);
                }
            }
        }
        if ended.is_none()
            && let Some(why) = recycle.after_job(|| handler.memory_bytes())
        {
            note(&mut ended, handler.asked(), why);
            consumer.stop();
        }
    }
    // A restart request or an empty queue stops the pool from its own threads,
    // possibly while this thread waited.
    let asked = ended.or_else(|| handler.asked());
    Served {
        stopped_by: ended_by(&stopper, asked),
        raise,
    }
}
