//! `Queue::move_waiting`: the last step of a migration from the recipe (seed layout to
//! the native one), and any move between queues, losing and doubling nothing.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{RedisServer, StopOnDrop, assert_no_leak, wait_for};
use delayq::{Due, Error, Layout, PushOptions, Queue, QueueOptions, State, Worker, WorkerOptions};
use parking_lot::Mutex;
use serde_json::json;

fn seed_queue(server: &RedisServer) -> Queue {
    server.queue_with(
        "orders",
        QueueOptions {
            layout: Layout::seed(),
            ..Default::default()
        },
    )
}

#[test]
fn the_recipes_messages_move_to_the_native_layout_with_their_ids_payloads_and_due_times() {
    let server = RedisServer::start();
    let seed = seed_queue(&server);
    let native = server.queue("orders");
    let mut con = server.con();
    let now = server.now_ms() / 1000;
    // More than two batches, as the recipe's phpredis producer writes them: some due
    // already, most in the next days.
    let mut expected = Vec::new();
    for i in 0..2500i64 {
        let id = format!("order-{i}");
        let payload = format!(r#"{{"order_id":{i},"action":"close"}}"#);
        let due = if i % 10 == 0 { now - 5 } else { now + 60 + i * 37 };
        redis::pipe()
            .hset("delay_queue:payload", &id, &payload)
            .zadd("delay_queue:zset", &id, due)
            .query::<()>(&mut con)
            .expect("recipe producer");
        expected.push((id, payload, due * 1000));
    }

    assert_eq!(seed.move_waiting(&native).expect("move"), 2500);

    let (zcard, hlen): (u64, u64) = redis::pipe()
        .zcard("delay_queue:zset")
        .hlen("delay_queue:payload")
        .query(&mut con)
        .expect("recipe keys");
    assert_eq!((zcard, hlen), (0, 0), "nothing left in the recipe's keys");
    assert_eq!(seed.stats().expect("stats").total("moved"), 2500);
    let stats = native.stats().expect("stats");
    assert_eq!((stats.scheduled, stats.ready, stats.total("pushed")), (2250, 250, 2500));
    for (id, payload, due_ms) in &expected {
        let m = native.get(id).expect("get").expect("moved");
        assert_eq!(
            (&m.payload_json, m.due_at_ms, m.attempts),
            (payload, Some(*due_ms), 0),
            "{id}"
        );
    }
    assert_no_leak(&server, "{dq:orders}");
    assert_eq!(
        seed.move_waiting(&native).expect("again"),
        0,
        "a second move finds nothing"
    );
}

#[test]
fn a_move_keeps_limits_and_deadlines_and_leaves_running_and_dead_messages() {
    let server = RedisServer::start();
    let old = server.queue("old");
    let new = server.queue_with(
        "new",
        QueueOptions {
            partitions: 4,
            ..Default::default()
        },
    );
    let limited = PushOptions {
        id: Some("limited".into()),
        max_attempts: Some(3),
        expire_after: Some(Duration::from_secs(60)),
        ..Default::default()
    };
    old.push_json(r#"{"n":1}"#, Due::In(Duration::from_secs(100)), &limited)
        .expect("push");
    let before = old.get("limited").expect("get").expect("pushed");
    let taken_id = PushOptions {
        id: Some("taken".into()),
        ..Default::default()
    };
    old.push_json(r#""old copy""#, Due::In(Duration::from_secs(100)), &taken_id)
        .expect("push");
    new.push_json(r#""already there""#, Due::In(Duration::from_secs(5)), &taken_id)
        .expect("push");
    let running = old.push(&"running", Duration::ZERO).expect("push");
    let doomed = old
        .push_json(
            r#""doomed""#,
            Due::NOW,
            &PushOptions {
                max_attempts: Some(1),
                ..Default::default()
            },
        )
        .expect("push");
    let (consumer, d) = common::one_dead_one_running(&old, &doomed);

    assert_eq!(old.move_waiting(&new).expect("move"), 2);

    let moved = new.get("limited").expect("get").expect("moved");
    assert_eq!(
        (moved.max_attempts, moved.due_at_ms, moved.expires_at_ms),
        (Some(3), before.due_at_ms, before.expires_at_ms)
    );
    let kept = new.get("taken").expect("get").expect("kept");
    assert_eq!(
        kept.payload_json, r#""already there""#,
        "as a second push of that id: kept"
    );
    let s = old.stats().expect("stats");
    assert_eq!(
        (s.scheduled, s.inflight, s.dead),
        (0, 1, 1),
        "running and dead ones stay"
    );
    assert_eq!(d.id, running);
    consumer.ack(d);
    wait_for(Duration::from_secs(10), "the running one acked where it ran", || {
        old.stats().is_ok_and(|s| s.inflight == 0 && s.total("acked") == 1)
    });
    consumer.stop();
    assert_no_leak(&server, "{dq:old}");
}

#[test]
fn a_message_the_target_cannot_hold_stops_the_move_and_names_it_before_writing() {
    let server = RedisServer::start();
    let native = server.queue("orders");
    let expiring = PushOptions {
        id: Some("reminder-7".into()),
        expire_after: Some(Duration::from_secs(60)),
        ..Default::default()
    };
    native.push(&"plain", Duration::from_secs(30)).expect("push");
    native
        .push_json(r#""remind""#, Due::In(Duration::from_secs(60)), &expiring)
        .expect("push");
    let seed = seed_queue(&server);
    let keys_before = server.dump_keys();

    let err = native
        .move_waiting(&seed)
        .expect_err("the seed layout has no deadlines");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("\"reminder-7\"") && text.contains("seed layout"),
        "{text}"
    );
    assert_eq!(server.dump_keys(), keys_before, "nothing written");
    assert_eq!(native.stats().expect("stats").scheduled, 2, "nothing lost");

    // The recipe's producer may have written what is no JSON at all.
    let mut con = server.con();
    redis::pipe()
        .hset("delay_queue:payload", "raw", "close order 9")
        .zadd("delay_queue:zset", "raw", 1)
        .query::<()>(&mut con)
        .expect("recipe producer");
    let other = server.queue("other");
    let err = seed.move_waiting(&other).expect_err("not JSON");
    assert!(err.to_string().contains("\"raw\""), "{err}");
    assert!(other.stats().expect("stats").total("pushed") == 0);

    let err = native.move_waiting(&native.clone()).expect_err("itself");
    assert!(err.to_string().contains("itself"), "{err}");
}

#[test]
fn a_move_while_the_old_queues_pool_runs_leaves_each_message_in_one_place() {
    let server = RedisServer::start();
    let old = server.queue("old");
    let new = server.queue("new");
    let n = 20_000;
    let batch: Vec<_> = (0..n)
        .map(|i| delayq::NewMessage::new(&json!({ "n": i }), Duration::ZERO).expect("message"))
        .collect();
    let ids = old.push_many(&batch).expect("push");
    let worker = Worker::new(
        old.clone(),
        WorkerOptions {
            batch: 50,
            ..Default::default()
        },
    )
    .expect("worker");
    let handled = Mutex::new(BTreeSet::new());
    let moved = std::thread::scope(|s| {
        let stopper = worker.stopper();
        let run = s.spawn(|| {
            worker
                .run(2, |d| {
                    // Slow enough that the move finds most messages still waiting.
                    std::thread::sleep(Duration::from_micros(100));
                    handled.lock().insert(d.id.clone());
                    Ok(())
                })
                .expect("run")
        });
        let _stop = StopOnDrop(stopper);
        wait_for(Duration::from_secs(10), "the old pool at work", || {
            !handled.lock().is_empty()
        });
        let moved = old.move_waiting(&new).expect("move");
        wait_for(Duration::from_secs(20), "the old pool done", || {
            old.stats().is_ok_and(|s| s.scheduled + s.ready + s.inflight == 0)
        });
        drop(_stop);
        run.join().expect("pool");
        moved
    });
    let handled = handled.into_inner();
    eprintln!("moved {moved}, run by the old pool {}", handled.len());
    let waiting: BTreeSet<String> = ids
        .iter()
        .filter(|id| new.get(id).expect("get").is_some())
        .cloned()
        .collect();
    let both: Vec<_> = handled.intersection(&waiting).collect();
    assert!(
        both.is_empty(),
        "{} run by the old pool and waiting in the new queue, e.g. {:?}",
        both.len(),
        both.first()
    );
    assert_eq!(handled.len() + waiting.len(), n, "every message in one of the two");
    assert_eq!(waiting.len() as u64, moved);
    assert!(moved > 0 && !handled.is_empty(), "both had their share");
    assert!(
        waiting
            .iter()
            .all(|id| new.get(id).expect("get").is_some_and(|m| m.state == State::Ready))
    );
}
