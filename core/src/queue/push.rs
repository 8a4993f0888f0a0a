//! `push`, `push_at`, `push_json` and `push_many`: one script call per partition.

use std::cell::Cell;

use serde::Serialize;

use crate::conn::Replay;
use crate::error::{Error, Result};
use crate::payload::to_json;
use crate::scripts::{self, Answer, Call, Finished, Invocation, MAX_BATCH, Stream, now, push};
use crate::time::Due;
use crate::{Layout, NewMessage, PayloadJson, PushOptions, Queue, envelope, keys, lines};

use super::validate::{
    expire_after_ms, validate_group, validate_id, validate_key, validate_max_attempts, validate_serial_key,
};

impl Queue {
    /// Schedule `payload` (any serialisable value) after `delay`. Returns its id.
    pub fn push<T: Serialize + ?Sized>(&self, payload: &T, due: impl Into<Due>) -> Result<String> {
        self.push_json(to_json(payload)?, due.into(), &PushOptions::default())
    }

    /// Schedule `payload` at the Unix time `at`.
    pub fn push_at<T: Serialize + ?Sized>(&self, payload: &T, at: std::time::SystemTime) -> Result<String> {
        self.push_json(to_json(payload)?, Due::at(at), &PushOptions::default())
    }

    /// Schedule a payload given as JSON text. One round trip.
    pub fn push_json(&self, payload_json: impl Into<PayloadJson>, due: Due, options: &PushOptions) -> Result<String> {
        let mut ids = self.push_many(&[NewMessage {
            payload_json: payload_json.into(),
            due,
            options: options.clone(),
        }])?;
        Ok(ids.remove(0))
    }

    /// Schedule a batch in one round trip (two for `MAX_BATCH` delays or more, see
    /// `client_stamps`). Every message is validated before anything is written. Up to
    /// `MAX_BATCH` messages of a partition are one script: all written or, on an
    /// error, none, and the error is the cause itself. A batch of several scripts (more
    /// messages, or several partitions) that fails in one may have written others:
    /// then the error is [`Error::PartlyWritten`], which carries every id of the batch,
    /// those written and those whose script was sent without a reply (a connection
    /// that failed), and the cause, whose category it keeps; only when no script may
    /// have written is it the cause alone. On one server the scripts are streamed: each
    /// is sent as soon as it is written, and every reply is read, so a script refused
    /// in the middle leaves the others written; on a cluster they go one by one and stop
    /// at the first that fails.
    pub fn push_many(&self, batch: &[NewMessage]) -> Result<Vec<String>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let inner = &*self.inner;
        let layout = &inner.opts.layout;
        let created_ms = crate::time::now_unix_ms();
        let mut ids = Vec::with_capacity(batch.len());
        let mut expiries = Vec::with_capacity(batch.len());
        for (i, m) in batch.iter().enumerate() {
            let at = |e: Error| -> Error {
                if batch.len() == 1 {
                    e
                } else {
                    match e {
                        Error::InvalidArgument { name, reason } => Error::InvalidArgument {
                            name: format!("{name} of item {i}"),
                            reason,
                        },
                        Error::PayloadNotSerializable(r) => Error::PayloadNotSerializable(format!("item {i}: {r}")),
                        other => other,
                    }
                }
            };
            m.payload_json.validate(inner.opts.max_payload_bytes).map_err(at)?;
            validate_max_attempts(layout, m.options.max_attempts).map_err(at)?;
            expiries.push(expire_after_ms(layout, m.options.expire_after).map_err(at)?);
            m.due.validate().map_err(at)?;
            if let Some(key) = &m.options.partition_key {
                validate_key("partition_key", key).map_err(at)?;
            }
            if let Some(key) = &m.options.serial_key {
                validate_serial_key(layout, key, m.options.partition_key.as_deref()).map_err(at)?;
            }
            if let Some(group) = &m.options.group {
                validate_group(layout, group, &m.options).map_err(at)?;
            }
            if m.options.replace && m.options.id.is_none() {
                return Err(at(Error::invalid(
                    "replace",
                    "needs an id: the message of that id is the one replaced",
                )));
            }
            let id = match &m.options.id {
                Some(id) => {
                    validate_id(id).map_err(at)?;
                    id.clone()
                }
                // Sortable by creation time and unique without coordination. Having the
                // id before the first send makes a retried push idempotent.
                None => crate::fork::new_message_id(),
            };
            ids.push(id);
        }
        // Per partition, in push order, in scripts of at most MAX_BATCH messages.
        let n = self.partitions();
        let mut by_part: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, m) in batch.iter().enumerate() {
            let key = (m.options.partition_key.as_deref())
                .or(m.options.serial_key.as_deref())
                .or(m.options.group.as_deref());
            by_part[self.partition_of(&ids[i], key)].push(i);
        }
        let line_keys: Vec<_> = (batch.iter())
            .map(|m| lines::encode(m.options.serial_key.as_deref(), m.options.group.as_deref()))
            .collect();
        let resolved = self.client_stamps(batch)?;
        // Each client stamp's score: a partition's k-th script proposes place k of the
        // millisecond, which it gets if nothing else waits there.
        let mut stamps: Vec<Option<u64>> = vec![None; batch.len()];
        for members in &by_part {
            for (k, chunk) in members.chunks(MAX_BATCH).enumerate() {
                for &i in chunk {
                    stamps[i] = resolved[i]
                        .filter(|&(_, stamped)| stamped && k < keys::SEQ_SPAN as usize)
                        .and_then(|(ms, _)| envelope::first_place_score(ms))
                        .map(|score| score + k as u64);
                }
            }
        }
        let chunks: Vec<(usize, &[usize])> = by_part
            .iter()
            .enumerate()
            .flat_map(|(part, idx)| idx.chunks(MAX_BATCH).map(move |c| (part, c)))
            .collect();
        // An id that delayq generated cannot exist before its first send, so the script
        // skips looking it up; a resend (the first one may have run) and ids that the
        // caller chose are looked up. The cluster client resends on its own, so there
        // every send looks up.
        let sent = Cell::new(inner.endpoint.is_cluster());
        // One script call, its envelopes written as it is built: a batch of several
        // writes the next call's while Redis runs the one before.
        let call_of = |part: usize, members: &[usize]| -> Invocation<'_> {
            // One string for the call's envelopes, each a range of it.
            let reserve = members
                .iter()
                .map(|&i| envelope::encoded_len(&batch[i].payload_json, &ids[i]))
                .sum();
            let mut written = String::with_capacity(reserve);
            let mut ends = Vec::with_capacity(members.len());
            for &i in members {
                let m = &batch[i];
                envelope::encode_into(
                    &mut written,
                    layout,
                    &ids[i],
                    &m.payload_json,
                    m.options.max_attempts,
                    expiries[i],
                    created_ms,
                    stamps[i],
                );
                ends.push(written.len());
            }
            let starts = std::iter::once(0).chain(ends.iter().copied());
            let args = push::Args {
                check_existing: sent.get() || members.iter().any(|&i| batch[i].options.id.is_some()),
                native: matches!(layout, Layout::Native),
                messages: members
                    .iter()
                    .zip(starts.zip(&ends))
                    .map(|(&i, (start, &end))| {
                        let envelope = &written[start..end];
                        push::Message {
                            id: &ids[i],
                            due: resolved[i].map_or(batch[i].due, |(ms, _)| Due::AtUnixMs(ms)),
                            replace: batch[i].options.replace,
                            expires: batch[i].options.expire_after.is_some(),
                            envelope: if stamps[i].is_some() {
                                envelope
                            } else {
                                envelope::body(layout, envelope)
                            },
                            serial_key: line_keys[i].as_deref(),
                            generated_id: batch[i].options.id.is_none(),
                            stamped: stamps[i].is_some(),
                        }
                    })
                    .collect(),
            };
            let mut inv = self.invocation(part, args.script());
            args.add_to(&mut inv);
            inv
        };
        let waits = inner.opts.wait_replicas > 0;
        // What each script came to, over every send of it: the error of a batch of
        // several says what they wrote.
        let mut known = vec![Known::NotWritten; chunks.len()];
        let fail = |cause: Error, known: &[Known]| partly_written(cause, &ids, &chunks, known);
        if inner.endpoint.is_cluster() {
            // Each partition may live on another master: one call per script, and the
            // WAIT on the connection to that master.
            for (c, &(part, members)) in chunks.iter().enumerate() {
                let (tries, ran) = (Cell::new(0), Cell::new(false));
                let result = inner
                    .conn
                    .lock()
                    .run_conn(&inner.endpoint, "push", Replay::Safe, |con| {
                        tries.set(tries.get() + 1);
                        let v: redis::Value = call_of(part, members).invoke(con.as_dyn())?;
                        ran.set(true);
                        let confirmed = if waits {
                            self.confirm_replicated(con, part)?
                        } else {
                            i64::MAX
                        };
                        Ok((v, confirmed))
                    });
                // A refusal of the only send wrote nothing (a script checks before its
                // first write); a send that failed otherwise may have run. (The cluster
                // client resends a call whose connection failed on its own: a refusal
                // of such a resend, a full Redis's, is taken as the call's.)
                known[c] = match &result {
                    _ if ran.get() => Known::Written,
                    Err(e) if tries.get() == 1 && !e.is_retryable() => Known::NotWritten,
                    _ => Known::Unknown,
                };
                let (v, confirmed) = result.map_err(|e| fail(e, &known))?;
                let script = push::script_for(members.iter().any(|&i| batch[i].options.replace));
                if let Err(e) = scripts::read::<push::Reply>(script, v) {
                    known[c] = Known::Unknown;
                    return Err(fail(e, &known));
                }
                self.check_replicated(confirmed).map_err(|e| fail(e, &known))?;
            }
        } else if chunks.len() == 1 && !waits {
            let (part, members) = chunks[0];
            let script = push::script_for(members.iter().any(|&i| batch[i].options.replace));
            let v: redis::Value = inner.conn.lock().run(&inner.endpoint, "push", Replay::Safe, |con| {
                let inv = call_of(part, members);
                sent.set(true);
                inv.invoke(con)
            })?;
            scripts::read::<push::Reply>(script, v)?;
        } else {
            // One round trip for the whole batch, the WAIT included: each call goes out
            // as soon as it is built, so Redis runs one while the next is written.
            let streamed = Cell::new(false);
            let seen = std::cell::RefCell::new(std::mem::take(&mut known));
            let replies = inner
                .conn
                .lock()
                .run_conn(&inner.endpoint, "push_many", Replay::Safe, |con| {
                    // Calls go out as they are built: a rerun after a failure part way
                    // (a write that timed out, a reset) may follow calls that ran.
                    if streamed.replace(true) {
                        sent.set(true);
                    }
                    let mut again = false;
                    loop {
                        let mut stream = Stream::new(con)?;
                        // What this send of each script came to: a call sent whole may
                        // run until its reply says otherwise; one whose write failed
                        // did not reach Redis whole, so it ran nothing.
                        let mut pass = vec![Known::NotWritten; chunks.len()];
                        let mut sending = Ok(());
                        for (c, &(part, members)) in chunks.iter().enumerate() {
                            sending = stream.send(call_of(part, members));
                            if sending.is_err() {
                                break;
                            }
                            pass[c] = Known::Unknown;
                        }
                        if sending.is_ok() && waits {
                            sending = stream.send_command(&self.wait_command());
                        }
                        let failed = sending.err();
                        if failed.is_none() {
                            sent.set(true);
                        }
                        // After a failed write the replies Redis sent before it closed
                        // are still read, to learn what ran; not after a write that
                        // timed out, where a read would wait as long.
                        let mut done = match &failed {
                            Some(e) if e.is_timeout() => Finished::default(),
                            _ => stream.finish(),
                        };
                        for (p, answer) in pass.iter_mut().zip(&done.answers) {
                            *p = match answer {
                                Answer::Reply(..) => Known::Written,
                                Answer::Refused | Answer::Missing => Known::NotWritten,
                            };
                        }
                        for (k, p) in seen.borrow_mut().iter_mut().zip(&pass) {
                            *k = (*k).max(*p);
                        }
                        if let Some(e) = failed.or(done.cut.take()).or(done.refused.take()) {
                            return Err(e);
                        }
                        if done.scripts_missing()
                            && let Some(e) = done.load_refused.take()
                        {
                            // Missing, and this user may not load them: what an admin must do.
                            return Err(e);
                        }
                        if !done.scripts_missing() {
                            return Ok(done
                                .answers
                                .into_iter()
                                .filter_map(|a| match a {
                                    Answer::Reply(script, v) => Some((script, v)),
                                    Answer::Refused | Answer::Missing => None,
                                })
                                .collect::<Vec<_>>());
                        }
                        // A call that found no script ran nothing, but a later one may
                        // have (another client loaded it in between): the batch goes
                        // again, loading its scripts first, as a resend, which looks its
                        // ids up.
                        if again {
                            return Err(redis::RedisError::from((
                                redis::ErrorKind::Server(redis::ServerErrorKind::NoScript),
                                "the push scripts were flushed again as soon as they were loaded",
                            )));
                        }
                        again = true;
                    }
                });
            known = seen.into_inner();
            let replies = replies.map_err(|e| fail(e, &known))?;
            let mut confirmed = i64::MAX;
            for (c, (script, v)) in replies.into_iter().enumerate() {
                match script {
                    Some(script) => {
                        if let Err(e) = scripts::read::<push::Reply>(script, v) {
                            // It answered, but not as a push does: whether it wrote is
                            // unknown.
                            known[c] = Known::Unknown;
                            return Err(fail(e, &known));
                        }
                    }
                    None => {
                        confirmed = redis::FromRedisValue::from_redis_value(v).map_err(|e| {
                            fail(
                                Error::Protocol {
                                    script: "WAIT".to_owned(),
                                    reason: e.to_string(),
                                },
                                &known,
                            )
                        })?;
                    }
                }
            }
            // Every script wrote: NotReplicated says so itself.
            self.check_replicated(confirmed)?;
        }
        self.register_producer();
        Ok(ids)
    }

    /// Each message's due time in Unix ms where the client resolves it, and whether
    /// the client stamps it (see push.lua's "stamped" runs), so that Redis builds no
    /// string for it: a new message with an id made here (no claim can have held it)
    /// and no expiry, due at a time given, or after a delay counted from one read of
    /// the queue clock. The read is made when enough delayed messages gain from it to
    /// pay its round trip, on one partition (each partition keeps its own clock, see
    /// include/clock.lua) and not on a cluster; it comes after the call began, so no
    /// message is due earlier than its delay after it. Then every delay of the batch
    /// counts from it, so that the batch keeps its push order.
    fn client_stamps(&self, batch: &[NewMessage]) -> Result<Vec<Option<(i64, bool)>>> {
        let inner = &*self.inner;
        // One message goes to push_one.lua, which stamps it.
        if !matches!(inner.opts.layout, Layout::Native) || batch.len() == 1 {
            return Ok(vec![None; batch.len()]);
        }
        let stampable =
            |m: &NewMessage| m.options.id.is_none() && !m.options.replace && m.options.expire_after.is_none();
        let delayed = batch
            .iter()
            .filter(|m| stampable(m) && matches!(m.due, Due::In(_)))
            .count();
        let clock_ms = if delayed >= CLOCK_READ_MIN && self.partitions() == 1 && !inner.endpoint.is_cluster() {
            let read = now::Args;
            let now::NowMs(ms) = self.call(0, "push_many", Replay::Safe, read.script(), |inv| read.add_to(inv))?;
            Some(ms)
        } else {
            None
        };
        Ok(batch
            .iter()
            .map(|m| {
                let due_ms = match (m.due, clock_ms) {
                    (Due::AtUnixMs(ms), _) => ms.max(0),
                    (Due::In(_), Some(now)) => now.saturating_add(m.due.script_args().1),
                    (Due::In(_), None) => return None,
                };
                Some((due_ms, stampable(m) && envelope::first_place_score(due_ms).is_some()))
            })
            .collect())
    }
}

/// Delayed messages of one push worth a read of the queue clock: a full script's, so
/// that the round trip is small beside the call's own time in Redis, even where Redis
/// is a network away.
const CLOCK_READ_MIN: usize = MAX_BATCH;

/// What is known of one script of a batch over every send of it, in the order in which
/// a later send's outcome does not undo an earlier one's: one that ran stays written,
/// one that may have run stays unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Known {
    /// Not sent, or refused: a refused script wrote nothing.
    NotWritten,
    /// Sent, and no reply read: it may have run.
    Unknown,
    /// It replied.
    Written,
}

/// The error of a batch whose scripts `known` came to: `cause` itself for one script,
/// which is written whole or not at all, or when no script may have written;
/// otherwise `PartlyWritten` with the ids of each kind, in batch order.
fn partly_written(cause: Error, ids: &[String], chunks: &[(usize, &[usize])], known: &[Known]) -> Error {
    if chunks.len() < 2 || known.iter().all(|k| *k == Known::NotWritten) {
        return cause;
    }
    let mut of = vec![Known::NotWritten; ids.len()];
    for (&(_, members), &k) in chunks.iter().zip(known) {
        for &i in members {
            of[i] = k;
        }
    }
    let kind = |want: Known| -> Vec<String> {
        ids.iter()
            .zip(&of)
            .filter(|&(_, &k)| k == want)
            .map(|(id, _)| id.clone())
            .collect()
    };
    Error::PartlyWritten {
        ids: ids.to_vec(),
        written: kind(Known::Written),
        unknown: kind(Known::Unknown),
        cause: Box::new(cause),
    }
}
