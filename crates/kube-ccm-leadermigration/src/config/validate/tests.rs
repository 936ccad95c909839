use super::*;
use crate::config::{ApiVersion, ControllerLeaderConfiguration};

fn config(leader_name: &str, resource_lock: &str, leaders: &[(&str, &str)]) -> LeaderMigrationConfiguration {
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
    let rendered: Vec<String> = match validate_documents(&documents, &crate::controller_name::test_catalog())
    {
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
        &["resourceLock: Invalid value: \"invalid\": resource Lock must be one of 'leases' or 'endpoints'"],
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
        &["resourceLock: Invalid value: \"Leases\": resource Lock must be one of 'leases' or 'endpoints'"],
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
fn an_entry_resolves_to_a_canonical_name_or_a_problem() {
    let catalog = crate::controller_name::test_catalog();
    let lines = DocumentLines::default();
    // (case, the name as written, the canonical name or the rendered problem)
    let cases = [
        ("no name: upstream's rule reports it", "", "nothing to check"),
        (
            "a canonical name",
            "node-route-controller",
            "node-route-controller",
        ),
        ("an alias", "route", "node-route-controller"),
        (
            "the wildcard",
            "*",
            "f: controllerLeaders[0].name: Invalid value: \"*\": \"*\" is a wildcard for component, not for name\n  hint: list each controller to migrate by name",
        ),
        (
            "a typo, with the nearest name",
            "cloud-nodelifecycle-controller",
            "f: controllerLeaders[0].name: Invalid value: \"cloud-nodelifecycle-controller\": not a known controller\n  hint: did you mean cloud-node-lifecycle-controller?",
        ),
        (
            "an unknown name, nothing near",
            "grey",
            "f: controllerLeaders[0].name: Invalid value: \"grey\": not a known controller",
        ),
    ];
    for (case, written, expected) in cases {
        let leader = ControllerLeaderConfiguration::new(written, "*");
        let got = match resolve_leader(&leader, 0, &lines, &catalog) {
            Ok(Some(name)) => name.as_str().to_owned(),
            Ok(None) => "nothing to check".to_owned(),
            Err(problem) => problem.render("f"),
        };
        assert_eq!(got, expected, "{case}");
    }
}

#[test]
fn a_second_claim_on_a_controller_is_a_problem() {
    let catalog = crate::controller_name::test_catalog();
    let resolve = |name: &str| catalog.resolve(name).expect("a known controller").name;
    let claims = HashMap::from([(
        resolve("route"),
        Claim {
            lease: "a",
            document: 0,
            written: "route",
        },
    )]);
    let lines = DocumentLines::default();
    // (case, the name as written, its document, the rendered problem if any)
    let cases = [
        (
            "listed twice in one document",
            "route",
            0,
            Some(
                "f: controllerLeaders[1].name: Duplicate value: \"node-route-controller\": already listed as \"route\" (route is an alias of node-route-controller)",
            ),
        ),
        (
            "by its canonical name in one document",
            "node-route-controller",
            0,
            Some(
                "f: controllerLeaders[1].name: Duplicate value: \"node-route-controller\": already listed as \"route\"",
            ),
        ),
        (
            "in another document's lock",
            "node-route-controller",
            1,
            Some(
                "f: controllerLeaders[1].name: Duplicate value: \"node-route-controller\": already governed by lease \"a\" (document 1)\n  hint: no controller may be in two migration locks",
            ),
        ),
        ("a controller no one claimed", "service", 1, None),
    ];
    for (case, written, document, expected) in cases {
        let claim = Claim {
            lease: "b",
            document,
            written,
        };
        let got = claim_problem(&claims, resolve(written), &claim, 1, &lines).map(|p| p.render("f"));
        assert_eq!(got.as_deref(), expected, "{case}");
    }
}

#[test]
fn edit_distance_counts_edits() {
    assert_eq!(edit_distance("kitten", "sitting"), 3);
    assert_eq!(edit_distance("", "ab"), 2);
    assert_eq!(edit_distance("same", "same"), 0);
}
