//! `DelayQueueMessage`: one delivery (mirrors `delayq::Delivery`). Inside a
//! `DelayQueueWorker` handler, its return or exception decides, and retryLater() or
//! deadLetter() change that decision; a message of `DelayQueueConsumer::receive()` is
//! decided by its own ack(), fail(), release(), retryLater() or deadLetter(), each
//! written to Redis before it returns (or throwing when it could not be).

use std::cell::RefCell;
use std::rc::Rc;

use ext_php_rs::exception::PhpException;
use ext_php_rs::prelude::*;
use ext_php_rs::types::Zval;

use crate::convert::{self, Seconds};
use crate::errors::{self, OrThrow};

type PhpResult<T> = Result<T, PhpException>;

/// What a handler asked for with retryLater() or deadLetter(); shared with the loop
/// that reads it once the handler is done (both on the PHP thread).
pub(crate) type Decision = Rc<RefCell<Option<(delayq::Retry, String)>>>;

/// A running pool, shared by a `DelayQueueConsumer` and the messages it handed out;
/// `None` once stopped.
pub(crate) type SharedConsumer = Rc<RefCell<Option<delayq::Consumer>>>;

/// A message of a pull consumer: its delivery until decided.
#[derive(Debug)]
pub(crate) struct Pulled {
    pub(crate) consumer: SharedConsumer,
    pub(crate) delivery: RefCell<Option<delayq::Delivery>>,
}

/// The reason a message dropped undecided fails with.
const DROPPED: &str = "the message was dropped undecided (no ack(), fail(), release(), retryLater() or deadLetter())";

/// One delivery: the handler's second argument, or what `DelayQueueConsumer::receive()`
/// returns.
#[php_class]
#[php(name = "DelayQueueMessage")]
#[php(flags = ext_php_rs::flags::ClassFlags::Final)]
#[derive(Debug)]
pub struct PhpMessage {
    pub(crate) id: String,
    pub(crate) attempt: i64,
    pub(crate) max_attempts: i64,
    pub(crate) due_at: f64,
    pub(crate) expires_at: Option<f64>,
    pub(crate) serial_key: Option<String>,
    pub(crate) group: Option<String>,
    pub(crate) queue: String,
    pub(crate) partition: i64,
    pub(crate) payload: Zval,
    pub(crate) decision: Decision,
    pub(crate) pulled: Option<Pulled>,
    pub(crate) cancel: delayq::CancelFlag,
}

impl PhpMessage {
    /// The message of `delivery`, whose payload is `payload`.
    pub(crate) fn new(delivery: &delayq::Delivery, payload: Zval, pulled: Option<Pulled>) -> Self {
        Self {
            id: delivery.id.clone(),
            attempt: i64::from(delivery.attempt),
            max_attempts: i64::from(delivery.max_attempts),
            due_at: convert::ms_to_secs(delivery.due_at_ms),
            expires_at: delivery.expires_at_ms.map(convert::ms_to_secs),
            serial_key: delivery.serial_key.clone(),
            group: delivery.group.clone(),
            queue: delivery.queue.to_string(),
            partition: delivery.partition() as i64,
            payload,
            decision: Decision::default(),
            pulled,
            cancel: delayq::Delivery::cancel_flag(delivery),
        }
    }

    fn decide(&self, retry: delayq::Retry, reason: String) -> PhpResult<()> {
        if self.pulled.is_some() {
            return self.complete("retryLater() or deadLetter()", |c, d| {
                c.fail_with(d, &reason, retry);
            });
        }
        let mut decision = self.decision.borrow_mut();
        if decision.is_some() {
            return Err(errors::invalid(
                "retryLater() or deadLetter() was called for this delivery already",
            ));
        }
        *decision = Some((retry, reason));
        Ok(())
    }

    /// Hands a pulled message's delivery to `act` and waits until the pool has written
    /// what it decided.
    fn complete(&self, called: &str, act: impl FnOnce(&delayq::Consumer, delayq::Delivery)) -> PhpResult<()> {
        let Some(pulled) = &self.pulled else {
            return Err(errors::invalid(format!(
                "{called} is for messages of DelayQueueConsumer::receive(); inside a DelayQueueWorker \
                 handler, return to acknowledge the message or throw to fail it"
            )));
        };
        let consumer = pulled.consumer.borrow();
        let Some(consumer) = consumer.as_ref() else {
            return Err(errors::invalid(format!(
                "message {} cannot be decided: its DelayQueueConsumer was stopped; it runs again after its lease",
                self.id
            )));
        };
        let Some(delivery) = pulled.delivery.borrow_mut().take() else {
            return Err(errors::invalid(format!("message {} was decided already", self.id)));
        };
        let receipt = delivery.receipt();
        act(consumer, delivery);
        consumer.wait_written(receipt).or_throw()
    }
}

impl Drop for PhpMessage {
    /// A pulled message dropped undecided fails (counted as an attempt): it runs again
    /// after the backoff rather than after its lease, or on its last attempt goes to
    /// the dead letters.
    fn drop(&mut self) {
        let Some(pulled) = &self.pulled else { return };
        let (Some(d), Ok(consumer)) = (pulled.delivery.borrow_mut().take(), pulled.consumer.try_borrow()) else {
            return;
        };
        if let Some(c) = consumer.as_ref() {
            c.fail(d, DROPPED);
        }
    }
}

#[php_impl]
impl PhpMessage {
    /// The message id.
    #[php(getter)]
    pub fn get_id(&self) -> String {
        self.id.clone()
    }

    /// The payload, as the handler receives it.
    #[php(getter)]
    pub fn get_payload(&self) -> Zval {
        self.payload.shallow_clone()
    }

    /// This delivery's number, counting from 1.
    #[php(getter)]
    pub fn get_attempt(&self) -> i64 {
        self.attempt
    }

    /// Deliveries allowed before the message goes to the dead-letter set.
    #[php(getter)]
    pub fn get_max_attempts(&self) -> i64 {
        self.max_attempts
    }

    /// When this delivery was due: Unix time in seconds (float).
    #[php(getter)]
    pub fn get_due_at(&self) -> f64 {
        self.due_at
    }

    /// With the push option 'expire_after': the latest it could start, Unix seconds;
    /// else null.
    #[php(getter)]
    pub fn get_expires_at(&self) -> Option<f64> {
        self.expires_at
    }

    /// With the push option 'serial_key': the key, which no other running message
    /// holds meanwhile; else null.
    #[php(getter)]
    pub fn get_serial_key(&self) -> Option<String> {
        self.serial_key.clone()
    }

    /// With the push option 'group': the group, whose limits it counts against; else
    /// null.
    #[php(getter)]
    pub fn get_group(&self) -> Option<String> {
        self.group.clone()
    }

    /// The queue's name.
    #[php(getter)]
    pub fn get_queue(&self) -> String {
        self.queue.clone()
    }

    /// The partition it came from (0 unless the queue has `partitions`).
    #[php(getter)]
    pub fn get_partition(&self) -> i64 {
        self.partition
    }

    /// Fail this delivery and run it again after `$delay` seconds (a rate limit's
    /// "try again in 60 s"). Counts as an attempt: past max_attempts the message goes
    /// to the dead-letter set. In a handler, whatever the handler does next; for a
    /// message of a consumer, at once.
    #[php(defaults(reason = "\"retry requested by the handler\""))]
    pub fn retry_later(&self, delay: Seconds, reason: String) -> PhpResult<()> {
        let delay = delayq::delay_from_secs("delay", delay.0).or_throw()?;
        self.decide(delayq::Retry::After(delay), reason)
    }

    /// Fail this delivery for good: to the dead-letter set now with `$reason`, no
    /// retries (the order it was about no longer exists). In a handler, whatever the
    /// handler does next; for a message of a consumer, at once.
    #[php(defaults(reason = "\"dead-lettered by the handler\""))]
    pub fn dead_letter(&self, reason: String) -> PhpResult<()> {
        self.decide(delayq::Retry::Never, reason)
    }

    /// Whether it was cancelled while it runs (`DelayQueue::cancel()` from any
    /// process): its worker learns of it within a heartbeat (a third of its lease).
    /// Whatever the handler does then, the message is deleted: not retried, not
    /// dead-lettered. A handler that never asks ends normally.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// A message of a consumer is done: deleted.
    pub fn ack(&self) -> PhpResult<()> {
        self.complete("ack()", delayq::Consumer::ack)
    }

    /// A message of a consumer failed with `$reason`: retried after the worker's
    /// backoff, or past max_attempts moved to the dead-letter set.
    pub fn fail(&self, reason: String) -> PhpResult<()> {
        self.complete("fail()", |c, d| {
            c.fail(d, &reason);
        })
    }

    /// Give a message of a consumer back unstarted: due again at once, and this
    /// delivery does not count as an attempt.
    pub fn release(&self) -> PhpResult<()> {
        self.complete("release()", delayq::Consumer::release)
    }
}
