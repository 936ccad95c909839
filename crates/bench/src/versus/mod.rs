//! `ccm-bench versus`: this repository's manager against upstream's cloud-controller-manager (the Go peer
//! `cargo xtask kube` builds from `k8s.io/cloud-provider`'s app package at the pinned release, with a
//! provider acting on the same fake cloud) on the node path, in one run, one process at a time, each on a
//! fresh real kube-apiserver and etcd with the same workload: [`crate::nodes::measure`], a burst of
//! kubelet-shaped nodes with the uninitialized taint and a cloud answering every call after
//! `--cloud-latency-ms`.
//!
//! Contenders: `ceiling` (the ideal client, `src/ideal.rs`: the node controller's two writes per node
//! from a minimal loop, at each `--ceiling-concurrency`, the best kept; what the kube-apiserver takes),
//! `go-default` (upstream at its defaults: `--concurrent-node-syncs 1`,
//! `--concurrent-service-syncs 1`, client QPS 20 and burst 30), `go-tuned` (upstream with our defaults'
//! concurrency and client limits: 128 node and 8 service workers, QPS 1,000 and burst 2,000) and `ours`
//! (at its defaults). Each: time to initialise every node and nodes/s, kube-apiserver requests and
//! writes per node (from its audit log, by the managers' `User-Agent`s), the manager's peak resident set
//! and CPU-seconds, kube-apiserver's and etcd's CPU-seconds over the burst; then `--services`
//! LoadBalancer services, timed until each has its load balancer's address, with requests, writes and
//! cloud calls per service; then the ratios ours/theirs, and each contender's nodes/s over the ceiling's.
//! Then hand-offs ([`handoff`]): three replicas of each sharing upstream's Lease, the leader stopped
//! gracefully and crashed in turn, with the same election timings (2 s / 1 s / 200 ms) for both.
//!
//! With `--cloud aws`, the AWS providers instead: ours against upstream's cloud-provider-aws on moto
//! ([`aws`]).

use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::json;

use crate::nodes::{Burst, Contender, Measured, Server, measure};
use crate::stats::{percentile, round};

mod aws;
mod handoff;

use handoff::{Gaps, Kind};

const CONTENDERS: [&str; 4] = ["ceiling", "go-default", "go-tuned", "ours"];

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Which providers: `fake` (upstream's CCM with a provider on our fake cloud) or `aws` (upstream's
    /// cloud-provider-aws and ours, on moto).
    #[arg(long, default_value = "fake", value_parser = ["fake", "aws"])]
    cloud: String,
    /// New nodes in the burst [default: 10,000; 1,000 with `--cloud aws`].
    #[arg(long)]
    nodes: Option<u32>,
    /// With `--cloud aws`: the lifecycle-monitor and address-refresh period, in seconds.
    #[arg(long, default_value_t = 3)]
    period_seconds: u64,
    /// With `--cloud aws`: the periods each is sampled over.
    #[arg(long, default_value_t = 4)]
    periods: u32,
    /// LoadBalancer services created once every node is initialised, each given a load balancer (on
    /// the fake cloud, fronting every node) by the manager measured (0: no services phase).
    #[arg(long, default_value_t = 2_000)]
    services: u32,
    /// Latency of every fake-cloud call, in milliseconds.
    #[arg(long, default_value_t = 50)]
    cloud_latency_ms: u64,
    /// Once the services are served, change the node set three times (a node added, one deleted, one
    /// made unschedulable) and time each until every load balancer has the new set.
    #[arg(long)]
    fleet: bool,
    /// A flag for ours beyond its defaults (repeatable), e.g. to measure the default of one against
    /// another value.
    #[arg(long = "ours-flag", value_name = "FLAG", allow_hyphen_values = true)]
    ours_flags: Vec<String>,
    /// With `--fleet`: how long the unschedulable change is watched for load-balancer writes.
    #[arg(long, default_value_t = 10)]
    fleet_quiet_seconds: u64,
    /// Creates in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Give up on a contender after this many seconds (upstream at its defaults initialises about ten
    /// nodes a second).
    #[arg(long, default_value_t = 3600)]
    timeout_seconds: u64,
    /// Graceful stops, and as many crashes, of the leader of three replicas of each (0: none).
    #[arg(long, default_value_t = 5)]
    handoff_rounds: u32,
    /// Which contenders, in order [default: ceiling,go-default,go-tuned,ours; with `--cloud aws`:
    /// aws-default,aws-tuned,ours].
    #[arg(long, value_delimiter = ',', value_parser = ["ceiling", "go-default", "go-tuned", "aws-default", "aws-tuned", "ours"])]
    contenders: Vec<String>,
    /// The ceiling's writes in flight: it is measured once at each, with each of `--ceiling-protocols`,
    /// and the best stands.
    #[arg(long, value_delimiter = ',', default_values_t = [64, 256])]
    ceiling_concurrency: Vec<u32>,
    /// The ceiling's protocols: `http1` (kube's pool, a connection per request in flight) and `http2`
    /// (one connection, as client-go's).
    #[arg(long, value_delimiter = ',', default_values_t = ["http1".to_owned(), "http2".to_owned()], value_parser = ["http1", "http2"])]
    ceiling_protocols: Vec<String>,
    #[command(flatten)]
    output: crate::Output,
}

/// Upstream's CCM with `flags` beyond its defaults (routes off: the fake provider implements them and
/// upstream refuses to start them without a cluster CIDR; ours skips them without one).
fn upstream(name: &'static str, binaries: &control_plane::KubeBinaries, flags: &[&str]) -> Contender {
    let mut args = vec!["--configure-cloud-routes=false".to_owned()];
    args.extend(flags.iter().map(|&f| f.to_owned()));
    Contender {
        name,
        binary: binaries.go_cloud_controller_manager.clone(),
        args,
        // Its controllers name themselves as ours do (the peer's naming.go); its informers are client-go's.
        agents: &["cloud-controller-manager/", "go-cloud-controller-manager/"],
    }
}

/// Upstream's CCM as the contender `name` names: `go-default` (its defaults) or `go-tuned` (our
/// defaults' concurrency and client limits); `None` for any other name.
pub(crate) fn go_contender(name: &str, binaries: &control_plane::KubeBinaries) -> Option<Contender> {
    match name {
        "go-default" => Some(upstream("go-default", binaries, &[])),
        "go-tuned" => Some(upstream(
            "go-tuned",
            binaries,
            &[
                "--concurrent-node-syncs=128",
                "--concurrent-service-syncs=8",
                "--kube-api-qps=1000",
                "--kube-api-burst=2000",
            ],
        )),
        _ => None,
    }
}

pub(crate) async fn run(mut args: Args) -> Result<()> {
    if args.cloud == "aws" {
        let contenders = if args.contenders.is_empty() {
            aws::CONTENDERS.map(str::to_owned).to_vec()
        } else {
            args.contenders.clone()
        };
        let result = aws::run(&aws::Run {
            nodes: args.nodes.unwrap_or(1_000),
            period: Duration::from_secs(args.period_seconds.max(1)),
            periods: args.periods.max(1),
            timeout: Duration::from_secs(args.timeout_seconds),
            contenders,
        })
        .await?;
        return args.output.write(&result);
    }
    if args.contenders.is_empty() {
        args.contenders = CONTENDERS.map(str::to_owned).to_vec();
    }
    if let Some(other) = args.contenders.iter().find(|c| !CONTENDERS.contains(&c.as_str())) {
        anyhow::bail!(
            "--contenders: {other} is not one of {} (without --cloud aws)",
            CONTENDERS.join(", ")
        );
    }
    let nodes = args.nodes.unwrap_or(10_000);
    let binaries = control_plane::KubeBinaries::find()
        .context("the Go peer and kube-apiserver (`cargo xtask kube` builds them)")?;
    let burst = Burst {
        nodes,
        services: 0,
        load_balancers: args.services,
        fleet: args.fleet.then(|| Duration::from_secs(args.fleet_quiet_seconds)),
        route_periods: 0,
        cloud_latency_ms: args.cloud_latency_ms,
        concurrency: args.concurrency,
        timeout: Duration::from_secs(args.timeout_seconds),
        steady: None,
    };
    let mut results = serde_json::Map::new();
    let mut measured: Vec<(String, Measured)> = Vec::new();
    let mut apiserver = serde_json::Value::Null;
    for name in &args.contenders {
        if name == "ceiling" {
            let (entry, best) = ceiling(&burst, &args.ceiling_concurrency, &args.ceiling_protocols).await?;
            results.insert(name.clone(), entry);
            measured.push((name.clone(), best));
            continue;
        }
        let contender = match go_contender(name, &binaries) {
            Some(go) => go,
            None => Contender::ours(&args.ours_flags.iter().map(String::as_str).collect::<Vec<_>>())?,
        };
        let server = Server::start("kube").await?;
        let result = measure(&server, &burst, &contender)
            .await
            .with_context(|| format!("measuring {name}"))?;
        eprintln!(
            "versus: {name}: {} nodes in {} s ({} nodes/s), {} requests/node, peak {} MB",
            burst.nodes,
            result.seconds,
            result.nodes_per_sec,
            result.api_requests_per_node,
            result.peak_rss_mb
        );
        if let Some(lb) = &result.load_balancers {
            eprintln!(
                "versus: {name}: {} load balancers in {} s ({} services/s), {} requests/service",
                args.services, lb.seconds, lb.services_per_sec, lb.api_requests_per_service
            );
        }
        apiserver = server.describe();
        let mut entry = serde_json::to_value(&result)?;
        entry["flags"] = json!(contender.args);
        entry["cpu_seconds_per_1000_nodes"] =
            json!(round(result.cpu_seconds * 1000.0 / f64::from(burst.nodes)));
        results.insert(name.clone(), entry);
        measured.push((name.clone(), result));
    }
    let mut ratios = ratios(&measured);
    print_table(&measured, &ratios);
    let mut handoffs = serde_json::Map::new();
    if args.handoff_rounds > 0 {
        let timings = harness::Timings::fast();
        let go = handoff::measure(
            Kind::Go,
            &binaries.go_cloud_controller_manager,
            args.handoff_rounds,
            timings,
        )
        .await
        .context("the Go CCM's hand-offs")?;
        let ours = handoff::measure(
            Kind::Ours,
            &crate::process::manager_binary()?,
            args.handoff_rounds,
            timings,
        )
        .await
        .context("our hand-offs")?;
        for (name, gaps) in [("go", &go), ("ours", &ours)] {
            eprintln!("versus: {name}: hand-offs {}", gaps.to_json());
            handoffs.insert(name.to_owned(), gaps.to_json());
        }
        ratios["handoff"] = handoff_ratios(&go, &ours);
        eprintln!("hand-off ratios: {}", ratios["handoff"]);
    }
    args.output.write(&json!({
        "cloud": "fake",
        "nodes": nodes,
        "services": args.services,
        "cloud_latency_ms": args.cloud_latency_ms,
        "contenders": results,
        "handoffs": handoffs,
        "ratios": ratios,
        "apiserver": apiserver,
    }))
}

/// How many times faster ours hands off gracefully (theirs/ours, medians), and its crash fail-over
/// relative to theirs (ours/theirs, medians: at most 1 is no slower).
fn handoff_ratios(go: &Gaps, ours: &Gaps) -> serde_json::Value {
    let median = |samples: &[f64]| percentile(samples, 50.0);
    json!({
        "graceful_go_over_ours": round(median(&go.graceful_ms) / median(&ours.graceful_ms).max(0.01)),
        "crash_ours_over_go": round(median(&ours.crash_ms) / median(&go.crash_ms).max(0.01)),
    })
}

/// The ideal client ([`Contender::ideal`]) at each of `concurrencies` with each of `protocols`, each on a
/// fresh kube-apiserver with the burst's nodes and no services: every run, and the best (most nodes/s).
async fn ceiling(
    burst: &Burst,
    concurrencies: &[u32],
    protocols: &[String],
) -> Result<(serde_json::Value, Measured)> {
    let nodes_only = Burst {
        load_balancers: 0,
        ..burst.clone()
    };
    let mut runs = Vec::new();
    let mut best: Option<Measured> = None;
    let settings = protocols
        .iter()
        .flat_map(|p| concurrencies.iter().map(move |&c| (p.as_str(), c)));
    for (protocol, concurrency) in settings {
        let contender = Contender::ideal(concurrency, protocol)?;
        let server = Server::start("kube").await?;
        let result = measure(&server, &nodes_only, &contender)
            .await
            .with_context(|| format!("measuring the ceiling at {concurrency} in flight over {protocol}"))?;
        eprintln!(
            "versus: ceiling, {protocol}, {concurrency} in flight: {} nodes/s, {} requests/node, kube-apiserver {:?} CPU-s",
            result.nodes_per_sec, result.api_requests_per_node, result.apiserver_cpu_seconds
        );
        let mut entry = serde_json::to_value(&result)?;
        entry["concurrency"] = json!(concurrency);
        entry["protocol"] = json!(protocol);
        runs.push(entry);
        if best
            .as_ref()
            .is_none_or(|b| result.nodes_per_sec > b.nodes_per_sec)
        {
            best = Some(result);
        }
    }
    let best = best.context("--ceiling-concurrency: no value")?;
    let mut entry = serde_json::to_value(&best)?;
    entry["cpu_seconds_per_1000_nodes"] = json!(round(best.cpu_seconds * 1000.0 / f64::from(burst.nodes)));
    entry["runs"] = json!(runs);
    Ok((entry, best))
}

/// Each contender's nodes/s over the ceiling's (when it ran), and ours against each Go contender: speed
/// (higher is better for ours), memory, CPU per node (one burst size for all) and requests per node (lower
/// is better for ours).
fn ratios(measured: &[(String, Measured)]) -> serde_json::Value {
    let mut ratios = serde_json::Map::new();
    if let Some((_, ceiling)) = measured.iter().find(|(name, _)| name == "ceiling") {
        let of_ceiling: serde_json::Map<String, serde_json::Value> = measured
            .iter()
            .filter(|(name, _)| name != "ceiling")
            .map(|(name, m)| {
                (
                    name.clone(),
                    json!(round(m.nodes_per_sec / ceiling.nodes_per_sec)),
                )
            })
            .collect();
        ratios.insert("nodes_per_sec_of_ceiling".into(), json!(of_ceiling));
    }
    let Some((_, ours)) = measured.iter().find(|(name, _)| name == "ours") else {
        return serde_json::Value::Object(ratios);
    };
    for (name, theirs) in measured
        .iter()
        .filter(|(name, _)| name != "ours" && name != "ceiling")
    {
        ratios.insert(
            format!("ours_vs_{name}"),
            json!({
                "nodes_per_sec": round(ours.nodes_per_sec / theirs.nodes_per_sec),
                "peak_rss": round(ours.peak_rss_mb / theirs.peak_rss_mb),
                "cpu_seconds_per_node": round(ours.cpu_seconds / theirs.cpu_seconds),
                "api_requests_per_node": round(ours.api_requests_per_node / theirs.api_requests_per_node),
                "api_writes_per_node": round(ours.api_writes_per_node / theirs.api_writes_per_node),
                "apiserver_cpu_seconds": ratio(ours.apiserver_cpu_seconds, theirs.apiserver_cpu_seconds),
                "services": match (&ours.load_balancers, &theirs.load_balancers) {
                    (Some(ours), Some(theirs)) => json!({
                        "services_per_sec": round(ours.services_per_sec / theirs.services_per_sec),
                        "api_requests_per_service":
                            ratio(Some(ours.api_requests_per_service), Some(theirs.api_requests_per_service)),
                        "cloud_calls_per_service":
                            ratio(Some(ours.cloud_calls_per_service), Some(theirs.cloud_calls_per_service)),
                        "cpu_seconds": ratio(Some(ours.cpu_seconds), Some(theirs.cpu_seconds)),
                    }),
                    _ => serde_json::Value::Null,
                },
                // Theirs over ours: how many times faster ours brings every load balancer to a new node
                // set (the slowest change), and ours over theirs for the cloud calls it takes.
                "fleet": match (&ours.fleet, &theirs.fleet) {
                    (Some(ours), Some(theirs)) => json!({
                        "worst_seconds_theirs_over_ours": ratio(Some(theirs.worst_seconds), Some(ours.worst_seconds)),
                        "cloud_calls": ratio(
                            Some(ours.changes.iter().map(|c| c.cloud_calls_total as f64).sum()),
                            Some(theirs.changes.iter().map(|c| c.cloud_calls_total as f64).sum()),
                        ),
                    }),
                    _ => serde_json::Value::Null,
                },
            }),
        );
    }
    serde_json::Value::Object(ratios)
}

/// `ours / theirs`, when both are known and theirs is not zero.
fn ratio(ours: Option<f64>, theirs: Option<f64>) -> serde_json::Value {
    match (ours, theirs) {
        (Some(a), Some(b)) if b > 0.0 => json!(round(a / b)),
        _ => serde_json::Value::Null,
    }
}

fn print_table(measured: &[(String, Measured)], ratios: &serde_json::Value) {
    eprintln!(
        "\n{:<11} {:>9} {:>10} {:>9} {:>9} {:>10} {:>9} {:>12}",
        "contender", "seconds", "nodes/s", "req/node", "wr/node", "peak MB", "CPU s", "apiserver s"
    );
    for (name, m) in measured {
        eprintln!(
            "{:<11} {:>9} {:>10} {:>9} {:>9} {:>10} {:>9} {:>12}",
            name,
            m.seconds,
            m.nodes_per_sec,
            m.api_requests_per_node,
            m.api_writes_per_node,
            m.peak_rss_mb,
            m.cpu_seconds,
            m.apiserver_cpu_seconds.map_or("-".to_owned(), |s| s.to_string())
        );
    }
    if measured.iter().any(|(_, m)| m.load_balancers.is_some()) {
        eprintln!(
            "\n{:<11} {:>9} {:>10} {:>9} {:>9} {:>11} {:>10} {:>9}",
            "contender", "seconds", "services/s", "req/svc", "wr/svc", "cloud/svc", "peak MB", "CPU s"
        );
        for (name, m) in measured {
            if let Some(lb) = &m.load_balancers {
                eprintln!(
                    "{:<11} {:>9} {:>10} {:>9} {:>9} {:>11} {:>10} {:>9}",
                    name,
                    lb.seconds,
                    lb.services_per_sec,
                    lb.api_requests_per_service,
                    lb.api_writes_per_service,
                    lb.cloud_calls_per_service,
                    lb.peak_rss_mb,
                    lb.cpu_seconds
                );
            }
        }
    }
    if measured.iter().any(|(_, m)| m.fleet.is_some()) {
        eprintln!(
            "\n{:<11} {:>14} {:>9} {:>9} {:>9}",
            "contender", "change", "seconds", "written", "calls"
        );
        for (name, m) in measured {
            for change in m.fleet.iter().flat_map(|f| &f.changes) {
                eprintln!(
                    "{:<11} {:>14} {:>9} {:>9} {:>9}",
                    name,
                    change.change,
                    change.seconds,
                    change.load_balancers_written,
                    change.cloud_calls_total
                );
            }
        }
    }
    eprintln!("ratios: {ratios}");
}
