//! When a supervisor starts a dead process again, and when it gives up: a process that
//! lived is replaced at once; one that died at its start, after a back-off that
//! doubles, and after a few such deaths in a row the pool stops (a handler module that
//! fails on import would otherwise loop).

use std::time::Duration;

use super::hung::secs;

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
    /// after it lived `lived`.
    pub fn died(&mut self, lived: Duration) -> Respawn {
        if lived >= self.policy.quick_death {
            self.in_a_row = 0;
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

    /// Deaths at the start in a row so far.
    pub fn in_a_row(&self) -> u32 {
        self.in_a_row
    }

    /// Why the pool gave up, for the log and the error.
    pub fn give_up_text(&self) -> String {
        format!(
            "{} worker processes in a row ended within {} s of their start; giving up (their errors are above)",
            self.in_a_row,
            secs(self.policy.quick_death)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RespawnPolicy {
        RespawnPolicy {
            quick_death: Duration::from_secs(2),
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(500),
            give_up_after: 5,
        }
    }

    #[test]
    fn quick_deaths_back_off_doubling_up_to_the_cap_then_give_up() {
        let mut r = Respawns::new(policy());
        let quick = Duration::from_millis(300);
        let pauses: Vec<Respawn> = (0..5).map(|_| r.died(quick)).collect();
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
            assert_ne!(r.died(quick), Respawn::GiveUp);
        }
        assert_eq!(r.died(Duration::from_secs(3)), Respawn::Now);
        assert_eq!(r.in_a_row(), 0);
        assert_eq!(
            r.died(quick),
            Respawn::After(Duration::from_millis(100)),
            "counted afresh"
        );
    }
}
