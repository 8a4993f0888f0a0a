//! The registry of queues: which queues live on a Redis, for tools that list them
//! without being told their names (`delayq dashboard`). One sorted set per key prefix,
//! `<prefix>:queues`, outside every queue's hash tag: a queue's scripts never write it
//! (on a cluster they stay in their queue's slot), plain commands of pools and
//! producers do. Each member says how to open a queue (JSON of [`RegisteredQueue`]),
//! its score when a pool or producer last said it exists (Unix ms, the writer's
//! clock). A pool registers when it starts and again every [`POOL_RENEWAL`]; a
//! producer once per process and queue, at its first push. Entries unseen for
//! [`FORGET_AFTER`] are dropped by the next write, and readers skip them.
//!
//! The registry is a convenience: a write it cannot make (an ACL user limited to its
//! queue's keys, a Redis that is down) is logged at debug level and costs the queue
//! nothing.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::conn::{ConnSlot, Replay};
use crate::error::Result;
use crate::keys::Layout;
use crate::queue::Queue;

/// How long an entry nobody renews stays in the registry.
pub const FORGET_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

/// How often a running pool renews its queue's entry.
pub const POOL_RENEWAL: Duration = Duration::from_secs(3600);

/// A queue as the registry knows it: enough to open it (with the registry's prefix).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RegisteredQueue {
    /// The queue's name.
    pub name: String,
    /// "native" or "seed".
    pub layout: String,
    /// The seed layout's ZSET.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zset_key: Option<String>,
    /// The seed layout's HASH of payloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_key: Option<String>,
    /// Its partitions.
    pub partitions: u32,
    /// When a pool or producer last registered it, Unix ms.
    #[serde(skip)]
    pub last_seen_ms: i64,
}

/// The most entries one page of the registry holds (`registered_queues_page`).
pub const MAX_REGISTRY_PAGE: usize = 1000;

/// A page of the registry (`registered_queues_page`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegistryPage {
    /// The queues of the page's entries, seen most recently first, each once (as its
    /// page's latest entry of its name says it); entries that this version cannot read
    /// are left out, so a page may hold fewer than it was asked for.
    pub queues: Vec<RegisteredQueue>,
    /// The entries that are not forgotten, in all: the next page starts at
    /// `start + limit` while that is less.
    pub total: u64,
}

/// When this process last registered each queue (by URL and entry): producers and
/// pools of one process share it, so a producer after a pool sends nothing.
static REGISTERED: Mutex<Option<HashMap<String, Instant>>> = Mutex::new(None);

impl Queue {
    fn registry_key(&self) -> String {
        format!("{}:queues", self.options().prefix)
    }

    fn registry_entry(&self) -> String {
        let (zset_key, payload_key) = match &self.options().layout {
            Layout::Native => (None, None),
            Layout::Seed { zset_key, payload_key } => (Some(zset_key.clone()), Some(payload_key.clone())),
        };
        let entry = RegisteredQueue {
            name: self.name().to_owned(),
            layout: self.options().layout.script_name().to_owned(),
            zset_key,
            payload_key,
            partitions: u32::try_from(self.partitions()).unwrap_or(u32::MAX),
            last_seen_ms: 0,
        };
        serde_json::to_string(&entry).unwrap_or_default()
    }

    /// Whether this process should register the queue now: never registered, or (with
    /// `renew`) longer ago than that. Marks it registered.
    fn registration_due(&self, renew: Option<Duration>) -> bool {
        let id = format!("{}\n{}\n{}", self.url(), self.registry_key(), self.registry_entry());
        let mut registered = REGISTERED.lock();
        let seen = registered.get_or_insert_with(HashMap::new);
        let due = match (seen.get(&id), renew) {
            (None, _) => true,
            (Some(at), Some(every)) => at.elapsed() >= every,
            (Some(_), None) => false,
        };
        if due {
            seen.insert(id, Instant::now());
        }
        due
    }

    fn register_on(&self, slot: &mut ConnSlot) {
        let key = self.registry_key();
        let entry = self.registry_entry();
        let now = crate::time::now_unix_ms();
        let forget_before = now - i64::try_from(FORGET_AFTER.as_millis()).unwrap_or(i64::MAX);
        let res = slot.run(&self.inner.endpoint, "register", Replay::Safe, |con| {
            let mut note = redis::pipe();
            note.zadd(&key, &entry, now)
                .cmd("ZREMRANGEBYSCORE")
                .arg(&key)
                .arg("-inf")
                .arg(format!("({forget_before}"));
            crate::conn::query_one_slot::<()>(con, &note)
        });
        if let Err(e) = res {
            log::debug!("delayq[{}]: could not note the queue in {key}: {e}", self.name());
        }
    }

    /// A pool's registration: at its start, then every [`POOL_RENEWAL`].
    pub(crate) fn register_pool(&self, slot: &mut ConnSlot) {
        if self.registration_due(Some(POOL_RENEWAL)) {
            self.register_on(slot);
        }
    }

    /// A producer's registration: once per process and queue. A push pays one atomic
    /// load for it once its handle has registered (or found the queue registered).
    pub(crate) fn register_producer(&self) {
        use std::sync::atomic::Ordering;
        if self.inner.producer_registered.swap(true, Ordering::Relaxed) {
            return;
        }
        if self.registration_due(None) {
            let mut slot = self.inner.conn.lock();
            self.register_on(&mut slot);
        }
    }

    /// The queues registered on this queue's Redis under its key prefix, by name,
    /// each as the latest pool or producer said it, without those unseen for
    /// [`FORGET_AFTER`]. Reads the whole registry: for a registry that others may fill,
    /// read it a page at a time (`registered_queues_page`).
    pub fn registered_queues(&self) -> Result<Vec<RegisteredQueue>> {
        let key = self.registry_key();
        let since = Self::registry_since();
        let inner = &*self.inner;
        let members: Vec<(String, f64)> =
            inner
                .conn
                .lock()
                .run(&inner.endpoint, "registered_queues", Replay::Safe, |con| {
                    redis::cmd("ZRANGEBYSCORE")
                        .arg(&key)
                        .arg(since)
                        .arg("+inf")
                        .arg("WITHSCORES")
                        .query(con)
                })?;
        let mut latest: HashMap<String, RegisteredQueue> = HashMap::new();
        for q in Self::readable(members) {
            if latest
                .get(&q.name)
                .is_none_or(|seen| seen.last_seen_ms < q.last_seen_ms)
            {
                latest.insert(q.name.clone(), q);
            }
        }
        let mut out: Vec<RegisteredQueue> = latest.into_values().collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Entries `start..start + limit` of the registry, seen most recently first (at
    /// most [`MAX_REGISTRY_PAGE`]), and how many it holds: one bounded read (a
    /// `ZREVRANGE` and a `ZCOUNT`) however many entries others wrote. A name whose
    /// older entry falls on a later page shows there too.
    pub fn registered_queues_page(&self, start: usize, limit: usize) -> Result<RegistryPage> {
        if limit > MAX_REGISTRY_PAGE {
            return Err(crate::error::Error::invalid(
                "limit",
                format!("a page of the registry holds at most {MAX_REGISTRY_PAGE} entries, got {limit}"),
            ));
        }
        let key = self.registry_key();
        let since = Self::registry_since();
        let inner = &*self.inner;
        // By rank, which Redis finds in logarithmic time however deep the page: the
        // forgotten entries rank last, after the `total` that are not.
        let first = i64::try_from(start).unwrap_or(i64::MAX);
        let last = first.saturating_add(i64::try_from(limit).unwrap_or(0)) - 1;
        let (members, total): (Vec<(String, f64)>, u64) =
            inner
                .conn
                .lock()
                .run(&inner.endpoint, "registered_queues_page", Replay::Safe, |con| {
                    let mut read = redis::pipe();
                    if limit > 0 {
                        read.cmd("ZREVRANGE").arg(&key).arg(first).arg(last).arg("WITHSCORES");
                    }
                    read.cmd("ZCOUNT").arg(&key).arg(since).arg("+inf");
                    if limit > 0 {
                        crate::conn::query_one_slot(con, &read)
                    } else {
                        crate::conn::query_one_slot::<(u64,)>(con, &read).map(|(total,)| (Vec::new(), total))
                    }
                })?;
        let fresh = members.into_iter().filter(|&(_, score)| score >= since as f64);
        let mut queues: Vec<RegisteredQueue> = Vec::new();
        for q in Self::readable(fresh) {
            if !queues.iter().any(|seen| seen.name == q.name) {
                queues.push(q);
            }
        }
        Ok(RegistryPage { queues, total })
    }

    /// The oldest score of an entry not forgotten.
    fn registry_since() -> i64 {
        crate::time::now_unix_ms() - i64::try_from(FORGET_AFTER.as_millis()).unwrap_or(i64::MAX)
    }

    /// The entries this version can read, with when they were seen.
    fn readable(members: impl IntoIterator<Item = (String, f64)>) -> impl Iterator<Item = RegisteredQueue> {
        members.into_iter().filter_map(|(member, score)| {
            // An entry this version cannot read names no queue it could open.
            let mut q = serde_json::from_str::<RegisteredQueue>(&member).ok()?;
            q.last_seen_ms = score as i64;
            Some(q)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_reads_back_and_names_the_seed_keys_only_for_the_seed_layout() {
        let native: RegisteredQueue =
            serde_json::from_str(r#"{"name":"orders","layout":"native","partitions":2}"#).expect("reads");
        assert_eq!((native.zset_key, native.partitions), (None, 2));
        let seed = RegisteredQueue {
            name: "default".into(),
            layout: "seed".into(),
            zset_key: Some("delay_queue:zset".into()),
            payload_key: Some("delay_queue:payload".into()),
            partitions: 1,
            last_seen_ms: 5,
        };
        let text = serde_json::to_string(&seed).expect("writes");
        assert!(!text.contains("last_seen"), "the score holds it: {text}");
        let back: RegisteredQueue = serde_json::from_str(&text).expect("reads");
        assert_eq!(
            back,
            RegisteredQueue {
                last_seen_ms: 0,
                ..seed
            }
        );
    }
}
