//! `ccm-bench aws`: what the AWS provider costs in EC2 requests, against moto. The shipped manager
//! (`--cloud-provider=aws`) and the test API server run as processes; moto (from `<target>/venv`, which
//! `cargo xtask bench aws` installs) is reached through a counting proxy, so every attempt is counted, as
//! the account's rate limit would count it. See `harness::aws_cost` for the scenario.
//!
//! The targets, per 1,000 nodes: ≤ 20 `DescribeInstances` to initialise them, ≤ 10 per lifecycle-monitor
//! period with every node NotReady, ≤ 10 per address-refresh period. (The AWS provider asks about 200
//! nodes a request, EC2's limit on a filter's values: 5 per 1,000 nodes a round.) Past 4,000 nodes the
//! instances are spread over moto's default subnets, one zone each.

use std::time::Duration;

use anyhow::{Context, Result};
use harness::Moto;
use harness::aws_cost::{CostRun, measure};
use serde_json::json;

use crate::process::{ApiServer, TempDir, manager_binary};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Instances in moto, and their nodes.
    #[arg(long, default_value_t = 1_000)]
    nodes: usize,
    /// The lifecycle-monitor and address-refresh period, in seconds.
    #[arg(long, default_value_t = 3)]
    period_seconds: u64,
    /// Periods each is sampled over.
    #[arg(long, default_value_t = 4)]
    periods: u32,
    #[command(flatten)]
    output: crate::Output,
}

pub(crate) async fn run(args: Args) -> Result<()> {
    let server_path = Moto::installed().context(
        "moto is not installed under the target directory's venv/: run `cargo xtask bench aws`, which installs it",
    )?;
    let moto = Moto::start(&server_path)?;
    let server = ApiServer::start(&[])?;
    let client = server.client().await?;
    let directory = TempDir::new()?;
    let run = CostRun {
        manager: manager_binary()?,
        flags: vec!["--kube-api-qps=1000".into(), "--kube-api-burst=1000".into()],
        kubeconfig: server.kubeconfig.clone(),
        moto_url: moto.url().to_owned(),
        nodes: args.nodes,
        period: Duration::from_secs(args.period_seconds.max(1)),
        periods: args.periods.max(1),
        dir: directory.0.clone(),
        timeout: Duration::from_secs(300),
    };
    let costs = measure(&run, client)
        .await
        .with_context(|| format!("the managers' logs are in {}", directory.keep().display()))?;
    let targets = json!({
        "init_describe_instances_per_1000_nodes": 20,
        "monitor_describe_instances_per_1000_nodes_per_period": 10,
        "refresh_describe_instances_per_1000_nodes_per_period": 10,
    });
    let thousands = costs.nodes.max(1) as f64 / 1000.0;
    let init = costs.init_describe_instances as f64 / thousands;
    let monitor = costs.monitor_describe_instances_per_period / thousands;
    let refresh = costs.refresh_describe_instances_per_period / thousands;
    let pass = init <= 20.0 && monitor <= 10.0 && refresh <= 10.0;
    let mut result = serde_json::to_value(&costs)?;
    result["period_seconds"] = json!(args.period_seconds);
    result["periods_sampled"] = json!(args.periods);
    result["init_describe_instances_per_1000_nodes"] = json!(crate::stats::round(init));
    result["monitor_describe_instances_per_1000_nodes_per_period"] = json!(crate::stats::round(monitor));
    result["refresh_describe_instances_per_1000_nodes_per_period"] = json!(crate::stats::round(refresh));
    result["targets"] = targets;
    result["pass"] = json!(pass);
    args.output.write(&result)
}
