//! A PHP callable looked up once and called many times, as PHP's own `array_map`
//! does: the handler and `pcntl_signal_dispatch`, each called once per message.
//! ext-php-rs's `ZendCallable::try_call` has the engine look the callable up twice
//! on every call (its own check, then `zend_call_function`'s).

use ext_php_rs::convert::IntoZvalDyn;
use ext_php_rs::error::{Error, Result};
use ext_php_rs::ffi::{zend_fcall_info, zend_fcall_info_cache, zend_is_callable_ex};
use ext_php_rs::types::{ZendCallable, Zval};
use ext_php_rs::zend::ExecutorGlobals;

unsafe extern "C" {
    // ZEND_API: calls `fci` with the function `fcc` resolved (or resolves it when
    // its handler is unset). SUCCESS is 0.
    fn zend_call_function(fci: *mut zend_fcall_info, fcc: *mut zend_fcall_info_cache) -> i32;
    // ZEND_API since PHP 8.0: frees what zend_is_callable_ex() made for a __call().
    fn zend_release_fcall_info_cache(fcc: *mut zend_fcall_info_cache);
}

/// A callable and the function the engine resolved it to.
pub(crate) struct Resolved {
    /// Holds the closure or object alive while the cache points into it.
    callable: Zval,
    fcc: zend_fcall_info_cache,
    /// A reference to the cache's object (`$this`), which the cache itself does not
    /// hold. A closure is `callable` itself.
    _object: Zval,
}

/// What looking a callable up once found.
enum Lookup {
    Resolved(Resolved),
    /// Callable, but to be looked up on each call: a trampoline (`__call`,
    /// `__callStatic`), which the engine frees after one call, or an array holding a
    /// reference (`[&$obj, 'handle']`), whose target may change between calls.
    EachCall,
    NotCallable,
}

impl Resolved {
    fn lookup(callable: &Zval) -> Lookup {
        let mut resolved = Self {
            callable: callable.shallow_clone(),
            // SAFETY: all-null is the engine's empty cache.
            fcc: unsafe { std::mem::zeroed() },
            _object: Zval::new(),
        };
        // SAFETY: the zval is live; the engine fills the cache and does not change
        // the zval. A cache filled here is released by Drop.
        let found = unsafe {
            zend_is_callable_ex(
                &raw mut resolved.callable,
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
                &raw mut resolved.fcc,
                std::ptr::null_mut(),
            )
        };
        // SAFETY: null or the engine's function, alive while the callable is.
        let Some(function) = (unsafe { resolved.fcc.function_handler.as_ref() }).filter(|_| found) else {
            return Lookup::NotCallable;
        };
        // SAFETY: `common` is the part every kind of function shares.
        let flags = unsafe { function.common.fn_flags };
        let holds_reference = callable
            .array()
            .is_some_and(|parts| parts.values().any(Zval::is_reference));
        if flags & ext_php_rs::ffi::ZEND_ACC_CALL_VIA_TRAMPOLINE != 0 || holds_reference {
            return Lookup::EachCall;
        }
        // SAFETY: null or an object the engine just resolved, alive now.
        if let Some(object) = unsafe { resolved.fcc.object.as_mut() } {
            resolved._object.set_object(object);
        }
        Lookup::Resolved(resolved)
    }

    /// Call it with `args` passed by value. Err when it could not be called or
    /// threw; a thrown exception stays pending for the caller to take, as with
    /// `ZendCallable::try_call`.
    pub(crate) fn call<const N: usize>(&self, args: [&Zval; N]) -> Result<Zval> {
        // Copies, as the engine may turn an argument into a reference in place.
        let mut params = args.map(Zval::shallow_clone);
        let mut retval = Zval::new();
        // Never dropped: its function name is a bitwise copy of `callable`, which the
        // engine only reads, and dropping it would release the callable once more.
        let mut fci = std::mem::ManuallyDrop::new(zend_fcall_info {
            size: std::mem::size_of::<zend_fcall_info>(),
            // SAFETY: see above.
            function_name: unsafe { std::ptr::read(&raw const self.callable) },
            retval: std::ptr::from_mut(&mut retval).cast(),
            params: if N == 0 {
                std::ptr::null_mut()
            } else {
                params.as_mut_ptr().cast()
            },
            object: self.fcc.object,
            param_count: N as u32,
            named_params: std::ptr::null_mut(),
        });
        let mut fcc = self.fcc;
        // SAFETY: `fci` and `fcc` describe a live callable and `N` live arguments.
        let failed = unsafe { zend_call_function(&raw mut *fci, &raw mut fcc) } != 0;
        drop(params);
        if failed {
            return Err(Error::Callable);
        }
        if ExecutorGlobals::get().exception().is_some() {
            let class = ExecutorGlobals::pending_exception_class().unwrap_or_default();
            return Err(Error::ExceptionPending { class });
        }
        Ok(retval)
    }
}

impl Drop for Resolved {
    fn drop(&mut self) {
        // SAFETY: the cache zend_is_callable_ex filled, released once.
        unsafe { zend_release_fcall_info_cache(&raw mut self.fcc) };
    }
}

/// A callable to call many times: resolved once where the engine allows it, else
/// looked up on each call by `ZendCallable`.
pub(crate) enum Callee<'a> {
    Resolved(Resolved),
    Plain(ZendCallable<'a>),
}

impl<'a> Callee<'a> {
    pub(crate) fn new(callable: &'a Zval) -> Result<Self> {
        match Resolved::lookup(callable) {
            Lookup::Resolved(resolved) => Ok(Self::Resolved(resolved)),
            Lookup::EachCall => ZendCallable::new(callable).map(Self::Plain),
            Lookup::NotCallable => Err(Error::Callable),
        }
    }

    /// The function `name`, if it exists.
    pub(crate) fn by_name(name: &str) -> Option<Callee<'static>> {
        let mut callable = Zval::new();
        callable.set_string(name, false).ok()?;
        match Resolved::lookup(&callable) {
            Lookup::Resolved(resolved) => Some(Callee::Resolved(resolved)),
            Lookup::EachCall => ZendCallable::new_owned(callable).ok().map(Callee::Plain),
            Lookup::NotCallable => None,
        }
    }

    /// Call it with `args` passed by value (see `Resolved::call`).
    pub(crate) fn call<const N: usize>(&self, args: [&Zval; N]) -> Result<Zval> {
        match self {
            Self::Resolved(r) => r.call(args),
            Self::Plain(c) => c.try_call(args.iter().map(|&a| a as &dyn IntoZvalDyn).collect()),
        }
    }
}
