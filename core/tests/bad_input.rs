//! Each bad input yields its documented error, names the culprit, and writes nothing.

mod common;

use std::time::Duration;

use common::RedisServer;
use delayq::{ConnectOptions, Due, Error, Layout, NewMessage, PushOptions, Queue, QueueOptions, Worker, WorkerOptions};

fn assert_nothing_written(server: &RedisServer) {
    assert_eq!(server.dump_keys(), Vec::<String>::new(), "bad input must write nothing");
}

#[test]
fn payloads_over_the_limit_are_refused_before_anything_is_written() {
    let server = RedisServer::start();
    let q = server.queue_with(
        "big",
        QueueOptions {
            max_payload_bytes: 64,
            ..Default::default()
        },
    );
    let err = q.push(&"x".repeat(100), Duration::ZERO).expect_err("too large");
    assert!(matches!(err, Error::PayloadTooLarge { size: 102, max: 64 }), "{err:?}");
    assert!(err.to_string().contains("max_payload_bytes"), "{err}");
    assert!(err.is_invalid_input() && !err.is_retryable());
    assert_nothing_written(&server);
}

#[test]
fn invalid_json_text_and_too_deep_nesting_are_refused() {
    let server = RedisServer::start();
    let q = server.queue("json");
    for bad in ["{", "", "[1,]", "{\"a\":1} {\"b\":2}", "NaN"] {
        let err = q.push_json(bad, Due::NOW, &PushOptions::default()).expect_err(bad);
        assert!(matches!(err, Error::PayloadNotSerializable(_)), "{bad}: {err:?}");
    }
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let err = q.push_json(&deep, Due::NOW, &PushOptions::default()).expect_err("deep");
    assert!(err.to_string().contains("nested 200 levels deep"), "{err}");
    assert_nothing_written(&server);
}

#[test]
fn one_bad_item_in_a_batch_writes_nothing_and_is_named() {
    let server = RedisServer::start();
    let q = server.queue("batch");
    let mut batch: Vec<NewMessage> = (0..5)
        .map(|i| NewMessage::new(&i, Duration::ZERO).expect("msg"))
        .collect();
    batch[3].options.id = Some(String::new());
    let err = q.push_many(&batch).expect_err("bad id");
    assert!(err.to_string().contains("id of item 3"), "{err}");
    batch[3].options.id = None;
    batch[4].payload_json = "{oops".into();
    let err = q.push_many(&batch).expect_err("bad json");
    assert!(err.to_string().contains("item 4"), "{err}");
    assert_nothing_written(&server);
}

#[test]
fn bad_ids_attempt_limits_and_delays_are_named() {
    let server = RedisServer::start();
    let q = server.queue("ids");
    let push = |id: &str| {
        q.push_json(
            "1",
            Due::NOW,
            &PushOptions {
                id: Some(id.to_owned()),
                ..Default::default()
            },
        )
    };
    for bad in [String::new(), "a\nb".into(), "x".repeat(201)] {
        let err = push(&bad).expect_err("bad id");
        assert!(err.to_string().starts_with("invalid id"), "{err}");
    }
    let err = q
        .push_json(
            "1",
            Due::NOW,
            &PushOptions {
                max_attempts: Some(0),
                ..Default::default()
            },
        )
        .expect_err("zero attempts");
    assert!(err.to_string().starts_with("invalid max_attempts"), "{err}");
    let err = q
        .push(&1, Duration::from_secs(200 * 365 * 86400))
        .expect_err("two centuries");
    assert!(err.to_string().starts_with("invalid delay"), "{err}");
    for bad in [f64::NAN, f64::INFINITY, -1.0] {
        assert!(
            Due::from_delay_secs(bad)
                .expect_err("bad delay")
                .to_string()
                .contains("delay")
        );
    }
    assert!(q.cancel("").is_err());
    assert!(q.get("").is_err());
    assert_nothing_written(&server);
}

#[test]
fn bad_urls_and_names_are_refused_without_connecting() {
    for url in [
        "http://127.0.0.1:6379",
        "127.0.0.1:6379",
        "redis://127.0.0.1:notaport",
        "redis+cluster://",
    ] {
        let err = Queue::new(url, "q", QueueOptions::default()).expect_err(url);
        assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
    }
    let err = Queue::new("redis://:secret@127.0.0.1:1", "q", QueueOptions::default())
        .and_then(|q| q.push(&1, Duration::ZERO))
        .expect_err("closed port");
    assert!(
        !err.to_string().contains("secret"),
        "passwords never appear in messages: {err}"
    );
    for name in ["", "a{b", "a}b", "with space"] {
        let err = Queue::new("redis://127.0.0.1:1", name, QueueOptions::default()).expect_err(name);
        assert!(err.to_string().starts_with("invalid queue name"), "{err}");
    }
    for (partitions, layout) in [(0, Layout::Native), (1025, Layout::Native), (2, Layout::seed())] {
        let err = Queue::new(
            "redis://127.0.0.1:1",
            "q",
            QueueOptions {
                partitions,
                layout,
                ..Default::default()
            },
        )
        .expect_err("partitions");
        assert!(err.to_string().starts_with("invalid partitions"), "{err}");
    }
    let err = Queue::new(
        "redis://127.0.0.1:1",
        "q",
        QueueOptions {
            wait_replicas: 1,
            wait_timeout: Duration::ZERO,
            ..Default::default()
        },
    )
    .expect_err("wait forever");
    assert!(err.to_string().starts_with("invalid wait_timeout"), "{err}");
}

#[test]
fn a_closed_port_is_a_connection_error_within_the_retry_timeout() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let q = Queue::new(
        &format!("redis://127.0.0.1:{port}"),
        "q",
        QueueOptions {
            connect: ConnectOptions {
                retry_timeout: Duration::from_millis(300),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .expect("valid");
    let started = std::time::Instant::now();
    let err = q.stats().expect_err("nobody listens");
    assert!(matches!(err, Error::Connection { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn a_wrong_password_and_a_user_without_permissions_are_auth_errors() {
    let server = RedisServer::start_with(&["--requirepass", "right"]);
    let wrong = Queue::new(
        &format!("redis://:wrong@127.0.0.1:{}", server.port),
        "q",
        QueueOptions::default(),
    )
    .expect("valid");
    let err = wrong.push(&1, Duration::ZERO).expect_err("wrong password");
    assert!(matches!(err, Error::AuthFailed(_)), "{err:?}");
    assert!(err.to_string().contains("wrong password for user \"default\""), "{err}");

    // No password at all: every call, a push of many arguments included (Redis refuses
    // those as "unauthenticated multibulk length"), says that Redis needs one.
    let none = Queue::new(&server.url(), "q", QueueOptions::default()).expect("valid");
    let many: Vec<NewMessage> = (0..20)
        .map(|i| NewMessage::new(&i, Duration::ZERO).expect("message"))
        .collect();
    for err in [
        none.push(&1, Duration::ZERO).expect_err("no password"),
        none.push_many(&many).expect_err("no password"),
        none.stats().expect_err("no password"),
    ] {
        assert!(matches!(err, Error::AuthFailed(_)), "{err:?}");
        assert!(err.to_string().contains("Redis needs a password"), "{err}");
    }
    // A worker fails at its start with that error, stop_when_empty or not.
    for stop_when_empty in [false, true] {
        for q in [&wrong, &none] {
            let opts = WorkerOptions {
                stop_when_empty,
                ..WorkerOptions::default()
            };
            let started = std::time::Instant::now();
            let err = Worker::new(q.clone(), opts)
                .expect("worker")
                .run(1, |_| Ok(()))
                .expect_err("no access");
            assert!(matches!(err, Error::AuthFailed(_)), "{err:?}");
            assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        }
    }

    let mut con = server.con();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "reader", "on", ">pw", "~*", "+ping", "+info"])
        .query(&mut con)
        .expect("ACL SETUSER");
    let weak = Queue::new(
        &format!("redis://reader:pw@127.0.0.1:{}", server.port),
        "q",
        QueueOptions::default(),
    )
    .expect("valid");
    let err = weak.push(&1, Duration::ZERO).expect_err("no EVALSHA permission");
    assert!(matches!(err, Error::AuthFailed(_)), "{err:?}");
    assert!(
        err.to_string().contains("NOPERM") || err.to_string().contains("permission"),
        "{err}"
    );
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).expect("KEYS");
    assert!(keys.is_empty(), "{keys:?}");
}

#[test]
fn bad_worker_options_are_named() {
    let q = Queue::new("redis://127.0.0.1:1", "q", QueueOptions::default()).expect("valid");
    let cases: Vec<(&str, WorkerOptions)> = vec![
        (
            "threads",
            WorkerOptions {
                threads: 0,
                ..Default::default()
            },
        ),
        (
            "batch",
            WorkerOptions {
                batch: 0,
                ..Default::default()
            },
        ),
        (
            "batch",
            WorkerOptions {
                batch: 1001,
                ..Default::default()
            },
        ),
        (
            "lease",
            WorkerOptions {
                lease: Duration::from_millis(1),
                ..Default::default()
            },
        ),
        (
            "max_attempts",
            WorkerOptions {
                max_attempts: 0,
                ..Default::default()
            },
        ),
        (
            "backoff_max",
            WorkerOptions {
                backoff_base: Duration::from_secs(10),
                backoff_max: Duration::from_secs(1),
                ..Default::default()
            },
        ),
        (
            "timeout",
            WorkerOptions {
                timeout: Some(Duration::ZERO),
                ..Default::default()
            },
        ),
    ];
    for (name, opts) in cases {
        let err = Worker::new(q.clone(), opts).expect_err(name);
        assert!(err.to_string().starts_with(&format!("invalid {name}")), "{name}: {err}");
    }
}
