//! `cloud-node-lifecycle-controller`: what happens to nodes whose instances stop or disappear.
//!
//! Every `--node-monitor-period` (upstream: 5 s), for each node:
//! - Ready: the shutdown taint is removed if present.
//! - Not ready (False, Unknown or missing): if its instance no longer exists, the Node is deleted (Event
//!   `DeletingNode`); if it exists and is shut down, the shutdown taint is added.
//!
//! Cloud look-ups for all not-ready nodes of a round are one batch call each (exists, then shutdown).

use std::sync::Arc;
use std::time::Instant;

use cloud_provider::CloudError;
use cloud_provider::names::TAINT_SHUTDOWN;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::json;

use super::{ControllerContext, has_taint, pause, reference, taints};
use crate::cached_node::CachedNode;

pub(super) async fn run(controller: ControllerContext) {
    let informer = controller.informers.nodes();
    tokio::select! {
        () = controller.stop.cancelled() => return,
        () = informer.ready() => {}
    }
    controller.started.send_replace(true);
    let api: Api<Node> = Api::all(controller.client.clone());
    loop {
        let started = Instant::now();
        let result = monitor(&controller, &api).await;
        controller.metrics.reconciled(
            controller.controller.as_str(),
            result.is_ok(),
            started.elapsed().as_secs_f64(),
        );
        if let Err(error) = result {
            tracing::warn!(%error, "cannot check nodes against the cloud");
        }
        if !pause(&controller.stop, controller.settings.node_monitor_period).await {
            return;
        }
    }
}

async fn monitor(controller: &ControllerContext, api: &Api<Node>) -> Result<(), CloudError> {
    let Some(instances) = controller.provider.instances_v2() else {
        return Ok(());
    };
    let nodes = controller.informers.nodes().store().state();
    let (ready, not_ready): (Vec<Arc<CachedNode>>, Vec<Arc<CachedNode>>) =
        nodes.into_iter().partition(|n| n.is_ready());

    for node in ready.iter().filter(|n| n.has_taint(TAINT_SHUTDOWN)) {
        set_shutdown_taint(api, &Arc::new(node.to_node()), false).await;
    }
    // Only the few NotReady nodes are materialised for the provider.
    let not_ready: Vec<Arc<Node>> = not_ready.iter().map(|n| Arc::new(n.to_node())).collect();
    if not_ready.is_empty() {
        return Ok(());
    }

    let started = Instant::now();
    let exists = instances.instance_exists_batch(&not_ready).await;
    controller
        .metrics
        .cloud_call("instance_exists_batch", true, started.elapsed().as_secs_f64());
    let mut existing = Vec::new();
    for (node, exists) in not_ready.into_iter().zip(exists) {
        match exists {
            Ok(true) => existing.push(node),
            Ok(false) | Err(CloudError::InstanceNotFound) => delete(controller, api, &node).await,
            Err(error) => {
                tracing::warn!(node = node.metadata.name.as_deref().unwrap_or_default(), %error, "cannot tell whether the instance exists")
            }
        }
    }
    if existing.is_empty() {
        return Ok(());
    }
    let started = Instant::now();
    let shutdown = instances.instance_shutdown_batch(&existing).await;
    controller
        .metrics
        .cloud_call("instance_shutdown_batch", true, started.elapsed().as_secs_f64());
    for (node, shutdown) in existing.iter().zip(shutdown) {
        match shutdown {
            Ok(true) if !has_taint(node, TAINT_SHUTDOWN) => set_shutdown_taint(api, node, true).await,
            // As upstream, NotImplemented and InstanceNotFound mean "not shut down".
            Ok(_) | Err(CloudError::NotImplemented | CloudError::InstanceNotFound) => {}
            Err(error) => {
                tracing::warn!(node = node.metadata.name.as_deref().unwrap_or_default(), %error, "cannot tell whether the instance is shut down")
            }
        }
    }
    Ok(())
}

async fn delete(controller: &ControllerContext, api: &Api<Node>, node: &Arc<Node>) {
    let name = node.metadata.name.clone().unwrap_or_default();
    controller
        .event(
            &reference(node.as_ref()),
            false,
            "DeletingNode",
            "DeleteNode",
            format!("Deleting node {name} because it does not exist in the cloud provider"),
        )
        .await;
    // Only this node, not a newer one of the same name.
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: node.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&name, &params).await {
        Ok(_) => tracing::info!(node = %name, "deleted node: its instance is gone"),
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(error) => {
            controller
                .event(
                    &reference(node.as_ref()),
                    true,
                    "DeletingNodeFailed",
                    "DeleteNode",
                    format!("Error deleting node {name}: {error}"),
                )
                .await;
        }
    }
}

/// Adds or removes the shutdown taint, conditional on the cached version (taints are a whole-list field).
async fn set_shutdown_taint(api: &Api<Node>, node: &Arc<Node>, present: bool) {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut list: Vec<Taint> = taints(node)
        .into_iter()
        .filter(|t| t.key != TAINT_SHUTDOWN)
        .collect();
    if present {
        list.push(Taint {
            key: TAINT_SHUTDOWN.to_owned(),
            effect: "NoSchedule".to_owned(),
            ..Taint::default()
        });
    }
    let patch =
        json!({"metadata": {"resourceVersion": node.metadata.resource_version}, "spec": {"taints": list}});
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => tracing::info!(node = %name, shut_down = present, "updated the shutdown taint"),
        // Changed meanwhile: the next round sees the new version.
        Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {}
        Err(error) => tracing::warn!(node = %name, %error, "cannot update the shutdown taint"),
    }
}
