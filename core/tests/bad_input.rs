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

#[test]
fn a_port_out_of_range_is_named_with_the_url() {
    for (url, port, shown) in [
        (
            "redis://:secret@127.0.0.1:67011",
            "67011",
            "\"redis://***@127.0.0.1:67011\"",
        ),
        ("rediss://127.0.0.1:0", "0", "\"rediss://127.0.0.1:0\""),
        (
            "redis+cluster://:secret@127.0.0.1:7000,127.0.0.1:99999",
            "99999",
            "\"redis+cluster://***@127.0.0.1:7000,127.0.0.1:99999\"",
        ),
        (
            "redis+sentinel://:secret@127.0.0.1:70000/mymaster",
            "70000",
            "\"redis+sentinel://***@127.0.0.1:70000/mymaster\"",
        ),
    ] {
        let err = Queue::new(url, "q", QueueOptions::default()).expect_err(url);
        assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
        let text = err.to_string();
        assert!(
            text.contains(&format!("port {port} is out of range (1-65535)")),
            "{text}"
        );
        assert!(text.contains(shown), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }
    let err = Queue::new("redis://127.0.0.1:notaport", "q", QueueOptions::default()).expect_err("not a number");
    assert!(err.to_string().contains("the port is not a number"), "{err}");
}

#[test]
fn a_database_the_server_lacks_fails_at_the_first_connect_without_retries() {
    let server = RedisServer::start_with(&["--databases", "4"]);
    let q = Queue::new(&format!("{}/99", server.url()), "q", QueueOptions::default()).expect("valid");
    let started = std::time::Instant::now();
    let err = q.push(&1, Duration::ZERO).expect_err("database 99");
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
    assert!(err.is_invalid_input() && !err.is_retryable(), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("database 99"), "{text}");
    assert!(text.contains("DB index is out of range"), "{text}");
    assert!(
        text.contains(&format!("\"redis://127.0.0.1:{}/99\"", server.port)),
        "{text}"
    );
    assert_nothing_written(&server);

    // A worker on it does not start, rather than retry claims for ever.
    let worker = delayq::Worker::new(q, delayq::WorkerOptions::default()).expect("worker");
    let err = worker.start().expect_err("database 99");
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
}

#[test]
fn a_password_for_a_redis_without_one_is_named_as_such() {
    let server = RedisServer::start();
    let q = Queue::new(
        &format!("redis://:s3cr3t-pw@127.0.0.1:{}", server.port),
        "q",
        QueueOptions::default(),
    )
    .expect("valid");
    let started = std::time::Instant::now();
    let err = q.push(&1, Duration::ZERO).expect_err("no password is set");
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    assert!(matches!(err, Error::AuthFailed(_)), "{err:?}");
    let text = err.to_string();
    assert!(!text.contains("wrong password"), "{text}");
    assert!(text.contains("no password set for user \"default\""), "{text}");
    assert!(text.contains("requirepass"), "{text}");
    assert!(!text.contains("s3cr3t"), "{text}");
    // A user that does not exist is still a wrong password.
    let err = Queue::new(
        &format!("redis://nobody:s3cr3t-pw@127.0.0.1:{}", server.port),
        "q",
        QueueOptions::default(),
    )
    .and_then(|q| q.push(&1, Duration::ZERO))
    .expect_err("no such user");
    assert!(err.to_string().contains("wrong password for user \"nobody\""), "{err}");
    assert_nothing_written(&server);
}

/// Every error, parse or connect, with passwords that hold the characters a URL
/// parser stops at, raw or percent-encoded: none shows a byte of the password.
#[test]
fn no_error_shows_any_part_of_a_password_that_holds_url_delimiters() {
    // Letter pairs that no message holds, around each delimiter.
    let pieces = ["QJ", "XK", "ZV", "WF", "MB"];
    let port = common::free_port();
    let mut urls = Vec::new();
    for sep in ["?", "/", "#", "@", "%3F", "%2F", "%23", "%40", "?x=", "@h?a="] {
        let pw = pieces.join(sep);
        for (scheme, tail) in [
            ("redis", format!("127.0.0.1:{port}")),
            ("redis", format!("127.0.0.1:{port}/0")),
            ("redis", "127.0.0.1:67011".to_owned()),
            ("rediss", format!("127.0.0.1:{port}")),
            ("redis+cluster", format!("127.0.0.1:{port},127.0.0.1:1")),
            ("redis+sentinel", format!("127.0.0.1:{port}/mymaster")),
        ] {
            urls.push(format!("{scheme}://:{pw}@{tail}"));
            urls.push(format!("{scheme}://user:{pw}@{tail}"));
        }
        urls.push(format!(
            "redis+sentinel://127.0.0.1:{port}/mymaster?sentinel_password={pw}"
        ));
        urls.push(format!(
            "redis+sentinel://:{pw}@127.0.0.1:{port}/mymaster?sentinel_password={pw}"
        ));
        urls.push(format!(
            "redis+sentinel://127.0.0.1:{port}/mymaster?sentinel_pasword={pw}"
        ));
    }
    let opts = QueueOptions {
        connect: ConnectOptions {
            retry_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_millis(200),
            ..Default::default()
        },
        ..Default::default()
    };
    for url in &urls {
        let texts = match Queue::new(url, "q", opts.clone()) {
            Ok(q) => {
                let err = q.ping().expect_err("nobody listens");
                vec![
                    err.to_string(),
                    format!("{err:?}"),
                    q.url().to_owned(),
                    format!("{q:?}"),
                ]
            }
            Err(err) => vec![err.to_string(), format!("{err:?}")],
        };
        for text in texts {
            for piece in pieces {
                assert!(!text.contains(piece), "{url}: {text}");
            }
        }
    }
}

#[test]
fn a_user_or_password_holding_url_delimiters_is_told_to_percent_encode_them() {
    for url in [
        "redis://:QJ?XK@127.0.0.1:6379",
        "redis://:QJ/XK@127.0.0.1:6379",
        "redis://user:6379/XK@127.0.0.1:6379",
        "rediss://:QJ#XK@127.0.0.1:6379",
        "redis+cluster://:QJ/XK@127.0.0.1:7000",
        "redis+sentinel://:QJ?XK@127.0.0.1:26379/mymaster",
    ] {
        let err = Queue::new(url, "q", QueueOptions::default()).expect_err(url);
        assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
        let text = err.to_string();
        assert!(text.contains("percent-encode"), "{url}: {text}");
        assert!(text.contains("@127.0.0.1:"), "{url}: {text}");
        assert!(!text.contains("QJ") && !text.contains("XK"), "{url}: {text}");
    }
    // Percent-encoded, they parse.
    Queue::new("redis://:QJ%3FXK%2F%23%40@127.0.0.1:6379", "q", QueueOptions::default()).expect("encoded");
}

#[test]
fn a_cluster_url_with_a_query_says_it_takes_none() {
    let err = Queue::new(
        "redis+cluster://127.0.0.1:7000,127.0.0.1:7001/?x=1",
        "q",
        QueueOptions::default(),
    )
    .expect_err("a query on a cluster URL");
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
    assert!(err.to_string().contains("takes no query or fragment"), "{err}");
}
