//! Hand-off gaps of three replicas sharing upstream's Lease (`kube-system/cloud-controller-manager`), for
//! upstream's Go CCM and for ours, on a fresh kube-apiserver each: the leader stopped gracefully (SIGTERM)
//! `rounds` times, then crashed (SIGKILL) as often, a new replica started in its place each time. Each gap
//! is judged by an independent watch of the Lease ([`harness::LeaseWatch`]) from the times the electors
//! wrote: the old leader's last renewal (or its release) to the new leader's acquisition.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use harness::{Environment, LeaseWatch, Replica, Side, Timings, wait_for_holders};
use kube_ccm_fake::{FakeCloud, FakeCloudServer, Knobs};
use serde_json::json;

use crate::nodes::Server;
use crate::process::TempDir;
use crate::stats::summary;

const LEASE: &str = "cloud-controller-manager";
const WAIT: Duration = Duration::from_secs(60);

/// Whose replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Upstream's Go CCM.
    Go,
    /// This repository's manager.
    Ours,
}

/// The gaps, in milliseconds.
pub(super) struct Gaps {
    pub(super) graceful_ms: Vec<f64>,
    pub(super) crash_ms: Vec<f64>,
    /// Graceful stops that released the Lease.
    pub(super) released: usize,
}

impl Gaps {
    pub(super) fn to_json(&self) -> serde_json::Value {
        json!({
            "graceful_handoff_ms": summary(&self.graceful_ms),
            "crash_failover_ms": summary(&self.crash_ms),
            "graceful_stops_that_released": self.released,
        })
    }
}

fn args(kind: Kind, environment: &Environment) -> Vec<String> {
    let mut args = vec![
        "--cloud-provider=fake".to_owned(),
        format!("--cloud-config={}", environment.cloud_config.display()),
        format!("--kubeconfig={}", environment.kubeconfig.display()),
        "--secure-port=0".to_owned(),
    ];
    if kind == Kind::Go {
        args.push("--configure-cloud-routes=false".to_owned());
    }
    args.extend(environment.timing_flags());
    args
}

/// Runs `rounds` graceful stops and `rounds` crashes of the leader of three `kind` replicas (`binary`),
/// with `timings` for all.
pub(super) async fn measure(
    kind: Kind,
    binary: &std::path::Path,
    rounds: u32,
    timings: Timings,
) -> Result<Gaps> {
    let server = Server::start("kube").await?;
    let client = server.client().await?;
    let cloud = FakeCloudServer::start(
        FakeCloud::new(Vec::new(), Knobs::default()),
        ([127, 0, 0, 1], 0).into(),
    )
    .await?;
    let directory = TempDir::new()?;
    let environment = Environment::prepare(
        &directory.0,
        binary.to_owned(),
        server.kubeconfig().to_owned(),
        cloud.url(),
        timings,
    )?;
    let args = args(kind, &environment);
    let watch = LeaseWatch::start(client.clone(), "kube-system");
    let mut started = 0;
    let mut start = |replicas: &mut Vec<Replica>| -> Result<()> {
        started += 1;
        replicas.push(Replica::spawn(
            &environment,
            &format!("replica-{started}"),
            Side::Ccm,
            &args,
        )?);
        Ok(())
    };
    let mut replicas = Vec::new();
    for _ in 0..3 {
        start(&mut replicas)?;
    }
    let mut stopped: Vec<(String, bool)> = Vec::new();
    for round in 0..rounds * 2 {
        let crash = round >= rounds;
        let gone: Vec<String> = stopped.iter().map(|(identity, _)| identity.clone()).collect();
        let holders = wait_for_holders(&client, &[LEASE], WAIT, "a live leader", |h| {
            h[LEASE].as_ref().is_some_and(|holder| !gone.contains(holder))
        })
        .await?;
        let holder = holders[LEASE].clone().unwrap_or_default();
        // The leader's process: the one that reported this identity (a Go peer reports it once it leads).
        let deadline = tokio::time::Instant::now() + WAIT;
        let index = loop {
            if let Some(index) = replicas
                .iter_mut()
                .position(|r| r.reported_identity().as_deref() == Some(holder.as_str()))
            {
                break index;
            }
            if tokio::time::Instant::now() > deadline {
                bail!("no replica reported the identity {holder} of the leader");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let mut leader = replicas.remove(index);
        if crash {
            leader.kill()?;
        } else {
            leader.terminate()?;
        }
        tokio::task::block_in_place(|| leader.wait(WAIT))
            .with_context(|| format!("the leader {} to exit", leader.name))?;
        stopped.push((holder, crash));
        start(&mut replicas)?;
    }
    let gone: Vec<String> = stopped.iter().map(|(identity, _)| identity.clone()).collect();
    wait_for_holders(&client, &[LEASE], WAIT, "the last take-over", |h| {
        h[LEASE].as_ref().is_some_and(|holder| !gone.contains(holder))
    })
    .await?;
    let handoffs = watch.handoffs(|_| kind == Kind::Go);
    let mut gaps = Gaps {
        graceful_ms: Vec::new(),
        crash_ms: Vec::new(),
        released: 0,
    };
    for (identity, crash) in &stopped {
        let handoff = handoffs
            .iter()
            .find(|h| h.lease == LEASE && h.from == *identity)
            .with_context(|| format!("no hand-off from {identity} was seen"))?;
        if handoff.premature {
            bail!("a premature takeover: {handoff:?}");
        }
        if *crash {
            gaps.crash_ms.push(handoff.gap_ms);
        } else {
            gaps.graceful_ms.push(handoff.gap_ms);
            gaps.released += usize::from(handoff.released);
        }
    }
    for replica in &mut replicas {
        replica.kill()?;
    }
    Ok(gaps)
}
