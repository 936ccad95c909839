//! `cloud-controller-manager leader-migration …`.

use serde_json::json;

use crate::support::{run, stderr, stdout};

#[test]
fn validate_accepts_the_shipped_examples_with_one_line_each() {
    let files = [
        "examples/leader-migration/n.yaml",
        "examples/leader-migration/n-plus-1.yaml",
        "examples/leader-migration/wildcard.yaml",
        "examples/leader-migration/two-locks.yaml",
    ];
    let mut args = vec!["leader-migration", "validate"];
    args.extend(files);
    let output = run(&args);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let out = stdout(&output);
    assert_eq!(out.lines().count(), files.len(), "{out}");
    assert!(out.contains(
        "examples/leader-migration/n.yaml: valid: 1 migration lock: cloud-provider-extraction-migration (3 controllers)"
    ));
    assert!(out.contains("two-locks.yaml: valid: 2 migration locks: cloud-network-controller-migration (2 controllers), cloud-node-lifecycle-migration (1 controller)"));
    assert_eq!(stderr(&output), "");
}

#[test]
fn validate_reports_every_problem_with_file_line_and_field_and_exits_1() {
    let output = run(&[
        "leader-migration",
        "validate",
        "examples/leader-migration/n.yaml",
        "examples/leader-migration/broken.yaml",
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stdout(&output).contains("n.yaml: valid"),
        "valid files are still summarised"
    );
    let err = stderr(&output);
    let problems: Vec<&str> = err.lines().filter(|l| !l.starts_with("  ")).collect();
    assert_eq!(
        problems,
        [
            "examples/leader-migration/broken.yaml:5: resourceLock: unknown field `resourceLock`, expected one of apiVersion, kind, leaderName, controllerLeaders",
            "examples/leader-migration/broken.yaml:8: controllerLeaders[0]: unquoted * is read as a YAML alias, not as the wildcard (while scanning an anchor or alias, did not find expected alphabetic or numeric character)",
        ],
        "{err}"
    );
    assert!(err.contains("  hint: an unquoted * starts a YAML alias"));
    assert!(err.contains("  hint: controllermanager.config.k8s.io/v1 has no resourceLock"));
}

#[test]
fn validate_names_unreadable_files() {
    let output = run(&["leader-migration", "validate", "does/not/exist.yaml"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).starts_with("does/not/exist.yaml: cannot read the file: "),
        "{}",
        stderr(&output)
    );
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(run(&["leader-migration", "validate"]).status.code(), Some(2));
    assert_eq!(
        run(&["leader-migration", "plan"]).status.code(),
        Some(2),
        "--component is required"
    );
    assert_eq!(
        run(&["leader-migration", "plan", "--component", "x", "--output", "xml"])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(run(&["leader-migration", "frobnicate"]).status.code(), Some(2));
}

#[test]
fn status_and_preflight_refuse_bad_flags_before_touching_a_cluster() {
    let unknown = run(&["leader-migration", "status", "--wait-for", "Done"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(
        stderr(&unknown).contains("unknown condition \"Done\" (one of KubeControllerManagerLeading, "),
        "{}",
        stderr(&unknown)
    );
    let status = run(&["leader-migration", "status", "--wait-for", "Completed=Yes"]);
    assert_eq!(status.status.code(), Some(2));
    assert!(stderr(&status).contains("unknown status \"Yes\" (True, False or Unknown)"));
    let reason = run(&[
        "leader-migration",
        "status",
        "--wait-for",
        "Completed=False/not one",
    ]);
    assert_eq!(reason.status.code(), Some(2));
    assert!(
        stderr(&reason).contains("a reason is one CamelCase word, not \"not one\""),
        "{}",
        stderr(&reason)
    );
    let report = run(&[
        "leader-migration",
        "status",
        "--report",
        "/nonexistent-dir/status.svg",
    ]);
    assert_eq!(report.status.code(), Some(1), "{}", stderr(&report));
    assert!(
        stderr(&report)
            .contains("--report /nonexistent-dir/status.svg: the directory /nonexistent-dir does not exist"),
        "{}",
        stderr(&report)
    );
    let timeout_alone = run(&["leader-migration", "status", "--timeout", "5s"]);
    assert_eq!(timeout_alone.status.code(), Some(2), "--timeout needs --wait-for");
    let bad_timeout = run(&[
        "leader-migration",
        "status",
        "--wait-for",
        "Completed",
        "--timeout",
        "soon",
    ]);
    assert_eq!(bad_timeout.status.code(), Some(2));
    assert_eq!(
        run(&["leader-migration", "preflight"]).status.code(),
        Some(2),
        "--component is required"
    );
}

#[test]
fn plan_json_places_every_controller() {
    let output = run(&[
        "leader-migration",
        "plan",
        "--component",
        "kube-controller-manager",
        "--config",
        "examples/leader-migration/n-plus-1.yaml",
        "--output",
        "json",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let plan: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        plan,
        json!({
            "component": "kube-controller-manager",
            "controllers": [
                {"name": "cloud-node-controller", "lock": "main", "lease": "kube-controller-manager", "owner": null,
                 "skipped": null, "needs": ["instances"]},
                {"name": "cloud-node-lifecycle-controller", "lock": "none", "lease": null, "owner": "cloud-controller-manager",
                 "skipped": null, "needs": ["instances"]},
                {"name": "service-lb-controller", "lock": "none", "lease": null, "owner": "cloud-controller-manager",
                 "skipped": null, "needs": ["load balancers"]},
                {"name": "node-route-controller", "lock": "none", "lease": null, "owner": "cloud-controller-manager",
                 "skipped": null, "needs": ["routes"]},
                // Off unless named: the framework's node-IPAM controller (the cloud allocator needs the
                // provider's pod CIDRs), and a provider's own controller, only with its provider.
                {"name": "node-ipam-controller", "lock": "disabled", "lease": null, "owner": null,
                 "skipped": null, "needs": ["pod CIDRs with --cidr-allocator-type=CloudAllocator"]},
                {"name": "tagging-controller", "lock": "disabled", "lease": null, "owner": null,
                 "skipped": null, "needs": ["--cloud-provider=aws"]},
            ]
        })
    );
}

#[test]
fn plan_without_config_uses_the_default_and_honours_controllers() {
    let output = run(&[
        "leader-migration",
        "plan",
        "--component",
        "cloud-controller-manager",
        "--controllers",
        "*,-route",
        "--output",
        "json",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let plan: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let locks: Vec<(&str, &str)> = plan["controllers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["lock"].as_str().unwrap()))
        .collect();
    assert_eq!(
        locks,
        [
            ("cloud-node-controller", "main"),
            ("cloud-node-lifecycle-controller", "migration"),
            ("service-lb-controller", "migration"),
            ("node-route-controller", "disabled"),
            ("node-ipam-controller", "disabled"),
            ("tagging-controller", "disabled"),
        ]
    );
    let bad = run(&[
        "leader-migration",
        "plan",
        "--component",
        "c",
        "--controllers",
        "deployment",
    ]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("--controllers: \"deployment\" is not in the list of known controllers"));
    let broken = run(&[
        "leader-migration",
        "plan",
        "--component",
        "c",
        "--config",
        "examples/leader-migration/broken.yaml",
    ]);
    assert_eq!(broken.status.code(), Some(1));
    assert!(
        stderr(&broken).contains("broken.yaml:5: resourceLock"),
        "{}",
        stderr(&broken)
    );
}

#[test]
fn default_output_is_accepted_by_validate() {
    let dir = tempfile::tempdir().unwrap();
    for format in ["yaml", "json"] {
        let output = run(&["leader-migration", "default", "--output", format]);
        assert_eq!(output.status.code(), Some(0));
        let path = dir.path().join(format!("default.{format}"));
        std::fs::write(&path, &output.stdout).unwrap();
        let validated = run(&["leader-migration", "validate", path.to_str().unwrap()]);
        assert_eq!(validated.status.code(), Some(0), "{}", stderr(&validated));
        assert!(stdout(&validated).contains("cloud-provider-extraction-migration (3 controllers)"));
    }
}

#[test]
fn rbac_restricts_named_verbs_to_the_leases_of_a_config() {
    let output = run(&[
        "leader-migration",
        "rbac",
        "--namespace",
        "cp",
        "--config",
        "examples/leader-migration/two-locks.yaml",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = stdout(&output);
    let documents: Vec<serde_json::Value> = text
        .split("\n---\n")
        .skip(1)
        .map(|document| serde_saphyr::from_str(document).expect("each document is YAML"))
        .collect();
    assert_eq!(documents.len(), 4);
    for document in &documents {
        assert_eq!(document["metadata"]["namespace"], "cp");
    }
    assert_eq!(
        documents[2]["rules"][1]["resourceNames"],
        json!([
            "cloud-network-controller-migration",
            "cloud-node-lifecycle-migration"
        ])
    );
    assert_eq!(
        run(&["leader-migration", "rbac", "--lease", "a", "--config", "x"])
            .status
            .code(),
        Some(2)
    );
}

#[test]
fn plan_with_a_provider_says_which_controllers_it_skips_and_why() {
    let files = tempfile::tempdir().unwrap();
    let cloud_config = files.path().join("cloud.yaml");
    std::fs::write(&cloud_config, "loadBalancers: false\n").unwrap();
    let cloud_config = cloud_config.display().to_string();
    let plan = |extra: &[&str]| {
        let mut args = vec![
            "leader-migration",
            "plan",
            "--component",
            "cloud-controller-manager",
        ];
        args.extend(extra);
        let output = run(&args);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        stdout(&output)
    };
    let without = plan(&[]);
    assert!(
        without.contains("service-lb-controller              migration  lease cloud-provider-extraction-migration; needs: load balancers"),
        "{without}"
    );
    let with = plan(&[
        "--cloud-provider",
        "fake",
        "--cloud-config",
        &cloud_config,
        "--cluster-cidr",
        "10.244.0.0/16",
    ]);
    assert!(
        with.contains("service-lb-controller              migration  lease cloud-provider-extraction-migration; skipped: the cloud provider does not support load balancers"),
        "{with}"
    );
    assert!(
        with.contains(
            "node-route-controller              migration  lease cloud-provider-extraction-migration\n"
        ),
        "{with}"
    );
    let no_cidr = plan(&["--cloud-provider", "fake"]);
    assert!(
        no_cidr.contains("node-route-controller              migration  lease cloud-provider-extraction-migration; skipped: --cluster-cidr is not set"),
        "{no_cidr}"
    );
    let unknown = run(&[
        "leader-migration",
        "plan",
        "--component",
        "c",
        "--cloud-provider",
        "nimbus",
    ]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        stderr(&unknown).contains("unknown cloud provider \"nimbus\" (this binary has: aws, fake, gce)"),
        "{}",
        stderr(&unknown)
    );
}

#[test]
fn help_lists_the_providers_and_controllers_this_binary_has() {
    let output = run(&["--help"]);
    assert_eq!(output.status.code(), Some(0));
    let help = stdout(&output).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        help.contains("The provider for cloud services. Required. This binary has: aws, fake, gce."),
        "{help}"
    );
    assert!(
        help.contains("Controllers: cloud-node-controller (alias cloud-node), cloud-node-lifecycle-controller (alias cloud-node-lifecycle), service-lb-controller (alias service, service-controller), node-route-controller (alias route, route-controller). Disabled-by-default controllers: node-ipam-controller (alias nodeipam), tagging-controller (alias tagging) [--cloud-provider=aws]."),
        "{help}"
    );
    assert!(
        help.contains("Controllers' flags: --service-cluster-ip-range <service-cluster-ip-range> node-ipam-controller: CIDR Range for Services")
            && help.contains("--tags <tags> tagging-controller (--cloud-provider=aws): Tags to apply to AWS resources"),
        "{help}"
    );
}
