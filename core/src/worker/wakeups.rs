//! The wake-up subscriber: producers' announcements on each partition's channel wake
//! the fetchers early; and, under Sentinel, the watch for a new master.

use std::collections::HashMap;
use std::time::Duration;

use super::pause_unless_stopped;
use super::pool::Pool;

/// Listens for producers' announcements on every partition's channel. On a cluster
/// it subscribes on one seed node (a cluster forwards every PUBLISH to every node) and
/// moves to the next seed when that node fails.
pub(super) fn subscribe_loop(pool: &Pool) {
    let control = &*pool.control;
    let channels: HashMap<&str, usize> = pool
        .queue
        .inner
        .parts
        .iter()
        .enumerate()
        .map(|(part, keys)| (keys.wake_channel.as_str(), part))
        .collect();
    let mut pause = Duration::from_millis(50);
    let mut attempt = 0;
    let endpoint = &pool.queue.inner.endpoint;
    while !control.stopped() {
        let epoch = endpoint.master_epoch();
        let mut conn = match endpoint.pubsub_connection(attempt) {
            Ok(c) => c,
            Err(e) => {
                log::debug!("delayq[{}]: wake-up subscription: {e}", pool.queue_name);
                attempt += 1;
                pause_unless_stopped(pool, pause);
                pause = (pause * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        let mut pubsub = conn.as_pubsub();
        // The read timeout only lets this thread notice a stop; it sends nothing.
        if pubsub.subscribe(channels.keys().copied().collect::<Vec<_>>()).is_err()
            || pubsub.set_read_timeout(Some(Duration::from_millis(250))).is_err()
        {
            attempt += 1;
            pause_unless_stopped(pool, pause);
            continue;
        }
        pause = Duration::from_millis(50);
        // Announcements published while we were not subscribed are lost: look now.
        control.wake.kick();
        // After a failover, producers publish on the new master.
        while !control.stopped() && endpoint.master_epoch() == epoch {
            match pubsub.get_message() {
                Ok(msg) => {
                    let Some(&part) = channels.get(msg.get_channel_name()) else {
                        continue;
                    };
                    let due = msg.get_payload::<String>().ok().and_then(|p| p.parse::<i64>().ok());
                    control.wake.offer_due(part, due);
                }
                Err(e) if e.is_timeout() => {}
                Err(e) => {
                    log::debug!("delayq[{}]: wake-up subscription lost: {e}", pool.queue_name);
                    attempt += 1;
                    break;
                }
            }
        }
    }
}

/// Under Sentinel: follows the watch on the connection's side (`Endpoint::watch_sentinels`)
/// until the pool stops, and wakes the fetchers when the master moved.
pub(super) fn watch_sentinels(pool: &Pool) {
    let control = &*pool.control;
    pool.queue.inner.endpoint.watch_sentinels(
        &pool.queue_name,
        &|| control.stopped(),
        &|pause| pause_unless_stopped(pool, pause),
        &|| control.wake.kick(),
    );
}
