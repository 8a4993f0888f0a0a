//! PHP extension for delayq (ext-php-rs): conversion, error mapping and process
//! supervision only; the queue logic lives in the `delayq` crate.

use ext_php_rs::prelude::*;

#[php_module]
pub fn module(module: ModuleBuilder) -> ModuleBuilder {
    module
}
