//! The core's options tables (`delayq::options`) as tuples of dicts:
//! `WORKER_OPTIONS` and `QUEUE_OPTIONS`. The Python package takes its defaults from
//! them, and the tests check the signatures, the `.pyi`, the PHP stub and the docs
//! against them.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use delayq::options::{Default, OptionRow};

pub(crate) fn table<'py>(py: Python<'py>, rows: &[OptionRow]) -> PyResult<Bound<'py, PyTuple>> {
    let rows = rows
        .iter()
        .map(|o| {
            let row = PyDict::new(py);
            row.set_item("name", o.name)?;
            row.set_item("kind", o.kind.as_str())?;
            row.set_item("min", o.min)?;
            row.set_item("max", o.max)?;
            row.set_item("above_zero", o.above_zero)?;
            row.set_item("choices", PyTuple::new(py, o.choices)?)?;
            match o.default {
                Default::Count(n) => row.set_item("default", n)?,
                Default::Seconds(s) => row.set_item("default", s)?,
                Default::Flag(b) => row.set_item("default", b)?,
                Default::Text(t) => row.set_item("default", t)?,
                Default::Unset => row.set_item("default", py.None())?,
            }
            row.set_item("php", o.takers.php)?;
            row.set_item("python", o.takers.python)?;
            row.set_item("doc", o.doc)?;
            Ok(row)
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, rows)
}
