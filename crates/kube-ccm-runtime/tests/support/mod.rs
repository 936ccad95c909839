//! What the controller tests share: an API server (the test API server or a real kube-apiserver, by
//! `Backend`) and a fake cloud, a manager of the framework's controllers over them, and waiting for
//! conditions.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use control_plane::{ApiServer, Backend};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, ListParams};
use kube_ccm_fake::{
    AdminRequest, CloudRequest, CloudResponse, FakeCloud, FakeCloudConfig, FakeCloudServer, FakeInstance,
    FakeProvider, Knobs,
};
use kube_ccm_leadermigration::ControllerSelection;
use kube_ccm_leadermigration::user_agent::UserAgent;
use kube_ccm_provider::names::TAINT_UNINITIALIZED;
use kube_ccm_runtime::{
    Cidr, ClientFactory, ControllerRegistry, ControllerSettings, Manager, ManagerConfig, ManagerError,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

pub struct Cluster {
    pub server: ApiServer,
    pub cloud: FakeCloudServer,
}

impl Cluster {
    pub async fn start(backend: Backend, instances: Vec<FakeInstance>) -> Cluster {
        let server = ApiServer::for_test(backend).await;
        let cloud = FakeCloudServer::start(
            FakeCloud::new(instances, Knobs::default()),
            ([127, 0, 0, 1], 0).into(),
        )
        .await
        .unwrap();
        Cluster { server, cloud }
    }

    pub fn cloud_config(&self) -> FakeCloudConfig {
        FakeCloudConfig {
            endpoint: Some(self.cloud.url().to_owned()),
            ..FakeCloudConfig::default()
        }
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.server.client())
    }

    pub fn services(&self) -> Api<Service> {
        Api::namespaced(self.server.client(), "default")
    }

    pub async fn admin(&self, request: AdminRequest) {
        self.cloud.cloud().handle(CloudRequest::Admin(request)).await;
    }

    pub async fn snapshot(&self) -> CloudResponse {
        self.cloud
            .cloud()
            .handle(CloudRequest::Admin(AdminRequest::Snapshot))
            .await
    }

    /// Successful writes by `controller`, from the server's request log.
    pub fn writes_by(&self, controller: &str) -> Vec<control_plane::RequestRecord> {
        self.server
            .requests()
            .into_iter()
            .filter(|r| r.is_write() && (200..300).contains(&r.status))
            .filter(|r| UserAgent::parse(&r.user_agent).is_some_and(|ua| ua.controller == controller))
            .collect()
    }
}

pub fn settings() -> ControllerSettings {
    ControllerSettings {
        cluster_cidrs: Cidr::parse_list("10.244.0.0/16").unwrap(),
        node_monitor_period: Duration::from_millis(100),
        route_reconciliation_period: Duration::from_millis(200),
        node_status_update_frequency: Duration::from_secs(3600),
        ..ControllerSettings::defaults("test-cluster")
    }
}

pub struct Running {
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<Result<(), ManagerError>>,
}

impl Running {
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }
}

pub fn manager(cluster: &Cluster, cloud: FakeCloudConfig, settings: ControllerSettings) -> Manager {
    manager_as(cluster, cloud, settings, "test-host_1", &["*"])
}

/// A manager whose requests carry `identity` in their user agent, running `controllers` (as
/// `--controllers`).
pub fn manager_as(
    cluster: &Cluster,
    cloud: FakeCloudConfig,
    settings: ControllerSettings,
    identity: &str,
    controllers: &[&str],
) -> Manager {
    let registry = ControllerRegistry::builtin();
    let config = ManagerConfig {
        component: "cloud-controller-manager".into(),
        clients: ClientFactory::new(
            cluster.server.config(),
            "cloud-controller-manager",
            identity,
            1000.0,
            1000,
        ),
        leader_election: None,
        selection: ControllerSelection::parse(controllers, registry.catalog()).unwrap(),
        controllers: settings,
    };
    Manager::new(config, registry, Arc::new(FakeProvider::new(cloud)))
}

pub fn start(manager: Manager) -> Running {
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(manager.run(shutdown.clone()));
    Running { shutdown, task }
}

pub async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn node(name: &str, extra: serde_json::Value) -> Node {
    let mut value = json!({"metadata": {"name": name}});
    json_patch::merge(&mut value, &extra);
    serde_json::from_value(value).unwrap()
}

pub fn uninitialized() -> serde_json::Value {
    json!({"key": TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"})
}

pub fn ready(status: &str) -> serde_json::Value {
    json!({"status": {"conditions": [{"type": "Ready", "status": status}]}})
}

/// The node's taints but `node.kubernetes.io/not-ready`, which the API server's `TaintNodesByCondition`
/// admission gives every new node (kube-controller-manager's node lifecycle controller, not a cloud
/// controller, removes it).
pub async fn taint_keys(api: &Api<Node>, name: &str) -> Vec<String> {
    api.get(name)
        .await
        .unwrap()
        .spec
        .unwrap_or_default()
        .taints
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .filter(|key| key != "node.kubernetes.io/not-ready")
        .collect()
}

pub async fn events(cluster: &Cluster, reason: &str) -> Vec<Event> {
    let api: Api<Event> = Api::all(cluster.server.client());
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// The Events of `reason` once `enough` holds of them: a controller's Events are written in the
/// background, a moment after what they report.
pub async fn events_when(cluster: &Cluster, reason: &str, enough: impl Fn(&[Event]) -> bool) -> Vec<Event> {
    eventually(&format!("{reason} Events"), || async {
        enough(&events(cluster, reason).await)
    })
    .await;
    events(cluster, reason).await
}

/// Whether the service's status has a load balancer's address (the harness crate's check).
pub fn has_ingress(service: &Service) -> bool {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|ingress| !ingress.is_empty())
}

pub fn load_balancer_nodes(snapshot: &CloudResponse) -> Vec<Vec<String>> {
    match snapshot {
        CloudResponse::Snapshot { load_balancers, .. } => {
            load_balancers.iter().map(|lb| lb.nodes.clone()).collect()
        }
        other => panic!("not a snapshot: {other:?}"),
    }
}

/// The value of one series of the manager's exposition, written as it appears there (`name{labels}`, or the
/// bare name); 0 when absent.
pub fn sample(metrics: &kube_ccm_runtime::Metrics, series: &str) -> f64 {
    metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}
