//! The controllers checks: the framework's own manager, with every built-in controller and the provider
//! under test, against the in-process test API server ([`test_apiserver`](crate::test_apiserver)). Where the contract
//! checks ask the provider call by call, these ask what a cluster sees: nodes initialised, a service's load
//! balancer through its life, routes, and a node deleted only when its instance is gone.
//!
//! Rooms: `nodes.rs` (the cloud-node and node-lifecycle controllers), `services.rs` (the service
//! controller), `routing.rs` (the route controller); here, the cluster they share.
//!
//! The manager's provider is the fixture's, wrapped to note the calls made of it
//! ([`crate::broken::Broken`] without a fault): a check judges from those notes that the controllers did
//! ask (a check whose cloud was never asked would pass anything).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Service};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube_ccm_leadermigration::ControllerSelection;
use kube_ccm_provider::CloudProvider;
use kube_ccm_provider::names::TAINT_UNINITIALIZED;
use kube_ccm_runtime::{
    Cidr, ClientFactory, ControllerRegistry, ControllerSettings, LeaderElectionConfig, Manager, ManagerConfig,
};
use kube_ccm_test_apiserver::TestApiServer;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::broken::{Broken, Call, Calls};
use crate::contract::{eventually_within, fail};
use crate::{FIXTURE_FAILED, Failure, Fixture};

mod nodes;
mod routing;
mod services;

pub use nodes::*;
pub use routing::*;
pub use services::*;

/// How long the manager may take to act on a change (its caches, its queues, the cloud's own settling).
pub const REACT: Duration = Duration::from_secs(60);

/// The namespace of the checks' services.
const NAMESPACE: &str = "default";

/// The pod network the route checks give the manager (`--cluster-cidr`).
const CLUSTER_CIDR: &str = "10.244.0.0/16";

/// The identity of the manager in the checks (`holderIdentity` of its Lease when it leads).
pub(crate) const IDENTITY: &str = "conformance_1";

/// A test API server, the fixture's cloud, and managers run over them.
pub(crate) struct Cluster<'f> {
    pub(crate) fixture: &'f dyn Fixture,
    pub(crate) server: TestApiServer,
    /// Every call the managers' providers were asked, across processes.
    pub(crate) calls: Arc<Calls>,
}

/// A manager running in this process; stopped (and its task aborted) when dropped.
pub(crate) struct Running {
    shutdown: CancellationToken,
    task: Option<JoinHandle<Result<(), kube_ccm_runtime::ManagerError>>>,
}

impl Running {
    /// Stops the manager and waits for it, as a SIGTERM would; a manager that failed fails the check.
    pub(crate) async fn stop(mut self) -> Result<(), Failure> {
        self.shutdown.cancel();
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        match tokio::time::timeout(REACT, task).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => fail(format!("the manager failed: {e}")),
            Ok(Err(e)) => fail(format!("the manager's task ended abnormally (a panic?): {e}")),
            Err(_) => fail(format!(
                "the manager did not stop within {REACT:?} of its shutdown"
            )),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl<'f> Cluster<'f> {
    pub(crate) async fn start(fixture: &'f dyn Fixture) -> Result<Cluster<'f>, Failure> {
        let server = TestApiServer::start().await.map_err(|e| {
            Failure(format!(
                "{FIXTURE_FAILED}: the test API server did not start: {e}"
            ))
        })?;
        Ok(Cluster {
            fixture,
            server,
            calls: Arc::default(),
        })
    }

    pub(crate) fn nodes(&self) -> Api<Node> {
        Api::all(self.server.client())
    }

    pub(crate) fn services(&self) -> Api<Service> {
        Api::namespaced(self.server.client(), NAMESPACE)
    }

    /// The controllers' settings in the checks: the fixture's cluster name, a pod network for routes,
    /// periods short enough that a check waits seconds, not minutes, and no node-deletion breaker.
    pub(crate) fn settings(&self) -> ControllerSettings {
        let mut settings = ControllerSettings::defaults(self.fixture.cluster_name());
        settings.cluster_cidrs = Cidr::parse_list(CLUSTER_CIDR).expect("a valid CIDR");
        settings.node_monitor_period = Duration::from_millis(500);
        settings.route_reconciliation_period = Duration::from_secs(1);
        // The checks judge the provider's answers: the breaker, which would hide a provider that answers
        // "gone" for every node during an outage, is off. A deletion still needs two answers a period apart.
        settings.node_deletion.breaker_ratio = 1.0;
        settings
    }

    /// A new manager process (a new provider from the fixture), run until stopped.
    pub(crate) async fn run(&self, election: Option<LeaderElectionConfig>) -> Result<Running, Failure> {
        let made = self.fixture.provider().await?;
        let provider: Arc<dyn CloudProvider> = Broken::watched_into(made, self.calls.clone());
        let registry = ControllerRegistry::builtin();
        let config = ManagerConfig {
            component: "cloud-controller-manager".into(),
            clients: ClientFactory::new(
                self.server.config(),
                "cloud-controller-manager",
                IDENTITY,
                1000.0,
                1000,
            ),
            leader_election: election,
            selection: ControllerSelection::default(),
            controllers: self.settings(),
        };
        let manager = Manager::new(config, registry, provider);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(manager.run(shutdown.clone()));
        Ok(Running {
            shutdown,
            task: Some(task),
        })
    }

    /// Launches an instance for `name` and registers its node as the kubelet does with an external cloud
    /// provider: tainted uninitialised, with `pod_cidr` if given. The node's name is the fixture's (a
    /// cloud may name nodes its own way, as AWS by private DNS name); the checks use the name returned.
    pub(crate) async fn register(&self, name: &str, pod_cidr: Option<&str>) -> Result<String, Failure> {
        let mut node = self.fixture.launch(name).await?;
        node.metadata.resource_version = None;
        let spec = node.spec.get_or_insert_with(Default::default);
        let mut taints = spec.taints.take().unwrap_or_default();
        taints.push(
            serde_json::from_value(
                serde_json::json!({"key": TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}),
            )
            .expect("a valid taint"),
        );
        spec.taints = Some(taints);
        if let Some(cidr) = pod_cidr {
            spec.pod_cidr = Some(cidr.to_owned());
            spec.pod_cidrs = Some(vec![cidr.to_owned()]);
        }
        node.status = None;
        let created = self
            .nodes()
            .create(&PostParams::default(), &node)
            .await
            .map_err(|e| kube_failed(&format!("create node {name}"), e))?;
        Ok(crate::contract::name_of(&created))
    }

    /// The node once the cloud-node controller has initialised it (its uninitialised taint is gone).
    pub(crate) async fn initialised(&self, name: &str) -> Result<Node, Failure> {
        let nodes = self.nodes();
        eventually_within(
            REACT,
            &format!("node {name} initialised (the {TAINT_UNINITIALIZED} taint removed)"),
            || async {
                let node = get(&nodes, name).await?;
                Ok(match &node {
                    Some(node) if !has_taint(node, TAINT_UNINITIALIZED) => Ok(node.clone()),
                    other => Err(format!("{:?}", other.as_ref().and_then(|n| n.spec.clone()))),
                })
            },
        )
        .await
    }

    /// Sets the node's `Ready` condition, as its kubelet (or the node-lifecycle controller of
    /// kube-controller-manager, for a silent kubelet) would.
    pub(crate) async fn set_ready(&self, name: &str, status: &str) -> Result<(), Failure> {
        let patch = serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": status}]}});
        self.nodes()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map(|_| ())
            .map_err(|e| kube_failed(&format!("set node {name} Ready={status}"), e))
    }

    /// Waits until a call of `method` began at or after `since` that `wanted` accepts (see [`Call`]).
    pub(crate) async fn until_called(
        &self,
        what: &str,
        method: &str,
        since: tokio::time::Instant,
        wanted: impl Fn(&Call) -> bool,
    ) -> Result<(), Failure> {
        eventually_within(REACT, what, || async {
            let calls = self.calls_of(&[method]);
            Ok(if calls.iter().any(|c| c.started >= since && wanted(c)) {
                Ok(())
            } else {
                Err(format!("{} calls of {method}, none so", calls.len()))
            })
        })
        .await
    }

    /// The calls made so far of method `method` (any of `methods`), in order.
    pub(crate) fn calls_of(&self, methods: &[&str]) -> Vec<Call> {
        self.calls
            .all()
            .into_iter()
            .filter(|c| methods.contains(&c.method))
            .collect()
    }
}

/// A request to the test API server failed: not the provider's failure, nor the fixture's, but a check
/// that cannot go on.
pub(crate) fn kube_failed(what: &str, error: kube::Error) -> Failure {
    Failure(format!(
        "{FIXTURE_FAILED}: {what} on the test API server: {error}"
    ))
}

pub(crate) async fn get<K>(api: &Api<K>, name: &str) -> Result<Option<K>, Failure>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name)
        .await
        .map_err(|e| kube_failed(&format!("get {name}"), e))
}

pub(crate) fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| taints.iter().any(|t| t.key == key))
}
