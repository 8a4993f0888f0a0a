//! delayq behind Redis Sentinel, with a master, a replica and sentinels started here: a
//! `redis+sentinel://` URL finds the master, follows a crash failover without losing a
//! message a replica confirmed, and leaves a replaced master at once, before Sentinel
//! demotes it.

mod common;

use std::time::{Duration, Instant};

use common::{Sentinels, StopOnDrop, consume_until, is_master, push_numbered_retrying, wait_for};
use delayq::{ConnectOptions, Due, Error, PushOptions, Queue, QueueOptions, Worker, WorkerOptions};
use parking_lot::Mutex;

fn connect_opts() -> ConnectOptions {
    ConnectOptions {
        // Long enough to ride out a failover (down after 2 s, then the election).
        retry_timeout: Duration::from_secs(20),
        connect_timeout: Duration::from_millis(500),
        read_timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

fn sentinel_queue(url: &str, name: &str, wait_replicas: u32) -> Queue {
    Queue::new(
        url,
        name,
        QueueOptions {
            connect: connect_opts(),
            wait_replicas,
            ..Default::default()
        },
    )
    .expect("sentinel queue")
}

fn worker(q: &Queue) -> Worker {
    Worker::new(
        q.clone(),
        WorkerOptions {
            lease: Duration::from_secs(2),
            ..Default::default()
        },
    )
    .expect("worker")
}

#[test]
fn a_crash_failover_loses_nothing_that_a_replica_confirmed() {
    let mut set = Sentinels::start(2);
    let q = sentinel_queue(&set.url(), "crash", 1);
    let old_master = set.master.port;
    assert_eq!(set.named_master(), Some(old_master));
    let total = 3000u64;
    let w = worker(&q);
    let set_ref = Mutex::new(&mut set);
    let seen = std::thread::scope(|s| {
        let producer = s.spawn(|| {
            for i in 0..total {
                if i == 1000 {
                    let mut set = set_ref.lock();
                    set.master.kill();
                    let promoted = set.replica.port;
                    wait_for(Duration::from_secs(30), "the sentinels promote the replica", || {
                        set.named_master() == Some(promoted)
                    });
                    // Back as a replica of the new master, so that a push can be
                    // confirmed again (WAIT 1).
                    set.master.restart();
                }
                push_numbered_retrying(&q, i);
            }
        });
        let seen = consume_until(&w, |seen| producer.is_finished() && seen.len() as u64 >= total);
        producer.join().expect("producer");
        seen
    });
    let lost: Vec<u64> = (0..total).filter(|i| !seen.contains_key(i)).collect();
    assert!(lost.is_empty(), "lost although a replica confirmed them: {lost:?}");
    let twice = seen.values().filter(|&&n| n > 1).count();
    #[expect(
        clippy::print_stderr,
        reason = "the measured duplicates are reported in docs/RELIABILITY.md"
    )]
    {
        eprintln!("sentinel crash failover: {total} pushed, 0 lost, {twice} handled twice");
    }
    let stats = q.stats().expect("stats on the new master");
    assert_eq!(stats.ready + stats.scheduled + stats.inflight, 0, "{stats:?}");
}

#[test]
fn producers_and_pools_leave_a_replaced_master_before_sentinel_demotes_it() {
    let set = Sentinels::start(1);
    let url = set.url();
    // Separate queues, so that the producer learns of the failover by itself.
    let producer = sentinel_queue(&url, "manual", 0);
    let consumer_side = sentinel_queue(&url, "manual", 0);
    producer
        .push_json("0", Due::In(Duration::ZERO), &PushOptions::default())
        .expect("push before");
    let old = set.master.port;
    let new = set.replica.port;
    // Only the wake-ups that producers publish can start it: they reach the pool only
    // if its subscription left the old master when the sentinel announced the new one.
    let w = Worker::new(
        consumer_side.clone(),
        WorkerOptions {
            idle_check: Duration::from_secs(60),
            ..Default::default()
        },
    )
    .expect("worker");
    let stopper = w.stopper();
    let seen: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        s.spawn(|| {
            let _stop = StopOnDrop(stopper.clone());
            wait_for(Duration::from_secs(10), "the first message handled", || !seen.lock().is_empty());
            set.failover();
            wait_for(Duration::from_secs(10), "the sentinel names the replica", || {
                set.named_master() == Some(new)
            });
            // A producer asks its sentinel at most once a second.
            std::thread::sleep(Duration::from_millis(1100));
            for i in 1..=100 {
                push_numbered_retrying(&producer, i);
            }
            wait_for(Duration::from_secs(10), "the pool ran them on the new master", || {
                seen.lock().len() >= 101
            });
            assert!(
                is_master(&set.master),
                "the old master was demoted before the pool ran what was pushed after the failover: the pool did not follow the sentinel's announcement (or Sentinel demoted it unusually fast)"
            );
            stopper.stop();
        });
        w.run(2, |d| {
            seen.lock().push(d.payload().map_err(|e| e.to_string())?);
            Ok(())
        })
        .expect("run");
    });
    let mut old_con = set.master.con();
    let on_old: u64 = redis::cmd("HLEN")
        .arg("{dq:manual}:messages")
        .query(&mut old_con)
        .expect("HLEN");
    let keys_new: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut set.replica.con()).expect("KEYS");
    assert!(keys_new.iter().any(|k| k.starts_with("{dq:manual}")), "{keys_new:?}");
    assert_eq!(on_old, 0, "a push after the failover went to the old master {old}");
    let mut handled = seen.into_inner();
    handled.sort_unstable();
    handled.dedup();
    assert_eq!(handled, (0..=100).collect::<Vec<_>>());
}

#[test]
fn passwords_for_the_master_and_the_sentinels_go_where_they_belong() {
    let set = Sentinels::start_with_passwords(1, Some("node-secret"), Some("sentinel-secret"));
    let hosts = format!("127.0.0.1:{}", set.ports[0]);
    let good = format!("redis+sentinel://:node-secret@{hosts}/mymaster/2?sentinel_password=sentinel-secret");
    let q = sentinel_queue(&good, "auth", 0);
    let id = q
        .push_json("1", Due::In(Duration::ZERO), &PushOptions::default())
        .expect("push");
    assert!(q.get(&id).expect("get").is_some());
    let mut con = set.master.con();
    let _: () = redis::cmd("SELECT").arg(2).query(&mut con).expect("SELECT");
    let n: u64 = redis::cmd("HLEN")
        .arg("{dq:auth}:messages")
        .query(&mut con)
        .expect("HLEN");
    assert_eq!(n, 1, "the URL's database is the master's");

    let wrong_node = format!("redis+sentinel://:wrong@{hosts}/mymaster?sentinel_password=sentinel-secret");
    let err = sentinel_queue(&wrong_node, "auth", 0)
        .ping()
        .expect_err("wrong master password");
    assert!(matches!(err, Error::AuthFailed(_)), "{err:?}");
    let wrong_sentinel = format!("redis+sentinel://:node-secret@{hosts}/mymaster?sentinel_password=wrong");
    let err = sentinel_queue(&wrong_sentinel, "auth", 0)
        .ping()
        .expect_err("wrong sentinel password");
    assert!(matches!(err, Error::AuthFailed(_)), "{err:?}");
    assert!(!err.to_string().contains("sentinel-secret"), "{err}");

    // A database the master lacks: refused at the first connect, not retried.
    let no_db = format!("redis+sentinel://:node-secret@{hosts}/mymaster/99?sentinel_password=sentinel-secret");
    let started = Instant::now();
    let err = sentinel_queue(&no_db, "auth", 0).ping().expect_err("database 99");
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
    assert!(err.to_string().contains("database 99"), "{err}");
    assert!(!err.to_string().contains("secret"), "{err}");
}

/// A queue that gives up reconnecting after 300 ms.
fn impatient(url: &str) -> Queue {
    Queue::new(
        url,
        "x",
        QueueOptions {
            connect: ConnectOptions {
                retry_timeout: Duration::from_millis(300),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .expect("parses")
}

#[test]
fn an_unknown_master_name_or_unreachable_sentinels_fail_with_a_clear_error() {
    let set = Sentinels::start(1);
    let url = set.url().replace("/mymaster", "/nosuchmaster");
    let q = impatient(&url);
    let err = q.ping().expect_err("no such master");
    assert!(err.is_connection(), "{err:?}");
    assert!(
        err.to_string().contains("knows no master named \"nosuchmaster\""),
        "{err}"
    );

    let dead = format!("redis+sentinel://127.0.0.1:{}/mymaster", common::free_port());
    let q = impatient(&dead);
    let started = Instant::now();
    let err = q.ping().expect_err("no sentinel");
    assert!(err.is_connection(), "{err:?}");
    assert!(err.to_string().contains("sentinel 127.0.0.1:"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "gave up after {:?}",
        started.elapsed()
    );
}

#[test]
fn malformed_sentinel_urls_are_refused_before_connecting() {
    for (url, needle) in [
        ("redis+sentinel://127.0.0.1:26379", "names the master"),
        ("redis+sentinel:///mymaster", "at least one sentinel"),
        ("redis+sentinel://127.0.0.1:26379/mymaster/x", "must be a number"),
        (
            "redis+sentinel://127.0.0.1:26379/mymaster/0/extra",
            "unexpected \"extra\"",
        ),
        (
            "redis+sentinel://h:26379/mymaster?sentinel_pasword=x",
            "unknown query parameter \"sentinel_pasword\"",
        ),
    ] {
        let err = Queue::new(url, "x", QueueOptions::default()).expect_err(url);
        assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
        assert!(err.to_string().contains(needle), "{url}: {err}");
    }
    let err = Queue::new(
        "redis+sentinel://:pw@h:26379/mymaster?sentinel_password=secret",
        "x",
        QueueOptions {
            connect: ConnectOptions {
                tls_ca_file: Some("/nonexistent".into()),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .expect_err("a CA file without TLS");
    assert!(err.to_string().contains("only applies to rediss://"), "{err}");
    // The sentinel's password never shows in messages.
    let err = Queue::new(
        "redis+sentinel://h:26379/mymaster?sentinel_password=secret&x=1",
        "x",
        QueueOptions::default(),
    )
    .expect_err("unknown parameter");
    assert!(!err.to_string().contains("secret"), "{err}");
}
