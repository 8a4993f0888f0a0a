//! Operating a queue: pause and resume, rate and group limits, restarting workers,
//! purge.

use std::collections::BTreeSet;

use super::validate::validate_key;
use crate::conn::Replay;
use crate::error::{Error, Result};
use crate::keys::Layout;
use crate::lines;
use crate::scripts::admin;
use crate::scripts::replies::{Count, Flag, Ids};
use crate::{GroupLimit, Queue, RateLimit};

impl Queue {
    /// Stop consumption on every partition, for every consumer pool on any host, until
    /// `resume`: claims hand out nothing, so no handler starts a new message except
    /// those a pool had already prefetched (about 50 ms of work per handler). Running
    /// handlers finish and complete as usual, pushes keep being accepted, and idle
    /// pools keep their cost of one look per `idle_check`. Returns whether the queue
    /// was running (pausing a paused queue keeps the first pause's time).
    pub fn pause(&self) -> Result<bool> {
        self.set_paused(true)
    }

    /// Undo `pause`: consumers waiting since are woken at once. Returns whether the
    /// queue was paused.
    pub fn resume(&self) -> Result<bool> {
        self.set_paused(false)
    }

    /// Whether `pause` is in force (on any partition).
    pub fn is_paused(&self) -> Result<bool> {
        Ok(self.stats()?.paused_at_ms.is_some())
    }

    pub(super) fn set_paused(&self, paused: bool) -> Result<bool> {
        let operation = if paused { "pause" } else { "resume" };
        let mut changed = false;
        for part in 0..self.partitions() {
            let Flag(changed_here) = self.call(part, operation, Replay::Safe, admin::pause(), |inv| {
                admin::Pause { paused }.add_to(inv);
            })?;
            changed |= changed_here;
        }
        Ok(changed)
    }

    /// Cap how fast consumers are handed this queue's messages: at most `limit.max` in
    /// any window of `limit.per` (sliding, not aligned to the clock), over every pool
    /// on every host and in every language, retries and re-deliveries included, e.g.
    /// to stay within a payment provider's quota. Kept in Redis, like `pause`, until
    /// changed or cleared; pools pick it up at their next claim and sleep until the
    /// window has room, with no extra commands. A partitioned queue splits `max` among
    /// its partitions (so it must be at least the partition count); each partition
    /// holds its share, so a partition with little traffic leaves its share unused.
    pub fn set_rate_limit(&self, limit: RateLimit) -> Result<()> {
        let parts = self.partitions();
        limit.validate(parts)?;
        let per_ms = u64::try_from(limit.per.as_millis()).unwrap_or(u64::MAX);
        for (part, share) in limit.shares(parts).enumerate() {
            let Flag(_) = self.call(part, "set_rate_limit", Replay::Safe, admin::limit(), |inv| {
                admin::Limit {
                    set: Some((share, per_ms, limit.max)),
                }
                .add_to(inv);
            })?;
        }
        Ok(())
    }

    /// Lift the rate limit; pools it held back are woken at once. Returns whether one
    /// was in force.
    pub fn clear_rate_limit(&self) -> Result<bool> {
        let mut had = false;
        for part in 0..self.partitions() {
            let Flag(had_here) = self.call(part, "clear_rate_limit", Replay::Safe, admin::limit(), |inv| {
                admin::Limit { set: None }.add_to(inv);
            })?;
            had |= had_here;
        }
        Ok(had)
    }

    /// Set `group`'s limits, or with `None` the default for every group without limits
    /// of its own; `GroupLimit::none()` clears them. Takes effect at once on every pool:
    /// a raised limit starts messages its group held back. Lowering one stops no running
    /// message; new ones wait until the group is within it. Returns whether limits were
    /// in force there before.
    pub fn set_group_limit(&self, group: Option<&str>, limit: GroupLimit) -> Result<bool> {
        if let Some(group) = group {
            validate_key("group", group)?;
        }
        if let Layout::Seed { .. } = self.inner.opts.layout {
            return Err(Error::invalid(
                "group",
                "is not available in the seed layout (the recipe's own consumers would not respect it)",
            ));
        }
        let key = lines::group_key(group.unwrap_or_default());
        let parts = match group {
            Some(group) => vec![self.partition_of(group, Some(group))],
            None => (0..self.partitions()).collect(),
        };
        if let Some(n) = limit.concurrency {
            GroupLimit::concurrency(n)?;
        }
        let rate = match limit.rate {
            Some(rate) => {
                rate.validate(1)?;
                Some((rate.max, u64::try_from(rate.per.as_millis()).unwrap_or(u64::MAX)))
            }
            None => None,
        };
        let mut had = false;
        for part in parts {
            let Flag(had_here) = self.call(part, "set_group_limit", Replay::Safe, admin::group_limit(), |inv| {
                admin::GroupLimit {
                    key: &key,
                    concurrency: limit.concurrency,
                    rate,
                }
                .add_to(inv);
            })?;
            had |= had_here;
        }
        Ok(had)
    }

    /// The rate limit in force, if any.
    pub fn rate_limit(&self) -> Result<Option<RateLimit>> {
        Ok(self.partition_stats(0)?.rate_limit)
    }

    /// Ask every consumer pool running on this queue, on every host and in every
    /// language, to stop gracefully, e.g. after a deploy: each finishes its running
    /// handlers, releases what it had prefetched and returns from `run` with
    /// `Stopper::restart_requested`, so that its process manager starts the new code
    /// (Laravel's `queue:restart`). Idle pools are woken at once; workers started after
    /// the request are not affected. Returns how many pools were alive when asked.
    pub fn restart_workers(&self) -> Result<usize> {
        // A pool registers in every partition it serves: count each once.
        let mut asked = BTreeSet::new();
        for part in 0..self.partitions() {
            let Ids(pools) = self.call(part, "restart_workers", Replay::Safe, admin::restart(), |_| {})?;
            asked.extend(pools);
        }
        Ok(asked.len())
    }

    /// Delete every message in every state. Returns how many were deleted. A message
    /// that a pool holds already (running, or prefetched in its memory) may still reach
    /// a handler; its acknowledgement then finds it gone. Stop the pools first to run
    /// nothing more.
    pub fn purge(&self) -> Result<u64> {
        let mut total = 0;
        for part in 0..self.partitions() {
            let Count(n) = self.call(part, "purge", Replay::IfNotSent, admin::purge(), |_| {})?;
            total += n;
        }
        Ok(total)
    }
}
