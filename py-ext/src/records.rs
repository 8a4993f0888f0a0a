//! The core's records (`delayq::records`) as Python dicts: the one converter of every
//! read call (`get`, `stats`, `workers`, ...) and of a worker's summary, so Python shows
//! what PHP shows; and their shapes (`RECORD_SHAPES`), which a test checks the
//! TypedDicts of `delayq.records` and the PHP stub against.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use delayq::records::{Field, Record};

use crate::convert::json_to_py;

/// A record as a dict.
pub(crate) fn dict(py: Python<'_>, r: Record) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    for (name, field) in r.0 {
        d.set_item(name, value(py, field)?)?;
    }
    Ok(d)
}

/// Records as a list of dicts.
pub(crate) fn list(py: Python<'_>, rs: impl IntoIterator<Item = Record>) -> PyResult<Bound<'_, PyList>> {
    let list = PyList::empty(py);
    for r in rs {
        list.append(dict(py, r)?)?;
    }
    Ok(list)
}

fn value(py: Python<'_>, field: Field) -> PyResult<Bound<'_, PyAny>> {
    Ok(match field {
        Field::Null => py.None().into_bound(py),
        Field::Int(n) => n.into_pyobject(py)?.into_any(),
        Field::Float(x) => x.into_pyobject(py)?.into_any(),
        Field::Text(s) => s.into_pyobject(py)?.into_any(),
        Field::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Field::Json(text) => match json_to_py(py, &text) {
            Ok(v) => v,
            Err(_) => text.into_pyobject(py)?.into_any(),
        },
        Field::Record(r) => dict(py, r)?.into_any(),
    })
}

/// `RECORD_SHAPES`: each record's name and its fields in order.
pub(crate) fn shapes(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    for (name, fields) in delayq::records::shapes() {
        d.set_item(name, PyTuple::new(py, fields)?)?;
    }
    Ok(d)
}
