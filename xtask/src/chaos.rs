//! `cargo xtask chaos [--seconds N] [--seed S] [--apiserver test|kube] [--peers rust|go] [--min-events N]
//! [--output FILE]`: builds the manager, the test API server and the benchmark driver (debug builds: the
//! run judges safety and convergence, not speed), and with `--apiserver kube` or `--peers go`
//! kube-apiserver, etcd and the Go peer (`cargo xtask kube`, cached), then runs `ccm-bench chaos` (six
//! managers mid-migration under kills, pauses, partitions, API-server and cloud faults; see
//! `crates/bench/src/chaos.rs`). The full `cargo xtask test` runs it for 60 s on the test API server, and
//! with upstream's Go cloud-controller-manager beside ours on the real kube-apiserver for at least 200
//! fault events, each with a fixed seed.

use std::process::Command;

use anyhow::Result;

use crate::shell::{cargo, exec, target_dir};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// How long the faults go on.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Seed of the fault schedule (random when absent; the report gives it).
    #[arg(long)]
    seed: Option<u64>,
    /// Write the JSON report here too.
    #[arg(long, value_name = "FILE")]
    output: Option<std::path::PathBuf>,
    /// `test` (our API server, with its faults) or `kube` (the real kube-apiserver and etcd).
    #[arg(long, default_value = "test", value_parser = ["test", "kube"])]
    apiserver: String,
    /// `rust` (six of ours) or `go` (three of upstream's Go cloud-controller-manager, three of ours).
    #[arg(long, default_value = "rust", value_parser = ["rust", "go"])]
    peers: String,
    /// Fail with fewer fault events than this.
    #[arg(long, default_value_t = 0)]
    min_events: u32,
    /// How long the cluster has to converge once the faults stop.
    #[arg(long, default_value_t = 90)]
    converge_seconds: u64,
}

impl Args {
    /// What the full test run uses.
    pub(crate) fn ci() -> Args {
        Args {
            seconds: 60,
            seed: Some(1),
            output: Some(target_dir().join("chaos.json")),
            apiserver: "test".to_owned(),
            peers: "rust".to_owned(),
            min_events: 0,
            converge_seconds: 90,
        }
    }

    /// What the full test run uses where Go is: Go and Rust replicas on the real kube-apiserver, at least
    /// 200 fault events.
    pub(crate) fn ci_with_go_peers() -> Args {
        Args {
            seconds: 240,
            seed: Some(1),
            output: Some(target_dir().join("chaos-kube-go.json")),
            apiserver: "kube".to_owned(),
            peers: "go".to_owned(),
            min_events: 200,
            // Four minutes of work arrive; upstream's Go CCM, when it leads at the end, works through
            // what is left.
            converge_seconds: 240,
        }
    }
}

pub(crate) fn run(args: &Args) -> Result<()> {
    exec(cargo().args([
        "build",
        "--locked",
        "-p",
        "cloud-controller-manager",
        "-p",
        "test-apiserver",
        "-p",
        "bench",
    ]))?;
    if args.apiserver == "kube" || args.peers == "go" {
        crate::kube::build()?;
    }
    let debug = target_dir().join("debug");
    let mut command = Command::new(debug.join("ccm-bench"));
    command
        .env("BENCH_MANAGER_BINARY", debug.join("cloud-controller-manager"))
        .args(["chaos", "--seconds", &args.seconds.to_string()]);
    if let Some(seed) = args.seed {
        command.args(["--seed", &seed.to_string()]);
    }
    command.args([
        "--apiserver",
        &args.apiserver,
        "--peers",
        &args.peers,
        "--min-events",
        &args.min_events.to_string(),
        "--converge-seconds",
        &args.converge_seconds.to_string(),
    ]);
    if let Some(output) = &args.output {
        command.arg("--output").arg(output);
    }
    exec(&mut command)
}
