//! What push accepts, every consumer delivers: a payload nested as deep as
//! `MAX_DEPTH` reaches its handler; one level deeper is refused at push, and one
//! written past push (by hand, another tool) goes to the dead letters at its first
//! claim with the reason, never to a handler. A message buried because earlier
//! deliveries used up `max_attempts` keeps its last error.

mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::{RedisServer, run_until_empty};
use delayq::{Error, MAX_DEPTH, NewMessage, Worker, WorkerOptions};

fn deep(levels: usize) -> String {
    format!("{}1{}", "[".repeat(levels), "]".repeat(levels))
}

fn drain(q: &delayq::Queue, opts: WorkerOptions) -> Vec<String> {
    let seen = Mutex::new(Vec::new());
    run_until_empty(q, opts, |d| {
        let v: serde_json::Value = d.payload().map_err(|e| e.to_string())?;
        seen.lock().expect("lock").push(v.to_string());
        Ok(())
    });
    seen.into_inner().expect("lock")
}

#[test]
fn a_payload_at_the_depth_limit_is_delivered_and_one_past_it_is_refused() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    q.push_json(deep(MAX_DEPTH), delayq::Due::NOW, &Default::default())
        .expect("at the limit");
    let err = q
        .push_json(deep(MAX_DEPTH + 1), delayq::Due::NOW, &Default::default())
        .expect_err("past the limit");
    assert!(matches!(err, Error::PayloadNotSerializable(_)), "{err:?}");
    assert!(err.to_string().contains("the limit is 128"), "{err}");
    let seen = drain(&q, WorkerOptions::default());
    assert_eq!(seen, [deep(MAX_DEPTH)]);
    assert_eq!(q.stats().expect("stats").dead, 0);
}

#[test]
fn a_stored_payload_too_deep_to_decode_is_dead_lettered_at_its_first_claim() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    let id = q.push_json("0", delayq::Due::NOW, &Default::default()).expect("push");
    // Rewrite its envelope with a payload deeper than push allows.
    let mut con = server.con();
    let stored: String = redis::cmd("HGET")
        .arg("{dq:orders}:messages")
        .arg(&id)
        .query(&mut con)
        .expect("HGET");
    let deeper = stored.replace("\"payload\":0", &format!("\"payload\":{}", deep(MAX_DEPTH + 1)));
    assert_ne!(deeper, stored);
    let _: () = redis::cmd("HSET")
        .arg("{dq:orders}:messages")
        .arg(&id)
        .arg(&deeper)
        .query(&mut con)
        .expect("HSET");
    let seen = drain(&q, WorkerOptions::default());
    assert!(seen.is_empty(), "a handler got it: {seen:?}");
    let dead = q.dead_letters(10).expect("dead");
    assert_eq!(dead.len(), 1);
    assert!(
        dead[0].last_error.contains("nested 129 levels deep, the limit is 128"),
        "{}",
        dead[0].last_error
    );
}

#[test]
fn a_message_past_a_lowered_max_attempts_keeps_its_last_error() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    let id = q.push(&1, Duration::ZERO).expect("push");
    // Two failed attempts under a pool that allows five, then it stops.
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            backoff_base: Duration::from_millis(1),
            backoff_max: Duration::from_millis(1),
            ..WorkerOptions::default()
        },
    )
    .expect("worker");
    let stopper = worker.stopper();
    let failures = std::sync::atomic::AtomicUsize::new(0);
    let summary = worker
        .run(1, |_| {
            if failures.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 1 {
                stopper.stop();
            }
            Err("card declined".into())
        })
        .expect("run");
    assert_eq!(summary.failed, 2);
    assert!(
        q.reschedule(&id, Duration::ZERO).expect("reschedule"),
        "it waits for its retry"
    );
    // The next pool allows one: the message is buried at its claim, unrun.
    let seen = drain(
        &q,
        WorkerOptions {
            max_attempts: 1,
            ..WorkerOptions::default()
        },
    );
    assert!(seen.is_empty(), "{seen:?}");
    let dead = q.dead_letters(10).expect("dead");
    assert_eq!(dead.len(), 1);
    let error = &dead[0].last_error;
    assert!(
        error.starts_with("gave up after 2 attempts (max_attempts 1)"),
        "{error}"
    );
    assert!(error.contains("card declined"), "{error}");
    assert_eq!(dead[0].attempts, 2);
    assert_eq!(q.get(&id).expect("get").expect("dead").attempts, 2);
}

#[test]
fn a_batch_that_names_a_too_deep_item_writes_nothing() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    let batch = vec![
        NewMessage::new(&1, Duration::ZERO).expect("message"),
        NewMessage {
            payload_json: deep(MAX_DEPTH + 1).into(),
            ..NewMessage::new(&1, Duration::ZERO).expect("message")
        },
    ];
    let err = q.push_many(&batch).expect_err("too deep");
    assert!(err.to_string().contains("item 1"), "{err}");
    assert!(server.dump_keys().is_empty());
}

#[test]
fn integers_past_the_signed_64_bit_range_are_refused_by_path_and_write_nothing() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    // PHP would receive these as rounded floats.
    let err = q
        .push(&serde_json::json!({"order": {"ids": [1, u64::MAX]}}), Duration::ZERO)
        .expect_err("u64::MAX");
    assert!(matches!(err, Error::PayloadNotSerializable(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains(r#"payload["order"]["ids"][1] is 18446744073709551615, outside the signed 64-bit range"#),
        "{err}"
    );
    let batch = [
        NewMessage::new(&serde_json::json!({"n": 1}), Duration::ZERO).expect("payload"),
        NewMessage::new(&serde_json::json!({"n": i64::MAX as u64 + 1}), Duration::ZERO).expect("payload"),
    ];
    let err = q.push_many(&batch).expect_err("one item past the range");
    assert!(err.to_string().contains("9223372036854775808"), "{err}");
    assert!(
        server.dump_keys().is_empty(),
        "nothing written: {:?}",
        server.dump_keys()
    );
    // The edges themselves go through, exactly.
    let edges = serde_json::json!({"max": i64::MAX, "min": i64::MIN});
    q.push(&edges, Duration::ZERO).expect("the edges");
    assert_eq!(drain(&q, WorkerOptions::default()), [edges.to_string()]);
}
