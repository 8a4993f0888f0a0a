//! The slots of a supervised pool: a few words of memory per process, shared between
//! the process and its supervisor.
//!
//! Tasks:
//! - the process says when a handler starts and ends (the supervisor's hung-handler
//!   clock and the scaler's "busy" read it),
//! - and which delivery that handler holds (id, lease, attempt), so that the
//!   supervisor can fail it at once when it kills the process; a process whose
//!   handlers share one thread (coroutines on an event loop) names the one that blocks
//!   the others, and the others' deliveries go back at once before the kill;
//! - the process publishes its run's counts, so that a process killed before it could
//!   report keeps them in the pool's summary;
//! - the memory is an anonymous shared mapping for forked processes (PHP) or a file
//!   that an exec'd process maps by its path (Python).
//!
//! Why memory and not a pipe: a handler start costs a few stores instead of a system
//! call, nothing blocks when the supervisor is slow to read, and what a killed process
//! wrote last is still there after its death. The delivery is guarded by a sequence
//! number (a seqlock), so a torn read is detected, and the lease in it is a fence: a
//! delivery that the process completed meanwhile is refused by Redis, never failed twice.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::hung::HungClock;

use crate::queue::MAX_ID_BYTES;
use crate::worker::{CancelFlag, Delivery, Releaser, Summary};

const ID_WORDS: usize = MAX_ID_BYTES.div_ceil(8);
/// A lease is "<token>:<score>", far shorter than this.
const LEASE_WORDS: usize = 16;
const COUNTS: usize = Summary::FIELDS;
/// How often a process copies its counts into its slot.
const PUBLISH_EVERY: Duration = Duration::from_millis(20);

/// One process's cells. Only atomics: two processes read and write them at once.
#[repr(C)]
struct Cells {
    /// Handler starts so far: a new busy period has a new number.
    starts: AtomicU64,
    /// 1 while a handler runs.
    busy: AtomicU64,
    /// Time past the timeout the supervisor allows this busy period, in ms (coroutine
    /// handlers are cancelled by their own loop first).
    grace_ms: AtomicU64,
    /// The busy period (its `starts`) whose waiting deliveries the process released
    /// before its kill; 0 none.
    gave_back: AtomicU64,
    /// The busy period (its `starts`) in which the held delivery was named as the one
    /// blocking every other handler of the process; 0 none.
    blocker: AtomicU64,
    /// The busy period (its `starts`) whose held delivery was cancelled with `kill`
    /// (`Queue::cancel_with`): the supervisor kills the process as at its timeout; 0
    /// none.
    kill_asked: AtomicU64,
    /// The seqlock over the held delivery: odd while it is being written.
    held_seq: AtomicU64,
    /// 0: none known; else 1 + the index of its queue in the worker (0: its own queue).
    held_member: AtomicU64,
    held_part: AtomicU64,
    held_attempt: AtomicU64,
    held_max_attempts: AtomicU64,
    held_id_len: AtomicU64,
    held_lease_len: AtomicU64,
    held_id: [AtomicU64; ID_WORDS],
    held_lease: [AtomicU64; LEASE_WORDS],
    counts: [AtomicU64; COUNTS],
}

const CELLS: usize = std::mem::size_of::<Cells>();

/// The delivery a process's handler held, as its slot tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// Which of the worker's queues it came from (0: its own, then its lower queues).
    pub member: usize,
    /// Its queue's partition.
    pub part: usize,
    /// The message id.
    pub id: String,
    /// The lease its claim returned: completes this delivery and no later one.
    pub lease: String,
    /// This delivery's attempt (1 for the first).
    pub attempt: u32,
    /// Deliveries allowed in all.
    pub max_attempts: u32,
}

/// What the supervisor reads in a slot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotView {
    /// Handler starts so far.
    pub starts: u64,
    /// Whether a handler runs.
    pub busy: bool,
    /// Time allowed past the timeout for this busy period.
    pub grace: Duration,
    /// The busy period whose waiting deliveries the process released (0 none): it is
    /// ready to be killed.
    pub gave_back: u64,
    /// The delivery the running handler holds, if the process said.
    pub held: Option<Held>,
    /// Whether the process named the held delivery's handler as the one that blocks
    /// all its others (`Slot::blocked_on`) in this busy period.
    pub blocking: bool,
    /// Whether the held delivery was cancelled with `kill` in this busy period, and the
    /// process gave its other waiting deliveries back: it is to be killed now.
    pub kill_asked: bool,
    /// The process's counts, as it last published them.
    pub counts: Summary,
}

struct Mapping {
    base: *mut Cells,
    len: usize,
    /// The backing file of a mapping that exec'd processes open; removed on drop by
    /// the process that made it.
    owned_path: Option<PathBuf>,
}

// SAFETY: the mapping holds only atomics, valid to use from any thread.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn map(len: usize, fd: Option<&File>) -> io::Result<*mut Cells> {
        let (flags, fd) = match fd {
            Some(f) => (libc::MAP_SHARED, f.as_raw_fd()),
            None => (libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1),
        };
        // SAFETY: a fresh shared mapping, checked for failure. Zeroed memory (new
        // anonymous pages, a file extended with zeros) is valid for the atomics.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len * CELLS,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(base.cast())
    }

    fn cells(&self, index: usize) -> &Cells {
        assert!(index < self.len, "slot {index} of {}", self.len);
        // SAFETY: within the mapping, which lives as long as `self`.
        unsafe { &*self.base.add(index) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`.
        unsafe {
            libc::munmap(self.base.cast(), self.len * CELLS);
        }
        if let Some(path) = &self.owned_path {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The slots of a pool, one per process it may run.
#[derive(Clone)]
pub struct SlotTable {
    mapping: Arc<Mapping>,
}

impl std::fmt::Debug for SlotTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotTable")
            .field("len", &self.mapping.len)
            .field("path", &self.mapping.owned_path)
            .finish()
    }
}

impl SlotTable {
    /// Slots that processes forked after this call share.
    pub fn anonymous(len: usize) -> io::Result<Self> {
        let base = Mapping::map(len.max(1), None)?;
        Ok(Self {
            mapping: Arc::new(Mapping {
                base,
                len: len.max(1),
                owned_path: None,
            }),
        })
    }

    /// Slots in a new file in the temporary directory, which processes started later
    /// map by its path (`Slot::open`); the file goes when the table is dropped.
    pub fn in_file(len: usize) -> io::Result<Self> {
        let len = len.max(1);
        let dir = std::env::temp_dir();
        let mut attempt = 0u32;
        let (file, path) = loop {
            let path = dir.join(format!(
                "delayq-slots-{}-{}-{attempt}",
                std::process::id(),
                crate::time::now_unix_ms()
            ));
            match OpenOptions::new().read(true).write(true).create_new(true).open(&path) {
                Ok(f) => break (f, path),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 100 => attempt += 1,
                Err(e) => return Err(e),
            }
        };
        file.set_len((len * CELLS) as u64)?;
        let base = Mapping::map(len, Some(&file))?;
        Ok(Self {
            mapping: Arc::new(Mapping {
                base,
                len,
                owned_path: Some(path),
            }),
        })
    }

    /// How many slots.
    pub fn len(&self) -> usize {
        self.mapping.len
    }

    /// Never: a table has one slot at least.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The file of a table made by `in_file`.
    pub fn path(&self) -> Option<&Path> {
        self.mapping.owned_path.as_deref()
    }

    /// Slot `index`, as its process writes it.
    pub fn slot(&self, index: usize) -> Slot {
        let _ = self.mapping.cells(index);
        Slot {
            mapping: Arc::clone(&self.mapping),
            index,
            writer: Arc::default(),
            cancel: Arc::default(),
        }
    }

    /// What slot `index` says now.
    pub fn view(&self, index: usize) -> SlotView {
        let c = self.mapping.cells(index);
        let counts: Vec<(&str, u64)> = Summary::default()
            .counts()
            .iter()
            .zip(&c.counts)
            .map(|((name, _), n)| (*name, n.load(Ordering::Acquire)))
            .collect();
        let starts = c.starts.load(Ordering::Acquire);
        let held = read_held(c);
        SlotView {
            starts,
            busy: c.busy.load(Ordering::Acquire) == 1,
            grace: Duration::from_millis(c.grace_ms.load(Ordering::Acquire)),
            gave_back: c.gave_back.load(Ordering::Acquire),
            blocking: starts != 0 && c.blocker.load(Ordering::Acquire) == starts && held.is_some(),
            kill_asked: starts != 0 && c.kill_asked.load(Ordering::Acquire) == starts,
            held,
            counts: Summary::from_counts(counts).unwrap_or_default(),
        }
    }

    /// Empty slot `index` for a new process.
    pub fn reset(&self, index: usize) {
        let c = self.mapping.cells(index);
        c.busy.store(0, Ordering::Release);
        c.grace_ms.store(0, Ordering::Release);
        c.gave_back.store(0, Ordering::Release);
        c.blocker.store(0, Ordering::Release);
        c.kill_asked.store(0, Ordering::Release);
        c.held_member.store(0, Ordering::Release);
        // Even: a process killed amid `started` left it odd, and no later one could
        // name its message.
        c.held_seq.store(0, Ordering::Release);
        for n in &c.counts {
            n.store(0, Ordering::Release);
        }
    }
}

fn store_bytes(words: &[AtomicU64], bytes: &[u8]) -> usize {
    let n = bytes.len().min(words.len() * 8);
    for (word, chunk) in words.iter().zip(bytes[..n].chunks(8)) {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        word.store(u64::from_le_bytes(b), Ordering::Relaxed);
    }
    n
}

fn load_bytes(words: &[AtomicU64], len: usize) -> Vec<u8> {
    let len = len.min(words.len() * 8);
    let mut out: Vec<u8> = words
        .iter()
        .take(len.div_ceil(8))
        .flat_map(|w| w.load(Ordering::Relaxed).to_le_bytes())
        .collect();
    out.truncate(len);
    out
}

fn read_held(c: &Cells) -> Option<Held> {
    // A handler that writes while this reads changes the sequence: try again, and give
    // up (nothing known) rather than spin against a busy writer.
    for _ in 0..100 {
        let before = c.held_seq.load(Ordering::Acquire);
        if before % 2 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let member = c.held_member.load(Ordering::Relaxed);
        let part = c.held_part.load(Ordering::Relaxed);
        let attempt = c.held_attempt.load(Ordering::Relaxed);
        let max_attempts = c.held_max_attempts.load(Ordering::Relaxed);
        let id = load_bytes(&c.held_id, c.held_id_len.load(Ordering::Relaxed) as usize);
        let lease = load_bytes(&c.held_lease, c.held_lease_len.load(Ordering::Relaxed) as usize);
        fence(Ordering::Acquire);
        if c.held_seq.load(Ordering::Relaxed) != before {
            continue;
        }
        if member == 0 {
            return None;
        }
        return Some(Held {
            member: (member - 1) as usize,
            part: part as usize,
            id: String::from_utf8(id).ok()?,
            lease: String::from_utf8(lease).ok()?,
            attempt: u32::try_from(attempt).unwrap_or(u32::MAX),
            max_attempts: u32::try_from(max_attempts).unwrap_or(u32::MAX),
        });
    }
    None
}

/// Returns whether the slot names `held` (a lease too long to keep names nothing).
fn write_held(c: &Cells, held: Option<&Delivery>) -> bool {
    let seq = c.held_seq.fetch_add(1, Ordering::AcqRel);
    debug_assert!(seq.is_multiple_of(2), "one writer per slot");
    fence(Ordering::Release);
    match held {
        Some(d) => {
            c.held_part.store(d.partition() as u64, Ordering::Relaxed);
            c.held_attempt.store(u64::from(d.attempt), Ordering::Relaxed);
            c.held_max_attempts.store(u64::from(d.max_attempts), Ordering::Relaxed);
            let n = store_bytes(&c.held_id, d.id.as_bytes());
            c.held_id_len.store(n as u64, Ordering::Relaxed);
            let lease = d.token().as_bytes();
            let n = store_bytes(&c.held_lease, lease);
            c.held_lease_len.store(n as u64, Ordering::Relaxed);
            // A lease too long to keep whole cannot complete anything: unknown.
            let known = n == lease.len() && d.id.len() <= MAX_ID_BYTES;
            c.held_member
                .store(if known { d.member() as u64 + 1 } else { 0 }, Ordering::Relaxed);
            c.held_seq.fetch_add(1, Ordering::Release);
            known
        }
        None => {
            c.held_member.store(0, Ordering::Relaxed);
            c.held_seq.fetch_add(1, Ordering::Release);
            false
        }
    }
}

/// One process's slot, as the process writes it.
#[derive(Clone)]
pub struct Slot {
    mapping: Arc<Mapping>,
    index: usize,
    /// The process that writes it (its `fork::generation() + 1`): the first one that does. A process its handler
    /// forks inherits the mapping, and must not tell the supervisor that the
    /// parent's handler ended.
    writer: Arc<AtomicU64>,
    /// The cancel flag of the delivery the running handler holds (this process's own
    /// memory): one cancelled with `kill` asks the supervisor for the kill.
    cancel: Arc<std::sync::Mutex<Option<CancelFlag>>>,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Slot").field(&self.index).finish()
    }
}

impl Slot {
    /// Slot `index` of the table in the file at `path` (made by `SlotTable::in_file` in
    /// the supervisor).
    pub fn open(path: &Path, index: usize) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let len = usize::try_from(file.metadata()?.len()).unwrap_or(0) / CELLS;
        if index >= len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} has no slot {index}", path.display()),
            ));
        }
        let base = Mapping::map(len, Some(&file))?;
        Ok(Self {
            mapping: Arc::new(Mapping {
                base,
                len,
                owned_path: None,
            }),
            index,
            writer: Arc::default(),
            cancel: Arc::default(),
        })
    }

    fn cells(&self) -> &Cells {
        self.mapping.cells(self.index)
    }

    /// Whether this process is the slot's writer.
    fn mine(&self) -> bool {
        // A fork generation, as the pool tells its own process: an atomic load, where
        // a pid would cost a system call per handler call.
        let this = crate::fork::generation() + 1;
        match self
            .writer
            .compare_exchange(0, this, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(writer) => writer == this,
        }
    }

    /// A handler starts on `held` (None: the process cannot name one), allowed `grace`
    /// past the timeout. `killable`: a cancel of `held` with `kill` kills the process
    /// (false where it would kill other handlers with it: coroutines of one loop).
    pub fn started(&self, held: Option<&Delivery>, grace: Duration, killable: bool) {
        if !self.mine() {
            return;
        }
        let c = self.cells();
        c.blocker.store(0, Ordering::Release);
        write_held(c, held);
        if let Ok(mut cancel) = self.cancel.lock() {
            *cancel = held.filter(|_| killable).map(Delivery::cancel_flag);
        }
        c.grace_ms
            .store(u64::try_from(grace.as_millis()).unwrap_or(u64::MAX), Ordering::Release);
        c.starts.fetch_add(1, Ordering::AcqRel);
        c.busy.store(1, Ordering::Release);
    }

    /// The handler of `held` blocks every other handler of this process (a coroutine
    /// that blocks its event loop): name it in the running busy period, whose clock
    /// goes on. Past the timeout, the others' deliveries then go back to the queue
    /// uncounted before the kill, and the supervisor fails this one. A delivery the
    /// slot cannot name whole names nothing, and nothing is released.
    pub fn blocked_on(&self, held: &Delivery) {
        if !self.mine() {
            return;
        }
        let c = self.cells();
        if c.busy.load(Ordering::Acquire) != 1 {
            return;
        }
        let starts = c.starts.load(Ordering::Acquire);
        if write_held(c, Some(held)) {
            c.blocker.store(starts, Ordering::Release);
        } else {
            c.blocker.store(0, Ordering::Release);
        }
    }

    /// The handlers run again after a block (`blocked_on`): `held` is the one to time,
    /// in the same busy period (its clock goes on), and nobody blocks the others.
    pub fn unblocked(&self, held: Option<&Delivery>) {
        if !self.mine() {
            return;
        }
        let c = self.cells();
        c.blocker.store(0, Ordering::Release);
        write_held(c, held);
    }

    /// Whether the running handler's delivery was cancelled with `kill`.
    fn kill_asked(&self) -> bool {
        self.cancel
            .lock()
            .is_ok_and(|c| c.as_ref().is_some_and(CancelFlag::kill_asked))
    }

    /// The handler ended.
    pub fn finished(&self) {
        if self.mine() {
            self.cells().busy.store(0, Ordering::Release);
        }
    }

    /// Copy a run's counts into the slot.
    pub fn publish(&self, counts: &Summary) {
        if !self.mine() {
            return;
        }
        for ((_, n), cell) in counts.counts().iter().zip(&self.cells().counts) {
            cell.store(*n, Ordering::Release);
        }
    }

    /// Publish the counts of a running pool until the guard is dropped (and once more
    /// then): a process killed before it can report keeps what it did. With a
    /// `timeout`, also get ready for the kill of a handler past it: stop claiming and
    /// give the waiting deliveries back (and the running ones too when the held one
    /// was named as blocking them, `blocked_on`), so that only the hung message stays
    /// held (and the supervisor fails that one), then say so in the slot.
    pub fn publish_while(&self, releaser: Releaser, timeout: Option<Duration>) -> Publisher {
        let stop = Arc::new(AtomicBool::new(false));
        let slot = self.clone();
        let flag = Arc::clone(&stop);
        let thread = crate::threads::spawn("delayq-slot".into(), move || {
            let mut clock = HungClock::default();
            while !flag.load(Ordering::Acquire) {
                slot.publish(&releaser.summary());
                let c = slot.cells();
                let starts = c.starts.load(Ordering::Acquire);
                let busy = c.busy.load(Ordering::Acquire) == 1;
                if busy && c.kill_asked.load(Ordering::Acquire) != starts && slot.kill_asked() {
                    // Cancelled with `kill`: as at a timeout, the waiting deliveries go
                    // back first, then the supervisor kills the process.
                    releaser.stop_and_release_waiting();
                    slot.publish(&releaser.summary());
                    if c.starts.load(Ordering::Acquire) == starts {
                        c.kill_asked.store(starts, Ordering::Release);
                    }
                }
                if let (Some(t), Some(ran)) = (timeout, clock.observe(starts, busy, Instant::now()))
                    && HungClock::is_hung(ran, t, Duration::from_millis(c.grace_ms.load(Ordering::Acquire)))
                    && c.gave_back.load(Ordering::Acquire) != starts
                {
                    // The named blocker is the one hung: every other delivery goes
                    // back uncounted. Otherwise only the waiting ones can be known
                    // innocent; the other running ones come back after their lease.
                    let held = read_held(c);
                    let blocker = c.blocker.load(Ordering::Acquire);
                    if c.starts.load(Ordering::Acquire) != starts {
                        // Its handlers moved on meanwhile: look again next turn.
                        std::thread::park_timeout(PUBLISH_EVERY);
                        continue;
                    }
                    match held {
                        Some(held) if blocker == starts => {
                            releaser.stop_and_release_all_but(held.member, &held.lease, &held.id);
                        }
                        _ => {
                            releaser.stop_and_release_waiting();
                        }
                    }
                    slot.publish(&releaser.summary());
                    c.gave_back.store(starts, Ordering::Release);
                }
                std::thread::park_timeout(PUBLISH_EVERY);
            }
            slot.publish(&releaser.summary());
        })
        .ok();
        Publisher { stop, thread }
    }
}

/// See [`Slot::publish_while`].
#[derive(Debug)]
pub struct Publisher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_through_words() {
        let words: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(0)).collect();
        for text in ["", "a", "01234567", "0123456789abcdefXYZ"] {
            let n = store_bytes(&words, text.as_bytes());
            assert_eq!(load_bytes(&words, n), text.as_bytes());
        }
        assert_eq!(store_bytes(&words, &[7u8; 40]), 32, "cut to what fits");
    }

    #[test]
    fn a_slot_names_the_delivery_its_handler_holds_until_the_next_one() {
        let table = SlotTable::anonymous(2).expect("table");
        let slot = table.slot(1);
        let first = Delivery::for_test("order-10086", "17:1700000000000", 2, 5, 3, 1);
        slot.started(Some(&first), Duration::ZERO, true);
        let seen = table.view(1);
        assert_eq!((seen.starts, seen.busy), (1, true));
        assert_eq!(
            seen.held,
            Some(Held {
                member: 1,
                part: 3,
                id: "order-10086".into(),
                lease: "17:1700000000000".into(),
                attempt: 2,
                max_attempts: 5,
            })
        );
        slot.finished();
        let long_id = "x".repeat(MAX_ID_BYTES);
        let second = Delivery::for_test(&long_id, "18:1", 1, 1, 0, 0);
        slot.started(Some(&second), Duration::ZERO, true);
        let seen = table.view(1);
        assert_eq!(seen.starts, 2, "a new busy period");
        assert_eq!(seen.held.map(|h| (h.id, h.member)), Some((long_id, 0)));
        let unkeepable = Delivery::for_test("y", &"9".repeat(LEASE_WORDS * 8 + 1), 1, 1, 0, 0);
        slot.started(Some(&unkeepable), Duration::ZERO, true);
        assert_eq!(table.view(1).held, None, "a lease cut short would fence nothing");
        slot.started(None, Duration::ZERO, true);
        assert_eq!(table.view(1).held, None);
    }

    #[test]
    fn a_blocker_is_named_in_the_running_busy_period_until_the_next_one() {
        let table = SlotTable::anonymous(1).expect("table");
        let slot = table.slot(0);
        let oldest = Delivery::for_test("oldest", "7:1", 1, 3, 0, 0);
        let blocker = Delivery::for_test("blocker", "7:2", 2, 3, 0, 0);
        slot.blocked_on(&blocker);
        assert_eq!(table.view(0).held, None, "no handler runs: nothing to name");
        slot.started(Some(&oldest), Duration::ZERO, true);
        assert!(!table.view(0).blocking);
        slot.blocked_on(&blocker);
        let seen = table.view(0);
        assert_eq!(
            (seen.starts, seen.busy, seen.blocking),
            (1, true, true),
            "the same busy period"
        );
        assert_eq!(
            seen.held.map(|h| (h.id, h.lease, h.attempt)),
            Some(("blocker".into(), "7:2".into(), 2))
        );
        slot.unblocked(Some(&oldest));
        let seen = table.view(0);
        assert_eq!(
            (seen.starts, seen.blocking),
            (1, false),
            "the loop runs again: the same period"
        );
        assert_eq!(seen.held.map(|h| h.id), Some("oldest".into()));
        let unkeepable = Delivery::for_test("long", &"9".repeat(LEASE_WORDS * 8 + 1), 1, 1, 0, 0);
        slot.blocked_on(&unkeepable);
        assert!(!table.view(0).blocking, "a blocker it cannot name releases nothing");
        slot.blocked_on(&blocker);
        slot.started(Some(&oldest), Duration::ZERO, true);
        let seen = table.view(0);
        assert_eq!(
            (seen.starts, seen.blocking),
            (2, false),
            "a new period names no blocker"
        );
        assert_eq!(seen.held.map(|h| h.id), Some("oldest".into()));
        slot.blocked_on(&blocker);
        table.reset(0);
        assert!(!table.view(0).blocking);
    }

    #[test]
    fn a_file_table_is_shared_with_a_slot_opened_by_path_and_removed_on_drop() {
        let table = SlotTable::in_file(3).expect("table");
        let path = table.path().expect("a file").to_owned();
        let slot = Slot::open(&path, 2).expect("slot");
        assert!(Slot::open(&path, 3).is_err());
        slot.started(None, Duration::from_millis(1500), true);
        let seen = table.view(2);
        assert_eq!(
            (seen.starts, seen.busy, seen.grace, seen.held),
            (1, true, Duration::from_millis(1500), None)
        );
        // Every count, the last one too, reaches the supervisor.
        let counts = Summary::from_counts(
            Summary::default()
                .counts()
                .iter()
                .zip(1..)
                .map(|((name, _), n)| (*name, n)),
        )
        .expect("counts");
        slot.publish(&counts);
        slot.finished();
        let seen = table.view(2);
        assert_eq!((seen.busy, &seen.counts), (false, &counts));
        assert_eq!(table.view(0), SlotView::default(), "other slots untouched");
        table.reset(2);
        assert_eq!(table.view(2).counts, Summary::default());
        drop(slot);
        drop(table);
        assert!(!path.exists());
    }
}
