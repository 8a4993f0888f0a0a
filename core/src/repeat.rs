//! Repeating messages: a named schedule (every N seconds, or a cron pattern in a time
//! zone) that pushes one ordinary message per occurrence, with the id
//! `repeat:<name>:<due_ms>`.
//!
//! Redis holds the definitions and, per repeat, the due time of the latest occurrence
//! pushed (its mark); a script pushes an occurrence only past the mark, so each runs
//! once however many pools compute it. The pool that claims an occurrence pushes the
//! next one (cron patterns cannot be evaluated in Lua); should that fail, or should
//! purge or cancel take the occurrence, a claim about once a minute asks Redis which
//! repeats have none waiting or running, and the pool pushes their next one then.
//! Occurrences missed while no pool ran are not made up for: the next one is the first
//! after now (an occurrence already waiting still runs, late).

use std::str::FromStr as _;
use std::time::Duration;

use chrono::{TimeZone as _, Utc};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::{Error, Result};
use crate::time::MAX_DELAY;

/// When a repeating message recurs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Schedule {
    /// Every interval (at least a second), the first one an interval from now.
    Every(Duration),
    /// A cron pattern (5 fields, or 6 with seconds first; `@daily` and the like), read
    /// in an IANA time zone (`UTC` unless given), so that "0 2 * * *" in
    /// `Asia/Shanghai` is 02:00 there, daylight saving time included.
    Cron {
        /// The cron pattern, as given.
        pattern: String,
        /// The IANA time zone it is read in.
        tz: String,
    },
}

/// The shortest interval of `Schedule::Every`.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

impl Schedule {
    /// Every `interval`; refused below one second or above 100 years.
    pub fn every(interval: Duration) -> Result<Self> {
        if interval < MIN_INTERVAL || interval > MAX_DELAY {
            return Err(Error::invalid(
                "schedule",
                format!("an interval must be 1 second to 100 years, got {interval:?}"),
            ));
        }
        Ok(Self::Every(interval))
    }

    /// An interval as the bindings receive it: `seconds`, with the time zone they may
    /// pass along refused (it would be silently ignored: only patterns have one).
    pub fn every_secs(seconds: f64, tz: Option<&str>) -> Result<Self> {
        if tz.is_some() {
            return Err(Error::invalid("tz", "applies to cron patterns, not to intervals"));
        }
        Self::every(crate::time::delay_from_secs("schedule", seconds)?)
    }

    /// A cron pattern in time zone `tz` (an IANA name such as `Europe/Berlin`; `None`
    /// means UTC). Both are checked here, so a bad one is refused before anything is
    /// written.
    pub fn cron(pattern: &str, tz: Option<&str>) -> Result<Self> {
        let tz = tz.unwrap_or("UTC");
        let schedule = Self::Cron {
            pattern: pattern.trim().to_owned(),
            tz: tz.to_owned(),
        };
        schedule.parsed()?;
        Ok(schedule)
    }

    fn parsed(&self) -> Result<Option<(croner::Cron, chrono_tz::Tz)>> {
        let Self::Cron { pattern, tz } = self else {
            return Ok(None);
        };
        let cron = croner::Cron::from_str(pattern)
            .map_err(|e| Error::invalid("schedule", format!("{pattern:?} is not a cron pattern: {e}")))?;
        let zone = chrono_tz::Tz::from_str(tz)
            .map_err(|_| Error::invalid("tz", format!("{tz:?} is not an IANA time zone name")))?;
        Ok(Some((cron, zone)))
    }

    /// The first occurrence after `previous_ms` that is also after `now_ms` (Unix ms):
    /// occurrences missed while no pool ran are skipped. `None` when a cron pattern has
    /// no later match.
    pub fn next_after(&self, previous_ms: Option<i64>, now_ms: i64) -> Option<i64> {
        match self {
            Self::Every(interval) => {
                let step = i64::try_from(interval.as_millis()).ok()?.max(1);
                let Some(previous) = previous_ms else {
                    return now_ms.checked_add(step);
                };
                let next = previous.checked_add(step)?;
                if next > now_ms {
                    return Some(next);
                }
                let behind = (now_ms - previous) / step + 1;
                previous.checked_add(behind.checked_mul(step)?)
            }
            Self::Cron { .. } => {
                let (cron, zone) = self.parsed().ok()??;
                let from = previous_ms.map_or(now_ms, |p| p.max(now_ms));
                // Patterns match whole seconds; croner keeps the start's fraction.
                let from = from - from.rem_euclid(1000);
                let start = Utc.timestamp_millis_opt(from).single()?.with_timezone(&zone);
                let next = cron.find_next_occurrence(&start, false).ok()?;
                Some(next.timestamp_millis())
            }
        }
    }

    /// How it is stored and shown: `every 60s` (whole seconds when it is) or the cron
    /// pattern.
    pub fn describe(&self) -> String {
        match self {
            Self::Every(d) if d.subsec_millis() == 0 => format!("every {}s", d.as_secs()),
            Self::Every(d) => format!("every {}ms", d.as_millis()),
            Self::Cron { pattern, .. } => pattern.clone(),
        }
    }
}

/// What each occurrence of a repeating message is pushed with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RepeatOptions {
    /// Deliveries allowed per occurrence (overrides the worker's `max_attempts`).
    pub max_attempts: Option<u32>,
    /// An occurrence that cannot start within this long after its due time goes to
    /// the dead-letter set unrun (`PushOptions::expire_after`): "sync every 5
    /// minutes" has no use for a run 20 minutes late after an outage.
    pub expire_after: Option<Duration>,
}

impl RepeatOptions {
    /// Each occurrence's own `max_attempts`.
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n);
        self
    }

    /// Each occurrence's own `expire_after`.
    #[must_use]
    pub fn expire_after(mut self, d: Duration) -> Self {
        self.expire_after = Some(d);
        self
    }
}

/// A repeating message as stored.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RepeatInfo {
    /// Its name, unique in the queue.
    pub name: String,
    /// When its occurrences are due.
    pub schedule: Schedule,
    /// The payload of every occurrence, as JSON text.
    pub payload_json: String,
    /// See [`RepeatOptions::max_attempts`].
    pub max_attempts: Option<u32>,
    /// See [`RepeatOptions::expire_after`].
    pub expire_after: Option<Duration>,
    /// Due time of the latest occurrence pushed (Unix ms): the pending one, or the one
    /// that ran last while its successor is being pushed.
    pub next_due_ms: Option<i64>,
}

/// The stored definition: JSON text that the scripts compare whole, never parse.
/// `expire_after_ms` is written only when set, so definitions made before it existed
/// read the same and a deploy that repeats them changes nothing.
pub(crate) fn definition(schedule: &Schedule, payload_json: &str, options: &RepeatOptions) -> String {
    let text = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
    let schedule = match schedule {
        Schedule::Every(d) => format!(r#"{{"every_ms":{}}}"#, d.as_millis()),
        Schedule::Cron { pattern, tz } => format!(r#"{{"cron":{},"tz":{}}}"#, text(pattern), text(tz)),
    };
    let limit = options
        .max_attempts
        .map_or_else(|| "null".to_owned(), |n| n.to_string());
    let expiry = options
        .expire_after
        .map_or_else(String::new, |d| format!(r#","expire_after_ms":{}"#, d.as_millis()));
    format!(r#"{{"v":1,"schedule":{schedule},"max_attempts":{limit}{expiry},"payload":{payload_json}}}"#)
}

#[derive(Deserialize)]
struct StoredSchedule {
    every_ms: Option<u64>,
    cron: Option<String>,
    tz: Option<String>,
}

#[derive(Deserialize)]
struct Stored<'a> {
    schedule: StoredSchedule,
    max_attempts: Option<u32>,
    expire_after_ms: Option<u64>,
    #[serde(borrow)]
    payload: &'a RawValue,
}

/// A definition read back, with the payload's JSON text as pushed.
pub(crate) fn parse_definition(name: &str, text: &str) -> Result<(Schedule, String, RepeatOptions)> {
    let bad = |why: String| Error::Redis(format!("repeat {name:?} has an unreadable definition: {why}"));
    let stored: Stored<'_> = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let schedule = match stored.schedule {
        StoredSchedule { every_ms: Some(ms), .. } => Schedule::Every(Duration::from_millis(ms)),
        StoredSchedule {
            cron: Some(pattern),
            tz,
            ..
        } => Schedule::Cron {
            pattern,
            tz: tz.unwrap_or_else(|| "UTC".to_owned()),
        },
        _ => return Err(bad("no schedule".into())),
    };
    let options = RepeatOptions {
        max_attempts: stored.max_attempts,
        expire_after: stored.expire_after_ms.map(Duration::from_millis),
    };
    Ok((schedule, stored.payload.get().to_owned(), options))
}

/// The name and due time of an occurrence id, or `None` for another id.
pub(crate) fn occurrence_of(id: &str) -> Option<(&str, i64)> {
    let (name, due) = id.strip_prefix("repeat:")?.rsplit_once(':')?;
    Some((name, due.parse().ok()?))
}

pub(crate) fn occurrence_id(name: &str, due_ms: i64) -> String {
    format!("repeat:{name}:{due_ms}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: i64 = 3_600_000;

    #[test]
    fn intervals_skip_what_was_missed_and_never_drift() {
        let every = Schedule::every(Duration::from_secs(60)).expect("valid");
        assert_eq!(every.next_after(None, 1_000), Some(61_000));
        assert_eq!(
            every.next_after(Some(61_000), 61_005),
            Some(121_000),
            "from the last due time, not from now"
        );
        assert_eq!(
            every.next_after(Some(61_000), 300_000),
            Some(301_000),
            "missed ones skipped"
        );
        assert!(Schedule::every(Duration::from_millis(999)).is_err());
    }

    #[test]
    fn cron_patterns_follow_their_time_zone() {
        // 2026-11-30 00:00:00 UTC.
        let midnight = 1_795_996_800_000;
        let utc = Schedule::cron("0 2 * * *", None).expect("valid");
        assert_eq!(utc.next_after(None, midnight), Some(midnight + 2 * HOUR));
        let shanghai = Schedule::cron("0 2 * * *", Some("Asia/Shanghai")).expect("valid");
        // 02:00 in Shanghai (UTC+8) is 18:00 UTC of the day before: next is that day's.
        assert_eq!(shanghai.next_after(None, midnight), Some(midnight + 18 * HOUR));
        assert_eq!(
            shanghai.next_after(Some(midnight + 18 * HOUR), midnight + 18 * HOUR),
            Some(midnight + 42 * HOUR)
        );
        let seconds = Schedule::cron("*/30 * * * * *", None).expect("six fields: seconds first");
        assert_eq!(seconds.next_after(None, midnight), Some(midnight + 30_000));
        assert_eq!(
            seconds.next_after(None, midnight + 741),
            Some(midnight + 30_000),
            "whole seconds"
        );
        assert_eq!(
            seconds.next_after(Some(midnight + 30_000), midnight + 30_002),
            Some(midnight + 60_000)
        );
    }

    #[test]
    fn bad_patterns_and_zones_are_named() {
        let err = Schedule::cron("61 * * * *", None).expect_err("minute 61");
        assert!(err.to_string().contains("not a cron pattern"), "{err}");
        let err = Schedule::cron("0 2 * * *", Some("Mars/Olympus")).expect_err("no such zone");
        assert!(err.to_string().contains("IANA time zone"), "{err}");
    }

    #[test]
    fn definitions_read_back_as_written() {
        let cron = Schedule::cron("0 2 * * *", Some("Europe/Berlin")).expect("valid");
        let options = RepeatOptions::default()
            .max_attempts(3)
            .expire_after(Duration::from_millis(1500));
        let text = definition(&cron, r#"{"big":9223372036854775807}"#, &options);
        let (schedule, payload, read) = parse_definition("n", &text).expect("readable");
        assert_eq!(
            (schedule, payload.as_str(), read),
            (cron.clone(), r#"{"big":9223372036854775807}"#, options)
        );
        // Definitions stored before expire_after existed must stay byte for byte what
        // they were, or every deploy would replace them.
        assert_eq!(
            definition(&cron, "1", &RepeatOptions::default().max_attempts(3)),
            r#"{"v":1,"schedule":{"cron":"0 2 * * *","tz":"Europe/Berlin"},"max_attempts":3,"payload":1}"#
        );
        assert_eq!(occurrence_of(&occurrence_id("a:b", 42)), Some(("a:b", 42)));
        assert_eq!(occurrence_of("repeat:x"), None);
        assert_eq!(occurrence_of("01a2-uuid"), None);
    }
}
