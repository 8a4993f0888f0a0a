//! `Worker`: the handle users make. Checks the options, and starts a pool's threads
//! (fetchers, completer, heartbeat, wake-up subscriber, Sentinel watch) per queue.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::queue::Queue;

use super::complete::complete_loop;
use super::control::Control;
use super::fetch::{check_access, fetch_loop};
use super::heartbeat::heartbeat_loop;
use super::pool::{HeldMap, Pool};
use super::registration::{Lateness, Registration};
use super::summary::Counters;
use super::wake::{Slots, Wake};
use super::wakeups::{subscribe_loop, watch_sentinels};
use super::{Consumer, Delivery, Stopper, WorkerOptions};

/// A consumer pool on one queue.
pub struct Worker {
    pub(super) queue: Queue,
    pub(super) opts: WorkerOptions,
    pub(super) control: Arc<Control>,
    pub(super) running: Arc<AtomicBool>,
    /// What a restart request compares with: a worker made before it runs old code.
    /// (PHP makes the worker before forking its processes, so a process forked later
    /// by an old supervisor is old too; the monotonic clock is shared across fork.)

    /// Queues consumed only when the ones before them have nothing for the handlers,
    /// in priority order; each runs its own pool (never nested further).
    pub(super) lower: Vec<Worker>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("queue", &self.queue)
            .field("lower_queues", &self.lower.iter().map(|w| &w.queue).collect::<Vec<_>>())
            .field("opts", &self.opts)
            .finish()
    }
}

/// Most queues one worker consumes (its own and its lower queues).
pub const MAX_WORKER_QUEUES: usize = 16;

impl Worker {
    /// A pool for `queue`. Validates the options; starts no thread.
    pub fn new(queue: Queue, opts: WorkerOptions) -> Result<Self> {
        opts.validate()?;
        let partitions = queue.partitions();
        Ok(Self {
            queue,
            opts,
            control: Arc::new(Control {
                stop: AtomicBool::new(false),
                restart: AtomicBool::new(false),
                empty: AtomicBool::new(false),
                wake: Wake::new(partitions),
                slots: Slots {
                    free: Mutex::new(0),
                    cv: Condvar::new(),
                },
                restart_baseline: (0..partitions).map(|_| std::sync::OnceLock::new()).collect(),
                pool_process: AtomicU64::new(0),
            }),
            running: Arc::new(AtomicBool::new(false)),
            lower: Vec::new(),
        })
    }

    /// A pool for `queue` first and, in this order, the `lower` queues: a handler gets
    /// a message of a lower queue only when no queue before it has one due (Laravel's
    /// `--queue=high,default`, strict priority). Every queue keeps its own leases,
    /// retries, pause, rate limit and registration; the options apply to each.
    pub fn with_lower_queues(queue: Queue, lower: Vec<Queue>, opts: WorkerOptions) -> Result<Self> {
        if lower.len() >= MAX_WORKER_QUEUES {
            return Err(Error::invalid(
                "lower_queues",
                format!(
                    "a worker consumes at most {MAX_WORKER_QUEUES} queues, got {}",
                    lower.len() + 1
                ),
            ));
        }
        let same = |a: &Queue, b: &Queue| a.url() == b.url() && a.inner.parts[0].all[0] == b.inner.parts[0].all[0];
        for (i, q) in lower.iter().enumerate() {
            if same(q, &queue) || lower[..i].iter().any(|earlier| same(q, earlier)) {
                return Err(Error::invalid(
                    "lower_queues",
                    format!("queue {:?} on {} is listed twice", q.name(), q.url()),
                ));
            }
        }
        let mut worker = Self::new(queue, opts)?;
        worker.lower = lower
            .into_iter()
            .map(|q| Self::new(q, worker.opts.clone()))
            .collect::<Result<_>>()?;
        Ok(worker)
    }

    /// The options it was made with.
    pub fn options(&self) -> &WorkerOptions {
        &self.opts
    }

    /// Its own queue (the first in priority).
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// Every queue it consumes, highest priority first.
    pub fn queues(&self) -> impl Iterator<Item = &Queue> {
        self.members().map(|w| &w.queue)
    }

    pub(super) fn members(&self) -> impl Iterator<Item = &Worker> {
        std::iter::once(self).chain(&self.lower)
    }

    /// Record which restart requests (`Queue::restart_workers`) came before now, as a
    /// start of `run` does: a supervisor calls it before it forks its processes, so
    /// that a process forked later stops for a request made after this call. Fails
    /// as a start would on an auth or permission error, or a stray key.
    pub fn mark_start(&self) -> Result<()> {
        for w in self.members() {
            check_access(&w.queue, &w.opts, &w.control)?;
        }
        Ok(())
    }

    /// A handle that stops this worker's current or next run.
    pub fn stopper(&self) -> Stopper {
        Stopper(self.members().map(|w| Arc::clone(&w.control)).collect())
    }

    /// Ask the pool to stop; `run` / `finish` return once everything is written.
    pub fn stop(&self) {
        self.members().for_each(|w| w.control.stop());
    }

    /// Whether a pool of this worker is running now (threads exist).
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// Start the pool's threads and return the hand-off through which the caller's
    /// thread receives deliveries and reports their outcome, one at a time.
    pub fn start(&self) -> Result<Consumer> {
        self.start_with(1)
    }

    /// Like `start`, for a caller that works on up to `handlers` deliveries at once
    /// (threads or async tasks).
    pub fn start_with(&self, handlers: usize) -> Result<Consumer> {
        if handlers == 0 {
            return Err(Error::invalid("handlers", "must be at least 1"));
        }
        if self.running.swap(true, Ordering::AcqRel) {
            return Err(Error::State("this worker is already running".into()));
        }
        let prepared: Vec<_> = self
            .members()
            .enumerate()
            .map(|(member, w)| w.prepare(handlers, member))
            .collect();
        let group: Vec<Weak<Pool>> = prepared.iter().map(|(pool, _, _)| Arc::downgrade(pool)).collect();
        for (pool, _, _) in &prepared {
            let _ = pool.group.set(group.clone());
        }
        let mut consumers = Vec::with_capacity(prepared.len());
        for (w, (pool, tx, rx)) in self.members().zip(prepared) {
            match w.spawn_pool(pool, tx, rx) {
                Ok(c) => consumers.push(c),
                Err(e) => {
                    consumers.iter().for_each(|c: &Consumer| c.pool.control.stop());
                    for c in consumers {
                        let _ = c.finish();
                    }
                    self.running.store(false, Ordering::Release);
                    return Err(e);
                }
            }
        }
        let mut members = consumers.into_iter();
        let mut top = members
            .next()
            .ok_or_else(|| Error::State("a worker without a queue".into()))?;
        top.lower = members.collect();
        Ok(top)
    }

    /// The pool of this worker's own queue, the `member`-th of its group; no thread
    /// yet.
    pub(super) fn prepare(&self, handlers: usize, member: usize) -> (Arc<Pool>, Sender<Delivery>, Receiver<Delivery>) {
        self.running.store(true, Ordering::Release);
        // Also registers the fork counter, before a handler can fork.
        let process = crate::fork::generation() + 1;
        self.control.pool_process.store(process, Ordering::Release);
        *self.control.slots.free.lock() = self.opts.prefetch_limit();
        // Look at every partition at once, whatever an earlier run left behind.
        self.control.wake.kick();
        let (deliver_tx, deliver_rx) = crossbeam_channel::unbounded();
        let pool = Arc::new(Pool {
            queue: self.queue.clone(),
            queue_name: Arc::from(self.queue.name()),
            opts: self.opts.clone(),
            control: Arc::clone(&self.control),
            counters: Counters::default(),
            outstanding: Mutex::new(HeldMap::default()),
            handlers,
            stalled: AtomicBool::new(false),
            buffered: deliver_rx.clone(),
            handler_us: AtomicU64::new(0),
            lateness: Mutex::new((Lateness::default(), Lateness::default())),
            registration: Registration::new(&self.opts),
            paused: AtomicBool::new(false),
            repeat_checks: Mutex::new(vec![Instant::now(); self.queue.partitions()]),
            rate_limited: (0..self.queue.partitions()).map(|_| AtomicBool::new(false)).collect(),
            quarantine_due: (0..self.queue.partitions()).map(|_| AtomicBool::new(false)).collect(),
            reserved: Mutex::new(0),
            settled: Condvar::new(),
            unwritten: Mutex::default(),
            claiming: AtomicUsize::new(0),
            claiming_alone: AtomicBool::new(false),
            member,
            group: OnceLock::new(),
            overdue: AtomicUsize::new(0),
            claim_failures: (0..self.queue.partitions()).map(|_| Mutex::new(None)).collect(),
            failing_parts: AtomicUsize::new(0),
            minutes: crate::metrics::Tally::new(self.queue.partitions()),
        });
        (pool, deliver_tx, deliver_rx)
    }

    /// Start the threads of a prepared pool.
    pub(super) fn spawn_pool(
        &self,
        pool: Arc<Pool>,
        deliver_tx: Sender<Delivery>,
        deliver_rx: Receiver<Delivery>,
    ) -> Result<Consumer> {
        let (outcome_tx, outcome_rx) = crossbeam_channel::unbounded();
        let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(0);
        let mut fetchers = Vec::new();
        let mut others = Vec::new();
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            crate::threads::spawn(name, f).map_err(|e| Error::State(format!("cannot start a pool thread: {e}")))
        };
        check_access(&pool.queue, &pool.opts, &pool.control)?;
        let result = (|| -> Result<()> {
            for index in 0..self.opts.threads {
                let (pool, tx, otx) = (Arc::clone(&pool), deliver_tx.clone(), outcome_tx.clone());
                fetchers.push(spawn(
                    format!("delayq-fetch-{index}"),
                    Box::new(move || fetch_loop(&pool, index, &tx, &otx)),
                )?);
            }
            let p = Arc::clone(&pool);
            others.push(spawn(
                "delayq-complete".into(),
                Box::new(move || complete_loop(&p, &outcome_rx)),
            )?);
            let p = Arc::clone(&pool);
            others.push(spawn(
                "delayq-heartbeat".into(),
                Box::new(move || heartbeat_loop(&p, &done_rx)),
            )?);
            let p = Arc::clone(&pool);
            others.push(spawn("delayq-wake".into(), Box::new(move || subscribe_loop(&p)))?);
            if pool.queue.inner.endpoint.sentinel_service().is_some() {
                let p = Arc::clone(&pool);
                others.push(spawn("delayq-sentinel".into(), Box::new(move || watch_sentinels(&p)))?);
            }
            Ok(())
        })();
        let consumer = Consumer {
            pool,
            deliveries: deliver_rx,
            outcomes: Some(outcome_tx),
            fetchers,
            others,
            done: Some(done_tx),
            running: Arc::clone(&self.running),
            finished: false,
            lower: Vec::new(),
        };
        drop(deliver_tx);
        match result {
            Ok(()) => Ok(consumer),
            Err(e) => {
                consumer.finish();
                Err(e)
            }
        }
    }
}
