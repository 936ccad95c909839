//! Requests to the fake cloud, the same in-process and over HTTP (JSON).

use serde::{Deserialize, Serialize};

use crate::cloud::{FakeInstance, FakeLoadBalancer, InstanceState, Knobs};

/// How a node is looked up: provider ID first, then name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRef {
    /// Node name.
    pub name: String,
    /// `spec.providerID`, when set.
    #[serde(default)]
    pub provider_id: Option<String>,
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
        /// Ports to forward.
        ports: Vec<i32>,
        /// Backend nodes.
        nodes: Vec<String>,
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
    /// Everything the cloud holds.
    Snapshot,
}

/// Answers; errors travel as `Error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum CloudResponse {
    /// One entry per node asked about, in order.
    Instances {
        /// `None`: no such instance (or terminated).
        instances: Vec<Option<FakeInstance>>,
    },
    /// A load balancer.
    LoadBalancer {
        /// `None`: it does not exist.
        load_balancer: Option<FakeLoadBalancer>,
    },
    /// Every route.
    Routes {
        /// The routes.
        routes: Vec<crate::cloud::FakeRoute>,
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
        routes: Vec<crate::cloud::FakeRoute>,
        /// Cloud calls answered so far (admin requests excluded).
        calls: u64,
    },
    /// The call failed.
    Error {
        /// Why.
        message: String,
        /// Whether the thing asked for does not exist.
        not_found: bool,
    },
}
