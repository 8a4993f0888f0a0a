//! Stopping: the flags shared by a `Worker` and its running pool, the rule that ends a
//! worker's pools together, and `Stopper`, which any thread may hold.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::wake::{Slots, Wake};

/// Shared by a `Worker` and the pool it runs, so `stop` works before and during `run`.
pub(super) struct Control {
    pub(super) stop: AtomicBool,
    /// The stop came from `Queue::restart_workers` (see `Stopper::restart_requested`).
    pub(super) restart: AtomicBool,
    /// The stop came from `stop_when_empty` (see `Stopper::found_empty`).
    pub(super) empty: AtomicBool,
    pub(super) wake: Wake,
    pub(super) slots: Slots,
    /// Each partition's restart generation when this worker started (see restart.lua):
    /// set once, by the first start, and inherited by processes forked after it.
    pub(super) restart_baseline: Vec<std::sync::OnceLock<u64>>,
    /// `fork::generation() + 1` of the process whose threads run the pool, 0 while
    /// none runs: a process forked meanwhile (by a handler) tells itself apart by it.
    pub(super) pool_process: AtomicU64,
}

impl Control {
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if self.in_forked_child() {
            // Nobody here waits on these, and a lock that a pool thread held at the
            // fork stays held in this process for ever.
            return;
        }
        self.wake.interrupt();
        let _free = self.slots.free.lock();
        self.slots.cv.notify_all();
    }

    /// Whether this process was forked while the pool ran: the pool's threads stayed
    /// in the parent, and what this process holds of it is a copy frozen at the fork.
    pub(super) fn in_forked_child(&self) -> bool {
        let owner = self.pool_process.load(Ordering::Acquire);
        owner != 0 && owner != crate::fork::generation() + 1
    }

    pub(super) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

/// Whether the pools of one worker (its own queue's and its lower queues') are done.
/// A queue found empty (`stop_when_empty`) ends only its own pool; any other stop (a
/// call, a signal, a restart request) ends them all.
pub(super) fn group_stopped(controls: &[Arc<Control>]) -> bool {
    let (mut all, mut ending) = (true, false);
    for c in controls {
        if c.stopped() {
            ending |= !c.empty.load(Ordering::Acquire);
        } else {
            all = false;
        }
    }
    if ending && !all {
        controls.iter().for_each(|c| c.stop());
        return true;
    }
    all
}

/// Stops a running (or about to run) pool from any thread or a signal handler's
/// thread; the pool finishes the running handlers and returns the prefetched rest.
#[derive(Clone)]
pub struct Stopper(pub(super) Arc<[Arc<Control>]>);

impl std::fmt::Debug for Stopper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Stopper").field(&self.is_stopped()).finish()
    }
}

impl Stopper {
    /// Stop gracefully: running handlers finish and are acknowledged, prefetched
    /// deliveries go back to the queue at once. Returns at once.
    pub fn stop(&self) {
        self.0.iter().for_each(|c| c.stop());
    }

    /// Whether a stop was asked for.
    pub fn is_stopped(&self) -> bool {
        group_stopped(&self.0)
    }

    /// Whether the pool stopped because `Queue::restart_workers` asked every pool
    /// started before it to stop (the caller's process should exit and be started
    /// anew by its process manager); with lower queues, a request on any of them.
    pub fn restart_requested(&self) -> bool {
        self.0.iter().any(|c| c.restart.load(Ordering::Acquire))
    }

    /// Whether the pool stopped because, with `stop_when_empty`, no message was due
    /// and none ran (with lower queues: on every one of them).
    pub fn found_empty(&self) -> bool {
        self.0.iter().all(|c| c.empty.load(Ordering::Acquire))
    }
}
