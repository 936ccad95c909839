//! `cloud-controller-manager demo`: the README's first command, end to end.

use crate::support::{binary, stderr, stdout};

fn demo(args: &[&str]) -> (std::process::Output, serde_json::Value) {
    let output = binary()
        .args([
            "demo",
            "--output",
            "json",
            "--replicas",
            "2",
            "--dwell-seconds",
            "0.3",
        ])
        .args(args)
        .output()
        .unwrap();
    let result = serde_json::from_str(&stdout(&output))
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", stdout(&output), stderr(&output)));
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

#[test]
fn a_graceful_rolling_migration_passes_the_audit() {
    let (output, result) = demo(&[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_migrated(&result, true);
    // Graceful hand-offs are immediate, not a lease duration.
    for handoff in result["handoffs"].as_array().unwrap() {
        assert!(handoff["gap_ms"].as_f64().unwrap() < 1000.0, "{result:#}");
    }
}

#[test]
fn a_migration_by_crashes_waits_out_each_lease_and_passes_the_audit() {
    let (output, result) = demo(&["--crash"]);
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
