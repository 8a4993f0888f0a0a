//! The consumer pool: native threads that claim, extend, acknowledge and reap, and a
//! hand-off so that handlers can run on the caller's own thread (what PHP and Python
//! need) or on the pool's threads (pure Rust).
//!
//! Threads of one running pool, each with its own connection:
//! - `threads` fetchers: claim due messages in batches into a bounded prefetch buffer,
//!   then sleep on a client-side timer until the next due time (no polling);
//! - one subscriber: listens for producers' wake-ups on the queue's channel;
//! - one completer: writes acks, nacks and releases in batches;
//! - one heartbeat: extends the leases of everything claimed and not yet completed.
//!
//! A worker with lower-priority queues runs one such pool per queue and hands the
//! caller a delivery of a lower queue only when no higher one has a delivery waiting;
//! a lower pool claims nothing while a higher one holds unstarted deliveries, is
//! claiming or knows of due messages (see `Pool::yields_to_higher`).
//!
//! Files, one role each: `complete`, `consumer`, `control`, `delivery`, `fetch`, `heartbeat`, `launch`, `options`, `pool`, `registration`, `release`, `run`, `summary`, `wake`, `wakeups`.

mod complete;
mod consumer;
mod control;
mod delivery;
mod fetch;
mod heartbeat;
mod launch;
mod options;
mod pool;
mod registration;
mod release;
mod run;
mod summary;
mod wake;
mod wakeups;

use std::time::{Duration, Instant};

use pool::Pool;

use crate::{Queue, scripts};
use redis::Value;

use crate::conn::ConnSlot;
use crate::error::{Category, Error, Result};
use crate::scripts::Call;

pub use consumer::Consumer;
pub use control::Stopper;
pub(crate) use delivery::fail_lease;
pub use delivery::{CancelFlag, Delivery, Fate, Receipt, Received, Retry};
pub use launch::{MAX_WORKER_QUEUES, Worker};
pub use options::{MAX_TRACE_BYTES, WorkerOptions};
pub use release::Releaser;
pub use summary::Summary;

fn pause_unless_stopped(pool: &Pool, pause: Duration) {
    let w = &pool.control.wake;
    w.wait(Some(Instant::now() + pause), w.epoch(), &pool.control.stop);
}

/// A fault that retrying at once cannot mend: the user may not run the scripts, a
/// key of the queue holds a stray type, or the server refuses the URL (a database it
/// lacks). The scripts stop before their first write on it; an operator may mend it.
fn is_setup_fault(e: &Error) -> bool {
    e.category() == Category::Auth || matches!(e, Error::WrongType(_) | Error::InvalidUrl { .. } | Error::Format { .. })
}

/// Send one script call over `slot` (no retry) and decode its reply.
fn run_call<C: Call>(slot: &mut ConnSlot, queue: &Queue, part: usize, call: &C) -> Result<C::Reply> {
    let script = call.script();
    let v = slot.run_once(&queue.inner.endpoint, script.name, |con| {
        let mut inv = queue.invocation(part, script);
        call.add_to(&mut inv);
        inv.invoke::<Value>(con)
    })?;
    scripts::read(script, v)
}
