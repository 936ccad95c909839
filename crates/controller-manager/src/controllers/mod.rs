//! The cloud controllers, each registered under its typed name.
//!
//! A controller is either started or *skipped with a reason* (its capability is missing, or a setting
//! turns it off): [`skip_reason`] decides before anything starts, so `leader-migration plan` can show it.

mod node;
mod node_addresses;
mod node_lifecycle;
mod route;
mod service;

use std::sync::Arc;
use std::time::Duration;

use cloud_provider::CloudProvider;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Taint};
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use leadermigration::CloudController;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::ControllerSettings;
use crate::informers::Informers;
use crate::metrics::Metrics;

/// What a running controller gets.
#[derive(Clone)]
pub(crate) struct ControllerContext {
    pub(crate) controller: CloudController,
    /// The controller's own client (its `User-Agent`, rate limit, and fence).
    pub(crate) client: kube::Client,
    pub(crate) provider: Arc<dyn CloudProvider>,
    pub(crate) informers: Arc<Informers>,
    pub(crate) settings: Arc<ControllerSettings>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) recorder: Arc<Recorder>,
    /// Fires when the controller must stop.
    pub(crate) stop: CancellationToken,
    /// Set once the controller's caches are synced and it is working (readiness).
    pub(crate) started: Arc<watch::Sender<bool>>,
}

impl ControllerContext {
    /// Publishes an Event about `object` (errors are logged: an event is never worth failing a sync).
    pub(crate) async fn event(
        &self,
        reference: &ObjectReference,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, reference).await {
            tracing::debug!(controller = self.controller.as_str(), %error, reason, "cannot publish event");
        }
    }
}

/// The recorder of one controller: events name it and this process.
pub(crate) fn recorder(client: kube::Client, controller: CloudController, identity: &str) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: controller.as_str().to_owned(),
            instance: Some(identity.to_owned()),
        },
    )
}

/// Why a controller will not run with this provider and these settings; `None` when it can.
pub(crate) fn skip_reason(
    controller: CloudController,
    provider: &dyn CloudProvider,
    settings: &ControllerSettings,
) -> Option<String> {
    match controller {
        CloudController::CloudNode | CloudController::CloudNodeLifecycle => provider
            .instances_v2()
            .is_none()
            .then(|| "the cloud provider does not support instances".to_owned()),
        CloudController::ServiceLb => provider
            .load_balancer()
            .is_none()
            .then(|| "the cloud provider does not support load balancers".to_owned()),
        CloudController::NodeRoute => {
            if !settings.configure_cloud_routes {
                Some("--configure-cloud-routes is false".to_owned())
            } else if provider.routes().is_none() {
                Some("the cloud provider does not support routes".to_owned())
            } else if settings.cluster_cidrs.is_empty() {
                // Upstream exits at start-up here; skipping keeps the other controllers running.
                Some("--cluster-cidr is not set (routes are configured for pod CIDRs inside it)".to_owned())
            } else {
                None
            }
        }
        CloudController::NodeIpam => {
            Some("node IPAM is provider specific and no provider of this binary implements it".to_owned())
        }
    }
}

/// Runs a controller until its context's `stop` fires.
pub(crate) async fn run(context: ControllerContext) {
    match context.controller {
        CloudController::CloudNode => node::run(context).await,
        CloudController::CloudNodeLifecycle => node_lifecycle::run(context).await,
        CloudController::ServiceLb => service::run(context).await,
        CloudController::NodeRoute => route::run(context).await,
        CloudController::NodeIpam => {}
    }
}

/// Waits for `duration` or until `stop`; false when stopped.
pub(crate) async fn pause(stop: &CancellationToken, duration: Duration) -> bool {
    tokio::select! {
        () = stop.cancelled() => false,
        () = tokio::time::sleep(duration) => true,
    }
}

/// Whether the node has a taint with this key.
pub(crate) fn has_taint(node: &Node, key: &str) -> bool {
    taints(node).iter().any(|t| t.key == key)
}

/// The node's taints.
pub(crate) fn taints(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

/// An object reference for events: without the resourceVersion, so that an event repeated about a node
/// or service that changed in between is one event with a series (patched), as client-go's correlator
/// makes it, not a new event per version.
pub(crate) fn reference<K: Resource<DynamicType = ()>>(object: &K) -> ObjectReference {
    ObjectReference {
        resource_version: None,
        ..object.object_ref(&())
    }
}

/// Seconds since the object was created (for upstream's delay histograms).
pub(crate) fn age_seconds<K: Resource>(object: &K) -> Option<f64> {
    let created = object.meta().creation_timestamp.as_ref()?.0;
    let age = jiff::Timestamp::now().duration_since(created);
    Some(age.as_secs_f64().max(0.0))
}
