//! `Queue::minutes`: the per-minute records that consumer pools write (see metrics.rs).

use super::Queue;
use crate::conn::Replay;
use crate::error::{Error, Result};
use crate::metrics::{self, KEEP_MINUTES, MinuteStats};
use crate::scripts::minutes;

impl Queue {
    /// The last `span` minutes (at most [`KEEP_MINUTES`]), oldest first, the current
    /// one last, summed over the partitions: messages handled and failed, how late
    /// handlers started (p50, p99) and the backlog sampled once a minute. Consumer
    /// pools write them at their heartbeat; a minute without a pool shows zeros and
    /// no backlog.
    pub fn minutes(&self, span: u32) -> Result<Vec<MinuteStats>> {
        if !(1..=KEEP_MINUTES).contains(&span) {
            return Err(Error::invalid(
                "span",
                format!("must be 1 to {KEEP_MINUTES} minutes, got {span}"),
            ));
        }
        let mut all = Vec::new();
        let mut now_ms = i64::MIN;
        for part in 0..self.partitions() {
            let r: minutes::Records = self.call(part, "minutes", Replay::Safe, minutes::records(), |_| {})?;
            now_ms = now_ms.max(r.now_ms);
            all.extend(r.minutes);
        }
        Ok(metrics::summarize(&all, now_ms, span))
    }
}
