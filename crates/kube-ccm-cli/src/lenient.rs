//! Deserializers that accept a value written as text or as itself.
//!
//! Flags arrive as strings, and figment's environment provider parses values TOML-style (`CCM_CLUSTER_NAME=12345`
//! becomes a number): every setting accepts either form, so no source needs quoting tricks.

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;

use serde::de::{self, Deserializer, SeqAccess, Visitor};

/// Text, from a string or from a number or bool written bare.
pub(crate) fn string<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    struct Text;
    impl<'de> Visitor<'de> for Text {
        type Value = String;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_owned())
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
            Ok(v.to_string())
        }
    }
    deserializer.deserialize_any(Text)
}

/// A value parsed from its text (numbers, bools, durations), or given natively.
pub(crate) fn parsed<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: fmt::Display,
{
    let text = string(deserializer)?;
    text.trim()
        .parse()
        .map_err(|e| de::Error::custom(format!("invalid value {text:?}: {e}")))
}

/// A bool from `true`/`false` (any case), `1`/`0`, or a native bool.
pub(crate) fn boolean<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    let text = string(deserializer)?;
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "t" => Ok(true),
        "false" | "0" | "f" => Ok(false),
        _ => Err(de::Error::custom(format!(
            "invalid value {text:?}: expected true or false"
        ))),
    }
}

/// A list, from a sequence or from comma-separated text.
pub(crate) fn list<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    struct List(PhantomData<()>);
    impl<'de> Visitor<'de> for List {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list or comma-separated text")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Vec<String>, E> {
            Ok(v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
            let mut items = Vec::new();
            while let Some(item) = seq.next_element::<serde_json::Value>()? {
                match item {
                    serde_json::Value::String(s) => items.push(s),
                    other => items.push(other.to_string()),
                }
            }
            Ok(items)
        }
    }
    deserializer.deserialize_any(List(PhantomData))
}
