//! The routes' phase of [`super::measure`] (`ccm-bench nodes --routes`): the manager runs its route
//! controller for [`CLUSTER_CIDR`] (the kubelet-shaped nodes' pod CIDRs lie in it). After the burst:
//! the time until the cloud holds a route for every node, and the route calls it took from the manager's
//! start (a round lists the cloud's routes once and creates only what is missing); then a window of whole
//! `--route-reconciliation-period`s with nothing changing, and the route calls per period in it.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use kube_ccm_fake::{AdminRequest, CloudRequest, CloudResponse, FakeCloud};

use super::steady::calls_between;
use crate::stats::round;

/// The cluster CIDR the manager is given: it holds every pod CIDR of [`super::kubelet_node`].
pub(crate) const CLUSTER_CIDR: &str = "10.64.0.0/10";

/// How often the cloud's routes are counted while waiting: it bounds how late convergence is noticed.
const POLL: Duration = Duration::from_secs(1);

/// What the route controller did.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Routes {
    /// Nodes, each with one pod CIDR.
    pub(crate) nodes: usize,
    /// From the last node initialised to a route for every node.
    pub(crate) seconds_after_burst: f64,
    /// Route calls from the manager's start to a route for every node, by call.
    pub(crate) calls_to_converge: BTreeMap<String, u64>,
    /// The route period and how many of them the steady window was.
    pub(crate) period_seconds: f64,
    pub(crate) periods: u32,
    /// Route calls per period in the steady window, by call.
    pub(crate) calls_per_period: BTreeMap<String, f64>,
    /// Of those, the writes (creates and deletes) per period: none once every route exists.
    pub(crate) writes_per_period: f64,
}

/// The cloud's routes and its route calls so far.
async fn snapshot(cloud: &FakeCloud) -> Result<(usize, HashMap<String, u64>)> {
    match cloud.handle(CloudRequest::Admin(AdminRequest::Snapshot)).await {
        CloudResponse::Snapshot {
            routes,
            calls_by_kind,
            ..
        } => Ok((
            routes.len(),
            calls_by_kind
                .into_iter()
                .filter(|(kind, _)| kind.ends_with("_route") || kind.ends_with("_routes"))
                .collect(),
        )),
        other => bail!("the fake cloud answered a snapshot with {other:?}"),
    }
}

/// Waits (up to `timeout`) for a route per node, then watches `periods` of `period`.
pub(super) async fn measure(
    cloud: &FakeCloud,
    nodes: usize,
    period: Duration,
    periods: u32,
    timeout: Duration,
) -> Result<Routes> {
    let started = Instant::now();
    let calls_to_converge = loop {
        let (routes, calls) = snapshot(cloud).await?;
        if routes >= nodes {
            break calls;
        }
        if started.elapsed() >= timeout {
            bail!("timed out after {timeout:?} waiting for {nodes} routes: the cloud has {routes}");
        }
        tokio::time::sleep(POLL).await;
    };
    let seconds_after_burst = started.elapsed().as_secs_f64();
    eprintln!("nodes: routes: {nodes} routes {seconds_after_burst:.1} s after the burst");
    let before = snapshot(cloud).await?.1;
    // The window is the measurement: nothing is awaited in it.
    tokio::time::sleep(period * periods).await;
    let calls = calls_between(&before, &snapshot(cloud).await?.1);
    let per_period = |n: u64| round(n as f64 / f64::from(periods.max(1)));
    let writes: u64 = calls
        .iter()
        .filter(|(kind, _)| kind.starts_with("create_") || kind.starts_with("delete_"))
        .map(|(_, n)| n)
        .sum();
    Ok(Routes {
        nodes,
        seconds_after_burst: round(seconds_after_burst),
        calls_to_converge: calls_to_converge.into_iter().collect(),
        period_seconds: period.as_secs_f64(),
        periods,
        calls_per_period: calls
            .iter()
            .map(|(kind, n)| (kind.clone(), per_period(*n)))
            .collect(),
        writes_per_period: per_period(writes),
    })
}
