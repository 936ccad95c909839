//! `ccm-bench`: the project's benchmarks. Run through `cargo xtask bench <name>`, which builds this and the
//! binaries it drives in release mode.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;

use clap::{Parser, Subcommand};

mod apiserver;
mod aws;
mod chaos;
mod kwok;
mod leader;
mod netns;
mod nodes;
mod process;
mod stats;
mod takeover;
mod versus;

#[derive(Debug, Parser)]
#[command(name = "ccm-bench")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Writes, reads and watch fan-out of the test API server.
    Apiserver(apiserver::Args),
    /// Leader migration: graceful hand-off, crash fail-over, idle standby cost, overlaps.
    Leader(leader::Args),
    /// Cloud-node initialisation of a burst of nodes: rate, API writes per node, controller-manager memory.
    Nodes(nodes::Args),
    /// The AWS provider against moto: EC2 requests to initialise and to watch a cluster's nodes.
    Aws(aws::Args),
    /// Six managers mid-migration under kills, pauses, API-server and cloud faults: overlaps and convergence.
    Chaos(chaos::Args),
    /// Ours against upstream's Go cloud-controller-manager on the node path, on a real kube-apiserver.
    Versus(versus::Args),
    /// Nodes with kwok's heartbeats on a real kube-apiserver beside kube-controller-manager: initialisation,
    /// steady state, and a group's heartbeats stopping.
    Kwok(kwok::Args),
    /// A standby taking over a large cluster after SIGKILL and SIGTERM of the leader, and its idle cost.
    Takeover(takeover::Args),
}

/// Where results go.
#[derive(Debug, clap::Args)]
pub(crate) struct Output {
    /// Write the JSON result here (it is always printed too).
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
}

impl Output {
    pub(crate) fn write(&self, result: &serde_json::Value) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(result)?;
        println!("{text}");
        if let Some(path) = &self.output {
            std::fs::write(path, format!("{text}\n"))
                .map_err(|e| anyhow::anyhow!("--output {}: {e}", path.display()))?;
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Apiserver(args) => apiserver::run(args).await,
        Command::Leader(args) => leader::run(args).await,
        Command::Nodes(args) => nodes::run(args).await,
        Command::Kwok(args) => kwok::run(args).await,
        Command::Takeover(args) => takeover::run(args).await,
        Command::Chaos(args) => chaos::run(args).await,
        Command::Aws(args) => aws::run(args).await,
        Command::Versus(args) => versus::run(args).await,
    }
}
