//! The producer and admin API of one queue: the `Queue` handle, its connections and
//! the process-wide cache of shared handles, and how its calls reach Redis. Its
//! calls live in the files below, one role each.

mod admin;
mod dead;
mod inspect;
mod minutes;
mod options;
mod push;
mod repeats;
mod validate;
mod views;
mod waiting;

use std::sync::Arc;

use parking_lot::Mutex;
use redis::{FromRedisValue, RedisResult, Value};

use crate::conn::{Conn, ConnSlot, Endpoint, Replay};
use crate::error::{Error, Result};
use crate::keys::{Keys, Layout, partition_of, partition_tags, validate_name};
use crate::scripts::{self, Invocation, LuaScript, MAX_BATCH};

pub use options::{
    DEFAULT_MAX_PAYLOAD_BYTES, GroupLimit, MAX_KEEP_COMPLETED, MAX_PAYLOAD_BYTES, MAX_RATE_LIMIT_PERIOD, NewMessage,
    PushOptions, QUEUE_OPTIONS, QueueOptions, RateLimit, queue_option,
};
pub use validate::MAX_ID_BYTES;
pub use views::{COUNTERS, DeadLetter, Listing, MAX_ERROR_TEXT_BYTES, MessageInfo, State, Stats, WorkerInfo};
pub use waiting::CancelOptions;

pub(super) fn earliest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Most messages a page of a listing may skip (`list_page`, `dead_letters_page`): on a
/// partitioned queue each partition's first `start + limit` are read to merge them.
pub const MAX_PAGE_START: usize = 100_000;

pub(crate) struct Inner {
    pub(crate) name: String,
    /// The keys of each partition.
    pub(crate) parts: Vec<Keys>,
    /// Shared with the queues made by `sharing_connection`, together with `conn`: the
    /// slot's record of the master it connected to is this endpoint's.
    pub(crate) endpoint: Arc<Endpoint>,
    pub(crate) opts: QueueOptions,
    /// The producer and admin connection, shared by the queues of `sharing_connection`.
    pub(crate) conn: Arc<Mutex<ConnSlot>>,
    /// This handle's producer side has noted the queue in the registry of queues (see
    /// registry.rs): every later push skips the process-wide bookkeeping.
    pub(crate) producer_registered: std::sync::atomic::AtomicBool,
}

/// A handle on one queue. Cheap to clone; safe to share between threads; usable on
/// both sides of a `fork()` (each process opens its own connection).
#[derive(Clone)]
pub struct Queue {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("name", &self.inner.name)
            .field("url", &self.inner.endpoint.display)
            .field("layout", &self.inner.opts.layout)
            .finish()
    }
}

/// Queues kept by `Queue::shared`, oldest first.
pub(super) static SHARED: Mutex<Vec<(String, Queue)>> = Mutex::new(Vec::new());

/// Distinct shared queues kept per process; past it the least recently asked for goes.
pub const MAX_SHARED_QUEUES: usize = 64;

impl Queue {
    /// The queue `new` would make, kept for the life of the process together with its
    /// connection: asking again with the same URL, name and options returns it, still
    /// connected. For processes that live longer than the code that pushes, such as a
    /// PHP-FPM worker, which would otherwise connect (and, over TLS, shake hands) once
    /// per request. At most `MAX_SHARED_QUEUES` are kept.
    pub fn shared(url: &str, name: &str, opts: QueueOptions) -> Result<Self> {
        let key = format!("{url}\n{name}\n{opts:?}");
        let mut shared = SHARED.lock();
        if let Some(at) = shared.iter().position(|(k, _)| *k == key) {
            let entry = shared.remove(at);
            let queue = entry.1.clone();
            shared.push(entry);
            return Ok(queue);
        }
        let queue = Self::new(url, name, opts)?;
        if shared.len() >= MAX_SHARED_QUEUES {
            shared.remove(0);
        }
        shared.push((key, queue.clone()));
        Ok(queue)
    }

    /// A handle on queue `name` at `url`. Validates everything; connects on first use.
    pub fn new(url: &str, name: &str, opts: QueueOptions) -> Result<Self> {
        opts.check()?;
        let parts = Self::keys_of(name, &opts)?;
        let endpoint = Endpoint::parse(url, opts.connect.clone())?;
        Ok(Self::with(
            name,
            parts,
            opts,
            Arc::new(endpoint),
            Arc::new(Mutex::new(ConnSlot::new())),
        ))
    }

    /// A handle on queue `name` at this queue's Redis that shares this queue's
    /// connection: many queues, one client of Redis (a dashboard of hundreds of
    /// queues). Validates as `new`; `opts.connect` must be this queue's, since the
    /// connection is made once, with them. The calls of the queues that share a
    /// connection take turns on it; a pool built on one still opens its own. Like
    /// any connection it reconnects when dropped, for all of them, and a forked
    /// process opens its own.
    pub fn sharing_connection(&self, name: &str, opts: QueueOptions) -> Result<Self> {
        opts.check()?;
        if opts.connect != self.inner.opts.connect {
            return Err(Error::invalid(
                "connect",
                "the options of the connection differ from those of the queue whose connection it shares",
            ));
        }
        let parts = Self::keys_of(name, &opts)?;
        Ok(Self::with(
            name,
            parts,
            opts,
            Arc::clone(&self.inner.endpoint),
            Arc::clone(&self.inner.conn),
        ))
    }

    /// The keys of each partition of queue `name`.
    fn keys_of(name: &str, opts: &QueueOptions) -> Result<Vec<Keys>> {
        match &opts.layout {
            Layout::Native => {
                validate_name("prefix", &opts.prefix)?;
                validate_name("queue name", name)?;
                partition_tags(&opts.prefix, name, opts.partitions)
                    .iter()
                    .map(|tag| Keys::new(tag, name, &opts.layout))
                    .collect()
            }
            Layout::Seed { .. } if opts.partitions > 1 => Err(Error::invalid(
                "partitions",
                "the seed layout is the recipe's one ZSET and HASH; it cannot be partitioned",
            )),
            Layout::Seed { .. } => Ok(vec![Keys::new("", name, &opts.layout)?]),
        }
    }

    fn with(
        name: &str,
        parts: Vec<Keys>,
        opts: QueueOptions,
        endpoint: Arc<Endpoint>,
        conn: Arc<Mutex<ConnSlot>>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                parts,
                endpoint,
                opts,
                conn,
                producer_registered: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The options it was made with.
    pub fn options(&self) -> &QueueOptions {
        &self.inner.opts
    }

    /// The URL with its password hidden.
    pub fn url(&self) -> &str {
        &self.inner.endpoint.display
    }

    /// How many partitions this queue is spread over.
    pub fn partitions(&self) -> usize {
        self.inner.parts.len()
    }

    /// The partition that holds (or will hold) a message: by its partition key when it
    /// has one, else by its id.
    pub fn partition_of(&self, id: &str, partition_key: Option<&str>) -> usize {
        partition_of(partition_key.unwrap_or(id), self.partitions())
    }

    /// The hash tag of partition `part` (`{...}` included), e.g. for ACL rules.
    pub fn hash_tag(&self, part: usize) -> Option<String> {
        let keys = self.inner.parts.get(part)?;
        let first = &keys.all[0];
        Some(
            first
                .split_once('}')
                .map_or_else(|| first.clone(), |(tag, _)| format!("{tag}}}")),
        )
    }

    /// Run `build` to add arguments, then the script on partition `part`, on the
    /// producer connection; its reply decoded as `R` (a reply that does not decode is
    /// `Error::Protocol`, naming the script).
    pub(crate) fn call<R: FromRedisValue>(
        &self,
        part: usize,
        operation: &str,
        replay: Replay,
        script: &LuaScript,
        build: impl Fn(&mut Invocation<'_>),
    ) -> Result<R> {
        let inner = &*self.inner;
        let v: Value = inner.conn.lock().run(&inner.endpoint, operation, replay, |con| {
            let mut inv = self.invocation(part, script);
            build(&mut inv);
            inv.invoke(con)
        })?;
        scripts::read(script, v)
    }

    /// Run a by-id script on the id's own partition first, then on the others, until
    /// `found` accepts a reply (a message pushed with a partition key may live on any).
    pub(super) fn call_by_id<R: FromRedisValue>(
        &self,
        id: &str,
        operation: &str,
        replay: Replay,
        script: &LuaScript,
        build: impl Fn(&mut Invocation<'_>),
        found: impl Fn(&R) -> bool,
    ) -> Result<R> {
        let n = self.partitions();
        let home = partition_of(id, n);
        let mut last = self.call(home, operation, replay, script, &build)?;
        for part in (0..n).filter(|&p| p != home) {
            if found(&last) {
                break;
            }
            last = self.call(part, operation, replay, script, &build)?;
        }
        Ok(last)
    }

    /// A call of `script` on partition `part`: the keys its header declares, then the
    /// layout and the wake-up channel.
    pub(crate) fn invocation<'a>(&'a self, part: usize, script: &'a LuaScript) -> Invocation<'a> {
        let keys = &self.inner.parts[part];
        let mut inv = Invocation::new(
            script,
            script.keys.iter().map(|&k| keys.all[k].as_str()),
            Some(&self.inner.endpoint.functions),
        );
        inv.arg(self.inner.opts.layout.script_name()).arg(&keys.wake_channel);
        inv
    }

    /// Ask Redis to confirm that `wait_replicas` replicas have the writes made so far
    /// on this connection to partition `part`'s master.
    pub(super) fn confirm_replicated(&self, con: &mut Conn, part: usize) -> RedisResult<i64> {
        con.query_on_key_node(&self.wait_command(), &self.inner.parts[part].all[0])
    }

    /// WAIT for `wait_replicas` replicas, at most `wait_timeout`.
    pub(super) fn wait_command(&self) -> redis::Cmd {
        let o = &self.inner.opts;
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(o.wait_replicas).arg(o.wait_timeout.as_millis() as u64);
        cmd
    }

    pub(super) fn check_replicated(&self, confirmed: i64) -> Result<()> {
        let o = &self.inner.opts;
        if confirmed < i64::from(o.wait_replicas) {
            return Err(Error::NotReplicated {
                wanted: o.wait_replicas,
                confirmed: u32::try_from(confirmed).unwrap_or(0),
                timeout_ms: o.wait_timeout.as_millis() as u64,
            });
        }
        Ok(())
    }

    /// Check that Redis answers (connecting if needed).
    pub fn ping(&self) -> Result<()> {
        let inner = &*self.inner;
        inner.conn.lock().run(&inner.endpoint, "ping", Replay::Safe, |con| {
            redis::cmd("PING").query::<String>(con)
        })?;
        Ok(())
    }
}

impl Queue {
    /// The page `start..start + limit` of a listing merged over the partitions, in the
    /// order `sort` puts them: one call on a single partition; otherwise each
    /// partition's first `start + limit`, read in calls of at most `MAX_BATCH`.
    /// `fetch(part, start, limit)` reads one partition's slice.
    pub(super) fn page<T>(
        &self,
        start: usize,
        limit: usize,
        mut fetch: impl FnMut(usize, usize, usize) -> Result<Vec<T>>,
        sort: impl FnOnce(&mut Vec<T>),
    ) -> Result<Vec<T>> {
        if start > MAX_PAGE_START {
            return Err(Error::invalid(
                "start",
                format!("at most {MAX_PAGE_START} messages may be skipped, got {start}"),
            ));
        }
        if limit == 0 {
            return Ok(Vec::new());
        }
        if self.partitions() == 1 {
            return fetch(0, start, limit);
        }
        let end = start + limit;
        let mut all = Vec::new();
        for part in 0..self.partitions() {
            let mut from = 0;
            while from < end {
                let want = MAX_BATCH.min(end - from);
                let got = fetch(part, from, want)?;
                let short = got.len() < want;
                all.extend(got);
                if short {
                    break;
                }
                from += want;
            }
        }
        sort(&mut all);
        Ok(all.into_iter().skip(start).take(limit).collect())
    }
}
