//! Messages due in the same millisecond run in push order, whatever the queue's
//! sequence counter reads: in one batch, in pushes one after another, on each
//! partition, and for retries and requeued dead letters due in one millisecond.

mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::{RedisServer, run_until_empty};
use delayq::{Due, NewMessage, Queue, QueueOptions, WorkerOptions};
use serde_json::json;

/// The order one handler meets the queue's due messages in.
fn drained_order(q: &Queue) -> Vec<i64> {
    let seen = Mutex::new(Vec::new());
    run_until_empty(q, WorkerOptions::default(), |d| {
        let v: serde_json::Value = d.payload().map_err(|e| e.to_string())?;
        seen.lock().expect("lock").push(v["n"].as_i64().expect("n"));
        Ok(())
    });
    seen.into_inner().expect("lock")
}

/// One due millisecond in the past: due now, the same for every message.
fn one_millisecond(server: &RedisServer) -> Due {
    Due::AtUnixMs(server.now_ms() - 1000)
}

fn set_counter(server: &RedisServer, key: &str, value: i64) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query(&mut server.con())
        .expect("SET");
}

#[test]
fn a_batch_due_in_one_millisecond_keeps_its_order_across_the_counters_wrap() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    // The sequence that scores used to take their low 12 bits from, 6 below a multiple
    // of 4096: a batch of 12 crossed it and ran as [6..11, 0..5].
    set_counter(&server, "{dq:orders}:seq", 4090);
    let due = one_millisecond(&server);
    let batch: Vec<NewMessage> = (0..12)
        .map(|n| NewMessage::new(&json!({"n": n}), due).expect("message"))
        .collect();
    q.push_many(&batch).expect("push_many");
    assert_eq!(drained_order(&q), (0..12).collect::<Vec<_>>());
}

#[test]
fn a_batch_of_chosen_ids_keeps_push_order_whatever_the_ids_sort_as() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    let due = one_millisecond(&server);
    // Generated ids share one score per run (they increase as they are made); chosen
    // ids, here in falling order and mixed with generated ones, each take a place.
    let batch: Vec<NewMessage> = (0..12)
        .map(|n| {
            let mut m = NewMessage::new(&json!({"n": n}), due).expect("message");
            if n % 4 != 3 {
                m.options.id = Some(format!("order-{}", 99 - n));
            }
            m
        })
        .collect();
    q.push_many(&batch).expect("push_many");
    assert_eq!(drained_order(&q), (0..12).collect::<Vec<_>>());
}

#[test]
fn pushes_one_after_another_due_in_one_millisecond_keep_their_order() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    set_counter(&server, "{dq:orders}:seq", 4093);
    push_twelve(&q, one_millisecond(&server));
    assert_eq!(drained_order(&q), (0..12).collect::<Vec<_>>());
}

/// Messages 0 to 11 due at `due`: 8 pushes one after another, then a batch of 4.
fn push_twelve(q: &Queue, due: Due) {
    for n in 0..8 {
        q.push(&json!({"n": n}), due).expect("push");
    }
    let batch: Vec<NewMessage> = (8..12)
        .map(|n| NewMessage::new(&json!({"n": n}), due).expect("message"))
        .collect();
    q.push_many(&batch).expect("push_many");
}

/// The same below a message due later: the millisecond's last place is read from the
/// schedule, where above it the schedule's highest score gives it.
#[test]
fn pushes_due_before_a_later_message_keep_their_order() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    let due = one_millisecond(&server);
    let Due::AtUnixMs(ms) = due else { unreachable!() };
    q.push(&json!({"n": 100}), Due::AtUnixMs(ms + 500)).expect("push");
    push_twelve(&q, due);
    assert_eq!(drained_order(&q), (0..12).chain([100]).collect::<Vec<_>>());
}

#[test]
fn each_partition_keeps_push_order_within_a_millisecond() {
    let server = RedisServer::start();
    let opts = QueueOptions {
        partitions: 3,
        ..QueueOptions::default()
    };
    let q = Queue::new(&server.url(), "orders", opts).expect("queue");
    for part in 0..3 {
        let tag = q.hash_tag(part).expect("tag");
        set_counter(&server, &format!("{tag}:seq"), 4095 - part as i64);
    }
    let due = one_millisecond(&server);
    // Each run of 10 on one partition (by its partition key), interleaved.
    let batch: Vec<NewMessage> = (0..30)
        .map(|n| {
            let mut m = NewMessage::new(&json!({"n": n}), due).expect("message");
            m.options.partition_key = Some(format!("key-{}", n % 3));
            m
        })
        .collect();
    q.push_many(&batch).expect("push_many");
    let order = drained_order(&q);
    assert_eq!(order.len(), 30);
    for key in 0..3 {
        let of_key: Vec<i64> = order.iter().copied().filter(|n| n % 3 == key).collect();
        let mut sorted = of_key.clone();
        sorted.sort_unstable();
        assert_eq!(of_key, sorted, "partition key {key}");
    }
}

#[test]
fn requeued_dead_letters_keep_the_order_they_are_requeued_in() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    set_counter(&server, "{dq:orders}:seq", 4094);
    for n in 0..6 {
        let mut m = NewMessage::new(&json!({"n": n}), Duration::ZERO).expect("message");
        m.options.id = Some(format!("m{n}"));
        q.push_many(&[m]).expect("push");
    }
    let opts = WorkerOptions {
        max_attempts: 1,
        ..WorkerOptions::default()
    };
    run_until_empty(&q, opts, |_| Err("declined".into()));
    assert_eq!(q.stats().expect("stats").dead, 6);
    // All requeued in one call, due in the same millisecond: oldest death first.
    assert_eq!(q.requeue_dead(None).expect("requeue"), 6);
    assert_eq!(drained_order(&q), (0..6).collect::<Vec<_>>());
}
