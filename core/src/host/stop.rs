//! Why a worker run ended: one enum for every binding, shown to users as the
//! `stopped_by` text of a run's summary (PHP's array, Python's dict, the CLI's JSON).

use std::fmt;

/// Why a worker run (one process's, or a supervised pool's) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopReason {
    /// `stop()` was called.
    Stop,
    /// SIGTERM or SIGINT.
    Signal,
    /// The run handled `max_jobs` messages.
    MaxJobs,
    /// The process held `max_memory_mb` or more.
    MaxMemory,
    /// The run lasted `max_time`.
    MaxTime,
    /// A handler ended its process (PHP's `exit()`, Python's `sys.exit()`).
    Exit,
    /// `restart_workers()` asked the pools running then to stop.
    Restart,
    /// `stop_when_empty`: nothing was due and nothing ran.
    Empty,
    /// A supervised pool gave up on processes that kept dying at their start.
    Error,
}

impl StopReason {
    /// Every reason, for parsing and tests.
    pub const ALL: [Self; 9] = [
        Self::Stop,
        Self::Signal,
        Self::MaxJobs,
        Self::MaxMemory,
        Self::MaxTime,
        Self::Exit,
        Self::Restart,
        Self::Empty,
        Self::Error,
    ];

    /// The `stopped_by` text users see.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Signal => "signal",
            Self::MaxJobs => "max_jobs",
            Self::MaxMemory => "max_memory",
            Self::MaxTime => "max_time",
            Self::Exit => "exit",
            Self::Restart => "restart",
            Self::Empty => "empty",
            Self::Error => "error",
        }
    }

    /// The reason named by `text` (as `as_str` writes it).
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == text)
    }

    /// A process ended by this goes on in a fresh one (a leak is left behind).
    pub fn recycles(self) -> bool {
        matches!(self, Self::MaxJobs | Self::MaxMemory | Self::MaxTime)
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_reads_back_from_its_text() {
        for r in StopReason::ALL {
            assert_eq!(StopReason::parse(r.as_str()), Some(r));
        }
        assert_eq!(StopReason::parse("nonsense"), None);
    }
}
