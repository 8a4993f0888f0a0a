//! `Queue::find`: the messages whose payload contains a text (or whose id it is), in every state.

mod common;

use std::time::Duration;

use common::{RedisServer, run_until};
use delayq::{Error, NewMessage, QueueOptions, State, Worker, WorkerOptions};
use serde_json::json;

#[test]
fn find_reaches_every_state_and_every_partition_and_only_payloads_and_whole_ids_match() {
    let server = RedisServer::start();
    let q = server.queue_with(
        "orders",
        QueueOptions {
            partitions: 3,
            keep_completed: 10,
            ..Default::default()
        },
    );
    // A backlog of more than one scan step, with order 10086 in it once per state.
    for start in (0..3000).step_by(1000) {
        let batch: Vec<NewMessage> = (start..start + 1000)
            .map(|i| NewMessage::new(&json!({"order_id": i + 20000}), Duration::from_secs(3600)).expect("message"))
            .collect();
        q.push_many(&batch).expect("push");
    }
    let waiting = q
        .push(&json!({"order_id": 10086, "step": "remind"}), Duration::from_secs(60))
        .expect("push");
    let done = q
        .push(&json!({"order_id": 10086, "step": "close"}), Duration::ZERO)
        .expect("push");
    let worker = Worker::new(q.clone(), WorkerOptions::default()).expect("worker");
    run_until(
        &worker,
        1,
        Duration::from_secs(10),
        |_, n: &parking_lot::Mutex<u32>| {
            *n.lock() += 1;
            Ok(())
        },
        |n| *n == 1,
    );
    let running = q
        .push(&json!({"order_id": 10086, "step": "refund"}), Duration::ZERO)
        .expect("push");
    let doomed = q
        .push_json(
            r#"{"order_id":10086,"step":"notify"}"#,
            delayq::Due::NOW,
            &delayq::PushOptions {
                max_attempts: Some(1),
                ..Default::default()
            },
        )
        .expect("push");
    let (consumer, held) = common::one_dead_one_running(&q, &doomed);
    assert_eq!(held.id, running);

    let mut found = q.find("10086", 10).expect("find");
    found.sort_by_key(|m| m.payload_json.clone());
    let states: Vec<(&str, State)> = found.iter().map(|m| (m.id.as_str(), m.state)).collect();
    assert_eq!(
        states,
        vec![
            (done.as_str(), State::Completed),
            (doomed.as_str(), State::Dead),
            (running.as_str(), State::Inflight),
            (waiting.as_str(), State::Scheduled)
        ]
    );
    assert_eq!(q.find("10086", 2).expect("find").len(), 2, "the limit holds");
    assert_eq!(q.find(&waiting, 10).expect("find by id").len(), 1);
    assert!(
        q.find("created_ms", 10).expect("find").is_empty(),
        "envelope metadata is not the payload"
    );
    assert!(q.find("no such order", 10).expect("find").is_empty());
    let named = q
        .push_json(
            r#"{"order_id":1}"#,
            delayq::Due::In(Duration::from_secs(60)),
            &delayq::PushOptions {
                id: Some("ref-10086-x".into()),
                ..Default::default()
            },
        )
        .expect("push");
    assert!(
        q.find("10086", 10).expect("find").iter().all(|m| m.id != named),
        "part of an id is no match: generated ids are random hex"
    );
    assert_eq!(q.find(&named, 10).expect("find by id")[0].id, named);
    consumer.ack(held);
    consumer.stop();
}

#[test]
fn find_refuses_an_empty_text_and_a_limit_past_1000() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    assert!(matches!(q.find("", 10), Err(Error::InvalidArgument { name, .. }) if name == "text"));
    assert!(matches!(q.find("x", 1001), Err(Error::InvalidArgument { name, .. }) if name == "limit"));
    assert!(q.find("x", 0).expect("find").is_empty());
}

#[test]
fn find_field_matches_a_payload_field_exactly() {
    let server = RedisServer::start();
    let q = server.queue_with(
        "orders",
        QueueOptions {
            partitions: 2,
            ..Default::default()
        },
    );
    let later = Duration::from_secs(3600);
    let exact = q
        .push(&json!({"order_id": 10086, "step": "close"}), later)
        .expect("push");
    // Each of these holds "10086" as find() sees it, and none is order 10086.
    for other in [
        json!({"order_id": 100861}),
        json!({"order_id": "10086"}),
        json!({"order_id": 10086.5}),
        json!({"sub_order_id": 10086}),
        json!({"note": "\"order_id\":10086"}),
        json!({"nested": {"order_id": 10086}}),
    ] {
        q.push(&other, later).expect("push");
    }
    assert_eq!(q.find("10086", 100).expect("find").len(), 7, "the substring search");
    let found = q.find_field("order_id", &json!(10086), 100).expect("find_field");
    assert_eq!(
        found.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(),
        [exact.as_str()]
    );
    assert_eq!(q.find_field("order_id", &json!("10086"), 100).expect("string").len(), 1);
    assert!(q.find_field("order_id", &json!(1), 100).expect("none").is_empty());
    for (field, value, name) in [
        ("", json!(1), "field"),
        ("order_id", json!([10086]), "value"),
        ("order_id", json!({"a": 1}), "value"),
    ] {
        let err = q.find_field(field, &value, 10).expect_err("refused");
        assert!(
            matches!(&err, Error::InvalidArgument { name: n, .. } if n == name),
            "{err:?}"
        );
    }
}
