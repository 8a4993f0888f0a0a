//! `QueueOptions::keep_completed`: acknowledged messages kept for a while, so that
//! "did order 10086 close, and when?" has an answer, within a bounded memory.

mod common;

use std::time::Duration;

use common::{RedisServer, run_until};
use delayq::{Error, Listing, PushOptions, Queue, QueueOptions, State, Worker, WorkerOptions};
use serde_json::json;

fn keeping(server: &RedisServer, keep: usize, keep_for: Duration) -> Queue {
    server.queue_with(
        "orders",
        QueueOptions {
            keep_completed: keep,
            keep_completed_for: keep_for,
            ..Default::default()
        },
    )
}

fn fast() -> WorkerOptions {
    WorkerOptions {
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_millis(10),
        ..Default::default()
    }
}

/// Run a pool on `q` until `n` deliveries succeeded; the first delivery of a payload
/// with `"fail": true` fails.
fn consume(q: &Queue, n: usize) {
    let worker = Worker::new(q.clone(), fast()).expect("worker");
    run_until(
        &worker,
        1,
        Duration::from_secs(20),
        |d, done: &parking_lot::Mutex<usize>| {
            if d.payload_json().contains("\"fail\":true") && d.attempt == 1 {
                return Err("gateway down".into());
            }
            *done.lock() += 1;
            Ok(())
        },
        |done| *done == n,
    );
    // The last acknowledgements are written when the pool stops.
}

/// The kept set and its records agree, as the message hash and the sets do.
fn assert_kept_agree(server: &RedisServer, tag: &str) -> u64 {
    let mut con = server.con();
    let (zcard, hlen): (u64, u64) = redis::pipe()
        .zcard(format!("{tag}:completed"))
        .hlen(format!("{tag}:completed_messages"))
        .query(&mut con)
        .expect("completed keys");
    assert_eq!(zcard, hlen, "completed set and records disagree under {tag}");
    zcard
}

#[test]
fn the_latest_completed_messages_are_kept_with_their_payload_attempts_and_times() {
    let server = RedisServer::start();
    let q = keeping(&server, 3, Duration::from_secs(3600));
    let ids: Vec<String> = (0..5)
        .map(|i| {
            let payload = if i == 4 {
                json!({"n": i, "fail": true})
            } else {
                json!({"n": i})
            };
            q.push(&payload, Duration::ZERO).expect("push")
        })
        .collect();
    let before = server.now_ms();

    consume(&q, 5);

    let stats = q.stats().expect("stats");
    assert_eq!((stats.completed, stats.total("acked")), (3, 5));
    assert_eq!(assert_kept_agree(&server, "{dq:orders}"), 3);
    let listed = q.list(Listing::Completed, 10).expect("list");
    assert_eq!(listed.len(), 3);
    assert!(
        listed.windows(2).all(|w| w[0].completed_at_ms >= w[1].completed_at_ms),
        "latest first"
    );
    let failed_once = q.get(&ids[4]).expect("get").expect("kept");
    assert_eq!(
        (
            failed_once.state,
            failed_once.attempts,
            failed_once.payload_json.as_str()
        ),
        (State::Completed, 2, r#"{"n":4,"fail":true}"#)
    );
    let at = failed_once.completed_at_ms.expect("completed_at");
    assert!(at >= before && at <= server.now_ms(), "{at} on the server clock");
    assert!(failed_once.due_at_ms.expect("due of the retry") > before);
    let kept: Vec<&str> = listed.iter().map(|m| m.id.as_str()).collect();
    let gone: Vec<&String> = ids.iter().filter(|id| !kept.contains(&id.as_str())).collect();
    assert_eq!(gone.len(), 2);
    for id in gone {
        assert!(q.get(id).expect("get").is_none(), "past keep_completed: {id} deleted");
    }
    common::assert_no_leak(&server, "{dq:orders}");
}

#[test]
fn old_completed_messages_go_and_so_do_all_once_keeping_stops() {
    let server = RedisServer::start();
    let q = keeping(&server, 100, Duration::from_secs(1));
    let first = q.push(&"first", Duration::ZERO).expect("push");
    consume(&q, 1);
    assert_eq!(q.get(&first).expect("get").expect("kept").state, State::Completed);
    std::thread::sleep(Duration::from_millis(1100));
    q.push(&"second", Duration::ZERO).expect("push");
    consume(&q, 1);
    assert!(q.get(&first).expect("get").is_none(), "older than keep_completed_for");
    assert_eq!(q.stats().expect("stats").completed, 1);

    // A pool that keeps none clears what an earlier setting kept.
    let plain = server.queue("orders");
    plain.push(&"third", Duration::ZERO).expect("push");
    consume(&plain, 1);
    assert_eq!(q.stats().expect("stats").completed, 0);
    assert_eq!(assert_kept_agree(&server, "{dq:orders}"), 0);
}

#[test]
fn a_kept_id_pushed_again_is_a_new_message_and_purge_clears_the_kept_ones() {
    let server = RedisServer::start();
    let q = keeping(&server, 10, Duration::from_secs(3600));
    let opts = PushOptions {
        id: Some("close-order-10086".into()),
        ..Default::default()
    };
    q.push_json(r#"{"v":1}"#, delayq::Due::NOW, &opts).expect("push");
    consume(&q, 1);
    q.push_json(r#"{"v":2}"#, delayq::Due::In(Duration::from_secs(60)), &opts)
        .expect("push again");
    let now = q.get("close-order-10086").expect("get").expect("exists");
    assert_eq!((now.state, now.payload_json.as_str()), (State::Scheduled, r#"{"v":2}"#));
    assert_eq!(q.stats().expect("stats").completed, 1);

    assert_eq!(q.purge().expect("purge"), 1, "kept ones are not counted as messages");
    assert_eq!(q.stats().expect("stats").completed, 0);
    assert!(
        server.dump_keys().iter().all(|k| !k.contains("completed")),
        "{:?}",
        server.dump_keys()
    );
}

#[test]
fn bad_retention_settings_are_refused() {
    let server = RedisServer::start();
    let make = |keep: usize, keep_for: Duration| {
        Queue::new(
            &server.url(),
            "orders",
            QueueOptions {
                keep_completed: keep,
                keep_completed_for: keep_for,
                ..Default::default()
            },
        )
    };
    let too_many = make(delayq::MAX_KEEP_COMPLETED + 1, Duration::from_secs(60)).expect_err("too many");
    assert!(matches!(&too_many, Error::InvalidArgument { name, .. } if name == "keep_completed"));
    let too_short = make(10, Duration::from_millis(500)).expect_err("too short");
    assert!(matches!(&too_short, Error::InvalidArgument { name, .. } if name == "keep_completed_for"));
    assert!(server.dump_keys().is_empty());
}
