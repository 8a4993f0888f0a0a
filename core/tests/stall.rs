//! A Redis that stands still longer than a lease (CLIENT PAUSE, DEBUG SLEEP, a long
//! fork) must not make a claim reap the leases of live holders, which had no chance
//! to renew them: no message runs twice at the same time. A pool that really died is
//! still re-delivered.

mod common;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{RedisServer, Runs, StopOnDrop, timed_run, wait_for};
use delayq::{Worker, WorkerOptions};
use serde_json::json;

fn opts() -> WorkerOptions {
    WorkerOptions {
        threads: 1,
        lease: Duration::from_millis(1200),
        ..WorkerOptions::default()
    }
}

#[test]
fn a_redis_pause_longer_than_the_lease_runs_nothing_twice_at_once() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    // Two busy pools, one message each; an idle pool beside them.
    let busy: Vec<Worker> = (0..2)
        .map(|_| Worker::new(q.clone(), opts()).expect("worker"))
        .collect();
    let idle = Worker::new(q.clone(), opts()).expect("worker");
    // id -> (starts, ends) of handler runs.
    let runs: Runs = Mutex::new(HashMap::new());
    let handler = |d: &delayq::Delivery| {
        timed_run(&runs, &d.id, || std::thread::sleep(Duration::from_millis(4000)));
        Ok(())
    };
    std::thread::scope(|s| {
        let _stops: Vec<StopOnDrop> = busy.iter().chain([&idle]).map(|w| StopOnDrop(w.stopper())).collect();
        for w in &busy {
            s.spawn(|| w.run(1, handler).expect("run"));
        }
        wait_for(Duration::from_secs(10), "the busy pools listed", || {
            q.workers().is_ok_and(|w| w.len() == 2)
        });
        for n in 0..2 {
            q.push(&json!({"n": n}), Duration::ZERO).expect("push");
        }
        wait_for(Duration::from_secs(10), "both messages running", || {
            runs.lock().expect("lock").len() == 2
        });
        s.spawn(|| idle.run(1, handler).expect("run"));
        wait_for(Duration::from_secs(10), "the idle pool listed", || {
            q.workers().is_ok_and(|w| w.len() == 3)
        });
        // Redis stands still for 3 s: every lease (1.2 s) passes its deadline unrenewed.
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(3000)
            .query(&mut server.con())
            .expect("CLIENT PAUSE");
        wait_for(Duration::from_secs(20), "both messages handled", || {
            q.stats().is_ok_and(|st| st.inflight + st.ready + st.scheduled == 0)
        });
        for w in busy.iter().chain([&idle]) {
            w.stop();
        }
    });
    let runs = runs.into_inner().expect("lock");
    for (id, list) in &runs {
        assert_eq!(list.len(), 1, "{id} ran {} times: {list:?}", list.len());
    }
    let stats = q.stats().expect("stats");
    assert_eq!((stats.total("acked"), stats.total("expired")), (2, 0), "{stats:?}");
}

#[test]
fn a_pool_that_died_is_still_redelivered_after_a_pause() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    let id = q.push(&json!({"n": 1}), Duration::ZERO).expect("push");
    // A pool that claimed it and died: its lease (1.2 s) is in the in-flight set, and
    // nothing will renew it. Claimed by a pool that starts and is then stopped without
    // writing its completion: a consumer kept from finishing.
    let mut con = server.con();
    let score: f64 = redis::cmd("ZSCORE")
        .arg("{dq:orders}:scheduled")
        .arg(&id)
        .query(&mut con)
        .expect("ZSCORE");
    let deadline = server.now_ms() + 1200;
    let _: () = redis::pipe()
        .atomic()
        .cmd("ZREM")
        .arg("{dq:orders}:scheduled")
        .arg(&id)
        .ignore()
        .cmd("ZADD")
        .arg("{dq:orders}:inflight")
        .arg(deadline)
        .arg(&id)
        .ignore()
        .cmd("HSET")
        .arg("{dq:orders}:leases")
        .arg(&id)
        .arg(format!("99:{score}"))
        .ignore()
        .cmd("HSET")
        .arg("{dq:orders}:control")
        .arg("seen_ms")
        .arg(server.now_ms())
        .arg("stall_ms")
        .arg(600)
        .ignore()
        .query(&mut con)
        .expect("a claim by hand");
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(2000)
        .query(&mut con)
        .expect("CLIENT PAUSE");
    let started = Instant::now();
    let handled = Mutex::new(Vec::new());
    let live = Worker::new(q.clone(), opts()).expect("worker");
    let stopper = live.stopper();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _stop = StopOnDrop(stopper.clone());
            wait_for(Duration::from_secs(15), "the message handled", || {
                !handled.lock().expect("lock").is_empty()
            });
        });
        live.run(1, |d| {
            handled.lock().expect("lock").push(d.id.clone());
            Ok(())
        })
        .expect("run");
    });
    assert_eq!(handled.into_inner().expect("lock"), [id]);
    // The pause, then one heartbeat of grace (0.4 s) and a claim.
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}
