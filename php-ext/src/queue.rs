//! `DelayQueue`: the producer and admin API (mirrors `delayq::Queue`).
// PHP names each parameter after the Rust one, in code that ext-php-rs generates
// outside the impl: aclRule()'s `$preloadedScripts` is camelCase, as PHP spells it.
#![allow(non_snake_case)]

use ext_php_rs::boxed::ZBox;
use ext_php_rs::exception::PhpException;
use ext_php_rs::ffi;
use ext_php_rs::flags::DataType;
use ext_php_rs::prelude::*;
use ext_php_rs::types::{ZendHashTable, Zval};
use ext_php_rs::zend::ClassEntry;

use crate::convert::{self, Options, OptionsArg, Seconds, ms_to_secs};
use crate::errors::{self, OrThrow};
use crate::values;
use delayq::{GroupLimit, Listing, MessageInfo, RateLimit, RepeatOptions, Schedule, ScriptRights, records};

type PhpResult<T> = Result<T, PhpException>;

/// A delay queue on Redis. Safe to use on both sides of `pcntl_fork()`: each process
/// opens its own connection.
#[php_class]
#[php(name = "DelayQueue")]
#[php(flags = ext_php_rs::flags::ClassFlags::Final)]
#[derive(Debug)]
pub struct PhpDelayQueue {
    pub(crate) queue: delayq::Queue,
}

/// The queue's options, read by the core's table, and whether the queue is to be kept
/// for the process (`persistent`).
fn queue_options(options: Option<&ZendHashTable>) -> PhpResult<(delayq::QueueOptions, bool)> {
    let mut o = Options::new(options, "DelayQueue option");
    let persistent = o.bool("persistent")?.unwrap_or(false);
    let mut values = Vec::new();
    for row in delayq::QUEUE_OPTIONS
        .iter()
        .filter(|r| r.takers.php && r.name != "persistent")
    {
        if let Some(value) = o.value(row)? {
            values.push((row.name, value));
        }
    }
    o.finish()?;
    let opts = delayq::QueueOptions::from_values(values).map_err(|e| o.core_error(&e))?;
    Ok((opts, persistent))
}

fn push_options(options: Option<&ZendHashTable>, what: &'static str) -> PhpResult<delayq::PushOptions> {
    let mut o = Options::new(options, what);
    let opts = read_push_options(&mut o)?;
    o.finish()?;
    Ok(opts)
}

/// The per-message options of push(), pushAt() and a pushMany() item.
fn read_push_options(o: &mut Options<'_>) -> PhpResult<delayq::PushOptions> {
    if o.exhausted() {
        // The common `pushMany` item: a payload and a delay, nothing else.
        return Ok(delayq::PushOptions::default());
    }
    Ok(delayq::PushOptions {
        id: o.string("id")?,
        max_attempts: o.int("max_attempts", 1, i64::from(u32::MAX))?.map(|n| n as u32),
        partition_key: o.string("partition_key")?,
        replace: o.bool("replace")?.unwrap_or(false),
        expire_after: o.duration("expire_after")?,
        serial_key: o.string("serial_key")?,
        group: o.string("group")?,
    })
}

/// A delay in seconds; `name` names it in an error, and is put together only then.
fn delay(value: &Zval, name: impl Fn() -> String) -> PhpResult<delayq::Due> {
    let secs = match convert::plain_seconds(value) {
        Some(secs) => secs,
        None => convert::seconds(value, &name())?,
    };
    match delayq::delay_from_secs("delay", secs) {
        Ok(d) => Ok(delayq::Due::In(d)),
        Err(_) => delayq::delay_from_secs(&name(), secs).map(delayq::Due::In).or_throw(),
    }
}

/// The `$at` of `pushAt()`, declared `float|DateTimeInterface`. ext-php-rs 0.16 gives a
/// parameter one declared type (union types come with extphprs/ext-php-rs#734, not yet
/// released), so this declares the class and `declare_union_types` adds `float` to it.
/// Every value is taken here: `absolute` refuses the wrong ones with a TypeError that
/// names them.
#[derive(Debug, Clone, Copy)]
pub struct DueTimeArg<'a>(&'a Zval);

impl<'a> ext_php_rs::convert::FromZval<'a> for DueTimeArg<'a> {
    const TYPE: DataType = DataType::object(DATE_TIME_INTERFACE);

    fn from_zval(zval: &'a Zval) -> Option<Self> {
        Some(Self(zval))
    }
}

const DATE_TIME_INTERFACE: &str = "DateTimeInterface";

/// Adds `float` to the declared type of `pushAt()`'s `$at` (declared
/// `DateTimeInterface` by `DueTimeArg`): the type mask PHP's own stubs give such a
/// parameter (`ZEND_ARG_OBJ_TYPE_MASK(…, DateTimeInterface, MAY_BE_DOUBLE, …)`), so
/// that Reflection, IDEs and static analysers see `DateTimeInterface|float`. The engine
/// never checks an internal function's declared types (its argument parser does); this
/// only changes what the declaration says. Runs after the class is registered, when
/// the engine has turned the class name into an interned string; once per module
/// start, so that a SAPI which starts the module again declares it again.
pub(crate) fn declare_union_types() {
    let Some(class) = ClassEntry::try_find("DelayQueue") else {
        return;
    };
    let method = "pushat";
    // SAFETY: the class is registered, so its function table holds internal functions
    // whose arg_info the engine allocated (and owns for the process); the request has
    // not started, so no other code reads the declaration while it changes.
    unsafe {
        let found = ffi::zend_hash_str_find(&raw const class.function_table, method.as_ptr().cast(), method.len());
        if found.is_null() {
            return;
        }
        let function = (*found).value.ptr.cast::<ffi::zend_function>();
        if function.is_null() || (*function).type_ != ffi::ZEND_INTERNAL_FUNCTION as u8 {
            return;
        }
        let internal = &mut (*function).internal_function;
        if internal.num_args < 2 || internal.arg_info.is_null() {
            return;
        }
        let at = &mut (*internal.arg_info.add(1)).type_;
        if at.type_mask & ffi::_ZEND_TYPE_NAME_BIT != 0 {
            at.type_mask |= 1 << ffi::IS_DOUBLE;
        }
    }
}

/// `float|int` Unix seconds or a `DateTimeInterface`.
fn absolute(at: &Zval) -> PhpResult<delayq::Due> {
    let at = at.dereference();
    let wrong_type = || {
        errors::type_error(format!(
            "at must be a Unix timestamp (int|float) or a DateTimeInterface, {} given",
            values::type_name(at)
        ))
    };
    if let Some(object) = at.object() {
        let is_datetime = ClassEntry::try_find(DATE_TIME_INTERFACE).is_some_and(|ce| object.instance_of(ce));
        if !is_datetime {
            return Err(wrong_type());
        }
        let text = object
            .try_call_method("format", vec![&"U.u"])
            .map_err(|e| errors::invalid(format!("at: cannot read the DateTimeInterface: {e}")))?;
        let secs: f64 = text
            .str()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| errors::invalid("at: the DateTimeInterface has no Unix time"))?;
        return delayq::Due::from_unix_secs(secs).or_throw();
    }
    let secs = convert::seconds(at, "at").map_err(|_| wrong_type())?;
    delayq::Due::from_unix_secs(secs).or_throw()
}

#[php_impl]
impl PhpDelayQueue {
    /// @param array{prefix?: string, layout?: 'native'|'seed', zset_key?: string, payload_key?: string,
    ///   max_payload_bytes?: int, connect_timeout?: float, read_timeout?: float, retry_timeout?: float,
    ///   tls_ca_file?: string, partitions?: int, wait_replicas?: int, wait_timeout?: float, dead_max?: int,
    ///   dead_ttl?: float, keep_completed?: int, keep_completed_for?: float, persistent?: bool} $options
    #[php(defaults(
        url = "\"redis://127.0.0.1:6379\"",
        queue = "\"default\"",
        options = "OptionsArg::EMPTY"
    ))]
    pub fn __construct(url: String, queue: String, options: OptionsArg<'_>) -> PhpResult<Self> {
        let (opts, persistent) = queue_options(options.0)?;
        crate::logs::sync_level();
        let queue = if persistent {
            delayq::Queue::shared(&url, &queue, opts)
        } else {
            delayq::Queue::new(&url, &queue, opts)
        };
        Ok(Self {
            queue: queue.or_throw()?,
        })
    }

    /// Schedule `$payload` (array, scalar, null or JsonSerializable) after `$delay`
    /// seconds, measured on the Redis server's clock. Returns the message id.
    ///
    /// @param array{id?: string, max_attempts?: int, partition_key?: string, replace?: bool, expire_after?: float, serial_key?: string,
    ///   group?: string} $options
    #[php(defaults(delay = 0.0, options = "OptionsArg::EMPTY"))]
    pub fn push(&self, payload: &Zval, delay: Seconds, options: OptionsArg<'_>) -> PhpResult<String> {
        let due = delayq::delay_from_secs("delay", delay.0)
            .map(delayq::Due::In)
            .or_throw()?;
        let opts = push_options(options.0, "push option")?;
        let json = convert::payload_to_json(payload)?;
        self.queue.push_json(json, due, &opts).or_throw()
    }

    /// Schedule `$payload` at `$at`: Unix seconds (float) or a DateTimeInterface.
    ///
    /// @param array{id?: string, max_attempts?: int, partition_key?: string, replace?: bool, expire_after?: float, serial_key?: string,
    ///   group?: string} $options
    #[php(defaults(options = "OptionsArg::EMPTY"))]
    pub fn push_at(&self, payload: &Zval, at: DueTimeArg<'_>, options: OptionsArg<'_>) -> PhpResult<String> {
        let due = absolute(at.0)?;
        let opts = push_options(options.0, "pushAt option")?;
        let json = convert::payload_to_json(payload)?;
        self.queue.push_json(json, due, &opts).or_throw()
    }

    /// Schedule many messages in one round trip (two for 1 000 delays or more, the first
    /// reading the Redis clock so that the client stamps them). Each item is
    /// `['payload' => …, 'delay' => seconds]` or `['payload' => …, 'at' => time]`, with
    /// optional `'id'`, `'max_attempts'`, `'partition_key'`, `'replace'`, `'expire_after'`,
    /// `'serial_key'` and `'group'`. Returns the ids in order. Nothing is written unless
    /// every item is valid. Up to 1 000 messages of one partition are one script, written
    /// all or none, and its error is the one a push throws. A batch of
    /// several scripts (more messages, or several partitions) that fails in one may have
    /// written others: then it throws a `DelayQueuePartialPushException` (errors.rs),
    /// which names every id of the batch, those written and those whose outcome is
    /// unknown, and is also the class its cause throws.
    ///
    /// @param list<array{payload: mixed, delay?: float, at?: float|\DateTimeInterface, id?: string, max_attempts?: int,
    ///   partition_key?: string, replace?: bool, expire_after?: float, serial_key?: string,
    ///   group?: string}> $items
    /// @return list<string>
    pub fn push_many(&self, items: &ZendHashTable) -> PhpResult<Vec<String>> {
        let mut batch = Vec::with_capacity(items.len());
        for (i, (_, item)) in convert::entries(items).enumerate() {
            let table = item.dereference().array().ok_or_else(|| {
                errors::type_error(format!(
                    "pushMany item {i} must be an array, {} given",
                    values::type_name(item)
                ))
            })?;
            let mut o = Options::item(table, "pushMany item", i, "key");
            let payload = o.get("payload");
            let delay_v = o.get("delay");
            let at_v = o.get("at");
            let options = read_push_options(&mut o)?;
            o.finish()?;
            if table.get("payload").is_none() {
                return Err(errors::invalid(format!("pushMany item {i} has no 'payload'")));
            }
            let due = match (delay_v, at_v) {
                (Some(_), Some(_)) => {
                    return Err(errors::invalid(format!("pushMany item {i} has both 'delay' and 'at'")));
                }
                (Some(d), None) => self::delay(d, || format!("pushMany item {i} 'delay'"))?,
                (None, Some(a)) => absolute(a)?,
                (None, None) => delayq::Due::NOW,
            };
            let null = Zval::new();
            let payload_json =
                convert::payload_to_json_named(payload.unwrap_or(&null), || format!("pushMany item {i} payload"))?;
            batch.push(delayq::NewMessage {
                payload_json,
                due,
                options,
            });
        }
        self.queue.push_many(&batch).or_throw()
    }

    /// Cancel a message. One that waits is deleted; one that runs is marked
    /// cancelled: its handler sees it (`$msg->isCancelled()`) within a heartbeat, and
    /// whatever it does then, the message is deleted, neither retried nor
    /// dead-lettered. With `'kill' => true`, a worker process that runs it is killed
    /// as at its timeout. False when it is unknown or dead.
    ///
    /// @param array{kill?: bool} $options
    #[php(defaults(options = "OptionsArg::EMPTY"))]
    pub fn cancel(&self, id: String, options: OptionsArg<'_>) -> PhpResult<bool> {
        let mut o = Options::new(options.0, "cancel option");
        let kill = o.bool("kill")?.unwrap_or(false);
        o.finish()?;
        self.queue
            .cancel_with(&id, delayq::CancelOptions::kill(kill))
            .or_throw()
    }

    /// Move a waiting message to `$delay` seconds from now. False when it is not
    /// waiting (unknown, running or dead).
    pub fn reschedule(&self, id: String, delay: Seconds) -> PhpResult<bool> {
        let due = delayq::delay_from_secs("delay", delay.0)
            .map(delayq::Due::In)
            .or_throw()?;
        self.queue.reschedule(&id, due).or_throw()
    }

    /// Everything known about a message, or null for an unknown id.
    ///
    /// @return array{id: string, state: 'scheduled'|'ready'|'inflight'|'dead'|'completed', payload: mixed,
    ///   payload_omitted_bytes: ?int, due_at: ?float, attempts: int, max_attempts: ?int, last_error: ?string,
    ///   error_trace: ?string, dead_at: ?float, created_at: ?float, lease_until: ?float, expires_at: ?float,
    ///   completed_at: ?float, serial_key: ?string, group: ?string, held: ?string,
    ///   cancelled: bool}|null
    pub fn get(&self, id: String) -> PhpResult<Option<ZBox<ZendHashTable>>> {
        match self.queue.get(&id).or_throw()? {
            Some(info) => Ok(Some(crate::records::record(records::message(&info))?)),
            None => Ok(None),
        }
    }

    /// The next `$limit` (at most 1000) messages waiting, scheduled or ready, earliest
    /// due first, each as get() shows it.
    #[php(defaults(limit = 100))]
    pub fn waiting(&self, limit: i64) -> PhpResult<ZBox<ZendHashTable>> {
        self.listing(Listing::Waiting, limit)
    }

    /// Up to `$limit` (at most 1000) running messages, earliest lease deadline first,
    /// each as get() shows it; a `lease_until` in the past is a delivery whose worker
    /// died or hung (it runs again at the next claim).
    #[php(defaults(limit = 100))]
    pub fn inflight(&self, limit: i64) -> PhpResult<ZBox<ZendHashTable>> {
        self.listing(Listing::Inflight, limit)
    }

    /// Up to `$limit` (at most 1000) messages whose payload contains `$text` (or whose id it is), in
    /// any state, each as get() shows it: a scan of the whole queue, for operators.
    #[php(defaults(limit = 20))]
    pub fn find(&self, text: String, limit: i64) -> PhpResult<ZBox<ZendHashTable>> {
        message_list(self.queue.find(&text, list_limit(limit)?).or_throw()?)
    }

    /// Up to `$limit` (at most 1000) messages whose payload has the field `$field`
    /// equal to `$value` (a scalar or null), in any state (see the stub).
    #[php(defaults(limit = 20))]
    pub fn find_field(&self, field: String, value: &Zval, limit: i64) -> PhpResult<ZBox<ZendHashTable>> {
        let json = convert::payload_to_json_named(value, || "$value".into())?;
        let value: serde_json::Value =
            serde_json::from_str(&json).map_err(|e| errors::invalid(format!("invalid value: {e}")))?;
        message_list(self.queue.find_field(&field, &value, list_limit(limit)?).or_throw()?)
    }

    /// Up to `$limit` (at most 1000) completed messages kept by `keep_completed`,
    /// latest first, each as get() shows it.
    #[php(defaults(limit = 100))]
    pub fn completed(&self, limit: i64) -> PhpResult<ZBox<ZendHashTable>> {
        self.listing(Listing::Completed, limit)
    }

    /// Queue depth by state and lifetime counters.
    ///
    /// @return array{scheduled: int, ready: int, inflight: int, dead: int, completed: int, held: int,
    ///   next_due_at: ?float, paused_at: ?float, rate_limit: array{max: int, per: float}|null, partitions: int,
    ///   pushed: int, delivered: int, acked: int, retried: int, died: int, expired: int, released: int,
    ///   cancelled: int, requeued: int, discarded: int, trimmed: int, purged: int,
    ///   replaced: int, moved: int}
    pub fn stats(&self) -> PhpResult<ZBox<ZendHashTable>> {
        let s = self.queue.stats().or_throw()?;
        crate::records::record(records::stats(&s, self.queue.partitions() as u32))
    }

    /// The consumer pools alive on this queue, from every host and language, oldest first.
    ///
    /// @return list<array{id: string, host: string, pid: int, started_at: float, last_seen: float,
    ///   threads: int, handlers: int, handled: int, acked: int, failed: int, holding: int,
    ///   started_recently: int, lateness_avg: ?float, lateness_max: ?float, handler_avg: ?float}>
    pub fn workers(&self) -> PhpResult<ZBox<ZendHashTable>> {
        crate::records::list(self.queue.workers().or_throw()?.iter().map(records::worker))
    }

    /// Up to `$limit` dead letters, newest first.
    ///
    /// @return list<array{id: string, payload: mixed, attempts: int, last_error: string, error_trace: ?string,
    ///   dead_at: float}>
    #[php(defaults(limit = 100))]
    pub fn dead_letters(&self, limit: i64) -> PhpResult<ZBox<ZendHashTable>> {
        if limit < 0 {
            return Err(errors::invalid(format!("limit must not be negative, got {limit}")));
        }
        crate::records::list(
            self.queue
                .dead_letters(limit as usize)
                .or_throw()?
                .iter()
                .map(records::dead_letter),
        )
    }

    /// Send dead letters back to the queue, due now, with a fresh attempt budget:
    /// the one with `$id`, or all when `$id` is null. Returns how many.
    pub fn requeue_dead(&self, id: Option<String>) -> PhpResult<i64> {
        let n = self.queue.requeue_dead(id.as_deref()).or_throw()?;
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    }

    /// Delete dead letters for good, payload and all: the one with `$id`, or all when
    /// `$id` is null. Returns how many. Waiting and running messages are not touched.
    pub fn delete_dead(&self, id: Option<String>) -> PhpResult<i64> {
        let n = self.queue.delete_dead(id.as_deref()).or_throw()?;
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    }

    /// Requeue the dead letters whose last error contains `$text` (plain text): after
    /// the fix of one failure, the others stay dead. Returns how many.
    pub fn requeue_dead_with_error(&self, text: String) -> PhpResult<i64> {
        let n = self.queue.requeue_dead_with_error(&text).or_throw()?;
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    }

    /// Delete the dead letters whose last error contains `$text` (plain text). Returns
    /// how many.
    pub fn delete_dead_with_error(&self, text: String) -> PhpResult<i64> {
        let n = self.queue.delete_dead_with_error(&text).or_throw()?;
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    }

    /// Define or change a repeating message: `$payload` is pushed once per occurrence
    /// of `$schedule`, as a message with the id "repeat:<name>:<due ms>". The same
    /// definition again changes nothing (call it at every deploy); another replaces it
    /// and its waiting occurrence. Returns the next occurrence's due time (Unix seconds).
    ///
    /// @param string|int|float $schedule a cron pattern ("0 2 * * *"; 6 fields: seconds
    ///   first), or an interval in seconds (at least 1)
    /// @param array{tz?: string, max_attempts?: int, expire_after?: float} $options tz: the
    ///   cron pattern's IANA time zone (UTC by default); expire_after: seconds after its
    ///   due time past which an occurrence that could not start goes to the dead-letter
    ///   set unrun
    #[php(defaults(options = "OptionsArg::EMPTY"))]
    pub fn repeat(&self, name: String, schedule: &Zval, payload: &Zval, options: OptionsArg<'_>) -> PhpResult<f64> {
        let mut o = Options::new(options.0, "repeat option");
        let tz = o.string("tz")?;
        let mut repeat_options = RepeatOptions::default();
        repeat_options.max_attempts = o.int("max_attempts", 1, i64::from(u32::MAX))?.map(|n| n as u32);
        repeat_options.expire_after = o.duration("expire_after")?;
        o.finish()?;
        let schedule = schedule_of(schedule, tz.as_deref())?;
        let json = convert::payload_to_json(payload)?;
        let due = self
            .queue
            .repeat_json(&name, &schedule, json, &repeat_options)
            .or_throw()?;
        Ok(ms_to_secs(due))
    }

    /// Stop a repeating message; its waiting occurrence is cancelled. Returns false if
    /// there was none of that name.
    pub fn unrepeat(&self, name: String) -> PhpResult<bool> {
        self.queue.unrepeat(&name).or_throw()
    }

    /// The repeating messages, by name.
    ///
    /// @return list<array{name: string, schedule: string|float, tz: ?string, payload: mixed,
    ///   max_attempts: ?int, expire_after: ?float, next_due_at: ?float}>
    pub fn repeats(&self) -> PhpResult<ZBox<ZendHashTable>> {
        crate::records::list(self.queue.repeats().or_throw()?.iter().map(records::repeat))
    }

    /// Stop consumption for every worker pool, on every host, until resume(): no
    /// handler starts a new message (beyond the about 50 ms of work a pool had
    /// prefetched); running handlers finish as usual and pushes are still accepted.
    /// Returns false if the queue was paused already.
    pub fn pause(&self) -> PhpResult<bool> {
        self.queue.pause().or_throw()
    }

    /// Undo pause(); idle worker pools start at once. Returns false if the queue was
    /// not paused.
    pub fn resume(&self) -> PhpResult<bool> {
        self.queue.resume().or_throw()
    }

    /// Whether pause() is in force.
    pub fn is_paused(&self) -> PhpResult<bool> {
        self.queue.is_paused().or_throw()
    }

    /// Hand out at most `$max` messages in any window of `$per` seconds, over every
    /// worker pool on every host (retries included): e.g. to stay within a payment
    /// provider's quota. Kept in Redis until changed or cleared; pools follow it from
    /// their next claim and sleep until the window has room. A partitioned queue
    /// splits `$max` among its partitions, so it must be at least their count.
    #[php(defaults(per = 1.0))]
    pub fn set_rate_limit(&self, max: i64, per: Seconds) -> PhpResult<()> {
        let max = u32::try_from(max)
            .map_err(|_| errors::invalid(format!("max must be from 1 to {}, got {max}", u32::MAX)))?;
        let limit = RateLimit::new(max, per.0).or_throw()?;
        self.queue.set_rate_limit(limit).or_throw()
    }

    /// Lift the rate limit; pools it held back start at once. Returns false if none
    /// was set.
    pub fn clear_rate_limit(&self) -> PhpResult<bool> {
        self.queue.clear_rate_limit().or_throw()
    }

    /// Limit `$group`'s messages, or with null every group without limits of its own:
    /// at most `$concurrency` running at once and at most `$max` started in any window
    /// of `$per` seconds (1 unless given), over every worker pool on every host. Neither
    /// clears them. Returns whether limits were in force before.
    #[php(optional = concurrency)]
    pub fn set_group_limit(
        &self,
        group: Option<String>,
        concurrency: Option<i64>,
        max: Option<i64>,
        per: Option<Seconds>,
    ) -> PhpResult<bool> {
        let limit = GroupLimit::from_args(concurrency, max, per.map(|p| p.0)).or_throw()?;
        self.queue.set_group_limit(group.as_deref(), limit).or_throw()
    }

    /// The rate limit in force, or null.
    ///
    /// @return array{max: int, per: float}|null
    pub fn rate_limit(&self) -> PhpResult<Option<ZBox<ZendHashTable>>> {
        self.queue
            .rate_limit()
            .or_throw()?
            .map(|l| crate::records::record(records::rate_limit(&l)))
            .transpose()
    }

    /// Ask every worker pool running on this queue, on every host and in every
    /// language, to stop gracefully (after a deploy, so that the process manager
    /// starts the new code). Returns how many pools were alive when asked.
    pub fn restart_workers(&self) -> PhpResult<i64> {
        Ok(i64::try_from(self.queue.restart_workers().or_throw()?).unwrap_or(i64::MAX))
    }

    /// The `ACL SETUSER` line that grants `$user` exactly this queue: its keys, its
    /// wake-up channels and the commands delayq sends. Replace `PASSWORD` with the
    /// user's password before running it. With `$preloadedScripts`, without `SCRIPT
    /// LOAD` (see loadScripts()); with `$functions`, FCALL instead of EVALSHA and
    /// `SCRIPT LOAD` (see installFunctions()).
    #[php(defaults(preloadedScripts = false, functions = false))]
    pub fn acl_rule(&self, user: String, preloadedScripts: bool, functions: bool) -> PhpResult<String> {
        if user.is_empty() {
            return Err(errors::invalid("user must not be empty"));
        }
        let rights = match (preloadedScripts, functions) {
            (false, false) => ScriptRights::Load,
            (true, false) => ScriptRights::Preloaded,
            (false, true) => ScriptRights::Functions,
            (true, true) => {
                return Err(errors::invalid(
                    "preloadedScripts and functions are two ways to run the scripts: give one",
                ));
            }
        };
        Ok(self.queue.acl_rule_for(&user, rights))
    }

    /// Load every script of delayq on the server (each node of a cluster), as an admin,
    /// for users whose rule lacks `SCRIPT LOAD`. Returns how many.
    pub fn load_scripts(&self) -> PhpResult<i64> {
        Ok(i64::try_from(self.queue.load_scripts().or_throw()?).unwrap_or(i64::MAX))
    }

    /// Install this build's library of functions (Redis 7.0+), as an admin, for users
    /// whose rule grants FCALL. Returns the library's name.
    pub fn install_functions(&self) -> PhpResult<String> {
        self.queue.install_functions().or_throw()
    }

    /// Move every waiting message to the queue `to` (another name, layout, partition
    /// count or Redis): the last step of leaving the seed layout. Returns how many.
    pub fn move_waiting(&self, to: &PhpDelayQueue) -> PhpResult<i64> {
        Ok(i64::try_from(self.queue.move_waiting(&to.queue).or_throw()?).unwrap_or(i64::MAX))
    }

    /// Delete every message of the queue in every state. Returns how many. A message a
    /// worker holds already (running or prefetched) may still reach its handler.
    pub fn purge(&self) -> PhpResult<i64> {
        Ok(i64::try_from(self.queue.purge().or_throw()?).unwrap_or(i64::MAX))
    }

    /// The queue's name.
    pub fn name(&self) -> String {
        self.queue.name().to_owned()
    }

    /// Check that Redis answers; throws DelayQueueConnectionException otherwise.
    pub fn ping(&self) -> PhpResult<bool> {
        self.queue.ping().or_throw()?;
        Ok(true)
    }
}

impl PhpDelayQueue {
    fn listing(&self, which: Listing, limit: i64) -> PhpResult<ZBox<ZendHashTable>> {
        message_list(self.queue.list(which, list_limit(limit)?).or_throw()?)
    }
}

fn list_limit(limit: i64) -> PhpResult<usize> {
    usize::try_from(limit).map_err(|_| errors::invalid(format!("limit must not be negative, got {limit}")))
}

fn message_list(infos: Vec<MessageInfo>) -> PhpResult<ZBox<ZendHashTable>> {
    crate::records::list(infos.iter().map(records::message))
}

/// A cron pattern (string) or an interval in seconds (int or float).
fn schedule_of(value: &Zval, tz: Option<&str>) -> PhpResult<Schedule> {
    let value = value.dereference();
    if let Some(pattern) = value.zend_str() {
        let pattern = values::utf8(pattern.as_bytes())
            .map_err(|e| errors::invalid(format!("$schedule is not valid UTF-8 (byte {}): \"{}\"", e.at, e.shown)))?;
        return Schedule::cron(pattern, tz).or_throw();
    }
    if value.is_long() || value.is_double() {
        return Schedule::every_secs(convert::seconds(value, "schedule")?, tz).or_throw();
    }
    Err(errors::invalid(format!(
        "$schedule must be a cron pattern (string) or an interval in seconds (int|float), got {}",
        values::type_name(value)
    )))
}
