//! Changes to waiting messages: `cancel`, `reschedule`, `move_waiting`.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::conn::Replay;
use crate::error::{Error, Result};
use crate::keys::partition_of;
use crate::scripts::replies::Ids;
use crate::scripts::{MAX_BATCH, admin};
use crate::time::Due;
use crate::{Listing, MessageInfo, NewMessage, PayloadJson, PushOptions, Queue, State};

use super::validate::{expire_after_ms, validate_id};

/// What [`Queue::cancel_with`] does to a message that runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CancelOptions {
    /// Also kill the supervised worker process whose handler runs it, as its
    /// `timeout` would (the message then ends as cancelled, not failed). Handlers that
    /// run as threads or coroutines cannot be killed: for them this is a plain cancel.
    pub kill: bool,
}

impl CancelOptions {
    /// With `kill` set as given.
    pub fn kill(kill: bool) -> Self {
        Self { kill }
    }
}

impl Queue {
    /// Cancel a message: one that waits is deleted; one that runs is marked
    /// cancelled, and ends so whatever its handler does (see
    /// [`cancel_with`](Self::cancel_with)). `false` when it is unknown or dead.
    pub fn cancel(&self, id: &str) -> Result<bool> {
        self.cancel_with(id, CancelOptions::default())
    }

    /// Cancel a message. One that waits is deleted, as it was never pushed. One that
    /// runs is marked cancelled: its pool learns of it within a heartbeat (a third
    /// of its lease), its handler sees it (`Delivery::is_cancelled`), and whatever
    /// the handler does then, the message is neither retried nor dead-lettered: it is
    /// deleted when the delivery ends, and counted under `cancelled` in `stats()`. A
    /// handler that never looks ends normally. With [`CancelOptions::kill`], a
    /// supervised process whose handler runs it is killed as at its `timeout`.
    /// `true` when it waited or runs; `false` when it is unknown or dead, or runs where
    /// no mark can be stored (the seed layout, an envelope edited by hand).
    pub fn cancel_with(&self, id: &str, options: CancelOptions) -> Result<bool> {
        validate_id(id)?;
        let args = admin::Cancel {
            mark: if options.kill { "2" } else { "1" },
            counter: "cancelled",
            ids: vec![id],
        };
        let Ids(removed) = self.call_by_id(
            id,
            "cancel",
            Replay::IfNotSent,
            admin::cancel(),
            |inv| args.add_to(inv),
            |Ids(removed): &Ids| !removed.is_empty(),
        )?;
        Ok(!removed.is_empty())
    }

    /// Delete those of `ids` that still wait, counted under `counter`; returns them.
    pub(super) fn take_waiting(&self, ids: &[String], counter: &str) -> Result<BTreeSet<String>> {
        let n = self.partitions();
        let call = |part: usize, ids: &[&String]| -> Result<Vec<String>> {
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            let args = admin::Cancel {
                counter,
                mark: "",
                ids: ids.iter().map(|id| id.as_str()).collect(),
            };
            let Ids(removed) = self.call(part, "move_waiting", Replay::IfNotSent, admin::cancel(), |inv| {
                args.add_to(inv);
            })?;
            Ok(removed)
        };
        // Each id in its home partition first: only one pushed with a partition key
        // lives elsewhere.
        let mut by_home: Vec<Vec<&String>> = vec![Vec::new(); n];
        for id in ids {
            by_home[partition_of(id, n)].push(id);
        }
        let mut taken = BTreeSet::new();
        for (part, ids) in by_home.iter().enumerate() {
            taken.extend(call(part, ids)?);
        }
        if n > 1 {
            for part in 0..n {
                let elsewhere: Vec<&String> = ids
                    .iter()
                    .filter(|id| partition_of(id, n) != part && !taken.contains(*id))
                    .collect();
                taken.extend(call(part, &elsewhere)?);
            }
        }
        Ok(taken)
    }

    /// Move every waiting message (scheduled or due, not yet claimed) to the queue
    /// `to`, which may differ in name, layout, partitions or Redis: to leave the seed
    /// layout once every consumer runs delayq, or to spread a queue over partitions.
    /// Each keeps its id, payload, due time, `max_attempts` and the deadline of
    /// `expire_after`; its attempts and last error start afresh. Messages that run
    /// finish where they are, dead letters stay (requeue them first to move them),
    /// and a message pushed to the old queue meanwhile is moved too, until a pass finds
    /// none. A message whose id `to` already holds is kept there as it is, as a second
    /// push of that id would be. Returns how many were moved.
    ///
    /// Batches of up to 1000: each is pushed to `to` first and then deleted here, so a
    /// crash or an error loses nothing (moving again pushes the rest). A message that a
    /// consumer of this queue claims between the two steps stays here and its copy is
    /// taken back from `to` unless `to` started it already: then it runs on both,
    /// which stopping this queue's pools for the move avoids. A message that `to`
    /// cannot hold (an id or payload past its limits, an `expire_after` for the seed
    /// layout) stops the move with an error naming it, before its batch is written.
    pub fn move_waiting(&self, to: &Queue) -> Result<u64> {
        if self.inner.endpoint.display == to.inner.endpoint.display && self.inner.parts[0].all == to.inner.parts[0].all
        {
            return Err(Error::invalid(
                "to",
                "names this very queue: a queue cannot move to itself",
            ));
        }
        let mut moved = 0;
        loop {
            let listed = self.list(Listing::Waiting, MAX_BATCH)?;
            if listed.is_empty() {
                return Ok(moved);
            }
            // A payload the listing left out is read whole, one message at a time;
            // one that no longer waits is no longer the move's.
            let mut batch = Vec::with_capacity(listed.len());
            for m in listed {
                if m.payload_omitted_bytes.is_none() {
                    batch.push(m);
                } else if let Some(whole) = self.get(&m.id)?
                    && matches!(whole.state, State::Scheduled | State::Ready)
                {
                    batch.push(whole);
                }
            }
            let copies = batch.iter().map(|m| to.copy_of(m)).collect::<Result<Vec<_>>>()?;
            to.push_many(&copies)?;
            let ids: Vec<String> = batch.iter().map(|m| m.id.clone()).collect();
            let taken = self.take_waiting(&ids, "moved")?;
            moved += taken.len() as u64;
            for m in batch.iter().filter(|m| !taken.contains(&m.id)) {
                // Claimed here (or cancelled) since the list: take the copy back, if
                // it is still the one this pass pushed and still waits.
                let ours = to.get(&m.id)?.is_some_and(|c| {
                    matches!(c.state, State::Scheduled | State::Ready) && c.payload_json == m.payload_json
                });
                if ours {
                    to.cancel(&m.id)?;
                }
            }
        }
    }

    /// `m`, read from another queue, as a push to this one.
    pub(super) fn copy_of(&self, m: &MessageInfo) -> Result<NewMessage> {
        let refuse = |reason: String| {
            Error::invalid(
                "to",
                format!(
                    "the target queue cannot hold message {:?}: {reason}; cancel or change that message, then move again (its batch was not moved)",
                    m.id
                ),
            )
        };
        validate_id(&m.id).map_err(|e| refuse(e.to_string()))?;
        let payload_json = PayloadJson::from(m.payload_json.as_str());
        payload_json
            .validate(self.inner.opts.max_payload_bytes)
            .map_err(|e| refuse(e.to_string()))?;
        let due_ms = m.due_at_ms.unwrap_or(0);
        let expire_after = m
            .expires_at_ms
            .map(|deadline| Duration::from_millis(u64::try_from(deadline - due_ms).unwrap_or(0).max(1)));
        expire_after_ms(&self.inner.opts.layout, expire_after).map_err(|e| refuse(e.to_string()))?;
        Ok(NewMessage {
            payload_json: PayloadJson::checked(payload_json.into_string()),
            due: Due::AtUnixMs(due_ms),
            options: PushOptions {
                id: Some(m.id.clone()),
                max_attempts: m.max_attempts,
                expire_after,
                serial_key: m.serial_key.clone(),
                group: m.group.clone(),
                ..PushOptions::default()
            },
        })
    }

    /// Move a waiting message to a new due time. `false` when it is not waiting.
    pub fn reschedule(&self, id: &str, due: impl Into<Due>) -> Result<bool> {
        validate_id(id)?;
        let args = admin::Reschedule {
            id,
            due: due.into().validate()?,
        };
        let admin::Moved(due) = self.call_by_id(
            id,
            "reschedule",
            Replay::Safe,
            admin::reschedule(),
            |inv| args.add_to(inv),
            |admin::Moved(due): &admin::Moved| due.is_some(),
        )?;
        Ok(due.is_some())
    }
}
