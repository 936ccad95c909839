//! Load balancers for `type: LoadBalancer` services.

use std::sync::Arc;

use kube_ccm::async_trait;
use kube_ccm::k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};
use kube_ccm::provider::{
    CallContext, CloudError, LoadBalancer, LoadBalancerClasses, default_load_balancer_name, service,
};

use crate::ExampleCloud;
use crate::cloud;

fn status(ip: &str) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(vec![LoadBalancerIngress {
            ip: Some(ip.to_owned()),
            ..LoadBalancerIngress::default()
        }]),
    }
}

fn names(nodes: &[Arc<Node>]) -> Vec<String> {
    let mut names: Vec<String> = nodes.iter().filter_map(|n| n.metadata.name.clone()).collect();
    names.sort();
    names
}

// ANCHOR: load_balancer
// Every method is idempotent: a call abandoned at its deadline is made again, perhaps by another process.
#[async_trait]
impl LoadBalancer for ExampleCloud {
    // ANCHOR: classes
    // Services without a class, and those that name this cloud's load balancer by its class (the
    // default: without a class only). Services of any other class are never handed over.
    fn classes(&self) -> LoadBalancerClasses {
        LoadBalancerClasses::new(true, ["example.com/lb"]).unwrap_or_default()
    }
    // ANCHOR_END: classes

    async fn get_load_balancer(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>, CloudError> {
        let name = default_load_balancer_name(service);
        let state = cx.guard(self.cloud.read()).await?;
        Ok(state
            .load_balancers
            .iter()
            .find(|lb| lb.name == name)
            .map(|lb| status(&lb.ip)))
    }

    async fn ensure_load_balancer(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<LoadBalancerStatus, CloudError> {
        let name = default_load_balancer_name(service);
        let ports = service
            .spec
            .iter()
            .flat_map(|s| s.ports.iter().flatten())
            .map(|p| p.port)
            .collect();
        let nodes = names(nodes);
        // What the service asks for, read as upstream's service helpers read it (a bad range is an
        // error naming the field, reported on the service as an Event).
        let source_ranges = service::load_balancer_source_ranges(service)?
            .iter()
            .map(ToString::to_string)
            .collect();
        let health_check =
            service::health_check_path_port(service).map(|(path, port)| (path.to_owned(), port));
        let ip = cx
            .guard(self.cloud.update(move |state| {
                if let Some(lb) = state.load_balancers.iter_mut().find(|lb| lb.name == name) {
                    lb.ports = ports;
                    lb.nodes = nodes;
                    lb.source_ranges = source_ranges;
                    lb.health_check = health_check;
                    return lb.ip.clone();
                }
                // The next free address of 203.0.113.0/24 (TEST-NET-3).
                let ip = (1..=254)
                    .map(|n| format!("203.0.113.{n}"))
                    .find(|ip| state.load_balancers.iter().all(|lb| &lb.ip != ip))
                    .unwrap_or_default();
                state.load_balancers.push(cloud::LoadBalancer {
                    name,
                    ip: ip.clone(),
                    ports,
                    nodes,
                    source_ranges,
                    health_check,
                });
                ip
            }))
            .await?;
        if ip.is_empty() {
            return Err(CloudError::provider("no free load-balancer address"));
        }
        Ok(status(&ip))
    }

    async fn update_load_balancer(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<(), CloudError> {
        let name = default_load_balancer_name(service);
        let nodes = names(nodes);
        cx.guard(self.cloud.update(move |state| {
            state
                .load_balancers
                .iter_mut()
                .filter(|lb| lb.name == name)
                .for_each(|lb| lb.nodes = nodes.clone());
        }))
        .await
    }

    async fn ensure_load_balancer_deleted(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<(), CloudError> {
        let name = default_load_balancer_name(service);
        cx.guard(
            self.cloud
                .update(move |state| state.load_balancers.retain(|lb| lb.name != name)),
        )
        .await
    }
}
// ANCHOR_END: load_balancer
