//! The scripts of repeating messages: repeat_set.lua defines one and pushes its first
//! occurrence, repeat_next.lua pushes a next one once, repeat_del.lua removes one,
//! repeats.lua lists them.

use redis::{FromRedisValue, ParsingError, Value};

use super::replies::optional_ms;
use super::{Invocation, LuaScript, decode, decode_list};

/// An occurrence to push (repeat_set.lua, repeat_next.lua). repeat_set replies the
/// due time (ms) of the next occurrence, repeat_next a `replies::Flag` (pushed).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Occurrence<'a> {
    pub(crate) name: &'a str,
    /// The definition it was computed from, compared whole.
    pub(crate) definition: &'a str,
    pub(crate) due_ms: i64,
    pub(crate) envelope: &'a str,
}

impl Occurrence<'_> {
    pub(crate) fn add_to(&self, inv: &mut Invocation<'_>) {
        inv.arg(self.name)
            .arg(self.definition)
            .arg(self.due_ms)
            .arg(self.envelope);
    }
}

/// repeat_del.lua and repeats.lua: one repeat by name, or ("") all of them.
/// repeat_del replies a `replies::Flag` (it existed), repeats a `Definitions`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Named<'a> {
    pub(crate) name: &'a str,
}

impl Named<'_> {
    pub(crate) fn add_to(&self, inv: &mut Invocation<'_>) {
        inv.arg(self.name);
    }
}

/// One stored repeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Definition {
    pub(crate) name: String,
    pub(crate) definition: String,
    /// Due time (ms) of its latest occurrence pushed.
    pub(crate) mark: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Definitions(pub(crate) Vec<Definition>);

impl FromRedisValue for Definitions {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let items = decode_list(v, "the reply")?;
        if !items.len().is_multiple_of(3) {
            return Err(format!("{} values, not groups of 3", items.len()).into());
        }
        items
            .chunks_exact(3)
            .map(|c| {
                Ok(Definition {
                    name: decode(&c[0])?,
                    definition: decode(&c[1])?,
                    mark: optional_ms(&c[2])?,
                })
            })
            .collect::<Result<_, ParsingError>>()
            .map(Self)
    }
}

/// The scripts.
pub(crate) fn set() -> &'static LuaScript {
    &super::REPEAT_SET
}
pub(crate) fn next() -> &'static LuaScript {
    &super::REPEAT_NEXT
}
pub(crate) fn delete() -> &'static LuaScript {
    &super::REPEAT_DEL
}
pub(crate) fn list() -> &'static LuaScript {
    &super::REPEATS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_decode() {
        let v = Value::Array(vec![
            Value::BulkString(b"h".to_vec()),
            Value::BulkString(b"{}".to_vec()),
            Value::Int(-1),
        ]);
        let d = Definitions::from_redis_value(v).expect("decodes").0;
        assert_eq!((d[0].name.as_str(), d[0].mark), ("h", None));
        assert!(Definitions::from_redis_value(Value::Array(vec![Value::Int(1)])).is_err());
        // redis-rs reads a nil as an empty list: not here.
        assert!(Definitions::from_redis_value(Value::Nil).is_err());
    }
}
