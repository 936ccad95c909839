//! Providers broken on purpose: the negative controls. Each [`Fault`] wraps a good provider and breaks one
//! promise the controllers rely on; the suite must fail the checks that guard it (and should pass the
//! others). Run them against your own fixture with [`WithFault`] to see the suite judge your cloud.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use cloud_provider::{
    CallContext, CloudError, CloudProvider, InstanceMetadata, InstancesV2, LoadBalancer, Routes,
};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};

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
}

impl Fault {
    /// Every fault.
    pub const ALL: [Fault; 3] = [
        Fault::GoneOnError,
        Fault::NonIdempotentEnsure,
        Fault::IgnoresDeadline,
    ];

    /// The checks the suite must fail for this fault.
    pub fn failed_checks(self) -> &'static [&'static str] {
        match self {
            Fault::GoneOnError => &["an_outage_is_an_error_never_gone"],
            Fault::NonIdempotentEnsure => &[
                "ensure_is_idempotent_and_a_second_ensure_writes_nothing",
                "a_new_process_adopts_an_existing_load_balancer",
            ],
            Fault::IgnoresDeadline => &[
                "a_call_abandoned_at_its_deadline_writes_nothing_later",
                "a_cancelled_call_writes_nothing_later",
            ],
        }
    }
}

/// A provider with `fault`, otherwise `inner`.
pub struct Broken {
    inner: Arc<dyn CloudProvider>,
    fault: Fault,
}

impl Broken {
    /// `inner` with `fault`.
    pub fn wrap(inner: Arc<dyn CloudProvider>, fault: Fault) -> Arc<dyn CloudProvider> {
        Arc::new(Broken { inner, fault })
    }
}

impl CloudProvider for Broken {
    fn provider_name(&self) -> &str {
        self.inner.provider_name()
    }

    fn owns_provider_id(&self, provider_id: &str) -> bool {
        self.inner.owns_provider_id(provider_id)
    }

    fn check_provider_id(&self, provider_id: &str) -> Result<(), String> {
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
            (Fault::GoneOnError, Err(_)) => Ok(false),
            (_, answer) => answer,
        }
    }
}

#[async_trait]
impl InstancesV2 for Broken {
    async fn instance_exists(&self, cx: &CallContext, node: &Node) -> Result<bool, CloudError> {
        let answer = self.instances()?.instance_exists(cx, node).await;
        self.gone_on_error(answer)
    }

    async fn instance_shutdown(&self, cx: &CallContext, node: &Node) -> Result<bool, CloudError> {
        self.instances()?.instance_shutdown(cx, node).await
    }

    async fn instance_metadata(&self, cx: &CallContext, node: &Node) -> Result<InstanceMetadata, CloudError> {
        self.instances()?.instance_metadata(cx, node).await
    }

    async fn instance_exists_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<bool, CloudError>> {
        match self.instances() {
            Ok(inner) => inner
                .instance_exists_batch(cx, nodes)
                .await
                .into_iter()
                .map(|answer| self.gone_on_error(answer))
                .collect(),
            Err(e) => nodes.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    async fn instance_shutdown_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<bool, CloudError>> {
        match self.instances() {
            Ok(inner) => inner.instance_shutdown_batch(cx, nodes).await,
            Err(e) => nodes.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    async fn instance_metadata_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<InstanceMetadata, CloudError>> {
        match self.instances() {
            Ok(inner) => inner.instance_metadata_batch(cx, nodes).await,
            Err(e) => nodes.iter().map(|_| Err(e.clone())).collect(),
        }
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
        self.balancer()?
            .get_load_balancer(cx, cluster_name, service)
            .await
    }

    fn load_balancer_name(&self, cluster_name: &str, service: &Service) -> String {
        match self.inner.load_balancer() {
            Some(inner) => inner.load_balancer_name(cluster_name, service),
            None => cloud_provider::default_load_balancer_name(service),
        }
    }

    async fn ensure_load_balancer(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<LoadBalancerStatus, CloudError> {
        let inner = self.balancer()?;
        match self.fault {
            Fault::NonIdempotentEnsure
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
            Fault::IgnoresDeadline => {
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

    async fn update_load_balancer(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<(), CloudError> {
        self.balancer()?
            .update_load_balancer(cx, cluster_name, service, nodes)
            .await
    }

    async fn ensure_load_balancer_deleted(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
    ) -> Result<(), CloudError> {
        self.balancer()?
            .ensure_load_balancer_deleted(cx, cluster_name, service)
            .await
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
