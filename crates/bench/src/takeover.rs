//! `ccm-bench takeover`: how long a standby takes to lead a large cluster once the Lease is free, and
//! what a standby costs while it waits.
//!
//! The test API server (its own process) holds `--nodes` initialised kubelet-shaped nodes and
//! `--services` LoadBalancer services (of another class: cached, never provisioned); the fake cloud holds
//! their instances. A leader replica (leader migration on, upstream's lease timings: 15 s / 10 s / 2 s)
//! caches them all; a standby waits. Then, twice: the leader is stopped (SIGKILL, then SIGTERM of the
//! next leader), and at once a new node arrives with the uninitialized taint. Timed from the moment the
//! Lease is free (a crashed leader's last renewal plus the lease duration; a stopped leader's exit, which
//! follows its release) to the new leader's acquisition (the Lease's `acquireTime`) and to its first
//! write, the new node initialised: the election, the caches' lists and the controllers' start.

use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use harness::{Environment, Replica, Side, Timings, initialized};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, PostParams};
use kube_ccm_fake::{FakeCloud, FakeCloudServer, FakeInstance, Knobs};
use serde_json::json;

use crate::nodes::{create_all, kubelet_node, service};
use crate::process::{ApiServer, TempDir, manager_binary, peak_rss_mib, rss_mib};
use crate::stats::round;

const CCM: &str = "cloud-controller-manager";

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Initialised nodes in the cluster.
    #[arg(long, default_value_t = 100_000)]
    nodes: u32,
    /// LoadBalancer services in the cluster (another class's: cached, not provisioned).
    #[arg(long, default_value_t = 10_000)]
    services: u32,
    /// Lease duration in whole seconds (renew deadline: two thirds; retry period: a seventh and a half,
    /// upstream's 15 s / 10 s / 2 s by default).
    #[arg(long, default_value_t = 15)]
    lease_seconds: u64,
    /// Latency of every fake-cloud call, in milliseconds.
    #[arg(long, default_value_t = 50)]
    cloud_latency_ms: u64,
    /// Standbys start their caches at once (`--warm-standby`) instead of when they lead.
    #[arg(long)]
    warm: bool,
    /// Creates in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Give up on a step after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_seconds: u64,
    #[command(flatten)]
    output: crate::Output,
}

/// An initialised node: what a node looks like once a manager has initialised it.
fn initialised_node(index: u32) -> Result<Node> {
    let name = format!("node-{index}");
    let mut node = kubelet_node(&name, index)?;
    if let Some(spec) = node.spec.as_mut() {
        spec.taints = None;
        spec.provider_id = Some(format!("fake://{name}"));
    }
    Ok(node)
}

async fn create_cluster(client: &kube::Client, args: &Args) -> Result<()> {
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    create_all(&services, args.services, args.concurrency, service)
        .await
        .context("create the services")?;
    let nodes: Api<Node> = Api::all(client.clone());
    create_all(&nodes, args.nodes, args.concurrency, initialised_node)
        .await
        .context("create the nodes")
}

/// Creates node `name` with the uninitialized taint and waits until it is initialised; returns when
/// that was first seen (polled every 50 ms).
async fn probe(nodes: &Api<Node>, probe: u32, first_index: u32, timeout: Duration) -> Result<SystemTime> {
    let name = &format!("probe-{probe}");
    nodes
        .create(&PostParams::default(), &kubelet_node(name, first_index + probe)?)
        .await?;
    let deadline = Instant::now() + timeout;
    loop {
        if nodes.get_opt(name).await?.is_some_and(|n| initialized(&n)) {
            return Ok(SystemTime::now());
        }
        if Instant::now() > deadline {
            bail!("{name} was not initialised within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How long each cache's list took, from the replica's log (`cache filled from a list`).
fn lists(replica: &Replica) -> serde_json::Value {
    let text = std::fs::read_to_string(replica.log_path()).unwrap_or_default();
    let field = |line: &str, name: &str| {
        let start = line.find(&format!(" {name}="))? + name.len() + 2;
        line[start..]
            .split_whitespace()
            .next()
            .map(|v| v.trim_matches('"').to_owned())
    };
    let lists: Vec<serde_json::Value> = text
        .lines()
        .filter(|line| line.contains("cache filled from a list"))
        .map(|line| {
            json!({
                "kind": field(line, "kind"),
                "objects": field(line, "objects").and_then(|v| v.parse::<u64>().ok()),
                "seconds": field(line, "seconds").and_then(|v| v.parse::<f64>().ok()).map(round),
            })
        })
        .collect();
    json!(lists)
}

/// Waits until `replica` has filled its node and service caches (a warm standby's lists), polled every 100 ms.
async fn caches_filled(replica: &Replica, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let filled = |kind: &str| {
        lists(replica)
            .as_array()
            .is_some_and(|lists| lists.iter().any(|l| l["kind"] == kind))
    };
    while !(filled("Node") && filled("Service")) {
        if Instant::now() > deadline {
            bail!("the standby did not fill its node and service caches within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

fn seconds_between(from: SystemTime, to: SystemTime) -> f64 {
    match to.duration_since(from) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

fn micro_time(
    time: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime>,
) -> Option<SystemTime> {
    let time = time?.0;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_micros(u64::try_from(time.as_microsecond()).ok()?))
}

/// Stops `old` (gracefully or not), then times the take-over by the replica named `new`, which then
/// initialises the probe node `probe_index`.
async fn takeover(
    client: &kube::Client,
    old: &mut Replica,
    new: &mut Replica,
    graceful: bool,
    probe_index: u32,
    args: &Args,
) -> Result<serde_json::Value> {
    let (warm, first_index) = (args.warm, args.nodes);
    let timeout = Duration::from_secs(args.timeout_seconds);
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let nodes: Api<Node> = Api::all(client.clone());
    let new_id = new.identity(timeout)?;
    if warm {
        caches_filled(new, timeout).await?;
    }
    if graceful {
        old.terminate()?;
    } else {
        old.kill()?;
    }
    old.wait(timeout)?;
    let exited = SystemTime::now();
    let before = leases.get(CCM).await?;
    let spec = before.spec.unwrap_or_default();
    let free = if graceful {
        exited
    } else {
        let renewed = micro_time(spec.renew_time.as_ref()).context("the crashed leader's last renewal")?;
        renewed + Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(15)).unwrap_or(15))
    };
    let written = probe(&nodes, probe_index, first_index, timeout).await?;
    let after = leases.get(CCM).await?.spec.unwrap_or_default();
    if after.holder_identity.as_deref() != Some(new_id.as_str()) {
        bail!(
            "{CCM} is held by {:?}, not the standby {new_id}",
            after.holder_identity
        );
    }
    let acquired = micro_time(after.acquire_time.as_ref()).context("the new leader's acquireTime")?;
    Ok(json!({
        "stop": if graceful { "SIGTERM" } else { "SIGKILL" },
        "lease_free_to_acquired_seconds": round(seconds_between(free, acquired)),
        "acquired_to_first_write_seconds": round(seconds_between(acquired, written)),
        "lease_free_to_first_write_seconds": round(seconds_between(free, written)),
        "exit_to_first_write_seconds": round(seconds_between(exited, written)),
        "new_leader_lists": lists(new),
        "new_leader_rss_mb": rss_mib(new.pid()).map(round),
        "new_leader_peak_rss_mb": peak_rss_mib(new.pid()).map(round),
    }))
}

pub(crate) async fn run(args: Args) -> Result<()> {
    let server = ApiServer::start(&[])?;
    let client = server.client().await?;
    let instances = (0..args.nodes)
        .map(|i| FakeInstance::running(&format!("node-{i}"), i))
        .chain((0..3).map(|i| FakeInstance::running(&format!("probe-{i}"), args.nodes + i)))
        .collect();
    let knobs = Knobs {
        latency_ms: args.cloud_latency_ms,
        ..Knobs::default()
    };
    let cloud = FakeCloudServer::start(FakeCloud::new(instances, knobs), ([127, 0, 0, 1], 0).into()).await?;
    let started = Instant::now();
    create_cluster(&client, &args).await?;
    eprintln!(
        "takeover: {} nodes and {} services created in {:.1} s",
        args.nodes,
        args.services,
        started.elapsed().as_secs_f64()
    );
    let directory = TempDir::new()?;
    let lease = Duration::from_secs(args.lease_seconds.max(2));
    let timings = Timings {
        lease_duration: lease,
        renew_deadline: lease * 2 / 3,
        retry_period: lease * 2 / 15,
    };
    let environment = Environment::prepare(
        &directory.0,
        manager_binary()?,
        server.kubeconfig.clone(),
        cloud.url(),
        timings,
    )?;
    // Routes off: a route per node is not what this measures; upstream's node-monitor period.
    let mut flags = vec!["--configure-cloud-routes=false", "--node-monitor-period=5s"];
    if args.warm {
        flags.push("--warm-standby");
    }
    let timeout = Duration::from_secs(args.timeout_seconds);
    let start = |name: &str| Replica::start_with(&environment, name, Side::Ccm, &flags);
    let mut first = start("ccm-1")?;
    let nodes: Api<Node> = Api::all(client.clone());
    let leading = Instant::now();
    probe(&nodes, 0, args.nodes, timeout)
        .await
        .with_context(|| first.log_tail())?;
    let leader = json!({
        "start_to_first_write_seconds": round(leading.elapsed().as_secs_f64()),
        "lists": lists(&first),
        "rss_mb": rss_mib(first.pid()).map(round),
        "peak_rss_mb": peak_rss_mib(first.pid()).map(round),
    });
    eprintln!("takeover: leader {leader}");
    let mut second = start("ccm-2")?;
    second.identity(timeout)?;
    // A standby's cost: its memory once it has tried for the Lease a few times.
    tokio::time::sleep(timings.retry_period * 5).await;
    if args.warm {
        caches_filled(&second, timeout).await?;
    }
    let standby = json!({"rss_mb": rss_mib(second.pid()).map(round), "peak_rss_mb": peak_rss_mib(second.pid()).map(round)});
    eprintln!("takeover: standby {standby}");
    let crash = takeover(&client, &mut first, &mut second, false, 1, &args)
        .await
        .with_context(|| second.log_tail())?;
    eprintln!("takeover: {crash}");
    let mut third = start("ccm-3")?;
    third.identity(timeout)?;
    let graceful = takeover(&client, &mut second, &mut third, true, 2, &args)
        .await
        .with_context(|| third.log_tail())?;
    eprintln!("takeover: {graceful}");
    args.output.write(&json!({
        "nodes": args.nodes,
        "services": args.services,
        "lease_seconds": lease.as_secs(),
        "standbys": if args.warm {
            "warm: a standby caches what a leader does (--warm-standby)"
        } else {
            "cold: a standby lists nothing until it leads"
        },
        "leader": leader,
        "standby": standby,
        "takeovers": [crash, graceful],
        "apiserver_rss_mb": server.rss_mib().map(round),
    }))
}
