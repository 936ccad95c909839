//! Requests to the fake cloud, the same in-process and over HTTP (JSON).

use serde::{Deserialize, Serialize};

use crate::model::{
    CloudWrite, FakeAddress, FakeInstance, FakeLoadBalancer, FakeRoute, InstanceState, Knobs,
};

/// How a node is looked up: provider ID first, then name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRef {
    /// Node name.
    pub name: String,
    /// `spec.providerID`, when set.
    #[serde(default)]
    pub provider_id: Option<String>,
}

impl CloudRequest {
    /// The object a mutating call changes (`None` for reads).
    pub fn mutated_object(&self) -> Option<&str> {
        match self {
            CloudRequest::EnsureLoadBalancer { name, .. }
            | CloudRequest::UpdateLoadBalancer { name, .. }
            | CloudRequest::DeleteLoadBalancer { name }
            | CloudRequest::CreateRoute { name, .. }
            | CloudRequest::DeleteRoute { name } => Some(name),
            CloudRequest::DescribeInstances { .. }
            | CloudRequest::GetLoadBalancer { .. }
            | CloudRequest::ListLoadBalancers { .. }
            | CloudRequest::ListRoutes
            | CloudRequest::Admin(_) => None,
        }
    }

    /// The call's name, as it travels (`describe_instances`, `list_routes`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            CloudRequest::DescribeInstances { .. } => "describe_instances",
            CloudRequest::GetLoadBalancer { .. } => "get_load_balancer",
            CloudRequest::EnsureLoadBalancer { .. } => "ensure_load_balancer",
            CloudRequest::UpdateLoadBalancer { .. } => "update_load_balancer",
            CloudRequest::DeleteLoadBalancer { .. } => "delete_load_balancer",
            CloudRequest::ListLoadBalancers { .. } => "list_load_balancers",
            CloudRequest::ListRoutes => "list_routes",
            CloudRequest::CreateRoute { .. } => "create_route",
            CloudRequest::DeleteRoute { .. } => "delete_route",
            CloudRequest::Admin(_) => "admin",
        }
    }
}

/// A cloud API call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "snake_case")]
pub enum CloudRequest {
    /// Metadata of many instances.
    DescribeInstances {
        /// The nodes, answered in order.
        nodes: Vec<NodeRef>,
    },
    /// Get a load balancer.
    GetLoadBalancer {
        /// Its name.
        name: String,
    },
    /// Create or update a load balancer.
    EnsureLoadBalancer {
        /// Its name.
        name: String,
        /// `namespace/name` of the service.
        service: String,
        /// The cluster it is for (its tag).
        #[serde(default)]
        cluster: String,
        /// Ports to forward.
        ports: Vec<i32>,
        /// Backend nodes.
        nodes: Vec<String>,
        /// Whether it serves IPv6 too (an address of each family).
        #[serde(default)]
        ipv6: bool,
    },
    /// Change an existing load balancer's nodes.
    UpdateLoadBalancer {
        /// Its name.
        name: String,
        /// Backend nodes.
        nodes: Vec<String>,
    },
    /// Delete a load balancer (no error when absent).
    DeleteLoadBalancer {
        /// Its name.
        name: String,
    },
    /// The load balancers tagged for `cluster` (never the untagged ones).
    ListLoadBalancers {
        /// The cluster.
        cluster: String,
    },
    /// Every route.
    ListRoutes,
    /// Create a route.
    CreateRoute {
        /// Its name.
        name: String,
        /// The node.
        target_node: String,
        /// The pod CIDR.
        destination_cidr: String,
        /// The node's addresses.
        #[serde(default)]
        target_node_addresses: Vec<FakeAddress>,
    },
    /// Delete a route.
    DeleteRoute {
        /// Its name.
        name: String,
    },
    /// Change the cloud (tests and the demo).
    Admin(AdminRequest),
}

/// Changing the cloud while it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "admin", rename_all = "snake_case")]
pub enum AdminRequest {
    /// Add or replace an instance.
    PutInstance(FakeInstance),
    /// Start, stop or terminate an instance.
    SetInstanceState {
        /// The instance (node name).
        name: String,
        /// Its new state.
        state: InstanceState,
    },
    /// Latency and error rate.
    SetKnobs(Knobs),
    /// A zone the cloud cannot reach (`reachable: false`) or can again: its instances are neither found
    /// nor absent but unknown, and so is any instance looked up that is not found in a reachable zone.
    SetZoneReachable {
        /// The zone.
        zone: String,
        /// Whether it answers.
        reachable: bool,
    },
    /// Add or replace a load balancer (another cluster's, an untagged one, a leftover).
    PutLoadBalancer(FakeLoadBalancer),
    /// Add or replace a route (one the cluster did not make, say).
    PutRoute(FakeRoute),
    /// Refuse calls beyond `per_second` a second (a bucket of one second's calls), as a cloud's API rate
    /// limit does: answered `throttled`. Zero lifts the limit.
    SetRateLimit {
        /// Calls a second.
        per_second: f64,
    },
    /// A cloud that answers "no such instance" for every instance (`blind: true`), as one reached with a
    /// wrong region or account does, or answers truly again.
    SetBlind {
        /// Whether every look-up finds nothing.
        blind: bool,
    },
    /// Everything the cloud holds.
    Snapshot,
    /// The load balancers grouped by the nodes they send traffic to: a cheap check that every one has
    /// a node set, where a snapshot would copy every load balancer's nodes.
    HostSets,
    /// The changes applied, from the `from`-th on (the audit judges them against lock tenures).
    Writes {
        /// Index of the first change wanted.
        #[serde(default)]
        from: usize,
    },
}

/// Answers; errors travel as `Error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum CloudResponse {
    /// One entry per node asked about, in order.
    Instances {
        /// `None`: no such instance (or terminated).
        instances: Vec<Option<FakeInstance>>,
        /// Indexes of the nodes the cloud cannot answer for (an unreachable zone): their entry is `None`
        /// but means "unknown", never "absent".
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        unknown: Vec<usize>,
    },
    /// A load balancer.
    LoadBalancer {
        /// `None`: it does not exist.
        load_balancer: Option<FakeLoadBalancer>,
    },
    /// Load balancers.
    LoadBalancers {
        /// Them, by name.
        load_balancers: Vec<FakeLoadBalancer>,
    },
    /// Every route.
    Routes {
        /// The routes.
        routes: Vec<FakeRoute>,
    },
    /// Done.
    Done,
    /// Everything the cloud holds.
    Snapshot {
        /// Instances.
        instances: Vec<FakeInstance>,
        /// Load balancers.
        load_balancers: Vec<FakeLoadBalancer>,
        /// Routes.
        routes: Vec<FakeRoute>,
        /// Cloud calls answered so far (admin requests excluded).
        calls: u64,
        /// The same, by call (`list_routes`, `ensure_load_balancer`, …).
        #[serde(default)]
        calls_by_kind: std::collections::BTreeMap<String, u64>,
        /// Of `calls`, those refused for the rate limit.
        #[serde(default)]
        throttled: u64,
        /// The most calls answered at once so far, by call (refused ones not counted).
        #[serde(default)]
        peak_in_flight: std::collections::BTreeMap<String, u64>,
    },
    /// The load balancers by node set, the largest group first.
    HostSets {
        /// Each distinct node set and how many load balancers have it.
        sets: Vec<HostSet>,
        /// Cloud calls answered so far, by call, as in [`CloudResponse::Snapshot`].
        calls_by_kind: std::collections::BTreeMap<String, u64>,
        /// How many changes the cloud has applied ([`AdminRequest::Writes`]' next `from`).
        writes: usize,
    },
    /// Changes applied, in order.
    Writes {
        /// The changes.
        writes: Vec<CloudWrite>,
    },
    /// The call failed.
    Error {
        /// Why.
        message: String,
        /// Whether the thing asked for does not exist.
        not_found: bool,
        /// Whether the cloud refused the call for its rate limit ([`AdminRequest::SetRateLimit`]).
        #[serde(default)]
        throttled: bool,
    },
}

/// Load balancers sending traffic to the same nodes ([`AdminRequest::HostSets`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostSet {
    /// The nodes, sorted.
    pub nodes: Vec<String>,
    /// How many load balancers have exactly these.
    pub load_balancers: usize,
}
