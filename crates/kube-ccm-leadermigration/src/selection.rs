//! `--controllers`: which controllers a manager runs.
//!
//! Upstream semantics (`IsControllerEnabled`, `GenericControllerManagerConfigurationOptions`): the list is
//! scanned in order; `name` enables and `-name` disables a controller; otherwise `*` enables everything not
//! disabled by default, and without `*` nothing else runs. Aliases are accepted and rewritten to
//! canonical names; unknown names are an error.

use crate::controller_name::{CatalogEntry, ControllerCatalog, ControllerName};

/// Upstream's `IsControllerEnabled`, on plain strings.
pub fn is_controller_enabled(name: &str, disabled_by_default: &[&str], controllers: &[&str]) -> bool {
    let mut has_star = false;
    for &controller in controllers {
        if controller == name {
            return true;
        }
        if controller.strip_prefix('-') == Some(name) {
            return false;
        }
        if controller == "*" {
            has_star = true;
        }
    }
    has_star && !disabled_by_default.contains(&name)
}

/// A `--controllers` item that names nothing this binary runs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--controllers: {name:?} is not in the list of known controllers{detail}")]
pub struct SelectionError {
    /// The name as written, without a leading `-`.
    pub name: String,
    /// Why, when there is more to say.
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Item {
    All,
    Enable(ControllerName),
    Disable(ControllerName),
}

/// A parsed `--controllers` list, with aliases resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerSelection {
    items: Vec<Item>,
}

impl Default for ControllerSelection {
    /// `--controllers=*`, upstream's default.
    fn default() -> Self {
        ControllerSelection {
            items: vec![Item::All],
        }
    }
}

impl ControllerSelection {
    /// Parses the list against the controllers this binary can run.
    pub fn parse<S: AsRef<str>>(items: &[S], catalog: &ControllerCatalog) -> Result<Self, SelectionError> {
        let items = items
            .iter()
            .map(|item| {
                let item = item.as_ref();
                if item == "*" {
                    return Ok(Item::All);
                }
                let (disable, name) = match item.strip_prefix('-') {
                    Some(name) => (true, name),
                    None => (false, item),
                };
                let entry = catalog
                    .resolve(name)
                    .filter(|e| e.runnable)
                    .ok_or_else(|| SelectionError {
                        name: name.to_owned(),
                        detail: match catalog.resolve(name) {
                            Some(entry) => {
                                format!(
                                    " ({} is a known controller, but this binary does not run it)",
                                    entry.name
                                )
                            }
                            None => String::new(),
                        },
                    })?;
                Ok(if disable {
                    Item::Disable(entry.name)
                } else {
                    Item::Enable(entry.name)
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(ControllerSelection { items })
    }

    /// Whether the controller runs.
    pub fn is_enabled(&self, entry: &CatalogEntry) -> bool {
        let mut has_star = false;
        for item in &self.items {
            match item {
                Item::Enable(name) if *name == entry.name => return true,
                Item::Disable(name) if *name == entry.name => return false,
                Item::All => has_star = true,
                Item::Enable(_) | Item::Disable(_) => {}
            }
        }
        has_star && !entry.disabled_by_default
    }

    /// The list with canonical names, as upstream's `ApplyTo` writes it back.
    pub fn to_strings(&self) -> Vec<String> {
        self.items
            .iter()
            .map(|item| match item {
                Item::All => "*".to_owned(),
                Item::Enable(name) => name.as_str().to_owned(),
                Item::Disable(name) => format!("-{name}"),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Upstream TestIsControllerEnabled (reference §8.6).
    #[test]
    fn is_controller_enabled_table() {
        let disabled = ["delta", "echo"];
        let cases: &[(&str, &[&str], &str, bool)] = &[
            ("on by name", &["alpha", "bravo", "-charlie"], "bravo", true),
            ("off by name", &["alpha", "bravo", "-charlie"], "charlie", false),
            ("on by default", &["*"], "alpha", true),
            ("off by default", &["*"], "delta", false),
            ("on by star, not off by name", &["*", "-charlie"], "alpha", true),
            ("off by name with star", &["*", "-charlie"], "charlie", false),
            (
                "off by default implicit, no star",
                &["alpha", "bravo", "-charlie"],
                "foxtrot",
                false,
            ),
        ];
        for &(case, list, controller, expected) in cases {
            assert_eq!(
                is_controller_enabled(controller, &disabled, list),
                expected,
                "{case}"
            );
        }
    }

    /// Upstream's synthetic universe from `options/generic_test.go` (reference §8.5).
    fn colours(with_aliases: bool) -> ControllerCatalog {
        let (red, blue): (&'static [&'static str], &'static [&'static str]) = if with_aliases {
            (
                &["crimson-controller", "pink-controller"],
                &["ultramarine-controller"],
            )
        } else {
            (&[], &[])
        };
        ControllerCatalog::from_entries([
            ("red-controller", red, false),
            ("green-controller", &[], true),
            ("blue-controller", blue, false),
        ])
    }

    #[track_caller]
    fn check_validate(catalog: &ControllerCatalog, list: &[&str], expected_error: Option<&str>) {
        match (ControllerSelection::parse(list, catalog), expected_error) {
            (Ok(_), None) => {}
            (Err(error), Some(expected)) => assert!(error.to_string().contains(expected), "{error}"),
            (result, expected) => panic!("{list:?}: got {result:?}, expected error {expected:?}"),
        }
    }

    #[test]
    fn a1_to_a8_validate() {
        let empty = ControllerCatalog::from_entries([]);
        check_validate(&empty, &["*"], None); // A1
        check_validate(&colours(true), &["*"], None); // A2: unset means the default, `*`
        check_validate(&colours(false), &["blue-controller"], None); // A3
        check_validate(&colours(true), &["*", "-red-controller", "blue-controller"], None); // A4
        check_validate(&colours(true), &["green-controller"], None); // A5
        check_validate(
            &colours(true),
            &["ultramarine-controller", "-pink-controller"],
            None,
        ); // A6
        check_validate(
            &empty,
            &["red-controller"],
            Some("\"red-controller\" is not in the list of known controllers"),
        ); // A7
        check_validate(
            &colours(true),
            &["crimson-controller", "grey-controller"],
            Some("\"grey-controller\" is not in the list of known controllers"),
        ); // A8
    }

    #[track_caller]
    fn check_apply(catalog: &ControllerCatalog, list: &[&str], expected: &[&str]) {
        assert_eq!(
            ControllerSelection::parse(list, catalog).unwrap().to_strings(),
            expected
        );
    }

    #[test]
    fn b1_to_b4_apply_rewrites_aliases() {
        let empty = ControllerCatalog::from_entries([]);
        check_apply(&empty, &["*"], &["*"]); // B1
        check_apply(&colours(false), &["-blue-controller"], &["-blue-controller"]); // B2
        check_apply(
            &colours(true),
            &["*", "green-controller", "-red-controller", "blue-controller"],
            &["*", "green-controller", "-red-controller", "blue-controller"],
        ); // B3
        check_apply(
            &colours(true),
            &[
                "green-controller",
                "-crimson-controller",
                "ultramarine-controller",
                "-pink-controller",
            ],
            &[
                "green-controller",
                "-red-controller",
                "blue-controller",
                "-red-controller",
            ],
        ); // B4
    }

    #[test]
    fn cloud_controller_manager_aliases() {
        // Upstream TestCloudControllerManagerAliases, with today's canonical names.
        check_apply(
            &crate::controller_name::test_catalog(),
            &[
                "service-lb-controller",
                "-service",
                "route",
                "-cloud-node-lifecycle-controller",
            ],
            &[
                "service-lb-controller",
                "-service-lb-controller",
                "node-route-controller",
                "-cloud-node-lifecycle-controller",
            ],
        );
    }

    #[test]
    fn selection_follows_upstream_semantics_with_disabled_defaults() {
        let catalog = colours(true);
        let entry = |name| catalog.resolve(name).unwrap().clone();
        let star = ControllerSelection::default();
        assert!(star.is_enabled(&entry("red-controller")));
        assert!(
            !star.is_enabled(&entry("green-controller")),
            "disabled by default"
        );
        let explicit =
            ControllerSelection::parse(&["*", "green-controller", "-pink-controller"], &catalog).unwrap();
        assert!(explicit.is_enabled(&entry("green-controller")));
        assert!(!explicit.is_enabled(&entry("red-controller")));
        let none = ControllerSelection::parse(&["blue-controller"], &catalog).unwrap();
        assert!(!none.is_enabled(&entry("red-controller")));
    }

    #[test]
    fn names_this_binary_does_not_run_are_refused_with_a_reason() {
        let error =
            ControllerSelection::parse(&["deployment"], &crate::controller_name::test_catalog()).unwrap_err();
        assert_eq!(
            error.to_string(),
            "--controllers: \"deployment\" is not in the list of known controllers (deployment-controller is a known controller, but this binary does not run it)"
        );
        assert!(ControllerSelection::parse(&["-*"], &crate::controller_name::test_catalog()).is_err());
    }
}
