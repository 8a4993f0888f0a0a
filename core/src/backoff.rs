//! Retry delays after a failed attempt.

use std::time::Duration;

use rand::Rng;

/// Exponential backoff with "equal jitter": half the step is fixed, half random, so
/// a burst of failures spreads out instead of retrying in lockstep.
pub(crate) fn retry_delay(attempt: u32, base: Duration, max: Duration) -> Duration {
    let exp = attempt.saturating_sub(1).min(40);
    let step = base.saturating_mul(1u32 << exp.min(31)).min(max);
    let half = step / 2;
    let jitter = rand::rng().random_range(0..=half.as_millis().max(1) as u64);
    (half + Duration::from_millis(jitter)).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_stays_within_bounds() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(10);
        for attempt in 1..60 {
            let step = (base * 2u32.saturating_pow((attempt - 1).min(31))).min(max);
            for _ in 0..20 {
                let d = retry_delay(attempt, base, max);
                assert!(
                    d >= step / 2 && d <= step.max(Duration::from_millis(1)),
                    "{attempt}: {d:?} vs {step:?}"
                );
            }
        }
    }
}
