//! Repeating messages as the queue's calls: define, remove and list them, and the
//! pool's side (definitions, next occurrences).

use serde::Serialize;

use crate::conn::Replay;
use crate::error::{Error, Result};
use crate::keys::partition_of;
use crate::payload::to_json;
use crate::repeat::{RepeatInfo, RepeatOptions, Schedule};
use crate::scripts::repeat as repeat_script;
use crate::scripts::replies::Flag;
use crate::{PayloadJson, Queue, envelope, repeat};

use super::validate::{expire_after_ms, validate_max_attempts, validate_repeat_name};

impl Queue {
    /// Define a repeating message, or change one: `name` pushes `payload` once per
    /// occurrence of `schedule`, as an ordinary message with the id
    /// `repeat:<name>:<due_ms>` (retries, dead letters and the rest as usual). Calling
    /// it again with the same schedule and payload changes nothing, so a deploy may call
    /// it every time; a different one replaces the definition and its waiting
    /// occurrence. Consumer pools push each next occurrence (see the `repeat` module).
    /// Returns the due time (Unix ms) of the next occurrence.
    pub fn repeat<T: Serialize + ?Sized>(&self, name: &str, schedule: &Schedule, payload: &T) -> Result<i64> {
        self.repeat_json(name, schedule, to_json(payload)?, &RepeatOptions::default())
    }

    /// `repeat` with the payload as JSON text and options for every occurrence.
    pub fn repeat_json(
        &self,
        name: &str,
        schedule: &Schedule,
        payload_json: impl Into<PayloadJson>,
        options: &RepeatOptions,
    ) -> Result<i64> {
        validate_repeat_name(name)?;
        let payload_json = payload_json.into();
        payload_json.validate(self.inner.opts.max_payload_bytes)?;
        let payload_json = payload_json.as_str();
        validate_max_attempts(&self.inner.opts.layout, options.max_attempts)?;
        let expire_after = expire_after_ms(&self.inner.opts.layout, options.expire_after)?;
        let now = crate::time::now_unix_ms();
        let first = schedule
            .next_after(None, now)
            .ok_or_else(|| Error::invalid("schedule", format!("{} never occurs after now", schedule.describe())))?;
        let definition = repeat::definition(schedule, payload_json, options);
        let envelope = envelope::encode(
            &self.inner.opts.layout,
            &repeat::occurrence_id(name, first),
            payload_json,
            options.max_attempts,
            expire_after,
            now,
            None,
        );
        let args = repeat_script::Occurrence {
            name,
            definition: &definition,
            due_ms: first,
            envelope: &envelope,
        };
        self.call(
            self.repeat_partition(name),
            "repeat",
            Replay::Safe,
            repeat_script::set(),
            |inv| args.add_to(inv),
        )
    }

    /// Stop a repeating message; its occurrence that still waits is cancelled (one
    /// that runs finishes). Returns whether it existed.
    pub fn unrepeat(&self, name: &str) -> Result<bool> {
        validate_repeat_name(name)?;
        let Flag(existed) = self.call(
            self.repeat_partition(name),
            "unrepeat",
            Replay::Safe,
            repeat_script::delete(),
            |inv| repeat_script::Named { name }.add_to(inv),
        )?;
        Ok(existed)
    }

    /// Every repeating message of the queue, by name.
    pub fn repeats(&self) -> Result<Vec<RepeatInfo>> {
        let mut all = Vec::new();
        for part in 0..self.partitions() {
            for repeat_script::Definition { name, definition, mark } in self.repeat_definitions(part, "")? {
                let (schedule, payload_json, options) = repeat::parse_definition(&name, &definition)?;
                all.push(RepeatInfo {
                    name,
                    schedule,
                    payload_json,
                    max_attempts: options.max_attempts,
                    expire_after: options.expire_after,
                    next_due_ms: mark,
                });
            }
        }
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    pub(crate) fn repeat_partition(&self, name: &str) -> usize {
        partition_of(name, self.partitions())
    }

    /// (name, definition text, mark) of one repeat (`name`) or all (`""`).
    pub(crate) fn repeat_definitions(&self, part: usize, name: &str) -> Result<Vec<repeat_script::Definition>> {
        let repeat_script::Definitions(all) =
            self.call(part, "repeats", Replay::Safe, repeat_script::list(), |inv| {
                repeat_script::Named { name }.add_to(inv);
            })?;
        Ok(all)
    }

    /// Push the occurrence of a repeat that follows the one due at `previous_ms` (and
    /// now), computed from `definition` as read from Redis. Returns whether one was
    /// pushed (not when another pool was first, or the definition changed meanwhile).
    pub(crate) fn push_next_occurrence(
        &self,
        part: usize,
        name: &str,
        definition: &str,
        previous_ms: Option<i64>,
    ) -> Result<bool> {
        let (schedule, payload_json, options) = repeat::parse_definition(name, definition)?;
        let now = crate::time::now_unix_ms();
        let Some(due) = schedule.next_after(previous_ms, now) else {
            return Ok(false);
        };
        // Taken as stored: the definition was checked when it was written.
        let expire_after = options
            .expire_after
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let envelope = envelope::encode(
            &self.inner.opts.layout,
            &repeat::occurrence_id(name, due),
            &payload_json,
            options.max_attempts,
            expire_after,
            now,
            None,
        );
        let args = repeat_script::Occurrence {
            name,
            definition,
            due_ms: due,
            envelope: &envelope,
        };
        let Flag(pushed) = self.call(part, "repeat_next", Replay::Safe, repeat_script::next(), |inv| {
            args.add_to(inv);
        })?;
        Ok(pushed)
    }
}
