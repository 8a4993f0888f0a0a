//! Python values to and from JSON text. Strict: only JSON's own types (dict with str
//! keys, list, tuple, str, int within signed 64 bits, finite float, bool, None) are accepted,
//! naming the path of anything else; dict key order and 64-bit integers survive.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use delayq::{PayloadFault, PayloadJson, PayloadWriter};

use crate::errors;

pub(crate) fn payload_to_json(value: &Bound<'_, PyAny>) -> PyResult<PayloadJson> {
    payload_to_json_named(value, || "payload".into())
}

/// The same, with errors naming the payload `name` (e.g. "push_many item 3 payload").
/// One walk drives the core's writer, which holds the limits; the path to a value that
/// cannot be written is put together only for the error, as it propagates.
pub(crate) fn payload_to_json_named(value: &Bound<'_, PyAny>, name: impl FnOnce() -> String) -> PyResult<PayloadJson> {
    let mut out = PayloadWriter::new();
    match write_json(value, &mut out) {
        Ok(()) => Ok(out.finish()),
        Err(Fault::Raised(e)) => Err(e),
        Err(Fault::At {
            segments,
            type_error,
            message,
        }) => {
            let mut path = name();
            for segment in segments.iter().rev() {
                path.push_str(segment);
            }
            let text = message(&delayq::path_for_error(&path));
            Err(if type_error {
                errors::type_error(text)
            } else {
                payload_error(value.py(), text)
            })
        }
    }
}

/// Values that JSON cannot carry are payload errors: `delayq.PayloadError`, which is
/// also a `ValueError`.
fn payload_error(py: Python<'_>, message: impl Into<String>) -> PyErr {
    errors::new_err(py, errors::Kind::Payload, message.into())
}

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into())
}

/// A value that cannot be written: an exception Python raised on the way, or a
/// message given the path to the value (a TypeError for a value of no JSON type,
/// else a PayloadError), with the path's segments from the value up, each added by
/// the container it is in.
enum Fault {
    Raised(PyErr),
    At {
        segments: Vec<String>,
        /// A TypeError rather than a PayloadError.
        type_error: bool,
        message: Box<dyn FnOnce(&str) -> String>,
    },
}

impl Fault {
    fn payload(message: impl FnOnce(&str) -> String + 'static) -> Self {
        Self::At {
            segments: Vec::new(),
            type_error: false,
            message: Box::new(message),
        }
    }

    fn wrong_type(message: impl FnOnce(&str) -> String + 'static) -> Self {
        Self::At {
            segments: Vec::new(),
            type_error: true,
            message: Box::new(message),
        }
    }

    fn inside(mut self, segment: impl FnOnce() -> String) -> Self {
        if let Self::At { segments, .. } = &mut self {
            segments.push(segment());
        }
        self
    }
}

impl From<PyErr> for Fault {
    fn from(e: PyErr) -> Self {
        Self::Raised(e)
    }
}

impl From<PayloadFault> for Fault {
    fn from(fault: PayloadFault) -> Self {
        Self::payload(move |path| fault.message(path))
    }
}

fn write_json(value: &Bound<'_, PyAny>, out: &mut PayloadWriter) -> Result<(), Fault> {
    if value.is_none() {
        out.null();
    } else if let Ok(b) = value.cast::<PyBool>() {
        out.bool(b.is_true());
    } else if let Ok(i) = value.cast::<PyInt>() {
        // Signed 64 bits only: PHP (and most JSON readers) would turn 2**63 and beyond
        // into a float, silently rounded.
        let n = i.extract::<i64>().map_err(|_| {
            let shown = i.to_string();
            Fault::payload(move |path| {
                format!("{path} is {shown}, outside the signed 64-bit range (-2**63 to 2**63-1)")
            })
        })?;
        out.int(n);
    } else if let Ok(f) = value.cast::<PyFloat>() {
        out.float(f.value())?;
    } else if let Ok(s) = value.cast::<PyString>() {
        let text = s.to_cow().map_err(|_| {
            Fault::payload(|path| format!("{path} is a str that is not valid unicode (lone surrogate)"))
        })?;
        out.str(&text);
    } else if let Ok(d) = value.cast::<PyDict>() {
        out.begin_object()?;
        for (k, v) in d.iter() {
            let key = k.cast::<PyString>().map_err(|_| {
                let shown = type_name(&k);
                Fault::wrong_type(move |path| format!("{path} has a key of type {shown}; JSON object keys must be str"))
            })?;
            let key = key
                .to_cow()
                .map_err(|_| Fault::payload(|path| format!("{path} has a key that is not valid unicode")))?;
            out.key(&key);
            write_json(&v, out).map_err(|f| f.inside(|| format!("[{key:?}]")))?;
        }
        out.end_object();
    } else if value.cast::<PyList>().is_ok() || value.cast::<PyTuple>().is_ok() {
        out.begin_list()?;
        for (i, item) in value.try_iter()?.enumerate() {
            write_json(&item?, out).map_err(|f| f.inside(|| format!("[{i}]")))?;
        }
        out.end_list();
    } else {
        let shown = type_name(value);
        return Err(Fault::wrong_type(move |path| {
            format!("{path} is of type {shown}, which is not a JSON value (dict, list, str, int, float, bool, None)")
        }));
    }
    Ok(())
}

/// JSON text to Python objects, as `json.loads` would return them: built as the text
/// is read (the core's checks, no tree in between).
pub(crate) fn json_to_py<'py>(py: Python<'py>, json: &str) -> PyResult<Bound<'py, PyAny>> {
    built_with(py, |seed| delayq::decode_payload_with(json, seed))
}

/// A delivery's payload as Python objects, as `json_to_py` builds them.
pub(crate) fn payload_to_py<'py>(py: Python<'py>, delivery: &delayq::Delivery) -> PyResult<Bound<'py, PyAny>> {
    built_with(py, |seed| delivery.decode_payload_with(seed))
}

fn built_with<'py>(
    py: Python<'py>,
    decode: impl FnOnce(PySeed<'_, 'py>) -> delayq::Result<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let failed = std::cell::RefCell::new(None);
    decode(PySeed { py, failed: &failed }).map_err(|e| {
        // An error of Python's own (out of memory) stays itself.
        failed.take().unwrap_or_else(|| {
            errors::new_err(
                py,
                errors::Kind::Payload,
                format!("stored payload cannot be decoded: {e}"),
            )
        })
    })
}

/// Builds Python objects from JSON as serde_json reads it; an error Python raised
/// meanwhile is kept in `failed`.
#[derive(Clone, Copy)]
struct PySeed<'a, 'py> {
    py: Python<'py>,
    failed: &'a std::cell::RefCell<Option<PyErr>>,
}

impl<'py> PySeed<'_, 'py> {
    fn keep<T, E: serde::de::Error>(self, r: PyResult<T>) -> Result<T, E> {
        r.map_err(|e| {
            let text = e.to_string();
            self.failed.borrow_mut().get_or_insert(e);
            E::custom(text)
        })
    }
}

impl<'de, 'py> serde::de::DeserializeSeed<'de> for PySeed<'_, 'py> {
    type Value = Bound<'py, PyAny>;

    fn deserialize<D: serde::Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de, 'py> serde::de::Visitor<'de> for PySeed<'_, 'py> {
    type Value = Bound<'py, PyAny>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(self.py.None().into_bound(self.py))
    }

    fn visit_bool<E>(self, b: bool) -> Result<Self::Value, E> {
        Ok(PyBool::new(self.py, b).to_owned().into_any())
    }

    fn visit_i64<E>(self, n: i64) -> Result<Self::Value, E> {
        Ok(n.into_pyobject(self.py).unwrap_or_else(|e| match e {}).into_any())
    }

    fn visit_u64<E>(self, n: u64) -> Result<Self::Value, E> {
        Ok(n.into_pyobject(self.py).unwrap_or_else(|e| match e {}).into_any())
    }

    fn visit_f64<E>(self, f: f64) -> Result<Self::Value, E> {
        Ok(PyFloat::new(self.py, f).into_any())
    }

    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok(PyString::new(self.py, s).into_any())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let list = PyList::empty(self.py);
        while let Some(item) = seq.next_element_seed(self)? {
            self.keep(list.append(item))?;
        }
        Ok(list.into_any())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let dict = PyDict::new(self.py);
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let value = map.next_value_seed(self)?;
            self.keep(dict.set_item(key.as_ref(), value))?;
        }
        Ok(dict.into_any())
    }
}

/// Seconds from an int or float argument, validated by the core.
pub(crate) fn seconds(py: Python<'_>, value: &Bound<'_, PyAny>, name: &str) -> PyResult<f64> {
    if value.cast::<PyBool>().is_ok() || !(value.cast::<PyFloat>().is_ok() || value.cast::<PyInt>().is_ok()) {
        return Err(errors::type_error(format!(
            "{name} must be a number of seconds (int or float), got {}",
            type_name(value)
        )));
    }
    let _ = py;
    value.extract::<f64>()
}

/// Unix seconds from a float/int or a datetime (naive datetimes are local time, as
/// `datetime.timestamp()` treats them).
pub(crate) fn unix_seconds(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<f64> {
    let datetime = py.import("datetime")?.getattr("datetime")?;
    if value.is_instance(&datetime)? {
        return value.call_method0("timestamp")?.extract::<f64>();
    }
    seconds(py, value, "at")
}

// Arguments read with their name in the error, as PHP's are ("argument 'id' must be
// str, not int"): pyo3's own extraction names only the type (it adds the name as a
// note, which `str(error)` and most logs leave out). Each reader is a
// `#[pyo3(from_py_with = ...)]` of the argument it names.

fn wrong_type(name: &str, expected: &str, value: &Bound<'_, PyAny>) -> PyErr {
    errors::type_error(format!(
        "argument '{name}' must be {expected}, not {}",
        type_name(value)
    ))
}

fn text(value: &Bound<'_, PyAny>, name: &str) -> PyResult<String> {
    if value.is_instance_of::<PyString>() {
        value.extract()
    } else {
        Err(wrong_type(name, "str", value))
    }
}

/// `read`, with None taken as None.
fn optional<T>(
    value: &Bound<'_, PyAny>,
    name: &str,
    read: fn(&Bound<'_, PyAny>, &str) -> PyResult<T>,
) -> PyResult<Option<T>> {
    if value.is_none() {
        Ok(None)
    } else {
        read(value, name).map(Some)
    }
}

fn opt_text(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<String>> {
    optional(value, name, text)
}

fn number(value: &Bound<'_, PyAny>, name: &str) -> PyResult<f64> {
    // Anything float() takes as a number (a Decimal, a numpy float), but not a bool.
    match value.extract::<f64>() {
        Ok(n) if !value.is_instance_of::<PyBool>() => Ok(n),
        _ => Err(wrong_type(name, "a number of seconds (int or float)", value)),
    }
}

fn opt_number(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<f64>> {
    optional(value, name, number)
}

fn flag(value: &Bound<'_, PyAny>, name: &str) -> PyResult<bool> {
    match value.cast::<PyBool>() {
        Ok(b) => Ok(b.is_true()),
        Err(_) => Err(wrong_type(name, "bool", value)),
    }
}

fn whole<T: TryFrom<i64> + Into<u64>>(value: &Bound<'_, PyAny>, name: &str, max: T) -> PyResult<T> {
    if !value.is_instance_of::<PyInt>() || value.is_instance_of::<PyBool>() {
        return Err(wrong_type(name, "int", value));
    }
    let n = value.extract::<i64>().ok().and_then(|n| T::try_from(n).ok());
    n.ok_or_else(|| {
        errors::invalid(
            value.py(),
            format!("argument '{name}' must be from 0 to {}, got {value}", max.into()),
        )
    })
}

fn whole_u32(value: &Bound<'_, PyAny>, name: &str) -> PyResult<u32> {
    whole(value, name, u32::MAX)
}

fn opt_whole_u32(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<u32>> {
    optional(value, name, whole_u32)
}

/// A whole number that may be negative (its range is checked where it is used).
fn whole_i64(value: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    if !value.is_instance_of::<PyInt>() || value.is_instance_of::<PyBool>() {
        return Err(wrong_type(name, "int", value));
    }
    value.extract::<i64>().map_err(|_| {
        errors::invalid(
            value.py(),
            format!("argument '{name}' must be within the signed 64-bit range, got {value}"),
        )
    })
}

fn opt_whole_i64(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<i64>> {
    optional(value, name, whole_i64)
}

fn whole_usize(value: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    whole::<u64>(value, name, u64::from(u32::MAX)).map(|n| usize::try_from(n).unwrap_or(usize::MAX))
}

macro_rules! argument_readers {
    ($($reader:ident -> $ty:ty = $read:ident($name:literal);)*) => {$(
        pub(crate) fn $reader(value: &Bound<'_, PyAny>) -> PyResult<$ty> {
            $read(value, $name)
        }
    )*};
}

argument_readers! {
    id_arg -> String = text("id");
    opt_id_arg -> Option<String> = opt_text("id");
    partition_key_arg -> Option<String> = opt_text("partition_key");
    serial_key_arg -> Option<String> = opt_text("serial_key");
    group_arg -> Option<String> = opt_text("group");
    concurrency_arg -> Option<i64> = opt_whole_i64("concurrency");
    opt_max_arg -> Option<i64> = opt_whole_i64("max");
    opt_per_arg -> Option<f64> = opt_number("per");
    name_arg -> String = text("name");
    text_arg -> String = text("text");
    field_arg -> String = text("field");
    user_arg -> String = text("user");
    tz_arg -> Option<String> = opt_text("tz");
    delay_arg -> f64 = number("delay");
    per_arg -> f64 = number("per");
    expire_after_arg -> Option<f64> = opt_number("expire_after");
    max_attempts_arg -> Option<u32> = opt_whole_u32("max_attempts");
    replace_arg -> bool = flag("replace");
    limit_arg -> usize = whole_usize("limit");
    start_arg -> usize = whole_usize("start");
    span_arg -> u32 = whole_u32("span");
    threads_arg -> usize = whole_usize("threads");
    batch_arg -> usize = whole_usize("batch");
    prefetch_arg -> usize = whole_usize("prefetch");
    worker_max_attempts_arg -> u32 = whole_u32("max_attempts");
    lease_arg -> f64 = number("lease");
    backoff_base_arg -> f64 = number("backoff_base");
    backoff_max_arg -> f64 = number("backoff_max");
    timeout_arg -> Option<f64> = opt_number("timeout");
    idle_check_arg -> f64 = number("idle_check");
    stop_when_empty_arg -> bool = flag("stop_when_empty");
    max_jobs_arg -> Option<i64> = opt_whole_i64("max_jobs");
    max_time_arg -> Option<f64> = opt_number("max_time");
    max_memory_mb_arg -> Option<i64> = opt_whole_i64("max_memory_mb");
    zset_key_arg -> Option<String> = opt_text("zset_key");
    payload_key_arg -> Option<String> = opt_text("payload_key");
    max_payload_bytes_arg -> i64 = whole_i64("max_payload_bytes");
    connect_timeout_arg -> f64 = number("connect_timeout");
    read_timeout_arg -> f64 = number("read_timeout");
    retry_timeout_arg -> f64 = number("retry_timeout");
    partitions_arg -> i64 = whole_i64("partitions");
    wait_replicas_arg -> i64 = whole_i64("wait_replicas");
    wait_timeout_arg -> f64 = number("wait_timeout");
    dead_max_arg -> i64 = whole_i64("dead_max");
    dead_ttl_arg -> f64 = number("dead_ttl");
    keep_completed_arg -> i64 = whole_i64("keep_completed");
    keep_completed_for_arg -> f64 = number("keep_completed_for");
}
