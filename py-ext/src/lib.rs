//! Python module for delayq (pyo3): conversion and error mapping only; the queue logic
//! lives in the `delayq` crate.

use pyo3::prelude::*;

#[pymodule]
fn _delayq(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}
