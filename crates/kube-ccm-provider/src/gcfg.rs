//! Reading cloud-configs in upstream's INI dialect (Go's `gcfg`), which the AWS and GCE providers (and
//! most in-tree providers before them) use:
//!
//! ```ini
//! ; a comment          # also a comment
//! [Global]
//! Region = us-east-1
//! node-tags = a        ; a key given twice is a list
//! node-tags = b
//! multizone            ; a key without `=` is `true`
//!
//! [ServiceOverride "1"]
//! URL = "https://ec2.example.internal"
//! ```
//!
//! [`read`] turns a file into [`Item`]s (section headers and keys, with their line numbers) and leaves
//! their meaning to the provider; names are compared case-insensitively by the caller, as gcfg does.

use crate::Refused;
use std::fmt;

/// A cloud-config the provider cannot use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// 1-based line, 0 for a problem of the whole file.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl ConfigError {
    /// An error at `line` (0: the whole file).
    pub fn new(line: usize, message: impl Into<String>) -> ConfigError {
        ConfigError {
            line,
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "cloud-config: {}", self.message)
        } else {
            write!(f, "cloud-config line {}: {}", self.line, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

/// One meaningful line of a cloud-config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// `[name]` or `[name "sub"]`.
    Section {
        /// 1-based line.
        line: usize,
        /// The section's name, as written.
        name: String,
        /// The subsection, unquoted.
        sub: Option<String>,
    },
    /// `key = value` (or a bare `key`, which is `true`).
    Key {
        /// 1-based line.
        line: usize,
        /// The key, as written.
        key: String,
        /// The value, unquoted.
        value: String,
    },
}

/// The items of `text`, in order. A key before any section, an unclosed header or quote is an error
/// naming its line.
pub fn read(text: &str) -> Result<Vec<Item>, ConfigError> {
    let mut items = Vec::new();
    let mut in_section = false;
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let error = |message: String| ConfigError { line, message };
        let content = strip_comment(raw).trim();
        if content.is_empty() {
            continue;
        }
        if let Some(header) = content.strip_prefix('[') {
            let header = header
                .strip_suffix(']')
                .ok_or_else(|| error(format!("section header {content:?} has no closing ]")))?;
            let (name, sub) = match header.split_once(char::is_whitespace) {
                Some((name, sub)) => (name, Some(unquote(sub.trim()).map_err(&error)?)),
                None => (header, None),
            };
            items.push(Item::Section {
                line,
                name: name.to_owned(),
                sub,
            });
            in_section = true;
            continue;
        }
        if !in_section {
            return Err(error(format!("{content:?} is outside any section")));
        }
        let (key, value) = match content.split_once('=') {
            Some((key, value)) => (key.trim(), unquote(value.trim()).map_err(&error)?),
            None => (content, "true".to_owned()),
        };
        items.push(Item::Key {
            line,
            key: key.to_owned(),
            value,
        });
    }
    Ok(items)
}

/// A gcfg boolean: `true`/`yes`/`on`/`1`, `false`/`no`/`off`/`0`/empty, any case.
pub fn boolean(value: &str) -> Result<bool, Refused> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" | "" => Ok(false),
        _ => Err(Refused::new(format!("{value:?} is not a boolean (true/false)"))),
    }
}

/// The line without a `;` or `#` comment outside quotes.
fn strip_comment(line: &str) -> &str {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => quoted = !quoted,
            ';' | '#' if !quoted => return &line[..i],
            _ => {}
        }
    }
    line
}

/// A value, unquoted: `"a \"b\""` → `a "b"`; bare values are taken as written.
fn unquote(value: &str) -> Result<String, String> {
    let Some(inner) = value.strip_prefix('"') else {
        return Ok(value.to_owned());
    };
    let inner = inner
        .strip_suffix('"')
        .ok_or_else(|| format!("value {value} has no closing quote"))?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(other) => out.push(other),
                None => return Err(format!("value {value} ends in a lone backslash")),
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(line: usize, key: &str, value: &str) -> Item {
        Item::Key {
            line,
            key: key.into(),
            value: value.into(),
        }
    }

    #[test]
    fn sections_keys_lists_bare_keys_quotes_and_comments() {
        let items = read(
            "; comment\n[Global]\nRegion = us-east-1 # trailing\nnode-tags = a\nnode-tags = b\nmultizone\n\
             [ServiceOverride \"1\"]\nURL = \"https://x;y\" ; c\n",
        )
        .unwrap();
        assert_eq!(
            items,
            vec![
                Item::Section {
                    line: 2,
                    name: "Global".into(),
                    sub: None
                },
                key(3, "Region", "us-east-1"),
                key(4, "node-tags", "a"),
                key(5, "node-tags", "b"),
                key(6, "multizone", "true"),
                Item::Section {
                    line: 7,
                    name: "ServiceOverride".into(),
                    sub: Some("1".into())
                },
                key(8, "URL", "https://x;y"),
            ]
        );
    }

    #[test]
    fn malformed_lines_are_one_error_naming_the_line() {
        let cases = [
            ("Region = x\n", 1, "outside any section"),
            ("[Global\n", 1, "no closing ]"),
            ("[Global]\n\nRegion = \"x\n", 3, "no closing quote"),
            ("[Global]\nRegion = \"x\\\"\n", 2, "lone backslash"),
        ];
        for (text, line, needle) in cases {
            let error = read(text).unwrap_err();
            assert_eq!(error.line, line, "{text:?}: {error}");
            assert!(error.to_string().contains(needle), "{text:?}: {error}");
            assert!(
                error
                    .to_string()
                    .starts_with(&format!("cloud-config line {line}: "))
            );
        }
    }

    #[test]
    fn booleans_as_gcfg() {
        for yes in ["true", "TRUE", "yes", "on", "1"] {
            assert_eq!(boolean(yes), Ok(true));
        }
        for no in ["false", "No", "off", "0", ""] {
            assert_eq!(boolean(no), Ok(false));
        }
        assert!(boolean("maybe").unwrap_err().reason().contains("\"maybe\""));
    }
}
