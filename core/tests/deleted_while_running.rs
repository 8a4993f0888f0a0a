//! A message deleted while its handler runs (purge, a flush) is reported as gone,
//! not as a lost lease: no setting of the pool's would have changed it.

mod common;

use std::time::Duration;

use common::RedisServer;
use delayq::{Worker, WorkerOptions};
use serde_json::json;

#[test]
fn an_acknowledgement_of_a_purged_message_counts_as_gone() {
    assert!(
        delayq::capture_logs(log::LevelFilter::Info),
        "the only logger of this test binary"
    );
    let server = RedisServer::start();
    let q = server.queue("orders");
    q.push(&json!({"n": 1}), Duration::ZERO).expect("push");
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            threads: 1,
            stop_when_empty: true,
            ..WorkerOptions::default()
        },
    )
    .expect("worker");
    let (started, running) = crossbeam_channel::bounded::<()>(1);
    let (purged_tx, purged) = crossbeam_channel::bounded::<()>(1);
    let summary = std::thread::scope(|s| {
        s.spawn(|| {
            running
                .recv_timeout(Duration::from_secs(10))
                .expect("the handler started");
            assert_eq!(q.purge().expect("purge"), 1);
            purged_tx.send(()).expect("send");
        });
        worker
            .run(1, |_| {
                started.send(()).map_err(|e| e.to_string())?;
                purged.recv_timeout(Duration::from_secs(10)).map_err(|e| e.to_string())
            })
            .expect("run")
    });
    assert_eq!(
        (summary.acked, summary.gone, summary.lease_lost),
        (0, 1, 0),
        "{summary:?}"
    );
    let logs: Vec<String> = delayq::take_logs().into_iter().map(|r| r.message).collect();
    assert!(logs.iter().any(|m| m.contains("was deleted while it ran")), "{logs:?}");
    assert!(!logs.iter().any(|m| m.contains("lease")), "{logs:?}");
}
