//! The dead-letter set: listing, requeue and delete (by id, all, or by error text).

use crate::conn::Replay;
use crate::error::{Error, Result};
use crate::scripts::replies::Count;
use crate::scripts::{LuaScript, MAX_BATCH, dead};
use crate::{DeadLetter, MAX_ERROR_TEXT_BYTES, Queue, envelope};

use super::validate::validate_id;

impl Queue {
    /// Up to `limit` dead letters, newest first (from every partition).
    pub fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>> {
        self.dead_letters_page(0, limit)
    }

    /// As [`Queue::dead_letters`], after skipping the `start` newest (at most
    /// [`MAX_PAGE_START`](crate::MAX_PAGE_START)): one page, for paging through them.
    pub fn dead_letters_page(&self, start: usize, limit: usize) -> Result<Vec<DeadLetter>> {
        self.dead_letters_page_with(start, limit, Self::LISTED_PAYLOAD_BYTES)
    }

    /// As [`Queue::dead_letters_page`], showing stored messages up to
    /// `max_payload_bytes` whole (`usize::MAX`: all) rather than up to
    /// [`Queue::LISTED_PAYLOAD_BYTES`] (see [`Queue::list_page_with`]).
    pub fn dead_letters_page_with(
        &self,
        start: usize,
        limit: usize,
        max_payload_bytes: usize,
    ) -> Result<Vec<DeadLetter>> {
        let limit = limit.min(self.inner.opts.dead_max.max(1));
        let bounds = Self::listing_bounds(max_payload_bytes);
        let fetch = |part: usize, start: usize, limit: usize| {
            let args = dead::List { limit, start, bounds };
            let dead::Rows(rows) = self.call(part, "dead_letters", Replay::Safe, dead::list(), |inv| {
                args.add_to(inv);
            })?;
            Ok(rows
                .into_iter()
                .map(|r| DeadLetter {
                    id: r.id,
                    payload_json: match r.omitted_bytes {
                        Some(_) => String::new(),
                        None => envelope::decode(&self.inner.opts.layout, &r.stored)
                            .map(|d| d.payload_json.to_owned())
                            .unwrap_or(r.stored),
                    },
                    payload_omitted_bytes: r.omitted_bytes,
                    attempts: r.attempts,
                    last_error: r.last_error.unwrap_or_default(),
                    error_trace: r.error_trace,
                    dead_at_ms: r.dead_at_ms,
                })
                .collect())
        };
        // Each partition's list is newest first already; merge them the same way.
        self.page(start, limit, fetch, |all: &mut Vec<DeadLetter>| {
            all.sort_by_key(|d| std::cmp::Reverse(d.dead_at_ms));
        })
    }

    /// Send dead letters back to the queue, due now, with a fresh attempt budget: one
    /// (`Some(id)`) or all. Returns how many were requeued.
    pub fn requeue_dead(&self, id: Option<&str>) -> Result<u64> {
        self.on_dead("requeue_dead", dead::requeue(), id)
    }

    /// Delete dead letters for good, payload and all: one (`Some(id)`) or all. Returns
    /// how many were deleted. Waiting and running messages are not touched (see
    /// `cancel` and `purge`).
    pub fn delete_dead(&self, id: Option<&str>) -> Result<u64> {
        self.on_dead("delete_dead", dead::delete(), id)
    }

    /// Requeue the dead letters whose last error contains `text` (plain text, not a
    /// pattern), as `requeue_dead` does each: after the fix of one failure, the others
    /// stay dead. Returns how many were requeued. It reads the errors of the whole
    /// dead-letter set on the server, 1000 a call; a dead letter that arrives during
    /// the look may be left out.
    pub fn requeue_dead_with_error(&self, text: &str) -> Result<u64> {
        self.dead_with_error(text)?
            .iter()
            .try_fold(0, |n, id| Ok(n + self.requeue_dead(Some(id))?))
    }

    /// Delete the dead letters whose last error contains `text`, as `delete_dead` does
    /// each (see `requeue_dead_with_error`). Returns how many were deleted.
    pub fn delete_dead_with_error(&self, text: &str) -> Result<u64> {
        self.dead_with_error(text)?
            .iter()
            .try_fold(0, |n, id| Ok(n + self.delete_dead(Some(id))?))
    }

    /// The ids of the dead letters whose last error contains `text`, from every partition.
    pub(super) fn dead_with_error(&self, text: &str) -> Result<Vec<String>> {
        if text.is_empty() || text.len() > MAX_ERROR_TEXT_BYTES {
            return Err(Error::invalid(
                "text",
                format!("must be 1 to {MAX_ERROR_TEXT_BYTES} bytes, got {}", text.len()),
            ));
        }
        let mut found = Vec::new();
        for part in 0..self.partitions() {
            let mut first = Some(0);
            while let Some(from) = first {
                let args = dead::Matching {
                    first: from,
                    count: MAX_BATCH,
                    text,
                };
                let step: dead::MatchStep =
                    self.call(part, "dead_with_error", Replay::Safe, dead::matching(), |inv| {
                        args.add_to(inv);
                    })?;
                first = step.next;
                found.extend(step.ids);
            }
        }
        Ok(found)
    }

    pub(super) fn on_dead(&self, operation: &'static str, script: &LuaScript, id: Option<&str>) -> Result<u64> {
        if let Some(id) = id {
            validate_id(id)?;
            let Count(n) = self.call_by_id(
                id,
                operation,
                Replay::Safe,
                script,
                |inv| dead::Selection::One(id).add_to(inv),
                |Count(n): &Count| *n > 0,
            )?;
            return Ok(n);
        }
        let mut total = 0;
        for part in 0..self.partitions() {
            loop {
                // Batches keep each call short; a crash between batches leaves the rest as they were.
                let Count(n) = self.call(part, operation, Replay::Safe, script, |inv| {
                    dead::Selection::Oldest(MAX_BATCH).add_to(inv);
                })?;
                total += n;
                if n < MAX_BATCH as u64 {
                    break;
                }
            }
        }
        Ok(total)
    }
}
