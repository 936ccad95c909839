//! `ccm-demo demo`: the README's first command, end to end.

use control_plane::Backend;

#[allow(dead_code)] // the binaries' shared helpers; the demo uses a few
#[path = "../../cloud-controller-manager/tests/it/support.rs"]
mod support;

use crate::support::{SvgTenure, stderr, stdout, svg_tenures};

/// The binary under test.
fn binary() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_ccm-demo"))
}

fn demo(args: &[&str]) -> (std::process::Output, serde_json::Value) {
    demo_on(Backend::Test, args)
}

/// `demo … --output json` on the test API server or (`--apiserver kube`) a real kube-apiserver.
fn demo_on(backend: Backend, args: &[&str]) -> (std::process::Output, serde_json::Value) {
    let apiserver = match backend {
        Backend::Test => "test",
        Backend::Kube => "kube",
    };
    let output = binary()
        .args([
            "demo",
            "--output",
            "json",
            "--replicas",
            "2",
            "--dwell-seconds",
            "0.3",
            "--apiserver",
            apiserver,
        ])
        .args(args)
        .output()
        .unwrap();
    let result: serde_json::Value = serde_json::from_str(&stdout(&output))
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", stdout(&output), stderr(&output)));
    assert_eq!(result["apiserver"]["kind"], backend.kind(), "{result:#}");
    (output, result)
}

fn assert_migrated(result: &serde_json::Value, released: bool) {
    assert_eq!(result["verdict"], "ok", "{result:#}");
    assert_eq!(result["overlaps"], 0, "{result:#}");
    assert!(result["writes_checked"].as_u64().unwrap() > 0, "{result:#}");
    assert!(result["nodes_initialized"].as_u64().unwrap() >= 6, "{result:#}");
    assert!(
        result["services_with_ingress"].as_u64().unwrap() >= 2,
        "{result:#}"
    );
    let handoffs = result["handoffs"].as_array().unwrap();
    let to_new_side = handoffs
        .iter()
        .find(|h| {
            h["lease"] == "cloud-provider-extraction-migration"
                && h["from"].as_str().unwrap().starts_with("kcm-")
                && h["to"].as_str().unwrap().starts_with("ccm-")
        })
        .unwrap_or_else(|| panic!("no kcm → ccm hand-off of the migration lease: {result:#}"));
    assert_eq!(to_new_side["released"], released, "{result:#}");
}

fn a_graceful_rolling_migration_passes_the_audit(backend: Backend) {
    let (output, result) = demo_on(backend, &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_migrated(&result, true);
    // Graceful hand-offs are immediate, not a lease duration.
    for handoff in result["handoffs"].as_array().unwrap() {
        assert!(handoff["gap_ms"].as_f64().unwrap() < 1000.0, "{result:#}");
    }
}

fn a_migration_by_crashes_waits_out_each_lease_and_passes_the_audit(backend: Backend) {
    let (output, result) = demo_on(backend, &["--crash"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_migrated(&result, false);
    for handoff in result["handoffs"].as_array().unwrap() {
        assert!(handoff["gap_ms"].as_f64().unwrap() >= 2000.0, "{result:#}");
    }
}

#[test]
fn the_text_timeline_names_leases_holders_and_the_verdict() {
    let output = binary()
        .args([
            "demo",
            "--replicas",
            "1",
            "--dwell-seconds",
            "0",
            "--nodes",
            "1",
            "--services",
            "1",
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    for expected in [
        "lease cloud-provider-extraction-migration",
        "→ kcm-1",
        "→ ccm-1",
        "runs cloud-node-controller",
        "step 1/1: ccm-1 joins",
        "verdict: ok",
    ] {
        assert!(text.contains(expected), "{expected:?} missing from:\n{text}");
    }
}

fn a_rollback_half_way_and_back_passes_the_audit_and_its_report_draws_it(backend: Backend) {
    let directory = tempfile::tempdir().unwrap();
    let report = directory.path().join("rollback.svg");
    let (output, result) = demo_on(backend, &["--rollback", "--report", report.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(result["verdict"], "ok", "{result:#}");
    assert_eq!(result["mode"], "rollback", "{result:#}");
    assert_eq!(result["overlaps"], 0, "{result:#}");
    assert_eq!(
        result["migration_lease_ends_with"], "kube-controller-manager",
        "{result:#}"
    );
    // Every service (more arrived during the rollback) has its load balancer: kube-controller-manager took
    // its controllers back.
    assert!(
        result["services_with_ingress"].as_u64().unwrap() >= 2,
        "{result:#}"
    );
    let handoffs = result["handoffs"].as_array().unwrap();
    let migration_handoff = |from: &str, to: &str| {
        handoffs.iter().any(|h| {
            h["lease"] == "cloud-provider-extraction-migration"
                && h["from"].as_str().unwrap().starts_with(from)
                && h["to"].as_str().unwrap().starts_with(to)
        })
    };
    assert!(migration_handoff("kcm-", "ccm-"), "forward: {result:#}");
    assert!(migration_handoff("ccm-", "kcm-"), "back: {result:#}");

    // The report draws what the audit found: the picture is checked by its content.
    let text = std::fs::read_to_string(&report).unwrap();
    let svg = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{e}:\n{text}"));
    assert_eq!(svg.root_element().tag_name().name(), "svg");
    let tenures = svg_tenures(&svg);
    let migration: Vec<&SvgTenure> = tenures
        .iter()
        .filter(|t| t.0 == "cloud-provider-extraction-migration")
        .collect();
    assert!(migration.len() >= 3, "kcm → ccm → kcm at least: {migration:?}");
    for tenure in &migration {
        let side = if tenure.1.starts_with("kcm-") {
            "kube-controller-manager"
        } else {
            "cloud-controller-manager"
        };
        assert_eq!(tenure.2, side, "{tenure:?}");
    }
    // One holder at a time: each tenure ends before the next begins, and the last holder is a
    // kube-controller-manager.
    let mut ordered = migration.clone();
    ordered.sort_by_key(|t| t.3);
    for pair in ordered.windows(2) {
        let end = pair[0].4.expect("only the last tenure may be open");
        assert!(end <= pair[1].3, "overlapping tenures drawn: {pair:?}");
    }
    assert!(ordered.last().unwrap().1.starts_with("kcm-"), "{ordered:?}");
    // Every hand-off is a hatched gap; every join and stop a mark; the verdict is in the footer.
    let gaps = svg
        .descendants()
        .filter(|n| n.attribute("class") == Some("gap"))
        .count();
    assert!(
        gaps >= handoffs.len(),
        "{gaps} gaps for {} hand-offs",
        handoffs.len()
    );
    let marks: Vec<&str> = svg
        .descendants()
        .filter_map(|n| n.attribute("data-label"))
        .collect();
    for expected in [
        "kcm-1 joins",
        "ccm-1 joins",
        "kcm-3 joins",
        "ccm-1 SIGTERM",
        "every replica stopped (SIGTERM)",
    ] {
        assert!(marks.contains(&expected), "{expected:?} not in {marks:?}");
    }
    // The first node to go is the one whose kube-controller-manager held the migration lock then.
    let first_stop = svg
        .descendants()
        .find(|n| {
            n.attribute("data-label")
                .is_some_and(|l| l.starts_with("kcm-") && l.ends_with(" SIGTERM"))
        })
        .unwrap();
    let (who, at) = (
        first_stop
            .attribute("data-label")
            .unwrap()
            .trim_end_matches(" SIGTERM"),
        first_stop
            .attribute("data-at-us")
            .unwrap()
            .parse::<i64>()
            .unwrap(),
    );
    let holder_then = ordered
        .iter()
        .find(|t| t.3 <= at && t.4.is_none_or(|end| at < end))
        .unwrap_or_else(|| panic!("nobody held the migration lock at {at}: {ordered:?}"));
    assert_eq!(holder_then.1, who, "{ordered:?}");
    let footer: Vec<String> = svg
        .descendants()
        .filter(|n| n.attribute("class") == Some("footer"))
        .map(|n| n.text().unwrap_or_default().to_owned())
        .collect();
    assert!(footer[0].starts_with("verdict: ok · 0 overlap(s)"), "{footer:?}");
    assert!(
        footer[1].contains("held at the end by: kube-controller-manager"),
        "{footer:?}"
    );
}

#[test]
fn a_report_that_cannot_be_written_is_an_error_naming_the_flag() {
    let directory = tempfile::tempdir().unwrap();
    let report = directory.path().join("missing-directory/report.svg");
    let output = binary()
        .args([
            "demo",
            "--replicas",
            "1",
            "--dwell-seconds",
            "0",
            "--nodes",
            "1",
            "--services",
            "1",
            "--report",
        ])
        .arg(&report)
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert_eq!(stdout(&output), "", "refused before the demo starts");
    let error = stderr(&output);
    assert!(
        error.contains("--report") && error.contains("missing-directory"),
        "{error}"
    );
    assert!(!report.exists());
    let onto_a_directory = binary()
        .args(["demo", "--report"])
        .arg(directory.path())
        .output()
        .unwrap();
    assert!(!onto_a_directory.status.success());
    assert_eq!(stdout(&onto_a_directory), "");
    assert!(
        stderr(&onto_a_directory).contains("a directory, not a file"),
        "{}",
        stderr(&onto_a_directory)
    );
}

/// The cloud's part of a result: every change judged (none unattributed), and at the end one load balancer
/// per service, each sending to every node, and a route to every node.
fn assert_cloud_converged(result: &serde_json::Value, cloud: &str) {
    assert_eq!(result["cloud"], cloud, "{result:#}");
    assert!(result["cloud_writes_checked"].as_u64().unwrap() > 0, "{result:#}");
    assert_eq!(
        result["unattributed_cloud_writes"].as_array().unwrap().len(),
        0,
        "{result:#}"
    );
    let end = &result["cloud_at_end"];
    let nodes = result["nodes_initialized"].as_u64().unwrap();
    let load_balancers = end["load_balancers"].as_array().unwrap();
    assert_eq!(
        load_balancers.len() as u64,
        result["services_with_ingress"].as_u64().unwrap(),
        "{result:#}"
    );
    assert!(
        load_balancers.iter().all(|lb| lb["backends"] == nodes),
        "{result:#}"
    );
    assert!(end["routes"].as_u64().unwrap() >= nodes, "{result:#}");
    assert!(end["instances"].as_u64().unwrap() >= nodes, "{result:#}");
}

#[test]
fn the_aws_provider_migrates_against_moto_and_its_cloud_changes_pass_the_audit() {
    // The demo would install moto on first use; a test never does.
    if harness::Moto::installed_for_test().is_none() {
        return;
    }
    let (output, result) = demo(&["--cloud", "aws"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_migrated(&result, true);
    assert_cloud_converged(&result, "aws");
}

#[test]
fn the_gce_provider_migrates_against_the_compute_double_and_its_cloud_changes_pass_the_audit() {
    let (output, result) = demo(&["--cloud", "gce", "--crash"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_migrated(&result, false);
    assert_cloud_converged(&result, "gce");
}

control_plane::on_both_backends!(
    sync a_graceful_rolling_migration_passes_the_audit,
    a_migration_by_crashes_waits_out_each_lease_and_passes_the_audit,
    a_rollback_half_way_and_back_passes_the_audit_and_its_report_draws_it,
);

/// Issue 33's scenario 1 as the demo plays it: from the real kube-controller-manager (N), which since
/// v1.31 holds its Leases and runs no cloud controller (the timeline shows `leader-migration status`
/// saying so), to ours; kube-controller-manager does not release, so the migration Lease passes after it
/// expires.
#[test]
fn the_demo_migrates_from_the_real_kube_controller_manager() {
    crate::support::with_kube_binaries(
        "the_demo_migrates_from_the_real_kube_controller_manager",
        |binaries| async move {
            let output = binary()
                .args([
                    "demo",
                    "--apiserver",
                    "kube",
                    "--from",
                    "kcm",
                    "--replicas",
                    "2",
                    "--dwell-seconds",
                    "0.3",
                ])
                .output()
                .unwrap();
            let text = stdout(&output);
            assert!(output.status.success(), "{text}\n{}", stderr(&output));
            for expected in [
                &format!(
                    "as the real kube-controller-manager {}",
                    binaries.kubernetes_version
                )[..],
                "runs no cloud controller",
                "leader-migration status: MigrationLocksOnCloudSide False (HeldByExternalKubeControllerManager)",
                "step 1/2: ccm-1 joins",
                "verdict: ok",
            ] {
                assert!(text.contains(expected), "{expected:?} missing from:\n{text}");
            }
            let refused = binary()
                .args(["demo", "--apiserver", "kube", "--from", "kcm", "--rollback"])
                .output()
                .unwrap();
            assert!(!refused.status.success());
            assert!(
                stderr(&refused).contains("leaves them running nowhere"),
                "{}",
                stderr(&refused)
            );
        },
    );
}

/// Issue 33's scenario 2 as the demo plays it: upstream's Go cloud-controller-manager replaced by ours
/// one replica at a time, half-way and back (`--rollback`), judged from kube-apiserver's audit log; the
/// JSON names the peer and its version.
#[test]
fn the_demo_swaps_upstreams_go_ccm_for_ours_and_back() {
    crate::support::with_kube_binaries(
        "the_demo_swaps_upstreams_go_ccm_for_ours_and_back",
        |binaries| async move {
            let (output, result) = demo_on(Backend::Kube, &["--from", "go-ccm", "--rollback"]);
            assert!(output.status.success(), "{result:#}\n{}", stderr(&output));
            assert_eq!(result["verdict"], "ok", "{result:#}");
            assert_eq!(result["from"]["kind"], "go-cloud-controller-manager");
            assert_eq!(result["from"]["version"], binaries.kubernetes_version);
            assert_eq!(result["overlaps"], 0, "{result:#}");
            let migration: Vec<&serde_json::Value> = result["handoffs"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|h| h["lease"] == "cloud-provider-extraction-migration")
                .collect();
            let named = |h: &serde_json::Value, key: &str, prefix: &str| {
                h[key].as_str().is_some_and(|n| n.starts_with(prefix))
            };
            assert!(
                migration
                    .iter()
                    .any(|h| named(h, "from", "go-ccm-") && named(h, "to", "ccm-")),
                "Go → ours: {result:#}"
            );
            assert!(
                migration
                    .iter()
                    .any(|h| named(h, "from", "ccm-") && named(h, "to", "go-ccm-")),
                "ours → Go: {result:#}"
            );
        },
    );
}

#[test]
fn the_demo_binary_is_the_manager_with_demo_added() {
    let help = binary().arg("--help").output().unwrap();
    assert!(help.status.success(), "{}", stderr(&help));
    let text = stdout(&help);
    assert!(
        text.contains("  demo\n          Run a leader migration on this machine"),
        "{text}"
    );
    assert!(text.contains("  leader-migration\n"), "{text}");
    assert!(text.contains("--cloud-provider"), "{text}");
    // A bad demo flag is clap's usage error, naming the flag.
    let bad = binary().args(["demo", "--replicas", "0"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("--replicas"), "{}", stderr(&bad));
}
