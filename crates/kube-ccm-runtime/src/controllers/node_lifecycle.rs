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
use kube_ccm_provider::names::TAINT_SHUTDOWN;
use kube_ccm_provider::{CloudError, CloudProvider, InstancesV2, Refused};
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

/// Which nodes a round acts on, from the cache alone ([`select`]).
#[derive(Debug, Default)]
struct Selection {
    /// Ready nodes with the shutdown taint: it is removed (the cloud is not asked about a ready node).
    untaint: Vec<Arc<CachedNode>>,
    /// Not-ready nodes whose provider ID the provider cannot interpret, with why: reported, never looked
    /// up, so never deleted.
    uninterpretable: Vec<(Arc<CachedNode>, Refused)>,
    /// The not-ready nodes the cloud is asked about, in the cache's order.
    check: Vec<Arc<CachedNode>>,
}

/// Sorts the cached nodes for a round: another provider's are left out; a ready node is not looked up,
/// only untainted if it has the shutdown taint; a not-ready one is looked up when it has no provider ID or
/// one its provider can interpret, and reported otherwise. Pure (the provider is only asked to read
/// provider IDs), so the choice is tested without a cloud or a cluster.
fn select(nodes: Vec<Arc<CachedNode>>, provider: &dyn CloudProvider) -> Selection {
    // Another provider's nodes are none of this one's business.
    let (ready, not_ready): (Vec<Arc<CachedNode>>, Vec<Arc<CachedNode>>) = nodes
        .into_iter()
        .filter(|n| n.provider_id().is_none_or(|id| provider.owns_provider_id(id)))
        .partition(|n| n.is_ready());
    let mut selection = Selection {
        untaint: ready
            .into_iter()
            .filter(|n| n.has_taint(TAINT_SHUTDOWN))
            .collect(),
        ..Selection::default()
    };
    // Only what the provider can interpret is asked about: an answer about anything else proves nothing.
    for node in not_ready {
        let refused = node
            .provider_id()
            .filter(|id| !id.is_empty())
            .and_then(|id| provider.check_provider_id(id).err());
        match refused {
            Some(why) => selection.uninterpretable.push((node, why)),
            None => selection.check.push(node),
        }
    }
    selection
}

/// What the cloud's answer to "does this not-ready node's instance exist?" means ([`on_exists`]).
#[derive(Debug)]
enum OnExists {
    /// It exists: whether it is shut down is asked next.
    AskShutdown,
    /// It is gone: the node is deleted.
    Delete,
    /// No answer (any error, `InstanceNotFound` included: only an answer deletes a node): the node is
    /// left alone, and the round fails.
    Unknown(CloudError),
}

/// Reads the answer to "does the instance exist?".
fn on_exists(answer: Result<bool, CloudError>) -> OnExists {
    match answer {
        Ok(true) => OnExists::AskShutdown,
        Ok(false) => OnExists::Delete,
        Err(error) => OnExists::Unknown(error),
    }
}

/// What the cloud's answer to "is this not-ready node's instance shut down?" means ([`on_shutdown`]).
#[derive(Debug)]
enum OnShutdown {
    /// Shut down, and the node has no shutdown taint yet: it is added.
    Taint,
    /// Nothing to do: not shut down, already tainted, or the provider cannot say.
    Leave,
    /// No answer: the node is left alone, and the round fails.
    Unknown(CloudError),
}

/// Reads the answer to "is the instance shut down?" for `node`. A not-ready node whose instance runs
/// keeps a shutdown taint it has (as upstream): only a ready node loses it ([`select`]).
fn on_shutdown(node: &CachedNode, answer: Result<bool, CloudError>) -> OnShutdown {
    match answer {
        Ok(true) if !node.has_taint(TAINT_SHUTDOWN) => OnShutdown::Taint,
        // As upstream, NotImplemented and InstanceNotFound mean "not shut down".
        Ok(_) | Err(CloudError::NotImplemented | CloudError::InstanceNotFound) => OnShutdown::Leave,
        Err(error) => OnShutdown::Unknown(error),
    }
}

/// One round: the nodes sorted ([`select`]), the uninterpretable ones reported, the ready ones untainted,
/// then the not-ready ones checked against the cloud.
async fn monitor(controller: &ControllerContext, api: &Api<Written<Node>>) -> Result<(), RoundFailed> {
    let _working = controller.working();
    let provider = controller.provider();
    let Some(instances) = instances_of(provider.as_ref()) else {
        return Ok(());
    };
    let selection = select(controller.nodes().store().state(), provider.as_ref());
    let mut failures = report_uninterpretable(controller, &selection.uninterpretable).await;
    for node in &selection.untaint {
        failures += usize::from(!set_shutdown_taint(api, node, false).await);
    }
    if !selection.check.is_empty() {
        failures += look_up(controller, api, instances.as_ref(), selection.check).await;
    }
    if failures == 0 {
        Ok(())
    } else {
        Err(RoundFailed { failures })
    }
}

/// Sets the gauge of nodes whose provider ID the provider cannot interpret, then logs an error and
/// records a Warning Event for each; they are all failures of the round (their number is returned).
async fn report_uninterpretable(
    controller: &ControllerContext,
    uninterpretable: &[(Arc<CachedNode>, Refused)],
) -> usize {
    controller
        .metrics
        .uninterpretable_provider_ids
        .set(i64::try_from(uninterpretable.len()).unwrap_or(i64::MAX));
    for (node, why) in uninterpretable {
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
    uninterpretable.len()
}

/// Asks the cloud whether the instances of `nodes` (not ready) exist, deletes the nodes whose instances
/// are gone, then asks whether the existing ones are shut down and taints those that are ([`on_exists`],
/// [`on_shutdown`]); the number of nodes that could not be checked or changed.
async fn look_up(
    controller: &ControllerContext,
    api: &Api<Written<Node>>,
    instances: &dyn InstancesV2,
    nodes: Vec<Arc<CachedNode>>,
) -> usize {
    let mut failures = 0;
    // Only the few NotReady nodes are materialised for the provider.
    let materialized: Vec<Arc<Node>> = nodes.iter().map(|n| Arc::new(n.to_node())).collect();
    let exists = ask(controller, instances, Question::Exists, &materialized).await;
    let mut existing = Vec::new();
    for ((node, materialized), exists) in nodes.into_iter().zip(materialized).zip(exists) {
        match on_exists(exists) {
            OnExists::AskShutdown => existing.push((node, materialized)),
            OnExists::Delete => failures += usize::from(!delete(controller, api, &node).await),
            OnExists::Unknown(error) => {
                failures += 1;
                tracing::warn!(node = node.name(), %error, "cannot tell whether the instance exists");
            }
        }
    }
    if existing.is_empty() {
        return failures;
    }
    let materialized: Vec<Arc<Node>> = existing.iter().map(|(_, m)| m.clone()).collect();
    let shutdown = ask(controller, instances, Question::Shutdown, &materialized).await;
    for ((node, _), shutdown) in existing.iter().zip(shutdown) {
        match on_shutdown(node, shutdown) {
            OnShutdown::Taint => failures += usize::from(!set_shutdown_taint(api, node, true).await),
            OnShutdown::Leave => {}
            OnShutdown::Unknown(error) => {
                failures += 1;
                tracing::warn!(node = node.name(), %error, "cannot tell whether the instance is shut down");
            }
        }
    }
    failures
}

/// One of the batch questions a round asks the cloud ([`ask`]).
#[derive(Debug, Clone, Copy)]
enum Question {
    /// `instance_exists_batch`.
    Exists,
    /// `instance_shutdown_batch`.
    Shutdown,
}

/// Asks the cloud `question` about `nodes` in one batch call, under the call context's deadline and
/// observed as its request; one answer per node (each the error, when the framework abandoned the call).
async fn ask(
    controller: &ControllerContext,
    instances: &dyn InstancesV2,
    question: Question,
    nodes: &[Arc<Node>],
) -> Vec<Result<bool, CloudError>> {
    let cx = controller.call_context();
    let started = Instant::now();
    let answers = cx
        .guard(async {
            Ok(match question {
                Question::Exists => instances.instance_exists_batch(&cx, nodes).await,
                Question::Shutdown => instances.instance_shutdown_batch(&cx, nodes).await,
            })
        })
        .await
        .unwrap_or_else(|error| all_failed(nodes.len(), &error));
    let request = match question {
        Question::Exists => "instance_exists_batch",
        Question::Shutdown => "instance_shutdown_batch",
    };
    cx.observe(
        request,
        started.elapsed(),
        crate::metrics::batch_outcome(&answers),
    );
    answers
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

#[cfg(test)]
mod tests;
