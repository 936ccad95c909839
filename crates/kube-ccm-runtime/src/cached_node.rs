//! The node cache's own form of a Node: what the controllers read, compactly.
//!
//! A kubelet-registered `k8s_openapi` Node takes ≈ 5.4 KB of heap even without its images and machine
//! inventory (two `BTreeMap`s, a 1.5 KB struct, a string per field); 10k of them would be most of the
//! process. [`CachedNode`] keeps metadata identity, labels, annotations, the spec fields and the
//! addresses and conditions (type, status, reason): strings packed into one allocation per field, the
//! conditions' few distinct strings and lists interned; ≈ 1 KB. Controllers read it directly where they scan every node (route, lifecycle,
//! load-balancer node sets) and [`CachedNode::to_node`] it where a `Node` goes to the cloud provider or
//! through a controller's per-node logic.
//!
//! What a provider receives is therefore the node *as cached*: metadata (name, uid, resourceVersion,
//! timestamps, labels, annotations), spec (providerID, podCIDR(s), taints, unschedulable), status
//! addresses, node info (`systemUUID`, `machineID`, versions, …), capacity and allocatable (shared
//! between nodes that have the same), and conditions without messages or heartbeats. The kubelet's images,
//! volumes, daemon endpoints and condition messages are not kept: no provider reads them.

use parking_lot::Mutex;
use std::borrow::Borrow;
use std::collections::{BTreeMap, HashSet};
use std::hash::Hash;
use std::sync::{Arc, LazyLock};

use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, ObjectReference, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::cached::{Cached, Identity, Referable, reference};

/// Interned strings stop being added beyond this many (condition types, statuses and reasons are few;
/// this bounds the table should a cluster use unusual ones).
const INTERNED_MAX: usize = 4_096;

static INTERNED: LazyLock<Mutex<HashSet<Arc<str>>>> = LazyLock::new(Mutex::default);

static SHARED: LazyLock<Mutex<HashSet<Arc<Packed>>>> = LazyLock::new(Mutex::default);

static CONDITION_SETS: LazyLock<Mutex<HashSet<Arc<[Condition]>>>> = LazyLock::new(Mutex::default);

/// The shared copy of `value` in `table`: the one there, or `value` made shared (and added, while the
/// table has room).
fn shared_in<T, V>(table: &Mutex<HashSet<Arc<T>>>, value: V) -> Arc<T>
where
    T: ?Sized + Hash + Eq,
    V: Borrow<T> + Into<Arc<T>>,
{
    let mut table = table.lock();
    if let Some(found) = table.get(value.borrow()) {
        return found.clone();
    }
    let new = value.into();
    if table.len() < INTERNED_MAX {
        table.insert(new.clone());
    }
    new
}

/// One shared copy of a node's conditions as the cache keeps them: without messages and times, most nodes
/// have the same few lists (all healthy; not ready yet).
fn share_conditions(conditions: Vec<Condition>) -> Arc<[Condition]> {
    shared_in(&CONDITION_SETS, conditions)
}

/// One shared copy of packed strings that many nodes repeat (the node info their kubelets share, the
/// capacity of one instance type).
fn share(packed: Packed) -> Arc<Packed> {
    shared_in(&SHARED, packed)
}

/// One shared copy of a string that many nodes repeat.
fn intern(text: &str) -> Arc<str> {
    shared_in(&INTERNED, text)
}

/// Strings in one allocation, each preceded by its length (LEB128): a dozen labels cost one allocation of
/// their bytes instead of two dozen small ones.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
struct Packed(Box<[u8]>);

impl Packed {
    fn new<'a>(items: impl IntoIterator<Item = &'a str>) -> Packed {
        let mut bytes = Vec::new();
        for item in items {
            let mut length = item.len();
            loop {
                let low = (length & 0x7f) as u8;
                length >>= 7;
                if length == 0 {
                    bytes.push(low);
                    break;
                }
                bytes.push(low | 0x80);
            }
            bytes.extend_from_slice(item.as_bytes());
        }
        Packed(bytes.into_boxed_slice())
    }

    /// From a map, as alternating keys and values (in the map's order: sorted by key).
    fn pairs(map: Option<&BTreeMap<String, String>>) -> Packed {
        Packed::new(
            map.into_iter()
                .flatten()
                .flat_map(|(k, v)| [k.as_str(), v.as_str()]),
        )
    }

    fn iter(&self) -> impl Iterator<Item = &str> {
        let mut rest: &[u8] = &self.0;
        std::iter::from_fn(move || {
            if rest.is_empty() {
                return None;
            }
            let mut length = 0_usize;
            let mut shift = 0;
            loop {
                let byte = rest[0];
                rest = &rest[1..];
                length |= usize::from(byte & 0x7f) << shift;
                shift += 7;
                if byte & 0x80 == 0 {
                    break;
                }
            }
            let (item, after) = rest.split_at(length);
            rest = after;
            Some(std::str::from_utf8(item).expect("packed from strings"))
        })
    }

    fn iter_pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        let mut items = self.iter();
        std::iter::from_fn(move || Some((items.next()?, items.next()?)))
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.iter_pairs().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    fn to_map(&self) -> Option<BTreeMap<String, String>> {
        (!self.0.is_empty()).then(|| {
            self.iter_pairs()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
    }
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// A condition as the controllers read it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Condition {
    type_: Arc<str>,
    status: Arc<str>,
    reason: Option<Arc<str>>,
}

/// A Node, compactly (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct CachedNode {
    identity: Identity,
    /// Keys and values, alternating.
    labels: Packed,
    /// Keys and values, alternating.
    annotations: Packed,
    provider_id: Option<Box<str>>,
    pod_cidrs: Packed,
    taints: Box<[Taint]>,
    unschedulable: bool,
    /// Types and addresses, alternating.
    addresses: Packed,
    /// Shared by the nodes that have the same (see [`share_conditions`]).
    conditions: Arc<[Condition]>,
    /// `status.nodeInfo` fields that kubelets of one build share (versions, OS, architecture), as
    /// name/value pairs.
    node_info_shared: Arc<Packed>,
    /// `status.nodeInfo` fields of this machine (`bootID`, `machineID`, `systemUUID`, in that order), or
    /// nothing.
    node_info_own: Packed,
    /// `status.capacity` and `status.allocatable`, as name/quantity pairs (shared by nodes of one type).
    capacity: Arc<Packed>,
    allocatable: Arc<Packed>,
}

/// The wire form, reduced to what is kept: serde skips every other field without allocating, so a
/// kubelet's images and machine inventory never reach the heap.
#[derive(serde::Deserialize)]
struct Wire {
    #[serde(default)]
    metadata: WireMeta,
    #[serde(default)]
    spec: Option<WireSpec>,
    #[serde(default)]
    status: Option<WireStatus>,
}

#[derive(Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMeta {
    name: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Default, serde::Deserialize)]
struct WireSpec {
    #[serde(rename = "providerID")]
    provider_id: Option<String>,
    #[serde(rename = "podCIDR")]
    pod_cidr: Option<String>,
    #[serde(rename = "podCIDRs")]
    pod_cidrs: Option<Vec<String>>,
    taints: Option<Vec<Taint>>,
    unschedulable: Option<bool>,
}

#[derive(Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireStatus {
    addresses: Option<Vec<NodeAddress>>,
    conditions: Option<Vec<WireCondition>>,
    node_info: Option<BTreeMap<String, String>>,
    capacity: Option<BTreeMap<String, String>>,
    allocatable: Option<BTreeMap<String, String>>,
}

/// `status.nodeInfo` fields that identify one machine, packed in this order (values only); the others are
/// shared by many nodes.
const OWN_NODE_INFO: [&str; 3] = ["bootID", "machineID", "systemUUID"];

#[derive(serde::Deserialize)]
struct WireCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    reason: Option<String>,
}

impl From<Wire> for CachedNode {
    fn from(wire: Wire) -> CachedNode {
        let Wire {
            metadata,
            spec,
            status,
        } = wire;
        let spec = spec.unwrap_or_default();
        let status = status.unwrap_or_default();
        let plural = spec.pod_cidrs.unwrap_or_default();
        let pod_cidrs = if plural.is_empty() {
            Packed::new(spec.pod_cidr.as_deref().filter(|c| !c.is_empty()))
        } else {
            Packed::new(plural.iter().map(String::as_str))
        };
        let mut node_info = status.node_info.unwrap_or_default();
        let own: Vec<String> = OWN_NODE_INFO
            .iter()
            .map(|key| node_info.remove(*key).unwrap_or_default())
            .collect();
        node_info.retain(|_, v| !v.is_empty());
        CachedNode {
            node_info_shared: share(Packed::pairs(Some(&node_info))),
            node_info_own: if own.iter().all(String::is_empty) {
                Packed::default()
            } else {
                Packed::new(own.iter().map(String::as_str))
            },
            capacity: share(Packed::pairs(status.capacity.as_ref())),
            allocatable: share(Packed::pairs(status.allocatable.as_ref())),
            labels: Packed::pairs(metadata.labels.as_ref()),
            annotations: Packed::pairs(metadata.annotations.as_ref()),
            identity: Identity::new(
                metadata.name.as_deref().unwrap_or_default(),
                None,
                metadata.uid.as_deref().unwrap_or_default(),
                metadata.resource_version.as_deref(),
                metadata.creation_timestamp,
                metadata.deletion_timestamp,
            ),
            provider_id: spec
                .provider_id
                .filter(|p| !p.is_empty())
                .map(String::into_boxed_str),
            pod_cidrs,
            taints: spec.taints.unwrap_or_default().into_boxed_slice(),
            unschedulable: spec.unschedulable.unwrap_or(false),
            addresses: Packed::new(
                status
                    .addresses
                    .iter()
                    .flatten()
                    .flat_map(|a| [a.type_.as_str(), a.address.as_str()]),
            ),
            conditions: share_conditions(
                status
                    .conditions
                    .unwrap_or_default()
                    .into_iter()
                    .map(|c| Condition {
                        type_: intern(&c.type_),
                        status: intern(&c.status),
                        reason: c.reason.as_deref().map(intern),
                    })
                    .collect(),
            ),
        }
    }
}

impl<'de> serde::Deserialize<'de> for CachedNode {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<CachedNode, D::Error> {
        Wire::deserialize(deserializer).map(CachedNode::from)
    }
}

impl Cached for CachedNode {
    type Kind = Node;

    fn identity(&self) -> &Identity {
        &self.identity
    }
}

impl Referable for CachedNode {
    fn event_reference(&self) -> ObjectReference {
        reference::<Node>(&self.identity)
    }
}

/// Quantities from packed pairs.
fn quantities(packed: &Packed) -> Option<BTreeMap<String, Quantity>> {
    (!packed.0.is_empty()).then(|| {
        packed
            .iter_pairs()
            .map(|(k, v)| (k.to_owned(), Quantity(v.to_owned())))
            .collect()
    })
}

impl CachedNode {
    /// The node's name.
    pub fn name(&self) -> &str {
        self.identity.name()
    }

    /// A label's value.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key)
    }

    /// `spec.providerID`, when set and not empty.
    pub fn provider_id(&self) -> Option<&str> {
        self.provider_id.as_deref()
    }

    /// `spec.podCIDRs` (or the single `spec.podCIDR` of an older node).
    pub fn pod_cidrs(&self) -> impl Iterator<Item = &str> {
        self.pod_cidrs.iter()
    }

    /// Whether the node has a taint with this key.
    pub fn has_taint(&self, key: &str) -> bool {
        self.taints.iter().any(|t| t.key == key)
    }

    /// `spec.taints`.
    pub fn taints(&self) -> &[Taint] {
        &self.taints
    }

    /// An annotation's value.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key)
    }

    /// `metadata.uid`.
    pub fn uid(&self) -> &str {
        self.identity.uid()
    }

    /// `metadata.resourceVersion`.
    pub fn resource_version(&self) -> Option<&str> {
        self.identity.resource_version()
    }

    /// `status.addresses`, in order.
    pub fn addresses(&self) -> Vec<NodeAddress> {
        self.addresses
            .iter_pairs()
            .map(|(type_, address)| NodeAddress {
                type_: type_.to_owned(),
                address: address.to_owned(),
            })
            .collect()
    }

    /// `metadata.creationTimestamp`.
    pub fn created(&self) -> Option<&Time> {
        self.identity.created()
    }

    /// Whether the node is being deleted.
    pub fn deleting(&self) -> bool {
        self.identity.deleted().is_some()
    }

    /// A condition's status and reason.
    pub fn condition(&self, type_: &str) -> Option<(&str, Option<&str>)> {
        self.conditions
            .iter()
            .find(|c| c.type_.as_ref() == type_)
            .map(|c| (c.status.as_ref(), c.reason.as_deref()))
    }

    /// Whether the Ready condition is True.
    pub fn is_ready(&self) -> bool {
        self.condition("Ready")
            .is_some_and(|(status, _)| status == "True")
    }

    /// A `status.nodeInfo` field (`systemUUID`, `machineID`, `kubeletVersion`, …).
    pub fn node_info_field(&self, name: &str) -> Option<&str> {
        match OWN_NODE_INFO.iter().position(|key| *key == name) {
            Some(index) => self.node_info_own.iter().nth(index).filter(|v| !v.is_empty()),
            None => self.node_info_shared.get(name),
        }
    }

    fn node_info(&self) -> Option<NodeSystemInfo> {
        if self.node_info_own.0.is_empty() && self.node_info_shared.0.is_empty() {
            return None;
        }
        let field = |name: &str| self.node_info_field(name).unwrap_or_default().to_owned();
        Some(NodeSystemInfo {
            architecture: field("architecture"),
            boot_id: field("bootID"),
            container_runtime_version: field("containerRuntimeVersion"),
            kernel_version: field("kernelVersion"),
            kube_proxy_version: field("kubeProxyVersion"),
            kubelet_version: field("kubeletVersion"),
            machine_id: field("machineID"),
            operating_system: field("operatingSystem"),
            os_image: field("osImage"),
            system_uuid: field("systemUUID"),
            ..NodeSystemInfo::default()
        })
    }

    /// The Node as cached (see the module documentation for what that leaves out).
    pub fn to_node(&self) -> Node {
        let pod_cidrs: Vec<String> = self.pod_cidrs().map(str::to_owned).collect();
        Node {
            metadata: ObjectMeta {
                labels: self.labels.to_map(),
                annotations: self.annotations.to_map(),
                ..self.identity.to_meta()
            },
            spec: Some(NodeSpec {
                provider_id: self.provider_id.as_deref().map(str::to_owned),
                pod_cidr: pod_cidrs.first().cloned(),
                pod_cidrs: (!pod_cidrs.is_empty()).then_some(pod_cidrs),
                taints: (!self.taints.is_empty()).then(|| self.taints.to_vec()),
                unschedulable: self.unschedulable.then_some(true),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                addresses: (!self.addresses.0.is_empty()).then(|| self.addresses()),
                node_info: self.node_info(),
                capacity: quantities(&self.capacity),
                allocatable: quantities(&self.allocatable),
                conditions: (!self.conditions.is_empty()).then(|| {
                    self.conditions
                        .iter()
                        .map(|c| NodeCondition {
                            type_: c.type_.to_string(),
                            status: c.status.to_string(),
                            reason: c.reason.as_deref().map(str::to_owned),
                            ..NodeCondition::default()
                        })
                        .collect()
                }),
                ..NodeStatus::default()
            }),
        }
    }
}

#[cfg(test)]
mod tests;
