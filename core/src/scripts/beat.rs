//! beat.lua's contract: a pool says it is alive for `ttl_ms` more, or (0) that it
//! stopped; the reply is how many pools are alive.

use redis::{FromRedisValue, ParsingError, Value};

use super::{Call, Invocation, LuaScript, decode_unsigned};

#[derive(Debug, Clone, Copy)]
pub(crate) struct Args<'a> {
    pub(crate) pool_id: &'a str,
    pub(crate) ttl_ms: u64,
    /// The pool's info JSON ("" when leaving).
    pub(crate) info: &'a str,
}

impl Call for Args<'_> {
    type Reply = Alive;

    fn script(&self) -> &'static LuaScript {
        script()
    }

    fn add_to(&self, inv: &mut Invocation<'_>) {
        inv.arg(self.pool_id).arg(self.ttl_ms).arg(self.info);
    }
}

/// Pools alive after the beat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Alive(pub(crate) u64);

impl FromRedisValue for Alive {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        decode_unsigned(&v).map(Self)
    }
}

/// The script.
pub(crate) fn script() -> &'static LuaScript {
    &super::BEAT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_of_live_pools_decodes() {
        assert_eq!(Alive::from_redis_value(Value::Int(2)).expect("decodes"), Alive(2));
        assert!(Alive::from_redis_value(Value::Int(-1)).is_err());
        assert!(Alive::from_redis_value(Value::Nil).is_err());
    }
}
