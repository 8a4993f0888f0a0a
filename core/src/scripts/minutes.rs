//! minutes_add.lua's and minutes.lua's contracts: a pool adds its per-minute deltas
//! (and the first call of a minute samples the backlog); the reply is the current
//! minute. A reader gets the partition's records as they are stored (see metrics.rs).

use redis::{FromRedisValue, ParsingError, Value};

use super::{Call, Invocation, LuaScript, decode, decode_list};

/// minutes_add.lua: the deltas, each as `metrics::Delta::encode` writes it.
#[derive(Debug, Clone)]
pub(crate) struct Add {
    pub(crate) keep_minutes: u32,
    pub(crate) deltas: Vec<String>,
}

impl Call for Add {
    type Reply = Minute;

    fn script(&self) -> &'static LuaScript {
        &super::MINUTES_ADD
    }

    fn add_to(&self, inv: &mut Invocation<'_>) {
        inv.arg(self.keep_minutes);
        for d in &self.deltas {
            inv.arg(d);
        }
    }
}

/// The current minute of the queue's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Minute(pub(crate) i64);

impl FromRedisValue for Minute {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        decode(&v).map(Self)
    }
}

/// minutes.lua's reply: the queue's clock and the stored minutes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Records {
    pub(crate) now_ms: i64,
    pub(crate) minutes: Vec<(i64, String)>,
}

impl FromRedisValue for Records {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let items = decode_list(v, "the reply")?;
        let Some((now, entries)) = items.split_first() else {
            return Err("an empty reply".into());
        };
        if !entries.len().is_multiple_of(2) {
            return Err("a minute without its record".into());
        }
        let mut minutes = Vec::with_capacity(entries.len() / 2);
        for pair in entries.chunks_exact(2) {
            let field: String = decode(&pair[0])?;
            // A field that is no minute is not ours to read (the writer drops it).
            if let Ok(minute) = field.parse() {
                minutes.push((minute, decode(&pair[1])?));
            }
        }
        Ok(Self {
            now_ms: decode(now)?,
            minutes,
        })
    }
}

/// The reading script.
pub(crate) fn records() -> &'static LuaScript {
    &super::MINUTES
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: &str) -> Value {
        Value::BulkString(x.as_bytes().to_vec())
    }

    #[test]
    fn records_decode_and_a_lone_field_is_refused() {
        let r = Records::from_redis_value(Value::Array(vec![
            Value::Int(120_000),
            s("2"),
            s("1 0 0 0 0"),
            s("stray"),
            s("x"),
        ]))
        .expect("decodes");
        assert_eq!(r.now_ms, 120_000);
        assert_eq!(r.minutes, vec![(2, "1 0 0 0 0".to_owned())]);
        assert!(Records::from_redis_value(Value::Array(vec![Value::Int(1), s("2")])).is_err());
        assert!(Records::from_redis_value(Value::Array(vec![])).is_err());
        assert_eq!(Minute::from_redis_value(Value::Int(7)).expect("minute"), Minute(7));
    }
}
