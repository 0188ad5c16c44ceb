//! An export kind's daemon-wide options: what it declares ([`KindOption`]), what the daemon
//! hands it ([`KindOptions`]) and how its `ExportKind::init` reads them ([`OptionValues`]).
//! Plain types: the kinds (`exports/mod.rs`) use them, not the other way round.
//!
//! The daemon (`flashpath serve`) builds a flag for each declared option that has one, reads
//! each from its configuration table, checks the range, and fills [`KindOptions`] from the flag,
//! else the file; an option given nowhere keeps its declared default. So a kind's options are
//! its own code: the daemon names none of them.

use std::collections::BTreeMap;
use std::time::Duration;

/// One option of an export kind: a key of a configuration table and, when it has one, a flag
/// of `flashpath serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindOption {
    /// The configuration file's table it is a key of (`nbd` for `[nbd]`); a daemon table
    /// (`security`) when the setting is about the daemon's exposure rather than the kind.
    pub table: &'static str,
    /// Its key in the table; unique among the kind's options.
    pub key: &'static str,
    /// `serve`'s flag, without the leading dashes (`nbd-stop-timeout-ms`); `None` for a
    /// setting that is the configuration file's only.
    pub flag: Option<&'static str>,
    /// What it takes, and its default.
    pub value: OptionType,
    /// The flag's help, and what the option means (without its default: the daemon adds it).
    pub help: &'static str,
}

/// What an option takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionType {
    /// A whole number of milliseconds from `min` to `max`.
    Millis { default: u64, min: u64, max: u64 },
    /// True or false.
    Bool { default: bool },
}

impl OptionType {
    /// The value of an option given nowhere.
    pub fn default_value(self) -> OptionValue {
        match self {
            OptionType::Millis { default, .. } => OptionValue::Millis(default),
            OptionType::Bool { default } => OptionValue::Bool(default),
        }
    }
}

/// An option's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionValue {
    Millis(u64),
    Bool(bool),
}

/// Why a value does not fit its option; the caller prefixes where it came from (the flag, or
/// `table.key`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    #[error("{value} is not between {min} and {max}")]
    OutOfRange { value: u64, min: u64, max: u64 },
    #[error("expected {expected}")]
    WrongType { expected: &'static str },
}

impl KindOption {
    /// `value`, if it is one this option takes.
    pub fn check(&self, value: OptionValue) -> Result<OptionValue, OptionError> {
        match (self.value, value) {
            (OptionType::Millis { min, max, .. }, OptionValue::Millis(ms)) if !(min..=max).contains(&ms) => {
                Err(OptionError::OutOfRange { value: ms, min, max })
            }
            (OptionType::Millis { .. }, OptionValue::Millis(_))
            | (OptionType::Bool { .. }, OptionValue::Bool(_)) => Ok(value),
            (OptionType::Millis { .. }, _) => {
                Err(OptionError::WrongType { expected: "a whole number of milliseconds" })
            }
            (OptionType::Bool { .. }, _) => Err(OptionError::WrongType { expected: "true or false" }),
        }
    }
}

/// The options the daemon was given, by table and key: those given nowhere are absent and
/// read as their declared default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KindOptions(BTreeMap<(&'static str, &'static str), OptionValue>);

impl KindOptions {
    /// Sets `table.key`: the caller checked it against its declaration ([`KindOption::check`]).
    pub fn set(&mut self, table: &'static str, key: &'static str, value: OptionValue) {
        self.0.insert((table, key), value);
    }

    /// These options with `table.key` set (for tests and embedders).
    pub fn with(mut self, table: &'static str, key: &'static str, value: OptionValue) -> KindOptions {
        self.set(table, key, value);
        self
    }

    /// The value of `option`: as given, else its default.
    pub fn value_of(&self, option: &KindOption) -> OptionValue {
        self.0.get(&(option.table, option.key)).copied().unwrap_or_else(|| option.value.default_value())
    }

    /// The values given, by table and key.
    pub fn given(&self) -> impl Iterator<Item = ((&'static str, &'static str), OptionValue)> + '_ {
        self.0.iter().map(|(k, v)| (*k, *v))
    }
}

/// One kind's options as its `ExportKind::init` reads them: by key.
pub struct OptionValues<'a> {
    /// The kind's name, for the panics.
    pub(crate) kind: &'static str,
    /// What the kind declares (`ExportKind::options`).
    pub(crate) declared: &'static [KindOption],
    pub(crate) given: &'a KindOptions,
}

impl OptionValues<'_> {
    fn get(&self, key: &str) -> OptionValue {
        let declared = self.declared.iter().find(|o| o.key == key).unwrap_or_else(|| {
            panic!("export kind '{}' reads option '{key}', which it does not declare", self.kind)
        });
        self.given.value_of(declared)
    }

    /// The kind's milliseconds option `key`.
    ///
    /// # Panics
    /// When the kind declares no such option, or one of another type: a kind reads only its own.
    pub fn millis(&self, key: &str) -> Duration {
        match self.get(key) {
            OptionValue::Millis(ms) => Duration::from_millis(ms),
            other => {
                panic!("option '{key}' of export kind '{}' is {other:?}, not milliseconds", self.kind)
            }
        }
    }

    /// The kind's true-or-false option `key`.
    ///
    /// # Panics
    /// As [`OptionValues::millis`].
    pub fn flag(&self, key: &str) -> bool {
        match self.get(key) {
            OptionValue::Bool(b) => b,
            other => {
                panic!("option '{key}' of export kind '{}' is {other:?}, not true or false", self.kind)
            }
        }
    }
}
