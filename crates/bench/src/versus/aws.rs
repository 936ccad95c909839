//! `ccm-bench versus --cloud aws`: our `aws` provider against upstream's cloud-provider-aws (its own
//! `aws-cloud-controller-manager`, which `cargo xtask kube` builds from `k8s.io/cloud-provider-aws` at
//! the pinned Kubernetes minor), each against a fresh moto behind a counting proxy and a fresh real
//! kube-apiserver, with the same cloud-config and the same scenario ([`harness::aws_cost`]): `--nodes`
//! instances and their kubelet-shaped nodes (named by private DNS name, no provider ID, as a kubelet
//! with `--cloud-provider=external` registers them), the EC2 requests and the time to initialise them,
//! then the requests per lifecycle-monitor period with every node NotReady and per address-refresh
//! period, each controller alone; the manager's peak resident set while initialising.
//!
//! Contenders: `aws-default` (cloud-provider-aws at its defaults: one node worker, client QPS 20 and
//! burst 30), `aws-tuned` (with our defaults' node workers and client limits) and `ours` (at its
//! defaults).

use std::time::Duration;

use anyhow::{Context, Result};
use harness::Moto;
use harness::aws_cost::{CostRun, Costs, measure};
use serde_json::json;

use crate::nodes::Server;
use crate::process::{TempDir, manager_binary};
use crate::stats::round;

/// The contenders `--contenders` may name with `--cloud aws`.
pub(crate) const CONTENDERS: [&str; 3] = ["aws-default", "aws-tuned", "ours"];

/// What to run.
pub(crate) struct Run {
    pub(crate) nodes: u32,
    pub(crate) period: Duration,
    pub(crate) periods: u32,
    pub(crate) timeout: Duration,
    pub(crate) contenders: Vec<String>,
}

/// Each contender's figures and the ratios, as JSON.
pub(crate) async fn run(run: &Run) -> Result<serde_json::Value> {
    let server_path = Moto::installed().context(
        "moto is not installed under the target directory's venv/: `cargo xtask bench versus --cloud aws` installs it",
    )?;
    let binaries = control_plane::KubeBinaries::find()
        .context("cloud-provider-aws and kube-apiserver (`cargo xtask kube` builds them)")?;
    let mut results = serde_json::Map::new();
    let mut measured: Vec<(String, Costs)> = Vec::new();
    for name in &run.contenders {
        let (binary, flags): (_, &[&str]) = match name.as_str() {
            "aws-default" => (binaries.aws_cloud_controller_manager.clone(), &[]),
            "aws-tuned" => (
                binaries.aws_cloud_controller_manager.clone(),
                &harness::aws_cost::UPSTREAM_TUNED,
            ),
            "ours" => (manager_binary()?, &[]),
            other => anyhow::bail!(
                "--contenders: {other} is not one of {} (with --cloud aws)",
                CONTENDERS.join(", ")
            ),
        };
        let moto = Moto::start(&server_path)?;
        let server = Server::start("kube").await?;
        let directory = TempDir::new()?;
        let cost_run = CostRun {
            manager: binary,
            flags: flags.iter().map(|&f| f.to_owned()).collect(),
            kubeconfig: server.kubeconfig().to_owned(),
            moto_url: moto.url().to_owned(),
            nodes: run.nodes as usize,
            period: run.period,
            periods: run.periods,
            dir: directory.0.clone(),
            timeout: run.timeout,
        };
        let costs = measure(&cost_run, server.client().await?)
            .await
            .with_context(|| format!("measuring {name}; its logs are in {}", directory.keep().display()))?;
        eprintln!(
            "versus aws: {name}: {} nodes in {:.1} s, {} EC2 requests ({} DescribeInstances), peak {:?} MB; \
             per monitor period {} ({} DescribeInstances), per refresh period {} ({})",
            costs.nodes,
            costs.init_seconds,
            costs.init_requests_total,
            costs.init_describe_instances,
            costs.init_peak_rss_mb,
            costs.monitor_requests_per_period,
            costs.monitor_describe_instances_per_period,
            costs.refresh_requests_per_period,
            costs.refresh_describe_instances_per_period,
        );
        let mut entry = serde_json::to_value(&costs)?;
        entry["flags"] = json!(flags);
        results.insert(name.clone(), entry);
        measured.push((name.clone(), costs));
    }
    let ratios = ratios(&measured);
    print_table(&measured, &ratios);
    Ok(json!({
        "cloud": "aws",
        "nodes": run.nodes,
        "period_seconds": run.period.as_secs_f64(),
        "periods_sampled": run.periods,
        "cloud_provider_aws": binaries.cloud_provider_aws_version,
        "kubernetes": binaries.kubernetes_version,
        "contenders": results,
        "ratios": ratios,
    }))
}

/// Ours against each of upstream's: how many times fewer requests ours makes (theirs/ours, so higher is
/// better for ours), how many times faster it initialises, and its peak resident set over theirs.
fn ratios(measured: &[(String, Costs)]) -> serde_json::Value {
    let Some((_, ours)) = measured.iter().find(|(name, _)| name == "ours") else {
        return json!({});
    };
    let fewer = |theirs: f64, ours: f64| {
        if ours > 0.0 {
            json!(round(theirs / ours))
        } else {
            serde_json::Value::Null
        }
    };
    let mut ratios = serde_json::Map::new();
    for (name, theirs) in measured.iter().filter(|(name, _)| name != "ours") {
        ratios.insert(
            format!("ours_vs_{name}"),
            json!({
                "init_requests_times_fewer":
                    fewer(theirs.init_requests_total as f64, ours.init_requests_total as f64),
                "init_describe_instances_times_fewer":
                    fewer(theirs.init_describe_instances as f64, ours.init_describe_instances as f64),
                "init_times_faster": fewer(theirs.init_seconds, ours.init_seconds),
                "monitor_requests_per_period_times_fewer":
                    fewer(theirs.monitor_requests_per_period, ours.monitor_requests_per_period),
                "refresh_requests_per_period_times_fewer":
                    fewer(theirs.refresh_requests_per_period, ours.refresh_requests_per_period),
                "init_peak_rss": match (ours.init_peak_rss_mb, theirs.init_peak_rss_mb) {
                    (Some(a), Some(b)) if b > 0.0 => json!(round(a / b)),
                    _ => serde_json::Value::Null,
                },
            }),
        );
    }
    serde_json::Value::Object(ratios)
}

fn print_table(measured: &[(String, Costs)], ratios: &serde_json::Value) {
    eprintln!(
        "\n{:<12} {:>8} {:>9} {:>9} {:>9} {:>11} {:>11}",
        "contender", "seconds", "init req", "init DI", "peak MB", "monitor/p", "refresh/p"
    );
    for (name, c) in measured {
        eprintln!(
            "{:<12} {:>8.1} {:>9} {:>9} {:>9} {:>11} {:>11}",
            name,
            c.init_seconds,
            c.init_requests_total,
            c.init_describe_instances,
            c.init_peak_rss_mb.map_or("-".to_owned(), |m| m.to_string()),
            c.monitor_requests_per_period,
            c.refresh_requests_per_period
        );
    }
    eprintln!("ratios: {ratios}");
}
