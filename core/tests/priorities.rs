//! One worker over several queues in priority order (`Worker::with_lower_queues`):
//! a lower queue's message runs only when no higher queue has one due.

mod common;

use std::time::Duration;

use common::{RedisServer, StopOnDrop, assert_no_leak, run_until, wait_for};
use delayq::{Category, NewMessage, Queue, Received, Retry, Worker, WorkerOptions};
use parking_lot::Mutex;

fn fast() -> WorkerOptions {
    WorkerOptions {
        idle_check: Duration::from_millis(50),
        ..Default::default()
    }
}

fn push_due_now(q: &Queue, tag: &str, n: u64) {
    let batch: Vec<NewMessage> = (0..n)
        .map(|i| NewMessage::new(&format!("{tag}-{i}"), Duration::ZERO).expect("msg"))
        .collect();
    q.push_many(&batch).expect("push_many");
}

/// Run `worker` with one handler (as PHP and Python do) until `total` deliveries were
/// seen; `handle` may fail one. Returns (queue, payload) in the order handled.
fn drain(
    worker: &Worker,
    total: usize,
    handle: impl Fn(&str, &str, usize) -> Result<(), String> + Sync,
) -> Vec<(String, String)> {
    run_until(
        worker,
        1,
        Duration::from_secs(30),
        |d, seen: &Mutex<Vec<_>>| {
            let payload: String = d.payload().map_err(|e| e.to_string())?;
            let position = {
                let mut seen = seen.lock();
                seen.push((d.queue.to_string(), payload.clone()));
                seen.len()
            };
            // A handler that does some work, as real ones do.
            std::thread::sleep(Duration::from_micros(100));
            handle(&d.queue, &payload, position)
        },
        |seen| seen.len() >= total,
    )
}

#[test]
fn a_lower_queue_waits_until_the_higher_ones_have_nothing_due() {
    let server = RedisServer::start();
    let (high, default, low) = (server.queue("high"), server.queue("default"), server.queue("low"));
    // The lower queues' messages are older: priority, not due time, decides.
    push_due_now(&low, "low", 300);
    push_due_now(&default, "default", 300);
    push_due_now(&high, "high", 300);
    let worker = Worker::with_lower_queues(high.clone(), vec![default.clone(), low.clone()], fast()).expect("worker");
    assert_eq!(
        worker.queues().map(Queue::name).collect::<Vec<_>>(),
        ["high", "default", "low"]
    );
    let seen = drain(&worker, 900, |_, _, _| Ok(()));
    let last_of = |name: &str| seen.iter().rposition(|(q, _)| q == name).expect("handled");
    let before = |name: &str, end: usize| seen[..end].iter().filter(|(q, _)| q == name).count();
    // Only what a lower pool claimed in the first instant, before the higher pool's
    // first claim was under way, may run ahead (one message per handler).
    let (last_high, last_default) = (last_of("high"), last_of("default"));
    assert!(
        before("default", last_high) + before("low", last_high) <= 2,
        "lower queues ran before high was drained: {:?}",
        &seen[..=last_high]
    );
    assert!(before("low", last_default) <= 2, "low ran before default was drained");
    for (q, n) in [(&high, "high"), (&default, "default"), (&low, "low")] {
        let mut payloads: Vec<&str> = seen
            .iter()
            .filter(|(name, _)| name == n)
            .map(|(_, p)| p.as_str())
            .collect();
        payloads.sort_unstable();
        payloads.dedup();
        assert_eq!(payloads.len(), 300, "{n}: each message once");
        let stats = q.stats().expect("stats");
        assert_eq!((stats.ready, stats.inflight), (0, 0), "{n}");
        assert_eq!(stats.totals.get("acked"), Some(&300), "{n}: acks went to its own queue");
        assert_no_leak(&server, &format!("{{dq:{n}}}"));
    }
}

#[test]
fn a_higher_message_pushed_while_a_lower_queue_drains_runs_next() {
    let server = RedisServer::start();
    let (high, low) = (server.queue("urgent"), server.queue("bulk"));
    push_due_now(&low, "bulk", 1000);
    let worker = Worker::with_lower_queues(high.clone(), vec![low.clone()], fast()).expect("worker");
    let pushed_at = std::sync::OnceLock::new();
    let seen = drain(&worker, 1020, |_, _, position| {
        if position == 50 {
            push_due_now(&high, "urgent", 20);
            let _ = pushed_at.set(position);
        }
        // The bound below in time: 100 positions take two idle checks at least, so the
        // urgent queue is claimed within it even if its wake-up comes late.
        std::thread::sleep(Duration::from_millis(1));
        Ok(())
    });
    let urgent: Vec<usize> = seen
        .iter()
        .enumerate()
        .filter(|(_, (q, _))| q == "urgent")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(urgent.len(), 20);
    // The handler takes the urgent queue's deliveries before the bulk ones it had
    // prefetched: they run within the next few messages, not after the other 950
    // (the bound leaves room for the claims of a loaded machine).
    let last_urgent = *urgent.last().expect("urgent");
    assert!(
        last_urgent < 50 + 100 + 20 + 10,
        "urgent messages ran late, the last at position {last_urgent}"
    );
    // Once the first has come, no prefetched bulk message slips in while the urgent
    // queue's next claims are under way.
    let first_urgent = urgent[0];
    assert_eq!(
        urgent,
        (first_urgent..first_urgent + 20).collect::<Vec<_>>(),
        "bulk messages ran between urgent ones"
    );
    assert_eq!(seen.iter().filter(|(q, _)| q == "bulk").count(), 1000);
}

#[test]
fn each_queue_keeps_its_own_retries_and_dead_letters() {
    let server = RedisServer::start();
    let (high, low) = (server.queue("mail"), server.queue("reports"));
    push_due_now(&high, "mail", 5);
    push_due_now(&low, "reports", 5);
    let worker = Worker::with_lower_queues(
        high.clone(),
        vec![low.clone()],
        WorkerOptions {
            max_attempts: 2,
            backoff_base: Duration::from_millis(10),
            backoff_max: Duration::from_millis(10),
            ..fast()
        },
    )
    .expect("worker");
    let consumer = worker.start().expect("start");
    let _stop = StopOnDrop(consumer.stopper());
    let mut handled = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    // Each message once, and the two that failed once more.
    while handled < 5 + 5 + 2 {
        assert!(std::time::Instant::now() < deadline, "handled only {handled}");
        match consumer.recv_timeout(Duration::from_millis(100)) {
            Received::Message(d) => {
                handled += 1;
                let payload: String = d.payload().expect("payload");
                match payload.as_str() {
                    // Given up at once: straight to its queue's dead letters.
                    "mail-0" => drop(consumer.fail_with(d, "bounced", Retry::Never)),
                    // Fails once, then runs again from its own queue.
                    "reports-3" if d.attempt == 1 => drop(consumer.fail(d, "database busy")),
                    "mail-1" if d.attempt == 1 => drop(consumer.fail(d, "smtp busy")),
                    _ => consumer.ack(d),
                }
            }
            Received::Idle => {}
            Received::Stopped => panic!("stopped early"),
        }
    }
    let summary = consumer.finish();
    assert_eq!(
        (summary.handled, summary.failed, summary.dead),
        (12, 3, 1),
        "{summary:?}"
    );
    let dead = high.dead_letters(10).expect("dead");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].last_error, "bounced");
    assert!(low.dead_letters(10).expect("dead").is_empty());
    let (hs, ls) = (high.stats().expect("stats"), low.stats().expect("stats"));
    assert_eq!((hs.totals.get("acked"), hs.totals.get("retried")), (Some(&4), Some(&1)));
    assert_eq!((ls.totals.get("acked"), ls.totals.get("retried")), (Some(&5), Some(&1)));
    assert_no_leak(&server, "{dq:mail}");
    assert_no_leak(&server, "{dq:reports}");
}

#[test]
fn stop_when_empty_returns_once_every_queue_is_empty() {
    let server = RedisServer::start();
    let (a, b) = (server.queue("a"), server.queue("b"));
    push_due_now(&a, "a", 30);
    push_due_now(&b, "b", 70);
    let worker = Worker::with_lower_queues(
        a.clone(),
        vec![b.clone()],
        WorkerOptions {
            stop_when_empty: true,
            ..fast()
        },
    )
    .expect("worker");
    let count = std::sync::atomic::AtomicUsize::new(0);
    let summary = worker
        .run(1, |_| {
            count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        })
        .expect("run");
    assert_eq!((summary.handled, summary.acked), (100, 100));
    assert!(worker.stopper().found_empty());
    assert_eq!(a.stats().expect("stats").ready + b.stats().expect("stats").ready, 0);
}

#[test]
fn a_restart_request_on_any_of_its_queues_stops_the_whole_worker() {
    let server = RedisServer::start();
    let (a, b) = (server.queue("first"), server.queue("second"));
    let worker = Worker::with_lower_queues(a.clone(), vec![b.clone()], fast()).expect("worker");
    let consumer = worker.start().expect("start");
    let _stop = StopOnDrop(consumer.stopper());
    // Let the pools start (a request from before a pool started is not for it).
    std::thread::sleep(Duration::from_millis(200));
    b.restart_workers().expect("restart");
    wait_for(Duration::from_secs(10), "the worker to stop", || {
        matches!(consumer.recv_timeout(Duration::from_millis(50)), Received::Stopped)
    });
    let stopper = consumer.stopper();
    assert!(stopper.restart_requested() && stopper.is_stopped());
    consumer.finish();
    // Stopped for good: a message pushed now stays.
    a.push(&"later", Duration::ZERO).expect("push");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(a.stats().expect("stats").ready, 1);
}

#[test]
fn a_queue_listed_twice_or_too_many_queues_are_refused() {
    let server = RedisServer::start();
    let a = server.queue("a");
    for lower in [vec![server.queue("a")], vec![server.queue("b"), server.queue("b")]] {
        let err = Worker::with_lower_queues(a.clone(), lower, fast()).expect_err("refused");
        assert_eq!(err.category(), Category::InvalidArgument);
        assert!(
            err.to_string().contains("lower_queues") && err.to_string().contains("twice"),
            "{err}"
        );
    }
    let many: Vec<Queue> = (0..delayq::MAX_WORKER_QUEUES)
        .map(|i| server.queue(&format!("q{i}")))
        .collect();
    let err = Worker::with_lower_queues(a.clone(), many, fast()).expect_err("refused");
    assert!(err.to_string().contains("at most 16 queues"), "{err}");
    // Bad options are refused as for one queue.
    let err = Worker::with_lower_queues(a, vec![server.queue("b")], WorkerOptions { batch: 0, ..fast() })
        .expect_err("refused");
    assert!(err.to_string().contains("batch"), "{err}");
}

#[test]
fn a_higher_queue_whose_redis_is_down_holds_nobody_back() {
    let down = Mutex::new(RedisServer::start());
    let up = RedisServer::start();
    let impatient = |server: &RedisServer, name: &str| {
        server.queue_with(
            name,
            delayq::QueueOptions {
                connect: delayq::ConnectOptions {
                    connect_timeout: Duration::from_millis(200),
                    retry_timeout: Duration::from_millis(300),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
    };
    let (high, low) = (impatient(&down.lock(), "urgent"), impatient(&up, "bulk"));
    down.lock().kill();
    push_due_now(&low, "bulk", 50);
    let worker = Worker::with_lower_queues(high.clone(), vec![low.clone()], fast()).expect("worker");
    let seen = drain(&worker, 55, |_, _, position| {
        if position == 50 {
            // Back up (empty: it keeps nothing on disk): the pool reconnects by itself,
            // and what is pushed now runs.
            down.lock().restart();
            push_due_now(&high, "urgent", 5);
        }
        Ok(())
    });
    assert!(seen[..50].iter().all(|(q, _)| q == "bulk"), "{seen:?}");
    assert!(seen[50..].iter().all(|(q, _)| q == "urgent"), "{seen:?}");
    assert_eq!(low.stats().expect("stats").totals.get("acked"), Some(&50));
}

#[test]
fn deliveries_of_a_lower_queue_kept_waiting_go_back_to_other_consumers() {
    let server = RedisServer::start();
    let (high, low) = (server.queue("flood"), server.queue("shared"));
    push_due_now(&low, "shared", 100);
    let opts = WorkerOptions {
        // A heartbeat every 200 ms.
        lease: Duration::from_millis(600),
        ..fast()
    };
    let busy = Worker::with_lower_queues(high.clone(), vec![low.clone()], opts.clone()).expect("worker");
    let alone = Worker::new(low.clone(), opts).expect("worker");
    let (busy_stop, alone_stop) = (busy.stopper(), alone.stopper());
    let handled_low = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let _stops = (StopOnDrop(busy_stop.clone()), StopOnDrop(alone_stop.clone()));
        s.spawn(|| {
            busy.run(1, |d| {
                if &*d.queue == "shared" {
                    handled_low.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(2));
                Ok(())
            })
        });
        // The busy worker runs some of the shared queue and prefetches more; then its
        // higher queue floods: 3000 messages, about 6 s of its handler.
        wait_for(Duration::from_secs(10), "the busy worker on the shared queue", || {
            handled_low.load(std::sync::atomic::Ordering::SeqCst) >= 5
        });
        push_due_now(&high, "flood", 3000);
        s.spawn(|| alone.run(1, |_| Ok(())));
        wait_for(Duration::from_secs(10), "every shared message done", || {
            low.stats().is_ok_and(|st| st.totals.get("acked") == Some(&100))
        });
        let flood = high.stats().expect("stats");
        assert!(
            flood.ready + flood.inflight > 1000,
            "the shared queue finished only as the flood ended: {flood:?}"
        );
        assert!(
            low.stats()
                .expect("stats")
                .totals
                .get("released")
                .is_some_and(|&n| n > 0),
            "the busy worker gave nothing back"
        );
        busy_stop.stop();
        alone_stop.stop();
    });
    assert_no_leak(&server, "{dq:shared}");
}
