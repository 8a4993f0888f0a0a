//! Stack traces kept with failures (`Consumer::fail_traced`): what `get` and the dead
//! letters show when someone looks into a failure after the worker's log is gone.

mod common;

use std::time::Duration;

use common::{RedisServer, assert_no_leak, wait_for};
use delayq::{Consumer, Delivery, Error, Listing, Queue, Received, Retry, State, Worker, WorkerOptions};
use serde_json::json;

const TAG: &str = "{dq:orders}";

fn opts() -> WorkerOptions {
    WorkerOptions {
        max_attempts: 3,
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_millis(10),
        lease: Duration::from_millis(300),
        ..Default::default()
    }
}

fn next(c: &Consumer) -> Delivery {
    match c.recv_timeout(Duration::from_secs(10)) {
        Received::Message(d) => d,
        other => panic!("expected a delivery, got {other:?}"),
    }
}

/// A consumer of `q` with room for `handlers` deliveries at once.
fn pool(q: &Queue, handlers: usize) -> Consumer {
    Worker::new(q.clone(), opts())
        .expect("worker")
        .start_with(handlers)
        .expect("start")
}

fn traces_held(server: &RedisServer) -> u64 {
    redis::cmd("HLEN")
        .arg(format!("{TAG}:traces"))
        .query(&mut server.con())
        .expect("HLEN")
}

fn trace_of(q: &Queue, id: &str) -> Option<String> {
    q.get(id).expect("get").expect("known").error_trace
}

#[test]
fn a_trace_follows_its_error_and_goes_with_the_message() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    let id = q.push(&json!({"order": 10086}), Duration::ZERO).expect("push");
    let other = q.push(&json!({"order": 10087}), Duration::ZERO).expect("push");
    let c = pool(&q, 2);

    // Each failure retries in a minute and the test brings the message back itself
    // (reschedule), so that what it reads is not a delivery racing ahead.
    let later = Retry::After(Duration::from_secs(60));
    let bring_back = || assert!(q.reschedule(&id, Duration::ZERO).expect("reschedule"));

    // Attempt 1 fails with a trace: get and the waiting list show it beside the error.
    for _ in 0..2 {
        let d = next(&c);
        if d.id == id {
            c.fail_traced(
                d,
                "PDOException: gone away",
                "#0 Order.php(12): close()\n#1 {main}",
                later,
            );
        } else {
            c.ack(d);
        }
    }
    // The completer writes in batches: the ack may follow the failure's write.
    wait_for(Duration::from_secs(5), "the trace written and the other acked", || {
        trace_of(&q, &id).is_some() && q.get(&other).expect("get").is_none()
    });
    let info = q.get(&id).expect("get").expect("known");
    assert_eq!(info.last_error.as_deref(), Some("PDOException: gone away"));
    assert_eq!(
        info.error_trace.as_deref(),
        Some("#0 Order.php(12): close()\n#1 {main}")
    );
    let listed = q.list(Listing::Waiting, 10).expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].error_trace, info.error_trace);

    // Attempt 2 fails without one: the old trace would describe another error.
    bring_back();
    let d = next(&c);
    assert_eq!((d.id.as_str(), d.attempt), (id.as_str(), 2));
    c.fail_with(d, "Timeout: no answer", later);
    wait_for(Duration::from_secs(5), "the second failure written", || {
        q.get(&id)
            .expect("get")
            .is_some_and(|m| m.state == State::Scheduled && m.attempts == 2)
    });
    let info = q.get(&id).expect("get").expect("known");
    assert_eq!(info.last_error.as_deref(), Some("Timeout: no answer"));
    assert_eq!(info.error_trace, None);
    assert_eq!(traces_held(&server), 0);
    bring_back();

    // Attempt 3, the last: the dead letter keeps its trace.
    let d = next(&c);
    let fate = c.fail_traced(
        d,
        "PDOException: gone away",
        "#0 Order.php(12): close()",
        Retry::Backoff,
    );
    assert!(matches!(fate, delayq::Fate::Dead(_)), "{fate:?}");
    wait_for(Duration::from_secs(5), "dead", || q.stats().is_ok_and(|s| s.dead == 1));
    let dead = q.dead_letters(10).expect("dead letters");
    assert_eq!(dead[0].error_trace.as_deref(), Some("#0 Order.php(12): close()"));
    let info = q.get(&id).expect("get").expect("known");
    assert_eq!(
        (info.state, info.error_trace.as_deref()),
        (State::Dead, Some("#0 Order.php(12): close()"))
    );

    // Requeued, it keeps its history until it fails again or completes.
    assert_eq!(q.requeue_dead(Some(&id)).expect("requeue"), 1);
    assert!(trace_of(&q, &id).is_some());
    let d = next(&c);
    c.ack(d);
    assert_eq!(c.finish().acked, 2, "the other message and the requeued one");
    assert_eq!(q.get(&id).expect("get"), None);
    assert_eq!(
        traces_held(&server),
        0,
        "an acknowledged message leaves no trace behind"
    );
    assert_no_leak(&server, TAG);
}

#[test]
fn an_expired_lease_and_every_way_out_drop_the_trace() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    let ids: Vec<String> = (0..3)
        .map(|i| q.push(&json!({"order": i}), Duration::ZERO).expect("push"))
        .collect();
    let c = pool(&q, 3);
    for _ in 0..3 {
        let d = next(&c);
        c.fail_traced(
            d,
            "boom",
            "Traceback (most recent call last):\n  ...",
            Retry::After(Duration::from_millis(300)),
        );
    }
    wait_for(Duration::from_secs(5), "three traces", || traces_held(&server) == 3);

    assert_eq!(c.finish().retried, 3);
    // One of them is claimed again by a handler that hangs (its heartbeat stops at
    // `timeout`): the lease expiry becomes its error.
    let hung_pool = Worker::new(
        q.clone(),
        WorkerOptions {
            threads: 1,
            prefetch: 1,
            timeout: Some(Duration::from_millis(50)),
            ..opts()
        },
    )
    .expect("worker");
    let hung_consumer = hung_pool.start().expect("start");
    let hung = next(&hung_consumer);
    let c = pool(&q, 3);
    for _ in 0..3 {
        let d = next(&c);
        if d.id == hung.id {
            assert_eq!(d.attempt, 3, "attempt 1 failed, attempt 2 hung");
            let info = q.get(&d.id).expect("get").expect("known");
            assert!(
                info.last_error.as_deref().is_some_and(|e| e.contains("lease expired")),
                "{info:?}"
            );
            assert_eq!(info.error_trace, None, "the trace belonged to the attempt before");
            c.ack(d);
        } else {
            c.fail_traced(d, "boom", "trace", Retry::Never);
        }
    }
    let s = c.finish();
    assert_eq!((s.acked, s.dead), (1, 2));
    hung_consumer.ack(hung);
    assert_eq!(hung_consumer.finish().lease_lost, 1);
    wait_for(Duration::from_secs(5), "two dead", || {
        q.stats().is_ok_and(|s| s.dead == 2)
    });
    assert_eq!(traces_held(&server), 2);
    let dead = q.dead_letters(10).expect("dead");
    assert_eq!(q.delete_dead(Some(&dead[0].id)).expect("delete"), 1);
    assert_eq!(traces_held(&server), 1);
    assert!(ids.contains(&dead[1].id));
    assert!(q.purge().expect("purge") >= 1);
    assert_eq!(traces_held(&server), 0);
    assert!(server.dump_keys().iter().all(|k| !k.ends_with(":traces")));
}

#[test]
fn a_long_trace_is_cut_to_max_trace_bytes_and_zero_keeps_none() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    let long: String = (0..2000)
        .map(|i| format!("#{i} App\\Jobs\\CloseOrder->handle()\n"))
        .collect();
    for (max, expect_kept) in [(1000, true), (0, false)] {
        let id = q.push(&json!({"max": max}), Duration::ZERO).expect("push");
        let c = Worker::new(
            q.clone(),
            WorkerOptions {
                max_trace_bytes: max,
                ..opts()
            },
        )
        .expect("worker")
        .start()
        .expect("start");
        let d = next(&c);
        assert_eq!(d.id, id);
        c.fail_traced(d, "boom", &long, Retry::Never);
        assert_eq!(c.finish().dead, 1);
        let info = q.get(&id).expect("get").expect("known");
        assert_eq!(info.last_error.as_deref(), Some("boom"));
        match info.error_trace {
            Some(kept) => {
                assert!(expect_kept, "max_trace_bytes 0 keeps none");
                assert!(kept.len() <= 1000, "{}", kept.len());
                assert!(kept.starts_with("#0 App\\Jobs\\CloseOrder->handle()\n#1 "), "{kept}");
                assert!(kept.ends_with("#1999 App\\Jobs\\CloseOrder->handle()\n"), "{kept}");
                assert!(kept.contains("bytes left out"), "{kept}");
            }
            None => assert!(!expect_kept, "a 1000-byte cut of the trace was expected"),
        }
    }
}

#[test]
fn a_max_trace_bytes_beyond_the_limit_is_refused_by_name() {
    let server = RedisServer::start();
    let refused = Worker::new(
        server.queue("orders"),
        WorkerOptions {
            max_trace_bytes: delayq::MAX_TRACE_BYTES + 1,
            ..opts()
        },
    );
    let Err(err) = refused else {
        panic!("a max_trace_bytes over the limit was accepted")
    };
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    assert!(err.to_string().contains("max_trace_bytes"), "{err}");
}
