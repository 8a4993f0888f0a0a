//! `processes` mode, PHP's part of it: fork a worker process for the core's supervisor
//! (`delayq::host::supervise`, which respawns, backs off, gives up, kills hung handlers,
//! scales and sums), run the worker in the child, and pass PHP's signals and `stop()`
//! on. No decision about processes or messages is made here.

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;

use delayq::host::{self, Asked, Report, Slot, SlotTable, StopReason};
use ext_php_rs::boxed::ZBox;
use ext_php_rs::exception::PhpException;
use ext_php_rs::types::ZendHashTable;
use ext_php_rs::zend::ExecutorGlobals;

use crate::callable::Callee;
use crate::errors;
use crate::signals;
use crate::summary::{RunSummary, summary_array};
use crate::worker::PhpWorker;

type PhpResult<T> = Result<T, PhpException>;

/// In a child that a second signal ends at once (from its watcher thread, the handler
/// still running): the counts so far, so that the pool's summary keeps them.
pub(crate) fn report_ended_at_once(mut report: File, counts: delayq::Summary) {
    let done = Report::Done {
        counts,
        stopped_by: Some(StopReason::Signal),
    };
    let _ = report.write_all(done.encode().as_bytes());
}

/// In the child: run, report, and leave without running the parent's script further.
fn child_main(worker: &PhpWorker, handler: &Callee, slot: &Slot, mut report: File, parent: libc::pid_t) -> ! {
    signals::clear();
    host::stop_with_supervisor(parent);
    let describe_pending = |fallback: String| {
        ExecutorGlobals::take_exception()
            .and_then(|ex| {
                let class = ex.get_class_name().ok()?;
                let msg = ex.try_call_method("getMessage", vec![]).ok()?.string()?;
                Some(format!("{class}: {msg}"))
            })
            .unwrap_or(fallback)
    };
    let outcome = match worker.call_on_start() {
        Err(e) => Report::hook_failed("on_start", &describe_pending(format!("{e:?}"))),
        Ok(()) => match worker.consume(handler, Some(slot), report.try_clone().ok()) {
            // exit() is still unwinding: no PHP code can run (on_stop would fail, and
            // touching the pending exit crashes the engine). The report says why.
            Ok(s) if s.ended == Some(StopReason::Exit) => Report::Done {
                counts: s.core,
                stopped_by: s.ended,
            },
            Ok(s) => match worker.call_on_stop() {
                Ok(()) => Report::Done {
                    counts: s.core,
                    stopped_by: s.ended,
                },
                Err(e) => Report::Fatal(format!("on_stop failed: {}", describe_pending(format!("{e:?}")))),
            },
            Err(e) => Report::Fatal(describe_pending(format!("{e:?}"))),
        },
    };
    let _ = report.write_all(outcome.encode().as_bytes());
    drop(report);
    // SAFETY: ends the child without PHP's shutdown, which belongs to the parent's
    // script (its output buffers, shutdown functions and connections).
    unsafe { libc::_exit(0) }
}

struct PhpSpawner<'a> {
    worker: &'a PhpWorker,
    handler: &'a Callee<'a>,
    dispatch: Option<Callee<'static>>,
}

impl host::Spawner for PhpSpawner<'_> {
    fn spawn(&mut self, index: usize, slots: &SlotTable, report: OwnedFd) -> std::io::Result<libc::pid_t> {
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: no Rust thread exists in this process (the pool's threads start in
        // the children), so the child inherits a consistent state.
        match unsafe { libc::fork() } {
            -1 => Err(std::io::Error::last_os_error()),
            0 => child_main(
                self.worker,
                self.handler,
                &slots.slot(index),
                File::from(report),
                parent,
            ),
            pid => Ok(pid),
        }
    }

    fn poll(&mut self) -> Asked {
        crate::logs::flush();
        if let Some(f) = &self.dispatch {
            // Lets the script's own pcntl_signal() handlers run (they may call stop()).
            let _ = f.call([]);
        }
        let stop = if signals::take() {
            Some(StopReason::Signal)
        } else if self.worker.stop_requested() {
            Some(StopReason::Stop)
        } else {
            None
        };
        Asked {
            stop,
            urgent: signals::urgent().is_some(),
        }
    }
}

pub(crate) fn supervise(worker: &PhpWorker, handler: &Callee) -> PhpResult<ZBox<ZendHashTable>> {
    let settings = worker.settings();
    // Before any fork: processes forked later belong to this start (a restart request
    // made after it stops them too), and a user without access fails here, once.
    worker.mark_start()?;
    let slots = SlotTable::anonymous(settings.processes)
        .map_err(|e| errors::invalid(format!("cannot map shared memory: {e}")))?;
    let opts = host::SupervisorOptions {
        processes: settings.processes,
        timeout: settings.pool.timeout,
        scaler: settings.scaler.clone(),
        queues: worker.queues().cloned().collect(),
        respawn: host::RespawnPolicy::default(),
    };
    let mut spawner = PhpSpawner {
        worker,
        handler,
        dispatch: Callee::by_name("pcntl_signal_dispatch"),
    };
    let pool = host::supervise(&mut spawner, opts, slots);
    crate::logs::flush();
    if let Some(msg) = &pool.fatal {
        return Err(errors::worker_failed(format!("a worker process failed: {msg}")));
    }
    if let Some(msg) = &pool.gave_up {
        return Err(errors::worker_failed(msg.clone()));
    }
    summary_array(
        &RunSummary {
            core: pool.counts.clone(),
            ended: pool.stopped_by,
        },
        Some(&pool),
    )
}
