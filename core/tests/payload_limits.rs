//! What push accepts, every consumer delivers: a payload nested as deep as
//! `MAX_DEPTH` reaches its handler; one level deeper is refused at push, and one
//! written past push (by hand, another tool) goes to the dead letters at its first
//! claim with the reason, never to a handler. A message buried because earlier
//! deliveries used up `max_attempts` keeps its last error. A payload, error or trace
//! written past every limit leaves the listings fast: they show its size, not it.

mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::{RedisServer, run_until_empty};
use delayq::{Error, Listing, MAX_DEPTH, MAX_ERROR_TEXT_BYTES, NewMessage, Queue, QueueOptions, Worker, WorkerOptions};

fn deep(levels: usize) -> String {
    format!("{}1{}", "[".repeat(levels), "]".repeat(levels))
}

fn drain(q: &delayq::Queue, opts: WorkerOptions) -> Vec<String> {
    let seen = Mutex::new(Vec::new());
    run_until_empty(q, opts, |d| {
        let v: serde_json::Value = d.payload().map_err(|e| e.to_string())?;
        seen.lock().expect("lock").push(v.to_string());
        Ok(())
    });
    seen.into_inner().expect("lock")
}

#[test]
fn a_payload_at_the_depth_limit_is_delivered_and_one_past_it_is_refused() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    q.push_json(deep(MAX_DEPTH), delayq::Due::NOW, &Default::default())
        .expect("at the limit");
    let err = q
        .push_json(deep(MAX_DEPTH + 1), delayq::Due::NOW, &Default::default())
        .expect_err("past the limit");
    assert!(matches!(err, Error::PayloadNotSerializable(_)), "{err:?}");
    assert!(err.to_string().contains("the limit is 128"), "{err}");
    let seen = drain(&q, WorkerOptions::default());
    assert_eq!(seen, [deep(MAX_DEPTH)]);
    assert_eq!(q.stats().expect("stats").dead, 0);
}

#[test]
fn a_stored_payload_too_deep_to_decode_is_dead_lettered_at_its_first_claim() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    let id = q.push_json("0", delayq::Due::NOW, &Default::default()).expect("push");
    // Rewrite its envelope with a payload deeper than push allows.
    let mut con = server.con();
    let stored: String = redis::cmd("HGET")
        .arg("{dq:orders}:messages")
        .arg(&id)
        .query(&mut con)
        .expect("HGET");
    let deeper = stored.replace("\"payload\":0", &format!("\"payload\":{}", deep(MAX_DEPTH + 1)));
    assert_ne!(deeper, stored);
    let _: () = redis::cmd("HSET")
        .arg("{dq:orders}:messages")
        .arg(&id)
        .arg(&deeper)
        .query(&mut con)
        .expect("HSET");
    let seen = drain(&q, WorkerOptions::default());
    assert!(seen.is_empty(), "a handler got it: {seen:?}");
    let dead = q.dead_letters(10).expect("dead");
    assert_eq!(dead.len(), 1);
    assert!(
        dead[0].last_error.contains("nested 129 levels deep, the limit is 128"),
        "{}",
        dead[0].last_error
    );
}

#[test]
fn a_message_past_a_lowered_max_attempts_keeps_its_last_error() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    let id = q.push(&1, Duration::ZERO).expect("push");
    // Two failed attempts under a pool that allows five, then it stops.
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            backoff_base: Duration::from_millis(1),
            backoff_max: Duration::from_millis(1),
            ..WorkerOptions::default()
        },
    )
    .expect("worker");
    let stopper = worker.stopper();
    let failures = std::sync::atomic::AtomicUsize::new(0);
    let summary = worker
        .run(1, |_| {
            if failures.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 1 {
                stopper.stop();
            }
            Err("card declined".into())
        })
        .expect("run");
    assert_eq!(summary.failed, 2);
    assert!(
        q.reschedule(&id, Duration::ZERO).expect("reschedule"),
        "it waits for its retry"
    );
    // The next pool allows one: the message is buried at its claim, unrun.
    let seen = drain(
        &q,
        WorkerOptions {
            max_attempts: 1,
            ..WorkerOptions::default()
        },
    );
    assert!(seen.is_empty(), "{seen:?}");
    let dead = q.dead_letters(10).expect("dead");
    assert_eq!(dead.len(), 1);
    let error = &dead[0].last_error;
    assert!(
        error.starts_with("gave up after 2 attempts (max_attempts 1)"),
        "{error}"
    );
    assert!(error.contains("card declined"), "{error}");
    assert_eq!(dead[0].attempts, 2);
    assert_eq!(q.get(&id).expect("get").expect("dead").attempts, 2);
}

#[test]
fn a_batch_that_names_a_too_deep_item_writes_nothing() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    let batch = vec![
        NewMessage::new(&1, Duration::ZERO).expect("message"),
        NewMessage {
            payload_json: deep(MAX_DEPTH + 1).into(),
            ..NewMessage::new(&1, Duration::ZERO).expect("message")
        },
    ];
    let err = q.push_many(&batch).expect_err("too deep");
    assert!(err.to_string().contains("item 1"), "{err}");
    assert!(server.dump_keys().is_empty());
}

#[test]
fn integers_past_the_signed_64_bit_range_are_refused_by_path_and_write_nothing() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    // PHP would receive these as rounded floats.
    let err = q
        .push(&serde_json::json!({"order": {"ids": [1, u64::MAX]}}), Duration::ZERO)
        .expect_err("u64::MAX");
    assert!(matches!(err, Error::PayloadNotSerializable(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains(r#"payload["order"]["ids"][1] is 18446744073709551615, outside the signed 64-bit range"#),
        "{err}"
    );
    let batch = [
        NewMessage::new(&serde_json::json!({"n": 1}), Duration::ZERO).expect("payload"),
        NewMessage::new(&serde_json::json!({"n": i64::MAX as u64 + 1}), Duration::ZERO).expect("payload"),
    ];
    let err = q.push_many(&batch).expect_err("one item past the range");
    assert!(err.to_string().contains("9223372036854775808"), "{err}");
    assert!(
        server.dump_keys().is_empty(),
        "nothing written: {:?}",
        server.dump_keys()
    );
    // The edges themselves go through, exactly.
    let edges = serde_json::json!({"max": i64::MAX, "min": i64::MIN});
    q.push(&edges, Duration::ZERO).expect("the edges");
    assert_eq!(drain(&q, WorkerOptions::default()), [edges.to_string()]);
}

/// Rewrite field `id` of `hash` so that its `"pad":""` holds `pad`, as a producer that
/// bypasses its own limits (or writes the hash itself) would.
fn pad_stored(con: &mut redis::Connection, hash: &str, id: &str, pad: &str) -> usize {
    let stored: String = redis::cmd("HGET").arg(hash).arg(id).query(con).expect("HGET");
    let padded = stored.replacen(r#""pad":"""#, &format!(r#""pad":"{pad}""#), 1);
    assert_ne!(padded, stored, "{hash} {id}");
    let _: () = redis::cmd("HSET")
        .arg(hash)
        .arg(id)
        .arg(&padded)
        .query(con)
        .expect("HSET");
    padded.len()
}

#[test]
fn listings_show_the_size_of_a_huge_payload_and_cut_a_huge_trace() {
    let server = RedisServer::start();
    let q: Queue = server.queue_with(
        "orders",
        QueueOptions {
            keep_completed: 10,
            ..Default::default()
        },
    );
    let payload = |name: &str| serde_json::json!({"order": "order-7", "name": name, "pad": ""});
    let doomed = delayq::PushOptions {
        max_attempts: Some(1),
        ..Default::default()
    };
    let mut ids = std::collections::BTreeMap::new();
    for name in ["small-dead", "big-dead"] {
        let id = q
            .push_json(payload(name).to_string(), delayq::Due::NOW, &doomed)
            .expect("push");
        ids.insert(name, id);
    }
    run_until_empty(&q, WorkerOptions::default(), |_| Err("gave up".into()));
    for name in ["small-done", "big-done"] {
        ids.insert(name, q.push(&payload(name), Duration::ZERO).expect("push"));
    }
    run_until_empty(&q, WorkerOptions::default(), |_| Ok(()));
    for name in ["small-waiting", "big-waiting"] {
        ids.insert(name, q.push(&payload(name), Duration::from_secs(3600)).expect("push"));
    }
    let stats = q.stats().expect("stats");
    assert_eq!((stats.dead, stats.completed, stats.scheduled), (2, 2, 2));

    let mut con = server.con();
    let pad = "x".repeat(20 << 20);
    let mut sizes = std::collections::BTreeMap::new();
    for name in ["big-dead", "big-waiting"] {
        sizes.insert(name, pad_stored(&mut con, "{dq:orders}:messages", &ids[name], &pad));
    }
    sizes.insert(
        "big-done",
        pad_stored(&mut con, "{dq:orders}:completed_messages", &ids["big-done"], &pad),
    );
    // A trace and an error of a megabyte each, from their start to their end.
    let trace = format!("trace-start\n{}\ntrace-end", "t".repeat(1 << 20));
    let error = format!("error-start {} error-end", "e".repeat(1 << 20));
    let _: () = redis::cmd("HSET")
        .arg("{dq:orders}:traces")
        .arg(&ids["big-dead"])
        .arg(&trace)
        .query(&mut con)
        .expect("HSET");
    let _: () = redis::cmd("HSET")
        .arg("{dq:orders}:errors")
        .arg(&ids["big-dead"])
        .arg(&error)
        .query(&mut con)
        .expect("HSET");

    let shown = |name: &str, got: &str, omitted: Option<u64>| {
        if name.starts_with("small") {
            assert_eq!((got, omitted), (payload(name).to_string().as_str(), None), "{name}");
        } else {
            // Not the text in the message: a failure would print megabytes.
            assert!(
                got.is_empty() && omitted == Some(sizes[name] as u64),
                "{name}: {} bytes shown, {omitted:?} left out",
                got.len()
            );
        }
    };
    let waiting = q.list(Listing::Waiting, 10).expect("waiting");
    let completed = q.list(Listing::Completed, 10).expect("completed");
    for (m, state) in waiting
        .iter()
        .map(|m| (m, "waiting"))
        .chain(completed.iter().map(|m| (m, "done")))
    {
        let name = ids
            .iter()
            .find(|(_, id)| **id == m.id)
            .map(|(n, _)| *n)
            .expect("a known id");
        assert!(name.ends_with(state), "{name} listed as {state}");
        shown(name, &m.payload_json, m.payload_omitted_bytes);
    }
    assert_eq!((waiting.len(), completed.len()), (2, 2));
    let done = completed.iter().find(|m| m.id == ids["big-done"]).expect("listed");
    assert_eq!(done.attempts, 1, "a left-out completed message keeps its attempts");
    assert!(done.due_at_ms.is_some(), "and its due time");

    let dead = q.dead_letters(10).expect("dead letters");
    assert_eq!(dead.len(), 2);
    for d in &dead {
        let name = ids
            .iter()
            .find(|(_, id)| **id == d.id)
            .map(|(n, _)| *n)
            .expect("a known id");
        shown(name, &d.payload_json, d.payload_omitted_bytes);
    }
    let big = dead.iter().find(|d| d.id == ids["big-dead"]).expect("listed");
    let cut = big.error_trace.as_deref().expect("a trace");
    assert!(cut.len() <= Queue::LISTED_TRACE_BYTES, "{}", cut.len());
    assert!(
        cut.starts_with("trace-start") && cut.ends_with("trace-end"),
        "{}",
        &cut[..40]
    );
    assert!(cut.contains(" bytes left out ...]"), "the cut says so");
    assert!(big.last_error.len() <= MAX_ERROR_TEXT_BYTES, "{}", big.last_error.len());
    assert!(big.last_error.starts_with("error-start") && big.last_error.ends_with("error-end"));
    let small = dead.iter().find(|d| d.id == ids["small-dead"]).expect("listed");
    assert_eq!(small.last_error, "gave up");

    let found = q.find("order-7", 10).expect("find");
    assert_eq!(found.len(), 6);
    for m in &found {
        let name = ids
            .iter()
            .find(|(_, id)| **id == m.id)
            .map(|(n, _)| *n)
            .expect("a known id");
        shown(name, &m.payload_json, m.payload_omitted_bytes);
    }
    let traced = found.iter().find(|m| m.id == ids["big-dead"]).expect("found");
    assert!(
        traced
            .error_trace
            .as_deref()
            .is_some_and(|t| t.len() <= Queue::LISTED_TRACE_BYTES)
    );

    // One message asked for by its id comes whole, and so does a listing told to.
    let whole = q.get(&ids["big-waiting"]).expect("get").expect("known");
    assert_eq!(
        (whole.payload_json.len() > 20 << 20, whole.payload_omitted_bytes),
        (true, None)
    );
    assert_eq!(
        q.get(&ids["big-dead"]).expect("get").expect("known").error_trace,
        Some(trace)
    );
    let all = q
        .list_page_with(Listing::Waiting, 0, 10, usize::MAX)
        .expect("waiting, whole");
    assert!(
        all.iter()
            .all(|m| m.payload_omitted_bytes.is_none() && !m.payload_json.is_empty())
    );
}

/// Bytes Redis has sent its clients so far (`INFO stats`).
fn net_output(con: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("stats").query(con).expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("total_net_output_bytes:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("total_net_output_bytes")
}

#[test]
fn a_message_past_the_workers_max_payload_bytes_is_buried_unread() {
    buried_unread(false);
}

/// With serial keys the claim reads the envelopes itself: its read is bounded too.
#[test]
fn a_message_past_the_workers_max_payload_bytes_is_buried_unread_with_serial_keys() {
    buried_unread(true);
}

fn buried_unread(keyed: bool) {
    let server = RedisServer::start();
    let q = server.queue("orders");
    let options = |i: usize| delayq::PushOptions {
        serial_key: keyed.then(|| format!("customer-{i}")),
        ..Default::default()
    };
    let small: Vec<String> = (0..3)
        .map(|i| {
            q.push_json(format!("{{\"order\":{i}}}"), delayq::Due::NOW, &options(i))
                .expect("push")
        })
        .collect();
    // Written around the producer's limit: 20 MB straight into its envelope.
    let big = q.push_json("0", delayq::Due::NOW, &options(3)).expect("push");
    let mut con = server.con();
    let stored: String = redis::cmd("HGET")
        .arg("{dq:orders}:messages")
        .arg(&big)
        .query(&mut con)
        .expect("HGET");
    let huge = format!("\"payload\":\"{}\"", "x".repeat(20 << 20));
    let rewritten = stored.replace("\"payload\":0", &huge);
    assert!(rewritten.len() > 20 << 20);
    let _: () = redis::cmd("HSET")
        .arg("{dq:orders}:messages")
        .arg(&big)
        .arg(&rewritten)
        .query(&mut con)
        .expect("HSET");

    let before = net_output(&mut con);
    let seen = Mutex::new(Vec::new());
    let summary = run_until_empty(
        &q,
        WorkerOptions {
            max_payload_bytes: 1 << 20,
            ..Default::default()
        },
        |d| {
            seen.lock().expect("lock").push(d.id.clone());
            Ok(())
        },
    );
    // The pool's whole run, its claims and reads included: the big one never left Redis.
    let sent = net_output(&mut con) - before;
    assert!(sent < 1 << 20, "Redis sent {sent} bytes during the run");

    let mut seen = seen.into_inner().expect("lock");
    seen.sort();
    let mut expected = small.clone();
    expected.sort();
    assert_eq!(seen, expected, "the handler saw the small ones only");
    assert_eq!((summary.handled, summary.failed), (3, 0), "{summary:?}");
    let dead = q.dead_letters(10).expect("dead letters");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id, big);
    assert_eq!(
        dead[0].last_error,
        format!(
            "message of {} bytes is past this worker's max_payload_bytes (1048576): not loaded",
            rewritten.len()
        )
    );
    // Its one delivery, as for a message that expired unrun: no failure was counted.
    assert_eq!(dead[0].attempts, 1);
    // Still there, whole, for whoever raises the bound and requeues it.
    let kept = q.get(&big).expect("get").expect("known");
    assert!(kept.payload_json.len() > 20 << 20);
}

#[test]
fn a_payload_a_little_past_the_workers_bound_is_buried_though_read() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    let fits = q
        .push_json("\"fits\"", delayq::Due::NOW, &Default::default())
        .expect("push");
    let over = format!("\"{}\"", "y".repeat(200));
    let past = q
        .push_json(over.clone(), delayq::Due::NOW, &Default::default())
        .expect("push");
    let seen = Mutex::new(Vec::new());
    run_until_empty(
        &q,
        WorkerOptions {
            max_payload_bytes: 100,
            ..Default::default()
        },
        |d| {
            seen.lock().expect("lock").push(d.id.clone());
            Ok(())
        },
    );
    assert_eq!(seen.into_inner().expect("lock"), [fits]);
    let dead = q.dead_letters(10).expect("dead letters");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id, past);
    assert_eq!(
        dead[0].last_error,
        format!(
            "payload of {} bytes is past this worker's max_payload_bytes (100)",
            over.len()
        )
    );
}

#[test]
fn a_workers_max_payload_bytes_out_of_range_is_refused_by_name() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    for bad in [0, delayq::MAX_PAYLOAD_BYTES + 1] {
        let Err(err) = Worker::new(
            q.clone(),
            WorkerOptions {
                max_payload_bytes: bad,
                ..Default::default()
            },
        ) else {
            panic!("max_payload_bytes {bad} was accepted")
        };
        assert!(err.to_string().contains("max_payload_bytes"), "{err}");
    }
    assert_eq!(
        WorkerOptions::default().max_payload_bytes,
        delayq::DEFAULT_MAX_PAYLOAD_BYTES
    );
}
