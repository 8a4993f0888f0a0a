//! claim.lua's contract: what a pool sends to take due messages under a lease, and
//! the reply it reads (the Lua's header says what each part means).

use std::sync::Arc;

use redis::{FromRedisValue, ParsingError, Value};

use super::complete::Delivery;
use super::{Call, Invocation, LuaScript, decode, decode_list, decode_unsigned};
use crate::envelope::stamp_score;
use crate::keys::lease_score;

/// One claim.
#[derive(Debug, Clone)]
pub(crate) struct Args<'a> {
    /// Most messages to take (0: only reap expired leases and report).
    pub(crate) batch: usize,
    pub(crate) lease_ms: u64,
    pub(crate) dead_max: usize,
    pub(crate) dead_ttl_ms: u64,
    /// Look for repeating messages whose chain of occurrences broke.
    pub(crate) check_repeats: bool,
    /// The pool's heartbeat, carried by the claim: (pool id, ttl ms, info JSON).
    pub(crate) heartbeat: Option<(&'a str, u64, &'a str)>,
    /// The pool's per-minute records, carried by the claim: (minutes kept, deltas as
    /// `metrics::Delta::encode` writes them).
    pub(crate) minutes: Option<(u32, &'a [String])>,
    /// Which quarantined messages the claim may take (see claim.lua).
    pub(crate) quarantine: Quarantine,
    /// Where the claim reads the envelopes (serial keys), the longest it reads: a
    /// longer one comes back as its size (`Claimed::unloaded`).
    pub(crate) most_bytes: Option<u64>,
}

/// Which quarantined messages a claim may take (claim.lua's "quarantine" section).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Quarantine {
    /// None: the pool holds a message claimed alone.
    None,
    /// A group of several.
    Groups,
    /// A group, or a message claimed alone: a handler is free to start it at once.
    Alone,
}

impl Call for Args<'_> {
    type Reply = Reply;

    fn script(&self) -> &'static LuaScript {
        script()
    }

    fn add_to(&self, inv: &mut Invocation<'_>) {
        inv.arg(self.batch)
            .arg(self.lease_ms)
            .arg(self.dead_max)
            .arg(self.dead_ttl_ms)
            .arg(u8::from(self.check_repeats));
        if let Some((id, ttl_ms, info)) = self.heartbeat {
            inv.arg("beat").arg(id).arg(ttl_ms).arg(info);
        }
        if let Some((kept, deltas)) = self.minutes {
            inv.arg("minutes").arg(kept).arg(deltas.len());
            for d in deltas {
                inv.arg(d);
            }
        }
        if let Some(most) = self.most_bytes {
            inv.arg("most").arg(most);
        }
        match self.quarantine {
            Quarantine::None => {}
            Quarantine::Groups => {
                inv.arg("quarantine").arg("groups");
            }
            Quarantine::Alone => {
                inv.arg("quarantine").arg("alone");
            }
        }
    }
}

/// One claimed message.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Claimed {
    pub(crate) id: String,
    /// The claim's token, with ":<score>" in the seed layout: sent back whole to
    /// complete the delivery. The messages of one claim share its text.
    pub(crate) lease: Arc<str>,
    /// The schedule score it was claimed at (the lease's or the stamp's): its due time.
    /// None for an envelope without a stamp (a hand edit, see `envelope::has_stamp`)
    /// or with one that does not parse (a hand edit: the message is buried).
    pub(crate) score: Option<f64>,
    /// Empty until read, when the claim left that to its caller (`Reply::unread`).
    pub(crate) envelope: String,
    /// Which delivery of the message this is (1 = its first).
    pub(crate) attempt: u32,
    pub(crate) serial_key: Option<String>,
    pub(crate) group: Option<String>,
    /// The envelope's size, when the pool left it unread: past its bound (see
    /// `WorkerOptions::max_payload_bytes`).
    pub(crate) unloaded: Option<u64>,
}

/// A repeating message with no occurrence waiting or running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BrokenRepeat {
    pub(crate) name: String,
    pub(crate) definition: String,
    /// Due time (ms) of its latest occurrence, if any.
    pub(crate) mark: Option<i64>,
}

/// What a claim returns.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reply {
    pub(crate) server_now_ms: i64,
    /// The same reading of the queue clock in microseconds, for a pool that maps due
    /// times onto its own clock.
    pub(crate) server_now_us: i64,
    /// Earliest due time or lease deadline ahead; -1 none, -2 paused.
    pub(crate) next_ms: i64,
    pub(crate) reaped: u64,
    pub(crate) rate_limited: bool,
    /// How many restart requests were made on this partition.
    pub(crate) restart_generation: u64,
    pub(crate) items: Vec<Claimed>,
    pub(crate) broken_repeats: Vec<BrokenRepeat>,
    /// The queue's current minute, when the claim carried the per-minute records.
    pub(crate) minute: Option<i64>,
    /// A quarantined message was due and not taken (see claim.lua).
    pub(crate) quarantined_left: bool,
    /// The claim left the envelopes to its caller (see claim.lua), who reads them with
    /// `envelopes_query` and `take_envelopes` before anything else looks at the items.
    pub(crate) unread: bool,
}

impl Claimed {
    /// The delivery, as completions name it.
    pub(crate) fn delivery(&self) -> Delivery<'_> {
        Delivery {
            id: &self.id,
            lease: &self.lease,
        }
    }

    fn find_score(&mut self) {
        self.score = lease_score(&self.lease).or_else(|| stamp_score(&self.envelope));
    }
}

impl Reply {
    /// The HMGET of the claimed ids' envelopes, from `messages` (the partition's key of
    /// that role), for a claim that left them unread.
    pub(crate) fn envelopes_query(&self, messages: &str) -> redis::Cmd {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(messages);
        for item in &self.items {
            cmd.arg(&item.id);
        }
        cmd
    }

    /// Gives each item its envelope from the reply of `envelopes_query`, and its
    /// score. Returns the items whose id had none, taken out of `items`: orphans, whose
    /// deliveries the caller ends (orphans.lua).
    pub(crate) fn take_envelopes(&mut self, v: Value) -> Result<Vec<Claimed>, ParsingError> {
        // Owned: each envelope's bytes become its String without a copy.
        let envelopes = decode_list(v, "the envelopes read")?
            .into_iter()
            .map(Option::<String>::from_redis_value)
            .collect::<Result<Vec<_>, _>>()?;
        if envelopes.len() != self.items.len() {
            return Err(format!(
                "{} envelopes read for the {} messages claimed",
                envelopes.len(),
                self.items.len()
            )
            .into());
        }
        let mut orphans = Vec::new();
        let items = std::mem::take(&mut self.items);
        for (mut item, envelope) in items.into_iter().zip(envelopes) {
            match envelope {
                Some(envelope) => {
                    item.envelope = envelope;
                    item.find_score();
                    self.items.push(item);
                }
                None => orphans.push(item),
            }
        }
        self.unread = false;
        Ok(orphans)
    }
}

/// The (1-based) index into the claimed messages of a `later` or `keyed` pair.
fn index(v: &Value, n: usize) -> Result<usize, ParsingError> {
    let i: usize = decode_unsigned(v)?;
    if i == 0 || i > n {
        return Err(format!("index {i} outside the {n} messages claimed").into());
    }
    Ok(i - 1)
}

/// A part of the claim's reply, as an error names it: "part 2 (ids)".
struct Part(usize);

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const NAMES: [&str; 7] = ["header", "ids", "envelopes", "later", "keyed", "repeats", "leases"];
        let name = NAMES.get(self.0).copied().unwrap_or("one too many");
        write!(f, "part {} ({name})", self.0 + 1)
    }
}

impl FromRedisValue for Reply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        // By value: each id's bytes become its String without a copy (redis-rs's
        // arrays of N decode by reference, copying every part).
        let parts = decode_list(v, "the reply")?
            .into_iter()
            .enumerate()
            .map(|(i, part)| decode_list(part, Part(i)))
            .collect::<Result<Vec<_>, _>>()?;
        let n = parts.len();
        let Ok([header, ids, envelopes, later, keyed, repeats, leases]) = <[Vec<Value>; 7]>::try_from(parts) else {
            return Err(format!("a reply of {n} parts, not 7").into());
        };
        let [now, next, reaped, limited, generation, minute, now_us, quarantined_left]: [i64; 8] =
            FromRedisValue::from_redis_value(Value::Array(header))?;
        if !(0..1000).contains(&now_us) {
            return Err(format!("{now_us} microseconds past a millisecond").into());
        }
        // Serial keys make the claim read the envelopes, so keys come with them.
        let unread = envelopes.is_empty() && !ids.is_empty();
        if (ids.len() != envelopes.len() && !unread)
            || (unread && !keyed.is_empty())
            || !later.len().is_multiple_of(2)
            || !keyed.len().is_multiple_of(2)
            || !repeats.len().is_multiple_of(3)
            || leases.is_empty() != ids.is_empty()
            || (!leases.is_empty() && leases.len().is_multiple_of(2))
        {
            return Err(format!(
                "the reply's parts do not fit together: {} ids, {} envelopes, {} later, {} keyed, {} repeats, {} lease",
                ids.len(),
                envelopes.len(),
                later.len(),
                keyed.len(),
                repeats.len(),
                leases.len()
            )
            .into());
        }
        // The claim's token is every delivery's lease but those named after it.
        let token: Arc<str> = match leases.first() {
            Some(t) => decode::<String>(t)?.into(),
            None => Arc::from(""),
        };
        let mut envelopes = envelopes.into_iter();
        let mut items = ids
            .into_iter()
            .map(|id| {
                // An envelope past the claim's "most" comes as its size.
                let (envelope, unloaded) = match envelopes.next() {
                    Some(Value::Int(size)) => (String::new(), Some(decode_unsigned(&Value::Int(size))?)),
                    Some(v) => (FromRedisValue::from_redis_value(v)?, None),
                    None => (String::new(), None),
                };
                Ok(Claimed {
                    id: FromRedisValue::from_redis_value(id)?,
                    lease: Arc::clone(&token),
                    score: None,
                    envelope,
                    attempt: 1,
                    serial_key: None,
                    group: None,
                    unloaded,
                })
            })
            .collect::<Result<Vec<_>, ParsingError>>()?;
        let n = items.len();
        for pair in leases.get(1..).unwrap_or_default().chunks_exact(2) {
            items[index(&pair[0], n)?].lease = decode::<String>(&pair[1])?.into();
        }
        if !unread {
            items.iter_mut().for_each(Claimed::find_score);
        }
        for pair in later.chunks_exact(2) {
            items[index(&pair[0], n)?].attempt = decode_unsigned(&pair[1])?;
        }
        for pair in keyed.chunks_exact(2) {
            let item = &mut items[index(&pair[0], n)?];
            (item.serial_key, item.group) = crate::lines::decode(decode(&pair[1])?);
        }
        let broken_repeats = repeats
            .chunks_exact(3)
            .map(|c| {
                let mark: i64 = decode(&c[2])?;
                Ok(BrokenRepeat {
                    name: decode(&c[0])?,
                    definition: decode(&c[1])?,
                    mark: (mark >= 0).then_some(mark),
                })
            })
            .collect::<Result<_, ParsingError>>()?;
        Ok(Self {
            server_now_ms: now,
            server_now_us: now
                .checked_mul(1000)
                .and_then(|us| us.checked_add(now_us))
                .ok_or_else(|| format!("a clock reading of {now} ms"))?,
            next_ms: next,
            reaped: u64::try_from(reaped).map_err(|_| "a negative count of reaped leases")?,
            rate_limited: limited == 1,
            restart_generation: u64::try_from(generation).map_err(|_| "a negative restart generation")?,
            items,
            broken_repeats,
            minute: (minute >= 0).then_some(minute),
            quarantined_left: quarantined_left == 1,
            unread,
        })
    }
}

/// The script.
pub(crate) fn script() -> &'static LuaScript {
    &super::CLAIM
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: &str) -> Value {
        Value::BulkString(x.as_bytes().to_vec())
    }

    #[test]
    fn a_reply_decodes_into_its_parts() {
        let v = Value::Array(vec![
            Value::Array(vec![
                Value::Int(1000),
                Value::Int(-1),
                Value::Int(2),
                Value::Int(1),
                Value::Int(3),
                Value::Int(29_000_000),
                Value::Int(250),
                Value::Int(0),
            ]),
            Value::Array(vec![s("a"), s("b"), s("c")]),
            Value::Array(vec![s("{}"), s("[]"), s(r#"{"at":[6,12289],"v":1}"#)]),
            Value::Array(vec![Value::Int(2), Value::Int(3)]),
            Value::Array(vec![Value::Int(1), s("customer-7")]),
            Value::Array(vec![s("hourly"), s("{\"every\":1}"), Value::Int(-1)]),
            Value::Array(vec![s("7"), Value::Int(1), s("7:4096"), Value::Int(2), s("7:8192")]),
        ]);
        let r = Reply::from_redis_value(v).expect("decodes");
        assert_eq!(
            (
                r.server_now_ms,
                r.next_ms,
                r.reaped,
                r.rate_limited,
                r.restart_generation
            ),
            (1000, -1, 2, true, 3)
        );
        assert_eq!(r.items.len(), 3);
        assert_eq!(
            (r.items[0].attempt, r.items[0].serial_key.as_deref(), &*r.items[0].lease),
            (1, Some("customer-7"), "7:4096")
        );
        assert_eq!(
            (r.items[1].id.as_str(), r.items[1].attempt, &*r.items[1].lease),
            ("b", 3, "7:8192")
        );
        assert_eq!(r.items[1].score, Some(8192.0));
        // A stamped envelope's lease is the token alone: the stamp gives the score.
        assert_eq!((&*r.items[2].lease, r.items[2].score), ("7", Some(12289.0)));
        assert_eq!(r.broken_repeats[0].mark, None);
        assert_eq!(r.minute, Some(29_000_000), "the claim carried the per-minute records");
        assert_eq!(r.server_now_us, 1_000_250);
    }

    #[test]
    fn a_reply_that_does_not_fit_is_refused_not_defaulted() {
        let ints = |xs: &[i64]| Value::Array(xs.iter().map(|&x| Value::Int(x)).collect());
        let header_with = |generation: i64, us_past_ms: i64| ints(&[1000, -1, 0, 0, generation, -1, us_past_ms, 0]);
        let header = || header_with(0, 0);
        let empty = || Value::Array(vec![]);
        // (id, envelope) pairs, as the claim answers them in two lists.
        let reply = |deliveries: Vec<(Value, Value)>, later: Vec<Value>, leases: Vec<Value>| {
            let (ids, envelopes): (Vec<Value>, Vec<Value>) = deliveries.into_iter().unzip();
            Value::Array(vec![
                header(),
                Value::Array(ids),
                Value::Array(envelopes),
                Value::Array(later),
                empty(),
                empty(),
                Value::Array(leases),
            ])
        };
        let one = || vec![(s("a"), s("{}"))];
        // A well-formed reply is taken, and so is an empty one; each one below has one
        // part wrong.
        assert!(Reply::from_redis_value(reply(one(), vec![], vec![s("1"), Value::Int(1), s("1:2")])).is_ok());
        assert!(Reply::from_redis_value(reply(vec![], vec![], vec![])).is_ok());
        // A token alone with an envelope whose stamp does not parse: the one message
        // has no due time (the pool buries it), the reply stands.
        let r = Reply::from_redis_value(reply(one(), vec![], vec![s("7")])).expect("decodes");
        assert_eq!((&*r.items[0].lease, r.items[0].score), ("7", None));
        let parts = |header: Value| {
            let mut all = vec![header];
            all.extend((0..6).map(|_| empty()));
            Value::Array(all)
        };
        for bad in [
            parts(header_with(-1, 0)),
            parts(header_with(0, 1000)),
            // The header of a claim.lua from before the microseconds.
            parts(ints(&[1000, -1, 0, 0, 0, -1])),
            // The flat reply of an older claim.lua.
            ints(&[1000, -1, 0, 0, 0, -1, 0, 0]),
            // The reply of a claim.lua from before the ids and envelopes came apart:
            // {id, envelope} pairs in one part.
            Value::Array(vec![
                header(),
                Value::Array(vec![s("a"), s("{}")]),
                empty(),
                empty(),
                empty(),
                Value::Array(vec![s("1")]),
            ]),
            // Envelopes for fewer ids than claimed (none: left to the caller, below),
            // an envelope without its id, a nil envelope.
            Value::Array(vec![
                header(),
                Value::Array(vec![s("a"), s("b")]),
                Value::Array(vec![s("{}")]),
                empty(),
                empty(),
                empty(),
                Value::Array(vec![s("1")]),
            ]),
            Value::Array(vec![
                header(),
                empty(),
                Value::Array(vec![s("{}")]),
                empty(),
                empty(),
                empty(),
                Value::Array(vec![s("1")]),
            ]),
            reply(vec![(s("a"), Value::Nil)], vec![], vec![s("1")]),
            // Serial keys for a claim that left the envelopes unread.
            Value::Array(vec![
                header(),
                Value::Array(vec![s("a")]),
                empty(),
                empty(),
                Value::Array(vec![Value::Int(1), s("k")]),
                empty(),
                Value::Array(vec![s("1")]),
            ]),
            reply(vec![], vec![Value::Int(1), Value::Int(2)], vec![]),
            // Deliveries without their token, a token without deliveries, a lease
            // named for no delivery, a pair cut short.
            reply(one(), vec![], vec![]),
            reply(vec![], vec![], vec![s("1")]),
            reply(one(), vec![], vec![s("1"), Value::Int(2), s("1:2")]),
            reply(one(), vec![], vec![s("1"), Value::Int(1)]),
            Value::Nil,
            // A part that is not a list, nil above all: it must not pass for an empty
            // one.
            Value::Array(vec![
                header(),
                Value::Nil,
                empty(),
                empty(),
                empty(),
                empty(),
                Value::Nil,
            ]),
            Value::Array(vec![
                header(),
                Value::Array(vec![s("a")]),
                Value::Array(vec![s("{}")]),
                empty(),
                empty(),
                empty(),
                s("1"),
            ]),
        ] {
            assert!(Reply::from_redis_value(bad.clone()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_claim_that_left_the_envelopes_takes_them_from_the_read() {
        let header = Value::Array([1000, -1, 0, 0, 0, -1, 0, 0].map(Value::Int).to_vec());
        let v = Value::Array(vec![
            header,
            Value::Array(vec![s("a"), s("b"), s("c")]),
            Value::Array(vec![]),
            Value::Array(vec![]),
            Value::Array(vec![]),
            Value::Array(vec![]),
            Value::Array(vec![s("7"), Value::Int(3), s("7:8192")]),
        ]);
        let mut r = Reply::from_redis_value(v).expect("decodes");
        assert!(r.unread);
        assert!(r.items.iter().all(|i| i.envelope.is_empty() && i.score.is_none()));
        let query = r.envelopes_query("{dq:x}:messages");
        let words: Vec<Vec<u8>> = query
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(w) => w.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(
            words,
            ["HMGET", "{dq:x}:messages", "a", "b", "c"].map(|w| w.as_bytes().to_vec())
        );
        // A read of the wrong length, or no list, is refused and changes nothing.
        assert!(r.take_envelopes(Value::Array(vec![s("{}")])).is_err());
        let nil = r.take_envelopes(Value::Nil).expect_err("a nil is no envelopes");
        assert!(
            nil.to_string().contains("the envelopes read is nil, not a list"),
            "{nil}"
        );
        assert_eq!(r.items.len(), 3);
        let orphans = r
            .take_envelopes(Value::Array(vec![
                s(r#"{"at":[6,12289],"v":1}"#),
                Value::Nil,
                s(r#"{"v":1}"#),
            ]))
            .expect("read");
        assert!(!r.unread);
        assert_eq!(orphans.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(), ["b"]);
        assert_eq!(r.items.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), ["a", "c"]);
        // The stamp gives the score; a lease that names one gives it; the others have
        // none.
        assert_eq!((r.items[0].score, &*r.items[0].lease), (Some(12289.0), "7"));
        assert_eq!((r.items[1].score, &*r.items[1].lease), (Some(8192.0), "7:8192"));
        assert_eq!(r.items[1].envelope, r#"{"v":1}"#);

        // One message claimed, one string read: redis-rs would take it for a list of one.
        let header = Value::Array([1000, -1, 0, 0, 0, -1, 0, 0].map(Value::Int).to_vec());
        let v = Value::Array(vec![
            header,
            Value::Array(vec![s("a")]),
            Value::Array(vec![]),
            Value::Array(vec![]),
            Value::Array(vec![]),
            Value::Array(vec![]),
            Value::Array(vec![s("7")]),
        ]);
        let mut one = Reply::from_redis_value(v).expect("decodes");
        assert!(one.take_envelopes(s("{}")).is_err());
        assert_eq!(one.items.len(), 1);
    }

    #[test]
    fn an_error_names_the_part_that_is_not_a_list() {
        let v = Value::Array(vec![
            Value::Array([1000, -1, 0, 0, 0, -1, 0, 0].map(Value::Int).to_vec()),
            Value::Nil,
        ]);
        let e = Reply::from_redis_value(v).expect_err("a nil part");
        assert!(e.to_string().contains("part 2 (ids) is nil, not a list"), "{e}");
        let long = "x".repeat(500);
        let e = Reply::from_redis_value(s(&long)).expect_err("a string");
        assert!(e.to_string().contains("the reply is "), "{e}");
        assert!(e.to_string().len() < 200, "the error shows the value's start only: {e}");
    }
}
