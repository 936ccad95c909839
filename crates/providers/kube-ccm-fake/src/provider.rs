//! The provider: `CloudProvider` over a [`FakeCloud`], in-process or over HTTP.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress, Service};
use kube_ccm_provider::service::{IpFamily, ip_families};
use kube_ccm_provider::{
    CallContext, Cidr, CloudError, CloudProvider, ClusterLoadBalancer, ClusterStack, InstanceMetadata,
    InstancesV2, LoadBalancer, LoadBalancerClasses, PodCidrs, PodCidrsError, Refused, Route, Routes,
};

use crate::cloud::FakeCloud;
use crate::config::FakeCloudConfig;
use crate::model::{FakeAddress, FakeInstance, FakeLoadBalancer, InstanceState, Knobs};
use crate::protocol::{CloudRequest, CloudResponse, NodeRef};
use crate::server::FakeCloudClient;

/// How long a throttled call waits before it is tried again (the fake cloud's bucket holds one second).
pub const THROTTLED_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The provider name (`--cloud-provider=fake`) and provider-ID scheme.
pub const PROVIDER_NAME: &str = "fake";

enum Backend {
    Local(FakeCloud),
    Remote(Box<FakeCloudClient>),
}

/// The fake cloud provider.
pub struct FakeProvider {
    backend: Backend,
    config: FakeCloudConfig,
}

/// The registry factory: builds the provider from `--cloud-config` bytes.
pub async fn factory(
    config: Option<Vec<u8>>,
) -> Result<Arc<dyn CloudProvider>, Box<dyn std::error::Error + Send + Sync>> {
    let config = match config {
        Some(bytes) => FakeCloudConfig::parse(&bytes)?,
        None => FakeCloudConfig::default(),
    };
    Ok(Arc::new(FakeProvider::new(config)))
}

impl FakeProvider {
    /// A provider for this configuration.
    pub fn new(config: FakeCloudConfig) -> FakeProvider {
        let backend = match &config.endpoint {
            Some(url) => Backend::Remote(Box::new(FakeCloudClient::new(url))),
            None => Backend::Local(FakeCloud::new(
                config.instances.clone(),
                Knobs {
                    latency_ms: config.latency_ms,
                    error_rate: config.error_rate,
                    hang_rate: 0.0,
                    lost_answer_rate: 0.0,
                },
            )),
        };
        FakeProvider { backend, config }
    }

    /// The load balancers' `ipMode` (`loadBalancerIPMode`).
    fn ip_mode(&self) -> Option<&str> {
        self.config.load_balancer_ip_mode.as_deref()
    }

    /// One call to the cloud, abandoned at the context's deadline or cancellation.
    async fn call(&self, cx: &CallContext, request: CloudRequest) -> Result<CloudResponse, CloudError> {
        // One request, one turn of the process's budget.
        cx.acquire().await?;
        let kind = request.kind();
        let response = cx
            .guard(async {
                Ok(match &self.backend {
                    Backend::Local(cloud) => cloud.handle_as(request, cx.caller()).await,
                    Backend::Remote(client) => client.call_within(&request, cx).await,
                })
            })
            .await?;
        match response {
            CloudResponse::Error {
                message,
                throttled: true,
                ..
            } => {
                let error = CloudError::Throttled {
                    after: THROTTLED_RETRY_AFTER,
                    message,
                };
                // Reported as a provider reports its requests: the budget pauses.
                cx.observe(kind, Duration::ZERO, Err(&error));
                Err(error)
            }
            CloudResponse::Error { message, .. } => Err(CloudError::provider(message)),
            other => Ok(other),
        }
    }

    /// The instance of each node, in order: found, absent, or an error (the cloud could not tell).
    async fn describe(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Result<Vec<Result<Option<FakeInstance>, CloudError>>, CloudError> {
        let nodes = nodes
            .iter()
            .map(|n| NodeRef {
                name: n.metadata.name.clone().unwrap_or_default(),
                provider_id: n.spec.as_ref().and_then(|s| s.provider_id.clone()),
            })
            .collect();
        self.describe_refs(cx, nodes).await
    }

    /// [`FakeProvider::describe`] by name and provider ID.
    async fn describe_refs(
        &self,
        cx: &CallContext,
        nodes: Vec<NodeRef>,
    ) -> Result<Vec<Result<Option<FakeInstance>, CloudError>>, CloudError> {
        let count = nodes.len();
        match self.call(cx, CloudRequest::DescribeInstances { nodes }).await? {
            CloudResponse::Instances { instances, unknown } if instances.len() == count => Ok(instances
                .into_iter()
                .enumerate()
                .map(|(index, instance)| {
                    if unknown.contains(&index) {
                        Err(CloudError::provider("the cloud cannot reach the instance's zone"))
                    } else {
                        Ok(instance)
                    }
                })
                .collect()),
            CloudResponse::Instances { instances, .. } => Err(CloudError::provider(format!(
                "{} answers for {count} nodes",
                instances.len()
            ))),
            other => Err(CloudError::provider(format!("unexpected answer {other:?}"))),
        }
    }
}

fn metadata(instance: &FakeInstance) -> InstanceMetadata {
    InstanceMetadata {
        provider_id: instance.provider_id(),
        instance_type: instance.instance_type.clone(),
        node_addresses: instance
            .addresses
            .iter()
            .map(|a| NodeAddress {
                type_: a.type_.clone(),
                address: a.address.clone(),
            })
            .collect(),
        zone: instance.zone.clone(),
        region: instance.region.clone(),
        additional_labels: instance.labels.clone().into_iter().collect::<BTreeMap<_, _>>(),
    }
}

fn node_names(nodes: &[Arc<Node>]) -> Vec<String> {
    nodes.iter().filter_map(|n| n.metadata.name.clone()).collect()
}

fn service_key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or_default(),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The load balancer's addresses for the service: one per family the service asks for that it has, in
/// the service's order; its IPv4 address when it has none of them (it serves what it can).
fn status(lb: &FakeLoadBalancer, service: &Service, mode: Option<&str>) -> LoadBalancerStatus {
    let mut ips: Vec<String> = ip_families(service)
        .into_iter()
        .filter_map(|family| match family {
            IpFamily::Ipv4 => Some(lb.ip.clone()),
            IpFamily::Ipv6 => lb.ipv6.clone(),
        })
        .collect();
    if ips.is_empty() {
        ips.push(lb.ip.clone());
    }
    let ingress = ips
        .into_iter()
        .map(|ip| LoadBalancerIngress {
            ip: Some(ip),
            ip_mode: mode.map(str::to_owned),
            ..LoadBalancerIngress::default()
        })
        .collect();
    LoadBalancerStatus {
        ingress: Some(ingress),
    }
}

#[async_trait]
impl InstancesV2 for FakeProvider {
    async fn instance_exists(&self, cx: &CallContext, node: &Node) -> Result<bool, CloudError> {
        let mut answers = self.instance_exists_batch(cx, &[Arc::new(node.clone())]).await;
        answers.pop().unwrap_or(Err(CloudError::InstanceNotFound))
    }

    async fn instance_shutdown(&self, cx: &CallContext, node: &Node) -> Result<bool, CloudError> {
        let mut answers = self.instance_shutdown_batch(cx, &[Arc::new(node.clone())]).await;
        answers.pop().unwrap_or(Err(CloudError::InstanceNotFound))
    }

    async fn instance_metadata(&self, cx: &CallContext, node: &Node) -> Result<InstanceMetadata, CloudError> {
        let mut answers = self.instance_metadata_batch(cx, &[Arc::new(node.clone())]).await;
        answers.pop().unwrap_or(Err(CloudError::InstanceNotFound))
    }

    async fn instance_exists_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<bool, CloudError>> {
        match self.describe(cx, nodes).await {
            Ok(instances) => instances.into_iter().map(|i| i.map(|i| i.is_some())).collect(),
            Err(error) => nodes.iter().map(|_| Err(error.clone())).collect(),
        }
    }

    async fn instance_shutdown_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<bool, CloudError>> {
        match self.describe(cx, nodes).await {
            Ok(instances) => instances
                .into_iter()
                .map(|i| {
                    i?.map(|i| i.state == InstanceState::Stopped)
                        .ok_or(CloudError::InstanceNotFound)
                })
                .collect(),
            Err(error) => nodes.iter().map(|_| Err(error.clone())).collect(),
        }
    }

    async fn instance_metadata_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<InstanceMetadata, CloudError>> {
        match self.describe(cx, nodes).await {
            Ok(instances) => instances
                .into_iter()
                .map(|i| i?.as_ref().map(metadata).ok_or(CloudError::InstanceNotFound))
                .collect(),
            Err(error) => nodes.iter().map(|_| Err(error.clone())).collect(),
        }
    }
}

/// The cloud allocator's answer: the instance's `pod_cidrs`, one of each family the stack names.
#[async_trait]
impl PodCidrs for FakeProvider {
    async fn pod_cidrs(
        &self,
        cx: &CallContext,
        provider_id: &str,
        stack: ClusterStack,
    ) -> Result<Vec<Cidr>, PodCidrsError> {
        let node = NodeRef {
            name: String::new(),
            provider_id: Some(provider_id.to_owned()),
        };
        let found = self.describe_refs(cx, vec![node]).await?.pop();
        let instance = match found {
            Some(Ok(Some(instance))) => instance,
            Some(Ok(None)) => return Err(PodCidrsError::InstanceNotFound(provider_id.to_owned())),
            Some(Err(error)) => return Err(error.into()),
            None => return Err(CloudError::provider("no answer for the instance").into()),
        };
        if instance.pod_cidrs.is_empty() {
            return Err(PodCidrsError::NoRanges(
                "has no ranges from which CIDRs can be allocated".to_owned(),
            ));
        }
        let cidrs: Vec<Cidr> = instance
            .pod_cidrs
            .iter()
            .map(|text| text.parse::<Cidr>())
            .collect::<Result<_, _>>()
            .map_err(|error| PodCidrsError::NoRanges(format!("has ranges that are not CIDRs: {error}")))?;
        stack.pick_from(&cidrs).ok_or(PodCidrsError::MissingFamily(stack))
    }
}

#[async_trait]
impl LoadBalancer for FakeProvider {
    /// The cloud-config's classes; none when they are invalid (a config built in code, not parsed).
    fn classes(&self) -> LoadBalancerClasses {
        self.config.classes().unwrap_or_else(|error| {
            tracing::error!(%error, "serving no load balancers");
            LoadBalancerClasses::new(false, Vec::<String>::new()).unwrap_or_default()
        })
    }

    /// Both families, in the service's order, unless the cloud-config says `loadBalancerIPv6: false`.
    fn check_ip_families(&self, service: &Service) -> Result<(), Refused> {
        if self.config.load_balancer_ipv6 || ip_families(service) == [IpFamily::Ipv4] {
            Ok(())
        } else {
            Err("this fake cloud's load balancers serve IPv4 only (loadBalancerIPv6: false)".into())
        }
    }

    async fn get_load_balancer(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>, CloudError> {
        let name = self.load_balancer_name(cluster_name, service);
        match self.call(cx, CloudRequest::GetLoadBalancer { name }).await? {
            CloudResponse::LoadBalancer { load_balancer } => {
                Ok(load_balancer.map(|lb| status(&lb, service, self.ip_mode())))
            }
            other => Err(CloudError::provider(format!("unexpected answer {other:?}"))),
        }
    }

    async fn ensure_load_balancer(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<LoadBalancerStatus, CloudError> {
        let ports = service
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .map(|ports| ports.iter().map(|p| p.port).collect())
            .unwrap_or_default();
        let request = CloudRequest::EnsureLoadBalancer {
            name: self.load_balancer_name(cluster_name, service),
            service: service_key(service),
            cluster: cluster_name.to_owned(),
            ports,
            nodes: node_names(nodes),
            ipv6: self.config.load_balancer_ipv6 && ip_families(service).contains(&IpFamily::Ipv6),
        };
        match self.call(cx, request).await? {
            CloudResponse::LoadBalancer {
                load_balancer: Some(lb),
            } => Ok(status(&lb, service, self.ip_mode())),
            other => Err(CloudError::provider(format!("unexpected answer {other:?}"))),
        }
    }

    async fn update_load_balancer(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<(), CloudError> {
        let name = self.load_balancer_name(cluster_name, service);
        self.call(
            cx,
            CloudRequest::UpdateLoadBalancer {
                name,
                nodes: node_names(nodes),
            },
        )
        .await
        .map(|_| ())
    }

    async fn ensure_load_balancer_deleted(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
    ) -> Result<(), CloudError> {
        let name = self.load_balancer_name(cluster_name, service);
        self.call(cx, CloudRequest::DeleteLoadBalancer { name })
            .await
            .map(|_| ())
    }

    /// Those tagged for the cluster; an untagged one is nobody's provably.
    async fn list_load_balancers(
        &self,
        cx: &CallContext,
        cluster_name: &str,
    ) -> Result<Vec<ClusterLoadBalancer>, CloudError> {
        let request = CloudRequest::ListLoadBalancers {
            cluster: cluster_name.to_owned(),
        };
        match self.call(cx, request).await? {
            CloudResponse::LoadBalancers { load_balancers } => Ok(load_balancers
                .into_iter()
                .map(|lb| ClusterLoadBalancer {
                    parts: vec![lb.name.clone()],
                    service: Some(lb.service).filter(|s| !s.is_empty()),
                    name: lb.name,
                })
                .collect()),
            other => Err(CloudError::provider(format!("unexpected answer {other:?}"))),
        }
    }

    async fn delete_load_balancer(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
        load_balancer: &ClusterLoadBalancer,
    ) -> Result<(), CloudError> {
        let name = load_balancer.name.clone();
        self.call(cx, CloudRequest::DeleteLoadBalancer { name })
            .await
            .map(|_| ())
    }
}

#[async_trait]
impl Routes for FakeProvider {
    async fn list_routes(&self, cx: &CallContext, _cluster_name: &str) -> Result<Vec<Route>, CloudError> {
        match self.call(cx, CloudRequest::ListRoutes).await? {
            CloudResponse::Routes { routes } => Ok(routes
                .into_iter()
                .map(|r| Route {
                    name: r.name,
                    blackhole: r.target_node.is_empty(),
                    target_node: r.target_node,
                    destination_cidr: r.destination_cidr,
                    // The fake routes by node: addresses are recorded, not compared.
                    enable_node_addresses: false,
                    target_node_addresses: r
                        .target_node_addresses
                        .into_iter()
                        .map(|a| NodeAddress {
                            type_: a.type_,
                            address: a.address,
                        })
                        .collect(),
                })
                .collect()),
            other => Err(CloudError::provider(format!("unexpected answer {other:?}"))),
        }
    }

    async fn create_route(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<(), CloudError> {
        let name = format!("{cluster_name}-{name_hint}");
        let request = CloudRequest::CreateRoute {
            name,
            target_node: route.target_node.clone(),
            destination_cidr: route.destination_cidr.clone(),
            target_node_addresses: route
                .target_node_addresses
                .iter()
                .map(|a| FakeAddress {
                    type_: a.type_.clone(),
                    address: a.address.clone(),
                })
                .collect(),
        };
        self.call(cx, request).await.map(|_| ())
    }

    async fn delete_route(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
        route: &Route,
    ) -> Result<(), CloudError> {
        self.call(
            cx,
            CloudRequest::DeleteRoute {
                name: route.name.clone(),
            },
        )
        .await
        .map(|_| ())
    }
}

#[async_trait]
impl CloudProvider for FakeProvider {
    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        self.config.load_balancers.then_some(self as &dyn LoadBalancer)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        self.config.routes.then_some(self as &dyn Routes)
    }

    fn pod_cidrs(&self) -> Option<&dyn PodCidrs> {
        Some(self)
    }

    fn has_cluster_id(&self) -> bool {
        self.config.cluster_id.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::FakeCloudServer;

    fn node(name: &str) -> Arc<Node> {
        Arc::new(serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap())
    }

    #[tokio::test]
    async fn a_shared_cloud_over_http_answers_like_the_local_one() {
        let server = FakeCloudServer::start(
            FakeCloud::new(vec![FakeInstance::running("n1", 1)], Knobs::default()),
            ([127, 0, 0, 1], 0).into(),
        )
        .await
        .unwrap();
        let config = FakeCloudConfig {
            endpoint: Some(server.url().to_owned()),
            ..FakeCloudConfig::default()
        };
        let provider = FakeProvider::new(config);
        let instances = provider.instances_v2().unwrap();
        let cx = CallContext::with_timeout(std::time::Duration::from_secs(10));
        let answers = instances
            .instance_metadata_batch(&cx, &[node("n1"), node("n2")])
            .await;
        assert_eq!(answers[0].as_ref().unwrap().provider_id, "fake://n1");
        assert!(matches!(answers[1], Err(CloudError::InstanceNotFound)));
        server
            .cloud()
            .handle(CloudRequest::Admin(crate::AdminRequest::SetInstanceState {
                name: "n1".into(),
                state: InstanceState::Stopped,
            }))
            .await;
        assert!(instances.instance_shutdown(&cx, &node("n1")).await.unwrap());
        assert!(instances.instance_exists(&cx, &node("n1")).await.unwrap());
        assert!(!instances.instance_exists(&cx, &node("n2")).await.unwrap());
    }

    #[tokio::test]
    async fn an_unreachable_zone_is_unknown_never_gone() {
        let mut elsewhere = FakeInstance::running("n2", 2);
        elsewhere.zone = "zone-b".into();
        let cloud = FakeCloud::new(vec![FakeInstance::running("n1", 1), elsewhere], Knobs::default());
        let provider = FakeProvider {
            backend: Backend::Local(cloud.clone()),
            config: FakeCloudConfig::default(),
        };
        let instances = provider.instances_v2().unwrap();
        let cx = CallContext::with_timeout(std::time::Duration::from_secs(10));
        let nodes = [node("n1"), node("n2"), node("gone")];
        let zone = FakeInstance::running("n1", 1).zone;
        cloud
            .handle(CloudRequest::Admin(crate::AdminRequest::SetZoneReachable {
                zone: zone.clone(),
                reachable: false,
            }))
            .await;
        let answers = instances.instance_exists_batch(&cx, &nodes).await;
        // n1's zone cannot be reached; n2's can; an instance not found anywhere reachable might be in it.
        assert!(answers[0].is_err(), "{answers:?}");
        assert!(matches!(answers[1], Ok(true)), "{answers:?}");
        assert!(answers[2].is_err(), "{answers:?}");
        cloud
            .handle(CloudRequest::Admin(crate::AdminRequest::SetZoneReachable {
                zone,
                reachable: true,
            }))
            .await;
        let answers = instances.instance_exists_batch(&cx, &nodes).await;
        let answers: Vec<bool> = answers.into_iter().map(Result::unwrap).collect();
        assert_eq!(answers, [true, true, false]);
    }

    #[tokio::test]
    async fn capabilities_follow_the_config() {
        let provider = factory(Some(b"loadBalancers: false\n".to_vec())).await.unwrap();
        assert!(provider.load_balancer().is_none());
        assert!(provider.routes().is_some());
        assert!(provider.instances_v2().is_some());
        let error = factory(Some(b"bogus: 1\n".to_vec())).await.err().unwrap();
        assert!(error.to_string().contains("unknown field `bogus`"), "{error}");
    }
}
