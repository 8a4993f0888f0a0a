//! `Queue::cancel` of a message that runs: its pool learns of the mark within a
//! heartbeat, its handler sees it, and whatever the handler does then the message is
//! deleted, counted as cancelled: never retried, never dead-lettered, never run again.

mod common;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{RedisServer, assert_no_leak, wait_for};
use delayq::{CancelOptions, Listing, Queue, State, Worker, WorkerOptions};
use serde_json::json;

const LEASE: Duration = Duration::from_millis(600);

fn counter(q: &Queue, name: &str) -> u64 {
    q.stats().expect("stats").totals.get(name).copied().unwrap_or(0)
}

fn push(q: &Queue, payload: serde_json::Value, due: Duration, id: &str) {
    let opts = delayq::PushOptions {
        id: Some(id.to_owned()),
        ..delayq::PushOptions::default()
    };
    q.push_json(payload.to_string(), due.into(), &opts).expect("push");
}

fn options() -> WorkerOptions {
    WorkerOptions {
        threads: 1,
        lease: LEASE,
        stop_when_empty: true,
        max_attempts: 5,
        backoff_base: Duration::from_millis(10),
        ..WorkerOptions::default()
    }
}

/// Run `handler` in a pool over `q` while `cancel` runs on another thread once the
/// handler of `id` started; the handler calls per id are returned.
fn run_cancelling(
    q: &Queue,
    opts: WorkerOptions,
    id: &str,
    cancel: impl FnOnce() + Send,
    handler: impl Fn(&delayq::Delivery) -> Result<(), String> + Sync,
) -> (delayq::Summary, HashMap<String, u32>) {
    let worker = Worker::new(q.clone(), opts).expect("worker");
    let calls = Mutex::new(HashMap::<String, u32>::new());
    // A check that fails inside a handler fails its delivery only: kept for the test.
    let failed_check = Mutex::new(None::<String>);
    let (started, running) = crossbeam_channel::bounded::<()>(1);
    let summary = std::thread::scope(|s| {
        s.spawn(|| {
            running
                .recv_timeout(Duration::from_secs(10))
                .expect("the handler started");
            cancel();
        });
        worker
            .run(1, |d| {
                *calls.lock().expect("lock").entry(d.id.clone()).or_default() += 1;
                if d.id == id && calls.lock().expect("lock")[&d.id] == 1 {
                    let _ = started.try_send(());
                }
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(d))).unwrap_or_else(|p| {
                    let text = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_default();
                    failed_check.lock().expect("lock").get_or_insert(text);
                    Err("a check failed".into())
                })
            })
            .expect("run")
    });
    if let Some(text) = failed_check.into_inner().expect("lock") {
        panic!("a check in the handler failed: {text}");
    }
    (summary, calls.into_inner().expect("lock"))
}

/// Wait for the mark in the handler, at most `limit`; how long it took.
fn wait_cancelled(d: &delayq::Delivery, limit: Duration) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if d.is_cancelled() {
            return Some(t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

#[test]
fn a_handler_sees_the_cancel_within_a_heartbeat_and_its_failure_is_not_retried() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    push(&q, json!({"n": 1}), Duration::ZERO, "o-1");
    let cancelled_at = Mutex::new(None);
    let seen_after = Mutex::new(None);
    let (summary, calls) = run_cancelling(
        &q,
        options(),
        "o-1",
        || {
            *cancelled_at.lock().expect("lock") = Some(Instant::now());
            assert!(q.cancel("o-1").expect("cancel"), "a running message is cancelled");
        },
        |d| {
            if wait_cancelled(d, Duration::from_secs(5)).is_some() {
                *seen_after.lock().expect("lock") = cancelled_at.lock().expect("lock").map(|t| t.elapsed());
            }
            Err("the handler fails after the cancel".into())
        },
    );
    let seen = seen_after.lock().expect("lock").expect("the handler saw the cancel");
    // One heartbeat is a third of the lease; a scheduling slack on top.
    assert!(seen < LEASE / 3 + Duration::from_millis(150), "seen after {seen:?}");
    assert_eq!(calls["o-1"], 1, "never run again");
    assert_eq!(
        (summary.retried, summary.dead, summary.cancelled),
        (0, 0, 1),
        "{summary:?}"
    );
    assert_eq!(counter(&q, "cancelled"), 1);
    assert_eq!((counter(&q, "retried"), counter(&q, "dead")), (0, 0));
    assert_eq!(q.get("o-1").expect("get"), None, "its data is deleted");
    assert_no_leak(&server, "{dq:orders}");
}

#[test]
fn a_handler_that_ignores_the_cancel_ends_normally_and_the_message_counts_as_cancelled() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    push(&q, json!({"n": 1}), Duration::ZERO, "o-1");
    push(&q, json!({"n": 2}), Duration::ZERO, "o-2");
    let (summary, calls) = run_cancelling(
        &q,
        options(),
        "o-1",
        || assert!(q.cancel("o-1").expect("cancel")),
        |d| {
            if d.id == "o-1" {
                // Several heartbeats, the mark never looked at.
                std::thread::sleep(LEASE * 2);
            }
            Ok(())
        },
    );
    assert_eq!((calls["o-1"], calls["o-2"]), (1, 1));
    assert_eq!(summary.handled, 2, "{summary:?}");
    assert_eq!(counter(&q, "cancelled"), 1);
    assert_eq!(counter(&q, "acked"), 1, "the other one");
    assert_eq!(q.get("o-1").expect("get"), None);
    assert_no_leak(&server, "{dq:orders}");
}

#[test]
fn a_prefetched_message_cancelled_before_its_start_is_never_started() {
    // o-2 waits in the pool's buffer, claimed with o-1, while o-1 runs: a heartbeat
    // brings its mark, and the pool ends it as cancelled instead of starting it.
    let server = RedisServer::start();
    let q = server.queue("orders");
    // A fast handler first (claimed alone: the pool holds one message a handler until
    // it measured one), so that the pool then claims o-1 and o-2 together.
    push(&q, json!({"n": 0}), Duration::ZERO, "f-1");
    push(&q, json!({"n": 1}), Duration::ZERO, "o-1");
    push(&q, json!({"n": 2}), Duration::ZERO, "o-2");
    let marked = std::sync::atomic::AtomicBool::new(false);
    let (summary, calls) = run_cancelling(
        &q,
        WorkerOptions {
            prefetch: 2,
            ..options()
        },
        "o-1",
        || {
            wait_for(Duration::from_secs(5), "o-2 claimed with o-1", || {
                q.get("o-2").expect("get").is_some_and(|m| m.state == State::Inflight)
            });
            assert!(q.cancel("o-2").expect("cancel"), "a claimed message is marked");
            marked.store(true, std::sync::atomic::Ordering::SeqCst);
        },
        |d| {
            if d.id == "o-1" {
                wait_for(Duration::from_secs(10), "the cancel", || {
                    marked.load(std::sync::atomic::Ordering::SeqCst)
                });
                // Two heartbeats and more: the mark has reached the pool.
                std::thread::sleep(LEASE);
            }
            Ok(())
        },
    );
    assert_eq!(calls.get("o-2"), None, "never started: {summary:?}");
    assert_eq!(
        (summary.handled, summary.acked, summary.cancelled),
        (2, 2, 1),
        "{summary:?}"
    );
    assert_eq!((counter(&q, "cancelled"), counter(&q, "acked")), (1, 2));
    assert_eq!(q.get("o-2").expect("get"), None);
    assert_no_leak(&server, "{dq:orders}");
}

#[test]
fn a_cancel_just_before_the_ack_counts_as_cancelled() {
    cancel_just_before_the_end(Ok(()), false);
}

#[test]
fn a_cancel_just_before_a_failure_counts_as_cancelled_not_failed() {
    cancel_just_before_the_end(Err("fails".into()), false);
}

#[test]
fn a_cancel_before_the_ack_counts_as_cancelled_whatever_lease_another_pool_has() {
    // Acks look for marks while the latest is recent, as the last pool to run a script
    // tells a lease: a pool of 0.2 s leases beside this one of 30 s must not end that
    // look before this pool's ack, which comes 1 s after the cancel and before its first
    // heartbeat (10 s).
    cancel_just_before_the_end(Ok(()), true);
}

/// The handler ends with `end` before any heartbeat could carry the mark: the ack or
/// the nack finds it. `beside_short_leases`: an idle pool of 0.2 s leases runs beside,
/// and the handler ends 1 s after the cancel.
fn cancel_just_before_the_end(end: Result<(), String>, beside_short_leases: bool) {
    let server = RedisServer::start();
    let q = server.queue("orders");
    push(&q, json!({"n": 1}), Duration::ZERO, "o-1");
    let (done_tx, done) = crossbeam_channel::bounded::<()>(1);
    let short = beside_short_leases.then(|| {
        let opts = WorkerOptions {
            lease: Duration::from_millis(200),
            idle_check: Duration::from_millis(20),
            ..options()
        };
        Worker::new(q.clone(), opts).expect("worker")
    });
    let (summary, calls) = run_cancelling(
        &q,
        WorkerOptions {
            lease: Duration::from_secs(30),
            ..options()
        },
        "o-1",
        || {
            std::thread::scope(|s| {
                let idle = short.as_ref().map(|w| s.spawn(|| w.run(1, |_| Ok(())).expect("run")));
                if idle.is_some() {
                    wait_for(Duration::from_secs(5), "the short pool's half lease in control", || {
                        let half: Option<u64> = redis::cmd("HGET")
                            .arg("{dq:orders}:control")
                            .arg("stall_ms")
                            .query(&mut server.con())
                            .expect("HGET");
                        half == Some(100)
                    });
                }
                assert!(q.cancel("o-1").expect("cancel"));
                if idle.is_some() {
                    std::thread::sleep(Duration::from_secs(1));
                }
                done_tx.send(()).expect("send");
                if let (Some(w), Some(idle)) = (&short, idle) {
                    wait_for(Duration::from_secs(10), "o-1 ended", || {
                        counter(&q, "cancelled") + counter(&q, "acked") + counter(&q, "retried") == 1
                    });
                    w.stopper().stop();
                    idle.join().expect("idle pool");
                }
            });
        },
        |d| {
            done.recv_timeout(Duration::from_secs(10)).map_err(|e| e.to_string())?;
            assert!(!d.is_cancelled(), "no heartbeat came between");
            end.clone()
        },
    );
    assert_eq!(calls["o-1"], 1);
    assert_eq!(
        (summary.acked, summary.failed, summary.retried, summary.cancelled),
        (0, 0, 0, 1),
        "{summary:?} {:?}",
        q.stats().expect("stats").totals
    );
    assert_eq!(
        (counter(&q, "cancelled"), counter(&q, "acked"), counter(&q, "retried")),
        (1, 0, 0)
    );
    assert_no_leak(&server, "{dq:orders}");
}

#[test]
fn a_cancelled_message_whose_lease_expires_is_not_delivered_again() {
    // Past its timeout the handler is left to run and its lease to expire: the reaper
    // (another pool's claim: this one's only handler is overdue, so it claims nothing)
    // deletes the marked message instead of delivering it again.
    let server = RedisServer::start();
    let q = server.queue("orders");
    push(&q, json!({"n": 1}), Duration::ZERO, "o-1");
    let other_calls = Mutex::new(0);
    let (summary, calls) = run_cancelling(
        &q,
        WorkerOptions {
            timeout: Some(Duration::from_millis(200)),
            ..options()
        },
        "o-1",
        || {
            assert!(q.cancel("o-1").expect("cancel"));
            // Claims, each of which reaps, until the lease expired and the reaper took
            // the message.
            let deadline = Instant::now() + Duration::from_secs(10);
            while counter(&q, "cancelled") == 0 && Instant::now() < deadline {
                common::run_until_empty(&q, options(), |_| {
                    *other_calls.lock().expect("lock") += 1;
                    Ok(())
                });
                std::thread::sleep(Duration::from_millis(50));
            }
        },
        |d| {
            if d.id == "o-1" {
                wait_for(Duration::from_secs(10), "the reaper", || counter(&q, "cancelled") == 1);
            }
            Ok(())
        },
    );
    assert_eq!(calls.get("o-1"), Some(&1), "{summary:?}");
    assert_eq!(*other_calls.lock().expect("lock"), 0, "not delivered again");
    assert_eq!((counter(&q, "cancelled"), counter(&q, "expired")), (1, 0));
    assert_eq!(q.get("o-1").expect("get"), None);
    assert_no_leak(&server, "{dq:orders}");
}

#[test]
fn a_marked_message_reads_as_before_while_it_runs() {
    // The mark is the stamp's first number: the views of this build and the plain JSON
    // reading of the build before (which decodes an envelope whole when its own
    // reading fails) see the message as it was.
    let server = RedisServer::start();
    let q = server.queue("orders");
    push(&q, json!({"order": 10086}), Duration::ZERO, "o-1");
    let mut con = server.con();
    let (summary, _) = run_cancelling(
        &q,
        options(),
        "o-1",
        || assert!(q.cancel_with("o-1", CancelOptions::kill(true)).expect("cancel")),
        |d| {
            wait_cancelled(d, Duration::from_secs(5)).expect("seen");
            let stored: String = redis::cmd("HGET")
                .arg("{dq:orders}:messages")
                .arg("o-1")
                .query(&mut server.con())
                .expect("HGET");
            let whole: serde_json::Value = serde_json::from_str(&stored).expect("valid JSON");
            assert_eq!(whole["payload"], json!({"order": 10086}));
            let info = q.get("o-1").expect("get").expect("known");
            assert_eq!(
                (info.state, info.payload_json.as_str()),
                (State::Inflight, r#"{"order":10086}"#)
            );
            assert!(info.due_at_ms.is_some(), "{info:?}");
            let running = q.list(Listing::Inflight, 10).expect("list");
            assert_eq!(running.len(), 1);
            assert!(stored.starts_with(r#"{"at":[-2,"#), "{stored}");
            Ok(())
        },
    );
    assert_eq!(summary.handled, 1);
    let stored: bool = redis::cmd("HEXISTS")
        .arg("{dq:orders}:messages")
        .arg("o-1")
        .query(&mut con)
        .expect("HEXISTS");
    assert!(!stored, "deleted when its delivery ended");
    assert_eq!(counter(&q, "cancelled"), 1);
}

#[test]
fn a_waiting_message_is_deleted_as_before_and_an_unknown_one_is_not_cancelled() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    push(&q, json!({"n": 1}), Duration::from_secs(60), "later");
    assert!(q.cancel("later").expect("cancel"));
    assert!(!q.cancel("later").expect("cancel"), "gone now");
    assert!(!q.cancel_with("nobody", CancelOptions::kill(true)).expect("cancel"));
    assert_eq!(counter(&q, "cancelled"), 1);
    assert_no_leak(&server, "{dq:orders}");
}

#[test]
fn an_older_builds_claim_number_is_no_cancel_mark() {
    // The build before this one wrote the queue's sequence where the mark goes: a
    // stamp of [1,...] or [2,...] is a claim number, and its message runs as usual.
    let server = RedisServer::start();
    let q = server.queue("orders");
    // Run first: its mark, recent while the others run, opens the look for marks in
    // ack.lua and extend.lua.
    push(&q, json!({}), Duration::ZERO, "c");
    let mut con = server.con();
    for (id, no) in [("a", "1"), ("b", "2")] {
        push(&q, json!({"id": id}), Duration::ZERO, id);
        let stored: String = redis::cmd("HGET")
            .arg("{dq:orders}:messages")
            .arg(id)
            .query(&mut con)
            .expect("HGET");
        let rest = stored.strip_prefix(r#"{"at":[0,"#).expect("a stamp");
        let _: () = redis::cmd("HSET")
            .arg("{dq:orders}:messages")
            .arg(id)
            .arg(format!(r#"{{"at":[{no},{rest}"#))
            .query(&mut con)
            .expect("HSET");
    }
    let (summary, calls) = run_cancelling(
        &q,
        WorkerOptions { batch: 1, ..options() },
        "c",
        || assert!(q.cancel("c").expect("cancel")),
        |d| {
            if d.id == "c" {
                wait_cancelled(d, Duration::from_secs(5)).expect("seen");
            } else {
                std::thread::sleep(LEASE / 2);
                assert!(!d.is_cancelled(), "{} is not cancelled", d.id);
                let info = q.get(&d.id).expect("get").expect("known");
                assert_eq!((info.state, info.cancelled), (State::Inflight, false), "{}", d.id);
            }
            Ok(())
        },
    );
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert_eq!(summary.acked, 2, "{summary:?}");
    assert_eq!((counter(&q, "cancelled"), counter(&q, "acked")), (1, 2));
    assert_no_leak(&server, "{dq:orders}");
}

#[test]
fn a_prefetched_message_cancelled_before_a_stop_counts_as_cancelled_not_released() {
    // No heartbeat comes between the cancel and the stop (30 s leases): the release at
    // the stop finds the mark and deletes the message, and the summary says so.
    let server = RedisServer::start();
    let q = server.queue("orders");
    // A fast delivery first (claimed alone until the pool measured one), so that the
    // pool then claims o-1 and o-2 together.
    push(&q, json!({"n": 0}), Duration::ZERO, "f-1");
    push(&q, json!({"n": 1}), Duration::ZERO, "o-1");
    push(&q, json!({"n": 2}), Duration::ZERO, "o-2");
    let opts = WorkerOptions {
        prefetch: 2,
        lease: Duration::from_secs(30),
        ..options()
    };
    let c = Worker::new(q.clone(), opts)
        .expect("worker")
        .start_with(1)
        .expect("start");
    let mut handled = Vec::new();
    while handled.len() < 2 {
        let delayq::Received::Message(d) = c.recv_timeout(Duration::from_secs(5)) else {
            panic!("no delivery after {handled:?}");
        };
        handled.push(d.id.clone());
        if d.id == "o-1" {
            wait_for(Duration::from_secs(5), "o-2 claimed with o-1", || {
                q.get("o-2").expect("get").is_some_and(|m| m.state == State::Inflight)
            });
            assert!(q.cancel("o-2").expect("cancel"));
        }
        c.ack(d);
    }
    assert_eq!(handled, ["f-1", "o-1"]);
    let summary = c.finish();
    assert_eq!(
        (summary.handled, summary.acked, summary.released, summary.cancelled),
        (2, 2, 0, 1),
        "{summary:?}"
    );
    assert_eq!((counter(&q, "cancelled"), counter(&q, "released")), (1, 0));
    assert_eq!(q.get("o-2").expect("get"), None);
    assert_no_leak(&server, "{dq:orders}");
}

#[test]
fn a_delivery_cancelled_before_its_late_start_is_not_counted_as_handled() {
    // A caller that starts the handler after the hand-out (an asyncio task) asks
    // `begin`: the mark came between, so no handler starts it.
    let server = RedisServer::start();
    let q = server.queue("orders");
    push(&q, json!({"n": 1}), Duration::ZERO, "o-1");
    let c = Worker::new(q.clone(), options())
        .expect("worker")
        .start_with(1)
        .expect("start");
    let delayq::Received::Message(d) = c.recv_timeout(Duration::from_secs(5)) else {
        panic!("no delivery");
    };
    assert!(q.cancel("o-1").expect("cancel"));
    wait_cancelled(&d, Duration::from_secs(5)).expect("a heartbeat brought the mark");
    assert!(c.begin(d).is_none(), "not started");
    let summary = c.finish();
    assert_eq!((summary.handled, summary.cancelled), (0, 1), "{summary:?}");
    assert_eq!(counter(&q, "cancelled"), 1);
    assert_no_leak(&server, "{dq:orders}");
}

#[test]
fn a_handler_past_its_timeout_still_sees_the_cancel() {
    // Past its timeout the delivery leaves its claim (its lease is no longer renewed),
    // but its handler may still run until that lease ends: the heartbeats still bring
    // it the mark.
    let server = RedisServer::start();
    let q = server.queue("orders");
    push(&q, json!({"n": 1}), Duration::ZERO, "o-1");
    let lease = Duration::from_millis(1500);
    let seen = Mutex::new(None);
    let (summary, calls) = run_cancelling(
        &q,
        WorkerOptions {
            lease,
            timeout: Some(Duration::from_millis(200)),
            ..options()
        },
        "o-1",
        || {
            wait_for(Duration::from_secs(5), "o-1 detached from its claim", || {
                let own: Option<f64> = redis::cmd("ZSCORE")
                    .arg("{dq:orders}:inflight")
                    .arg("o-1")
                    .query(&mut server.con())
                    .expect("ZSCORE");
                own.is_some()
            });
            assert!(q.cancel("o-1").expect("cancel"));
        },
        |d| {
            *seen.lock().expect("lock") = wait_cancelled(d, lease);
            Ok(())
        },
    );
    let seen = seen.lock().expect("lock").expect("the handler saw the cancel");
    assert!(seen < lease, "seen after {seen:?}");
    assert_eq!(calls["o-1"], 1);
    assert_eq!((summary.acked, summary.cancelled), (0, 1), "{summary:?}");
    assert_eq!((counter(&q, "cancelled"), counter(&q, "acked")), (1, 0));
    assert_no_leak(&server, "{dq:orders}");
}

#[test]
fn get_and_the_running_listing_show_the_mark_at_once() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    push(&q, json!({"n": 1}), Duration::ZERO, "o-1");
    push(&q, json!({"n": 2}), Duration::from_secs(60), "later");
    let c = Worker::new(q.clone(), options())
        .expect("worker")
        .start_with(1)
        .expect("start");
    let delayq::Received::Message(d) = c.recv_timeout(Duration::from_secs(5)) else {
        panic!("no delivery");
    };
    let info = q.get("o-1").expect("get").expect("known");
    assert_eq!((info.state, info.cancelled), (State::Inflight, false));
    assert!(q.cancel("o-1").expect("cancel"));
    // Read from the stored mark: no heartbeat needs to come first.
    let info = q.get("o-1").expect("get").expect("known");
    assert_eq!((info.state, info.cancelled), (State::Inflight, true), "{info:?}");
    assert_eq!(info.payload_json, r#"{"n":1}"#);
    let running = q.list(Listing::Inflight, 10).expect("list");
    assert_eq!(running.iter().map(|m| m.cancelled).collect::<Vec<_>>(), [true]);
    let waiting = q.get("later").expect("get").expect("known");
    assert!(!waiting.cancelled, "{waiting:?}");
    c.ack(d);
    let summary = c.finish();
    assert_eq!(summary.cancelled, 1, "{summary:?}");
    assert_eq!(q.get("o-1").expect("get"), None);
}
