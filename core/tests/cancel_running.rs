//! `Queue::cancel` of a message that runs: its pool learns of the mark within a
//! heartbeat, its handler sees it, and whatever the handler does then the message is
//! deleted, counted as cancelled: never retried, never dead-lettered, never run again.

mod common;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{RedisServer, assert_no_leak, wait_for};
use delayq::{CancelOptions, Queue, Worker, WorkerOptions};
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
                handler(d)
            })
            .expect("run")
    });
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
    assert_eq!((summary.retried, summary.dead), (0, 0), "{summary:?}");
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
fn a_cancel_just_before_the_ack_counts_as_cancelled() {
    // The handler returns before any heartbeat could carry the mark: the ack finds it.
    let server = RedisServer::start();
    let q = server.queue("orders");
    push(&q, json!({"n": 1}), Duration::ZERO, "o-1");
    let (done_tx, done) = crossbeam_channel::bounded::<()>(1);
    let (summary, calls) = run_cancelling(
        &q,
        WorkerOptions {
            lease: Duration::from_secs(30),
            ..options()
        },
        "o-1",
        || {
            assert!(q.cancel("o-1").expect("cancel"));
            done_tx.send(()).expect("send");
        },
        |d| {
            done.recv_timeout(Duration::from_secs(10)).map_err(|e| e.to_string())?;
            assert!(!d.is_cancelled(), "no heartbeat came between");
            Ok(())
        },
    );
    assert_eq!(calls["o-1"], 1);
    assert_eq!(summary.acked, 0, "{summary:?} {:?}", q.stats().expect("stats").totals);
    assert_eq!((counter(&q, "cancelled"), counter(&q, "acked")), (1, 0));
    assert_no_leak(&server, "{dq:orders}");
}

#[test]
fn a_cancelled_message_whose_lease_expires_is_not_delivered_again() {
    // Past its timeout the handler is left to run and its lease to expire: the reaper
    // deletes the marked message instead of delivering it again.
    let server = RedisServer::start();
    let q = server.queue("orders");
    push(&q, json!({"n": 1}), Duration::ZERO, "o-1");
    let (summary, calls) = run_cancelling(
        &q,
        WorkerOptions {
            timeout: Some(Duration::from_millis(200)),
            ..options()
        },
        "o-1",
        || assert!(q.cancel("o-1").expect("cancel")),
        |d| {
            if d.id == "o-1" {
                let t = Instant::now();
                wait_for(Duration::from_secs(10), "the reaper", || {
                    t.elapsed() > LEASE * 3 && counter(&q, "cancelled") == 1
                });
            }
            Ok(())
        },
    );
    assert_eq!(calls.get("o-1"), Some(&1), "{summary:?}");
    assert_eq!((counter(&q, "cancelled"), counter(&q, "expired")), (1, 0));
    assert_eq!(q.get("o-1").expect("get"), None);
    assert_no_leak(&server, "{dq:orders}");
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
            }
            Ok(())
        },
    );
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert_eq!(summary.acked, 2, "{summary:?}");
    assert_eq!((counter(&q, "cancelled"), counter(&q, "acked")), (1, 2));
    assert_no_leak(&server, "{dq:orders}");
}
