//! `DelayQueueConsumer`: a pull consumer on the PHP thread (mirrors `delayq::Consumer`),
//! for code that asks for the next message and decides its fate later, as
//! frameworks' workers do. The pool's threads claim and renew leases meanwhile.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ext_php_rs::boxed::ZBox;
use ext_php_rs::exception::PhpException;
use ext_php_rs::prelude::*;
use ext_php_rs::types::ZendHashTable;
use ext_php_rs::zend::ExecutorGlobals;

use crate::convert::{self, Seconds};
use crate::errors;
use crate::message::{PhpMessage, Pulled, SharedConsumer};
use crate::summary::{RunSummary, summary_array};

type PhpResult<T> = Result<T, PhpException>;

/// How often a wait looks for a signal that PHP has to handle.
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// The longest single wait of `receive()`.
const MAX_WAIT: f64 = 3600.0;

/// Whether the engine has work to do between two calls: a signal caught by a pcntl
/// handler with `pcntl_async_signals(true)` (a framework worker's SIGTERM, a timeout's
/// SIGALRM) sets `EG(vm_interrupt)`, and the handler runs once this call returns.
fn interrupt_pending() -> bool {
    let eg = ExecutorGlobals::get();
    // SAFETY: `vm_interrupt` is a bool (PHP 8.1) or a `zend_atomic_bool` holding one
    // (8.2 and later): either way one byte, written by signal handlers, read atomically.
    unsafe { (*std::ptr::addr_of!(eg.vm_interrupt).cast::<AtomicBool>()).load(Ordering::Relaxed) }
}

/// A running pool whose messages the caller takes one at a time.
#[php_class]
#[php(name = "DelayQueueConsumer")]
#[php(flags = ext_php_rs::flags::ClassFlags::Final)]
#[derive(Debug)]
pub struct PhpConsumer {
    consumer: SharedConsumer,
}

impl PhpConsumer {
    pub(crate) fn new(consumer: delayq::Consumer) -> Self {
        Self {
            consumer: Rc::new(RefCell::new(Some(consumer))),
        }
    }
}

#[php_impl]
impl PhpConsumer {
    /// The next due message, waiting at most `$timeout` seconds; null when none came,
    /// when the consumer is stopping (see isStopped()), or early when a signal
    /// arrived for one of PHP's handlers (they run as this returns). Throws what the
    /// pool's claims failed with when it could reach no message for that reason.
    #[php(defaults(timeout = 1.0))]
    pub fn receive(&self, timeout: Seconds) -> PhpResult<Option<PhpMessage>> {
        if timeout.0.is_nan() || timeout.0 < 0.0 {
            return Err(errors::invalid(format!(
                "DelayQueueConsumer::receive(): timeout must be 0 or more seconds, got {}",
                timeout.0
            )));
        }
        let shared = self.consumer.borrow();
        let Some(c) = shared.as_ref() else {
            return Err(errors::invalid("this DelayQueueConsumer was stopped"));
        };
        let deadline = Instant::now() + Duration::from_secs_f64(timeout.0.min(MAX_WAIT));
        loop {
            if interrupt_pending() {
                break;
            }
            let wait = deadline.saturating_duration_since(Instant::now()).min(SIGNAL_CHECK);
            match c.recv_timeout(wait) {
                delayq::Received::Message(d) => {
                    match d.decode_payload_with(convert::ZvalSeed).map_err(|e| e.to_string()) {
                        Ok(payload) => {
                            let mut message = PhpMessage::new(&d, payload, None);
                            message.pulled = Some(Pulled {
                                consumer: Rc::clone(&self.consumer),
                                delivery: RefCell::new(Some(d)),
                            });
                            crate::logs::flush();
                            return Ok(Some(message));
                        }
                        Err(e) => {
                            c.unreadable(d, &format!("stored payload cannot be decoded: {e}"));
                        }
                    }
                }
                delayq::Received::Stopped => break,
                delayq::Received::Idle if Instant::now() >= deadline => {
                    crate::logs::flush();
                    return match c.claim_failure() {
                        Some(e) => Err(errors::to_php(&e)),
                        None => Ok(None),
                    };
                }
                delayq::Received::Idle => {}
            }
        }
        crate::logs::flush();
        Ok(None)
    }

    /// Seconds until a message of its queues may next be taken as far as the pool
    /// knows (the next due one, or a lease that ends sooner), 0.0 when one is due now,
    /// null when none is known: a caller about to sleep
    /// before it asks again may wait for that message instead.
    pub fn next_due_in(&self) -> Option<f64> {
        let shared = self.consumer.borrow();
        shared.as_ref()?.next_due_in().map(|d| d.as_secs_f64())
    }

    /// Whether the pool stopped (stop(), or DelayQueue::restartWorkers()): receive()
    /// returns null from now on.
    pub fn is_stopped(&self) -> bool {
        self.consumer.borrow().as_ref().is_none_or(|c| c.stopper().is_stopped())
    }

    /// Stop: waiting deliveries go back to the queue at once, every decision made is
    /// written, and the pool's threads end. Messages still undecided can no longer be
    /// decided; they run again after their lease. Returns the pool's counts.
    ///
    /// @return array{handled: int, acked: int, failed: int, retried: int, dead: int, lease_lost: int, gone: int,
    ///   released: int, unwritten: int, cancelled: int, stopped_by: ?string}
    pub fn stop(&self) -> PhpResult<ZBox<ZendHashTable>> {
        let taken = self.consumer.borrow_mut().take();
        let ended = taken
            .as_ref()
            .and_then(|c| delayq::host::ended_by(&c.stopper(), Some(delayq::host::StopReason::Stop)));
        let core = taken.map(delayq::Consumer::finish).unwrap_or_default();
        crate::logs::flush();
        summary_array(&RunSummary { core, ended }, None)
    }
}
