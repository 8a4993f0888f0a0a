//! The process supervisor of a worker run with `processes` (or a `timeout`), the same
//! for every binding; the binding only spawns a process (PHP forks and runs the worker
//! in the child, Python starts its worker command) and passes its signals on.
//!
//! Tasks:
//! - start a process per slot through the binding ([`Spawner`]), each with a report
//!   pipe and a slot (see `slot.rs`);
//! - reap the processes that end, read their reports ([`Report`]) and sum their counts
//!   (from the slot for a process that died before it could report);
//! - respawn: a recycled process (max_jobs, max_time, max_memory) is replaced at once;
//!   one that died is too, unless it died within [`RespawnPolicy::quick_death`] of its
//!   start with no handler running: then after a back-off, and after
//!   [`RespawnPolicy::give_up_after`] such deaths in a row the pool gives up
//!   ([`Respawns`]). A death while a handler ran fails that handler's message, counted
//!   as an attempt, and is not counted toward giving up ([`Death`]);
//! - stop the whole pool when a process says so: `stop()` in a handler, a restart
//!   request, a handler that ended its process (exit); under `stop_when_empty`, end
//!   once every process found the queue empty, not while one still runs a message;
//! - kill a process whose handler runs past `timeout`, measured on a monotonic clock
//!   ([`HungClock`]), and fail the message it held at once, counted as an attempt;
//! - scale between `min_processes` and `processes` (the decision is `scale.rs`'s);
//! - pass stop signals on (a second one at once), and return one [`PoolSummary`].

use std::fs::File;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use super::hung::{HungClock, secs, timeout_error};
use super::report::Report;
use super::respawn::{Death, Respawn, RespawnPolicy, Respawns};
use super::signals::URGENT_AFTER;
use super::slot::{Held, SlotTable, SlotView};
use super::stop::StopReason;
use crate::queue::Queue;
use crate::scale::Scaler;
use crate::worker::{Fate, Summary, fail_lease};

/// How often an auto-balanced pool reads the backlog (the scaler's cooldown bounds how
/// often it changes).
pub const LOOK_EVERY: Duration = Duration::from_millis(500);
/// One turn of the supervisor's loop: the delay in noticing a death or a hung handler.
const TURN: Duration = Duration::from_millis(50);
/// How long a hung handler's process is given to hand its waiting deliveries back
/// before it is killed all the same (a process too stuck to do it, a Redis that hangs).
const GIVE_BACK_WAIT: Duration = Duration::from_secs(2);

/// Whether a worker run needs a supervisor: several processes, or a timeout (a thread
/// cannot be stopped, nor a coroutine that blocks its loop; a process can be killed).
pub fn is_supervised(processes: usize, timeout: Option<Duration>) -> bool {
    processes > 1 || timeout.is_some()
}

/// What the binding says at each turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Asked {
    /// A stop asked for (`stop()`, a signal).
    pub stop: Option<StopReason>,
    /// A second stop signal came: every process is to stop at once.
    pub urgent: bool,
}

/// What a binding does for its supervisor.
pub trait Spawner {
    /// Start the process of slot `index` of `slots`, which writes its report to
    /// `report` (close it in the supervisor, keep it open in the process); returns its
    /// pid. PHP forks and runs the worker in the child; Python starts its command.
    fn spawn(&mut self, index: usize, slots: &SlotTable, report: OwnedFd) -> std::io::Result<libc::pid_t>;

    /// Called at every turn: run the binding's own signal handling and flush its logs;
    /// returns what was asked for.
    fn poll(&mut self) -> Asked;
}

/// Settings of a supervised pool.
#[derive(Debug, Clone)]
pub struct SupervisorOptions {
    /// Slots (the most processes at once).
    pub processes: usize,
    /// Longest a handler may run before its process is killed.
    pub timeout: Option<Duration>,
    /// Balances the number of processes between its minimum and `processes`.
    pub scaler: Scaler,
    /// The worker's queues, its own first, then its lower ones (the backlog the scaler
    /// reads; where a killed process's message is failed).
    pub queues: Vec<Queue>,
    /// When dead processes are replaced.
    pub respawn: RespawnPolicy,
}

/// What a supervised pool did: the summary of `run()` with `processes`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolSummary {
    /// The processes' counts, summed.
    pub counts: Summary,
    /// Why the pool stopped.
    pub stopped_by: Option<StopReason>,
    /// Slots.
    pub processes: u64,
    /// Processes started in place of ended ones.
    pub restarts: u64,
    /// Processes killed for running a handler past `timeout`.
    pub killed_hung: u64,
    /// Processes added by the scaler.
    pub scaled_up: u64,
    /// Processes let go by the scaler.
    pub scaled_down: u64,
    /// A process could not run (its report): the binding raises it.
    pub fatal: Option<String>,
    /// Why the pool gave up on processes that kept dying (`stopped_by` is `error`).
    pub gave_up: Option<String>,
}

impl PoolSummary {
    /// A run in the calling process, with no supervisor: one process, nothing else.
    pub fn single() -> Self {
        Self {
            processes: 1,
            ..Self::default()
        }
    }

    /// The supervisor's own counts by name, in the order the summary shows them.
    pub fn pool_counts(&self) -> [(&'static str, u64); 5] {
        [
            ("processes", self.processes),
            ("restarts", self.restarts),
            ("killed_hung", self.killed_hung),
            ("scaled_up", self.scaled_up),
            ("scaled_down", self.scaled_down),
        ]
    }
}

struct Child {
    pid: libc::pid_t,
    report: File,
    born: Instant,
    clock: HungClock,
    /// Killed for running past the timeout, or for a cancel with `kill`: the busy
    /// period it was killed in.
    killed_in: Option<u64>,
    /// Killed for a cancel with `kill` (`Queue::cancel_with`), not at the timeout.
    killed_for_cancel: bool,
}

/// The error a message gets when its process was killed for a cancel with `kill`
/// (nack.lua deletes it as cancelled, whatever the error).
const CANCEL_KILL_ERROR: &str = "cancelled while it ran; process killed (cancel with kill)";

fn kill(pid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: signals a child of ours.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// How a process that sent no report ended, from its `waitpid` status (`None`: it
/// was reaped by another, so how is unknown).
fn describe_death(status: Option<libc::c_int>) -> String {
    let Some(status) = status else {
        return "ended; its status is unknown (the process waited for it itself, or ignores SIGCHLD)".to_owned();
    };
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
        format!("exited with status {}", libc::WEXITSTATUS(status))
    } else {
        format!("ended (wait status {status})")
    }
}

/// What a process wrote to its report pipe before it ended: what is there now, never
/// waiting for more.
fn read_report(pipe: &mut File) -> String {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match pipe.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn report_pipe() -> std::io::Result<(File, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors; checked. Close-on-exec: a process started
    // later must not hold another's write end (its report would never end).
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // The read end never blocks: a process that the handler forked holds the write end
    // as long as it lives, so a read to the end could wait for ever. The report is in
    // the pipe before its process exits.
    // SAFETY: fcntl on a descriptor just made; checked.
    if unsafe { libc::fcntl(fds[0], libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: both are ours and not used again.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        return Err(e);
    }
    // SAFETY: each descriptor is owned by exactly one value from here on.
    Ok(unsafe { (File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Add one failure, as the process would have counted it, to `counts`.
fn count_failure(counts: &mut Summary, fate: Option<&Fate>) {
    match fate {
        Some(Fate::Retry(_)) => {
            counts.failed += 1;
            counts.retried += 1;
        }
        Some(Fate::Dead(_)) => {
            counts.failed += 1;
            counts.dead += 1;
        }
        Some(Fate::Cancelled) => counts.cancelled += 1,
        None => {}
    }
}

struct Pool<'a, S: Spawner> {
    spawner: &'a mut S,
    opts: SupervisorOptions,
    slots: SlotTable,
    children: Vec<Option<Child>>,
    /// The slots that should hold a running process (the scaler's choice).
    wanted: Vec<bool>,
    /// Under `stop_when_empty`: the slots whose process found the queue empty.
    found_empty: Vec<bool>,
    spawn_at: Vec<Instant>,
    respawns: Respawns,
    summary: PoolSummary,
    stopping: bool,
    told_children: bool,
    next_urgent_relay: Instant,
}

impl<S: Spawner> Pool<'_, S> {
    fn stop(&mut self, why: StopReason) {
        if !self.stopping {
            self.stopping = true;
            self.summary.stopped_by = Some(why);
        }
    }

    fn start(&mut self, i: usize) {
        self.slots.reset(i);
        let spawned = report_pipe().and_then(|(read, write)| {
            let pid = self.spawner.spawn(i, &self.slots, write)?;
            Ok((pid, read))
        });
        match spawned {
            Ok((pid, report)) => {
                log::info!("worker process {pid} started");
                self.children[i] = Some(Child {
                    pid,
                    report,
                    born: Instant::now(),
                    clock: HungClock::default(),
                    killed_in: None,
                    killed_for_cancel: false,
                });
            }
            Err(e) => {
                log::error!("cannot start a worker process: {e}");
                self.respawn(i, Some((Duration::ZERO, Death::Outside)));
            }
        }
    }

    /// Plan slot `i`'s next process: `died` is the life of a process that ended
    /// unasked and how it died (None: as planned, replaced at once).
    fn respawn(&mut self, i: usize, died: Option<(Duration, Death)>) {
        if self.stopping || !self.wanted[i] || self.found_empty[i] {
            return;
        }
        let pause = match died.map(|(lived, death)| self.respawns.died(lived, death)) {
            None | Some(Respawn::Now) => Duration::ZERO,
            Some(Respawn::After(pause)) => {
                log::warn!(
                    "a worker process ended within {} s of its start ({} in a row); the next starts in {:.1} s",
                    secs(self.opts.respawn.quick_death),
                    self.respawns.in_a_row(),
                    pause.as_secs_f64()
                );
                pause
            }
            Some(Respawn::GiveUp) => {
                let text = self.respawns.give_up_text();
                log::error!("{text}");
                self.summary.gave_up = Some(text);
                self.stop(StopReason::Error);
                return;
            }
        };
        self.summary.restarts += 1;
        self.spawn_at[i] = Instant::now() + pause;
    }

    /// Fail the message a dead process's handler held, if the slot still shows that
    /// handler running (one that ended completed its message itself, or its completion
    /// waits in vain and the lease brings it back).
    fn fail_held(&self, view: &SlotView, since: Option<u64>, error: &str) -> Option<Fate> {
        if !view.busy || since.is_some_and(|s| s != view.starts) {
            return None;
        }
        let held: &Held = view.held.as_ref()?;
        let queue = self.opts.queues.get(held.member)?;
        match fail_lease(queue, held, error, Duration::ZERO) {
            Ok(fate) => fate,
            Err(e) => {
                log::warn!(
                    "could not fail message {} at once; it runs again after its lease: {e}",
                    held.id
                );
                None
            }
        }
    }

    fn reaped(&mut self, i: usize, mut child: Child, status: Option<libc::c_int>) {
        let pid = child.pid;
        let text = read_report(&mut child.report);
        let lived = child.born.elapsed();
        let view = self.slots.view(i);
        let report = Report::decode(&text);
        // A process killed at its timeout that reported all the same (its handler
        // returned just before the kill) ended as its report says.
        if let Some(starts) = child.killed_in
            && report.is_none()
        {
            let timeout = self.opts.timeout.unwrap_or_default();
            let error = if child.killed_for_cancel {
                CANCEL_KILL_ERROR.to_owned()
            } else {
                timeout_error(timeout)
            };
            let fate = self.fail_held(&view, Some(starts), &error);
            let mut counts = view.counts.clone();
            count_failure(&mut counts, fate.as_ref());
            self.summary.counts += &counts;
            if child.killed_for_cancel {
                log::info!(
                    "worker process {pid}: killed, as asked by a cancel with kill of the message its handler \
                     held; {}",
                    match fate {
                        Some(Fate::Cancelled) => "the message is deleted",
                        _ => "its handler had ended it",
                    }
                );
                self.respawn(i, None);
                return;
            }
            log::warn!(
                "worker process {pid}: its handler ran past the {} s timeout and was killed{}; {}",
                secs(timeout),
                if view.blocking {
                    " (it blocked the other handlers of the process, whose messages went back to the queue)"
                } else {
                    ""
                },
                match fate {
                    Some(Fate::Retry(_)) => "its message is due again at once",
                    Some(Fate::Dead(_)) => "its message used its last attempt and went to the dead letters",
                    Some(Fate::Cancelled) => "its message was cancelled while it ran, and is deleted",
                    None => "its message is delivered again when its lease ends",
                }
            );
            self.respawn(i, None);
            return;
        }
        match report {
            Some(Report::Fatal(msg)) => {
                self.summary.fatal.get_or_insert(msg);
                self.stop(StopReason::Error);
            }
            Some(Report::Done { counts, stopped_by }) => {
                self.summary.counts += &counts;
                // It stopped its pool to be killed (past the timeout, or a cancel with
                // `kill`), and its handler returned before the kill: that stop was its
                // own, not the pool's.
                let past_timeout = view.gave_back != 0 && view.gave_back == view.starts;
                match stopped_by {
                    Some(StopReason::Stop) | None if past_timeout || view.kill_asked => {
                        let why = if past_timeout {
                            "its handler ended past the timeout"
                        } else {
                            "its handler ended before the kill its message's cancel asked for"
                        };
                        log::info!("worker process {pid}: {why}; starting another");
                        self.respawn(i, None);
                    }
                    Some(why) if why.recycles() => {
                        if !self.stopping && self.wanted[i] {
                            log::info!("worker process {pid} recycled ({why}); starting another");
                        }
                        self.respawn(i, None);
                    }
                    // Under stop_when_empty the others go on until each finds the
                    // queue empty itself: one may still run a message, or get back one
                    // that a killed process held.
                    Some(StopReason::Empty) => self.found_empty[i] = true,
                    // stop() in a handler stops the whole pool; so do a restart request
                    // (the other processes have it too) and a handler that ended its
                    // process, as it does without processes.
                    // A process the scaler stopped ends as asked, whatever it reports.
                    Some(StopReason::Stop) if !self.wanted[i] => self.respawn(i, None),
                    Some(why @ (StopReason::Stop | StopReason::Restart | StopReason::Exit)) => {
                        if why == StopReason::Exit && !self.stopping {
                            log::warn!("worker process {pid}: a handler ended its process (exit); stopping the pool");
                        }
                        self.stop(why);
                    }
                    other => {
                        if !self.stopping && self.wanted[i] {
                            log::warn!(
                                "worker process {pid} stopped ({}); starting another",
                                other.map_or("without a reason", StopReason::as_str)
                            );
                        }
                        // It reported: its run ended, no handler was running.
                        self.respawn(i, Some((lived, Death::Outside)));
                    }
                }
            }
            None => {
                let how = describe_death(status);
                let fate = self.fail_held(&view, None, &format!("the worker process {how} while its handler ran"));
                let mut counts = view.counts.clone();
                count_failure(&mut counts, fate.as_ref());
                self.summary.counts += &counts;
                let death = Death::seen_in(&view);
                let held = match fate {
                    Some(Fate::Retry(_)) => "; the message its handler held is due again at once",
                    Some(Fate::Dead(_)) => "; the message its handler held went to the dead letters",
                    Some(Fate::Cancelled) => "; the message its handler held was cancelled, and is deleted",
                    // A delivery the slot could not name (see `Death::seen_in`).
                    None if death == Death::InHandler && view.held.is_none() => {
                        "; the message its handler held is delivered again when its lease ends"
                    }
                    None => "",
                };
                let replaced = !self.stopping && self.wanted[i];
                log::warn!(
                    "worker process {pid} {how}{}{held}",
                    if replaced { "; starting another" } else { "" }
                );
                self.respawn(i, Some((lived, death)));
            }
        }
    }

    /// Reap the pool's own processes that ended, each by its pid: other children of
    /// this process (an application's own `pcntl_fork()` or `subprocess`) stay for
    /// their owner to wait on.
    fn reap(&mut self) {
        for i in 0..self.children.len() {
            let Some(pid) = self.children[i].as_ref().map(|c| c.pid) else {
                continue;
            };
            let mut status = 0;
            // SAFETY: waits for this child of ours without blocking.
            let status = match unsafe { libc::waitpid(pid, &raw mut status, libc::WNOHANG) } {
                done if done == pid => Some(status),
                // Gone without us: the application reaped it (`pcntl_waitpid(-1)`) or
                // ignores SIGCHLD. Left in its slot, it would keep the pool waiting.
                -1 if std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD) => None,
                _ => continue,
            };
            if let Some(child) = self.children[i].take() {
                self.reaped(i, child, status);
            }
        }
    }

    fn kill_hung(&mut self) {
        let now = Instant::now();
        for i in 0..self.children.len() {
            let view = self.slots.view(i);
            let Some(c) = self.children[i].as_mut() else { continue };
            if c.killed_in.is_some() {
                continue;
            }
            // Its handler's message was cancelled with `kill` (the process gave its
            // waiting deliveries back already, see `Slot::publish_while`).
            if view.busy && view.kill_asked {
                kill(c.pid, libc::SIGKILL);
                c.killed_in = Some(view.starts);
                c.killed_for_cancel = true;
                continue;
            }
            let Some(timeout) = self.opts.timeout else { continue };
            // Once past the timeout, the process gives its waiting deliveries back
            // itself (see `Slot::publish_while`); it is killed when it did, or when
            // it was given the time to.
            if let Some(ran) = c.clock.observe(view.starts, view.busy, now)
                && HungClock::is_hung(ran, timeout, view.grace)
                && (view.gave_back == view.starts || HungClock::is_hung(ran, timeout, view.grace + GIVE_BACK_WAIT))
            {
                kill(c.pid, libc::SIGKILL);
                c.killed_in = Some(view.starts);
                self.summary.killed_hung += 1;
            }
        }
    }

    fn scale(&mut self, scaler: &mut Scaler) {
        let n = self.children.len();
        let running = self.wanted.iter().filter(|&&w| w).count();
        let busy = (0..n)
            .filter(|&i| self.wanted[i] && self.children[i].is_some() && self.slots.view(i).busy)
            .count();
        let target = scaler.look(&self.opts.queues, running, busy);
        if target > running
            && let Some(i) = (0..n).find(|&i| !self.wanted[i] && self.children[i].is_none())
        {
            self.wanted[i] = true;
            self.spawn_at[i] = Instant::now();
            self.summary.scaled_up += 1;
            log::info!("messages are waiting: {target} worker processes (at most {n})");
        } else if target < running
            && let Some(i) = (0..n)
                .rev()
                .find(|&i| self.wanted[i] && self.children[i].is_some() && !self.slots.view(i).busy)
        {
            self.wanted[i] = false;
            if let Some(c) = &self.children[i] {
                kill(c.pid, libc::SIGTERM);
            }
            self.summary.scaled_down += 1;
            log::info!("nothing waiting: {target} worker processes (at least {})", scaler.min());
        }
    }

    /// Every process found the queue empty and none is left to start.
    fn drained(&self) -> bool {
        self.found_empty.iter().any(|&e| e)
            && self.children.iter().all(Option::is_none)
            && (0..self.children.len()).all(|i| !self.wanted[i] || self.found_empty[i])
    }
}

/// Run a supervised pool until it stops; see the module's header for what it does.
pub fn supervise(spawner: &mut impl Spawner, opts: SupervisorOptions, slots: SlotTable) -> PoolSummary {
    let n = opts.processes.min(slots.len()).max(1);
    let mut scaler = opts.scaler.clone();
    let initial = scaler.initial();
    let mut pool = Pool {
        spawner,
        respawns: Respawns::new(opts.respawn.clone()),
        opts,
        slots,
        children: (0..n).map(|_| None).collect(),
        wanted: (0..n).map(|i| i < initial).collect(),
        found_empty: vec![false; n],
        spawn_at: vec![Instant::now(); n],
        summary: PoolSummary {
            processes: n as u64,
            ..PoolSummary::default()
        },
        stopping: false,
        told_children: false,
        next_urgent_relay: Instant::now(),
    };
    let mut next_look = Instant::now() + LOOK_EVERY;
    loop {
        let asked = pool.spawner.poll();
        if let Some(why) = asked.stop {
            pool.stop(why);
        }
        if pool.stopping {
            if !pool.told_children {
                pool.told_children = true;
                for c in pool.children.iter().flatten() {
                    kill(c.pid, libc::SIGTERM);
                }
            }
            // Told again until it ended: its own first signal may have come a little
            // after ours, and a second one stops it at once.
            if asked.urgent && Instant::now() >= pool.next_urgent_relay {
                pool.next_urgent_relay = Instant::now() + URGENT_AFTER;
                for c in pool.children.iter().flatten() {
                    kill(c.pid, libc::SIGTERM);
                }
            }
        } else {
            let now = Instant::now();
            let draining = pool.found_empty.iter().any(|&e| e);
            if scaler.is_auto() && !draining && now >= next_look {
                next_look = now + LOOK_EVERY;
                pool.scale(&mut scaler);
            }
            for i in 0..n {
                if pool.wanted[i]
                    && !pool.found_empty[i]
                    && pool.children[i].is_none()
                    && pool.spawn_at[i] <= now
                    && !pool.stopping
                {
                    pool.start(i);
                }
            }
        }
        pool.reap();
        pool.kill_hung();
        if !pool.stopping && pool.drained() {
            pool.stop(StopReason::Empty);
        }
        if pool.stopping && pool.children.iter().all(Option::is_none) {
            break;
        }
        std::thread::sleep(TURN);
    }
    pool.summary
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_processes_or_a_timeout_run_supervised() {
        assert!(!is_supervised(1, None));
        assert!(is_supervised(2, None));
        assert!(is_supervised(1, Some(Duration::from_secs(1))));
    }
}
