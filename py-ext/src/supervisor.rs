//! `delayq worker --processes N` (or `--timeout`), Python's part of it: start a worker
//! process (this module's command, exec'd: no thread or connection of the supervisor
//! is copied into it) for the core's supervisor (`delayq::host::supervise`, which
//! respawns, backs off, gives up, kills hung handlers, scales and sums), and pass
//! Python's signals on (a worker process's slot is `slot.rs`'s). No decision about
//! processes or messages is made here.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use delayq::host::{self, Asked, SlotTable, StopReason, StopSignals};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{self, OrRaise};
use crate::queue::PyQueue;
use crate::scale::PyScaler;

/// The core's supervisor over copies of a command.
#[pyclass(name = "_Supervisor", module = "delayq._delayq", frozen)]
pub(crate) struct PySupervisor {
    command: Vec<String>,
    opts: Mutex<Option<host::SupervisorOptions>>,
    signals: Mutex<StopSignals>,
}

struct PySpawner<'a> {
    command: &'a [String],
    signals: &'a Mutex<StopSignals>,
}

impl host::Spawner for PySpawner<'_> {
    fn spawn(&mut self, index: usize, slots: &SlotTable, report: OwnedFd) -> std::io::Result<libc::pid_t> {
        let (program, args) = self
            .command
            .split_first()
            .ok_or_else(|| std::io::Error::other("no command"))?;
        let fd = report.as_raw_fd();
        let path = slots
            .path()
            .ok_or_else(|| std::io::Error::other("slots without a file"))?;
        let mut command = Command::new(program);
        command
            .args(args)
            .arg("--report-fd")
            .arg(fd.to_string())
            .arg("--slot-file")
            .arg(path)
            .arg("--slot-index")
            .arg(index.to_string());
        // SAFETY: between fork and exec only fcntl, which is async-signal-safe. The
        // report pipe is close-on-exec (no other process may hold it): this process
        // keeps its own end open.
        unsafe {
            command.pre_exec(move || {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn()?;
        drop(report);
        // The core reaps it (waitpid); the handle is only dropped.
        libc::pid_t::try_from(child.id()).map_err(std::io::Error::other)
    }

    fn poll(&mut self) -> Asked {
        Python::attach(|py| {
            // Runs the Python signal handlers, which call `signal()`.
            if let Err(e) = py.check_signals() {
                log::warn!("a signal handler raised {e}");
                self.signals
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .received(Instant::now());
            }
            crate::logs::flush(py);
        });
        let signals = self.signals.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Asked {
            stop: signals.stopping().then_some(StopReason::Signal),
            urgent: signals.urgent(),
        }
    }
}

#[pymethods]
impl PySupervisor {
    #[new]
    #[pyo3(signature = (command, processes, timeout, scaler, queues))]
    fn new(
        py: Python<'_>,
        command: Vec<String>,
        processes: usize,
        timeout: Option<f64>,
        scaler: &PyScaler,
        queues: Vec<PyRef<'_, PyQueue>>,
    ) -> PyResult<Self> {
        if command.is_empty() {
            return Err(errors::invalid(py, "the worker command is empty"));
        }
        let timeout = timeout
            .map(|t| delayq::delay_from_secs("timeout", t))
            .transpose()
            .or_raise(py)?;
        Ok(Self {
            command,
            opts: Mutex::new(Some(host::SupervisorOptions {
                processes,
                timeout,
                scaler: scaler.scaler.clone(),
                queues: queues.iter().map(|q| q.queue.clone()).collect(),
                respawn: host::RespawnPolicy::default(),
            })),
            signals: Mutex::new(StopSignals::default()),
        })
    }

    /// Whether a run of `processes` with `timeout` runs under a supervisor.
    #[staticmethod]
    #[pyo3(signature = (processes, timeout))]
    fn needed(processes: usize, timeout: Option<f64>) -> bool {
        host::is_supervised(processes, timeout.map(|_| Duration::ZERO))
    }

    /// SIGTERM or SIGINT came (from the Python handler): the pool stops gracefully, and
    /// at once on a second one.
    fn signal(&self, signum: i32) {
        let mut signals = self.signals.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if signals.received(Instant::now()) {
            let name = if signum == libc::SIGINT { "SIGINT" } else { "SIGTERM" };
            log::warn!("{name} again: stopping every worker process now");
        }
    }

    /// Run the pool until it stops; returns its summary and whether it ran as asked
    /// (False: it gave up on processes that kept dying, or one could not run).
    fn run<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyDict>, bool)> {
        crate::logs::sync_level(py);
        let opts = self
            .opts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .ok_or_else(|| errors::invalid(py, "this supervisor ran already"))?;
        let slots = SlotTable::in_file(opts.processes)
            .map_err(|e| errors::invalid(py, format!("cannot make the slot file: {e}")))?;
        let mut spawner = PySpawner {
            command: &self.command,
            signals: &self.signals,
        };
        let pool = py.detach(|| host::supervise(&mut spawner, opts, slots));
        crate::logs::flush(py);
        if let Some(fatal) = &pool.fatal {
            log::error!("a worker process failed: {fatal}");
            crate::logs::flush(py);
        }
        let d = crate::records::dict(py, delayq::records::summary(&pool.counts, pool.stopped_by, Some(&pool)))?;
        Ok((d, pool.gave_up.is_none() && pool.fatal.is_none()))
    }
}

/// The report of a supervised process whose run ended (its summary: counts and
/// `stopped_by`), as the core encodes it for the supervisor.
#[pyfunction]
#[pyo3(name = "_report_done")]
pub(crate) fn report_done(py: Python<'_>, summary: &Bound<'_, PyDict>) -> PyResult<String> {
    let mut counts = Vec::new();
    let mut stopped_by = None;
    for (key, value) in summary.iter() {
        let key: String = key.extract()?;
        if key == "stopped_by" {
            let text: Option<String> = value.extract()?;
            stopped_by = text
                .map(|t| {
                    StopReason::parse(&t).ok_or_else(|| errors::invalid(py, format!("no stop reason is named {t:?}")))
                })
                .transpose()?;
        } else {
            counts.push((key, value.extract::<u64>()?));
        }
    }
    let counts = delayq::Summary::from_counts(counts.iter().map(|(k, n)| (k.as_str(), *n))).or_raise(py)?;
    Ok(host::Report::Done { counts, stopped_by }.encode())
}

/// The report of a supervised process whose `hook` (`on_start`, `on_stop`) raised `what`.
#[pyfunction]
#[pyo3(name = "_report_hook_failed")]
pub(crate) fn report_hook_failed(hook: &str, what: &str) -> String {
    host::Report::hook_failed(hook, what).encode()
}

/// In a worker process: stop gracefully once the supervisor `parent` is gone (see
/// `host::stop_with_supervisor`).
#[pyfunction]
#[pyo3(name = "_stop_with_supervisor")]
pub(crate) fn stop_with_supervisor(parent: i32) {
    host::stop_with_supervisor(parent);
}

/// The stop signals of a run in this process, by the core's rule (`host::StopSignals`):
/// the first stops gracefully, one at least `URGENT_AFTER` later stops at once.
#[pyclass(name = "_StopSignals")]
pub(crate) struct PyStopSignals(Mutex<StopSignals>);

#[pymethods]
impl PyStopSignals {
    #[new]
    fn new() -> Self {
        Self(Mutex::new(StopSignals::default()))
    }

    /// A stop signal came: True when it made the stop urgent (once).
    fn received(&self) -> bool {
        self.0.lock().map(|mut s| s.received(Instant::now())).unwrap_or(false)
    }
}
