//! `cloud-node-lifecycle-controller`: what happens to nodes whose instances stop or disappear.
//!
//! Every `--node-monitor-period` (upstream: 5 s), for each node:
//! - Ready: the shutdown taint is removed if present.
//! - Not ready (False, Unknown or missing): if the cloud answers that its instance no longer exists, the
//!   Node is deleted (Event `DeletingNode`) once that answer is certain ([`deletion`]: confirmed a period
//!   later, not part of a round where the cloud says most nodes are gone, within the round's cap); if it
//!   exists and is shut down, the shutdown taint is added. A look-up that fails — any error,
//!   `InstanceNotFound` included — leaves the node alone, as upstream: only an answer deletes a node.
//!
//! Beyond upstream: a node whose provider ID belongs to another provider (`CloudProvider::owns_provider_id`)
//! is never looked up, so never deleted; nor is one whose provider ID its own provider cannot interpret
//! (`CloudProvider::check_provider_id`): that is an error (logged, a Warning Event
//! `ProviderIDNotInterpretable`, the gauge `node_lifecycle_uninterpretable_provider_ids`), as upstream's
//! AWS provider errors for such an ID, so a provider that would answer "not found" for an ID it cannot
//! parse never has a node deleted for it; and the delete is conditional on the node's UID, so a node
//! re-created under the same name is not deleted in its predecessor's place.
//!
//! Cloud look-ups for all not-ready nodes of a round, and as many ready ones cross-checked for the breaker,
//! are one batch call each (exists, then shutdown). A round succeeds when every look-up and write of it did.

mod deletion;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, DeleteParams, Patch, Preconditions};
use kube::runtime::events::EventType;
use kube_ccm_provider::names::TAINT_SHUTDOWN;
use kube_ccm_provider::{CloudError, CloudProvider, InstancesV2, Priority, Refused};
use parking_lot::Mutex;
use serde_json::json;
use tokio::time::Instant;

use super::periodic::{self, Schedule};
use crate::cached_node::CachedNode;
use crate::context::{ControllerContext, event_reference};
use crate::instances::instances_of;
use crate::written::Written;
pub use deletion::NodeDeletion;
use deletion::{Answer, Decision, GoneSince, Round};

/// The most ready nodes a round cross-checks: as many as the not-ready nodes it asks about, up to this.
const MAX_CROSS_CHECKS: usize = 100;

/// The most Warning Events a held round records (one per node whose deletion it holds; the log gives the
/// count).
const HELD_EVENTS: usize = 10;

/// What the controller keeps between rounds, for as long as it runs (a new tenure starts afresh).
#[derive(Debug, Default)]
struct Memory {
    /// The not-ready nodes answered "gone", since when.
    gone_since: GoneSince,
    /// Rounds so far: which ready nodes a round cross-checks rotates with it.
    rounds: usize,
}

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
    let memory = Mutex::new(Memory::default());
    periodic::run(controller.stop(), schedule, || async {
        let started = Instant::now();
        let result = monitor(&controller, &api, &memory).await;
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
    /// Ready nodes asked about too, as many as `check` (up to [`MAX_CROSS_CHECKS`]): their instances surely
    /// run, so a cloud that answers "gone" for them trips the breaker ([`deletion`]).
    cross_check: Vec<Arc<CachedNode>>,
}

/// Sorts the cached nodes for a round: another provider's are left out; a ready node is not looked up,
/// only untainted if it has the shutdown taint, unless it is cross-checked (ready nodes with a provider ID
/// the provider can interpret, from the `rotation`-th on, as many as the not-ready ones looked up); a
/// not-ready one is looked up when it has no provider ID or one its provider can interpret, and reported
/// otherwise. Pure (the provider is only asked to read provider IDs), so the choice is tested without a
/// cloud or a cluster.
fn select(nodes: Vec<Arc<CachedNode>>, provider: &dyn CloudProvider, rotation: usize) -> Selection {
    // Another provider's nodes are none of this one's business.
    let (ready, not_ready): (Vec<Arc<CachedNode>>, Vec<Arc<CachedNode>>) = nodes
        .into_iter()
        .filter(|n| n.provider_id().is_none_or(|id| provider.owns_provider_id(id)))
        .partition(|n| n.is_ready());
    let interpretable = |id: &str| !id.is_empty() && provider.check_provider_id(id).is_ok();
    let checkable: Vec<&Arc<CachedNode>> = ready
        .iter()
        .filter(|n| n.provider_id().is_some_and(interpretable))
        .collect();
    let mut selection = Selection {
        untaint: ready
            .iter()
            .filter(|n| n.has_taint(TAINT_SHUTDOWN))
            .cloned()
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
    let wanted = selection.check.len().min(MAX_CROSS_CHECKS).min(checkable.len());
    selection.cross_check = checkable
        .iter()
        .cycle()
        .skip(rotation % checkable.len().max(1))
        .take(wanted)
        .map(|n| Arc::clone(n))
        .collect();
    selection
}

/// What the cloud's answer to "does this not-ready node's instance exist?" means ([`on_exists`]).
#[derive(Debug)]
enum OnExists {
    /// It exists: whether it is shut down is asked next.
    AskShutdown,
    /// It is gone: the node is deleted once that is certain ([`deletion`]).
    Gone,
    /// No answer (any error, `InstanceNotFound` included: only an answer deletes a node): the node is
    /// left alone, and the round fails.
    Unknown(CloudError),
}

/// Reads the answer to "does the instance exist?".
fn on_exists(answer: Result<bool, CloudError>) -> OnExists {
    match answer {
        Ok(true) => OnExists::AskShutdown,
        Ok(false) => OnExists::Gone,
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
async fn monitor(
    controller: &ControllerContext,
    api: &Api<Written<Node>>,
    memory: &Mutex<Memory>,
) -> Result<(), RoundFailed> {
    let _working = controller.working();
    let provider = controller.provider();
    let Some(instances) = instances_of(provider.as_ref()) else {
        return Ok(());
    };
    let rotation = {
        let mut memory = memory.lock();
        memory.rounds = memory.rounds.wrapping_add(1);
        memory.rounds
    };
    let selection = select(controller.nodes().store().state(), provider.as_ref(), rotation);
    let mut failures = report_uninterpretable(controller, &selection.uninterpretable).await;
    for node in &selection.untaint {
        failures += usize::from(!set_shutdown_taint(api, node, false).await);
    }
    if selection.check.is_empty() {
        memory.lock().gone_since = GoneSince::default();
    } else {
        let asked = Asked {
            not_ready: selection.check,
            ready: selection.cross_check,
        };
        failures += look_up(controller, api, instances.as_ref(), asked, memory).await;
    }
    controller
        .metrics
        .nodes_awaiting_deletion
        .set(i64::try_from(memory.lock().gone_since.len()).unwrap_or(i64::MAX));
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

/// The nodes a round asks the cloud about ([`Selection`]).
struct Asked {
    /// Not ready: each is acted on by its answers.
    not_ready: Vec<Arc<CachedNode>>,
    /// Ready, cross-checked: their answers only feed the breaker.
    ready: Vec<Arc<CachedNode>>,
}

/// Asks the cloud whether the instances of the nodes exist, deletes the not-ready nodes whose instances
/// are certainly gone ([`on_exists`], [`deletion`]), then asks whether the existing ones are shut down and
/// taints those that are ([`on_shutdown`]); the number of nodes that could not be checked or changed.
async fn look_up(
    controller: &ControllerContext,
    api: &Api<Written<Node>>,
    instances: &dyn InstancesV2,
    asked: Asked,
    memory: &Mutex<Memory>,
) -> usize {
    let mut failures = 0;
    let nodes = asked.not_ready;
    // Only the few nodes asked about are materialised for the provider.
    let materialized: Vec<Arc<Node>> = nodes
        .iter()
        .chain(&asked.ready)
        .map(|n| Arc::new(n.to_node()))
        .collect();
    let at = Instant::now();
    let mut exists = ask(controller, instances, Question::Exists, &materialized).await;
    let ready_answers = exists.split_off(nodes.len().min(exists.len()));
    let mut answers = Vec::with_capacity(nodes.len());
    let mut existing = Vec::new();
    for ((node, materialized), exists) in nodes.iter().zip(&materialized).zip(exists) {
        answers.push(match on_exists(exists) {
            OnExists::AskShutdown => {
                existing.push((node, materialized.clone()));
                Answer::Exists
            }
            OnExists::Gone => Answer::Gone,
            OnExists::Unknown(error) => {
                failures += 1;
                tracing::warn!(node = node.name(), %error, "cannot tell whether the instance exists");
                Answer::Unknown
            }
        });
    }
    let keyed: Vec<(&str, Answer)> = nodes.iter().map(|n| n.uid()).zip(answers).collect();
    let round = Round {
        at,
        answers: &keyed,
        cross_checked: ready_answers.iter().filter(|a| a.is_ok()).count(),
        cross_checked_gone: ready_answers.iter().filter(|a| matches!(a, Ok(false))).count(),
    };
    let settings = controller.settings();
    let decision =
        memory
            .lock()
            .gone_since
            .decide(&settings.node_deletion, settings.node_monitor_period, &round);
    failures += on_gone(controller, api, &nodes, &keyed, decision, memory).await;
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

/// Carries out the round's [`Decision`] about the not-ready `nodes` answered "gone" (`answers`, in their
/// order): reports a held round (a log line, the breaker's counter, Warning Events on some of the nodes),
/// deletes the confirmed ones; the number of deletions that failed.
async fn on_gone(
    controller: &ControllerContext,
    api: &Api<Written<Node>>,
    nodes: &[Arc<CachedNode>],
    answers: &[(&str, Answer)],
    decision: Decision,
    memory: &Mutex<Memory>,
) -> usize {
    if let Some(held) = &decision.held {
        controller.metrics.node_deletion_breaker_trips.inc();
        tracing::warn!(%held, "holding node deletions: the cloud's answers look wrong (a wrong region or account in the cloud-config, or an outage); --node-deletion-breaker-ratio sets the limit");
        let gone = nodes
            .iter()
            .zip(answers)
            .filter(|(_, (_, answer))| *answer == Answer::Gone);
        for (node, _) in gone.take(HELD_EVENTS) {
            controller
                .event(
                    &event_reference(node.as_ref()),
                    EventType::Warning,
                    "NodeDeletionHeld",
                    "DeleteNode",
                    format!("Not deleting node {}: {held}", node.name()),
                )
                .await;
        }
    } else if decision.waiting > 0 {
        tracing::info!(
            waiting = decision.waiting,
            "nodes whose instances the cloud says are gone wait for the answer to be confirmed, or for room in a round"
        );
    }
    let mut failures = 0;
    for i in decision.delete {
        let node = &nodes[i];
        if delete(controller, api, node).await {
            memory.lock().gone_since.forget(node.uid());
            controller.metrics.nodes_deleted.inc();
        } else {
            failures += 1;
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
    // Periodic work: it waits behind initialisation and reconciling in the cloud budget.
    let cx = controller.call_context_at(Priority::Refresh);
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
