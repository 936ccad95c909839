//! `docs/provider-authoring.md` shows this crate's code: every `rust` or `toml` block of the guide names
//! the region it was taken from (`<!-- from: PATH#ANCHOR -->`, a region between `ANCHOR: name` and
//! `ANCHOR_END: name` comments) and must equal it, so the guide cannot drift from code that compiles
//! and is tested.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf()
}

/// The lines between the `ANCHOR: name` and `ANCHOR_END: name` comments of `source`, without the
/// anchor lines of other regions.
fn region(source: &str, name: &str) -> Option<String> {
    let is_anchor = |line: &str, kind: &str| {
        let t = line.trim_start();
        (t.starts_with("//") || t.starts_with('#'))
            && t.trim_start_matches(['/', '#', ' '])
                .strip_prefix(kind)
                .is_some_and(|r| r.trim() == name)
    };
    let start = source.lines().position(|l| is_anchor(l, "ANCHOR:"))?;
    let end = source.lines().position(|l| is_anchor(l, "ANCHOR_END:"))?;
    let lines: Vec<&str> = source
        .lines()
        .skip(start + 1)
        .take(end.checked_sub(start + 1)?)
        .filter(|l| {
            !l.trim_start()
                .trim_start_matches(['/', '#', ' '])
                .starts_with("ANCHOR")
        })
        .collect();
    Some(lines.join("\n"))
}

/// `(marker, language, body)` for every fenced block of `markdown`; the marker is the HTML comment on
/// the line before the fence, if any.
fn blocks(markdown: &str) -> Vec<(Option<String>, String, String)> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if let Some(language) = lines[i].strip_prefix("```") {
            let marker = i
                .checked_sub(1)
                .map(|p| lines[p].trim())
                .filter(|l| l.starts_with("<!--"))
                .map(str::to_owned);
            let close = (i + 1..lines.len())
                .find(|&j| lines[j] == "```")
                .expect("an unclosed block");
            out.push((marker, language.to_owned(), lines[i + 1..close].join("\n")));
            i = close;
        }
        i += 1;
    }
    out
}

/// The guide with every marked block replaced by its region (`UPDATE_DOCS=1` writes it).
fn refreshed(guide: &str) -> String {
    let mut out = Vec::new();
    let lines: Vec<&str> = guide.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        out.push(lines[i].to_owned());
        let from = lines[i]
            .trim()
            .strip_prefix("<!-- from:")
            .and_then(|m| m.strip_suffix("-->"));
        if let (Some(from), Some(fence)) = (from, lines.get(i + 1).filter(|l| l.starts_with("```"))) {
            let (path, anchor) = from.trim().split_once('#').expect("PATH#ANCHOR");
            let source = std::fs::read_to_string(repo().join(path)).unwrap();
            out.push((*fence).to_owned());
            out.push(region(&source, anchor).unwrap_or_else(|| panic!("{path} has no region {anchor}")));
            i += 2;
            while lines[i] != "```" {
                i += 1;
            }
            continue;
        }
        i += 1;
    }
    out.join("\n") + "\n"
}

#[test]
fn every_code_block_of_the_guide_is_this_crates_code() {
    let guide_path = repo().join("docs/provider-authoring.md");
    let mut guide = std::fs::read_to_string(&guide_path).unwrap();
    if std::env::var_os("UPDATE_DOCS").is_some() {
        guide = refreshed(&guide);
        std::fs::write(&guide_path, &guide).unwrap();
    }
    let mut checked = 0;
    for (marker, language, body) in blocks(&guide) {
        if !matches!(language.as_str(), "rust" | "toml") {
            continue;
        }
        let marker = marker
            .unwrap_or_else(|| panic!("a {language} block has no `<!-- from: PATH#ANCHOR -->`:\n{body}"));
        let from = marker
            .trim_start_matches("<!--")
            .trim_end_matches("-->")
            .trim()
            .strip_prefix("from:")
            .unwrap_or_else(|| panic!("{marker}: expected `<!-- from: PATH#ANCHOR -->`"))
            .trim();
        let (path, anchor) = from
            .split_once('#')
            .unwrap_or_else(|| panic!("{marker}: no #ANCHOR"));
        let source = std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        let expected = region(&source, anchor).unwrap_or_else(|| panic!("{path} has no region {anchor}"));
        assert_eq!(
            body, expected,
            "the guide's block from {from} differs from the code"
        );
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} blocks checked");
}

#[test]
fn regions_and_blocks_are_found_as_documented() {
    let source = "a\n// ANCHOR: x\nfn f() {}\n    // ANCHOR: inner\nlet y;\n    // ANCHOR_END: inner\n// ANCHOR_END: x\n";
    assert_eq!(region(source, "x").unwrap(), "fn f() {}\nlet y;");
    assert_eq!(region(source, "inner").unwrap(), "let y;");
    assert!(region(source, "missing").is_none());
    let markdown = "text\n<!-- from: a#b -->\n```rust\nfn f() {}\n```\n```sh\nls\n```\n";
    assert_eq!(
        blocks(markdown),
        [
            (
                Some("<!-- from: a#b -->".into()),
                "rust".into(),
                "fn f() {}".into()
            ),
            (None, "sh".into(), "ls".into())
        ]
    );
}
