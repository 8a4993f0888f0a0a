//! The fetchers' wake timer (when each partition is next looked at, woken early by
//! producers, stops and found work) and the room left in the prefetch buffer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// When each partition should next be looked at, shared by the fetchers; wakes them
/// on stop, when a producer publishes an earlier due time, and when a fetcher finds
/// more work than it can take.
pub(super) struct Wake {
    pub(super) state: Mutex<WakeState>,
    pub(super) cv: Condvar,
}

pub(super) struct WakeState {
    pub(super) epoch: u64,
    /// A reading of the queue clock, so that due times (server ms) become local
    /// deadlines.
    pub(super) clock: Option<Reading>,
    /// Per partition: the earliest due time producers announced, or "now" after a
    /// kick, as a local deadline. A claim of the partition clears a passed one.
    pub(super) announced: Vec<Option<Instant>>,
    /// Per partition: when the last claim said its next message is due; `None` when
    /// it found the partition empty.
    pub(super) next_due: Vec<Option<Instant>>,
}

impl WakeState {
    pub(super) fn due_at(&self, part: usize) -> Option<Instant> {
        match (self.announced[part], self.next_due[part]) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The queue clock's reading by a claim: in microseconds, mapped to the middle of the
/// call's round trip on the local monotonic clock.
#[derive(Clone, Copy)]
pub(super) struct Reading {
    local: Instant,
    server_us: i64,
    round_trip: Duration,
    received: Instant,
}

/// How long a tight reading is kept over looser ones (see `Wake::set_clock`): both
/// clocks run at one rate, but NTP may slew Redis's a little.
const READING_KEPT: Duration = Duration::from_secs(10);

/// What a fetcher should do next.
pub(super) enum Pick {
    /// Claim from this partition now; `due` partitions are due in all.
    Claim { part: usize, due: usize },
    /// Nothing is due before this moment (`None`: nothing known to be due at all).
    Sleep(Option<Instant>),
}

impl Wake {
    pub(super) fn new(partitions: usize) -> Self {
        Self {
            state: Mutex::new(WakeState {
                epoch: 0,
                clock: None,
                announced: vec![None; partitions],
                next_due: vec![None; partitions],
            }),
            cv: Condvar::new(),
        }
    }

    /// Look at every partition now (start, a new subscription, the end of a stall).
    pub(super) fn kick(&self) {
        let now = Instant::now();
        let mut st = self.state.lock();
        st.announced.iter_mut().for_each(|a| *a = Some(now));
        st.epoch += 1;
        drop(st);
        self.cv.notify_all();
    }

    /// Wake every waiter without changing what is due (stop).
    pub(super) fn interrupt(&self) {
        self.state.lock().epoch += 1;
        self.cv.notify_all();
    }

    pub(super) fn epoch(&self) -> u64 {
        self.state.lock().epoch
    }

    /// A claim sent at `sent` and answered at `received` read the queue clock at
    /// `server_us`, somewhere in between: its middle is the estimate. A call that took
    /// more than twice as long as the reading in force (a reconnect, a script loaded
    /// again, a slow moment) is a loose estimate and is not taken, unless that reading
    /// is older than `READING_KEPT`.
    pub(super) fn set_clock(&self, sent: Instant, received: Instant, server_us: i64) {
        let round_trip = received.saturating_duration_since(sent);
        let reading = Reading {
            local: sent + round_trip / 2,
            server_us,
            round_trip,
            received,
        };
        let mut st = self.state.lock();
        let take = st.clock.is_none_or(|kept| {
            round_trip <= kept.round_trip * 2 || received.saturating_duration_since(kept.received) > READING_KEPT
        });
        if take {
            st.clock = Some(reading);
        }
    }

    /// The Redis server's clock now, from the last claim's reading.
    pub(super) fn server_now_ms(&self) -> Option<i64> {
        self.server_ms_at(Instant::now())
    }

    /// The Redis server's clock at `at` (no earlier than the last claim's reading).
    pub(super) fn server_ms_at(&self, at: Instant) -> Option<i64> {
        let r = self.state.lock().clock?;
        let elapsed = i64::try_from(at.saturating_duration_since(r.local).as_micros()).unwrap_or(i64::MAX / 2);
        Some(r.server_us.saturating_add(elapsed).div_euclid(1000))
    }

    /// When the queue clock reaches `server_ms` here. The server alone decides what is
    /// due, so a deadline that comes early costs one more claim, never an early start.
    pub(super) fn local_deadline(st: &WakeState, server_ms: i64) -> Option<Instant> {
        let r = st.clock?;
        let ahead = server_ms.saturating_mul(1000).saturating_sub(r.server_us);
        Some(if ahead <= 0 {
            r.local
        } else {
            r.local + Duration::from_micros(u64::try_from(ahead).unwrap_or(0))
        })
    }

    /// A producer announced a message due at `server_ms` on partition `part`.
    pub(super) fn offer_due(&self, part: usize, server_ms: Option<i64>) {
        let mut st = self.state.lock();
        if part >= st.announced.len() {
            return;
        }
        let at = server_ms
            .and_then(|ms| Self::local_deadline(&st, ms))
            .unwrap_or_else(Instant::now);
        if st.announced[part].is_none_or(|e| at < e) {
            st.announced[part] = Some(at);
            st.epoch += 1;
            drop(st);
            self.cv.notify_all();
        }
    }

    /// Whether some partition is known to have a message due (announced, or the last
    /// claim filled its batch), or is to be looked at now.
    pub(super) fn due_now(&self) -> bool {
        let st = self.state.lock();
        let now = Instant::now();
        (0..st.announced.len()).any(|part| st.due_at(part).is_some_and(|t| t <= now))
    }

    /// The first partition from `cursor` on that is due now, and the epoch this
    /// answer was read in (for `wait`).
    pub(super) fn pick(&self, cursor: usize, now: Instant) -> (Pick, u64) {
        let st = self.state.lock();
        let n = st.announced.len();
        let mut earliest: Option<Instant> = None;
        let mut first_due = None;
        let mut due = 0;
        for part in (cursor..n).chain(0..cursor) {
            match st.due_at(part) {
                Some(t) if t <= now => {
                    first_due.get_or_insert(part);
                    due += 1;
                }
                Some(t) => earliest = Some(earliest.map_or(t, |e| e.min(t))),
                None => {}
            }
        }
        let pick = match first_due {
            Some(part) => Pick::Claim { part, due },
            None => Pick::Sleep(earliest),
        };
        (pick, st.epoch)
    }

    /// A claim of `part` starts: announcements it answers are spent.
    pub(super) fn begin_claim(&self, part: usize, now: Instant) {
        let mut st = self.state.lock();
        if st.announced[part].is_some_and(|a| a <= now) {
            st.announced[part] = None;
        }
    }

    /// A claim of `part` ended: it filled its batch (`more`, so look again now and let
    /// idle siblings join in), or the partition's next message is due at `next_ms`
    /// (server clock; negative when it is empty).
    pub(super) fn end_claim(&self, part: usize, more: bool, next_ms: i64) {
        let mut st = self.state.lock();
        st.next_due[part] = if more {
            Some(Instant::now())
        } else if next_ms >= 0 {
            Self::local_deadline(&st, next_ms)
        } else {
            None
        };
        if more {
            st.epoch += 1;
            drop(st);
            self.cv.notify_all();
        }
    }

    /// As `end_claim` with nothing more to take now: `part` is next due at `next_ms`,
    /// but not before `not_before` (what is due there waits for something else).
    pub(super) fn end_claim_not_before(&self, part: usize, next_ms: i64, not_before: Instant) {
        let mut st = self.state.lock();
        let due = (next_ms >= 0).then(|| Self::local_deadline(&st, next_ms)).flatten();
        st.next_due[part] = Some(due.map_or(not_before, |d| d.max(not_before)));
    }

    /// A claim of `part` failed: look again once the caller's pause is over.
    pub(super) fn retry_claim(&self, part: usize) {
        self.state.lock().announced[part] = Some(Instant::now());
    }

    /// Sleep until `deadline`, a change after `seen` (an announcement, a kick), or
    /// stop.
    pub(super) fn wait(&self, deadline: Option<Instant>, seen: u64, stop: &AtomicBool) {
        let mut st = self.state.lock();
        loop {
            if stop.load(Ordering::Acquire) || st.epoch != seen {
                return;
            }
            match deadline {
                Some(t) if t <= Instant::now() => return,
                Some(t) => {
                    self.cv.wait_until(&mut st, t);
                }
                None => self.cv.wait(&mut st),
            }
        }
    }
}

/// Room in the prefetch buffer: claimed but not yet completed deliveries.
pub(super) struct Slots {
    pub(super) free: Mutex<usize>,
    pub(super) cv: Condvar,
}

impl Slots {
    pub(super) fn acquire_up_to(&self, want: usize, stop: &AtomicBool) -> usize {
        let mut free = self.free.lock();
        while *free == 0 {
            if stop.load(Ordering::Acquire) {
                return 0;
            }
            self.cv.wait(&mut free);
        }
        let got = want.min(*free);
        *free -= got;
        got
    }

    pub(super) fn wait_for_release(&self, limit: Duration) {
        let mut free = self.free.lock();
        self.cv.wait_for(&mut free, limit);
    }

    pub(super) fn release(&self, n: usize) {
        if n > 0 {
            *self.free.lock() += n;
            self.cv.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim_of(pick: Pick) -> Option<(usize, usize)> {
        match pick {
            Pick::Claim { part, due } => Some((part, due)),
            Pick::Sleep(_) => None,
        }
    }

    #[test]
    fn a_kick_makes_every_partition_due_now_and_wakes_waiters() {
        let wake = Wake::new(3);
        let now = Instant::now();
        let (pick, epoch) = wake.pick(0, now);
        assert!(matches!(pick, Pick::Sleep(None)), "nothing is known at first");
        wake.kick();
        assert_ne!(wake.epoch(), epoch, "a waiter of the old epoch returns");
        let later = Instant::now();
        assert_eq!(
            claim_of(wake.pick(1, later).0),
            Some((1, 3)),
            "from the cursor on, all three due"
        );
        wake.begin_claim(1, later);
        assert_eq!(
            claim_of(wake.pick(1, later).0),
            Some((2, 2)),
            "a claim spends its announcement"
        );
    }

    #[test]
    fn announced_and_reported_due_times_become_local_deadlines() {
        let wake = Wake::new(2);
        let local = Instant::now();
        // 250 µs past the millisecond the reading names, in the middle of the call.
        wake.set_clock(
            local - Duration::from_micros(100),
            local + Duration::from_micros(100),
            1_000_000_250,
        );
        wake.offer_due(0, Some(1_000_500));
        wake.end_claim(1, false, 1_002_000);
        match wake.pick(0, local).0 {
            Pick::Sleep(Some(t)) => assert_eq!(t, local + Duration::from_micros(499_750), "the earlier of the two"),
            _ => panic!("nothing is due yet"),
        }
        assert_eq!(
            claim_of(wake.pick(0, local + Duration::from_millis(500)).0),
            Some((0, 1))
        );
        assert_eq!(claim_of(wake.pick(0, local + Duration::from_secs(2)).0), Some((0, 2)));
        // A later announcement does not postpone an earlier one.
        wake.offer_due(0, Some(1_009_000));
        assert_eq!(
            claim_of(wake.pick(0, local + Duration::from_millis(500)).0),
            Some((0, 1))
        );
    }

    #[test]
    fn a_full_claim_looks_again_now_and_an_empty_one_forgets_the_partition() {
        let wake = Wake::new(1);
        let local = Instant::now();
        wake.set_clock(local, local, 5_000_000);
        let epoch = wake.epoch();
        wake.end_claim(0, true, 9_000);
        assert_ne!(wake.epoch(), epoch, "idle siblings are woken to join in");
        assert!(wake.due_now());
        wake.end_claim(0, false, -1);
        assert!(!wake.due_now());
        assert!(matches!(wake.pick(0, Instant::now()).0, Pick::Sleep(None)));
    }

    #[test]
    fn a_loose_reading_of_the_clock_does_not_replace_a_tight_one_until_it_is_old() {
        let wake = Wake::new(1);
        let t0 = Instant::now();
        let ms = Duration::from_millis(1);
        let mapped = |wake: &Wake| {
            let st = wake.state.lock();
            Wake::local_deadline(&st, 10_000).expect("a reading is kept")
        };
        // Read at 1 000 ms, in a call of 1 ms: 10 000 ms is due 9 s after its middle.
        wake.set_clock(t0, t0 + ms, 1_000_000);
        assert_eq!(mapped(&wake), t0 + ms / 2 + Duration::from_secs(9));
        // A call of 40 ms (a reconnect): its middle is no estimate; the reading stays.
        wake.set_clock(t0 + 2 * ms, t0 + 42 * ms, 1_021_000);
        assert_eq!(mapped(&wake), t0 + ms / 2 + Duration::from_secs(9));
        // A call as tight as the one in force is taken.
        wake.set_clock(t0 + 50 * ms, t0 + 52 * ms, 1_050_000);
        assert_eq!(mapped(&wake), t0 + 51 * ms + Duration::from_millis(8_950));
        // Past READING_KEPT a loose call is taken too.
        let late = t0 + READING_KEPT + 100 * ms;
        wake.set_clock(late, late + 40 * ms, 2_000_000);
        assert_eq!(mapped(&wake), late + 20 * ms + Duration::from_secs(8));
    }
}
