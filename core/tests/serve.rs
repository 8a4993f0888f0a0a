//! The receive loop (`host::serve`) over a scripted binding, against a real
//! redis-server: what each outcome does to its message, which hooks run, and why the
//! run ends.

mod common;

use std::time::Duration;

use common::RedisServer;
use delayq::host::{Called, Handler, Outcome, Recycle, StopReason, serve};
use delayq::{Delivery, Retry, State, Worker, WorkerOptions};
use serde_json::json;

/// A binding whose handler does what each payload's `"do"` says.
#[derive(Default)]
struct Scripted {
    /// Payloads the handler was called with, in order.
    called: Vec<String>,
    /// `(id, error)` of each `on_failure` call.
    failures: Vec<(String, String)>,
    /// `(id, error)` of each `on_dead` call.
    dead: Vec<(String, String)>,
    /// What `between` gives at its nth call (counting from 0).
    signal_at: Option<usize>,
    raise_at: Option<usize>,
    betweens: usize,
    /// What `memory_bytes` reports.
    memory: i64,
}

struct Call {
    id: String,
    act: String,
}

impl Handler for Scripted {
    type Call = Call;
    type Return = String;
    type Thrown = String;
    type Raise = String;

    fn between(&mut self, _ending: bool) -> Result<Option<StopReason>, String> {
        let n = self.betweens;
        self.betweens += 1;
        if self.raise_at == Some(n) {
            return Err("KeyboardInterrupt".into());
        }
        Ok((self.signal_at == Some(n)).then_some(StopReason::Signal))
    }

    fn asked(&mut self) -> Option<StopReason> {
        None
    }

    fn wait<T: Send>(&mut self, wait: impl FnOnce() -> T + Send) -> T {
        wait()
    }

    fn flush_logs(&mut self) {}

    fn prepare(&mut self, delivery: &Delivery) -> Result<Call, String> {
        let payload: serde_json::Value = serde_json::from_str(delivery.payload_json()).map_err(|e| e.to_string())?;
        Ok(Call {
            id: delivery.id.clone(),
            act: payload["do"].as_str().ok_or("no \"do\"")?.to_owned(),
        })
    }

    fn call(&mut self, call: &Call) -> String {
        self.called.push(call.act.clone());
        call.act.clone()
    }

    fn outcome(&mut self, returned: String) -> Called<String, String> {
        let raised = |no_retry| Outcome::Raised {
            error: "RuntimeException: boom".into(),
            trace: "#0 {main}".into(),
            no_retry,
        };
        let (outcome, thrown, raise) = match returned.as_str() {
            "raise" | "decide" => (raised(false), Some("boom".to_owned()), None),
            "raise_no_retry" => (raised(true), Some("boom".to_owned()), None),
            "exit" => (
                Outcome::Exited("exit(3) in the handler".into()),
                None,
                Some("SystemExit".to_owned()),
            ),
            _ => (Outcome::Returned, None, None),
        };
        Called { outcome, thrown, raise }
    }

    fn decision(&mut self, call: &Call) -> Option<(Retry, String)> {
        (call.act == "decide").then(|| (Retry::Never, "decided by the handler".to_owned()))
    }

    fn leave_forked_child(&mut self, _: Option<String>) -> String {
        unreachable!("nothing forks here")
    }

    fn on_failure(&mut self, call: &Call, thrown: String) {
        self.failures.push((call.id.clone(), thrown));
    }

    fn on_dead(&mut self, call: &Call, error: &str) {
        self.dead.push((call.id.clone(), error.to_owned()));
    }

    fn memory_bytes(&mut self) -> i64 {
        self.memory
    }
}

fn opts() -> WorkerOptions {
    WorkerOptions {
        threads: 1,
        batch: 1,
        prefetch: 1,
        backoff_base: Duration::from_secs(60),
        ..WorkerOptions::default()
    }
}

fn unlimited() -> Recycle {
    Recycle::new(None, None, None)
}

#[test]
fn each_outcome_settles_its_message_and_runs_its_hooks() {
    let server = RedisServer::start();
    let q = server.queue("serve-outcomes");
    let ok = q.push(&json!({"do": "return"}), Duration::ZERO).expect("push");
    let retried = q.push(&json!({"do": "raise"}), Duration::from_millis(1)).expect("push");
    let buried = q
        .push(&json!({"do": "raise_no_retry"}), Duration::from_millis(2))
        .expect("push");
    let decided = q
        .push(&json!({"do": "decide"}), Duration::from_millis(3))
        .expect("push");
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            stop_when_empty: true,
            ..opts()
        },
    )
    .expect("worker");
    let consumer = worker.start().expect("start");
    let mut side = Scripted::default();
    let served = serve(&consumer, &mut side, None, Recycle::new(Some(10), None, None));
    let summary = consumer.finish();

    assert_eq!(served.stopped_by, Some(StopReason::Empty));
    assert!(served.raise.is_none());
    assert_eq!(side.called, ["return", "raise", "raise_no_retry", "decide"]);
    assert_eq!((summary.acked, summary.failed, summary.dead), (1, 3, 2));
    assert!(q.get(&ok).expect("get").is_none(), "acknowledged and deleted");
    let info = q.get(&retried).expect("get").expect("kept");
    assert_eq!((info.state, info.attempts), (State::Scheduled, 1));
    assert_eq!(info.last_error.as_deref(), Some("RuntimeException: boom"));
    // Every exception goes to on_failure; the message's own decision beats it.
    assert_eq!(side.failures.len(), 3);
    assert_eq!(
        side.dead,
        [
            (buried.clone(), "RuntimeException: boom".to_owned()),
            (decided.clone(), "decided by the handler".to_owned())
        ]
    );
    assert_eq!(q.get(&decided).expect("get").expect("kept").state, State::Dead);
}

#[test]
fn an_exit_counts_an_attempt_returns_the_message_at_once_and_stops_the_run() {
    let server = RedisServer::start();
    let q = server.queue("serve-exit");
    let id = q.push(&json!({"do": "exit"}), Duration::ZERO).expect("push");
    let after = q
        .push(&json!({"do": "return"}), Duration::from_millis(50))
        .expect("push");
    let worker = Worker::new(q.clone(), opts()).expect("worker");
    let consumer = worker.start().expect("start");
    let mut side = Scripted::default();
    let served = serve(&consumer, &mut side, None, unlimited());
    consumer.finish();

    assert_eq!(served.stopped_by, Some(StopReason::Exit));
    assert_eq!(served.raise.as_deref(), Some("SystemExit"));
    assert_eq!(side.called, ["exit"], "nothing runs after an exit");
    assert!(
        side.failures.is_empty() && side.dead.is_empty(),
        "no hook runs after an exit"
    );
    let info = q.get(&id).expect("get").expect("kept");
    assert_eq!(info.attempts, 1);
    assert!(matches!(info.state, State::Ready | State::Scheduled));
    assert!(
        info.due_at_ms.expect("due") <= server.now_ms(),
        "due at once, not after a back-off"
    );
    assert!(
        q.get(&after).expect("get").is_some(),
        "the next message waits for the next run"
    );
}

#[test]
fn limits_and_signals_end_the_run_with_their_reason() {
    let server = RedisServer::start();
    let q = server.queue("serve-limits");
    for _ in 0..5 {
        q.push(&json!({"do": "return"}), Duration::ZERO).expect("push");
    }
    let worker = Worker::new(q.clone(), opts()).expect("worker");

    let consumer = worker.start().expect("start");
    let served = serve(
        &consumer,
        &mut Scripted::default(),
        None,
        Recycle::new(Some(2), None, None),
    );
    assert_eq!(consumer.finish().acked, 2);
    assert_eq!(served.stopped_by, Some(StopReason::MaxJobs));

    let consumer = worker.start().expect("start");
    let mut heavy = Scripted {
        memory: 200 << 20,
        ..Scripted::default()
    };
    let served = serve(&consumer, &mut heavy, None, Recycle::new(None, None, Some(100 << 20)));
    assert_eq!(consumer.finish().acked, 1);
    assert_eq!(served.stopped_by, Some(StopReason::MaxMemory));

    // A stop asked by the language's signal handlers.
    let consumer = worker.start().expect("start");
    let mut signalled = Scripted {
        signal_at: Some(0),
        ..Scripted::default()
    };
    let served = serve(&consumer, &mut signalled, None, Recycle::new(Some(1), None, None));
    consumer.finish();
    assert_eq!(served.stopped_by, Some(StopReason::Signal));

    // An error from the language's signal handlers ends the run at once, raised.
    let consumer = worker.start().expect("start");
    let mut interrupted = Scripted {
        raise_at: Some(0),
        ..Scripted::default()
    };
    let served = serve(&consumer, &mut interrupted, None, unlimited());
    consumer.finish();
    assert_eq!(served.raise.as_deref(), Some("KeyboardInterrupt"));
    assert!(interrupted.called.is_empty());
    let stats = q.stats().expect("stats");
    assert!(stats.scheduled + stats.ready >= 1, "given back, not lost");
    assert_eq!(stats.inflight, 0);
}
