//! Providers broken on purpose: the negative controls. Each [`Fault`] wraps a good provider and breaks one
//! promise the controllers rely on; the suite must fail the checks that guard it (and should pass the
//! others). Run them against your own fixture with [`WithFault`] to see the suite judge your cloud.

use parking_lot::Mutex;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use kube_ccm_provider::{
    CallContext, CloudError, CloudProvider, ClusterLoadBalancer, Clusters, InitializeContext,
    InstanceMetadata, Instances, InstancesV2, LeadingContext, LoadBalancer, LoadBalancerClasses, Routes,
    Zones,
};
use tokio::time::Instant;

use crate::{Capability, CloudLoadBalancer, CloudRoute, Fixture, FixtureError};

/// A broken promise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// `instance_exists` answers "gone" when the cloud fails (upstream's #28901: every node deleted).
    GoneOnError,
    /// `ensure_load_balancer` makes another load balancer when one exists (leaks one per resync).
    NonIdempotentEnsure,
    /// `ensure_load_balancer` does its work in a spawned task with a context of its own, so it goes on
    /// after its call was abandoned (a write after the lock may have passed on).
    IgnoresDeadline,
    /// `list_load_balancers` lists load balancers by the cloud's ID, not by the name their services give
    /// them: the orphan sweep would take every live load balancer for an orphan.
    ListsByCloudId,
    /// `classes` declares a class (`conformance.example.com/refused`) that `ensure_load_balancer`
    /// refuses as `ImplementedElsewhere`: its services would keep the finalizer and never get an address.
    RefusesDeclaredClass,
}

/// The class [`Fault::RefusesDeclaredClass`] declares and refuses.
const REFUSED_CLASS: &str = "conformance.example.com/refused";

impl Fault {
    /// Every fault.
    pub const ALL: [Fault; 5] = [
        Fault::GoneOnError,
        Fault::NonIdempotentEnsure,
        Fault::IgnoresDeadline,
        Fault::ListsByCloudId,
        Fault::RefusesDeclaredClass,
    ];

    /// The checks the suite must fail for this fault.
    pub fn failed_checks(self) -> &'static [&'static str] {
        match self {
            Fault::GoneOnError => &[
                "an_outage_is_an_error_never_gone",
                "a_node_is_deleted_only_when_its_instance_is_gone",
            ],
            Fault::NonIdempotentEnsure => &[
                "ensure_is_idempotent_and_a_second_ensure_writes_nothing",
                "a_new_process_adopts_an_existing_load_balancer",
                "a_service_load_balancer_through_its_life",
            ],
            Fault::IgnoresDeadline => &[
                "a_call_abandoned_at_its_deadline_writes_nothing_later",
                "a_cancelled_call_writes_nothing_later",
                "no_cloud_write_lands_after_the_lock_is_lost",
            ],
            Fault::ListsByCloudId => &["listed_load_balancers_are_named_as_their_services_and_deleted_whole"],
            Fault::RefusesDeclaredClass => &["declared_classes_are_served"],
        }
    }
}

/// A provider with `fault`, otherwise `inner`. Inside the kit the same wrapper, without a fault, notes the
/// instance and load-balancer calls it forwards: the controllers checks judge from those notes that the
/// controllers did ask the provider (a check that asked nothing would pass anything).
pub struct Broken {
    inner: Arc<dyn CloudProvider>,
    fault: Option<Fault>,
    calls: Arc<Calls>,
}

impl Broken {
    /// `inner` with `fault`.
    pub fn wrap(inner: Arc<dyn CloudProvider>, fault: Fault) -> Arc<dyn CloudProvider> {
        Arc::new(Broken {
            inner,
            fault: Some(fault),
            calls: Arc::default(),
        })
    }

    /// `inner` unchanged, noting the calls made of it in `calls`.
    pub(crate) fn watched_into(inner: Arc<dyn CloudProvider>, calls: Arc<Calls>) -> Arc<dyn CloudProvider> {
        Arc::new(Broken {
            inner,
            fault: None,
            calls,
        })
    }
}

/// One call of the provider: which method, when it started and ended, and whether it failed (for a batch,
/// any of its answers).
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) method: &'static str,
    pub(crate) started: Instant,
    pub(crate) ended: Option<Instant>,
    pub(crate) failed: bool,
}

/// The calls made of a [`Broken`] provider, in the order they started.
#[derive(Debug, Default)]
pub(crate) struct Calls(Mutex<Vec<Call>>);

impl Calls {
    /// Every call so far.
    pub(crate) fn all(&self) -> Vec<Call> {
        self.0.lock().clone()
    }

    async fn note<T: Outcome>(&self, method: &'static str, call: impl Future<Output = T>) -> T {
        let index = {
            let mut log = self.0.lock();
            log.push(Call {
                method,
                started: Instant::now(),
                ended: None,
                failed: false,
            });
            log.len() - 1
        };
        let answer = call.await;
        let mut log = self.0.lock();
        log[index].ended = Some(Instant::now());
        log[index].failed = answer.failed();
        answer
    }
}

/// Whether a call's answer is a failure.
trait Outcome {
    fn failed(&self) -> bool;
}

impl<T> Outcome for Result<T, CloudError> {
    fn failed(&self) -> bool {
        self.is_err()
    }
}

impl<T> Outcome for Vec<Result<T, CloudError>> {
    fn failed(&self) -> bool {
        self.iter().any(Result::is_err)
    }
}

#[async_trait]
impl CloudProvider for Broken {
    fn provider_name(&self) -> &str {
        self.inner.provider_name()
    }

    async fn initialize(&self, context: InitializeContext) -> Result<(), CloudError> {
        self.inner.initialize(context).await
    }

    async fn start_leading(&self, context: LeadingContext) -> Result<(), CloudError> {
        self.inner.start_leading(context).await
    }

    fn instances(&self) -> Option<&dyn Instances> {
        self.inner.instances()
    }

    fn zones(&self) -> Option<&dyn Zones> {
        self.inner.zones()
    }

    fn clusters(&self) -> Option<&dyn Clusters> {
        self.inner.clusters()
    }

    fn owns_provider_id(&self, provider_id: &str) -> bool {
        self.inner.owns_provider_id(provider_id)
    }

    fn check_provider_id(&self, provider_id: &str) -> Result<(), kube_ccm_provider::Refused> {
        self.inner.check_provider_id(provider_id)
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        self.inner.instances_v2().map(|_| self as &dyn InstancesV2)
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        self.inner.load_balancer().map(|_| self as &dyn LoadBalancer)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        self.inner.routes()
    }

    fn has_cluster_id(&self) -> bool {
        self.inner.has_cluster_id()
    }
}

impl Broken {
    fn instances(&self) -> Result<&dyn InstancesV2, CloudError> {
        self.inner.instances_v2().ok_or(CloudError::NotImplemented)
    }

    fn balancer(&self) -> Result<&dyn LoadBalancer, CloudError> {
        self.inner.load_balancer().ok_or(CloudError::NotImplemented)
    }

    fn gone_on_error(&self, answer: Result<bool, CloudError>) -> Result<bool, CloudError> {
        match (self.fault, answer) {
            (Some(Fault::GoneOnError), Err(_)) => Ok(false),
            (_, answer) => answer,
        }
    }
}

#[async_trait]
impl InstancesV2 for Broken {
    async fn instance_exists(&self, cx: &CallContext, node: &Node) -> Result<bool, CloudError> {
        self.calls
            .note("instance_exists", async {
                let answer = self.instances()?.instance_exists(cx, node).await;
                self.gone_on_error(answer)
            })
            .await
    }

    async fn instance_shutdown(&self, cx: &CallContext, node: &Node) -> Result<bool, CloudError> {
        self.calls
            .note("instance_shutdown", async {
                self.instances()?.instance_shutdown(cx, node).await
            })
            .await
    }

    async fn instance_metadata(&self, cx: &CallContext, node: &Node) -> Result<InstanceMetadata, CloudError> {
        self.calls
            .note("instance_metadata", async {
                self.instances()?.instance_metadata(cx, node).await
            })
            .await
    }

    async fn instance_exists_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<bool, CloudError>> {
        let call = async {
            match self.instances() {
                Ok(inner) => inner
                    .instance_exists_batch(cx, nodes)
                    .await
                    .into_iter()
                    .map(|answer| self.gone_on_error(answer))
                    .collect(),
                Err(e) => nodes.iter().map(|_| Err(e.clone())).collect(),
            }
        };
        self.calls.note("instance_exists_batch", call).await
    }

    async fn instance_shutdown_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<bool, CloudError>> {
        let call = async {
            match self.instances() {
                Ok(inner) => inner.instance_shutdown_batch(cx, nodes).await,
                Err(e) => nodes.iter().map(|_| Err(e.clone())).collect(),
            }
        };
        self.calls.note("instance_shutdown_batch", call).await
    }

    async fn instance_metadata_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<InstanceMetadata, CloudError>> {
        let call = async {
            match self.instances() {
                Ok(inner) => inner.instance_metadata_batch(cx, nodes).await,
                Err(e) => nodes.iter().map(|_| Err(e.clone())).collect(),
            }
        };
        self.calls.note("instance_metadata_batch", call).await
    }
}

#[async_trait]
impl LoadBalancer for Broken {
    async fn get_load_balancer(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>, CloudError> {
        let call = async {
            self.balancer()?
                .get_load_balancer(cx, cluster_name, service)
                .await
        };
        self.calls.note("get_load_balancer", call).await
    }

    fn classes(&self) -> LoadBalancerClasses {
        let inner = self
            .inner
            .load_balancer()
            .map(LoadBalancer::classes)
            .unwrap_or_default();
        if self.fault != Some(Fault::RefusesDeclaredClass) {
            return inner;
        }
        let classes = inner.classes().iter().map(String::as_str).chain([REFUSED_CLASS]);
        LoadBalancerClasses::new(inner.serves_unclassed(), classes).unwrap_or(inner)
    }

    fn load_balancer_name(&self, cluster_name: &str, service: &Service) -> String {
        match self.inner.load_balancer() {
            Some(inner) => inner.load_balancer_name(cluster_name, service),
            None => kube_ccm_provider::default_load_balancer_name(service),
        }
    }

    async fn ensure_load_balancer(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<LoadBalancerStatus, CloudError> {
        let call = self.ensure(cx, cluster_name, service, nodes);
        self.calls.note("ensure_load_balancer", call).await
    }

    async fn update_load_balancer(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<(), CloudError> {
        let call = async {
            self.balancer()?
                .update_load_balancer(cx, cluster_name, service, nodes)
                .await
        };
        self.calls.note("update_load_balancer", call).await
    }

    async fn ensure_load_balancer_deleted(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
    ) -> Result<(), CloudError> {
        let call = async {
            self.balancer()?
                .ensure_load_balancer_deleted(cx, cluster_name, service)
                .await
        };
        self.calls.note("ensure_load_balancer_deleted", call).await
    }

    async fn list_load_balancers(
        &self,
        cx: &CallContext,
        cluster_name: &str,
    ) -> Result<Vec<ClusterLoadBalancer>, CloudError> {
        let mut listed = self.balancer()?.list_load_balancers(cx, cluster_name).await?;
        if self.fault == Some(Fault::ListsByCloudId) {
            for load_balancer in &mut listed {
                load_balancer.name = format!("lb-{}", load_balancer.name);
            }
        }
        Ok(listed)
    }

    async fn delete_load_balancer(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        load_balancer: &ClusterLoadBalancer,
    ) -> Result<(), CloudError> {
        self.balancer()?
            .delete_load_balancer(cx, cluster_name, load_balancer)
            .await
    }
}

impl Broken {
    /// `ensure_load_balancer` of the inner provider, or broken by the fault.
    async fn ensure(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<LoadBalancerStatus, CloudError> {
        let inner = self.balancer()?;
        match self.fault {
            Some(Fault::RefusesDeclaredClass)
                if kube_ccm_provider::service::load_balancer_class(service) == Some(REFUSED_CLASS) =>
            {
                Err(CloudError::ImplementedElsewhere)
            }
            Some(Fault::NonIdempotentEnsure)
                if inner
                    .get_load_balancer(cx, cluster_name, service)
                    .await?
                    .is_some() =>
            {
                // Made again under a name of its own, as a provider that names by time or random would.
                let mut another = service.clone();
                another.metadata.uid = Some(uuid::Uuid::new_v4().to_string());
                inner
                    .ensure_load_balancer(cx, cluster_name, &another, nodes)
                    .await?;
                inner.ensure_load_balancer(cx, cluster_name, service, nodes).await
            }
            Some(Fault::IgnoresDeadline) => {
                let provider = self.inner.clone();
                let (cluster, service, nodes) = (cluster_name.to_owned(), service.clone(), nodes.to_vec());
                let detached = tokio::spawn(async move {
                    let own = CallContext::with_timeout(Duration::from_secs(60));
                    let lb = provider.load_balancer().ok_or(CloudError::NotImplemented)?;
                    lb.ensure_load_balancer(&own, &cluster, &service, &nodes).await
                });
                detached.await.map_err(CloudError::provider)?
            }
            _ => inner.ensure_load_balancer(cx, cluster_name, service, nodes).await,
        }
    }
}

/// `fixture` whose providers have `fault`.
pub struct WithFault<F> {
    inner: F,
    fault: Fault,
}

impl<F: Fixture> WithFault<F> {
    /// `inner` with `fault` in every provider it makes.
    pub fn new(inner: F, fault: Fault) -> WithFault<F> {
        WithFault { inner, fault }
    }
}

#[async_trait]
impl<F: Fixture> Fixture for WithFault<F> {
    async fn provider(&self) -> Result<Arc<dyn CloudProvider>, FixtureError> {
        Ok(Broken::wrap(self.inner.provider().await?, self.fault))
    }

    fn unavailable(&self) -> Option<String> {
        self.inner.unavailable()
    }

    fn lacks(&self) -> &[Capability] {
        self.inner.lacks()
    }

    fn cluster_name(&self) -> &str {
        self.inner.cluster_name()
    }

    async fn launch(&self, name: &str) -> Result<Node, FixtureError> {
        self.inner.launch(name).await
    }

    async fn stop(&self, name: &str) -> Result<(), FixtureError> {
        self.inner.stop(name).await
    }

    async fn terminate(&self, name: &str) -> Result<(), FixtureError> {
        self.inner.terminate(name).await
    }

    async fn load_balancers(&self) -> Result<Vec<CloudLoadBalancer>, FixtureError> {
        self.inner.load_balancers().await
    }

    async fn routes(&self) -> Result<Vec<CloudRoute>, FixtureError> {
        self.inner.routes().await
    }

    async fn writes(&self) -> Result<u64, FixtureError> {
        self.inner.writes().await
    }

    async fn set_outage(&self, outage: bool) -> Result<(), FixtureError> {
        self.inner.set_outage(outage).await
    }

    async fn set_latency(&self, latency: Duration) -> Result<(), FixtureError> {
        self.inner.set_latency(latency).await
    }
}
