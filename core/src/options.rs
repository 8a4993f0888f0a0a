//! A table of options, once: the name, kind, range, default and doc line of each. The
//! worker's (`host::WORKER_OPTIONS`) and the queue's (`queue::QUEUE_OPTIONS`) are two
//! such tables; PHP's options arrays and Python's keywords take their defaults and
//! bounds from them, so both bindings agree by construction, and a test checks the PHP
//! stub, the `.pyi` and the docs against them.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::time::delay_from_secs;

/// What an option holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A whole number within `min..=max`.
    Count,
    /// Seconds (a number) within `min..=max`.
    Seconds,
    /// True or false.
    Flag,
    /// Text; `choices`, when not empty, lists the values allowed.
    Text,
    /// A callable (a hook).
    Callable,
    /// A list of queues.
    Queues,
    /// A list of exception classes.
    Classes,
}

impl Kind {
    /// Whether the core reads a value of this kind (`Value`); the others (hooks,
    /// queues, classes) only a binding can hold.
    pub fn is_value(self) -> bool {
        matches!(self, Self::Count | Self::Seconds | Self::Flag | Self::Text)
    }

    /// The name the docs and errors use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Count => "count",
            Self::Seconds => "seconds",
            Self::Flag => "flag",
            Self::Text => "text",
            Self::Callable => "callable",
            Self::Queues => "queues",
            Self::Classes => "classes",
        }
    }
}

/// An option's value when it is not given.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Default {
    /// A whole number.
    Count(i64),
    /// Seconds.
    Seconds(f64),
    /// True or false.
    Flag(bool),
    /// Text.
    Text(&'static str),
    /// Not set: no limit, no hook, an empty list.
    Unset,
}

/// Which bindings take an option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Takers {
    /// PHP takes it.
    pub php: bool,
    /// Python takes it.
    pub python: bool,
}

/// Both bindings.
pub const BOTH: Takers = Takers {
    php: true,
    python: true,
};
/// PHP only.
pub const PHP: Takers = Takers {
    php: true,
    python: false,
};
/// Python only.
pub const PYTHON: Takers = Takers {
    php: false,
    python: true,
};

/// Longest span an option in seconds takes (what a delay takes, `MAX_DELAY`).
pub const MAX_SECONDS: f64 = crate::time::MAX_DELAY.as_secs() as f64;

/// One row of a table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OptionRow {
    /// As both bindings spell it.
    pub name: &'static str,
    /// What it holds.
    pub kind: Kind,
    /// Lower bound of counts and seconds (inclusive; seconds may also be excluded at
    /// 0, see `above_zero`).
    pub min: f64,
    /// Upper bound (inclusive).
    pub max: f64,
    /// Seconds that must be above zero (`min` is then 0, excluded).
    pub above_zero: bool,
    /// The values a text may take (none: any text).
    pub choices: &'static [&'static str],
    /// Its value when not given.
    pub default: Default,
    /// Which bindings take it.
    pub takers: Takers,
    /// One line for the docs.
    pub doc: &'static str,
}

/// A whole number within `min..=max`.
pub const fn count(
    name: &'static str,
    min: i64,
    max: i64,
    default: Default,
    takers: Takers,
    doc: &'static str,
) -> OptionRow {
    row(name, Kind::Count, min as f64, max as f64, default, takers, doc)
}

/// Seconds, at least `min`.
pub const fn seconds(name: &'static str, min: f64, default: Default, takers: Takers, doc: &'static str) -> OptionRow {
    row(name, Kind::Seconds, min, MAX_SECONDS, default, takers, doc)
}

/// Seconds that must be above zero.
pub const fn positive_seconds(name: &'static str, default: Default, takers: Takers, doc: &'static str) -> OptionRow {
    let mut r = row(name, Kind::Seconds, 0.0, MAX_SECONDS, default, takers, doc);
    r.above_zero = true;
    r
}

/// Text, one of `choices` unless they are empty.
pub const fn text(
    name: &'static str,
    choices: &'static [&'static str],
    default: Default,
    takers: Takers,
    doc: &'static str,
) -> OptionRow {
    let mut r = row(name, Kind::Text, 0.0, 0.0, default, takers, doc);
    r.choices = choices;
    r
}

/// An option without bounds: a flag, a hook, a list.
pub const fn other(name: &'static str, kind: Kind, default: Default, takers: Takers, doc: &'static str) -> OptionRow {
    row(name, kind, 0.0, 0.0, default, takers, doc)
}

const fn row(
    name: &'static str,
    kind: Kind,
    min: f64,
    max: f64,
    default: Default,
    takers: Takers,
    doc: &'static str,
) -> OptionRow {
    OptionRow {
        name,
        kind,
        min,
        max,
        above_zero: false,
        choices: &[],
        default,
        takers,
        doc,
    }
}

/// The row of `name` in `table`.
///
/// # Panics
/// When `name` is not in it: the bindings and the core ask for their own literal names,
/// and a unit test asks for every one of them.
pub fn find(table: &'static [OptionRow], name: &str) -> &'static OptionRow {
    table
        .iter()
        .find(|o| o.name == name)
        .unwrap_or_else(|| panic!("no option {name:?} in the table"))
}

/// A value as a binding read it, by its row's kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A whole number.
    Count(i64),
    /// Seconds.
    Seconds(f64),
    /// True or false.
    Flag(bool),
    /// Text.
    Text(String),
}

impl OptionRow {
    /// The default of a count.
    pub fn default_count(&self) -> Option<i64> {
        match self.default {
            Default::Count(n) => Some(n),
            _ => None,
        }
    }

    /// The default of a span.
    pub fn default_duration(&self) -> Option<Duration> {
        match self.default {
            Default::Seconds(s) => Some(Duration::from_secs_f64(s)),
            _ => None,
        }
    }

    /// Lower and upper bound of a count.
    pub fn count_range(&self) -> (i64, i64) {
        (self.min as i64, self.max as i64)
    }

    /// `value` if within the bounds, or an error naming the option and its range.
    pub fn check_count(&self, value: i64) -> Result<i64> {
        let (lo, hi) = self.count_range();
        if value < lo || value > hi {
            return Err(Error::invalid(
                self.name,
                format!("must be between {lo} and {hi}, got {value}"),
            ));
        }
        Ok(value)
    }

    /// A count held in a `usize` or `u32` field, checked the same way.
    pub fn check_size(&self, value: u64) -> Result<()> {
        self.check_count(i64::try_from(value).unwrap_or(i64::MAX)).map(drop)
    }

    /// `secs` as a span if within the bounds, or an error naming the option and its range.
    pub fn check_seconds(&self, secs: f64) -> Result<Duration> {
        let span = delay_from_secs(self.name, secs)?;
        if self.above_zero && span.is_zero() {
            return Err(Error::invalid(
                self.name,
                format!("must be above 0 seconds, got {secs}"),
            ));
        }
        if !self.above_zero && secs < self.min {
            return Err(Error::invalid(
                self.name,
                format!("must be at least {} s, got {secs}", self.min),
            ));
        }
        Ok(span)
    }

    /// A span held in a `Duration` field, checked the same way.
    pub fn check_duration(&self, span: Duration) -> Result<()> {
        self.check_seconds(span.as_secs_f64()).map(drop)
    }

    /// `value` if it is one of the choices (or there are none), or an error naming them.
    pub fn check_text(&self, value: String) -> Result<String> {
        if self.choices.is_empty() || self.choices.contains(&value.as_str()) {
            return Ok(value);
        }
        let choices: Vec<String> = self.choices.iter().map(|c| format!("'{c}'")).collect();
        Err(Error::invalid(
            self.name,
            format!("must be {}, got {value:?}", choices.join(" or ")),
        ))
    }

    /// An error naming the option, the kind it takes and the kind it was given.
    pub fn wrong_kind(&self, given: &Value) -> Error {
        let given = match given {
            Value::Count(_) => "count",
            Value::Seconds(_) => "seconds",
            Value::Flag(_) => "flag",
            Value::Text(_) => "text",
        };
        Error::invalid(self.name, format!("takes {}, a {given} was given", self.kind.as_str()))
    }
}

/// Checks every table's rows: unique names, a taker each, and defaults within bounds.
#[cfg(test)]
pub(crate) fn check_table(table: &[OptionRow]) {
    for (i, o) in table.iter().enumerate() {
        assert!(table[..i].iter().all(|p| p.name != o.name), "{} twice", o.name);
        assert!(o.takers.php || o.takers.python, "{} is taken by nobody", o.name);
        match (o.kind, o.default) {
            (Kind::Count, Default::Count(n)) => assert!(o.check_count(n).is_ok(), "{}", o.name),
            (Kind::Seconds, Default::Seconds(s)) => assert!(o.check_seconds(s).is_ok(), "{}", o.name),
            (Kind::Text, Default::Text(t)) => assert!(o.check_text(t.to_owned()).is_ok(), "{}", o.name),
            (Kind::Flag, Default::Flag(_)) | (_, Default::Unset) => {}
            (kind, default) => panic!("{}: a {kind:?} with default {default:?}", o.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static TABLE: [OptionRow; 3] = [
        count("n", 1, 64, Default::Count(2), BOTH, "a count"),
        positive_seconds("t", Default::Unset, BOTH, "a span"),
        text("layout", &["native", "seed"], Default::Text("native"), BOTH, "a choice"),
    ];

    #[test]
    fn rows_check_their_bounds_by_name() {
        check_table(&TABLE);
        let n = find(&TABLE, "n");
        assert_eq!(n.check_count(64).ok(), Some(64));
        let e = n.check_count(65).expect_err("above the range").to_string();
        assert!(
            e.contains("n") && e.contains("between 1 and 64") && e.contains("65"),
            "{e}"
        );
        assert!(n.check_size(u64::MAX).is_err());
        let t = find(&TABLE, "t");
        assert!(t.check_seconds(0.0).expect_err("zero").to_string().contains("above 0"));
        assert!(t.check_seconds(f64::NAN).is_err());
        assert!(t.check_duration(Duration::from_millis(1)).is_ok());
    }

    #[test]
    fn a_text_with_choices_takes_only_them() {
        let layout = find(&TABLE, "layout");
        assert_eq!(layout.check_text("seed".into()).ok().as_deref(), Some("seed"));
        let e = layout.check_text("Seed".into()).expect_err("not a choice").to_string();
        assert!(e.contains("'native' or 'seed'") && e.contains("\"Seed\""), "{e}");
        let e = layout.wrong_kind(&Value::Count(1)).to_string();
        assert!(e.contains("takes text, a count was given"), "{e}");
    }

    #[test]
    #[should_panic(expected = "no option")]
    fn an_unknown_name_is_a_bug_of_ours() {
        find(&TABLE, "m");
    }
}
