//! A maxmemory-policy turned to an evicting one under a running pool is reported once,
//! at a heartbeat: a look when the process first connected is not enough.

mod common;

use std::time::Duration;

use common::{RedisServer, StopOnDrop, wait_for};
use delayq::{Worker, WorkerOptions};

#[test]
fn a_policy_changed_under_a_running_pool_is_warned_about_once() {
    assert!(
        delayq::capture_logs(log::LevelFilter::Warn),
        "the only logger of this test binary"
    );
    delayq::set_eviction_recheck(Duration::from_millis(100));
    let server = RedisServer::start_with(&["--maxmemory", "100mb", "--maxmemory-policy", "noeviction"]);
    let q = server.queue("orders");
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            // Heartbeats every lease / 3.
            lease: Duration::from_millis(600),
            ..WorkerOptions::default()
        },
    )
    .expect("worker");
    let stopper = worker.stopper();
    let mut warnings: Vec<String> = Vec::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _stop = StopOnDrop(stopper.clone());
            // A heartbeat or two under noeviction: nothing to say.
            std::thread::sleep(Duration::from_millis(800));
            let quiet: Vec<_> = delayq::take_logs()
                .into_iter()
                .filter(|r| r.message.contains("maxmemory-policy"))
                .collect();
            assert!(quiet.is_empty(), "{quiet:?}");
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory-policy")
                .arg("allkeys-lru")
                .query(&mut server.con())
                .expect("CONFIG SET");
            let mut seen = Vec::new();
            wait_for(Duration::from_secs(10), "the warning", || {
                seen.extend(
                    delayq::take_logs()
                        .into_iter()
                        .map(|r| r.message)
                        .filter(|m| m.contains("maxmemory-policy")),
                );
                !seen.is_empty()
            });
            // More heartbeats, the policy unchanged: no second warning.
            std::thread::sleep(Duration::from_millis(800));
            seen.extend(
                delayq::take_logs()
                    .into_iter()
                    .map(|r| r.message)
                    .filter(|m| m.contains("maxmemory-policy")),
            );
            stopper.stop();
            warnings = seen;
        });
        worker.run(1, |_| Ok(())).expect("run");
    });
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("allkeys-lru"), "{warnings:?}");
}
