//! The report a supervised process writes to its supervisor when it ends: one JSON
//! object on a pipe, the same from a forked PHP process and an exec'd Python one.
//!
//! Tasks: encode and decode it. A run that ended is its counts and `stopped_by` (the
//! shape of the summary users get from a run, so Python's process can write its run's
//! dict as it is); a run that could not go on is `{"fatal": text}`.

use serde_json::{Map, Value};

use super::stop::StopReason;
use crate::worker::Summary;

/// What a process tells its supervisor when it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// The run ended: its counts, and why.
    Done {
        /// The run's counts.
        counts: Summary,
        /// Why it ended.
        stopped_by: Option<StopReason>,
    },
    /// The process could not run (its `on_start` failed, a handler error that is not
    /// the message's): the pool stops and the supervisor raises this.
    Fatal(String),
}

impl Report {
    /// A worker process's hook (`on_start`, `on_stop`) raised: the pool cannot go on
    /// without it, so the process is not started again for ever; `what` is the error.
    pub fn hook_failed(hook: &str, what: &str) -> Self {
        Self::Fatal(format!("{hook} failed: {what}"))
    }

    /// The report as one line of JSON.
    pub fn encode(&self) -> String {
        let mut object = Map::new();
        match self {
            Self::Done { counts, stopped_by } => {
                for (name, n) in counts.counts() {
                    object.insert(name.to_owned(), Value::from(n));
                }
                object.insert(
                    "stopped_by".to_owned(),
                    stopped_by.map_or(Value::Null, |r| Value::from(r.as_str())),
                );
            }
            Self::Fatal(text) => {
                object.insert("fatal".to_owned(), Value::from(text.as_str()));
            }
        }
        let mut line = Value::Object(object).to_string();
        line.push('\n');
        line
    }

    /// A report read from the pipe; None for anything else (a process that died
    /// before it wrote one, or wrote part of one). Keys it does not know are skipped.
    pub fn decode(text: &str) -> Option<Self> {
        let Value::Object(object) = serde_json::from_str::<Value>(text.trim()).ok()? else {
            return None;
        };
        if let Some(fatal) = object.get("fatal") {
            return Some(Self::Fatal(fatal.as_str().unwrap_or_default().to_owned()));
        }
        let known: Vec<(&'static str, u64)> = Summary::default()
            .counts()
            .iter()
            .map(|(name, _)| (*name, object.get(*name).and_then(Value::as_u64).unwrap_or(0)))
            .collect();
        let counts = Summary::from_counts(known).ok()?;
        let stopped_by = object
            .get("stopped_by")
            .and_then(Value::as_str)
            .and_then(StopReason::parse);
        Some(Self::Done { counts, stopped_by })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_read_back_as_written() {
        let done = Report::Done {
            counts: Summary {
                handled: 5,
                acked: 4,
                failed: 1,
                retried: 1,
                ..Summary::default()
            },
            stopped_by: Some(StopReason::Exit),
        };
        assert_eq!(Report::decode(&done.encode()), Some(done));
        let fatal = Report::Fatal("on_start failed: \"no database\"\nline two".into());
        assert_eq!(Report::decode(&fatal.encode()), Some(fatal));
    }

    #[test]
    fn a_python_run_dict_is_a_report_and_garbage_is_none() {
        let text = r#"{"handled": 2, "acked": 2, "failed": 0, "retried": 0, "dead": 0, "lease_lost": 0,
            "gone": 0, "released": 0, "unwritten": 0, "stopped_by": "max_jobs", "extra": 1}"#;
        let Some(Report::Done { counts, stopped_by }) = Report::decode(text) else {
            panic!("not decoded")
        };
        assert_eq!((counts.acked, stopped_by), (2, Some(StopReason::MaxJobs)));
        assert_eq!(Report::decode(""), None);
        assert_eq!(Report::decode("{\"handled\": 3"), None, "cut short");
        assert_eq!(Report::decode("[1]"), None);
    }
}
