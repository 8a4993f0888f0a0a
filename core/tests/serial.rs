//! Serial keys: messages that share one never run at the same time, and start in due
//! order, without waiting out any lease.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{RedisServer, StopOnDrop, assert_no_leak, hung_consumer, receive, wait_for};
use delayq::{Layout, NewMessage, PushOptions, QueueOptions, Received, State, Worker, WorkerOptions};
use parking_lot::Mutex;
use serde_json::json;

fn keyed(n: u64, key: Option<&str>, due: Duration) -> NewMessage {
    let mut m = NewMessage::new(&json!({"n": n}), due).expect("message");
    m.options.serial_key = key.map(str::to_owned);
    m
}

fn n_of(d: &delayq::Delivery) -> u64 {
    let v: serde_json::Value = d.payload().expect("payload");
    v["n"].as_u64().expect("n")
}

fn line_length(server: &RedisServer, tag: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(format!("{tag}:serial_line"))
        .query(&mut server.con())
        .expect("ZCARD")
}

fn nothing_for(c: &delayq::Consumer, wait: Duration) {
    match c.recv_timeout(wait) {
        Received::Idle => {}
        Received::Message(d) => panic!("expected nothing, got message {}", n_of(&d)),
        Received::Stopped => panic!("stopped"),
    }
}

/// `{"n": 1}` then `{"n": 2}`, both of serial key "k", due now in that order.
fn push_two_of_one_key(q: &delayq::Queue) {
    q.push_many(&[
        keyed(1, Some("k"), Duration::ZERO),
        keyed(2, Some("k"), Duration::from_millis(1)),
    ])
    .expect("push");
}

/// One handler call: the message's `n`, when it started and when it ended.
type Span = (u64, Instant, Instant);

/// Run `worker` on `threads` handler threads, each call sleeping `sleep`, until `count`
/// calls ended; returns the calls and the most that ran at once.
fn run_spans(worker: &Worker, threads: usize, sleep: Duration, count: usize) -> (Vec<Span>, usize) {
    let spans: Mutex<Vec<Span>> = Mutex::new(Vec::new());
    let (running, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let stopper = worker.stopper();
    std::thread::scope(|s| {
        let _stop = StopOnDrop(stopper.clone());
        let run = s.spawn(|| {
            worker
                .run(threads, |d| {
                    let started = Instant::now();
                    most.fetch_max(running.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    std::thread::sleep(sleep);
                    running.fetch_sub(1, Ordering::SeqCst);
                    spans.lock().push((n_of(d), started, Instant::now()));
                    Ok(())
                })
                .expect("run")
        });
        wait_for(Duration::from_secs(20), "every message run", || {
            spans.lock().len() == count
        });
        stopper.stop();
        run.join().expect("run thread");
    });
    (spans.into_inner(), most.into_inner())
}

/// The spans of one key ran one after the other, in the order of `expected`.
fn assert_one_at_a_time(mut spans: Vec<&Span>, expected: &[u64]) {
    spans.sort_by_key(|r| r.1);
    assert_eq!(spans.iter().map(|r| r.0).collect::<Vec<_>>(), expected, "due order");
    for pair in spans.windows(2) {
        assert!(
            pair[0].2 <= pair[1].1,
            "{} started before {} ended",
            pair[1].0,
            pair[0].0
        );
    }
}

fn serial_bookkeeping(server: &RedisServer) -> Vec<String> {
    server
        .dump_keys()
        .into_iter()
        .filter(|k| k.contains(":serial_"))
        .collect()
}

#[test]
fn messages_sharing_a_serial_key_never_overlap_and_start_in_due_order() {
    let server = RedisServer::start();
    let q = server.queue("serial");
    // Two keys of 8 messages each, interleaved with 16 that have none; due in push order.
    let key_of = |n: u64| match n % 4 {
        0 => Some("order-1"),
        1 => Some("order-2"),
        _ => None,
    };
    let batch: Vec<NewMessage> = (0..32u64)
        .map(|n| keyed(n, key_of(n), Duration::from_millis(n)))
        .collect();
    q.push_many(&batch).expect("push");
    // A lease far longer than the run: a message that waited out its key's lease would
    // fail the test's time limit.
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            threads: 2,
            lease: Duration::from_secs(60),
            ..WorkerOptions::default()
        },
    )
    .expect("worker");
    let (spans, most) = run_spans(&worker, 4, Duration::from_millis(30), 32);
    for key in 0..2 {
        let expected: Vec<u64> = (0..8).map(|i| i * 4 + key).collect();
        assert_one_at_a_time(spans.iter().filter(|r| r.0 % 4 == key).collect(), &expected);
    }
    assert!(most > 1, "messages of other keys, and those without, ran side by side");
    assert_eq!(q.stats().expect("stats").totals["acked"], 32);
    assert_no_leak(&server, "{dq:serial}");
    let left = serial_bookkeeping(&server);
    assert!(left.is_empty(), "serial bookkeeping left behind: {left:?}");
}

/// A consumer of `q` with two handler slots whose failures retry after `backoff`.
fn two_handlers_retrying_after(q: &delayq::Queue, backoff: Duration) -> delayq::Consumer {
    let opts = WorkerOptions {
        backoff_base: backoff,
        backoff_max: backoff,
        ..WorkerOptions::default()
    };
    Worker::new(q.clone(), opts)
        .and_then(|w| w.start_with(2))
        .expect("worker")
}

#[test]
fn a_failure_frees_the_key_and_the_next_in_line_runs_before_the_retry() {
    let server = RedisServer::start();
    let q = server.queue("serial-retry");
    push_two_of_one_key(&q);
    let c = two_handlers_retrying_after(&q, Duration::from_millis(200));
    let first = receive(&c);
    assert_eq!(n_of(&first), 1);
    nothing_for(&c, Duration::from_millis(300));
    let s = q.stats().expect("stats");
    assert_eq!((s.held, s.scheduled + s.ready), (1, 1), "the second waits, held: {s:?}");
    c.fail(first, "the payment gateway timed out");
    let second = receive(&c);
    assert_eq!(
        (n_of(&second), second.attempt),
        (2, 1),
        "the next in line, not the retry"
    );
    // The retry is due meanwhile; the key is held again, so it waits.
    nothing_for(&c, Duration::from_millis(400));
    c.ack(second);
    let retry = receive(&c);
    assert_eq!((n_of(&retry), retry.attempt), (1, 2));
    c.ack(retry);
    let s = c.finish();
    assert_eq!((s.acked, s.retried), (2, 1));
    assert_eq!(q.stats().expect("stats").held, 0);
    assert_no_leak(&server, "{dq:serial-retry}");
}

#[test]
fn a_delivery_carries_its_serial_key_on_every_attempt() {
    let server = RedisServer::start();
    let q = server.queue("serial-delivery");
    q.push_many(&[
        keyed(1, Some("customer-42"), Duration::ZERO),
        keyed(2, None, Duration::from_millis(1)),
    ])
    .expect("push");
    let c = two_handlers_retrying_after(&q, Duration::from_millis(1));
    let mut seen = vec![];
    for _ in 0..2 {
        let d = receive(&c);
        seen.push((n_of(&d), d.serial_key.clone()));
        if n_of(&d) == 1 {
            c.fail(d, "once more");
        } else {
            c.ack(d);
        }
    }
    let retry = receive(&c);
    seen.push((n_of(&retry), retry.serial_key.clone()));
    c.ack(retry);
    c.finish();
    seen.sort();
    let key = Some("customer-42".to_owned());
    assert_eq!(seen, vec![(1, key.clone()), (1, key), (2, None)]);
}

#[test]
fn a_holder_whose_worker_died_frees_its_key_when_its_lease_ends() {
    let server = RedisServer::start();
    let q = server.queue("serial-crash");
    push_two_of_one_key(&q);
    // Consumer A takes the first and hangs: its lease runs out.
    let ca = hung_consumer(&q);
    let held = receive(&ca);
    assert_eq!(n_of(&held), 1);
    let b = Worker::new(q.clone(), WorkerOptions::default()).expect("worker b");
    let cb = b.start_with(2).expect("start b");
    wait_for(Duration::from_secs(5), "the second in its key's line", || {
        line_length(&server, "{dq:serial-crash}") == 1
    });
    let waiting = q.get(&id_of_n(&q, 2)).expect("get").expect("exists");
    assert_eq!(
        (waiting.state, waiting.serial_key.as_deref()),
        (State::Ready, Some("k")),
        "due, waiting for its key"
    );
    let due_then = q.list(delayq::Listing::Waiting, 10).expect("list")[0].due_at_ms;
    assert_eq!(waiting.due_at_ms, due_then);
    assert!(
        waiting.due_at_ms.expect("due") <= server.now_ms(),
        "shown due when it was due, not when its safety net brings it back"
    );
    // A's lease ends: the key frees and the line moves on, without a later lease.
    let next = receive(&cb);
    assert_eq!(n_of(&next), 2, "first in line before the expired one's redelivery");
    cb.ack(next);
    let again = receive(&cb);
    assert_eq!((n_of(&again), again.attempt), (1, 2));
    cb.ack(again);
    ca.ack(held);
    assert_eq!(ca.finish().lease_lost, 1);
    assert_eq!(cb.finish().acked, 2);
    assert_no_leak(&server, "{dq:serial-crash}");
}

/// The id of the message whose payload has this `n`.
fn id_of_n(q: &delayq::Queue, n: u64) -> String {
    q.list(delayq::Listing::Waiting, 100)
        .expect("list")
        .into_iter()
        .find(|m| m.payload_json.contains(&format!("\"n\":{n}")))
        .map(|m| m.id)
        .expect("listed")
}

#[test]
fn cancel_reschedule_and_replace_take_a_message_out_of_its_line() {
    let server = RedisServer::start();
    let q = server.queue("serial-line");
    q.push_many(&[keyed(1, Some("k"), Duration::ZERO)]).expect("push");
    let holder_worker = Worker::new(q.clone(), WorkerOptions::default()).expect("worker");
    let holder = holder_worker.start().expect("start");
    let held = receive(&holder);
    let push = |n: u64, id: &str| {
        let mut m = keyed(n, Some("k"), Duration::ZERO);
        m.options.id = Some(id.to_owned());
        q.push_many(&[m]).expect("push");
    };
    push(2, "cancelled");
    push(3, "rescheduled");
    push(4, "replaced");
    push(5, "stays");
    let other_worker = Worker::new(q.clone(), WorkerOptions::default()).expect("worker");
    let other = other_worker.start_with(4).expect("start");
    wait_for(Duration::from_secs(5), "four in the key's line", || {
        line_length(&server, "{dq:serial-line}") == 4
    });
    assert!(q.cancel("cancelled").expect("cancel"));
    assert!(
        q.reschedule("rescheduled", Duration::from_secs(60))
            .expect("reschedule")
    );
    let replaced = q
        .push_json(
            r#"{"n": 40}"#,
            Duration::from_secs(60).into(),
            &PushOptions {
                id: Some("replaced".into()),
                replace: true,
                serial_key: Some("k".into()),
                ..PushOptions::default()
            },
        )
        .expect("replace");
    assert_eq!(replaced, "replaced");
    assert_eq!(line_length(&server, "{dq:serial-line}"), 1, "only the one left alone");
    holder.ack(held);
    // Stopped, so that the next in line goes to `other` (a delivery the holder's
    // consumer took meanwhile goes back to the queue at once).
    holder.finish();
    let next = receive(&other);
    assert_eq!(n_of(&next), 5, "the line skipped what left it");
    other.ack(next);
    nothing_for(&other, Duration::from_millis(300));
    for id in ["rescheduled", "replaced"] {
        let info = q.get(id).expect("get").expect("exists");
        assert_eq!(info.state, State::Scheduled, "{id} keeps its new due time");
    }
    assert!(q.get("cancelled").expect("get").is_none());
    other.finish();
    q.purge().expect("purge");
    let left = serial_bookkeeping(&server);
    assert!(left.is_empty(), "purge leaves no serial bookkeeping: {left:?}");
}

#[test]
fn a_batch_whose_later_push_of_an_id_replaces_it_without_a_key_writes_it_whole() {
    // Found by tests/model.rs: the key of the first push counted for the batch, the
    // replacing one dropped it, and the script failed halfway with nothing to write.
    let server = RedisServer::start();
    let q = server.queue("serial-batch");
    let with_id = |n, key: Option<&str>, replace| {
        let mut m = keyed(n, key, Duration::ZERO);
        m.options.id = Some("order-1".into());
        m.options.replace = replace;
        m
    };
    let ids = q
        .push_many(&[with_id(1, Some("k"), false), with_id(2, None, true)])
        .expect("push");
    assert_eq!(ids, ["order-1", "order-1"]);
    let info = q.get("order-1").expect("get").expect("exists");
    assert_eq!((info.payload_json.as_str(), info.serial_key), (r#"{"n":2}"#, None));
    assert_eq!(q.stats().expect("stats").totals["pushed"], 1);
    assert!(serial_bookkeeping(&server).is_empty());
    // And the other way round: the replacing push brings the key.
    q.purge().expect("purge");
    q.push_many(&[with_id(3, None, false), with_id(4, Some("k"), true)])
        .expect("push");
    let info = q.get("order-1").expect("get").expect("exists");
    assert_eq!(info.serial_key.as_deref(), Some("k"));
    assert_no_leak(&server, "{dq:serial-batch}");
}

#[test]
fn bad_serial_keys_are_refused_and_write_nothing() {
    let server = RedisServer::start();
    let q = server.queue("serial-bad");
    let push = |key: &str, partition_key: Option<&str>| {
        q.push_json(
            "1",
            Duration::ZERO.into(),
            &PushOptions {
                serial_key: Some(key.into()),
                partition_key: partition_key.map(str::to_owned),
                ..PushOptions::default()
            },
        )
    };
    for (key, partition_key, names) in [
        ("", None, "serial_key"),
        ("a\nb", None, "serial_key"),
        (&"k".repeat(1000) as &str, None, "serial_key"),
        ("order-1", Some("order-2"), "partition_key"),
    ] {
        let err = push(key, partition_key).expect_err("refused");
        assert!(err.is_invalid_input() && err.to_string().contains(names), "{err}");
    }
    push("order-1", Some("order-1")).expect("the same key twice is fine");
    let seed = server.queue_with(
        "ignored",
        QueueOptions {
            layout: Layout::seed(),
            ..QueueOptions::default()
        },
    );
    let mut m = NewMessage::new(&1, Duration::ZERO).expect("message");
    m.options.serial_key = Some("k".into());
    let err = seed.push_many(&[m]).expect_err("seed layout");
    assert!(err.to_string().contains("seed layout"), "{err}");
    assert_eq!(q.stats().expect("stats").totals["pushed"], 1);
    assert_eq!(seed.stats().expect("stats").ready, 0);
}

#[test]
fn on_a_partitioned_queue_a_serial_key_keeps_its_messages_in_one_partition() {
    let server = RedisServer::start();
    let q = server.queue_with(
        "serial-parts",
        QueueOptions {
            partitions: 3,
            ..QueueOptions::default()
        },
    );
    let batch: Vec<NewMessage> = (0..12u64)
        .map(|n| keyed(n, Some("order-1"), Duration::from_millis(n)))
        .collect();
    q.push_many(&batch).expect("push");
    let parts: std::collections::BTreeSet<usize> = q
        .list(delayq::Listing::Waiting, 100)
        .expect("list")
        .iter()
        .map(|m| q.partition_of(&m.id, m.serial_key.as_deref()))
        .collect();
    assert_eq!(parts.len(), 1, "one partition: {parts:?}");
    let listed = q.list(delayq::Listing::Waiting, 1).expect("list");
    let found = q
        .get(&listed[0].id)
        .expect("get")
        .expect("found outside its id's own partition");
    assert_eq!(found.serial_key.as_deref(), Some("order-1"));
    let worker = Worker::new(q.clone(), WorkerOptions::default()).expect("worker");
    let (spans, _) = run_spans(&worker, 3, Duration::from_millis(10), 12);
    assert_one_at_a_time(spans.iter().collect(), &(0..12).collect::<Vec<_>>());
}

#[test]
fn move_waiting_carries_the_serial_key() {
    let server = RedisServer::start();
    let from = server.queue("serial-from");
    let to = server.queue("serial-to");
    let mut m = keyed(1, Some("order-1"), Duration::from_secs(60));
    m.options.id = Some("close-order-1".into());
    from.push_many(&[m]).expect("push");
    assert_eq!(from.move_waiting(&to).expect("move"), 1);
    let moved = to.get("close-order-1").expect("get").expect("moved");
    assert_eq!(moved.serial_key.as_deref(), Some("order-1"));
    assert!(
        serial_bookkeeping(&server)
            .iter()
            .all(|k| k.starts_with("{dq:serial-to}"))
    );
}

#[test]
fn failures_and_retries_never_let_two_messages_of_a_key_overlap() {
    let server = RedisServer::start();
    let q = server.queue("serial-churn");
    // Three keys of 20 messages; every fifth fails on its first attempt.
    let batch: Vec<NewMessage> = (0..60u64)
        .map(|n| keyed(n, Some(["a", "b", "c"][(n % 3) as usize]), Duration::ZERO))
        .collect();
    q.push_many(&batch).expect("push");
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            threads: 2,
            backoff_base: Duration::from_millis(5),
            backoff_max: Duration::from_millis(20),
            ..WorkerOptions::default()
        },
    )
    .expect("worker");
    let spans: Mutex<Vec<(u64, u32, Instant, Instant)>> = Mutex::new(Vec::new());
    let stopper = worker.stopper();
    std::thread::scope(|s| {
        let _stop = StopOnDrop(stopper.clone());
        let run = s.spawn(|| {
            worker
                .run(6, |d| {
                    let started = Instant::now();
                    std::thread::sleep(Duration::from_millis(3));
                    spans.lock().push((n_of(d), d.attempt, started, Instant::now()));
                    if n_of(d).is_multiple_of(5) && d.attempt == 1 {
                        return Err("fails once".into());
                    }
                    Ok(())
                })
                .expect("run")
        });
        wait_for(Duration::from_secs(30), "every message done", || {
            q.stats().is_ok_and(|s| s.totals.get("acked") == Some(&60))
        });
        stopper.stop();
        run.join().expect("run thread");
    });
    let spans = spans.into_inner();
    assert_eq!(spans.len(), 72, "60 messages, 12 of them twice");
    for key in 0..3 {
        let mut mine: Vec<_> = spans.iter().filter(|s| s.0 % 3 == key).collect();
        mine.sort_by_key(|s| s.2);
        for pair in mine.windows(2) {
            assert!(
                pair[0].3 <= pair[1].2,
                "{}/{} started before {}/{} ended",
                pair[1].0,
                pair[1].1,
                pair[0].0,
                pair[0].1
            );
        }
    }
    assert_no_leak(&server, "{dq:serial-churn}");
    let left = serial_bookkeeping(&server);
    assert!(left.is_empty(), "serial bookkeeping left behind: {left:?}");
}
