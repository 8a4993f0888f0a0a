//! `delayq.Worker` glue (mirrors `delayq::Worker` / `delayq::Consumer`): the handler
//! runs on the calling thread with the GIL; Redis I/O runs on the pool's threads, and
//! every wait releases the GIL.

use std::sync::Arc;
use std::time::Duration;

use delayq::host::{Called, Outcome, Publisher, Recycle, StopReason, WorkerSettings};
use pyo3::exceptions::{PyBaseException, PyException, PySystemExit};
use pyo3::prelude::*;
use pyo3::sync::MutexExt;
use pyo3::types::{PyDict, PyTuple};

use crate::convert::{self, payload_to_py};
use crate::errors::{self, OrRaise};
use crate::message::{PyDelivery, PyMessage, message};
use crate::queue::PyQueue;
use crate::slot::PySlot;

/// The error of a delivery whose handler raised SystemExit (`sys.exit()`).
fn exit_error(py: Python<'_>, e: &PyErr) -> String {
    format!("the handler raised {}, which stopped the worker", describe(py, e))
}

/// A SystemExit that a second stop signal raised (see `delayq._urgent_signal`), not the
/// handler's own.
fn is_urgent_stop(py: Python<'_>, e: &PyErr) -> bool {
    e.value(py).hasattr("_delayq_urgent").unwrap_or(false)
}

/// An alert (`on_dead`, `on_failure`), not part of the message's handling: what it
/// raises is logged and the pool goes on.
fn alert<'py>(
    py: Python<'py>,
    f: &Bound<'py, PyAny>,
    name: &str,
    args: impl pyo3::call::PyCallArgs<'py>,
    msg: &Bound<'py, PyMessage>,
) {
    if let Err(e) = f.call1(args) {
        log::warn!("delayq[{}]: {name} raised {}", msg.get().queue, describe(py, &e));
    }
}

/// The traceback as Python prints it, chained causes included.
fn traceback_text(py: Python<'_>, err: &PyErr) -> String {
    py.import("traceback")
        .and_then(|tb| tb.call_method1("format_exception", (err.get_type(py), err.value(py), err.traceback(py))))
        .and_then(|lines| lines.extract::<Vec<String>>())
        .map(|lines| lines.concat())
        .unwrap_or_default()
}

fn describe(py: Python<'_>, err: &PyErr) -> String {
    let name = err
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "Exception".into());
    format!("{name}: {}", err.value(py))
}

#[pyclass(name = "_Worker", module = "delayq._delayq", frozen)]
pub(crate) struct PyWorker {
    worker: delayq::Worker,
    /// Exception classes that go to the dead-letter set at once (a tuple, as
    /// `isinstance` takes it).
    no_retry: Py<PyTuple>,
    /// Why the run was stopped, the first reason given; shared with the asyncio
    /// runner's consumer, whose limits give theirs here too.
    stopped_by: Arc<std::sync::Mutex<Option<StopReason>>>,
    /// Its options, of which the recycle limits of each run are read here.
    settings: WorkerSettings,
}

impl PyWorker {
    fn recycle(&self) -> Recycle {
        self.settings.recycle()
    }
}

/// The process's resident memory, what `max_memory_mb` limits in Python.
fn resident_bytes() -> i64 {
    // statm's second field is the resident set, in pages.
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|n| n.parse::<i64>().ok()))
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    pages.saturating_mul(unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as i64)
}

fn summary<'py>(py: Python<'py>, s: &delayq::Summary, stopped_by: Option<StopReason>) -> PyResult<Bound<'py, PyDict>> {
    crate::records::dict(py, delayq::records::summary(s, stopped_by, None))
}

/// A `stopped_by` text from Python code, as the core's reason.
fn reason(py: Python<'_>, text: &str) -> PyResult<StopReason> {
    StopReason::parse(text).ok_or_else(|| errors::invalid(py, format!("no stop reason is named {text:?}")))
}

impl PyWorker {
    fn take_reason(&self, py: Python<'_>) -> Option<StopReason> {
        self.stopped_by.lock_py_attached(py).ok().and_then(|mut r| r.take())
    }

    fn set_reason(&self, py: Python<'_>, why: StopReason) {
        if let Ok(mut r) = self.stopped_by.lock_py_attached(py) {
            r.get_or_insert(why);
        }
    }
}

#[pymethods]
impl PyWorker {
    #[new]
    #[pyo3(signature = (queue, *, threads, batch, prefetch, lease, max_attempts, backoff_base, backoff_max,
        timeout, idle_check, stop_when_empty, lower_queues, max_trace_bytes = 8192, max_payload_bytes = 1_048_576, no_retry = None,
        max_jobs = None, max_time = None, max_memory_mb = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        queue: &PyQueue,
        #[pyo3(from_py_with = convert::threads_arg)] threads: usize,
        #[pyo3(from_py_with = convert::batch_arg)] batch: usize,
        #[pyo3(from_py_with = convert::prefetch_arg)] prefetch: usize,
        #[pyo3(from_py_with = convert::lease_arg)] lease: f64,
        #[pyo3(from_py_with = convert::worker_max_attempts_arg)] max_attempts: u32,
        #[pyo3(from_py_with = convert::backoff_base_arg)] backoff_base: f64,
        #[pyo3(from_py_with = convert::backoff_max_arg)] backoff_max: f64,
        #[pyo3(from_py_with = convert::timeout_arg)] timeout: Option<f64>,
        #[pyo3(from_py_with = convert::idle_check_arg)] idle_check: f64,
        #[pyo3(from_py_with = convert::stop_when_empty_arg)] stop_when_empty: bool,
        lower_queues: Vec<PyRef<'_, PyQueue>>,
        max_trace_bytes: i64,
        max_payload_bytes: i64,
        no_retry: Option<Bound<'_, PyTuple>>,
        #[pyo3(from_py_with = convert::max_jobs_arg)] max_jobs: Option<i64>,
        #[pyo3(from_py_with = convert::max_time_arg)] max_time: Option<f64>,
        #[pyo3(from_py_with = convert::max_memory_mb_arg)] max_memory_mb: Option<i64>,
    ) -> PyResult<Self> {
        use delayq::options::Value;
        let mut values = vec![
            ("threads", Value::Count(threads as i64)),
            ("batch", Value::Count(batch as i64)),
            ("prefetch", Value::Count(prefetch as i64)),
            ("lease", Value::Seconds(lease)),
            ("max_attempts", Value::Count(i64::from(max_attempts))),
            ("backoff_base", Value::Seconds(backoff_base)),
            ("backoff_max", Value::Seconds(backoff_max)),
            ("idle_check", Value::Seconds(idle_check)),
            ("stop_when_empty", Value::Flag(stop_when_empty)),
            ("max_trace_bytes", Value::Count(max_trace_bytes)),
            ("max_payload_bytes", Value::Count(max_payload_bytes)),
        ];
        let optional = [
            ("timeout", timeout.map(Value::Seconds)),
            ("max_jobs", max_jobs.map(Value::Count)),
            ("max_time", max_time.map(Value::Seconds)),
            ("max_memory_mb", max_memory_mb.map(Value::Count)),
        ];
        values.extend(optional.into_iter().filter_map(|(name, v)| v.map(|v| (name, v))));
        let settings = WorkerSettings::from_values(values).or_raise(py)?;
        Ok(Self {
            worker: delayq::Worker::with_lower_queues(
                queue.queue.clone(),
                lower_queues.iter().map(|q| q.queue.clone()).collect(),
                settings.pool.clone(),
            )
            .or_raise(py)?,
            stopped_by: Arc::new(std::sync::Mutex::new(None)),
            no_retry: no_retry.unwrap_or_else(|| PyTuple::empty(py)).unbind(),
            settings,
        })
    }

    /// Run a synchronous handler until stopped. `slot`: a supervised process's slot,
    /// told of each handler call and the delivery it holds.
    #[pyo3(signature = (handler, on_dead = None, on_failure = None, slot = None))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        handler: Bound<'py, PyAny>,
        on_dead: Option<Bound<'py, PyAny>>,
        on_failure: Option<Bound<'py, PyAny>>,
        slot: Option<PyRef<'py, PySlot>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        crate::logs::sync_level(py);
        let consumer = py.detach(|| self.worker.start()).or_raise(py)?;
        let slot = slot.map(|s| s.slot.clone());
        let publisher = slot
            .as_ref()
            .map(|s| s.publish_while(consumer.releaser(), self.worker.options().timeout));
        let mut side = PyHandler {
            py,
            worker: self,
            handler: &handler,
            on_dead: on_dead.as_ref(),
            on_failure: on_failure.as_ref(),
        };
        let served = delayq::host::serve(&consumer, &mut side, slot.as_ref(), self.recycle());
        if consumer.in_forked_child() {
            // The inherited pool is not this process's to finish.
            return Err(served
                .raise
                .unwrap_or_else(|| errors::new_err(py, errors::Kind::Root, "a forked child did not end".into())));
        }
        // Now in `served`; the next run starts without it.
        let _ = self.take_reason(py);
        let s = py.detach(|| {
            let s = consumer.finish();
            drop(publisher);
            s
        });
        crate::logs::flush(py);
        let summary = summary(py, &s, served.stopped_by)?;
        match served.raise {
            // A signal handler's exception, an exit, a teardown: raised with the counts.
            Some(e) => Err(with_summary(py, e, summary)),
            None => Ok(summary),
        }
    }

    /// Start the pool for a caller-driven loop (the asyncio runner) that runs up to
    /// `handlers` deliveries at once; `slot` as for `run`.
    #[pyo3(signature = (handlers, slot = None))]
    fn start(&self, py: Python<'_>, handlers: usize, slot: Option<PyRef<'_, PySlot>>) -> PyResult<PyConsumer> {
        crate::logs::sync_level(py);
        let consumer = py.detach(|| self.worker.start_with(handlers)).or_raise(py)?;
        let publisher = slot.map(|s| s.slot.publish_while(consumer.releaser(), self.worker.options().timeout));
        Ok(PyConsumer::new(
            consumer,
            publisher,
            self.recycle(),
            Arc::clone(&self.stopped_by),
            self.no_retry.clone_ref(py),
        ))
    }

    /// Why the pool was stopped ("stop", "signal"), once; for the asyncio runner.
    fn take_stop_reason(&self, py: Python<'_>) -> Option<&'static str> {
        self.take_reason(py).map(StopReason::as_str)
    }

    /// Stop gracefully; `reason` ends up in the summary's "stopped_by".
    #[pyo3(signature = (reason = "stop"))]
    fn stop(&self, py: Python<'_>, reason: &str) -> PyResult<()> {
        let why = self::reason(py, reason)?;
        self.set_reason(py, why);
        self.worker.stop();
        Ok(())
    }
}

/// What a handler's call came to, given what it raised (None: it returned), as the
/// core's run policy takes it, the same on the sync and the asyncio path:
/// - `SystemExit` (`sys.exit()`) ends the process: as PHP's exit(), the pool stops, and
///   the run raises it;
/// - a second stop signal's exception, `KeyboardInterrupt`, `asyncio.CancelledError`
///   (any `BaseException` that is not an `Exception`): the process or the task is torn
///   down under the handler, the message goes back uncounted, and the run raises it;
/// - any `Exception` fails the message (buried at once when of a `no_retry` class),
///   and goes to `on_failure`. One that carries `_delayq_error` (the asyncio timeout)
///   is kept as that text, without a traceback.
fn classify(py: Python<'_>, raised: Option<PyErr>, no_retry: &Bound<'_, PyTuple>) -> Called<PyErr, PyErr> {
    let Some(e) = raised else {
        return Called {
            outcome: Outcome::Returned,
            thrown: None,
            raise: None,
        };
    };
    if e.is_instance_of::<PySystemExit>(py) && !is_urgent_stop(py, &e) {
        return Called {
            outcome: Outcome::Exited(exit_error(py, &e)),
            thrown: None,
            raise: Some(e),
        };
    }
    if !e.is_instance_of::<PyException>(py) {
        return Called {
            outcome: Outcome::Abandoned,
            thrown: None,
            raise: Some(e),
        };
    }
    let own = e
        .value(py)
        .getattr("_delayq_error")
        .ok()
        .and_then(|t| t.extract::<String>().ok());
    let outcome = match own {
        Some(error) => Outcome::Raised {
            error,
            trace: String::new(),
            no_retry: false,
        },
        None => Outcome::Raised {
            error: describe(py, &e),
            trace: traceback_text(py, &e),
            no_retry: e.is_instance(py, no_retry.as_any()),
        },
    };
    Called {
        outcome,
        thrown: Some(e),
        raise: None,
    }
}

/// The Python side of the core's receive loop (`delayq::host::serve`), holding the GIL
/// except while it waits.
struct PyHandler<'py, 'a> {
    py: Python<'py>,
    worker: &'a PyWorker,
    handler: &'a Bound<'py, PyAny>,
    on_dead: Option<&'a Bound<'py, PyAny>>,
    on_failure: Option<&'a Bound<'py, PyAny>>,
}

/// A handler's arguments, kept for the hooks.
struct PyCall<'py> {
    payload: Bound<'py, PyAny>,
    message: Bound<'py, PyMessage>,
}

impl<'py> delayq::host::Handler for PyHandler<'py, '_> {
    type Call = PyCall<'py>;
    type Return = PyResult<Bound<'py, PyAny>>;
    type Thrown = PyErr;
    type Raise = PyErr;

    /// Runs Python's signal handlers (delayq's own call stop(), which gives its reason).
    fn between(&mut self, _ending: bool) -> Result<Option<StopReason>, PyErr> {
        self.py.check_signals().map(|()| None)
    }

    fn asked(&mut self) -> Option<StopReason> {
        self.worker.stopped_by.lock_py_attached(self.py).ok().and_then(|r| *r)
    }

    fn wait<T: Send>(&mut self, wait: impl FnOnce() -> T + Send) -> T {
        self.py.detach(wait)
    }

    fn flush_logs(&mut self) {
        crate::logs::flush(self.py);
    }

    fn prepare(&mut self, delivery: &delayq::Delivery) -> Result<PyCall<'py>, String> {
        let py = self.py;
        let payload = payload_to_py(py, delivery).map_err(|e| describe(py, &e))?;
        let message = Bound::new(py, message(delivery)).map_err(|e| describe(py, &e))?;
        Ok(PyCall { payload, message })
    }

    fn call(&mut self, call: &PyCall<'py>) -> Self::Return {
        self.handler.call1((&call.payload, &call.message))
    }

    fn outcome(&mut self, returned: Self::Return) -> Called<PyErr, PyErr> {
        classify(self.py, returned.err(), self.worker.no_retry.bind(self.py))
    }

    fn decision(&mut self, call: &PyCall<'py>) -> Option<(delayq::Retry, String)> {
        call.message.get().take_decision(self.py)
    }

    fn leave_forked_child(&mut self, returned: Option<Self::Return>) -> PyErr {
        end_forked_child(self.py, returned.and_then(Result::err))
    }

    fn on_failure(&mut self, call: &PyCall<'py>, thrown: PyErr) {
        if let Some(f) = self.on_failure {
            // into_value attaches the traceback, as `raise` would have.
            let args = (&call.payload, &call.message, thrown.into_value(self.py));
            alert(self.py, f, "on_failure", args, &call.message);
        }
    }

    fn on_dead(&mut self, call: &PyCall<'py>, error: &str) {
        if let Some(f) = self.on_dead {
            alert(
                self.py,
                f,
                "on_dead",
                (&call.payload, &call.message, error),
                &call.message,
            );
        }
    }

    fn memory_bytes(&mut self) -> i64 {
        resident_bytes()
    }
}

/// A process that a handler forked (`os.fork()`) came back into the worker: ends it
/// with `delayq._end_forked_child`, which says why. Returns only if that could not be
/// called, with what it raised, after `os._exit(1)` failed too.
fn end_forked_child(py: Python<'_>, raised: Option<PyErr>) -> PyErr {
    let raised = raised.map(|e| e.into_value(py));
    let failed = match py
        .import("delayq")
        .and_then(|m| m.getattr("_end_forked_child"))
        .and_then(|f| f.call1((raised,)))
    {
        Ok(_) => errors::new_err(py, errors::Kind::Root, "a forked child did not end".into()),
        Err(e) => e,
    };
    let _ = py.import("os").and_then(|os| os.call_method1("_exit", (1,)));
    failed
}

/// A run ended by an exception (a second stop signal) still has counts: they go with
/// it, for the Python side to keep (`Worker._last_summary`).
fn with_summary<'py>(py: Python<'py>, e: PyErr, summary: Bound<'py, PyDict>) -> PyErr {
    // Only fails for an exception object without attributes, which Python's are not.
    let _ = e.value(py).setattr("_delayq_summary", summary);
    e
}

#[pyclass(name = "_Consumer", module = "delayq._delayq", frozen)]
pub(crate) struct PyConsumer {
    /// Shared, not locked for the length of a call: the asyncio runner waits in `recv`
    /// on an executor thread while its handlers acknowledge on the event loop's thread,
    /// and an ack that waited for the receive would hold up the message it frees (the
    /// next one of a serial key) for the receive's whole timeout. None once finished.
    consumer: std::sync::Mutex<Option<Arc<delayq::Consumer>>>,
    /// A call gives its share of the consumer back under `returns` and signals
    /// `returned`, for `finish`, which needs the consumer whole. A lock of its own:
    /// `consumer` is held while waiting for the GIL (`lock_py_attached`), and a share
    /// may be returned by a thread that holds the GIL.
    returns: std::sync::Mutex<()>,
    returned: std::sync::Condvar,
    /// A supervised process's counts, copied into its slot until `finish`.
    publisher: std::sync::Mutex<Option<Publisher>>,
    /// The run's own limits, and whether one of them ended it.
    recycle: std::sync::Mutex<(Recycle, bool)>,
    /// The worker's reason for the stop (see `PyWorker::stopped_by`).
    stopped_by: Arc<std::sync::Mutex<Option<StopReason>>>,
    /// The worker's `no_retry` classes.
    no_retry: Py<PyTuple>,
}

/// A call's share of the consumer, returned when the call ends.
struct Share<'a> {
    consumer: Option<Arc<delayq::Consumer>>,
    owner: &'a PyConsumer,
}

impl std::ops::Deref for Share<'_> {
    type Target = delayq::Consumer;

    fn deref(&self) -> &delayq::Consumer {
        // Some until dropped.
        self.consumer.as_deref().unwrap_or_else(|| unreachable!())
    }
}

impl Drop for Share<'_> {
    fn drop(&mut self) {
        let guard = self
            .owner
            .returns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.consumer = None;
        drop(guard);
        self.owner.returned.notify_all();
    }
}

impl PyConsumer {
    fn new(
        consumer: delayq::Consumer,
        publisher: Option<Publisher>,
        recycle: Recycle,
        stopped_by: Arc<std::sync::Mutex<Option<StopReason>>>,
        no_retry: Py<PyTuple>,
    ) -> Self {
        Self {
            consumer: std::sync::Mutex::new(Some(Arc::new(consumer))),
            returns: std::sync::Mutex::new(()),
            returned: std::sync::Condvar::new(),
            publisher: std::sync::Mutex::new(publisher),
            recycle: std::sync::Mutex::new((recycle, false)),
            stopped_by,
            no_retry,
        }
    }

    /// Stop the pool once, when `limit` (applied to the run's limits) says so; its
    /// reason counts unless the worker already had one (the first reason wins, as in
    /// `run`). Raises nothing: it runs in the handler's `finally`, after a finished
    /// run too.
    fn apply_limit(&self, py: Python<'_>, limit: impl FnOnce(&mut Recycle) -> Option<StopReason>) {
        let why = {
            let Ok(mut r) = self.recycle.lock_py_attached(py) else {
                return;
            };
            let (recycle, ended) = &mut *r;
            if *ended {
                return;
            }
            let why = limit(recycle);
            *ended = why.is_some();
            why
        };
        let Some(why) = why else { return };
        if let Ok(mut r) = self.stopped_by.lock_py_attached(py) {
            r.get_or_insert(why);
        }
        if let Ok(Some(c)) = self.current(py) {
            c.stop();
        }
    }

    fn current(&self, py: Python<'_>) -> PyResult<Option<Share<'_>>> {
        let guard = self
            .consumer
            .lock_py_attached(py)
            .map_err(|_| errors::new_err(py, errors::Kind::Root, "consumer lock poisoned".into()))?;
        Ok(guard.as_ref().map(|c| Share {
            consumer: Some(Arc::clone(c)),
            owner: self,
        }))
    }

    fn with<T>(&self, py: Python<'_>, f: impl FnOnce(&delayq::Consumer) -> T) -> PyResult<T> {
        let c = self
            .current(py)?
            .ok_or_else(|| errors::new_err(py, errors::Kind::Root, "this consumer is finished".into()))?;
        Ok(f(&c))
    }

    /// Takes the consumer out and waits until the calls still under way on other
    /// threads (a `recv` waiting out its timeout, at most 60 s) have given their shares
    /// back. None if it was finished already. Call without the GIL: those calls may
    /// need it to end.
    fn take_whole(&self) -> Option<delayq::Consumer> {
        let mut shared = self
            .consumer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()?;
        let mut guard = self.returns.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        loop {
            match Arc::try_unwrap(shared) {
                Ok(consumer) => return Some(consumer),
                Err(again) => {
                    shared = again;
                    guard = self
                        .returned
                        .wait(guard)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
            }
        }
    }

    fn take(py: Python<'_>, d: &PyDelivery) -> PyResult<delayq::Delivery> {
        d.delivery
            .lock_py_attached(py)
            .ok()
            .and_then(|mut d| d.take())
            .ok_or_else(|| errors::invalid(py, "this delivery was completed already"))
    }
}

#[pymethods]
impl PyConsumer {
    /// The next delivery within `timeout` seconds, or None (idle, or stopping: see
    /// `stopped`).
    fn recv(&self, py: Python<'_>, timeout: f64) -> PyResult<Option<PyDelivery>> {
        self.apply_limit(py, |r| r.before_next());
        let wait = Duration::from_secs_f64(timeout.clamp(0.0, 60.0));
        let Some(c) = self.current(py)? else { return Ok(None) };
        let received = py.detach(|| c.recv_timeout(wait));
        crate::logs::flush(py);
        let delayq::Received::Message(d) = received else {
            return Ok(None);
        };
        let payload = match payload_to_py(py, &d) {
            Ok(p) => p.unbind(),
            Err(e) => {
                let text = describe(py, &e);
                self.with(py, |c| {
                    c.unreadable(d, &text);
                })?;
                return Ok(None);
            }
        };
        let message = Py::new(py, message(&d))?;
        Ok(Some(PyDelivery {
            delivery: std::sync::Mutex::new(Some(d)),
            payload,
            message,
        }))
    }

    /// A handler call ended: counts it against `max_jobs` and `max_memory_mb`.
    fn after_job(&self, py: Python<'_>) {
        self.apply_limit(py, |r| r.after_job(resident_bytes));
    }

    /// Whether the pool is stopping (recv returns None from now on).
    #[getter]
    fn stopped(&self, py: Python<'_>) -> PyResult<bool> {
        self.with(py, |c| c.stopper().is_stopped())
    }

    /// Complete the delivery as its handler's call came to (`raised`: what it raised,
    /// None when it returned; see `classify`) and the message's own decision. Returns
    /// what follows, in the run policy's order (`host::after_settle`): the exception
    /// that ends the run now (no hook runs), else None; whether `on_failure` runs; the
    /// last error for `on_dead` when the message went to the dead letters, else None.
    #[pyo3(signature = (delivery, raised = None))]
    fn settle<'py>(
        &self,
        py: Python<'py>,
        delivery: &PyDelivery,
        raised: Option<Bound<'py, PyBaseException>>,
    ) -> PyResult<(Option<Bound<'py, PyBaseException>>, bool, Option<String>)> {
        let d = Self::take(py, delivery)?;
        let called = classify(
            py,
            raised.map(|e| PyErr::from_value(e.into_any())),
            self.no_retry.bind(py),
        );
        let decision = delivery.message.get().take_decision(py);
        let (fate, stop) = self.with(py, |c| delayq::host::settle(c, d, called.outcome, decision))?;
        if let (Some(why), Ok(mut r)) = (stop, self.stopped_by.lock_py_attached(py)) {
            r.get_or_insert(why);
        }
        Ok(match delayq::host::after_settle(fate, stop, called.thrown.is_some()) {
            delayq::host::AfterSettle::Stop(_) => (called.raise.map(|e| e.into_value(py).into_bound(py)), false, None),
            delayq::host::AfterSettle::Hooks { on_failure, on_dead } => (None, on_failure, on_dead),
        })
    }

    fn release(&self, py: Python<'_>, delivery: &PyDelivery) -> PyResult<()> {
        let d = Self::take(py, delivery)?;
        self.with(py, |c| c.release(d))
    }

    /// Whether the delivery's handler may start now, in this step: its lease lives by a
    /// clock read here; else it was given back unstarted (see `Consumer::begin`). False
    /// too for one completed already (given back at a stop).
    fn begin(&self, py: Python<'_>, delivery: &PyDelivery) -> PyResult<bool> {
        let c = self
            .current(py)?
            .ok_or_else(|| errors::new_err(py, errors::Kind::Root, "this consumer is finished".into()))?;
        let mut held = delivery
            .delivery
            .lock_py_attached(py)
            .map_err(|_| errors::invalid(py, "this delivery is in use on another thread"))?;
        let Some(d) = held.take() else { return Ok(false) };
        *held = c.begin(d);
        Ok(held.is_some())
    }

    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |c| c.stop())
    }

    /// Release prefetched deliveries, write every completion, join the threads.
    fn finish<'py>(&self, py: Python<'py>, stopped_by: Option<&str>) -> PyResult<Bound<'py, PyDict>> {
        let stopped_by = stopped_by.map(|t| reason(py, t)).transpose()?;
        let stopped_by = match self.current(py)? {
            Some(c) => delayq::host::ended_by(&c.stopper(), stopped_by),
            None => stopped_by,
        };
        let publisher = self.publisher.lock_py_attached(py).ok().and_then(|mut p| p.take());
        let s = py
            .detach(|| {
                let s = self.take_whole().map(delayq::Consumer::finish);
                drop(publisher);
                s
            })
            .unwrap_or_default();
        crate::logs::flush(py);
        summary(py, &s, stopped_by)
    }
}
