//! push.lua's contract: one or many messages scheduled in one call, idempotent per id.

use redis::{FromRedisValue, ParsingError, Value};

use super::{LuaScript, decode, decode_unsigned};
use crate::time::Due;

/// One message of a push.
#[derive(Debug, Clone)]
pub(crate) struct Message<'a> {
    pub(crate) id: &'a str,
    pub(crate) due: Due,
    /// Replace a message of this id that waits or is dead.
    pub(crate) replace: bool,
    /// The envelope carries an `expire_after` deadline, which counts from the due time.
    pub(crate) expires: bool,
    pub(crate) envelope: &'a str,
    pub(crate) serial_key: Option<&'a str>,
}

/// One push call.
#[derive(Debug, Clone)]
pub(crate) struct Args<'a> {
    /// Look each id up: the caller chose it, or this may be a resend. `false` only for
    /// ids delayq generated for this first send, which cannot exist yet.
    pub(crate) check_existing: bool,
    pub(crate) messages: Vec<Message<'a>>,
}

impl Message<'_> {
    fn options(&self) -> &'static str {
        match (self.replace, self.expires) {
            (false, false) => "",
            (true, false) => "replace",
            (false, true) => "expires",
            (true, true) => "replace expires",
        }
    }
}

impl Args<'_> {
    pub(crate) fn add_to(&self, inv: &mut redis::ScriptInvocation<'_>) {
        inv.arg(if self.check_existing { "check" } else { "new" });
        for m in &self.messages {
            let (timing, ms) = m.due.script_args();
            inv.arg(m.id)
                .arg(timing)
                .arg(ms)
                .arg(m.options())
                .arg(m.envelope)
                .arg(m.serial_key.unwrap_or(""));
        }
    }
}

/// What a push returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reply {
    pub(crate) server_now_ms: i64,
    /// Messages that were new.
    pub(crate) created: u64,
    /// Messages that replaced one of the same id.
    pub(crate) replaced: u64,
}

impl FromRedisValue for Reply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let [server_now_ms, created, replaced]: [Value; 3] = FromRedisValue::from_redis_value(v)?;
        Ok(Self {
            server_now_ms: decode(&server_now_ms)?,
            created: decode_unsigned(&created)?,
            replaced: decode_unsigned(&replaced)?,
        })
    }
}

/// The script.
pub(crate) fn script() -> &'static LuaScript {
    &super::PUSH
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn options_are_named_words() {
        let mut m = Message {
            id: "a",
            due: Due::In(Duration::from_millis(5)),
            replace: true,
            expires: true,
            envelope: "{}",
            serial_key: None,
        };
        assert_eq!(m.options(), "replace expires");
        m.replace = false;
        assert_eq!(m.options(), "expires");
    }

    #[test]
    fn the_reply_decodes_or_is_refused() {
        let ok = Value::Array(vec![Value::Int(1000), Value::Int(2), Value::Int(1)]);
        assert_eq!(
            Reply::from_redis_value(ok).expect("decodes"),
            Reply {
                server_now_ms: 1000,
                created: 2,
                replaced: 1
            }
        );
        assert!(Reply::from_redis_value(Value::Array(vec![Value::Int(1)])).is_err());
        assert!(Reply::from_redis_value(Value::Array(vec![Value::Int(1), Value::Int(-1), Value::Int(0)])).is_err());
    }
}
