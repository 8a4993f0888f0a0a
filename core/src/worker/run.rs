//! `Worker::run`: handlers on the pool's own threads (pure Rust), with panics kept as
//! the failure's trace and forked children ended when their handler returns.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use crate::error::{Error, Result};

use super::{Delivery, Received, Summary, Worker};
use crate::host::{Outcome, settle};

impl Worker {
    /// Run `handler` on `handler_threads` threads of the pool until stopped. A handler
    /// that returns `Err` or panics fails the delivery (retry, then dead letter); a
    /// panic's place and backtrace are kept as the message's `error_trace`. A child
    /// process that a handler forks ends (`_exit`) as soon as the handler returns in
    /// it, with status 0, 1 for `Err` or 101 for a panic; only the parent completes
    /// the delivery.
    pub fn run<F>(&self, handler_threads: usize, handler: F) -> Result<Summary>
    where
        F: Fn(&Delivery) -> std::result::Result<(), String> + Sync,
    {
        if handler_threads == 0 {
            return Err(Error::invalid("handler_threads", "must be at least 1"));
        }
        let consumer = self.start_with(handler_threads)?;
        record_handler_panics();
        std::thread::scope(|s| {
            for _ in 0..handler_threads {
                s.spawn(|| {
                    loop {
                        match consumer.recv_timeout(Duration::from_millis(200)) {
                            Received::Message(d) => {
                                IN_HANDLER.set(true);
                                let result = catch_unwind(AssertUnwindSafe(|| handler(&d)));
                                IN_HANDLER.set(false);
                                if consumer.in_forked_child() {
                                    end_forked_child(&result);
                                }
                                // The same run policy as the bindings' (host::settle).
                                let outcome = match result {
                                    Ok(Ok(())) => Outcome::Returned,
                                    Ok(Err(error)) => Outcome::Raised {
                                        error,
                                        trace: String::new(),
                                        no_retry: false,
                                    },
                                    Err(panic) => Outcome::Raised {
                                        error: format!("handler panicked: {}", panic_text(&panic)),
                                        trace: PANIC_TRACE.take().unwrap_or_default(),
                                        no_retry: false,
                                    },
                                };
                                settle(&consumer, d, outcome, None);
                            }
                            Received::Idle => {}
                            Received::Stopped => break,
                        }
                    }
                });
            }
        });
        Ok(consumer.finish())
    }
}

/// A process that a handler forked came back from it: it ends here, before it could
/// run, wait on or write through the pool it inherited (whose threads stayed in the
/// parent), with 0 for `Ok`, 1 for `Err` and 101 (Rust's) for a panic.
pub(super) fn end_forked_child(result: &std::thread::Result<std::result::Result<(), String>>) -> ! {
    let (status, error) = match result {
        Ok(Ok(())) => (0, None),
        Ok(Err(e)) => (1, Some(e.clone())),
        Err(panic) => (101, Some(format!("handler panicked: {}", panic_text(panic)))),
    };
    if let Some(error) = error {
        // write(2), not eprintln!: a pool thread may have held stderr's lock at the fork.
        let line = format!("delayq: a process forked by a handler ended with an error: {error}\n");
        // SAFETY: writes our own buffer to fd 2.
        unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
    }
    crate::fork::exit_child(status)
}

thread_local! {
    /// Set while this thread runs a handler of `Worker::run`.
    static IN_HANDLER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Where that handler panicked, with the backtrace there (unwinding loses it).
    static PANIC_TRACE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Chains a panic hook, once per process, that keeps the place and backtrace of a
/// handler's panic for its `error_trace`. The previous hook still runs, so what the
/// application's hook does (or the default message on stderr) is unchanged; a hook
/// that the application sets later replaces this one, and panics then keep no trace.
pub(super) fn record_handler_panics() {
    static CHAINED: std::sync::Once = std::sync::Once::new();
    CHAINED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_HANDLER.get() {
                let trace = format!(
                    "{info}\nstack backtrace:\n{}",
                    std::backtrace::Backtrace::force_capture()
                );
                PANIC_TRACE.set(Some(trace));
            }
            previous(info);
        }));
    });
}

pub(super) fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-text panic".to_owned())
}
