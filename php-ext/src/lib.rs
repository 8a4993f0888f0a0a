//! PHP extension for delayq (ext-php-rs): value conversion, error mapping, running
//! the handler on the PHP thread, and the fork of supervised processes (the supervisor
//! itself is the core's `host` module). The queue logic lives in
//! the `delayq` crate; each file here mirrors one part of its API.

mod args;
mod callable;
mod consumer;
mod convert;
mod errors;
mod logs;
mod message;
mod queue;
mod records;
mod signals;
mod summary;
mod supervisor;
mod values;
mod worker;

use std::sync::atomic::{AtomicBool, Ordering};

use ext_php_rs::prelude::*;

/// Set by each module start; the first request after it completes the declarations
/// that need the classes registered, which ext-php-rs does after `startup` returns.
static DECLARATIONS_PENDING: AtomicBool = AtomicBool::new(false);

extern "C" fn startup(_type: i32, module_number: i32) -> i32 {
    logs::install(module_number);
    args::reserve_slot();
    args::install_panic_hook();
    DECLARATIONS_PENDING.store(true, Ordering::SeqCst);
    match errors::register() {
        Ok(()) => 0,
        Err(e) => {
            // The engine reports "Unable to start delayq module" after this.
            eprintln!("delayq: cannot register exception classes: {e}");
            -1
        }
    }
}

extern "C" fn request_startup(_type: i32, _module_number: i32) -> i32 {
    args::request_started();
    if DECLARATIONS_PENDING.swap(false, Ordering::SeqCst) {
        queue::declare_union_types();
        args::wrap_methods();
        args::mark_sensitive_parameters();
    }
    0
}

/// `php --ri delayq` and `phpinfo()`.
extern "C" fn info(_module: *mut ext_php_rs::zend::ModuleEntry) {
    ext_php_rs::info_table_start!();
    ext_php_rs::info_table_row!("delayq support", "enabled");
    ext_php_rs::info_table_row!("version", env!("CARGO_PKG_VERSION"));
    ext_php_rs::info_table_row!(logs::LEVEL_INI, logs::configured_level());
    ext_php_rs::info_table_end!();
}

#[php_module]
pub fn module(module: ModuleBuilder) -> ModuleBuilder {
    // `extension_loaded('delayq')`, not the crate's package name.
    module
        .name("delayq")
        .startup_function(startup)
        .request_startup_function(request_startup)
        .info_function(info)
        .class::<queue::PhpDelayQueue>()
        .class::<worker::PhpWorker>()
        .class::<message::PhpMessage>()
        .class::<consumer::PhpConsumer>()
}
