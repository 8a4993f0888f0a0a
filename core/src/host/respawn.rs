//! When a supervisor starts a dead process again, and when it gives up: a process that
//! lived is replaced at once, and so is one that its handler ended (its message pays
//! for that death); one that died at its start, or otherwise outside a handler, after a
//! back-off that doubles, and after a few such deaths in a row the pool stops (a
//! handler module that fails on import would otherwise loop).

use std::time::Duration;

use super::hung::secs;
use super::slot::SlotView;

/// When processes that die are started again, and when the pool gives up on them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RespawnPolicy {
    /// A process that ends this soon after its start, unasked, died at its start.
    pub quick_death: Duration,
    /// The pause before replacing the first of such deaths; it doubles with each more.
    pub first_backoff: Duration,
    /// The longest pause.
    pub max_backoff: Duration,
    /// Deaths at the start in a row after which the pool stops: a handler module that
    /// fails on import, or a Redis that refuses every process, would otherwise loop.
    pub give_up_after: u32,
}

impl Default for RespawnPolicy {
    fn default() -> Self {
        Self {
            quick_death: Duration::from_secs(2),
            first_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
            give_up_after: 5,
        }
    }
}

/// What a process that ended unasked was doing, as its slot shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Death {
    /// A handler ran: the handler ended its process (a kill of its own, a crash in
    /// native code, the OOM killer at its allocation). Its message pays for that: the
    /// supervisor fails the delivery the slot names, counted as an attempt; one it
    /// cannot name comes back when its lease ends, counted too. So `max_attempts`
    /// bounds how often one message ends a process, and the death is not the pool's
    /// to count: a few poison messages must not stop a pool that works.
    InHandler,
    /// No handler ran: the process died at its start (a broken bootstrap, a handler
    /// module that fails on import), between messages, or after its handler returned
    /// (while it completed the message, in a hook). No message surely pays for it: the
    /// handler's may have been acknowledged, so it is not failed, and a process that
    /// dies there each time would be started for ever.
    Outside,
}

impl Death {
    /// How the process of `view`, its slot after its death, died. A running handler
    /// whose delivery the slot cannot name (a lease too long to keep) ended it all the
    /// same: its message comes back after its lease, counted as an attempt.
    pub fn seen_in(view: &SlotView) -> Self {
        if view.busy { Self::InHandler } else { Self::Outside }
    }
}

/// What to do about a process that died.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Respawn {
    /// Start another now.
    Now,
    /// Start another after this pause.
    After(Duration),
    /// Stop the pool.
    GiveUp,
}

/// The deaths of a pool's processes, counted against its [`RespawnPolicy`].
#[derive(Debug, Clone, Default)]
pub struct Respawns {
    policy: RespawnPolicy,
    in_a_row: u32,
}

impl Respawns {
    /// Deaths counted against `policy`.
    pub fn new(policy: RespawnPolicy) -> Self {
        Self { policy, in_a_row: 0 }
    }

    /// A process ended unasked (a crash, an exit without report, a stop of its own)
    /// after it lived `lived`, as `death` says.
    ///
    /// A process that lived past `quick_death` starts the count afresh, whatever ended
    /// it. A quick death in a handler is replaced at once and leaves the count as it
    /// was: it neither adds to it (nor to the back-off) nor resets it, so handler kills
    /// between quick deaths at the start hide no crash loop, and however many there
    /// are, the pool does not give up on them.
    pub fn died(&mut self, lived: Duration, death: Death) -> Respawn {
        if lived >= self.policy.quick_death {
            self.in_a_row = 0;
            return Respawn::Now;
        }
        if death == Death::InHandler {
            return Respawn::Now;
        }
        self.in_a_row += 1;
        if self.in_a_row >= self.policy.give_up_after {
            return Respawn::GiveUp;
        }
        let doublings = (self.in_a_row - 1).min(16);
        Respawn::After(
            self.policy
                .first_backoff
                .saturating_mul(1 << doublings)
                .min(self.policy.max_backoff),
        )
    }

    /// Deaths at the start in a row so far (deaths in a handler skipped).
    pub fn in_a_row(&self) -> u32 {
        self.in_a_row
    }

    /// Why the pool gave up, for the log and the error.
    pub fn give_up_text(&self) -> String {
        format!(
            "{} worker processes in a row ended within {} s of their start; giving up (their errors are \
             above; deaths in a handler count against their messages instead)",
            self.in_a_row,
            secs(self.policy.quick_death)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::Held;

    fn policy() -> RespawnPolicy {
        RespawnPolicy {
            quick_death: Duration::from_secs(2),
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(500),
            give_up_after: 5,
        }
    }

    const QUICK: Duration = Duration::from_millis(300);

    #[test]
    fn quick_deaths_back_off_doubling_up_to_the_cap_then_give_up() {
        let mut r = Respawns::new(policy());
        let pauses: Vec<Respawn> = (0..5).map(|_| r.died(QUICK, Death::Outside)).collect();
        assert_eq!(
            pauses,
            [
                Respawn::After(Duration::from_millis(100)),
                Respawn::After(Duration::from_millis(200)),
                Respawn::After(Duration::from_millis(400)),
                Respawn::After(Duration::from_millis(500)),
                Respawn::GiveUp,
            ]
        );
        assert!(
            r.give_up_text()
                .starts_with("5 worker processes in a row ended within 2 s of their start; giving up")
        );
    }

    #[test]
    fn a_process_that_lived_resets_the_count_and_is_replaced_at_once() {
        let mut r = Respawns::new(policy());
        let quick = Duration::from_millis(10);
        for _ in 0..4 {
            assert_ne!(r.died(quick, Death::Outside), Respawn::GiveUp);
        }
        assert_eq!(r.died(Duration::from_secs(3), Death::Outside), Respawn::Now);
        assert_eq!(r.in_a_row(), 0);
        assert_eq!(
            r.died(quick, Death::Outside),
            Respawn::After(Duration::from_millis(100)),
            "counted afresh"
        );
        for _ in 0..3 {
            r.died(quick, Death::Outside);
        }
        assert_eq!(
            r.died(Duration::from_secs(3), Death::InHandler),
            Respawn::Now,
            "a handler's kill after a life resets as well"
        );
        assert_eq!(r.in_a_row(), 0);
    }

    #[test]
    fn quick_deaths_in_a_handler_are_replaced_at_once_and_never_give_up() {
        let mut r = Respawns::new(policy());
        for n in 0..50 {
            assert_eq!(r.died(QUICK, Death::InHandler), Respawn::Now, "death {n}");
        }
        assert_eq!(r.in_a_row(), 0);
        assert_eq!(
            r.died(QUICK, Death::Outside),
            Respawn::After(Duration::from_millis(100)),
            "no back-off grew from them"
        );
    }

    #[test]
    fn handler_deaths_between_quick_deaths_at_the_start_neither_hide_nor_reset_them() {
        let mut r = Respawns::new(policy());
        let mut seen = Vec::new();
        for _ in 0..5 {
            seen.push(r.died(QUICK, Death::Outside));
            // Each replaced at once, without waiting out the back-off of the others.
            assert_eq!(r.died(QUICK, Death::InHandler), Respawn::Now);
            assert_eq!(r.died(Duration::ZERO, Death::InHandler), Respawn::Now);
        }
        assert_eq!(
            seen,
            [
                Respawn::After(Duration::from_millis(100)),
                Respawn::After(Duration::from_millis(200)),
                Respawn::After(Duration::from_millis(400)),
                Respawn::After(Duration::from_millis(500)),
                Respawn::GiveUp,
            ],
            "the same as without the handler deaths"
        );
    }

    #[test]
    fn only_a_running_handler_makes_a_death_its_own() {
        let held = Held {
            member: 0,
            part: 0,
            id: "order-10086".into(),
            lease: "17:1700000000000".into(),
            attempt: 1,
            max_attempts: 3,
        };
        let running = SlotView {
            starts: 3,
            busy: true,
            held: Some(held.clone()),
            ..SlotView::default()
        };
        assert_eq!(Death::seen_in(&running), Death::InHandler);
        let unnamed = SlotView {
            held: None,
            ..running.clone()
        };
        assert_eq!(
            Death::seen_in(&unnamed),
            Death::InHandler,
            "its message comes back after its lease, counted"
        );
        let returned = SlotView { busy: false, ..running };
        assert_eq!(
            Death::seen_in(&returned),
            Death::Outside,
            "its handler returned: its message may be acknowledged"
        );
        assert_eq!(
            Death::seen_in(&SlotView::default()),
            Death::Outside,
            "no handler started"
        );
    }
}
