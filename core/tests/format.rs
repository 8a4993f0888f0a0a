//! The stored format's version (include/clock.lua): the first script that stores the
//! queue clock records it in :control; a build that meets a higher one stops before
//! it writes, naming both versions, and a worker pool does not start on it.

mod common;

use std::time::Duration;

use common::{RedisServer, run_until_empty};
use delayq::{Error, NewMessage, Worker, WorkerOptions};
use serde_json::json;

fn recorded(server: &RedisServer, tag: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(format!("{tag}:control"))
        .arg("format")
        .query(&mut server.con())
        .expect("HGET")
}

/// The queue's keys with their DUMP.
fn snapshot(server: &RedisServer, tag: &str) -> Vec<(String, Vec<u8>)> {
    let mut con = server.con();
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{tag}:*"))
        .query(&mut con)
        .expect("KEYS");
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let dump: Vec<u8> = redis::cmd("DUMP").arg(&k).query(&mut con).expect("DUMP");
            (k, dump)
        })
        .collect()
}

#[test]
fn the_first_write_records_the_format_and_a_queue_of_the_build_before_gets_it() {
    let server = RedisServer::start();
    let q = server.queue("fresh");
    assert_eq!(recorded(&server, "{dq:fresh}"), None);
    q.push(&json!({"n": 1}), Duration::ZERO).expect("push");
    assert_eq!(recorded(&server, "{dq:fresh}").as_deref(), Some("1"));

    // The build before recorded none: its messages run, and the first write records it.
    let old = server.queue("old");
    old.push(&json!({"n": 1}), Duration::ZERO).expect("push");
    let _: () = redis::cmd("HDEL")
        .arg("{dq:old}:control")
        .arg("format")
        .query(&mut server.con())
        .expect("HDEL");
    let summary = run_until_empty(&old, WorkerOptions::default(), |_| Ok(()));
    assert_eq!(summary.acked, 1);
    assert_eq!(recorded(&server, "{dq:old}").as_deref(), Some("1"));
}

#[test]
fn a_newer_format_stops_every_call_before_it_writes_and_names_both_versions() {
    let server = RedisServer::start();
    let q = server.queue("newer");
    q.push(&json!({"n": "before"}), Duration::ZERO).expect("push");
    let _: () = redis::cmd("HSET")
        .arg("{dq:newer}:control")
        .arg("format")
        .arg("3")
        .query(&mut server.con())
        .expect("HSET");
    let before = snapshot(&server, "{dq:newer}");
    let check = |what: &str, err: Error| {
        assert!(matches!(err, Error::Format { stored: 3, known: 2 }), "{what}: {err:?}");
        assert!(err.to_string().contains("stored format 3"), "{what}: {err}");
    };
    check("push", q.push(&json!({"n": 1}), Duration::ZERO).expect_err("push"));
    let batch: Vec<NewMessage> = (0..2)
        .map(|n| NewMessage::new(&json!({"n": n}), Duration::ZERO).expect("message"))
        .collect();
    check("push_many", q.push_many(&batch).expect_err("push_many"));
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            stop_when_empty: true,
            ..WorkerOptions::default()
        },
    )
    .expect("worker");
    check("a pool", worker.run(1, |_| Ok(())).expect_err("a pool"));
    assert!(
        snapshot(&server, "{dq:newer}") == before,
        "a call wrote under a newer format"
    );
}

/// Groups are what builds of format 1 would misread (as serial keys): the first push
/// of a group, or a group's limit, records format 2, and nothing lowers it again.
#[test]
fn a_queue_that_holds_groups_records_format_2() {
    let server = RedisServer::start();
    for (name, with_group) in [("pushed", true), ("limited", false)] {
        let q = server.queue(name);
        let tag = format!("{{dq:{name}}}");
        q.push(&json!({"n": 0}), Duration::ZERO).expect("push");
        assert_eq!(recorded(&server, &tag).as_deref(), Some("1"));
        if with_group {
            let mut m = NewMessage::new(&json!({"n": 1}), Duration::ZERO).expect("message");
            m.options.group = Some("merchant-42".into());
            q.push_many(&[m]).expect("push a group");
        } else {
            q.set_group_limit(None, delayq::GroupLimit::concurrency(2).expect("limit"))
                .expect("limit");
        }
        assert_eq!(recorded(&server, &tag).as_deref(), Some("2"), "{name}");
        let summary = run_until_empty(&q, WorkerOptions::default(), |_| Ok(()));
        assert_eq!(summary.acked, if with_group { 2 } else { 1 });
        q.push(&json!({"n": 2}), Duration::ZERO).expect("push");
        assert_eq!(recorded(&server, &tag).as_deref(), Some("2"), "{name}");
    }
}
