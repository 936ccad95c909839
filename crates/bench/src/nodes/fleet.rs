//! The fleet phase of [`super::measure`]: with every load-balanced service served, the cluster's nodes
//! change three times, one after the other — a node added, a node deleted, a node made unschedulable —
//! and each change is timed until every load balancer in the cloud sends traffic to the new node set:
//! from the change's API request to the cloud's last write of the change (the fake cloud stamps each),
//! with the cloud calls made meanwhile. An unschedulable node stays in the set (upstream's stable node
//! set, and ours): that change is watched for `--fleet-quiet-seconds`, and any load-balancer write in it
//! is reported.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_ccm_fake::{AdminRequest, CloudRequest, CloudResponse, FakeCloud, FakeInstance, HostSet};
use serde_json::json;

use super::kubelet_node;
use super::steady::calls_between;
use crate::stats::round;

/// How often the cloud's load balancers are checked: the time itself comes from the cloud's write
/// stamps, so this bounds only how late a change is noticed.
const POLL: Duration = Duration::from_secs(1);

/// One change of the node set and what it took.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Change {
    /// `add`, `delete` or `unschedulable`.
    pub(crate) change: &'static str,
    /// From the change's request to the last load balancer written with the new set (0 when none had
    /// to be).
    pub(crate) seconds: f64,
    /// Load balancers whose nodes the cloud changed.
    pub(crate) load_balancers_written: usize,
    /// Cloud calls meanwhile, by call.
    pub(crate) cloud_calls: BTreeMap<String, u64>,
    pub(crate) cloud_calls_total: u64,
}

/// The fleet phase: the load balancers, and each change.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Fleet {
    pub(crate) load_balancers: usize,
    pub(crate) nodes: usize,
    pub(crate) changes: Vec<Change>,
    /// The slowest of the changes that had load balancers to update.
    pub(crate) worst_seconds: f64,
}

/// What the cloud holds now.
struct Hosts {
    sets: Vec<HostSet>,
    calls: std::collections::HashMap<String, u64>,
    writes: usize,
}

async fn hosts(cloud: &FakeCloud) -> Result<Hosts> {
    match cloud.handle(CloudRequest::Admin(AdminRequest::HostSets)).await {
        CloudResponse::HostSets {
            sets,
            calls_by_kind,
            writes,
        } => Ok(Hosts {
            sets,
            calls: calls_by_kind.into_iter().collect(),
            writes,
        }),
        other => bail!("the fake cloud answered host sets with {other:?}"),
    }
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// Waits until every one of `load_balancers` sends traffic to exactly `nodes`.
async fn converged(
    cloud: &FakeCloud,
    load_balancers: usize,
    nodes: &[String],
    timeout: Duration,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let now = hosts(cloud).await?;
        if matches!(now.sets.as_slice(), [only] if only.load_balancers == load_balancers && only.nodes == nodes)
        {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            let groups: Vec<(usize, usize)> = now
                .sets
                .iter()
                .map(|s| (s.load_balancers, s.nodes.len()))
                .collect();
            bail!(
                "timed out after {timeout:?}: {load_balancers} load balancers should send traffic to the same \
                 {} nodes; (load balancers, nodes) by set: {groups:?}",
                nodes.len()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The cloud's load-balancer writes from the `from`-th on: the load balancers written, and the latest
/// of their *first* writes (a load balancer written again later, e.g. by a second pass that changes
/// nothing, had its new set at its first write).
async fn load_balancer_writes(cloud: &FakeCloud, from: usize) -> Result<(usize, Option<i64>)> {
    match cloud
        .handle(CloudRequest::Admin(AdminRequest::Writes { from }))
        .await
    {
        CloudResponse::Writes { writes } => {
            let mut first: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
            for write in writes.iter().filter(|w| w.call.ends_with("_load_balancer")) {
                first.entry(&write.object).or_insert(write.time_us);
            }
            Ok((first.len(), first.values().max().copied()))
        }
        other => bail!("the fake cloud answered writes with {other:?}"),
    }
}

/// The nodes the load balancers should have: every node (none is excluded or being deleted here).
pub(super) async fn measure(
    client: &kube::Client,
    cloud: &FakeCloud,
    load_balancers: usize,
    timeout: Duration,
    quiet: Duration,
) -> Result<Fleet> {
    let api: Api<Node> = Api::all(client.clone());
    let mut nodes: Vec<String> = api
        .list_metadata(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    nodes.sort();
    converged(cloud, load_balancers, &nodes, timeout)
        .await
        .context("before the fleet's changes")?;
    let mut changes = Vec::new();
    for change in ["add", "delete", "unschedulable"] {
        let started_us = now_us();
        let before = hosts(cloud).await?;
        match change {
            "add" => {
                let name = "fleet-added";
                cloud
                    .handle(CloudRequest::Admin(AdminRequest::PutInstance(
                        FakeInstance::running(name, 900_000),
                    )))
                    .await;
                api.create(&PostParams::default(), &kubelet_node(name, 900_000)?)
                    .await?;
                nodes.push(name.to_owned());
                nodes.sort();
            }
            "delete" => {
                let name = nodes
                    .iter()
                    .find(|n| n.starts_with("node-"))
                    .cloned()
                    .context("no node to delete")?;
                api.delete(&name, &DeleteParams::default()).await?;
                nodes.retain(|n| *n != name);
            }
            _ => {
                let name = nodes
                    .iter()
                    .find(|n| n.starts_with("node-"))
                    .cloned()
                    .context("no node to cordon")?;
                let patch = json!({"spec": {"unschedulable": true}});
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                // Nothing to wait for: the window is the measurement.
                tokio::time::sleep(quiet).await;
            }
        }
        converged(cloud, load_balancers, &nodes, timeout)
            .await
            .with_context(|| format!("after the fleet's change {change}"))?;
        let after = hosts(cloud).await?;
        let (written, last) = load_balancer_writes(cloud, before.writes).await?;
        let calls = calls_between(&before.calls, &after.calls);
        let seconds = last.map_or(0.0, |last| (last - started_us).max(0) as f64 / 1e6);
        eprintln!("nodes: fleet: {change}: {written} load balancers written in {seconds:.2} s");
        changes.push(Change {
            change,
            seconds: round(seconds),
            load_balancers_written: written,
            cloud_calls_total: calls.values().sum(),
            cloud_calls: calls,
        });
    }
    let worst = changes.iter().map(|c| c.seconds).fold(0.0, f64::max);
    Ok(Fleet {
        load_balancers,
        nodes: nodes.len(),
        changes,
        worst_seconds: worst,
    })
}
