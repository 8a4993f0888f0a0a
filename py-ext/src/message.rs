//! What Python code gets of one delivery (mirrors `delayq::Delivery`): `Message`, the
//! handler's second argument, with the handler's own decision (retry_later(),
//! dead_letter()) and its cancel mark; and `_Delivery`, the delivery that
//! `_Consumer.recv` hands to the Python package, with its payload and `Message`.

use pyo3::prelude::*;
use pyo3::sync::MutexExt;

use crate::errors::{self, OrRaise};

/// One delivery, the handler's second argument.
#[pyclass(name = "Message", module = "delayq", frozen)]
pub(crate) struct PyMessage {
    /// The message id.
    #[pyo3(get)]
    id: String,
    /// This delivery's number, counting from 1.
    #[pyo3(get)]
    attempt: u32,
    /// Deliveries allowed before the message goes to the dead-letter set.
    #[pyo3(get)]
    max_attempts: u32,
    /// When this delivery was due: Unix time in seconds.
    #[pyo3(get)]
    due_at: f64,
    /// With `expire_after`: the latest it could start, Unix seconds; else None.
    #[pyo3(get)]
    expires_at: Option<f64>,
    /// With `serial_key`: the key, which no other running message holds meanwhile;
    /// else None.
    #[pyo3(get)]
    serial_key: Option<String>,
    /// With `group`: the group, whose limits it counts against; else None.
    #[pyo3(get)]
    group: Option<String>,
    /// The queue's name.
    #[pyo3(get)]
    pub(crate) queue: String,
    /// The partition it came from (0 unless the queue has `partitions`).
    #[pyo3(get)]
    partition: usize,
    /// What the handler asked for with retry_later() or dead_letter().
    decision: std::sync::Mutex<Option<(delayq::Retry, String)>>,
    cancel: delayq::CancelFlag,
}

#[pymethods]
impl PyMessage {
    fn __repr__(&self) -> String {
        format!(
            "Message(id={:?}, attempt={}, due_at={}, queue={:?})",
            self.id, self.attempt, self.due_at, self.queue
        )
    }

    /// Whether it was cancelled while it runs (`DelayQueue.cancel()` from any
    /// process), as its worker learned within a heartbeat (a third of its lease).
    /// Whatever the handler does then, the message is deleted: not retried, not
    /// dead-lettered.
    #[getter]
    fn cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Fail this delivery and run it again after `delay` seconds (a rate limit's
    /// "try again in 60 s"), whatever the handler does next. Counts as an attempt:
    /// past max_attempts the message goes to the dead-letter set.
    #[pyo3(signature = (delay, reason = "retry requested by the handler"))]
    fn retry_later(&self, py: Python<'_>, delay: f64, reason: &str) -> PyResult<()> {
        let delay = delayq::delay_from_secs("delay", delay).or_raise(py)?;
        self.decide(py, delayq::Retry::After(delay), reason)
    }

    /// Fail this delivery for good: to the dead-letter set now with `reason`, no
    /// retries (the order it was about no longer exists), whatever the handler does next.
    #[pyo3(signature = (reason = "dead-lettered by the handler"))]
    fn dead_letter(&self, py: Python<'_>, reason: &str) -> PyResult<()> {
        self.decide(py, delayq::Retry::Never, reason)
    }
}

impl PyMessage {
    fn decide(&self, py: Python<'_>, retry: delayq::Retry, reason: &str) -> PyResult<()> {
        let mut decision = self
            .decision
            .lock_py_attached(py)
            .map_err(|_| errors::new_err(py, errors::Kind::Root, "message lock poisoned".into()))?;
        if decision.is_some() {
            return Err(errors::invalid(
                py,
                "retry_later() or dead_letter() was called for this delivery already",
            ));
        }
        *decision = Some((retry, reason.to_owned()));
        Ok(())
    }

    pub(crate) fn take_decision(&self, py: Python<'_>) -> Option<(delayq::Retry, String)> {
        self.decision.lock_py_attached(py).ok().and_then(|mut d| d.take())
    }
}

pub(crate) fn message(d: &delayq::Delivery) -> PyMessage {
    PyMessage {
        id: d.id.clone(),
        attempt: d.attempt,
        max_attempts: d.max_attempts,
        due_at: d.due_at_ms as f64 / 1000.0,
        expires_at: d.expires_at_ms.map(|ms| ms as f64 / 1000.0),
        serial_key: d.serial_key.clone(),
        group: d.group.clone(),
        queue: d.queue.to_string(),
        partition: d.partition(),
        decision: std::sync::Mutex::new(None),
        cancel: d.cancel_flag(),
    }
}

impl PyDelivery {
    /// `f` with the delivery, or with None once it was completed.
    pub(crate) fn with_delivery<T>(&self, py: Python<'_>, f: impl FnOnce(Option<&delayq::Delivery>) -> T) -> T {
        match self.delivery.lock_py_attached(py) {
            Ok(d) => f(d.as_ref()),
            Err(_) => f(None),
        }
    }
}

/// A delivery handed to Python code by `_Consumer.recv`.
#[pyclass(name = "_Delivery", module = "delayq._delayq", frozen)]
pub(crate) struct PyDelivery {
    pub(crate) delivery: std::sync::Mutex<Option<delayq::Delivery>>,
    #[pyo3(get)]
    pub(crate) payload: Py<PyAny>,
    #[pyo3(get)]
    pub(crate) message: Py<PyMessage>,
}
