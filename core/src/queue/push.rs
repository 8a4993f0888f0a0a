//! `push`, `push_at`, `push_json` and `push_many`: one script call per partition.

use std::cell::Cell;

use serde::Serialize;

use crate::conn::Replay;
use crate::error::{Error, Result};
use crate::payload::to_json;
use crate::scripts::{self, Call, Invocation, MAX_BATCH, Stream, Streamed, now, push};
use crate::time::Due;
use crate::{Layout, NewMessage, PayloadJson, PushOptions, Queue, envelope, keys};

use super::validate::{expire_after_ms, validate_id, validate_key, validate_max_attempts, validate_serial_key};

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
    /// error, none. A batch of several (more messages, or several partitions) that fails
    /// in one may have written the others, so a retry pushes those again unless their
    /// ids were given. On one server its scripts are streamed: each is sent as soon as it
    /// is written.
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
            let key = m.options.partition_key.as_deref().or(m.options.serial_key.as_deref());
            by_part[self.partition_of(&ids[i], key)].push(i);
        }
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
                            serial_key: batch[i].options.serial_key.as_deref(),
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
        if inner.endpoint.is_cluster() {
            // Each partition may live on another master: one call per script, and the
            // WAIT on the connection to that master.
            for (part, members) in chunks {
                let confirmed = inner
                    .conn
                    .lock()
                    .run_conn(&inner.endpoint, "push", Replay::Safe, |con| {
                        call_of(part, members).invoke::<push::Reply>(con.as_dyn())?;
                        if waits {
                            self.confirm_replicated(con, part)
                        } else {
                            Ok(i64::MAX)
                        }
                    })?;
                self.check_replicated(confirmed)?;
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
                        for &(part, members) in &chunks {
                            stream.send(call_of(part, members))?;
                        }
                        sent.set(true);
                        if waits {
                            stream.send_command(&self.wait_command())?;
                        }
                        match stream.finish()? {
                            Streamed::Replies(replies) => return Ok(replies),
                            // A call that found no script ran nothing, but a later one
                            // may have (another client loaded it in between): the batch
                            // goes again, loading its scripts first, as a resend, which
                            // looks its ids up.
                            Streamed::ScriptsMissing if !again => again = true,
                            Streamed::ScriptsMissing => {
                                return Err(redis::RedisError::from((
                                    redis::ErrorKind::Server(redis::ServerErrorKind::NoScript),
                                    "the push scripts were flushed again as soon as they were loaded",
                                )));
                            }
                        }
                    }
                })?;
            let mut confirmed = i64::MAX;
            for (script, v) in replies {
                match script {
                    Some(script) => {
                        scripts::read::<push::Reply>(script, v)?;
                    }
                    None => {
                        confirmed = redis::FromRedisValue::from_redis_value(v).map_err(|e| Error::Protocol {
                            script: "WAIT".to_owned(),
                            reason: e.to_string(),
                        })?;
                    }
                }
            }
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
        if !matches!(inner.opts.layout, Layout::Native) {
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
