//! `scale::Scaler::look`: the backlog that balances supervised worker processes is
//! read from every queue a worker consumes.

mod common;

use std::time::Duration;

use common::RedisServer;
use delayq::QueueOptions;
use delayq::scale::Scaler;
use serde_json::json;

#[test]
fn the_backlog_of_any_queue_grows_the_pool_and_an_unreadable_redis_keeps_it() {
    // Kept on disk: the restarted server still holds the backlog.
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let quick = || QueueOptions {
        connect: delayq::ConnectOptions {
            retry_timeout: Duration::from_millis(300),
            connect_timeout: Duration::from_millis(200),
            ..Default::default()
        },
        ..Default::default()
    };
    let high = server.queue_with("high", quick());
    let low = server.queue_with("low", quick());
    // A cooldown longer than two looks take on a loaded machine.
    let mut scaler = Scaler::new(1, 4, Duration::from_secs(1)).expect("valid");

    // Nothing due (a message for later does not count): the pool stays at its minimum.
    low.push(&json!({"later": true}), Duration::from_secs(3600))
        .expect("push");
    assert_eq!(scaler.look([&high, &low], 1, 1), 1);

    // A message due on the lower queue: one more process.
    low.push(&json!({"now": true}), Duration::ZERO).expect("push");
    assert_eq!(scaler.look([&high, &low], 1, 1), 2);
    assert_eq!(scaler.look([&high, &low], 2, 2), 2, "within the cooldown");

    // Redis gone: the size holds, neither grown nor shrunk on a guess.
    server.kill();
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(scaler.look([&high, &low], 3, 0), 3);
    // Back, but a failed look pauses the reads (2 s after a first failure), so that a
    // supervisor is not held up look after look by a Redis that is down or hangs.
    server.restart();
    assert_eq!(scaler.look([&high, &low], 3, 3), 3, "not read within the pause");
    std::thread::sleep(Duration::from_millis(2100));
    assert_eq!(scaler.look([&high, &low], 3, 3), 4, "the backlog is still there");
}

#[test]
fn a_hung_redis_costs_one_look_one_request_and_the_next_looks_none() {
    let server = RedisServer::start();
    let proxy = common::Proxy::start(server.port);
    let queue = delayq::Queue::new(
        &proxy.url(),
        "orders",
        QueueOptions {
            connect: delayq::ConnectOptions {
                read_timeout: Duration::from_millis(300),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .expect("queue");
    queue.push(&json!({"now": true}), Duration::ZERO).expect("push");
    let mut scaler = Scaler::new(1, 4, Duration::from_millis(100)).expect("valid");
    assert_eq!(scaler.look([&queue], 1, 1), 2);

    // Redis takes the requests and never answers: the look gives up after one read
    // timeout, without the reconnect loop that would send the request again and again.
    proxy.swallow_replies(true);
    let before = proxy.requests();
    assert_eq!(scaler.look([&queue], 2, 2), 2);
    assert_eq!(proxy.requests(), before + 1, "one request, not retried");
    // The next looks do not send the hung server anything.
    for _ in 0..5 {
        assert_eq!(scaler.look([&queue], 2, 2), 2);
    }
    assert_eq!(proxy.requests(), before + 1, "nothing sent within the pause");
}
