//! The process balancer of `delayq worker --processes N --min-processes M`: the core's
//! `Scaler`, which decides how many processes run; the core's supervisor starts and
//! stops them.

use pyo3::prelude::*;

use crate::errors::OrRaise;
use crate::queue::PyQueue;

#[pyclass(name = "_Scaler", module = "delayq._delayq")]
pub(crate) struct PyScaler {
    pub(crate) scaler: delayq::scale::Scaler,
}

#[pymethods]
impl PyScaler {
    #[new]
    fn new(py: Python<'_>, min: usize, max: usize, cooldown: f64) -> PyResult<Self> {
        let cooldown = delayq::delay_from_secs("scale_cooldown", cooldown).or_raise(py)?;
        Ok(Self {
            scaler: delayq::scale::Scaler::new(min, max, cooldown).or_raise(py)?,
        })
    }

    #[getter]
    fn initial(&self) -> usize {
        self.scaler.initial()
    }

    #[getter]
    fn min(&self) -> usize {
        self.scaler.min()
    }

    #[getter]
    fn is_auto(&self) -> bool {
        self.scaler.is_auto()
    }

    /// How many processes should run, given `running` (of which `busy` are in a
    /// handler) and the backlog of `queues`, read now.
    fn look(&mut self, py: Python<'_>, queues: Vec<PyRef<'_, PyQueue>>, running: usize, busy: usize) -> usize {
        let queues: Vec<delayq::Queue> = queues.iter().map(|q| q.queue.clone()).collect();
        let scaler = &mut self.scaler;
        py.detach(|| scaler.look(&queues, running, busy))
    }
}
