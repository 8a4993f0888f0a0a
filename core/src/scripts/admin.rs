//! The scripts that change a queue outside the message flow: cancel.lua,
//! reschedule.lua, pause.lua, limit.lua, restart.lua and purge.lua. Their replies are
//! the shared `replies` types, and reschedule's `Moved`.

use redis::{FromRedisValue, ParsingError, Value};

use super::{Invocation, LuaScript, decode};
use crate::time::Due;

/// cancel.lua: delete those of `ids` that still wait, counted under `counter`
/// ("cancelled", or "moved" by move_waiting), and mark those that run with `mark`
/// ("" none, "1" cancelled, "2" and killed). Reply: `replies::Ids`, those deleted or
/// marked.
#[derive(Debug, Clone)]
pub(crate) struct Cancel<'a> {
    pub(crate) counter: &'a str,
    pub(crate) mark: &'a str,
    pub(crate) ids: Vec<&'a str>,
}

impl Cancel<'_> {
    pub(crate) fn add_to(&self, inv: &mut Invocation<'_>) {
        inv.arg(self.counter).arg(self.mark);
        for id in &self.ids {
            inv.arg(*id);
        }
    }
}

/// reschedule.lua: move a waiting message to a new due time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reschedule<'a> {
    pub(crate) id: &'a str,
    pub(crate) due: Due,
}

impl Reschedule<'_> {
    pub(crate) fn add_to(&self, inv: &mut Invocation<'_>) {
        let (timing, ms) = self.due.script_args();
        inv.arg(self.id).arg(timing).arg(ms);
    }
}

/// The new due time (ms), or `None` when the message does not wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Moved(pub(crate) Option<i64>);

impl FromRedisValue for Moved {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match decode::<i64>(&v)? {
            -1 => Ok(Self(None)),
            ms if ms >= 0 => Ok(Self(Some(ms))),
            other => Err(format!("due time {other}").into()),
        }
    }
}

/// pause.lua: pause (true) or resume. Reply: `replies::Flag`, whether it changed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pause {
    pub(crate) paused: bool,
}

impl Pause {
    pub(crate) fn add_to(&self, inv: &mut Invocation<'_>) {
        inv.arg(u8::from(self.paused));
    }
}

/// limit.lua: this partition's share of the queue's rate limit, or `None` to clear
/// it. Reply: `replies::Flag`, whether a limit was in force.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limit {
    /// (this partition's share, per ms, the queue's max).
    pub(crate) set: Option<(u32, u64, u32)>,
}

impl Limit {
    pub(crate) fn add_to(&self, inv: &mut Invocation<'_>) {
        match self.set {
            Some((share, per_ms, max)) => inv.arg(share).arg(per_ms).arg(max),
            None => inv.arg("").arg("").arg(""),
        };
    }
}

/// group_limit.lua: a group's limits (its key, include/serial.lua), or the default for
/// every group; none of them clears them. Reply: `replies::Flag`, whether limits were
/// in force under that key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GroupLimit<'a> {
    pub(crate) key: &'a str,
    pub(crate) concurrency: Option<u32>,
    /// (max, per ms).
    pub(crate) rate: Option<(u32, u64)>,
}

impl GroupLimit<'_> {
    pub(crate) fn add_to(&self, inv: &mut Invocation<'_>) {
        inv.arg(self.key);
        match self.concurrency {
            Some(n) => inv.arg(n),
            None => inv.arg(""),
        };
        match self.rate {
            Some((max, per_ms)) => inv.arg(max).arg(per_ms),
            None => inv.arg("").arg(""),
        };
    }
}

/// The scripts. restart.lua takes no arguments and replies `replies::Ids` (the pools
/// alive); purge.lua none and replies `replies::Count`.
pub(crate) fn cancel() -> &'static LuaScript {
    &super::CANCEL
}
pub(crate) fn reschedule() -> &'static LuaScript {
    &super::RESCHEDULE
}
pub(crate) fn pause() -> &'static LuaScript {
    &super::PAUSE
}
pub(crate) fn limit() -> &'static LuaScript {
    &super::LIMIT
}
pub(crate) fn group_limit() -> &'static LuaScript {
    &super::GROUP_LIMIT
}
pub(crate) fn restart() -> &'static LuaScript {
    &super::RESTART
}
pub(crate) fn purge() -> &'static LuaScript {
    &super::PURGE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_move_decodes() {
        assert_eq!(Moved::from_redis_value(Value::Int(-1)).expect("decodes"), Moved(None));
        assert_eq!(Moved::from_redis_value(Value::Int(7)).expect("decodes"), Moved(Some(7)));
        assert!(Moved::from_redis_value(Value::Int(-2)).is_err());
    }
}
