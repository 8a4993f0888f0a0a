//! A handler that forks (side work in a child process): the child never runs, waits
//! on or writes through the pool it inherited, and the parent's delivery goes on.

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::RedisServer;
use delayq::{NewMessage, Received, Worker, WorkerOptions};
use serde_json::json;

/// How `pid` ended: its exit status, or its signal as 128 + number. None if it still
/// ran after `limit` (then it is killed): a child that hangs fails the test, not the
/// suite.
fn wait_child(pid: libc::pid_t, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child.
        let done = unsafe { libc::waitpid(pid, &raw mut status, libc::WNOHANG) };
        if done == pid {
            return Some(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            });
        }
        if Instant::now() >= deadline {
            // SAFETY: ends and reaps our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &raw mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn fork() -> libc::pid_t {
    // SAFETY: the child runs only the code of the test's branch and then `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    pid
}

fn push_numbered(q: &delayq::Queue, n: usize) {
    let batch: Vec<NewMessage> = (0..n)
        .map(|i| NewMessage::new(&json!({"n": i}), Duration::ZERO).expect("message"))
        .collect();
    q.push_many(&batch).expect("push_many");
}

#[test]
fn a_child_forked_by_a_run_handler_ends_when_it_returns_and_only_the_parent_acknowledges() {
    let server = RedisServer::start();
    let q = server.queue("forks");
    push_numbered(&q, 3);
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            threads: 1,
            stop_when_empty: true,
            ..WorkerOptions::default()
        },
    )
    .expect("worker");
    let ended = Mutex::new(Vec::new());
    let summary = worker
        .run(1, |d| {
            let n = d.payload::<serde_json::Value>().expect("payload")["n"]
                .as_u64()
                .expect("n");
            let pid = fork();
            if pid == 0 {
                // The child returns as a handler does: Ok, Err, or a panic.
                return match n {
                    0 => Ok(()),
                    1 => Err("the child's side work failed".into()),
                    _ => panic!("the child's side work panicked"),
                };
            }
            let status = wait_child(pid, Duration::from_secs(5));
            ended.lock().expect("lock").push((n, status));
            Ok(())
        })
        .expect("run");
    let mut ended = ended.into_inner().expect("lock");
    ended.sort_unstable();
    assert_eq!(
        ended,
        [(0, Some(0)), (1, Some(1)), (2, Some(101))],
        "each child ended by itself when it returned, with its outcome as its status"
    );
    assert_eq!(
        (summary.handled, summary.acked, summary.failed, summary.released),
        (3, 3, 0, 0)
    );
    let stats = q.stats().expect("stats");
    assert_eq!((stats.ready, stats.inflight), (0, 0));
    assert_eq!(
        stats.totals.get("acked"),
        Some(&3),
        "acknowledged once each, by the parent"
    );
    assert_eq!(
        stats.totals.get("released"),
        None,
        "nothing released, by either process"
    );
}

#[test]
fn a_forked_child_finds_its_copy_of_the_consumer_inert() {
    let server = RedisServer::start();
    let q = server.queue("inert");
    push_numbered(&q, 2);
    let worker = Worker::new(q.clone(), WorkerOptions::default()).expect("worker");
    let consumer = worker.start().expect("start");
    let next = || loop {
        match consumer.recv_timeout(Duration::from_secs(5)) {
            Received::Message(d) => return d,
            Received::Idle => {}
            Received::Stopped => panic!("stopped"),
        }
    };
    let d = next();
    assert!(!consumer.in_forked_child());
    let pid = fork();
    if pid == 0 {
        // Everything a child could do with the pool: none of it may wait for the
        // parent's threads, or write to Redis.
        let checks = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            assert!(consumer.in_forked_child());
            consumer.ack(d);
            worker.stop();
            assert!(matches!(
                consumer.recv_timeout(Duration::from_secs(5)),
                Received::Stopped
            ));
            consumer.finish();
            assert!(worker.start().is_err(), "a child does not run the pool it inherited");
            drop(worker);
        }));
        // SAFETY: ends the child without running the test harness's code.
        unsafe { libc::_exit(if checks.is_ok() { 0 } else { 1 }) }
    }
    assert_eq!(
        wait_child(pid, Duration::from_secs(5)),
        Some(0),
        "the child's calls returned at once"
    );
    assert!(!consumer.in_forked_child());
    // The parent's pool goes on: its delivery, then the next message.
    consumer.ack(d);
    let second = next();
    consumer.ack(second);
    let summary = consumer.finish();
    assert_eq!((summary.handled, summary.acked, summary.released), (2, 2, 0));
    let stats = q.stats().expect("stats");
    assert_eq!((stats.ready, stats.inflight), (0, 0));
    assert_eq!(stats.totals.get("acked"), Some(&2), "acknowledged by the parent only");
}
