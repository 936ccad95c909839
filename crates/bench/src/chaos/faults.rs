//! The faults of a chaos run, and a node's machine going away.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use harness::Admin;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube_ccm_fake::{AdminRequest, CloudRequest, CloudResponse, FakeCloudClient, InstanceState, Knobs};
use rand::Rng;
use rand::rngs::StdRng;
use serde_json::json;
use tokio::time::Instant;

use super::plane::{Plane, Stop};

pub(super) async fn cloud_call(cloud: &FakeCloudClient, request: AdminRequest) -> Result<CloudResponse> {
    match cloud.call(&CloudRequest::Admin(request)).await {
        CloudResponse::Error { message, .. } => bail!("fake cloud admin: {message}"),
        other => Ok(other),
    }
}

/// Marks the node NotReady for `reason`; false when the node is gone already (a wrong deletion the verdict
/// reports, so it is not retired or stalled after the fact).
async fn not_ready(nodes: &Api<Node>, name: &str, reason: &str) -> Result<bool> {
    let status = json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": reason}]}});
    match nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(error) => Err(error).with_context(|| format!("mark {name} NotReady")),
    }
}

/// A node's machine goes away: the node turns NotReady and its instance is terminated, so the lifecycle
/// controller must delete it. False when the node is gone already.
pub(super) async fn retire(nodes: &Api<Node>, cloud: &FakeCloudClient, name: &str) -> Result<bool> {
    if !not_ready(nodes, name, "KubeletStopped").await? {
        return Ok(false);
    }
    cloud_call(
        cloud,
        AdminRequest::SetInstanceState {
            name: name.to_owned(),
            state: InstanceState::Terminated,
        },
    )
    .await?;
    Ok(true)
}

/// A node's kubelet stops reporting while its machine runs on: the node turns NotReady and its instance
/// exists, so no controller may delete it (the lying cloud's faults tempt them to). False when the node is
/// gone already.
pub(super) async fn stall(nodes: &Api<Node>, name: &str) -> Result<bool> {
    not_ready(nodes, name, "KubeletStalled").await
}

/// The cloud as it is when no fault holds: answering in 5 ms, seeing every instance, no rate limit.
pub(super) async fn calm_cloud(cloud: &FakeCloudClient) -> Result<()> {
    let knobs = Knobs {
        latency_ms: 5,
        ..Knobs::default()
    };
    cloud_call(cloud, AdminRequest::SetKnobs(knobs)).await?;
    cloud_call(cloud, AdminRequest::SetBlind { blind: false }).await?;
    cloud_call(cloud, AdminRequest::SetRateLimit { per_second: 0.0 }).await?;
    Ok(())
}

/// Matches the `User-Agent` of every manager (both components), not the workload's or the judge's.
const MANAGERS: &str = "-controller-manager/";

/// The kinds [`inject`] returns that are not faults: nothing to act on, or the cloud recovering.
pub(super) const NOT_FAULTS: [&str; 2] = ["none", "cloud_recovers"];

/// One fault, chosen at random; returns its kind.
pub(super) async fn inject(
    rng: &mut StdRng,
    plane: &mut Plane,
    faults: Option<&Admin>,
    cloud: &FakeCloudClient,
    lease: Duration,
) -> Result<&'static str> {
    let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
    let Some(target) = plane.pick(rng) else {
        return Ok("none");
    };
    let mut kind = rng.random_range(0..12);
    // The real kube-apiserver has no faults of its own: a network partition instead, where there are
    // links to cut, else the cloud's faults.
    if faults.is_none() && matches!(kind, 3..=5 | 8) {
        kind = if plane.slots.is_empty() { 6 } else { 3 };
    }
    let admin = faults;
    let (name, slot) = (plane.name_of(target), plane.replicas[target].1);
    let kind = match kind {
        0 => {
            plane.replace(target, Stop::Kill)?;
            "sigkill_and_restart"
        }
        1 => {
            plane.replace(target, Stop::Terminate)?;
            "sigterm_and_restart"
        }
        2 => {
            plane.replicas[target].0.pause()?;
            let frozen = Duration::from_millis(rng.random_range(lease_ms * 3 / 2..lease_ms * 3));
            plane.paused.push((target, Instant::now() + frozen));
            "sigstop_longer_than_the_lease"
        }
        3 if !plane.slots.is_empty() => {
            let slot = plane.replicas[target].1;
            if !plane.cut.iter().any(|(s, _)| *s == slot) {
                plane.slots[slot].netns.cut(true)?;
                let heal = Duration::from_millis(rng.random_range(lease_ms..lease_ms * 3));
                plane.cut.push((slot, Instant::now() + heal));
            }
            "network_partition"
        }
        3 | 8 => {
            let replica = plane.user_agent_of(target);
            admin
                .context("API-server faults")?
                .add_fault(json!({"user_agent": replica, "action": {"type": "partition"}, "duration_ms": rng.random_range(lease_ms..lease_ms * 2)}))
                .await?;
            "api_partition"
        }
        4 => {
            let code = [500, 503, 429][rng.random_range(0..3)];
            admin
                .context("API-server faults")?
                .add_fault(json!({"user_agent": MANAGERS, "action": {"type": "error", "code": code, "rate": 0.3}, "duration_ms": rng.random_range(500..lease_ms * 2)}))
                .await?;
            "api_errors"
        }
        5 => {
            admin
                .context("API-server faults")?
                .add_fault(json!({"user_agent": MANAGERS, "action": {"type": "latency", "ms": rng.random_range(100..lease_ms / 2)}, "duration_ms": rng.random_range(500..lease_ms * 2)}))
                .await?;
            "api_latency"
        }
        6 => {
            cloud_call(
                cloud,
                AdminRequest::SetKnobs(Knobs {
                    latency_ms: rng.random_range(5..lease_ms / 2),
                    error_rate: rng.random_range(0.0..0.3),
                    hang_rate: rng.random_range(0.0..0.1),
                    lost_answer_rate: 0.0,
                }),
            )
            .await?;
            "cloud_slow_failing_hanging"
        }
        9 => {
            // A wrong region or account: every instance answered absent until the cloud recovers.
            cloud_call(cloud, AdminRequest::SetBlind { blind: true }).await?;
            "cloud_says_every_instance_is_gone"
        }
        10 => {
            let per_second = rng.random_range(2.0..10.0);
            cloud_call(cloud, AdminRequest::SetRateLimit { per_second }).await?;
            "cloud_throttles"
        }
        11 => {
            // Writes land and their answers are lost: the caller times out on a write that happened, and
            // must neither duplicate nor leak what it made.
            cloud_call(
                cloud,
                AdminRequest::SetKnobs(Knobs {
                    latency_ms: 5,
                    lost_answer_rate: rng.random_range(0.1..0.5),
                    ..Knobs::default()
                }),
            )
            .await?;
            "cloud_applies_then_loses_the_answer"
        }
        _ => {
            calm_cloud(cloud).await?;
            "cloud_recovers"
        }
    };
    plane.note(format!("{kind}: {name} (slot {slot})"));
    Ok(kind)
}
