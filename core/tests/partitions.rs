//! Partitioned queues on one Redis: one logical queue over several hash tags. The same
//! code runs on a cluster (tests/cluster.rs); here every partition can be inspected.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{RedisServer, StopOnDrop, assert_no_leak, run_until, wait_for};
use delayq::{Due, NewMessage, PushOptions, Queue, QueueOptions, State, Worker, WorkerOptions};
use parking_lot::Mutex;

fn partitioned(server: &RedisServer, name: &str, partitions: u32) -> Queue {
    server.queue_with(
        name,
        QueueOptions {
            partitions,
            ..Default::default()
        },
    )
}

fn keyed(key: &str) -> PushOptions {
    PushOptions {
        partition_key: Some(key.to_owned()),
        ..Default::default()
    }
}

/// The hash tags that hold keys now.
fn tags_in_use(server: &RedisServer) -> Vec<String> {
    let mut tags: Vec<String> = server
        .dump_keys()
        .iter()
        .filter_map(|k| k.split_once('}').map(|(t, _)| format!("{t}}}")))
        .collect();
    tags.sort();
    tags.dedup();
    tags
}

/// Run `worker` with one handler until `total` deliveries were seen; returns them.
fn drain(worker: &Worker, total: usize) -> Vec<(usize, serde_json::Value)> {
    run_until(
        worker,
        1,
        Duration::from_secs(30),
        |d, seen: &Mutex<Vec<_>>| {
            let payload = d.payload().map_err(|e| e.to_string())?;
            seen.lock().push((d.partition(), payload));
            Ok(())
        },
        |seen| seen.len() >= total,
    )
}

fn fast() -> WorkerOptions {
    WorkerOptions {
        idle_check: Duration::from_millis(50),
        ..Default::default()
    }
}

#[test]
fn one_queue_spreads_over_its_partitions_and_each_message_runs_once() {
    let server = RedisServer::start();
    let q = partitioned(&server, "orders", 4);
    assert_eq!(q.partitions(), 4);
    let batch: Vec<NewMessage> = (0..2000u64)
        .map(|i| NewMessage::new(&i, Duration::from_millis(i % 100)).expect("msg"))
        .collect();
    let ids = q.push_many(&batch).expect("push_many");
    assert_eq!(ids.len(), 2000);

    let tags = tags_in_use(&server);
    assert_eq!(tags.len(), 4, "{tags:?}");
    let expected: Vec<String> = (0..4).map(|p| q.hash_tag(p).expect("tag")).collect();
    let mut sorted = expected.clone();
    sorted.sort();
    assert_eq!(tags, sorted);
    let per_part: Vec<u64> = (0..4)
        .map(|p| {
            let s = q.partition_stats(p).expect("stats");
            s.scheduled + s.ready
        })
        .collect();
    assert!(per_part.iter().all(|&n| n > 350), "ids spread evenly: {per_part:?}");
    let stats = q.stats().expect("stats");
    assert_eq!(stats.scheduled + stats.ready, 2000);
    assert_eq!(stats.total("pushed"), 2000);
    assert!(q.partition_stats(4).is_err(), "partition 4 of 4 does not exist");

    // Every by-id call finds its message, whichever partition holds it.
    for id in ids.iter().take(20) {
        let info = q.get(id).expect("get").expect("known id");
        assert_eq!(&info.id, id);
    }

    let worker = Worker::new(q.clone(), fast()).expect("worker");
    let seen = drain(&worker, 2000);
    let mut values: Vec<u64> = seen.iter().map(|(_, v)| v.as_u64().expect("number")).collect();
    values.sort_unstable();
    assert_eq!(values, (0..2000).collect::<Vec<_>>(), "each message exactly once");
    let parts: BTreeMap<usize, usize> = seen.iter().fold(BTreeMap::new(), |mut m, (p, _)| {
        *m.entry(*p).or_default() += 1;
        m
    });
    assert_eq!(parts.len(), 4, "deliveries came from every partition: {parts:?}");
    for tag in expected {
        assert_no_leak(&server, &tag);
    }
    assert_eq!(q.stats().expect("stats").total("acked"), 2000);
}

#[test]
fn a_partition_key_keeps_related_messages_together_and_in_order() {
    let server = RedisServer::start();
    let q = partitioned(&server, "ordered", 3);
    let mut batch = Vec::new();
    for step in 0..50u64 {
        for customer in ["alice", "bob", "carol", "dave"] {
            batch.push(NewMessage {
                payload_json: format!(r#"{{"customer":"{customer}","step":{step}}}"#).into(),
                due: Due::NOW,
                options: keyed(customer),
            });
        }
    }
    q.push_many(&batch).expect("push_many");
    // Order within a partition holds for one fetch thread and one handler, as in any
    // queue: concurrent claims or handlers may overlap.
    let worker = Worker::new(q.clone(), WorkerOptions { threads: 1, ..fast() }).expect("worker");
    let seen = drain(&worker, 200);
    let mut by_customer: HashMap<String, (Vec<u64>, Vec<usize>)> = HashMap::new();
    for (part, v) in &seen {
        let e = by_customer
            .entry(v["customer"].as_str().expect("customer").to_owned())
            .or_default();
        e.0.push(v["step"].as_u64().expect("step"));
        e.1.push(*part);
    }
    for (customer, (steps, parts)) in by_customer {
        assert_eq!(steps, (0..50).collect::<Vec<_>>(), "{customer}: in push order");
        assert!(parts.windows(2).all(|w| w[0] == w[1]), "{customer}: one partition");
        assert_eq!(parts[0], q.partition_of("ignored", Some(&customer)));
    }
}

#[test]
fn a_busy_partition_does_not_starve_the_others() {
    let server = RedisServer::start();
    let q = partitioned(&server, "fair", 2);
    // The busy partition is 0, the one a fetcher without rotation would always pick first.
    let key_on = |part: usize| {
        (0..)
            .map(|i| format!("key-{i}"))
            .find(|k| q.partition_of("", Some(k)) == part)
            .expect("a key on each partition")
    };
    let (a, b) = (key_on(0), key_on(1));
    let a = a.as_str();
    let mut batch = Vec::new();
    for i in 0..600u64 {
        let key = if i < 500 { a } else { b.as_str() };
        batch.push(NewMessage {
            payload_json: i.to_string().into(),
            due: Due::NOW,
            options: keyed(key),
        });
    }
    q.push_many(&batch).expect("push_many");
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            threads: 1,
            batch: 10,
            ..fast()
        },
    )
    .expect("worker");
    let seen = drain(&worker, 600);
    // Claims alternate between partitions, each due partition getting an equal share of
    // the room, so the small partition's 100 messages are done after about 200
    // deliveries. A fetcher that always took the first due partition would run them
    // after the busy one's 500 (last at 599); one that rotated without sharing the room
    // fell into claims of 9 and 1 (last at 590).
    let position_of_last_small = seen.iter().rposition(|(p, _)| *p == 1).expect("small partition");
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (p, _) in &seen {
        match runs.last_mut() {
            Some((q, n)) if q == p => *n += 1,
            _ => runs.push((*p, 1)),
        }
    }
    assert!(
        position_of_last_small < 300,
        "the small partition waited: last at {position_of_last_small}; runs (partition, count): {runs:?}"
    );
}

#[test]
fn by_id_calls_and_dead_letters_work_across_partitions() {
    let server = RedisServer::start();
    let q = partitioned(&server, "admin", 3);
    // Keys send these ids away from the partition their id would pick.
    let ids: Vec<String> = (0..30)
        .map(|i| {
            q.push_json(
                i.to_string(),
                Due::In(Duration::from_secs(60)),
                &keyed(&format!("k{i}")),
            )
            .expect("push")
        })
        .collect();
    assert!(
        ids.iter()
            .enumerate()
            .any(|(i, id)| q.partition_of(id, None) != q.partition_of(id, Some(&format!("k{i}")))),
        "some message lives away from its id's partition"
    );
    for id in &ids[..10] {
        assert_eq!(q.get(id).expect("get").expect("found").state, State::Scheduled);
        assert!(q.reschedule(id, Duration::ZERO).expect("reschedule"), "{id}");
    }
    for id in &ids[10..20] {
        assert!(q.cancel(id).expect("cancel"), "{id}");
        assert!(q.get(id).expect("get").is_none());
    }
    assert!(!q.cancel("no-such-id").expect("cancel"));
    assert!(q.get("no-such-id").expect("get").is_none());

    // The ten made due now fail for good, on whichever partition they live.
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            max_attempts: 1,
            ..fast()
        },
    )
    .expect("worker");
    let calls = AtomicUsize::new(0);
    let stopper = worker.stopper();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _stop = StopOnDrop(stopper.clone());
            wait_for(Duration::from_secs(20), "ten dead letters", || {
                q.stats().is_ok_and(|st| st.dead == 10)
            });
            stopper.stop();
        });
        worker
            .run(1, |_| {
                calls.fetch_add(1, Ordering::Relaxed);
                Err("card declined".into())
            })
            .expect("run");
    });
    assert_eq!(calls.load(Ordering::Relaxed), 10);
    let dead = q.dead_letters(100).expect("dead letters");
    assert_eq!(dead.len(), 10);
    assert!(
        dead.windows(2).all(|w| w[0].dead_at_ms >= w[1].dead_at_ms),
        "newest first"
    );
    assert_eq!(q.dead_letters(4).expect("dead letters").len(), 4);
    assert_eq!(q.requeue_dead(Some(&ids[0])).expect("requeue one"), 1);
    assert_eq!(q.requeue_dead(None).expect("requeue the rest"), 9);
    let stats = q.stats().expect("stats");
    assert_eq!((stats.dead, stats.ready, stats.scheduled), (0, 10, 10));
    assert_eq!(q.purge().expect("purge"), 20);
    assert!(
        server
            .dump_keys()
            .iter()
            // Counters, the pools' note of when they last ran (see include/stall.lua), their
            // per-minute records (see metrics.rs) and the registry of queues (registry.rs).
            .all(|k| k.ends_with(":stats")
                || k.ends_with(":seq")
                || k.ends_with(":control")
                || k.ends_with(":minutes")
                || k == "dq:queues")
    );
}

#[test]
fn an_idle_pool_sleeps_on_every_partition_and_wakes_for_any() {
    let server = RedisServer::start();
    let q = partitioned(&server, "idle", 4);
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            // Only a producer's announcement can wake the pool this early.
            idle_check: Duration::from_secs(30),
            ..Default::default()
        },
    )
    .expect("worker");
    let seen = Mutex::new(Vec::new());
    let stopper = worker.stopper();
    let commands = |server: &RedisServer| -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut server.con())
            .expect("INFO");
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| l.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
            .sum()
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            let _stop = StopOnDrop(stopper.clone());
            // Let the pool look once at every partition, then count its calls.
            std::thread::sleep(Duration::from_millis(500));
            let before = commands(&server);
            std::thread::sleep(Duration::from_secs(2));
            let idle_calls = commands(&server) - before;
            assert!(idle_calls <= 1, "an idle pool called {idle_calls} scripts in 2 s");
            // One message on each partition, each well before idle_check.
            for key in ["a", "b", "c", "d", "e", "f", "g", "h"] {
                q.push_json(format!("\"{key}\""), Due::In(Duration::from_millis(100)), &keyed(key))
                    .expect("push");
            }
            wait_for(Duration::from_secs(10), "woken by the announcements", || {
                seen.lock().len() == 8
            });
            stopper.stop();
        });
        worker
            .run(1, |d| {
                seen.lock().push(d.partition());
                Ok(())
            })
            .expect("run");
    });
    let mut parts = seen.into_inner();
    parts.sort_unstable();
    parts.dedup();
    assert!(
        parts.len() >= 3,
        "messages on several partitions woke the pool: {parts:?}"
    );
}

#[test]
fn partition_keys_are_validated_before_anything_is_written() {
    let server = RedisServer::start();
    let q = partitioned(&server, "bad", 2);
    for bad in [String::new(), "a\nb".into(), "x".repeat(201)] {
        let err = q.push_json("1", Due::NOW, &keyed(&bad)).expect_err("bad key");
        assert!(err.to_string().starts_with("invalid partition_key"), "{err}");
    }
    let batch = vec![
        NewMessage::new(&1, Due::NOW).expect("msg"),
        NewMessage {
            payload_json: "2".into(),
            due: Due::NOW,
            options: keyed(""),
        },
    ];
    let err = q.push_many(&batch).expect_err("bad item");
    assert!(err.to_string().starts_with("invalid partition_key of item 1"), "{err}");
    assert!(server.dump_keys().is_empty(), "{:?}", server.dump_keys());
}

#[test]
fn a_push_that_no_replica_confirms_says_so() {
    let server = RedisServer::start();
    let q = server.queue_with(
        "durable",
        QueueOptions {
            wait_replicas: 1,
            wait_timeout: Duration::from_millis(100),
            ..Default::default()
        },
    );
    let err = q
        .push_json(
            "1",
            Due::NOW,
            &PushOptions {
                id: Some("order-1".into()),
                ..Default::default()
            },
        )
        .expect_err("this server has no replica");
    assert!(err.is_timeout(), "{err:?}");
    assert!(err.to_string().contains("0 of 1 replicas"), "{err}");
    // It is on the master; pushing again with the same id creates nothing new.
    assert_eq!(
        q.get("order-1").expect("get").expect("on the master").state,
        State::Ready
    );
    let many: Vec<NewMessage> = (0..3).map(|i| NewMessage::new(&i, Due::NOW).expect("msg")).collect();
    assert!(q.push_many(&many).expect_err("no replica").is_timeout());
}
