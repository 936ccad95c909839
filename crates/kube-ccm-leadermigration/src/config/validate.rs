//! Validation: upstream's rules, then the ones upstream misses.

use std::collections::HashMap;

use super::decode::{Document, DocumentLines};
use super::errors::{FieldError, Problem};
use super::{
    ANY_COMPONENT, CLOUD_CONTROLLER_MANAGER, Component, KUBE_CONTROLLER_MANAGER, LEASES,
    LeaderMigrationConfiguration, LoadedConfig, MigratedController, MigrationConfig, MigrationLock,
};
use crate::controller_name::{ControllerCatalog, ControllerName};

const ENDPOINTS: &str = "endpoints";

/// Upstream's `ValidateLeaderMigrationConfiguration`, rule for rule and in the same order.
///
/// It accepts `resourceLock: endpoints`, duplicate and unknown controller names and any lease name;
/// [`MigrationConfig::load`] rejects those too.
pub fn upstream_errors(config: &LeaderMigrationConfiguration) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if config.leader_name.is_empty() {
        errors.push(FieldError::required(
            "leaderName",
            "leaderName must be set for LeaderMigrationConfiguration",
        ));
    }
    if config.resource_lock != LEASES && config.resource_lock != ENDPOINTS {
        errors.push(FieldError::invalid(
            "resourceLock",
            &config.resource_lock,
            "resource Lock must be one of 'leases' or 'endpoints'",
        ));
    }
    for (index, leader) in config.controller_leaders.iter().enumerate() {
        if leader.component.is_empty() {
            errors.push(FieldError::required(
                format!("controllerLeaders[{index}].component"),
                "",
            ));
        }
        if leader.name.is_empty() {
            errors.push(FieldError::required(
                format!("controllerLeaders[{index}].name"),
                "",
            ));
        }
    }
    errors
}

/// Where a controller was first claimed, to report a second claim.
struct Claim<'a> {
    lease: &'a str,
    document: usize,
    written: &'a str,
}

/// Validates every document of one file, and the rules between documents.
pub(super) fn validate_documents(
    documents: &[Document],
    catalog: &ControllerCatalog,
) -> Result<LoadedConfig, Vec<Problem>> {
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    let mut claims: HashMap<ControllerName, Claim<'_>> = HashMap::new();
    let mut leases: HashMap<&str, usize> = HashMap::new();
    let mut locks = Vec::new();

    for (document_index, document) in documents.iter().enumerate() {
        let config = &document.config;
        let lines = &document.lines;
        let mut document_problems: Vec<Problem> = upstream_errors(config)
            .iter()
            .map(|error| Problem::from_field_error(line_of(lines, &error.path), error))
            .collect();
        let at = |path: &str, error: FieldError| Problem::from_field_error(line_of(lines, path), &error);

        // The lease name.
        if !config.leader_name.is_empty() {
            if let Some(detail) = dns1123_subdomain_error(&config.leader_name) {
                document_problems.push(at(
                    "leaderName",
                    FieldError::invalid("leaderName", &config.leader_name, detail),
                ));
            } else if [KUBE_CONTROLLER_MANAGER, CLOUD_CONTROLLER_MANAGER]
                .contains(&config.leader_name.as_str())
            {
                document_problems.push(
                    at(
                        "leaderName",
                        FieldError::invalid("leaderName", &config.leader_name, "is the main leader-election lease of a controller manager"),
                    )
                    .hint("the migration lease must be a Lease of its own; upstream's default is cloud-provider-extraction-migration"),
                );
            } else if let Some(first) = leases.insert(config.leader_name.as_str(), document_index) {
                document_problems.push(at(
                    "leaderName",
                    FieldError::duplicate(
                        "leaderName",
                        &config.leader_name,
                        format!("already the lease of document {}", first + 1),
                    ),
                ));
            }
        }

        // The lock kind.
        if config.resource_lock == ENDPOINTS {
            document_problems.push(
                at(
                    "resourceLock",
                    FieldError::not_supported(
                        "resourceLock",
                        ENDPOINTS,
                        "client-go no longer has Endpoints locks (removed by kubernetes/kubernetes#106852); upstream accepts the value here and then fails at start-up",
                    ),
                )
                .hint(format!("use resourceLock: {LEASES}, or apiVersion controllermanager.config.k8s.io/v1, which implies it")),
            );
        }

        // The controllers.
        let mut controllers = Vec::new();
        for (index, leader) in config.controller_leaders.iter().enumerate() {
            let name_path = format!("controllerLeaders[{index}].name");
            let component_path = format!("controllerLeaders[{index}].component");
            if !leader.component.is_empty()
                && ![ANY_COMPONENT, KUBE_CONTROLLER_MANAGER, CLOUD_CONTROLLER_MANAGER]
                    .contains(&leader.component.as_str())
            {
                warnings.push(
                    Problem::error(
                        line_of(lines, &component_path),
                        Some(component_path.clone()),
                        format!("{:?} is neither kube-controller-manager, cloud-controller-manager nor \"*\"", leader.component),
                    )
                    .warning()
                    .hint(format!(
                        "only a manager started with --leader-migration-component={} will run {}; every other one treats it as owned elsewhere",
                        leader.component, leader.name
                    )),
                );
            }
            if leader.name.is_empty() {
                continue;
            }
            if leader.name == ANY_COMPONENT {
                document_problems.push(
                    at(
                        &name_path,
                        FieldError::invalid(
                            &name_path,
                            &leader.name,
                            "\"*\" is a wildcard for component, not for name",
                        ),
                    )
                    .hint("list each controller to migrate by name"),
                );
                continue;
            }
            let Some(entry) = catalog.resolve(&leader.name) else {
                let mut problem = at(
                    &name_path,
                    FieldError::invalid(&name_path, &leader.name, "not a known controller"),
                );
                if let Some(suggestion) = closest_name(&leader.name, catalog) {
                    problem = problem.hint(format!("did you mean {suggestion}?"));
                }
                document_problems.push(problem);
                continue;
            };
            let name = entry.name;
            let resolved = if name.as_str() == leader.name {
                String::new()
            } else {
                format!(" ({} is an alias of {name})", leader.name)
            };
            match claims.get(&name) {
                Some(claim) if claim.document == document_index => document_problems.push(at(
                    &name_path,
                    FieldError::duplicate(
                        &name_path,
                        name.as_str(),
                        format!("already listed as {:?}{resolved}", claim.written),
                    ),
                )),
                Some(claim) => document_problems.push(
                    at(
                        &name_path,
                        FieldError::duplicate(
                            &name_path,
                            name.as_str(),
                            format!(
                                "already governed by lease {:?} (document {}){resolved}",
                                claim.lease,
                                claim.document + 1
                            ),
                        ),
                    )
                    .hint("no controller may be in two migration locks"),
                ),
                None => {
                    claims.insert(
                        name,
                        Claim {
                            lease: &config.leader_name,
                            document: document_index,
                            written: &leader.name,
                        },
                    );
                }
            }
            if !leader.component.is_empty() {
                controllers.push(MigratedController {
                    name,
                    component: Component::parse(&leader.component),
                });
            }
        }
        document_problems.sort_by_key(|p| p.line);
        problems.extend(document_problems);
        locks.push(MigrationLock {
            lease_name: config.leader_name.clone(),
            controllers,
        });
    }

    if problems.is_empty() {
        Ok(LoadedConfig {
            config: MigrationConfig { locks },
            warnings,
        })
    } else {
        problems.extend(warnings);
        Err(problems)
    }
}

/// The file line of a field path, or of the nearest enclosing thing that has one.
fn line_of(lines: &DocumentLines, path: &str) -> Option<usize> {
    let line = match path {
        "leaderName" => lines.leader_name,
        "resourceLock" => lines.resource_lock,
        _ => path.strip_prefix("controllerLeaders[").and_then(|rest| {
            let (index, field) = rest.split_once("].")?;
            let leader = lines.leaders.get(index.parse::<usize>().ok()?)?;
            let field_line = if field == "name" {
                leader.name
            } else {
                leader.component
            };
            Some(field_line.unwrap_or(leader.entry)).filter(|&line| line > 0)
        }),
    };
    line.or((lines.start > 0).then_some(lines.start))
}

/// Upstream's `IsDNS1123Subdomain`, with its message.
pub(crate) fn dns1123_subdomain_error(value: &str) -> Option<String> {
    const MAX: usize = 253;
    if value.len() > MAX {
        return Some(format!("must be no more than {MAX} characters"));
    }
    let label_ok = |label: &str| {
        let bytes = label.as_bytes();
        !bytes.is_empty()
            && bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
            && bytes[0] != b'-'
            && bytes[bytes.len() - 1] != b'-'
    };
    if value.split('.').all(label_ok) {
        None
    } else {
        Some("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".to_owned())
    }
}

/// The known name (canonical or alias) nearest to `name`, if one is near enough to be a typo.
fn closest_name(name: &str, catalog: &ControllerCatalog) -> Option<&'static str> {
    let lowered = name.to_ascii_lowercase();
    catalog
        .entries()
        .flat_map(|entry| std::iter::once(entry.name.as_str()).chain(entry.aliases.iter().copied()))
        .map(|candidate| (edit_distance(&lowered, candidate), candidate))
        .filter(|&(distance, candidate)| distance <= 3.max(candidate.len() / 5))
        .min()
        .map(|(_, candidate)| candidate)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ApiVersion, ControllerLeaderConfiguration};

    fn config(
        leader_name: &str,
        resource_lock: &str,
        leaders: &[(&str, &str)],
    ) -> LeaderMigrationConfiguration {
        LeaderMigrationConfiguration {
            leader_name: leader_name.to_owned(),
            resource_lock: resource_lock.to_owned(),
            controller_leaders: leaders
                .iter()
                .map(|(n, c)| ControllerLeaderConfiguration::new(n, c))
                .collect(),
        }
    }

    #[track_caller]
    fn check_upstream(input: LeaderMigrationConfiguration, expected: &[&str]) {
        let errors: Vec<String> = upstream_errors(&input).iter().map(ToString::to_string).collect();
        assert_eq!(errors, expected);
    }

    /// Validates documents built in code with the standard catalog; expects these rendered problems.
    #[track_caller]
    fn check(inputs: &[LeaderMigrationConfiguration], expected: &[&str]) {
        let documents: Vec<Document> = inputs
            .iter()
            .map(|c| Document::from_config(ApiVersion::V1Beta1, c.clone()))
            .collect();
        let rendered: Vec<String> =
            match validate_documents(&documents, &crate::controller_name::test_catalog()) {
                Ok(loaded) => loaded.warnings.iter().map(|p| p.render("f")).collect(),
                Err(problems) => problems.iter().map(|p| p.render("f")).collect(),
            };
        assert_eq!(rendered, expected);
    }

    // Upstream TestValidateLeaderMigrationConfiguration (reference §8.2).

    #[test]
    fn v1_empty_name() {
        check_upstream(
            config("", "leases", &[]),
            &["leaderName: Required value: leaderName must be set for LeaderMigrationConfiguration"],
        );
    }

    #[test]
    fn v2_invalid_resource_lock() {
        check_upstream(
            config("test", "invalid", &[]),
            &[
                "resourceLock: Invalid value: \"invalid\": resource Lock must be one of 'leases' or 'endpoints'",
            ],
        );
    }

    #[test]
    fn v3_empty_controller_leaders_is_valid() {
        check_upstream(config("test", "leases", &[]), &[]);
        check(&[config("test", "leases", &[])], &[]);
    }

    #[test]
    fn v4_endpoints_passes_upstream_but_not_here() {
        let input = config(
            "migration-120-to-121",
            "endpoints",
            &[("route-controller", "kube-controller-manager")],
        );
        check_upstream(input.clone(), &[]);
        check(
            &[input],
            &[
                "f: resourceLock: Unsupported value: \"endpoints\": client-go no longer has Endpoints locks (removed by kubernetes/kubernetes#106852); upstream accepts the value here and then fails at start-up\n  hint: use resourceLock: leases, or apiVersion controllermanager.config.k8s.io/v1, which implies it",
            ],
        );
    }

    // Derived cases (reference §8.8).

    #[test]
    fn d3_all_four_errors_in_upstream_order() {
        check_upstream(
            config("", "x", &[("", "")]),
            &[
                "leaderName: Required value: leaderName must be set for LeaderMigrationConfiguration",
                "resourceLock: Invalid value: \"x\": resource Lock must be one of 'leases' or 'endpoints'",
                "controllerLeaders[0].component: Required value",
                "controllerLeaders[0].name: Required value",
            ],
        );
    }

    #[test]
    fn d4_resource_lock_is_case_sensitive() {
        check_upstream(
            config("x", "Leases", &[]),
            &[
                "resourceLock: Invalid value: \"Leases\": resource Lock must be one of 'leases' or 'endpoints'",
            ],
        );
    }

    #[test]
    fn d5_duplicate_names_pass_upstream_but_not_here() {
        let input = config(
            "x",
            "leases",
            &[
                ("service", "kube-controller-manager"),
                ("service-lb-controller", "cloud-controller-manager"),
            ],
        );
        check_upstream(input.clone(), &[]);
        check(
            &[input],
            &[
                "f: controllerLeaders[1].name: Duplicate value: \"service-lb-controller\": already listed as \"service\"",
            ],
        );
    }

    #[test]
    fn d11_wildcard_name() {
        check(
            &[config("x", "leases", &[("*", "*")])],
            &[
                "f: controllerLeaders[0].name: Invalid value: \"*\": \"*\" is a wildcard for component, not for name\n  hint: list each controller to migrate by name",
            ],
        );
    }

    // Rules upstream misses.

    #[test]
    fn unknown_controller_names_are_errors_with_a_suggestion() {
        check(
            &[config(
                "x",
                "leases",
                &[("cloud-nodelifecycle-controller", "*"), ("grey", "*")],
            )],
            &[
                "f: controllerLeaders[0].name: Invalid value: \"cloud-nodelifecycle-controller\": not a known controller\n  hint: did you mean cloud-node-lifecycle-controller?",
                "f: controllerLeaders[1].name: Invalid value: \"grey\": not a known controller",
            ],
        );
    }

    #[test]
    fn aliases_resolve_to_canonical_names() {
        let documents = [Document::from_config(
            ApiVersion::V1,
            config(
                "m",
                "leases",
                &[
                    ("route", "*"),
                    ("service-controller", "*"),
                    ("cloud-node-lifecycle", "kube-controller-manager"),
                ],
            ),
        )];
        let loaded = validate_documents(&documents, &crate::controller_name::test_catalog()).unwrap();
        let names: Vec<&str> = loaded.config.locks()[0]
            .controllers
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "node-route-controller",
                "service-lb-controller",
                "cloud-node-lifecycle-controller"
            ]
        );
    }

    #[test]
    fn lease_names_must_be_dns_subdomains() {
        check(
            &[config("Migration_1", "leases", &[])],
            &[
                "f: leaderName: Invalid value: \"Migration_1\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            ],
        );
        assert_eq!(dns1123_subdomain_error("a.b-c.d0"), None);
        assert!(dns1123_subdomain_error("-a").is_some());
        assert!(dns1123_subdomain_error("a..b").is_some());
        assert!(dns1123_subdomain_error(&"a".repeat(254)).is_some());
    }

    #[test]
    fn the_main_lease_cannot_be_a_migration_lease() {
        check(
            &[config("cloud-controller-manager", "leases", &[])],
            &[
                "f: leaderName: Invalid value: \"cloud-controller-manager\": is the main leader-election lease of a controller manager\n  hint: the migration lease must be a Lease of its own; upstream's default is cloud-provider-extraction-migration",
            ],
        );
    }

    #[test]
    fn several_locks_need_unique_leases_and_disjoint_controllers() {
        check(
            &[
                config("a", "leases", &[("route", "*")]),
                config("a", "leases", &[("node-route-controller", "*")]),
            ],
            &[
                "f: leaderName: Duplicate value: \"a\": already the lease of document 1",
                "f: controllerLeaders[0].name: Duplicate value: \"node-route-controller\": already governed by lease \"a\" (document 1)\n  hint: no controller may be in two migration locks",
            ],
        );
        let documents = [
            Document::from_config(ApiVersion::V1, config("a", "leases", &[("route", "*")])),
            Document::from_config(ApiVersion::V1, config("b", "leases", &[("service", "*")])),
        ];
        let loaded = validate_documents(&documents, &crate::controller_name::test_catalog()).unwrap();
        assert_eq!(loaded.config.locks().len(), 2);
    }

    #[test]
    fn unknown_components_are_warnings() {
        check(
            &[config("x", "leases", &[("route", "cloud-controler-manager")])],
            &[
                "f: warning: controllerLeaders[0].component: \"cloud-controler-manager\" is neither kube-controller-manager, cloud-controller-manager nor \"*\"\n  hint: only a manager started with --leader-migration-component=cloud-controler-manager will run route; every other one treats it as owned elsewhere",
            ],
        );
    }

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "ab"), 2);
        assert_eq!(edit_distance("same", "same"), 0);
    }
}
