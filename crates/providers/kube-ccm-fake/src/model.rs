//! What the fake cloud holds: instances, load balancers, routes, and its knobs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// An instance's power state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum InstanceState {
    /// Running.
    #[default]
    Running,
    /// Stopped: it exists and is shut down (its node gets the shutdown taint).
    Stopped,
    /// Terminated: it no longer exists (its node is deleted).
    Terminated,
}

/// An instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FakeInstance {
    /// The node name it backs.
    pub name: String,
    /// `fake://<name>` when not given.
    #[serde(default, rename = "providerID")]
    pub provider_id: Option<String>,
    /// Instance type.
    #[serde(default = "default_instance_type")]
    pub instance_type: String,
    /// Zone.
    #[serde(default = "default_zone")]
    pub zone: String,
    /// Region.
    #[serde(default = "default_region")]
    pub region: String,
    /// Addresses as `(type, address)`; an InternalIP and a Hostname are made up when empty.
    #[serde(default)]
    pub addresses: Vec<FakeAddress>,
    /// Power state.
    #[serde(default)]
    pub state: InstanceState,
    /// Labels the cloud adds to the node.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Pod ranges the cloud assigned it (the node-IPAM cloud allocator's answer), at most one IPv4 and
    /// one IPv6 CIDR; none by default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_cidrs: Vec<String>,
}

/// A node address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FakeAddress {
    /// `InternalIP`, `ExternalIP`, `Hostname`, …
    #[serde(rename = "type")]
    pub type_: String,
    /// The address.
    pub address: String,
}

fn default_instance_type() -> String {
    "fake.medium".to_owned()
}

fn default_zone() -> String {
    "fake-zone-a".to_owned()
}

fn default_region() -> String {
    "fake-region-1".to_owned()
}

impl FakeInstance {
    /// A running instance named `name` with made-up addresses derived from `index`.
    pub fn running(name: &str, index: u32) -> FakeInstance {
        FakeInstance {
            name: name.to_owned(),
            provider_id: None,
            instance_type: default_instance_type(),
            zone: default_zone(),
            region: default_region(),
            addresses: vec![
                FakeAddress {
                    type_: "InternalIP".into(),
                    address: format!(
                        "10.{}.{}.{}",
                        (index >> 16) & 0xff,
                        (index >> 8) & 0xff,
                        index & 0xff
                    ),
                },
                FakeAddress {
                    type_: "Hostname".into(),
                    address: name.to_owned(),
                },
            ],
            state: InstanceState::Running,
            labels: BTreeMap::new(),
            pod_cidrs: Vec::new(),
        }
    }

    /// The provider ID.
    pub fn provider_id(&self) -> String {
        self.provider_id
            .clone()
            .unwrap_or_else(|| format!("fake://{}", self.name))
    }
}

/// A load balancer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FakeLoadBalancer {
    /// Name (upstream's default: `a` + service UID).
    pub name: String,
    /// `namespace/name` of the service.
    pub service: String,
    /// The cluster it was made for (its tag; empty: untagged, nobody's provably).
    #[serde(default)]
    pub cluster: String,
    /// Ports it forwards.
    pub ports: Vec<i32>,
    /// Nodes it sends traffic to, sorted.
    pub nodes: Vec<String>,
    /// Its address.
    pub ip: String,
    /// Its IPv6 address, when it serves IPv6 too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<String>,
}

/// A route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FakeRoute {
    /// Name.
    pub name: String,
    /// Node (empty: the target is gone, a blackhole).
    pub target_node: String,
    /// Pod CIDR.
    pub destination_cidr: String,
    /// The node's addresses when the route was made.
    #[serde(default)]
    pub target_node_addresses: Vec<FakeAddress>,
}

/// Latency added to every call, the fraction of calls that fail, and the fraction that hang.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Knobs {
    /// Milliseconds added to each call (once per call, however many instances it covers).
    #[serde(default)]
    pub latency_ms: u64,
    /// Probability that a call fails.
    #[serde(default)]
    pub error_rate: f64,
    /// Probability that a call never answers (it is held until its caller gives up, and then not applied).
    #[serde(default)]
    pub hang_rate: f64,
    /// Probability that a call that changes something is applied and its answer then never comes (held
    /// until its caller gives up): the write landed, the caller saw a timeout.
    #[serde(default)]
    pub lost_answer_rate: f64,
}

/// A change the cloud applied, and who asked for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloudWrite {
    /// When it was applied: wall-clock microseconds since the epoch (comparable with the test API server's
    /// logs on the same machine).
    pub time_us: i64,
    /// The call (`ensure_load_balancer`, `create_route`, …).
    pub call: String,
    /// The object (load balancer or route name).
    pub object: String,
    /// The caller's `User-Agent` (component, version, identity, controller); empty when anonymous.
    pub caller: String,
}
