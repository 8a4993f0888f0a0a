//! `DelayQueueWorker` and `DelayQueueMessage`: runs the handler on the PHP thread
//! (mirrors `delayq::Worker` / `delayq::Consumer`), and in `processes` mode forks and
//! supervises handler processes (see `supervisor.rs`).

use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ext_php_rs::boxed::ZBox;
use ext_php_rs::convert::{IntoZval, IntoZvalDyn};
use ext_php_rs::exception::PhpException;
use ext_php_rs::prelude::*;
use ext_php_rs::types::{ZendCallable, ZendClassObject, ZendHashTable, ZendObject, Zval};
use ext_php_rs::zend::{BailoutGuard, ClassEntry, ExecutorGlobals, ce};

use crate::callable::Callee;
use crate::consumer::PhpConsumer;
use crate::convert::{self, Options, OptionsArg, zv};
use crate::errors::{self, OrThrow};
use crate::message::{Decision, PhpMessage};
use crate::queue::PhpDelayQueue;
use crate::signals;
use crate::summary::{RunSummary, summary_array};
use crate::supervisor;
use crate::values;
use delayq::host::{Called, Outcome, Slot, StopReason, WorkerSettings};

type PhpResult<T> = Result<T, PhpException>;

unsafe extern "C" {
    // ZEND_API since PHP 8.0: the pending "exception" is exit()/die() unwinding.
    fn zend_is_unwind_exit(ex: *const ext_php_rs::ffi::zend_object) -> bool;
    // ZEND_API since PHP 8.1: the pending "exception" unwinds a Fiber being destroyed
    // while suspended (not a Throwable: it has no methods to call).
    fn zend_is_graceful_exit(ex: *const ext_php_rs::ffi::zend_object) -> bool;
    // PHPAPI: flushes and closes every output buffer, as the end of a request does.
    fn php_output_end_all();
    // ZEND_API since PHP 8.0: frees what zend_is_callable_ex() made for a __call().
    fn zend_release_fcall_info_cache(fcc: *mut ext_php_rs::ffi::zend_fcall_info_cache);
}

/// The handler argument of `run()`: a callable, kept as its zval so that its
/// signature can be read (a `ZendCallable` does not show it).
#[derive(Debug)]
pub struct HandlerArg<'a>(&'a Zval);

impl<'a> ext_php_rs::convert::FromZval<'a> for HandlerArg<'a> {
    const TYPE: ext_php_rs::flags::DataType = ext_php_rs::flags::DataType::Callable;

    fn from_zval(zval: &'a Zval) -> Option<Self> {
        zval.is_callable().then_some(Self(zval))
    }
}

/// What a worker passes a handler: `($payload, $message)`.
const HANDLER_ARGUMENTS: u32 = 2;

/// Refuses, before anything is claimed, a handler that requires more parameters than
/// the worker passes, or a built-in function that takes fewer (PHP refuses extra
/// arguments to those): every message would fail with an ArgumentCountError, be
/// retried and end in the dead letters. A user function may take fewer (PHP drops
/// extra arguments to it); a handler whose signature cannot be read is let through.
fn check_handler_signature(handler: &Zval) -> PhpResult<()> {
    // SAFETY: zeroed is a valid empty cache; zend_is_callable_ex fills it (it does
    // not change the zval, whatever its signature says) and the cache is released
    // below; the function it points to lives at least as long as the handler.
    let (required, name) = unsafe {
        let mut fcc: ext_php_rs::ffi::zend_fcall_info_cache = std::mem::zeroed();
        let callable = std::ptr::from_ref(handler).cast_mut().cast::<ext_php_rs::ffi::zval>();
        let found = ext_php_rs::ffi::zend_is_callable_ex(
            callable,
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
            &raw mut fcc,
            std::ptr::null_mut(),
        );
        let seen = match fcc.function_handler.as_ref() {
            Some(function) if found => {
                let common = &function.common;
                let internal = u32::from(common.type_) == ext_php_rs::ffi::ZEND_INTERNAL_FUNCTION
                    && common.fn_flags & ext_php_rs::ffi::ZEND_ACC_VARIADIC == 0;
                let takes_at_most = internal.then_some(common.num_args);
                Some(((common.required_num_args, takes_at_most), function_name(function)))
            }
            _ => None,
        };
        zend_release_fcall_info_cache(&raw mut fcc);
        match seen {
            Some(seen) => seen,
            None => return Ok(()),
        }
    };
    let (required, takes_at_most) = required;
    if required > HANDLER_ARGUMENTS {
        return Err(errors::invalid(format!(
            "handler {name} needs {required} arguments; a worker calls it with ($payload, $message)"
        )));
    }
    if let Some(most) = takes_at_most.filter(|&n| n < HANDLER_ARGUMENTS) {
        let noun = if most == 1 { "argument" } else { "arguments" };
        return Err(errors::invalid(format!(
            "handler {name} takes at most {most} {noun}; a worker calls it with ($payload, $message)"
        )));
    }
    Ok(())
}

/// A function as an error names it: `name`, `Class::method`, or for a closure
/// `{closure}` and where it is defined.
///
/// # Safety
/// `function` is a live engine function.
unsafe fn function_name(function: &ext_php_rs::ffi::zend_function) -> String {
    let text = |s: *mut ext_php_rs::ffi::zend_string| {
        // SAFETY: the engine's interned or refcounted name, alive with the function.
        unsafe { s.cast::<ext_php_rs::types::ZendStr>().as_ref() }
            .and_then(|s| s.as_str().ok())
            .unwrap_or("?")
            .to_owned()
    };
    // SAFETY: `common` is the part that every kind of function shares.
    let common = unsafe { &function.common };
    let mut name = text(common.function_name);
    if common.fn_flags & ext_php_rs::ffi::ZEND_ACC_CLOSURE != 0 {
        // PHP 8.4 names closures `{closure:Class::method():line}`, earlier ones
        // `{closure}`: one name on every version, the place said after it.
        if name.starts_with("{closure") {
            name = "{closure}".to_owned();
        }
        if u32::from(common.type_) == ext_php_rs::ffi::ZEND_USER_FUNCTION {
            // SAFETY: a user function's op_array.
            let op_array = unsafe { &function.op_array };
            name = format!("{name} at {}:{}", text(op_array.filename), op_array.line_start);
        }
    // SAFETY: a method's class, registered for the life of the request.
    } else if let Some(class) = unsafe { common.scope.cast::<ClassEntry>().as_ref() } {
        name = format!("{}::{name}", class.name().unwrap_or("?"));
    }
    name
}

/// The error of a delivery whose handler called exit() or die().
const EXIT_ERROR: &str = "the handler called exit() or die(), which stopped the worker";

/// A pool of consumers running a PHP callable for each due message.
/// The worker's callables besides the handler, each run in the worker process.
#[derive(Default)]
struct Hooks {
    on_start: Option<Zval>,
    on_stop: Option<Zval>,
    /// `(mixed $payload, DelayQueueMessage $message, string $error)`, after a failure
    /// sent the message to the dead-letter set.
    on_dead: Option<Zval>,
    /// `(mixed $payload, DelayQueueMessage $message, Throwable $e)`, after each
    /// exception a handler threw (an error tracker's report).
    on_failure: Option<Zval>,
}

#[php_class]
#[php(name = "DelayQueueWorker")]
#[php(flags = ext_php_rs::flags::ClassFlags::Final)]
pub struct PhpWorker {
    worker: delayq::Worker,
    settings: WorkerSettings,
    hooks: Hooks,
    /// Throwable classes (or interfaces) whose exceptions go to the dead-letter set at
    /// once; looked up again at each failure, where the autoloader has loaded them.
    no_retry: Vec<String>,
    /// Set by `stop()` in the supervisor process.
    stop_requested: Arc<AtomicBool>,
    /// `run()` takes `&self`: a handler calls `stop()` on the same object while it runs.
    running: AtomicBool,
}

impl std::fmt::Debug for PhpWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelayQueueWorker")
            .field("worker", &self.worker)
            .finish_non_exhaustive()
    }
}

/// A process that a handler (or a hook) forked with `pcntl_fork()` came back into the
/// worker: it returned, called exit(), or threw. It ends here, before it could run,
/// wait on or write through the pool it inherited (whose threads stayed in the parent,
/// with the locks they held at the fork) or its supervisor's slot, with the status
/// PHP would give it: exit()'s, 255 after an uncaught exception, else 0. Output
/// buffers are flushed as at any exit; shutdown functions and destructors do not run
/// (they belong to the parent's objects, the worker among them).
fn end_forked_child(call: Option<&ext_php_rs::error::Result<Zval>>) -> ! {
    let status = match call {
        Some(Err(_)) => {
            let pending = ExecutorGlobals::get().exception().map(std::ptr::from_ref);
            match pending {
                // SAFETY: the engine's pending exception, alive until taken.
                Some(ex) if unsafe { zend_is_unwind_exit(ex.cast()) } => ExecutorGlobals::get().exit_status,
                // SAFETY: as above. A Fiber destroyed while suspended: nothing failed.
                Some(ex) if unsafe { zend_is_graceful_exit(ex.cast()) } => 0,
                Some(_) => {
                    let trace = ExecutorGlobals::take_exception()
                        .map(|ex| exception_trace(&ex))
                        .unwrap_or_default();
                    write_stderr(&format!(
                        "delayq: a process forked by a handler ended with an uncaught {trace}\n"
                    ));
                    255
                }
                None => 255,
            }
        }
        _ => 0,
    };
    // SAFETY: PHP's own end-of-request flush, on the PHP thread; then _exit(2), which
    // runs nothing of this process's.
    unsafe {
        php_output_end_all();
        libc::_exit(status)
    }
}

/// write(2) to stderr: a pool thread may have held Rust's stderr lock at a fork.
fn write_stderr(text: &str) {
    // SAFETY: writes our own buffer to fd 2.
    unsafe { libc::write(2, text.as_ptr().cast(), text.len()) };
}

/// The exception as PHP prints it: class, message, file and line, the stack trace,
/// and each previous exception ("Next ...").
fn exception_trace(ex: &ZendObject) -> String {
    let printed = ex.try_call_method("__toString", vec![]).ok().and_then(|z| z.string());
    // A class of the user's may override __toString and throw: what it threw must not
    // stay pending in the engine, and the final methods give the trace instead.
    if ExecutorGlobals::get().exception().is_some() {
        drop(ExecutorGlobals::take_exception());
        let frames = ex
            .try_call_method("getTraceAsString", vec![])
            .ok()
            .and_then(|z| z.string())
            .unwrap_or_default();
        return format!("{}\nStack trace:\n{frames}", describe_exception(ex));
    }
    printed.unwrap_or_default()
}

fn describe_exception(ex: &ZendObject) -> String {
    let class = ex.get_class_name().unwrap_or_else(|_| "Exception".into());
    let call = |m: &str| ex.try_call_method(m, vec![]).ok();
    let message = call("getMessage").and_then(|z| z.string()).unwrap_or_default();
    let file = call("getFile").and_then(|z| z.string()).unwrap_or_default();
    let line = call("getLine").and_then(|z| z.long()).unwrap_or(0);
    format!("{class}: {message} in {file}:{line}")
}

fn memory_usage() -> i64 {
    ZendCallable::try_from_name("memory_get_usage")
        .ok()
        .and_then(|f| f.try_call(vec![]).ok())
        .and_then(|z| z.long())
        .unwrap_or(0)
}

impl PhpWorker {
    /// The handler loop of one process: claims run on the pool's threads, the
    /// handler on this (the PHP) thread.
    /// `report`: a supervised process's pipe to its supervisor, for the counts of a
    /// run that a second signal ends at once.
    pub(crate) fn consume(
        &self,
        handler: &Callee,
        slot: Option<&Slot>,
        report: Option<std::fs::File>,
    ) -> PhpResult<RunSummary> {
        crate::logs::sync_level();
        let consumer = BailoutGuard::new(self.worker.start().or_throw()?);
        let releaser = consumer.releaser();
        // Ended (joined) when this function returns, after the pool has finished.
        let _watcher = signals::watch(move || {
            let given = releaser.release_all();
            if let Some(report) = report {
                crate::supervisor::report_ended_at_once(report, releaser.summary());
            }
            given
        });
        // A supervised process keeps its counts in its slot, for a supervisor that
        // kills it before it can report.
        let publisher = slot.map(|s| s.publish_while(consumer.releaser(), self.settings.pool.timeout));
        let mut side = PhpHandler {
            worker: self,
            handler,
            dispatch: Callee::by_name("pcntl_signal_dispatch"),
        };
        let recycle = self.settings.recycle();
        let served = delayq::host::serve(&consumer, &mut side, slot, recycle);
        let consumer = BailoutGuard::into_inner(consumer);
        let core = consumer.finish();
        drop(publisher);
        crate::logs::flush();
        Ok(RunSummary {
            core,
            ended: served.stopped_by,
        })
    }

    /// What the handler call came to, as the core's run policy takes it, and the
    /// exception it threw (for `on_failure`).
    fn outcome(&self, result: ext_php_rs::error::Result<Zval>) -> (Outcome, Option<ZBox<ZendObject>>) {
        let call_error = match result {
            // A generator function's body runs only when iterated: acknowledging it
            // would mark done a message whose handler never ran.
            Ok(returned)
                if returned
                    .object()
                    .is_some_and(|o| o.get_class_name().is_ok_and(|c| c == "Generator")) =>
            {
                return (
                    Outcome::NotRun(
                        "the handler returned a Generator (it contains `yield`): its body never ran; \
                         a handler must do its work and return"
                            .into(),
                    ),
                    None,
                );
            }
            Ok(_) => return (Outcome::Returned, None),
            Err(e) => e,
        };
        let pending = ExecutorGlobals::get().exception().map(std::ptr::from_ref);
        match pending {
            // SAFETY: the pointer is the engine's pending exception, alive until taken
            // or the request ends.
            Some(ex) if unsafe { zend_is_unwind_exit(ex.cast()) } => (Outcome::Exited(EXIT_ERROR.into()), None),
            // SAFETY: as above. A Fiber destroyed while its handler was suspended.
            Some(ex) if unsafe { zend_is_graceful_exit(ex.cast()) } => (Outcome::Abandoned, None),
            Some(_) => {
                let thrown = ExecutorGlobals::take_exception();
                let outcome = match &thrown {
                    Some(ex) => Outcome::Raised {
                        error: describe_exception(ex),
                        trace: exception_trace(ex),
                        no_retry: is_no_retry(ex, &self.no_retry),
                    },
                    None => Outcome::Raised {
                        error: call_error.to_string(),
                        trace: String::new(),
                        no_retry: false,
                    },
                };
                (outcome, thrown)
            }
            None => (
                Outcome::Raised {
                    error: format!("handler could not be called: {call_error}"),
                    trace: String::new(),
                    no_retry: false,
                },
                None,
            ),
        }
    }

    /// The death handler.
    fn call_on_dead(&self, payload: &Zval, message: &Zval, error: &str, queue_name: &str) {
        call_alert(
            self.hooks.on_dead.as_ref(),
            "on_dead",
            &[payload, message, &zv(error.to_owned())],
            queue_name,
        );
    }

    /// The failure report: the exception itself, once the message's fate is decided
    /// and handed to the pool (what the hook does cannot change it).
    fn call_on_failure(&self, payload: &Zval, message: &Zval, thrown: ZBox<ZendObject>, queue_name: &str) {
        if self.hooks.on_failure.is_none() {
            return;
        }
        let Ok(exception) = thrown.into_zval(false) else { return };
        call_alert(
            self.hooks.on_failure.as_ref(),
            "on_failure",
            &[payload, message, &exception],
            queue_name,
        );
    }

    pub(crate) fn call_on_start(&self) -> PhpResult<()> {
        call_hook(self.hooks.on_start.as_ref(), "on_start")
    }

    /// After this process's pool has stopped and written every acknowledgement.
    pub(crate) fn call_on_stop(&self) -> PhpResult<()> {
        call_hook(self.hooks.on_stop.as_ref(), "on_stop")
    }

    /// Record the restart requests made before this start (see
    /// `delayq::Worker::mark_start`); fails at once on an auth error or stray key.
    pub(crate) fn mark_start(&self) -> PhpResult<()> {
        self.worker.mark_start().or_throw()
    }

    pub(crate) fn settings(&self) -> &WorkerSettings {
        &self.settings
    }

    pub(crate) fn queues(&self) -> impl Iterator<Item = &delayq::Queue> {
        self.worker.queues()
    }

    pub(crate) fn stop_requested(&self) -> bool {
        self.stop_requested.load(Ordering::Acquire)
    }
}

/// The PHP side of the core's receive loop (`delayq::host::serve`), on the PHP thread.
struct PhpHandler<'a> {
    worker: &'a PhpWorker,
    handler: &'a Callee<'a>,
    /// `pcntl_signal_dispatch`, when pcntl is loaded.
    dispatch: Option<Callee<'static>>,
}

/// A handler's arguments, kept for the hooks.
struct PhpCall {
    payload: Zval,
    message: Zval,
    decision: Decision,
    /// With lower queues, each delivery names its own.
    queue_name: Arc<str>,
}

impl delayq::host::Handler for PhpHandler<'_> {
    type Call = PhpCall;
    type Return = ext_php_rs::error::Result<Zval>;
    type Thrown = ZBox<ZendObject>;
    /// PHP's run never raises from the loop: exit() goes on once run() returns.
    type Raise = std::convert::Infallible;

    fn between(&mut self, ending: bool) -> Result<Option<StopReason>, Self::Raise> {
        let signalled = !ending && signals::take();
        if let Some(f) = &self.dispatch {
            // Lets the script's own pcntl_signal() handlers run (they may call stop()).
            let _ = f.call([]);
        }
        Ok(signalled.then_some(StopReason::Signal))
    }

    fn asked(&mut self) -> Option<StopReason> {
        self.worker.stop_requested().then_some(StopReason::Stop)
    }

    fn wait<T: Send>(&mut self, wait: impl FnOnce() -> T + Send) -> T {
        wait()
    }

    fn flush_logs(&mut self) {
        crate::logs::flush();
    }

    fn prepare(&mut self, delivery: &delayq::Delivery) -> Result<PhpCall, String> {
        let payload = delivery
            .decode_payload_with(convert::ZvalSeed)
            .map_err(|e| format!("stored payload cannot be decoded: {e}"))?;
        let message = PhpMessage::new(delivery, payload.shallow_clone(), None);
        let decision = Rc::clone(&message.decision);
        Ok(PhpCall {
            payload,
            message: ZendClassObject::new(message).into_zval(false).unwrap_or_default(),
            decision,
            queue_name: Arc::clone(&delivery.queue),
        })
    }

    fn call(&mut self, call: &PhpCall) -> Self::Return {
        self.handler.call([&call.payload, &call.message])
    }

    fn outcome(&mut self, returned: Self::Return) -> Called<Self::Thrown, Self::Raise> {
        let (outcome, thrown) = self.worker.outcome(returned);
        Called {
            outcome,
            thrown,
            raise: None,
        }
    }

    fn decision(&mut self, call: &PhpCall) -> Option<(delayq::Retry, String)> {
        call.decision.borrow_mut().take()
    }

    fn leave_forked_child(&mut self, returned: Option<Self::Return>) -> Self::Raise {
        end_forked_child(returned.as_ref())
    }

    fn on_failure(&mut self, call: &PhpCall, thrown: ZBox<ZendObject>) {
        self.worker
            .call_on_failure(&call.payload, &call.message, thrown, &call.queue_name);
    }

    fn on_dead(&mut self, call: &PhpCall, error: &str) {
        self.worker
            .call_on_dead(&call.payload, &call.message, error, &call.queue_name);
    }

    fn memory_bytes(&mut self) -> i64 {
        memory_usage()
    }
}

/// An alert (`on_dead`, `on_failure`), not part of the message's handling: what it
/// throws is logged and cleared, and the pool goes on.
fn call_alert(callable: Option<&Zval>, name: &str, args: &[&Zval], queue_name: &str) {
    let Some(f) = callable.and_then(|c| ZendCallable::new(c).ok()) else {
        return;
    };
    if f.try_call(args.iter().map(|a| *a as &dyn IntoZvalDyn).collect())
        .is_err()
    {
        let thrown = ExecutorGlobals::take_exception()
            .map(|ex| describe_exception(&ex))
            .unwrap_or_else(|| "it could not be called".into());
        log::warn!("delayq[{queue_name}]: {name} failed: {thrown}");
    }
}

fn call_hook(callable: Option<&Zval>, name: &str) -> PhpResult<()> {
    let Some(callable) = callable else { return Ok(()) };
    let f = ZendCallable::new(callable).map_err(|e| errors::type_error(format!("{name} is not callable: {e}")))?;
    match f.try_call(vec![]) {
        Ok(_) => Ok(()),
        // The PHP exception stays pending and reaches the caller unchanged.
        Err(e) => Err(PhpException::from(format!("{name} failed: {e}"))),
    }
}

/// The option `lower_queues`: a list of `DelayQueue` objects.
fn lower_queues(value: Option<&Zval>) -> PhpResult<Vec<delayq::Queue>> {
    const WHAT: &str = "DelayQueueWorker option 'lower_queues'";
    let Some(value) = value else { return Ok(Vec::new()) };
    let list = value.dereference().array().ok_or_else(|| {
        errors::type_error(format!(
            "{WHAT} must be an array of DelayQueue, {} given",
            values::type_name(value)
        ))
    })?;
    convert::entries(list)
        .enumerate()
        .map(|(i, (_, item))| {
            item.dereference()
                .extract::<&PhpDelayQueue>()
                .map(|q| q.queue.clone())
                .ok_or_else(|| {
                    errors::type_error(format!(
                        "{WHAT} must hold DelayQueue objects, item {i} is {}",
                        values::type_name(item)
                    ))
                })
        })
        .collect()
}

type Parsed = (WorkerSettings, Vec<delayq::Queue>, Hooks, Vec<String>);

/// The `no_retry` option: names of Throwable classes or interfaces, each checked now
/// (autoloaded if need be) so that a typo fails at construction, not at the first
/// failure.
fn no_retry_classes(value: Option<&Zval>) -> PhpResult<Vec<String>> {
    const WHAT: &str = "DelayQueueWorker option 'no_retry'";
    let Some(value) = value else { return Ok(Vec::new()) };
    let list = value.dereference().array().ok_or_else(|| {
        errors::type_error(format!(
            "{WHAT} must be an array of exception class names, {} given",
            values::type_name(value)
        ))
    })?;
    convert::entries(list)
        .enumerate()
        .map(|(i, (_, item))| {
            if let Some(bytes) = item.dereference().zend_str() {
                values::utf8(bytes.as_bytes()).map_err(|e| {
                    errors::invalid(format!(
                        "{WHAT}: item {i} is not valid UTF-8 (byte {}): \"{}\"",
                        e.at, e.shown
                    ))
                })?;
            }
            let name = item.dereference().string().ok_or_else(|| {
                errors::type_error(format!(
                    "{WHAT} must hold class names, item {i} is {}",
                    values::type_name(item)
                ))
            })?;
            let class = ClassEntry::try_find(name.trim_start_matches('\\'))
                .ok_or_else(|| errors::invalid(format!("{WHAT}: class {name:?} does not exist")))?;
            if !class.instance_of(ce::throwable()) {
                return Err(errors::invalid(format!(
                    "{WHAT}: {name:?} is not an exception class (it does not implement Throwable)"
                )));
            }
            Ok(name)
        })
        .collect()
}

/// Whether `ex` is an instance of one of the `no_retry` classes.
fn is_no_retry(ex: &ZendObject, no_retry: &[String]) -> bool {
    no_retry
        .iter()
        .any(|name| ClassEntry::try_find(name.trim_start_matches('\\')).is_some_and(|class| ex.instance_of(class)))
}

fn worker_options(options: Option<&ZendHashTable>) -> PhpResult<Parsed> {
    let mut o = Options::new(options, "DelayQueueWorker option");
    let mut values = Vec::new();
    for row in delayq::host::WORKER_OPTIONS
        .iter()
        .filter(|r| r.takers.php && r.kind.is_value())
    {
        if let Some(value) = o.value(row)? {
            values.push((row.name, value));
        }
    }
    let settings = WorkerSettings::from_values(values).map_err(|e| o.core_error(&e))?;
    let mut hook = |name: &'static str| match o.get(name) {
        Some(v) if v.is_callable() => Ok(Some(v.shallow_clone())),
        Some(v) => Err(errors::type_error(format!(
            "DelayQueueWorker option '{name}' must be callable, {} given",
            values::type_name(v)
        ))),
        None => Ok(None),
    };
    let hooks = Hooks {
        on_start: hook("on_start")?,
        on_stop: hook("on_stop")?,
        on_dead: hook("on_dead")?,
        on_failure: hook("on_failure")?,
    };
    let lower = lower_queues(o.get("lower_queues"))?;
    let no_retry = no_retry_classes(o.get("no_retry"))?;
    o.finish()?;
    Ok((settings, lower, hooks, no_retry))
}

#[php_impl]
impl PhpWorker {
    /// @param array{threads?: int, processes?: int, batch?: int, prefetch?: int, lease?: float,
    ///   max_attempts?: int, backoff_base?: float, backoff_max?: float, timeout?: float,
    ///   idle_check?: float, stop_when_empty?: bool, max_trace_bytes?: int, max_payload_bytes?: int,
    ///   min_processes?: int, scale_cooldown?: float, max_jobs?: int,
    ///   max_memory_mb?: int, max_time?: float, on_start?: callable, on_stop?: callable, on_dead?: callable, on_failure?: callable,
    ///   lower_queues?: list<DelayQueue>, no_retry?: list<class-string<Throwable>>} $options
    #[php(defaults(options = "OptionsArg::EMPTY"))]
    pub fn __construct(queue: &PhpDelayQueue, options: OptionsArg<'_>) -> PhpResult<Self> {
        let (settings, lower, hooks, no_retry) = worker_options(options.0)?;
        Ok(Self {
            worker: delayq::Worker::with_lower_queues(queue.queue.clone(), lower, settings.pool.clone()).or_throw()?,
            settings,
            hooks,
            no_retry,
            stop_requested: Arc::new(AtomicBool::new(false)),
            running: AtomicBool::new(false),
        })
    }

    /// Consume until stopped (stop(), SIGTERM, SIGINT, max_jobs, max_memory_mb, max_time,
    /// DelayQueue::restartWorkers(), stop_when_empty), calling
    /// `$handler(mixed $payload, DelayQueueMessage $message)` for each due message.
    /// Returning acknowledges the message; throwing retries it with backoff, and after
    /// max_attempts moves it to the dead-letter set with the exception as its error.
    /// Returns once every acknowledgement is written. A second SIGTERM or SIGINT, half
    /// a second or more after the first, gives every held message back at once and
    /// ends the process by that signal (see `signals`). A handler that requires more
    /// than the two arguments is refused before anything is claimed; a child that a
    /// handler forks ends when it comes back (see `end_forked_child`).
    ///
    /// @param callable(mixed, DelayQueueMessage): void $handler
    /// @return array{handled: int, acked: int, failed: int, retried: int, dead: int, lease_lost: int, gone: int,
    ///   released: int, unwritten: int, cancelled: int, stopped_by: ?string, processes: int, restarts: int, killed_hung: int,
    ///   scaled_up: int, scaled_down: int}
    pub fn run(&self, handler: HandlerArg<'_>) -> PhpResult<ZBox<ZendHashTable>> {
        check_handler_signature(handler.0)?;
        let handler = Callee::new(handler.0).map_err(|e| errors::type_error(format!("handler: {e}")))?;
        if self.running.swap(true, Ordering::AcqRel) {
            return Err(errors::invalid("this DelayQueueWorker is already running"));
        }
        self.stop_requested.store(false, Ordering::Release);
        let guard = signals::install();
        let result = if self.settings.is_supervised() {
            supervisor::supervise(self, &handler)
        } else {
            self.call_on_start().and_then(|()| {
                let s = self.consume(&handler, None, None)?;
                self.call_on_stop()?;
                summary_array(&s, Some(&delayq::host::PoolSummary::single()))
            })
        };
        drop(guard);
        self.running.store(false, Ordering::Release);
        result
    }

    /// Start the pool in this process and take its messages one at a time with
    /// DelayQueueConsumer::receive(), deciding each with the message's ack(), fail(),
    /// release(), retryLater() or deadLetter(); their leases are renewed meanwhile.
    /// The options that shape run() (processes, timeout, max_jobs, max_time,
    /// max_memory_mb, the hooks, no_retry) are refused: the caller runs each message
    /// and decides when to stop.
    pub fn consumer(&self) -> PhpResult<PhpConsumer> {
        let s = &self.settings;
        let h = &self.hooks;
        let refused: Vec<&str> = [
            ("processes", s.processes != 1),
            ("timeout", s.pool.timeout.is_some()),
            ("max_jobs", s.max_jobs.is_some()),
            ("max_time", s.max_time.is_some()),
            ("max_memory_mb", s.max_memory_mb.is_some()),
            ("on_start", h.on_start.is_some()),
            ("on_stop", h.on_stop.is_some()),
            ("on_dead", h.on_dead.is_some()),
            ("on_failure", h.on_failure.is_some()),
            ("no_retry", !self.no_retry.is_empty()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        if !refused.is_empty() {
            return Err(errors::invalid(format!(
                "DelayQueueWorker::consumer(): option '{}' applies to run() only: the consumer's caller runs \
                 each message and decides when to stop",
                refused.join("', '")
            )));
        }
        if self.running.load(Ordering::Acquire) {
            return Err(errors::invalid("this DelayQueueWorker is already running"));
        }
        crate::logs::sync_level();
        Ok(PhpConsumer::new(self.worker.start().or_throw()?))
    }

    /// Stop gracefully: running handlers finish and are acknowledged, prefetched
    /// messages go back to the queue at once, then run() returns. Safe to call from a
    /// handler or a pcntl signal handler.
    pub fn stop(&self) {
        self.stop_requested.store(true, Ordering::Release);
        self.worker.stop();
    }
}
