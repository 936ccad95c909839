//! A burst of nodes for a manager to initialise under a cloud's rate limit, for the providers' tests of
//! the process's cloud budget (`aws.rs`, `gce.rs`).

use std::path::Path;

/// What one burst of node initialisations under a cloud's rate limit saw ([`initialise_burst`]).
#[derive(Debug)]
pub(crate) struct UnderLimit {
    /// From the first node created to the last initialised (or to the end of the wait for a refusal).
    pub(crate) took: std::time::Duration,
    /// Requests the cloud refused for its rate limit.
    pub(crate) refused: u64,
    /// The node controller's failed syncs, as the manager's log reports them.
    pub(crate) failed_syncs: usize,
}

/// Creates a node of each of `names` at once, with the uninitialized taint; then waits (at most a minute)
/// until every one is initialised or, with `until_refused`, until `refused` counts one refusal. `log` is
/// the manager's.
pub(crate) async fn initialise_burst(
    client: kube::Client,
    names: &[String],
    log: &Path,
    refused: impl Fn() -> u64,
    until_refused: bool,
) -> UnderLimit {
    use futures::StreamExt as _;
    use k8s_openapi::api::core::v1::Node;
    use kube_ccm_provider::names::TAINT_UNINITIALIZED;
    let nodes: kube::Api<Node> = kube::Api::all(client);
    let failed_syncs = || {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .matches("error syncing node; requeuing")
            .count()
    };
    let started = tokio::time::Instant::now();
    futures::stream::iter(names)
        .for_each_concurrent(32, |name| {
            let nodes = nodes.clone();
            async move {
                let node: Node = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": name},
                    "spec": {"taints": [{"key": TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
                }))
                .unwrap();
                nodes.create(&Default::default(), &node).await.unwrap();
            }
        })
        .await;
    let deadline = started + std::time::Duration::from_secs(60);
    loop {
        let done = if until_refused {
            refused() > 0
        } else {
            let list = nodes.list(&Default::default()).await.unwrap();
            !list.items.iter().any(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| t.iter().any(|t| t.key == TAINT_UNINITIALIZED))
            })
        };
        if done {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} within a minute:\n{}",
            if until_refused {
                "no refusal"
            } else {
                "nodes left uninitialised"
            },
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    UnderLimit {
        took: started.elapsed(),
        refused: refused(),
        failed_syncs: failed_syncs(),
    }
}
