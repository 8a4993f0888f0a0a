//! push.lua's contract (push_replace.lua's and push_one.lua's too): one or many
//! messages scheduled in one call, idempotent per id.

use redis::{FromRedisValue, ParsingError, Value};

use super::{Invocation, LuaScript, decode, decode_unsigned};
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
    /// The native layout's envelope without its opening brace (see `envelope::body`):
    /// the script writes the brace with the stamp in one string; whole when `stamped`;
    /// the seed layout's bare payload whole.
    pub(crate) envelope: &'a str,
    pub(crate) serial_key: Option<&'a str>,
    /// Its id is one that delayq made for this push: ids made by one process increase
    /// in the order they were made.
    pub(crate) generated_id: bool,
    /// The envelope carries the stamp of its due time's first place, written by the
    /// client (`envelope::encode`): for a generated id due `Due::AtUnixMs` only.
    pub(crate) stamped: bool,
}

/// One push call.
#[derive(Debug, Clone)]
pub(crate) struct Args<'a> {
    /// Look each id up: the caller chose it, or this may be a resend. `false` only for
    /// ids delayq generated for this first send, which cannot exist yet.
    pub(crate) check_existing: bool,
    /// The queue has the native layout (envelopes, not the recipe's bare payloads).
    pub(crate) native: bool,
    pub(crate) messages: Vec<Message<'a>>,
}

impl Message<'_> {
    /// Its run's options (see push.lua), as flags: one bit a word of `WORDS`.
    fn flags(&self) -> u8 {
        u8::from(self.replace)
            | u8::from(self.expires) << 1
            | u8::from(self.serial_key.is_some()) << 2
            | u8::from(self.generated_id) << 3
            | u8::from(self.stamped) << 4
    }

    /// What a message shares with the others of its run.
    fn run_key(&self) -> (&'static str, i64, u8) {
        let (timing, ms) = self.due.script_args();
        (timing, ms, self.flags())
    }
}

/// The options words, in the order of `Message::flags`' bits.
const WORDS: [&str; 5] = ["replace", "expires", "keyed", "ordered", "stamped"];

/// The options of a run, as push.lua reads them.
fn options(flags: u8) -> String {
    let words: Vec<&str> = WORDS
        .iter()
        .enumerate()
        .filter(|(bit, _)| flags & (1 << bit) != 0)
        .map(|(_, w)| *w)
        .collect();
    words.join(" ")
}

impl Args<'_> {
    /// The messages as runs of those that share their timing and options: a batch
    /// pushed alike sends two words a message, not six, and its run of generated ids
    /// takes one score.
    pub(crate) fn add_to(&self, inv: &mut Invocation<'_>) {
        if let Some(m) = self.one() {
            let (timing, ms) = m.due.script_args();
            inv.arg(timing).arg(ms).arg(m.id).arg(m.envelope);
            return;
        }
        inv.arg(if self.check_existing { "check" } else { "new" });
        for run in self.messages.chunk_by(|a, b| a.run_key() == b.run_key()) {
            let (timing, ms, flags) = run[0].run_key();
            inv.arg(run.len()).arg(timing).arg(ms).arg(options(flags));
            for m in run {
                inv.arg(m.id).arg(m.envelope);
                if let Some(key) = m.serial_key {
                    inv.arg(key);
                }
            }
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

impl Args<'_> {
    /// The script for these messages: push_one.lua for a single message it takes,
    /// else see `script_for`.
    pub(crate) fn script(&self) -> &'static LuaScript {
        if self.one().is_some() {
            return &super::PUSH_ONE;
        }
        script_for(self.messages.iter().any(|m| m.replace))
    }

    /// The message, when the call is one that push_one.lua takes.
    fn one(&self) -> Option<&Message<'_>> {
        match self.messages.as_slice() {
            [m] if self.native && !m.replace && !m.expires && m.serial_key.is_none() && !m.stamped => Some(m),
            _ => None,
        }
    }
}

/// push_replace.lua for a call where a message replaces, which takes the keys a
/// replaced message leaves; push.lua, with 5 keys, otherwise.
pub(crate) fn script_for(replacing: bool) -> &'static LuaScript {
    if replacing { &super::PUSH_REPLACE } else { &super::PUSH }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_replacing_message_takes_the_batch_to_push_replace() {
        let m = |replace| Message {
            id: "a",
            due: Due::In(Duration::from_millis(5)),
            replace,
            expires: false,
            envelope: "{}",
            serial_key: None,
            generated_id: false,
            stamped: false,
        };
        let args = |messages| Args {
            check_existing: true,
            native: true,
            messages,
        };
        assert_eq!(args(vec![m(false), m(false)]).script().name, "push");
        assert_eq!(args(vec![m(false)]).script().name, "push_one");
        assert_eq!(args(vec![m(true)]).script().name, "push_replace");
        assert_eq!(args(vec![m(false), m(true)]).script().name, "push_replace");
        assert_eq!(super::super::PUSH.keys.len(), 5);
    }

    #[test]
    fn options_are_named_words() {
        let mut m = Message {
            id: "a",
            due: Due::In(Duration::from_millis(5)),
            replace: true,
            expires: true,
            envelope: "{}",
            serial_key: None,
            generated_id: false,
            stamped: false,
        };
        assert_eq!(options(m.flags()), "replace expires");
        m.replace = false;
        assert_eq!(options(m.flags()), "expires");
        m.serial_key = Some("order-1");
        m.generated_id = true;
        assert_eq!(options(m.flags()), "expires keyed ordered");
        m.stamped = true;
        assert_eq!(options(m.flags()), "expires keyed ordered stamped");
        m.expires = false;
        m.serial_key = None;
        m.generated_id = false;
        m.stamped = false;
        assert_eq!(options(m.flags()), "");
    }

    #[test]
    fn messages_alike_share_a_run() {
        let m = |id, ms, key| Message {
            id,
            due: Due::In(Duration::from_millis(ms)),
            replace: false,
            expires: false,
            envelope: "{}",
            serial_key: key,
            generated_id: id != "e",
            stamped: false,
        };
        let args = Args {
            check_existing: false,
            native: true,
            messages: vec![
                m("a", 5, None),
                m("b", 5, None),
                m("c", 9, None),
                m("d", 9, Some("k")),
                m("e", 9, Some("k")),
            ],
        };
        assert_eq!(
            crate::scripts::sent_args(|inv| args.add_to(inv)),
            [
                "new",
                "2",
                "delay",
                "5",
                "ordered",
                "a",
                "{}",
                "b",
                "{}",
                "1",
                "delay",
                "9",
                "ordered",
                "c",
                "{}",
                "1",
                "delay",
                "9",
                "keyed ordered",
                "d",
                "{}",
                "k",
                "1",
                "delay",
                "9",
                "keyed",
                "e",
                "{}",
                "k"
            ]
        );
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
