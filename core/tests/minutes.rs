//! Per-minute records (`Queue::minutes`): consumer pools add what their handlers did
//! at their heartbeat, and the first call of a minute samples the backlog.

mod common;

use std::time::Duration;

use common::{RedisServer, run_until};
use delayq::metrics::{KEEP_MINUTES, MINUTE_MS, minute_of};
use delayq::{QueueOptions, Worker, WorkerOptions};
use serde_json::json;

#[test]
fn pools_record_handled_failed_lateness_and_backlog_by_minute() {
    let server = RedisServer::start();
    let q = server.queue_with(
        "orders",
        QueueOptions {
            partitions: 2,
            ..Default::default()
        },
    );
    let tags: Vec<String> = (0..2).map(|p| q.hash_tag(p).expect("tag")).collect();
    let mut con = server.con();
    // Records of long ago and a field that is no minute: the first sample of a minute drops them.
    let _: () = redis::cmd("HSET")
        .arg(format!("{}:minutes", tags[0]))
        .arg("1")
        .arg("5 0 0 0 0")
        .arg("stray")
        .arg("x")
        .query(&mut con)
        .expect("HSET");

    for i in 0..20 {
        q.push(&json!({"i": i, "fail": i % 4 == 0}), Duration::ZERO)
            .expect("push");
    }
    for i in 0..7 {
        q.push(&json!({"later": i}), Duration::from_secs(3600))
            .expect("push later");
    }

    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            // A heartbeat every second.
            lease: Duration::from_secs(3),
            max_attempts: 1,
            ..Default::default()
        },
    )
    .expect("worker");
    run_until(
        &worker,
        2,
        Duration::from_secs(30),
        |d, seen: &parking_lot::Mutex<usize>| {
            *seen.lock() += 1;
            if d.payload_json().contains("\"fail\":true") {
                return Err("card declined".into());
            }
            Ok(())
        },
        |seen| {
            *seen == 20
                && q.minutes(KEEP_MINUTES)
                    .expect("minutes")
                    .iter()
                    .any(|m| m.scheduled == Some(7))
        },
    );
    // The pool adds what is left when it stops.
    let minutes = q.minutes(KEEP_MINUTES).expect("minutes");
    assert_eq!(minutes.len(), KEEP_MINUTES as usize);
    let now_minute = minute_of(server.now_ms());
    assert!(
        (now_minute - 1..=now_minute).contains(&minute_of(minutes[minutes.len() - 1].start_ms)),
        "the current minute comes last"
    );
    for pair in minutes.windows(2) {
        assert_eq!(pair[1].start_ms - pair[0].start_ms, MINUTE_MS);
    }
    assert_eq!(minutes.iter().map(|m| m.handled).sum::<u64>(), 20);
    assert_eq!(minutes.iter().map(|m| m.failed).sum::<u64>(), 5);
    let busy: Vec<_> = minutes.iter().filter(|m| m.handled > 0).collect();
    for m in &busy {
        let (p50, p99) = (m.lateness_p50_ms.expect("p50"), m.lateness_p99_ms.expect("p99"));
        assert!(0.0 <= p50 && p50 <= p99 && p99 < 30_000.0, "{m:?}");
    }
    let sampled: Vec<_> = minutes.iter().filter(|m| m.scheduled.is_some()).collect();
    assert!(!sampled.is_empty());
    // Both partitions' samples, summed: the seven due in an hour are scheduled in every
    // minute of this test (a minute that began between the two partitions' calls holds
    // one partition's share).
    assert!(sampled.iter().any(|m| m.scheduled == Some(7)), "{sampled:?}");
    assert!(sampled.iter().all(|m| m.scheduled <= Some(7)), "{sampled:?}");
    let empty = minutes
        .iter()
        .find(|m| m.handled == 0 && m.scheduled.is_none())
        .expect("an empty minute");
    assert_eq!((empty.failed, empty.lateness_p50_ms, empty.ready), (0, None, None));

    for tag in &tags {
        let key = format!("{tag}:minutes");
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut con).expect("PTTL");
        assert!(
            ttl > 0 && ttl <= i64::from(KEEP_MINUTES + 1) * MINUTE_MS,
            "{key} expires when nobody writes: {ttl}"
        );
    }
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(format!("{}:minutes", tags[0]))
        .query(&mut con)
        .expect("HKEYS");
    assert!(!fields.is_empty());
    assert!(
        fields
            .iter()
            .all(|f| f.parse::<i64>().is_ok_and(|m| m > now_minute - i64::from(KEEP_MINUTES))),
        "old and stray fields dropped: {fields:?}"
    );

    for bad in [0, KEEP_MINUTES + 1] {
        let err = q.minutes(bad).expect_err("refused").to_string();
        assert!(err.contains("span"), "{err}");
    }
}
