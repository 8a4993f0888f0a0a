//! Groups: at most a group's concurrency limit of its messages run at once, on every
//! pool; the others wait in its line and start as running ones end.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{RedisServer, StopOnDrop, assert_no_leak, hung_consumer, receive, wait_for};
use delayq::{Error, GroupLimit, Layout, NewMessage, PushOptions, QueueOptions, Received, Worker, WorkerOptions};
use parking_lot::Mutex;
use serde_json::json;

fn grouped(n: u64, group: &str) -> NewMessage {
    let mut m = NewMessage::new(&json!({"n": n, "group": group}), Duration::ZERO).expect("message");
    m.options.group = Some(group.to_owned());
    m
}

fn nothing_for(c: &delayq::Consumer, wait: Duration) {
    match c.recv_timeout(wait) {
        Received::Idle => {}
        Received::Message(d) => panic!("expected nothing, got {:?} of group {:?}", d.id, d.group),
        Received::Stopped => panic!("stopped"),
    }
}

/// What is left of groups' bookkeeping (running counts, lines) once all ended.
fn group_bookkeeping(server: &RedisServer) -> Vec<String> {
    server
        .dump_keys()
        .into_iter()
        .filter(|k| k.contains(":serial_"))
        .collect()
}

/// Two pools of 4 handlers drain `batch`; returns the most of each group that ran at
/// once, and how many ran in all.
fn drain(q: &delayq::Queue, count: usize) -> (BTreeMap<String, usize>, usize) {
    let running: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());
    let most: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());
    let done = Mutex::new(0usize);
    let workers: Vec<Worker> = (0..2)
        .map(|_| {
            Worker::new(
                q.clone(),
                WorkerOptions {
                    threads: 2,
                    lease: Duration::from_secs(60),
                    ..WorkerOptions::default()
                },
            )
            .expect("worker")
        })
        .collect();
    std::thread::scope(|s| {
        let _stops: Vec<StopOnDrop> = workers.iter().map(|w| StopOnDrop(w.stopper())).collect();
        for w in &workers {
            let (running, most, done) = (&running, &most, &done);
            s.spawn(move || {
                w.run(4, |d| {
                    let group = d.group.clone().unwrap_or_default();
                    {
                        let mut r = running.lock();
                        let now = r.entry(group.clone()).or_default();
                        *now += 1;
                        let m = *now;
                        let mut most = most.lock();
                        let top = most.entry(group.clone()).or_default();
                        *top = (*top).max(m);
                    }
                    std::thread::sleep(Duration::from_millis(40));
                    *running.lock().get_mut(&group).expect("running") -= 1;
                    *done.lock() += 1;
                    Ok(())
                })
                .expect("run")
            });
        }
        wait_for(Duration::from_secs(30), "every message run", || *done.lock() == count);
    });
    let n = *done.lock();
    (most.into_inner(), n)
}

#[test]
fn at_most_a_groups_limit_runs_at_once_across_pools_and_other_groups_go_on() {
    let server = RedisServer::start();
    let q = server.queue("groups");
    q.set_group_limit(Some("merchant-1"), GroupLimit::concurrency(2).expect("limit"))
        .expect("set_group_limit");
    let batch: Vec<NewMessage> = (0..24u64)
        .map(|n| grouped(n, ["merchant-1", "merchant-2"][(n % 2) as usize]))
        .collect();
    q.push_many(&batch).expect("push");
    let (most, n) = drain(&q, 24);
    assert_eq!(n, 24);
    assert_eq!(most["merchant-1"], 2, "the limit, and no more: {most:?}");
    assert!(
        most["merchant-2"] > 2,
        "a group without a limit runs side by side: {most:?}"
    );
    assert_eq!(q.stats().expect("stats").totals["acked"], 24);
    assert_no_leak(&server, "{dq:groups}");
    let left = group_bookkeeping(&server);
    assert!(left.is_empty(), "group bookkeeping left behind: {left:?}");
}

#[test]
fn the_default_limit_holds_every_group_without_its_own() {
    let server = RedisServer::start();
    let q = server.queue("groups-default");
    q.set_group_limit(None, GroupLimit::concurrency(1).expect("limit"))
        .expect("default");
    q.set_group_limit(Some("vip"), GroupLimit::concurrency(3).expect("limit"))
        .expect("vip");
    let batch: Vec<NewMessage> = (0..24u64)
        .map(|n| grouped(n, ["a", "b", "vip"][(n % 3) as usize]))
        .collect();
    q.push_many(&batch).expect("push");
    let (most, n) = drain(&q, 24);
    assert_eq!(n, 24);
    assert_eq!((most["a"], most["b"], most["vip"]), (1, 1, 3), "{most:?}");
    // Cleared, the default no longer holds a group back.
    q.set_group_limit(None, GroupLimit::none()).expect("clear");
    q.push_many(&(0..8u64).map(|n| grouped(n, "a")).collect::<Vec<_>>())
        .expect("push");
    let (most, _) = drain(&q, 8);
    assert!(most["a"] > 1, "{most:?}");
    assert_no_leak(&server, "{dq:groups-default}");
}

#[test]
fn a_raised_limit_starts_held_messages_at_once_and_ends_free_places() {
    let server = RedisServer::start();
    let q = server.queue("groups-raise");
    q.set_group_limit(Some("g"), GroupLimit::concurrency(1).expect("limit"))
        .expect("limit");
    q.push_many(&(0..3u64).map(|n| grouped(n, "g")).collect::<Vec<_>>())
        .expect("push");
    // A long lease: a message that waited out a lease would not come within the test's
    // waits.
    let opts = WorkerOptions {
        lease: Duration::from_secs(60),
        backoff_base: Duration::from_millis(1),
        backoff_max: Duration::from_millis(1),
        ..WorkerOptions::default()
    };
    let c = Worker::new(q.clone(), opts)
        .and_then(|w| w.start_with(3))
        .expect("worker");
    let first = receive(&c);
    assert_eq!(first.group.as_deref(), Some("g"));
    nothing_for(&c, Duration::from_millis(300));
    let info = q.get(&first.id).expect("get").expect("known");
    assert_eq!(info.group.as_deref(), Some("g"));
    assert_eq!(q.stats().expect("stats").held, 2);
    for waiting in q.list(delayq::Listing::Waiting, 10).expect("list") {
        let info = q.get(&waiting.id).expect("get").expect("known");
        assert_eq!(
            (info.state, info.held.as_deref()),
            (
                delayq::State::Ready,
                Some("group \"g\" runs 1 of its concurrency limit of 1")
            ),
        );
    }
    assert_eq!(q.get(&first.id).expect("get").expect("known").held, None);
    q.set_group_limit(Some("g"), GroupLimit::concurrency(3).expect("limit"))
        .expect("raise");
    let second = receive(&c);
    let third = receive(&c);
    // A failure frees its place as an acknowledgement does: its retry runs.
    c.fail(second, "the partner timed out");
    let retry = receive(&c);
    assert_eq!(retry.attempt, 2);
    for d in [first, third, retry] {
        c.ack(d);
    }
    let s = c.finish();
    assert_eq!((s.acked, s.retried), (3, 1));
    assert_no_leak(&server, "{dq:groups-raise}");
    let left = group_bookkeeping(&server);
    assert!(left.is_empty(), "group bookkeeping left behind: {left:?}");
}

#[test]
fn a_lease_that_ends_unacknowledged_frees_its_place() {
    let server = RedisServer::start();
    let q = server.queue("groups-crash");
    q.set_group_limit(Some("g"), GroupLimit::concurrency(1).expect("limit"))
        .expect("limit");
    q.push_many(&(0..2u64).map(|n| grouped(n, "g")).collect::<Vec<_>>())
        .expect("push");
    // Consumer A takes the first and hangs: its lease runs out.
    let ca = hung_consumer(&q);
    let held = receive(&ca);
    let cb = Worker::new(q.clone(), WorkerOptions::default())
        .and_then(|w| w.start_with(2))
        .expect("worker b");
    wait_for(Duration::from_secs(5), "the other in its group's line", || {
        q.stats().expect("stats").held == 1
    });
    // The expired one's redelivery and the next in line, one after the other (both
    // due now: the older first).
    let mut seen = Vec::new();
    for _ in 0..2 {
        let d = receive(&cb);
        seen.push((d.id.clone(), d.attempt));
        nothing_for(&cb, Duration::from_millis(200));
        cb.ack(d);
    }
    seen.sort();
    assert_eq!(seen[0], (held.id.clone(), 2), "{seen:?}");
    assert_eq!(seen[1].1, 1, "{seen:?}");
    ca.ack(held);
    assert_eq!(ca.finish().lease_lost, 1);
    assert_eq!(cb.finish().acked, 2);
    assert_no_leak(&server, "{dq:groups-crash}");
    let left = group_bookkeeping(&server);
    assert!(left.is_empty(), "group bookkeeping left behind: {left:?}");
}

#[test]
fn bad_groups_and_limits_are_refused_and_write_nothing() {
    let server = RedisServer::start();
    let q = server.queue("groups-bad");
    let cases = [
        (
            PushOptions {
                group: Some(String::new()),
                ..Default::default()
            },
            "group",
        ),
        (
            PushOptions {
                group: Some("a\nb".into()),
                ..Default::default()
            },
            "group",
        ),
        (
            PushOptions {
                group: Some("g".into()),
                serial_key: Some("k".into()),
                ..Default::default()
            },
            "group",
        ),
        (
            PushOptions {
                group: Some("g".into()),
                partition_key: Some("p".into()),
                ..Default::default()
            },
            "partition_key",
        ),
    ];
    for (options, named) in cases {
        let mut m = NewMessage::new(&json!(1), Duration::ZERO).expect("message");
        m.options = options.clone();
        let err = q.push_many(&[m]).expect_err("refused");
        assert!(
            matches!(&err, Error::InvalidArgument { name, .. } if name == named),
            "{options:?}: {err}"
        );
    }
    assert!(matches!(
        GroupLimit::concurrency(0),
        Err(Error::InvalidArgument { name, .. }) if name == "concurrency"
    ));
    assert!(matches!(
        q.set_group_limit(Some(""), GroupLimit::none()),
        Err(Error::InvalidArgument { name, .. }) if name == "group"
    ));
    let seed = server.queue_with(
        "seed",
        QueueOptions {
            layout: Layout::Seed {
                zset_key: "delay:queue".into(),
                payload_key: "delay:payloads".into(),
            },
            ..QueueOptions::default()
        },
    );
    let mut m = NewMessage::new(&json!(1), Duration::ZERO).expect("message");
    m.options.group = Some("g".into());
    assert!(matches!(seed.push_many(&[m]), Err(Error::InvalidArgument { name, .. }) if name == "group"));
    assert!(server.dump_keys().is_empty(), "{:?}", server.dump_keys());
}

#[test]
fn on_a_partitioned_queue_a_group_and_its_limit_live_in_one_partition() {
    let server = RedisServer::start();
    let q = server.queue_with(
        "groups-parts",
        QueueOptions {
            partitions: 4,
            ..QueueOptions::default()
        },
    );
    q.set_group_limit(Some("g"), GroupLimit::concurrency(1).expect("limit"))
        .expect("limit");
    q.push_many(&(0..12u64).map(|n| grouped(n, "g")).collect::<Vec<_>>())
        .expect("push");
    let (most, n) = drain(&q, 12);
    assert_eq!((most["g"], n), (1, 12));
}

#[test]
fn a_groups_rate_limit_holds_its_starts_in_every_window_and_no_other_groups() {
    let server = RedisServer::start();
    let q = server.queue("groups-rate");
    let rate = delayq::RateLimit::new(3, 1.0).expect("rate");
    assert!(
        !q.set_group_limit(Some("partner"), GroupLimit::rate(rate))
            .expect("limit")
    );
    assert!(
        q.set_group_limit(Some("partner"), GroupLimit::rate(rate))
            .expect("again")
    );
    let batch: Vec<NewMessage> = (0..12u64)
        .map(|n| grouped(n, if n < 9 { "partner" } else { "other" }))
        .collect();
    q.push_many(&batch).expect("push");
    let starts: Mutex<Vec<(String, std::time::Instant)>> = Mutex::new(Vec::new());
    let worker = Worker::new(q.clone(), WorkerOptions::default()).expect("worker");
    let first = std::time::Instant::now();
    std::thread::scope(|s| {
        let _stop = StopOnDrop(worker.stopper());
        s.spawn(|| {
            worker
                .run(4, |d| {
                    starts
                        .lock()
                        .push((d.group.clone().unwrap_or_default(), std::time::Instant::now()));
                    Ok(())
                })
                .expect("run")
        });
        wait_for(Duration::from_secs(10), "every message run", || {
            starts.lock().len() == 12
        });
    });
    let starts = starts.into_inner();
    let partner: Vec<_> = starts.iter().filter(|(g, _)| g == "partner").map(|(_, t)| *t).collect();
    // The fourth start after any start comes a window later (less what the handlers'
    // clocks may add between a claim and a start).
    for pair in partner.windows(4) {
        let gap = pair[3] - pair[0];
        assert!(gap >= Duration::from_millis(900), "4 starts within {gap:?}");
    }
    let other = starts
        .iter()
        .filter(|(g, _)| g == "other")
        .map(|(_, t)| *t - first)
        .max();
    assert!(
        other.expect("other ran") < Duration::from_millis(900),
        "another group waited: {other:?}"
    );
    assert_no_leak(&server, "{dq:groups-rate}");
}

#[test]
fn a_long_backlog_of_one_group_does_not_hold_up_the_others() {
    let server = RedisServer::start();
    let q = server.queue("groups-fair");
    // As many as the pool's handlers: the big group keeps them all busy.
    q.set_group_limit(None, GroupLimit::concurrency(4).expect("limit"))
        .expect("default");
    // The big group's backlog is due first; 20 small groups come after it.
    let mut batch: Vec<NewMessage> = (0..1000u64).map(|n| grouped(n, "big")).collect();
    batch.extend((0..40u64).map(|n| grouped(n, &format!("small-{}", n % 20))));
    for chunk in batch.chunks(1000) {
        q.push_many(chunk).expect("push");
    }
    let order: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let worker = Worker::new(q.clone(), WorkerOptions::default()).expect("worker");
    std::thread::scope(|s| {
        let _stop = StopOnDrop(worker.stopper());
        s.spawn(|| {
            worker
                .run(4, |d| {
                    order.lock().push(d.group.clone().unwrap_or_default());
                    // Long enough that the pool prefetches nothing: each claim is for
                    // a handler that frees, and asks for few messages.
                    std::thread::sleep(Duration::from_millis(60));
                    Ok(())
                })
                .expect("run")
        });
        wait_for(Duration::from_secs(20), "the small groups run", || {
            order.lock().iter().filter(|g| g.starts_with("small")).count() == 40
        });
    });
    let order = order.into_inner();
    let last_small = order.iter().rposition(|g| g.starts_with("small")).expect("small ran");
    let big_before = order[..last_small].iter().filter(|g| *g == "big").count();
    assert!(
        big_before < 100,
        "{big_before} of the big group ran before the small groups were through"
    );
}

#[test]
fn get_says_why_a_message_of_a_group_waits() {
    let server = RedisServer::start();
    let q = server.queue("groups-held");
    let rate = delayq::RateLimit::new(1, 60.0).expect("rate");
    q.set_group_limit(Some("partner"), GroupLimit::rate(rate))
        .expect("limit");
    q.push_many(&(0..3u64).map(|n| grouped(n, "partner")).collect::<Vec<_>>())
        .expect("push");
    let c = Worker::new(q.clone(), WorkerOptions::default())
        .and_then(|w| w.start_with(2))
        .expect("worker");
    let d = receive(&c);
    wait_for(Duration::from_secs(5), "the others held", || {
        q.stats().expect("stats").held == 2
    });
    let why = "group \"partner\" started 1 in its rate limit's window (1 per 1 min 0 s)";
    for waiting in q.list(delayq::Listing::Waiting, 10).expect("list") {
        assert_eq!(waiting.held.as_deref(), Some(why), "the listing says why too");
        let info = q.get(&waiting.id).expect("get").expect("known");
        assert_eq!((info.state, info.held.as_deref()), (delayq::State::Ready, Some(why)));
    }
    c.ack(d);
    c.finish();
}
