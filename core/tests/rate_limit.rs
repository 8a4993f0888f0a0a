//! The queue-wide rate limit against a real redis-server.

mod common;

use std::time::{Duration, Instant};

use common::{RedisServer, StopOnDrop, assert_no_leak, wait_for};
use delayq::{NewMessage, QueueOptions, RateLimit, Received, Worker, WorkerOptions};
use parking_lot::Mutex;
use serde_json::json;

/// Longer than any test: a pool that sleeps past a freed window would hang the test,
/// so only the claim's own "next time worth looking" can move the pools on.
fn sleepy() -> WorkerOptions {
    WorkerOptions {
        idle_check: Duration::from_secs(600),
        ..WorkerOptions::default()
    }
}

#[test]
fn two_pools_never_start_more_than_max_in_any_window_and_resume_when_it_frees() {
    let server = RedisServer::start();
    let q = server.queue_with(
        "limited",
        QueueOptions {
            partitions: 2,
            ..Default::default()
        },
    );
    let limit = RateLimit::new(20, 0.5).expect("limit");
    q.set_rate_limit(limit).expect("set_rate_limit");
    assert_eq!(q.rate_limit().expect("rate_limit"), Some(limit));
    assert_eq!(q.stats().expect("stats").rate_limit, Some(limit));
    let batch: Vec<NewMessage> = (0..120)
        .map(|i| NewMessage::new(&json!({"n": i}), Duration::ZERO).expect("msg"))
        .collect();
    q.push_many(&batch).expect("push_many");

    let starts: Mutex<Vec<Instant>> = Mutex::new(Vec::new());
    let pools: Vec<Worker> = (0..2)
        .map(|_| Worker::new(q.clone(), sleepy()).expect("worker"))
        .collect();
    std::thread::scope(|s| {
        let _stop: Vec<StopOnDrop> = pools.iter().map(|w| StopOnDrop(w.stopper())).collect();
        for pool in &pools {
            let starts = &starts;
            s.spawn(move || {
                pool.run(4, |_| {
                    starts.lock().push(Instant::now());
                    Ok(())
                })
                .expect("run")
            });
        }
        wait_for(Duration::from_secs(30), "all 120 handled", || {
            starts.lock().len() == 120
        });
    });

    let mut starts = starts.into_inner();
    starts.sort();
    // The cap is on claims (server clock); a handler starts a little after its claim
    // (the reply's way back and the hand-off), never before, so starts 20 apart are
    // at least the window minus that delay apart (up to 200 ms on a loaded machine;
    // without the cap they would be a few ms apart).
    let tightest = starts.windows(21).map(|w| w[20] - w[0]).min().expect("121 starts");
    assert!(
        tightest >= Duration::from_millis(300),
        "21 handlers started within {tightest:?}: more than 20 per 500 ms"
    );
    let s = q.stats().expect("stats");
    assert_eq!((s.ready, s.inflight, s.total("acked")), (0, 0, 120));
    for part in 0..2 {
        assert_no_leak(&server, &q.hash_tag(part).expect("tag"));
    }
}

#[test]
fn under_a_rate_limit_a_pool_takes_only_what_its_idle_handlers_start_at_once() {
    let server = RedisServer::start();
    let q = server.queue("paced");
    q.set_rate_limit(RateLimit::new(1000, 60.0).expect("limit"))
        .expect("set_rate_limit");
    let batch: Vec<NewMessage> = (0..400)
        .map(|i| NewMessage::new(&json!({"n": i}), Duration::ZERO).expect("msg"))
        .collect();
    q.push_many(&batch).expect("push_many");
    let worker = Worker::new(q.clone(), sleepy()).expect("worker");
    let consumer = worker.start_with(2).expect("start");
    // Fast handlers: without a limit the pool would prefetch 50 ms of their work, a
    // whole batch, and those messages would start long after the limit counted them.
    for _ in 0..200 {
        match consumer.recv_timeout(Duration::from_secs(5)) {
            Received::Message(d) => consumer.ack(d),
            other => panic!("a message did not come: {other:?}"),
        }
    }
    let in_hand: Vec<_> = (0..2)
        .map(|_| match consumer.recv_timeout(Duration::from_secs(5)) {
            Received::Message(d) => d,
            other => panic!("a message did not come: {other:?}"),
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let s = q.stats().expect("stats");
    assert_eq!(
        s.inflight, 2,
        "with both handlers busy the pool holds nothing more ({} in flight)",
        s.inflight
    );
    for d in in_hand {
        consumer.ack(d);
    }
    consumer.finish();
    assert_eq!(q.stats().expect("stats").total("acked"), 202);
}

#[test]
fn clearing_or_raising_the_limit_wakes_the_pools_it_held_back() {
    let server = RedisServer::start();
    let q = server.queue("held");
    q.set_rate_limit(RateLimit::new(1, 3600.0).expect("limit"))
        .expect("set_rate_limit");
    for i in 0..5 {
        q.push(&json!({"n": i}), Duration::ZERO).expect("push");
    }
    let worker = Worker::new(q.clone(), sleepy()).expect("worker");
    let consumer = worker.start().expect("start");
    let first = match consumer.recv_timeout(Duration::from_secs(10)) {
        Received::Message(d) => d,
        other => panic!("the first message never came: {other:?}"),
    };
    consumer.ack(first);
    assert!(
        matches!(consumer.recv_timeout(Duration::from_millis(1500)), Received::Idle),
        "1 per hour: the second waits"
    );
    assert_eq!(q.stats().expect("stats").ready, 4);

    // Raised: one more fits the window at once.
    q.set_rate_limit(RateLimit::new(2, 3600.0).expect("limit"))
        .expect("raise");
    let second = match consumer.recv_timeout(Duration::from_secs(5)) {
        Received::Message(d) => d,
        other => panic!("raising the limit did not wake the pool: {other:?}"),
    };
    consumer.ack(second);
    assert!(matches!(
        consumer.recv_timeout(Duration::from_millis(1000)),
        Received::Idle
    ));

    assert!(q.clear_rate_limit().expect("clear"), "a limit was in force");
    assert!(!q.clear_rate_limit().expect("clear again"), "none is left");
    assert_eq!(q.rate_limit().expect("rate_limit"), None);
    let mut rest = 0;
    while rest < 3 {
        match consumer.recv_timeout(Duration::from_secs(5)) {
            Received::Message(d) => {
                consumer.ack(d);
                rest += 1;
            }
            other => panic!("clearing the limit did not wake the pool: {other:?}"),
        }
    }
    consumer.finish();
    assert_eq!(q.stats().expect("stats").total("acked"), 5);
    assert!(
        !server.dump_keys().iter().any(|k| k.contains("limit")),
        "a cleared limit leaves no key"
    );
}

#[test]
fn a_bad_rate_limit_names_its_culprit_and_writes_nothing() {
    let server = RedisServer::start();
    let q = server.queue_with(
        "bad",
        QueueOptions {
            partitions: 3,
            ..Default::default()
        },
    );
    let before = server.dump_keys();
    for (max, per, culprit) in [
        (0, 1.0, "max"),
        (5, 0.0, "per"),
        (5, f64::NAN, "per"),
        (5, -1.0, "per"),
        (5, 32.0 * 24.0 * 3600.0, "per"),
    ] {
        let err = RateLimit::new(max, per).expect_err("refused");
        assert!(err.is_invalid_input(), "{err}");
        assert!(err.to_string().contains(culprit), "{max}/{per}: {err}");
    }
    let two_for_three = RateLimit {
        max: 2,
        per: Duration::from_secs(1),
    };
    let err = q.set_rate_limit(two_for_three).expect_err("2 cannot be split 3 ways");
    assert!(
        err.is_invalid_input() && err.to_string().contains("3 partitions"),
        "{err}"
    );
    // The advice keeps the rate asked for, in a number of seconds one would type.
    assert!(err.to_string().ends_with("e.g. 3 per 1.5 s"), "{err}");
    let one_per_tenth = RateLimit::new(1, 0.1).expect("limit");
    let err = q.set_rate_limit(one_per_tenth).expect_err("1 cannot be split 3 ways");
    assert!(err.to_string().ends_with("e.g. 3 per 0.3 s"), "{err}");
    let one_a_month = RateLimit::new(1, 30.0 * 24.0 * 3600.0).expect("limit");
    let err = q.set_rate_limit(one_a_month).expect_err("1 cannot be split 3 ways");
    assert!(err.to_string().ends_with("raise max to at least 3"), "{err}");
    assert_eq!(server.dump_keys(), before, "nothing written");
    assert_eq!(q.rate_limit().expect("rate_limit"), None);

    // Split as evenly as it goes: 7 = 3 + 2 + 2, and stats reports the whole.
    let seven = RateLimit::new(7, 1.0).expect("limit");
    q.set_rate_limit(seven).expect("set");
    let mut con = server.con();
    let shares: Vec<u32> = (0..3)
        .map(|p| {
            redis::cmd("HGET")
                .arg(format!("{}:limit", q.hash_tag(p).expect("tag")))
                .arg("max")
                .query(&mut con)
                .expect("HGET")
        })
        .collect();
    assert_eq!(shares, [3, 2, 2]);
    assert_eq!(q.stats().expect("stats").rate_limit, Some(seven));
}
