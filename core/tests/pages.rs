//! `Queue::list_page`: paging through a listing past its first 1 000, on one partition
//! and merged over several.

mod common;

use std::time::Duration;

use common::RedisServer;
use delayq::{Error, Listing, MAX_PAGE_START, NewMessage, QueueOptions};
use serde_json::json;

fn pages_cover_the_listing_once_in_due_order(partitions: u32) {
    let server = RedisServer::start();
    let q = server.queue_with(
        "orders",
        QueueOptions {
            partitions,
            ..Default::default()
        },
    );
    let n = 2_345;
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let batch: Vec<NewMessage> = chunk
            .iter()
            .map(|i| NewMessage::new(&json!({ "n": i }), Duration::from_secs(60 + *i as u64)).expect("message"))
            .collect();
        q.push_many(&batch).expect("push");
    }
    let mut seen = Vec::new();
    let mut start = 0;
    loop {
        let page = q.list_page(Listing::Waiting, start, 400).expect("a page");
        if page.is_empty() {
            break;
        }
        start += page.len();
        seen.extend(page);
    }
    assert_eq!(seen.len(), n, "every message once");
    let order: Vec<i64> = seen
        .iter()
        .map(|m| {
            serde_json::from_str::<serde_json::Value>(&m.payload_json).expect("json")["n"]
                .as_i64()
                .expect("n")
        })
        .collect();
    assert_eq!(
        order,
        (0..n as i64).collect::<Vec<_>>(),
        "in due order across the pages"
    );
    // A page agrees with the same slice of a longer one.
    let long = q.list_page(Listing::Waiting, 1_000, 1_000).expect("long");
    let short = q.list_page(Listing::Waiting, 1_500, 100).expect("short");
    let ids = |v: &[delayq::MessageInfo]| v.iter().map(|m| m.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&short), ids(&long[500..600]));
    assert_eq!(ids(&q.list(Listing::Waiting, 10).expect("list")), ids(&seen[..10]));
    assert!(q.list_page(Listing::Waiting, n, 10).expect("past the end").is_empty());
}

#[test]
fn one_partition_pages_through_more_than_a_thousand() {
    pages_cover_the_listing_once_in_due_order(1);
}

#[test]
fn partitions_are_merged_page_by_page() {
    pages_cover_the_listing_once_in_due_order(3);
}

#[test]
fn a_page_too_far_or_too_long_is_refused_by_name() {
    let server = RedisServer::start();
    let q = server.queue("orders");
    let e = q
        .list_page(Listing::Waiting, MAX_PAGE_START + 1, 10)
        .expect_err("too far");
    assert!(
        matches!(&e, Error::InvalidArgument { name, .. } if name == "start"),
        "{e}"
    );
    let e = q.list_page(Listing::Waiting, 0, 1_001).expect_err("too long");
    assert!(
        matches!(&e, Error::InvalidArgument { name, .. } if name == "limit"),
        "{e}"
    );
    assert!(matches!(
        q.dead_letters_page(MAX_PAGE_START + 1, 10),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(q.dead_letters_page(0, 10).expect("none").is_empty());
}
