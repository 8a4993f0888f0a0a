//! The read models as the bindings show them: each a record of named fields in one
//! order, times as Unix seconds, spans as seconds, counts saturated to a signed 64-bit
//! integer, payloads as JSON text for the binding to decode. PHP makes an array and
//! Python a dict of a record with one converter each, so both show the same names,
//! units and order by construction; `shapes` lists the records for the test that checks
//! the PHP stub and the `.pyi` against them.

use crate::host::{PoolSummary, StopReason};
use crate::metrics::MinuteStats;
use crate::{DeadLetter, MessageInfo, RateLimit, RegisteredQueue, RepeatInfo, Schedule, Stats, Summary, WorkerInfo};

/// One value of a record.
#[derive(Debug, Clone, PartialEq)]
pub enum Field {
    /// Not set (PHP `null`, Python `None`).
    Null,
    /// A whole number.
    Int(i64),
    /// A float: seconds, or a Unix time in seconds.
    Float(f64),
    /// Text.
    Text(String),
    /// Yes or no.
    Bool(bool),
    /// A payload as stored: shown decoded, or as its text when it is not JSON (a seed
    /// layout's producer may store anything).
    Json(String),
    /// A record inside a record.
    Record(Record),
}

/// Named fields in the order the bindings show them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Record(pub Vec<(&'static str, Field)>);

impl Record {
    fn with(mut self, name: &'static str, value: Field) -> Self {
        self.0.push((name, value));
        self
    }

    /// The names of its fields, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.0.iter().map(|(name, _)| *name).collect()
    }
}

fn count(n: u64) -> Field {
    Field::Int(i64::try_from(n).unwrap_or(i64::MAX))
}

fn at(ms: i64) -> Field {
    Field::Float(ms as f64 / 1000.0)
}

fn ms_as_secs(ms: f64) -> Field {
    Field::Float(ms / 1000.0)
}

fn text(s: &str) -> Field {
    Field::Text(s.to_owned())
}

fn or_null<T>(value: Option<T>, field: impl FnOnce(T) -> Field) -> Field {
    value.map_or(Field::Null, field)
}

/// A payload, or null when the listing left it out (`payload_omitted_bytes` then says
/// its size): "" is no JSON, and null cannot be taken for a payload that is there
/// once the record says it was left out.
fn payload(json: &str, omitted: Option<u64>) -> Field {
    match omitted {
        Some(_) => Field::Null,
        None => Field::Json(json.to_owned()),
    }
}

/// What `get` shows, and each item of the listings (`waiting`, `inflight`, `completed`).
pub fn message(m: &MessageInfo) -> Record {
    Record::default()
        .with("id", text(&m.id))
        .with("state", text(m.state.as_str()))
        .with("payload", payload(&m.payload_json, m.payload_omitted_bytes))
        .with("payload_omitted_bytes", or_null(m.payload_omitted_bytes, count))
        .with("due_at", or_null(m.due_at_ms, at))
        .with("attempts", Field::Int(i64::from(m.attempts)))
        .with("max_attempts", or_null(m.max_attempts, |n| Field::Int(i64::from(n))))
        .with("last_error", or_null(m.last_error.as_deref(), text))
        .with("error_trace", or_null(m.error_trace.as_deref(), text))
        .with("dead_at", or_null(m.dead_at_ms, at))
        .with("created_at", or_null(m.created_at_ms, at))
        .with("lease_until", or_null(m.lease_until_ms, at))
        .with("expires_at", or_null(m.expires_at_ms, at))
        .with("completed_at", or_null(m.completed_at_ms, at))
        .with("serial_key", or_null(m.serial_key.as_deref(), text))
        .with("group", or_null(m.group.as_deref(), text))
        .with("held", or_null(m.held.as_deref(), text))
        .with("cancelled", Field::Bool(m.cancelled))
}

/// A rate limit in force.
pub fn rate_limit(l: &RateLimit) -> Record {
    Record::default()
        .with("max", Field::Int(i64::from(l.max)))
        .with("per", Field::Float(l.per.as_secs_f64()))
}

/// What `stats` shows: depth by state, then the lifetime counters.
pub fn stats(s: &Stats, partitions: u32) -> Record {
    let mut r = Record::default()
        .with("scheduled", count(s.scheduled))
        .with("ready", count(s.ready))
        .with("inflight", count(s.inflight))
        .with("dead", count(s.dead))
        .with("completed", count(s.completed))
        .with("held", count(s.held))
        .with("next_due_at", or_null(s.next_due_ms, at))
        .with("paused_at", or_null(s.paused_at_ms, at))
        .with(
            "rate_limit",
            or_null(s.rate_limit.as_ref(), |l| Field::Record(rate_limit(l))),
        )
        .with("partitions", Field::Int(i64::from(partitions)));
    for (name, total) in s.named_totals() {
        r = r.with(name, count(total));
    }
    r
}

/// A pool in `workers`.
pub fn worker(w: &WorkerInfo) -> Record {
    Record::default()
        .with("id", text(&w.id))
        .with("host", text(&w.host))
        .with("pid", Field::Int(i64::from(w.pid)))
        .with("started_at", at(w.started_at_ms))
        .with("last_seen", at(w.last_seen_ms))
        .with("threads", count(w.threads as u64))
        .with("handlers", count(w.handlers as u64))
        .with("handled", count(w.handled))
        .with("acked", count(w.acked))
        .with("failed", count(w.failed))
        .with("holding", count(w.holding))
        .with("started_recently", count(w.started_recently))
        .with("lateness_avg", or_null(w.lateness_avg_ms, ms_as_secs))
        .with("lateness_max", or_null(w.lateness_max_ms, at))
        .with("handler_avg", or_null(w.handler_avg_ms, ms_as_secs))
}

/// An item of `dead_letters`.
pub fn dead_letter(d: &DeadLetter) -> Record {
    Record::default()
        .with("id", text(&d.id))
        .with("payload", payload(&d.payload_json, d.payload_omitted_bytes))
        .with("payload_omitted_bytes", or_null(d.payload_omitted_bytes, count))
        .with("attempts", Field::Int(i64::from(d.attempts)))
        .with("last_error", text(&d.last_error))
        .with("error_trace", or_null(d.error_trace.as_deref(), text))
        .with("dead_at", at(d.dead_at_ms))
}

/// An item of `minutes`.
pub fn minute(m: &MinuteStats) -> Record {
    Record::default()
        .with("at", at(m.start_ms))
        .with("handled", count(m.handled))
        .with("failed", count(m.failed))
        .with("lateness_p50", or_null(m.lateness_p50_ms, ms_as_secs))
        .with("lateness_p99", or_null(m.lateness_p99_ms, ms_as_secs))
        .with("scheduled", or_null(m.scheduled, count))
        .with("ready", or_null(m.ready, count))
        .with("inflight", or_null(m.inflight, count))
}

/// An item of `registered_queues`.
pub fn registered_queue(q: &RegisteredQueue) -> Record {
    Record::default()
        .with("name", text(&q.name))
        .with("layout", text(&q.layout))
        .with("zset_key", or_null(q.zset_key.as_deref(), text))
        .with("payload_key", or_null(q.payload_key.as_deref(), text))
        .with("partitions", Field::Int(i64::from(q.partitions)))
        .with("last_seen", at(q.last_seen_ms))
}

/// An item of `repeats`: a cron pattern with its time zone, or an interval in seconds
/// with no time zone.
pub fn repeat(r: &RepeatInfo) -> Record {
    let (schedule, tz) = match &r.schedule {
        Schedule::Cron { pattern, tz } => (text(pattern), text(tz)),
        Schedule::Every(every) => (Field::Float(every.as_secs_f64()), Field::Null),
    };
    Record::default()
        .with("name", text(&r.name))
        .with("schedule", schedule)
        .with("tz", tz)
        .with("payload", Field::Json(r.payload_json.clone()))
        .with("max_attempts", or_null(r.max_attempts, |n| Field::Int(i64::from(n))))
        .with(
            "expire_after",
            or_null(r.expire_after, |d| Field::Float(d.as_secs_f64())),
        )
        .with("next_due_at", or_null(r.next_due_ms, at))
}

/// What a worker's run returns: its counts and why it stopped, then, for a supervised
/// pool, the supervisor's counts.
pub fn summary(s: &Summary, stopped_by: Option<StopReason>, pool: Option<&PoolSummary>) -> Record {
    let mut r = Record::default();
    for (name, n) in s.counts() {
        r = r.with(name, count(n));
    }
    r = r.with("stopped_by", or_null(stopped_by, |why| text(why.as_str())));
    if let Some(pool) = pool {
        for (name, n) in pool.pool_counts() {
            r = r.with(name, count(n));
        }
    }
    r
}

/// Every record by the name the `.pyi` gives its shape, with its fields in order (a
/// field holding a record is named once; that record has its own shape). A supervised
/// PHP pool's summary is `Summary` followed by `PoolSummary`.
pub fn shapes() -> Vec<(&'static str, Vec<&'static str>)> {
    let limit = RateLimit {
        max: 1,
        per: std::time::Duration::from_secs(1),
    };
    let pool = summary(&Summary::default(), None, Some(&PoolSummary::default())).names();
    let own = summary(&Summary::default(), None, None).names();
    vec![
        ("MessageInfo", message(&samples::message()).names()),
        ("RateLimit", rate_limit(&limit).names()),
        ("Stats", stats(&Stats::default(), 1).names()),
        ("WorkerInfo", worker(&samples::worker()).names()),
        ("DeadLetter", dead_letter(&samples::dead_letter()).names()),
        ("Minute", minute(&MinuteStats::default()).names()),
        (
            "RegisteredQueue",
            registered_queue(&samples::registered_queue()).names(),
        ),
        ("Repeat", repeat(&samples::repeat()).names()),
        ("PoolSummary", pool[own.len()..].to_vec()),
        ("Summary", own),
    ]
}

/// A value of each read model, for `shapes` and the tests: the names do not depend on
/// the values.
mod samples {
    use super::*;

    pub(super) fn message() -> MessageInfo {
        MessageInfo {
            id: "m".into(),
            state: crate::State::Scheduled,
            payload_json: "{}".into(),
            payload_omitted_bytes: None,
            due_at_ms: None,
            attempts: 0,
            max_attempts: None,
            last_error: None,
            error_trace: None,
            dead_at_ms: None,
            created_at_ms: None,
            lease_until_ms: None,
            expires_at_ms: None,
            completed_at_ms: None,
            serial_key: None,
            group: None,
            held: None,
            cancelled: false,
        }
    }

    pub(super) fn worker() -> WorkerInfo {
        serde_json::from_str(r#"{"id":"h:1:1","host":"h","pid":1,"started_at_ms":0,"threads":1,"handlers":1,"handled":0,"acked":0,"failed":0,"holding":0}"#)
            .expect("a worker entry")
    }

    pub(super) fn dead_letter() -> DeadLetter {
        DeadLetter {
            id: "m".into(),
            payload_json: "{}".into(),
            payload_omitted_bytes: None,
            attempts: 1,
            last_error: "e".into(),
            error_trace: None,
            dead_at_ms: 0,
        }
    }

    pub(super) fn registered_queue() -> RegisteredQueue {
        serde_json::from_str(r#"{"name":"q","layout":"native","partitions":1}"#).expect("a registry entry")
    }

    pub(super) fn repeat() -> RepeatInfo {
        RepeatInfo {
            name: "r".into(),
            schedule: Schedule::Every(std::time::Duration::from_secs(60)),
            payload_json: "{}".into(),
            max_attempts: None,
            expire_after: None,
            next_due_ms: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_seconds_and_unset_values_are_null() {
        let mut m = samples::message();
        m.due_at_ms = Some(1_500);
        m.max_attempts = Some(3);
        let r = message(&m);
        let get = |name| r.0.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone());
        assert_eq!(get("due_at"), Some(Field::Float(1.5)));
        assert_eq!(get("max_attempts"), Some(Field::Int(3)));
        assert_eq!(get("dead_at"), Some(Field::Null));
        assert_eq!(get("state"), Some(Field::Text("scheduled".into())));
        assert_eq!(get("payload"), Some(Field::Json("{}".into())));
        assert_eq!(get("payload_omitted_bytes"), Some(Field::Null));
    }

    #[test]
    fn a_payload_left_out_is_null_with_its_size() {
        let mut m = samples::message();
        m.payload_json = String::new();
        m.payload_omitted_bytes = Some(20_000_000);
        let r = message(&m);
        let get = |name| r.0.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone());
        assert_eq!(get("payload"), Some(Field::Null));
        assert_eq!(get("payload_omitted_bytes"), Some(Field::Int(20_000_000)));
        let mut d = samples::dead_letter();
        d.payload_omitted_bytes = Some(5);
        assert_eq!(
            dead_letter(&d).0[1..3],
            [("payload", Field::Null), ("payload_omitted_bytes", Field::Int(5))]
        );
    }

    #[test]
    fn counts_past_i64_saturate() {
        let s = Stats {
            scheduled: u64::MAX,
            ..Stats::default()
        };
        assert_eq!(stats(&s, 1).0[0], ("scheduled", Field::Int(i64::MAX)));
    }

    #[test]
    fn a_schedule_is_a_pattern_with_its_zone_or_seconds_without_one() {
        let mut r = samples::repeat();
        let fields = |r: &RepeatInfo| repeat(r).0.into_iter().map(|(_, v)| v).collect::<Vec<_>>();
        assert_eq!(fields(&r)[1..3], [Field::Float(60.0), Field::Null]);
        r.schedule = Schedule::cron("0 2 * * *", Some("Asia/Shanghai")).expect("a pattern");
        assert_eq!(
            fields(&r)[1..3],
            [Field::Text("0 2 * * *".into()), Field::Text("Asia/Shanghai".into())]
        );
    }

    #[test]
    fn shapes_name_every_record_once() {
        let shapes = shapes();
        let mut names: Vec<_> = shapes.iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), shapes.len());
        let shape = |name| {
            shapes
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, f)| f.clone())
                .expect(name)
        };
        assert!(shape("Stats").contains(&"rate_limit") && shape("Stats").contains(&"died"));
        assert_eq!(shape("RateLimit"), ["max", "per"]);
        assert_eq!(shape("Summary").first(), Some(&"handled"));
        assert_eq!(shape("Summary").last(), Some(&"stopped_by"));
        assert_eq!(
            shape("PoolSummary"),
            ["processes", "restarts", "killed_hung", "scaled_up", "scaled_down"]
        );
    }
}
