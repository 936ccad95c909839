//! Flags a provider, or a provider's own controller, adds to the manager's command line: upstream's GCE
//! manager adds `--cloud-provider-gce-lb-src-cidrs`, and its AWS manager `--tags` and `--resources` for
//! the tagging controller.
//!
//! A provider declares its flags when the binary registers it (`Registry::register_provider_flags` in
//! the `kube-ccm-runtime` crate), a controller on its definition (`ControllerDefinition::flags`, which
//! takes the same [`Flag`]). The command line offers them beside the manager's
//! own, read from the same sources (flags, `CCM_<FLAG>`, `--config`), each value checked at start by its
//! flag's [`Flag::check`]. The provider reads the values in
//! [`InitializeContext::flags`](crate::InitializeContext::flags), a controller in its settings.

use crate::Refused;
use std::collections::BTreeMap;

/// How a flag takes its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagKind {
    /// `--flag[=true|false]`.
    Bool,
    /// `--flag VALUE`.
    Value,
    /// `--flag A,B` (repeatable; the values accumulate).
    List,
}

/// A flag's value, as its kind reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlagValue {
    /// A [`FlagKind::Bool`] flag's.
    Bool(bool),
    /// A [`FlagKind::Value`] flag's text.
    Value(String),
    /// A [`FlagKind::List`] flag's items.
    List(Vec<String>),
}

impl FlagValue {
    /// The text of a value flag (empty for the other kinds).
    pub fn text(&self) -> &str {
        match self {
            FlagValue::Value(text) => text,
            _ => "",
        }
    }

    /// The items of a list flag (none for the other kinds).
    pub fn items(&self) -> &[String] {
        match self {
            FlagValue::List(items) => items,
            _ => &[],
        }
    }

    /// A bool flag's value (false for the other kinds).
    pub fn is_true(&self) -> bool {
        matches!(self, FlagValue::Bool(true))
    }
}

/// A value check: `Err(reason)` refuses the value, and the manager does not start.
pub type FlagCheck = fn(&FlagValue) -> Result<(), Refused>;

fn accept(_: &FlagValue) -> Result<(), Refused> {
    Ok(())
}

/// One flag of a provider or a controller: its name (also its settings-file key and, as `CCM_<NAME>`, its environment
/// variable), kind, default as `--help` shows it (and as the value is read when no source gives one),
/// help, and value check.
#[derive(Debug, Clone, Copy)]
pub struct Flag {
    /// Without the dashes.
    pub name: &'static str,
    /// How it takes a value.
    pub kind: FlagKind,
    /// The default, as text (a list's items comma-separated).
    pub default: &'static str,
    /// What it does.
    pub help: &'static str,
    /// Refuses a bad value at start.
    pub check: FlagCheck,
}

impl Flag {
    /// A `--name VALUE` flag.
    pub const fn value(name: &'static str, default: &'static str, help: &'static str) -> Flag {
        Flag {
            name,
            kind: FlagKind::Value,
            default,
            help,
            check: accept,
        }
    }

    /// A `--name A,B` flag.
    pub const fn list(name: &'static str, default: &'static str, help: &'static str) -> Flag {
        Flag {
            name,
            kind: FlagKind::List,
            default,
            help,
            check: accept,
        }
    }

    /// A `--name[=true|false]` flag.
    pub const fn bool(name: &'static str, default: &'static str, help: &'static str) -> Flag {
        Flag {
            name,
            kind: FlagKind::Bool,
            default,
            help,
            check: accept,
        }
    }

    /// The same flag, its values checked by `check`.
    pub const fn checked(mut self, check: FlagCheck) -> Flag {
        self.check = check;
        self
    }
}

/// The values of the providers' and controllers' flags, by flag name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlagValues(BTreeMap<String, FlagValue>);

impl FlagValues {
    /// Sets the flag `name` to `value`.
    pub fn insert(&mut self, name: &str, value: FlagValue) {
        self.0.insert(name.to_owned(), value);
    }

    /// The value of the flag `name`, if this binary has it.
    pub fn get(&self, name: &str) -> Option<&FlagValue> {
        self.0.get(name)
    }

    /// The text of the value flag `name` (empty when absent).
    pub fn text(&self, name: &str) -> &str {
        self.get(name).map_or("", FlagValue::text)
    }

    /// The items of the list flag `name` (none when absent).
    pub fn items(&self, name: &str) -> &[String] {
        match self.get(name) {
            Some(value) => value.items(),
            None => &[],
        }
    }

    /// The bool flag `name` (false when absent).
    pub fn is_true(&self, name: &str) -> bool {
        self.get(name).is_some_and(FlagValue::is_true)
    }
}

impl<'a> FromIterator<(&'a str, FlagValue)> for FlagValues {
    fn from_iter<I: IntoIterator<Item = (&'a str, FlagValue)>>(iter: I) -> FlagValues {
        FlagValues(iter.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
    }
}
