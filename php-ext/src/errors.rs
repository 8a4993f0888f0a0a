//! Error mapping: every core error becomes one subclass of `DelayQueueException`,
//! decided here and nowhere else.

use std::sync::atomic::{AtomicPtr, Ordering};

use ext_php_rs::args::ArgInfoTables;
use ext_php_rs::builders::{ClassBuilder, ClassProperty, FunctionBuilder};
use ext_php_rs::convert::IntoZval;
use ext_php_rs::exception::PhpException;
use ext_php_rs::ffi::zend_class_entry;
use ext_php_rs::flags::{ClassFlags, DataType, MethodFlags, PropertyFlags};
use ext_php_rs::types::{ZendObject, Zval};
use ext_php_rs::zend::{ClassEntry, ExecuteData, ExecutorGlobals, ce};

unsafe extern "C" {
    // SPL's RuntimeException: not reachable through ClassEntry::try_find at startup.
    static spl_ce_RuntimeException: *mut zend_class_entry;
}

fn runtime_exception() -> &'static ClassEntry {
    // SAFETY: SPL is part of every PHP build and registers its classes before any
    // extension's startup runs; the pointer is never written again.
    unsafe { &*spl_ce_RuntimeException.cast::<ClassEntry>() }
}

/// The exception classes, in registration order (parents first).
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Root,
    InvalidArgument,
    Connection,
    Auth,
    Payload,
    LeaseLost,
    Timeout,
    OutOfMemory,
}

const CLASSES: [(&str, Option<Kind>); 8] = [
    ("DelayQueueException", None),
    ("DelayQueueInvalidArgumentException", Some(Kind::Root)),
    ("DelayQueueConnectionException", Some(Kind::Root)),
    ("DelayQueueAuthException", Some(Kind::Root)),
    ("DelayQueuePayloadException", Some(Kind::Root)),
    ("DelayQueueLeaseLostException", Some(Kind::Root)),
    ("DelayQueueTimeoutException", Some(Kind::Connection)),
    ("DelayQueueOutOfMemoryException", Some(Kind::Root)),
];

static ENTRIES: [AtomicPtr<ClassEntry>; 8] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 8];

fn entry(kind: Kind) -> &'static ClassEntry {
    let ptr = ENTRIES[kind as usize].load(Ordering::Acquire);
    // SAFETY: set once at module startup to a class entry the engine owns for the life
    // of the process; null only if startup failed, when the extension is not loaded.
    unsafe { ptr.as_ref() }.unwrap_or_else(ce::exception)
}

fn root() -> &'static ClassEntry {
    entry(Kind::Root)
}

fn connection() -> &'static ClassEntry {
    entry(Kind::Connection)
}

macro_rules! keep {
    ($name:ident, $kind:expr) => {
        fn $name(ce: &'static mut ClassEntry, _: ArgInfoTables) {
            ENTRIES[$kind as usize].store(ce, Ordering::Release);
        }
    };
}
keep!(keep_root, Kind::Root);
keep!(keep_invalid, Kind::InvalidArgument);
keep!(keep_connection, Kind::Connection);
keep!(keep_auth, Kind::Auth);
keep!(keep_payload, Kind::Payload);
keep!(keep_lease_lost, Kind::LeaseLost);
keep!(keep_timeout, Kind::Timeout);
keep!(keep_out_of_memory, Kind::OutOfMemory);

/// Registers the exception hierarchy (called from the module's startup).
pub(crate) fn register() -> ext_php_rs::error::Result<()> {
    let keepers: [fn(&'static mut ClassEntry, ArgInfoTables); 8] = [
        keep_root,
        keep_invalid,
        keep_connection,
        keep_auth,
        keep_payload,
        keep_lease_lost,
        keep_timeout,
        keep_out_of_memory,
    ];
    for ((name, parent), keeper) in CLASSES.into_iter().zip(keepers) {
        let parent: ext_php_rs::class::ClassEntryInfo = match parent {
            None => (runtime_exception, "RuntimeException"),
            Some(Kind::Connection) => (connection, "DelayQueueConnectionException"),
            Some(_) => (root, "DelayQueueException"),
        };
        ClassBuilder::new(name)
            .extends(parent)
            .registration(keeper)
            .register()?;
    }
    register_partial()
}

/// A batch that failed after writing some of it (`delayq::Error::PartlyWritten`)
/// throws one of these: each extends the class its cause throws, so that a `catch` of
/// that class still catches it, and implements the interface that gives the ids.
const PARTIAL_INTERFACE: &str = "DelayQueuePartialPushException";

/// The classes of a batch written in part, by the class of their cause. A cause of
/// another class (bad input or a lost lease, which a push refuses before it sends
/// anything) would take the first.
const PARTIAL: [(&str, Kind, &str); 5] = [
    ("DelayQueueRedisPartialPushException", Kind::Root, "DelayQueueException"),
    (
        "DelayQueueConnectionPartialPushException",
        Kind::Connection,
        "DelayQueueConnectionException",
    ),
    (
        "DelayQueueTimeoutPartialPushException",
        Kind::Timeout,
        "DelayQueueTimeoutException",
    ),
    (
        "DelayQueueAuthPartialPushException",
        Kind::Auth,
        "DelayQueueAuthException",
    ),
    (
        "DelayQueueOutOfMemoryPartialPushException",
        Kind::OutOfMemory,
        "DelayQueueOutOfMemoryException",
    ),
];

/// The interface's entry, then the classes' in `PARTIAL` order.
static PARTIAL_ENTRIES: [AtomicPtr<ClassEntry>; 6] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 6];

/// Their private properties: every id of the batch, those written, those unknown.
const IDS: &str = "ids";
const WRITTEN: &str = "writtenIds";
const UNKNOWN: &str = "unknownIds";

fn partial_interface() -> &'static ClassEntry {
    let ptr = PARTIAL_ENTRIES[0].load(Ordering::Acquire);
    // SAFETY: as in `entry`.
    unsafe { ptr.as_ref() }.unwrap_or_else(ce::exception)
}

macro_rules! keep_partial {
    ($name:ident, $index:expr) => {
        fn $name(ce: &'static mut ClassEntry, _: ArgInfoTables) {
            PARTIAL_ENTRIES[$index].store(ce, Ordering::Release);
        }
    };
}
keep_partial!(keep_partial_interface, 0);
keep_partial!(keep_partial_root, 1);
keep_partial!(keep_partial_connection, 2);
keep_partial!(keep_partial_timeout, 3);
keep_partial!(keep_partial_auth, 4);
keep_partial!(keep_partial_out_of_memory, 5);

/// The parents of `PARTIAL`'s classes, as `ClassBuilder::extends` takes them.
fn out_of_memory() -> &'static ClassEntry {
    entry(Kind::OutOfMemory)
}

fn timeout() -> &'static ClassEntry {
    entry(Kind::Timeout)
}

fn auth() -> &'static ClassEntry {
    entry(Kind::Auth)
}

/// A native method, as `FunctionBuilder::new` takes it.
type Handler = extern "C" fn(&mut ExecuteData, &mut Zval);

/// The interface's methods: the name, what it returns, and the handler of the classes.
const PARTIAL_METHODS: [(&str, DataType, Handler); 4] = [
    ("getIds", DataType::Array, get_ids),
    ("getWrittenIds", DataType::Array, get_written_ids),
    ("getWrittenCount", DataType::Long, get_written_count),
    ("getUnknownIds", DataType::Array, get_unknown_ids),
];

/// Run `f` with `scope` as the class whose private properties may be used, as the
/// engine's `zend_update_property` does: the caller's own scope is `DelayQueue`.
fn in_scope<T>(scope: &ClassEntry, f: impl FnOnce() -> T) -> T {
    let before = std::mem::replace(
        &mut ExecutorGlobals::get_mut().fake_scope,
        std::ptr::from_ref(scope).cast_mut().cast(),
    );
    let out = f();
    ExecutorGlobals::get_mut().fake_scope = before;
    out
}

/// The value of `$this`'s private property `name`, for a method without arguments.
fn property_of_this(ex: &mut ExecuteData, name: &str) -> Option<Zval> {
    if ex.parser().parse().is_err() {
        return None;
    }
    let this = ex.get_self()?;
    let class = this.get_class_entry();
    in_scope(class, || this.get_property::<&Zval>(name).ok().map(Zval::shallow_clone))
}

extern "C" fn get_ids(ex: &mut ExecuteData, retval: &mut Zval) {
    if let Some(v) = property_of_this(ex, IDS) {
        *retval = v;
    }
}

extern "C" fn get_written_ids(ex: &mut ExecuteData, retval: &mut Zval) {
    if let Some(v) = property_of_this(ex, WRITTEN) {
        *retval = v;
    }
}

extern "C" fn get_written_count(ex: &mut ExecuteData, retval: &mut Zval) {
    if let Some(v) = property_of_this(ex, WRITTEN) {
        let count = v.array().map_or(0, |a| a.len());
        retval.set_long(i64::try_from(count).unwrap_or(i64::MAX));
    }
}

extern "C" fn get_unknown_ids(ex: &mut ExecuteData, retval: &mut Zval) {
    if let Some(v) = property_of_this(ex, UNKNOWN) {
        *retval = v;
    }
}

/// Registers the interface and the classes of a batch written in part.
fn register_partial() -> ext_php_rs::error::Result<()> {
    let mut interface = ClassBuilder::new(PARTIAL_INTERFACE)
        .flags(ClassFlags::Interface)
        .registration(keep_partial_interface);
    for (name, returns, _) in PARTIAL_METHODS {
        interface = interface.method(
            FunctionBuilder::new_abstract(name).returns(returns, false, false),
            MethodFlags::Public | MethodFlags::Abstract,
        );
    }
    interface.register()?;
    let keepers: [fn(&'static mut ClassEntry, ArgInfoTables); 5] = [
        keep_partial_root,
        keep_partial_connection,
        keep_partial_timeout,
        keep_partial_auth,
        keep_partial_out_of_memory,
    ];
    for ((name, kind, parent_name), keeper) in PARTIAL.into_iter().zip(keepers) {
        let parent: fn() -> &'static ClassEntry = match kind {
            Kind::Connection => connection,
            Kind::Timeout => timeout,
            Kind::Auth => auth,
            Kind::OutOfMemory => out_of_memory,
            _ => root,
        };
        let mut class = ClassBuilder::new(name)
            .extends((parent, parent_name))
            .implements((partial_interface, PARTIAL_INTERFACE))
            .flags(ClassFlags::Final)
            .registration(keeper);
        for (method, returns, handler) in PARTIAL_METHODS {
            class = class.method(
                FunctionBuilder::new(method, handler).returns(returns, false, false),
                MethodFlags::Public,
            );
        }
        for property in [IDS, WRITTEN, UNKNOWN] {
            class = class.property(ClassProperty {
                name: property.to_owned(),
                flags: PropertyFlags::Private,
                // Null, not an empty array: a default lives as long as the class,
                // beyond every request's memory.
                default: Some(Box::new(|| {
                    let mut null = Zval::new();
                    null.set_null();
                    Ok(null)
                })),
                docs: &[],
                ty: None,
                nullable: false,
                readonly: false,
                default_stub: None,
            });
        }
        class.register()?;
    }
    Ok(())
}

/// The exception of a batch written in part: its cause's message and class, with the
/// ids.
fn partial(message: String, kind: Kind, ids: &[String], written: &[String], unknown: &[String]) -> PhpException {
    let index = PARTIAL
        .iter()
        .position(|(_, k, _)| *k as usize == kind as usize)
        .unwrap_or(0);
    let ptr = PARTIAL_ENTRIES[index + 1].load(Ordering::Acquire);
    // SAFETY: as in `entry`.
    let Some(class) = (unsafe { ptr.as_ref() }) else {
        return PhpException::new(message, 0, entry(kind));
    };
    let mut object = ZendObject::new(class);
    let set = in_scope(class, || -> ext_php_rs::error::Result<()> {
        // Exception's own property, which its constructor would set.
        object.set_property("message", message.as_str())?;
        object.set_property(IDS, ids.to_vec())?;
        object.set_property(WRITTEN, written.to_vec())?;
        object.set_property(UNKNOWN, unknown.to_vec())
    });
    if set.is_err() {
        return PhpException::new(message, 0, entry(kind));
    }
    match object.into_zval(false) {
        Ok(zval) => PhpException::new(message, 0, class).with_object(zval),
        Err(_) => PhpException::new(message, 0, entry(kind)),
    }
}

fn class(kind: Kind) -> &'static ClassEntry {
    entry(kind)
}

/// A `DelayQueueException` subclass for a core error.
pub(crate) fn to_php(err: &delayq::Error) -> PhpException {
    use delayq::Category as C;
    let kind = match err.category() {
        C::InvalidArgument => Kind::InvalidArgument,
        C::Payload => Kind::Payload,
        C::Connection => Kind::Connection,
        C::Timeout => Kind::Timeout,
        C::Auth => Kind::Auth,
        C::LeaseLost => Kind::LeaseLost,
        C::OutOfMemory => Kind::OutOfMemory,
        _ => Kind::Root,
    };
    if let delayq::Error::PartlyWritten {
        ids, written, unknown, ..
    } = err
    {
        return partial(err.to_string(), kind, ids, written, unknown);
    }
    PhpException::new(err.to_string(), 0, class(kind))
}

/// Wrong input that PHP code passed: unknown option, out-of-range value.
pub(crate) fn invalid(message: impl Into<String>) -> PhpException {
    PhpException::new(message.into(), 0, class(Kind::InvalidArgument))
}

/// The class of [`invalid`], for the engine's own argument errors.
pub(crate) fn invalid_class() -> &'static ClassEntry {
    class(Kind::InvalidArgument)
}

/// A Rust panic inside a method: a bug of the extension, reported without a backtrace.
pub(crate) fn internal(message: impl Into<String>) -> PhpException {
    PhpException::new(message.into(), 0, class(Kind::Root))
}

/// A payload that cannot become JSON.
pub(crate) fn payload(message: impl Into<String>) -> PhpException {
    PhpException::new(message.into(), 0, class(Kind::Payload))
}

/// The pool itself failed (a worker process could not start).
pub(crate) fn worker_failed(message: impl Into<String>) -> PhpException {
    PhpException::new(message.into(), 0, class(Kind::Root))
}

/// A value of the wrong PHP type.
pub(crate) fn type_error(message: impl Into<String>) -> PhpException {
    PhpException::new(message.into(), 0, ce::type_error())
}

pub(crate) trait OrThrow<T> {
    fn or_throw(self) -> Result<T, PhpException>;
}

impl<T> OrThrow<T> for delayq::Result<T> {
    /// Every call into the core ends here, on the PHP thread: the place to write what
    /// the core logged meanwhile.
    fn or_throw(self) -> Result<T, PhpException> {
        crate::logs::flush();
        self.map_err(|e| to_php(&e))
    }
}
