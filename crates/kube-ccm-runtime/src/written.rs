//! The API server's answer to a write, read for its identity only.
//!
//! A patch (or delete) answers with the whole object: for a kubelet-registered Node ≈ 5 KB of JSON with
//! its images and machine inventory. Decoded as a `k8s_openapi` Node it was ≈ 6% of the node controller's
//! CPU in `bench nodes` (two writes per node), most of it allocating and freeing what nobody read: the
//! controllers want the written resourceVersion at most. `Api<Written<Node>>` writes to the same path and
//! keeps only `metadata.name`, `namespace`, `uid` and `resourceVersion`; serde skips the rest without
//! allocating.
//!
//! It also asks the API server for no more: `Api<Written<K>>` reads and patches with the `Accept` of a
//! metadata-only answer (`as=PartialObjectMetadata`; [`patch_status`] for the status subresource), so the
//! kube-apiserver encodes the object's metadata and none of its spec or status: for a kubelet-shaped Node
//! ≈ 1 KB in place of ≈ 5 KB. Encoding write answers was ≈ 3.5% of kube-apiserver's CPU under `bench
//! nodes`' burst (the benchmark's own creates included), ≈ 2.8% with ours asking for metadata only.

use std::borrow::Cow;
use std::fmt::Debug;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};

/// The `Accept` of a single object's answer reduced to its metadata (as kube's `Api::patch_metadata` sends).
const METADATA_ONLY: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";

/// The parameters of every controller patch (node, node-lifecycle, route, service, Event repeats, and the
/// providers' own: node IPAM, the AWS tagger, GCE's internal load-balancer finalizer): `fieldValidation=Ignore`.
/// A provider's own controller should use it too.
///
/// Without it kube-apiserver validates fields as `Warn` says: it decodes the patch strictly and converts the
/// patched object tracking unknown fields, only to report them in `Warning` headers, which kube's client never
/// reads. Our patches are built from typed fields, and their shape is held to the real kube-apiserver by the
/// both-backends tests. It saves kube-apiserver a little CPU (measured in decision 0018, `docs/decisions/`).
pub fn patch_params() -> PatchParams {
    PatchParams::default().validation_ignore()
}

/// `Api::patch_status` answered with the object's metadata only (kube's own asks for the whole object even
/// when the answer is read as [`Written`]).
pub async fn patch_status<K, P>(
    api: &Api<Written<K>>,
    name: &str,
    params: &PatchParams,
    patch: &Patch<P>,
) -> kube::Result<Written<K>>
where
    K: Resource<DynamicType = ()>,
    P: serde::Serialize + Debug,
{
    let mut request = kube::core::Request::new(api.resource_url())
        .patch_subresource("status", name, params, patch)
        .map_err(kube::Error::BuildRequest)?;
    request.headers_mut().insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static(METADATA_ONLY),
    );
    request.extensions_mut().insert("patch_status");
    api.clone().into_client().request::<Written<K>>(request).await
}

/// What a write to an object of type `K` answered, reduced to its identity (see the module documentation).
pub struct Written<K> {
    /// `name`, `namespace`, `uid` and `resourceVersion` only.
    pub metadata: ObjectMeta,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Written<K> {
    fn clone(&self) -> Self {
        Written {
            metadata: self.metadata.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> std::fmt::Debug for Written<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Written")
            .field("metadata", &self.metadata)
            .finish()
    }
}

#[derive(serde::Deserialize)]
struct Wire {
    #[serde(default)]
    metadata: WireMeta,
}

#[derive(Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
}

impl<'de, K> serde::Deserialize<'de> for Written<K> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Written<K>, D::Error> {
        let WireMeta {
            name,
            namespace,
            uid,
            resource_version,
        } = Wire::deserialize(deserializer)?.metadata;
        Ok(Written {
            metadata: ObjectMeta {
                name,
                namespace,
                uid,
                resource_version,
                ..ObjectMeta::default()
            },
            kind: PhantomData,
        })
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Written<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }

    /// Reads and patches ask for metadata only (see the module documentation).
    fn metadata_api() -> bool {
        true
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, Patch, PatchParams};
    use serde_json::json;

    use super::*;

    /// A patch through `Api<Written<Node>>` goes to the nodes' path and answers with the written version.
    #[tokio::test]
    async fn a_write_answers_with_its_identity() {
        let server = kube_ccm_test_apiserver::TestApiServer::start().await.unwrap();
        let nodes: Api<Node> = Api::all(server.client());
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"a": "b"}},
            "status": {"images": [{"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 1}]},
        }))
        .unwrap();
        let created = nodes.create(&Default::default(), &node).await.unwrap();
        let written: Api<Written<Node>> = Api::all(server.client());
        let patch = json!({"metadata": {"labels": {"c": "d"}}});
        let answer = written
            .patch("n1", &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap();
        let now = nodes.get("n1").await.unwrap();
        assert_eq!(answer.metadata.name.as_deref(), Some("n1"));
        assert_eq!(answer.metadata.uid, created.metadata.uid);
        assert_eq!(answer.metadata.resource_version, now.metadata.resource_version);
        assert_ne!(
            answer.metadata.resource_version,
            created.metadata.resource_version
        );
        assert_eq!(answer.metadata.labels, None, "nothing else is kept");
        assert_eq!(now.metadata.labels.unwrap().len(), 2);
    }
}
