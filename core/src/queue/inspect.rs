//! Reading a queue: `get`, listings, `find`/`find_field`, stats per queue and
//! partition, and the live pools (`workers`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::conn::Replay;
use crate::error::{Error, Result};
use crate::scripts::{MAX_BATCH, inspect};
use crate::{
    Layout, Listing, MAX_ERROR_TEXT_BYTES, MAX_ID_BYTES, MessageInfo, Queue, RateLimit, State, Stats, WorkerInfo,
    envelope,
};

use super::earliest;
use super::validate::validate_id;
use super::views::live_pool;

impl Queue {
    /// Everything known about one message, or `None` when the id is unknown: its
    /// payload, error and trace whole, however large (the listings bound them).
    pub fn get(&self, id: &str) -> Result<Option<MessageInfo>> {
        self.get_bounded(id, inspect::Bounds::WHOLE)
    }

    /// The bounds of a listing that shows stored messages up to `max_payload_bytes`.
    pub(super) fn listing_bounds(max_payload_bytes: usize) -> inspect::Bounds {
        inspect::Bounds {
            envelope: max_payload_bytes,
            error: MAX_ERROR_TEXT_BYTES,
            trace: Self::LISTED_TRACE_BYTES,
        }
    }

    fn get_bounded(&self, id: &str, bounds: inspect::Bounds) -> Result<Option<MessageInfo>> {
        validate_id(id)?;
        let args = inspect::Get { id, bounds };
        let inspect::Found(record) = self.call_by_id(
            id,
            "get",
            Replay::Safe,
            inspect::get(),
            |inv| args.add_to(inv),
            |inspect::Found(record): &inspect::Found| record.is_some(),
        )?;
        Ok(record.map(|r| self.message_info(id.to_owned(), r)))
    }

    /// The first `limit` (1 to 1000) messages of one state, from every partition, in
    /// the order consumers meet them: waiting ones by due time, running ones by lease
    /// deadline; completed ones (kept with `keep_completed`) latest first. For a look at a queue (what is next, what runs, what hangs), not for
    /// consuming it: the list is a snapshot and may be stale as soon as it returns.
    pub fn list(&self, which: Listing, limit: usize) -> Result<Vec<MessageInfo>> {
        self.list_page(which, 0, limit)
    }

    /// As [`Queue::list`], after skipping the first `start` (at most
    /// [`MAX_PAGE_START`](crate::MAX_PAGE_START)): one page of a listing, for paging through it.
    pub fn list_page(&self, which: Listing, start: usize, limit: usize) -> Result<Vec<MessageInfo>> {
        self.list_page_with(which, start, limit, Self::LISTED_PAYLOAD_BYTES)
    }

    /// As [`Queue::list_page`], showing stored messages up to `max_payload_bytes`
    /// whole (`usize::MAX`: all, however large) rather than up to
    /// [`Queue::LISTED_PAYLOAD_BYTES`]; a larger one comes with
    /// `payload_omitted_bytes` and no payload. Errors and traces are cut as
    /// [`MessageInfo::error_trace`] says.
    pub fn list_page_with(
        &self,
        which: Listing,
        start: usize,
        limit: usize,
        max_payload_bytes: usize,
    ) -> Result<Vec<MessageInfo>> {
        if limit > MAX_BATCH {
            return Err(Error::invalid(
                "limit",
                format!("at most {MAX_BATCH} messages per call, got {limit}"),
            ));
        }
        let fetch = |part: usize, start: usize, limit: usize| {
            let args = inspect::List {
                which: which.as_str(),
                limit,
                start,
                bounds: Self::listing_bounds(max_payload_bytes),
            };
            let inspect::Listed(listed) = self.call(part, "list", Replay::Safe, inspect::list(), |inv| {
                args.add_to(inv);
            })?;
            Ok(listed.into_iter().map(|(id, r)| self.message_info(id, r)).collect())
        };
        // Each partition's list is in order already; merge them the same way.
        self.page(start, limit, fetch, |all: &mut Vec<MessageInfo>| match which {
            Listing::Waiting => all.sort_by_key(|m| m.due_at_ms),
            Listing::Inflight => all.sort_by_key(|m| m.lease_until_ms),
            Listing::Completed => all.sort_by_key(|m| std::cmp::Reverse(m.completed_at_ms)),
        })
    }

    /// Up to `limit` (0 to 1000) messages whose payload contains `text` (plain
    /// text, not a pattern), or whose id is `text`, in any state: waiting, running, dead, or completed and
    /// kept (`keep_completed`). For operators with an order number and a generated
    /// message id ("where is the job of order 10086?"): it scans the queue, in steps of
    /// 1000 entries so that Redis is never blocked for long, comparing on the server,
    /// so its cost grows with the queue; not for the hot path. Messages written or
    /// deleted during the scan may be missed. What it finds comes as the listings
    /// show it: a stored message past [`Queue::LISTED_PAYLOAD_BYTES`] with
    /// `payload_omitted_bytes` and no payload (then the text may have matched its
    /// metadata rather than its payload).
    pub fn find(&self, text: &str, limit: usize) -> Result<Vec<MessageInfo>> {
        if text.is_empty() || text.len() > MAX_ID_BYTES {
            return Err(Error::invalid(
                "text",
                format!("must be 1 to {MAX_ID_BYTES} bytes, got {}", text.len()),
            ));
        }
        // What matched may be the envelope's metadata rather than the payload, the id
        // among it: a generated id is random hex, where an order number turns up by
        // chance.
        self.scan_for(text, limit, |info| {
            info.id == text || info.payload_json.contains(text) || info.payload_omitted_bytes.is_some()
        })
    }

    /// Up to `limit` (0 to 1000) messages whose payload is an object with the field
    /// `field` equal to `value` (a string, number, bool or null; `10086` is not
    /// `"10086"` nor `100861`), in any state, as [`find`](Self::find) looks: for an
    /// order number that is also a substring of others. It scans as `find` does, for
    /// `"field":value` as delayq writes JSON (without spaces), then compares exactly,
    /// except for a message whose payload is left out (as `find` says): it is kept
    /// on the server's match alone.
    pub fn find_field(&self, field: &str, value: &serde_json::Value, limit: usize) -> Result<Vec<MessageInfo>> {
        if field.is_empty() || field.len() > MAX_ID_BYTES {
            return Err(Error::invalid(
                "field",
                format!("must be 1 to {MAX_ID_BYTES} bytes, got {}", field.len()),
            ));
        }
        if value.is_array() || value.is_object() {
            return Err(Error::invalid(
                "value",
                "must be a string, a number, a bool or null (compare whole objects with find)",
            ));
        }
        let needle = format!("{}:{value}", serde_json::Value::String(field.to_owned()));
        if needle.len() > 2 * MAX_ID_BYTES {
            return Err(Error::invalid(
                "value",
                format!(
                    "must be at most {MAX_ID_BYTES} bytes as JSON, got {}",
                    value.to_string().len()
                ),
            ));
        }
        self.scan_for(&needle, limit, |info| {
            info.payload_omitted_bytes.is_some()
                || serde_json::from_str::<serde_json::Value>(&info.payload_json)
                    .is_ok_and(|payload| payload.get(field) == Some(value))
        })
    }

    /// The scan behind `find` and `find_field`: messages whose stored text contains
    /// `text` (compared on the server), kept when `matches` says so.
    pub(super) fn scan_for(
        &self,
        text: &str,
        limit: usize,
        matches: impl Fn(&MessageInfo) -> bool,
    ) -> Result<Vec<MessageInfo>> {
        if limit > MAX_BATCH {
            return Err(Error::invalid(
                "limit",
                format!("at most {MAX_BATCH} messages per call, got {limit}"),
            ));
        }
        let mut seen = BTreeSet::new();
        let mut found = Vec::new();
        for part in 0..self.partitions() {
            for which in ["messages", "completed"] {
                let mut cursor = "0".to_owned();
                loop {
                    if found.len() >= limit {
                        return Ok(found);
                    }
                    let args = inspect::Find {
                        which,
                        cursor: &cursor,
                        text,
                        count: MAX_BATCH,
                    };
                    let step: inspect::FindStep = self.call(part, "find", Replay::Safe, inspect::find(), |inv| {
                        args.add_to(inv);
                    })?;
                    cursor = step.cursor;
                    for id in step.ids {
                        // A re-pushed completed id shows its new message.
                        if found.len() < limit
                            && seen.insert(id.clone())
                            && let Some(info) =
                                self.get_bounded(&id, Self::listing_bounds(Self::LISTED_PAYLOAD_BYTES))?
                            && matches(&info)
                        {
                            found.push(info);
                        }
                    }
                    if cursor == "0" {
                        break;
                    }
                }
            }
        }
        Ok(found)
    }

    pub(super) fn message_info(&self, id: String, r: inspect::Record) -> MessageInfo {
        // The seed layout's bare payloads carry no stamp, and only a running message a mark.
        let cancelled = r.state == State::Inflight
            && matches!(self.inner.opts.layout, Layout::Native)
            && envelope::cancel_marked(&r.stored);
        let decoded = envelope::decode(&self.inner.opts.layout, &r.stored)
            .ok()
            .filter(|_| r.omitted_bytes.is_none())
            .map(|d| (d.payload_json.to_owned(), d.max_attempts, d.created_ms, d.expiry));
        let (payload_json, max_attempts, created_at_ms, expiry) = decoded.unwrap_or((r.stored, None, None, None));
        MessageInfo {
            id,
            state: r.state,
            payload_json,
            payload_omitted_bytes: r.omitted_bytes,
            due_at_ms: r.due_ms,
            attempts: r.attempts,
            max_attempts,
            last_error: r.last_error,
            error_trace: r.error_trace,
            dead_at_ms: r.dead_at_ms,
            created_at_ms,
            lease_until_ms: r.lease_until_ms,
            expires_at_ms: expiry.map(|(_, deadline)| deadline),
            completed_at_ms: r.completed_at_ms,
            held: r
                .held
                .map(|h| held_text(&h, r.serial_key.as_deref(), r.group.as_deref())),
            serial_key: r.serial_key,
            group: r.group,
            cancelled,
        }
    }

    /// Depth by state and lifetime counters, summed over the partitions.
    pub fn stats(&self) -> Result<Stats> {
        self.stats_with(Replay::Safe)
    }

    pub(crate) fn stats_with(&self, replay: Replay) -> Result<Stats> {
        let mut total = Stats::default();
        for part in 0..self.partitions() {
            let s = self.partition_stats_with(part, replay)?;
            total.scheduled += s.scheduled;
            total.ready += s.ready;
            total.inflight += s.inflight;
            total.dead += s.dead;
            total.completed += s.completed;
            total.held += s.held;
            total.next_due_ms = earliest(total.next_due_ms, s.next_due_ms);
            total.paused_at_ms = earliest(total.paused_at_ms, s.paused_at_ms);
            // Every partition holds the queue's whole limit beside its own share.
            total.rate_limit = total.rate_limit.or(s.rate_limit);
            for (k, v) in s.totals {
                *total.totals.entry(k).or_insert(0) += v;
            }
        }
        Ok(total)
    }

    /// Depth and counters of one partition (0 for an unpartitioned queue).
    pub fn partition_stats(&self, part: usize) -> Result<Stats> {
        self.partition_stats_with(part, Replay::Safe)
    }

    pub(super) fn partition_stats_with(&self, part: usize, replay: Replay) -> Result<Stats> {
        if part >= self.partitions() {
            return Err(Error::invalid(
                "partition",
                format!("this queue has partitions 0 to {}, not {part}", self.partitions() - 1),
            ));
        }
        let d: inspect::Depth = self.call(part, "stats", replay, inspect::stats(), |_| {})?;
        let rate_limit = d.rate_limit.map(|(max, per_ms)| RateLimit {
            max: u32::try_from(max).unwrap_or(u32::MAX),
            per: Duration::from_millis(per_ms),
        });
        Ok(Stats {
            scheduled: d.waiting.saturating_sub(d.ready),
            ready: d.ready,
            inflight: d.inflight,
            dead: d.dead,
            completed: d.completed,
            held: d.held,
            next_due_ms: d.next_due_ms,
            paused_at_ms: d.paused_at_ms,
            rate_limit,
            totals: d.counters.into_iter().collect(),
        })
    }
}

impl Queue {
    /// The consumer pools working on this queue, from every host and language, oldest
    /// first. A pool renews its entry in the partition its claim goes to, so the
    /// partitions' lists are merged, each pool at its latest renewal.
    pub fn workers(&self) -> Result<Vec<WorkerInfo>> {
        let mut latest: BTreeMap<String, WorkerInfo> = BTreeMap::new();
        for part in 0..self.partitions() {
            let pools: inspect::Pools = self.call(part, "workers", Replay::Safe, inspect::workers(), |_| {})?;
            let now = pools.now_ms;
            for info in pools.entries.iter().filter_map(|(_, entry)| live_pool(entry, now)) {
                if latest
                    .get(&info.id)
                    .is_none_or(|seen| seen.last_seen_ms < info.last_seen_ms)
                {
                    latest.insert(info.id.clone(), info);
                }
            }
        }
        let mut out: Vec<WorkerInfo> = latest.into_values().collect();
        out.sort_by(|a, b| (a.started_at_ms, &a.id).cmp(&(b.started_at_ms, &b.id)));
        Ok(out)
    }
}

/// Why a message waits in its line, in words.
fn held_text(held: &inspect::Held, serial_key: Option<&str>, group: Option<&str>) -> String {
    let key = serial_key.unwrap_or_default();
    let group = group.unwrap_or_default();
    match held {
        inspect::Held::Serial(Some(holder)) => format!("serial key {key:?} runs message {holder}"),
        inspect::Held::Serial(None) => format!("waits in serial key {key:?}'s line"),
        inspect::Held::Concurrency { running, limit } => {
            format!("group {group:?} runs {running} of its concurrency limit of {limit}")
        }
        inspect::Held::Rate { used, max, per_ms } => format!(
            "group {group:?} started {used} in its rate limit's window ({max} per {})",
            crate::time::human_ms(i64::try_from(*per_ms).unwrap_or(i64::MAX))
        ),
        inspect::Held::Line => format!("waits in group {group:?}'s line"),
    }
}
