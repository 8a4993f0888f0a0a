//! The read-only scripts that show a queue: get.lua, list.lua, find.lua, stats.lua and
//! workers.lua. Their replies decode here; queue.rs turns them into the public types.

use redis::{FromRedisValue, ParsingError, Value};

use super::replies::{optional_ms, optional_text, stored_or_size};
use super::{Invocation, LuaScript, decode, decode_list, decode_unsigned};
use crate::queue::State;

/// What a script knows of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) state: State,
    /// As stored: an envelope, or the seed layout's bare payload; "" when left out.
    pub(crate) stored: String,
    /// The stored size in bytes, when it was past the bound and left out.
    pub(crate) omitted_bytes: Option<u64>,
    pub(crate) due_ms: Option<i64>,
    /// Deliveries so far, the running one included.
    pub(crate) attempts: u32,
    pub(crate) last_error: Option<String>,
    pub(crate) dead_at_ms: Option<i64>,
    pub(crate) lease_until_ms: Option<i64>,
    pub(crate) completed_at_ms: Option<i64>,
    pub(crate) error_trace: Option<String>,
    pub(crate) serial_key: Option<String>,
    pub(crate) group: Option<String>,
    /// Why a waiting message in its key's or group's line waits (get.lua only).
    pub(crate) held: Option<Held>,
}

/// Why a message waits in its serial key's or group's line (get.lua).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Held {
    /// Its serial key runs another message (its id, when known).
    Serial(Option<String>),
    /// Its group runs `running` of `limit`.
    Concurrency { running: u64, limit: u64 },
    /// Its group started `used` in its window, of `max` per `per_ms`.
    Rate { used: u64, max: u64, per_ms: u64 },
    /// A place freed: it is due again.
    Line,
}

impl Held {
    fn decode(v: &Value) -> Result<Option<Self>, ParsingError> {
        if matches!(v, Value::Nil | Value::Boolean(false)) {
            return Ok(None);
        }
        let items = decode_list(v.clone(), "held")?;
        let kind: String = items.first().map(decode).transpose()?.unwrap_or_default();
        let n = |i: usize| {
            items
                .get(i)
                .map(decode_unsigned)
                .transpose()?
                .ok_or_else(|| ParsingError::from("held: a number is missing"))
        };
        Ok(Some(match kind.as_str() {
            "serial" => Self::Serial(items.get(1).map(optional_text).transpose()?.flatten()),
            "concurrency" => Self::Concurrency {
                running: n(1)?,
                limit: n(2)?,
            },
            "rate" => Self::Rate {
                used: n(1)?,
                max: n(2)?,
                per_ms: n(3)?,
            },
            "line" => Self::Line,
            other => return Err(format!("held {other:?}").into()),
        }))
    }
}

fn state(v: &Value) -> Result<State, ParsingError> {
    match decode::<String>(v)?.as_str() {
        "scheduled" => Ok(State::Scheduled),
        "ready" => Ok(State::Ready),
        "inflight" => Ok(State::Inflight),
        "dead" => Ok(State::Dead),
        "completed" => Ok(State::Completed),
        other => Err(format!("state {other:?}").into()),
    }
}

/// `[state, stored, due, attempts, error, dead_at, lease_until, completed, trace, serial]`
/// with `dead_at` absent from list.lua's groups.
fn record(v: &[Value], dead_at: Option<&Value>) -> Result<Record, ParsingError> {
    let [
        state_v,
        stored,
        due,
        attempts,
        error,
        lease_until,
        completed,
        trace,
        serial,
    ] = v
    else {
        return Err(format!("{} fields where 9 were due", v.len()).into());
    };
    let (stored, omitted_bytes) = stored_or_size(stored)?;
    Ok(Record {
        state: state(state_v)?,
        stored,
        omitted_bytes,
        due_ms: optional_ms(due)?,
        attempts: decode_unsigned(attempts)?,
        last_error: optional_text(error)?,
        dead_at_ms: dead_at.map(optional_ms).transpose()?.flatten(),
        lease_until_ms: optional_ms(lease_until)?,
        completed_at_ms: optional_ms(completed)?,
        error_trace: optional_text(trace)?,
        serial_key: None,
        group: None,
        held: None,
    }
    .with_line_key(optional_text(serial)?))
}

impl Record {
    fn with_line_key(mut self, stored: Option<String>) -> Self {
        if let Some(stored) = stored {
            (self.serial_key, self.group) = crate::lines::decode(stored);
        }
        self
    }
}

/// How much of each message get.lua, list.lua and dead.lua send (include/shown.lua):
/// an envelope larger than `envelope` bytes is sent as its size, an error or a trace
/// longer than its bound keeps its start and its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds {
    pub(crate) envelope: usize,
    pub(crate) error: usize,
    pub(crate) trace: usize,
}

impl Bounds {
    /// Everything whole, as `get` shows one message.
    pub(crate) const WHOLE: Self = Self {
        envelope: usize::MAX,
        error: usize::MAX,
        trace: usize::MAX,
    };

    pub(crate) fn add_to(&self, inv: &mut Invocation<'_>) {
        // Lua reads them as doubles: `usize::MAX` stays past any stored size.
        inv.arg(self.envelope).arg(self.error).arg(self.trace);
    }
}

/// get.lua: `id` of the message, and how much of it to send.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Get<'a> {
    pub(crate) id: &'a str,
    pub(crate) bounds: Bounds,
}

impl Get<'_> {
    pub(crate) fn add_to(&self, inv: &mut Invocation<'_>) {
        inv.arg(self.id);
        self.bounds.add_to(inv);
    }
}

/// The message, or `None` for an unknown id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found(pub(crate) Option<Record>);

impl FromRedisValue for Found {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        if v == Value::Nil {
            return Ok(Self(None));
        }
        let items = decode_list(v, "the reply")?;
        let [state, stored, due, attempts, error, dead_at, rest @ ..] = items.as_slice() else {
            return Err(format!("{} fields where 10 or 11 were due", items.len()).into());
        };
        // A waiting message's reply ends with why it waits.
        let (rest, held) = match rest {
            [rest @ .., held] if rest.len() == 4 => (rest, Held::decode(held)?),
            rest => (rest, None),
        };
        let mut fields = vec![
            state.clone(),
            stored.clone(),
            due.clone(),
            attempts.clone(),
            error.clone(),
        ];
        fields.extend_from_slice(rest);
        let record = record(&fields, Some(dead_at))?;
        Ok(Self(Some(Record { held, ..record })))
    }
}

/// list.lua: the first `limit` messages of one state.
#[derive(Debug, Clone, Copy)]
pub(crate) struct List<'a> {
    /// "waiting", "inflight" or "completed".
    pub(crate) which: &'a str,
    pub(crate) limit: usize,
    /// How many to skip first.
    pub(crate) start: usize,
    pub(crate) bounds: Bounds,
}

impl List<'_> {
    pub(crate) fn add_to(&self, inv: &mut Invocation<'_>) {
        inv.arg(self.which).arg(self.limit).arg(self.start);
        self.bounds.add_to(inv);
    }
}

/// (id, record) of each message listed, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed(pub(crate) Vec<(String, Record)>);

impl FromRedisValue for Listed {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let items = decode_list(v, "the reply")?;
        let Some((_now, groups)) = items.split_first() else {
            return Err("an empty reply".into());
        };
        if !groups.len().is_multiple_of(11) {
            return Err(format!("{} values, not groups of 11", groups.len()).into());
        }
        groups
            .chunks_exact(11)
            .map(|g| {
                let held = Held::decode(&g[10])?;
                Ok((
                    decode(&g[0])?,
                    Record {
                        held,
                        ..record(&g[1..10], None)?
                    },
                ))
            })
            .collect::<Result<_, ParsingError>>()
            .map(Self)
    }
}

/// find.lua: one HSCAN step over the messages ("messages") or the kept completed ones
/// ("completed"), for those whose id or stored text contains `text`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Find<'a> {
    pub(crate) which: &'a str,
    pub(crate) cursor: &'a str,
    pub(crate) text: &'a str,
    pub(crate) count: usize,
}

impl Find<'_> {
    pub(crate) fn add_to(&self, inv: &mut Invocation<'_>) {
        inv.arg(self.which).arg(self.cursor).arg(self.text).arg(self.count);
    }
}

/// The next cursor ("0" when done) and the ids that matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FindStep {
    pub(crate) cursor: String,
    pub(crate) ids: Vec<String>,
}

impl FromRedisValue for FindStep {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let items = decode_list(v, "the reply")?;
        let Some((cursor, ids)) = items.split_first() else {
            return Err("an empty reply".into());
        };
        Ok(Self {
            cursor: decode(cursor)?,
            ids: ids.iter().map(decode).collect::<Result<_, _>>()?,
        })
    }
}

/// What stats.lua counts on one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Depth {
    /// Every scheduled entry, due or not.
    pub(crate) waiting: u64,
    pub(crate) ready: u64,
    pub(crate) inflight: u64,
    pub(crate) dead: u64,
    pub(crate) next_due_ms: Option<i64>,
    pub(crate) paused_at_ms: Option<i64>,
    /// The rate limit's (queue-wide max, per ms), when one is in force.
    pub(crate) rate_limit: Option<(u64, u64)>,
    pub(crate) completed: u64,
    pub(crate) held: u64,
    pub(crate) counters: Vec<(String, u64)>,
}

impl FromRedisValue for Depth {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let items = decode_list(v, "the reply")?;
        let [
            _now,
            waiting,
            ready,
            inflight,
            dead,
            next,
            paused,
            max,
            per,
            completed,
            held,
            counters @ ..,
        ] = items.as_slice()
        else {
            return Err(format!("{} values where at least 11 were due", items.len()).into());
        };
        if !counters.len().is_multiple_of(2) {
            return Err("a counter without its value".into());
        }
        let (max, per): (i64, i64) = (decode(max)?, decode(per)?);
        Ok(Self {
            waiting: decode_unsigned(waiting)?,
            ready: decode_unsigned(ready)?,
            inflight: decode_unsigned(inflight)?,
            dead: decode_unsigned(dead)?,
            next_due_ms: optional_ms(next)?,
            paused_at_ms: optional_ms(paused)?,
            rate_limit: (max > 0 && per > 0).then(|| (max.unsigned_abs(), per.unsigned_abs())),
            completed: decode_unsigned(completed)?,
            held: decode_unsigned(held)?,
            counters: counters
                .chunks_exact(2)
                .map(|c| Ok((decode(&c[0])?, decode_unsigned(&c[1])?)))
                .collect::<Result<_, ParsingError>>()?,
        })
    }
}

/// workers.lua: the Redis time and each registered pool's entry, as beat.lua stored it
/// ("<expires_ms>|<seen_ms>|<info JSON>"), expired ones included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pools {
    pub(crate) now_ms: i64,
    pub(crate) entries: Vec<(String, String)>,
}

impl FromRedisValue for Pools {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let items = decode_list(v, "the reply")?;
        let Some((now, entries)) = items.split_first() else {
            return Err("an empty reply".into());
        };
        if !entries.len().is_multiple_of(2) {
            return Err("a pool without its entry".into());
        }
        Ok(Self {
            now_ms: decode(now)?,
            entries: entries
                .chunks_exact(2)
                .map(|c| Ok((decode(&c[0])?, decode(&c[1])?)))
                .collect::<Result<_, ParsingError>>()?,
        })
    }
}

/// The scripts.
pub(crate) fn get() -> &'static LuaScript {
    &super::GET
}
pub(crate) fn list() -> &'static LuaScript {
    &super::LIST
}
pub(crate) fn find() -> &'static LuaScript {
    &super::FIND
}
pub(crate) fn stats() -> &'static LuaScript {
    &super::STATS
}
pub(crate) fn workers() -> &'static LuaScript {
    &super::WORKERS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: &str) -> Value {
        Value::BulkString(x.as_bytes().to_vec())
    }

    #[test]
    fn a_message_decodes_and_an_unknown_state_is_refused() {
        let fields = |state: &str| {
            Value::Array(vec![
                s(state),
                s("{}"),
                Value::Int(5),
                Value::Int(1),
                Value::Nil,
                Value::Int(-1),
                Value::Int(-1),
                Value::Int(-1),
                Value::Nil,
                s("k"),
            ])
        };
        let r = Found::from_redis_value(fields("ready"))
            .expect("decodes")
            .0
            .expect("found");
        assert_eq!(
            (r.state, r.due_ms, r.attempts, r.dead_at_ms),
            (State::Ready, Some(5), 1, None)
        );
        assert_eq!(r.serial_key.as_deref(), Some("k"));
        assert_eq!(Found::from_redis_value(Value::Nil).expect("decodes").0, None);
        assert!(Found::from_redis_value(fields("lost")).is_err());
        assert!(Found::from_redis_value(Value::Array(vec![s("ready")])).is_err());
    }

    #[test]
    fn stats_decode_with_their_counters() {
        let mut v = vec![Value::Int(1); 5];
        v.extend([
            Value::Int(-1),
            Value::Int(-1),
            Value::Int(10),
            Value::Int(1000),
            Value::Int(0),
            Value::Int(0),
        ]);
        v.extend([s("pushed"), s("7")]);
        let d = Depth::from_redis_value(Value::Array(v.clone())).expect("decodes");
        assert_eq!(
            (d.rate_limit, d.counters.clone()),
            (Some((10, 1000)), vec![("pushed".to_owned(), 7)])
        );
        v.push(s("acked"));
        assert!(Depth::from_redis_value(Value::Array(v)).is_err());
    }

    #[test]
    fn listings_and_steps_decode() {
        let group = [
            s("a"),
            s("inflight"),
            s("{}"),
            Value::Int(5),
            Value::Int(1),
            Value::Nil,
            Value::Int(9),
            Value::Int(-1),
            Value::Nil,
            Value::Nil,
            Value::Array(vec![s("concurrency"), Value::Int(3), Value::Int(3)]),
        ];
        let mut v = vec![Value::Int(1)];
        v.extend(group.iter().cloned());
        let listed = Listed::from_redis_value(Value::Array(v.clone())).expect("decodes").0;
        assert_eq!((listed[0].0.as_str(), listed[0].1.lease_until_ms), ("a", Some(9)));
        assert_eq!(listed[0].1.omitted_bytes, None);
        assert_eq!(listed[0].1.held, Some(Held::Concurrency { running: 3, limit: 3 }));
        let mut big = v.clone();
        big[3] = Value::Int(20_000_000);
        let listed = Listed::from_redis_value(Value::Array(big)).expect("decodes").0;
        assert_eq!(
            (listed[0].1.stored.as_str(), listed[0].1.omitted_bytes),
            ("", Some(20_000_000))
        );
        v.pop();
        assert!(Listed::from_redis_value(Value::Array(v)).is_err());
        let step = FindStep::from_redis_value(Value::Array(vec![s("0"), s("x")])).expect("decodes");
        assert_eq!((step.cursor.as_str(), step.ids.len()), ("0", 1));
        let pools = Pools::from_redis_value(Value::Array(vec![Value::Int(3), s("p"), s("9|1|{}")])).expect("decodes");
        assert_eq!(pools.entries.len(), 1);
    }
}
