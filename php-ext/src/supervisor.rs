//! `processes` mode: fork N handler processes before any thread exists, restart those
//! that die or are recycled (max_jobs, max_memory_mb, max_time), kill those whose handler runs
//! past `timeout`, forward SIGTERM, wait for all, and sum their summaries. With
//! `min_processes`, the core's scaler moves N between it and `processes` as the backlog
//! asks: a process is added, or an idle one stopped gracefully.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ext_php_rs::boxed::ZBox;
use ext_php_rs::exception::PhpException;
use ext_php_rs::types::{ZendCallable, ZendHashTable};
use ext_php_rs::zend::ExecutorGlobals;

use crate::convert::zv;
use crate::errors;
use crate::signals;
use crate::worker::{Ended, PhpWorker, RunSummary, summary_array};

type PhpResult<T> = Result<T, PhpException>;

/// How often an auto-balanced pool reads the backlog (the scaler's cooldown bounds how
/// often it changes).
const LOOK_EVERY: Duration = Duration::from_millis(500);

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// When the handler of one process started (Unix ms), 0 while it is idle. Lives in
/// memory shared between the supervisor and its children.
pub(crate) struct Slot(*const AtomicI64);

impl Slot {
    fn cell(&self) -> &AtomicI64 {
        // SAFETY: points into the shared mapping, which outlives every child and the
        // supervisor's use of it.
        unsafe { &*self.0 }
    }

    pub(crate) fn started(&self) {
        self.cell().store(now_ms(), Ordering::Release);
    }

    pub(crate) fn finished(&self) {
        self.cell().store(0, Ordering::Release);
    }

    fn started_at(&self) -> i64 {
        self.cell().load(Ordering::Acquire)
    }
}

struct SharedSlots {
    base: *mut AtomicI64,
    len: usize,
}

impl SharedSlots {
    fn new(len: usize) -> PhpResult<Self> {
        let bytes = len * std::mem::size_of::<AtomicI64>();
        // SAFETY: an anonymous shared mapping; checked for failure below. Zeroed pages
        // are valid AtomicI64 values.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(errors::invalid(format!(
                "cannot map shared memory: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(Self { base: base.cast(), len })
    }

    fn slot(&self, i: usize) -> Slot {
        assert!(i < self.len);
        // SAFETY: within the mapping.
        Slot(unsafe { self.base.add(i) })
    }
}

impl Drop for SharedSlots {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`.
        unsafe {
            libc::munmap(self.base.cast(), self.len * std::mem::size_of::<AtomicI64>());
        }
    }
}

struct Child {
    pid: libc::pid_t,
    report: File,
    born: Instant,
    /// Killed by the supervisor for running past `timeout` (already reported).
    killed_hung: bool,
}

/// What a child tells its supervisor when it ends.
enum Report {
    Done(RunSummary),
    Fatal(String),
}

fn encode(report: &Report) -> String {
    match report {
        Report::Done(s) => {
            let c = &s.core;
            let counts: Vec<String> = c.counts().iter().map(|(name, n)| format!("{name}={n}")).collect();
            format!("done {} {}\n", counts.join(" "), s.ended.map_or("none", Ended::as_str))
        }
        Report::Fatal(text) => format!("fatal {}\n", text.replace('\n', " ")),
    }
}

fn decode(text: &str) -> Option<Report> {
    let line = text.lines().next()?;
    if let Some(msg) = line.strip_prefix("fatal ") {
        return Some(Report::Fatal(msg.to_owned()));
    }
    // "done name=n ... <ended>"
    let mut parts: Vec<&str> = line.strip_prefix("done ")?.split(' ').collect();
    let ended = parts.pop()?;
    let counts = parts
        .iter()
        .map(|p| {
            let (name, n) = p.split_once('=')?;
            Some((name, n.parse::<u64>().ok()?))
        })
        .collect::<Option<Vec<_>>>()?;
    let core = delayq::Summary::from_counts(counts).ok()?;
    let ended = match ended {
        "stop" => Some(Ended::Stop),
        "signal" => Some(Ended::Signal),
        "max_jobs" => Some(Ended::MaxJobs),
        "max_memory" => Some(Ended::MaxMemory),
        "max_time" => Some(Ended::MaxTime),
        "exit" => Some(Ended::Exit),
        "restart" => Some(Ended::Restart),
        "empty" => Some(Ended::Empty),
        _ => None,
    };
    Some(Report::Done(RunSummary { core, ended }))
}

/// In a child that a second signal ends at once (from its watcher thread, the handler
/// still running): the counts so far, so that the pool's summary keeps them.
pub(crate) fn report_ended_at_once(mut report: File, core: delayq::Summary) {
    let summary = RunSummary {
        core,
        ended: Some(Ended::Signal),
    };
    let _ = report.write_all(encode(&Report::Done(summary)).as_bytes());
}

/// In the child: run, report, and leave without running the parent's script further.
fn child_main(worker: &PhpWorker, handler: &ZendCallable, slot: &Slot, mut report: File, parent: libc::pid_t) -> ! {
    signals::clear();
    // SAFETY: plain syscalls. A child whose supervisor dies gets SIGTERM and stops
    // gracefully instead of running on unsupervised.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
        if libc::getppid() != parent {
            libc::raise(libc::SIGTERM);
        }
    }
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
        Err(e) => Report::Fatal(format!("on_start failed: {}", describe_pending(format!("{e:?}")))),
        Ok(()) => match worker.consume(handler, Some(slot), report.try_clone().ok()) {
            Ok(s) => match worker.call_on_stop() {
                Ok(()) => Report::Done(s),
                Err(e) => Report::Fatal(format!("on_stop failed: {}", describe_pending(format!("{e:?}")))),
            },
            Err(e) => Report::Fatal(describe_pending(format!("{e:?}"))),
        },
    };
    let _ = report.write_all(encode(&outcome).as_bytes());
    drop(report);
    // SAFETY: ends the child without PHP's shutdown, which belongs to the parent's
    // script (its output buffers, shutdown functions and connections).
    unsafe { libc::_exit(0) }
}

fn spawn(worker: &PhpWorker, handler: &ZendCallable, slot: &Slot) -> PhpResult<Child> {
    let mut fds = [0; 2];
    // SAFETY: pipe() fills two descriptors; checked below.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(errors::invalid(format!(
            "cannot create a pipe: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: each descriptor is owned by exactly one File from here on.
    let (read_end, write_end) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    let parent = unsafe { libc::getpid() };
    // SAFETY: no Rust thread exists in this process (the pool's threads start in the
    // children), so the child inherits a consistent state.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(errors::invalid(format!(
            "fork failed: {}",
            std::io::Error::last_os_error()
        ))),
        0 => {
            drop(read_end);
            child_main(worker, handler, slot, write_end, parent)
        }
        pid => {
            drop(write_end);
            Ok(Child {
                pid,
                report: read_end,
                born: Instant::now(),
                killed_hung: false,
            })
        }
    }
}

fn kill(pid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: signals our own child.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// How a child that sent no report ended, from its `waitpid` status.
fn describe_death(status: libc::c_int) -> String {
    if libc::WIFSIGNALED(status) {
        let signal = libc::WTERMSIG(status);
        let name = match signal {
            libc::SIGKILL => " (SIGKILL: the OOM killer, or kill -9)",
            libc::SIGSEGV => " (SIGSEGV: a crash)",
            libc::SIGABRT => " (SIGABRT: an abort)",
            libc::SIGBUS => " (SIGBUS: a crash)",
            _ => "",
        };
        format!("was killed by signal {signal}{name}")
    } else if libc::WIFEXITED(status) {
        format!(
            "exited with status {} before it could report (a fatal error in PHP?)",
            libc::WEXITSTATUS(status)
        )
    } else {
        format!("ended (wait status {status})")
    }
}

pub(crate) fn supervise(worker: &PhpWorker, handler: &ZendCallable) -> PhpResult<ZBox<ZendHashTable>> {
    let n = worker.limits().processes;
    let timeout = worker.limits().timeout;
    let mut scaler = worker.limits().scaler.clone();
    // The slots that should hold a running process; the others stay empty (a stopped
    // process's slot is free again once it has ended).
    let mut wanted: Vec<bool> = (0..n).map(|i| i < scaler.initial()).collect();
    let mut next_look = Instant::now() + LOOK_EVERY;
    let (mut scaled_up, mut scaled_down) = (0i64, 0i64);
    // Before any fork: processes forked later belong to this start (a restart request
    // made after it stops them too), and a user without access fails here, once.
    worker.mark_start()?;
    let slots = SharedSlots::new(n)?;
    let dispatch = ZendCallable::try_from_name("pcntl_signal_dispatch").ok();
    let mut children: Vec<Option<Child>> = (0..n).map(|_| None).collect();
    let mut spawn_at: Vec<Instant> = vec![Instant::now(); n];
    let mut quick_deaths = vec![0u32; n];
    let mut total = delayq::Summary::default();
    let (mut restarts, mut killed_hung) = (0i64, 0i64);
    let mut ended: Option<Ended> = None;
    let mut fatal: Option<String> = None;
    let mut stopping = false;
    let mut told_children = false;
    // After a second signal, each process is told again every half second until it
    // ended: its own first signal may have come a little after this process's.
    let mut next_urgent_relay = Instant::now();
    loop {
        if !stopping {
            let why = if signals::take() {
                Some(Ended::Signal)
            } else if worker.stop_requested() {
                Some(Ended::Stop)
            } else {
                None
            };
            if let Some(why) = why {
                stopping = true;
                ended = Some(why);
            }
        }
        if stopping {
            if !told_children {
                told_children = true;
                for c in children.iter().flatten() {
                    kill(c.pid, libc::SIGTERM);
                }
            }
            if signals::urgent().is_some() && Instant::now() >= next_urgent_relay {
                next_urgent_relay = Instant::now() + Duration::from_millis(500);
                for c in children.iter().flatten() {
                    kill(c.pid, libc::SIGTERM);
                }
            }
        } else {
            let now = Instant::now();
            if scaler.is_auto() && now >= next_look {
                next_look = now + LOOK_EVERY;
                let running = wanted.iter().filter(|&&w| w).count();
                let busy = (0..n)
                    .filter(|&i| wanted[i] && children[i].is_some() && slots.slot(i).started_at() > 0)
                    .count();
                let target = scaler.look(worker.queues(), running, busy);
                if target > running
                    && let Some(i) = (0..n).find(|&i| !wanted[i] && children[i].is_none())
                {
                    wanted[i] = true;
                    spawn_at[i] = now;
                    scaled_up += 1;
                    log::info!("messages are waiting: {target} worker processes (at most {n})");
                } else if target < running
                    && let Some(i) = (0..n)
                        .rev()
                        .find(|&i| wanted[i] && children[i].is_some() && slots.slot(i).started_at() == 0)
                {
                    wanted[i] = false;
                    if let Some(c) = &children[i] {
                        kill(c.pid, libc::SIGTERM);
                    }
                    scaled_down += 1;
                    log::info!("nothing waiting: {target} worker processes (at least {})", scaler.min());
                }
            }
            for i in 0..n {
                if wanted[i] && children[i].is_none() && spawn_at[i] <= now {
                    slots.slot(i).finished();
                    children[i] = Some(spawn(worker, handler, &slots.slot(i))?);
                }
            }
        }
        // Reap every child that ended.
        loop {
            let mut status = 0;
            // SAFETY: waits for our own children without blocking.
            let pid = unsafe { libc::waitpid(-1, &raw mut status, libc::WNOHANG) };
            if pid <= 0 {
                break;
            }
            let Some(i) = children.iter().position(|c| c.as_ref().is_some_and(|c| c.pid == pid)) else {
                continue;
            };
            let Some(mut child) = children[i].take() else { continue };
            let mut text = String::new();
            let _ = child.report.read_to_string(&mut text);
            match decode(&text) {
                Some(Report::Fatal(msg)) => {
                    fatal.get_or_insert(msg);
                    stopping = true;
                }
                Some(Report::Done(s)) => {
                    total += &s.core;
                    if let Some(why @ (Ended::MaxJobs | Ended::MaxMemory | Ended::MaxTime)) = s.ended
                        && !stopping
                        && wanted[i]
                    {
                        log::info!("worker process {pid} recycled ({}); starting another", why.as_str());
                    }
                    // stop() called inside a child means: stop the whole pool; so do a
                    // restart request (the other children have it too) and an empty
                    // queue under stop_when_empty (the others' handlers finish first).
                    if let Some(why @ (Ended::Stop | Ended::Restart | Ended::Empty)) = s.ended
                        && !stopping
                    {
                        stopping = true;
                        ended = Some(why);
                    }
                }
                // Killed (SIGKILL, OOM, segfault): its leases expire and its messages
                // are delivered again.
                None if child.killed_hung => {}
                // A second signal: the process gave its messages back and ended by it.
                None if stopping && signals::urgent().is_some() => {
                    log::info!("worker process {pid} stopped at once (a second stop signal)");
                }
                None => log::warn!(
                    "worker process {pid} {}; the messages it held are delivered again when their lease ends{}",
                    describe_death(status),
                    if stopping || !wanted[i] {
                        ""
                    } else {
                        "; starting another"
                    }
                ),
            }
            if !stopping && wanted[i] {
                restarts += 1;
                // A child that dies right after starting is backed off, not respawned
                // in a tight loop.
                if child.born.elapsed() < Duration::from_secs(1) {
                    quick_deaths[i] += 1;
                } else {
                    quick_deaths[i] = 0;
                }
                let backoff =
                    Duration::from_millis(100 * (1u64 << quick_deaths[i].min(8))).min(Duration::from_secs(30));
                if quick_deaths[i] > 0 {
                    log::warn!(
                        "worker process {pid} ended within a second of starting ({} in a row); the next starts in {:.1} s",
                        quick_deaths[i],
                        backoff.as_secs_f64()
                    );
                }
                spawn_at[i] = Instant::now() + if quick_deaths[i] == 0 { Duration::ZERO } else { backoff };
            }
        }
        if let Some(t) = timeout {
            let limit = i64::try_from(t.as_millis()).unwrap_or(i64::MAX);
            let now = now_ms();
            for (i, c) in children.iter_mut().enumerate() {
                let Some(c) = c else { continue };
                let started = slots.slot(i).started_at();
                if started > 0 && now - started > limit {
                    kill(c.pid, libc::SIGKILL);
                    c.killed_hung = true;
                    slots.slot(i).finished();
                    killed_hung += 1;
                    log::warn!(
                        "worker process {}: its handler ran past the {:.1} s timeout and was killed; the message \
                         is delivered again when its lease ends",
                        c.pid,
                        t.as_secs_f64()
                    );
                }
            }
        }
        crate::logs::flush();
        if stopping && children.iter().all(Option::is_none) {
            break;
        }
        if let Some(f) = &dispatch {
            let _ = f.try_call(vec![]);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if let Some(msg) = fatal {
        return Err(errors::worker_failed(format!("a worker process failed: {msg}")));
    }
    summary_array(
        &RunSummary { core: total, ended },
        vec![
            ("processes", zv(i64::try_from(n).unwrap_or(i64::MAX))),
            ("restarts", zv(restarts)),
            ("killed_hung", zv(killed_hung)),
            ("scaled_up", zv(scaled_up)),
            ("scaled_down", zv(scaled_down)),
        ],
    )
}
