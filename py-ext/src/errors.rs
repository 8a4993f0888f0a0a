//! Error mapping: every core error becomes one subclass of `delayq.DelayQueueError`
//! (defined in delayq/errors.py, where multiple inheritance from the builtin
//! ValueError / ConnectionError / TimeoutError is plain Python).

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

static CLASSES: [PyOnceLock<Py<PyType>>; 8] = [const { PyOnceLock::new() }; 8];
const NAMES: [&str; 8] = [
    "DelayQueueError",
    "InvalidArgumentError",
    "ConnectionError",
    "TimeoutError",
    "AuthError",
    "PayloadError",
    "LeaseLostError",
    "OutOfMemoryError",
];

#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Root = 0,
    InvalidArgument = 1,
    Connection = 2,
    Timeout = 3,
    Auth = 4,
    Payload = 5,
    LeaseLost = 6,
    OutOfMemory = 7,
}

/// The class of a batch written in part (`delayq::Error::PartlyWritten`), by its
/// cause's kind: a subclass of both `PartialPushError` and the cause's class (see
/// errors.py). A push refuses bad input before it sends anything, so those kinds take
/// `PartialPushError` itself.
static PARTIAL_CLASSES: [PyOnceLock<Py<PyType>>; 8] = [const { PyOnceLock::new() }; 8];
const PARTIAL_NAMES: [&str; 8] = [
    "PartialPushError",
    "PartialPushError",
    "PartialConnectionError",
    "PartialTimeoutError",
    "PartialAuthError",
    "PartialPushError",
    "PartialPushError",
    "PartialOutOfMemoryError",
];

pub(crate) fn new_err(py: Python<'_>, kind: Kind, message: String) -> PyErr {
    match CLASSES[kind as usize].import(py, "delayq.errors", NAMES[kind as usize]) {
        Ok(ty) => PyErr::from_type(ty.clone(), message),
        Err(e) => e,
    }
}

/// The Python exception for a core error.
pub(crate) fn to_py(py: Python<'_>, err: &delayq::Error) -> PyErr {
    use delayq::Category as C;
    let kind = match err.category() {
        C::InvalidArgument => Kind::InvalidArgument,
        C::Payload => Kind::Payload,
        C::Connection => Kind::Connection,
        C::Timeout => Kind::Timeout,
        C::Auth => Kind::Auth,
        C::LeaseLost => Kind::LeaseLost,
        C::OutOfMemory => Kind::OutOfMemory,
        _ => Kind::Root,
    };
    if let delayq::Error::PartlyWritten {
        ids, written, unknown, ..
    } = err
    {
        return partial(py, kind, err.to_string(), ids, written, unknown).unwrap_or_else(|e| e);
    }
    new_err(py, kind, err.to_string())
}

/// The exception of a batch written in part, with its ids as attributes.
fn partial(
    py: Python<'_>,
    kind: Kind,
    message: String,
    ids: &[String],
    written: &[String],
    unknown: &[String],
) -> PyResult<PyErr> {
    let ty = PARTIAL_CLASSES[kind as usize].import(py, "delayq.errors", PARTIAL_NAMES[kind as usize])?;
    let exception = ty.call1((message,))?;
    exception.setattr("ids", ids)?;
    exception.setattr("written_ids", written)?;
    exception.setattr("unknown_ids", unknown)?;
    Ok(PyErr::from_value(exception))
}

pub(crate) fn invalid(py: Python<'_>, message: impl Into<String>) -> PyErr {
    new_err(py, Kind::InvalidArgument, message.into())
}

pub(crate) fn type_error(message: impl Into<String>) -> PyErr {
    PyTypeError::new_err(message.into())
}

pub(crate) trait OrRaise<T> {
    fn or_raise(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> OrRaise<T> for delayq::Result<T> {
    /// Every call into the core ends here, on the caller's thread: the place to hand
    /// over what the core logged meanwhile.
    fn or_raise(self, py: Python<'_>) -> PyResult<T> {
        crate::logs::flush(py);
        self.map_err(|e| to_py(py, &e))
    }
}
