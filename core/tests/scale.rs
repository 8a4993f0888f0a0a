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
    let mut scaler = Scaler::new(1, 4, Duration::from_millis(100)).expect("valid");

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
    server.restart();
    assert_eq!(scaler.look([&high, &low], 3, 3), 4, "the backlog is still there");
}
