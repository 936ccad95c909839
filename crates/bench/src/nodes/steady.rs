//! The steady state: a window in which nothing in the cluster changes, and what a manager asks of the
//! API server and of the cloud meanwhile. Its periodic work (the address refresh every
//! `--node-status-update-frequency`, the lifecycle monitor, the services' node sets, routes) is all there
//! is to see.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use anyhow::Result;
use kube_ccm_fake::{AdminRequest, CloudRequest, CloudResponse, FakeCloud};

use super::{Contender, Server};
use crate::process::cpu_seconds;
use crate::stats::round;

/// What a manager did in a steady window.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Steady {
    pub(crate) seconds: f64,
    pub(crate) api_requests_per_minute: f64,
    /// API requests in the window by verb and resource (`patch nodes/status`).
    pub(crate) api_requests: BTreeMap<String, usize>,
    /// Cloud calls in the window by kind.
    pub(crate) cloud_calls: BTreeMap<String, u64>,
    pub(crate) cloud_calls_total: u64,
    /// Cloud calls per 1,000 nodes per address-refresh period (the bound: at most 1 with a
    /// batched provider).
    pub(crate) cloud_calls_per_1000_nodes_per_period: f64,
    pub(crate) manager_cpu_seconds: Option<f64>,
}

/// The cloud's calls so far, by kind.
pub(crate) async fn cloud_calls(cloud: &FakeCloud) -> HashMap<String, u64> {
    match cloud.handle(CloudRequest::Admin(AdminRequest::Snapshot)).await {
        CloudResponse::Snapshot { calls_by_kind, .. } => calls_by_kind.into_iter().collect(),
        _ => HashMap::new(),
    }
}

/// The calls made between two counts, by kind (kinds with none left out).
pub(crate) fn calls_between(
    before: &HashMap<String, u64>,
    after: &HashMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(kind, n)| {
            (
                kind.clone(),
                n.saturating_sub(before.get(kind).copied().unwrap_or(0)),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// `verb resource[/subresource]` of a request to `path` (`/api/v1/nodes/a/status` patched: `patch
/// nodes/status`); the path itself when it is not a resource's.
fn kind(verb: Option<&str>, path: &str) -> String {
    let path = path.split('?').next().unwrap_or_default();
    let mut segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let skip = match segments.first() {
        Some(&"api") => 2,
        Some(&"apis") => 3,
        _ => return format!("{} {path}", verb.unwrap_or("?")),
    };
    segments.drain(..skip.min(segments.len()));
    if segments.first() == Some(&"namespaces") && segments.len() > 2 {
        segments.drain(..2);
    }
    let resource = match segments.as_slice() {
        [resource, _, subresource, ..] => format!("{resource}/{subresource}"),
        [resource, ..] => (*resource).to_owned(),
        [] => "(discovery)".to_owned(),
    };
    format!("{} {resource}", verb.unwrap_or("?"))
}

/// The manager's requests so far, counted by [`kind`].
async fn requests_by_kind(
    server: &Server,
    client: &kube::Client,
    contender: &Contender,
) -> Result<BTreeMap<String, usize>> {
    let mut kinds = BTreeMap::new();
    for request in server.requests(client).await? {
        if contender.agents.iter().any(|a| request.user_agent.starts_with(a)) {
            *kinds
                .entry(kind(request.verb.as_deref(), &request.path))
                .or_default() += 1;
        }
    }
    Ok(kinds)
}

/// A steady window: how long, over how many nodes, refreshed how often.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pub(crate) length: Duration,
    pub(crate) nodes: u32,
    /// The manager's `--node-status-update-frequency`.
    pub(crate) period: Duration,
}

/// Waits out `window` with nothing changing and reports what the manager `pid` asked meanwhile.
pub(crate) async fn observe(
    server: &Server,
    client: &kube::Client,
    cloud: &FakeCloud,
    contender: &Contender,
    pid: u32,
    window: Window,
) -> Result<Steady> {
    let Window {
        length: window,
        nodes,
        period,
    } = window;
    let requests_before = requests_by_kind(server, client, contender).await?;
    let (calls_before, cpu_before) = (cloud_calls(cloud).await, cpu_seconds(pid));
    tokio::time::sleep(window).await;
    let cpu = cpu_seconds(pid)
        .zip(cpu_before)
        .map(|(after, before)| round(after - before));
    let calls = calls_between(&calls_before, &cloud_calls(cloud).await);
    let mut requests = requests_by_kind(server, client, contender).await?;
    for (kind, count) in &mut requests {
        *count = count.saturating_sub(requests_before.get(kind).copied().unwrap_or(0));
    }
    requests.retain(|_, count| *count > 0);
    let total: u64 = calls.values().sum();
    let periods = window.as_secs_f64() / period.as_secs_f64().max(1.0);
    let minutes = window.as_secs_f64() / 60.0;
    Ok(Steady {
        seconds: round(window.as_secs_f64()),
        api_requests_per_minute: round(requests.values().sum::<usize>() as f64 / minutes.max(f64::EPSILON)),
        api_requests: requests,
        cloud_calls: calls,
        cloud_calls_total: total,
        cloud_calls_per_1000_nodes_per_period: round(
            total as f64 * 1000.0 / f64::from(nodes.max(1)) / periods.max(f64::EPSILON),
        ),
        manager_cpu_seconds: cpu,
    })
}

#[cfg(test)]
mod tests {
    use super::kind;

    #[test]
    fn requests_are_counted_by_verb_and_resource() {
        assert_eq!(
            kind(Some("patch"), "/api/v1/nodes/a/status?fieldManager=x"),
            "patch nodes/status"
        );
        assert_eq!(kind(Some("list"), "/api/v1/nodes"), "list nodes");
        assert_eq!(
            kind(Some("get"), "/api/v1/namespaces/default/services/s"),
            "get services"
        );
        assert_eq!(
            kind(
                Some("update"),
                "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l"
            ),
            "update leases"
        );
        assert_eq!(
            kind(Some("patch"), "/api/v1/namespaces/d/services/s/status"),
            "patch services/status"
        );
        assert_eq!(
            kind(Some("create"), "/api/v1/namespaces/d/events"),
            "create events"
        );
        assert_eq!(kind(None, "/version"), "? /version");
    }
}
