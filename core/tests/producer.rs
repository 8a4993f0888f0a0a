//! Producer and admin API against a real redis-server.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use common::{RedisServer, assert_no_leak, wait_for};
use delayq::{Due, NewMessage, PushOptions, State};
use serde_json::json;

#[test]
fn push_then_get_reports_state_payload_and_due_time() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    let before = server.now_ms();
    let id = q
        .push(&json!({"order_id": 10086, "action": "close"}), Duration::from_secs(60))
        .expect("push");
    let info = q.get(&id).expect("get").expect("exists");
    assert_eq!(info.state, State::Scheduled);
    assert_eq!(info.payload_json, r#"{"order_id":10086,"action":"close"}"#);
    let due = info.due_at_ms.expect("due");
    assert!(
        due >= before + 60_000 && due <= before + 61_000,
        "due {due} vs now {before}"
    );
    assert_eq!(info.attempts, 0);
    assert_eq!(info.last_error, None);
    let created = info.created_at_ms.expect("created");
    assert!((created - before).abs() < 5_000, "created {created} vs now {before}");

    let now_id = q.push(&json!(1), Duration::ZERO).expect("push");
    assert_eq!(q.get(&now_id).expect("get").expect("exists").state, State::Ready);
    assert!(q.get("no-such-id").expect("get").is_none());
    assert_no_leak(&server, "{dq:orders}");
}

#[test]
fn payload_text_survives_exactly() {
    let server = RedisServer::start();
    let q = server.queue("exact");
    let text = r#"{"z":1,"a":9223372036854775807,"n":-9223372036854775808,"u":"日本語 ✓","nested":{"b":[1,{"c":null}],"a":true}}"#;
    let id = q.push_json(text, Due::NOW, &PushOptions::default()).expect("push");
    assert_eq!(q.get(&id).expect("get").expect("exists").payload_json, text);
}

#[test]
fn push_at_uses_absolute_time_and_past_times_are_due_now() {
    let server = RedisServer::start();
    let q = server.queue("at");
    let at = SystemTime::UNIX_EPOCH + Duration::from_millis(4_102_444_800_123); // 2100-01-01
    let id = q.push_at(&"later", at).expect("push_at");
    assert_eq!(
        q.get(&id).expect("get").expect("exists").due_at_ms,
        Some(4_102_444_800_123)
    );
    let past = q
        .push_at(&"past", SystemTime::UNIX_EPOCH + Duration::from_secs(1))
        .expect("push_at");
    assert_eq!(q.get(&past).expect("get").expect("exists").state, State::Ready);
}

#[test]
fn a_caller_supplied_id_makes_push_idempotent() {
    let server = RedisServer::start();
    let q = server.queue("idem");
    let opts = PushOptions {
        id: Some("order-42-close".into()),
        max_attempts: Some(3),
        ..Default::default()
    };
    let first = q
        .push_json(r#"{"v":1}"#, Due::In(Duration::from_secs(30)), &opts)
        .expect("push");
    let second = q
        .push_json(r#"{"v":2}"#, Due::In(Duration::from_secs(90)), &opts)
        .expect("push again");
    assert_eq!(first, "order-42-close");
    assert_eq!(second, first);
    let info = q.get(&first).expect("get").expect("exists");
    assert_eq!(info.payload_json, r#"{"v":1}"#, "the second push must not overwrite");
    assert_eq!(info.max_attempts, Some(3));
    let stats = q.stats().expect("stats");
    assert_eq!(stats.scheduled, 1);
    assert_eq!(stats.total("pushed"), 1);
}

#[test]
fn push_many_is_one_round_trip_or_two_and_keeps_order() {
    let server = RedisServer::start();
    let q = server.queue("bulk");
    q.ping().expect("ping");
    let calls_before = commands_processed(&server);
    let batch: Vec<NewMessage> = (0..2500)
        .map(|i| NewMessage::new(&json!({"i": i}), Duration::ZERO).expect("message"))
        .collect();
    let ids = q.push_many(&batch).expect("push_many");
    assert_eq!(ids.len(), 2500);
    let calls = commands_processed(&server) - calls_before;
    // The clock read (now.lua; its first call loads it: three commands), then,
    // streamed in one round trip, one SCRIPT LOAD (the connection's first stream) and
    // three script calls of at most 1000; the recipe needs 5000 commands for the same
    // batch. As functions, nothing is loaded: four calls.
    let expected = if common::functions_installed() { 4 } else { 7 };
    assert_eq!(calls, expected, "push_many sent {calls} script commands");
    let stats = q.stats().expect("stats");
    assert_eq!(stats.ready, 2500);
    // Same due millisecond or not, the schedule keeps push order.
    let mut con = server.con();
    let order: Vec<String> = redis::cmd("ZRANGE")
        .arg("{dq:bulk}:scheduled")
        .arg(0)
        .arg(-1)
        .query(&mut con)
        .expect("ZRANGE");
    assert_eq!(order, ids);
    // Fewer than 1000 delays read no clock.
    let delayed = |n: usize| -> Vec<NewMessage> {
        (0..n)
            .map(|i| NewMessage::new(&json!({"i": i}), Duration::from_secs(60)).expect("message"))
            .collect()
    };
    // A connection loads a script before its first stream only.
    let calls_before = commands_processed(&server);
    q.push_many(&batch).expect("push_many");
    let calls = commands_processed(&server) - calls_before;
    assert_eq!(calls, 4, "a second stream sent {calls} script commands");
    for (n, expected) in [(999, 1), (1000, 2)] {
        let calls_before = commands_processed(&server);
        q.push_many(&delayed(n)).expect("push_many");
        let calls = commands_processed(&server) - calls_before;
        assert_eq!(calls, expected, "{n} delays: {calls} script commands");
    }
}

/// Commands the clients sent (script and function calls, script loads); commands run
/// inside scripts are not round trips.
fn commands_processed(server: &RedisServer) -> i64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.con())
        .expect("INFO");
    info.lines()
        .filter(|l| {
            // Redis 6 counts SCRIPT LOAD as "script", 7.0 and later as "script|load".
            [
                "cmdstat_evalsha:",
                "cmdstat_eval:",
                "cmdstat_fcall:",
                "cmdstat_script|load:",
                "cmdstat_script:",
            ]
            .iter()
            .any(|p| l.starts_with(p))
        })
        .filter_map(|l| l.split("calls=").nth(1)?.split(',').next()?.parse::<i64>().ok())
        .sum()
}

#[test]
fn cancel_and_reschedule_only_touch_waiting_messages() {
    let server = RedisServer::start();
    let q = server.queue("cr");
    let id = q.push(&"x", Duration::from_secs(3600)).expect("push");
    assert!(q.reschedule(&id, Duration::from_secs(7200)).expect("reschedule"));
    let due = q.get(&id).expect("get").expect("exists").due_at_ms.expect("due");
    assert!(due > server.now_ms() + 7_000_000);
    assert!(q.reschedule(&id, Due::NOW).expect("reschedule"));
    assert_eq!(q.get(&id).expect("get").expect("exists").state, State::Ready);
    assert!(q.cancel(&id).expect("cancel"));
    assert!(!q.cancel(&id).expect("cancel twice"));
    assert!(!q.reschedule(&id, Due::NOW).expect("reschedule gone"));
    assert!(q.get(&id).expect("get").is_none());
    assert_eq!(q.stats().expect("stats").total("cancelled"), 1);
    assert_no_leak(&server, "{dq:cr}");
}

#[test]
fn purge_deletes_everything_and_reports_the_count() {
    let server = RedisServer::start();
    let q = server.queue("p");
    for i in 0..10 {
        q.push(&i, Duration::from_secs(i)).expect("push");
    }
    assert_eq!(q.purge().expect("purge"), 10);
    let s = q.stats().expect("stats");
    assert_eq!((s.scheduled, s.ready, s.inflight, s.dead), (0, 0, 0, 0));
    assert_eq!(q.purge().expect("purge again"), 0);
}

#[test]
fn queues_with_different_names_or_prefixes_are_independent() {
    let server = RedisServer::start();
    let a = server.queue("a");
    let b = server.queue("b");
    let other_prefix = server.queue_with(
        "a",
        delayq::QueueOptions {
            prefix: "app2".into(),
            ..Default::default()
        },
    );
    a.push(&1, Duration::ZERO).expect("push");
    assert_eq!(a.stats().expect("stats").ready, 1);
    assert_eq!(b.stats().expect("stats").ready, 0);
    assert_eq!(other_prefix.stats().expect("stats").ready, 0);
    // The queue's keys, and the registry of queues of its prefix (see registry.rs).
    assert!(
        server
            .dump_keys()
            .iter()
            .all(|k| k.starts_with("{dq:a}:") || k == "dq:queues")
    );
}

#[test]
fn a_replacing_push_debounces_a_waiting_message_revives_a_dead_one_and_leaves_a_running_one() {
    let server = RedisServer::start();
    let q = server.queue("carts");
    let push = |v: i64, delay: Duration, replace: bool, max_attempts: Option<u32>| {
        let opts = PushOptions {
            id: Some("close-cart-1".into()),
            replace,
            max_attempts,
            ..Default::default()
        };
        q.push_json(json!({"v": v}).to_string(), delay.into(), &opts)
            .expect("push")
    };
    let payload = || q.get("close-cart-1").expect("get").expect("exists").payload_json;

    let before = server.now_ms();
    assert_eq!(push(1, Duration::from_secs(60), true, None), "close-cart-1");
    push(2, Duration::from_secs(1800), true, None);
    let info = q.get("close-cart-1").expect("get").expect("exists");
    assert_eq!(info.payload_json, r#"{"v":2}"#);
    assert!(
        info.due_at_ms.expect("due") >= before + 1_800_000,
        "the timer starts again"
    );
    push(3, Duration::ZERO, false, None);
    assert_eq!(payload(), r#"{"v":2}"#, "without replace the message is kept");
    let s = q.stats().expect("stats");
    assert_eq!((s.scheduled, s.total("pushed"), s.total("replaced")), (1, 1, 1));

    // Due now, one attempt: a consumer takes it.
    push(4, Duration::ZERO, true, Some(1));
    let worker = delayq::Worker::new(q.clone(), delayq::WorkerOptions::default()).expect("worker");
    let consumer = worker.start().expect("start");
    let running = match consumer.recv_timeout(Duration::from_secs(10)) {
        delayq::Received::Message(d) => d,
        other => panic!("the replaced message never came: {other:?}"),
    };
    assert_eq!(running.payload_json(), r#"{"v":4}"#);
    push(5, Duration::ZERO, true, None);
    let info = q.get("close-cart-1").expect("get").expect("exists");
    assert_eq!(
        (info.state, info.payload_json.as_str()),
        (State::Inflight, r#"{"v":4}"#),
        "a running one is left"
    );

    consumer.fail(running, "gateway down");
    consumer.finish();
    assert_eq!(q.get("close-cart-1").expect("get").expect("exists").state, State::Dead);
    push(6, Duration::from_secs(60), true, None);
    let info = q.get("close-cart-1").expect("get").expect("exists");
    assert_eq!(
        (info.state, info.payload_json.as_str(), info.attempts, info.last_error),
        (State::Scheduled, r#"{"v":6}"#, 0, None),
        "a dead one starts afresh"
    );
    let s = q.stats().expect("stats");
    assert_eq!((s.dead, s.scheduled, s.total("replaced")), (0, 1, 3));

    // Twice in one batch: the later wins.
    let twice: Vec<NewMessage> = [7, 8]
        .iter()
        .map(|v| NewMessage {
            payload_json: json!({"v": v}).to_string().into(),
            due: Due::NOW,
            options: PushOptions {
                id: Some("close-cart-2".into()),
                replace: true,
                ..Default::default()
            },
        })
        .collect();
    q.push_many(&twice).expect("push_many");
    let info = q.get("close-cart-2").expect("get").expect("exists");
    assert_eq!(info.payload_json, r#"{"v":8}"#);
    assert_eq!(q.stats().expect("stats").total("pushed"), 2);

    let before = server.dump_keys();
    let err = q
        .push_json(
            "1",
            Due::NOW,
            &PushOptions {
                replace: true,
                ..Default::default()
            },
        )
        .expect_err("replace without an id");
    assert!(err.is_invalid_input() && err.to_string().contains("replace"), "{err}");
    assert_eq!(server.dump_keys(), before);
    assert_no_leak(&server, "{dq:carts}");
}

/// push.lua takes the keys of a push without a replacing run only; a batch with one
/// goes to push_replace.lua, which also takes what a replaced message leaves.
#[test]
fn a_batch_with_a_replacing_push_goes_to_the_script_that_holds_its_keys() {
    let server = RedisServer::start();
    let mut con = server.con();
    // push.lua refuses a replacing run before it writes anything.
    let words: Vec<String> = ["new", "1", "delay", "1000", "replace", "m-1", r#""v":1}"#]
        .map(str::to_owned)
        .into();
    let err = common::call_script(&mut con, "push", "split", &words).expect_err("refused");
    assert!(err.to_string().contains("push_replace.lua"), "{err}");
    let keys: Vec<String> = redis::cmd("KEYS").arg("*split*").query(&mut con).expect("KEYS");
    assert!(keys.is_empty(), "{keys:?}");
    assert!(common::call_script(&mut con, "push_replace", "split", &words).is_ok());

    // Through the API: a batch of a new message and a replacing one is one call.
    let q = server.queue("carts");
    let keep = PushOptions {
        id: Some("cart-1".into()),
        ..Default::default()
    };
    q.push_json(r#"{"v":1}"#.to_owned(), Duration::from_secs(60).into(), &keep)
        .expect("push");
    let mut plain = NewMessage::new(&json!({"v": "plain"}), Duration::from_secs(60)).expect("message");
    plain.options.id = Some("cart-2".into());
    let mut again = NewMessage::new(&json!({"v": 2}), Duration::from_secs(60)).expect("message");
    again.options = PushOptions {
        replace: true,
        ..keep.clone()
    };
    // The EVAL above left push_replace.lua in Redis's script cache: no load.
    let before = commands_processed(&server);
    q.push_many(&[plain, again]).expect("push_many");
    assert_eq!(commands_processed(&server) - before, 1, "one script call");
    assert_eq!(q.get("cart-1").expect("get").expect("kept").payload_json, r#"{"v":2}"#);
    assert!(q.get("cart-2").expect("get").is_some());
    let s = q.stats().expect("stats");
    assert_eq!((s.scheduled, s.total("pushed"), s.total("replaced")), (2, 2, 1));
}

#[test]
fn a_shared_queue_keeps_its_connection_and_the_least_recently_used_goes_first() {
    use delayq::{MAX_SHARED_QUEUES, Queue, QueueOptions};
    let server = RedisServer::start();
    let mut inspector = server.con();
    let mut connections = || -> i64 {
        let info: String = redis::cmd("INFO").arg("stats").query(&mut inspector).expect("INFO");
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("total_connections_received")
    };
    let shared = |name: &str| Queue::shared(&server.url(), name, QueueOptions::default()).expect("queue");
    let before = connections();
    for i in 0..10 {
        shared("kept").push(&i, Duration::ZERO).expect("push");
    }
    assert_eq!(connections() - before, 1, "ten handles, one connection");
    let other = QueueOptions {
        dead_max: 5,
        ..QueueOptions::default()
    };
    Queue::shared(&server.url(), "kept", other)
        .expect("queue")
        .push(&10, Duration::ZERO)
        .expect("push");
    assert_eq!(connections() - before, 2, "other options, another queue");
    assert_eq!(shared("kept").stats().expect("stats").ready, 11);

    // Fill the cache with others; "kept" was asked for least recently and goes.
    for i in 0..MAX_SHARED_QUEUES {
        shared(&format!("other{i}")).ping().expect("ping");
    }
    let before = connections();
    shared("other1").ping().expect("ping");
    assert_eq!(connections() - before, 0, "still kept");
    shared("kept").ping().expect("ping");
    assert_eq!(connections() - before, 1, "dropped, so connected anew");
}

#[test]
fn a_streamed_batch_that_fails_writes_nothing_and_leaves_the_connection_in_step() {
    let server = RedisServer::start();
    let q = server.queue("streamed");
    let mut con = server.con();
    // A string where the stats hash goes: every call of the batch is refused before
    // it writes.
    let _: () = redis::cmd("SET")
        .arg("{dq:streamed}:stats")
        .arg("stray")
        .query(&mut con)
        .expect("SET");
    let batch = |from: usize| -> Vec<NewMessage> {
        (from..from + 1500)
            .map(|i| NewMessage::new(&json!({"i": i}), Duration::from_secs(60)).expect("message"))
            .collect()
    };
    let err = q.push_many(&batch(0)).expect_err("a stats key of the wrong type");
    assert!(
        err.to_string().contains("key {dq:streamed}:stats holds a string"),
        "{err}"
    );
    let written: i64 = redis::cmd("EXISTS")
        .arg("{dq:streamed}:scheduled")
        .arg("{dq:streamed}:messages")
        .query(&mut con)
        .expect("EXISTS");
    assert_eq!(written, 0, "a refused batch wrote");
    // Every reply of the failed stream was read: the next calls on the same connection
    // get their own.
    let _: () = redis::cmd("DEL")
        .arg("{dq:streamed}:stats")
        .query(&mut con)
        .expect("DEL");
    let ids = q.push_many(&batch(1500)).expect("push_many");
    let one = q.push(&json!({"i": "last"}), Duration::from_secs(60)).expect("push");
    assert_eq!(
        q.get(&one).expect("get").expect("exists").payload_json,
        r#"{"i":"last"}"#
    );
    assert_eq!(
        q.get(&ids[1499]).expect("get").expect("exists").payload_json,
        r#"{"i":2999}"#
    );
    assert_eq!(q.stats().expect("stats").scheduled, 1501);
}

#[test]
fn a_batch_over_partitions_that_fails_in_one_writes_the_others_and_stays_in_step() {
    let server = RedisServer::start();
    let q = server.queue_with(
        "parted",
        delayq::QueueOptions {
            partitions: 2,
            ..delayq::QueueOptions::default()
        },
    );
    let batch = |from: usize, n: usize| -> Vec<NewMessage> {
        (from..from + n)
            .map(|i| NewMessage::new(&json!({"i": i}), Duration::from_secs(60)).expect("message"))
            .collect()
    };
    // Both partitions' keys exist after a first batch.
    q.push_many(&batch(0, 200)).expect("push_many");
    let mut con = server.con();
    let mut stats: Vec<String> = redis::cmd("KEYS")
        .arg("{dq:parted*:stats")
        .query(&mut con)
        .expect("KEYS");
    stats.sort();
    assert_eq!(stats.len(), 2, "{stats:?}");
    let schedule = |stats_key: &str| stats_key.replace(":stats", ":scheduled");
    let sizes = |con: &mut redis::Connection| -> Vec<i64> {
        stats
            .iter()
            .map(|k| redis::cmd("ZCARD").arg(schedule(k)).query(con).expect("ZCARD"))
            .collect()
    };
    let before = sizes(&mut con);
    // One partition's stats hash becomes a string: its script is refused before it
    // writes; the other partition's, sent in the same stream, runs.
    let _: () = redis::cmd("DEL").arg(&stats[0]).query(&mut con).expect("DEL");
    let _: () = redis::cmd("SET")
        .arg(&stats[0])
        .arg("stray")
        .query(&mut con)
        .expect("SET");
    let err = q
        .push_many(&batch(200, 1000))
        .expect_err("a stats key of the wrong type");
    assert!(
        err.to_string().contains(&format!("key {} holds a string", stats[0])),
        "{err}"
    );
    let after = sizes(&mut con);
    assert_eq!(after[0], before[0], "the refused partition wrote");
    assert!(
        after[1] > before[1],
        "the other partition's script did not run: {after:?}"
    );
    // The error names what the other partition's script wrote: as many as it added,
    // each stored there.
    let stored: BTreeSet<String> = redis::cmd("HKEYS")
        .arg(stats[1].replace(":stats", ":messages"))
        .query(&mut con)
        .expect("HKEYS");
    let delayq::Error::PartlyWritten {
        ids, written, unknown, ..
    } = &err
    else {
        panic!("not PartlyWritten: {err:?}");
    };
    assert_eq!((ids.len(), unknown.len()), (1000, 0));
    assert_eq!(written.len() as i64, after[1] - before[1]);
    assert!(written.iter().all(|id| stored.contains(id)));
    assert!(
        err.to_string().contains(&format!(
            "{} of the batch's 1000 messages were written and the other {} were not",
            written.len(),
            1000 - written.len()
        )),
        "{err}"
    );
    // Every reply was read: the next calls on the same connection get their own.
    let _: () = redis::cmd("DEL").arg(&stats[0]).query(&mut con).expect("DEL");
    let ids = q.push_many(&batch(1200, 1000)).expect("push_many");
    assert_eq!(
        q.get(&ids[999]).expect("get").expect("exists").payload_json,
        r#"{"i":2199}"#
    );
    let total: i64 = sizes(&mut con).iter().sum();
    assert_eq!(total, before.iter().sum::<i64>() + (after[1] - before[1]) + 1000);
}

#[test]
fn a_stream_cut_after_its_first_call_ran_is_sent_again_as_a_resend() {
    let server = RedisServer::start();
    // Redis refuses a bulk argument longer than this with a protocol error and closes
    // the connection: the second call of the batch below, after the first has run.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("proto-max-bulk-len")
        .arg("1mb")
        .query(&mut server.con())
        .expect("CONFIG SET");
    let q = server.queue_with(
        "cut",
        delayq::QueueOptions {
            max_payload_bytes: 32 << 20,
            connect: delayq::ConnectOptions {
                retry_timeout: Duration::from_millis(500),
                ..delayq::ConnectOptions::default()
            },
            ..delayq::QueueOptions::default()
        },
    );
    // Far past what the socket's buffers take, so that the write fails part way.
    let big = "x".repeat(16 << 20);
    let batch: Vec<NewMessage> = (0..3000)
        .map(|i| {
            let payload = if i == 1000 {
                json!({"i": i, "pad": big})
            } else {
                json!({"i": i})
            };
            NewMessage::new(&payload, Duration::from_secs(60)).expect("message")
        })
        .collect();
    let connections = || -> i64 {
        let info: String = redis::cmd("INFO").arg("stats").query(&mut server.con()).expect("INFO");
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("total_connections_received")
    };
    let before = connections();
    let err = q
        .push_many(&batch)
        .expect_err("the second call is refused, and its connection closed, every time");
    // It reconnected and sent the batch again (the count includes the first of these
    // two looks' own connection).
    let reconnects = connections() - before - 1;
    assert!(reconnects >= 1, "no rerun: {reconnects} reconnects");
    // The first call ran once: each rerun looked its ids up rather than writing them
    // again.
    let stats = q.stats().expect("stats");
    assert_eq!((stats.scheduled, stats.total("pushed")), (1000, 1000), "{stats:?}");
    // And the error says which: the first call's reply was read after the failed
    // write, the second call never reached Redis whole, the third was not sent.
    assert!(err.is_connection(), "{err:?}");
    assert!(
        err.to_string()
            .contains("1000 of the batch's 3000 messages were written and the other 2000 were not"),
        "{err}"
    );
    let delayq::Error::PartlyWritten {
        ids, written, unknown, ..
    } = &err
    else {
        panic!("not PartlyWritten: {err:?}");
    };
    assert_eq!((&written[..], unknown.len()), (&ids[..1000], 0));
    assert!(q.get(&written[999]).expect("get").is_some());
}

#[test]
fn scripts_flushed_from_redis_are_loaded_again_by_every_kind_of_call() {
    let server = RedisServer::start();
    let q = server.queue("flushed");
    let flush = || {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(&mut server.con())
            .expect("SCRIPT FLUSH");
    };
    let mut ids = vec![q.push(&json!({"n": 0}), Duration::ZERO).expect("push")];
    // One script call (EVALSHA, NOSCRIPT, loaded, called again) and one pipeline.
    flush();
    ids.push(q.push(&json!({"n": 1}), Duration::ZERO).expect("push after a flush"));
    flush();
    let batch: Vec<NewMessage> = (2..5)
        .map(|n| NewMessage::new(&json!({"n": n}), Duration::ZERO).expect("message"))
        .collect();
    ids.extend(q.push_many(&batch).expect("push_many after a flush"));
    // A batch streamed as several calls, all sent before the first reply comes back:
    // the connection's first stream loads the script before its calls, and one that
    // finds it flushed (its calls run nothing) goes again.
    let streamed = server.queue("flushed_streamed");
    for round in 1..=2 {
        flush();
        let batch: Vec<NewMessage> = (0..1500)
            .map(|n| NewMessage::new(&json!({"n": n}), Duration::from_secs(3600)).expect("message"))
            .collect();
        streamed.push_many(&batch).expect("a streamed push_many after a flush");
        let stats = streamed.stats().expect("stats");
        assert_eq!(
            (stats.scheduled, stats.total("pushed")),
            (1500 * round, 1500 * round),
            "{stats:?}"
        );
    }
    let stats = q.stats().expect("stats");
    assert_eq!(stats.scheduled + stats.ready, 5, "{stats:?}");

    // A pool's claims and acks, each after a flush.
    let c = delayq::Worker::new(q.clone(), delayq::WorkerOptions::default())
        .expect("worker")
        .start_with(1)
        .expect("start");
    let mut got = Vec::new();
    while got.len() < ids.len() {
        flush();
        match c.recv_timeout(Duration::from_secs(10)) {
            delayq::Received::Message(d) => {
                let id = d.id.clone();
                c.ack(d);
                // Written before the next flush, which would otherwise race the
                // ack's own reload.
                wait_for(Duration::from_secs(5), "the ack written", || {
                    q.get(&id).expect("get").is_none()
                });
                got.push(id);
            }
            other => panic!("expected a delivery, got {other:?}"),
        }
    }
    let summary = c.finish();
    assert_eq!(
        (summary.acked, summary.lease_lost, summary.unwritten),
        (5, 0, 0),
        "{summary:?}"
    );
    got.sort();
    ids.sort();
    assert_eq!(got, ids);
    assert_no_leak(&server, "{dq:flushed}");
}

fn used_memory(server: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO").arg("memory").query(&mut server.con()).expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("used_memory")
}

fn set_maxmemory(server: &RedisServer, bytes: u64) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(bytes)
        .query(&mut server.con())
        .expect("CONFIG SET");
}

/// Push `batch`, two scripts of `MAX_BATCH`, under `maxmemory` limits until one lets
/// the first script in and refuses the second, and return that push's error. Each try
/// starts from an empty server; one that wrote everything had too high a limit, one
/// that wrote nothing too low. Searched for rather than computed: what a script's
/// arguments take while it runs differs between Redis versions.
fn refused_after_its_first_script(server: &RedisServer, q: &delayq::Queue, batch: &[NewMessage]) -> delayq::Error {
    let messages = "{dq:full}:messages";
    let stored = || -> usize { redis::cmd("HLEN").arg(messages).query(&mut server.con()).expect("HLEN") };
    let empty = || {
        set_maxmemory(server, 0);
        let _: () = redis::cmd("FLUSHALL").query(&mut server.con()).expect("FLUSHALL");
    };
    // The scripts loaded, then what one script's messages take.
    q.push_many(&batch[..10]).expect("push");
    empty();
    let before = used_memory(server);
    q.push_many(&batch[..delayq::MAX_BATCH]).expect("push");
    let one = used_memory(server).saturating_sub(before);
    empty();
    let (mut low, mut high) = (before, before + 2 * one);
    for _ in 0..30 {
        let limit = low + (high - low) / 2;
        set_maxmemory(server, limit);
        let result = q.push_many(batch);
        set_maxmemory(server, 0);
        match (result, stored()) {
            (Err(e), n) if n == delayq::MAX_BATCH => return e,
            (Ok(_), _) => high = limit,
            (Err(e), 0) => {
                assert!(e.is_out_of_memory(), "{e}");
                low = limit;
            }
            (result, n) => panic!("{n} messages stored, {result:?}"),
        }
        empty();
    }
    panic!("no maxmemory between {low} and {high} lets one script of the batch in and not the other");
}

#[test]
fn a_streamed_batch_refused_for_memory_after_its_first_script_names_the_ids_it_wrote() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let q = server.queue("full");
    let batch: Vec<NewMessage> = (0..2 * delayq::MAX_BATCH)
        .map(|i| NewMessage::new(&json!({"i": i, "pad": "x".repeat(100)}), Duration::from_secs(60)).expect("message"))
        .collect();
    let err = refused_after_its_first_script(&server, &q, &batch);
    // Still the out-of-memory error it was, for code that catches that.
    assert!(err.is_out_of_memory() && !err.is_retryable(), "{err:?}");
    assert_eq!(err.category(), delayq::Category::OutOfMemory);
    let text = err.to_string();
    assert!(
        text.contains("1000 of the batch's 2000 messages were written and the other 1000 were not"),
        "{text}"
    );
    assert!(!text.contains("nothing was written"), "{text}");
    let delayq::Error::PartlyWritten {
        ids, written, unknown, ..
    } = &err
    else {
        panic!("not PartlyWritten: {err:?}");
    };
    assert_eq!(ids.len(), batch.len());
    assert_eq!(
        written[..],
        ids[..delayq::MAX_BATCH],
        "the first script's ids, in batch order"
    );
    assert_eq!(err.written_ids(), &written[..]);
    assert!(unknown.is_empty(), "{unknown:?}");
    // Exactly those are stored, with their payloads.
    let mut con = server.con();
    let mut stored: Vec<String> = redis::cmd("HKEYS")
        .arg("{dq:full}:messages")
        .query(&mut con)
        .expect("HKEYS");
    stored.sort();
    let mut expected = written.clone();
    expected.sort();
    assert_eq!(stored, expected);
    assert_eq!(q.stats().expect("stats").total("pushed"), 1000);
    let last = q.get(&written[999]).expect("get").expect("exists");
    assert!(last.payload_json.starts_with(r#"{"i":999,"#), "{}", last.payload_json);
    // The advice holds: the whole batch again under those ids writes the rest once.
    let again: Vec<NewMessage> = batch
        .iter()
        .zip(ids)
        .map(|(m, id)| {
            let mut m = m.clone();
            m.options.id = Some(id.clone());
            m
        })
        .collect();
    assert_eq!(&q.push_many(&again).expect("push_many"), ids);
    assert_eq!(q.stats().expect("stats").scheduled, 2000);
}

/// On a cluster a batch's scripts go one by one, and stop at the first refused: the
/// error names the ids of the partitions before it, and those after it were not sent.
#[test]
fn a_cluster_batch_refused_in_its_second_partition_names_the_first_partitions_ids() {
    let cluster = common::Cluster::start(3, 0);
    let q = delayq::Queue::new(
        &cluster.url(),
        "parts",
        delayq::QueueOptions {
            partitions: 3,
            ..delayq::QueueOptions::default()
        },
    )
    .expect("cluster queue");
    let batch = |from: usize, n: usize| -> Vec<NewMessage> {
        (from..from + n)
            .map(|i| NewMessage::new(&json!({"i": i}), Duration::from_secs(60)).expect("message"))
            .collect()
    };
    // Every partition's keys exist after a first batch.
    q.push_many(&batch(0, 300)).expect("push_many");
    let key = |part: usize, role: &str| format!("{}:{role}", q.hash_tag(part).expect("tag"));
    let con = |key: &str| cluster.nodes[cluster.master_of(key)].con();
    let stored = |part: usize| -> BTreeSet<String> {
        let messages = key(part, "messages");
        redis::cmd("HKEYS")
            .arg(&messages)
            .query(&mut con(&messages))
            .expect("HKEYS")
    };
    let before: Vec<BTreeSet<String>> = (0..3).map(stored).collect();
    // Partition 1's stats hash becomes a string: its script is refused before it writes.
    let stats = key(1, "stats");
    let _: () = redis::cmd("DEL").arg(&stats).query(&mut con(&stats)).expect("DEL");
    let _: () = redis::cmd("SET")
        .arg(&stats)
        .arg("stray")
        .query(&mut con(&stats))
        .expect("SET");
    let err = q
        .push_many(&batch(300, 300))
        .expect_err("a stats key of the wrong type");
    let after: Vec<BTreeSet<String>> = (0..3).map(stored).collect();
    assert_eq!(
        (&after[1], &after[2]),
        (&before[1], &before[2]),
        "partition 1 was refused, partition 2 not sent"
    );
    let added: Vec<&String> = after[0].difference(&before[0]).collect();
    assert!(!added.is_empty(), "partition 0's script did not run");
    let delayq::Error::PartlyWritten {
        ids,
        written,
        unknown,
        cause,
    } = &err
    else {
        panic!("not PartlyWritten: {err:?}");
    };
    assert!(matches!(**cause, delayq::Error::WrongType(_)), "{cause:?}");
    assert_eq!((ids.len(), unknown.len()), (300, 0));
    let mut named: Vec<&String> = written.iter().collect();
    named.sort();
    assert_eq!(named, added, "the ids named written are the ones partition 0 stored");
    assert!(
        err.to_string().contains(&format!(
            "{} of the batch's 300 messages were written and the other {} were not",
            written.len(),
            300 - written.len()
        )),
        "{err}"
    );
}

/// Clients connected to `server`, this inspecting connection included.
fn connected_clients(inspector: &mut redis::Connection) -> usize {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(inspector).expect("CLIENT LIST");
    list.lines().count()
}

#[test]
fn queues_made_sharing_a_connection_are_one_client_and_reconnect_together() {
    use delayq::{Layout, Queue, QueueOptions};
    let server = RedisServer::start();
    let mut inspector = server.con();
    let base = server.queue("orders");
    let emails = base
        .sharing_connection(
            "emails",
            QueueOptions {
                partitions: 3,
                ..QueueOptions::default()
            },
        )
        .expect("queue");
    let seed = base
        .sharing_connection(
            "legacy",
            QueueOptions {
                layout: Layout::Seed {
                    zset_key: "old:zset".into(),
                    payload_key: "old:payload".into(),
                },
                ..QueueOptions::default()
            },
        )
        .expect("queue");
    let alone = connected_clients(&mut inspector);
    for i in 0..5 {
        base.push(&i, Duration::ZERO).expect("push");
        emails.push(&i, Duration::from_secs(60)).expect("push");
        seed.push(&i, Duration::from_secs(60)).expect("push");
    }
    assert_eq!(connected_clients(&mut inspector), alone + 1, "three queues, one client");
    assert_eq!(base.stats().expect("stats").ready, 5);
    assert_eq!(emails.stats().expect("stats").scheduled, 5);
    assert_eq!((emails.partitions(), emails.url()), (3, base.url()));
    assert_eq!(seed.stats().expect("stats").scheduled, 5);

    // Their one connection dropped: the next call of either reconnects, once, for both.
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("SKIPME")
        .arg("yes")
        .query(&mut inspector)
        .expect("CLIENT KILL");
    assert_eq!(killed, 1);
    assert_eq!(connected_clients(&mut inspector), alone);
    emails.push(&"after", Duration::from_secs(60)).expect("push");
    base.push(&"after", Duration::ZERO).expect("push");
    seed.ping().expect("ping");
    assert_eq!(
        connected_clients(&mut inspector),
        alone + 1,
        "one new client, for all three"
    );
    assert_eq!(base.stats().expect("stats").ready, 6);
    assert_eq!(emails.stats().expect("stats").scheduled, 6);

    // Validated as `new` validates; the connection's options are the first queue's.
    let err = base
        .sharing_connection("bad{name", QueueOptions::default())
        .expect_err("a brace in the name");
    assert!(err.to_string().contains("queue name"), "{err}");
    let mut other = QueueOptions::default();
    other.connect.read_timeout = Duration::from_secs(1);
    let err = base.sharing_connection("x", other).expect_err("other connect options");
    assert!(err.to_string().contains("connection"), "{err}");
    // A shared queue lends its connection too.
    let shared = Queue::shared(&server.url(), "kept-shared", QueueOptions::default()).expect("queue");
    shared.ping().expect("ping");
    let before = connected_clients(&mut inspector);
    shared
        .sharing_connection("beside-shared", QueueOptions::default())
        .expect("queue")
        .push(&1, Duration::ZERO)
        .expect("push");
    assert_eq!(connected_clients(&mut inspector), before);
}

#[test]
fn a_page_of_the_registry_is_one_bounded_read_however_many_entries_it_holds() {
    use delayq::{MAX_REGISTRY_PAGE, registry::FORGET_AFTER};
    let server = RedisServer::start();
    let mut con = server.con();
    let now = server.now_ms();
    // Entries as anyone with write access to dq:queues could write them.
    let mut zadd = redis::cmd("ZADD");
    zadd.arg("dq:queues");
    for i in 0..20_000 {
        zadd.arg(now - 10_000 - i)
            .arg(format!(r#"{{"name":"spam{i:05}","layout":"native","partitions":1}}"#));
    }
    let _: i64 = zadd.query(&mut con).expect("ZADD");
    let stale = now - i64::try_from(FORGET_AFTER.as_millis()).expect("ms") - 1;
    let _: i64 = redis::cmd("ZADD")
        .arg("dq:queues")
        .arg(now)
        .arg("not json")
        .arg(now - 1)
        .arg(r#"{"name":"dup","layout":"native","partitions":2}"#)
        .arg(now - 2)
        .arg(r#"{"name":"dup","layout":"native","partitions":1}"#)
        .arg(stale)
        .arg(r#"{"name":"forgotten","layout":"native","partitions":1}"#)
        .query(&mut con)
        .expect("ZADD");
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .expect("RESETSTAT");
    let q = server.queue("orders");
    let page = q.registered_queues_page(0, 5).expect("page");
    let names: Vec<&str> = page.queues.iter().map(|q| q.name.as_str()).collect();
    // The unreadable entry and the older "dup" take their places on the page.
    assert_eq!(names, ["dup", "spam00000", "spam00001"]);
    assert_eq!(page.queues[0].partitions, 2);
    assert_eq!(page.total, 20_003, "all but the forgotten entry");
    let info: String = redis::cmd("INFO").arg("stats").query(&mut con).expect("INFO");
    let sent: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("total_net_output_bytes:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("total_net_output_bytes");
    assert!(sent < 4_000, "{sent} bytes sent for a page of five");

    let later = q.registered_queues_page(20_000, 10).expect("page");
    let names: Vec<&str> = later.queues.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(names, ["spam19997", "spam19998", "spam19999"]);
    assert!(q.registered_queues_page(0, 0).expect("page").queues.is_empty());
    let err = q
        .registered_queues_page(0, MAX_REGISTRY_PAGE + 1)
        .expect_err("too long a page");
    assert!(err.to_string().contains("at most"), "{err}");
    assert_eq!(q.registered_queues().expect("all").len(), 20_001);
}
