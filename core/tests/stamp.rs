//! The stamp at the front of a native envelope (lua/include/stamp.lua): the score a
//! message waits at, written by every script that schedules it, so that a claim need
//! not read scores from the schedule. An envelope written by hand may carry none.

mod common;

use std::time::Duration;

use common::{RedisServer, wait_for};
use delayq::{Delivery, Received, Retry, Worker, WorkerOptions};
use serde_json::json;

const MESSAGES: &str = "{dq:stamp}:messages";
const SCHEDULED: &str = "{dq:stamp}:scheduled";

/// (claim number, score) of the stored envelope's stamp, None without one.
fn stamp(con: &mut redis::Connection, id: &str) -> Option<(u64, u64)> {
    let stored: String = redis::cmd("HGET").arg(MESSAGES).arg(id).query(con).expect("hget");
    let rest = stored.strip_prefix(r#"{"at":["#)?;
    let (claim_no, rest) = rest.split_once(',')?;
    let (score, _) = rest.split_once("],")?;
    Some((claim_no.parse().expect("claim no"), score.parse().expect("score")))
}

fn score(con: &mut redis::Connection, id: &str) -> Option<u64> {
    let s: Option<f64> = redis::cmd("ZSCORE").arg(SCHEDULED).arg(id).query(con).expect("zscore");
    s.map(|s| s as u64)
}

/// An envelope written by hand, without the stamp.
fn strip_stamp(con: &mut redis::Connection, id: &str) {
    let stored: String = redis::cmd("HGET").arg(MESSAGES).arg(id).query(con).expect("hget");
    let (_, rest) = stored.split_once("],").expect("stamped");
    let _: () = redis::cmd("HSET")
        .arg(MESSAGES)
        .arg(id)
        .arg(format!("{{{rest}"))
        .query(con)
        .expect("hset");
    assert_eq!(stamp(con, id), None);
}

/// Completions are written by the pool's own thread: wait until `id`'s stamp is no
/// longer `was`, and return it (the pool may claim the message again at once, so its
/// place in the schedule cannot be waited for).
fn stamped_anew(con: &mut redis::Connection, id: &str, was: Option<(u64, u64)>) -> (u64, u64) {
    wait_for(Duration::from_secs(5), "the message stamped anew", || {
        stamp(con, id) != was
    });
    stamp(con, id).expect("stamped")
}

/// A pool of one thread with room for `handlers` deliveries, under a lease of a minute.
fn pool(q: &delayq::Queue, handlers: usize) -> delayq::Consumer {
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            lease: Duration::from_secs(60),
            threads: 1,
            ..WorkerOptions::default()
        },
    )
    .expect("worker");
    worker.start_with(handlers).expect("start")
}

fn next(c: &delayq::Consumer) -> Delivery {
    match c.recv_timeout(Duration::from_secs(5)) {
        Received::Message(d) => d,
        other => panic!("expected a delivery, got {other:?}"),
    }
}

#[test]
fn every_script_that_schedules_a_message_stamps_it_with_its_score() {
    let server = RedisServer::start();
    let q = server.queue("stamp");
    let mut con = server.con();
    let id = q.push(&json!({"n": 1}), Duration::from_secs(60)).expect("push");
    let (pushed_no, pushed_at) = stamp(&mut con, &id).expect("a push stamps");
    assert_eq!(Some(pushed_at), score(&mut con, &id));
    assert_eq!(pushed_no, 0, "no claim number: nothing reads one");
    let due = q.get(&id).expect("get").expect("exists").due_at_ms;
    assert_eq!(due, Some((pushed_at / 4096) as i64));

    q.reschedule(&id, Duration::ZERO).expect("reschedule");
    let (_, now_at) = stamp(&mut con, &id).expect("stamped");
    assert!(
        now_at < pushed_at && Some(now_at) == score(&mut con, &id),
        "moved with its due time"
    );

    // A claim takes the score from the stamp: the delivery's due time is the stamp's,
    // and its lease is the claim's token alone.
    let c = pool(&q, 1);
    let d = next(&c);
    assert_eq!(d.due_at_ms, (now_at / 4096) as i64);
    assert!(!d.token().contains(':'), "{}", d.token());
    // A failure schedules it again: stamped with the new score.
    let was = stamp(&mut con, &id);
    c.fail_with(d, "boom", Retry::After(Duration::from_secs(1)));
    let (retry_no, retry_at) = stamped_anew(&mut con, &id, was);
    assert!(
        score(&mut con, &id).is_none_or(|s| s == retry_at),
        "waits at its stamp's score"
    );
    assert!(retry_at > now_at && retry_no == 0, "{retry_no} {retry_at} {now_at}");
    // A release puts it back at the same score, its stamp as it was.
    let d = next(&c);
    assert_eq!(d.due_at_ms, (retry_at / 4096) as i64);
    c.release(d);
    assert_eq!(stamp(&mut con, &id), Some((0, retry_at)), "back at its place");
    c.finish();
}

#[test]
fn an_envelope_without_a_stamp_runs_with_its_claims_time_and_a_retry_stamps_it() {
    let server = RedisServer::start();
    let q = server.queue("stamp");
    let mut con = server.con();
    let ids: Vec<String> = (0..3)
        .map(|n| q.push(&json!({"n": n}), Duration::ZERO).expect("push"))
        .collect();
    let dues: Vec<i64> = ids
        .iter()
        .map(|id| q.get(id).expect("get").expect("exists").due_at_ms.expect("due"))
        .collect();
    for (id, due) in ids[..2].iter().zip(&dues) {
        strip_stamp(&mut con, id);
        assert_eq!(
            q.get(id).expect("get").expect("exists").due_at_ms,
            Some(*due),
            "a waiting message's due time is the schedule's"
        );
    }
    let c = pool(&q, 3);
    let mut got: Vec<Delivery> = (0..3).map(|_| next(&c)).collect();
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut con).expect("time");
    let after_claims = secs * 1000 + micros / 1000;
    got.sort_by_key(|d| ids.iter().position(|i| *i == d.id));
    for (i, d) in got.iter().enumerate() {
        // The claim does not read envelopes (their caller does), so every lease is the
        // claim's token alone.
        assert!(!d.token().contains(':'), "{}", d.token());
        let info = q.get(&d.id).expect("get").expect("exists");
        if i < 2 {
            // No stamp: the due time is unknown, and had come by the claim.
            assert!(
                (dues[i]..=after_claims).contains(&d.due_at_ms),
                "{}: due {} between {} and {after_claims}",
                d.id,
                d.due_at_ms,
                dues[i]
            );
            assert_eq!(info.due_at_ms, None, "in flight, nothing tells it");
        } else {
            assert_eq!(d.due_at_ms, dues[i], "{}: from its stamp", d.id);
            assert_eq!(info.due_at_ms, Some(dues[i]), "in flight: from the stamp");
        }
    }
    let [first, second, third]: [Delivery; 3] = got.try_into().expect("three deliveries");
    c.ack(first);
    let second_id = second.id.clone();
    c.fail_with(second, "boom", Retry::After(Duration::from_secs(30)));
    let (_, at) = stamped_anew(&mut con, &second_id, None);
    assert_eq!(Some(at), score(&mut con, &second_id), "waits 30 s at its stamp's score");
    c.ack(third);
    c.finish();
}

#[test]
fn a_stamp_later_than_its_claim_is_not_trusted() {
    let server = RedisServer::start();
    let q = server.queue("stamp");
    let mut con = server.con();
    let id = q.push(&json!({"n": 1}), Duration::from_secs(60)).expect("push");
    let (_, stamped_at) = stamp(&mut con, &id).expect("stamped");
    // What an older delayq's reschedule leaves mid-deploy: due now in the schedule,
    // the stamp still saying a minute on.
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut con).expect("time");
    let now_ms = secs * 1000 + micros / 1000;
    let _: () = redis::cmd("ZADD")
        .arg(SCHEDULED)
        .arg(now_ms * 4096)
        .arg(&id)
        .query(&mut con)
        .expect("zadd");
    let c = pool(&q, 1);
    let d = next(&c);
    assert!(
        d.due_at_ms < (stamped_at / 4096) as i64 - 30_000,
        "due {} from the stamp",
        d.due_at_ms
    );
    let was = stamp(&mut con, &id);
    c.release(d);
    let (_, released_at) = stamped_anew(&mut con, &id, was);
    assert!(released_at < stamped_at - 30_000 * 4096, "put back a minute on");
    c.finish();
}

/// The queue's sequence set to `n`, as claims made before would leave it.
fn set_seq(con: &mut redis::Connection, n: u64) {
    let _: () = redis::cmd("SET").arg("{dq:stamp}:seq").arg(n).query(con).expect("set");
}

/// push.lua called directly, as the core never would.
fn push_directly(con: &mut redis::Connection, words: &[String]) -> redis::RedisResult<redis::Value> {
    common::call_script(con, "push", "stamp", words)
}

/// A batch of `n` new messages alike, due after `delay` or at Unix ms `at`.
fn batch(n: usize, due: impl Into<delayq::Due> + Copy) -> Vec<delayq::NewMessage> {
    (0..n)
        .map(|i| delayq::NewMessage::new(&json!({"n": i}), due).expect("message"))
        .collect()
}

#[test]
fn a_bulk_push_stamps_on_the_client_and_redis_keeps_the_stamp() {
    let server = RedisServer::start();
    let q = server.queue("stamp");
    let mut con = server.con();
    let before = server.now_ms();
    let ids = q.push_many(&batch(1500, Duration::from_secs(60))).expect("push");
    let after = server.now_ms();
    // Two scripts of one partition: places 0 and 1 of one millisecond, read from the
    // queue clock once, after the call began.
    let mut seen = std::collections::BTreeSet::new();
    for id in &ids {
        let (claim_no, at) = stamp(&mut con, id).expect("stamped");
        assert_eq!(claim_no, 0, "stamped by the client");
        assert_eq!(Some(at), score(&mut con, id), "{id}");
        seen.insert(at);
    }
    let scores: Vec<u64> = seen.into_iter().collect();
    assert_eq!(scores.len(), 2, "{scores:?}");
    let due = scores[0] / 4096;
    assert_eq!((scores[0] % 4096, scores[1]), (0, scores[0] + 1));
    assert!(
        (before + 60_000..=after + 60_000).contains(&(due as i64)),
        "{before} {due} {after}"
    );
    assert_eq!(score(&mut con, &ids[999]), Some(scores[0]), "the first script's");
    assert_eq!(score(&mut con, &ids[1000]), Some(scores[1]), "the second script's");
    // A small batch of delays reads no clock: the push stamps it.
    let small = q.push_many(&batch(3, Duration::from_secs(60))).expect("push");
    assert_eq!(stamp(&mut con, &small[0]).map(|s| s.0), Some(0));
}

#[test]
fn a_client_stamp_whose_place_is_taken_is_replaced_by_the_push() {
    let server = RedisServer::start();
    let q = server.queue("stamp");
    let mut con = server.con();
    set_seq(&mut con, 7);
    let at = server.now_ms() + 60_000;
    let first = q.push_many(&batch(1, delayq::Due::AtUnixMs(at))).expect("push");
    assert_eq!(
        stamp(&mut con, &first[0]),
        Some((0, at as u64 * 4096)),
        "a time given needs no read"
    );
    // The same millisecond again: its first place is taken, so the run gets the next
    // one and the push writes its own stamp.
    let later = q.push_many(&batch(200, delayq::Due::AtUnixMs(at))).expect("push");
    for id in &later {
        assert_eq!(stamp(&mut con, id), Some((0, at as u64 * 4096 + 1)), "{id}");
        assert_eq!(score(&mut con, id), Some(at as u64 * 4096 + 1));
    }
    let info = q.get(&later[199]).expect("get").expect("exists");
    assert_eq!(
        info.payload_json, r#"{"n":199}"#,
        "the body after the replaced stamp, whole"
    );
    assert_eq!(info.due_at_ms, Some(at));
    // A claim takes the due time from a client's stamp.
    let past = server.now_ms() - 5;
    let due_now = q.push_many(&batch(1, delayq::Due::AtUnixMs(past))).expect("push");
    assert_eq!(stamp(&mut con, &due_now[0]).map(|s| s.0), Some(0));
    let c = pool(&q, 1);
    let d = next(&c);
    assert_eq!((d.id.as_str(), d.due_at_ms), (due_now[0].as_str(), past));
    assert!(!d.token().contains(':'), "{}", d.token());
    c.ack(d);
    c.finish();
}

#[test]
fn a_stamped_run_that_does_not_hold_is_refused_before_anything_is_written() {
    let server = RedisServer::start();
    let mut con = server.con();
    let at = server.now_ms() + 60_000;
    let envelope = |score: u64| format!(r#"{{"at":[0,{score}],"v":1,"id":"a","created_ms":1,"payload":1}}"#);
    let good = envelope(at as u64 * 4096);
    let unstamped = r#"{"v":1,"id":"a","created_ms":1,"payload":1}"#.to_owned();
    for (timing, options, stored, second) in [
        ("at", "ordered stamped", envelope(at as u64 * 4096 + 4096), None),
        ("at", "ordered stamped", unstamped.clone(), None),
        ("at", "ordered stamped", good.replace("[0,", "[0,0"), None),
        ("at", "stamped", good.clone(), None),
        ("at", "ordered expires stamped", good.clone(), None),
        ("delay", "ordered stamped", good.clone(), None),
        ("at", "ordered stamped", good.clone(), Some(unstamped.clone())),
        (
            "at",
            "ordered stamped",
            good.clone(),
            Some(envelope(at as u64 * 4096 + 1)),
        ),
    ] {
        let n = 1 + usize::from(second.is_some());
        let mut words: Vec<String> = ["new", &n.to_string(), timing, &at.to_string(), options, "a", &stored]
            .map(String::from)
            .into();
        if let Some(second) = &second {
            words.extend(["b".to_owned(), second.clone()]);
        }
        let err = push_directly(&mut con, &words).expect_err("refused");
        assert!(
            err.to_string().contains("\"stamped\" needs"),
            "{options} {stored} {second:?}: {err}"
        );
        assert_eq!(server.dump_keys(), Vec::<String>::new(), "nothing written");
    }
}

#[test]
fn a_resend_keeps_the_clients_stamp_where_its_place_holds() {
    let server = RedisServer::start();
    let mut con = server.con();
    let at = server.now_ms() + 60_000;
    let score = at as u64 * 4096;
    // A "check" call may resend a push whose first send ran: the stamp it carries is
    // the one the script would write, claim number 0 and the place proposed.
    let envelope = format!(r#"{{"at":[0,{score}],"v":1,"id":"a","created_ms":1,"payload":1}}"#);
    let words = ["check", "1", "at", &at.to_string(), "ordered stamped", "a", &envelope].map(String::from);
    push_directly(&mut con, &words).expect("pushed");
    let stored: String = redis::cmd("HGET").arg(MESSAGES).arg("a").query(&mut con).expect("hget");
    assert_eq!(
        stored,
        format!(r#"{{"at":[0,{score}],"v":1,"id":"a","created_ms":1,"payload":1}}"#)
    );
}

#[test]
fn a_mixed_batch_keeps_its_push_order() {
    let server = RedisServer::start();
    let q = server.queue("stamp");
    let mut con = server.con();
    let mut chosen = delayq::NewMessage::new(&json!({"chosen": 1}), Duration::from_secs(60)).expect("message");
    chosen.options.id = Some("chosen-1".into());
    let mut messages = vec![chosen];
    messages.extend(batch(delayq::MAX_BATCH, Duration::from_secs(60)));
    let ids = q.push_many(&messages).expect("push");
    let order: Vec<String> = redis::cmd("ZRANGE")
        .arg(SCHEDULED)
        .arg(0)
        .arg(-1)
        .query(&mut con)
        .expect("zrange");
    assert_eq!(order, ids, "every delay counts from the one clock read");
    for id in &ids {
        assert_eq!(stamp(&mut con, id).map(|s| s.1), score(&mut con, id), "{id}");
    }
}
