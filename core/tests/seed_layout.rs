//! The seed layout: delayq and the hand-made recipe (../shared/seeds) share keys, so a
//! team can replace the producer first and the consumers later.

mod common;

use std::time::Duration;

use common::{RedisServer, StopOnDrop, wait_for};
use delayq::{Layout, Queue, QueueOptions, State, Worker, WorkerOptions};
use parking_lot::Mutex;

/// The recipe's pop_delay.lua, word for word (shared with the PHP tests).
const RECIPE_POP: &str = include_str!("../../tests/fixtures/pop_delay.lua");

fn seed_queue(server: &RedisServer) -> Queue {
    Queue::new(
        &server.url(),
        "orders",
        QueueOptions {
            layout: Layout::seed(),
            ..Default::default()
        },
    )
    .expect("seed queue")
}

#[test]
fn the_recipes_lua_pop_consumes_what_delayq_pushes() {
    let server = RedisServer::start();
    let q = seed_queue(&server);
    let payload = r#"{"order_id":10086,"action":"close","note":"日本"}"#;
    let id = q
        .push_json(payload, delayq::Due::NOW, &Default::default())
        .expect("push");
    let mut con = server.con();
    // The recipe's producer layout exactly: score = whole seconds, member = id.
    let score: f64 = redis::cmd("ZSCORE")
        .arg("delay_queue:zset")
        .arg(&id)
        .query(&mut con)
        .expect("ZSCORE");
    assert_eq!(score.fract(), 0.0);
    let stored: String = redis::cmd("HGET")
        .arg("delay_queue:payload")
        .arg(&id)
        .query(&mut con)
        .expect("HGET");
    assert_eq!(stored, payload);

    let pop = redis::Script::new(RECIPE_POP);
    let mut popped: Vec<String> = Vec::new();
    // delayq rounds the due time up to the next whole second (never early), so the
    // recipe sees it once its own `time()` reaches that second.
    wait_for(Duration::from_secs(3), "the recipe to pop it", || {
        let now = server.now_ms() / 1000;
        popped = pop
            .key("delay_queue:zset")
            .key("delay_queue:payload")
            .arg(now)
            .arg(50)
            .invoke(&mut con)
            .expect("recipe pop");
        !popped.is_empty()
    });
    assert_eq!(popped, vec![id.clone(), payload.to_owned()]);
    assert!(q.get(&id).expect("get").is_none());
}

#[test]
fn delayq_consumes_what_the_recipes_producer_pushed() {
    let server = RedisServer::start();
    let q = seed_queue(&server);
    let mut con = server.con();
    // The recipe's phpredis producer: uniqid id, HSET payload, ZADD time() + delay.
    let now = server.now_ms() / 1000;
    let ids: Vec<String> = (0..5).map(|i| format!("msg_6745f0a1b2c3d{i}.12345678")).collect();
    for (i, id) in ids.iter().enumerate() {
        let json = format!(r#"{{"order_id":{},"action":"close"}}"#, 10_000 + i);
        let _: () = redis::cmd("HSET")
            .arg("delay_queue:payload")
            .arg(id)
            .arg(&json)
            .query(&mut con)
            .expect("HSET");
        let _: () = redis::cmd("ZADD")
            .arg("delay_queue:zset")
            .arg(now)
            .arg(id)
            .query(&mut con)
            .expect("ZADD");
    }
    assert_eq!(q.get(&ids[0]).expect("get").expect("known").state, State::Ready);
    let got: Mutex<Vec<(String, String, u32)>> = Mutex::new(Vec::new());
    let worker = Worker::new(q.clone(), WorkerOptions::default()).expect("worker");
    let stopper = worker.stopper();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _stop = StopOnDrop(stopper.clone());
            wait_for(Duration::from_secs(10), "five handled", || {
                got.lock().len() == 5 && q.stats().is_ok_and(|s| s.inflight == 0)
            });
            stopper.stop();
        });
        worker
            .run(1, |d| {
                got.lock().push((d.id.clone(), d.payload_json().to_owned(), d.attempt));
                Ok(())
            })
            .expect("run");
    });
    let mut got = got.into_inner();
    got.sort();
    for (i, (id, payload, attempt)) in got.iter().enumerate() {
        assert_eq!(id, &ids[i]);
        assert_eq!(payload, &format!(r#"{{"order_id":{},"action":"close"}}"#, 10_000 + i));
        assert_eq!(*attempt, 1);
    }
    // Acked messages leave nothing behind in the recipe's hash (its HLEN/ZCARD check).
    let hlen: u64 = redis::cmd("HLEN")
        .arg("delay_queue:payload")
        .query(&mut con)
        .expect("HLEN");
    let zcard: u64 = redis::cmd("ZCARD")
        .arg("delay_queue:zset")
        .query(&mut con)
        .expect("ZCARD");
    assert_eq!((hlen, zcard), (0, 0));
}

#[test]
fn in_the_seed_layout_failures_retry_and_dead_letter_in_side_keys() {
    let server = RedisServer::start();
    let q = seed_queue(&server);
    let id = q.push(&serde_json::json!({"bad": 1}), Duration::ZERO).expect("push");
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            max_attempts: 2,
            backoff_base: Duration::from_millis(10),
            backoff_max: Duration::from_millis(10),
            ..Default::default()
        },
    )
    .expect("worker");
    let stopper = worker.stopper();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _stop = StopOnDrop(stopper.clone());
            // The retry is rounded up to a whole second, as the recipe's scores are.
            wait_for(Duration::from_secs(10), "the dead letter", || {
                q.stats().is_ok_and(|s| s.dead == 1)
            });
            stopper.stop();
        });
        worker.run(1, |_| Err("handler failed".into())).expect("run");
    });
    let mut con = server.con();
    let dead: Vec<String> = redis::cmd("ZRANGE")
        .arg("delay_queue:zset:dead")
        .arg(0)
        .arg(-1)
        .query(&mut con)
        .expect("ZRANGE");
    assert_eq!(dead, vec![id.clone()]);
    let info = q.get(&id).expect("get").expect("dead");
    assert_eq!((info.state, info.attempts), (State::Dead, 2));
    // The recipe's consumers never see a dead message: it is not in their ZSET.
    let zcard: u64 = redis::cmd("ZCARD")
        .arg("delay_queue:zset")
        .query(&mut con)
        .expect("ZCARD");
    assert_eq!(zcard, 0);
}

#[test]
fn a_messages_own_max_attempts_is_refused_in_the_seed_layout_not_dropped() {
    let server = RedisServer::start();
    let q = seed_queue(&server);
    let own = delayq::PushOptions {
        max_attempts: Some(3),
        ..Default::default()
    };
    let err = q
        .push_json("1", delayq::Due::In(Duration::ZERO), &own)
        .expect_err("refused");
    assert!(matches!(err, delayq::Error::InvalidArgument { .. }), "{err:?}");
    assert!(
        err.to_string().contains("max_attempts") && err.to_string().contains("native layout"),
        "{err}"
    );
    let mut batch = vec![delayq::NewMessage::new(&1, Duration::ZERO).expect("msg"); 2];
    batch[1].options.max_attempts = Some(3);
    let err = q.push_many(&batch).expect_err("refused");
    assert!(err.to_string().contains("max_attempts of item 1"), "{err}");
    let every = delayq::Schedule::every(Duration::from_secs(60)).expect("schedule");
    let err = q
        .repeat_json(
            "nightly",
            &every,
            "{}",
            &delayq::RepeatOptions::default().max_attempts(3),
        )
        .expect_err("refused");
    assert!(err.to_string().contains("max_attempts"), "{err}");
    assert!(server.dump_keys().is_empty(), "written: {:?}", server.dump_keys());
    // Without one, the worker's max_attempts applies, as before.
    q.push_json("1", delayq::Due::In(Duration::ZERO), &Default::default())
        .expect("push");
}
