//! `ccm-bench nodes`: how fast the cloud-node controller initialises a burst of new nodes, how many API
//! writes each costs, and what the controller-manager's memory is with a large cluster cached.
//!
//! The API server (the test API server, or with `--apiserver kube` a real kube-apiserver on etcd whose
//! audit log records every request's metadata) and the cloud-controller-manager run as their own
//! processes; the fake cloud runs
//! in this one, holding an instance for every node and answering each call after `--cloud-latency-ms`.
//! The cluster first gets `--services` LoadBalancer services (owned by another load-balancer class, so
//! they are cached but provision nothing: a load balancer fronting 10k nodes is not what this measures)
//! and one warm-up node, initialised before the clock starts. Then `--nodes` kubelet-shaped nodes, each
//! carrying the uninitialized taint, are created as fast as the API server takes them; the time runs from
//! the first create to the last node seen without the taint. Writes are counted from the API server's
//! request log or audit log (every write attempt by the controller-manager, failed ones included); memory
//! is the controller-manager's resident set once every node is initialised. With `--steady-seconds`, a
//! window with nothing changing follows: what the manager's periodic work asks of the API server and the
//! cloud ([`steady`]). With `--route-periods`, the manager runs its route controller too, and a routes'
//! phase follows the burst ([`routes`]).

use std::collections::HashSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::{FutureExt, StreamExt, TryStreamExt};
use harness::initialized;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use kube_ccm_fake::{FakeCloud, FakeCloudServer, FakeInstance, Knobs};
use serde_json::json;

mod fleet;
mod objects;
mod routes;
mod server;
mod services;
pub(crate) mod steady;

pub(crate) use fleet::Fleet;
pub(crate) use objects::{kubelet_node, service};
pub(crate) use routes::Routes;
pub(crate) use server::Server;
pub(crate) use services::Provisioned;
use services::{Phase, provision};
use steady::{Steady, Window};

use crate::process::{TempDir, cpu_seconds, manager_binary, peak_rss_mib, rss_mib, rss_split_mib};
use crate::stats::round;

const CCM_AGENT: &str = "cloud-controller-manager/";
/// The manager's `--route-reconciliation-period` (its default).
const ROUTE_PERIOD: Duration = Duration::from_secs(10);
const WARM_UP: &str = "warm-up";

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// New nodes in the burst.
    #[arg(long, default_value_t = 10_000)]
    nodes: u32,
    /// LoadBalancer services in the cluster (cached by the controller-manager).
    #[arg(long, default_value_t = 5_000)]
    services: u32,
    /// Latency of every fake-cloud call, in milliseconds.
    #[arg(long, default_value_t = 50)]
    cloud_latency_ms: u64,
    /// Creates in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_seconds: u64,
    /// After the burst, a window of this many seconds with nothing changing: the manager's API requests
    /// and cloud calls meanwhile (0: none). With a window, the manager refreshes every node's addresses
    /// every `--node-status-seconds`.
    #[arg(long, default_value_t = 0)]
    steady_seconds: u64,
    /// The manager's `--node-status-update-frequency` in seconds, with a steady window.
    #[arg(long, default_value_t = 60)]
    node_status_seconds: u64,
    /// Run the route controller (for the nodes' pod CIDRs): after the burst, the time and cloud calls
    /// until every node has its route, then the route calls per period over this many
    /// `--route-reconciliation-period`s (10 s) with nothing changing (0: no route controller).
    #[arg(long, default_value_t = 0)]
    route_periods: u32,
    /// The API server: `test` (this repository's test API server, as a process) or `kube` (a real
    /// kube-apiserver on etcd, built by `cargo xtask kube`; writes are counted from its audit log).
    #[arg(long, default_value = "test", value_parser = ["test", "kube"])]
    apiserver: String,
    #[command(flatten)]
    output: crate::Output,
}

/// The controller-manager process; killed on drop, or, when a profiler wraps it, stopped by SIGTERM
/// first (up to two minutes) so that the profiler writes its output.
struct Manager {
    child: Child,
    wrapped: bool,
}

impl Drop for Manager {
    fn drop(&mut self) {
        if self.wrapped {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(120);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            eprintln!("nodes: the wrapped controller-manager did not stop in 2 minutes of SIGTERM: killed");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) async fn run(args: Args) -> Result<()> {
    let server = Server::start(&args.apiserver).await?;
    let burst = Burst {
        nodes: args.nodes,
        services: args.services,
        load_balancers: 0,
        fleet: None,
        route_periods: args.route_periods,
        cloud_latency_ms: args.cloud_latency_ms,
        concurrency: args.concurrency,
        timeout: Duration::from_secs(args.timeout_seconds),
        steady: (args.steady_seconds > 0).then(|| Window {
            length: Duration::from_secs(args.steady_seconds),
            nodes: args.nodes + 1,
            period: Duration::from_secs(args.node_status_seconds.max(1)),
        }),
    };
    let node_status = format!(
        "--node-status-update-frequency={}s",
        args.node_status_seconds.max(1)
    );
    // The burst is bounded by the client-side rate limit otherwise (upstream's default: 20/s).
    let mut flags = vec!["--kube-api-qps=10000", "--kube-api-burst=10000"];
    if burst.steady.is_some() {
        flags.push(&node_status);
    }
    let cluster_cidr = format!("--cluster-cidr={}", routes::CLUSTER_CIDR);
    if args.route_periods > 0 {
        flags.extend([cluster_cidr.as_str(), "--configure-cloud-routes=true"]);
    }
    let ours = Contender::ours(&flags)?;
    let measured = measure(&server, &burst, &ours).await?;
    let result = json!({
        "nodes": args.nodes,
        "services": args.services,
        "cloud_latency_ms": args.cloud_latency_ms,
        "seconds": measured.seconds,
        "nodes_per_sec": measured.nodes_per_sec,
        "api_writes_per_node": measured.api_writes_per_node,
        "rss_mb": measured.rss_mb,
        "rss_anon_mb": measured.rss_anon_mb,
        "rss_file_mb": measured.rss_file_mb,
        "peak_rss_mb": measured.peak_rss_mb,
        // The manager's CPU time from its start to the last node initialised (its share of 2 cores is
        // what the rate competes for with the API server).
        "cpu_seconds": measured.cpu_seconds,
        "apiserver_cpu_seconds": measured.apiserver_cpu_seconds,
        "etcd_cpu_seconds": measured.etcd_cpu_seconds,
        "steady": measured.steady,
        "routes": measured.routes,
        "apiserver": server.describe(),
    });
    args.output.write(&result)
}

/// The workload of one measurement.
#[derive(Clone)]
pub(crate) struct Burst {
    /// New nodes.
    pub(crate) nodes: u32,
    /// LoadBalancer services of another class, cached.
    pub(crate) services: u32,
    /// LoadBalancer services of the default class created once every node is initialised, each to be
    /// given a load balancer by the manager (0: none).
    pub(crate) load_balancers: u32,
    /// With load balancers: the node set changed three times after they are served ([`fleet`]), the
    /// unschedulable change watched this long.
    pub(crate) fleet: Option<Duration>,
    /// With the route controller running: the route periods watched after every route exists (0: the
    /// manager runs none, or no routes phase).
    pub(crate) route_periods: u32,
    /// Latency of every fake-cloud call.
    pub(crate) cloud_latency_ms: u64,
    /// Creates in flight at once.
    pub(crate) concurrency: usize,
    /// Bound of each wait.
    pub(crate) timeout: Duration,
    /// A steady window after the burst (and the load balancers), if any.
    pub(crate) steady: Option<Window>,
}

/// A controller manager to measure: its binary and flags (beyond the cloud, the kubeconfig, no leader
/// election and no serving), and the `User-Agent` prefixes of its requests.
pub(crate) struct Contender {
    pub(crate) name: &'static str,
    pub(crate) binary: std::path::PathBuf,
    pub(crate) args: Vec<String>,
    pub(crate) agents: &'static [&'static str],
}

impl Contender {
    /// The ideal client (`src/ideal.rs`, beside this binary) with `concurrency` writes in flight, over
    /// `protocol`: `http2` (one connection) or `http1` (kube's pool).
    pub(crate) fn ideal(concurrency: u32, protocol: &str) -> Result<Contender> {
        let mut args = vec![format!("--concurrency={concurrency}")];
        if protocol == "http2" {
            args.push("--http2".to_owned());
        }
        Ok(Contender {
            name: "ceiling",
            binary: crate::process::sibling("ideal-node-client")?,
            args,
            agents: &["ideal-node-client/"],
        })
    }

    /// This repository's manager, with `flags`.
    pub(crate) fn ours(flags: &[&str]) -> Result<Contender> {
        Ok(Contender {
            name: "ours",
            binary: manager_binary()?,
            args: flags.iter().map(|&f| f.to_owned()).collect(),
            agents: &[CCM_AGENT],
        })
    }
}

/// What one measurement found.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Measured {
    pub(crate) seconds: f64,
    pub(crate) nodes_per_sec: f64,
    /// Writes (create, update, patch, delete) per initialised node, failed ones included.
    pub(crate) api_writes_per_node: f64,
    /// Every request (reads, lists and watches too) per initialised node, from start to the end.
    pub(crate) api_requests_per_node: f64,
    pub(crate) rss_mb: f64,
    /// Of `rss_mb`, the process's own memory (Linux's `RssAnon`: heap, stacks).
    pub(crate) rss_anon_mb: f64,
    /// Of `rss_mb`, pages of mapped files (`RssFile`: the binary's code and read-only data, shared
    /// with the page cache).
    pub(crate) rss_file_mb: f64,
    pub(crate) peak_rss_mb: f64,
    /// The manager's CPU time from its start to the last node initialised.
    pub(crate) cpu_seconds: f64,
    /// The API server's CPU time over the burst (kube-apiserver only; etcd apart).
    pub(crate) apiserver_cpu_seconds: Option<f64>,
    pub(crate) etcd_cpu_seconds: Option<f64>,
    /// The load balancers' phase, when the burst has one.
    pub(crate) load_balancers: Option<Provisioned>,
    /// The node-set changes after it, when the burst has them.
    pub(crate) fleet: Option<Fleet>,
    /// The routes' phase, when the burst has one.
    pub(crate) routes: Option<Routes>,
    /// The steady window, if the burst had one.
    pub(crate) steady: Option<Steady>,
}

/// Starts `contender` on `server` with a fake cloud holding every node's instance, initialises a
/// warm-up node, then times the burst.
pub(crate) async fn measure(server: &Server, burst: &Burst, contender: &Contender) -> Result<Measured> {
    let client = server.client().await?;
    let instances: Vec<FakeInstance> = std::iter::once(FakeInstance::running(WARM_UP, 0))
        .chain((0..burst.nodes).map(|i| FakeInstance::running(&format!("node-{i}"), i + 1)))
        .collect();
    let cloud = FakeCloudServer::start(
        FakeCloud::new(
            instances,
            Knobs {
                latency_ms: burst.cloud_latency_ms,
                error_rate: 0.0,
                hang_rate: 0.0,
                lost_answer_rate: 0.0,
            },
        ),
        ([127, 0, 0, 1], 0).into(),
    )
    .await?;
    let directory = TempDir::new()?;
    let cloud_config = directory.0.join("cloud.yaml");
    std::fs::write(&cloud_config, format!("endpoint: {}\n", cloud.url()))?;

    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    create_all(&services, burst.services, burst.concurrency, service)
        .await
        .context("create the services")?;
    eprintln!("nodes: {} services created", burst.services);

    let log_path = directory.0.join(format!("{}.log", contender.name));
    let log = std::fs::File::create(&log_path)?;
    // A profiler may wrap the controller-manager, e.g. BENCH_CCM_WRAPPER="valgrind --tool=massif".
    let wrapper = std::env::var("BENCH_CCM_WRAPPER").unwrap_or_default();
    let mut wrapper = wrapper.split_whitespace();
    let wrapped = wrapper.clone().next().is_some();
    let mut command = match wrapper.next() {
        Some(program) => {
            let mut command = Command::new(program);
            command.args(wrapper).arg(&contender.binary);
            command
        }
        None => Command::new(&contender.binary),
    };
    let mut manager = Manager {
        child: command
            .arg("--cloud-provider=fake")
            .arg(format!("--cloud-config={}", cloud_config.display()))
            .arg(format!("--kubeconfig={}", server.kubeconfig().display()))
            .args(["--leader-elect=false", "--secure-port=0"])
            .args(&contender.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {}", contender.binary.display()))?,
        wrapped,
    };
    let pid = manager.child.id();
    // Follow every node; `done` counts the burst's initialised nodes.
    let nodes: Api<Node> = Api::all(client.clone());
    let (progress, mut seen) = tokio::sync::watch::channel((false, 0_u32));
    let follower = tokio::spawn({
        let nodes = nodes.clone();
        async move {
            let mut done: HashSet<String> = HashSet::new();
            let mut warm = false;
            let mut stream = std::pin::pin!(watcher::watcher(nodes, watcher::Config::default()));
            while let Some(event) = stream.try_next().await? {
                let objects = match event {
                    watcher::Event::Apply(node) | watcher::Event::InitApply(node) => vec![node],
                    _ => Vec::new(),
                };
                for node in objects.iter().filter(|n| initialized(n)) {
                    let name = node.metadata.name.clone().unwrap_or_default();
                    if name == WARM_UP {
                        warm = true;
                    } else {
                        done.insert(name);
                    }
                }
                progress.send_replace((warm, u32::try_from(done.len())?));
            }
            anyhow::Ok(())
        }
    });

    let deadline = burst.timeout;

    nodes
        .create(&PostParams::default(), &kubelet_node(WARM_UP, 0)?)
        .await?;
    let mut warm_up = seen.clone();
    tokio::select! {
        waited = wait_for(&mut warm_up, deadline, "the warm-up node", |s| s.0) => {
            waited.with_context(|| log_tail(&log_path))?;
        }
        status = exited(&mut manager.child) => {
            bail!("{} exited before the warm-up node was initialised ({}): {}", contender.name, status?, log_tail(&log_path));
        }
    }
    eprintln!(
        "nodes: {}: warm-up node initialised; creating {} nodes",
        contender.name, burst.nodes
    );

    let started = Instant::now();
    let apiserver_cpu_before = server.cpu_seconds();
    let creating = create_all(&nodes, burst.nodes, burst.concurrency, |i| {
        kubelet_node(&format!("node-{i}"), i + 1)
    })
    .inspect(|_| {
        eprintln!(
            "nodes: all created after {:.1} s",
            started.elapsed().as_secs_f64()
        )
    });
    let total = burst.nodes;
    let (created, all) = tokio::join!(creating, async {
        tokio::select! {
            waited = wait_for(&mut seen, deadline, "every node initialised", |s| s.1 >= total) => waited,
            status = exited(&mut manager.child) => {
                Err(anyhow::anyhow!("{} exited during the burst ({})", contender.name, status?))
            }
        }
    });
    created.context("create the nodes")?;
    all?;
    let seconds = started.elapsed().as_secs_f64();
    let apiserver_cpu_after = server.cpu_seconds();
    let cpu = cpu_seconds(pid).context("the controller-manager's CPU time")?;
    let rss = rss_mib(pid).context("the controller-manager's memory")?;
    let (rss_anon, rss_file) = rss_split_mib(pid).context("the controller-manager's memory")?;
    let peak = peak_rss_mib(pid).context("the controller-manager's peak memory")?;
    follower.abort();

    let (requests, writes) = count_requests(server, &client, contender).await?;
    let initialised = f64::from(burst.nodes + 1);
    let delta = |index: usize| match (apiserver_cpu_before, apiserver_cpu_after) {
        (Some(before), Some(after)) => Some(round([after.0 - before.0, after.1 - before.1][index])),
        _ => None,
    };
    let routes = if burst.route_periods > 0 {
        Some(
            routes::measure(
                cloud.cloud(),
                usize::try_from(burst.nodes + 1)?,
                ROUTE_PERIOD,
                burst.route_periods,
                burst.timeout,
            )
            .await
            .with_context(|| log_tail(&log_path))?,
        )
    } else {
        None
    };
    let load_balancers = if burst.load_balancers > 0 {
        let phase = Phase {
            pid,
            requests,
            writes,
            cpu,
        };
        Some(
            provision(server, &client, &cloud, burst, contender, phase)
                .await
                .with_context(|| log_tail(&log_path))?,
        )
    } else {
        None
    };
    let fleet = match burst.fleet.filter(|_| burst.load_balancers > 0) {
        Some(quiet) => Some(
            fleet::measure(
                &client,
                cloud.cloud(),
                usize::try_from(burst.load_balancers)?,
                burst.timeout,
                quiet,
            )
            .await
            .with_context(|| log_tail(&log_path))?,
        ),
        None => None,
    };
    let steady = match burst.steady {
        Some(window) => {
            let steady = steady::observe(server, &client, cloud.cloud(), contender, pid, window).await?;
            eprintln!(
                "nodes: {}: steady {}",
                contender.name,
                serde_json::to_string(&steady)?
            );
            Some(steady)
        }
        None => None,
    };
    drop(manager);
    Ok(Measured {
        seconds: round(seconds),
        nodes_per_sec: round(f64::from(burst.nodes) / seconds),
        api_writes_per_node: round(writes as f64 / initialised),
        api_requests_per_node: round(requests as f64 / initialised),
        rss_mb: round(rss),
        rss_anon_mb: round(rss_anon),
        rss_file_mb: round(rss_file),
        peak_rss_mb: round(peak),
        cpu_seconds: round(cpu),
        apiserver_cpu_seconds: delta(1),
        etcd_cpu_seconds: delta(0),
        load_balancers,
        fleet,
        routes,
        steady,
    })
}

/// The manager's requests and writes (create, update, patch, delete) so far, by its `User-Agent`s.
pub(crate) async fn count_requests(
    server: &Server,
    client: &kube::Client,
    contender: &Contender,
) -> Result<(usize, usize)> {
    let requests = server.requests(client).await?;
    let ours: Vec<_> = requests
        .iter()
        .filter(|r| contender.agents.iter().any(|a| r.user_agent.starts_with(a)))
        .collect();
    let writes = ours
        .iter()
        .filter(|r| matches!(r.verb.as_deref(), Some("create" | "update" | "patch" | "delete")))
        .count();
    Ok((ours.len(), writes))
}

/// When `child` exits, its status (polled every 200 ms): raced against a wait, so that a contender that
/// dies fails the measurement at once instead of at the wait's bound.
async fn exited(child: &mut std::process::Child) -> Result<std::process::ExitStatus> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until what `seen` publishes passes `check`, for at most `deadline`.
pub(crate) async fn wait_for<T>(
    seen: &mut tokio::sync::watch::Receiver<T>,
    deadline: Duration,
    what: &str,
    check: impl Fn(&T) -> bool,
) -> Result<()> {
    tokio::time::timeout(deadline, seen.wait_for(|s| check(s)))
        .await
        .with_context(|| format!("timed out after {deadline:?} waiting for {what}"))?
        .with_context(|| format!("the watch ended before {what}"))?;
    Ok(())
}

/// Creates `make(0)` … `make(count - 1)` through `api`, `concurrency` at a time; the first error ends it.
pub(crate) async fn create_all<K>(
    api: &Api<K>,
    count: u32,
    concurrency: usize,
    make: impl Fn(u32) -> Result<K>,
) -> Result<()>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let make = &make;
    futures::stream::iter(0..count)
        .map(|i| async move {
            api.create(&PostParams::default(), &make(i)?).await?;
            anyhow::Ok(())
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await
        .map(drop)
}

/// The end of the controller-manager's log, for an error message.
fn log_tail(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    format!(
        "the controller-manager's log ends:\n{}",
        lines[lines.len().saturating_sub(20)..].join("\n")
    )
}
