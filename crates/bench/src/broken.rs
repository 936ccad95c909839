//! `broken-ccm`: this framework's manager with the fake provider, deliberately broken in the one way
//! `NEGATIVE_CONTROL` names, so that each judge (the chaos verdict, the demo's, the audit) is seen to fail on
//! what it exists to catch. Test tooling, built only for the negative controls: nothing of it is a flag,
//! a feature or a code path of the shipped binary. It breaks the rules only the way a provider's own code
//! could, with the public API a provider's binary has.
//!
//! - `late-writes`: once the manager has returned (its lease lost or released), the process goes on
//!   writing for two seconds as the controller of its last load-balancer call: the Service patched, the
//!   load balancer updated, both under that controller's `User-Agent`.
//! - `anonymous`: every load-balancer ensure also makes a cloud change and a Service patch whose
//!   `User-Agent` names nobody.
//! - `leak`: a load balancer is never deleted (its delete answers success), and every ensure also makes
//!   a second load balancer for the same service (kept up to date with the first).
//! - `gone-when-not-ready`: the provider answers whether an instance exists from the node's status instead
//!   of its cloud: a not-ready node's instance is gone, a ready one's exists. It asks the cloud nothing, so
//!   no cloud fault (an error, a hang, a blind cloud) keeps a round from acting on it; the ready nodes
//!   cross-checked beside the not-ready ones keep the node-deletion breaker closed (half the nodes asked
//!   about are answered "gone", not more), and a node whose kubelet stalled is deleted.

use parking_lot::Mutex;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use kube::api::{Api, Patch, PatchParams};
use kube_ccm_fake::{CloudRequest, FakeCloudClient, FakeCloudConfig, FakeProvider};
use kube_ccm_provider::{
    CallContext, CloudError, CloudProvider, ClusterLoadBalancer, InstancesV2, LoadBalancer, Routes,
};
use kube_ccm_runtime::Registry;

/// The ways this binary is broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Broken {
    LateWrites,
    Anonymous,
    Leak,
    GoneWhenNotReady,
}

impl Broken {
    fn from_env() -> Result<Broken, String> {
        match std::env::var("NEGATIVE_CONTROL").as_deref() {
            Ok("late-writes") => Ok(Broken::LateWrites),
            Ok("anonymous") => Ok(Broken::Anonymous),
            Ok("leak") => Ok(Broken::Leak),
            Ok("gone-when-not-ready") => Ok(Broken::GoneWhenNotReady),
            other => Err(format!(
                "NEGATIVE_CONTROL={other:?}: expected late-writes, anonymous, leak or gone-when-not-ready"
            )),
        }
    }
}

/// The last load-balancer call this process made: who made it and on what.
#[derive(Debug, Clone)]
struct LastCall {
    caller: String,
    endpoint: String,
    load_balancer: String,
    namespace: String,
    service: String,
    nodes: Vec<String>,
}

static LAST_CALL: Mutex<Option<LastCall>> = Mutex::new(None);

/// A `User-Agent` that names no process and no controller.
const NOBODY: &str = "curl/8.0 (negative control)";

/// How long `late-writes` goes on after the manager returned.
const LATE: Duration = Duration::from_secs(2);

struct BrokenProvider {
    inner: FakeProvider,
    endpoint: String,
    broken: Broken,
}

fn service_name(service: &Service) -> (String, String) {
    (
        service.metadata.namespace.clone().unwrap_or_default(),
        service.metadata.name.clone().unwrap_or_default(),
    )
}

/// The kubeconfig the manager was given (the last `--kubeconfig`, as the manager reads it).
fn kubeconfig() -> Option<String> {
    std::env::args()
        .filter_map(|arg| arg.strip_prefix("--kubeconfig=").map(str::to_owned))
        .next_back()
}

/// A client with this `User-Agent`, from the manager's kubeconfig.
async fn client(user_agent: &str) -> Result<kube::Client, Box<dyn std::error::Error + Send + Sync>> {
    let path = kubeconfig().ok_or("no --kubeconfig")?;
    let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default()).await?;
    config
        .headers
        .push((http::header::USER_AGENT, http::HeaderValue::from_str(user_agent)?));
    Ok(kube::Client::try_from(config)?)
}

/// Patches an annotation of the service as `user_agent`.
async fn patch_service(user_agent: &str, namespace: &str, name: &str, value: &str) {
    let Ok(client) = client(user_agent).await else {
        return;
    };
    let services: Api<Service> = Api::namespaced(client, namespace);
    let patch = serde_json::json!({"metadata": {"annotations": {"negative-control/broken": value}}});
    let _ = services
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await;
}

#[async_trait]
impl LoadBalancer for BrokenProvider {
    fn classes(&self) -> kube_ccm_provider::LoadBalancerClasses {
        self.inner.classes()
    }

    async fn get_load_balancer(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>, CloudError> {
        self.inner.get_load_balancer(cx, cluster_name, service).await
    }

    async fn ensure_load_balancer(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<LoadBalancerStatus, CloudError> {
        let status = self
            .inner
            .ensure_load_balancer(cx, cluster_name, service, nodes)
            .await?;
        let (namespace, name) = service_name(service);
        let load_balancer = self.inner.load_balancer_name(cluster_name, service);
        let node_names: Vec<String> = nodes.iter().filter_map(|n| n.metadata.name.clone()).collect();
        let cloud = FakeCloudClient::new(&self.endpoint);
        match self.broken {
            Broken::LateWrites | Broken::GoneWhenNotReady => {}
            Broken::Anonymous => {
                let update = CloudRequest::UpdateLoadBalancer {
                    name: load_balancer.clone(),
                    nodes: node_names.clone(),
                };
                cloud.call_as(&update, "").await;
                patch_service(NOBODY, &namespace, &name, "anonymous").await;
            }
            Broken::Leak => {
                let second = CloudRequest::EnsureLoadBalancer {
                    name: format!("{load_balancer}-leak"),
                    service: format!("{namespace}/{name}"),
                    // Untagged: a leak no sweep may take for this cluster's.
                    cluster: String::new(),
                    ports: Vec::new(),
                    nodes: node_names.clone(),
                    ipv6: false,
                };
                cloud.call_within(&second, cx).await;
            }
        }
        {
            *LAST_CALL.lock() = Some(LastCall {
                caller: cx.caller().to_owned(),
                endpoint: self.endpoint.clone(),
                load_balancer,
                namespace,
                service: name,
                nodes: node_names,
            });
        }
        Ok(status)
    }

    async fn update_load_balancer(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<(), CloudError> {
        self.inner
            .update_load_balancer(cx, cluster_name, service, nodes)
            .await?;
        if self.broken == Broken::Leak {
            // The second load balancer is kept up to date: a leak that looks served.
            let second = CloudRequest::UpdateLoadBalancer {
                name: format!("{}-leak", self.inner.load_balancer_name(cluster_name, service)),
                nodes: nodes.iter().filter_map(|n| n.metadata.name.clone()).collect(),
            };
            FakeCloudClient::new(&self.endpoint)
                .call_within(&second, cx)
                .await;
        }
        Ok(())
    }

    async fn ensure_load_balancer_deleted(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
    ) -> Result<(), CloudError> {
        if self.broken == Broken::Leak {
            return Ok(());
        }
        self.inner
            .ensure_load_balancer_deleted(cx, cluster_name, service)
            .await
    }

    // The sweep as the real manager's: the leak's second load balancer is untagged, so it never takes it.
    async fn list_load_balancers(
        &self,
        cx: &CallContext,
        cluster_name: &str,
    ) -> Result<Vec<ClusterLoadBalancer>, CloudError> {
        self.inner.list_load_balancers(cx, cluster_name).await
    }

    async fn delete_load_balancer(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        load_balancer: &ClusterLoadBalancer,
    ) -> Result<(), CloudError> {
        self.inner
            .delete_load_balancer(cx, cluster_name, load_balancer)
            .await
    }
}

/// Whether the node's Ready condition is True.
fn ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[async_trait]
impl InstancesV2 for BrokenProvider {
    async fn instance_exists(&self, _: &CallContext, node: &Node) -> Result<bool, CloudError> {
        Ok(ready(node))
    }

    async fn instance_shutdown(&self, cx: &CallContext, node: &Node) -> Result<bool, CloudError> {
        self.instances()?.instance_shutdown(cx, node).await
    }

    async fn instance_metadata(
        &self,
        cx: &CallContext,
        node: &Node,
    ) -> Result<kube_ccm_provider::InstanceMetadata, CloudError> {
        self.instances()?.instance_metadata(cx, node).await
    }

    async fn instance_metadata_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<kube_ccm_provider::InstanceMetadata, CloudError>> {
        match self.instances() {
            Ok(inner) => inner.instance_metadata_batch(cx, nodes).await,
            Err(error) => nodes.iter().map(|_| Err(error.clone())).collect(),
        }
    }
}

impl BrokenProvider {
    /// The fake provider's instances.
    fn instances(&self) -> Result<&dyn InstancesV2, CloudError> {
        self.inner.instances_v2().ok_or(CloudError::NotImplemented)
    }
}

#[async_trait]
impl CloudProvider for BrokenProvider {
    fn provider_name(&self) -> &str {
        self.inner.provider_name()
    }

    fn owns_provider_id(&self, provider_id: &str) -> bool {
        self.inner.owns_provider_id(provider_id)
    }

    fn check_provider_id(&self, provider_id: &str) -> Result<(), kube_ccm_provider::Refused> {
        self.inner.check_provider_id(provider_id)
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        match self.broken {
            Broken::GoneWhenNotReady => Some(self),
            _ => self.inner.instances_v2(),
        }
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        Some(self)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        self.inner.routes()
    }

    fn has_cluster_id(&self) -> bool {
        self.inner.has_cluster_id()
    }
}

/// Writes as the controller of the last load-balancer call, for [`LATE`], after the manager returned.
fn write_late() {
    let Some(last) = LAST_CALL.lock().clone() else {
        return;
    };
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        return;
    };
    runtime.block_on(async {
        let cloud = FakeCloudClient::new(&last.endpoint);
        let until = tokio::time::Instant::now() + LATE;
        let mut round = 0u32;
        while tokio::time::Instant::now() < until {
            let update = CloudRequest::UpdateLoadBalancer {
                name: last.load_balancer.clone(),
                nodes: last.nodes.clone(),
            };
            cloud.call_as(&update, &last.caller).await;
            patch_service(
                &last.caller,
                &last.namespace,
                &last.service,
                &format!("late-{round}"),
            )
            .await;
            round += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
}

fn main() -> ExitCode {
    let broken = match Broken::from_env() {
        Ok(broken) => broken,
        Err(why) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("broken-ccm: {why}");
            }
            return ExitCode::from(2);
        }
    };
    let mut registry = Registry::new();
    let registered = registry.register_provider(kube_ccm_fake::PROVIDER_NAME, move |config| async move {
        let config = match config {
            Some(bytes) => FakeCloudConfig::parse(&bytes)?,
            None => FakeCloudConfig::default(),
        };
        let endpoint = config
            .endpoint
            .clone()
            .ok_or("broken-ccm acts on a shared fake cloud: its cloud-config needs an endpoint")?;
        let provider: Arc<dyn CloudProvider> = Arc::new(BrokenProvider {
            inner: FakeProvider::new(config),
            endpoint,
            broken,
        });
        Ok(provider)
    });
    if let Err(error) = registered {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("broken-ccm: {error}");
        }
        return ExitCode::FAILURE;
    }
    let code = ccm_demo::main(registry);
    if broken == Broken::LateWrites {
        write_late();
    }
    code
}
