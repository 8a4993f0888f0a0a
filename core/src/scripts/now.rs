//! now.lua's contract: the queue clock in ms, read without writing.

use redis::{FromRedisValue, ParsingError, Value};

use super::{Call, Invocation, LuaScript, decode};

/// No arguments: the clock of the queue the call is made on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Args;

impl Call for Args {
    type Reply = NowMs;

    fn script(&self) -> &'static LuaScript {
        &super::NOW
    }

    fn add_to(&self, _inv: &mut Invocation<'_>) {}
}

/// The queue clock's reading (Unix ms, see include/clock.lua).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NowMs(pub(crate) i64);

impl FromRedisValue for NowMs {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let ms: i64 = decode(&v)?;
        if ms < 0 {
            return Err(format!("{ms} where a clock reading was due").into());
        }
        Ok(Self(ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reading_decodes_or_is_refused() {
        assert_eq!(
            NowMs::from_redis_value(Value::Int(1_764_460_800_123)).expect("decodes"),
            NowMs(1_764_460_800_123)
        );
        assert!(NowMs::from_redis_value(Value::Int(-1)).is_err());
        assert!(NowMs::from_redis_value(Value::Nil).is_err());
    }
}
