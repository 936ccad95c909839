//! `cloud-node-lifecycle-controller`: what happens to nodes whose instances stop or disappear.
//!
//! Every `--node-monitor-period` (upstream: 5 s), for each node:
//! - Ready: the shutdown taint is removed if present.
//! - Not ready (False, Unknown or missing): if the cloud answers that its instance no longer exists, the
//!   Node is deleted (Event `DeletingNode`); if it exists and is shut down, the shutdown taint is added.
//!   A look-up that fails — any error, `InstanceNotFound` included — leaves the node alone, as upstream: only
//!   an answer deletes a node.
//!
//! Beyond upstream: a node whose provider ID belongs to another provider (`CloudProvider::owns_provider_id`)
//! is never looked up, so never deleted; nor is one whose provider ID its own provider cannot interpret
//! (`CloudProvider::check_provider_id`): that is an error (logged, a Warning Event
//! `ProviderIDNotInterpretable`, the gauge `node_lifecycle_uninterpretable_provider_ids`), as upstream's
//! AWS provider errors for such an ID, so a provider that would answer "not found" for an ID it cannot
//! parse never has a node deleted for it; and the delete is conditional on the node's UID, so a node
//! re-created under the same name is not deleted in its predecessor's place.
//!
//! Cloud look-ups for all not-ready nodes of a round are one batch call each (exists, then shutdown). A
//! round succeeds when every look-up and write of it did.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, DeleteParams, Patch, Preconditions};
use kube::runtime::events::EventType;
use kube_ccm_provider::CloudError;
use kube_ccm_provider::names::TAINT_SHUTDOWN;
use serde_json::json;

use super::periodic::{self, Schedule};
use crate::cached_node::CachedNode;
use crate::context::{ControllerContext, event_reference};
use crate::instances::instances_of;
use crate::written::Written;

/// A round in which some nodes could not be checked or changed (each is logged).
#[derive(Debug, thiserror::Error)]
#[error("{failures} node(s) could not be checked against the cloud or updated")]
struct RoundFailed {
    failures: usize,
}

pub(super) async fn run(controller: ControllerContext) {
    let informer = controller.nodes();
    tokio::select! {
        () = controller.stop().cancelled() => return,
        () = informer.ready() => {}
    }
    controller.set_started();
    let api: Api<Written<Node>> = Api::all(controller.client().clone());
    let schedule = Schedule {
        period: controller.settings().node_monitor_period,
        from_start: false,
        first_round_at_once: true,
        on_change: None,
        min_gap: Duration::ZERO,
    };
    periodic::run(controller.stop(), schedule, || async {
        let started = Instant::now();
        let result = monitor(&controller, &api).await;
        controller.record_reconcile(result.is_ok(), started.elapsed());
        if let Err(error) = result {
            tracing::warn!(%error, "cannot check every node against the cloud");
        }
    })
    .await;
}

/// Answers for every node of a batch the framework abandoned.
fn all_failed<T>(count: usize, error: &CloudError) -> Vec<Result<T, CloudError>> {
    (0..count).map(|_| Err(error.clone())).collect()
}

async fn monitor(controller: &ControllerContext, api: &Api<Written<Node>>) -> Result<(), RoundFailed> {
    let _working = controller.working();
    let provider = controller.provider();
    let Some(instances) = instances_of(provider.as_ref()) else {
        return Ok(());
    };
    let mut failures = 0;
    let nodes = controller.nodes().store().state();
    // Another provider's nodes are none of this one's business.
    let nodes = nodes
        .into_iter()
        .filter(|n| n.provider_id().is_none_or(|id| provider.owns_provider_id(id)));
    let (ready, not_ready): (Vec<Arc<CachedNode>>, Vec<Arc<CachedNode>>) = nodes.partition(|n| n.is_ready());
    // Only what the provider can interpret is asked about: an answer about anything else proves nothing.
    let mut uninterpretable = Vec::new();
    let not_ready: Vec<Arc<CachedNode>> = not_ready
        .into_iter()
        .filter(|node| {
            let refused = node
                .provider_id()
                .filter(|id| !id.is_empty())
                .and_then(|id| provider.check_provider_id(id).err());
            match refused {
                Some(why) => {
                    uninterpretable.push((node.clone(), why));
                    false
                }
                None => true,
            }
        })
        .collect();
    controller
        .metrics
        .uninterpretable_provider_ids
        .set(i64::try_from(uninterpretable.len()).unwrap_or(i64::MAX));
    for (node, why) in &uninterpretable {
        failures += 1;
        let id = node.provider_id().unwrap_or_default();
        tracing::error!(node = node.name(), provider_id = id, %why, "the provider cannot interpret the node's provider ID: the node is not looked up, and never deleted");
        controller
            .event(
                &event_reference(node.as_ref()),
                EventType::Warning,
                "ProviderIDNotInterpretable",
                "CheckInstance",
                format!(
                    "Cannot tell whether node {} exists in the cloud provider: its provider ID {id:?} is {why}",
                    node.name()
                ),
            )
            .await;
    }

    for node in ready.iter().filter(|n| n.has_taint(TAINT_SHUTDOWN)) {
        failures += usize::from(!set_shutdown_taint(api, node, false).await);
    }
    if not_ready.is_empty() {
        return if failures == 0 {
            Ok(())
        } else {
            Err(RoundFailed { failures })
        };
    }
    // Only the few NotReady nodes are materialised for the provider.
    let materialized: Vec<Arc<Node>> = not_ready.iter().map(|n| Arc::new(n.to_node())).collect();
    let cx = controller.call_context();
    let started = Instant::now();
    let exists = cx
        .guard(async { Ok(instances.instance_exists_batch(&cx, &materialized).await) })
        .await
        .unwrap_or_else(|error| all_failed(materialized.len(), &error));
    cx.observe(
        "instance_exists_batch",
        started.elapsed(),
        crate::metrics::batch_outcome(&exists),
    );
    let mut existing = Vec::new();
    for ((node, materialized), exists) in not_ready.into_iter().zip(materialized).zip(exists) {
        match exists {
            Ok(true) => existing.push((node, materialized)),
            Ok(false) => failures += usize::from(!delete(controller, api, &node).await),
            Err(error) => {
                failures += 1;
                tracing::warn!(node = node.name(), %error, "cannot tell whether the instance exists");
            }
        }
    }
    if !existing.is_empty() {
        let materialized: Vec<Arc<Node>> = existing.iter().map(|(_, m)| m.clone()).collect();
        let cx = controller.call_context();
        let started = Instant::now();
        let shutdown = cx
            .guard(async { Ok(instances.instance_shutdown_batch(&cx, &materialized).await) })
            .await
            .unwrap_or_else(|error| all_failed(materialized.len(), &error));
        cx.observe(
            "instance_shutdown_batch",
            started.elapsed(),
            crate::metrics::batch_outcome(&shutdown),
        );
        for ((node, _), shutdown) in existing.iter().zip(shutdown) {
            match shutdown {
                Ok(true) if !node.has_taint(TAINT_SHUTDOWN) => {
                    failures += usize::from(!set_shutdown_taint(api, node, true).await);
                }
                // As upstream, NotImplemented and InstanceNotFound mean "not shut down".
                Ok(_) | Err(CloudError::NotImplemented | CloudError::InstanceNotFound) => {}
                Err(error) => {
                    failures += 1;
                    tracing::warn!(node = node.name(), %error, "cannot tell whether the instance is shut down");
                }
            }
        }
    }
    if failures == 0 {
        Ok(())
    } else {
        Err(RoundFailed { failures })
    }
}

/// Deletes the node; false when that failed.
async fn delete(controller: &ControllerContext, api: &Api<Written<Node>>, node: &CachedNode) -> bool {
    let name = node.name();
    controller
        .event(
            &event_reference(node),
            EventType::Normal,
            "DeletingNode",
            "DeleteNode",
            format!("Deleting node {name} because it does not exist in the cloud provider"),
        )
        .await;
    // Only this node, not a newer one of the same name.
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(node.uid().to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => {
            tracing::info!(node = %name, "deleted node: its instance is gone");
            true
        }
        Err(kube::Error::Api(status)) if status.code == 404 => true,
        Err(error) => {
            controller
                .event(
                    &event_reference(node),
                    EventType::Warning,
                    "DeletingNodeFailed",
                    "DeleteNode",
                    format!("Failed deleting node {name}: {error}"),
                )
                .await;
            false
        }
    }
}

/// Adds or removes the shutdown taint, conditional on the cached version (taints are a whole-list field);
/// false when the write failed.
async fn set_shutdown_taint(api: &Api<Written<Node>>, node: &CachedNode, present: bool) -> bool {
    let name = node.name();
    let mut list: Vec<Taint> = node
        .taints()
        .iter()
        .filter(|t| t.key != TAINT_SHUTDOWN)
        .cloned()
        .collect();
    if present {
        list.push(Taint {
            key: TAINT_SHUTDOWN.to_owned(),
            effect: "NoSchedule".to_owned(),
            ..Taint::default()
        });
    }
    let patch = json!({"metadata": {"resourceVersion": node.resource_version()}, "spec": {"taints": list}});
    match api
        .patch(name, &crate::written::patch_params(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => {
            tracing::info!(node = %name, shut_down = present, "updated the shutdown taint");
            true
        }
        // Changed meanwhile: the next round sees the new version.
        Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => true,
        Err(error) => {
            tracing::warn!(node = %name, %error, "cannot update the shutdown taint");
            false
        }
    }
}
