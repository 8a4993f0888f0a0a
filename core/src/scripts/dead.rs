//! The dead-letter scripts: dead.lua lists them, requeue.lua and delete_dead.lua act
//! on them, dead_matching.lua finds them by their last error.

use redis::{FromRedisValue, ParsingError, Value};

use super::inspect::Bounds;
use super::replies::{optional_text, stored_or_size};
use super::{Invocation, LuaScript, decode, decode_list, decode_unsigned};

/// dead.lua: the newest `limit` dead letters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct List {
    pub(crate) limit: usize,
    /// How many to skip first.
    pub(crate) start: usize,
    pub(crate) bounds: Bounds,
}

impl List {
    pub(crate) fn add_to(&self, inv: &mut Invocation<'_>) {
        inv.arg(self.limit).arg(self.start);
        self.bounds.add_to(inv);
    }
}

/// One dead letter as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) id: String,
    pub(crate) dead_at_ms: i64,
    /// "" when left out (see `omitted_bytes`).
    pub(crate) stored: String,
    /// The stored size in bytes, when it was past the bound and left out.
    pub(crate) omitted_bytes: Option<u64>,
    pub(crate) attempts: u32,
    pub(crate) last_error: Option<String>,
    pub(crate) error_trace: Option<String>,
}

/// The dead letters listed, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rows(pub(crate) Vec<Row>);

impl FromRedisValue for Rows {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let items = decode_list(v, "the reply")?;
        if !items.len().is_multiple_of(6) {
            return Err(format!("{} values, not groups of 6", items.len()).into());
        }
        items
            .chunks_exact(6)
            .map(|c| {
                let (stored, omitted_bytes) = stored_or_size(&c[2])?;
                Ok(Row {
                    id: decode(&c[0])?,
                    dead_at_ms: decode(&c[1])?,
                    stored,
                    omitted_bytes,
                    attempts: decode_unsigned(&c[3])?,
                    last_error: optional_text(&c[4])?,
                    error_trace: optional_text(&c[5])?,
                })
            })
            .collect::<Result<_, ParsingError>>()
            .map(Self)
    }
}

/// Which dead letters requeue.lua or delete_dead.lua act on. The reply is a
/// `replies::Count`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Selection<'a> {
    One(&'a str),
    /// The oldest `n`; the caller repeats until a call acts on fewer.
    Oldest(usize),
}

impl Selection<'_> {
    pub(crate) fn add_to(&self, inv: &mut Invocation<'_>) {
        match self {
            Self::One(id) => inv.arg(*id).arg(1),
            Self::Oldest(n) => inv.arg("").arg(*n),
        };
    }
}

/// dead_matching.lua: look at `count` dead letters from rank `first` for a last error
/// containing `text`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Matching<'a> {
    pub(crate) first: u64,
    pub(crate) count: usize,
    pub(crate) text: &'a str,
}

impl Matching<'_> {
    pub(crate) fn add_to(&self, inv: &mut Invocation<'_>) {
        inv.arg(self.first).arg(self.count).arg(self.text);
    }
}

/// The next rank to look at (`None` once the set is done) and the ids that matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MatchStep {
    pub(crate) next: Option<u64>,
    pub(crate) ids: Vec<String>,
}

impl FromRedisValue for MatchStep {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let items = decode_list(v, "the reply")?;
        let Some((next, ids)) = items.split_first() else {
            return Err("an empty reply".into());
        };
        let next: i64 = decode(next)?;
        Ok(Self {
            next: u64::try_from(next).ok(),
            ids: ids.iter().map(decode).collect::<Result<_, _>>()?,
        })
    }
}

/// The scripts.
pub(crate) fn list() -> &'static LuaScript {
    &super::DEAD
}
pub(crate) fn requeue() -> &'static LuaScript {
    &super::REQUEUE
}
pub(crate) fn delete() -> &'static LuaScript {
    &super::DELETE_DEAD
}
pub(crate) fn matching() -> &'static LuaScript {
    &super::DEAD_MATCHING
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: &str) -> Value {
        Value::BulkString(x.as_bytes().to_vec())
    }

    #[test]
    fn dead_letters_decode_and_broken_groups_are_refused() {
        let row = vec![s("a"), Value::Int(9), s("{}"), Value::Int(3), s("boom"), s("")];
        let rows = Rows::from_redis_value(Value::Array(row.clone())).expect("decodes").0;
        assert_eq!(
            (
                rows[0].attempts,
                rows[0].last_error.as_deref(),
                rows[0].error_trace.clone()
            ),
            (3, Some("boom"), None)
        );
        assert!(Rows::from_redis_value(Value::Array(row[..5].to_vec())).is_err());
        let mut big = row.clone();
        big[2] = Value::Int(20_000_000);
        let rows = Rows::from_redis_value(Value::Array(big)).expect("decodes").0;
        assert_eq!((rows[0].stored.as_str(), rows[0].omitted_bytes), ("", Some(20_000_000)));
        // redis-rs reads a nil as an empty list: not here.
        assert!(Rows::from_redis_value(Value::Nil).is_err());
        assert!(MatchStep::from_redis_value(Value::Nil).is_err());
        let step = MatchStep::from_redis_value(Value::Array(vec![Value::Int(-1), s("a")])).expect("decodes");
        assert_eq!((step.next, step.ids.len()), (None, 1));
    }
}
