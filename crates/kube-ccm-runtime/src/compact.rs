//! Objects cached as their JSON, decoded when a controller works on one.
//!
//! A `k8s_openapi` Service takes ≈ 2.7 KB of heap; its JSON ≈ 0.7 KB. A controller that reads each
//! object only when it reconciles it (the service controller) loses nothing by decoding it then, and a
//! cluster with thousands of services keeps a fraction of the memory. The identity (name, namespace, uid,
//! resourceVersion, timestamps) stays decoded, for the cache's keys and for events.

use std::marker::PhantomData;

use k8s_openapi::api::core::v1::ObjectReference;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::cached::{Cached, Identity, Referable, reference};

/// Drops what no controller reads from an object about to be cached (as client-go's informer transforms).
pub(crate) trait Projected {
    /// Clears the unread fields.
    fn project(&mut self);
}

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

impl Projected for k8s_openapi::api::core::v1::Service {
    fn project(&mut self) {
        self.metadata.managed_fields = None;
        if let Some(annotations) = self.metadata.annotations.as_mut() {
            annotations.remove(LAST_APPLIED);
        }
    }
}

/// An object of type `K`, kept as the JSON of its projection (what a controller reads).
#[derive(Debug)]
pub struct Compact<K> {
    identity: Identity,
    json: Box<[u8]>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Compact<K> {
    fn clone(&self) -> Self {
        Compact {
            identity: self.identity.clone(),
            json: self.json.clone(),
            kind: PhantomData,
        }
    }
}

// Only crate-internal functions here: the bound does not leak.
#[allow(private_bounds)]
impl<K> Compact<K>
where
    K: kube::Resource + Projected + Serialize + DeserializeOwned,
{
    /// Keeps `object`, projected.
    pub(crate) fn new(mut object: K) -> Compact<K> {
        object.project();
        let json = serde_json::to_vec(&object)
            .expect("a Kubernetes object serialises")
            .into_boxed_slice();
        Compact {
            identity: Identity::of(object.meta()),
            json,
            kind: PhantomData,
        }
    }
}

impl<K: DeserializeOwned> Compact<K> {
    /// The object (as projected: no `managedFields`, no last-applied annotation).
    pub fn object(&self) -> K {
        serde_json::from_slice(&self.json).expect("the cache holds JSON it wrote itself")
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        self.identity.key().into_owned()
    }
}

impl<'de, K> serde::Deserialize<'de> for Compact<K>
where
    K: kube::Resource + Projected + Serialize + DeserializeOwned,
{
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Compact<K>, D::Error> {
        K::deserialize(deserializer).map(Compact::new)
    }
}

impl<K> Cached for Compact<K>
where
    K: kube::Resource<DynamicType = ()> + Projected + Serialize + DeserializeOwned + std::fmt::Debug,
    K: Send + Sync + 'static,
{
    type Kind = K;

    fn identity(&self) -> &Identity {
        &self.identity
    }
}

impl<K: kube::Resource<DynamicType = ()>> Referable for Compact<K> {
    fn event_reference(&self) -> ObjectReference {
        reference::<K>(&self.identity)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Service;
    use serde_json::json;

    use super::*;

    #[test]
    fn keeps_the_projected_object_and_its_identity() {
        let text = json!({
            "metadata": {
                "name": "web", "namespace": "shop", "uid": "u", "resourceVersion": "3",
                "annotations": {
                    "service.beta.kubernetes.io/aws-load-balancer-type": "nlb",
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"big\": true}",
                },
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
                "finalizers": ["service.kubernetes.io/load-balancer-cleanup"],
            },
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}},
        });
        let compact: Compact<Service> = serde_json::from_value(text.clone()).unwrap();
        assert_eq!(compact.key(), "shop/web");
        assert_eq!(compact.identity().resource_version(), Some("3"));
        assert_eq!(compact.identity().uid(), "u");
        assert_eq!(compact.event_reference().kind.as_deref(), Some("Service"));

        let mut expected: Service = serde_json::from_value(text).unwrap();
        expected.metadata.managed_fields = None;
        expected
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .remove("kubectl.kubernetes.io/last-applied-configuration");
        assert_eq!(compact.object(), expected);
    }
}
