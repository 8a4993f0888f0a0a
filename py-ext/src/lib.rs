//! Python module for delayq (pyo3): value conversion, error mapping, and the handler
//! loop, and the spawn of supervised worker processes. The queue logic lives in the `delayq` crate; each file here mirrors one part
//! of its API, and the Python package in `delayq/` adds the idioms (signals, asyncio,
//! context managers).

mod convert;
mod errors;
mod logs;
mod message;
mod options;
mod queue;
mod records;
mod scale;
mod slot;
mod supervisor;
mod worker;

use pyo3::prelude::*;

/// The error of a delivery whose coroutine handler was cancelled at its `timeout`
/// (the core's words, as a killed process's).
#[pyfunction]
#[pyo3(name = "_cancel_error")]
fn cancel_error(timeout: f64) -> String {
    delayq::host::cancel_error(std::time::Duration::from_secs_f64(timeout.max(0.0)))
}

#[pymodule]
fn _delayq(m: &Bound<'_, PyModule>) -> PyResult<()> {
    logs::install(m.py());
    m.add_class::<queue::PyQueue>()?;
    m.add_class::<message::PyMessage>()?;
    m.add_class::<worker::PyWorker>()?;
    m.add_class::<worker::PyConsumer>()?;
    m.add_class::<message::PyDelivery>()?;
    m.add_class::<scale::PyScaler>()?;
    m.add_class::<slot::PySlot>()?;
    m.add_class::<slot::PySlotTable>()?;
    m.add_class::<supervisor::PySupervisor>()?;
    m.add_class::<supervisor::PyStopSignals>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("DEFAULT_MAX_PAYLOAD_BYTES", delayq::DEFAULT_MAX_PAYLOAD_BYTES)?;
    m.add("_URGENT_AFTER", delayq::host::URGENT_AFTER.as_secs_f64())?;
    m.add("_CANCEL_GRACE", delayq::host::CANCEL_GRACE.as_secs_f64())?;
    m.add("_COROUTINE_GRACE", delayq::host::COROUTINE_GRACE.as_secs_f64())?;
    m.add_function(wrap_pyfunction!(cancel_error, m)?)?;
    m.add_function(wrap_pyfunction!(supervisor::report_done, m)?)?;
    m.add_function(wrap_pyfunction!(supervisor::report_hook_failed, m)?)?;
    m.add_function(wrap_pyfunction!(supervisor::stop_with_supervisor, m)?)?;
    m.add("WORKER_OPTIONS", options::table(m.py(), &delayq::host::WORKER_OPTIONS)?)?;
    m.add("QUEUE_OPTIONS", options::table(m.py(), &delayq::QUEUE_OPTIONS)?)?;
    m.add("RECORD_SHAPES", records::shapes(m.py())?)?;
    Ok(())
}
