//! The consumer pool against a real redis-server.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{RedisServer, StopOnDrop, assert_no_leak, wait_for};
use delayq::{NewMessage, Received, Retry, State, Worker, WorkerOptions};
use parking_lot::Mutex;
use serde_json::json;

fn opts() -> WorkerOptions {
    WorkerOptions {
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(100),
        ..WorkerOptions::default()
    }
}

/// Push `{"n": 0}` to `{"n": n - 1}`, all due now, in one round trip.
fn push_numbered(q: &delayq::Queue, n: usize) {
    let batch: Vec<NewMessage> = (0..n)
        .map(|i| NewMessage::new(&json!({"n": i}), Duration::ZERO).expect("message"))
        .collect();
    q.push_many(&batch).expect("push_many");
}

/// Run `worker` on `threads` handler threads until `done` says so, then stop it.
fn run_until(
    worker: &Worker,
    threads: usize,
    handler: impl Fn(&delayq::Delivery) -> Result<(), String> + Sync,
    done: impl Fn() -> bool + Send,
    limit: Duration,
) -> delayq::Summary {
    let stopper = worker.stopper();
    std::thread::scope(|s| {
        s.spawn(move || {
            // Stop the pool even when the wait fails, so the test fails instead of hanging.
            let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                wait_for(limit, "the pool to finish its work", &done)
            }));
            stopper.stop();
            if let Err(panic) = waited {
                std::panic::resume_unwind(panic);
            }
        });
        worker.run(threads, handler).expect("run")
    })
}

#[test]
fn ten_thousand_messages_are_each_delivered_once_across_eight_threads() {
    let server = RedisServer::start();
    let q = server.queue("exact");
    let batch: Vec<NewMessage> = (0..10_000)
        .map(|i| NewMessage::new(&json!({"n": i}), Duration::from_millis(i % 300)).expect("msg"))
        .collect();
    q.push_many(&batch).expect("push_many");
    let seen: Mutex<HashMap<i64, usize>> = Mutex::new(HashMap::new());
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            threads: 4,
            batch: 100,
            ..opts()
        },
    )
    .expect("worker");
    let summary = run_until(
        &worker,
        8,
        |d| {
            let v: serde_json::Value = d.payload().map_err(|e| e.to_string())?;
            *seen.lock().entry(v["n"].as_i64().expect("n")).or_default() += 1;
            Ok(())
        },
        || seen.lock().len() == 10_000 && q.stats().is_ok_and(|s| s.inflight == 0 && s.ready == 0),
        Duration::from_secs(60),
    );
    let seen = seen.into_inner();
    assert_eq!(seen.len(), 10_000);
    let dups: Vec<_> = seen.iter().filter(|(_, c)| **c != 1).collect();
    assert!(dups.is_empty(), "duplicates: {dups:?}");
    assert_eq!(summary.handled, 10_000);
    assert_eq!(summary.acked, 10_000);
    assert_eq!(summary.lease_lost, 0);
    let s = q.stats().expect("stats");
    assert_eq!((s.scheduled, s.ready, s.inflight, s.dead), (0, 0, 0, 0));
    assert_eq!(s.total("acked"), 10_000);
    assert_no_leak(&server, "{dq:exact}");
}

#[test]
fn messages_arrive_in_due_order_and_never_early() {
    let server = RedisServer::start();
    let q = server.queue("order");
    // Pushed in reverse: due order differs from push order.
    let mut ids = Vec::new();
    for i in (0..20u64).rev() {
        ids.push((i, q.push(&i, Duration::from_millis(100 + i * 25)).expect("push")));
    }
    let got: Mutex<Vec<(u64, i64, i64)>> = Mutex::new(Vec::new());
    let worker = Worker::new(q.clone(), WorkerOptions { threads: 1, ..opts() }).expect("worker");
    run_until(
        &worker,
        1,
        |d| {
            let (s, us): (i64, i64) = redis::cmd("TIME").query(&mut server.con()).map_err(|e| e.to_string())?;
            got.lock().push((
                d.payload().map_err(|e| e.to_string())?,
                d.due_at_ms,
                s * 1000 + us / 1000,
            ));
            Ok(())
        },
        || got.lock().len() == 20,
        Duration::from_secs(20),
    );
    let got = got.into_inner();
    let order: Vec<u64> = got.iter().map(|g| g.0).collect();
    assert_eq!(order, (0..20).collect::<Vec<_>>());
    for (n, due, handled_at) in got {
        assert!(
            handled_at >= due,
            "message {n} handled at {handled_at}, before its due time {due}"
        );
    }
}

#[test]
fn failures_retry_with_backoff_then_go_to_the_dead_letter_set() {
    let server = RedisServer::start();
    let q = server.queue("retry");
    let id = q.push(&json!({"poison": true}), Duration::ZERO).expect("push");
    let ok_id = q.push(&json!({"poison": false}), Duration::ZERO).expect("push");
    let attempts: Mutex<Vec<(u32, Instant)>> = Mutex::new(Vec::new());
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            max_attempts: 3,
            backoff_base: Duration::from_millis(200),
            backoff_max: Duration::from_secs(2),
            ..opts()
        },
    )
    .expect("worker");
    let summary = run_until(
        &worker,
        2,
        |d| {
            let v: serde_json::Value = d.payload().map_err(|e| e.to_string())?;
            if v["poison"] == json!(true) {
                attempts.lock().push((d.attempt, Instant::now()));
                return Err(format!("RuntimeException: cannot close order (attempt {})", d.attempt));
            }
            Ok(())
        },
        || {
            q.stats()
                .is_ok_and(|s| s.dead == 1 && s.ready + s.scheduled + s.inflight == 0)
        },
        Duration::from_secs(20),
    );
    let attempts = attempts.into_inner();
    assert_eq!(attempts.iter().map(|a| a.0).collect::<Vec<_>>(), vec![1, 2, 3]);
    // Equal jitter: the n-th retry waits at least half of base * 2^(n-1).
    assert!(attempts[1].1 - attempts[0].1 >= Duration::from_millis(100));
    assert!(attempts[2].1 - attempts[1].1 >= Duration::from_millis(200));
    assert_eq!(
        (summary.failed, summary.retried, summary.dead, summary.acked),
        (3, 2, 1, 1)
    );

    let info = q.get(&id).expect("get").expect("kept as dead letter");
    assert_eq!(info.state, State::Dead);
    assert_eq!(info.attempts, 3);
    let err = info.last_error.expect("last error");
    assert!(
        err.contains("cannot close order (attempt 3)") && err.contains("gave up after 3"),
        "{err}"
    );
    assert!(q.get(&ok_id).expect("get").is_none(), "acked message is deleted");

    let dead = q.dead_letters(10).expect("dead letters");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id, id);
    assert_eq!(dead[0].payload_json, r#"{"poison":true}"#);

    assert_eq!(q.requeue_dead(Some(&id)).expect("requeue"), 1);
    let info = q.get(&id).expect("get").expect("exists");
    assert_eq!((info.state, info.attempts), (State::Ready, 0));
    assert_eq!(q.requeue_dead(None).expect("requeue all"), 0);
    assert_no_leak(&server, "{dq:retry}");
}

#[test]
fn dead_letters_are_requeued_or_deleted_by_the_text_of_their_error() {
    let server = RedisServer::start();
    // More than one look (1000 a call) in one partition, and a partitioned queue.
    for (name, partitions, n) in [("one", 1, 1200usize), ("parts", 3, 30)] {
        let q = server.queue_with(
            name,
            delayq::QueueOptions {
                partitions,
                ..Default::default()
            },
        );
        push_numbered(&q, n);
        let worker = Worker::new(
            q.clone(),
            WorkerOptions {
                max_attempts: 1,
                batch: 500,
                ..opts()
            },
        )
        .expect("worker");
        run_until(
            &worker,
            2,
            |d| {
                let n: u64 = d.payload::<serde_json::Value>().expect("payload")["n"]
                    .as_u64()
                    .expect("n");
                Err(match n % 3 {
                    0 => format!("PDOException: SQLSTATE[HY000] [2002] Connection refused (order {n})"),
                    1 => format!("DomainException: order {n} is already closed"),
                    _ => "RuntimeException: the 50% off coupon is not valid".to_owned(),
                })
            },
            || q.stats().is_ok_and(|s| s.dead == n as u64),
            Duration::from_secs(60),
        );
        let thirds = (n / 3) as u64;
        assert_eq!(
            q.requeue_dead_with_error("Connection refused").expect("requeue"),
            thirds
        );
        assert_eq!(q.stats().expect("stats").ready, thirds);
        // Plain text, not a Lua pattern: "%" and "[" match themselves.
        assert_eq!(q.delete_dead_with_error("50% off").expect("delete"), thirds);
        assert_eq!(q.delete_dead_with_error("[2002]").expect("none left dead"), 0);
        assert_eq!(q.requeue_dead_with_error("no such error").expect("none"), 0);
        let left = q.dead_letters(n).expect("dead letters");
        assert_eq!(left.len() as u64, thirds);
        assert!(
            left.iter().all(|d| d.last_error.contains("already closed")),
            "{:?}",
            left[0]
        );
        for bad in [String::new(), "x".repeat(delayq::MAX_ERROR_TEXT_BYTES + 1)] {
            let err = q.requeue_dead_with_error(&bad).expect_err("refused");
            assert!(err.to_string().contains("text"), "{err}");
        }
        assert_eq!(q.stats().expect("stats").dead, thirds, "refusals change nothing");
    }
}

#[test]
fn dead_letters_are_deleted_one_or_all_and_nothing_else_is_touched() {
    let server = RedisServer::start();
    let q = server.queue("discard");
    // Three messages that fail once and die (a limit of 1), one that waits, one done.
    let doomed: Vec<String> = (0..3)
        .map(|i| {
            let opts = delayq::PushOptions {
                max_attempts: Some(1),
                ..Default::default()
            };
            q.push_json(json!({"doomed": i}).to_string(), Duration::ZERO.into(), &opts)
                .expect("push")
        })
        .collect();
    let waiting = q
        .push(&json!({"later": true}), Duration::from_secs(3600))
        .expect("push");
    let worker = Worker::new(q.clone(), opts()).expect("worker");
    run_until(
        &worker,
        1,
        |_| Err("boom".into()),
        || q.stats().is_ok_and(|s| s.dead == 3 && s.ready + s.inflight == 0),
        Duration::from_secs(20),
    );

    assert_eq!(q.delete_dead(Some(&doomed[1])).expect("delete one"), 1);
    assert!(q.get(&doomed[1]).expect("get").is_none(), "gone, payload and all");
    assert_eq!(
        q.delete_dead(Some(&doomed[1])).expect("again"),
        0,
        "nothing left to delete"
    );
    assert_eq!(
        q.delete_dead(Some(&waiting)).expect("a waiting one"),
        0,
        "not a dead letter"
    );
    assert_eq!(
        q.delete_dead(Some("no such id")).expect("unknown id"),
        0,
        "an unknown id deletes nothing"
    );
    assert!(matches!(
        q.delete_dead(Some("")),
        Err(delayq::Error::InvalidArgument { .. })
    ));

    assert_eq!(q.delete_dead(None).expect("delete all"), 2);
    let s = q.stats().expect("stats");
    assert_eq!((s.dead, s.scheduled), (0, 1));
    assert_eq!(s.total("discarded"), 3);
    assert_eq!(q.get(&waiting).expect("get").map(|i| i.state), Some(State::Scheduled));
    assert_eq!(q.delete_dead(None).expect("none left"), 0);
    assert_no_leak(&server, "{dq:discard}");
}

#[test]
fn fail_with_retries_after_its_own_delay_or_never() {
    let server = RedisServer::start();
    let q = server.queue("failwith");
    let later = q.push(&json!({"n": 1}), Duration::ZERO).expect("push");
    let hopeless = q.push(&json!({"n": 2}), Duration::ZERO).expect("push");
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            max_attempts: 2,
            backoff_base: Duration::from_secs(60),
            backoff_max: Duration::from_secs(60),
            ..opts()
        },
    )
    .expect("worker");
    let c = worker.start().expect("start");
    let next = || match c.recv_timeout(Duration::from_secs(5)) {
        Received::Message(d) => d,
        other => panic!("expected a delivery, got {other:?}"),
    };
    for _ in 0..2 {
        let d = next();
        if d.id == later {
            let fate = c.fail_with(d, "rate limited", Retry::After(Duration::from_millis(200)));
            assert_eq!(fate, delayq::Fate::Retry(Duration::from_millis(200)));
        } else {
            let fate = c.fail_with(d, "order is gone", Retry::Never);
            assert_eq!(fate, delayq::Fate::Dead("order is gone".into()));
        }
    }
    let again = next();
    assert_eq!(
        (again.id.as_str(), again.attempt),
        (later.as_str(), 2),
        "after 200 ms, not the 30 s backoff"
    );
    // The last attempt: a retry would exceed max_attempts.
    let fate = c.fail_with(again, "rate limited", Retry::After(Duration::from_millis(200)));
    assert_eq!(
        fate,
        delayq::Fate::Dead("rate limited (gave up after 2 attempts)".into())
    );
    let summary = c.finish();
    assert_eq!((summary.failed, summary.retried, summary.dead), (3, 1, 2));
    let info = q.get(&hopeless).expect("get").expect("dead letter");
    assert_eq!(
        (info.state, info.last_error.as_deref()),
        (State::Dead, Some("order is gone"))
    );
    let info = q.get(&later).expect("get").expect("dead letter");
    assert_eq!(
        (info.state, info.last_error.as_deref()),
        (State::Dead, Some("rate limited (gave up after 2 attempts)"))
    );
    assert_no_leak(&server, "{dq:failwith}");
}

#[test]
fn live_pools_are_listed_until_they_stop_or_miss_their_heartbeats() {
    let server = RedisServer::start();
    let q = server.queue("pools");
    assert!(q.workers().expect("workers").is_empty());
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            threads: 2,
            // A heartbeat every 200 ms.
            lease: Duration::from_millis(600),
            ..opts()
        },
    )
    .expect("worker");
    let c = worker.start().expect("start");
    wait_for(Duration::from_secs(5), "the pool to register", || {
        q.workers().is_ok_and(|w| w.len() == 1)
    });
    let info = q.workers().expect("workers").remove(0);
    assert_eq!((info.pid, info.threads), (std::process::id(), 2));
    assert!(!info.host.is_empty() && info.id.starts_with(&format!("{}:{}:", info.host, info.pid)));
    let now_ms = || {
        i64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_millis(),
        )
        .expect("ms")
    };
    assert!((now_ms() - info.last_seen_ms).abs() < 2_000, "{info:?}");

    for i in 0..3 {
        q.push(&json!({"n": i}), Duration::ZERO).expect("push");
    }
    for _ in 0..3 {
        match c.recv_timeout(Duration::from_secs(5)) {
            Received::Message(d) => c.ack(d),
            other => panic!("expected a delivery, got {other:?}"),
        }
    }
    wait_for(Duration::from_secs(5), "a heartbeat to carry the counters", || {
        q.workers()
            .is_ok_and(|w| w.first().is_some_and(|i| (i.handled, i.acked) == (3, 3)))
    });
    c.finish();
    assert!(
        q.workers().expect("workers").is_empty(),
        "a stopped pool leaves at once"
    );

    // A pool that died unannounced: its entry expired a moment ago.
    let ghost = format!(
        r#"{}|{}|{{"id":"ghost:1:1","host":"ghost","pid":1,"started_at_ms":1,"threads":1,"handlers":1,"handled":0,"acked":0,"failed":0,"holding":0}}"#,
        now_ms() - 1,
        now_ms() - 3_000
    );
    let mut con = server.con();
    let _: () = redis::cmd("HSET")
        .arg("{dq:pools}:workers")
        .arg("ghost:1:1")
        .arg(&ghost)
        .query(&mut con)
        .expect("write by hand");
    assert!(
        q.workers().expect("workers").is_empty(),
        "an expired entry is not listed"
    );
    let c = worker.start().expect("start again");
    wait_for(Duration::from_secs(5), "the new pool to register", || {
        q.workers().is_ok_and(|w| w.len() == 1)
    });
    let left: Vec<String> = redis::cmd("HKEYS")
        .arg("{dq:pools}:workers")
        .query(&mut con)
        .expect("hkeys");
    assert_eq!(left.len(), 1, "a beat drops the expired entry: {left:?}");
    assert!(!left[0].starts_with("ghost"));
    c.finish();
}

#[test]
fn a_message_limit_overrides_the_worker_limit() {
    let server = RedisServer::start();
    let q = server.queue("limit");
    let opts_once = delayq::PushOptions {
        max_attempts: Some(1),
        ..Default::default()
    };
    let id = q.push_json("1", delayq::Due::NOW, &opts_once).expect("push");
    let worker = Worker::new(q.clone(), opts()).expect("worker");
    let calls = AtomicUsize::new(0);
    run_until(
        &worker,
        1,
        |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            Err("boom".into())
        },
        || q.stats().is_ok_and(|s| s.dead == 1),
        Duration::from_secs(10),
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        q.get(&id).expect("get").expect("dead").last_error.as_deref(),
        Some("boom")
    );
}

#[test]
fn dead_letters_are_capped() {
    let server = RedisServer::start();
    let q = server.queue_with(
        "cap",
        delayq::QueueOptions {
            dead_max: 5,
            ..Default::default()
        },
    );
    let batch: Vec<NewMessage> = (0..12)
        .map(|i| NewMessage::new(&i, Duration::ZERO).expect("msg"))
        .collect();
    q.push_many(&batch).expect("push");
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            max_attempts: 1,
            ..opts()
        },
    )
    .expect("worker");
    run_until(
        &worker,
        1,
        |_| Err("no".into()),
        || {
            q.stats()
                .is_ok_and(|s| s.ready + s.inflight == 0 && s.total("dead") == 12)
        },
        Duration::from_secs(10),
    );
    let s = q.stats().expect("stats");
    assert_eq!(s.dead, 5);
    assert_eq!(s.total("trimmed"), 7);
    assert_no_leak(&server, "{dq:cap}");
}

#[test]
fn a_handler_that_panics_fails_the_delivery_with_where_it_panicked_and_the_pool_goes_on() {
    let server = RedisServer::start();
    let q = server.queue("panic");
    let bad = q.push(&"bad", Duration::ZERO).expect("push");
    q.push(&"good", Duration::ZERO).expect("push");
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            max_attempts: 1,
            ..opts()
        },
    )
    .expect("worker");
    let summary = run_until(
        &worker,
        1,
        |d| {
            assert_ne!(d.payload_json(), r#""bad""#, "bad payload");
            Ok(())
        },
        || q.stats().is_ok_and(|s| s.dead == 1 && s.ready == 0 && s.inflight == 0),
        Duration::from_secs(10),
    );
    assert_eq!((summary.acked, summary.dead), (1, 1));
    let info = q.get(&bad).expect("get").expect("dead");
    let err = info.last_error.expect("error");
    assert!(err.contains("handler panicked") && err.contains("bad payload"), "{err}");
    // Where it panicked, and the backtrace there: unwinding to the pool loses both.
    let trace = info.error_trace.expect("a trace");
    assert!(trace.starts_with("panicked at core/tests/consumer.rs:"), "{trace}");
    assert!(
        trace.contains("bad payload") && trace.contains("stack backtrace:"),
        "{trace}"
    );
}

#[test]
fn a_hung_handler_loses_its_lease_and_the_message_is_delivered_again() {
    let server = RedisServer::start();
    let q = server.queue("lease");
    let id = q.push(&"slow", Duration::ZERO).expect("push");
    let lease_opts = WorkerOptions {
        threads: 1,
        lease: Duration::from_millis(300),
        timeout: Some(Duration::from_millis(50)),
        ..opts()
    };
    // Consumer A takes the message and "hangs": its heartbeat stops at `timeout`. With
    // room for one delivery it cannot claim the re-delivery itself.
    let a = Worker::new(
        q.clone(),
        WorkerOptions {
            prefetch: 1,
            ..lease_opts.clone()
        },
    )
    .expect("worker a");
    let ca = a.start().expect("start a");
    let first = match ca.recv_timeout(Duration::from_secs(5)) {
        Received::Message(d) => d,
        other => panic!("expected a delivery, got {other:?}"),
    };
    assert_eq!((first.id.as_str(), first.attempt), (id.as_str(), 1));
    // Consumer B gets it again once the lease has run out.
    let b = Worker::new(q.clone(), lease_opts).expect("worker b");
    let cb = b.start().expect("start b");
    let second = match cb.recv_timeout(Duration::from_secs(5)) {
        Received::Message(d) => d,
        other => panic!("expected a re-delivery, got {other:?}"),
    };
    assert_eq!((second.id.as_str(), second.attempt), (id.as_str(), 2));
    assert_ne!(first.token(), second.token());
    let info = q.get(&id).expect("get").expect("exists");
    assert_eq!(info.state, State::Inflight);
    // The expired delivery counts; the running one is read from its lease.
    assert_eq!(info.attempts, 2);
    assert_eq!(info.due_at_ms, Some(second.due_at_ms));
    assert!(
        info.last_error
            .expect("error")
            .contains("lease expired during attempt 1")
    );

    // The stale consumer's ack is refused (fencing); the current one's succeeds.
    ca.ack(first);
    let sa = ca.finish();
    assert_eq!((sa.acked, sa.lease_lost), (0, 1));
    assert_eq!(q.get(&id).expect("get").expect("still there").state, State::Inflight);
    cb.ack(second);
    let sb = cb.finish();
    assert_eq!((sb.acked, sb.lease_lost), (1, 0));
    assert!(q.get(&id).expect("get").is_none());
    assert_no_leak(&server, "{dq:lease}");
}

#[test]
fn heartbeats_keep_a_slow_handler_lease_alive() {
    let server = RedisServer::start();
    let q = server.queue("hb");
    q.push(&"slow", Duration::ZERO).expect("push");
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            lease: Duration::from_millis(200),
            ..opts()
        },
    )
    .expect("worker");
    let calls = AtomicUsize::new(0);
    let summary = run_until(
        &worker,
        1,
        |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(900));
            Ok(())
        },
        || q.stats().is_ok_and(|s| s.total("acked") == 1),
        Duration::from_secs(10),
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "lease must not expire while the handler runs"
    );
    assert_eq!((summary.acked, summary.lease_lost), (1, 0));
    assert_eq!(q.stats().expect("stats").total("expired"), 0);
}

#[test]
fn graceful_stop_finishes_running_handlers_and_returns_prefetched_messages_at_once() {
    let server = RedisServer::start();
    let q = server.queue("stop");
    let batch: Vec<NewMessage> = (0..200)
        .map(|i| NewMessage::new(&i, Duration::ZERO).expect("msg"))
        .collect();
    q.push_many(&batch).expect("push");
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            threads: 2,
            batch: 50,
            lease: Duration::from_secs(60),
            ..opts()
        },
    )
    .expect("worker");
    let handled = Arc::new(AtomicUsize::new(0));
    let stopper = worker.stopper();
    let h = Arc::clone(&handled);
    let summary = worker
        .run(2, move |_| {
            // Fast handlers: the prefetch buffer grows, so the stop has deliveries to return.
            std::thread::sleep(Duration::from_millis(1));
            if h.fetch_add(1, Ordering::SeqCst) == 10 {
                stopper.stop();
            }
            Ok(())
        })
        .expect("run");
    let handled = handled.load(Ordering::SeqCst) as u64;
    assert_eq!(summary.handled, handled);
    assert_eq!(summary.acked, handled, "every started handler finished and was acked");
    assert!(summary.released > 0, "prefetched messages were returned");
    let s = q.stats().expect("stats");
    assert_eq!(s.inflight, 0, "nothing left waiting for a lease to expire");
    assert_eq!(s.ready, 200 - handled);
    assert_eq!(s.total("released"), summary.released);
    // Released messages keep their attempt budget.
    let first_left = q.dead_letters(1).expect("dead");
    assert!(first_left.is_empty());
    let rest = Worker::new(q.clone(), opts()).expect("worker");
    let again = run_until(
        &rest,
        2,
        |d| {
            assert_eq!(d.attempt, 1, "a released delivery does not count as an attempt");
            Ok(())
        },
        || q.stats().is_ok_and(|s| s.ready + s.inflight == 0),
        Duration::from_secs(20),
    );
    assert_eq!(again.acked, 200 - handled);
    assert_no_leak(&server, "{dq:stop}");
}

#[test]
fn stop_before_run_returns_at_once_and_the_worker_can_run_again() {
    let server = RedisServer::start();
    let q = server.queue("again");
    let worker = Worker::new(q.clone(), opts()).expect("worker");
    worker.stop();
    let s = worker.run(1, |_| Ok(())).expect("run");
    assert_eq!(s.handled, 0);
    q.push(&1, Duration::ZERO).expect("push");
    let s = run_until(
        &worker,
        1,
        |_| Ok(()),
        || q.stats().is_ok_and(|s| s.total("acked") == 1),
        Duration::from_secs(10),
    );
    assert_eq!(s.acked, 1);
    let c = worker.start().expect("start");
    assert!(worker.start().is_err(), "one pool per worker at a time");
    c.finish();
}

/// A worker on `threads` threads whose idle pool looks at Redis on its own only every
/// 30 s: what it does sooner, something told it to.
fn rarely_looking_worker(q: &delayq::Queue, threads: usize) -> Worker {
    Worker::new(
        q.clone(),
        WorkerOptions {
            threads,
            idle_check: Duration::from_secs(30),
            ..opts()
        },
    )
    .expect("worker")
}

#[test]
fn an_idle_pool_is_woken_by_a_push_instead_of_polling() {
    let server = RedisServer::start();
    let q = server.queue("idle");
    let worker = rarely_looking_worker(&q, 2);
    let consumer = worker.start().expect("start");
    assert!(matches!(
        consumer.recv_timeout(Duration::from_millis(300)),
        Received::Idle
    ));
    // Settled first: a start's own claims (each fetcher's, the heartbeat's join, the
    // check after subscribing) can come late on a loaded machine.
    let claims_before = settled_claim_calls(&server);
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(
        claim_calls(&server) - claims_before,
        0,
        "an idle pool must not poll Redis"
    );
    // With a 30 s idle check only the producer's wake-up can deliver this in time.
    q.push(&"wake", Duration::from_millis(200)).expect("push");
    match consumer.recv_timeout(Duration::from_secs(5)) {
        Received::Message(d) => consumer.ack(d),
        other => panic!("expected the pushed message, got {other:?}"),
    }
    assert_eq!(consumer.finish().acked, 1);
}

#[test]
fn a_resubscribed_pool_looks_at_once_for_what_it_was_not_told() {
    let server = RedisServer::start();
    let q = server.queue("resub");
    let worker = rarely_looking_worker(&q, 1);
    let consumer = worker.start().expect("start");
    let id = q.push(&"late news", Duration::from_secs(3600)).expect("push");
    let mut con = server.con();
    // Subscribed (and its look after subscribing made), then settled.
    wait_for(Duration::from_secs(10), "the pool subscribed", || {
        let counts: Vec<(String, i64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("{dq:resub}:wake")
            .query(&mut server.con())
            .expect("pubsub numsub");
        counts.first().is_some_and(|(_, n)| *n == 1)
    });
    let claims_before = settled_claim_calls(&server);
    // Due now with no announcement: what a producer's wake-up, published while the
    // pool was not subscribed, would have told it. (The stamp still says an hour on:
    // a claim trusts it no later than itself, as with an older delayq's reschedule.)
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut con).expect("time");
    let _: () = redis::cmd("ZADD")
        .arg("{dq:resub}:scheduled")
        .arg("XX")
        .arg((secs * 1000 + micros / 1000) * 4096)
        .arg(&id)
        .query(&mut con)
        .expect("zadd");
    assert!(
        matches!(consumer.recv_timeout(Duration::from_millis(500)), Received::Idle),
        "a sleeping pool does not see it"
    );
    assert_eq!(claim_calls(&server), claims_before, "nor does it look");
    // The subscription drops: the pool subscribes again and looks at once, long before
    // its 30 s idle check.
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut con)
        .expect("client kill");
    assert_eq!(killed, 1, "the pool's subscriber");
    match consumer.recv_timeout(Duration::from_secs(3)) {
        Received::Message(d) => {
            assert_eq!(d.id, id);
            consumer.ack(d);
        }
        other => panic!("expected the message, got {other:?}"),
    }
    assert_eq!(consumer.finish().acked, 1);
}

/// The script calls so far, once no new one came for 300 ms.
fn settled_claim_calls(server: &RedisServer) -> i64 {
    let mut before = claim_calls(server);
    wait_for(Duration::from_secs(10), "the pool settled", || {
        std::thread::sleep(Duration::from_millis(300));
        let now = claim_calls(server);
        std::mem::replace(&mut before, now) == now
    });
    before
}

fn claim_calls(server: &RedisServer) -> i64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.con())
        .expect("INFO");
    info.lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split("calls=").nth(1)?.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_consumer_whose_handlers_all_hang_gives_its_prefetched_messages_to_others() {
    let server = RedisServer::start();
    let q = server.queue("stall");
    let batch: Vec<NewMessage> = (0..200)
        .map(|i| NewMessage::new(&i, Duration::ZERO).expect("msg"))
        .collect();
    q.push_many(&batch).expect("push");
    let hung_opts = WorkerOptions {
        threads: 1,
        lease: Duration::from_millis(300),
        timeout: Some(Duration::from_millis(50)),
        ..opts()
    };
    // A handles 20 quickly, so its prefetch buffer grows; then one handler call hangs.
    let a = Worker::new(q.clone(), hung_opts).expect("worker a");
    let ca = a.start().expect("start a");
    let mut by_a = Vec::new();
    let stuck = loop {
        match ca.recv_timeout(Duration::from_secs(5)) {
            Received::Message(d) if by_a.len() < 20 => {
                by_a.push(d.payload::<u64>().expect("payload"));
                ca.ack(d);
            }
            Received::Message(d) => break d,
            other => panic!("expected a delivery, got {other:?}"),
        }
    };
    wait_for(Duration::from_secs(5), "A to hold more than the stuck one", || {
        q.stats().is_ok_and(|s| s.inflight > 1)
    });
    // B gets every other message: those A released, and the stuck one after its lease.
    let b = Worker::new(q.clone(), opts()).expect("worker b");
    let seen: Mutex<Vec<(u64, u32)>> = Mutex::new(Vec::new());
    run_until(
        &b,
        2,
        |d| {
            seen.lock().push((d.payload().map_err(|e| e.to_string())?, d.attempt));
            Ok(())
        },
        || seen.lock().len() >= 180 && q.stats().is_ok_and(|s| s.ready + s.scheduled == 0 && s.inflight == 0),
        Duration::from_secs(20),
    );
    let seen = seen.into_inner();
    let mut all: Vec<u64> = seen.iter().map(|s| s.0).chain(by_a.iter().copied()).collect();
    all.sort_unstable();
    assert_eq!(all, (0..200).collect::<Vec<_>>());
    let stuck_n: u64 = stuck.payload().expect("payload");
    assert!(seen.contains(&(stuck_n, 2)), "the stuck message ran again on B");
    drop(stuck);
    let sa = ca.finish();
    assert!(sa.released >= 1, "A gave its waiting deliveries back: {sa:?}");
    assert_eq!(sa.acked, 20);
}

#[test]
fn slow_handlers_do_not_hoard_due_messages_from_idle_consumers() {
    let server = RedisServer::start();
    let q = server.queue("fair");
    let batch: Vec<NewMessage> = (0..8)
        .map(|i| NewMessage::new(&i, Duration::ZERO).expect("msg"))
        .collect();
    q.push_many(&batch).expect("push");
    let by: Mutex<Vec<char>> = Mutex::new(Vec::new());
    let slow = |who: char| {
        let by = &by;
        move |_: &delayq::Delivery| {
            // Long enough that B starts claiming before A could take its share.
            std::thread::sleep(Duration::from_millis(400));
            by.lock().push(who);
            Ok(())
        }
    };
    let a = Worker::new(q.clone(), opts()).expect("worker a");
    let b = Worker::new(q.clone(), opts()).expect("worker b");
    let (sa, sb) = (a.stopper(), b.stopper());
    std::thread::scope(|s| {
        let (_stop_a, _stop_b) = (StopOnDrop(sa.clone()), StopOnDrop(sb.clone()));
        s.spawn(|| a.run(1, slow('a')).expect("run a"));
        // A is busy with its first message before B even starts.
        wait_for(Duration::from_secs(5), "A to start", || {
            q.stats().is_ok_and(|s| s.inflight >= 1)
        });
        s.spawn(|| b.run(1, slow('b')).expect("run b"));
        wait_for(Duration::from_secs(20), "all handled", || by.lock().len() == 8);
        sa.stop();
        sb.stop();
    });
    let by = by.into_inner();
    let b_count = by.iter().filter(|w| **w == 'b').count();
    assert!(
        b_count >= 3,
        "B handled {b_count} of 8: A hoarded due messages ({by:?})"
    );
}

#[test]
fn fetchers_claiming_at_once_hold_no_more_than_the_prefetch_and_keep_due_order() {
    let server = RedisServer::start();
    let q = server.queue("one-at-a-time");
    push_numbered(&q, 6);
    // One slow handler: the pool should hold one message at a time, however many
    // fetchers wake when its last one is acknowledged.
    let worker = Worker::new(q.clone(), WorkerOptions { threads: 4, ..opts() }).expect("worker");
    let ran = common::run_until(
        &worker,
        1,
        Duration::from_secs(20),
        |d, seen: &Mutex<Vec<(u64, u64)>>| {
            let inflight = q.stats().map_err(|e| e.to_string())?.inflight;
            std::thread::sleep(Duration::from_millis(100));
            let n = d.payload::<serde_json::Value>().map_err(|e| e.to_string())?["n"]
                .as_u64()
                .ok_or("no n")?;
            seen.lock().push((n, inflight));
            Ok(())
        },
        |seen| seen.len() == 6,
    );
    let order: Vec<u64> = ran.iter().map(|(n, _)| *n).collect();
    assert_eq!(order, [0, 1, 2, 3, 4, 5], "handed out in due order");
    let held: Vec<u64> = ran.iter().map(|(_, inflight)| *inflight).collect();
    assert_eq!(held, [1; 6], "messages in flight as each handler call began");
}

#[test]
fn a_paused_queue_hands_out_nothing_until_resumed_and_resuming_wakes_idle_pools() {
    let server = RedisServer::start();
    let q = server.queue_with(
        "paused",
        delayq::QueueOptions {
            partitions: 2,
            ..Default::default()
        },
    );
    let running = q.push(&json!({"n": -1}), Duration::ZERO).expect("push");
    // Longer than the test: only the wake-up that resuming publishes can end the wait.
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            idle_check: Duration::from_secs(600),
            ..opts()
        },
    )
    .expect("worker");
    let consumer = worker.start().expect("start");
    let in_hand = match consumer.recv_timeout(Duration::from_secs(10)) {
        Received::Message(d) => d,
        other => panic!("the first message never came: {other:?}"),
    };
    assert_eq!(in_hand.id, running);

    assert!(q.pause().expect("pause"), "it was running");
    assert!(!q.pause().expect("pause again"), "already paused");
    assert!(q.is_paused().expect("is_paused"));
    let paused_at = q.stats().expect("stats").paused_at_ms.expect("paused_at_ms");
    for i in 0..40 {
        let opts = delayq::PushOptions {
            partition_key: Some(format!("key{i}")),
            ..Default::default()
        };
        q.push_json(json!({"n": i}).to_string(), Duration::ZERO.into(), &opts)
            .expect("a paused queue still takes pushes");
    }
    let s = q.stats().expect("stats");
    assert!(
        (0..2).all(|p| q
            .partition_stats(p)
            .is_ok_and(|s| s.ready > 0 && s.paused_at_ms.is_some())),
        "every partition holds due messages and is paused"
    );
    assert_eq!(s.ready, 40);
    // The handler that holds a message when the pause comes finishes it as usual.
    consumer.ack(in_hand);
    assert!(
        matches!(consumer.recv_timeout(Duration::from_millis(1500)), Received::Idle),
        "nothing is handed out while paused"
    );
    let s = q.stats().expect("stats");
    assert_eq!((s.ready, s.inflight, s.total("acked")), (40, 0, 1));
    assert_eq!(s.total("delivered"), 1);
    assert_eq!(
        q.stats().expect("stats").paused_at_ms,
        Some(paused_at),
        "a second pause keeps the first's time"
    );

    assert!(q.resume().expect("resume"), "it was paused");
    assert!(!q.resume().expect("resume again"), "already running");
    assert!(!q.is_paused().expect("is_paused"));
    let mut got = 0;
    while got < 40 {
        match consumer.recv_timeout(Duration::from_secs(10)) {
            Received::Message(d) => {
                consumer.ack(d);
                got += 1;
            }
            other => panic!("after resume only {got} of 40 came: {other:?}"),
        }
    }
    let summary = consumer.finish();
    assert_eq!(summary.acked, 41);
    for p in 0..2 {
        assert_no_leak(&server, &q.hash_tag(p).expect("tag"));
    }
}

#[test]
fn waiting_and_running_messages_are_listed_in_the_order_consumers_meet_them() {
    let server = RedisServer::start();
    let q = server.queue_with(
        "listed",
        delayq::QueueOptions {
            partitions: 2,
            ..Default::default()
        },
    );
    let keyed = |key: &str| delayq::PushOptions {
        partition_key: Some(key.to_owned()),
        ..Default::default()
    };
    let push = |n: u32, delay: Duration, key: &str| {
        q.push_json(json!({"n": n}).to_string(), delay.into(), &keyed(key))
            .expect("push")
    };
    let late = push(0, Duration::from_secs(3600), "a");
    let soon = push(1, Duration::from_secs(60), "b");
    let due_first = push(2, Duration::ZERO, "a");
    std::thread::sleep(Duration::from_millis(5));
    let due_second = push(3, Duration::ZERO, "b");
    assert_ne!(
        q.partition_of(&due_first, Some("a")),
        q.partition_of(&due_second, Some("b"))
    );

    let waiting = q.list(delayq::Listing::Waiting, 10).expect("list");
    let order: Vec<(&str, State)> = waiting.iter().map(|m| (m.id.as_str(), m.state)).collect();
    assert_eq!(
        order,
        [
            (due_first.as_str(), State::Ready),
            (due_second.as_str(), State::Ready),
            (soon.as_str(), State::Scheduled),
            (late.as_str(), State::Scheduled),
        ],
        "merged over both partitions by due time"
    );
    assert_eq!(waiting[3].payload_json, r#"{"n":0}"#);
    assert_eq!(waiting[3].attempts, 0);
    assert_eq!(waiting[3].lease_until_ms, None);
    let two: Vec<String> = q
        .list(delayq::Listing::Waiting, 2)
        .expect("list")
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(two, [due_first.clone(), due_second.clone()]);
    assert!(q.list(delayq::Listing::Inflight, 10).expect("list").is_empty());
    assert!(q.list(delayq::Listing::Waiting, 0).expect("limit 0").is_empty());
    assert!(matches!(
        q.list(delayq::Listing::Waiting, 1001),
        Err(delayq::Error::InvalidArgument { .. })
    ));

    let worker = Worker::new(q.clone(), WorkerOptions { threads: 1, ..opts() }).expect("worker");
    let consumer = worker.start().expect("start");
    let Received::Message(running) = consumer.recv_timeout(Duration::from_secs(10)) else {
        panic!("no delivery");
    };
    let inflight = q.list(delayq::Listing::Inflight, 10).expect("list");
    assert_eq!(inflight.len(), 1, "one handler, one delivery held: {inflight:?}");
    let held = &inflight[0];
    assert_eq!(
        (held.id.as_str(), held.state, held.attempts),
        (running.id.as_str(), State::Inflight, 1)
    );
    assert_eq!(held.due_at_ms, Some(running.due_at_ms));
    let until = held.lease_until_ms.expect("lease deadline");
    assert!(until > running.due_at_ms, "the lease runs from the claim on");
    assert_eq!(
        q.get(&running.id).expect("get").expect("known").lease_until_ms,
        Some(until)
    );

    let failed = running.id.clone();
    consumer.fail_with(running, "card declined", Retry::After(Duration::from_secs(600)));
    wait_for(Duration::from_secs(10), "the retry to be scheduled", || {
        q.get(&failed)
            .is_ok_and(|m| m.is_some_and(|m| m.state == State::Scheduled))
    });
    assert_eq!(consumer.finish().retried, 1);
    let retry = q
        .list(delayq::Listing::Waiting, 10)
        .expect("list")
        .into_iter()
        .find(|m| m.id == failed)
        .expect("listed");
    assert_eq!(
        (retry.attempts, retry.last_error.as_deref()),
        (1, Some("card declined"))
    );
}

#[test]
fn restart_workers_stops_the_pools_running_then_and_not_those_started_after() {
    let server = RedisServer::start();
    let q = server.queue("restarted");
    // Longer than the test: only the wake-up that the request publishes reaches idle pools.
    let sleepy = || WorkerOptions {
        idle_check: Duration::from_secs(600),
        ..opts()
    };
    let pools: Vec<Worker> = (0..2)
        .map(|_| Worker::new(q.clone(), sleepy()).expect("worker"))
        .collect();
    let handled = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let _stop: Vec<StopOnDrop> = pools.iter().map(|w| StopOnDrop(w.stopper())).collect();
        let runs: Vec<_> = pools
            .iter()
            .map(|w| {
                let handled = &handled;
                s.spawn(move || {
                    w.run(2, |_| {
                        handled.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    })
                    .expect("run")
                })
            })
            .collect();
        wait_for(Duration::from_secs(10), "both pools listed", || {
            q.workers().is_ok_and(|w| w.len() == 2)
        });
        q.push(&json!({"n": 0}), Duration::ZERO).expect("push");
        wait_for(Duration::from_secs(10), "the message handled", || {
            handled.load(Ordering::SeqCst) == 1
        });
        assert_eq!(
            q.restart_workers().expect("restart_workers"),
            2,
            "pools alive when asked"
        );
        wait_for(Duration::from_secs(10), "both idle pools stopped", || {
            runs.iter().all(|r| r.is_finished())
        });
    });
    assert!(pools.iter().all(|w| w.stopper().restart_requested()));
    assert!(q.workers().expect("workers").is_empty(), "both said goodbye");

    // A pool started after the request is not meant by it, even when the request was
    // made with the Redis clock 300 s fast and the clock has stepped back since: pools
    // compare the count of requests, not their times.
    let _: () = redis::cmd("HSET")
        .arg("{dq:restarted}:control")
        .arg("restart_at")
        .arg(server.now_ms() + 300_000)
        .query(&mut server.con())
        .expect("HSET");
    let later = Worker::new(q.clone(), opts()).expect("worker");
    let consumer = later.start().expect("start");
    q.push(&json!({"n": 1}), Duration::ZERO).expect("push");
    match consumer.recv_timeout(Duration::from_secs(10)) {
        Received::Message(d) => consumer.ack(d),
        other => panic!("a pool started after the restart request stopped: {other:?}"),
    }
    assert!(!consumer.stopper().is_stopped() && !consumer.stopper().restart_requested());
    assert_eq!(consumer.finish().acked, 1);
}

#[test]
fn stop_when_empty_returns_once_nothing_is_due_or_running_and_leaves_later_messages() {
    let server = RedisServer::start();
    let q = server.queue("batch");
    let later = q.push(&json!({"n": "later"}), Duration::from_secs(3600)).expect("push");
    push_numbered(&q, 50);
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            stop_when_empty: true,
            ..opts()
        },
    )
    .expect("worker");
    let _stop = StopOnDrop(worker.stopper());
    let summary = worker
        .run(4, |_| {
            std::thread::sleep(Duration::from_millis(5));
            Ok(())
        })
        .expect("run");
    assert_eq!(summary.acked, 50, "every due message ran before the pool stopped");
    assert!(worker.stopper().found_empty() && !worker.stopper().restart_requested());
    let s = q.stats().expect("stats");
    assert_eq!((s.ready, s.inflight, s.scheduled), (0, 0, 1));
    assert_eq!(q.get(&later).expect("get").map(|m| m.state), Some(State::Scheduled));
}

#[test]
fn stop_when_empty_waits_while_due_messages_are_held_back() {
    let server = RedisServer::start();
    let q = server.queue("held");
    q.pause().expect("pause");
    for i in 0..3 {
        q.push(&json!({"n": i}), Duration::ZERO).expect("push");
    }
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            stop_when_empty: true,
            idle_check: Duration::from_millis(200),
            ..opts()
        },
    )
    .expect("worker");
    let handled = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(worker.stopper());
        let run = s.spawn(|| {
            worker
                .run(2, |_| {
                    handled.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                })
                .expect("run")
        });
        std::thread::sleep(Duration::from_millis(1500));
        assert!(!run.is_finished(), "a paused queue with due messages is not empty");
        q.resume().expect("resume");
        wait_for(Duration::from_secs(10), "the pool to drain and stop", || {
            run.is_finished()
        });
    });
    assert_eq!(handled.load(Ordering::SeqCst), 3);
    assert!(worker.stopper().found_empty());
}

#[test]
fn pools_report_how_late_their_handlers_started() {
    let server = RedisServer::start();
    let q = server.queue("late");
    // Held back for a second: each message starts at least that late.
    q.pause().expect("pause");
    for i in 0..5 {
        q.push(&json!({"n": i}), Duration::ZERO).expect("push");
    }
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            // A heartbeat every 100 ms, each reporting the starts since the last.
            lease: Duration::from_millis(300),
            ..opts()
        },
    )
    .expect("worker");
    let handled = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(worker.stopper());
        s.spawn(|| {
            worker
                .run(1, |_| {
                    std::thread::sleep(Duration::from_millis(10));
                    handled.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                })
                .expect("run")
        });
        wait_for(Duration::from_secs(10), "the pool listed", || {
            q.workers().is_ok_and(|w| w.len() == 1)
        });
        let idle = q.workers().expect("workers").remove(0);
        assert_eq!((idle.started_recently, idle.lateness_max_ms), (0, None));
        std::thread::sleep(Duration::from_secs(1));
        q.resume().expect("resume");
        let mut seen = None;
        wait_for(Duration::from_secs(10), "a heartbeat that reports the starts", || {
            seen = q
                .workers()
                .ok()
                .and_then(|mut w| w.pop())
                .filter(|w| w.started_recently > 0);
            seen.is_some()
        });
        let w = seen.expect("seen");
        let (avg, max) = (
            w.lateness_avg_ms.expect("lateness_avg_ms"),
            w.lateness_max_ms.expect("lateness_max_ms"),
        );
        assert!((900..5000).contains(&max), "started {max} ms late after a 1 s pause");
        assert!(avg >= 900.0 && avg <= max as f64, "avg {avg}, max {max}");
        assert!(w.started_recently <= 5 && w.handled <= 5);
        wait_for(Duration::from_secs(10), "all handled", || {
            handled.load(Ordering::SeqCst) == 5
        });
        // A heartbeat between the first start and the first return reports starts
        // and no handler time yet; a later one reports it.
        wait_for(
            Duration::from_secs(10),
            "a heartbeat that reports the handler time",
            || {
                q.workers()
                    .ok()
                    .and_then(|mut w| w.pop())
                    .is_some_and(|w| w.handler_avg_ms.is_some_and(|ms| ms >= 10.0))
            },
        );
    });
}

#[test]
fn a_restart_requested_mid_drain_loses_and_doubles_nothing() {
    let server = RedisServer::start();
    let q = server.queue("deploy");
    push_numbered(&q, 5_000);
    let seen: Mutex<HashMap<i64, usize>> = Mutex::new(HashMap::new());
    let handle = |d: &delayq::Delivery| {
        let v: serde_json::Value = d.payload().map_err(|e| e.to_string())?;
        std::thread::sleep(Duration::from_micros(300));
        *seen.lock().entry(v["n"].as_i64().expect("n")).or_insert(0) += 1;
        Ok(())
    };
    // The old code's pool, asked to stop after about a tenth of the work.
    let old = Worker::new(q.clone(), opts()).expect("worker");
    let (asked_at, summary) = std::thread::scope(|s| {
        let _stop = StopOnDrop(old.stopper());
        let run = s.spawn(|| old.run(4, handle).expect("run"));
        wait_for(Duration::from_secs(20), "a tenth handled", || seen.lock().len() >= 500);
        let asked_at = seen.lock().len();
        q.restart_workers().expect("restart_workers");
        wait_for(Duration::from_secs(10), "the old pool stopped", || run.is_finished());
        (asked_at, run.join().expect("join"))
    });
    assert!(old.stopper().restart_requested());
    let stopped_at = seen.lock().len();
    assert!(
        stopped_at < 5_000,
        "the old pool stopped before the end ({stopped_at} handled)"
    );
    assert_eq!(
        q.stats().expect("stats").inflight,
        0,
        "running handlers finished, the prefetched went back"
    );
    // The new code's pool finishes the work.
    let new = Worker::new(
        q.clone(),
        WorkerOptions {
            stop_when_empty: true,
            ..opts()
        },
    )
    .expect("worker");
    let _stop = StopOnDrop(new.stopper());
    new.run(4, handle).expect("run");
    let seen = seen.into_inner();
    let doubled = seen.values().filter(|&&c| c > 1).count();
    eprintln!(
        "restart asked at {asked_at} handled, old pool stopped at {stopped_at} ({} released), new pool ran the rest: \
         {} distinct, {doubled} twice",
        summary.released,
        seen.len()
    );
    assert_eq!((seen.len(), doubled), (5_000, 0));
    assert_no_leak(&server, "{dq:deploy}");
}

#[test]
fn a_releaser_gives_running_and_prefetched_deliveries_back_at_once() {
    let server = RedisServer::start();
    let q = server.queue("cold");
    push_numbered(&q, 5);
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            lease: Duration::from_secs(60),
            threads: 1,
            ..opts()
        },
    )
    .expect("worker");
    let c = worker.start_with(3).expect("start");
    let running = match c.recv_timeout(Duration::from_secs(5)) {
        Received::Message(d) => d,
        other => panic!("expected a delivery, got {other:?}"),
    };
    wait_for(Duration::from_secs(5), "more claimed than the one running", || {
        q.stats().is_ok_and(|s| s.inflight >= 2)
    });
    let held = q.stats().expect("stats").inflight;
    // From another thread, while the handler of `running` still runs.
    let releaser = c.releaser();
    let (given, so_far) = std::thread::spawn(move || (releaser.release_all(), releaser.summary()))
        .join()
        .expect("thread");
    assert_eq!(given as u64, held, "the running one and the prefetched ones");
    // What a process that ends right after can still report.
    assert_eq!((so_far.handled, so_far.released, so_far.acked), (1, held, 0));
    let s = q.stats().expect("stats");
    assert_eq!(
        (s.ready, s.inflight),
        (5, 0),
        "due again at once, not after the 60 s lease"
    );
    let info = q.get(&running.id).expect("get").expect("exists");
    assert_eq!(info.attempts, 0, "a released delivery does not count as an attempt");
    // The handler finishing late cannot complete the delivery it no longer holds.
    c.ack(running);
    let summary = c.finish();
    assert_eq!((summary.acked, summary.lease_lost), (0, 1));
    assert_eq!(q.stats().expect("stats").ready, 5);
}

#[test]
fn deliveries_of_one_claim_that_share_a_lease_text_are_kept_apart() {
    // Messages due at one score (past 4 096 in one millisecond, or a run of generated
    // ids) get one lease text from one claim: the pool must still hold, release and
    // complete each of them.
    let server = RedisServer::start();
    let q = server.queue("same");
    for n in 0..4 {
        let mut m = NewMessage::new(&json!({"n": n}), Duration::ZERO).expect("message");
        m.options.id = Some(format!("m{n}"));
        q.push_many(&[m]).expect("push");
    }
    let mut con = server.con();
    for n in 0..4 {
        let _: () = redis::cmd("ZADD")
            .arg("{dq:same}:scheduled")
            .arg("XX")
            .arg(4096)
            .arg(format!("m{n}"))
            .query(&mut con)
            .expect("ZADD");
    }
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            lease: Duration::from_secs(60),
            threads: 1,
            ..opts()
        },
    )
    .expect("worker");
    let c = worker.start_with(4).expect("start");
    let first = match c.recv_timeout(Duration::from_secs(5)) {
        Received::Message(d) => d,
        other => panic!("expected a delivery, got {other:?}"),
    };
    wait_for(Duration::from_secs(5), "all four claimed", || {
        q.stats().is_ok_and(|s| s.inflight == 4)
    });
    c.ack(first);
    wait_for(Duration::from_secs(5), "the ack written", || {
        q.stats().is_ok_and(|s| s.inflight == 3)
    });
    assert_eq!(
        c.releaser().release_all(),
        3,
        "each of the other three, not one for their lease text"
    );
    let summary = c.finish();
    assert_eq!((summary.acked, summary.released), (1, 3));
    assert_eq!(q.stats().expect("stats").ready, 3);
}

#[test]
fn a_working_pools_counts_in_the_list_of_pools_stay_fresh_between_heartbeats() {
    let server = RedisServer::start();
    let q = server.queue("fresh");
    // Heartbeats every 10 s: counts refreshed only then would read 0 for the whole test.
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            lease: Duration::from_secs(30),
            threads: 1,
            ..opts()
        },
    )
    .expect("worker");
    std::thread::scope(|s| {
        let _stop = StopOnDrop(worker.stopper());
        s.spawn(|| {
            worker
                .run(1, |_| {
                    std::thread::sleep(Duration::from_millis(100));
                    Ok(())
                })
                .expect("run")
        });
        wait_for(Duration::from_secs(10), "the pool listed", || {
            q.workers().is_ok_and(|w| w.len() == 1)
        });
        for n in 0..10 {
            q.push(&json!({"n": n}), Duration::ZERO).expect("push");
        }
        wait_for(Duration::from_secs(5), "the list to show every message handled", || {
            q.workers()
                .is_ok_and(|w| w.len() == 1 && w[0].handled == 10 && w[0].acked == 10)
        });
        // Idle again: its entry goes on being renewed at heartbeats only.
        worker.stop();
    });
}

#[test]
fn a_delivery_completed_on_another_consumer_leaves_that_consumers_deliveries_alone() {
    let server = RedisServer::start();
    let (qa, qb) = (server.queue("stale-a"), server.queue("stale-b"));
    qa.push(&"a", Duration::ZERO).expect("push a");
    qb.push(&"b", Duration::ZERO).expect("push b");
    let short = WorkerOptions {
        lease: Duration::from_millis(200),
        ..opts()
    };
    let a = Worker::new(qa.clone(), short.clone())
        .expect("worker a")
        .start_with(1)
        .expect("start a");
    // Room for two, so that a redelivery of its running message would reach b.
    let b = Worker::new(qb.clone(), short)
        .expect("worker b")
        .start_with(2)
        .expect("start b");
    let next = |c: &delayq::Consumer| match c.recv_timeout(Duration::from_secs(10)) {
        Received::Message(d) => d,
        other => panic!("expected a delivery, got {other:?}"),
    };
    let (da, db) = (next(&a), next(&b));
    let id_b = db.id.clone();

    // Misuse: a's delivery completed on b. It must not touch b's bookkeeping of its
    // own delivery, whose heartbeats keep its lease while it runs.
    b.ack(da);
    if let Received::Message(again) = b.recv_timeout(Duration::from_millis(1_200)) {
        panic!("b's running message was delivered again: {again:?}");
    }
    b.ack(db);
    let summary = b.finish();
    assert_eq!((summary.acked, summary.lease_lost), (1, 1), "{summary:?}");
    assert_eq!(qb.stats().expect("stats").total("expired"), 0);
    assert_eq!(qb.get(&id_b).expect("get").map(|m| m.state), None, "acked, gone");
    a.finish();
}

/// A caller that drives the pool itself (a framework's worker through the PHP
/// consumer): it waits until each decision is written, learns when one was given up
/// on or when claims fail, and when the next message is due.
#[test]
fn a_pull_caller_waits_for_its_decisions_and_learns_what_the_pool_meets() {
    let mut server = RedisServer::start();
    let q = server.queue("pull");
    let id = q.push(&json!({"order": 1}), Duration::ZERO).expect("push");
    let lease = Duration::from_secs(1);
    let worker = Worker::new(q.clone(), WorkerOptions { lease, ..opts() }).expect("worker");
    let consumer = worker.start().expect("start");
    let Received::Message(d) = consumer.recv_timeout(Duration::from_secs(5)) else {
        panic!("no delivery");
    };
    let receipt = d.receipt();
    consumer.ack(d);
    consumer.wait_written(receipt).expect("written");
    assert!(q.get(&id).expect("get").is_none(), "deleted once wait_written returned");

    q.push(&json!({"order": 2}), Duration::from_secs(3)).expect("push");
    assert!(matches!(
        consumer.recv_timeout(Duration::from_millis(500)),
        Received::Idle
    ));
    let next = consumer.next_due_in().expect("a due time is known");
    // No later than that message; a lease that ends sooner may come first.
    assert!(next <= Duration::from_secs(3), "{next:?}");
    assert!(consumer.claim_failure().is_none());

    q.push(&json!({"order": 3}), Duration::ZERO).expect("push");
    let Received::Message(d) = consumer.recv_timeout(Duration::from_secs(5)) else {
        panic!("no delivery");
    };
    server.kill();
    let receipt = d.receipt();
    consumer.ack(d);
    let e = consumer.wait_written(receipt).expect_err("given up within the lease");
    assert_eq!(e.category(), delayq::Category::Connection, "{e}");
    assert!(e.to_string().contains("runs again after its lease"), "{e}");
    wait_for(Duration::from_secs(10), "claims to fail", || {
        consumer.claim_failure().is_some()
    });
    assert_eq!(
        consumer.claim_failure().expect("failure").category(),
        delayq::Category::Connection
    );
}

/// An outage is logged when it begins and when it ends, not at every retry of the
/// claims: a caller of the consumer hears of it through `claim_failure` already.
#[test]
fn claims_failing_through_an_outage_are_logged_when_it_begins_and_ends() {
    let _ = delayq::capture_logs(log::LevelFilter::Info);
    // Other tests of this binary log too, into a bounded buffer: take ours as they come.
    let mut mine: Vec<String> = Vec::new();
    let take = |mine: &mut Vec<String>| {
        mine.extend(
            delayq::take_logs()
                .into_iter()
                .map(|r| r.message)
                .filter(|m| m.starts_with("delayq[outage]: claim")),
        );
    };
    let mut server = RedisServer::start();
    let q = server.queue("outage");
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            idle_check: Duration::from_millis(100),
            ..opts()
        },
    )
    .expect("worker");
    let consumer = worker.start().expect("start");
    assert!(matches!(
        consumer.recv_timeout(Duration::from_millis(200)),
        Received::Idle
    ));
    server.kill();
    wait_for(Duration::from_secs(10), "claims to fail", || {
        take(&mut mine);
        consumer.claim_failure().is_some()
    });
    // Several retries: 50 ms doubling up to 2 s.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        take(&mut mine);
        std::thread::sleep(Duration::from_millis(20));
    }
    server.restart();
    wait_for(Duration::from_secs(10), "claims to work again", || {
        take(&mut mine);
        consumer.claim_failure().is_none()
    });
    take(&mut mine);
    // The broken connection, then the refused ones: two errors, each logged once.
    let (last, failed) = mine.split_last().expect("logs");
    assert!(last.contains("claims work again, after "), "{mine:#?}");
    assert!(
        (1..=2).contains(&failed.len()) && failed.iter().all(|m| m.contains("claim failed")),
        "{mine:#?}"
    );
}
