//! The same queue API on Redis Cluster, through a `redis+cluster://` URL. Partitioned
//! queues, resharding and failover are tested under issue 7; this shows the cluster
//! client end to end on three masters started here.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{RedisServer, free_port, wait_for};
use delayq::{NewMessage, Queue, QueueOptions, Worker, WorkerOptions};
use parking_lot::Mutex;

#[test]
fn a_queue_works_on_a_three_master_cluster() {
    // The bus port defaults to port + 10000, past 65535 for a port high in the
    // ephemeral range: give it a free port of its own.
    let nodes: Vec<RedisServer> = (0..3)
        .map(|_| {
            let bus = free_port().to_string();
            RedisServer::start_with(&[
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                &bus,
                "--cluster-node-timeout",
                "2000",
            ])
        })
        .collect();
    let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
    let out = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("redis-cli");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    wait_for(Duration::from_secs(20), "cluster_state:ok", || {
        nodes.iter().all(|n| {
            redis::cmd("CLUSTER")
                .arg("INFO")
                .query::<String>(&mut n.con())
                .is_ok_and(|i| i.contains("cluster_state:ok"))
        })
    });

    let url = format!("redis+cluster://{},{}", addrs[0], addrs[1]);
    let q = Queue::new(&url, "orders", QueueOptions::default()).expect("cluster queue");
    let batch: Vec<NewMessage> = (0..1500u64)
        .map(|i| NewMessage::new(&i, Duration::from_millis(i % 200)).expect("msg"))
        .collect();
    q.push_many(&batch).expect("push_many across chunks");
    let stats = q.stats().expect("stats");
    assert_eq!(stats.ready + stats.scheduled, 1500);

    let seen: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            idle_check: Duration::from_millis(100),
            ..Default::default()
        },
    )
    .expect("worker");
    let stopper = worker.stopper();
    std::thread::scope(|s| {
        s.spawn(|| {
            wait_for(Duration::from_secs(30), "all handled", || seen.lock().len() >= 1500);
            stopper.stop();
        });
        worker
            .run(2, |d| {
                seen.lock().push(d.payload().map_err(|e| e.to_string())?);
                Ok(())
            })
            .expect("run");
    });
    let mut seen = seen.into_inner();
    seen.sort_unstable();
    assert_eq!(seen, (0..1500).collect::<Vec<_>>(), "each message exactly once");
    // Every key of the queue lives on one node: one hash slot.
    let holders = nodes.iter().filter(|n| !n.dump_keys().is_empty()).count();
    assert_eq!(holders, 1);
}
