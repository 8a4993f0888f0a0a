//! Repeating messages: one push per occurrence, each run once however many pools
//! consume, redefinition and removal, a broken chain repaired, bad input refused.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{RedisServer, StopOnDrop, assert_no_leak, wait_for};
use delayq::{Layout, Queue, QueueOptions, RepeatOptions, Schedule, State, Worker, WorkerOptions};
use parking_lot::Mutex;
use serde_json::json;

/// (id, due_ms, handled_at_ms on the Redis clock) of each delivery.
type Seen = Mutex<Vec<(String, i64, i64)>>;

/// Run `pools` worker pools on `q` until `done` holds for what they saw.
fn consume(
    server: &RedisServer,
    q: &Queue,
    pools: usize,
    done: impl Fn(&[(String, i64, i64)]) -> bool,
) -> Vec<(String, i64, i64)> {
    let seen: Seen = Mutex::new(Vec::new());
    let workers: Vec<Worker> = (0..pools)
        .map(|_| {
            Worker::new(
                q.clone(),
                WorkerOptions {
                    threads: 1,
                    ..WorkerOptions::default()
                },
            )
            .expect("worker")
        })
        .collect();
    std::thread::scope(|s| {
        for w in &workers {
            let seen = &seen;
            s.spawn(move || {
                w.run(1, |d| {
                    seen.lock().push((d.id.clone(), d.due_at_ms, server.now_ms()));
                    Ok(())
                })
                .expect("run")
            });
        }
        let _stop: Vec<StopOnDrop> = workers.iter().map(|w| StopOnDrop(w.stopper())).collect();
        wait_for(Duration::from_secs(20), "the occurrences", || done(&seen.lock()));
    });
    seen.into_inner()
}

fn occurrences(seen: &[(String, i64, i64)], name: &str) -> Vec<i64> {
    let prefix = format!("repeat:{name}:");
    let mut dues: Vec<i64> = seen
        .iter()
        .filter_map(|(id, ..)| id.strip_prefix(&prefix)?.parse().ok())
        .collect();
    dues.sort_unstable();
    dues
}

#[test]
fn an_interval_repeats_once_per_occurrence_across_two_pools_and_never_early() {
    let server = RedisServer::start();
    let q = server.queue("every");
    let every = Schedule::every(Duration::from_secs(1)).expect("schedule");
    let first = q.repeat("tick", &every, &json!({"tick": true})).expect("repeat");
    let seen = consume(&server, &q, 2, |seen| occurrences(seen, "tick").len() >= 3);
    let dues = occurrences(&seen, "tick");
    assert_eq!(dues[0], first);
    for pair in dues.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            1000,
            "one per second, none twice, none skipped: {dues:?}"
        );
    }
    let mut runs: HashMap<&str, usize> = HashMap::new();
    for (id, due, handled) in &seen {
        *runs.entry(id.as_str()).or_default() += 1;
        assert!(handled >= due, "{id} ran {} ms early", due - handled);
    }
    assert!(runs.values().all(|&n| n == 1), "each occurrence ran once: {runs:?}");
    let listed = q.repeats().expect("repeats");
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].name.as_str(), &listed[0].schedule), ("tick", &every));
    assert_eq!(listed[0].payload_json, r#"{"tick":true}"#);
    assert!(
        listed[0].next_due_ms.is_some_and(|d| d > *dues.last().expect("some")),
        "the next one is pushed"
    );
    assert_no_leak(&server, "{dq:every}");
}

#[test]
fn a_cron_pattern_fires_on_its_seconds() {
    let server = RedisServer::start();
    let q = server.queue("cron");
    let cron = Schedule::cron("*/1 * * * * *", Some("Europe/Berlin")).expect("six fields: seconds");
    q.repeat("each-second", &cron, &1).expect("repeat");
    let seen = consume(&server, &q, 1, |seen| occurrences(seen, "each-second").len() >= 2);
    let dues = occurrences(&seen, "each-second");
    assert!(dues.iter().all(|d| d % 1000 == 0), "on whole seconds: {dues:?}");
    assert_eq!(dues[1] - dues[0], 1000);
}

#[test]
fn redefining_replaces_the_waiting_occurrence_and_the_same_definition_changes_nothing() {
    let server = RedisServer::start();
    let q = server.queue("redefine");
    let daily = Schedule::cron("0 2 * * *", Some("Asia/Shanghai")).expect("schedule");
    let due = q.repeat("report", &daily, &json!({"v": 1})).expect("repeat");
    assert_eq!(
        q.repeat("report", &daily, &json!({"v": 1})).expect("again"),
        due,
        "a deploy may call it each time"
    );
    assert_eq!(q.stats().expect("stats").total("pushed"), 1);
    let first_id = format!("repeat:report:{due}");
    assert_eq!(q.get(&first_id).expect("get").map(|m| m.state), Some(State::Scheduled));

    let hourly = Schedule::every(Duration::from_secs(3600)).expect("schedule");
    let new_due = q.repeat("report", &hourly, &json!({"v": 2})).expect("changed");
    assert!(q.get(&first_id).expect("get").is_none(), "the old occurrence went");
    let info = q
        .get(&format!("repeat:report:{new_due}"))
        .expect("get")
        .expect("the new one waits");
    assert_eq!(info.payload_json, r#"{"v":2}"#);
    assert_eq!(q.stats().expect("stats").scheduled, 1);

    assert!(q.unrepeat("report").expect("unrepeat"));
    assert!(!q.unrepeat("report").expect("again"), "gone already");
    assert!(q.repeats().expect("repeats").is_empty());
    assert_eq!(
        q.stats().expect("stats").scheduled,
        0,
        "its waiting occurrence was cancelled"
    );
    assert_no_leak(&server, "{dq:redefine}");
}

#[test]
fn a_repeat_whose_occurrence_was_purged_is_pushed_again_by_the_next_pool() {
    let server = RedisServer::start();
    let q = server.queue("repair");
    q.repeat("tick", &Schedule::every(Duration::from_secs(1)).expect("schedule"), &0)
        .expect("repeat");
    assert_eq!(
        q.purge().expect("purge"),
        1,
        "the pending occurrence is a message like any other"
    );
    assert_eq!(q.repeats().expect("repeats").len(), 1, "the definition stays");
    // Nothing waits for the chain to go on: the pool's first claim finds it broken.
    let seen = consume(&server, &q, 1, |seen| !occurrences(seen, "tick").is_empty());
    assert!(!occurrences(&seen, "tick").is_empty());
}

#[test]
fn defining_an_unchanged_repeat_again_mends_a_broken_chain_at_once() {
    let server = RedisServer::start();
    let q = server.queue("mend");
    let hourly = Schedule::every(Duration::from_secs(3600)).expect("schedule");
    let first = q.repeat("report", &hourly, &1).expect("repeat");
    assert_eq!(
        q.repeat("report", &hourly, &1).expect("again"),
        first,
        "pending: unchanged"
    );
    assert!(q.cancel(&format!("repeat:report:{first}")).expect("cancel"));
    let mended = q.repeat("report", &hourly, &1).expect("mend");
    assert!(mended >= first, "a new occurrence, an hour from now");
    assert_eq!(
        q.get(&format!("repeat:report:{mended}")).expect("get").map(|m| m.state),
        Some(State::Scheduled)
    );
    assert_eq!(q.stats().expect("stats").scheduled, 1);
}

#[test]
fn bad_repeats_are_refused_and_write_nothing() {
    let server = RedisServer::start();
    let q = server.queue("bad");
    let every = Schedule::every(Duration::from_secs(60)).expect("schedule");
    for (name, err) in [
        ("", q.repeat("", &every, &1)),
        ("control", q.repeat("a\nb", &every, &1)),
        ("long", q.repeat(&"x".repeat(300), &every, &1)),
        (
            "payload",
            q.repeat_json("ok", &every, "{nope", &RepeatOptions::default()),
        ),
        (
            "attempts",
            q.repeat_json("ok", &every, "1", &RepeatOptions::default().max_attempts(0)),
        ),
        (
            "expire_after",
            q.repeat_json(
                "ok",
                &every,
                "1",
                &RepeatOptions::default().expire_after(Duration::ZERO),
            ),
        ),
        (
            "expire_after",
            q.repeat_json(
                "ok",
                &every,
                "1",
                &RepeatOptions::default().expire_after(delayq::MAX_DELAY + Duration::from_secs(1)),
            ),
        ),
    ] {
        assert!(
            matches!(
                err,
                Err(delayq::Error::InvalidArgument { .. } | delayq::Error::PayloadNotSerializable(_))
            ),
            "{name}: {err:?}"
        );
    }
    let seed = server.queue_with(
        "seed",
        QueueOptions {
            layout: Layout::seed(),
            ..QueueOptions::default()
        },
    );
    let err = seed
        .repeat_json(
            "ok",
            &every,
            "1",
            &RepeatOptions::default().expire_after(Duration::from_secs(1)),
        )
        .expect_err("no room for a deadline in the seed layout");
    assert!(err.to_string().contains("native layout"), "{err}");
    assert!(Schedule::cron("not a pattern", None).is_err());
    assert!(Schedule::cron("0 2 * * *", Some("Nowhere/Else")).is_err());
    assert!(Schedule::every(Duration::from_millis(10)).is_err());
    assert!(
        server.dump_keys().is_empty(),
        "nothing written: {:?}",
        server.dump_keys()
    );
}

#[test]
fn an_occurrence_that_could_not_start_within_expire_after_is_buried_and_the_next_runs() {
    let server = RedisServer::start();
    let q = server.queue("late");
    let every = Schedule::every(Duration::from_secs(1)).expect("schedule");
    let options = RepeatOptions::default()
        .max_attempts(4)
        .expire_after(Duration::from_millis(600));
    let first = q
        .repeat_json("sync", &every, r#"{"sync":1}"#, &options)
        .expect("repeat");
    let pending = q.get(&format!("repeat:sync:{first}")).expect("get").expect("waits");
    assert_eq!(
        pending.expires_at_ms,
        Some(first + 600),
        "the deadline counts from the due time"
    );
    assert_eq!(pending.max_attempts, Some(4));
    assert_eq!(
        q.repeat_json("sync", &every, r#"{"sync":1}"#, &options).expect("again"),
        first,
        "the same options again change nothing"
    );
    let listed = q.repeats().expect("repeats");
    assert_eq!(
        (listed[0].max_attempts, listed[0].expire_after),
        (Some(4), Some(Duration::from_millis(600)))
    );

    // No pool runs until the first occurrence is past its deadline (an outage); the
    // next one, at first + 1000, leaves a new pool 900 ms to start.
    wait_for(Duration::from_secs(5), "the first deadline to pass", || {
        server.now_ms() > first + 700
    });
    let seen = consume(&server, &q, 1, |seen| !occurrences(seen, "sync").is_empty());
    let ran = occurrences(&seen, "sync");
    assert_eq!(
        ran[0],
        first + 1000,
        "the next occurrence ran, the late one did not: {ran:?}"
    );
    let dead = q.dead_letters(10).expect("dead letters");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].id, format!("repeat:sync:{first}"));
    assert!(dead[0].last_error.contains("expire_after"), "{}", dead[0].last_error);
    let next = q
        .get(&format!("repeat:sync:{}", first + 2000))
        .expect("get")
        .expect("the chain goes on");
    assert_eq!(next.expires_at_ms, Some(first + 2600));

    // Changing only expire_after is a new definition: its waiting occurrence is replaced.
    let changed = q
        .repeat_json("sync", &every, r#"{"sync":1}"#, &RepeatOptions::default())
        .expect("changed");
    let info = q.get(&format!("repeat:sync:{changed}")).expect("get").expect("waits");
    assert_eq!(info.expires_at_ms, None);
    assert_eq!(q.repeats().expect("repeats")[0].expire_after, None);
}
