//! PHP's own argument rules for the extension's methods. ext-php-rs parses arguments
//! strictly whatever the caller's mode, and refuses with "Invalid value given for
//! argument `delay`."; PHP's internal functions coerce in the default mode (`"30"` to
//! a float parameter, `123` to a string one) and refuse under `declare(strict_types=1)`
//! with "DelayQueue::push(): Argument #2 ($delay) must be of type float, string given".
//! Each method's handler is wrapped once the classes are registered: the wrapper applies
//! the engine's coercion (`zend_verify_scalar_type_hint`) to each argument whose type
//! does not match its declaration, or throws PHP's TypeError, before the method runs.
//! Null is never coerced: a null for a parameter that does not accept it is refused
//! (PHP 8.1 deprecated that coercion for internal functions and PHP 9 refuses it).
//! A string that is not valid UTF-8, for a parameter declared `string` or `?string`,
//! is refused here too, with `DelayQueueInvalidArgumentException` naming the parameter
//! (ext-php-rs would throw "Invalid value given for argument").
//!
//! The wrapper also keeps Rust panics away from PHP users: ext-php-rs turns a panic in a
//! method into `\Error("Rust panic: …")` after the panic hook printed it (with a
//! backtrace under RUST_BACKTRACE) to stderr. Inside a wrapped method the hook installed
//! by `install_panic_hook` stays silent, and the wrapper throws a `DelayQueueException`
//! naming the method in place of the `\Error`.

use std::cell::{Cell, RefCell};
use std::ffi::{CString, c_char, c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};

use ext_php_rs::ffi;
use ext_php_rs::types::Zval;
use ext_php_rs::zend::{ClassEntry, ExecutorGlobals};

use crate::{errors, values};

unsafe extern "C" {
    fn zend_verify_scalar_type_hint(type_mask: u32, arg: *mut ffi::zval, strict: bool, is_internal_arg: bool) -> bool;
    fn zend_argument_type_error(arg_num: u32, format: *const c_char, ...);
    fn zend_argument_error(error_ce: *mut ffi::zend_class_entry, arg_num: u32, format: *const c_char, ...);
    fn zend_get_resource_handle(module_name: *const c_char) -> c_int;
    // ZEND_API, with this signature since PHP 8.1: what `zend_add_parameter_attribute()`
    // (an inline) calls.
    fn zend_add_attribute(
        attributes: *mut *mut ffi::HashTable,
        name: *mut ffi::zend_string,
        argc: u32,
        flags: u32,
        offset: u32,
        lineno: u32,
    ) -> *mut c_void;
}

/// Parameters that hold a secret: `#[\SensitiveParameter]` (PHP 8.2 and later), so that
/// stack traces with arguments show a `SensitiveParameterValue` in their place.
const SENSITIVE: [(&str, &str, u32); 1] = [("DelayQueue", "__construct", 0)];

/// `ZEND_ATTRIBUTE_PERSISTENT`: the attribute of an internal function lives as long as it.
const ATTRIBUTE_PERSISTENT: u32 = 1;

/// After the classes are registered: marks the `SENSITIVE` parameters.
pub(crate) fn mark_sensitive_parameters() {
    if ClassEntry::try_find("SensitiveParameter").is_none() {
        return;
    }
    for (class, method, offset) in SENSITIVE {
        let Some(class) = ClassEntry::try_find(class) else {
            continue;
        };
        let Some(entry) = class.function_table.get(method) else {
            continue;
        };
        // SAFETY: a class's function table holds pointers to its zend_functions.
        let Some(function) = (unsafe { entry.ptr::<ffi::zend_function>() }) else {
            continue;
        };
        // SAFETY: an internal method of ours, owned by the engine for the life of the
        // module, changed before a request calls it; the name is a persistent string
        // that the attribute keeps.
        unsafe {
            if u32::from((*function).type_) != ffi::ZEND_INTERNAL_FUNCTION {
                continue;
            }
            let name = ext_php_rs::types::ZendStr::new("SensitiveParameter", true).into_raw();
            zend_add_attribute(
                &raw mut (*function).common.attributes,
                name.cast(),
                0,
                ATTRIBUTE_PERSISTENT,
                offset + 1,
                0,
            );
        }
    }
}

/// The classes whose methods are wrapped.
const CLASSES: [&str; 4] = [
    "DelayQueue",
    "DelayQueueWorker",
    "DelayQueueMessage",
    "DelayQueueConsumer",
];

const fn may_be(type_: u32) -> u32 {
    1 << type_
}

const MAY_BE_NULL: u32 = may_be(ffi::IS_NULL);
const MAY_BE_SCALAR: u32 = may_be(ffi::IS_FALSE)
    | may_be(ffi::IS_TRUE)
    | may_be(ffi::IS_LONG)
    | may_be(ffi::IS_DOUBLE)
    | may_be(ffi::IS_STRING);
/// The types this module judges; a declaration with any other (callable, iterable)
/// is left to the method.
const MAY_BE_JUDGED: u32 = MAY_BE_NULL | MAY_BE_SCALAR | may_be(ffi::IS_ARRAY) | may_be(ffi::IS_OBJECT);
/// The bits of a type mask that are types (above them: flags and the class name bits).
const MAY_BE_MASK: u32 = (1 << 20) - 1;
/// The low byte of a zval's `type_info` is its type; the bits above are flags.
const TYPE_BYTE: u32 = 0xff;

/// `reserved[]` slot of each wrapped function that keeps its original handler (from
/// `zend_get_resource_handle`, as profilers and opcache get theirs); -1: none, and
/// nothing is wrapped.
static SLOT: AtomicI32 = AtomicI32::new(-1);

/// At module start.
pub(crate) fn reserve_slot() {
    // SAFETY: called during module startup, on the one thread that starts modules.
    let slot = unsafe { zend_get_resource_handle(c"delayq".as_ptr()) };
    SLOT.store(slot, Ordering::SeqCst);
}

/// After the classes are registered (the first request after a module start).
pub(crate) fn wrap_methods() {
    let Ok(slot) = usize::try_from(SLOT.load(Ordering::SeqCst)) else {
        return;
    };
    for name in CLASSES {
        let Some(class) = ClassEntry::try_find(name) else {
            continue;
        };
        for (_, value) in class.function_table.iter() {
            // SAFETY: a class's function table holds pointers to its zend_functions,
            // which the engine owns for the life of the module; no request runs yet,
            // so nothing calls them while the handler changes.
            unsafe {
                let function = value.ptr::<ffi::zend_function>().unwrap_or(std::ptr::null_mut());
                if function.is_null() || u32::from((*function).type_) != ffi::ZEND_INTERNAL_FUNCTION {
                    continue;
                }
                let internal = &mut (*function).internal_function;
                let Some(original) = internal.handler else { continue };
                if original as usize == checked_call as *const () as usize || slot >= internal.reserved.len() {
                    continue;
                }
                internal.reserved[slot] = original as *mut c_void;
                internal.handler = Some(checked_call);
            }
        }
    }
}

/// The wrapper: PHP's argument rules, then the method.
unsafe extern "C" fn checked_call(execute_data: *mut ffi::zend_execute_data, return_value: *mut ffi::zval) {
    // Never -1 here: nothing is wrapped without a slot.
    let Ok(slot) = usize::try_from(SLOT.load(Ordering::Relaxed)) else {
        return;
    };
    // SAFETY: the engine calls a handler with its own frame, whose `func` is the
    // wrapped function; `wrap_methods` put the original handler in this slot.
    unsafe {
        let internal = &(*(*execute_data).func).internal_function;
        let original: unsafe extern "C" fn(*mut ffi::zend_execute_data, *mut ffi::zval) =
            std::mem::transmute(internal.reserved[slot]);
        if arguments_pass(execute_data, internal) {
            // A panic recorded before this call was reported by its own call.
            let _ = PANIC.try_with(|p| p.borrow_mut().take());
            let _ = DEPTH.try_with(|d| d.set(d.get() + 1));
            original(execute_data, return_value);
            let _ = DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
            if let Some(message) = PANIC.try_with(|p| p.borrow_mut().take()).ok().flatten() {
                report_panic(internal, &message);
            }
        }
    }
}

thread_local! {
    /// How many wrapped methods run on this thread (more than one when a worker's
    /// handler calls the queue).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// The last panic inside a wrapped method on this thread, until its wrapper reports it.
    static PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// At module start: a panic hook that is silent inside the wrapped methods (the
/// wrapper reports the panic as an exception) and leaves every other panic (the core's
/// threads) to the hook it replaces.
pub(crate) fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if DEPTH.try_with(Cell::get).unwrap_or(0) == 0 {
                return previous(info);
            }
            let payload = info.payload();
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            let message = match info.location() {
                Some(at) => {
                    let file = at.file().rsplit('/').next().unwrap_or_default();
                    format!("{message} ({file}:{})", at.line())
                }
                None => message,
            };
            let _ = PANIC.try_with(|p| *p.borrow_mut() = Some(message));
        }));
    });
}

/// At each request start: a bailout (exit(), a fatal error) in a wrapped method jumps
/// over its wrapper's bookkeeping.
pub(crate) fn request_started() {
    let _ = DEPTH.try_with(|d| d.set(0));
    let _ = PANIC.try_with(|p| p.borrow_mut().take());
}

/// Replaces the `\Error("Rust panic: …")` that ext-php-rs threw for a panic in
/// `internal` with a `DelayQueueException`.
fn report_panic(internal: &ffi::zend_internal_function, message: &str) {
    if ExecutorGlobals::pending_exception_class().as_deref() != Some("Error") {
        return;
    }
    let Some(mut thrown) = ExecutorGlobals::take_exception() else {
        return;
    };
    let from_panic = thrown
        .try_call_method("getMessage", vec![])
        .ok()
        .and_then(|m| m.str().map(|m| m.starts_with("Rust panic: ")))
        .unwrap_or(false);
    if !from_panic {
        // Not the panic's: thrown again as it was.
        let mut again = Zval::new();
        again.set_object(&mut thrown);
        let _ = ext_php_rs::exception::throw_object(again);
        return;
    }
    drop(thrown);
    errors::internal(format!(
        "{}(): internal error in the delayq extension, please report it: {message}",
        method_name(internal)
    ))
    .throw();
}

/// `Class::method` for messages.
fn method_name(internal: &ffi::zend_internal_function) -> String {
    // SAFETY: a registered function's name and class are zend_strings the engine owns
    // for the life of the module.
    unsafe {
        let method = zend_string_lossy(internal.function_name);
        if internal.scope.is_null() {
            return method;
        }
        format!("{}::{method}", zend_string_lossy((*internal.scope).name))
    }
}

/// # Safety
/// `s` is null or a live zend_string.
unsafe fn zend_string_lossy(s: *const ffi::zend_string) -> String {
    if s.is_null() {
        return String::new();
    }
    // SAFETY: per the contract; a zend_string's `val` holds `len` bytes.
    let bytes = unsafe { std::slice::from_raw_parts((*s).val.as_ptr().cast::<u8>(), (*s).len) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// Coerces the passed arguments to their declared types where PHP would; false (with a
/// TypeError thrown) for one that PHP would refuse.
///
/// # Safety
/// `execute_data` is the frame of a call to `internal`.
unsafe fn arguments_pass(execute_data: *mut ffi::zend_execute_data, internal: &ffi::zend_internal_function) -> bool {
    // SAFETY: per the contract; the arguments follow the frame's header in the VM stack
    // (ZEND_CALL_ARG), as many as `This.u2.num_args`.
    unsafe {
        let passed = (*execute_data).This.u2.num_args;
        let declared = internal.num_args.min(passed);
        if declared == 0 || internal.arg_info.is_null() {
            return true;
        }
        let strict = caller_is_strict(execute_data);
        let first = execute_data.cast::<ffi::zval>().add(frame_slots());
        for i in 0..declared {
            let info = &*internal.arg_info.add(i as usize);
            let arg = first.add(i as usize);
            if !argument_passes(i + 1, info.type_, arg, strict) || !utf8_passes(i + 1, info.type_, arg) {
                return false;
            }
        }
        true
    }
}

/// # Safety
/// `arg` is a live argument of the current call.
unsafe fn argument_passes(number: u32, declared: ffi::zend_type, arg: *mut ffi::zval, strict: bool) -> bool {
    let mask = declared.type_mask & MAY_BE_MASK;
    let has_class = declared.type_mask & ffi::_ZEND_TYPE_NAME_BIT != 0;
    // SAFETY: per the contract.
    let type_ = unsafe { (*arg).u1.type_info } & TYPE_BYTE;
    if type_ == ffi::IS_UNDEF || type_ == ffi::IS_REFERENCE || mask & !MAY_BE_JUDGED != 0 {
        return true;
    }
    if mask & may_be(type_) != 0 || (type_ == ffi::IS_OBJECT && has_class) {
        // An object against a class type: the method checks what it is.
        return true;
    }
    if type_ != ffi::IS_NULL && may_be(type_) & MAY_BE_SCALAR != 0 && mask & MAY_BE_SCALAR != 0 {
        // SAFETY: the engine's own coercion, on the argument in place.
        if unsafe { zend_verify_scalar_type_hint(mask, arg, strict, true) } {
            return true;
        }
        if ExecutorGlobals::has_exception() {
            return false;
        }
    }
    // SAFETY: per the contract.
    let given = values::type_name(unsafe { &*arg.cast::<Zval>() });
    let message = format!("must be of type {}, {given} given", type_text(declared));
    if let Ok(message) = CString::new(message) {
        // SAFETY: a "%s" format with one C string; the engine names the method and the
        // parameter from the current frame.
        unsafe { zend_argument_type_error(number, c"%s".as_ptr(), message.as_ptr()) };
    }
    false
}

/// False (with `DelayQueueInvalidArgumentException` thrown) for a string that is not
/// valid UTF-8 given to a parameter declared `string` or `?string`. Parameters of wider
/// types (a payload, a schedule) are checked where they are read, with the path of the
/// culprit.
///
/// # Safety
/// `arg` is a live argument of the current call.
unsafe fn utf8_passes(number: u32, declared: ffi::zend_type, arg: *mut ffi::zval) -> bool {
    let mask = declared.type_mask & MAY_BE_MASK;
    let has_class = declared.type_mask & ffi::_ZEND_TYPE_NAME_BIT != 0;
    if has_class || mask & MAY_BE_STRING == 0 || mask & !(MAY_BE_STRING | MAY_BE_NULL) != 0 {
        return true;
    }
    // SAFETY: per the contract.
    let Some(text) = (unsafe { &*arg.cast::<Zval>() }).zend_str() else {
        return true;
    };
    let Err(e) = values::utf8(text.as_bytes()) else {
        return true;
    };
    let message = format!("is not valid UTF-8 (byte {}): \"{}\"", e.at, e.shown);
    if let Ok(message) = CString::new(message) {
        let class = std::ptr::from_ref(errors::invalid_class()).cast_mut();
        // SAFETY: a "%s" format with one C string; the engine names the method and the
        // parameter from the current frame ("DelayQueue::get(): Argument #1 ($id) …").
        unsafe { zend_argument_error(class, number, c"%s".as_ptr(), message.as_ptr()) };
    }
    false
}

/// A declared type as PHP writes it: the class first, then the builtin types in the
/// engine's order (zend_type_to_string), "?" or "|null" for nullable.
fn type_text(declared: ffi::zend_type) -> String {
    let mask = declared.type_mask & MAY_BE_MASK;
    let mut parts: Vec<String> = Vec::new();
    if declared.type_mask & ffi::_ZEND_TYPE_NAME_BIT != 0 && !declared.ptr.is_null() {
        // SAFETY: with the name bit, `ptr` is the class name, which the engine made a
        // zend_string when it registered the class.
        let name = unsafe { &*declared.ptr.cast::<ffi::zend_string>() };
        // SAFETY: a zend_string's `val` holds `len` bytes.
        let bytes = unsafe { std::slice::from_raw_parts(name.val.as_ptr().cast::<u8>(), name.len) };
        parts.push(String::from_utf8_lossy(bytes).into_owned());
    }
    let bool_bits = may_be(ffi::IS_FALSE) | may_be(ffi::IS_TRUE);
    for (bits, text) in [
        (may_be(ffi::IS_OBJECT), "object"),
        (may_be(ffi::IS_ARRAY), "array"),
        (may_be(ffi::IS_STRING), "string"),
        (may_be(ffi::IS_LONG), "int"),
        (may_be(ffi::IS_DOUBLE), "float"),
        (bool_bits, "bool"),
    ] {
        if mask & bits == bits {
            parts.push(text.to_owned());
        }
    }
    if mask & bool_bits == may_be(ffi::IS_FALSE) {
        parts.push("false".to_owned());
    } else if mask & bool_bits == may_be(ffi::IS_TRUE) {
        parts.push("true".to_owned());
    }
    let text = parts.join("|");
    match (mask & MAY_BE_NULL != 0, parts.len()) {
        (false, _) => text,
        (true, 1) => format!("?{text}"),
        (true, _) => format!("{text}|null"),
    }
}

/// # Safety
/// `execute_data` is a live frame.
unsafe fn caller_is_strict(execute_data: *mut ffi::zend_execute_data) -> bool {
    // SAFETY: frames and functions outlive the call (ZEND_ARG_USES_STRICT_TYPES).
    unsafe {
        if execute_data.is_null() {
            return true;
        }
        let caller = (*execute_data).prev_execute_data;
        !caller.is_null()
            && !(*caller).func.is_null()
            && (*(*caller).func).common.fn_flags & ffi::ZEND_ACC_STRICT_TYPES != 0
    }
}

/// Types that an options array's value may be coerced to.
pub(crate) const MAY_BE_STRING: u32 = may_be(ffi::IS_STRING);
pub(crate) const MAY_BE_LONG: u32 = may_be(ffi::IS_LONG);
pub(crate) const MAY_BE_NUMBER: u32 = may_be(ffi::IS_LONG) | may_be(ffi::IS_DOUBLE);

/// An options array's value as the running method's caller would have passed it to a
/// parameter of type `mask` (a string, an int, a number): the converted copy, or None
/// where PHP would refuse it (strict_types, a non-numeric string, null, an array). The
/// same rules as for the arguments, so that `['id' => $orderId]` with an int id, or
/// `['processes' => getenv('WORKERS')]`, works wherever `push($p, '30')` does.
pub(crate) fn coerced(value: &Zval, mask: u32) -> Option<Zval> {
    if !(value.is_long() || value.is_double() || value.is_string() || value.is_bool()) {
        return None;
    }
    // SAFETY: a method runs inside its own frame, the current one.
    let strict = unsafe { caller_is_strict(ExecutorGlobals::get().current_execute_data) };
    let mut copy = value.shallow_clone();
    // SAFETY: the engine's coercion, on a copy this function owns.
    let passes = unsafe { zend_verify_scalar_type_hint(mask, &raw mut copy, strict, true) };
    (passes && !ExecutorGlobals::has_exception()).then_some(copy)
}

/// ZEND_CALL_FRAME_SLOT: the frame's header, in zvals.
const fn frame_slots() -> usize {
    let zval = size_of::<ffi::zval>();
    size_of::<ffi::zend_execute_data>().div_ceil(zval)
}
