//! PHP extension for delayq (ext-php-rs): value conversion, error mapping, running
//! the handler on the PHP thread, and process supervision. The queue logic lives in
//! the `delayq` crate; each file here mirrors one part of its API.

mod convert;
mod errors;
mod logs;
mod queue;
mod signals;
mod supervisor;
mod worker;

use ext_php_rs::prelude::*;

extern "C" fn startup(_type: i32, module_number: i32) -> i32 {
    logs::install(module_number);
    match errors::register() {
        Ok(()) => 0,
        Err(e) => {
            // The engine reports "Unable to start delayq module" after this.
            eprintln!("delayq: cannot register exception classes: {e}");
            -1
        }
    }
}

#[php_module]
pub fn module(module: ModuleBuilder) -> ModuleBuilder {
    // `extension_loaded('delayq')`, not the crate's package name.
    module
        .name("delayq")
        .startup_function(startup)
        .class::<queue::PhpDelayQueue>()
        .class::<worker::PhpWorker>()
        .class::<worker::PhpMessage>()
}
