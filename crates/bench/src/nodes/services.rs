//! The load balancers' phase of [`super::measure`]: LoadBalancer services of the default class created on
//! the initialised nodes, each timed until its status has an address.

use std::collections::HashSet;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use kube_ccm_fake::{AdminRequest, CloudRequest, CloudResponse, FakeCloudServer};
use serde_json::json;

use super::{Burst, Contender, Server, count_requests};
use crate::process::{cpu_seconds, peak_rss_mib};
use crate::stats::round;

/// A LoadBalancer service of the default class, provisioned by the manager measured. The fake cloud
/// forwards to service ports, so no node ports are allocated (a cluster has only 2,768 of them).
fn load_balancer_service(index: u32) -> Result<Service> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("lb-{index}"), "labels": {"app": format!("lb-{index}"), "bench": "load-balancer"}},
        "spec": {
            "type": "LoadBalancer",
            "allocateLoadBalancerNodePorts": false,
            "selector": {"app": format!("lb-{index}")},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}],
        },
    }))?)
}

/// What the load balancers' phase found: from the first service created to the last one whose status
/// has an address.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Provisioned {
    pub(crate) seconds: f64,
    pub(crate) services_per_sec: f64,
    /// The manager's API requests and writes over the phase, per service.
    pub(crate) api_requests_per_service: f64,
    pub(crate) api_writes_per_service: f64,
    /// Calls to the cloud over the phase, per service (`ensure_load_balancer`, `get_load_balancer`, …).
    pub(crate) cloud_calls_per_service: f64,
    /// The manager's CPU time over the phase.
    pub(crate) cpu_seconds: f64,
    /// The manager's peak resident set at the end (nodes and services).
    pub(crate) peak_rss_mb: f64,
    pub(crate) apiserver_cpu_seconds: Option<f64>,
}

/// Where the node phase left the manager: its process, requests and writes so far, CPU-seconds.
pub(super) struct Phase {
    pub(super) pid: u32,
    pub(super) requests: usize,
    pub(super) writes: usize,
    pub(super) cpu: f64,
}

/// Creates the burst's load-balanced services and times them until each has an address in its status.
pub(super) async fn provision(
    server: &Server,
    client: &kube::Client,
    cloud: &FakeCloudServer,
    burst: &Burst,
    contender: &Contender,
    before: Phase,
) -> Result<Provisioned> {
    let calls = || async {
        match cloud
            .cloud()
            .handle(CloudRequest::Admin(AdminRequest::Snapshot))
            .await
        {
            CloudResponse::Snapshot { calls, .. } => Ok(calls),
            other => bail!("the fake cloud answered a snapshot with {other:?}"),
        }
    };
    let calls_before = calls().await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let (progress, seen) = tokio::sync::watch::channel(0_u32);
    let follower = tokio::spawn({
        let services = services.clone();
        async move {
            let mut served: HashSet<String> = HashSet::new();
            let config = watcher::Config::default().labels("bench=load-balancer");
            let mut stream = std::pin::pin!(watcher::watcher(services, config));
            while let Some(event) = stream.try_next().await? {
                if let watcher::Event::Apply(service) | watcher::Event::InitApply(service) = event {
                    let addressed = service
                        .status
                        .and_then(|s| s.load_balancer)
                        .and_then(|lb| lb.ingress)
                        .is_some_and(|ingress| !ingress.is_empty());
                    if addressed {
                        served.insert(service.metadata.name.unwrap_or_default());
                        progress.send_replace(u32::try_from(served.len())?);
                    }
                }
            }
            anyhow::Ok(())
        }
    });
    let started = Instant::now();
    let apiserver_cpu_before = server.cpu_seconds();
    let creating = futures::stream::iter(0..burst.load_balancers)
        .map(|i| {
            let services = services.clone();
            async move {
                services
                    .create(&PostParams::default(), &load_balancer_service(i)?)
                    .await
                    .map(drop)
                    .map_err(anyhow::Error::from)
            }
        })
        .buffer_unordered(burst.concurrency)
        .try_collect::<Vec<()>>();
    let total = burst.load_balancers;
    let mut seen = seen;
    let waiting = async {
        tokio::time::timeout(burst.timeout, seen.wait_for(|&n| n >= total))
            .await
            .with_context(|| {
                format!(
                    "timed out after {:?} waiting for {total} load balancers",
                    burst.timeout
                )
            })?
            .context("the service watch ended before every load balancer")?;
        anyhow::Ok(())
    };
    let (created, all) = tokio::join!(creating, waiting);
    created.context("create the load-balanced services")?;
    all?;
    let seconds = started.elapsed().as_secs_f64();
    let apiserver_cpu_after = server.cpu_seconds();
    let cpu = cpu_seconds(before.pid).context("the controller-manager's CPU time")?;
    let peak = peak_rss_mib(before.pid).context("the controller-manager's peak memory")?;
    follower.abort();
    eprintln!(
        "nodes: {}: {total} load balancers after {seconds:.1} s",
        contender.name
    );
    let (requests, writes) = count_requests(server, client, contender).await?;
    let cloud_calls = calls().await? - calls_before;
    let per_service = |n: f64| round(n / f64::from(total));
    Ok(Provisioned {
        seconds: round(seconds),
        services_per_sec: round(f64::from(total) / seconds),
        api_requests_per_service: per_service((requests - before.requests) as f64),
        api_writes_per_service: per_service((writes - before.writes) as f64),
        cloud_calls_per_service: per_service(cloud_calls as f64),
        cpu_seconds: round(cpu - before.cpu),
        peak_rss_mb: round(peak),
        apiserver_cpu_seconds: match (apiserver_cpu_before, apiserver_cpu_after) {
            (Some(before), Some(after)) => Some(round(after.1 - before.1)),
            _ => None,
        },
    })
}
