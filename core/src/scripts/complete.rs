//! The completions of deliveries: ack.lua, nack.lua and release.lua. Each names a
//! delivery by its id and the lease its claim returned; only the delivery holding the
//! lease may complete it (the fence).

use redis::{FromRedisValue, ParsingError, Value};

use super::{Call, Invocation, LuaScript, decode, decode_list, decode_unsigned};

/// A delivery, as its claim returned it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Delivery<'a> {
    pub(crate) id: &'a str,
    pub(crate) lease: &'a str,
}

/// Acknowledge deliveries: the messages are done.
#[derive(Debug, Clone)]
pub(crate) struct Ack<'a> {
    /// Completed messages to keep (`keep_completed`; 0: none) and for how long.
    pub(crate) keep: usize,
    pub(crate) keep_ms: u64,
    pub(crate) deliveries: Vec<Delivery<'a>>,
}

/// One failed delivery.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Failure<'a> {
    pub(crate) delivery: Delivery<'a>,
    /// Run again after this many ms; `None`: to the dead letters now.
    pub(crate) retry_in_ms: Option<u64>,
    pub(crate) error: &'a str,
    /// "" for none (an earlier attempt's is dropped).
    pub(crate) trace: &'a str,
    /// Add the stored last error to `error` instead of replacing it.
    pub(crate) keep_last_error: bool,
    /// The handler never ran it (buried at its claim: unreadable, expired, or past
    /// max_attempts already): no attempt is counted.
    pub(crate) unrun: bool,
}

impl Failure<'_> {
    fn options(&self) -> &'static str {
        match (self.keep_last_error, self.unrun) {
            (false, false) => "",
            (true, false) => "keep_last_error",
            (false, true) => "unrun",
            (true, true) => "keep_last_error unrun",
        }
    }
}

/// Fail deliveries: retry later, or bury.
#[derive(Debug, Clone)]
pub(crate) struct Nack<'a> {
    pub(crate) dead_max: usize,
    pub(crate) dead_ttl_ms: u64,
    pub(crate) failures: Vec<Failure<'a>>,
}

/// Release deliveries that never started: due again at once, not counted.
#[derive(Debug, Clone)]
pub(crate) struct Release<'a> {
    pub(crate) deliveries: Vec<Delivery<'a>>,
}

impl Call for Ack<'_> {
    type Reply = Acked;

    fn script(&self) -> &'static LuaScript {
        ack()
    }

    /// Runs of deliveries holding one lease, in the order given: the lease, how many,
    /// their ids. A claim's deliveries share its lease, so a batch is mostly one run
    /// and the lease is sent once.
    fn add_to(&self, inv: &mut Invocation<'_>) {
        inv.arg(self.keep).arg(self.keep_ms);
        for run in self.deliveries.chunk_by(|a, b| a.lease == b.lease) {
            inv.arg(run[0].lease).arg(run.len());
            for d in run {
                inv.arg(d.id);
            }
        }
    }
}

impl Call for Nack<'_> {
    type Reply = Statuses;

    fn script(&self) -> &'static LuaScript {
        nack()
    }

    fn add_to(&self, inv: &mut Invocation<'_>) {
        inv.arg(self.dead_max).arg(self.dead_ttl_ms);
        for f in &self.failures {
            let delay = f.retry_in_ms.map_or(-1, |ms| i64::try_from(ms).unwrap_or(i64::MAX));
            inv.arg(f.delivery.id)
                .arg(f.delivery.lease)
                .arg(delay)
                .arg(f.error)
                .arg(f.trace)
                .arg(f.options());
        }
    }
}

impl Call for Release<'_> {
    type Reply = Released;

    fn script(&self) -> &'static LuaScript {
        release()
    }

    fn add_to(&self, inv: &mut Invocation<'_>) {
        for d in &self.deliveries {
            inv.arg(d.id).arg(d.lease);
        }
    }
}

/// What became of one acknowledged or failed delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Acknowledged (ack), or to run again later (nack).
    Done,
    /// In the dead letters (nack).
    Buried,
    /// The lease had passed to another delivery: the message lives on there.
    LeaseLost,
    /// No such message any more: completed already, cancelled, purged or flushed.
    Gone,
    /// Cancelled while it ran (cancel.lua): deleted by this completion (ack, nack,
    /// release), or, from a heartbeat, renewed and marked.
    Cancelled,
    /// From a heartbeat: renewed, cancelled, and its process is to be killed.
    CancelledKill,
}

/// One status per delivery, in the order sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Statuses(pub(crate) Vec<Status>);

impl FromRedisValue for Statuses {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let codes = decode_list(v, "the reply")?;
        codes
            .iter()
            .map(|c| match decode::<i64>(c)? {
                1 => Ok(Status::Done),
                2 => Ok(Status::Buried),
                0 => Ok(Status::LeaseLost),
                -1 => Ok(Status::Gone),
                3 => Ok(Status::Cancelled),
                4 => Ok(Status::CancelledKill),
                other => Err(format!("status {other}").into()),
            })
            .collect::<Result<_, ParsingError>>()
            .map(Self)
    }
}

/// What an ack returns: how many were acknowledged when every delivery was (the usual
/// batch), else one status per delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Acked {
    All(usize),
    Each(Statuses),
}

impl Acked {
    /// One status per delivery of the `sent`; an error if the reply does not fit them.
    pub(crate) fn statuses(self, sent: usize) -> Result<Vec<Status>, String> {
        let statuses = match self {
            Self::All(n) => vec![Status::Done; n],
            Self::Each(Statuses(each)) => each,
        };
        if statuses.len() == sent {
            Ok(statuses)
        } else {
            Err(format!(
                "ack answered for {} deliveries of the {sent} sent",
                statuses.len()
            ))
        }
    }
}

impl FromRedisValue for Acked {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match v {
            Value::Int(_) => decode_unsigned(&v).map(Self::All),
            Value::Array(_) => {
                let each = Statuses::from_redis_value(v)?;
                // Only a failure buries: an ack that says so answers something else.
                if each.0.contains(&Status::Buried) {
                    return Err("an ack status of 2 (buried)".into());
                }
                if each.0.contains(&Status::CancelledKill) {
                    return Err("an ack status of 4 (a heartbeat's)".into());
                }
                Ok(Self::Each(each))
            }
            other => Err(format!("an ack reply of {other:?}").into()),
        }
    }
}

/// What a release did: how many deliveries it returned to the queue, and how many it
/// deleted instead, their messages marked cancelled (cancel.lua).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Released {
    pub(crate) released: u64,
    pub(crate) cancelled: u64,
}

impl FromRedisValue for Released {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match decode_list(v, "the reply")?.as_slice() {
            [released, cancelled] => Ok(Self {
                released: decode_unsigned(released)?,
                cancelled: decode_unsigned(cancelled)?,
            }),
            other => Err(format!("a release reply of {} values", other.len()).into()),
        }
    }
}

/// The scripts.
pub(crate) fn ack() -> &'static LuaScript {
    &super::ACK
}
pub(crate) fn nack() -> &'static LuaScript {
    &super::NACK
}
pub(crate) fn release() -> &'static LuaScript {
    &super::RELEASE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_decode_each_code_and_refuse_others() {
        let v = Value::Array(vec![Value::Int(1), Value::Int(2), Value::Int(0), Value::Int(-1)]);
        assert_eq!(
            Statuses::from_redis_value(v).expect("decodes").0,
            [Status::Done, Status::Buried, Status::LeaseLost, Status::Gone]
        );
        assert!(Statuses::from_redis_value(Value::Array(vec![Value::Int(7)])).is_err());
        assert!(Statuses::from_redis_value(Value::Int(1)).is_err());
        assert!(Statuses::from_redis_value(Value::Nil).is_err(), "a nil is no statuses");
        let reply = |a, b| Value::Array(vec![Value::Int(a), Value::Int(b)]);
        assert_eq!(
            Released::from_redis_value(reply(3, 1)).expect("decodes"),
            Released {
                released: 3,
                cancelled: 1
            }
        );
        assert!(Released::from_redis_value(reply(-3, 0)).is_err());
        assert!(Released::from_redis_value(Value::Int(3)).is_err());
    }

    #[test]
    fn an_ack_reply_is_a_count_or_a_status_each_and_must_fit_what_was_sent() {
        let all = Acked::from_redis_value(Value::Int(2)).expect("decodes");
        assert_eq!(all.clone().statuses(2), Ok(vec![Status::Done, Status::Done]));
        assert!(all.statuses(3).is_err());
        let each = Acked::from_redis_value(Value::Array(vec![Value::Int(1), Value::Int(-1)])).expect("decodes");
        assert_eq!(each.clone().statuses(2), Ok(vec![Status::Done, Status::Gone]));
        assert!(each.statuses(1).is_err());
        assert!(Acked::from_redis_value(Value::Int(-1)).is_err());
        assert!(Acked::from_redis_value(Value::Nil).is_err());
        assert!(Acked::from_redis_value(Value::Array(vec![Value::Int(2)])).is_err());
    }

    #[test]
    fn an_ack_sends_each_lease_once_per_run() {
        let d = |id, lease| Delivery { id, lease };
        let ack = Ack {
            keep: 0,
            keep_ms: 0,
            deliveries: vec![d("a", "7"), d("b", "7"), d("c", "7:4096"), d("d", "7"), d("e", "8")],
        };
        assert_eq!(
            super::super::sent_args(|inv| ack.add_to(inv)),
            [
                "0", "0", "7", "2", "a", "b", "7:4096", "1", "c", "7", "1", "d", "8", "1", "e"
            ]
        );
    }
}
