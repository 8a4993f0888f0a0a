//! The core's log records, written with PHP's `error_log()` on the PHP thread: after
//! every call into the core and between deliveries (pool threads never touch PHP; see
//! the core's `logs`). `error_log()` follows the `error_log` ini setting: stderr in
//! the CLI when unset (the journal under systemd), PHP-FPM's log, a file or syslog.
//! It bypasses `set_error_handler()`, so a framework that turns warnings into
//! exceptions cannot break a worker over a log line.
//!
//! `delayq.log_level` (ini, any scope: php.ini, `-d`, `ini_set()`) picks what is
//! written: off, error, warning (default), info or debug. It is read again when a
//! queue is made and when a worker starts.

use ext_php_rs::flags::IniEntryPermission;
use ext_php_rs::types::ZendCallable;
use ext_php_rs::zend::{IniEntryDef, IniEntryDefs};

pub(crate) const LEVEL_INI: &str = "delayq.log_level";
const DEFAULT: log::LevelFilter = log::LevelFilter::Warn;

static INI: IniEntryDefs<2> = IniEntryDefs::new([
    IniEntryDef::new(c"delayq.log_level", c"warning", IniEntryPermission::All),
    IniEntryDef::end(),
]);

/// From the module's startup: before any thread exists.
pub(crate) fn install(module_number: i32) {
    IniEntryDef::register(INI.as_slice(), module_number);
    delayq::capture_logs(DEFAULT);
}

fn parse_level(value: &str) -> Option<log::LevelFilter> {
    Some(match value.trim().to_ascii_lowercase().as_str() {
        "off" | "none" | "0" => log::LevelFilter::Off,
        "error" => log::LevelFilter::Error,
        "warning" | "warn" => log::LevelFilter::Warn,
        "info" => log::LevelFilter::Info,
        "debug" => log::LevelFilter::Debug,
        "trace" => log::LevelFilter::Trace,
        _ => return None,
    })
}

fn ini_value() -> Option<String> {
    ZendCallable::try_from_name("ini_get")
        .ok()
        .and_then(|f| f.try_call(vec![&LEVEL_INI]).ok())
        .and_then(|z| z.string())
}

/// The setting as written, for `php --ri delayq`.
pub(crate) fn configured_level() -> String {
    ini_value().unwrap_or_default()
}

/// Apply the current `delayq.log_level`.
pub(crate) fn sync_level() {
    let Some(value) = ini_value() else { return };
    match parse_level(&value) {
        Some(level) => delayq::set_log_level(level),
        None => {
            delayq::set_log_level(DEFAULT);
            write_line(&format!(
                "[delayq warning] {LEVEL_INI} = {value:?} is not a level (off, error, warning, info, debug); \
                 using warning"
            ));
        }
    }
}

fn level_name(level: log::Level) -> &'static str {
    match level {
        log::Level::Error => "error",
        log::Level::Warn => "warning",
        log::Level::Info => "info",
        log::Level::Debug => "debug",
        log::Level::Trace => "trace",
    }
}

fn write_line(line: &str) {
    if let Ok(error_log) = ZendCallable::try_from_name("error_log") {
        let _ = error_log.try_call(vec![&line]);
    }
}

/// Write the waiting records. Never throws.
pub(crate) fn flush() {
    for r in delayq::take_logs() {
        write_line(&format!("[delayq {}] {}", level_name(r.level), r.message));
    }
}
