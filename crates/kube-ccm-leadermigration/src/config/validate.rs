//! Validation: upstream's rules, then the ones upstream misses.

use std::collections::HashMap;

use super::decode::{Document, DocumentLines};
use super::errors::{FieldError, Problem};
use super::{
    ANY_COMPONENT, CLOUD_CONTROLLER_MANAGER, Component, ControllerLeaderConfiguration,
    KUBE_CONTROLLER_MANAGER, LEASES, LeaderMigrationConfiguration, LoadedConfig, MigratedController,
    MigrationConfig, MigrationLock,
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

/// A claim on a controller: where an entry lists it, to report a second claim against the first.
struct Claim<'a> {
    lease: &'a str,
    document: usize,
    written: &'a str,
}

/// Validates every document of one file, and the rules between documents.
///
/// Each document's checks run in groups, in this order: upstream's rules, the lease name, the lock kind,
/// then each controller entry; its problems are then sorted by line (the sort is stable, so problems on
/// one line keep that order).
pub(super) fn validate_documents(
    documents: &[Document],
    catalog: &ControllerCatalog,
) -> Result<LoadedConfig, Vec<Problem>> {
    let mut problems = Vec::new();
    let mut warnings: Vec<Problem> = Vec::new();
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
        document_problems.extend(lease_name_problem(config, lines, document_index, &mut leases));
        document_problems.extend(resource_lock_problem(config, lines));

        let mut controllers = Vec::new();
        for (index, leader) in config.controller_leaders.iter().enumerate() {
            warnings.extend(component_warning(leader, index, lines));
            let name = match resolve_leader(leader, index, lines, catalog) {
                Ok(Some(name)) => name,
                Ok(None) => continue,
                Err(problem) => {
                    document_problems.push(problem);
                    continue;
                }
            };
            let claim = Claim {
                lease: &config.leader_name,
                document: document_index,
                written: &leader.name,
            };
            match claim_problem(&claims, name, &claim, index, lines) {
                Some(problem) => document_problems.push(problem),
                None => {
                    claims.insert(name, claim);
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

/// A problem located at `path`'s line: the one way every check below turns a field error into a problem.
fn problem_at(lines: &DocumentLines, path: &str, error: FieldError) -> Problem {
    Problem::from_field_error(line_of(lines, path), &error)
}

/// The lease name's problem, if any: not a DNS subdomain, the main lease of a controller manager, or
/// already an earlier document's lease. A lease name that passes the first two is recorded in `leases`
/// (replacing an earlier document's), so that later documents are checked against it.
fn lease_name_problem<'a>(
    config: &'a LeaderMigrationConfiguration,
    lines: &DocumentLines,
    document_index: usize,
    leases: &mut HashMap<&'a str, usize>,
) -> Option<Problem> {
    if config.leader_name.is_empty() {
        return None;
    }
    let at = |error: FieldError| problem_at(lines, "leaderName", error);
    if let Some(detail) = dns1123_subdomain_error(&config.leader_name) {
        Some(at(FieldError::invalid("leaderName", &config.leader_name, detail)))
    } else if [KUBE_CONTROLLER_MANAGER, CLOUD_CONTROLLER_MANAGER].contains(&config.leader_name.as_str()) {
        Some(
            at(FieldError::invalid(
                "leaderName",
                &config.leader_name,
                "is the main leader-election lease of a controller manager",
            ))
            .hint("the migration lease must be a Lease of its own; upstream's default is cloud-provider-extraction-migration"),
        )
    } else {
        let first = leases.insert(config.leader_name.as_str(), document_index)?;
        Some(at(FieldError::duplicate(
            "leaderName",
            &config.leader_name,
            format!("already the lease of document {}", first + 1),
        )))
    }
}

/// The lock kind's problem, if any: `endpoints`, which upstream accepts but client-go can no longer lock
/// with.
fn resource_lock_problem(config: &LeaderMigrationConfiguration, lines: &DocumentLines) -> Option<Problem> {
    (config.resource_lock == ENDPOINTS).then(|| {
        problem_at(
            lines,
            "resourceLock",
            FieldError::not_supported(
                "resourceLock",
                ENDPOINTS,
                "client-go no longer has Endpoints locks (removed by kubernetes/kubernetes#106852); upstream accepts the value here and then fails at start-up",
            ),
        )
        .hint(format!("use resourceLock: {LEASES}, or apiVersion controllermanager.config.k8s.io/v1, which implies it"))
    })
}

/// A warning for a `controllerLeaders` entry whose component is none a manager is started with: allowed,
/// but most likely a typo that leaves its controller to no one.
fn component_warning(
    leader: &ControllerLeaderConfiguration,
    index: usize,
    lines: &DocumentLines,
) -> Option<Problem> {
    if leader.component.is_empty()
        || [ANY_COMPONENT, KUBE_CONTROLLER_MANAGER, CLOUD_CONTROLLER_MANAGER]
            .contains(&leader.component.as_str())
    {
        return None;
    }
    let component_path = format!("controllerLeaders[{index}].component");
    Some(
        Problem::error(
            line_of(lines, &component_path),
            Some(component_path),
            format!(
                "{:?} is neither kube-controller-manager, cloud-controller-manager nor \"*\"",
                leader.component
            ),
        )
        .warning()
        .hint(format!(
            "only a manager started with --leader-migration-component={} will run {}; every other one treats it as owned elsewhere",
            leader.component, leader.name
        )),
    )
}

/// The canonical name a `controllerLeaders` entry names: `Ok(None)` when it names none (upstream's rule
/// reports that), `Err` for the wildcard or an unknown name (with the nearest known one as a hint).
fn resolve_leader(
    leader: &ControllerLeaderConfiguration,
    index: usize,
    lines: &DocumentLines,
    catalog: &ControllerCatalog,
) -> Result<Option<ControllerName>, Problem> {
    if leader.name.is_empty() {
        return Ok(None);
    }
    let name_path = format!("controllerLeaders[{index}].name");
    let at = |error: FieldError| problem_at(lines, &name_path, error);
    if leader.name == ANY_COMPONENT {
        return Err(at(FieldError::invalid(
            &name_path,
            &leader.name,
            "\"*\" is a wildcard for component, not for name",
        ))
        .hint("list each controller to migrate by name"));
    }
    let Some(entry) = catalog.resolve(&leader.name) else {
        let mut problem = at(FieldError::invalid(
            &name_path,
            &leader.name,
            "not a known controller",
        ));
        if let Some(suggestion) = closest_name(&leader.name, catalog) {
            problem = problem.hint(format!("did you mean {suggestion}?"));
        }
        return Err(problem);
    };
    Ok(Some(entry.name))
}

/// The problem with `claim` on `name`, if an earlier entry claimed it: in the same document, or in
/// another document's lock. Without one, the caller records the claim.
fn claim_problem(
    claims: &HashMap<ControllerName, Claim<'_>>,
    name: ControllerName,
    claim: &Claim<'_>,
    index: usize,
    lines: &DocumentLines,
) -> Option<Problem> {
    let first = claims.get(&name)?;
    let name_path = format!("controllerLeaders[{index}].name");
    let resolved = if name.as_str() == claim.written {
        String::new()
    } else {
        format!(" ({} is an alias of {name})", claim.written)
    };
    let at = |detail: String| {
        problem_at(
            lines,
            &name_path,
            FieldError::duplicate(&name_path, name.as_str(), detail),
        )
    };
    if first.document == claim.document {
        Some(at(format!("already listed as {:?}{resolved}", first.written)))
    } else {
        Some(
            at(format!(
                "already governed by lease {:?} (document {}){resolved}",
                first.lease,
                first.document + 1
            ))
            .hint("no controller may be in two migration locks"),
        )
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
mod tests;
