//! The negative controls of the demo's verdict: `broken-ccm demo` (every replica the deliberately broken
//! manager of `src/broken.rs`) must fail, naming what the broken manager did, on the test API server and
//! on kube-apiserver. The chaos verdict's are run by `cargo xtask test` (`xtask/src/chaos.rs`).

use std::process::Command;

use control_plane::{Backend, on_both_backends};

fn broken_demo(backend: Backend, broken: &str) -> serde_json::Value {
    let apiserver = match backend {
        Backend::Test => "test",
        Backend::Kube => "kube",
    };
    let output = Command::new(env!("CARGO_BIN_EXE_broken-ccm"))
        .env("NEGATIVE_CONTROL", broken)
        .args([
            "demo",
            "--output",
            "json",
            "--replicas",
            "2",
            "--dwell-seconds",
            "0.3",
        ])
        .args(["--apiserver", apiserver])
        .output()
        .expect("broken-ccm runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let result: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{}", String::from_utf8_lossy(&output.stderr)));
    assert!(
        !output.status.success(),
        "the demo passed a broken manager: {result:#}"
    );
    assert_eq!(result["verdict"], "fail", "{result:#}");
    result
}

fn overlaps<'a>(result: &'a serde_json::Value, kind: &'a str) -> impl Iterator<Item = &'a serde_json::Value> {
    result["overlap_list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(move |o| o["kind"] == kind)
}

fn writes_after_losing_the_lease_fail_the_demo(backend: Backend) {
    let result = broken_demo(backend, "late-writes");
    let late: Vec<&serde_json::Value> = overlaps(&result, "write_outside_tenure")
        .filter(|o| o["controller"] == "service-lb-controller")
        .collect();
    assert!(!late.is_empty(), "{result:#}");
    // Both the Kubernetes and the cloud write after the tenure are named.
    assert!(
        late.iter()
            .any(|o| o["path"].as_str().is_some_and(|p| p.starts_with("/api"))),
        "{result:#}"
    );
    assert!(
        late.iter()
            .any(|o| o["path"].as_str().is_some_and(|p| p.starts_with("cloud:"))),
        "{result:#}"
    );
}

fn writes_naming_nobody_fail_the_demo(backend: Backend) {
    let result = broken_demo(backend, "anonymous");
    let paths: Vec<&str> = overlaps(&result, "unattributable_write")
        .filter_map(|o| o["path"].as_str())
        .collect();
    assert!(paths.iter().any(|p| p.starts_with("cloud:")), "{result:#}");
    assert!(paths.iter().any(|p| p.starts_with("/api")), "{result:#}");
}

fn a_leaked_load_balancer_fails_the_demo(backend: Backend) {
    let result = broken_demo(backend, "leak");
    let load_balancers = result["cloud_at_end"]["load_balancers"].as_array().unwrap();
    assert!(
        load_balancers
            .iter()
            .any(|lb| lb["name"].as_str().is_some_and(|n| n.ends_with("-leak"))),
        "{result:#}"
    );
    // The overlap audit has nothing against it: the verdict fails on the cloud's inventory.
    assert_eq!(result["overlaps"], 0, "{result:#}");
}

on_both_backends!(
    sync writes_after_losing_the_lease_fail_the_demo,
    writes_naming_nobody_fail_the_demo,
    a_leaked_load_balancer_fails_the_demo,
);
