//! Work for the controllers (nodes with cloud instances, LoadBalancer services) and the predicates that
//! tell it was done.

use std::time::Duration;

use anyhow::{Context, Result};
use kube::api::Api;

use crate::Cloud;

/// The cloud-node controller has initialised `node`: it no longer carries the uninitialized taint.
pub fn initialized(node: &k8s_openapi::api::core::v1::Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_none_or(|t| {
            t.iter()
                .all(|t| t.key != kube_ccm_provider::names::TAINT_UNINITIALIZED)
        })
}

/// `service` asks for a load balancer (`type: LoadBalancer`); a cluster has others (`default/kubernetes`).
pub fn is_load_balancer(service: &k8s_openapi::api::core::v1::Service) -> bool {
    service.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
}

/// The service-lb controller has served `service`: its status has an ingress.
pub fn has_ingress(service: &k8s_openapi::api::core::v1::Service) -> bool {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}

/// Keeps the controllers busy: new nodes (each with a cloud instance, the uninitialized taint and a pod
/// CIDR) and LoadBalancer services, so that every controller writes throughout a migration.
#[derive(Clone)]
pub struct Workload {
    client: kube::Client,
    cloud: Cloud,
}

/// What a workload created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Created {
    /// Nodes.
    pub nodes: u32,
    /// LoadBalancer services.
    pub services: u32,
}

impl Workload {
    /// A workload writing through `client`, with instances in the fake cloud at `cloud_url`.
    pub fn new(client: kube::Client, cloud_url: &str) -> Workload {
        Workload::on(client, Cloud::fake(cloud_url))
    }

    /// A workload writing through `client`, with instances in `cloud`.
    pub fn on(client: kube::Client, cloud: Cloud) -> Workload {
        Workload { client, cloud }
    }

    /// Node `index`: its instance first, then the Node (Ready, uninitialized, with a pod CIDR).
    pub async fn add_node(&self, index: u32) -> Result<()> {
        let name = self
            .cloud
            .add_instance(index)
            .await
            .with_context(|| format!("the instance of node {index}"))?;
        let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {
                "podCIDR": format!("10.244.{}.0/24", index % 256),
                "podCIDRs": [format!("10.244.{}.0/24", index % 256)],
                "taints": [{"key": kube_ccm_provider::names::TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}],
            },
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                "addresses": [{"type": "Hostname", "address": name}],
            },
        }))?;
        Api::all(self.client.clone())
            .create(&Default::default(), &node)
            .await
            .with_context(|| format!("create node {index}"))?;
        Ok(())
    }

    /// LoadBalancer service `index` in `default`.
    pub async fn add_service(&self, index: u32) -> Result<()> {
        let service: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("web-{index}")},
            "spec": {"type": "LoadBalancer", "selector": {"app": format!("web-{index}")}, "ports": [{"port": 80, "targetPort": 8080}]},
        }))?;
        Api::namespaced(self.client.clone(), "default")
            .create(&Default::default(), &service)
            .await
            .with_context(|| format!("create service {index}"))?;
        Ok(())
    }

    /// Every `period`, adds a node and a service, until `stop`.
    pub fn churn(
        self,
        period: Duration,
        first: u32,
        stop: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<Result<Created>> {
        self.churn_with(period, first, true, stop)
    }

    /// Every `period`, adds a service (no nodes), until `stop`.
    pub fn churn_services(
        self,
        period: Duration,
        first: u32,
        stop: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<Result<Created>> {
        self.churn_with(period, first, false, stop)
    }

    fn churn_with(
        self,
        period: Duration,
        first: u32,
        nodes: bool,
        stop: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<Result<Created>> {
        tokio::spawn(async move {
            let mut created = Created::default();
            let mut index = first;
            loop {
                if nodes {
                    self.add_node(index).await?;
                    created.nodes += 1;
                }
                self.add_service(index).await?;
                created.services += 1;
                index += 1;
                tokio::select! {
                    () = stop.cancelled() => return Ok(created),
                    () = tokio::time::sleep(period) => {}
                }
            }
        })
    }
}
