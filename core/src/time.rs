//! Due times. Relative delays are resolved by the Lua scripts against Redis's own
//! `TIME`, so producers and consumers on hosts with skewed clocks still agree.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// Longest delay accepted: a century is plenty and keeps scores far from 2^53.
pub const MAX_DELAY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// When a message becomes due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// After this delay, measured on the Redis server's clock.
    In(Duration),
    /// At this Unix time in milliseconds (a past time means "due now").
    AtUnixMs(i64),
}

impl Due {
    /// Due now.
    pub const NOW: Self = Self::In(Duration::ZERO);

    /// `at` as an absolute due time.
    pub fn at(at: SystemTime) -> Self {
        match at.duration_since(UNIX_EPOCH) {
            Ok(since) => Self::AtUnixMs(i64::try_from(ceil_ms(since)).unwrap_or(i64::MAX)),
            Err(_) => Self::AtUnixMs(0),
        }
    }

    /// A delay given in (fractional) seconds, as the bindings receive it.
    pub fn from_delay_secs(seconds: f64) -> Result<Self> {
        Ok(Self::In(delay_from_secs("delay", seconds)?))
    }

    /// An absolute Unix time given in (fractional) seconds.
    pub fn from_unix_secs(seconds: f64) -> Result<Self> {
        if !seconds.is_finite() || seconds < 0.0 {
            return Err(Error::invalid(
                "at",
                format!("must be a finite Unix time in seconds >= 0, got {seconds}"),
            ));
        }
        let max = (now_unix_ms() as f64 / 1000.0) + MAX_DELAY.as_secs_f64();
        if seconds > max {
            return Err(Error::invalid("at", format!("{seconds} is more than 100 years ahead")));
        }
        Ok(Self::AtUnixMs((seconds * 1000.0).ceil() as i64))
    }

    /// (timing, ms) as the scripts take them: "delay" from the server's clock, or
    /// "at" a Unix time.
    pub(crate) fn script_args(self) -> (&'static str, i64) {
        match self {
            Self::In(d) => ("delay", i64::try_from(ceil_ms(d)).unwrap_or(i64::MAX)),
            Self::AtUnixMs(ms) => ("at", ms.max(0)),
        }
    }

    pub(crate) fn validate(self) -> Result<Self> {
        if let Self::In(d) = self
            && d > MAX_DELAY
        {
            return Err(Error::invalid("delay", format!("{d:?} is more than 100 years")));
        }
        Ok(self)
    }
}

impl From<Duration> for Due {
    fn from(d: Duration) -> Self {
        Self::In(d)
    }
}

impl From<SystemTime> for Due {
    fn from(at: SystemTime) -> Self {
        Self::at(at)
    }
}

/// Validate a number of seconds coming from a binding (NaN, infinities and negative
/// values are refused with a message that names `what`).
pub fn delay_from_secs(what: &str, seconds: f64) -> Result<Duration> {
    if seconds.is_nan() {
        return Err(Error::invalid(what, "must be a number of seconds, got NaN"));
    }
    if seconds.is_infinite() {
        return Err(Error::invalid(what, format!("must be finite, got {seconds}")));
    }
    if seconds < 0.0 {
        return Err(Error::invalid(what, format!("must not be negative, got {seconds}")));
    }
    if seconds > MAX_DELAY.as_secs_f64() {
        return Err(Error::invalid(
            what,
            format!("must be at most 100 years, got {seconds} s"),
        ));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Rounded up, so a message is never handed out before its time.
pub(crate) fn ceil_ms(d: Duration) -> u128 {
    d.as_nanos().div_ceil(1_000_000)
}

/// A span for people: "850 ms", "12.5 s", "4 min 10 s", "2 h 5 min".
pub(crate) fn human_ms(ms: i64) -> String {
    let ms = ms.max(0);
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{} min {} s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{} h {} min", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// Milliseconds as a number of seconds that people type: "0.3", "1.5", "2".
pub(crate) fn seconds_text(ms: u128) -> String {
    let text = format!("{}.{:03}", ms / 1000, ms % 1000);
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

pub(crate) fn now_unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_read_as_people_say_them() {
        let shown: Vec<String> = [-5, 850, 12_500, 250_000, 7_500_000]
            .into_iter()
            .map(human_ms)
            .collect();
        assert_eq!(shown, ["0 ms", "850 ms", "12.5 s", "4 min 10 s", "2 h 5 min"]);
    }

    #[test]
    fn seconds_read_as_typed() {
        let shown: Vec<String> = [300, 1500, 2000, 1, 0, 90_010].into_iter().map(seconds_text).collect();
        assert_eq!(shown, ["0.3", "1.5", "2", "0.001", "0", "90.01"]);
    }

    #[test]
    fn bad_delays_are_named() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.5, 1e12] {
            let err = Due::from_delay_secs(bad).expect_err("refused");
            assert!(err.to_string().starts_with("invalid delay"), "{err}");
            assert!(err.is_invalid_input());
        }
    }

    #[test]
    fn sub_millisecond_delays_round_up() {
        assert_eq!(Due::In(Duration::from_micros(1)).script_args(), ("delay", 1));
        assert_eq!(Due::In(Duration::from_micros(1500)).script_args(), ("delay", 2));
        assert_eq!(Due::from_delay_secs(0.25).expect("valid").script_args(), ("delay", 250));
    }

    #[test]
    fn absolute_times() {
        assert_eq!(Due::from_unix_secs(1.5).expect("valid").script_args(), ("at", 1500));
        assert!(Due::from_unix_secs(f64::NAN).is_err());
        assert!(Due::from_unix_secs(-1.0).is_err());
    }
}
