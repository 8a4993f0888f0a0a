//! Reply types that several scripts share: a count, a yes/no, a list of ids.

use redis::{FromRedisValue, ParsingError, Value};

use super::{decode, decode_list, decode_unsigned};

/// A count (messages requeued, deleted, released ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Count(pub(crate) u64);

impl FromRedisValue for Count {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        decode_unsigned(&v).map(Self)
    }
}

/// 1 or 0: whether something held (the state changed, a limit was in force ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flag(pub(crate) bool);

impl FromRedisValue for Flag {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match decode::<i64>(&v)? {
            1 => Ok(Self(true)),
            0 => Ok(Self(false)),
            other => Err(format!("{other} where 1 or 0 was due").into()),
        }
    }
}

/// Ids (or names), each a string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ids(pub(crate) Vec<String>);

impl FromRedisValue for Ids {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let items = decode_list(v, "the reply")?;
        items.iter().map(decode).collect::<Result<_, _>>().map(Self)
    }
}

/// A string that Lua sends as `false` (or "") when there is none.
pub(crate) fn optional_text(v: &Value) -> Result<Option<String>, ParsingError> {
    match v {
        Value::Nil | Value::Boolean(false) => Ok(None),
        other => Ok(Some(decode::<String>(other)?).filter(|s| !s.is_empty())),
    }
}

/// A stored text that a listing may send as its size instead (include/shown.lua): the
/// text, or "" and its size in bytes.
pub(crate) fn stored_or_size(v: &Value) -> Result<(String, Option<u64>), ParsingError> {
    match v {
        Value::Int(_) => Ok((String::new(), Some(decode_unsigned(v)?))),
        other => Ok((decode(other)?, None)),
    }
}

/// A time in ms that Lua sends as -1 when there is none.
pub(crate) fn optional_ms(v: &Value) -> Result<Option<i64>, ParsingError> {
    let ms: i64 = decode(v)?;
    Ok((ms >= 0).then_some(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_replies_decode_or_are_refused() {
        assert_eq!(Count::from_redis_value(Value::Int(4)).expect("count"), Count(4));
        assert!(Count::from_redis_value(Value::Int(-4)).is_err());
        assert_eq!(Flag::from_redis_value(Value::Int(1)).expect("flag"), Flag(true));
        assert!(Flag::from_redis_value(Value::Int(2)).is_err());
        let ids = Value::Array(vec![Value::BulkString(b"a".to_vec())]);
        assert_eq!(Ids::from_redis_value(ids).expect("ids").0, ["a"]);
        assert!(Ids::from_redis_value(Value::Array(vec![Value::Nil])).is_err());
        // A nil is not a list of nothing, nor is a lone string a list of one.
        assert_eq!(Ids::from_redis_value(Value::Array(vec![])).expect("none").0, [""; 0]);
        assert!(Ids::from_redis_value(Value::Nil).is_err());
        assert!(Ids::from_redis_value(Value::BulkString(b"a".to_vec())).is_err());
        assert_eq!(optional_text(&Value::Nil).expect("none"), None);
        assert_eq!(optional_text(&Value::BulkString(Vec::new())).expect("none"), None);
        assert_eq!(optional_ms(&Value::Int(-1)).expect("none"), None);
        assert_eq!(
            stored_or_size(&Value::Int(7)).expect("a size"),
            (String::new(), Some(7))
        );
        assert_eq!(
            stored_or_size(&Value::BulkString(b"{}".to_vec())).expect("a text"),
            ("{}".to_owned(), None)
        );
        assert!(stored_or_size(&Value::Int(-7)).is_err());
    }
}
