//! The three things a sync does — clean up, update hosts, ensure — and the clean-up of a load balancer
//! whose service is gone or was replaced.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::runner::Action;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, Patch};
use kube::runtime::events::EventType;
use kube_ccm_provider::names::{ANNOTATION_LOAD_BALANCER_CLASS, FINALIZER_LOAD_BALANCER_CLEANUP};
use kube_ccm_provider::service::{
    IpFamilyPolicy, annotation, ip_families, ip_family_policy, load_balancer_class,
};
use kube_ccm_provider::{CloudError, LoadBalancer};
use serde_json::json;

use super::ip_mode;
use super::node_set::NodeSet;
use super::{ServiceContext, Synced, has_finalizer, ingress_of};
use crate::context::event_reference;

/// Why a sync failed; the text is what upstream's `SyncLoadBalancerFailed` Event says after
/// "Error syncing load balancer: ".
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServiceError {
    #[error("failed to check if load balancer exists before cleanup: {0}")]
    CheckBeforeCleanup(#[source] CloudError),
    #[error("failed to delete load balancer: {0}")]
    Delete(#[source] CloudError),
    #[error("failed to ensure load balancer: {0}")]
    Ensure(#[source] CloudError),
    #[error("failed to add load balancer cleanup finalizer: {0}")]
    AddFinalizer(#[source] kube::Error),
    #[error("failed to remove load balancer cleanup finalizer: {0}")]
    RemoveFinalizer(#[source] kube::Error),
    #[error("failed to update load balancer status: {0}")]
    Status(#[source] kube::Error),
    /// Reported with its own `UpdateLoadBalancerFailed` Event.
    #[error("failed to update load balancer hosts: {0}")]
    UpdateHosts(#[source] CloudError),
    /// The load balancer of a deleted or replaced service; reported as `DeleteLoadBalancerFailed`.
    #[error("failed to delete the load balancer of a deleted or replaced service: {0}")]
    Orphan(#[source] CloudError),
}

impl ServiceError {
    /// When the cloud asked to be called again after a given time.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            ServiceError::CheckBeforeCleanup(error)
            | ServiceError::Delete(error)
            | ServiceError::Ensure(error)
            | ServiceError::UpdateHosts(error)
            | ServiceError::Orphan(error) => error.retry_after(),
            _ => None,
        }
    }

    /// Whether a `SyncLoadBalancerFailed` Event reports it (the others have their own).
    pub(crate) fn is_sync_failure(&self) -> bool {
        !matches!(self, ServiceError::UpdateHosts(_) | ServiceError::Orphan(_))
    }
}

/// One service's API handle, name, key and the cluster name: what every step uses.
pub(super) struct Target<'a> {
    pub(super) context: &'a ServiceContext,
    pub(super) load_balancers: &'a dyn LoadBalancer,
    pub(super) api: Api<Service>,
    pub(super) name: String,
    pub(super) key: String,
    pub(super) cluster: &'a str,
}

impl Target<'_> {
    pub(super) async fn event(
        &self,
        service: &Service,
        kind: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.context
            .controller
            .event(&event_reference(service), kind, reason, action, note)
            .await;
    }

    /// Writes `status.loadBalancer`; the service as stored, or `None` when it is already gone (fine).
    async fn set_status(&self, status: serde_json::Value) -> Result<Option<Service>, ServiceError> {
        let patch = json!({"status": {"loadBalancer": status}});
        match self
            .api
            .patch_status(&self.name, &crate::written::patch_params(), &Patch::Merge(patch))
            .await
        {
            Ok(stored) => Ok(Some(stored)),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(error) => Err(ServiceError::Status(error)),
        }
    }

    /// Adds our finalizer, conditional on the version read. Through the status subresource, as upstream's
    /// `PatchService` (a status write keeps the spec but takes metadata), so the bootstrap role
    /// `system:controller:service-controller`, which grants `services/status` but not `services` patch,
    /// is enough.
    /// With it, the service's class is recorded ([`ANNOTATION_LOAD_BALANCER_CLASS`]), or a recorded one
    /// removed; a service with our finalizer whose record differs from its class has it put right.
    pub(super) async fn add_finalizer(&self, service: Arc<Service>) -> Result<Arc<Service>, ServiceError> {
        let class = load_balancer_class(&service);
        let recorded = annotation(&service, ANNOTATION_LOAD_BALANCER_CLASS);
        if has_finalizer(&service) && recorded == class {
            return Ok(service);
        }
        let mut finalizers = service.metadata.finalizers.clone().unwrap_or_default();
        if !has_finalizer(&service) {
            finalizers.push(FINALIZER_LOAD_BALANCER_CLEANUP.to_owned());
        }
        let mut patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": service.metadata.resource_version}});
        if recorded != class {
            let mut annotations = serde_json::Map::new();
            annotations.insert(ANNOTATION_LOAD_BALANCER_CLASS.to_owned(), json!(class));
            patch["metadata"]["annotations"] = serde_json::Value::Object(annotations);
        }
        self.api
            .patch_status(&self.name, &crate::written::patch_params(), &Patch::Merge(patch))
            .await
            .map(Arc::new)
            .map_err(ServiceError::AddFinalizer)
    }

    /// Removes our finalizer only: the patch fails if the list changed at that position. Through the status
    /// subresource, as [`Self::add_finalizer`].
    async fn remove_finalizer(&self, service: &Service) -> Result<(), ServiceError> {
        let finalizers = service.metadata.finalizers.clone().unwrap_or_default();
        let Some(index) = finalizers
            .iter()
            .position(|f| f == FINALIZER_LOAD_BALANCER_CLEANUP)
        else {
            return Ok(());
        };
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": FINALIZER_LOAD_BALANCER_CLEANUP},
            {"op": "remove", "path": format!("/metadata/finalizers/{index}")},
        ]))
        .expect("a valid JSON patch");
        match self
            .api
            .patch_status(
                &self.name,
                &crate::written::patch_params(),
                &Patch::<()>::Json(patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(ServiceError::RemoveFinalizer(error)),
        }
    }
}

/// The service no longer wants a load balancer (deleted, or no longer of type LoadBalancer): as upstream,
/// ask the cloud whether one exists; delete it if so; then clear the status and remove the finalizer.
pub(super) async fn clean_up(target: &Target<'_>, service: &Service) -> Result<Action, ServiceError> {
    let controller = &target.context.controller;
    let cx = controller.call_context();
    let exists = cx
        .call(
            "get_load_balancer",
            target
                .load_balancers
                .get_load_balancer(&cx, target.cluster, service),
        )
        .await
        .map_err(ServiceError::CheckBeforeCleanup)?
        .is_some();
    if exists {
        target
            .event(
                service,
                EventType::Normal,
                "DeletingLoadBalancer",
                "DeleteLoadBalancer",
                "Deleting load balancer".to_owned(),
            )
            .await;
        let cx = controller.call_context();
        match cx
            .call(
                "ensure_load_balancer_deleted",
                target
                    .load_balancers
                    .ensure_load_balancer_deleted(&cx, target.cluster, service),
            )
            .await
        {
            Ok(()) | Err(CloudError::ImplementedElsewhere) => {}
            Err(error) => return Err(ServiceError::Delete(error)),
        }
    }
    let mut versions: Vec<String> = service.metadata.resource_version.iter().cloned().collect();
    if ingress_of(service).is_some() {
        let cleared = target.set_status(json!({"ingress": null})).await?;
        versions.extend(cleared.and_then(|s| s.metadata.resource_version));
    }
    target.remove_finalizer(service).await?;
    target.context.forget(&target.key);
    // The cache may still show those versions, our finalizer in them: not a clean-up to do again.
    target.context.cleaned_over(&target.key, versions);
    target
        .event(
            service,
            EventType::Normal,
            "DeletedLoadBalancer",
            "DeleteLoadBalancer",
            "Deleted load balancer".to_owned(),
        )
        .await;
    Ok(Action::await_change())
}

/// Upstream's Event text for a failed hosts update: at most 20 node names, then the count.
fn hosts_failure_note(nodes: &[Arc<Node>], error: &CloudError) -> String {
    let names: Vec<&str> = nodes
        .iter()
        .map(|n| n.metadata.name.as_deref().unwrap_or_default())
        .collect();
    let shown = if names.len() > 20 {
        format!("[{} <{} more>]", names[..20].join(" "), names.len() - 20)
    } else {
        format!("[{}]", names.join(" "))
    };
    format!(
        "Error updating load balancer with new hosts {shown} [node names limited, total number of nodes: {}], error: {error}",
        names.len()
    )
}

/// Only the node set changed: point the load balancer at the new one. When that fails and the load
/// balancer turns out to be gone, there is nothing to update (as upstream); otherwise the next attempt is a
/// full ensure.
pub(super) async fn update_hosts(
    target: &Target<'_>,
    service: &Service,
    set: &NodeSet,
    current: Synced,
) -> Result<Action, ServiceError> {
    let context = target.context;
    let metrics = &context.controller.metrics;
    let nodes = context.materialize(set);
    metrics.load_balancer_syncs.inc();
    let started = Instant::now();
    let cx = context.controller.call_context();
    let outcome = cx
        .call(
            "update_load_balancer",
            target
                .load_balancers
                .update_load_balancer(&cx, target.cluster, service, &nodes),
        )
        .await;
    metrics
        .update_load_balancer_host_latency
        .observe(started.elapsed().as_secs_f64());
    let result = match outcome {
        Ok(()) => {
            let (kind, reason, note) = if nodes.is_empty() {
                (
                    EventType::Warning,
                    "UnAvailableLoadBalancer",
                    "There are no available nodes for LoadBalancer",
                )
            } else {
                (
                    EventType::Normal,
                    "UpdatedLoadBalancer",
                    "Updated load balancer with new hosts",
                )
            };
            target
                .event(service, kind, reason, "UpdateLoadBalancer", note.to_owned())
                .await;
            context.synced().insert(target.key.clone(), current);
            Ok(Action::await_change())
        }
        Err(CloudError::ImplementedElsewhere) => {
            context.synced().insert(target.key.clone(), current);
            Ok(Action::await_change())
        }
        Err(error) => {
            let cx = context.controller.call_context();
            match cx
                .call(
                    "get_load_balancer",
                    target
                        .load_balancers
                        .get_load_balancer(&cx, target.cluster, service),
                )
                .await
            {
                Ok(None) => {
                    tracing::info!(service = %target.key, "the load balancer to update is gone; nothing to update");
                    context.synced().insert(target.key.clone(), current);
                    Ok(Action::await_change())
                }
                check => {
                    if let Err(check) = check {
                        tracing::warn!(service = %target.key, %check, "cannot tell whether the load balancer still exists");
                    }
                    target
                        .event(
                            service,
                            EventType::Warning,
                            "UpdateLoadBalancerFailed",
                            "UpdateLoadBalancer",
                            hosts_failure_note(&nodes, &error),
                        )
                        .await;
                    // The retry ensures the whole load balancer, as upstream's.
                    context.synced().remove(&target.key);
                    metrics.nodesync_errors.inc();
                    Err(ServiceError::UpdateHosts(error))
                }
            }
        }
    };
    context.node_sync_done(&target.key);
    result
}

/// The Event `IPFamiliesNotServed` when the provider's load balancer cannot serve every family the service
/// asks for: a Warning, unless the service only prefers dual stack.
async fn report_unserved_families(target: &Target<'_>, service: &Service) {
    let Err(why) = target.load_balancers.check_ip_families(service) else {
        return;
    };
    let kind = match ip_family_policy(service) {
        IpFamilyPolicy::PreferDualStack => EventType::Normal,
        IpFamilyPolicy::SingleStack | IpFamilyPolicy::RequireDualStack => EventType::Warning,
    };
    let families: Vec<String> = ip_families(service).iter().map(ToString::to_string).collect();
    let note = format!(
        "The load balancer does not serve every IP family of the service ({}): {why}",
        families.join(", ")
    );
    target
        .event(service, kind, "IPFamiliesNotServed", "EnsureLoadBalancer", note)
        .await;
}

/// Create or update the load balancer for the service's spec and the node set, then publish its ingress.
pub(super) async fn ensure(
    target: &Target<'_>,
    service: Arc<Service>,
    set: &NodeSet,
    current: Synced,
) -> Result<Action, ServiceError> {
    let context = target.context;
    target
        .event(
            &service,
            EventType::Normal,
            "EnsuringLoadBalancer",
            "EnsureLoadBalancer",
            "Ensuring load balancer".to_owned(),
        )
        .await;
    // The finalizer goes on before anything exists in the cloud.
    let read = service.metadata.resource_version.clone();
    let service = target.add_finalizer(service).await?;
    let nodes = context.materialize(set);
    if nodes.is_empty() {
        target
            .event(
                &service,
                EventType::Warning,
                "UnAvailableLoadBalancer",
                "EnsureLoadBalancer",
                "There are no available nodes for LoadBalancer".to_owned(),
            )
            .await;
    }
    let cx = context.controller.call_context();
    let status = match cx
        .call(
            "ensure_load_balancer",
            target
                .load_balancers
                .ensure_load_balancer(&cx, target.cluster, &service, &nodes),
        )
        .await
    {
        Ok(status) => status,
        Err(CloudError::ImplementedElsewhere) => {
            context.remember(&target.key, &service, current);
            return Ok(Action::await_change());
        }
        Err(error) => return Err(ServiceError::Ensure(error)),
    };
    context.remember(&target.key, &service, current);
    // After the ensure: a load balancer another controller serves (`ImplementedElsewhere`) is not judged.
    report_unserved_families(target, &service).await;
    target
        .event(
            &service,
            EventType::Normal,
            "EnsuredLoadBalancer",
            "EnsureLoadBalancer",
            "Ensured load balancer".to_owned(),
        )
        .await;
    // As the API server keeps it (an address without a mode is a VIP), so that a status it defaulted is
    // not written again.
    let stored = context.ip_modes.as_stored(&status);
    if service.status.as_ref().and_then(|s| s.load_balancer.as_ref()) != Some(&stored) {
        let answer = target.set_status(json!(stored)).await?;
        if let Some(answer) = answer.and_then(|s| s.status?.load_balancer) {
            context.ip_modes.learn(&stored, &answer);
        }
        // The versions this sync read and wrote before the status: a sync that meets one of them next
        // (its change is still queued) would ensure again for nothing.
        let versions = [read, service.metadata.resource_version.clone()];
        context.published(&target.key, versions.into_iter().flatten().collect());
    }
    if context.ip_modes.dropped() && ip_mode::wants_proxy(&status) {
        let note = "The API server does not store status.loadBalancer.ingress[].ipMode (Kubernetes 1.30 and \
                    later do): kube-proxy will send in-cluster traffic for this Proxy load balancer's address \
                    straight to the endpoints";
        target
            .event(
                &service,
                EventType::Warning,
                "LoadBalancerIPModeUnsupported",
                "EnsureLoadBalancer",
                note.to_owned(),
            )
            .await;
    }
    Ok(Action::await_change())
}

/// Deletes the load balancer of `gone` — a service deleted without our finalizer, or replaced by one of
/// the same name with another UID — as upstream's `processLoadBalancerDelete`.
pub(super) async fn delete_orphan(
    context: &ServiceContext,
    load_balancers: &dyn LoadBalancer,
    gone: &Service,
) -> Result<(), ServiceError> {
    let controller = &context.controller;
    let reference = event_reference(gone);
    let cluster = &controller.settings().cluster_name;
    controller
        .event(
            &reference,
            EventType::Normal,
            "DeletingLoadBalancer",
            "DeleteLoadBalancer",
            "Deleting load balancer".to_owned(),
        )
        .await;
    let cx = controller.call_context();
    match cx
        .call(
            "ensure_load_balancer_deleted",
            load_balancers.ensure_load_balancer_deleted(&cx, cluster, gone),
        )
        .await
    {
        Ok(()) | Err(CloudError::ImplementedElsewhere) => {
            controller
                .event(
                    &reference,
                    EventType::Normal,
                    "DeletedLoadBalancer",
                    "DeleteLoadBalancer",
                    "Deleted load balancer".to_owned(),
                )
                .await;
            Ok(())
        }
        Err(error) => {
            controller
                .event(
                    &reference,
                    EventType::Warning,
                    "DeleteLoadBalancerFailed",
                    "DeleteLoadBalancer",
                    format!("Error deleting load balancer: {error}"),
                )
                .await;
            Err(ServiceError::Orphan(error))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_failure_names_at_most_twenty_nodes() {
        let nodes: Vec<Arc<Node>> = (0..22)
            .map(|i| {
                Arc::new(serde_json::from_value(json!({"metadata": {"name": format!("n{i}")}})).unwrap())
            })
            .collect();
        let note = hosts_failure_note(&nodes, &CloudError::provider("boom"));
        assert!(
            note.starts_with("Error updating load balancer with new hosts [n0 n1 n2"),
            "{note}"
        );
        assert!(
            note.ends_with("n19 <2 more>] [node names limited, total number of nodes: 22], error: boom"),
            "{note}"
        );
        let few = hosts_failure_note(&nodes[..2], &CloudError::provider("boom"));
        assert_eq!(
            few,
            "Error updating load balancer with new hosts [n0 n1] [node names limited, total number of nodes: 2], error: boom"
        );
    }
}
