//! A lease per claim (lua/include/claims.lua): the messages of one claim share one
//! deadline; what leaves the claim lowers its count, and an expired claim gives back
//! exactly what it still held.

mod common;

use std::time::Duration;

use common::{RedisServer, assert_no_leak, wait_for};
use delayq::{Delivery, Due, PushOptions, Received, Retry, Worker, WorkerOptions};

fn next(c: &delayq::Consumer) -> Delivery {
    match c.recv_timeout(Duration::from_secs(5)) {
        Received::Message(d) => d,
        other => panic!("expected a delivery, got {other:?}"),
    }
}

fn count(server: &RedisServer, cmd: &str, key: &str) -> u64 {
    redis::cmd(cmd).arg(key).query(&mut server.con()).expect("count")
}

fn push(q: &delayq::Queue, id: &str, due: Due) {
    let opts = PushOptions {
        id: Some(id.to_owned()),
        ..PushOptions::default()
    };
    q.push_json(format!(r#"{{"id":"{id}"}}"#), due, &opts).expect("push");
}

#[test]
fn an_expired_claim_gives_back_exactly_what_it_still_held() {
    let server = RedisServer::start();
    let q = server.queue("claims");
    for id in ["m0", "m1", "m2", "m3"] {
        push(&q, id, Due::NOW);
    }
    let hangs = WorkerOptions {
        threads: 1,
        lease: Duration::from_millis(300),
        timeout: Some(Duration::from_millis(50)),
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(100),
        ..WorkerOptions::default()
    };
    // Pool A takes all four in one claim: one deadline, one record.
    let a = Worker::new(
        q.clone(),
        WorkerOptions {
            prefetch: 4,
            ..hangs.clone()
        },
    )
    .expect("worker a");
    let ca = a.start_with(4).expect("start a");
    let mut got: Vec<Delivery> = (0..4).map(|_| next(&ca)).collect();
    got.sort_by(|x, y| x.id.cmp(&y.id));
    assert!(got.iter().all(|d| d.token() == got[0].token()), "one claim");
    assert_eq!(count(&server, "ZCARD", "{dq:claims}:claims"), 1);
    assert_eq!(
        count(&server, "ZCARD", "{dq:claims}:inflight"),
        0,
        "no deadline per message"
    );
    let [m0, m1, m2, m3]: [Delivery; 4] = got.try_into().expect("four");
    // A claims nothing more (with room after the ack and the failure below, it could
    // take the re-deliveries itself); its completions are still written.
    ca.stop();
    // m0 is acknowledged and pushed again under its id, due later; m1 fails for a
    // retry a minute on. A holds m2 and m3 and "hangs": its heartbeat stops at timeout.
    ca.ack(m0);
    ca.fail_with(m1, "later", Retry::After(Duration::from_secs(60)));
    wait_for(Duration::from_secs(5), "m0 acknowledged and m1 waiting", || {
        q.stats().is_ok_and(|s| s.inflight == 2 && s.scheduled == 1)
    });
    push(&q, "m0", Due::In(Duration::from_secs(60)));
    // Pool B reaps A's claim once its lease ran out: m2 and m3 again, nothing else.
    let b = Worker::new(q.clone(), hangs).expect("worker b");
    let cb = b.start_with(4).expect("start b");
    let mut again: Vec<Delivery> = (0..2).map(|_| next(&cb)).collect();
    again.sort_by(|x, y| x.id.cmp(&y.id));
    assert_eq!(
        again.iter().map(|d| (d.id.as_str(), d.attempt)).collect::<Vec<_>>(),
        [("m2", 2), ("m3", 2)]
    );
    // Well within the lease of B's own claim, whose handlers time out (50 ms) and are
    // not renewed: B takes its messages again once that lease ends.
    assert!(matches!(cb.recv_timeout(Duration::from_millis(150)), Received::Idle));
    let s = q.stats().expect("stats");
    assert_eq!((s.scheduled, s.inflight, s.total("expired")), (2, 2, 2));
    for d in again {
        cb.ack(d);
    }
    // A's late completions find their claim gone: lease lost.
    ca.ack(m2);
    ca.ack(m3);
    assert_eq!(ca.finish().lease_lost, 2);
    assert_eq!(cb.finish().acked, 2);
    assert_eq!(count(&server, "ZCARD", "{dq:claims}:claims"), 0);
    assert_eq!(count(&server, "HLEN", "{dq:claims}:claim_ids"), 0);
    assert_no_leak(&server, "{dq:claims}");
}

#[test]
fn the_running_list_pages_through_claims_by_deadline() {
    let server = RedisServer::start();
    let q = server.queue("claims");
    for n in 0..7 {
        push(&q, &format!("m{n}"), Due::NOW);
    }
    let holds = |prefetch: usize| WorkerOptions {
        threads: 1,
        prefetch,
        lease: Duration::from_secs(60),
        ..WorkerOptions::default()
    };
    // Two claims, one after the other: of three, then of four.
    let a = Worker::new(q.clone(), holds(3)).expect("worker a");
    let ca = a.start_with(3).expect("start a");
    let held_a: Vec<Delivery> = (0..3).map(|_| next(&ca)).collect();
    std::thread::sleep(Duration::from_millis(20));
    let b = Worker::new(q.clone(), holds(4)).expect("worker b");
    let cb = b.start_with(4).expect("start b");
    let held_b: Vec<Delivery> = (0..4).map(|_| next(&cb)).collect();
    assert_eq!(count(&server, "ZCARD", "{dq:claims}:claims"), 2);
    let all = q.list(delayq::Listing::Inflight, 10).expect("list");
    let ids = |list: &[delayq::MessageInfo]| list.iter().map(|m| m.id.clone()).collect::<Vec<_>>();
    let mut expected: Vec<String> = held_a.iter().chain(&held_b).map(|d| d.id.clone()).collect();
    let mut listed = ids(&all);
    assert!(
        all.windows(2).all(|w| w[0].lease_until_ms <= w[1].lease_until_ms),
        "by deadline"
    );
    assert!(
        all[..3].iter().all(|m| held_a.iter().any(|d| d.id == m.id)),
        "A's claim first"
    );
    expected.sort();
    listed.sort();
    assert_eq!(listed, expected);
    for start in 0..8 {
        for limit in 1..8 {
            let page = q.list_page(delayq::Listing::Inflight, start, limit).expect("page");
            let end = (start + limit).min(all.len());
            assert_eq!(
                ids(&page),
                ids(&all[start.min(end)..end]),
                "start {start} limit {limit}"
            );
        }
    }
    for d in held_a {
        ca.ack(d);
    }
    for d in held_b {
        cb.ack(d);
    }
    ca.finish();
    cb.finish();
    assert_no_leak(&server, "{dq:claims}");
}

#[test]
fn a_handler_past_its_timeout_loses_its_lease_while_its_claims_others_live() {
    let server = RedisServer::start();
    let q = server.queue("claims");
    push(&q, "m0", Due::NOW);
    push(&q, "m1", Due::NOW);
    // One claim of both: m0 is handed to a handler that hangs past its timeout, m1
    // waits prefetched, not started, so the heartbeat renews its claim.
    let a = Worker::new(
        q.clone(),
        WorkerOptions {
            threads: 1,
            prefetch: 2,
            lease: Duration::from_millis(600),
            timeout: Some(Duration::from_millis(200)),
            ..WorkerOptions::default()
        },
    )
    .expect("worker a");
    let ca = a.start_with(2).expect("start a");
    let hung = next(&ca);
    wait_for(Duration::from_secs(5), "both claimed", || {
        q.stats().is_ok_and(|s| s.inflight == 2)
    });
    // B gets the hung one again once its own deadline passed; m1 stays with A.
    let b = Worker::new(q.clone(), WorkerOptions::default()).expect("worker b");
    let cb = b.start_with(2).expect("start b");
    let again = next(&cb);
    assert_eq!((again.id.as_str(), again.attempt), (hung.id.as_str(), 2));
    assert!(matches!(cb.recv_timeout(Duration::from_millis(1500)), Received::Idle));
    cb.ack(again);
    // The prefetched one is still A's to complete; the hung one's late ack is too late.
    let waiting = next(&ca);
    assert_ne!(waiting.id, hung.id);
    ca.ack(waiting);
    ca.ack(hung);
    let summary = ca.finish();
    assert_eq!((summary.acked, summary.lease_lost), (1, 1));
    cb.finish();
    assert_no_leak(&server, "{dq:claims}");
}

#[test]
fn a_killed_pools_four_full_claims_are_reaped_a_batch_at_a_time() {
    let server = RedisServer::start();
    let q = server.queue("claims");
    for _ in 0..4 {
        let batch: Vec<delayq::NewMessage> = (0..1000)
            .map(|n| delayq::NewMessage::new(&n, Duration::ZERO).expect("msg"))
            .collect();
        q.push_many(&batch).expect("push");
    }
    // What a pool of four threads leaves when killed mid-drain: four claims of 1000,
    // written as claim.lua writes them, long expired.
    let _: () = redis::cmd("EVAL")
        .arg(
            r"
            local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
            for c = 0, 3 do
              local token = tostring(redis.call('INCR', KEYS[5]))
              local held, leases = {}, {}
              for i = 1, 1000 do
                held[i] = ids[c * 1000 + i]
                leases[2 * i - 1], leases[2 * i] = held[i], token
              end
              redis.call('ZADD', KEYS[3], 1, token)
              redis.call('HSET', KEYS[4], token, cmsgpack.pack(held), token .. '#', 1000)
              redis.call('HSET', KEYS[2], unpack(leases))
              redis.call('ZREM', KEYS[1], unpack(held))
            end",
        )
        .arg(5)
        .arg("{dq:claims}:scheduled")
        .arg("{dq:claims}:leases")
        .arg("{dq:claims}:claims")
        .arg("{dq:claims}:claim_ids")
        .arg("{dq:claims}:seq")
        .query(&mut server.con())
        .expect("the killed pool's claims");
    assert_eq!(q.stats().expect("stats").inflight, 4000);
    let worker = Worker::new(q.clone(), WorkerOptions::default()).expect("worker");
    let c = worker.start_with(2).expect("start");
    let mut handled = 0;
    while handled < 4000 {
        let d = next(&c);
        // No handler may have started any of them, as far as Redis knows: uncharged,
        // and quarantined in claims of at most 500 (half of the claim they left).
        assert_eq!(d.attempt, 1, "{}", d.id);
        c.ack(d);
        handled += 1;
    }
    c.finish();
    let s = q.stats().expect("stats");
    assert_eq!(
        (s.ready, s.inflight, s.total("expired"), s.total("acked")),
        (0, 0, 4000, 4000)
    );
    let quarantined: u64 = redis::cmd("EXISTS")
        .arg("{dq:claims}:quarantine")
        .query(&mut server.con())
        .expect("EXISTS");
    assert_eq!(quarantined, 0);
    assert_no_leak(&server, "{dq:claims}");
}

/// claim.lua called directly for up to `batch` due messages: (the claim's token, the
/// ids handed out, the leases named apart from the token).
fn claim_directly(con: &mut redis::Connection, tag: &str, batch: usize) -> (String, Vec<String>, Vec<redis::Value>) {
    let words: Vec<String> = [
        batch.to_string(),
        "60000".into(),
        "100".into(),
        "60000".into(),
        "0".into(),
    ]
    .into();
    let reply: Vec<redis::Value> =
        redis::from_redis_value(common::call_script(con, "claim", tag, &words).expect("claim")).expect("parts");
    let ids: Vec<String> = redis::from_redis_value(reply[1].clone()).expect("ids");
    let mut leases: Vec<redis::Value> = redis::from_redis_value(reply[6].clone()).expect("leases");
    let token: String = redis::from_redis_value(leases.remove(0)).expect("token");
    (token, ids, leases)
}

/// The score in a stamped envelope's stamp, `{"at":[<claim no>,<score>],...`.
fn stamp_score(con: &mut redis::Connection, id: &str) -> u64 {
    let envelope: String = redis::cmd("HGET")
        .arg("{dq:runs}:messages")
        .arg(id)
        .query(con)
        .expect("envelope");
    envelope
        .strip_prefix("{\"at\":[")
        .and_then(|rest| rest.split(']').next())
        .and_then(|pair| pair.split(',').nth(1))
        .and_then(|score| score.parse().ok())
        .expect("a stamp")
}

/// ack.lua called directly with runs of (lease, ids), keeping `keep` completed messages.
fn ack_directly(
    con: &mut redis::Connection,
    tag: &str,
    keep: usize,
    runs: &[(&str, &[&str])],
) -> redis::RedisResult<redis::Value> {
    let mut words: Vec<String> = vec![keep.to_string(), "60000".into()];
    for (lease, ids) in runs {
        words.push((*lease).to_owned());
        words.push(ids.len().to_string());
        words.extend(ids.iter().map(|&id| id.to_owned()));
    }
    common::call_script(con, "ack", tag, &words)
}

#[test]
fn an_ack_answers_a_count_when_all_held_and_a_status_each_when_not() {
    let server = RedisServer::start();
    let q = server.queue("runs");
    for id in ["a", "b", "c", "d"] {
        push(&q, id, Due::NOW);
    }
    // One message with a serial key: the claim reads the envelopes then (see
    // claim.lua), and every lease is still the claim's token.
    let keyed = PushOptions {
        id: Some("e".to_owned()),
        serial_key: Some("k".to_owned()),
        ..PushOptions::default()
    };
    q.push_json(r#"{"id":"e"}"#.to_owned(), Due::NOW, &keyed).expect("push");
    let mut con = server.con();
    let a_stamp_before = stamp_score(&mut con, "a");
    let e_score = stamp_score(&mut con, "e");
    let (token, ids, apart) = claim_directly(&mut con, "runs", 10);
    assert_eq!(ids, ["a", "b", "c", "d", "e"]);
    assert!(apart.is_empty(), "no lease is named apart: {apart:?}");
    let e_lease = token.clone();

    // Two runs, every delivery held: a count. Kept completed, each with the due time
    // it ran for, from its stamp.
    let a_stamp = a_stamp_before;
    let both = ack_directly(&mut con, "runs", 10, &[(&token, &["a"]), (&e_lease, &["e"])]).expect("ack");
    assert_eq!(both, redis::Value::Int(2));
    for (id, score) in [("a", a_stamp), ("e", e_score)] {
        let kept: String = redis::cmd("HGET")
            .arg("{dq:runs}:completed_messages")
            .arg(id)
            .query(&mut con)
            .expect("kept");
        assert!(kept.starts_with(&format!("1|{}|", score / 4096)), "{id}: {kept}");
    }

    // b's lease passed to another delivery, c was acknowledged already (as when a
    // resend follows a write that went through): a status each, in order, and only d
    // leaves its claim.
    let _: () = redis::cmd("HSET")
        .arg("{dq:runs}:leases")
        .arg("b")
        .arg("999")
        .query(&mut con)
        .expect("b");
    assert_eq!(
        ack_directly(&mut con, "runs", 0, &[(&token, &["c"])]).expect("ack"),
        redis::Value::Int(1)
    );
    let each = ack_directly(&mut con, "runs", 0, &[(&token, &["b", "c", "d"])]).expect("ack");
    assert_eq!(
        each,
        redis::Value::Array(vec![redis::Value::Int(0), redis::Value::Int(-1), redis::Value::Int(1)])
    );
    let held: Vec<Option<String>> = redis::cmd("HMGET")
        .arg("{dq:runs}:messages")
        .arg(&["a", "b", "c", "d", "e"])
        .query(&mut con)
        .expect("messages");
    assert_eq!(
        held.iter().map(Option::is_some).collect::<Vec<_>>(),
        [false, true, false, false, false]
    );
    let left: u64 = redis::cmd("HGET")
        .arg("{dq:runs}:claim_ids")
        .arg(format!("{token}#"))
        .query(&mut con)
        .expect("count");
    assert_eq!(left, 1, "b still counts in the claim, until its reaper");

    // A run that names more ids than follow is refused before anything is written.
    let state = |con: &mut redis::Connection| -> Vec<Vec<Vec<u8>>> {
        ["messages", "leases", "claim_ids", "control", "stats"]
            .iter()
            .map(|role| {
                let mut all: Vec<Vec<u8>> = redis::cmd("HGETALL")
                    .arg(format!("{{dq:runs}}:{role}"))
                    .query(con)
                    .expect("hash");
                all.sort();
                all
            })
            .collect()
    };
    let before = state(&mut con);
    let words: Vec<String> = ["0", "0", &token, "3", "b"].map(str::to_owned).into();
    let err = common::call_script(&mut con, "ack", "runs", &words).expect_err("refused");
    assert!(err.to_string().contains("malformed ack run"), "{err}");
    assert_eq!(state(&mut con), before);
}

#[test]
fn a_scheduled_id_without_an_envelope_is_dropped_once_claimed() {
    let server = RedisServer::start();
    let q = server.queue("orphans");
    push(&q, "real", Due::NOW);
    // What a hand edit or a foreign tool leaves: an id in the schedule, no message.
    let mut con = server.con();
    let _: () = redis::cmd("ZADD")
        .arg("{dq:orphans}:scheduled")
        .arg(0)
        .arg("stray")
        .query(&mut con)
        .expect("zadd");
    let worker = Worker::new(q.clone(), WorkerOptions::default()).expect("worker");
    let c = worker.start_with(4).expect("start");
    let d = next(&c);
    assert_eq!(d.id, "real");
    c.ack(d);
    wait_for(Duration::from_secs(5), "the stray id dropped", || {
        q.stats().expect("stats").totals.get("orphaned") == Some(&1)
    });
    c.finish();
    let stats = q.stats().expect("stats");
    assert_eq!(
        (stats.totals.get("delivered"), stats.totals.get("acked")),
        (Some(&1), Some(&1)),
        "only the real message counts as delivered"
    );
    assert_eq!(count(&server, "ZCARD", "{dq:orphans}:scheduled"), 0);
    assert_eq!(count(&server, "HLEN", "{dq:orphans}:leases"), 0);
    assert_eq!(count(&server, "ZCARD", "{dq:orphans}:claims"), 0);
    assert_no_leak(&server, "{dq:orphans}");
}

#[test]
fn orphans_lua_drops_an_id_claimed_without_an_envelope_and_spares_one_pushed_since() {
    let server = RedisServer::start();
    let q = server.queue("strays");
    let mut con = server.con();
    for id in ["stray", "late"] {
        let _: () = redis::cmd("ZADD")
            .arg("{dq:strays}:scheduled")
            .arg(0)
            .arg(id)
            .query(&mut con)
            .expect("zadd");
    }
    // The claim hands them out under its lease: it reads no envelopes.
    let (token, ids, apart) = claim_directly(&mut con, "strays", 10);
    assert_eq!(ids, ["late", "stray"]);
    assert!(apart.is_empty(), "every lease is the token: {apart:?}");
    // "late" is pushed while its stray delivery holds the lease.
    push(&q, "late", Due::NOW);
    // "stray" named twice, as no pool sends it: it leaves its claim once.
    let words: Vec<String> = ["stray", token.as_str(), "late", token.as_str(), "stray", token.as_str()]
        .map(str::to_owned)
        .into();
    let dropped = common::call_script(&mut con, "orphans", "strays", &words).expect("orphans");
    assert_eq!(dropped, redis::Value::Int(1));
    let leases: u64 = count(&server, "HLEN", "{dq:strays}:leases");
    assert_eq!(leases, 0, "both deliveries ended");
    let waiting: Vec<String> = redis::cmd("ZRANGE")
        .arg("{dq:strays}:scheduled")
        .arg(0)
        .arg(-1)
        .query(&mut con)
        .expect("zrange");
    assert_eq!(waiting, ["late"], "the pushed one waits, the stray is gone");
    let stats = q.stats().expect("stats");
    assert_eq!(
        (stats.totals.get("orphaned"), stats.totals.get("delivered")),
        (Some(&1), Some(&0)),
        "neither counts as delivered"
    );
    assert_no_leak(&server, "{dq:strays}");
    // A resend finds the leases gone and changes nothing.
    assert_eq!(
        common::call_script(&mut con, "orphans", "strays", &words).expect("orphans"),
        redis::Value::Int(0)
    );
    let cut: Vec<String> = vec!["stray".into()];
    let err = common::call_script(&mut con, "orphans", "strays", &cut).expect_err("refused");
    assert!(err.to_string().contains("cut short"), "{err}");
}

#[test]
fn a_release_leaves_an_envelope_without_a_stamp_or_with_one_that_does_not_parse() {
    let server = RedisServer::start();
    let mut con = server.con();
    let bare = r#"{"v":1,"id":"bare","created_ms":1,"payload":1}"#;
    let broken = r#"{"at":[1,due],"v":1,"id":"broken","created_ms":1,"payload":1}"#;
    for (id, text) in [("bare", bare), ("broken", broken)] {
        let _: () = redis::pipe()
            .hset("{dq:loose}:messages", id, text)
            .zadd("{dq:loose}:scheduled", id, 1)
            .query(&mut con)
            .expect("write by hand");
    }
    let (token, ids, _) = claim_directly(&mut con, "loose", 10);
    assert_eq!(ids, ["bare", "broken"]);
    // "broken" under a lease that names its score, as a claim that read the envelopes
    // gives one: the release puts it back there, and still leaves its stamp alone.
    let scored = format!("{token}:4096");
    let _: () = redis::cmd("HSET")
        .arg("{dq:loose}:leases")
        .arg("broken")
        .arg(&scored)
        .query(&mut con)
        .expect("hset");
    let words: Vec<String> = ["bare", token.as_str(), "broken", scored.as_str()]
        .map(str::to_owned)
        .into();
    let released = common::call_script(&mut con, "release", "loose", &words).expect("release");
    assert_eq!(
        released,
        redis::Value::Array(vec![redis::Value::Int(2), redis::Value::Int(0)]),
        "both released, none cancelled"
    );
    let stored: Vec<String> = redis::cmd("HMGET")
        .arg("{dq:loose}:messages")
        .arg(&["bare", "broken"])
        .query(&mut con)
        .expect("hmget");
    let score: u64 = redis::cmd("ZSCORE")
        .arg("{dq:loose}:scheduled")
        .arg("bare")
        .query(&mut con)
        .expect("zscore");
    // Written by hand: due at once, as it is (its next claim takes the claim's time
    // as its due time).
    assert_eq!(stored[0], bare);
    assert!(score <= server.now_ms() as u64 * 4096 + 4095, "due at once: {score}");
    assert_eq!(stored[1], broken, "left for its next claim to bury");
    let broken_at: u64 = redis::cmd("ZSCORE")
        .arg("{dq:loose}:scheduled")
        .arg("broken")
        .query(&mut con)
        .expect("zscore");
    assert_eq!(broken_at, 4096, "back at the score its lease named");
}

/// claim.lua called directly under a lease of `lease_ms`, taking quarantined messages
/// alone when asked, else in groups:
/// (the ids handed out, their leases in order, whether a quarantined one was passed).
fn claim_quarantined(
    con: &mut redis::Connection,
    tag: &str,
    batch: usize,
    lease_ms: u64,
    alone: bool,
) -> (Vec<String>, Vec<String>, bool) {
    let mut words: Vec<String> = vec![
        batch.to_string(),
        lease_ms.to_string(),
        "100".into(),
        "60000".into(),
        "0".into(),
    ];
    words.push("quarantine".into());
    words.push(if alone { "alone" } else { "groups" }.into());
    let reply: Vec<redis::Value> =
        redis::from_redis_value(common::call_script(con, "claim", tag, &words).expect("claim")).expect("parts");
    let header: Vec<i64> = redis::from_redis_value(reply[0].clone()).expect("header");
    let ids: Vec<String> = redis::from_redis_value(reply[1].clone()).expect("ids");
    let later: Vec<i64> = redis::from_redis_value(reply[3].clone()).expect("later");
    assert!(later.is_empty(), "no attempt was counted yet: {later:?}");
    let lease_part: Vec<redis::Value> = redis::from_redis_value(reply[6].clone()).expect("leases");
    let mut leases = Vec::new();
    if let Some(token) = lease_part.first() {
        let token: String = redis::from_redis_value(token.clone()).expect("token");
        leases = vec![token; ids.len()];
        for pair in lease_part[1..].chunks(2) {
            let j: usize = redis::from_redis_value(pair[0].clone()).expect("index");
            leases[j - 1] = redis::from_redis_value(pair[1].clone()).expect("lease");
        }
    }
    (ids, leases, header[7] == 1)
}

/// Wait out leases of `lease_ms`, as pools that keep claiming (batch 0: only reaping)
/// would: a gap with no pool script at all looks like a Redis that stood still, and
/// gets a grace period (include/stall.lua).
fn wait_out(con: &mut redis::Connection, tag: &str, lease_ms: u64) {
    let until = std::time::Instant::now() + Duration::from_millis(lease_ms + 150);
    let words: Vec<String> = vec![
        "0".into(),
        lease_ms.to_string(),
        "100".into(),
        "60000".into(),
        "0".into(),
    ];
    while std::time::Instant::now() < until {
        common::call_script(con, "claim", tag, &words).expect("claim");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn attempts_of(con: &mut redis::Connection, tag: &str, id: &str) -> Option<u32> {
    redis::cmd("HGET")
        .arg(format!("{tag}:attempts"))
        .arg(id)
        .query(con)
        .expect("HGET")
}

#[test]
fn an_expired_claim_charges_none_and_its_messages_are_claimed_apart_by_halves() {
    let server = RedisServer::start();
    let q = server.queue("quarantine");
    let tag = "{dq:quarantine}";
    let mut con = server.con();
    for id in ["a", "b", "c", "d"] {
        push(&q, id, Due::NOW);
    }
    // A pool claims all four and dies (or freezes) before it finishes any.
    let (ids, ..) = claim_quarantined(&mut con, "quarantine", 4, 300, false);
    assert_eq!(ids, ["a", "b", "c", "d"]);
    wait_out(&mut con, "quarantine", 300);
    // Reaped uncharged: each may be claimed again in a group of two, apart from any
    // other message; the other two wait for the next claim.
    push(&q, "fresh", Due::NOW);
    let (ids, leases, passed) = claim_quarantined(&mut con, "quarantine", 10, 300, false);
    assert_eq!(ids, ["a", "b", "fresh"]);
    assert!(leases[0].starts_with('g') && leases[0] == leases[1], "{leases:?}");
    assert!(!leases[2].starts_with('g'), "{leases:?}");
    assert!(passed);
    for id in ["a", "b", "c", "d"] {
        assert_eq!(attempts_of(&mut con, tag, id), None, "{id}");
    }
    let s = q.stats().expect("stats");
    assert_eq!(s.total("expired"), 4);
    // The group expires too: halved, each of it is now claimed alone, and only by a
    // pool that says it has a handler free for it ("alone").
    wait_out(&mut con, "quarantine", 300);
    let (ids, _, passed) = claim_quarantined(&mut con, "quarantine", 10, 300, false);
    assert_eq!(ids, ["c", "d"], "the group of two that was left, not a or b");
    assert!(passed);
    wait_out(&mut con, "quarantine", 300);
    let (ids, leases, _) = claim_quarantined(&mut con, "quarantine", 10, 300, true);
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert!(leases[0].starts_with('q'), "{leases:?}");
    for id in ["a", "b", "c", "d", "fresh"] {
        assert_eq!(attempts_of(&mut con, tag, id), None, "{id}");
    }
    assert_no_leak(&server, tag);
}

#[test]
fn a_message_claimed_alone_is_charged_when_its_claim_expires_and_kept_when_released() {
    let server = RedisServer::start();
    let q = server.queue("alone");
    let tag = "{dq:alone}";
    let mut con = server.con();
    push(&q, "poison", Due::NOW);
    push(&q, "other", Due::NOW);
    claim_quarantined(&mut con, "alone", 2, 300, false);
    wait_out(&mut con, "alone", 300);
    // Halved to one each: without "alone" the claim takes neither, and says so.
    let (ids, _, passed) = claim_quarantined(&mut con, "alone", 2, 300, false);
    assert!(ids.is_empty() && passed, "{ids:?}");
    let (ids, leases, _) = claim_quarantined(&mut con, "alone", 2, 300, true);
    assert_eq!(ids, ["poison"], "one alone, the other passed over");
    assert!(leases[0].starts_with('q'));
    // Claimed alone and expired: its handler may have started it, and nothing else ran
    // under its claim, so this one counts.
    wait_out(&mut con, "alone", 300);
    let (ids, leases, _) = claim_quarantined(&mut con, "alone", 2, 60_000, true);
    assert_eq!(ids, ["other"], "the other is due first now");
    assert_eq!(attempts_of(&mut con, tag, "poison"), Some(1));
    assert_eq!(attempts_of(&mut con, tag, "other"), None);
    let error: String = redis::cmd("HGET")
        .arg(format!("{tag}:errors"))
        .arg("poison")
        .query(&mut con)
        .expect("HGET");
    assert_eq!(error, "lease expired during attempt 1 (worker stopped or hung)");
    // A pool that gives back what it claimed alone, unstarted, puts it back in the
    // quarantine: it is still to be claimed alone.
    let released =
        common::call_script(&mut con, "release", "alone", &["other".to_owned(), leases[0].clone()]).expect("release");
    assert_eq!(
        released,
        redis::Value::Array(vec![redis::Value::Int(1), redis::Value::Int(0)])
    );
    let (ids, _, passed) = claim_quarantined(&mut con, "alone", 2, 60_000, false);
    assert!(ids.is_empty() && passed, "{ids:?}");
    // Cancelling what waits in the quarantine leaves nothing of it behind.
    assert!(q.cancel("other").expect("cancel"));
    assert!(q.cancel("poison").expect("cancel"));
    assert_no_leak(&server, tag);
    let left: u64 = redis::cmd("EXISTS")
        .arg(format!("{tag}:quarantine"))
        .query(&mut con)
        .expect("EXISTS");
    assert_eq!(left, 0);
}

#[test]
fn a_message_of_a_serial_key_waits_behind_a_quarantined_one_of_its_key() {
    let server = RedisServer::start();
    let q = server.queue("keyed");
    let tag = "{dq:keyed}";
    let mut con = server.con();
    let keyed = |id: &str| PushOptions {
        id: Some(id.to_owned()),
        serial_key: Some("order:1".to_owned()),
        ..PushOptions::default()
    };
    q.push_json("1", Due::NOW, &keyed("close")).expect("push");
    claim_quarantined(&mut con, "keyed", 1, 300, false);
    wait_out(&mut con, "keyed", 300);
    // "close" waits to be claimed alone; "refund", due after it with its key, must not
    // start first through a claim that passes "close" over.
    q.push_json("2", Due::NOW, &keyed("refund")).expect("push");
    push(&q, "other", Due::NOW);
    let (ids, _, passed) = claim_quarantined(&mut con, "keyed", 10, 300, false);
    assert_eq!(ids, ["other"]);
    assert!(passed);
    let (ids, leases, _) = claim_quarantined(&mut con, "keyed", 10, 300, true);
    assert_eq!(ids, ["close"], "the key's first, alone; refund waits for the key");
    assert!(leases[0].starts_with('q'));
    assert_eq!(attempts_of(&mut con, tag, "refund"), None);
}

#[test]
fn a_single_message_claimed_for_a_free_handler_is_charged_when_its_claim_expires() {
    let server = RedisServer::start();
    let q = server.queue("single");
    let tag = "{dq:single}";
    let mut con = server.con();
    push(&q, "slow", Due::NOW);
    // A pool with a free handler ("alone") starts what it claims at once: a claim of one
    // is charged when it expires, as a queue:work killed mid-job expects.
    let (ids, leases, _) = claim_quarantined(&mut con, "single", 1, 300, true);
    assert_eq!(ids, ["slow"]);
    assert!(leases[0].starts_with('q'), "{leases:?}");
    wait_out(&mut con, "single", 300);
    assert_eq!(attempts_of(&mut con, tag, "slow"), Some(1));
    // One claimed without a free handler waited in a buffer, maybe: not charged.
    push(&q, "buffered", Due::NOW);
    let (ids, leases, _) = claim_quarantined(&mut con, "single", 1, 300, false);
    assert_eq!(ids, ["buffered"]);
    assert!(!leases[0].starts_with('q'), "{leases:?}");
    wait_out(&mut con, "single", 300);
    assert_eq!(attempts_of(&mut con, tag, "buffered"), None);
    assert_no_leak(&server, tag);
}
