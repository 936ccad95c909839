//! Instances: what the node controllers ask the cloud.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeAddress};

use crate::names::{
    LABEL_INSTANCE_TYPE, LABEL_INSTANCE_TYPE_BETA, LABEL_REGION, LABEL_REGION_BETA, LABEL_ZONE,
    LABEL_ZONE_BETA,
};
use crate::{CallContext, CloudError};

/// What the cloud says about a node's instance.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InstanceMetadata {
    /// `<provider>://<instance>`; empty when the provider cannot tell (the node's own is then kept, and a node
    /// without one stays tainted).
    pub provider_id: String,
    /// Instance type, e.g. `m5.large`.
    pub instance_type: String,
    /// Addresses (`InternalIP`, `ExternalIP`, `Hostname`, `InternalDNS`, `ExternalDNS`).
    pub node_addresses: Vec<NodeAddress>,
    /// Zone.
    pub zone: String,
    /// Region.
    pub region: String,
    /// More labels; keys under `kubernetes.io/` or `k8s.io/` are dropped, existing labels are not
    /// overwritten.
    pub additional_labels: BTreeMap<String, String>,
}

impl InstanceMetadata {
    /// The labels a node's initialisation sets from this metadata, given the node's current labels
    /// (`current(key)`): each well-known pair (beta and GA instance type, zone, region) where the node
    /// differs, and the additional labels the node lacks, except those under kubernetes.io or k8s.io.
    pub fn initial_labels<'a>(&self, current: impl Fn(&str) -> Option<&'a str>) -> BTreeMap<String, String> {
        let mut set = BTreeMap::new();
        for (value, keys) in [
            (
                &self.instance_type,
                [LABEL_INSTANCE_TYPE_BETA, LABEL_INSTANCE_TYPE],
            ),
            (&self.zone, [LABEL_ZONE_BETA, LABEL_ZONE]),
            (&self.region, [LABEL_REGION_BETA, LABEL_REGION]),
        ] {
            for key in keys.into_iter().filter(|_| !value.is_empty()) {
                if current(key) != Some(value.as_str()) {
                    set.insert(key.to_owned(), value.clone());
                }
            }
        }
        for (key, value) in &self.additional_labels {
            if !reserved(key) && current(key).is_none() {
                set.insert(key.clone(), value.clone());
            }
        }
        set
    }
}

/// Upstream's rule for additional labels: nothing under kubernetes.io or k8s.io.
fn reserved(key: &str) -> bool {
    let domain = key.split_once('/').map_or("", |(prefix, _)| prefix);
    ["kubernetes.io", "k8s.io"]
        .iter()
        .any(|reserved| domain == *reserved || domain.ends_with(&format!(".{reserved}")))
}

/// How many single look-ups the default batch forms of [`InstancesV2`] run at once: a batch may hold a
/// thousand nodes (the address refresh), which a cloud should not get as a thousand requests at once.
pub const DEFAULT_BATCH_CONCURRENCY: usize = 64;

/// `calls`' outputs in order, at most [`DEFAULT_BATCH_CONCURRENCY`] of them running at once. The calls come
/// made, as futures: a stream mapping borrowed nodes through a closure would defeat the `Send` check of
/// the trait's boxed futures.
async fn in_turns<F: Future>(calls: Vec<F>) -> Vec<F::Output> {
    futures::stream::iter(calls)
        .buffered(DEFAULT_BATCH_CONCURRENCY)
        .collect()
        .await
}

/// Instance look-ups by node (upstream's `InstancesV2`). Implementations should use `spec.providerID` when
/// the node has one and fall back to the node's name, labels and annotations (`status.nodeInfo.systemUUID`
/// is there too).
///
/// The `*_batch` methods answer many nodes at once; their defaults call the single forms,
/// [`DEFAULT_BATCH_CONCURRENCY`] at a time.
/// Override them when the cloud has a batch API: the controllers always call the batch forms.
///
/// Errors: a look-up that cannot answer returns an error and the node is left as it is (retried later);
/// in particular `instance_exists` answers `Ok(false)` for a gone instance, and an error (even
/// `InstanceNotFound`) never gets a node deleted, as upstream. A provider with nothing to say about a node
/// yet returns an error to be asked again.
#[async_trait]
pub trait InstancesV2: Send + Sync {
    /// Whether the instance exists. `false` gets the node deleted; stopped instances exist.
    async fn instance_exists(&self, cx: &CallContext, node: &Node) -> Result<bool, CloudError>;

    /// Whether the instance is shut down (it keeps its node, with the shutdown taint).
    async fn instance_shutdown(&self, cx: &CallContext, node: &Node) -> Result<bool, CloudError>;

    /// Everything the cloud-node controller needs to initialise the node.
    async fn instance_metadata(&self, cx: &CallContext, node: &Node) -> Result<InstanceMetadata, CloudError>;

    /// [`InstancesV2::instance_exists`] for many nodes; one result per node, in order (the
    /// default: [`DEFAULT_BATCH_CONCURRENCY`] single look-ups at a time).
    async fn instance_exists_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<bool, CloudError>> {
        in_turns(nodes.iter().map(|node| self.instance_exists(cx, node)).collect()).await
    }

    /// [`InstancesV2::instance_shutdown`] for many nodes; one result per node, in order (the
    /// default: [`DEFAULT_BATCH_CONCURRENCY`] single look-ups at a time).
    async fn instance_shutdown_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<bool, CloudError>> {
        in_turns(
            nodes
                .iter()
                .map(|node| self.instance_shutdown(cx, node))
                .collect(),
        )
        .await
    }

    /// [`InstancesV2::instance_metadata`] for many nodes; one result per node, in order (the
    /// default: [`DEFAULT_BATCH_CONCURRENCY`] single look-ups at a time).
    async fn instance_metadata_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<InstanceMetadata, CloudError>> {
        in_turns(
            nodes
                .iter()
                .map(|node| self.instance_metadata(cx, node))
                .collect(),
        )
        .await
    }
}

/// Instance look-ups by name or provider ID (upstream's older `Instances`), for providers ported from it.
/// The framework uses [`InstancesV2`] when a provider has it; otherwise it answers the node controllers from
/// these methods (with [`crate::Zones`] for zones), exactly as upstream's node controllers do.
#[async_trait]
pub trait Instances: Send + Sync {
    /// The addresses of the instance called `node_name`.
    async fn node_addresses(&self, cx: &CallContext, node_name: &str)
    -> Result<Vec<NodeAddress>, CloudError>;

    /// The addresses of the instance with this provider ID (possibly empty: then `node_addresses` is tried).
    async fn node_addresses_by_provider_id(
        &self,
        cx: &CallContext,
        provider_id: &str,
    ) -> Result<Vec<NodeAddress>, CloudError>;

    /// The cloud's ID of the instance called `node_name` (without the `<provider>://` scheme).
    /// `InstanceNotFound` means the instance is gone; `NotImplemented` that the provider cannot tell (the node
    /// is then initialised by name, without a provider ID).
    async fn instance_id(&self, cx: &CallContext, node_name: &str) -> Result<String, CloudError>;

    /// The type of the instance called `node_name`.
    async fn instance_type(&self, cx: &CallContext, node_name: &str) -> Result<String, CloudError>;

    /// The type of the instance with this provider ID.
    async fn instance_type_by_provider_id(
        &self,
        cx: &CallContext,
        provider_id: &str,
    ) -> Result<String, CloudError>;

    /// Whether the instance with this provider ID exists.
    async fn instance_exists_by_provider_id(
        &self,
        cx: &CallContext,
        provider_id: &str,
    ) -> Result<bool, CloudError>;

    /// Whether the instance with this provider ID is shut down.
    async fn instance_shutdown_by_provider_id(
        &self,
        cx: &CallContext,
        provider_id: &str,
    ) -> Result<bool, CloudError>;
}

#[cfg(test)]
mod tests {
    use super::reserved;

    #[test]
    fn reserved_domains() {
        assert!(reserved("kubernetes.io/hostname"));
        assert!(reserved("node.kubernetes.io/x"));
        assert!(reserved("k8s.io/x"));
        assert!(!reserved("example.com/kubernetes.io"));
        assert!(!reserved("plain"));
        assert!(!reserved("mykubernetes.io/x"));
    }
}
