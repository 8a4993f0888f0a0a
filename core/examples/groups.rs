//! Groups under load, for bench/groups.py: fills a queue, prints `{"filled": n}`, waits
//! for a line on stdin (the driver resets Redis's statistics meanwhile), runs a pool,
//! prints one line of JSON, waits for another line, then checks what is left and prints
//! a last line.
//!
//! Scenarios:
//! - `wide`: 100 groups of 1 000 due messages each, each group's block followed by 99
//!   groups of one due message (10 000 groups, 109 900 messages); a pool of 4 fetch
//!   threads, batch 1 000, 4 handler threads, a no-op handler, drained to the end.
//! - `plain`: the same messages without groups.
//! - `fair`: one group of 100 000 due messages, then 99 groups of 10; a pool of 8 handler
//!   threads (default fetch threads and batch), each handler sleeping 1 ms; stops once
//!   every message of the small groups ran, and reports when each group started its
//!   messages, in ms from the pool's start.
//!
//! LIMIT is the default concurrency limit of groups (0: none).
//!
//!     cargo run --release -p delayq --example groups -- URL wide|plain|fair LIMIT

use std::collections::BTreeMap;
use std::io::BufRead;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use delayq::{GroupLimit, NewMessage, Queue, QueueOptions, Worker, WorkerOptions};
use parking_lot::Mutex;

const BIG: &str = "big";

fn message(n: usize, group: Option<String>) -> Result<NewMessage, delayq::Error> {
    let mut m = NewMessage::new(
        &serde_json::json!({"order_id": n, "group": group.as_deref().unwrap_or("")}),
        Duration::ZERO,
    )?;
    m.options.group = group;
    Ok(m)
}

/// The groups of the scenario's messages, in push (due) order; `None` for no group.
fn layout(scenario: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    match scenario {
        "wide" | "plain" => {
            for backlog in 0..100 {
                out.extend((0..1000).map(|_| Some(format!("backlog-{backlog}"))));
                out.extend((0..99).map(|single| Some(format!("single-{backlog}-{single}"))));
            }
            if scenario == "plain" {
                out.iter_mut().for_each(|g| *g = None);
            }
        }
        "fair" => {
            out.extend((0..100_000).map(|_| Some(BIG.to_owned())));
            for _ in 0..10 {
                out.extend((0..99).map(|small| Some(format!("small-{small}"))));
            }
        }
        other => panic!("unknown scenario {other}"),
    }
    out
}

fn wait_for_line() -> std::io::Result<()> {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(())
}

#[expect(
    clippy::print_stdout,
    reason = "its lines of JSON on stdout are what bench/groups.py reads"
)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args.next().ok_or("URL")?;
    let scenario = args.next().ok_or("scenario")?;
    let limit: u32 = args.next().map_or(Ok(0), |a| a.parse())?;
    let queue = Queue::new(&url, "bench-groups", QueueOptions::default())?;
    queue.purge()?;
    if limit > 0 {
        queue.set_group_limit(None, GroupLimit::concurrency(limit)?)?;
    }
    let groups = layout(&scenario);
    let n = groups.len();
    for (start, chunk) in groups.chunks(10_000).enumerate() {
        let batch = chunk
            .iter()
            .enumerate()
            .map(|(i, g)| message(start * 10_000 + i, g.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        queue.push_many(&batch)?;
    }
    println!("{}", serde_json::json!({"filled": n}));
    wait_for_line()?;

    let fair = scenario == "fair";
    let small_total = if fair { n - 100_000 } else { 0 };
    let opts = if fair {
        WorkerOptions::default()
    } else {
        WorkerOptions {
            threads: 4,
            batch: 1000,
            ..WorkerOptions::default()
        }
    };
    let handlers = if fair { 8 } else { 4 };
    let handled = AtomicUsize::new(0);
    let small_done = AtomicUsize::new(0);
    // Each start as (µs since the pool's start, group), for `fair`.
    let starts: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());
    let last = Mutex::new(Instant::now());
    let worker = Worker::new(queue.clone(), opts)?;
    let stopper = worker.stopper();
    let started = Instant::now();
    let summary = std::thread::scope(|s| {
        s.spawn(|| {
            loop {
                let done = if fair {
                    small_done.load(Ordering::Relaxed) >= small_total
                } else {
                    handled.load(Ordering::Relaxed) >= n
                };
                if done {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            stopper.stop();
        });
        worker.run(handlers, |d| {
            if fair {
                let group = d.group.clone().unwrap_or_default();
                let small = group != BIG;
                starts.lock().push((started.elapsed().as_micros() as u64, group));
                std::thread::sleep(Duration::from_millis(1));
                if small {
                    small_done.fetch_add(1, Ordering::Relaxed);
                }
            }
            if handled.fetch_add(1, Ordering::Relaxed) + 1 == n {
                *last.lock() = Instant::now();
            }
            Ok(())
        })
    })?;
    let secs = last.into_inner().duration_since(started).as_secs_f64();
    let mut out = serde_json::json!({
        "handled": summary.handled,
        "acked": summary.acked,
    });
    if fair {
        // Per group: its last start (ms), and for the big group the starts before each.
        let starts = starts.into_inner();
        let mut last_start: BTreeMap<String, f64> = BTreeMap::new();
        for (us, group) in &starts {
            last_start.insert(group.clone(), *us as f64 / 1000.0);
        }
        let big_starts: Vec<f64> = starts
            .iter()
            .filter(|(_, g)| g == BIG)
            .map(|(us, _)| *us as f64 / 1000.0)
            .collect();
        out["last_start_ms"] = serde_json::json!(last_start);
        out["big_starts_ms"] = serde_json::json!(big_starts);
    } else {
        out["rate"] = serde_json::json!(n as f64 / secs);
        out["seconds"] = serde_json::json!(secs);
    }
    println!("{out}");
    wait_for_line()?;
    let left = queue.stats()?;
    println!(
        "{}",
        serde_json::json!({
            "left": left.ready + left.inflight + left.scheduled,
            "delivered": left.totals.get("delivered").copied().unwrap_or(0),
        })
    );
    Ok(())
}
