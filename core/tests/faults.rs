//! Faults: Redis killed and restarted mid-run, a worker process killed with SIGKILL.

mod common;

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{RedisServer, StopOnDrop, assert_no_leak, wait_for};
use delayq::{NewMessage, Queue, QueueOptions, Worker, WorkerOptions};
use parking_lot::Mutex;
use serde_json::json;

fn fast_retry() -> WorkerOptions {
    WorkerOptions {
        threads: 2,
        lease: Duration::from_secs(2),
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(100),
        ..WorkerOptions::default()
    }
}

fn n_of(d: &delayq::Delivery) -> Result<u64, String> {
    let v: serde_json::Value = d.payload().map_err(|e| e.to_string())?;
    v["n"].as_u64().ok_or_else(|| "no n".to_owned())
}

#[test]
#[expect(clippy::print_stderr, reason = "docs/RELIABILITY.md quotes the measured recovery")]
fn the_pool_and_producers_survive_a_redis_restart_and_lose_nothing() {
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let q = server.queue("restart");
    let first: Vec<NewMessage> = (0..3000u64)
        .map(|n| NewMessage::new(&json!({"n": n}), Duration::from_millis(n)).expect("msg"))
        .collect();
    q.push_many(&first).expect("push");
    let seen: Mutex<HashMap<u64, u32>> = Mutex::new(HashMap::new());
    let worker = Worker::new(q.clone(), fast_retry()).expect("worker");
    let stopper = worker.stopper();
    let summary = std::thread::scope(|s| {
        let _stop = StopOnDrop(stopper.clone());
        let run = s.spawn(|| {
            worker
                .run(2, |d| {
                    std::thread::sleep(Duration::from_micros(300));
                    *seen.lock().entry(n_of(d)?).or_default() += 1;
                    Ok(())
                })
                .expect("run")
        });
        wait_for(Duration::from_secs(30), "a third handled", || seen.lock().len() >= 1000);
        server.kill();
        let at_kill = seen.lock().len();
        std::thread::sleep(Duration::from_millis(300));
        server.restart();
        let restarted = std::time::Instant::now();
        wait_for(Duration::from_secs(30), "the pool to resume", || {
            seen.lock().len() > at_kill
        });
        let resumed = restarted.elapsed();
        // A producer whose connection died with the server reconnects by itself.
        for n in 3000..3500u64 {
            q.push(&json!({"n": n}), Duration::ZERO).expect("push after restart");
        }
        eprintln!("redis restart: the pool handled again {resumed:?} after the server was back");
        wait_for(Duration::from_secs(60), "every message handled", || {
            seen.lock().len() == 3500 && q.stats().is_ok_and(|s| s.ready + s.scheduled + s.inflight == 0)
        });
        stopper.stop();
        run.join().expect("run thread")
    });
    let seen = seen.into_inner();
    let missing: Vec<u64> = (0..3500).filter(|n| !seen.contains_key(n)).collect();
    assert!(missing.is_empty(), "lost: {missing:?}");
    let dups: u32 = seen.values().map(|c| c - 1).sum();
    // Only deliveries whose ack was cut off by the kill may run twice: at most the
    // prefetch window (batch 50 x 2 threads) plus the handlers running at that moment.
    eprintln!("redis restart: 0 lost of 3500, {dups} duplicates");
    assert!(dups <= 102, "{dups} duplicates");
    assert!(summary.acked >= 3500 - u64::from(dups));
    assert_no_leak(&server, "{dq:restart}");
}

#[test]
fn a_producer_gives_up_with_a_clear_error_when_redis_stays_down() {
    let mut server = RedisServer::start();
    let q = server.queue_with(
        "down",
        QueueOptions {
            connect: delayq::ConnectOptions {
                retry_timeout: Duration::from_millis(500),
                connect_timeout: Duration::from_millis(200),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    q.push(&1, Duration::ZERO).expect("push while up");
    server.kill();
    let started = std::time::Instant::now();
    let err = q.push(&2, Duration::ZERO).expect_err("redis is down");
    assert!(err.is_connection() && err.is_retryable(), "{err:?}");
    assert!(err.to_string().contains("127.0.0.1"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "gave up after {:?}",
        started.elapsed()
    );
}

/// Run as a child process by `a_worker_process_killed_mid_run_loses_nothing`: work the
/// queue and record each handled message, until killed.
#[test]
#[ignore = "helper: started as a child process by a_worker_process_killed_mid_run_loses_nothing"]
fn child_worker_process() {
    let url = std::env::var("DELAYQ_CHILD_URL").expect("run only by a_worker_process_killed_mid_run_loses_nothing");
    let log_path = std::env::var("DELAYQ_CHILD_LOG").expect("DELAYQ_CHILD_LOG");
    let q = Queue::new(&url, "crash", QueueOptions::default()).expect("queue");
    let log = Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .expect("log"),
    );
    let worker = Worker::new(q, fast_retry()).expect("worker");
    worker
        .run(2, |d| {
            std::thread::sleep(Duration::from_millis(1));
            writeln!(log.lock(), "{}", n_of(d)?).map_err(|e| e.to_string())
        })
        .expect("run");
}

#[test]
fn a_worker_process_killed_mid_run_loses_nothing() {
    let server = RedisServer::start();
    let q = server.queue("crash");
    let batch: Vec<NewMessage> = (0..2000u64)
        .map(|n| NewMessage::new(&json!({"n": n}), Duration::ZERO).expect("msg"))
        .collect();
    q.push_many(&batch).expect("push");
    let log_path = server.dir.join("child.log");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--ignored", "--exact", "child_worker_process", "--nocapture"])
        .env("DELAYQ_CHILD_URL", server.url())
        .env("DELAYQ_CHILD_LOG", &log_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child worker");
    let read_log = || -> Vec<u64> {
        std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect()
    };
    wait_for(Duration::from_secs(30), "the child to handle 300", || {
        read_log().len() >= 300
    });
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let before = q.stats().expect("stats");
    assert!(before.inflight > 0, "the kill left deliveries in flight: {before:?}");

    let by_child = read_log();
    let seen: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    let worker = Worker::new(q.clone(), fast_retry()).expect("worker");
    let stopper = worker.stopper();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _stop = StopOnDrop(stopper.clone());
            wait_for(Duration::from_secs(60), "the rest handled", || {
                q.stats().is_ok_and(|s| s.ready + s.scheduled + s.inflight == 0)
            });
            stopper.stop();
        });
        worker
            .run(2, |d| {
                seen.lock().push(n_of(d)?);
                Ok(())
            })
            .expect("run");
    });
    let mut all: Vec<u64> = by_child;
    all.extend(seen.into_inner());
    let distinct: HashSet<u64> = all.iter().copied().collect();
    let missing: Vec<u64> = (0..2000).filter(|n| !distinct.contains(n)).collect();
    assert!(missing.is_empty(), "lost after kill -9: {missing:?}");
    let dups = all.len() - distinct.len();
    assert!(
        dups as u64 <= before.inflight,
        "{dups} duplicates, more than the {} deliveries in flight at the kill",
        before.inflight
    );
    assert!(q.stats().expect("stats").total("expired") >= before.inflight);
    assert_no_leak(&server, "{dq:crash}");
}

#[test]
fn a_poison_envelope_written_by_hand_goes_to_the_dead_letters_and_the_pool_goes_on() {
    let server = RedisServer::start();
    let q = server.queue("poison");
    let good: Vec<NewMessage> = (0..100u64)
        .map(|n| NewMessage::new(&json!({"n": n}), Duration::ZERO).expect("msg"))
        .collect();
    q.push_many(&good).expect("push");
    // What a foreign tool or a half-migrated producer might leave behind: not JSON,
    // JSON that is not an envelope, and a stamp that tells no due time. Score 1: long
    // due.
    let mut con = server.con();
    for (id, text) in [
        ("poison-text", "{not json"),
        ("poison-shape", "[1,2,3]"),
        ("poison-stamp", r#"{"at":[1,due],"v":1,"payload":1}"#),
    ] {
        let _: () = redis::pipe()
            .hset("{dq:poison}:messages", id, text)
            .zadd("{dq:poison}:scheduled", id, 1)
            .query(&mut con)
            .expect("write by hand");
    }
    let seen: Mutex<HashSet<u64>> = Mutex::new(HashSet::new());
    let worker = Worker::new(q.clone(), fast_retry()).expect("worker");
    let stopper = worker.stopper();
    let summary = std::thread::scope(|s| {
        s.spawn(|| {
            let _stop = StopOnDrop(stopper.clone());
            wait_for(Duration::from_secs(30), "all handled or buried", || {
                q.stats().is_ok_and(|s| s.ready + s.scheduled + s.inflight == 0)
            });
            stopper.stop();
        });
        worker
            .run(2, |d| {
                seen.lock().insert(n_of(d)?);
                Ok(())
            })
            .expect("run")
    });
    assert_eq!(seen.into_inner().len(), 100, "the good messages all ran");
    assert_eq!(
        (summary.handled, summary.failed),
        (100, 0),
        "no handler ever saw a poison message"
    );
    let dead = q.dead_letters(10).expect("dead letters");
    let mut ids: Vec<&str> = dead.iter().map(|d| d.id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["poison-shape", "poison-stamp", "poison-text"]);
    for d in &dead {
        let why = &d.last_error;
        assert!(why.starts_with("poison message: "), "{}: {why}", d.id);
    }
    // The stored bytes are kept as they were, for a person to look at.
    let info = q.get("poison-text").expect("get").expect("kept");
    assert_eq!(info.payload_json, "{not json");
    assert_no_leak(&server, "{dq:poison}");
}

#[test]
fn get_reports_a_delivery_whose_lease_it_cannot_read() {
    let server = RedisServer::start();
    let q = server.queue("oddlease");
    let id = q.push(&json!({"n": 1}), Duration::ZERO).expect("push");
    let due = q.get(&id).expect("get").expect("exists").due_at_ms;
    assert!(due.is_some());
    // What an older delayq mid-upgrade (or a hand edit) might leave: an in-flight
    // message whose lease string is not in this version's format (this one is the
    // "<token>.<i>:<score>:<attempt>" of versions before 2026-11-30).
    let mut con = server.con();
    let _: () = redis::pipe()
        .zrem("{dq:oddlease}:scheduled", &id)
        .zadd("{dq:oddlease}:inflight", &id, 9_999_999_999_999_i64)
        .hset("{dq:oddlease}:leases", &id, "17.1:7227231436800000:1")
        .query(&mut con)
        .expect("write by hand");
    let info = q.get(&id).expect("get works").expect("exists");
    assert_eq!(info.state, delayq::State::Inflight);
    assert_eq!(info.due_at_ms, due, "the envelope's stamp still tells the due time");
    assert_eq!(info.attempts, 1, "the running delivery is the first");
    // Without the stamp as well (an envelope of a delayq before it) nothing tells it.
    let _: () = redis::cmd("HSET")
        .arg("{dq:oddlease}:messages")
        .arg(&id)
        .arg(r#"{"v":1,"id":"x","created_ms":1,"payload":{"n":1}}"#)
        .query(&mut con)
        .expect("write by hand");
    let info = q.get(&id).expect("get works").expect("exists");
    assert_eq!((info.state, info.due_at_ms), (delayq::State::Inflight, None));
}

/// A number from `INFO <section>`.
fn info_number(server: &RedisServer, section: &str, field: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg(section).query(&mut server.con()).expect("info");
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} has no {field}"))
}

fn used_memory(server: &RedisServer) -> u64 {
    info_number(server, "memory", "used_memory")
}

/// The ids of the server's clients but the one asking.
fn client_ids(server: &RedisServer) -> HashSet<u64> {
    let mut con = server.con();
    let own: u64 = redis::cmd("CLIENT").arg("ID").query(&mut con).expect("CLIENT ID");
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut con).expect("CLIENT LIST");
    list.lines()
        .filter_map(|l| l.strip_prefix("id=")?.split(' ').next()?.parse().ok())
        .filter(|&id| id != own)
        .collect()
}

fn set_maxmemory(server: &RedisServer, bytes: u64) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(bytes)
        .query(&mut server.con())
        .expect("config set");
}

/// A Redis at its maxmemory (noeviction) refuses pushes whole, with an error that says
/// so; the pool goes on draining (claims, acks that keep completed messages, retries,
/// lease extensions, its heartbeat): that is what frees memory. Before, a full Redis
/// refused the acks of a queue keeping completed messages and every lease extension,
/// so it ran messages again and again and never emptied.
#[test]
fn a_redis_out_of_memory_refuses_pushes_whole_and_the_pool_still_drains() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let q = server.queue_with(
        "full",
        QueueOptions {
            keep_completed: 10,
            ..QueueOptions::default()
        },
    );
    q.ping().expect("ping");
    let (empty, before) = (used_memory(&server), client_ids(&server));
    // The fill on a connection of its own, closed after it: the big push's query buffer
    // goes with it, instead of counting as data until Redis shrinks it (7.0 in its cron,
    // 8.0 at the connection's next command: seen with Debian unstable's 8.0.6).
    let filler = server.queue_with("full", QueueOptions::default());
    let batch: Vec<NewMessage> = (0..2000u64)
        .map(|n| NewMessage::new(&json!({"n": n, "pad": "x".repeat(200)}), Duration::ZERO).expect("msg"))
        .collect();
    filler.push_many(&batch).expect("push");
    drop(filler);
    wait_for(Duration::from_secs(5), "the filler's connection closed", || {
        client_ids(&server).is_subset(&before)
    });
    // Three quarters of the way from the empty queue to the full one: below the use
    // now, and above it once the messages are gone. (What the pool adds, its scripts
    // above all, took a little over half the way on Redis 7.0.)
    let full = used_memory(&server);
    set_maxmemory(&server, full - (full - empty) / 4);

    let pushed = q.stats().expect("stats under OOM").totals["pushed"];
    let err = q.push(&json!({"n": -1}), Duration::ZERO).expect_err("refused");
    assert!(err.is_out_of_memory() && !err.is_retryable(), "{err:?}");
    assert_eq!(err.category(), delayq::Category::OutOfMemory);
    assert!(err.to_string().contains("nothing was written"), "{err}");
    let err = q
        .push_json(
            r#"{"n": -2}"#,
            Duration::ZERO.into(),
            &delayq::PushOptions {
                id: Some("chosen".into()),
                ..Default::default()
            },
        )
        .expect_err("refused");
    assert!(err.is_out_of_memory(), "{err:?}");
    let s = q.stats().expect("stats");
    assert_eq!((s.totals["pushed"], s.ready), (pushed, 2000), "nothing written");
    assert!(q.get("chosen").expect("get").is_none());

    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            // Renewed every third of it: a late heartbeat on a loaded machine still keeps it.
            lease: Duration::from_millis(1_500),
            backoff_base: Duration::from_millis(10),
            backoff_max: Duration::from_millis(20),
            ..fast_retry()
        },
    )
    .expect("worker");
    let stopper = worker.stopper();
    let failed_once: Mutex<HashSet<u64>> = Mutex::new(HashSet::new());
    let summary = std::thread::scope(|s| {
        let _stop = StopOnDrop(stopper.clone());
        let run = s.spawn(|| {
            worker
                .run(2, |d| {
                    let n = n_of(d)?;
                    if n == 7 {
                        // Past its lease: only the extensions keep it.
                        std::thread::sleep(Duration::from_millis(2500));
                    }
                    if n % 100 == 0 && failed_once.lock().insert(n) {
                        return Err("fails once".into());
                    }
                    Ok(())
                })
                .expect("run")
        });
        wait_for(Duration::from_secs(5), "the pool listed by its heartbeat", || {
            q.workers().is_ok_and(|w| w.len() == 1)
        });
        wait_for(Duration::from_secs(30), "everything acknowledged", || {
            q.stats().is_ok_and(|s| s.ready + s.scheduled + s.inflight == 0)
        });
        stopper.stop();
        run.join().expect("run thread")
    });
    assert_eq!(
        (summary.acked, summary.retried, summary.lease_lost, summary.unwritten),
        (2000, 20, 0, 0),
        "{summary:?}"
    );
    assert_eq!(q.stats().expect("stats").completed, 10);
    // Drained, the queue left room: pushes are taken again.
    q.push(&json!({"n": 2000}), Duration::ZERO)
        .expect("push once memory is free");
}

/// A key of the queue of another type for a moment (another program wrote it, then
/// removed it) refuses acks and nacks in the scripts' preflight, before they write:
/// they are tried again while their leases live and go through once the key is gone.
/// No message runs again, every count adds up, and the fault is logged once.
#[test]
fn completions_refused_for_a_moment_by_a_stray_key_go_through_once_it_is_gone() {
    assert!(
        delayq::capture_logs(log::LevelFilter::Warn),
        "the only logger of this test binary"
    );
    // Only acks touch `completed`; acks, nacks, releases and claims touch `serial_line`.
    // Both are empty here: the stray value destroys nothing.
    for role in ["completed", "serial_line"] {
        completions_refused_for_a_moment(role);
    }
}

fn completions_refused_for_a_moment(role: &str) {
    const N: u64 = 120;
    let server = RedisServer::start();
    let name = format!("stray-{role}");
    let q = server.queue(&name);
    common::push_spread(&q, N, Duration::from_millis(15));
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            threads: 4,
            lease: Duration::from_secs(3),
            backoff_base: Duration::from_millis(20),
            backoff_max: Duration::from_millis(20),
            ..WorkerOptions::default()
        },
    )
    .expect("worker");
    let stopper = worker.stopper();
    let runs: Mutex<HashMap<u64, u32>> = Mutex::new(HashMap::new());
    let mine = format!("delayq[{name}]");
    let mut logs = Vec::new();
    let take_logs = |logs: &mut Vec<delayq::LogRecord>| {
        logs.extend(delayq::take_logs().into_iter().filter(|r| r.message.contains(&mine)));
    };
    let summary = std::thread::scope(|s| {
        let _stop = StopOnDrop(stopper.clone());
        let run = s.spawn(|| {
            worker
                .run(4, |d| {
                    let n = n_of(d)?;
                    let runs = {
                        let mut all = runs.lock();
                        let r = all.entry(n).or_insert(0);
                        *r += 1;
                        *r
                    };
                    std::thread::sleep(Duration::from_millis(40));
                    if n % 3 == 0 && runs == 1 {
                        return Err("fails once".into());
                    }
                    Ok(())
                })
                .expect("run")
        });
        wait_for(Duration::from_secs(10), "the first runs", || runs.lock().len() >= 20);
        let stray = format!("{{dq:{name}}}:{role}");
        let _: () = redis::cmd("SET")
            .arg(&stray)
            .arg("x")
            .query(&mut server.con())
            .expect("SET");
        std::thread::sleep(Duration::from_millis(700));
        let _: () = redis::cmd("DEL").arg(&stray).query(&mut server.con()).expect("DEL");
        wait_for(Duration::from_secs(30), "everything acknowledged", || {
            take_logs(&mut logs);
            q.stats().is_ok_and(|s| s.ready + s.scheduled + s.inflight == 0)
        });
        stopper.stop();
        run.join().expect("run thread")
    });
    take_logs(&mut logs);
    let runs = runs.into_inner();
    let again: Vec<(u64, u32)> = (0..N)
        .map(|n| (n, runs.get(&n).copied().unwrap_or(0)))
        .filter(|&(n, r)| r != if n % 3 == 0 { 2 } else { 1 })
        .collect();
    assert!(
        again.is_empty(),
        "{role}: ran another number of times: {again:?}; {summary:?}"
    );
    assert_eq!(
        (
            summary.acked,
            summary.retried,
            summary.lease_lost,
            summary.gone,
            summary.unwritten
        ),
        (N, N.div_ceil(3), 0, 0, 0),
        "{role}: {summary:?}"
    );
    // The claims' own retries (a stray `serial_line` refuses them too) are theirs to log.
    let completer: Vec<&str> = logs
        .iter()
        .map(|r| r.message.as_str())
        .filter(|m| !m.contains("claim failed"))
        .collect();
    let refused: Vec<&&str> = completer.iter().filter(|m| m.contains("holds a string")).collect();
    assert_eq!(refused.len(), 1, "{role}: the fault is logged once: {completer:#?}");
    assert!(refused[0].contains("refused"), "{}", refused[0]);
    assert_eq!(
        completer.iter().filter(|m| m.contains("go through again")).count(),
        1,
        "{role}: and its end once: {completer:#?}"
    );
    assert_no_leak(&server, &format!("{{dq:{name}}}"));
}
