//! No function in product code is longer than [`LIMIT`] lines unless a `// Long on purpose: …` comment
//! above it says why: a long function mixes deciding with doing, and reads as a diary of cases. Product code
//! is the published crates and the shipped binary, without their tests.

use std::path::{Path, PathBuf};

/// The most lines a function may span, its signature and closing brace included.
const LIMIT: usize = 100;

/// What a written reason starts with.
const REASON: &str = "// Long on purpose:";

/// The product crates' source directories.
const PRODUCT: &[&str] = &[
    "crates/kube-ccm-provider/src",
    "crates/kube-ccm-leadermigration/src",
    "crates/kube-ccm-runtime/src",
    "crates/kube-ccm-cli/src",
    "crates/kube-ccm-conformance/src",
    "crates/kube-ccm/src",
    "crates/cloud-controller-manager/src",
    "crates/providers/kube-ccm-aws/src",
    "crates/providers/kube-ccm-gce/src",
    "crates/providers/kube-ccm-fake/src",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is inside the repository")
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && path
                .file_name()
                .is_some_and(|n| n != "tests.rs" && !n.to_string_lossy().ends_with("_tests.rs"))
        {
            out.push(path);
        }
    }
}

/// `text` with comments, strings and character literals blanked, lines kept.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, skipped: &[char]| {
        out.extend(skipped.iter().filter(|c| **c == '\n'));
        out.push(' ');
    };
    while i < chars.len() {
        let rest = &chars[i..];
        if rest.starts_with(&['/', '/']) {
            let end = rest.iter().position(|c| *c == '\n').unwrap_or(rest.len());
            i += end;
        } else if rest.starts_with(&['/', '*']) {
            let end = rest
                .windows(2)
                .position(|w| w == ['*', '/'])
                .map_or(rest.len(), |p| p + 2);
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == 'r'
            && (rest.get(1) == Some(&'"') || rest.get(1) == Some(&'#'))
            && !ident_before(&chars, i)
        {
            let hashes = rest[1..].iter().take_while(|c| **c == '#').count();
            if rest.get(1 + hashes) != Some(&'"') {
                out.push(rest[0]);
                i += 1;
                continue;
            }
            let close: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let body = 2 + hashes;
            let end = rest[body..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(rest.len(), |p| body + p + close.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == '"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != '"' {
                j += if rest[j] == '\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == '\''
            && (rest.get(2) == Some(&'\'') || (rest.get(1) == Some(&'\\') && rest[2..].contains(&'\'')))
        {
            let end = if rest.get(2) == Some(&'\'') {
                3
            } else {
                2 + rest[2..].iter().position(|c| *c == '\'').unwrap_or(0) + 1
            };
            out.push(' ');
            i += end;
        } else {
            out.push(rest[0]);
            i += 1;
        }
    }
    out
}

fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// `(name, first line, lines)` of each function with a body in `text`, up to its first `#[cfg(test)]`.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let code = code_only(text);
    let product = &code[..tests_module(&code).unwrap_or(code.len())];
    let lines: Vec<&str> = product.lines().collect();
    let mut out = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(at) = line.find("fn ").filter(|&at| {
            at == 0 || !ident_before(&line.chars().collect::<Vec<_>>(), line[..at].chars().count())
        }) else {
            continue;
        };
        let name: String = line[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        // The body: the first `{` outside parentheses before a `;`, then its matching `}`.
        let mut depth = 0i32;
        let mut parens = 0i32;
        let mut opened = false;
        let mut end = None;
        'scan: for (number, text) in lines.iter().enumerate().skip(start) {
            let text = if number == start { &text[at..] } else { text };
            for c in text.chars() {
                match c {
                    '(' | '[' => parens += 1,
                    ')' | ']' => parens -= 1,
                    ';' if !opened && parens == 0 => break 'scan,
                    '{' if opened || parens == 0 => {
                        opened = true;
                        depth += 1;
                    }
                    '}' if opened => {
                        depth -= 1;
                        if depth == 0 {
                            end = Some(number);
                            break 'scan;
                        }
                    }
                    _ => {}
                }
            }
        }
        if let Some(end) = end {
            out.push((name, start + 1, end - start + 1));
        }
    }
    out
}

/// Where the file's `#[cfg(test)] mod tests` begins (other `#[cfg(test)]` items are product code's helpers).
fn tests_module(code: &str) -> Option<usize> {
    code.match_indices("#[cfg(test)]").map(|(at, _)| at).find(|&at| {
        let next = code[at + "#[cfg(test)]".len()..].trim_start();
        [
            "mod tests",
            "pub(crate) mod tests",
            "mod test ",
            "pub(crate) mod test ",
        ]
        .iter()
        .any(|start| next.starts_with(start))
    })
}

/// Whether a `// Long on purpose:` comment stands above line `first` (1-based), over its attributes and docs.
fn has_reason(text: &str, first: usize) -> bool {
    let lines: Vec<&str> = text.lines().collect();
    lines[..first - 1]
        .iter()
        .rev()
        .map(|l| l.trim())
        .take_while(|l| l.starts_with("//") || l.starts_with("#[") || l.starts_with("#!["))
        .any(|l| l.starts_with(REASON))
}

/// The long functions of `text` without a written reason, as `NAME (N lines) at LINE`.
fn unexplained(text: &str) -> Vec<String> {
    functions(text)
        .into_iter()
        .filter(|(_, first, lines)| *lines > LIMIT && !has_reason(text, *first))
        .map(|(name, first, lines)| format!("{name} ({lines} lines) at line {first}"))
        .collect()
}

#[test]
fn no_product_function_is_long_without_a_written_reason() {
    let root = repo();
    let mut files = Vec::new();
    for dir in PRODUCT {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 100, "only {} files found", files.len());
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a source file");
        let name = file.strip_prefix(&root).unwrap_or(&file).display().to_string();
        found.extend(unexplained(&text).into_iter().map(|f| format!("{name}: {f}")));
    }
    assert!(
        found.is_empty(),
        "functions over {LIMIT} lines with no `{REASON} …` comment above them (split them: decide in a pure function, act in a short one):\n{}",
        found.join("\n")
    );
}

#[test]
fn a_long_function_is_caught_and_a_reason_or_a_test_module_excuses_it() {
    let body = |name: &str| {
        let lines: String = (0..LIMIT)
            .map(|i| format!("    let x{i} = \"}}\"; // {{\n"))
            .collect();
        format!("fn {name}() {{\n{lines}}}\n")
    };
    let short = "fn short() -> u8 {\n    let c = '{';\n    1\n}\n";
    let text = format!(
        "{short}{}\n/// Documented.\n// Long on purpose: a table.\n#[inline]\n{}\n#[cfg(test)]\nmod tests {{\n{}}}\n",
        body("long"),
        body("excused"),
        body("in_tests")
    );
    assert_eq!(unexplained(&text), ["long (102 lines) at line 5"]);
    let all: Vec<String> = functions(&text).into_iter().map(|(name, _, _)| name).collect();
    assert_eq!(all, ["short", "long", "excused"]);
}
