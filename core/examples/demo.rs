//! The demo: a producer schedules orders to close after short delays and a worker pool
//! closes them, then prints how late each was and what the queue counted.
//!
//! cargo run --release --example demo -- redis://127.0.0.1:6379

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use delayq::{NewMessage, Queue, QueueOptions, Worker, WorkerOptions};
use parking_lot::Mutex;
use serde_json::json;

const ORDERS: usize = 2000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let queue = Queue::new(&url, "demo-orders", QueueOptions::default())?;
    queue.purge()?;

    // Producer: close each unpaid order after 0-3 s (30 minutes in real life).
    let batch = (0..ORDERS)
        .map(|i| {
            NewMessage::new(
                &json!({"order_id": 10_000 + i, "action": "close"}),
                Duration::from_millis((i * 3000 / ORDERS) as u64),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    queue.push_many(&batch)?;
    eprintln!("producer: scheduled {ORDERS} orders to close within 3 s");

    // Worker pool: 4 handler threads; every 100th order fails once to show retries.
    let lateness = Mutex::new(Vec::with_capacity(ORDERS));
    let closed = AtomicUsize::new(0);
    let worker = Worker::new(
        queue.clone(),
        WorkerOptions {
            backoff_base: Duration::from_millis(100),
            ..WorkerOptions::default()
        },
    )?;
    let stopper = worker.stopper();
    let summary = std::thread::scope(|s| {
        s.spawn(|| {
            while closed.load(Ordering::SeqCst) < ORDERS {
                std::thread::sleep(Duration::from_millis(20));
            }
            stopper.stop();
        });
        worker.run(4, |d| {
            let order: serde_json::Value = d.payload().map_err(|e| e.to_string())?;
            let id = order["order_id"].as_u64().unwrap_or_default();
            if id.is_multiple_of(100) && d.attempt == 1 {
                return Err(format!("payment service timed out for order {id}"));
            }
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_err(|e| e.to_string())?;
            lateness.lock().push(now.as_millis() as i64 - d.due_at_ms);
            closed.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    })?;

    let mut late = lateness.into_inner();
    late.sort_unstable();
    let pct = |p: usize| late[(late.len() - 1) * p / 100];
    eprintln!(
        "worker: closed {} orders ({} retried once); lateness ms p50={} p99={} max={} min={}",
        late.len(),
        summary.retried,
        pct(50),
        pct(99),
        late[late.len() - 1],
        late[0]
    );
    let stats = queue.stats()?;
    eprintln!(
        "queue: scheduled={} ready={} inflight={} dead={} pushed={} acked={} retried={}",
        stats.scheduled,
        stats.ready,
        stats.inflight,
        stats.dead,
        stats.total("pushed"),
        stats.total("acked"),
        stats.total("retried")
    );
    if late.len() != ORDERS || stats.inflight + stats.ready + stats.scheduled != 0 {
        return Err("demo did not close every order".into());
    }
    queue.purge()?;
    Ok(())
}
