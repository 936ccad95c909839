//! `cargo xtask chaos [--seconds N] [--seed S] [--apiserver test|kube] [--peers rust|go] [--min-events N]
//! [--output FILE]`: builds the manager, the test API server and the benchmark driver (debug builds: the
//! run judges safety and convergence, not speed), and with `--apiserver kube` or `--peers go`
//! kube-apiserver, etcd and the Go peer (`cargo xtask kube`, cached), then runs `ccm-bench chaos` (six
//! managers mid-migration under kills, pauses, partitions, API-server and cloud faults; see
//! `crates/bench/src/chaos.rs`). The full `cargo xtask test` runs it for 60 s on the test API server, and
//! with upstream's Go cloud-controller-manager beside ours on the real kube-apiserver for at least 200
//! fault events, each with a fixed seed. Then the negative controls ([`negative_controls`]): the same run
//! with a deliberately broken manager in every slot of ours, whose verdict must fail naming the fault.

use std::process::Command;

use anyhow::{Context, Result, bail};

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
    /// Run the negative controls instead, on `--apiserver`: short runs with a deliberately broken manager,
    /// each of which must fail naming what it did.
    #[arg(long)]
    negative_controls: bool,
}

impl Args {
    /// What the full test run uses: a fault every 0.3–1.5 s, so about 60 in a minute, of which at least 40
    /// must be faults (not the cloud's recovery).
    pub(crate) fn ci() -> Args {
        Args {
            seconds: 60,
            seed: Some(1),
            output: Some(target_dir().join("chaos.json")),
            apiserver: "test".to_owned(),
            peers: "rust".to_owned(),
            min_events: 40,
            converge_seconds: 90,
            negative_controls: false,
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
            negative_controls: false,
        }
    }
}

/// Builds what a chaos run starts: the manager, the test API server, the benchmark driver and the
/// negative controls' broken manager (all in the `bench` package but the first two).
fn build() -> Result<()> {
    exec(cargo().args([
        "build",
        "--locked",
        "-p",
        "cloud-controller-manager",
        "-p",
        "kube-ccm-test-apiserver",
        "-p",
        "bench",
    ]))
}

pub(crate) fn run(args: &Args) -> Result<()> {
    if args.negative_controls {
        return negative_controls(&[args.apiserver.as_str()]);
    }
    build()?;
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

/// Whether a chaos report names a finding.
type Named = fn(&serde_json::Value) -> bool;

/// The ways `broken-ccm` (`crates/bench/src/broken.rs`) is broken, each with the finding the verdict must
/// name when it runs in every slot of ours.
const BROKEN: [(&str, &str, Named); 4] = [
    (
        "late-writes",
        "a write of ours outside its tenure (service-lb-controller)",
        |report| {
            overlaps(report)
                .any(|o| o["kind"] == "write_outside_tenure" && o["controller"] == "service-lb-controller")
        },
    ),
    (
        "anonymous",
        "unattributable writes, to the cloud and to the API server",
        |report| {
            let unattributable = |prefix: &str| {
                overlaps(report).any(|o| {
                    o["kind"] == "unattributable_write"
                        && o["path"].as_str().is_some_and(|path| path.starts_with(prefix))
                })
            };
            unattributable("cloud:") && unattributable("/api")
        },
    ),
    (
        "leak",
        "a second load balancer of a service, and an orphan of ours not excused",
        |report| {
            let duplicated = report["duplicated_load_balancers"]
                .as_array()
                .is_some_and(|d| !d.is_empty());
            let orphaned_by_ours = report["orphaned_load_balancers"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|o| o["excused"].is_null() && o["created_by"]["peer"] == "rust");
            duplicated && orphaned_by_ours
        },
    ),
    (
        "gone-when-not-ready",
        "a node deleted though its instance exists",
        |report| {
            report["nodes_wrongly_deleted"]
                .as_array()
                .is_some_and(|d| !d.is_empty())
        },
    ),
];

fn overlaps(report: &serde_json::Value) -> impl Iterator<Item = &serde_json::Value> {
    report["overlaps"].as_array().into_iter().flatten()
}

/// The negative controls of the chaos verdict: a short run with `broken-ccm` in every slot of ours, once
/// per way it is broken, on each of `backends` (`test`, `kube`).
/// Each run must fail, and its report must name what the broken manager did; a verdict that passes, or
/// fails for another reason only, fails this.
pub(crate) fn negative_controls(backends: &[&str]) -> Result<()> {
    build()?;
    if backends.contains(&"kube") {
        crate::kube::build()?;
    }
    for apiserver in backends {
        for (broken, finding, named) in BROKEN {
            // What a broken manager does under faults depends on timing (a lifecycle leader must hold on
            // long enough to act): a run that failed for another reason only is run once more, with
            // another fault schedule. A verdict that passes a broken manager is never run again.
            let mut failures = Vec::new();
            for seed in ["1", "2"] {
                let report = negative_control(apiserver, broken, seed)?;
                if named(&report) {
                    failures.clear();
                    break;
                }
                failures.push(report["failures"].to_string());
            }
            if !failures.is_empty() {
                bail!(
                    "negative control {broken} on {apiserver}: the verdict failed, but without naming {finding} \
                     (failures, seeds 1 and 2: {}; {})",
                    failures.join(" / "),
                    target_dir()
                        .join(format!("chaos-negative-{broken}-{apiserver}.json"))
                        .display()
                );
            }
            println!("negative control {broken} on {apiserver}: the chaos verdict failed, naming {finding}");
        }
    }
    Ok(())
}

/// One run of the negative control `broken` with the fault schedule `seed`: its report, or an error when
/// the verdict passed the broken manager.
fn negative_control(apiserver: &str, broken: &str, seed: &str) -> Result<serde_json::Value> {
    let debug = target_dir().join("debug");
    let output = target_dir().join(format!("chaos-negative-{broken}-{apiserver}.json"));
    let _ = std::fs::remove_file(&output);
    // Its failure is the expected outcome: what it says goes to a file, not the run's output.
    let log = target_dir().join(format!("chaos-negative-{broken}-{apiserver}.log"));
    let stderr = std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
    let mut command = Command::new(debug.join("ccm-bench"));
    command
        .env("BENCH_MANAGER_BINARY", debug.join("broken-ccm"))
        .env("NEGATIVE_CONTROL", broken)
        // Long enough that a lifecycle leader holds on through the faults and acts (at 12 s the
        // deletion control named its deletion in one run of two with the same seed).
        .args([
            "chaos",
            "--seconds",
            "20",
            "--seed",
            seed,
            "--converge-seconds",
            "30",
        ])
        .args(["--apiserver", apiserver, "--peers", "rust", "--output"])
        .arg(&output)
        .stdout(std::process::Stdio::null())
        .stderr(stderr);
    eprintln!(
        "$ NEGATIVE_CONTROL={broken} ccm-bench chaos --apiserver {apiserver} --seed {seed} (a negative control)"
    );
    let status = command.status().context("start ccm-bench")?;
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&output)
            .with_context(|| format!("the negative control {broken} wrote no report"))?,
    )?;
    if status.success() || report["pass"] != false {
        bail!(
            "negative control {broken} on {apiserver}: the chaos verdict PASSED a broken manager \
             ({}, {})",
            output.display(),
            log.display()
        );
    }
    Ok(report)
}
