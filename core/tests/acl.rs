//! Least privilege: a Redis ACL user that may touch only one queue's keys and
//! channel, and run only the commands delayq needs, works end to end; the same user
//! is refused on another queue. The rule is the one `Queue::acl_rule` prints (and
//! `delayq acl`), which the docs recommend.

mod common;

use std::time::Duration;

use common::{RedisServer, StopOnDrop, wait_for};
use delayq::{Error, NewMessage, Queue, QueueOptions, Worker, WorkerOptions};
use serde_json::json;

/// Runs `rule` (as `Queue::acl_rule` prints it) with PASSWORD replaced.
fn set_user(admin: &mut redis::Connection, rule: &str, password: &str) {
    let words: Vec<String> = rule
        .split_whitespace()
        .map(|w| {
            if w == ">PASSWORD" {
                format!(">{password}")
            } else {
                w.to_owned()
            }
        })
        .collect();
    assert_eq!(words[..2], ["ACL".to_owned(), "SETUSER".to_owned()], "{rule}");
    let mut cmd = redis::cmd("ACL");
    for w in &words[1..] {
        cmd.arg(w);
    }
    let _: () = cmd.query(admin).expect("ACL SETUSER");
}

#[test]
fn a_user_limited_to_one_queue_and_the_needed_commands_works_end_to_end() {
    let server = RedisServer::start();
    let mut admin = server.con();
    // The rule the queue prints for itself, as `delayq acl` does.
    let rule = server.queue("orders").acl_rule("orders-app");
    // Channel rules came with Redis 6.2; before it the rule goes without them.
    assert_eq!(
        rule.contains("resetchannels &{dq:orders}:wake"),
        server.version() >= (6, 2),
        "{rule}"
    );
    if server.version() >= (6, 2) {
        let docs = include_str!("../../docs/RELIABILITY.md");
        let documented = docs.lines().find(|l| l.starts_with("ACL SETUSER orders-app "));
        assert_eq!(
            documented,
            Some(rule.as_str()),
            "docs/RELIABILITY.md shows another rule"
        );
    }
    set_user(&mut admin, &rule, "s3cret");
    let url = format!("redis://orders-app:s3cret@127.0.0.1:{}", server.port);
    let q = Queue::new(&url, "orders", QueueOptions::default()).expect("queue");

    // Producer side.
    let first = q.push(&json!({"order_id": 1}), Duration::ZERO).expect("push");
    let ids = q
        .push_many(
            &(2..=5)
                .map(|i| {
                    // One serial key: the claims below put them in its line and take
                    // them out, one by one.
                    let mut m = NewMessage::new(&json!({"order_id": i}), Duration::ZERO).expect("msg");
                    m.options.serial_key = Some("customer-7".into());
                    m
                })
                .collect::<Vec<_>>(),
        )
        .expect("push_many");
    let later = q
        .push(&json!({"order_id": 6}), Duration::from_secs(3600))
        .expect("push");
    assert!(q.get(&first).expect("get").is_some());
    assert_eq!(q.find("\"order_id\":6", 10).expect("find")[0].id, later);
    assert!(q.reschedule(&later, Duration::from_secs(60)).expect("reschedule"));
    assert!(q.cancel(&later).expect("cancel"));
    assert_eq!(q.stats().expect("stats").ready, 5);
    let every = delayq::Schedule::every(Duration::from_secs(3600)).expect("schedule");
    q.repeat("hourly", &every, &json!({"report": true})).expect("repeat");
    assert_eq!(q.repeats().expect("repeats").len(), 1);
    assert!(q.unrepeat("hourly").expect("unrepeat"));
    assert!(q.pause().expect("pause"));
    assert!(q.is_paused().expect("is_paused"));
    assert!(q.resume().expect("resume"));
    // The claims below run under it: its log and counters need no other commands.
    let limit = delayq::RateLimit::new(100, 1.0).expect("limit");
    q.set_rate_limit(limit).expect("set_rate_limit");
    assert_eq!(q.rate_limit().expect("rate_limit"), Some(limit));

    // Consumer side: order 5 fails for good, the rest succeed.
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            threads: 1,
            max_attempts: 1,
            ..WorkerOptions::default()
        },
    )
    .expect("worker");
    let stopper = worker.stopper();
    let summary = std::thread::scope(|s| {
        s.spawn(|| {
            let _stop = StopOnDrop(stopper.clone());
            wait_for(Duration::from_secs(20), "all handled", || {
                q.stats().is_ok_and(|s| s.ready + s.inflight == 0)
            });
            wait_for(Duration::from_secs(5), "the pool listed", || {
                q.workers().is_ok_and(|w| w.len() == 1)
            });
            stopper.stop();
        });
        worker
            .run(1, |d| {
                let v: serde_json::Value = d.payload().map_err(|e| e.to_string())?;
                if v["order_id"] == 5 {
                    return Err("card declined".into());
                }
                Ok(())
            })
            .expect("run under the limited user")
    });
    assert_eq!((summary.acked, summary.dead), (4, 1));
    assert!(q.clear_rate_limit().expect("clear_rate_limit"));
    let dead = q.dead_letters(10).expect("dead letters");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id, ids[3]);
    assert_eq!(
        q.requeue_dead_with_error("declined").expect("requeue_dead_with_error"),
        1
    );
    assert_eq!(q.purge().expect("purge"), 1);
    assert!(
        q.workers().expect("workers").is_empty(),
        "the stopped pool left the list"
    );
    assert_eq!(q.restart_workers().expect("restart_workers"), 0);

    // The same credentials cannot reach another queue's keys.
    let other = Queue::new(&url, "payments", QueueOptions::default()).expect("queue");
    let err = other.push(&1, Duration::ZERO).expect_err("keys outside the rule");
    assert!(matches!(err, Error::AuthFailed(_)), "{err:?}");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("{dq:payments}*")
        .query(&mut admin)
        .expect("KEYS");
    assert!(keys.is_empty(), "{keys:?}");
}

/// A partitioned queue's rule names each partition's exact tag: a queue whose name
/// starts the same (`orders:payouts`) stays out of reach, and a name that could be a
/// partition tag is refused.
#[test]
fn a_partitioned_queues_rule_grants_no_other_queue() {
    let server = RedisServer::start();
    let mut admin = server.con();
    let opts = QueueOptions {
        partitions: 3,
        ..QueueOptions::default()
    };
    let rule = Queue::new(&server.url(), "orders", opts.clone())
        .expect("queue")
        .acl_rule("orders-app");
    assert!(!rule.contains("p*"), "{rule}");
    set_user(&mut admin, &rule, "s3cret");
    let url = format!("redis://orders-app:s3cret@127.0.0.1:{}", server.port);
    let orders = Queue::new(&url, "orders", opts.clone()).expect("queue");
    for i in 0..30 {
        orders
            .push(&json!({"i": i}), Duration::ZERO)
            .expect("push to every partition");
    }
    assert_eq!(orders.stats().expect("stats").ready, 30);

    let payouts_admin = Queue::new(&server.url(), "orders:payouts", QueueOptions::default()).expect("queue");
    payouts_admin.push(&json!({"amount": 1}), Duration::ZERO).expect("push");
    let payouts = Queue::new(&url, "orders:payouts", QueueOptions::default()).expect("queue");
    let err = payouts.stats().expect_err("another queue's keys");
    assert!(matches!(err, Error::AuthFailed(_)), "{err:?}");
    let err = payouts.purge().expect_err("another queue's keys");
    assert!(err.to_string().contains("orders-app"), "{err}");
    assert_eq!(payouts_admin.stats().expect("stats").ready, 1);

    let tag = orders.hash_tag(0).expect("tag");
    let plain = tag.trim_start_matches("{dq:").trim_end_matches('}');
    let Err(err) = Queue::new(&url, plain, QueueOptions::default()) else {
        panic!("a name like a partition tag was accepted");
    };
    assert!(err.to_string().contains("contains '~'"), "{err}");
}

/// A permission taken away from a running pool: its claims fail, logged at error
/// level with the command named, nothing is written or lost; once the permission is
/// back the pool goes on by itself.
#[test]
fn a_permission_taken_away_under_a_running_pool_is_an_error_and_loses_nothing() {
    assert!(
        delayq::capture_logs(log::LevelFilter::Warn),
        "the only logger of this test binary"
    );
    let server = RedisServer::start();
    let mut admin = server.con();
    let rule = server.queue("orders").acl_rule("orders-app");
    set_user(&mut admin, &rule, "s3cret");
    let url = format!("redis://orders-app:s3cret@127.0.0.1:{}", server.port);
    let q = Queue::new(&url, "orders", QueueOptions::default()).expect("queue");
    let worker = Worker::new(q.clone(), WorkerOptions::default()).expect("worker");
    let stopper = worker.stopper();
    let handled = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let _stop = StopOnDrop(stopper.clone());
            wait_for(Duration::from_secs(10), "the pool listed", || {
                q.workers().is_ok_and(|w| w.len() == 1)
            });
            // ZRANGEBYSCORE, which the claim needs, is taken away.
            let _: () = redis::cmd("ACL")
                .arg("SETUSER")
                .arg("orders-app")
                .arg("-zrangebyscore")
                .query(&mut admin)
                .expect("ACL SETUSER");
            let admin_q = server.queue("orders");
            for i in 0..20 {
                admin_q.push(&json!({"i": i}), Duration::ZERO).expect("push as admin");
            }
            // Redis 7.0 and later name it in the scripts' preflight; before, the script
            // stops at the command, and Redis's own text names no command.
            let named = if server.version() >= (7, 0) {
                "may not run ZRANGEBYSCORE"
            } else {
                "lacks a permission delayq needs"
            };
            let mut seen = Vec::new();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !seen.iter().any(|r: &delayq::LogRecord| {
                r.level == log::Level::Error && r.message.contains("claim failed") && r.message.contains(named)
            }) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "no failing claim logged: {seen:?}"
                );
                std::thread::sleep(Duration::from_millis(20));
                seen.extend(delayq::take_logs());
            }
            assert_eq!(handled.load(std::sync::atomic::Ordering::SeqCst), 0);
            assert_eq!(
                admin_q.stats().expect("stats").ready,
                20,
                "nothing claimed, nothing lost"
            );
            set_user(&mut admin, &rule, "s3cret");
            wait_for(
                Duration::from_secs(20),
                "all handled once the permission is back",
                || handled.load(std::sync::atomic::Ordering::SeqCst) == 20,
            );
            stopper.stop();
        });
        worker
            .run(1, |_| {
                handled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            })
            .expect("run");
    });
    assert_eq!(handled.into_inner(), 20);
}

/// A permission taken away for a moment refuses the acks in the scripts' preflight,
/// before they write: they are tried again while their leases live and go through once
/// it is back. No message runs again, and no ack is counted lost or unwritten.
#[test]
fn acks_refused_for_a_moment_by_a_permission_taken_away_go_through_once_it_is_back() {
    const N: u64 = 120;
    let server = RedisServer::start();
    if server.version() < (7, 0) {
        // Before 7.0 a script meets a missing command where it runs it, maybe after
        // writes, and such an ack is not tried again (complete.rs, refused_unwritten).
        return;
    }
    let mut admin = server.con();
    let rule = server.queue("orders").acl_rule("orders-app");
    set_user(&mut admin, &rule, "s3cret");
    let url = format!("redis://orders-app:s3cret@127.0.0.1:{}", server.port);
    let q = Queue::new(&url, "orders", QueueOptions::default()).expect("queue");
    common::push_spread(&q, N, Duration::from_millis(15));
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            threads: 4,
            lease: Duration::from_secs(3),
            ..WorkerOptions::default()
        },
    )
    .expect("worker");
    let stopper = worker.stopper();
    let runs: std::sync::Mutex<std::collections::HashMap<u64, u32>> = std::sync::Mutex::default();
    let summary = std::thread::scope(|s| {
        let _stop = StopOnDrop(stopper.clone());
        let run = s.spawn(|| {
            worker
                .run(4, |d| {
                    let n = d.payload::<serde_json::Value>().map_err(|e| e.to_string())?["n"]
                        .as_u64()
                        .ok_or("no n")?;
                    *runs.lock().expect("lock").entry(n).or_insert(0) += 1;
                    std::thread::sleep(Duration::from_millis(40));
                    Ok(())
                })
                .expect("run")
        });
        wait_for(Duration::from_secs(10), "the first runs", || {
            runs.lock().expect("lock").len() >= 20
        });
        // HINCRBY, which every ack runs (and the claims), is taken away.
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("orders-app")
            .arg("-hincrby")
            .query(&mut admin)
            .expect("ACL SETUSER");
        std::thread::sleep(Duration::from_millis(700));
        set_user(&mut admin, &rule, "s3cret");
        wait_for(Duration::from_secs(30), "everything acknowledged", || {
            q.stats().is_ok_and(|s| s.ready + s.scheduled + s.inflight == 0)
        });
        stopper.stop();
        run.join().expect("run thread")
    });
    let runs = runs.into_inner().expect("lock");
    let again: Vec<(u64, u32)> = (0..N)
        .map(|n| (n, runs.get(&n).copied().unwrap_or(0)))
        .filter(|&(_, r)| r != 1)
        .collect();
    assert!(again.is_empty(), "ran other than once: {again:?}; {summary:?}");
    assert_eq!(
        (summary.acked, summary.lease_lost, summary.gone, summary.unwritten),
        (N, 0, 0, 0),
        "{summary:?}"
    );
}

/// The rule without `SCRIPT LOAD`: the user runs delayq's scripts only, once an admin
/// loaded them, and no Lua of its own; without them, its calls say what to do.
#[test]
fn a_user_without_script_load_runs_only_the_scripts_an_admin_loaded() {
    let server = RedisServer::start();
    let mut admin = server.con();
    let rule = server
        .queue("orders")
        .acl_rule_for("strict-app", delayq::ScriptRights::Preloaded);
    assert!(!rule.contains("script|load") && rule.contains("+evalsha"), "{rule}");
    set_user(&mut admin, &rule, "s3cret");
    let url = format!("redis://strict-app:s3cret@127.0.0.1:{}", server.port);
    let q = Queue::new(&url, "orders", QueueOptions::default()).expect("queue");

    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut admin)
        .expect("SCRIPT FLUSH");
    let e = q
        .push(&json!({"order_id": 1}), Duration::ZERO)
        .expect_err("no scripts loaded");
    assert!(matches!(e, Error::AuthFailed(_)), "{e:?}");
    assert!(e.to_string().contains("`delayq load-scripts`"), "{e}");

    let loaded = server.queue("orders").load_scripts().expect("load as admin");
    assert!(loaded > 5, "{loaded}");
    let id = q.push(&json!({"order_id": 2}), Duration::ZERO).expect("push");
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            stop_when_empty: true,
            ..WorkerOptions::default()
        },
    )
    .expect("worker");
    let summary = worker.run(1, |_d| Ok(())).expect("run");
    assert_eq!(summary.acked, 1, "{summary:?}");
    assert!(q.get(&id).expect("get").is_none());

    // A batch over partitions goes as one stream, which loads each script first: the
    // refused load does not fail calls whose scripts are there.
    let opts = QueueOptions {
        partitions: 3,
        ..QueueOptions::default()
    };
    let admin_multi = Queue::new(&server.url(), "multi", opts.clone()).expect("queue");
    set_user(
        &mut admin,
        &admin_multi.acl_rule_for("strict-multi", delayq::ScriptRights::Preloaded),
        "s3cret",
    );
    let multi_url = format!("redis://strict-multi:s3cret@127.0.0.1:{}", server.port);
    let multi = Queue::new(&multi_url, "multi", opts).expect("queue");
    let batch = || -> Vec<NewMessage> {
        (0..10)
            .map(|i| NewMessage::new(&json!({"order_id": i}), Duration::ZERO).expect("msg"))
            .collect()
    };
    assert_eq!(multi.push_many(&batch()).expect("batch push").len(), 10);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut admin)
        .expect("SCRIPT FLUSH");
    let e = multi.push_many(&batch()).expect_err("no scripts loaded");
    assert!(e.to_string().contains("`delayq load-scripts`"), "{e}");
    assert_eq!(
        admin_multi.stats().expect("stats").ready,
        10,
        "the refused batch wrote nothing"
    );
    admin_multi.load_scripts().expect("load as admin");
    assert_eq!(multi.push_many(&batch()).expect("batch push").len(), 10);

    // No Lua of its own: neither loaded nor sent whole.
    let mut user = redis::Client::open(url.as_str())
        .expect("client")
        .get_connection()
        .expect("connect");
    let load: redis::RedisResult<String> = redis::cmd("SCRIPT").arg("LOAD").arg("return 1").query(&mut user);
    assert!(load.is_err(), "SCRIPT LOAD was let through");
    let eval: redis::RedisResult<i64> = redis::cmd("EVAL").arg("return 1").arg(0).query(&mut user);
    assert!(eval.is_err(), "EVAL was let through");
}

/// The rule made for functions (Redis 7): the user calls delayq's functions with FCALL
/// and may run no Lua of its own, not even delayq's scripts by hash; before an admin
/// installed them, and after FUNCTION FLUSH, its calls say what to do, and a pool
/// drains once they are back.
#[test]
fn a_user_granted_fcall_runs_delayqs_functions_and_no_lua_of_its_own() {
    let server = RedisServer::start();
    if server.version() < (7, 0) {
        // Functions came with Redis 7.0: the EVALSHA rules are for Redis 6.
        return;
    }
    let mut admin = server.con();
    let admin_q = server.queue("orders");
    let rule = admin_q.acl_rule_for("fn-app", delayq::ScriptRights::Functions);
    assert!(
        rule.contains("+fcall") && !rule.contains("+evalsha") && !rule.contains("script|load"),
        "{rule}"
    );
    set_user(&mut admin, &rule, "s3cret");
    let url = format!("redis://fn-app:s3cret@127.0.0.1:{}", server.port);
    // The library is gone whatever the suite's servers were started with.
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut admin)
        .expect("FUNCTION FLUSH");

    let q = Queue::new(&url, "orders", QueueOptions::default()).expect("queue");
    let e = q
        .push(&json!({"order_id": 1}), Duration::ZERO)
        .expect_err("no functions");
    assert!(matches!(e, Error::AuthFailed(_)), "{e:?}");
    assert!(e.to_string().contains("`delayq install-functions`"), "{e}");

    let name = admin_q.install_functions().expect("install as admin");
    assert_eq!(name, delayq::scripts::LIBRARY.name);
    // The same queue calls them once they are there.
    let first = q.push(&json!({"order_id": 2}), Duration::ZERO).expect("push");
    let batch: Vec<NewMessage> = (0..10)
        .map(|i| NewMessage::new(&json!({"order_id": 10 + i}), Duration::ZERO).expect("msg"))
        .collect();
    assert_eq!(q.push_many(&batch).expect("batch").len(), 10);
    let summary = common::run_until_empty(&q, WorkerOptions::default(), |_d| Ok(()));
    assert_eq!(summary.acked, 11, "{summary:?}");
    assert!(q.get(&first).expect("get").is_none());

    // FUNCTION FLUSH: the calls say what to do, and write nothing; once installed
    // again, they go on.
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut admin)
        .expect("FUNCTION FLUSH");
    let e = q.push(&json!({"order_id": 3}), Duration::ZERO).expect_err("flushed");
    assert!(e.to_string().contains("`delayq install-functions`"), "{e}");
    let e = q.push_many(&batch).expect_err("flushed");
    assert!(e.to_string().contains("install-functions"), "{e}");
    let ready: u64 = redis::cmd("ZCARD")
        .arg("{dq:orders}:scheduled")
        .query(&mut admin)
        .expect("ZCARD");
    assert_eq!(ready, 0, "a refused call wrote nothing");
    admin_q.install_functions().expect("install again");
    q.push(&json!({"order_id": 4}), Duration::ZERO)
        .expect("push after install");
    assert_eq!(q.push_many(&batch).expect("batch").len(), 10);
    assert_eq!(q.stats().expect("stats").ready, 11);

    // Every script call went as FCALL (the admin's fell back to EVALSHA once, above).
    let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut admin).expect("INFO");
    assert!(stats.contains("cmdstat_fcall:"), "{stats}");
    assert!(
        !stats.contains("cmdstat_evalsha:") || stats.contains("cmdstat_evalsha:calls=0,"),
        "{stats}"
    );

    // No Lua of its own, nor delayq's scripts by hash.
    let mut user = redis::Client::open(url.as_str())
        .expect("client")
        .get_connection()
        .expect("connect");
    for refused in [
        redis::cmd("SCRIPT").arg("LOAD").arg("return 1").clone(),
        redis::cmd("EVAL").arg("return 1").arg(0).clone(),
        redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("#!lua name=mine\nredis.register_function('mine', function() return 1 end)")
            .clone(),
    ] {
        let r: redis::RedisResult<redis::Value> = refused.query(&mut user);
        assert!(r.is_err(), "{refused:?} was let through");
    }
}
