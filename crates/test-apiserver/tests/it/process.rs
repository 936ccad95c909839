//! The `test-apiserver` binary.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::support::{kubectl, ok};

#[test]
fn prints_its_url_first_writes_a_kubeconfig_and_stops_on_sigterm() {
    let directory = tempfile::tempdir().unwrap();
    let kubeconfig = directory.path().join("kubeconfig");
    let mut child = Command::new(env!("CARGO_BIN_EXE_test-apiserver"))
        .args(["--listen", "127.0.0.1:0", "--kubeconfig-out"])
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let url = first
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("first line: {first}"));
    assert!(url.starts_with("http://127.0.0.1:"));
    let version = ok(&kubectl(&kubeconfig, &["version", "-o", "json"]));
    assert!(version.contains("v1.33.0-test-apiserver"), "{version}");
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(child.wait().unwrap().success(), "exits 0 on SIGTERM");
}
