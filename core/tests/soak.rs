//! Load: 8 producer threads and a pool of 8 handler threads, messages with mixed
//! delays pushed over a time window; every message handled, none lost, duplicates
//! counted (none expected without faults), resident memory reported at start and end.
//!
//! `make test` runs a short version (20 000 messages over 6 s); `make soak` the full
//! one (DELAYQ_SOAK_MESSAGES=200000 DELAYQ_SOAK_SECONDS=60).

mod common;

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{RedisServer, StopOnDrop, assert_no_leak, wait_for};
use delayq::{NewMessage, Worker, WorkerOptions};
use rand::Rng;
use serde_json::json;

const PRODUCERS: usize = 8;
const HANDLERS: usize = 8;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Mostly due at once or soon, some later, a few at the end of the window.
fn mixed_delay(rng: &mut impl Rng) -> Duration {
    match rng.random_range(0..10) {
        0..=3 => Duration::ZERO,
        4..=7 => Duration::from_millis(rng.random_range(1..1000)),
        _ => Duration::from_millis(rng.random_range(1000..5000)),
    }
}

#[test]
#[expect(clippy::print_stderr, reason = "the soak's report is its output")]
fn producers_and_a_pool_under_load_lose_nothing() {
    let n = usize::try_from(env_or("DELAYQ_SOAK_MESSAGES", 20_000)).expect("count");
    let window = Duration::from_secs(env_or("DELAYQ_SOAK_SECONDS", 6));
    let server = RedisServer::start();
    let q = server.queue("soak");
    let counts: Vec<AtomicU8> = (0..n).map(|_| AtomicU8::new(0)).collect();
    let handled = AtomicUsize::new(0);
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            threads: 4,
            ..WorkerOptions::default()
        },
    )
    .expect("worker");
    let stopper = worker.stopper();
    let started = Instant::now();
    let (rss_start, rss_end) = std::thread::scope(|s| {
        let _stop = StopOnDrop(stopper.clone());
        let run = s.spawn(|| {
            worker
                .run(HANDLERS, |d| {
                    let v: serde_json::Value = d.payload().map_err(|e| e.to_string())?;
                    let i = v["n"].as_u64().ok_or("no n")? as usize;
                    counts[i].fetch_add(1, Ordering::Relaxed);
                    handled.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                })
                .expect("run")
        });
        let per_producer = n.div_ceil(PRODUCERS);
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let q = q.clone();
                s.spawn(move || {
                    let mut rng = rand::rng();
                    let mine: Vec<usize> = (p * per_producer..((p + 1) * per_producer).min(n)).collect();
                    // Spread over the window: single pushes and small batches mixed.
                    let step = window.as_secs_f64() / mine.len().max(1) as f64;
                    let begin = Instant::now();
                    let mut k = 0;
                    while k < mine.len() {
                        let due = begin + Duration::from_secs_f64(step * k as f64);
                        if let Some(wait) = due.checked_duration_since(Instant::now()) {
                            std::thread::sleep(wait);
                        }
                        if rng.random_bool(0.5) {
                            q.push(&json!({"n": mine[k]}), mixed_delay(&mut rng)).expect("push");
                            k += 1;
                        } else {
                            let end = (k + 20).min(mine.len());
                            let batch: Vec<NewMessage> = mine[k..end]
                                .iter()
                                .map(|&i| NewMessage::new(&json!({"n": i}), mixed_delay(&mut rng)).expect("msg"))
                                .collect();
                            q.push_many(&batch).expect("push_many");
                            k = end;
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(window / 10);
        let rss_start = rss_kib();
        for p in producers {
            p.join().expect("producer");
        }
        wait_for(window + Duration::from_secs(120), "every message handled", || {
            q.stats()
                .is_ok_and(|s| s.total("pushed") == n as u64 && s.ready + s.scheduled + s.inflight == 0)
        });
        let rss_end = rss_kib();
        stopper.stop();
        run.join().expect("pool");
        (rss_start, rss_end)
    });
    let lost = counts.iter().filter(|c| c.load(Ordering::Relaxed) == 0).count();
    let duplicates = handled.load(Ordering::Relaxed) - (n - lost);
    eprintln!(
        "soak: {n} messages, {PRODUCERS} producers, {HANDLERS} handlers, {:.1} s: {lost} lost, \
         {duplicates} duplicates, RSS {rss_start} KiB at start, {rss_end} KiB at end",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(lost, 0, "lost messages");
    assert_eq!(duplicates, 0, "duplicates without any fault");
    // Flat, not exact: allocator caches and thread stacks settle at their own level.
    assert!(
        rss_end <= rss_start + 32 * 1024,
        "RSS grew from {rss_start} KiB to {rss_end} KiB"
    );
    let stats = q.stats().expect("stats");
    assert_eq!(stats.total("acked"), n as u64);
    assert_no_leak(&server, "{dq:soak}");
}
