//! The core's log records, handed to Python's `logging` (logger `delayq` and its
//! children) on a thread that holds the GIL: after every call into the core and
//! between deliveries. Pool threads never take the GIL to log (see the core's `logs`).

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

static LOGGING: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn logging(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    LOGGING
        .get_or_try_init(py, || Ok(py.import("logging")?.unbind()))
        .map(|m| m.bind(py))
}

fn level_filter(python_level: i64) -> log::LevelFilter {
    match python_level {
        ..=9 => log::LevelFilter::Trace,
        10..=19 => log::LevelFilter::Debug,
        20..=29 => log::LevelFilter::Info,
        30..=39 => log::LevelFilter::Warn,
        40..=50 => log::LevelFilter::Error,
        _ => log::LevelFilter::Off,
    }
}

fn python_level(level: log::Level) -> i64 {
    match level {
        log::Level::Error => 40,
        log::Level::Warn => 30,
        log::Level::Info => 20,
        log::Level::Debug => 10,
        log::Level::Trace => 5,
    }
}

/// Keep the records that the `delayq` logger would pass. Read again whenever a queue
/// is made or a worker starts, so `logging` configured before either applies.
pub(crate) fn sync_level(py: Python<'_>) {
    let level = logging(py)
        .and_then(|m| {
            m.call_method1("getLogger", ("delayq",))?
                .call_method0("getEffectiveLevel")
        })
        .and_then(|l| l.extract::<i64>());
    if let Ok(level) = level {
        delayq::set_log_level(level_filter(level));
    }
}

pub(crate) fn install(py: Python<'_>) {
    delayq::capture_logs(log::LevelFilter::Warn);
    sync_level(py);
}

/// Hand the waiting records to `logging`. A handler that raises is `logging`'s to
/// report (it prints and carries on); this never raises.
pub(crate) fn flush(py: Python<'_>) {
    let records = delayq::take_logs();
    if records.is_empty() {
        return;
    }
    let Ok(logging) = logging(py) else { return };
    for r in records {
        let _ = logging
            .call_method1("getLogger", (delayq::logger_name(&r.target),))
            .and_then(|logger| logger.call_method1("log", (python_level(r.level), "%s", r.message)));
    }
}
