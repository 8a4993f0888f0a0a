//! Steps of the Redis server's clock, made while it runs by an `LD_PRELOAD` shim on
//! its wall clock (tests/common/clock_shift.c, built here with the system's `cc`).
//! A step back must not hold messages that were due before it, nor let messages pushed
//! after it overtake them; a step forward must not expire live leases; a restart
//! request made before a step back must not stop the pools started after it.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{RedisServer, Runs, StopOnDrop, timed_run, wait_for};
use delayq::{Received, Worker, WorkerOptions};
use serde_json::json;

/// A redis-server whose wall clock the test can step.
struct ShiftedRedis {
    server: RedisServer,
    shift_file: PathBuf,
    shift_ms: i64,
}

impl ShiftedRedis {
    fn start(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("delayq-clock-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let shim = dir.join("clock_shift.so");
        let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/common/clock_shift.c");
        let built = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o"])
            .arg(&shim)
            .arg(&source)
            .arg("-ldl")
            .status()
            .expect("cc must be installed (apt-get install gcc)");
        assert!(built.success(), "building {}", source.display());
        let shift_file = dir.join("shift");
        std::fs::write(&shift_file, 0_i64.to_ne_bytes()).expect("shift file");
        let server = RedisServer::start_with_env(&[
            ("LD_PRELOAD", shim.to_str().expect("path")),
            ("DELAYQ_CLOCK_SHIFT_FILE", shift_file.to_str().expect("path")),
        ]);
        let mut shifted = Self {
            server,
            shift_file,
            shift_ms: 0,
        };
        // The shim is in force: a step shows in TIME at once.
        let before = shifted.server.now_ms();
        shifted.step(-3_600_000);
        let after = shifted.server.now_ms();
        shifted.step(3_600_000);
        assert!(
            after < before - 3_000_000,
            "the clock shim is not in force: {before} then {after}"
        );
        shifted
    }

    /// Steps the server's clock by `ms` (back when negative).
    fn step(&mut self, ms: i64) {
        use std::os::unix::fs::FileExt;
        self.shift_ms += ms;
        // Written in place, never truncated: the shim maps this file, and a read past
        // its end would kill the server.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.shift_file)
            .expect("shift file");
        file.write_all_at(&self.shift_ms.to_ne_bytes(), 0).expect("shift file");
    }
}

fn opts() -> WorkerOptions {
    WorkerOptions {
        threads: 1,
        ..WorkerOptions::default()
    }
}

#[test]
fn a_step_back_neither_holds_due_messages_nor_lets_later_ones_overtake() {
    let mut redis = ShiftedRedis::start("back");
    let q = redis.server.queue("steps");
    // Due now, with no pool running yet.
    for n in 0..20 {
        q.push(&json!({"n": n}), Duration::ZERO).expect("push");
    }
    redis.step(-300_000);
    for n in 100..105 {
        q.push(&json!({"n": n}), Duration::ZERO).expect("push");
    }
    let delayed_at = Instant::now();
    q.push(&json!({"n": 200}), Duration::from_secs(2)).expect("push");

    let handled: Mutex<Vec<(i64, Instant)>> = Mutex::new(Vec::new());
    let worker = Worker::new(q.clone(), opts()).expect("worker");
    std::thread::scope(|s| {
        let _stop = StopOnDrop(worker.stopper());
        s.spawn(|| {
            worker
                .run(1, |d| {
                    let n = d.payload::<serde_json::Value>().expect("payload")["n"]
                        .as_i64()
                        .expect("n");
                    handled.lock().expect("lock").push((n, Instant::now()));
                    Ok(())
                })
                .expect("run")
        });
        // Held for the step, they would wait 300 s.
        wait_for(Duration::from_secs(30), "every message handled", || {
            handled.lock().expect("lock").len() == 26
        });
        worker.stop();
    });
    let handled = handled.into_inner().expect("lock");
    let order: Vec<i64> = handled.iter().map(|(n, _)| *n).collect();
    let expected: Vec<i64> = (0..20).chain(100..105).chain([200]).collect();
    assert_eq!(order, expected, "due order across the step");
    // Time goes on from where it stood: a delay pushed after the step is not cut short.
    let ran_after = handled[25].1 - delayed_at;
    assert!(
        ran_after >= Duration::from_secs(2),
        "a 2 s delay ran after {ran_after:?}"
    );
}

#[test]
fn a_step_forward_expires_no_live_lease() {
    let mut redis = ShiftedRedis::start("forward");
    let q = redis.server.queue("steps");
    let lease = WorkerOptions {
        lease: Duration::from_millis(1200),
        ..opts()
    };
    let busy: Vec<Worker> = (0..2)
        .map(|_| Worker::new(q.clone(), lease.clone()).expect("worker"))
        .collect();
    let idle = Worker::new(q.clone(), lease).expect("worker");
    let runs: Runs = Mutex::new(HashMap::new());
    let handler = |d: &delayq::Delivery| {
        let busy = d.payload::<serde_json::Value>().expect("payload")["busy"] == json!(true);
        timed_run(&runs, &d.id, || {
            if busy {
                std::thread::sleep(Duration::from_millis(4000));
            }
        });
        Ok(())
    };
    std::thread::scope(|s| {
        let _stops: Vec<StopOnDrop> = busy.iter().chain([&idle]).map(|w| StopOnDrop(w.stopper())).collect();
        for w in &busy {
            s.spawn(|| w.run(1, handler).expect("run"));
        }
        wait_for(Duration::from_secs(10), "the busy pools listed", || {
            q.workers().is_ok_and(|w| w.len() == 2)
        });
        for _ in 0..2 {
            q.push(&json!({"busy": true}), Duration::ZERO).expect("push");
        }
        wait_for(Duration::from_secs(10), "both messages running", || {
            runs.lock().expect("lock").len() == 2
        });
        // Due in a minute: the step makes it due at once (the documented cost of a step
        // forward; it is not undone).
        q.push(&json!({"busy": false}), Duration::from_secs(60)).expect("push");
        s.spawn(|| idle.run(1, handler).expect("run"));
        wait_for(Duration::from_secs(10), "the idle pool listed", || {
            q.workers().is_ok_and(|w| w.len() == 3)
        });
        redis.step(300_000);
        wait_for(Duration::from_secs(30), "all three messages handled", || {
            q.stats().is_ok_and(|st| st.inflight + st.ready + st.scheduled == 0)
        });
        for w in busy.iter().chain([&idle]) {
            w.stop();
        }
    });
    let runs = runs.into_inner().expect("lock");
    assert_eq!(runs.len(), 3);
    for (id, list) in &runs {
        assert_eq!(list.len(), 1, "{id} ran {} times: {list:?}", list.len());
    }
    let stats = q.stats().expect("stats");
    assert_eq!((stats.total("acked"), stats.total("expired")), (3, 0), "{stats:?}");
}

#[test]
fn a_restart_request_before_a_step_back_stops_no_later_pool() {
    let mut redis = ShiftedRedis::start("restart");
    let q = redis.server.queue("steps");
    let first = Worker::new(q.clone(), opts()).expect("worker");
    let consumer = first.start().expect("start");
    wait_for(Duration::from_secs(10), "the pool listed", || {
        q.workers().is_ok_and(|w| w.len() == 1)
    });
    assert_eq!(q.restart_workers().expect("restart_workers"), 1);
    wait_for(Duration::from_secs(10), "the pool asked to stop", || {
        consumer.stopper().restart_requested()
    });
    consumer.finish();
    redis.step(-300_000);

    let later = Worker::new(q.clone(), opts()).expect("worker");
    let consumer = later.start().expect("start");
    q.push(&json!({"n": 1}), Duration::ZERO).expect("push");
    match consumer.recv_timeout(Duration::from_secs(10)) {
        Received::Message(d) => consumer.ack(d),
        other => panic!("a pool started after the restart request and the step stopped: {other:?}"),
    }
    assert!(!consumer.stopper().restart_requested());
    assert_eq!(consumer.finish().acked, 1);
}

/// Redis time in ms, as include/clock.lua reads it.
const READ_TIME: &str = "local function redis_ms() local t = redis.call('TIME') \
                         return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) end";

/// include/clock.lua on its own, as every script runs it: the queue time, and Redis
/// time read just before and just after it. The offset queue_now() applied lies in
/// `queue - after ..= queue - before`: the two reads can fall in different
/// milliseconds, so a test that took either one as the offset's base would be off by 1.
fn queue_and_redis_time(server: &RedisServer) -> (i64, i64, i64) {
    let clock = include_str!("../src/lua/include/clock.lua");
    let script = format!(
        "local K_CONTROL = KEYS[1]\nlocal function fmt(n) return string.format('%.0f', n) end\n{clock}\n\
         {READ_TIME}\nlocal before = redis_ms()\nlocal q = queue_now(true)\n\
         return {{q, before, redis_ms()}}"
    );
    let (queue, before, after): (i64, i64, i64) = redis::Script::new(&script)
        .key("{dq:steps}:control")
        .invoke(&mut server.con())
        .expect("clock.lua");
    assert!(
        before <= after,
        "Redis time went back within one script: {before} then {after}"
    );
    (queue, before, after)
}

#[test]
fn after_a_step_back_the_queue_clock_goes_on_and_meets_redis_time_again() {
    let mut redis = ShiftedRedis::start("phase-out");
    let (before, raw_lo, raw_hi) = queue_and_redis_time(&redis.server);
    assert!(
        before - raw_hi >= -1 && before - raw_lo <= 1,
        "no offset before any step"
    );
    redis.step(-1_000);
    let (at_step, step_lo, step_hi) = queue_and_redis_time(&redis.server);
    assert!(at_step >= before, "queue time went back: {before} then {at_step}");
    assert!(
        at_step - step_hi >= 900 && at_step - step_lo <= 1_000,
        "the step is learned as the offset: {}..={}",
        at_step - step_hi,
        at_step - step_lo
    );
    // The offset is phased out while both clocks go on: queue time never goes back,
    // and ends where Redis time is. The offset at the step is at most
    // `at_step - step_lo`; one now is at least `now - hi`.
    let mut last = at_step;
    wait_for(Duration::from_secs(60), "the offset phased out", || {
        let (now, lo, hi) = queue_and_redis_time(&redis.server);
        assert!(now >= last, "queue time went back: {last} then {now}");
        assert!(now >= lo, "queue time fell behind Redis time: {now} < {lo}");
        assert!(
            now - hi <= at_step - step_lo,
            "the offset grew without a step: at least {} now, at most {} at the step",
            now - hi,
            at_step - step_lo
        );
        last = now;
        std::thread::sleep(Duration::from_millis(200));
        now - hi <= 0
    });
}

/// A measurement, not a check (`cargo test -p delayq --test clock_steps -- --ignored
/// --nocapture lateness`): how late delays of 1 to 4 s run on a running pool, without a
/// step, when pushed right after a step back of 300 s, and when waiting at the step
/// (with and without a script run right after it, by a push of one more message).
#[test]
#[ignore = "a measurement: run it by name"]
#[expect(clippy::print_stdout, reason = "the measurement is its output")]
fn lateness_of_delays_around_a_step_back() {
    const N: u64 = 40;
    const ROUNDS: usize = 3;
    const POKE: u64 = 2000;
    // (case, when the step comes after the last push (None: before the pushes), a
    // push right after the step); the first case has no step.
    let cases: [(&str, Option<Duration>, bool); 5] = [
        ("no step", None, false),
        ("pushed after the step", None, false),
        (
            "waiting, step 0.2 s after the pushes",
            Some(Duration::from_millis(200)),
            false,
        ),
        (
            "waiting, step 0.9 s after the pushes",
            Some(Duration::from_millis(900)),
            false,
        ),
        (
            "waiting, step 0.2 s after the pushes, a push right after it",
            Some(Duration::from_millis(200)),
            true,
        ),
    ];
    println!("| case | round | queue clock stood still, ms | min ms | median ms | max ms | max - delay/9, ms |");
    println!("|---|---|---|---|---|---|---|");
    for (i, (case, step_after, poke)) in cases.into_iter().enumerate() {
        for round in 0..ROUNDS {
            let mut redis = ShiftedRedis::start(&format!("late-{i}-{round}"));
            let q = redis.server.queue("steps");
            let worker = Worker::new(
                q.clone(),
                WorkerOptions {
                    threads: 4,
                    ..WorkerOptions::default()
                },
            )
            .expect("worker");
            let handled: Mutex<HashMap<u64, Instant>> = Mutex::new(HashMap::new());
            let mut pushed: HashMap<u64, (Instant, Duration)> = HashMap::new();
            std::thread::scope(|s| {
                let _stop = StopOnDrop(worker.stopper());
                s.spawn(|| {
                    worker
                        .run(4, |d| {
                            let at = Instant::now();
                            let n = d.payload::<serde_json::Value>().expect("payload")["n"]
                                .as_u64()
                                .expect("n");
                            handled.lock().expect("lock").insert(n, at);
                            Ok(())
                        })
                        .expect("run")
                });
                // A first message through the running pool.
                q.push(&json!({"n": 1000}), Duration::ZERO).expect("push");
                wait_for(Duration::from_secs(10), "the first message", || {
                    handled.lock().expect("lock").contains_key(&1000)
                });
                if i == 1 {
                    redis.step(-300_000);
                }
                for n in 0..N {
                    let delay = Duration::from_millis(1000 + n * 3000 / (N - 1));
                    let at = Instant::now();
                    q.push(&json!({"n": n}), delay).expect("push");
                    pushed.insert(n, (at, delay));
                }
                if let Some(after) = step_after {
                    std::thread::sleep(after);
                    redis.step(-300_000);
                }
                if poke {
                    q.push(&json!({"n": POKE}), Duration::ZERO).expect("push");
                }
                let all = N + 1 + u64::from(poke);
                wait_for(Duration::from_secs(30), "every delay handled", || {
                    handled.lock().expect("lock").len() as u64 == all
                });
                worker.stop();
            });
            // The offset learned at the step: 300 s less the Redis time that passed
            // between the last script before it and the first one after it, during
            // which the queue clock stood still.
            let learned: Option<i64> = redis::cmd("HGET")
                .arg("{dq:steps}:control")
                .arg("step_ms")
                .query(&mut redis.server.con())
                .expect("HGET");
            let handled = handled.into_inner().expect("lock");
            let mut late: Vec<f64> = Vec::new();
            let mut over_ninth = f64::MIN;
            for (n, (at, delay)) in &pushed {
                let ran = handled[n];
                let ms = if ran >= *at + *delay {
                    (ran - (*at + *delay)).as_secs_f64() * 1000.0
                } else {
                    -((*at + *delay - ran).as_secs_f64() * 1000.0)
                };
                over_ninth = over_ninth.max(ms - delay.as_secs_f64() * 1000.0 / 9.0);
                late.push(ms);
            }
            late.sort_by(f64::total_cmp);
            println!(
                "| {case} | {round} | {} | {:.0} | {:.0} | {:.0} | {over_ninth:.0} |",
                learned.map_or_else(|| "-".to_owned(), |ms| (300_000 - ms).to_string()),
                late[0],
                late[late.len() / 2],
                late[late.len() - 1]
            );
        }
    }
}
