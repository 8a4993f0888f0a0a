//! `PushOptions::expire_after`: a message that cannot start within that long after its
//! due time goes to the dead-letter set unrun.

mod common;

use std::time::{Duration, SystemTime};

use common::{RedisServer, StopOnDrop, assert_no_leak, run_until, wait_for};
use delayq::{
    Category, Due, Layout, NewMessage, PushOptions, Queue, QueueOptions, Received, Retry, State, Worker, WorkerOptions,
};
use parking_lot::Mutex;
use serde_json::json;

fn expiring(after: Duration) -> PushOptions {
    PushOptions {
        expire_after: Some(after),
        ..Default::default()
    }
}

fn fast() -> WorkerOptions {
    WorkerOptions {
        idle_check: Duration::from_millis(50),
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_millis(10),
        ..Default::default()
    }
}

/// Run a pool until `done` holds for the payloads handled so far; returns them.
fn consume(q: &Queue, done: impl Fn(&[String], &Queue) -> bool + Sync) -> Vec<String> {
    let worker = Worker::new(q.clone(), fast()).expect("worker");
    run_until(
        &worker,
        1,
        Duration::from_secs(20),
        |d, seen: &Mutex<Vec<String>>| {
            let payload = d.payload().map_err(|e| e.to_string())?;
            seen.lock().push(payload);
            Ok(())
        },
        |seen| done(seen, q),
    )
}

#[test]
fn a_message_past_its_deadline_goes_to_the_dead_letters_unrun() {
    let server = RedisServer::start();
    let q = server.queue("reminders");
    let stale = q
        .push_json(
            "\"stale\"",
            Due::In(Duration::ZERO),
            &expiring(Duration::from_millis(900)),
        )
        .expect("push");
    q.push_json("\"fresh\"", Due::In(Duration::ZERO), &expiring(Duration::from_secs(60)))
        .expect("push");
    q.push(&"plain", Duration::ZERO).expect("push");
    // No worker runs for a while (an outage). The window is wide enough for a new
    // pool to start within it on a loaded machine: the requeue below needs that.
    std::thread::sleep(Duration::from_millis(1_200));
    let ran = consume(&q, |seen, q| seen.len() == 2 && q.stats().is_ok_and(|s| s.dead == 1));
    assert_eq!(ran, ["fresh", "plain"]);
    let dead = q.dead_letters(10).expect("dead");
    assert_eq!(
        (dead.len(), dead[0].id.as_str(), dead[0].attempts),
        (1, stale.as_str(), 1)
    );
    let error = &dead[0].last_error;
    assert!(
        error.starts_with("expired: not started within 900 ms of its due time (expire_after); the deadline passed "),
        "{error}"
    );
    let info = q.get(&stale).expect("get").expect("kept");
    assert_eq!(info.state, State::Dead);
    assert_eq!(info.payload_json, "\"stale\"");
    // A dead letter sent back runs: requeue_dead gives it a fresh deadline.
    assert_eq!(q.requeue_dead(Some(&stale)).expect("requeue"), 1);
    let again = q.get(&stale).expect("get").expect("kept");
    let (due, deadline) = (again.due_at_ms.expect("due"), again.expires_at_ms.expect("deadline"));
    assert_eq!(deadline - due, 900, "a fresh window from the requeue");
    let ran = consume(&q, |seen, _| seen.len() == 1);
    assert_eq!(ran, ["stale"]);
    assert_no_leak(&server, "{dq:reminders}");
}

#[test]
fn the_deadline_counts_from_the_due_time_and_moves_with_reschedule() {
    let server = RedisServer::start();
    let q = server.queue("meetings");
    let at_ms = 4_102_444_800_000; // 2100-01-01, on the server's clock
    let at = SystemTime::UNIX_EPOCH + Duration::from_millis(at_ms as u64);
    // A payload that ends as the envelope's deadline does is left alone.
    let tricky = r#"{"expire_after_ms":1,"expires_ms":2}"#;
    let far = q
        .push_json(tricky, Due::at(at), &expiring(Duration::from_secs(600)))
        .expect("push");
    let info = q.get(&far).expect("get").expect("kept");
    assert_eq!(
        (info.due_at_ms, info.expires_at_ms, info.payload_json.as_str()),
        (Some(at_ms), Some(at_ms + 600_000), tricky)
    );
    assert!(
        q.reschedule(&far, Due::at(at + Duration::from_secs(1)))
            .expect("reschedule")
    );
    let info = q.get(&far).expect("get").expect("kept");
    assert_eq!(
        (info.expires_at_ms, info.payload_json.as_str()),
        (Some(at_ms + 601_000), tricky)
    );
    // Without an expiry there is no deadline.
    let plain = q.push(&"plain", Duration::from_secs(60)).expect("push");
    assert_eq!(q.get(&plain).expect("get").expect("kept").expires_at_ms, None);

    // Due now with 1 s to start; moved 1.2 s on at once, its deadline moves too: a
    // worker that starts 1.1 s later, past the first deadline, still runs it (and has
    // 1.1 s to start).
    let moved = q
        .push_json(
            "\"moved\"",
            Due::In(Duration::ZERO),
            &expiring(Duration::from_millis(1_000)),
        )
        .expect("push");
    assert!(q.reschedule(&moved, Duration::from_millis(1_200)).expect("reschedule"));
    let info = q.get(&moved).expect("get").expect("kept");
    assert_eq!(
        info.expires_at_ms.expect("deadline") - info.due_at_ms.expect("due"),
        1_000
    );
    std::thread::sleep(Duration::from_millis(1_100));
    let ran = consume(&q, |seen, _| !seen.is_empty());
    assert_eq!(ran, ["moved"]);
    assert_eq!(q.stats().expect("stats").dead, 0);
}

#[test]
fn retries_do_not_move_the_deadline() {
    let server = RedisServer::start();
    let q = server.queue("flash-sale");
    let id = q
        .push_json("\"sale\"", Due::In(Duration::ZERO), &expiring(Duration::from_secs(2)))
        .expect("push");
    let worker = Worker::new(q.clone(), fast()).expect("worker");
    let consumer = worker.start().expect("start");
    let _stop = StopOnDrop(consumer.stopper());
    let mut deliveries = 0;
    wait_for(Duration::from_secs(10), "the message buried", || {
        if let Received::Message(d) = consumer.recv_timeout(Duration::from_millis(20)) {
            deliveries += 1;
            // The handler can see the deadline it started within.
            assert_eq!(d.expires_at_ms, Some(d.due_at_ms + 2_000));
            // Due again in 3 s: past the deadline, 2 s after the first due time.
            consumer.fail_with(d, "gateway busy", Retry::After(Duration::from_secs(3)));
        }
        q.stats().is_ok_and(|s| s.dead == 1)
    });
    let summary = consumer.finish();
    assert_eq!((deliveries, summary.handled, summary.retried), (1, 1, 1));
    let dead = q.dead_letters(1).expect("dead");
    assert_eq!(dead[0].id, id);
    assert!(dead[0].last_error.starts_with("expired:"), "{}", dead[0].last_error);
    assert_no_leak(&server, "{dq:flash-sale}");
}

#[test]
fn a_bad_expiry_is_refused_and_writes_nothing() {
    let server = RedisServer::start();
    let q = server.queue("bad");
    for bad in [
        Duration::ZERO,
        Duration::from_micros(500),
        delayq::MAX_DELAY + Duration::from_secs(1),
    ] {
        let err = q
            .push_json("1", Due::In(Duration::ZERO), &expiring(bad))
            .expect_err("refused");
        assert_eq!(err.category(), Category::InvalidArgument);
        assert!(err.to_string().contains("expire_after"), "{err}");
    }
    let mut batch = vec![NewMessage::new(&1, Duration::ZERO).expect("msg"); 3];
    batch[2].options.expire_after = Some(Duration::ZERO);
    let err = q.push_many(&batch).expect_err("refused");
    assert!(err.to_string().contains("expire_after of item 2"), "{err}");
    let seed = Queue::new(
        &server.url(),
        "seed",
        QueueOptions {
            layout: Layout::seed(),
            ..Default::default()
        },
    )
    .expect("seed queue");
    let err = seed
        .push_json("1", Due::In(Duration::ZERO), &expiring(Duration::from_secs(1)))
        .expect_err("refused");
    assert!(err.to_string().contains("native layout"), "{err}");
    assert!(server.dump_keys().is_empty(), "written: {:?}", server.dump_keys());
    // What a replacing push brings is the message's new deadline.
    let id = q
        .push_json(
            json!("v1").to_string(),
            Due::In(Duration::from_secs(60)),
            &PushOptions {
                id: Some("cart-7".into()),
                ..expiring(Duration::from_secs(5))
            },
        )
        .expect("push");
    q.push_json(
        json!("v2").to_string(),
        Due::In(Duration::from_secs(120)),
        &PushOptions {
            id: Some(id.clone()),
            replace: true,
            ..Default::default()
        },
    )
    .expect("replace");
    assert_eq!(q.get(&id).expect("get").expect("kept").expires_at_ms, None);
}
