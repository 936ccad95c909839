//! `ccm-bench leader`: hand-off and fail-over times of leader migration, what an idle standby costs, and
//! overlaps, all judged from the API server's records.
//!
//! Three cloud-controller-manager replicas (N+1 configuration: main lock and migration lock) run with short
//! leases while a workload keeps their controllers writing. Repeatedly: the leader gets SIGTERM (graceful
//! hand-off: release → acquisition, measured per lock) or SIGKILL (crash fail-over: the old holder's last
//! renewal → acquisition), and a new replica replaces it. Then the standbys' requests are counted over a
//! quiet window. Gaps come from the server's Lease history, overlaps from `ccm-audit`.

use std::time::Duration;

use anyhow::{Context, Result};
use ccm_audit::audit;
use harness::{Admin, Environment, Replica, Side, Timings, Workload, wait_for_holders};
use kube_ccm_fake::{FakeCloud, FakeCloudServer, Knobs};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::process::{ApiServer, TempDir, manager_binary};
use crate::stats::{round, summary};

const CCM: &str = "cloud-controller-manager";
const MIGRATION: &str = "cloud-provider-extraction-migration";
const LEASES: [&str; 2] = [CCM, MIGRATION];

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Graceful hand-offs (SIGTERM of the leader).
    #[arg(long, default_value_t = 10)]
    handoffs: usize,
    /// Crash fail-overs (SIGKILL of the leader).
    #[arg(long, default_value_t = 5)]
    crashes: usize,
    /// Lease duration in whole seconds (renew deadline: half; retry period: a tenth).
    #[arg(long, default_value_t = 2)]
    lease_seconds: u64,
    /// How long to watch idle standbys.
    #[arg(long, default_value_t = 30)]
    idle_seconds: u64,
    #[command(flatten)]
    output: crate::Output,
}

pub(crate) async fn run(args: Args) -> Result<()> {
    let server = ApiServer::start(&[])?;
    let client = server.client().await?;
    let cloud = FakeCloudServer::start(
        FakeCloud::new(Vec::new(), Knobs::default()),
        ([127, 0, 0, 1], 0).into(),
    )
    .await?;
    let directory = TempDir::new()?;
    let lease = Duration::from_secs(args.lease_seconds);
    let timings = Timings {
        lease_duration: lease,
        renew_deadline: lease / 2,
        retry_period: lease / 10,
    };
    let environment = Environment::prepare(
        &directory.0,
        manager_binary()?,
        server.kubeconfig.clone(),
        cloud.url(),
        timings,
    )?;
    let wait = lease * 10;

    let stop = CancellationToken::new();
    let churn = Workload::new(client.clone(), cloud.url()).churn(Duration::from_millis(250), 0, stop.clone());
    let mut replicas: Vec<Replica> = Vec::new();
    let mut next = 0;
    let mut start = |replicas: &mut Vec<Replica>| -> Result<()> {
        next += 1;
        let mut replica = Replica::start(&environment, &format!("ccm-{next}"), Side::Ccm)?;
        replica.identity(wait)?;
        replicas.push(replica);
        Ok(())
    };
    for _ in 0..3 {
        start(&mut replicas)?;
    }
    let leader_of = |holders: &std::collections::BTreeMap<String, Option<String>>| {
        holders[CCM]
            .clone()
            .filter(|c| holders[MIGRATION].as_ref() == Some(c))
    };
    let mut holders =
        wait_for_holders(&client, &LEASES, wait, "a leader", |h| leader_of(h).is_some()).await?;

    // Hand-offs and crashes: replace the leader, each time.
    let mut crashed = Vec::new();
    for round_index in 0..args.handoffs + args.crashes {
        let crash = round_index >= args.handoffs;
        let leader = leader_of(&holders).context("a leader")?;
        let position = replicas
            .iter_mut()
            .position(|r| r.identity(wait).is_ok_and(|id| id == leader))
            .context("the leader is one of ours")?;
        let mut old = replicas.remove(position);
        if crash {
            old.kill()?;
            crashed.push(leader.clone());
        } else {
            old.terminate()?;
        }
        old.wait(wait)?;
        holders = wait_for_holders(&client, &LEASES, wait, "a new leader", |h| {
            leader_of(h).is_some_and(|l| l != leader)
        })
        .await?;
        start(&mut replicas)?;
        eprintln!(
            "leader: {} {} → {}",
            if crash { "crash" } else { "hand-off" },
            leader,
            leader_of(&holders).unwrap_or_default()
        );
    }

    // Idle standbys: count their requests over a quiet window (after their start-up requests).
    tokio::time::sleep(lease).await;
    let admin = Admin::new(client.clone());
    let leader = leader_of(&holders).context("a leader")?;
    let standbys: Vec<String> = replicas
        .iter_mut()
        .filter_map(|r| r.identity(wait).ok())
        .filter(|id| *id != leader)
        .collect();
    let count = |requests: &[ccm_audit::RequestEntry]| {
        requests
            .iter()
            .filter(|r| {
                standbys
                    .iter()
                    .any(|id| r.user_agent.contains(&format!(" {id}/")))
            })
            .count()
    };
    let before = count(&admin.requests().await?);
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let after = count(&admin.requests().await?);
    let idle_per_minute =
        (after - before) as f64 / standbys.len().max(1) as f64 * 60.0 / args.idle_seconds as f64;

    stop.cancel();
    churn.await??;
    for replica in &replicas {
        replica.terminate()?;
    }
    for replica in &mut replicas {
        replica.wait(wait)?;
    }
    let mut requests = admin.requests().await?;
    requests.extend(harness::cloud_writes(cloud.url()).await?);
    let report = audit(&admin.leases().await?, &requests, &environment.governance()?);
    let graceful: Vec<f64> = report
        .handoffs
        .iter()
        .filter(|h| h.released)
        .map(|h| h.gap_ms)
        .collect();
    let crash: Vec<f64> = report
        .handoffs
        .iter()
        .filter(|h| !h.released && crashed.contains(&h.from))
        .map(|h| h.gap_ms)
        .collect();
    for overlap in &report.overlaps {
        eprintln!("overlap: {overlap:?}");
    }
    let result = json!({
        "lease_duration_ms": lease.as_millis(),
        "graceful_handoff_ms": summary(&graceful),
        "crash_failover_ms": summary(&crash),
        "idle_requests_per_min_per_standby": round(idle_per_minute),
        "overlaps": report.overlaps.len(),
        "controller_writes_checked": report.writes_checked,
    });
    args.output.write(&result)
}
