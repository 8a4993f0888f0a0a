//! Log records for hosts whose logging may run only on their own thread.
//!
//! The core logs through the `log` facade from its pool threads (a poison message
//! dead-lettered, a handler past its timeout, a lease lost, an evicting Redis). A PHP
//! process may touch PHP only on its PHP thread, and Python's `logging` needs the GIL,
//! which a pool thread must never wait for (the Python thread may hold it while it
//! waits for the pool: a deadlock). So a binding installs this logger, which only
//! queues records, and hands them to its host's logging at its own safe points (after
//! every call into the core and between deliveries).
//!
//! Logging never blocks a pool thread for long and never grows without bound: past
//! [`CAPACITY`] records waiting, new ones are counted and dropped, and the next
//! [`take_logs`] reports how many.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

/// Records kept between two reads.
pub(crate) const CAPACITY: usize = 1000;

/// One log record, as the host's logging receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    /// Its severity.
    pub level: log::Level,
    /// The module that logged it, in `log`'s form (`delayq::worker`).
    pub target: String,
    /// The text, which names the queue (`delayq[orders]: ...`).
    pub message: String,
}

struct Queued {
    /// Records of a parent process are not the forked child's to report.
    generation: u64,
    record: LogRecord,
}

struct Buffered {
    records: Mutex<VecDeque<Queued>>,
    /// Lets the hot path (a read after every delivery) skip the lock.
    pending: AtomicBool,
    dropped: AtomicU64,
}

static BUFFER: Buffered = Buffered {
    records: Mutex::new(VecDeque::new()),
    pending: AtomicBool::new(false),
    dropped: AtomicU64::new(0),
};

/// `text` with control characters (tab kept) and bidirectional overrides written as
/// escapes (`\x1b`, `\u202e`): a log line holds texts that handlers and payloads
/// chose (an exception's message), which must not drive the terminal, forge a line of
/// their own, or reorder what is shown.
pub(crate) fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    use std::fmt::Write;
    let shown = |c: char| c == '\t' || !(c.is_control() || is_bidi_control(c));
    if text.chars().all(shown) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if shown(c) {
            out.push(c);
        } else if u32::from(c) < 0x100 {
            let _ = write!(out, "\\x{:02x}", u32::from(c));
        } else {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        }
    }
    std::borrow::Cow::Owned(out)
}

fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A lock held by a thread that a `fork()` left behind is never released in the
/// child: a record is then dropped (and counted), not waited for.
const LOCK_WAIT: Duration = Duration::from_millis(20);

impl log::Log for Buffered {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let queued = Queued {
            generation: crate::fork::generation(),
            record: LogRecord {
                level: record.level(),
                target: record.target().to_owned(),
                message: printable(&record.args().to_string()).into_owned(),
            },
        };
        match self.records.try_lock_for(LOCK_WAIT) {
            Some(mut records) if records.len() < CAPACITY => {
                records.push_back(queued);
                self.pending.store(true, Ordering::Release);
            }
            _ => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                self.pending.store(true, Ordering::Release);
            }
        }
    }

    fn flush(&self) {}
}

/// Route the `log` facade into the buffer that [`take_logs`] reads, at `level`.
/// Returns false when the process has another logger already (then records go there,
/// and `take_logs` stays empty).
pub fn capture_logs(level: log::LevelFilter) -> bool {
    if log::set_logger(&BUFFER).is_err() {
        return false;
    }
    log::set_max_level(level);
    true
}

/// Change the level of the records that are kept (a host's level setting changed).
pub fn set_log_level(level: log::LevelFilter) {
    log::set_max_level(level);
}

/// The records logged since the last call, oldest first; a note of how many were
/// dropped comes last. Cheap when there are none.
pub fn take_logs() -> Vec<LogRecord> {
    // A plain load first: the usual answer is "none", and a load leaves the cache
    // line shared instead of taking it for a write.
    if !BUFFER.pending.load(Ordering::Acquire) || !BUFFER.pending.swap(false, Ordering::AcqRel) {
        return Vec::new();
    }
    let generation = crate::fork::generation();
    let mut out: Vec<LogRecord> = match BUFFER.records.try_lock_for(LOCK_WAIT) {
        Some(mut records) => records
            .drain(..)
            .filter(|q| q.generation == generation)
            .map(|q| q.record)
            .collect(),
        None => Vec::new(),
    };
    let dropped = BUFFER.dropped.swap(0, Ordering::Relaxed);
    if dropped > 0 {
        out.push(LogRecord {
            level: log::Level::Warn,
            target: module_path!().to_owned(),
            message: format!("{dropped} log records were dropped: more than {CAPACITY} were logged between two reads"),
        });
    }
    out
}

/// A record's target as a dotted logger name under `delayq`, as Python's `logging`
/// names loggers: `delayq::worker` is `delayq.worker`, and the crates below the core
/// (`rustls::client`) come under it too (`delayq.rustls.client`), so that one
/// `delayq` logger configures them all. The files of the pool and of the queue log
/// under the names users configure, `delayq.worker` and `delayq.queue`, whichever
/// file within them logs.
pub fn logger_name(target: &str) -> String {
    let dotted = target.replace("::", ".");
    for area in KEPT_NAMES {
        if dotted.strip_prefix(area).is_some_and(|rest| rest.starts_with('.')) {
            return (*area).to_owned();
        }
    }
    if dotted == "delayq" || dotted.starts_with("delayq.") {
        dotted
    } else {
        format!("delayq.{dotted}")
    }
}

/// Logger names kept whole (see `logger_name`).
const KEPT_NAMES: &[&str] = &["delayq.worker", "delayq.queue"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_and_the_queue_log_under_one_name_each() {
        assert_eq!(logger_name("delayq::worker::fetch"), "delayq.worker");
        assert_eq!(logger_name("delayq::worker"), "delayq.worker");
        assert_eq!(logger_name("delayq::queue::push"), "delayq.queue");
        assert_eq!(logger_name("delayq::workers"), "delayq.workers");
        assert_eq!(logger_name("delayq::host::supervisor"), "delayq.host.supervisor");
        assert_eq!(logger_name("rustls::client"), "delayq.rustls.client");
    }

    #[test]
    fn controls_and_bidi_overrides_are_escaped_and_tabs_kept() {
        assert_eq!(super::printable("plain\ttext é"), "plain\ttext é");
        assert_eq!(
            super::printable("\u{1b}[31mred\nforged\r\u{9b}\u{202e}x\u{7f}"),
            "\\x1b[31mred\\x0aforged\\x0d\\x9b\\u202ex\\x7f"
        );
    }

    // One test: the logger is global to the test binary.
    #[test]
    fn records_from_any_thread_are_kept_in_order_and_an_overflow_is_reported() {
        assert!(capture_logs(log::LevelFilter::Info));
        assert!(take_logs().is_empty());
        std::thread::spawn(|| {
            log::warn!("first");
            log::debug!("below the level");
            log::error!(target: "rustls::client", "second");
        })
        .join()
        .expect("logging thread");
        let got = take_logs();
        let seen: Vec<(log::Level, &str, &str)> = got
            .iter()
            .map(|r| (r.level, r.target.as_str(), r.message.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                (log::Level::Warn, "delayq::logs::tests", "first"),
                (log::Level::Error, "rustls::client", "second"),
            ]
        );
        assert!(take_logs().is_empty(), "a record is handed over once");

        set_log_level(log::LevelFilter::Debug);
        log::debug!("now kept");
        assert_eq!(take_logs().len(), 1);

        for i in 0..CAPACITY + 5 {
            log::info!("flood {i}");
        }
        let got = take_logs();
        assert_eq!(got.len(), CAPACITY + 1);
        assert_eq!(got[0].message, "flood 0");
        assert_eq!(got[CAPACITY - 1].message, format!("flood {}", CAPACITY - 1));
        let note = &got[CAPACITY];
        assert_eq!(note.level, log::Level::Warn);
        assert!(
            note.message.starts_with("5 log records were dropped"),
            "{}",
            note.message
        );
        log::info!("after the flood");
        assert_eq!(take_logs().len(), 1, "room again once read");
    }

    #[test]
    fn logger_names_put_every_crate_under_delayq() {
        assert_eq!(logger_name("delayq"), "delayq");
        assert_eq!(logger_name("delayq::worker"), "delayq.worker");
        assert_eq!(logger_name("rustls::client::hs"), "delayq.rustls.client.hs");
        assert_eq!(logger_name("delayqx"), "delayq.delayqx");
    }
}
