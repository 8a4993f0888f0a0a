//! `delayq.DelayQueue`: the producer and admin API (mirrors `delayq::Queue`).

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::convert::{self, payload_to_json};
use crate::errors::{self, OrRaise};
use crate::records;
use delayq::records as records_of;
use delayq::{GroupLimit, Listing, MessageInfo, RateLimit, RepeatOptions, Schedule, ScriptRights};

/// A delay queue on Redis. Usable on both sides of os.fork(): each process opens its
/// own connection.
#[pyclass(name = "DelayQueue", module = "delayq", frozen)]
pub(crate) struct PyQueue {
    pub(crate) queue: delayq::Queue,
}

fn duration(py: Python<'_>, name: &str, secs: Option<f64>) -> PyResult<Option<Duration>> {
    secs.map(|s| delayq::delay_from_secs(name, s).or_raise(py)).transpose()
}

/// A delay in seconds; `name` names it in an error, and is put together only then.
fn delay_due(py: Python<'_>, value: &Bound<'_, PyAny>, name: impl Fn() -> String) -> PyResult<delayq::Due> {
    let secs = match value.cast::<pyo3::types::PyFloat>() {
        Ok(f) => f.value(),
        // A plain int (a bool is an int too, and refused): read without putting
        // `name` together, which only an error needs.
        Err(_) if value.cast_exact::<pyo3::types::PyInt>().is_ok() => value.extract::<f64>()?,
        Err(_) => convert::seconds(py, value, &name())?,
    };
    match delayq::delay_from_secs("delay", secs) {
        Ok(d) => Ok(delayq::Due::In(d)),
        Err(_) => delayq::delay_from_secs(&name(), secs).map(delayq::Due::In).or_raise(py),
    }
}

fn at_due(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<delayq::Due> {
    delayq::Due::from_unix_secs(convert::unix_seconds(py, value)?).or_raise(py)
}

// The default in the signature below is a literal so that Python can show it.
const _: () = assert!(delayq::DEFAULT_MAX_PAYLOAD_BYTES == 1_048_576);

fn ms_to_secs(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

#[pymethods]
impl PyQueue {
    #[new]
    #[pyo3(signature = (url = "redis://127.0.0.1:6379", queue = "default", *, prefix = "dq", layout = "native",
        zset_key = None, payload_key = None, max_payload_bytes = 1_048_576,
        connect_timeout = 2.0, read_timeout = 5.0, retry_timeout = 5.0, tls_ca_file = None, partitions = 1,
        wait_replicas = 0, wait_timeout = 1.0, dead_max = 10_000, dead_ttl = 2_592_000.0, keep_completed = 0,
        keep_completed_for = 86_400.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        url: &str,
        queue: &str,
        prefix: &str,
        layout: &str,
        #[pyo3(from_py_with = convert::zset_key_arg)] zset_key: Option<String>,
        #[pyo3(from_py_with = convert::payload_key_arg)] payload_key: Option<String>,
        #[pyo3(from_py_with = convert::max_payload_bytes_arg)] max_payload_bytes: i64,
        #[pyo3(from_py_with = convert::connect_timeout_arg)] connect_timeout: f64,
        #[pyo3(from_py_with = convert::read_timeout_arg)] read_timeout: f64,
        #[pyo3(from_py_with = convert::retry_timeout_arg)] retry_timeout: f64,
        tls_ca_file: Option<std::path::PathBuf>,
        #[pyo3(from_py_with = convert::partitions_arg)] partitions: i64,
        #[pyo3(from_py_with = convert::wait_replicas_arg)] wait_replicas: i64,
        #[pyo3(from_py_with = convert::wait_timeout_arg)] wait_timeout: f64,
        #[pyo3(from_py_with = convert::dead_max_arg)] dead_max: i64,
        #[pyo3(from_py_with = convert::dead_ttl_arg)] dead_ttl: f64,
        #[pyo3(from_py_with = convert::keep_completed_arg)] keep_completed: i64,
        #[pyo3(from_py_with = convert::keep_completed_for_arg)] keep_completed_for: f64,
    ) -> PyResult<Self> {
        use delayq::options::Value::Seconds;
        let mut values = queue_values(QueueValues {
            prefix,
            layout,
            zset_key,
            payload_key,
            max_payload_bytes,
            partitions,
            wait_replicas,
            wait_timeout,
            dead_max,
            dead_ttl,
            keep_completed,
            keep_completed_for,
        });
        values.extend([
            ("connect_timeout", Seconds(connect_timeout)),
            ("read_timeout", Seconds(read_timeout)),
            ("retry_timeout", Seconds(retry_timeout)),
        ]);
        let mut opts = delayq::QueueOptions::from_values(values).or_raise(py)?;
        // A path, not text: one that is not UTF-8 is still a file name.
        opts.connect.tls_ca_file = tls_ca_file;
        crate::logs::sync_level(py);
        Ok(Self {
            queue: delayq::Queue::new(url, queue, opts).or_raise(py)?,
        })
    }

    /// A queue on this queue's Redis and connection (see the stub): the options of
    /// `DelayQueue()` but those of the connection, which are this queue's; `prefix`
    /// defaults to this queue's.
    #[pyo3(signature = (queue, *, prefix = None, layout = "native", zset_key = None, payload_key = None,
        max_payload_bytes = 1_048_576, partitions = 1, wait_replicas = 0, wait_timeout = 1.0, dead_max = 10_000,
        dead_ttl = 2_592_000.0, keep_completed = 0, keep_completed_for = 86_400.0))]
    #[allow(clippy::too_many_arguments)]
    fn sharing_connection(
        &self,
        py: Python<'_>,
        queue: &str,
        prefix: Option<&str>,
        layout: &str,
        #[pyo3(from_py_with = convert::zset_key_arg)] zset_key: Option<String>,
        #[pyo3(from_py_with = convert::payload_key_arg)] payload_key: Option<String>,
        #[pyo3(from_py_with = convert::max_payload_bytes_arg)] max_payload_bytes: i64,
        #[pyo3(from_py_with = convert::partitions_arg)] partitions: i64,
        #[pyo3(from_py_with = convert::wait_replicas_arg)] wait_replicas: i64,
        #[pyo3(from_py_with = convert::wait_timeout_arg)] wait_timeout: f64,
        #[pyo3(from_py_with = convert::dead_max_arg)] dead_max: i64,
        #[pyo3(from_py_with = convert::dead_ttl_arg)] dead_ttl: f64,
        #[pyo3(from_py_with = convert::keep_completed_arg)] keep_completed: i64,
        #[pyo3(from_py_with = convert::keep_completed_for_arg)] keep_completed_for: f64,
    ) -> PyResult<Self> {
        let values = queue_values(QueueValues {
            prefix: prefix.unwrap_or(&self.queue.options().prefix),
            layout,
            zset_key,
            payload_key,
            max_payload_bytes,
            partitions,
            wait_replicas,
            wait_timeout,
            dead_max,
            dead_ttl,
            keep_completed,
            keep_completed_for,
        });
        let mut opts = delayq::QueueOptions::from_values(values).or_raise(py)?;
        opts.connect = self.queue.options().connect.clone();
        Ok(Self {
            queue: self.queue.sharing_connection(queue, opts).or_raise(py)?,
        })
    }

    /// Schedule `payload` (any JSON value) after `delay` seconds on the Redis clock.
    /// Returns the message id; an `id` makes the push idempotent.
    #[pyo3(signature = (payload, delay = 0.0, *, id = None, max_attempts = None, partition_key = None,
        replace = false, expire_after = None, serial_key = None, group = None))]
    #[allow(clippy::too_many_arguments)]
    fn push(
        &self,
        py: Python<'_>,
        payload: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = convert::delay_arg)] delay: f64,
        #[pyo3(from_py_with = convert::opt_id_arg)] id: Option<String>,
        #[pyo3(from_py_with = convert::max_attempts_arg)] max_attempts: Option<u32>,
        #[pyo3(from_py_with = convert::partition_key_arg)] partition_key: Option<String>,
        #[pyo3(from_py_with = convert::replace_arg)] replace: bool,
        #[pyo3(from_py_with = convert::expire_after_arg)] expire_after: Option<f64>,
        #[pyo3(from_py_with = convert::serial_key_arg)] serial_key: Option<String>,
        #[pyo3(from_py_with = convert::group_arg)] group: Option<String>,
    ) -> PyResult<String> {
        let due = delayq::delay_from_secs("delay", delay)
            .map(delayq::Due::In)
            .or_raise(py)?;
        let json = payload_to_json(payload)?;
        let opts = delayq::PushOptions {
            id,
            max_attempts,
            partition_key,
            replace,
            expire_after: duration(py, "expire_after", expire_after)?,
            serial_key,
            group,
        };
        py.detach(|| self.queue.push_json(json, due, &opts)).or_raise(py)
    }

    /// Schedule `payload` at `at`: Unix seconds or a datetime.
    #[pyo3(signature = (payload, at, *, id = None, max_attempts = None, partition_key = None, replace = false,
        expire_after = None, serial_key = None, group = None))]
    #[allow(clippy::too_many_arguments)]
    fn push_at(
        &self,
        py: Python<'_>,
        payload: &Bound<'_, PyAny>,
        at: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = convert::opt_id_arg)] id: Option<String>,
        #[pyo3(from_py_with = convert::max_attempts_arg)] max_attempts: Option<u32>,
        #[pyo3(from_py_with = convert::partition_key_arg)] partition_key: Option<String>,
        #[pyo3(from_py_with = convert::replace_arg)] replace: bool,
        #[pyo3(from_py_with = convert::expire_after_arg)] expire_after: Option<f64>,
        #[pyo3(from_py_with = convert::serial_key_arg)] serial_key: Option<String>,
        #[pyo3(from_py_with = convert::group_arg)] group: Option<String>,
    ) -> PyResult<String> {
        let due = at_due(py, at)?;
        let json = payload_to_json(payload)?;
        let opts = delayq::PushOptions {
            id,
            max_attempts,
            partition_key,
            replace,
            expire_after: duration(py, "expire_after", expire_after)?,
            serial_key,
            group,
        };
        py.detach(|| self.queue.push_json(json, due, &opts)).or_raise(py)
    }

    /// Schedule many messages in one round trip (two for 1 000 delays or more, the first
    /// reading the Redis clock so that the client stamps them): `(payload, delay)` tuples or dicts
    /// with `payload` and optional `delay` or `at`, `id`, `max_attempts`, `partition_key`, `replace`,
    /// `expire_after`, `serial_key`, `group`. Nothing is written unless every item is valid. Up
    /// to 1 000 messages of one partition are one script, written all or none, and its
    /// error is the one a push raises. A batch of several scripts (more messages, or
    /// several partitions) that fails in one may have written others: then it raises a
    /// `PartialPushError` (errors.rs) with the ids written, those unknown and every id of
    /// the batch, which is also the class its cause raises.
    fn push_many(&self, py: Python<'_>, items: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
        let mut batch = Vec::new();
        for (i, item) in items.try_iter()?.enumerate() {
            let item = item?;
            let message = if let Ok(t) = item.cast::<PyTuple>() {
                if t.len() != 2 {
                    return Err(errors::type_error(format!(
                        "push_many item {i} must be a (payload, delay) pair, got a tuple of {}",
                        t.len()
                    )));
                }
                delayq::NewMessage {
                    payload_json: convert::payload_to_json_named(&t.get_item(0)?, || {
                        format!("push_many item {i} payload")
                    })?,
                    due: delay_due(py, &t.get_item(1)?, || format!("push_many item {i} delay"))?,
                    options: delayq::PushOptions::default(),
                }
            } else if let Ok(d) = item.cast::<PyDict>() {
                for key in d.keys() {
                    let k: String = key.extract()?;
                    if ![
                        "payload",
                        "delay",
                        "at",
                        "id",
                        "max_attempts",
                        "partition_key",
                        "replace",
                        "expire_after",
                        "serial_key",
                        "group",
                    ]
                    .contains(&k.as_str())
                    {
                        return Err(errors::invalid(
                            py,
                            format!(
                                "push_many item {i} has an unknown key '{k}' \
                                 (known: payload, delay, at, id, max_attempts, partition_key, replace, expire_after, serial_key, group)"
                            ),
                        ));
                    }
                }
                let payload = d
                    .get_item("payload")?
                    .ok_or_else(|| errors::invalid(py, format!("push_many item {i} has no 'payload'")))?;
                let due = match (d.get_item("delay")?, d.get_item("at")?) {
                    (Some(_), Some(_)) => {
                        return Err(errors::invalid(
                            py,
                            format!("push_many item {i} has both 'delay' and 'at'"),
                        ));
                    }
                    (Some(delay), None) => delay_due(py, &delay, || format!("push_many item {i} delay"))?,
                    (None, Some(at)) => at_due(py, &at)?,
                    (None, None) => delayq::Due::NOW,
                };
                delayq::NewMessage {
                    payload_json: convert::payload_to_json_named(&payload, || format!("push_many item {i} payload"))?,
                    due,
                    options: delayq::PushOptions {
                        id: d.get_item("id")?.map(|v| v.extract()).transpose()?,
                        max_attempts: d.get_item("max_attempts")?.map(|v| v.extract()).transpose()?,
                        partition_key: d.get_item("partition_key")?.map(|v| v.extract()).transpose()?,
                        replace: d
                            .get_item("replace")?
                            .map(|v| v.extract())
                            .transpose()?
                            .unwrap_or(false),
                        expire_after: duration(
                            py,
                            &format!("push_many item {i} expire_after"),
                            d.get_item("expire_after")?.map(|v| v.extract()).transpose()?,
                        )?,
                        serial_key: d.get_item("serial_key")?.map(|v| v.extract()).transpose()?,
                        group: d.get_item("group")?.map(|v| v.extract()).transpose()?,
                    },
                }
            } else {
                return Err(errors::type_error(format!(
                    "push_many item {i} must be a (payload, delay) tuple or a dict, got {}",
                    item.get_type().name()?
                )));
            };
            batch.push(message);
        }
        py.detach(|| self.queue.push_many(&batch)).or_raise(py)
    }

    /// Cancel a message: one that waits is deleted; one that runs is marked
    /// cancelled (its handler sees `message.cancelled`, and the message is deleted
    /// whatever the handler does then); with `kill`, a worker process that runs it is
    /// killed as at its timeout. False when it is unknown or dead.
    #[pyo3(signature = (id, *, kill = false))]
    fn cancel(&self, py: Python<'_>, #[pyo3(from_py_with = convert::id_arg)] id: String, kill: bool) -> PyResult<bool> {
        py.detach(|| self.queue.cancel_with(&id, delayq::CancelOptions::kill(kill)))
            .or_raise(py)
    }

    /// Move a waiting message to `delay` seconds from now; False when not waiting.
    fn reschedule(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::id_arg)] id: String,
        #[pyo3(from_py_with = convert::delay_arg)] delay: f64,
    ) -> PyResult<bool> {
        let due = delayq::delay_from_secs("delay", delay)
            .map(delayq::Due::In)
            .or_raise(py)?;
        py.detach(|| self.queue.reschedule(&id, due)).or_raise(py)
    }

    /// Everything known about a message, or None for an unknown id.
    fn get<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = convert::id_arg)] id: String,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        match py.detach(|| self.queue.get(&id)).or_raise(py)? {
            Some(info) => Ok(Some(records::dict(py, records_of::message(&info))?)),
            None => Ok(None),
        }
    }

    /// The next `limit` (at most 1000) messages waiting, scheduled or ready, earliest
    /// due first, each as `get()` shows it.
    #[pyo3(signature = (limit = 100, *, start = 0))]
    fn waiting<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = convert::limit_arg)] limit: usize,
        #[pyo3(from_py_with = convert::start_arg)] start: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        self.listing(py, Listing::Waiting, start, limit)
    }

    /// Up to `limit` (at most 1000) running messages, earliest lease deadline first,
    /// each as `get()` shows it; a `lease_until` in the past is a delivery whose worker
    /// died or hung (it runs again at the next claim).
    #[pyo3(signature = (limit = 100, *, start = 0))]
    fn inflight<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = convert::limit_arg)] limit: usize,
        #[pyo3(from_py_with = convert::start_arg)] start: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        self.listing(py, Listing::Inflight, start, limit)
    }

    /// Up to `limit` (at most 1000) messages whose payload contains `text` (or whose id it is), in
    /// any state (see the stub).
    #[pyo3(signature = (text, limit = 20))]
    fn find<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = convert::text_arg)] text: String,
        #[pyo3(from_py_with = convert::limit_arg)] limit: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        let found = py.detach(|| self.queue.find(&text, limit)).or_raise(py)?;
        message_list(py, found)
    }

    /// Up to `limit` (at most 1000) messages whose payload has `field` equal to `value`
    /// (see the stub).
    #[pyo3(signature = (field, value, limit = 20))]
    fn find_field<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = convert::field_arg)] field: String,
        value: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = convert::limit_arg)] limit: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        let json = convert::payload_to_json_named(value, || "value".into())?;
        let value: serde_json::Value =
            serde_json::from_str(&json).map_err(|e| errors::invalid(py, format!("invalid value: {e}")))?;
        let found = py
            .detach(|| self.queue.find_field(&field, &value, limit))
            .or_raise(py)?;
        message_list(py, found)
    }

    /// Up to `limit` (at most 1000) completed messages kept by `keep_completed`, latest
    /// first, each as `get()` shows it.
    #[pyo3(signature = (limit = 100, *, start = 0))]
    fn completed<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = convert::limit_arg)] limit: usize,
        #[pyo3(from_py_with = convert::start_arg)] start: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        self.listing(py, Listing::Completed, start, limit)
    }

    /// Queue depth by state and lifetime counters (same keys as PHP's stats()).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = py.detach(|| self.queue.stats()).or_raise(py)?;
        records::dict(py, records_of::stats(&s, self.queue.partitions() as u32))
    }

    /// Up to `limit` dead letters, newest first.
    #[pyo3(signature = (limit = 100, *, start = 0))]
    fn dead_letters<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = convert::limit_arg)] limit: usize,
        #[pyo3(from_py_with = convert::start_arg)] start: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        let dead = py.detach(|| self.queue.dead_letters_page(start, limit)).or_raise(py)?;
        records::list(py, dead.iter().map(records_of::dead_letter))
    }

    /// The last `span` minutes, oldest first (see the stub).
    #[pyo3(signature = (span = 60))]
    fn minutes<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = convert::span_arg)] span: u32,
    ) -> PyResult<Bound<'py, PyList>> {
        let minutes = py.detach(|| self.queue.minutes(span)).or_raise(py)?;
        records::list(py, minutes.iter().map(records_of::minute))
    }

    /// The queues registered on this Redis under this queue's prefix (see the stub).
    fn registered_queues<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let queues = py.detach(|| self.queue.registered_queues()).or_raise(py)?;
        records::list(py, queues.iter().map(records_of::registered_queue))
    }

    /// Entries `start..start + limit` of the registry, seen most recently first, and how
    /// many it holds (see the stub).
    #[pyo3(signature = (limit = 50, *, start = 0))]
    fn registered_queues_page<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = convert::limit_arg)] limit: usize,
        #[pyo3(from_py_with = convert::start_arg)] start: usize,
    ) -> PyResult<(Bound<'py, PyList>, u64)> {
        let page = py
            .detach(|| self.queue.registered_queues_page(start, limit))
            .or_raise(py)?;
        Ok((
            records::list(py, page.queues.iter().map(records_of::registered_queue))?,
            page.total,
        ))
    }

    /// The consumer pools alive on this queue, from every host and language.
    fn workers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let pools = py.detach(|| self.queue.workers()).or_raise(py)?;
        records::list(py, pools.iter().map(records_of::worker))
    }

    /// Send dead letters back, due now, with a fresh attempt budget: one, or all when
    /// `id` is None. Returns how many.
    #[pyo3(signature = (id = None))]
    fn requeue_dead(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::opt_id_arg)] id: Option<String>,
    ) -> PyResult<u64> {
        py.detach(|| self.queue.requeue_dead(id.as_deref())).or_raise(py)
    }

    /// Delete dead letters for good, payload and all: one, or all when `id` is None.
    /// Returns how many; waiting and running messages are not touched.
    #[pyo3(signature = (id = None))]
    fn delete_dead(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::opt_id_arg)] id: Option<String>,
    ) -> PyResult<u64> {
        py.detach(|| self.queue.delete_dead(id.as_deref())).or_raise(py)
    }

    /// Requeue the dead letters whose last error contains `text` (plain text). Returns
    /// how many.
    fn requeue_dead_with_error(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::text_arg)] text: String,
    ) -> PyResult<u64> {
        py.detach(|| self.queue.requeue_dead_with_error(&text)).or_raise(py)
    }

    /// Delete the dead letters whose last error contains `text` (plain text). Returns
    /// how many.
    fn delete_dead_with_error(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::text_arg)] text: String,
    ) -> PyResult<u64> {
        py.detach(|| self.queue.delete_dead_with_error(&text)).or_raise(py)
    }

    /// Define or change a repeating message: `payload` is pushed once per occurrence
    /// of `schedule` (a cron pattern, or an interval in seconds), as a message with the
    /// id "repeat:<name>:<due ms>". Returns the next occurrence's due time.
    #[pyo3(signature = (name, schedule, payload, *, tz = None, max_attempts = None, expire_after = None))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn repeat(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::name_arg)] name: String,
        schedule: &Bound<'_, PyAny>,
        payload: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = convert::tz_arg)] tz: Option<String>,
        #[pyo3(from_py_with = convert::max_attempts_arg)] max_attempts: Option<u32>,
        #[pyo3(from_py_with = convert::expire_after_arg)] expire_after: Option<f64>,
    ) -> PyResult<f64> {
        let mut options = RepeatOptions::default();
        options.max_attempts = max_attempts;
        options.expire_after = duration(py, "expire_after", expire_after)?;
        let schedule = if let Ok(pattern) = schedule.extract::<String>() {
            Schedule::cron(&pattern, tz.as_deref())
        } else {
            Schedule::every_secs(convert::seconds(py, schedule, "schedule")?, tz.as_deref())
        }
        .or_raise(py)?;
        let json = payload_to_json(payload)?;
        let due = py
            .detach(|| self.queue.repeat_json(&name, &schedule, json, &options))
            .or_raise(py)?;
        Ok(ms_to_secs(due))
    }

    /// Stop a repeating message; its waiting occurrence is cancelled. False if there
    /// was none of that name.
    fn unrepeat(&self, py: Python<'_>, #[pyo3(from_py_with = convert::name_arg)] name: String) -> PyResult<bool> {
        py.detach(|| self.queue.unrepeat(&name)).or_raise(py)
    }

    /// The repeating messages, by name.
    fn repeats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let repeats = py.detach(|| self.queue.repeats()).or_raise(py)?;
        records::list(py, repeats.iter().map(records_of::repeat))
    }

    /// Stop consumption for every worker pool, on every host, until `resume()`: no
    /// handler starts a new message (beyond the about 50 ms of work a pool had
    /// prefetched); running handlers finish as usual and pushes are still accepted.
    /// Returns False if the queue was paused already.
    fn pause(&self, py: Python<'_>) -> PyResult<bool> {
        py.detach(|| self.queue.pause()).or_raise(py)
    }

    /// Undo `pause()`; idle worker pools start at once. Returns False if the queue
    /// was not paused.
    fn resume(&self, py: Python<'_>) -> PyResult<bool> {
        py.detach(|| self.queue.resume()).or_raise(py)
    }

    /// Whether `pause()` is in force.
    fn is_paused(&self, py: Python<'_>) -> PyResult<bool> {
        py.detach(|| self.queue.is_paused()).or_raise(py)
    }

    /// Hand out at most `max` messages in any window of `per` seconds, over every
    /// worker pool on every host and in every language (see the stub for more).
    #[pyo3(signature = (max, per = 1.0))]
    fn set_rate_limit(
        &self,
        py: Python<'_>,
        max: i64,
        #[pyo3(from_py_with = convert::per_arg)] per: f64,
    ) -> PyResult<()> {
        let max = u32::try_from(max)
            .map_err(|_| errors::invalid(py, format!("max must be from 1 to {}, got {max}", u32::MAX)))?;
        let limit = RateLimit::new(max, per).or_raise(py)?;
        py.detach(|| self.queue.set_rate_limit(limit)).or_raise(py)
    }

    /// Lift the rate limit; pools it held back start at once. False if none was set.
    fn clear_rate_limit(&self, py: Python<'_>) -> PyResult<bool> {
        py.detach(|| self.queue.clear_rate_limit()).or_raise(py)
    }

    /// Limit `group`'s messages, or with None every group without limits of its own;
    /// neither `concurrency` nor `max` clears them (see the stub).
    #[pyo3(signature = (group, *, concurrency = None, max = None, per = None))]
    fn set_group_limit(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::group_arg)] group: Option<String>,
        #[pyo3(from_py_with = convert::concurrency_arg)] concurrency: Option<i64>,
        #[pyo3(from_py_with = convert::opt_max_arg)] max: Option<i64>,
        #[pyo3(from_py_with = convert::opt_per_arg)] per: Option<f64>,
    ) -> PyResult<bool> {
        let limit = GroupLimit::from_args(concurrency, max, per).or_raise(py)?;
        py.detach(|| self.queue.set_group_limit(group.as_deref(), limit))
            .or_raise(py)
    }

    /// The rate limit in force, as `{"max": int, "per": float}`, or None.
    fn rate_limit<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let limit = py.detach(|| self.queue.rate_limit()).or_raise(py)?;
        limit.map(|l| records::dict(py, records_of::rate_limit(&l))).transpose()
    }

    /// Ask every worker pool running on this queue to stop gracefully (see the stub).
    fn restart_workers(&self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| self.queue.restart_workers()).or_raise(py)
    }

    /// The `ACL SETUSER` line that grants `user` exactly this queue (see the stub).
    #[pyo3(signature = (user, *, preloaded_scripts = false, functions = false))]
    fn acl_rule(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::user_arg)] user: String,
        preloaded_scripts: bool,
        functions: bool,
    ) -> PyResult<String> {
        if user.is_empty() {
            return Err(errors::invalid(py, "user must not be empty"));
        }
        let rights = match (preloaded_scripts, functions) {
            (false, false) => ScriptRights::Load,
            (true, false) => ScriptRights::Preloaded,
            (false, true) => ScriptRights::Functions,
            (true, true) => {
                return Err(errors::invalid(
                    py,
                    "preloaded_scripts and functions are two ways to run the scripts: give one",
                ));
            }
        };
        Ok(py.detach(|| self.queue.acl_rule_for(&user, rights)))
    }

    /// Load every script of delayq on the server, as an admin (see the stub).
    fn load_scripts(&self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| self.queue.load_scripts()).or_raise(py)
    }

    /// Install this build's library of functions, as an admin (see the stub).
    fn install_functions(&self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| self.queue.install_functions()).or_raise(py)
    }

    /// Move every waiting message to the queue `to` (see the stub); returns how many.
    fn move_waiting(&self, py: Python<'_>, to: &Bound<'_, PyQueue>) -> PyResult<u64> {
        let to = to.get().queue.clone();
        py.detach(|| self.queue.move_waiting(&to)).or_raise(py)
    }

    /// Delete every message in every state; returns how many. A message that a worker
    /// holds already (running or prefetched) may still reach its handler.
    fn purge(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| self.queue.purge()).or_raise(py)
    }

    /// Check that Redis answers.
    fn ping(&self, py: Python<'_>) -> PyResult<bool> {
        py.detach(|| self.queue.ping()).or_raise(py)?;
        Ok(true)
    }

    /// The queue's name.
    #[getter]
    fn name(&self) -> &str {
        self.queue.name()
    }

    fn __repr__(&self) -> String {
        format!("DelayQueue(url={:?}, queue={:?})", self.queue.url(), self.queue.name())
    }
}

/// The options of a queue but those of its connection, as given to Python.
struct QueueValues<'a> {
    prefix: &'a str,
    layout: &'a str,
    zset_key: Option<String>,
    payload_key: Option<String>,
    max_payload_bytes: i64,
    partitions: i64,
    wait_replicas: i64,
    wait_timeout: f64,
    dead_max: i64,
    dead_ttl: f64,
    keep_completed: i64,
    keep_completed_for: f64,
}

fn queue_values(v: QueueValues<'_>) -> Vec<(&'static str, delayq::options::Value)> {
    use delayq::options::Value::{Count, Seconds, Text};
    let mut values = vec![
        ("prefix", Text(v.prefix.to_owned())),
        ("layout", Text(v.layout.to_owned())),
        ("max_payload_bytes", Count(v.max_payload_bytes)),
        ("partitions", Count(v.partitions)),
        ("wait_replicas", Count(v.wait_replicas)),
        ("wait_timeout", Seconds(v.wait_timeout)),
        ("dead_max", Count(v.dead_max)),
        ("dead_ttl", Seconds(v.dead_ttl)),
        ("keep_completed", Count(v.keep_completed)),
        ("keep_completed_for", Seconds(v.keep_completed_for)),
    ];
    values.extend(v.zset_key.map(|k| ("zset_key", Text(k))));
    values.extend(v.payload_key.map(|k| ("payload_key", Text(k))));
    values
}

impl PyQueue {
    fn listing<'py>(
        &self,
        py: Python<'py>,
        which: Listing,
        start: usize,
        limit: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        let listed = py.detach(|| self.queue.list_page(which, start, limit)).or_raise(py)?;
        message_list(py, listed)
    }
}

fn message_list(py: Python<'_>, infos: Vec<MessageInfo>) -> PyResult<Bound<'_, PyList>> {
    records::list(py, infos.iter().map(records_of::message))
}
