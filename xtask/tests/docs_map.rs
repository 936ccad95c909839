//! The maps cannot go stale silently: `README.md`, `docs/ARCHITECTURE.md` and `CONTRIBUTING.md` stay
//! within their sizes, and every path, link, `cargo xtask` command and `kube_ccm…::` item they name
//! exists. A path under a `### ` heading that names a crate directory may be written relative to that
//! crate or its `src/`. And each workspace member lives in a directory named as its package.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is inside the repository")
        .to_path_buf()
}

/// The subcommands `cargo xtask --help` lists.
fn xtask_commands() -> BTreeSet<String> {
    let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("--help")
        .output()
        .expect("xtask --help runs");
    let help = String::from_utf8_lossy(&output.stdout);
    let commands: BTreeSet<String> = help
        .lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect();
    assert!(
        commands.len() >= 5,
        "xtask --help lists too few commands:\n{help}"
    );
    commands
}

/// The text between each pair of backticks on `line`.
fn backticked(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

/// A token that names a file or directory of this repository (not a URL, flag, Go import path, build
/// output or placeholder). A bare file name counts only under a crate's heading, relative to the crate.
fn is_path(token: &str, under_crate: bool) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "_./-".contains(c);
    if token.is_empty()
        || !token.chars().all(allowed)
        || token.starts_with(['/', '-', '.'])
        || token.starts_with("target/")
    {
        return false;
    }
    let first = token.split('/').next().unwrap_or_default();
    let lower = |s: &str| {
        s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_.-".contains(c))
    };
    if token.contains('/') {
        // `k8s.io/cloud-provider`, `sigs.k8s.io/kwok`: Go import paths, not ours.
        return lower(first) && !first.contains('.');
    }
    under_crate && (token.ends_with(".rs") || token.ends_with(".md"))
}

/// The crate directory a `### ` heading names (its first backticked token, when that is a directory).
fn heading_base(root: &Path, line: &str) -> Option<PathBuf> {
    let token = backticked(line).into_iter().next()?;
    let dir = root.join(token);
    dir.is_dir().then_some(dir)
}

/// The source directory of the crate a `kube_ccm…` path names.
fn crate_dir(root: &Path, ident: &str) -> Option<PathBuf> {
    let package = ident.replace('_', "-");
    ["crates", "crates/providers", "crates/testing"]
        .iter()
        .map(|parent| root.join(parent).join(&package))
        .find(|dir| dir.is_dir())
}

/// Whether `word` appears as a whole identifier in some `.rs` file under `dir`.
fn defined_under(dir: &Path, word: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|entry| {
        let path = entry.path();
        if path.is_dir() {
            return path.file_name().is_none_or(|n| n != "target") && defined_under(&path, word);
        }
        path.extension().is_some_and(|e| e == "rs")
            && std::fs::read_to_string(&path).is_ok_and(|text| {
                text.match_indices(word).any(|(at, _)| {
                    let before = text[..at].chars().next_back();
                    let after = text[at + word.len()..].chars().next();
                    let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
                    !ident(before) && !ident(after)
                })
            })
    })
}

/// A four-digit year, a dash, two digits, a dash, two digits.
fn has_date(line: &str) -> bool {
    let bytes = line.as_bytes();
    bytes.windows(10).any(|w| {
        w[0..4].iter().all(u8::is_ascii_digit)
            && w[4] == b'-'
            && w[5..7].iter().all(u8::is_ascii_digit)
            && w[7] == b'-'
            && w[8..10].iter().all(u8::is_ascii_digit)
    })
}

/// What is wrong with the map `name` (repository-relative) whose text is `text`.
fn problems(
    root: &Path,
    name: &str,
    text: &str,
    commands: &BTreeSet<String>,
    max_lines: usize,
    dated: bool,
) -> Vec<String> {
    let mut out = Vec::new();
    let lines = text.lines().count();
    if lines > max_lines {
        out.push(format!("{name}: {lines} lines, more than {max_lines}"));
    }
    let dir = root
        .join(name)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| root.to_path_buf());
    let mut base: Option<PathBuf> = None;
    let mut fenced = false;
    for (number, line) in text.lines().enumerate() {
        let at = format!("{name}:{}", number + 1);
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if line.starts_with("## ") {
            base = None;
        }
        if line.starts_with("### ") {
            base = heading_base(root, line);
        }
        if !dated && has_date(line) {
            out.push(format!(
                "{at}: a date; measurements and their dates belong in a decision or docs/benchmarks.md"
            ));
        }
        for token in backticked(line) {
            let token = token.trim_end_matches('/');
            if is_path(token, base.is_some()) {
                let candidates = [
                    Some(root.join(token)),
                    base.as_ref().map(|b| b.join(token)),
                    base.as_ref().map(|b| b.join("src").join(token)),
                ];
                if !candidates.iter().flatten().any(|p| p.exists()) {
                    out.push(format!("{at}: `{token}` does not exist"));
                }
            }
            if let Some((krate, item)) = token.split_once("::").filter(|(k, _)| k.starts_with("kube_ccm")) {
                let last = item
                    .rsplit("::")
                    .next()
                    .unwrap_or_default()
                    .trim_end_matches("()")
                    .trim_end_matches('!');
                match crate_dir(root, krate) {
                    None => out.push(format!("{at}: `{token}`: no crate {krate}")),
                    Some(dir) if !last.is_empty() && !defined_under(&dir.join("src"), last) => {
                        out.push(format!("{at}: `{token}`: {krate} has no {last}"));
                    }
                    Some(_) => {}
                }
            }
        }
        for (at_command, _) in line.match_indices("cargo xtask ") {
            let command: String = line[at_command + "cargo xtask ".len()..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '-')
                .collect();
            if !command.is_empty() && !commands.contains(&command) {
                out.push(format!("{at}: `cargo xtask {command}` is not an xtask command"));
            }
        }
        if fenced {
            continue;
        }
        for (open, _) in line.match_indices("](") {
            let rest = &line[open + 2..];
            let Some(close) = rest.find(')') else { continue };
            let target = rest[..close].split('#').next().unwrap_or_default();
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            if !dir.join(target).exists() {
                out.push(format!("{at}: the link ({target}) leads nowhere"));
            }
        }
    }
    out
}

#[test]
fn the_maps_name_only_what_exists_and_stay_short() {
    let root = repo();
    let commands = xtask_commands();
    let mut found = Vec::new();
    for (name, max_lines, dated) in [
        ("README.md", 100, true),
        ("docs/ARCHITECTURE.md", 300, false),
        ("CONTRIBUTING.md", 150, true),
    ] {
        let text = std::fs::read_to_string(root.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        found.extend(problems(&root, name, &text, &commands, max_lines, dated));
    }
    assert!(found.is_empty(), "the maps are stale:\n{}", found.join("\n"));
}

#[test]
fn a_stale_map_is_caught() {
    let root = repo();
    let commands = xtask_commands();
    let text = "\
### `crates/kube-ccm-runtime`
- `src/controllers/route.rs` exists, `controllers/route.rs` too, `controllers/gone.rs` does not.
- `crates/kube-ccm-cli/src/flags.rs`, `k8s.io/cloud-provider` is Go's, `--tls-cert-file` a flag.
- `kube_ccm_runtime::Manager` is there; `kube_ccm_runtime::ControllerFlag` is not; `kube_ccm_nothing::X`.
- `cargo xtask bench`, `cargo xtask teleport`; [the map](ARCHITECTURE.md), [a ghost](ghost.md).
- Measured on 2026-11-27.
";
    let found = problems(&root, "docs/example.md", text, &commands, 4, false);
    let expected = [
        "docs/example.md: 6 lines, more than 4",
        "docs/example.md:2: `controllers/gone.rs` does not exist",
        "docs/example.md:3: `crates/kube-ccm-cli/src/flags.rs` does not exist",
        "docs/example.md:4: `kube_ccm_runtime::ControllerFlag`: kube_ccm_runtime has no ControllerFlag",
        "docs/example.md:4: `kube_ccm_nothing::X`: no crate kube_ccm_nothing",
        "docs/example.md:5: `cargo xtask teleport` is not an xtask command",
        "docs/example.md:5: the link (ghost.md) leads nowhere",
        "docs/example.md:6: a date; measurements and their dates belong in a decision or docs/benchmarks.md",
    ];
    assert_eq!(found, expected);
}

/// `fuzz/` keeps cargo-fuzz's directory name for its package, `ccm-fuzz`.
const DIRECTORY_NOT_PACKAGE: &[&str] = &["fuzz"];

#[test]
fn every_member_lives_in_a_directory_named_as_its_package() {
    let root = repo();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("the workspace manifest");
    let members: Vec<&str> = manifest
        .split("members = [")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .expect("a members list")
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .collect();
    assert!(members.len() >= 10, "members: {members:?}");
    let mut wrong = Vec::new();
    for member in members {
        let text = std::fs::read_to_string(root.join(member).join("Cargo.toml")).expect("a member manifest");
        let package = text
            .lines()
            .find_map(|line| line.strip_prefix("name = "))
            .map(|name| name.trim_matches('"'))
            .expect("a package name");
        let directory = member.rsplit('/').next().unwrap_or(member);
        if directory != package && !DIRECTORY_NOT_PACKAGE.contains(&member) {
            wrong.push(format!("{member}: package {package}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "directories not named as their packages:\n{}",
        wrong.join("\n")
    );
}
