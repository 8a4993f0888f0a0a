//! Error mapping: every core error becomes one subclass of `DelayQueueException`,
//! decided here and nowhere else.

use std::sync::atomic::{AtomicPtr, Ordering};

use ext_php_rs::args::ArgInfoTables;
use ext_php_rs::builders::ClassBuilder;
use ext_php_rs::exception::PhpException;
use ext_php_rs::ffi::zend_class_entry;
use ext_php_rs::zend::{ClassEntry, ce};

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
    Ok(())
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
