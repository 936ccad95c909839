//! Shared helpers.

use std::future::Future;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

/// Runs `kubectl` with the server's kubeconfig; panics with a clear message when kubectl is missing.
pub(crate) fn kubectl(kubeconfig: &Path, args: &[&str]) -> Output {
    kubectl_with_input(kubeconfig, args, None)
}

pub(crate) fn kubectl_with_input(kubeconfig: &Path, args: &[&str], input: Option<&str>) -> Output {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("kubectl is required for these tests and could not be started: {error}. Install kubectl and put it on PATH"));
    if let Some(input) = input {
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(input.as_bytes())
            .expect("write kubectl's stdin");
    }
    drop(child.stdin.take());
    child.wait_with_output().expect("kubectl runs")
}

pub(crate) fn ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "kubectl failed ({}):\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Polls `condition` until it holds or `timeout` passes.
pub(crate) async fn eventually<F, Fut>(timeout: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if condition().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A ConfigMap named `name` with `data`.
pub(crate) fn configmap(name: &str, data: serde_json::Value) -> k8s_openapi::api::core::v1::ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "data": data})).unwrap()
}

/// The code and reason of an API error; panics on any other error.
pub(crate) fn api_error(error: kube::Error) -> (u16, String) {
    match error {
        kube::Error::Api(status) => (status.code, status.reason),
        other => panic!("expected an API error, got {other:?}"),
    }
}
