//! No Redis error inside a script loses a message. Generated from the scripts
//! themselves (`delayq::scripts::all()`): for every command any script runs, an ACL
//! user without just that command; for every key role any script touches, a stray
//! value of another type at that key. Under each fault every operation of the API and
//! a worker pool run against a queue with messages in every state; each call that
//! fails must fail with an error naming the fault and leave every key as it was, and
//! every call that names the faulty command or key must fail. After each fault the
//! queue holds every message in exactly one state, and once the fault is removed a
//! pool drains every message. A new command or key in a script is covered without a
//! new test; a new script needs one line in `operations` (the test says so).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use common::{RedisServer, StopOnDrop, assert_no_leak, run_until_empty};
use delayq::{
    Category, Error, GroupLimit, Listing, NewMessage, PushOptions, Queue, QueueOptions, RateLimit, Worker,
    WorkerOptions,
};
use serde_json::json;

const PASSWORD: &str = "s3cret";

/// Every key with its contents: equal snapshots mean the keys hold what they held.
/// Contents, not DUMP: a hash past its listpack size is a table whose DUMP order moves
/// with a field added and removed again (push_one undoing its writes).
fn snapshot(server: &RedisServer) -> BTreeMap<String, Vec<u8>> {
    let mut con = server.con();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).expect("KEYS");
    keys.into_iter()
        .filter(|k| !k.ends_with(":saved"))
        .map(|k| {
            let kind: String = redis::cmd("TYPE").arg(&k).query(&mut con).expect("TYPE");
            let mut items: Vec<Vec<u8>> = match kind.as_str() {
                "hash" => redis::cmd("HGETALL").arg(&k).query(&mut con),
                "zset" => redis::cmd("ZRANGE")
                    .arg(&k)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query(&mut con),
                _ => redis::cmd("DUMP").arg(&k).query(&mut con).map(|d| vec![d]),
            }
            .expect("contents");
            if kind == "hash" {
                let mut pairs: Vec<Vec<u8>> = items.chunks(2).map(|p| p.concat()).collect();
                pairs.sort();
                items = pairs;
            }
            (
                k,
                [kind.into_bytes()]
                    .into_iter()
                    .chain(items)
                    .collect::<Vec<_>>()
                    .join(&0u8),
            )
        })
        .collect()
}

/// One state per message: each id of the schedule, the leases (what runs) and the dead
/// letters is in one of them only and has an envelope; the claims hold what runs.
fn assert_one_state_each(server: &RedisServer, tag: &str) {
    assert_no_leak(server, tag);
    let mut con = server.con();
    let mut seen = BTreeSet::new();
    for set in ["scheduled", "leases", "dead"] {
        let key = format!("{tag}:{set}");
        let mut cmd = redis::cmd(if set == "leases" { "HKEYS" } else { "ZRANGE" });
        cmd.arg(&key);
        if set != "leases" {
            cmd.arg(0).arg(-1);
        }
        let ids: Vec<String> = cmd.query(&mut con).expect("ids");
        for id in ids {
            let has: bool = redis::cmd("HEXISTS")
                .arg(format!("{tag}:messages"))
                .arg(&id)
                .query(&mut con)
                .expect("HEXISTS");
            assert!(has, "{id} in {set} has no envelope");
            assert!(seen.insert(id.clone()), "{id} is in two states");
        }
    }
}

fn ids_alive(server: &RedisServer, tag: &str) -> BTreeSet<String> {
    let keys: Vec<String> = redis::cmd("HKEYS")
        .arg(format!("{tag}:messages"))
        .query(&mut server.con())
        .expect("HKEYS");
    keys.into_iter().collect()
}

/// One call of the API on the queue under a fault, and the script it runs.
struct Operation {
    scripts: &'static [&'static str],
    name: &'static str,
    run: fn(&Queue) -> Result<(), Error>,
}

/// Every script, through the public call that runs it. Pool scripts (claim, ack,
/// nack, release, extend, beat, repeat_next) run in `run_pool` instead.
fn operations() -> Vec<Operation> {
    fn op(scripts: &'static [&'static str], name: &'static str, run: fn(&Queue) -> Result<(), Error>) -> Operation {
        Operation { scripts, name, run }
    }
    vec![
        op(&["push_one"], "push", |q| {
            q.push(&json!({"n": "new"}), Duration::ZERO).map(drop)
        }),
        op(&["push"], "push_many", |q| {
            let batch: Vec<NewMessage> = (0..2)
                .map(|n| NewMessage::new(&json!({"n": n}), Duration::from_secs(5)).expect("message"))
                .collect();
            q.push_many(&batch).map(drop)
        }),
        // A full script of delays (due now, so that the drain below takes them): the
        // clock read, then envelopes the client stamped.
        op(&["now", "push"], "push_many_stamped", |q| {
            let batch: Vec<NewMessage> = (0..delayq::MAX_BATCH)
                .map(|n| NewMessage::new(&json!({"n": n}), Duration::ZERO).expect("message"))
                .collect();
            q.push_many(&batch).map(drop)
        }),
        // A replacing push, of a message that waits: the script that takes the keys a
        // replaced message leaves.
        op(&["push_replace"], "push_replace", |q| {
            let mut m = NewMessage::new(&json!({"n": "later-3 again"}), Duration::from_secs(3600)).expect("message");
            m.options.id = Some("later-3".into());
            m.options.replace = true;
            q.push_many(&[m]).map(drop)
        }),
        op(&["get"], "get", |q| q.get("later-1").map(drop)),
        op(&["stats"], "stats", |q| q.stats().map(drop)),
        op(&["list"], "list", |q| q.list(Listing::Waiting, 10).map(drop)),
        op(&["find", "get"], "find", |q| q.find("later", 10).map(drop)),
        op(&["dead"], "dead_letters", |q| q.dead_letters(10).map(drop)),
        op(&["dead_matching", "requeue"], "requeue_dead_with_error", |q| {
            q.requeue_dead_with_error("(doomed)").map(drop)
        }),
        op(&["requeue"], "requeue_dead", |q| {
            q.requeue_dead(Some("doomed")).map(drop)
        }),
        op(&["delete_dead"], "delete_dead", |q| {
            q.delete_dead(Some("doomed-2")).map(drop)
        }),
        op(&["reschedule"], "reschedule", |q| {
            q.reschedule("later-1", Duration::from_secs(7200)).map(drop)
        }),
        op(&["cancel"], "cancel", |q| q.cancel("later-2").map(drop)),
        op(&["workers"], "workers", |q| q.workers().map(drop)),
        op(&["pause"], "pause", |q| q.pause().and_then(|_| q.resume()).map(drop)),
        op(&["limit"], "set_rate_limit", |q| {
            q.set_rate_limit(RateLimit::new(1000, 1.0).expect("limit"))
                .and_then(|()| q.clear_rate_limit())
                .map(drop)
        }),
        op(&["group_limit"], "set_group_limit", |q| {
            let rate = RateLimit::new(100, 1.0).expect("rate");
            q.set_group_limit(
                Some("merchant-9"),
                GroupLimit::concurrency(2).expect("limit").with_rate(rate),
            )
            .and_then(|_| q.set_group_limit(None, GroupLimit::none()))
            .map(drop)
        }),
        op(&["restart"], "restart_workers", |q| q.restart_workers().map(drop)),
        op(&["repeat_set"], "repeat", |q| {
            let every = delayq::Schedule::every(Duration::from_secs(3600)).expect("schedule");
            q.repeat("hourly-2", &every, &json!({"report": 2})).map(drop)
        }),
        op(&["repeats"], "repeats", |q| q.repeats().map(drop)),
        op(&["repeat_del"], "unrepeat", |q| q.unrepeat("hourly").map(drop)),
        op(&["minutes"], "minutes", |q| q.minutes(60).map(drop)),
    ]
}

/// Scripts only a pool runs (orphans: on the queue of its own, see `one_fault`).
const POOL_SCRIPTS: [&str; 9] = [
    "claim",
    "ack",
    "nack",
    "release",
    "extend",
    "beat",
    "repeat_next",
    "minutes_add",
    "orphans",
];

/// A queue with messages in every state: waiting (some with a serial key), due, dead,
/// and a repeat.
fn fill(q: &Queue) {
    for (id, max) in [("doomed", 1), ("doomed-2", 1)] {
        let mut m = NewMessage::new(&json!({"n": id}), Duration::ZERO).expect("message");
        m.options = PushOptions {
            id: Some(id.into()),
            max_attempts: Some(max),
            ..PushOptions::default()
        };
        q.push_many(&[m]).expect("push");
    }
    let summary = run_until_empty(q, WorkerOptions::default(), |d| Err(format!("declined ({})", d.id)));
    assert_eq!(summary.dead, 2);
    let mut batch = Vec::new();
    for i in 1..=3 {
        let mut m = NewMessage::new(&json!({"n": format!("later-{i}")}), Duration::from_secs(3600)).expect("message");
        m.options.id = Some(format!("later-{i}"));
        batch.push(m);
    }
    for i in 1..=4 {
        let mut m = NewMessage::new(&json!({"n": format!("due-{i}")}), Duration::ZERO).expect("message");
        m.options.id = Some(format!("due-{i}"));
        if i <= 2 {
            m.options.serial_key = Some("customer-7".into());
        } else {
            m.options.group = Some("merchant-9".into());
        }
        batch.push(m);
    }
    q.push_many(&batch).expect("push_many");
    let rate = RateLimit::new(100, 1.0).expect("rate");
    q.set_group_limit(
        Some("merchant-9"),
        GroupLimit::concurrency(1).expect("limit").with_rate(rate),
    )
    .expect("group limit");
    let every = delayq::Schedule::every(Duration::from_secs(3600)).expect("schedule");
    q.repeat("hourly", &every, &json!({"report": 1})).expect("repeat");
}

/// A pool under the fault: it fails `due-1` once, sleeps past a lease renewal on
/// `due-3`, cancels `due-4` while it runs it (its completion then deletes it, see
/// cancel.lua) and acknowledges the rest; stopped after a second, it releases what it
/// holds. Returns the ids it handled, or the error that stopped it.
fn run_pool(q: &Queue) -> Result<BTreeSet<String>, Error> {
    let worker = Worker::new(
        q.clone(),
        WorkerOptions {
            threads: 1,
            lease: Duration::from_millis(600),
            backoff_base: Duration::from_secs(60),
            ..WorkerOptions::default()
        },
    )
    .expect("worker");
    let stopper = worker.stopper();
    let handled = Mutex::new(BTreeSet::new());
    std::thread::scope(|s| {
        s.spawn(|| {
            let _stop = StopOnDrop(stopper.clone());
            std::thread::sleep(Duration::from_millis(1200));
        });
        worker
            .run(1, |d| {
                handled.lock().expect("lock").insert(d.id.clone());
                match d.id.as_str() {
                    "due-1" => Err("fails once".into()),
                    "due-3" => {
                        std::thread::sleep(Duration::from_millis(400));
                        Ok(())
                    }
                    "due-4" => {
                        // Under the fault the cancel may fail, and so may the heartbeat
                        // that would carry the mark: either way, one state each.
                        let _ = q.cancel("due-4");
                        std::thread::sleep(Duration::from_millis(250));
                        Ok(())
                    }
                    _ => Ok(()),
                }
            })
            .map(drop)
    })?;
    Ok(handled.into_inner().expect("lock"))
}

enum Fault {
    /// The user may run every command delayq needs but this one.
    NoCommand(String),
    /// A value of another type stands at this role's key.
    WrongType(&'static str, &'static str),
}

impl Fault {
    fn hits(&self, script: &delayq::scripts::LuaScript) -> bool {
        match self {
            Self::NoCommand(c) => c != delayq::scripts::TYPE_CHECK && script.commands.contains(c),
            Self::WrongType(role, _) => script.key_roles().any(|r| r.name == *role),
        }
    }

    fn check_error(&self, err: &Error, what: &str) {
        match self {
            Self::NoCommand(c) => {
                assert_eq!(err.category(), Category::Auth, "{what}: {err}");
                let text = err.to_string();
                assert!(
                    text.contains(&format!("may not run {c}")) && text.contains("faulty"),
                    "{what}: {text}"
                );
                assert!(text.contains("delayq acl --user faulty"), "{what}: {text}");
            }
            Self::WrongType(role, _) => {
                assert!(matches!(err, Error::WrongType(_)), "{what}: {err:?}");
                let text = err.to_string();
                assert!(text.contains(&format!(":{role} holds a ")), "{what}: {text}");
            }
        }
    }
}

fn faults() -> Vec<Fault> {
    let scripts = delayq::scripts::all();
    let commands: BTreeSet<String> = scripts.iter().flat_map(|s| s.commands.iter().cloned()).collect();
    let roles: BTreeSet<(&'static str, &'static str)> = scripts
        .iter()
        .flat_map(|s| s.key_roles().map(|r| (r.name, r.kind)).collect::<Vec<_>>())
        .collect();
    commands
        .into_iter()
        .map(Fault::NoCommand)
        .chain(roles.into_iter().map(|(r, k)| Fault::WrongType(r, k)))
        .collect()
}

/// Each fault on a queue of its own, one after the other on one server.
#[test]
fn no_fault_inside_a_script_loses_a_message() {
    let covered: BTreeSet<&str> = operations()
        .iter()
        .flat_map(|o| o.scripts.iter().copied())
        .chain(POOL_SCRIPTS)
        .chain(["purge"])
        .collect();
    for s in delayq::scripts::all() {
        assert!(
            covered.contains(s.name),
            "script {} has no operation in this test: add one to operations()",
            s.name
        );
    }
    let server = RedisServer::start();
    // Redis before 7.0 cannot check a user's permissions from a script
    // (redis.acl_check_cmd): there a missing command stops the script where it runs.
    let acl_preflight = server.version() >= (7, 0);
    let faults = faults();
    assert!(faults.len() > 30, "{} faults", faults.len());
    for (n, fault) in faults.iter().enumerate() {
        if matches!(fault, Fault::NoCommand(_)) && !acl_preflight {
            continue;
        }
        one_fault(&server, n, fault);
    }
}

fn one_fault(server: &RedisServer, n: usize, fault: &Fault) {
    let name = format!("q{n}");
    let tag = format!("{{dq:{name}}}");
    let admin = server.queue(&name);
    fill(&admin);
    // Purge empties a queue: it runs on one of its own.
    let purge_name = format!("{name}-purge");
    let purge_tag = format!("{{dq:{purge_name}}}");
    let purge_admin = server.queue(&purge_name);
    purge_admin.push(&json!({"n": "purged"}), Duration::ZERO).expect("push");
    let mut con = server.con();
    // orphans.lua runs where a claim hands out an id without an envelope on a queue
    // without serial keys (whose claims leave the envelopes to the pool): a queue of
    // its own holds such an id, left by hand.
    let orphan_name = format!("{name}-orphan");
    let orphan_tag = format!("{{dq:{orphan_name}}}");
    let orphan_admin = server.queue(&orphan_name);
    orphan_admin
        .push(&json!({"n": "beside"}), Duration::ZERO)
        .expect("push");
    let _: () = redis::cmd("ZADD")
        .arg(format!("{orphan_tag}:scheduled"))
        .arg(0)
        .arg("stray")
        .query(&mut con)
        .expect("ZADD");

    let before = ids_alive(server, &tag);
    // The fault, and the user the operations run as.
    let rule = admin.acl_rule_for("faulty", common::script_rights());
    let mut words: Vec<String> = rule
        .split_whitespace()
        .skip(3)
        .map(|w| w.replace(">PASSWORD", &format!(">{PASSWORD}")))
        .collect();
    let what = match fault {
        Fault::NoCommand(c) => {
            let grant = format!("+{}", c.to_ascii_lowercase());
            assert!(words.contains(&grant), "{rule}");
            words.retain(|w| *w != grant);
            format!("without {c}")
        }
        Fault::WrongType(role, kind) => {
            for t in [&tag, &purge_tag, &orphan_tag] {
                let key = format!("{t}:{role}");
                let exists: bool = redis::cmd("EXISTS").arg(&key).query(&mut con).expect("EXISTS");
                if exists {
                    let _: () = redis::cmd("RENAME")
                        .arg(&key)
                        .arg(format!("{key}:saved"))
                        .query(&mut con)
                        .expect("RENAME");
                }
                let _: () = if *kind == "string" {
                    redis::cmd("HSET")
                        .arg(&key)
                        .arg("stray")
                        .arg("1")
                        .query(&mut con)
                        .expect("HSET")
                } else {
                    redis::cmd("SET").arg(&key).arg("stray").query(&mut con).expect("SET")
                };
            }
            format!("{tag}:{role} of the wrong type")
        }
    };
    // The purge and orphan queues' keys and channels too.
    for w in [&purge_admin, &orphan_admin].iter().flat_map(|q| {
        q.acl_rule_for("faulty", common::script_rights())
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    }) {
        if w.starts_with('~') {
            words.insert(3, w);
        } else if w.starts_with('&') {
            words.push(w);
        }
    }
    let mut setuser = redis::cmd("ACL");
    setuser.arg("SETUSER").arg("faulty").arg("reset");
    for w in &words {
        setuser.arg(w);
    }
    let _: () = setuser.query(&mut con).expect("ACL SETUSER");
    let url = format!("redis://faulty:{PASSWORD}@127.0.0.1:{}", server.port);
    let q = Queue::new(&url, &name, QueueOptions::default()).expect("queue");
    let scripts: BTreeMap<&str, &delayq::scripts::LuaScript> =
        delayq::scripts::all().into_iter().map(|s| (s.name, s)).collect();

    let mut removed: BTreeSet<String> = BTreeSet::new();
    for op in operations() {
        // A guarded script (push_one) runs some commands only to undo its writes after a
        // fault: without one of them it may succeed; when it fails, it is held to the rest.
        let may_fail = op.scripts.iter().any(|s| fault.hits(scripts[s]));
        let expect_fail =
            may_fail && !(matches!(fault, Fault::NoCommand(_)) && op.scripts.iter().all(|s| scripts[s].guarded));
        let snap = snapshot(server);
        let ctx = format!("{} ({} script) {what}", op.name, op.scripts.join(", "));
        match (op.run)(&q) {
            Ok(()) => {
                assert!(
                    !expect_fail,
                    "{ctx}: succeeded, though its script needs what the fault takes"
                );
                if op.name == "cancel" {
                    removed.insert("later-2".into());
                }
                if op.name == "delete_dead" {
                    removed.insert("doomed-2".into());
                }
                if op.name == "unrepeat" {
                    removed.extend(before.iter().filter(|id| id.starts_with("repeat:hourly:")).cloned());
                }
            }
            Err(e) => {
                assert!(may_fail, "{ctx}: {e}");
                fault.check_error(&e, &ctx);
                let after = snapshot(server);
                let changed: Vec<&String> = after
                    .keys()
                    .chain(snap.keys())
                    .filter(|k| after.get(*k) != snap.get(*k))
                    .collect();
                assert!(changed.is_empty(), "{ctx}: failed, and wrote {changed:?} before it did");
            }
        }
    }
    let purge = Queue::new(&url, &purge_name, QueueOptions::default()).expect("queue");
    let snap = snapshot(server);
    match purge.purge() {
        Ok(n) => {
            assert!(!fault.hits(scripts["purge"]), "purge {what}: succeeded");
            assert_eq!(n, 1);
        }
        Err(e) => {
            assert!(fault.hits(scripts["purge"]), "purge {what}: {e}");
            fault.check_error(&e, &format!("purge {what}"));
            assert!(
                snapshot(server) == snap,
                "purge {what}: failed, and wrote before it did"
            );
        }
    }
    let claim_hit = fault.hits(scripts["claim"]);
    // A pool also reads the sizes of what it claims (HSTRLEN, sent outside the scripts),
    // and asks one at its start.
    let size_hit = matches!(&fault, Fault::NoCommand(c) if c == "HSTRLEN");
    let pool_hit = claim_hit || size_hit;
    let check_pool_error = |e: &Error, what: &str| {
        if claim_hit {
            fault.check_error(e, what);
        } else {
            assert_eq!(e.category(), Category::Auth, "{what}: {e}");
            let text = e.to_string();
            assert!(
                text.contains("'hstrlen'") && text.contains("delayq acl --user faulty"),
                "{what}: {text}"
            );
        }
    };
    let orphans = Queue::new(&url, &orphan_name, QueueOptions::default()).expect("queue");
    let snap = snapshot(server);
    match run_pool(&orphans) {
        Ok(_) => assert!(
            !pool_hit,
            "orphan pool {what}: ran, though a pool needs what the fault takes"
        ),
        Err(e) => {
            assert!(pool_hit, "orphan pool {what}: {e}");
            check_pool_error(&e, &format!("orphan pool {what}"));
            assert!(
                snapshot(server) == snap,
                "orphan pool {what}: failed at its start, and wrote before it did"
            );
        }
    }
    let orphaned = || -> redis::RedisResult<Option<u64>> {
        redis::cmd("HGET")
            .arg(format!("{orphan_tag}:stats"))
            .arg("orphaned")
            .query(&mut server.con())
    };
    // (A stray stats key of the wrong type hits the claim: then nothing is dropped.)
    assert_eq!(
        orphaned().ok().flatten().is_some(),
        !pool_hit && !fault.hits(scripts["orphans"]),
        "{what}: the stray id dropped or not"
    );
    let snap = snapshot(server);
    match run_pool(&q) {
        Ok(handled) => {
            assert!(!pool_hit, "pool {what}: ran, though a pool needs what the fault takes");
            removed.extend(handled.into_iter().filter(|id| id != "due-1"));
        }
        Err(e) => {
            assert!(pool_hit, "pool {what}: {e}");
            check_pool_error(&e, &format!("pool {what}"));
            assert!(
                snapshot(server) == snap,
                "pool {what}: failed at its start, and wrote before it did"
            );
        }
    }

    // The fault goes; every message is still in one state, and a pool drains them all.
    if let Fault::WrongType(role, _) = fault {
        for t in [&tag, &purge_tag, &orphan_tag] {
            let key = format!("{t}:{role}");
            let _: () = redis::cmd("DEL").arg(&key).query(&mut con).expect("DEL");
            let saved: bool = redis::cmd("EXISTS")
                .arg(format!("{key}:saved"))
                .query(&mut con)
                .expect("EXISTS");
            if saved {
                let _: () = redis::cmd("RENAME")
                    .arg(format!("{key}:saved"))
                    .arg(&key)
                    .query(&mut con)
                    .expect("RENAME");
            }
        }
    }
    assert_one_state_each(server, &tag);
    // A stray id the fault left under a lease is dropped once that lease (600 ms) has
    // passed: the reaper puts it back, and the next claim hands it out again.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while orphaned().expect("HGET").is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: the stray id was never dropped"
        );
        run_until_empty(&orphan_admin, WorkerOptions::default(), |_| Ok(()));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(orphaned().expect("HGET"), Some(1), "{what}");
    assert_one_state_each(server, &orphan_tag);
    let after = ids_alive(server, &tag);
    for id in &before {
        assert!(
            after.contains(id) || removed.contains(id),
            "{what}: {id} is gone, though nothing removed it"
        );
    }
    let mut waiting = Vec::new();
    loop {
        let page = admin.list_page(Listing::Waiting, waiting.len(), 1000).expect("waiting");
        let full = page.len() == 1000;
        waiting.extend(page);
        if !full {
            break;
        }
    }
    for m in waiting.iter().filter(|m| m.state == delayq::State::Scheduled) {
        admin.reschedule(&m.id, Duration::ZERO).expect("reschedule");
    }
    let drained = Mutex::new(BTreeSet::new());
    // Deliveries the faulty pool could not complete come back once their lease (600
    // ms) has passed, and one heartbeat more after the pause between the pools (see
    // include/stall.lua): drain until nothing is in flight or due.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        run_until_empty(&admin, WorkerOptions::default(), |d| {
            drained.lock().expect("lock").insert(d.id.clone());
            Ok(())
        });
        let stats = admin.stats().expect("stats");
        if stats.inflight + stats.ready == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: left in flight: {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let drained = drained.into_inner().expect("lock");
    // A message whose deliveries the fault kept from completing may have used up its
    // max_attempts (doomed ones have 1): then it is a dead letter, which is a state.
    let dead_after: BTreeSet<String> = admin
        .dead_letters(100)
        .expect("dead")
        .into_iter()
        .map(|d| d.id)
        .collect();
    // Cancelled while the faulty pool ran it, whose completion the fault kept from
    // being written: deleted when its lease expired, unrun.
    let cancelled_unrun = |id: &String| id == "due-4" && admin.get(id).expect("get").is_none();
    for id in &after {
        assert!(
            drained.contains(id) || dead_after.contains(id) || id.starts_with("repeat:") || cancelled_unrun(id),
            "{what}: {id} was neither delivered nor a dead letter once the fault was gone"
        );
    }
    let stats = admin.stats().expect("stats");
    assert_eq!(stats.inflight + stats.ready, 0, "{what}: {stats:?}");
    assert_one_state_each(server, &tag);
}

/// The arities the preflight pads its permission checks to are the server's.
#[test]
fn the_preflights_arities_are_the_servers() {
    let server = RedisServer::start();
    let mut con = server.con();
    for &(command, arity) in delayq::scripts::ARITIES {
        let info: Vec<redis::Value> = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(command)
            .query(&mut con)
            .expect("COMMAND INFO");
        let Some(redis::Value::Array(fields)) = info.first() else {
            panic!("COMMAND INFO {command}: {info:?}");
        };
        let served: i64 = redis::FromRedisValue::from_redis_value(fields[1].clone()).expect("arity");
        // PEXPIRE took its options, and so a variable arity, in a later Redis; its fixed
        // arity before that counts the same words.
        let expected = if command == "PEXPIRE" && server.version() < (7, 0) {
            -arity
        } else {
            arity
        };
        assert_eq!(served, i64::from(expected), "{command}");
    }
}
