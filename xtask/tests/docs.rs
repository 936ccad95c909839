//! Every shell block in `README.md`, `docs/` and the crates' READMEs says how it is tested, on the line
//! before it, and this test does it:
//!
//! - `<!-- doc-test: run [ARGS] -->`: each command runs and must exit 0. `cargo xtask …` runs the
//!   xtask binary; `cargo run -p P [--bin B] -- …` runs the binary the workspace's test build made. ARGS
//!   are appended to every command (for example `--profile dev --no-build`, so a release command packages
//!   the debug build instead of spending 15 minutes on a `dist` build); `{tmp}` is a fresh directory.
//!   `cargo xtask test` in such a block is checked as `ci` (this test runs inside it).
//! - `<!-- doc-test: synopsis -->`: usage forms, not commands; every `--flag` on each line must be in
//!   the `--help` of the binary and subcommand the line names (a workspace binary, `cargo xtask`, or a Go
//!   tool `cargo xtask kube` built, such as `cosign`).
//! - `<!-- doc-test: ci -->`: what CI itself runs: `cargo xtask test` must be what `.ci/run` runs, and a
//!   `cargo test -p P` must name a workspace member (so the full run tests it).
//! - `docs/migration-guide.md`'s blocks carry `<!-- test: STAGE -->`: the CLI's `migration_guide` test
//!   runs them at their stage of a migration.

#![allow(clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn target_dir() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .ancestors()
        .nth(3)
        .unwrap()
        .to_path_buf()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `(file, line, marker, body)` of every `sh` block in the documents.
fn shell_blocks() -> Vec<(String, usize, String, String)> {
    let mut files = vec![repo().join("README.md")];
    for dir in ["docs", "examples/provider-example", "deploy"] {
        let path = repo().join(dir);
        let entries = std::fs::read_dir(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut blocks = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let name = file.strip_prefix(repo()).unwrap().display().to_string();
        let mut i = 0;
        while i < lines.len() {
            if let Some(language) = lines[i].strip_prefix("```") {
                let close = (i + 1..lines.len())
                    .find(|&j| lines[j] == "```")
                    .expect("an unclosed block");
                if matches!(language, "sh" | "bash" | "shell" | "console") {
                    let marker = if i > 0 {
                        lines[i - 1].trim().to_owned()
                    } else {
                        String::new()
                    };
                    blocks.push((name.clone(), i + 1, marker, lines[i + 1..close].join("\n")));
                }
                i = close;
            }
            i += 1;
        }
    }
    blocks
}

/// The block's commands: continuation lines joined, comments and blank lines dropped.
fn commands(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in body.lines() {
        let line = match line.find(" #") {
            Some(at) if !line[..at].contains('\'') => &line[..at],
            _ => line,
        };
        let line = if line.trim_start().starts_with('#') {
            ""
        } else {
            line
        };
        match line.trim_end().strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                let command = current.split_whitespace().collect::<Vec<_>>().join(" ");
                if !command.is_empty() {
                    out.push(command);
                }
                current.clear();
            }
        }
    }
    out
}

/// The shell command that runs `command` here: cargo's front ends replaced by the built binaries.
fn rewrite(command: &str) -> String {
    let debug = target_dir().join("debug");
    if let Some(rest) = command.strip_prefix("cargo xtask ") {
        return format!("{} {rest}", env!("CARGO_BIN_EXE_xtask"));
    }
    if let Some(rest) = command.strip_prefix("cargo run ") {
        let (cargo_args, args) = rest.split_once(" -- ").unwrap_or((rest, ""));
        let words: Vec<&str> = cargo_args.split_whitespace().collect();
        let after = |flag: &str| words.iter().position(|w| *w == flag).map(|i| words[i + 1]);
        let binary = after("--bin")
            .or(after("-p"))
            .expect("cargo run names -p or --bin");
        return format!("{} {args}", debug.join(binary).display());
    }
    panic!("{command}: not a command this test knows how to run (cargo xtask, cargo run)");
}

#[test]
fn every_shell_block_in_the_documents_is_tested_as_its_marker_says() {
    let blocks = shell_blocks();
    assert!(blocks.len() >= 10, "only {} blocks found", blocks.len());
    let mut ran = 0;
    for (file, line, marker, body) in &blocks {
        let at = format!("{file}:{line}");
        let Some(how) = marker
            .strip_prefix("<!-- doc-test:")
            .and_then(|m| m.strip_suffix("-->"))
            .map(str::trim)
        else {
            assert!(
                file == "docs/migration-guide.md" && marker.starts_with("<!-- test: "),
                "{at}: a shell block needs `<!-- doc-test: run|synopsis|ci -->` on the line before it"
            );
            continue;
        };
        let (kind, extra) = how.split_once(' ').unwrap_or((how, ""));
        match kind {
            "run" => {
                for command in commands(body) {
                    if command.starts_with("cargo xtask test") {
                        check_ci(&at, &command); // the test run itself: not run again from inside it
                        continue;
                    }
                    let scratch = tempfile::tempdir().unwrap();
                    let extra = extra.replace("{tmp}", &scratch.path().display().to_string());
                    let shell = format!("{} {extra}", rewrite(&command));
                    eprintln!("{at}: $ {shell}");
                    let output = Command::new("timeout")
                        .args(["600", "sh", "-c", &shell])
                        .current_dir(scratch.path())
                        .env("CARGO_TARGET_DIR", target_dir())
                        .output()
                        .unwrap();
                    assert!(
                        output.status.success(),
                        "{at}: `{command}` failed ({}):\n{}{}",
                        output.status,
                        String::from_utf8_lossy(&output.stdout),
                        String::from_utf8_lossy(&output.stderr)
                    );
                    ran += 1;
                }
            }
            "synopsis" => {
                for command in commands(body) {
                    check_synopsis(&at, &command);
                }
            }
            "ci" => {
                for command in commands(body) {
                    check_ci(&at, &command);
                }
            }
            other => panic!("{at}: unknown doc-test kind {other:?}"),
        }
    }
    assert!(ran >= 5, "only {ran} commands ran");
}

/// Every `--flag` of a usage line is in its binary's `--help` for the subcommand the line names.
fn check_synopsis(at: &str, line: &str) {
    let line = if line.starts_with("cargo run ") || line.starts_with("cargo xtask ") {
        rewrite(line)
    } else {
        line.to_owned()
    };
    let words: Vec<&str> = line.split_whitespace().collect();
    // A Go tool (`cosign`) is the one `cargo xtask kube` built; anything else, the workspace's.
    let binary = go_tool(words[0]).unwrap_or_else(|| target_dir().join("debug").join(words[0]));
    assert!(binary.is_file(), "{at}: {} is not built", binary.display());
    let subcommands: Vec<&str> = words[1..]
        .iter()
        .take_while(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '-') && !w.starts_with('-'))
        .copied()
        .collect();
    let help = Command::new(&binary)
        .args(&subcommands)
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        help.status.success(),
        "{at}: {} {} --help failed",
        words[0],
        subcommands.join(" ")
    );
    let help = String::from_utf8_lossy(&help.stdout);
    let flags: Vec<&str> = words
        .iter()
        .filter_map(|w| w.trim_start_matches('[').strip_prefix("--"))
        .map(|f| f.split(['=', ']', ' ']).next().unwrap_or(f))
        .collect();
    assert!(
        !flags.is_empty() || !subcommands.is_empty(),
        "{at}: `{line}` shows nothing to check"
    );
    for flag in flags {
        assert!(
            help.contains(&format!("--{flag}")),
            "{at}: `{} {}` has no --{flag}",
            words[0],
            subcommands.join(" ")
        );
    }
}

/// `name`'s path in `<target>/kube/kube.json`, where `cargo xtask kube` lists the Go tools it built.
fn go_tool(name: &str) -> Option<PathBuf> {
    let text = std::fs::read_to_string(target_dir().join("kube/kube.json")).ok()?;
    let manifest: serde_json::Value = serde_json::from_str(&text).ok()?;
    manifest["binaries"][name]["path"].as_str().map(PathBuf::from)
}

/// `cargo xtask test` is what CI runs; `cargo test -p P` names a workspace member, which that run tests.
fn check_ci(at: &str, command: &str) {
    if command == "cargo xtask test" || command.starts_with("cargo xtask test -p ") {
        let ci = std::fs::read_to_string(repo().join(".ci/run")).unwrap();
        assert!(
            ci.lines().any(|l| l.trim() == "exec cargo xtask test"),
            "{at}: .ci/run does not run `cargo xtask test`"
        );
        return;
    }
    let package = command
        .strip_prefix("cargo test -p ")
        .unwrap_or_else(|| panic!("{at}: `{command}` is not something CI runs"));
    let workspace = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let member = workspace
        .lines()
        .filter_map(|l| l.trim().strip_prefix('"')?.strip_suffix("\",").map(str::to_owned))
        .find(|dir| {
            std::fs::read_to_string(repo().join(dir).join("Cargo.toml"))
                .is_ok_and(|m| m.contains(&format!("name = \"{package}\"")))
        });
    assert!(
        member.is_some(),
        "{at}: {package} is not a workspace member, so CI does not test it"
    );
}

#[test]
fn commands_are_split_and_rewritten_as_documented() {
    let body =
        "# a comment\ncargo xtask dist     # tarballs\ncargo run -q -p ccm-demo -- \\\n    demo --crash\n\n";
    assert_eq!(
        commands(body),
        ["cargo xtask dist", "cargo run -q -p ccm-demo -- demo --crash"]
    );
    assert!(rewrite("cargo run -q -p ccm-demo -- demo").ends_with("debug/ccm-demo demo"));
    assert!(
        rewrite("cargo run -p provider-example --bin example-cloud-controller-manager -- --help")
            .ends_with("debug/example-cloud-controller-manager --help")
    );
}

#[test]
fn a_synopsis_with_a_flag_the_binary_lacks_fails() {
    check_synopsis(
        "ok",
        "cloud-controller-manager leader-migration plan --component NAME [--output text]",
    );
    let caught = std::panic::catch_unwind(|| {
        check_synopsis(
            "x",
            "cloud-controller-manager leader-migration validate --no-such-flag FILE",
        )
    });
    let message = *caught.unwrap_err().downcast::<String>().unwrap();
    assert_eq!(
        message,
        "x: `cloud-controller-manager leader-migration validate` has no --no-such-flag"
    );
}
