//! Drain throughput of the core alone: N already-due messages, a no-op handler on the
//! pool's own threads. Used by bench/run.py; prints one JSON line.
//!
//! cargo run --release -p delayq --example drain -- redis://127.0.0.1:6379 200000 [partitions] [keep_completed]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use delayq::{NewMessage, Queue, QueueOptions, Worker, WorkerOptions};

#[expect(
    clippy::print_stdout,
    reason = "its one line of JSON on stdout is what bench/run.py reads"
)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let n: usize = args.next().map_or(Ok(200_000), |a| a.parse())?;
    let partitions: u32 = args.next().map_or(Ok(1), |a| a.parse())?;
    let keep_completed: usize = args.next().map_or(Ok(0), |a| a.parse())?;
    let queue = Queue::new(
        &url,
        "bench-rust",
        QueueOptions {
            partitions,
            keep_completed,
            ..QueueOptions::default()
        },
    )?;
    queue.purge()?;
    for start in (0..n).step_by(10_000) {
        let batch = (start..(start + 10_000).min(n))
            .map(|i| NewMessage::new(&serde_json::json!({"order_id": i, "action": "close"}), Duration::ZERO))
            .collect::<Result<Vec<_>, _>>()?;
        queue.push_many(&batch)?;
    }
    let handled = AtomicUsize::new(0);
    let last = parking_lot::Mutex::new(Instant::now());
    let worker = Worker::new(
        queue.clone(),
        WorkerOptions {
            threads: 4,
            batch: 1000,
            ..WorkerOptions::default()
        },
    )?;
    let stopper = worker.stopper();
    let started = Instant::now();
    let summary = std::thread::scope(|s| {
        s.spawn(|| {
            while handled.load(Ordering::Relaxed) < n {
                std::thread::sleep(Duration::from_millis(5));
            }
            stopper.stop();
        });
        worker.run(4, |_| {
            if handled.fetch_add(1, Ordering::Relaxed) + 1 == n {
                *last.lock() = Instant::now();
            }
            Ok(())
        })
    })?;
    let secs = last.into_inner().duration_since(started).as_secs_f64();
    let left = queue.stats()?;
    println!(
        "{{\"rate\": {:.1}, \"seconds\": {secs:.3}, \"handled\": {}, \"acked\": {}, \"left\": {}, \"completed\": {}}}",
        n as f64 / secs,
        summary.handled,
        summary.acked,
        left.ready + left.inflight + left.scheduled,
        left.completed
    );
    queue.purge()?;
    Ok(())
}
