//! Release notes from `CHANGELOG.md` (Keep a Changelog): the section of the version being shipped, else
//! the `[Unreleased]` one, marked so; `cargo xtask dist` writes them as `RELEASE-NOTES.md`.

use anyhow::{Result, bail};

/// The notes for `binary` at `version`, from `changelog` (its text; `file` names it in errors).
pub(crate) fn release_notes(changelog: &str, file: &str, binary: &str, version: &str) -> Result<String> {
    let (body, released) = match section(changelog, version) {
        Some(body) => (body, true),
        None => match section(changelog, "Unreleased") {
            Some(body) => (body, false),
            None => bail!("{file} has no section `## [{version}]` nor `## [Unreleased]`"),
        },
    };
    let body = body.trim();
    if !body.lines().any(|l| l.trim_start().starts_with("- ")) {
        let name = if released { version } else { "Unreleased" };
        bail!("{file}: the section `## [{name}]` lists no change");
    }
    let title = if released {
        format!("# {binary} {version}")
    } else {
        format!("# {binary} {version} (unreleased: from `## [Unreleased]` of {file})")
    };
    Ok(format!("{title}\n\n{body}\n"))
}

/// The lines under `## [name]` (with or without a date after it) up to the next `## ` heading.
fn section<'a>(changelog: &'a str, name: &str) -> Option<&'a str> {
    let heading = format!("## [{name}]");
    let mut start = None;
    let mut offset = 0;
    for line in changelog.split_inclusive('\n') {
        let at = offset;
        offset += line.len();
        let trimmed = line.trim_end();
        match start {
            None if trimmed == heading || trimmed.starts_with(&format!("{heading} ")) => start = Some(offset),
            Some(from) if trimmed.starts_with("## ") => return Some(&changelog[from..at]),
            _ => {}
        }
    }
    start.map(|from| &changelog[from..])
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHANGELOG: &str = "# Changelog\n\nIntro.\n\n## [Unreleased]\n\n### Added\n- next thing\n\n## [0.2.0] - 2026-10-01\n\n### Fixed\n- a bug\n\n## [0.1.0]\n- first\n";

    #[test]
    fn the_versions_section_else_the_unreleased_one() {
        let notes = release_notes(CHANGELOG, "CHANGELOG.md", "ccm", "0.2.0").unwrap();
        assert_eq!(notes, "# ccm 0.2.0\n\n### Fixed\n- a bug\n");
        let last = release_notes(CHANGELOG, "CHANGELOG.md", "ccm", "0.1.0").unwrap();
        assert_eq!(last, "# ccm 0.1.0\n\n- first\n");
        let next = release_notes(CHANGELOG, "CHANGELOG.md", "ccm", "0.3.0").unwrap();
        assert!(next.starts_with("# ccm 0.3.0 (unreleased"), "{next}");
        assert!(next.ends_with("### Added\n- next thing\n"), "{next}");
    }

    #[test]
    fn a_changelog_without_the_section_or_changes_is_one_error_naming_it() {
        let none =
            release_notes("# Changelog\n## [0.1.0]\n- x\n", "CHANGELOG.md", "ccm", "0.2.0").unwrap_err();
        assert_eq!(
            none.to_string(),
            "CHANGELOG.md has no section `## [0.2.0]` nor `## [Unreleased]`"
        );
        let empty = release_notes(
            "## [Unreleased]\n\n## [0.1.0]\n- x\n",
            "CHANGELOG.md",
            "ccm",
            "0.2.0",
        )
        .unwrap_err();
        assert_eq!(
            empty.to_string(),
            "CHANGELOG.md: the section `## [Unreleased]` lists no change"
        );
        // A heading that only starts like the version's is another version's.
        assert!(section("## [0.1.00]\n- x\n", "0.1.0").is_none());
    }
}
