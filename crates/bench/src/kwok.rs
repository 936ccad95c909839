//! `ccm-bench kwok`: a cloud-controller-manager on a real kube-apiserver whose nodes have heartbeats.
//! kwok's simulated kubelets (`--groups` processes, built by `cargo xtask kube`) keep every node's status
//! and Lease alive, the real kube-controller-manager runs its node-lifecycle controller, and the fake
//! cloud holds an instance per node, answering after `--cloud-latency-ms`.
//!
//! Each of `--contenders` (ours, and upstream's Go CCM as `versus` runs it) is measured one at a time,
//! each on a fresh cluster, in three phases; then ours against each of the others:
//! - **Initialisation**: `--nodes` nodes registered as a kubelet registers them (the uninitialized taint,
//!   no status: kwok writes it), as fast as the API server takes them; timed until every one is
//!   initialised by us and `Ready` by kwok. The manager's memory and CPU, kwok's and the API server's CPU.
//! - **Steady state**: `--steady-seconds` with nothing changing: the manager's API requests and cloud
//!   calls a minute, and its CPU. Every contender refreshes nodes every `--node-status-seconds`.
//! - **Heartbeats stop**: the last group's instances are stopped in the cloud and its kwok is killed.
//!   Timed per node from the kill until kube-controller-manager taints it unreachable and until the
//!   manager adds the shutdown taint; the cloud calls it made meanwhile. No node of the other groups may
//!   be tainted.
//!
//! kwok's node Lease renewals are left out of kube-apiserver's audit log: at 20,000 nodes they are
//! 2,000 writes a second, and nothing here judges them.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::TryStreamExt;
use harness::kwok::{GROUP_LABEL, Kwok};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::watcher;
use kube_ccm_fake::{
    AdminRequest, CloudRequest, FakeCloud, FakeCloudServer, FakeInstance, InstanceState, Knobs,
};
use kube_ccm_provider::names::{TAINT_SHUTDOWN, TAINT_UNINITIALIZED};
use serde_json::json;

use crate::nodes::steady::{Window, calls_between, cloud_calls, observe};
use crate::nodes::{Contender, Server, count_requests, create_all, wait_for};
use crate::process::{TempDir, cpu_seconds, peak_rss_mib, rss_mib};
use crate::stats::{percentile, round};

const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";

/// The rule put first in `control_plane::LEAN_AUDIT_POLICY` for this benchmark: kwok's node Lease
/// renewals are not audited.
const NO_NODE_LEASES: &str = "\
- level: None
  resources: [{group: coordination.k8s.io, resources: [leases]}]
  namespaces: [kube-node-lease]
";

/// `control_plane::LEAN_AUDIT_POLICY` with [`NO_NODE_LEASES`] as its first rule.
fn audit_policy() -> Result<String> {
    let lean = control_plane::LEAN_AUDIT_POLICY;
    let Some(at) = lean.find("rules:\n").map(|at| at + "rules:\n".len()) else {
        bail!("control_plane::LEAN_AUDIT_POLICY has no `rules:` line to put kwok's rule under");
    };
    Ok(format!("{}{NO_NODE_LEASES}{}", &lean[..at], &lean[at..]))
}

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Nodes, kept alive by kwok.
    #[arg(long, default_value_t = 2_000)]
    nodes: u32,
    /// kwok processes, each keeping an equal share of the nodes alive; the last one is killed.
    #[arg(long, default_value_t = 4)]
    groups: u32,
    /// kwok's node Lease duration in seconds (renewed every quarter of it; kwok's own default is 40).
    #[arg(long, default_value_t = 40)]
    lease_seconds: u64,
    /// kube-controller-manager's `--node-monitor-grace-period` in seconds (its default is 50).
    #[arg(long, default_value_t = 50)]
    grace_seconds: u64,
    /// The steady-state window, in seconds.
    #[arg(long, default_value_t = 120)]
    steady_seconds: u64,
    /// Every contender's `--node-status-update-frequency` (the address refresh), in seconds.
    #[arg(long, default_value_t = 60)]
    node_status_seconds: u64,
    /// Which managers, in order, each on a fresh cluster: `ours`, and upstream's Go CCM as `versus` runs
    /// it (`go-tuned`, `go-default`).
    #[arg(long, value_delimiter = ',', default_value = "ours", value_parser = ["ours", "go-tuned", "go-default"])]
    contenders: Vec<String>,
    /// Latency of every fake-cloud call, in milliseconds.
    #[arg(long, default_value_t = 50)]
    cloud_latency_ms: u64,
    /// Creates in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Give up on a phase after this many seconds.
    #[arg(long, default_value_t = 900)]
    timeout_seconds: u64,
    #[command(flatten)]
    output: crate::Output,
}

/// A child process killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the watch has seen of each node: when (after the start) it was first initialised and `Ready`,
/// tainted unreachable, tainted shut down.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    alive: Option<Duration>,
    unreachable: Option<Duration>,
    shutdown: Option<Duration>,
}

type Nodes = HashMap<String, Seen>;

fn group_of(index: u32, groups: u32) -> String {
    format!("g{}", index % groups)
}

fn node(index: u32, groups: u32) -> Result<Node> {
    let name = format!("node-{index}");
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            GROUP_LABEL: group_of(index, groups), "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
        }},
        "spec": {"taints": [{"key": TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]},
    }))?)
}

/// Follows every node, recording when each first reached each state; publishes the map.
fn follow(
    nodes: Api<Node>,
    started: Instant,
) -> (
    tokio::task::JoinHandle<Result<()>>,
    tokio::sync::watch::Receiver<Nodes>,
) {
    let (publish, seen) = tokio::sync::watch::channel(Nodes::new());
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher::watcher(nodes, watcher::Config::default()));
        while let Some(event) = stream.try_next().await? {
            let (watcher::Event::Apply(node) | watcher::Event::InitApply(node)) = event else {
                continue;
            };
            let name = node.metadata.name.clone().unwrap_or_default();
            let taints: Vec<&str> = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .map(|t| t.iter().map(|t| t.key.as_str()).collect())
                .unwrap_or_default();
            let ready = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let now = started.elapsed();
            publish.send_modify(|nodes| {
                let seen = nodes.entry(name).or_default();
                if ready && !taints.contains(&TAINT_UNINITIALIZED) {
                    seen.alive.get_or_insert(now);
                }
                if taints.contains(&TAINT_UNREACHABLE) {
                    seen.unreachable.get_or_insert(now);
                }
                if taints.contains(&TAINT_SHUTDOWN) {
                    seen.shutdown.get_or_insert(now);
                }
            });
        }
        Ok(())
    });
    (task, seen)
}

/// Seconds, median and maximum.
fn spread(samples: &[f64]) -> serde_json::Value {
    json!({"p50": round(percentile(samples, 50.0)), "max": round(samples.iter().copied().fold(0.0, f64::max))})
}

pub(crate) async fn run(args: Args) -> Result<()> {
    if args.groups < 2 || args.nodes < args.groups {
        bail!(
            "--groups must be at least 2 and at most --nodes (one group's heartbeats stop, the others' go on)"
        );
    }
    let binaries =
        control_plane::KubeBinaries::find().context("kwok and kube-apiserver (`cargo xtask kube`)")?;
    let mut results = serde_json::Map::new();
    for name in &args.contenders {
        let contender = match crate::versus::go_contender(name, &binaries) {
            Some(go) => go,
            None => Contender::ours(&[])?,
        };
        let directory = TempDir::new()?;
        match measure(&args, &binaries, &contender, &directory.0).await {
            Ok(result) => results.insert(name.clone(), result),
            Err(error) => {
                let kept = directory.keep();
                return Err(error.context(format!(
                    "measuring {name}: the processes' logs are in {}",
                    kept.display()
                )));
            }
        };
    }
    let ratios = ratios(&results);
    eprintln!("kwok: ratios {ratios}");
    args.output.write(&json!({
        "nodes": args.nodes,
        "groups": args.groups,
        "lease_seconds": args.lease_seconds,
        "grace_seconds": args.grace_seconds,
        "node_status_seconds": args.node_status_seconds,
        "cloud_latency_ms": args.cloud_latency_ms,
        "kwok": binaries.kwok_version,
        "contenders": results,
        "ratios": ratios,
    }))
}

/// Ours over each other contender, figure by figure (below 1: ours is faster, smaller or fewer).
fn ratios(results: &serde_json::Map<String, serde_json::Value>) -> serde_json::Value {
    let Some(ours) = results.get("ours") else {
        return json!({});
    };
    let figures = [
        ("seconds_to_initialise", "/initialisation/seconds"),
        ("peak_rss", "/initialisation/manager_peak_rss_mb"),
        ("cpu_seconds_to_initialise", "/initialisation/manager_cpu_seconds"),
        (
            "apiserver_cpu_seconds_to_initialise",
            "/initialisation/apiserver_and_etcd_cpu_seconds",
        ),
        (
            "steady_api_requests_per_minute",
            "/steady/api_requests_per_minute",
        ),
        ("steady_cloud_calls", "/steady/cloud_calls_total"),
        ("steady_cpu_seconds", "/steady/manager_cpu_seconds"),
        (
            "shutdown_after_unreachable_p50",
            "/heartbeats_stop/shutdown_after_unreachable_seconds/p50",
        ),
        (
            "heartbeats_stop_cloud_calls",
            "/heartbeats_stop/cloud_calls_total",
        ),
    ];
    let mut ratios = serde_json::Map::new();
    for (name, theirs) in results.iter().filter(|(name, _)| *name != "ours") {
        let each: serde_json::Map<String, serde_json::Value> = figures
            .iter()
            .map(|(figure, pointer)| {
                let value = |r: &serde_json::Value| r.pointer(pointer).and_then(serde_json::Value::as_f64);
                let ratio = match (value(ours), value(theirs)) {
                    // Three decimals: ours often makes a hundredth of the calls or fewer.
                    (Some(a), Some(b)) if b > 0.0 => json!((a / b * 1000.0).round() / 1000.0),
                    _ => serde_json::Value::Null,
                };
                ((*figure).to_owned(), ratio)
            })
            .collect();
        ratios.insert(format!("ours_vs_{name}"), json!(each));
    }
    json!(ratios)
}

async fn measure(
    args: &Args,
    binaries: &control_plane::KubeBinaries,
    contender: &Contender,
    dir: &std::path::Path,
) -> Result<serde_json::Value> {
    let timeout = Duration::from_secs(args.timeout_seconds);
    let server = Server::kube(&audit_policy()?).await?;
    let client = server.client().await?;
    let cloud = FakeCloudServer::start(
        FakeCloud::new(
            (0..args.nodes)
                .map(|i| FakeInstance::running(&format!("node-{i}"), i))
                .collect(),
            Knobs {
                latency_ms: args.cloud_latency_ms,
                ..Knobs::default()
            },
        ),
        ([127, 0, 0, 1], 0).into(),
    )
    .await?;
    let cloud_config = dir.join("cloud.yaml");
    std::fs::write(&cloud_config, format!("endpoint: {}\n", cloud.url()))?;
    let kubeconfig = server.kubeconfig().to_owned();
    let log = |name: &str| std::fs::File::create(dir.join(format!("{name}.log")));

    let lease = Duration::from_secs(args.lease_seconds);
    let mut kwoks = (0..args.groups)
        .map(|g| {
            Kwok::start(
                &binaries.kwok,
                &binaries.kwok_stages,
                &kubeconfig,
                &format!("g{g}"),
                lease,
                dir,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let _kcm = Killed(
        Command::new(&binaries.kube_controller_manager)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args([
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--cloud-provider=external",
                "--leader-elect=false",
            ])
            .args([
                "--controllers=node-lifecycle-controller",
                "--kube-api-qps=100",
                "--kube-api-burst=200",
            ])
            .arg(format!("--node-monitor-grace-period={}s", args.grace_seconds))
            .stdout(Stdio::null())
            .stderr(log("kube-controller-manager")?)
            .spawn()
            .context("start kube-controller-manager")?,
    );
    let manager = Killed(
        Command::new(&contender.binary)
            .arg("--cloud-provider=fake")
            .arg(format!("--cloud-config={}", cloud_config.display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["--leader-elect=false", "--secure-port=0"])
            .arg(format!(
                "--node-status-update-frequency={}s",
                args.node_status_seconds
            ))
            .args(&contender.args)
            .stdout(Stdio::null())
            .stderr(log(contender.name)?)
            .spawn()
            .with_context(|| format!("start {}", contender.binary.display()))?,
    );
    let pid = manager.0.id();

    let started = Instant::now();
    let nodes: Api<Node> = Api::all(client.clone());
    let (follower, mut seen) = follow(nodes.clone(), started);
    let cpu = |pids: &[u32]| pids.iter().filter_map(|&p| cpu_seconds(p)).sum::<f64>();
    let kwok_pids: Vec<u32> = kwoks.iter().map(Kwok::pid).collect();
    let server_cpu = || server.cpu_seconds().map(|(etcd, apiserver)| etcd + apiserver);
    let (cpu_before, server_before) = (cpu(&[pid]), server_cpu());
    create_all(&nodes, args.nodes, args.concurrency, |i| node(i, args.groups))
        .await
        .context("create the nodes")?;
    let total = args.nodes as usize;
    wait_for(&mut seen, timeout, "every node initialised and Ready", |n| {
        n.values().filter(|s| s.alive.is_some()).count() >= total
    })
    .await?;
    let init_seconds = started.elapsed().as_secs_f64();
    let initialisation = json!({
        "seconds": round(init_seconds),
        "nodes_per_sec": round(f64::from(args.nodes) / init_seconds),
        "manager_cpu_seconds": round(cpu(&[pid]) - cpu_before),
        "manager_rss_mb": rss_mib(pid).map(round),
        "manager_peak_rss_mb": peak_rss_mib(pid).map(round),
        "kwok_cpu_seconds": round(cpu(&kwok_pids)),
        "apiserver_and_etcd_cpu_seconds": server_cpu().zip(server_before).map(|(a, b)| round(a - b)),
    });
    eprintln!("kwok: {}: initialisation {initialisation}", contender.name);

    let window = Window {
        length: Duration::from_secs(args.steady_seconds.max(1)),
        nodes: args.nodes,
        period: Duration::from_secs(args.node_status_seconds.max(1)),
    };
    let mut steady =
        serde_json::to_value(observe(&server, &client, cloud.cloud(), contender, pid, window).await?)?;
    steady["manager_rss_mb"] = json!(rss_mib(pid).map(round));
    eprintln!("kwok: {}: steady state {steady}", contender.name);

    let quiet_group = format!("g{}", args.groups - 1);
    let quiet: Vec<String> = (0..args.nodes)
        .filter(|&i| group_of(i, args.groups) == quiet_group)
        .map(|i| format!("node-{i}"))
        .collect();
    for name in &quiet {
        let state = AdminRequest::SetInstanceState {
            name: name.clone(),
            state: InstanceState::Stopped,
        };
        cloud.cloud().handle(CloudRequest::Admin(state)).await;
    }
    let calls_before = cloud_calls(cloud.cloud()).await;
    let (requests_before, _) = count_requests(&server, &client, contender).await?;
    let Some(mut stopped) = kwoks.pop() else {
        bail!("no kwok group")
    };
    stopped.kill()?;
    let killed = started.elapsed();
    let stop_timeout = timeout + Duration::from_secs(args.grace_seconds);
    wait_for(
        &mut seen,
        stop_timeout,
        "every quiet node tainted unreachable and shut down",
        |n| {
            quiet.iter().all(|q| {
                n.get(q)
                    .is_some_and(|s| s.shutdown.is_some() && s.unreachable.is_some())
            })
        },
    )
    .await?;
    let phase_seconds = (started.elapsed() - killed).as_secs_f64();
    let (requests_after, _) = count_requests(&server, &client, contender).await?;
    let snapshot = seen.borrow().clone();
    let after_kill = |at: Option<Duration>| at.map_or(f64::NAN, |at| at.saturating_sub(killed).as_secs_f64());
    let unreachable: Vec<f64> = quiet
        .iter()
        .map(|q| after_kill(snapshot[q].unreachable))
        .collect();
    let shutdown: Vec<f64> = quiet.iter().map(|q| after_kill(snapshot[q].shutdown)).collect();
    let ours_after_kcm: Vec<f64> = shutdown.iter().zip(&unreachable).map(|(s, u)| s - u).collect();
    let wrongly_tainted = snapshot
        .iter()
        .filter(|(name, s)| !quiet.contains(name) && (s.shutdown.is_some() || s.unreachable.is_some()))
        .count();
    follower.abort();
    let stop_calls = calls_between(&calls_before, &cloud_calls(cloud.cloud()).await);
    let heartbeats_stop = json!({
        "nodes": quiet.len(),
        "seconds": round(phase_seconds),
        "unreachable_after_seconds": spread(&unreachable),
        "shutdown_after_seconds": spread(&shutdown),
        "shutdown_after_unreachable_seconds": spread(&ours_after_kcm),
        "cloud_calls_total": stop_calls.values().sum::<u64>(),
        "cloud_calls": stop_calls,
        "api_requests": requests_after - requests_before,
        "other_nodes_tainted": wrongly_tainted,
    });
    eprintln!("kwok: {}: heartbeats stop {heartbeats_stop}", contender.name);
    if wrongly_tainted > 0 {
        bail!("{wrongly_tainted} nodes whose heartbeats go on were tainted");
    }
    drop(manager);
    Ok(json!({
        "flags": contender.args,
        "initialisation": initialisation,
        "steady": steady,
        "heartbeats_stop": heartbeats_stop,
        "apiserver": server.describe(),
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn node_leases_are_left_out_before_any_other_rule() {
        let policy = super::audit_policy().unwrap();
        let rules: Vec<&str> = policy.lines().filter(|l| l.starts_with("- level:")).collect();
        assert_eq!(rules.first(), Some(&"- level: None"), "{policy}");
        assert!(policy.contains("namespaces: [kube-node-lease]"), "{policy}");
        assert_eq!(rules.len(), 3, "the lean policy's two rules follow: {policy}");
    }
}
