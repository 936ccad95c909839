//! What a cluster costs in AWS API requests: a manager (`--cloud-provider=aws`: ours, or upstream's
//! cloud-provider-aws, which takes the same flags and cloud-config) against moto through a recording
//! proxy, with an API server (the test one, or a real kube-apiserver). Shared by the binary's test (which
//! asserts the targets), `cargo xtask bench aws` (which reports them) and `cargo xtask bench versus
//! --cloud aws` (which compares ours with upstream's).
//!
//! Three figures, as an account's rate limit would see them (every attempt, retries included): the EC2
//! requests to initialise N nodes as fast as the API server takes them, then per lifecycle-monitor period
//! with every node NotReady, and per address-refresh period, each controller run alone and sampled over
//! whole periods.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

use crate::aws::{MOTO_ENVIRONMENT, Network, RecordingProxy, cloud_config, run_instances};

/// Upstream's flags for "tuned" (our defaults' node workers and client limits), where its batches of
/// `DescribeInstances` by ID fill best: `ccm-bench versus --cloud aws` and the binary's test.
pub const UPSTREAM_TUNED: [&str; 3] = [
    "--concurrent-node-syncs=128",
    "--kube-api-qps=1000",
    "--kube-api-burst=2000",
];

/// What to measure.
#[derive(Debug, Clone)]
pub struct CostRun {
    /// The manager's binary: ours, or upstream's `aws-cloud-controller-manager`.
    pub manager: PathBuf,
    /// Flags for every start of it beyond [`manager_command`]'s (client limits, workers).
    pub flags: Vec<String>,
    /// Its kubeconfig for the API server (the test one, or a real kube-apiserver).
    pub kubeconfig: PathBuf,
    /// moto's endpoint.
    pub moto_url: String,
    /// How many instances and nodes.
    pub nodes: usize,
    /// The monitor and refresh period (`--node-monitor-period`, `--node-status-update-frequency`).
    pub period: Duration,
    /// How many periods each is sampled over.
    pub periods: u32,
    /// Where the managers' logs and cloud-config go.
    pub dir: PathBuf,
    /// How long the nodes may take to initialise.
    pub timeout: Duration,
}

/// The figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Costs {
    /// Nodes initialised.
    pub nodes: usize,
    /// From the first node created to the last initialised.
    pub init_seconds: f64,
    /// `DescribeInstances` to initialise them all.
    pub init_describe_instances: u64,
    /// `DescribeAvailabilityZones` meanwhile (zone IDs, cached).
    pub init_describe_availability_zones: u64,
    /// Every request during initialisation, by action.
    pub init_requests: BTreeMap<String, u64>,
    /// Every request during initialisation.
    pub init_requests_total: u64,
    /// The manager's peak resident set during initialisation (MiB; Linux's `VmHWM`).
    pub init_peak_rss_mb: Option<f64>,
    /// `DescribeInstances` per lifecycle-monitor period, every node NotReady.
    pub monitor_describe_instances_per_period: f64,
    /// Every request per lifecycle-monitor period.
    pub monitor_requests_per_period: f64,
    /// `DescribeInstances` per address-refresh period.
    pub refresh_describe_instances_per_period: f64,
    /// Every request per address-refresh period.
    pub refresh_requests_per_period: f64,
}

/// Runs the scenario against the API server behind `client` (its kubeconfig in `run`).
pub async fn measure(run: &CostRun, client: kube::Client) -> Result<Costs> {
    let names = run_instances(&run.moto_url, run.nodes).await?;
    let network = Network::default_of(&run.moto_url).await?;
    let counter = RecordingProxy::start(&run.moto_url).await?;
    counter.answer("DescribeInstanceTopology", crate::aws::no_instance_topology);
    let config = (counter.url.as_str(), Some(&network));
    let nodes: Api<Node> = Api::all(client);

    // Ready nodes (the lifecycle controller leaves them alone), addresses refreshed every 5 minutes (the
    // default): only the cloud-node controller asks.
    let mut manager = Manager::start(run, config, "init", &[])?;
    let begun = Instant::now();
    create_all(&nodes, &names, |name| {
        serde_json::json!({
            "metadata": {"name": name},
            "spec": {"taints": [{"key": kube_ccm_provider::names::TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        })
    })
    .await?;
    let deadline = Instant::now() + run.timeout;
    loop {
        if let Some(status) = manager.child.try_wait()? {
            bail!(
                "{} exited ({status}) before the nodes were initialised: {}",
                run.manager.display(),
                last_lines(&manager.log)
            );
        }
        let list = nodes.list(&Default::default()).await?;
        let done = list
            .items
            .iter()
            .filter(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_ref()).is_some())
            .count();
        if done == names.len() {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "{done} of {} nodes initialised in {} s; the manager's log is {}",
                names.len(),
                run.timeout.as_secs(),
                manager.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let init_seconds = begun.elapsed().as_secs_f64();
    let init_peak_rss_mb =
        crate::proc_status_mib(manager.child.id(), "VmHWM:").map(|mib| (mib * 10.0).round() / 10.0);
    drop(manager);
    let init_requests = counter.take_all();

    // Every node NotReady, then each periodic check alone, sampled over whole periods.
    futures::stream::iter(names.iter())
        .map(|name| {
            let nodes = nodes.clone();
            async move {
                let status =
                    serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}});
                nodes
                    .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
                    .await
                    .map(drop)
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<()>, _>>()?;
    let period = format!("{}ms", run.period.as_millis());
    let mut per_period = Vec::new();
    for (name, flags) in [
        (
            "monitor",
            [
                "--controllers=cloud-node-lifecycle-controller".to_owned(),
                format!("--node-monitor-period={period}"),
            ],
        ),
        (
            "refresh",
            [
                "--controllers=cloud-node-controller".to_owned(),
                format!("--node-status-update-frequency={period}"),
            ],
        ),
    ] {
        let manager = Manager::start(run, config, name, &flags)?;
        // Sampling a rate over whole periods, not waiting for a condition.
        tokio::time::sleep(run.period * run.periods).await;
        drop(manager);
        let requests = counter.take_all();
        let periods = f64::from(run.periods);
        per_period.push((
            requests.get("DescribeInstances").copied().unwrap_or(0) as f64 / periods,
            requests.values().sum::<u64>() as f64 / periods,
        ));
    }
    Ok(Costs {
        nodes: names.len(),
        init_seconds,
        init_describe_instances: init_requests.get("DescribeInstances").copied().unwrap_or(0),
        init_describe_availability_zones: init_requests
            .get("DescribeAvailabilityZones")
            .copied()
            .unwrap_or(0),
        init_requests_total: init_requests.values().sum(),
        init_requests,
        init_peak_rss_mb,
        monitor_describe_instances_per_period: per_period[0].0,
        monitor_requests_per_period: per_period[0].1,
        refresh_describe_instances_per_period: per_period[1].0,
        refresh_requests_per_period: per_period[1].1,
    })
}

/// The last lines of the log at `path`, for an error.
fn last_lines(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

async fn create_all(
    nodes: &Api<Node>,
    names: &[String],
    node: impl Fn(&str) -> serde_json::Value,
) -> Result<()> {
    let bodies: Vec<Node> = names
        .iter()
        .map(|name| serde_json::from_value(node(name)))
        .collect::<Result<_, _>>()?;
    futures::stream::iter(bodies)
        .map(|body| {
            let nodes = nodes.clone();
            async move { nodes.create(&PostParams::default(), &body).await.map(drop) }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<()>, _>>()?;
    Ok(())
}

/// The manager, killed on drop.
struct Manager {
    child: Child,
    log: PathBuf,
}

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Manager {
    /// The manager for `run` with AWS at `url` in `network`, its flags and `flags`; its log is
    /// `<name>.log`.
    fn start(
        run: &CostRun,
        (url, network): (&str, Option<&Network>),
        name: &str,
        flags: &[String],
    ) -> Result<Manager> {
        let log = run.dir.join(format!("{name}.log"));
        let child = manager_command(&run.manager, &run.kubeconfig, &run.dir, url, network)?
            .args(&run.flags)
            .args(flags)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {}", run.manager.display()))?;
        Ok(Manager { child, log })
    }
}

/// `manager` with `--cloud-provider=aws`, EC2 and the ELBs at `url` (its [`cloud_config`], with
/// `network`, written to `dir/cloud.conf`), moto's dummy credentials, one process without election,
/// routes off (no cluster CIDR), no serving: flags ours and upstream's share.
pub fn manager_command(
    manager: &Path,
    kubeconfig: &Path,
    dir: &Path,
    url: &str,
    network: Option<&Network>,
) -> Result<Command> {
    let path = dir.join("cloud.conf");
    std::fs::write(&path, cloud_config(url, network))
        .with_context(|| format!("writing {}", path.display()))?;
    let mut command = Command::new(manager);
    command
        .arg("--cloud-provider=aws")
        .arg(format!("--cloud-config={}", path.display()))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args([
            "--leader-elect=false",
            "--secure-port=0",
            "--configure-cloud-routes=false",
        ])
        .envs(MOTO_ENVIRONMENT);
    Ok(command)
}
