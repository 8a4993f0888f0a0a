//! Per-minute records of a queue, for charts of its last hour (`Queue::minutes`, the
//! dashboard): messages handled and failed, how late handlers started (a histogram
//! with log-spaced buckets, fine enough for p50 and p99), and the backlog (scheduled,
//! ready, in flight) sampled once a minute.
//!
//! Consumer pools count what their handlers do in a [`Tally`], by partition and by
//! minute of the queue's clock, and add it to the partition's `minutes` HASH at their
//! heartbeat (minutes_add.lua), which also samples the backlog for the minute when no
//! pool has yet. A pool with nothing new calls only when a new minute needs its
//! sample. The HASH keeps [`KEEP_MINUTES`] minutes and expires when nobody writes.
//!
//! Wire formats (Lua mirrors them in minutes_add.lua):
//! - a pool's delta: `"<minute> <handled> <failed>[ <bucket>:<count>...]"`;
//! - a stored minute, field `<minute>`:
//!   `"<handled> <failed> <scheduled> <ready> <inflight>[ <bucket>:<count>...]"`, the
//!   backlog `-1` while unsampled.
//!
//! A minute is Unix ms / 60 000 on the queue's clock.

use std::collections::BTreeMap;

use parking_lot::Mutex;

/// Minutes a queue's records keep (the dashboard charts the last hour of them).
pub const KEEP_MINUTES: u32 = 90;

/// Length of one record, ms.
pub const MINUTE_MS: i64 = 60_000;

/// Lateness buckets per doubling: each spans a factor of 2^(1/4), about 19 %, so a
/// quantile read from them is off by at most about 9 %.
const BUCKETS_PER_DOUBLING: f64 = 4.0;

/// The highest bucket: lateness past 2^40 ms (decades) lands there.
const MAX_BUCKET: u16 = 160;

/// The minute of a time on the queue's clock (Unix ms).
pub fn minute_of(ms: i64) -> i64 {
    ms.div_euclid(MINUTE_MS)
}

/// The histogram bucket of a lateness: 0 for none, then log-spaced.
pub(crate) fn lateness_bucket(ms: i64) -> u16 {
    if ms <= 0 {
        return 0;
    }
    let k = 1.0 + ((ms as f64).log2() * BUCKETS_PER_DOUBLING).floor();
    (k as u16).min(MAX_BUCKET)
}

/// The lateness (ms) that stands for bucket `k`: the geometric middle of its span.
pub(crate) fn bucket_value_ms(k: u16) -> f64 {
    if k == 0 {
        return 0.0;
    }
    2f64.powf((f64::from(k) - 0.5) / BUCKETS_PER_DOUBLING)
}

/// The `q` quantile (0 < q <= 1) of a histogram, ms; `None` when it is empty.
pub(crate) fn quantile_ms(histogram: &BTreeMap<u16, u64>, q: f64) -> Option<f64> {
    let total: u64 = histogram.values().sum();
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (&k, &n) in histogram {
        seen += n;
        if seen >= rank {
            return Some(bucket_value_ms(k));
        }
    }
    histogram.keys().next_back().map(|&k| bucket_value_ms(k))
}

/// What one pool's handlers did in one minute of one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Delta {
    pub(crate) handled: u64,
    pub(crate) failed: u64,
    pub(crate) lateness: BTreeMap<u16, u64>,
}

impl Delta {
    fn merge(&mut self, other: &Self) {
        self.handled += other.handled;
        self.failed += other.failed;
        for (&k, &n) in &other.lateness {
            *self.lateness.entry(k).or_insert(0) += n;
        }
    }

    /// The wire form for minutes_add.lua.
    pub(crate) fn encode(&self, minute: i64) -> String {
        let mut out = format!("{minute} {} {}", self.handled, self.failed);
        for (k, n) in &self.lateness {
            out.push_str(&format!(" {k}:{n}"));
        }
        out
    }
}

/// What the partitions of a pool have to send: deltas by minute.
#[derive(Debug, Default)]
struct PartTally {
    deltas: BTreeMap<i64, Delta>,
    /// The latest minute the queue's clock told this pool a call was made in (its
    /// backlog then has its sample).
    sampled_minute: Option<i64>,
    /// The heartbeat asked for the records to be sent: the next claim of the
    /// partition carries them, or the next heartbeat sends them on their own.
    due: bool,
}

/// One partition's call to make: the deltas to add (oldest minute first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Batch {
    pub(crate) part: usize,
    pub(crate) deltas: Vec<(i64, Delta)>,
}

impl Batch {
    /// The arguments of minutes_add.lua after the minutes kept.
    pub(crate) fn encoded(&self) -> Vec<String> {
        self.deltas.iter().map(|(m, d)| d.encode(*m)).collect()
    }
}

/// A pool's counts since its last call, by partition and minute.
#[derive(Debug)]
pub(crate) struct Tally {
    parts: Mutex<Vec<PartTally>>,
}

impl Tally {
    pub(crate) fn new(partitions: usize) -> Self {
        Self {
            parts: Mutex::new((0..partitions.max(1)).map(|_| PartTally::default()).collect()),
        }
    }

    fn with_delta(&self, part: usize, now_ms: i64, add: impl FnOnce(&mut Delta)) {
        let mut parts = self.parts.lock();
        if let Some(p) = parts.get_mut(part) {
            add(p.deltas.entry(minute_of(now_ms)).or_default());
        }
    }

    /// A handler started, `late_ms` after its message's due time, at `now_ms`.
    pub(crate) fn record_start(&self, part: usize, now_ms: i64, late_ms: i64) {
        self.with_delta(part, now_ms, |d| {
            d.handled += 1;
            *d.lateness.entry(lateness_bucket(late_ms)).or_insert(0) += 1;
        });
    }

    /// A handler failed at `now_ms`.
    pub(crate) fn record_failure(&self, part: usize, now_ms: i64) {
        self.with_delta(part, now_ms, |d| d.failed += 1);
    }

    /// The calls to make at `now_ms` (the pool's idea of the queue's clock): each
    /// partition with deltas, and (unless `flush_only`) each whose backlog has no
    /// sample from this pool in the current minute. Their deltas leave the tally.
    pub(crate) fn take(&self, now_ms: i64, flush_only: bool) -> Vec<Batch> {
        let minute = minute_of(now_ms);
        let mut parts = self.parts.lock();
        (0..parts.len())
            .filter_map(|part| Self::batch(&mut parts[part], part, minute, flush_only))
            .collect()
    }

    fn batch(p: &mut PartTally, part: usize, minute: i64, flush_only: bool) -> Option<Batch> {
        p.due = false;
        let needs_sample = !flush_only && p.sampled_minute.is_none_or(|m| m < minute);
        if p.deltas.is_empty() && !needs_sample {
            return None;
        }
        Some(Batch {
            part,
            deltas: std::mem::take(&mut p.deltas).into_iter().collect(),
        })
    }

    /// A heartbeat: the records of every partition are due, to ride on its next claim.
    /// Returns the calls to make now, on their own, for the partitions that no claim
    /// took since the last heartbeat (a pool that claims from some partitions only).
    pub(crate) fn heartbeat(&self, now_ms: i64) -> Vec<Batch> {
        let minute = minute_of(now_ms);
        let mut parts = self.parts.lock();
        let mut alone = Vec::new();
        for part in 0..parts.len() {
            let p = &mut parts[part];
            if p.due {
                alone.extend(Self::batch(p, part, minute, false));
            } else {
                p.due = true;
            }
        }
        alone
    }

    /// What a claim of `part` at `now_ms` carries: the partition's records, when a
    /// heartbeat made them due.
    pub(crate) fn take_for_claim(&self, part: usize, now_ms: i64) -> Option<Batch> {
        let mut parts = self.parts.lock();
        let p = parts.get_mut(part).filter(|p| p.due)?;
        Self::batch(p, part, minute_of(now_ms), false)
    }

    /// A call succeeded; the queue's clock was in `minute`.
    pub(crate) fn sent(&self, part: usize, minute: i64) {
        if let Some(p) = self.parts.lock().get_mut(part) {
            p.sampled_minute = Some(p.sampled_minute.map_or(minute, |m| m.max(minute)));
        }
    }

    /// A call failed: its deltas wait for the next, unless older than the records keep.
    pub(crate) fn put_back(&self, batch: Batch, now_ms: i64) {
        let oldest = minute_of(now_ms) - i64::from(KEEP_MINUTES);
        if let Some(p) = self.parts.lock().get_mut(batch.part) {
            p.due = true;
            for (m, d) in batch.deltas.into_iter().filter(|(m, _)| *m > oldest) {
                p.deltas.entry(m).or_default().merge(&d);
            }
        }
    }
}

/// One minute of a queue, summed over its partitions (see `Queue::minutes`).
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct MinuteStats {
    /// When the minute began, Unix ms on the queue's clock.
    pub start_ms: i64,
    /// Handlers started in it.
    pub handled: u64,
    /// Handler calls that failed in it (retried or dead-lettered).
    pub failed: u64,
    /// Median of how late handlers started after their due time, ms (±9 %); `None`
    /// when none started.
    pub lateness_p50_ms: Option<f64>,
    /// 99th percentile of it, ms (±9 %).
    pub lateness_p99_ms: Option<f64>,
    /// Backlog sampled once in the minute by the first pool that reported in it:
    /// waiting for a later due time. `None` when no pool reported in it.
    pub scheduled: Option<u64>,
    /// Due, waiting for a consumer.
    pub ready: Option<u64>,
    /// Under a lease.
    pub inflight: Option<u64>,
}

/// A stored minute, as one partition holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) delta: Delta,
    /// (scheduled, ready, inflight), when sampled.
    pub(crate) backlog: Option<(u64, u64, u64)>,
}

/// A stored minute's value; `None` for one written by another version.
pub(crate) fn decode_stored(value: &str) -> Option<Stored> {
    let mut words = value.split(' ');
    let mut number = || -> Option<i64> { words.next()?.parse().ok() };
    let handled = u64::try_from(number()?).ok()?;
    let failed = u64::try_from(number()?).ok()?;
    let (s, r, i) = (number()?, number()?, number()?);
    let backlog = (s >= 0 && r >= 0 && i >= 0).then_some((s as u64, r as u64, i as u64));
    let mut lateness = BTreeMap::new();
    for w in words {
        let (k, n) = w.split_once(':')?;
        *lateness.entry(k.parse().ok()?).or_insert(0) += n.parse::<u64>().ok()?;
    }
    Some(Stored {
        delta: Delta {
            handled,
            failed,
            lateness,
        },
        backlog,
    })
}

/// The last `span` minutes up to `now_ms`, oldest first, from the partitions' records
/// (`(minute, value)` pairs of every partition); a minute nobody wrote is all zero,
/// its backlog `None`.
pub(crate) fn summarize(records: &[(i64, String)], now_ms: i64, span: u32) -> Vec<MinuteStats> {
    let last = minute_of(now_ms);
    let first = last - i64::from(span) + 1;
    let mut merged: BTreeMap<i64, Stored> = BTreeMap::new();
    for (minute, value) in records {
        if !(first..=last).contains(minute) {
            continue;
        }
        let Some(stored) = decode_stored(value) else { continue };
        let m = merged.entry(*minute).or_default();
        m.delta.merge(&stored.delta);
        if let Some((s, r, i)) = stored.backlog {
            let (ms, mr, mi) = m.backlog.unwrap_or_default();
            m.backlog = Some((ms + s, mr + r, mi + i));
        }
    }
    (first..=last)
        .map(|minute| {
            let m = merged.remove(&minute).unwrap_or_default();
            MinuteStats {
                start_ms: minute * MINUTE_MS,
                handled: m.delta.handled,
                failed: m.delta.failed,
                lateness_p50_ms: quantile_ms(&m.delta.lateness, 0.5),
                lateness_p99_ms: quantile_ms(&m.delta.lateness, 0.99),
                scheduled: m.backlog.map(|b| b.0),
                ready: m.backlog.map(|b| b.1),
                inflight: m.backlog.map(|b| b.2),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log_spaced_and_hold_their_values() {
        assert_eq!(lateness_bucket(0), 0);
        assert_eq!(lateness_bucket(-5), 0);
        assert_eq!(lateness_bucket(1), 1);
        assert_eq!(lateness_bucket(2), 5);
        assert_eq!(lateness_bucket(1024), 41);
        assert_eq!(lateness_bucket(i64::MAX), MAX_BUCKET);
        for ms in [1_i64, 3, 17, 250, 999, 60_000, 3_600_000] {
            let v = bucket_value_ms(lateness_bucket(ms));
            let error = (v - ms as f64).abs() / ms as f64;
            assert!(error < 0.1, "{ms} ms stands as {v} ms");
        }
    }

    #[test]
    fn quantiles_come_from_the_histogram() {
        let mut h = BTreeMap::new();
        assert_eq!(quantile_ms(&h, 0.5), None);
        // Most start on time; one is a little late, one very late.
        h.insert(lateness_bucket(0), 98);
        *h.entry(lateness_bucket(100)).or_insert(0) += 1;
        *h.entry(lateness_bucket(10_000)).or_insert(0) += 1;
        assert_eq!(quantile_ms(&h, 0.5), Some(0.0));
        let p99 = quantile_ms(&h, 0.99).expect("p99");
        assert!((90.0..110.0).contains(&p99), "{p99}");
        let max = quantile_ms(&h, 1.0).expect("max");
        assert!((9_000.0..11_000.0).contains(&max), "{max}");
    }

    #[test]
    fn a_tally_hands_out_its_deltas_once_and_samples_once_a_minute() {
        let t = Tally::new(2);
        let at = 1_764_460_800_000; // the start of a minute
        t.record_start(1, at + 10, 3);
        t.record_start(1, at + 20, 3);
        t.record_failure(1, at + 30);
        t.record_start(1, at + MINUTE_MS, 0);
        let batches = t.take(at + MINUTE_MS + 1, false);
        // The first partition has nothing new but no sample yet; the second has two minutes.
        assert_eq!(batches.len(), 2);
        assert_eq!(
            batches[0],
            Batch {
                part: 0,
                deltas: vec![]
            }
        );
        let m = minute_of(at);
        assert_eq!(
            batches[1].encoded(),
            vec![format!("{m} 2 1 7:2"), format!("{} 1 0 0:1", m + 1)]
        );
        t.sent(0, m + 1);
        t.sent(1, m + 1);
        assert!(t.take(at + MINUTE_MS + 2, false).is_empty(), "nothing new, sampled");
        assert_eq!(
            t.take(at + 2 * MINUTE_MS, false).len(),
            2,
            "a new minute wants its sample"
        );
        t.record_failure(0, at + 2 * MINUTE_MS);
        assert_eq!(t.take(at + 2 * MINUTE_MS, true).len(), 1, "a flush sends deltas only");
    }

    #[test]
    fn a_heartbeat_makes_the_records_ride_on_a_claim_or_go_alone_one_beat_later() {
        let t = Tally::new(2);
        let at = 1_764_460_800_000;
        t.record_start(0, at, 0);
        assert_eq!(t.take_for_claim(0, at), None, "not before a heartbeat made them due");
        assert!(
            t.heartbeat(at).is_empty(),
            "the first heartbeat leaves them to the claims"
        );
        let carried = t.take_for_claim(0, at).expect("partition 0 rides on its claim");
        assert_eq!(carried.encoded(), vec![format!("{} 1 0 0:1", minute_of(at))]);
        assert_eq!(t.take_for_claim(0, at), None, "once");
        t.sent(0, minute_of(at));
        // No claim of partition 1 came: the next heartbeat sends its sample alone.
        let alone = t.heartbeat(at + 10);
        assert_eq!(alone.iter().map(|b| b.part).collect::<Vec<_>>(), vec![1]);
        // A failed claim leaves its records due for the next one.
        let failed = t.take_for_claim(0, at + 20);
        assert_eq!(failed, None, "sampled and nothing new: nothing to carry");
        t.record_failure(0, at + 30);
        assert!(t.heartbeat(at + 40).is_empty());
        let batch = t.take_for_claim(0, at + 40).expect("due");
        t.put_back(batch, at + 40);
        assert!(t.take_for_claim(0, at + 50).is_some(), "due again after a failure");
    }

    #[test]
    fn a_failed_call_puts_its_deltas_back_unless_too_old() {
        let t = Tally::new(1);
        let at = 1_764_460_800_000;
        t.record_start(0, at, 0);
        let batch = t.take(at, false).remove(0);
        t.record_start(0, at, 0);
        t.put_back(batch.clone(), at);
        assert_eq!(
            t.take(at, false)[0].encoded(),
            vec![format!("{} 2 0 0:2", minute_of(at))]
        );
        t.put_back(batch, at + i64::from(KEEP_MINUTES) * MINUTE_MS);
        assert_eq!(t.take(at, true), vec![]);
    }

    #[test]
    fn stored_minutes_decode_and_sum_over_partitions() {
        assert_eq!(decode_stored("nonsense"), None);
        assert_eq!(decode_stored("1 2 3 4"), None);
        let s = decode_stored("5 1 -1 -1 -1 0:4 9:1").expect("decodes");
        assert_eq!((s.delta.handled, s.delta.failed, s.backlog), (5, 1, None));
        let now = 1_764_460_800_000 + 5;
        let m = minute_of(now);
        let records = vec![
            (m, "5 1 10 2 3 0:4 9:1".to_owned()),
            (m, "1 0 -1 -1 -1 41:1".to_owned()),
            (m - 2, "3 3 1 1 1 0:3".to_owned()),
            (m - 500, "9 9 9 9 9".to_owned()),
            (m - 1, "garbage".to_owned()),
        ];
        let minutes = summarize(&records, now, 3);
        assert_eq!(minutes.len(), 3);
        assert_eq!(minutes[0].start_ms, (m - 2) * MINUTE_MS);
        assert_eq!((minutes[0].handled, minutes[0].scheduled), (3, Some(1)));
        assert_eq!(
            minutes[1],
            MinuteStats {
                start_ms: (m - 1) * MINUTE_MS,
                ..MinuteStats::default()
            }
        );
        let last = &minutes[2];
        assert_eq!((last.handled, last.failed), (6, 1));
        assert_eq!(
            (last.scheduled, last.ready, last.inflight),
            (Some(10), Some(2), Some(3))
        );
        assert_eq!(last.lateness_p50_ms, Some(0.0));
        assert!(last.lateness_p99_ms.expect("p99") > 900.0);
    }
}
