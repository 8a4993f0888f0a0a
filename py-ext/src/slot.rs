//! A supervised worker process's side of its slot (mirrors the core's `host/slot.rs`):
//! `_Slot`, opened by path in the exec'd process, where the Python package says when
//! a handler starts, blocks the others and ends, and on which delivery; and
//! `_SlotTable`, slots in a file as a supervisor makes them, for tests.

use std::time::Duration;

use delayq::host::{self, SlotTable};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors;
use crate::message::PyDelivery;

/// A worker process's slot (see the core's `host::Slot`), opened by path.
#[pyclass(name = "_Slot", module = "delayq._delayq", frozen)]
pub(crate) struct PySlot {
    pub(crate) slot: host::Slot,
}

#[pymethods]
impl PySlot {
    #[new]
    fn new(py: Python<'_>, path: &str, index: usize) -> PyResult<Self> {
        let slot = host::Slot::open(path.as_ref(), index)
            .map_err(|e| errors::invalid(py, format!("cannot open the slot file {path}: {e}")))?;
        Ok(Self { slot })
    }

    /// A handler started on `delivery` (None: unknown), allowed `grace` seconds past
    /// the timeout; `killable` as `Slot::started` has it.
    #[pyo3(signature = (delivery, grace = 0.0, killable = true))]
    fn started(&self, py: Python<'_>, delivery: Option<&PyDelivery>, grace: f64, killable: bool) {
        let grace = Duration::from_secs_f64(grace.clamp(0.0, 86_400.0));
        match delivery {
            Some(d) => d.with_delivery(py, |d| self.slot.started(d, grace, killable)),
            None => self.slot.started(None, grace, killable),
        }
    }

    /// The handler of `delivery` blocks every other one of this process (a coroutine
    /// blocking the event loop): named in the running busy period.
    fn blocked_on(&self, py: Python<'_>, delivery: &PyDelivery) {
        delivery.with_delivery(py, |d| {
            if let Some(d) = d {
                self.slot.blocked_on(d);
            }
        });
    }

    /// The handlers run again after a block: `delivery`'s is the one to time (None:
    /// unknown), in the same busy period.
    #[pyo3(signature = (delivery = None))]
    fn unblocked(&self, py: Python<'_>, delivery: Option<&PyDelivery>) {
        match delivery {
            Some(d) => d.with_delivery(py, |d| self.slot.unblocked(d)),
            None => self.slot.unblocked(None),
        }
    }

    /// The handler ended.
    fn finished(&self) {
        self.slot.finished();
    }
}

/// Slots in a file, as a supervisor makes them: for tests of what a worker process
/// tells its supervisor.
#[pyclass(name = "_SlotTable", module = "delayq._delayq", frozen)]
pub(crate) struct PySlotTable {
    table: SlotTable,
}

#[pymethods]
impl PySlotTable {
    #[new]
    fn new(py: Python<'_>, len: usize) -> PyResult<Self> {
        let table = SlotTable::in_file(len).map_err(|e| errors::invalid(py, format!("cannot make slots: {e}")))?;
        Ok(Self { table })
    }

    #[getter]
    fn path(&self) -> String {
        self.table.path().map(|p| p.display().to_string()).unwrap_or_default()
    }

    /// What slot `index` says: starts, busy, the held message's id and attempt.
    fn view<'py>(&self, py: Python<'py>, index: usize) -> PyResult<Bound<'py, PyDict>> {
        let v = self.table.view(index);
        let d = PyDict::new(py);
        d.set_item("starts", v.starts)?;
        d.set_item("busy", v.busy)?;
        d.set_item("held_id", v.held.as_ref().map(|h| h.id.clone()))?;
        d.set_item("held_attempt", v.held.as_ref().map(|h| h.attempt))?;
        d.set_item("blocking", v.blocking)?;
        d.set_item("handled", v.counts.handled)?;
        Ok(d)
    }
}
