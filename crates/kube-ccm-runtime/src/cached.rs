//! What the informers cache: compact forms of Kubernetes objects ([`Cached`]), each with its
//! [`Identity`] in place of an `ObjectMeta`.
//!
//! An `ObjectMeta` is large before any of its strings, most of them empty options, and the controllers
//! read five of its fields; at many nodes it is a visible share of the process (decision 0017,
//! `docs/decisions/`). So the cache keeps the name, namespace, uid and resourceVersion in one string and
//! the two timestamps beside them. The watch still needs an object with `metadata` (kube-runtime reads each event's
//! resourceVersion through [`Resource`]): it reads [`Watched`] objects, which the informer unwraps before
//! caching.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Resource;
use serde::de::DeserializeOwned;

/// An object's name, namespace, uid, resourceVersion and creation and deletion times: what the
/// controllers read of its `metadata`, besides labels and annotations.
#[derive(Clone, PartialEq, Eq)]
pub struct Identity {
    /// Name, namespace, uid and resourceVersion, one after the other.
    text: Box<str>,
    /// Where the name, the namespace and the uid end in `text`.
    ends: [u32; 3],
    created: Option<Time>,
    deleted: Option<Time>,
}

impl Identity {
    /// An identity from its parts (an empty namespace or resourceVersion is none).
    pub fn new(
        name: &str,
        namespace: Option<&str>,
        uid: &str,
        resource_version: Option<&str>,
        created: Option<Time>,
        deleted: Option<Time>,
    ) -> Identity {
        let parts = [
            name,
            namespace.unwrap_or_default(),
            uid,
            resource_version.unwrap_or_default(),
        ];
        let mut text = String::with_capacity(parts.iter().map(|p| p.len()).sum());
        let mut ends = [0_u32; 3];
        for (index, part) in parts.iter().enumerate() {
            text.push_str(part);
            if let Some(end) = ends.get_mut(index) {
                *end = u32::try_from(text.len()).expect("metadata strings are far below 4 GiB");
            }
        }
        Identity {
            text: text.into_boxed_str(),
            ends,
            created,
            deleted,
        }
    }

    /// The identity in `meta`.
    pub fn of(meta: &ObjectMeta) -> Identity {
        Identity::new(
            meta.name.as_deref().unwrap_or_default(),
            meta.namespace.as_deref(),
            meta.uid.as_deref().unwrap_or_default(),
            meta.resource_version.as_deref(),
            meta.creation_timestamp.clone(),
            meta.deletion_timestamp.clone(),
        )
    }

    fn part(&self, index: usize) -> &str {
        let start = index
            .checked_sub(1)
            .map_or(0, |before| self.ends[before] as usize);
        let end = self.ends.get(index).map_or(self.text.len(), |end| *end as usize);
        &self.text[start..end]
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        self.part(0)
    }

    /// `metadata.namespace`, for a namespaced object.
    pub fn namespace(&self) -> Option<&str> {
        Some(self.part(1)).filter(|n| !n.is_empty())
    }

    /// `metadata.uid` (empty if the server gave none).
    pub fn uid(&self) -> &str {
        self.part(2)
    }

    /// `metadata.resourceVersion`.
    pub fn resource_version(&self) -> Option<&str> {
        Some(self.part(3)).filter(|v| !v.is_empty())
    }

    /// `metadata.creationTimestamp`.
    pub fn created(&self) -> Option<&Time> {
        self.created.as_ref()
    }

    /// `metadata.deletionTimestamp`: set once the object is being deleted.
    pub fn deleted(&self) -> Option<&Time> {
        self.deleted.as_ref()
    }

    /// The key the object is cached under: `namespace/name`, or `name`.
    pub fn key(&self) -> Cow<'_, str> {
        match self.namespace() {
            Some(namespace) => Cow::Owned(format!("{namespace}/{}", self.name())),
            None => Cow::Borrowed(self.name()),
        }
    }

    /// An `ObjectMeta` with these fields (and no others).
    pub fn to_meta(&self) -> ObjectMeta {
        let owned = |text: &str| Some(text.to_owned()).filter(|t| !t.is_empty());
        ObjectMeta {
            name: owned(self.name()),
            namespace: self.namespace().map(str::to_owned),
            uid: owned(self.uid()),
            resource_version: self.resource_version().map(str::to_owned),
            creation_timestamp: self.created.clone(),
            deletion_timestamp: self.deleted.clone(),
            ..ObjectMeta::default()
        }
    }
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("name", &self.name())
            .field("namespace", &self.namespace())
            .field("uid", &self.uid())
            .field("resource_version", &self.resource_version())
            .field("created", &self.created)
            .field("deleted", &self.deleted)
            .finish()
    }
}

/// A compact form of a Kubernetes object of type [`Cached::Kind`], as an informer caches it: read from
/// the object's JSON, keeping what the controllers read.
pub trait Cached: DeserializeOwned + Clone + std::fmt::Debug + Send + Sync + 'static {
    /// The Kubernetes type (its API path, kind and scope).
    type Kind: Resource<DynamicType = ()>;

    /// The object's identity.
    fn identity(&self) -> &Identity;
}

/// An object an Event can be about.
pub trait Referable {
    /// A reference to the object for Events: without the resourceVersion (see
    /// [`event_reference`](crate::event_reference)).
    fn event_reference(&self) -> ObjectReference;
}

impl<K: Resource<DynamicType = ()>> Referable for K {
    fn event_reference(&self) -> ObjectReference {
        ObjectReference {
            resource_version: None,
            ..self.object_ref(&())
        }
    }
}

/// A reference for Events to the object of kind `K` with this identity.
pub(crate) fn reference<K: Resource<DynamicType = ()>>(identity: &Identity) -> ObjectReference {
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: Some(identity.name().to_owned()).filter(|n| !n.is_empty()),
        namespace: identity.namespace().map(str::to_owned),
        uid: Some(identity.uid().to_owned()).filter(|u| !u.is_empty()),
        ..ObjectReference::default()
    }
}

/// A cached form as the watch reads it: with the `metadata` (only its resourceVersion) that kube-runtime's
/// watcher reads through [`Resource`]. It lives for one event.
#[derive(Clone, Debug)]
pub(crate) struct Watched<K> {
    pub(crate) object: K,
    meta: ObjectMeta,
}

impl<'de, K: Cached> serde::Deserialize<'de> for Watched<K> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Watched<K>, D::Error> {
        let object = K::deserialize(deserializer)?;
        let meta = ObjectMeta {
            resource_version: object.identity().resource_version().map(str::to_owned),
            ..ObjectMeta::default()
        };
        Ok(Watched { object, meta })
    }
}

impl<K: Cached> Resource for Watched<K> {
    type DynamicType = ();
    type Scope = <K::Kind as Resource>::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::Kind::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        K::Kind::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        K::Kind::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        K::Kind::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_keeps_its_parts() {
        let created = Time("2026-11-26T10:00:00Z".parse().unwrap());
        let identity = Identity::new(
            "web",
            Some("shop"),
            "u-1",
            Some("42"),
            Some(created.clone()),
            None,
        );
        assert_eq!(identity.name(), "web");
        assert_eq!(identity.namespace(), Some("shop"));
        assert_eq!(identity.uid(), "u-1");
        assert_eq!(identity.resource_version(), Some("42"));
        assert_eq!(identity.created(), Some(&created));
        assert_eq!(identity.deleted(), None);
        assert_eq!(identity.key(), "shop/web");
        assert_eq!(Identity::of(&identity.to_meta()), identity, "round trip");

        let node = Identity::new("n1", None, "", None, None, Some(created));
        assert_eq!(
            (node.namespace(), node.uid(), node.resource_version()),
            (None, "", None)
        );
        assert_eq!(node.key(), "n1");
        let meta = node.to_meta();
        assert_eq!(
            (meta.namespace, meta.uid, meta.resource_version),
            (None, None, None)
        );
        assert!(meta.deletion_timestamp.is_some());
    }

    #[test]
    fn a_reference_names_the_kind_and_object_without_a_version() {
        let identity = Identity::new("web", Some("shop"), "u-1", Some("42"), None, None);
        let reference = reference::<k8s_openapi::api::core::v1::Service>(&identity);
        assert_eq!(reference.api_version.as_deref(), Some("v1"));
        assert_eq!(reference.kind.as_deref(), Some("Service"));
        assert_eq!(reference.name.as_deref(), Some("web"));
        assert_eq!(reference.namespace.as_deref(), Some("shop"));
        assert_eq!(reference.uid.as_deref(), Some("u-1"));
        assert_eq!(reference.resource_version, None);
    }
}
