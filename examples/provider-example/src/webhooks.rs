//! The provider's admission webhook: the API server asks it before a Service is stored, and it refuses
//! what the example cloud cannot make, so a mistake is an error at `kubectl apply`, not an Event later.
//! Served with `--feature-gates=CloudControllerManagerWebhook=true --webhooks=*`.

use kube_ccm::kube::core::DynamicObject;
use kube_ccm::kube::core::admission::{AdmissionRequest, AdmissionResponse};
use kube_ccm::runtime::webhooks::{WebhookContext, WebhookDefinition};

/// The load balancer's size.
pub const SIZE_ANNOTATION: &str = "example.com/load-balancer-size";
/// What the example cloud sells.
pub const SIZES: [&str; 3] = ["small", "medium", "large"];
/// The zone the load balancer is to be in: one with nodes.
pub const ZONE_ANNOTATION: &str = "example.com/load-balancer-zone";

// ANCHOR: webhook
/// `service-annotations` at `/validate-service`: a Service's load-balancer size must be one the cloud
/// sells, and its zone one where the cluster has nodes; anything else is let through.
pub fn definition() -> WebhookDefinition {
    WebhookDefinition::new("service-annotations", "/validate-service", review)
}

async fn review(
    context: WebhookContext,
    request: AdmissionRequest<DynamicObject>,
) -> Result<AdmissionResponse, String> {
    let annotations = request
        .object
        .as_ref()
        .and_then(|service| service.metadata.annotations.clone())
        .unwrap_or_default();
    if let Some(size) = annotations.get(SIZE_ANNOTATION)
        && !SIZES.contains(&size.as_str())
    {
        return Ok(AdmissionResponse::from(&request).deny(format!(
            "{SIZE_ANNOTATION}: {size:?} is not a size the example cloud sells ({})",
            SIZES.join(", ")
        )));
    }
    if let Some(zone) = annotations.get(ZONE_ANNOTATION) {
        // The manager's node cache (shared with its controllers): no watch of the webhook's own.
        let caches = context.caches;
        tokio::time::timeout(std::time::Duration::from_secs(5), caches.nodes_synced())
            .await
            .map_err(|_| "the node cache is not synced yet".to_owned())?;
        let in_zone = caches.nodes().iter().any(|node| {
            node.metadata
                .labels
                .as_ref()
                .and_then(|labels| labels.get("topology.kubernetes.io/zone"))
                == Some(zone)
        });
        if !in_zone {
            return Ok(AdmissionResponse::from(&request).deny(format!(
                "{ZONE_ANNOTATION}: no node of the cluster is in zone {zone:?}"
            )));
        }
    }
    Ok(AdmissionResponse::from(&request))
}
// ANCHOR_END: webhook
