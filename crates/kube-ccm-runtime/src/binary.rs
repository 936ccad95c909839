//! What a binary says it is: its name and version ([`Binary`]), set through
//! [`crate::Registry::set_binary`].

use crate::RegistrationError;

/// What a binary says it is. A provider's binary names itself and gives its own version
/// ([`crate::Registry::set_binary`]); without that it is this framework's `cloud-controller-manager` at the
/// framework's version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binary {
    name: String,
    version: String,
}

impl Binary {
    /// `name` at `version`. Both appear in every request's `User-Agent`
    /// (`<component>/<version> (…) <identity>/<controller>`), so neither may be empty or hold whitespace,
    /// a control character, `/`, `(` or `)`; a leading `v` of the version is dropped.
    pub fn new(name: &str, version: &str) -> Result<Binary, RegistrationError> {
        let version = version.strip_prefix('v').unwrap_or(version);
        for (field, value) in [("name", name), ("version", version)] {
            let problem = if value.is_empty() {
                Some("is empty")
            } else if value
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || "/()".contains(c))
            {
                Some("holds whitespace, a control character, `/`, `(` or `)`")
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(RegistrationError::Binary {
                    field,
                    value: value.to_owned(),
                    problem,
                });
            }
        }
        Ok(Binary {
            name: name.to_owned(),
            version: version.to_owned(),
        })
    }

    /// The name `--help` shows.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The version, without a leading `v`: `--version` prints `Kubernetes v<version>`, and it is the
    /// version in every request's `User-Agent` and in `kubernetes_build_info`'s `git_version`.
    pub fn version(&self) -> &str {
        &self.version
    }
}

impl Default for Binary {
    fn default() -> Binary {
        Binary {
            name: "cloud-controller-manager".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Registry;

    #[test]
    fn a_binary_names_itself_in_what_a_user_agent_can_carry() {
        let mut registry = Registry::new();
        assert_eq!(registry.binary().name(), "cloud-controller-manager");
        assert_eq!(registry.binary().version(), env!("CARGO_PKG_VERSION"));
        registry.set_binary("acme-ccm", "v2.0.1-rc.1+build.5").unwrap();
        assert_eq!(registry.binary().version(), "2.0.1-rc.1+build.5");
        for (name, version, field) in [
            ("", "1.0.0", "name"),
            ("acme ccm", "1.0.0", "name"),
            ("acme/ccm", "1.0.0", "name"),
            ("acme", "v", "version"),
            ("acme", "1.0 (beta)", "version"),
            ("acme", "1.0\n", "version"),
        ] {
            let error = registry.set_binary(name, version).unwrap_err();
            assert!(
                matches!(&error, RegistrationError::Binary { field: f, .. } if *f == field),
                "{name:?} {version:?}: {error}"
            );
        }
        assert_eq!(
            registry.binary().name(),
            "acme-ccm",
            "a refused name changes nothing"
        );
    }
}
