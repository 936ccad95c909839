//! What a cluster costs in AWS API requests: the manager (`--cloud-provider=aws`) against moto through a
//! counting proxy, with the test API server. Shared by the binary's test (which asserts the targets) and
//! `cargo xtask bench aws` (which reports them).
//!
//! Three figures, as an account's rate limit would see them (every attempt, retries included): the EC2
//! requests to initialise N nodes as fast as the API server takes them, then per lifecycle-monitor period
//! with every node NotReady, and per address-refresh period, each controller run alone and sampled over
//! whole periods.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

/// The cluster ID the instances are tagged with and the manager is configured for.
pub const CLUSTER_ID: &str = "test";

/// What to measure.
#[derive(Debug, Clone)]
pub struct CostRun {
    /// The `cloud-controller-manager` binary.
    pub manager: PathBuf,
    /// Its kubeconfig for the test API server.
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
    /// `DescribeInstances` per lifecycle-monitor period, every node NotReady.
    pub monitor_describe_instances_per_period: f64,
    /// `DescribeInstances` per address-refresh period.
    pub refresh_describe_instances_per_period: f64,
}

/// Runs the scenario against the API server behind `client` (its kubeconfig in `run`).
pub async fn measure(run: &CostRun, client: kube::Client) -> Result<Costs> {
    let names = run_instances(&run.moto_url, run.nodes).await?;
    let counter = CountingProxy::start(&run.moto_url).await?;
    let nodes: Api<Node> = Api::all(client);

    // Ready nodes (the lifecycle controller leaves them alone), addresses refreshed every 5 minutes (the
    // default): only the cloud-node controller asks.
    let manager = Manager::start(run, &counter.url, "init", &[])?;
    let begun = Instant::now();
    create_all(&nodes, &names, |name| {
        serde_json::json!({
            "metadata": {"name": name},
            "spec": {"taints": [{"key": cloud_provider::names::TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        })
    })
    .await?;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
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
                "{done} of {} nodes initialised in 300 s; the manager's log is {}",
                names.len(),
                manager.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let init_seconds = begun.elapsed().as_secs_f64();
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
        let manager = Manager::start(run, &counter.url, name, &flags)?;
        // Sampling a rate over whole periods, not waiting for a condition.
        tokio::time::sleep(run.period * run.periods).await;
        drop(manager);
        per_period.push(
            counter.take_all().remove("DescribeInstances").unwrap_or(0) as f64 / f64::from(run.periods),
        );
    }
    Ok(Costs {
        nodes: names.len(),
        init_seconds,
        init_describe_instances: init_requests.get("DescribeInstances").copied().unwrap_or(0),
        init_describe_availability_zones: init_requests
            .get("DescribeAvailabilityZones")
            .copied()
            .unwrap_or(0),
        init_requests,
        monitor_describe_instances_per_period: per_period[0],
        refresh_describe_instances_per_period: per_period[1],
    })
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

/// One EC2 Query API request to moto (a dummy signature: moto does not check them); the answer's XML.
async fn ec2_query(moto_url: &str, form: &[(&str, String)]) -> Result<String> {
    let body = form
        .iter()
        .map(|(key, value)| format!("{}={}", encode(key), encode(value)))
        .collect::<Vec<_>>()
        .join("&");
    let action = form
        .iter()
        .find(|(key, _)| *key == "Action")
        .map_or("", |(_, value)| value.as_str())
        .to_owned();
    let client: hyper_util::client::legacy::Client<_, Full<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let request = http::Request::post(format!("{}/", moto_url.trim_end_matches('/')))
        .header(http::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        // moto routes a request by the service its credential scope names (S3 without one); the
        // signature itself is not checked.
        .header(
            http::header::AUTHORIZATION,
            "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=00",
        )
        .body(Full::new(Bytes::from(body)))?;
    let response = client
        .request(request)
        .await
        .with_context(|| format!("{action} in moto"))?;
    let status = response.status();
    let text = String::from_utf8_lossy(&response.into_body().collect().await?.to_bytes()).into_owned();
    if !status.is_success() {
        bail!("{action} in moto answered {status}: {text}");
    }
    Ok(text)
}

/// `count` running instances tagged for [`CLUSTER_ID`], started in moto with one `RunInstances` in the
/// default subnet of us-east-1a; their private DNS names, which are the node names.
///
/// The subnet is named: without one, moto picks each instance's private IP at random in 10.0.0.0/8,
/// and among 1,000 instances two share an IP (so a DNS name) about one run in thirty; in a subnet it
/// hands out IPs in order.
pub async fn run_instances(moto_url: &str, count: usize) -> Result<Vec<String>> {
    let subnets = ec2_query(
        moto_url,
        &[
            ("Action", "DescribeSubnets".to_owned()),
            ("Version", "2016-11-15".to_owned()),
            ("Filter.1.Name", "default-for-az".to_owned()),
            ("Filter.1.Value.1", "true".to_owned()),
            ("Filter.2.Name", "availability-zone".to_owned()),
            ("Filter.2.Value.1", "us-east-1a".to_owned()),
        ],
    )
    .await?;
    let subnet = subnets
        .split_once("<subnetId>")
        .and_then(|(_, rest)| rest.split_once("</subnetId>"))
        .map(|(id, _)| id.to_owned())
        .context("moto has no default subnet in us-east-1a")?;
    let text = ec2_query(
        moto_url,
        &[
            ("Action", "RunInstances".to_owned()),
            ("Version", "2016-11-15".to_owned()),
            ("ImageId", "ami-12c6146b".to_owned()),
            ("MinCount", count.to_string()),
            ("MaxCount", count.to_string()),
            ("SubnetId", subnet),
            ("TagSpecification.1.ResourceType", "instance".to_owned()),
            (
                "TagSpecification.1.Tag.1.Key",
                format!("kubernetes.io/cluster/{CLUSTER_ID}"),
            ),
            ("TagSpecification.1.Tag.1.Value", "owned".to_owned()),
        ],
    )
    .await?;
    // An instance's name appears again in its network interfaces: first sightings, in order.
    let mut seen = HashSet::new();
    let names: Vec<String> = text
        .split("<privateDnsName>")
        .skip(1)
        .filter_map(|rest| {
            rest.split_once("</privateDnsName>")
                .map(|(name, _)| name.to_owned())
        })
        .filter(|name| !name.is_empty() && seen.insert(name.clone()))
        .collect();
    if names.len() != count {
        bail!(
            "RunInstances in moto: {} instance names in the answer, not {count}",
            names.len()
        );
    }
    Ok(names)
}

/// Percent-encoding for a form value: everything but RFC 3986's unreserved characters.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (byte as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
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
    /// The manager for `run`, EC2 and ELB at `url`, with `flags`; its log is `<name>.log`.
    fn start(run: &CostRun, url: &str, name: &str, flags: &[String]) -> Result<Manager> {
        let log = run.dir.join(format!("{name}.log"));
        let child = manager_command(&run.manager, &run.kubeconfig, &run.dir, url)?
            .args(flags)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {}", run.manager.display()))?;
        Ok(Manager { child, log })
    }
}

/// `manager` with `--cloud-provider=aws`, EC2 and ELB at `url` (its cloud-config written to
/// `dir/cloud.conf`), moto's dummy credentials, one process without election, and a generous API rate.
pub fn manager_command(manager: &Path, kubeconfig: &Path, dir: &Path, url: &str) -> Result<Command> {
    let config = dir.join("cloud.conf");
    std::fs::write(&config, cloud_config(url)).with_context(|| format!("writing {}", config.display()))?;
    let mut command = Command::new(manager);
    command
        .arg("--cloud-provider=aws")
        .arg(format!("--cloud-config={}", config.display()))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args([
            "--leader-elect=false",
            "--secure-port=0",
            "--configure-cloud-routes=false",
            "--kube-api-qps=1000",
            "--kube-api-burst=1000",
        ])
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    Ok(command)
}

/// The AWS provider's cloud-config for moto at `url`: EC2 and ELB overridden, the cluster ID set.
pub fn cloud_config(url: &str) -> String {
    let mut config = format!("[Global]\nRegion = us-east-1\nKubernetesClusterID = {CLUSTER_ID}\n");
    for service in ["ec2", "elb", "elbv2"] {
        config.push_str(&format!(
            "\n[ServiceOverride \"{service}\"]\nService = {service}\nRegion = us-east-1\nURL = {url}\nSigningRegion = us-east-1\n"
        ));
    }
    config
}

/// A counting HTTP proxy: every request's `Action` (the AWS Query protocol's operation) counted, then
/// forwarded to the upstream. It sees what the account's rate limit would see: every attempt.
pub struct CountingProxy {
    counts: Arc<Mutex<BTreeMap<String, u64>>>,
    /// Its endpoint, `http://127.0.0.1:<port>`.
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl CountingProxy {
    /// A proxy to `upstream` (`http://host:port`) on a free port of 127.0.0.1.
    pub async fn start(upstream: &str) -> Result<CountingProxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let counts: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
        let client: hyper_util::client::legacy::Client<_, Full<Bytes>> =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        let upstream = upstream.trim_end_matches('/').to_owned();
        let shared = counts.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (client, upstream, counts) = (client.clone(), upstream.clone(), shared.clone());
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                            let (client, upstream, counts) =
                                (client.clone(), upstream.clone(), counts.clone());
                            async move { forward(client, upstream, counts, request).await }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(CountingProxy { counts, url, task })
    }

    /// Every count since the last take, by action.
    pub fn take_all(&self) -> BTreeMap<String, u64> {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, u64>> {
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

type Upstream =
    hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

async fn forward(
    client: Upstream,
    upstream: String,
    counts: Arc<Mutex<BTreeMap<String, u64>>>,
    request: http::Request<hyper::body::Incoming>,
) -> std::io::Result<http::Response<Full<Bytes>>> {
    let (mut parts, body) = request.into_parts();
    let body = body.collect().await.map_err(std::io::Error::other)?.to_bytes();
    let action = String::from_utf8_lossy(&body)
        .split('&')
        .find_map(|pair| pair.strip_prefix("Action=").map(str::to_owned))
        .unwrap_or_else(|| "unknown".into());
    *counts
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .entry(action)
        .or_default() += 1;
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = format!("{upstream}{path}")
        .parse()
        .map_err(std::io::Error::other)?;
    let response = client
        .request(http::Request::from_parts(parts, Full::new(body)))
        .await
        .map_err(std::io::Error::other)?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map_err(std::io::Error::other)?.to_bytes();
    Ok(http::Response::from_parts(parts, Full::new(body)))
}
