//! Network load balancers (`service.beta.kubernetes.io/aws-load-balancer-type: nlb`), through ELBv2, as
//! upstream makes them:
//!
//! - The load balancer is named like a classic ELB (`a` + the service UID), so the in-tree provider's
//!   NLBs are adopted; type `network`, internal with `…-internal`, in the subnets a classic ELB would
//!   use, tagged for the cluster and the service.
//! - Per service port (TCP or UDP, with a node port): a target group of the nodes' instances on the node
//!   port, named as upstream (`k8s-<namespace:8>-<name:8>-<sha1 of the cluster ID, service, ports,
//!   protocols, target type and health check>[:10]`, so existing ones are found), and a listener
//!   forwarding to it. A changed port gets a new target group; the listener is pointed at it and the old
//!   group deleted.
//! - Health checks as upstream: TCP on the traffic port every 30 s (timeout 10 s, thresholds 3), or for
//!   `externalTrafficPolicy: Local` HTTP `/healthz` on the health-check node port every 10 s (thresholds
//!   2); with `ClusterServiceLoadBalancerHealthProbeMode = Shared`, HTTP on kube-proxy's port and path.
//! - Node security groups ([`super::security`]; unless `DisableSecurityGroupIngress`), as upstream: each node's group admits
//!   the clients (`loadBalancerSourceRanges`; else everyone, or the VPC for an internal NLB) on the node
//!   ports, and the NLB's subnets on the health-check ports (left out when the client rule already covers
//!   them), each rule described `kubernetes.io/rule/nlb/{client,health}=<name>` so it is found again and
//!   revoked when no longer wanted. Difference: UDP ports get UDP rules and TCP ports TCP rules (upstream
//!   opens every port with UDP when any is UDP); upstream's ICMP path-MTU rule is not added.
//! - Not yet: TLS listeners (`…-ssl-cert`), target-group attributes, static addresses.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, Listener, LoadBalancer as Nlb, LoadBalancerSchemeEnum, LoadBalancerTypeEnum,
    ProtocolEnum, Tag, TargetDescription, TargetGroup, TargetTypeEnum,
};
use cloud_provider::{CloudError, default_load_balancer_name};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};
use sha1::{Digest, Sha1};

use super::{annotated_subnets, is_internal};
use crate::{AwsProvider, aws_error};

/// A service port as the NLB serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// The listener's port.
    pub port: i32,
    /// TCP or UDP.
    pub protocol: ProtocolEnum,
    /// Where the targets listen.
    pub node_port: i32,
    /// The target group's health check.
    pub health: Health,
}

/// A target group's health check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// TCP or HTTP.
    pub protocol: ProtocolEnum,
    /// `traffic-port` or a port number.
    pub port: String,
    /// For HTTP.
    pub path: Option<String>,
    /// Seconds between checks.
    pub interval: i32,
    /// Seconds to wait.
    pub timeout: i32,
    /// Checks to pass.
    pub healthy: i32,
    /// Checks to fail.
    pub unhealthy: i32,
}

impl AwsProvider {
    /// The ports of `service` as listeners and target groups.
    pub fn nlb_mappings(&self, service: &Service) -> Result<Vec<Mapping>, CloudError> {
        let spec = service.spec.clone().unwrap_or_default();
        let local = spec.external_traffic_policy.as_deref() == Some("Local");
        let health = if local {
            Health {
                protocol: ProtocolEnum::Http,
                port: spec.health_check_node_port.unwrap_or_default().to_string(),
                path: Some("/healthz".into()),
                interval: 10,
                timeout: 10,
                healthy: 2,
                unhealthy: 2,
            }
        } else if self.config.cluster_service_load_balancer_health_probe_mode == "Shared" {
            Health {
                protocol: ProtocolEnum::Http,
                port: self
                    .config
                    .cluster_service_shared_load_balancer_health_probe_port
                    .to_string(),
                path: Some(
                    self.config
                        .cluster_service_shared_load_balancer_health_probe_path
                        .clone(),
                ),
                interval: 30,
                timeout: 10,
                healthy: 3,
                unhealthy: 3,
            }
        } else {
            Health {
                protocol: ProtocolEnum::Tcp,
                port: "traffic-port".into(),
                path: None,
                interval: 30,
                timeout: 10,
                healthy: 3,
                unhealthy: 3,
            }
        };
        let mut mappings = Vec::new();
        for port in spec.ports.iter().flatten() {
            let protocol = match port.protocol.as_deref().unwrap_or("TCP") {
                "TCP" => ProtocolEnum::Tcp,
                "UDP" => ProtocolEnum::Udp,
                other => {
                    return Err(CloudError::provider(format!(
                        "port {}: protocol {other}: NLBs take TCP and UDP",
                        port.port
                    )));
                }
            };
            if let Some(node_port) = port.node_port.filter(|p| *p > 0) {
                mappings.push(Mapping {
                    port: port.port,
                    protocol,
                    node_port,
                    health: health.clone(),
                });
            }
        }
        if mappings.is_empty() {
            return Err(CloudError::provider(
                "the service has no port with a node port yet",
            ));
        }
        Ok(mappings)
    }

    /// The target group's name for `mapping` of `service`, as upstream computes it.
    pub fn target_group_name(&self, service: &Service, mapping: &Mapping) -> String {
        let namespace = service.metadata.namespace.as_deref().unwrap_or("default");
        let name = service.metadata.name.as_deref().unwrap_or_default();
        let mut hasher = Sha1::new();
        for part in [
            self.config.cluster_id(),
            namespace,
            name,
            &mapping.port.to_string(),
            &mapping.node_port.to_string(),
            mapping.protocol.as_str(),
            TargetTypeEnum::Instance.as_str(),
            mapping.health.protocol.as_str(),
            &mapping.health.interval.to_string(),
        ] {
            hasher.update(part.as_bytes());
        }
        let digest: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
        let clean = |s: &str| {
            s.chars()
                .filter(char::is_ascii_alphanumeric)
                .take(8)
                .collect::<String>()
        };
        format!("k8s-{}-{}-{}", clean(namespace), clean(name), &digest[..10])
    }

    pub(crate) async fn describe_nlb(&self, name: &str) -> Result<Option<Nlb>, CloudError> {
        match self.elbv2.describe_load_balancers().names(name).send().await {
            Ok(output) => Ok(output.load_balancers().first().cloned()),
            Err(error)
                if error
                    .as_service_error()
                    .is_some_and(|e| e.is_load_balancer_not_found_exception()) =>
            {
                Ok(None)
            }
            Err(error) => Err(aws_error(error)),
        }
    }

    async fn target_group(&self, name: &str) -> Result<Option<TargetGroup>, CloudError> {
        match self.elbv2.describe_target_groups().names(name).send().await {
            Ok(output) => Ok(output.target_groups().first().cloned()),
            Err(error)
                if error
                    .as_service_error()
                    .is_some_and(|e| e.is_target_group_not_found_exception()) =>
            {
                Ok(None)
            }
            Err(error) => Err(aws_error(error)),
        }
    }

    fn nlb_tags(&self, service: &Service) -> Vec<Tag> {
        let (key, value) = (
            format!("kubernetes.io/cluster/{}", self.config.cluster_id()),
            "owned",
        );
        let service_name = format!(
            "{}/{}",
            service.metadata.namespace.as_deref().unwrap_or("default"),
            service.metadata.name.as_deref().unwrap_or_default()
        );
        vec![
            Tag::builder().key(key).value(value).build(),
            Tag::builder()
                .key("kubernetes.io/service-name")
                .value(service_name)
                .build(),
        ]
    }

    /// The target group for `mapping`, created when missing.
    async fn ensure_target_group(
        &self,
        service: &Service,
        mapping: &Mapping,
        vpc: &str,
    ) -> Result<String, CloudError> {
        let name = self.target_group_name(service, mapping);
        if let Some(group) = self.target_group(&name).await? {
            return Ok(group.target_group_arn().unwrap_or_default().to_owned());
        }
        let health = &mapping.health;
        let created = self
            .elbv2
            .create_target_group()
            .name(&name)
            .protocol(mapping.protocol.clone())
            .port(mapping.node_port)
            .vpc_id(vpc)
            .target_type(TargetTypeEnum::Instance)
            .health_check_protocol(health.protocol.clone())
            .health_check_port(&health.port)
            .set_health_check_path(health.path.clone())
            .health_check_interval_seconds(health.interval)
            .health_check_timeout_seconds(health.timeout)
            .healthy_threshold_count(health.healthy)
            .unhealthy_threshold_count(health.unhealthy)
            .set_tags(Some(self.nlb_tags(service)))
            .send()
            .await
            .map_err(aws_error)?;
        let arn = created
            .target_groups()
            .first()
            .and_then(|g| g.target_group_arn())
            .unwrap_or_default()
            .to_owned();
        tracing::info!(target_group = %name, "created an NLB target group");
        Ok(arn)
    }

    /// Registers exactly `instances` on `port` in the target group.
    async fn targets(&self, group: &str, port: i32, instances: &BTreeSet<String>) -> Result<(), CloudError> {
        let health = self
            .elbv2
            .describe_target_health()
            .target_group_arn(group)
            .send()
            .await
            .map_err(aws_error)?;
        let have: BTreeSet<String> = health
            .target_health_descriptions()
            .iter()
            .filter_map(|d| d.target()?.id().map(str::to_owned))
            .collect();
        let target = |id: &String| TargetDescription::builder().id(id).port(port).build();
        let add: Vec<TargetDescription> = instances.difference(&have).map(target).collect();
        // Upstream registers in chunks of 100.
        for chunk in add.chunks(100) {
            self.elbv2
                .register_targets()
                .target_group_arn(group)
                .set_targets(Some(chunk.to_vec()))
                .send()
                .await
                .map_err(aws_error)?;
        }
        let remove: Vec<TargetDescription> = have.difference(instances).map(target).collect();
        for chunk in remove.chunks(100) {
            self.elbv2
                .deregister_targets()
                .target_group_arn(group)
                .set_targets(Some(chunk.to_vec()))
                .send()
                .await
                .map_err(aws_error)?;
        }
        Ok(())
    }

    async fn listeners(&self, lb: &str) -> Result<Vec<Listener>, CloudError> {
        let output = self
            .elbv2
            .describe_listeners()
            .load_balancer_arn(lb)
            .send()
            .await
            .map_err(aws_error)?;
        Ok(output.listeners().to_vec())
    }

    pub(crate) async fn ensure_nlb(
        &self,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<LoadBalancerStatus, CloudError> {
        let mappings = self.nlb_mappings(service)?;
        let name = default_load_balancer_name(service);
        let instances = self.node_instances(nodes).await?;
        let vpc = self.vpc_of(&instances)?;
        let internal = is_internal(service);
        let lb = match self.describe_nlb(&name).await? {
            Some(lb) => {
                let is_internal = lb.scheme() == Some(&LoadBalancerSchemeEnum::Internal);
                if is_internal != internal {
                    return Err(CloudError::provider(format!(
                        "NLB {name}'s scheme cannot change; recreate the service to change {}internal",
                        if internal { "to " } else { "from " }
                    )));
                }
                lb
            }
            None => {
                let subnets = match annotated_subnets(service) {
                    Some(subnets) => subnets,
                    None => self.subnets(&vpc, internal).await?,
                };
                let created = self
                    .elbv2
                    .create_load_balancer()
                    .name(&name)
                    .r#type(LoadBalancerTypeEnum::Network)
                    .scheme(if internal {
                        LoadBalancerSchemeEnum::Internal
                    } else {
                        LoadBalancerSchemeEnum::InternetFacing
                    })
                    .set_subnets(Some(subnets))
                    .set_tags(Some(self.nlb_tags(service)))
                    .send()
                    .await
                    .map_err(aws_error)?;
                tracing::info!(name = %name, "created an NLB");
                created.load_balancers().first().cloned().ok_or_else(|| {
                    CloudError::provider(format!("NLB {name} was not returned by CreateLoadBalancer"))
                })?
            }
        };
        let lb_arn = lb.load_balancer_arn().unwrap_or_default().to_owned();
        let ids: BTreeSet<String> = instances
            .iter()
            .filter_map(|i| i.instance_id().map(str::to_owned))
            .collect();
        let listeners = self.listeners(&lb_arn).await?;
        let forwarded = |l: &Listener| -> Option<String> {
            l.default_actions()
                .iter()
                .find_map(|a| a.target_group_arn().map(str::to_owned))
        };
        let mut keep_groups = BTreeSet::new();
        let mut retired_groups = BTreeSet::new();
        for mapping in &mappings {
            let group = self.ensure_target_group(service, mapping, &vpc).await?;
            self.targets(&group, mapping.node_port, &ids).await?;
            keep_groups.insert(group.clone());
            let action = Action::builder()
                .r#type(ActionTypeEnum::Forward)
                .target_group_arn(&group)
                .build();
            match listeners.iter().find(|l| l.port() == Some(mapping.port)) {
                Some(listener)
                    if forwarded(listener).as_deref() == Some(group.as_str())
                        && listener.protocol() == Some(&mapping.protocol) => {}
                Some(listener) => {
                    self.elbv2
                        .modify_listener()
                        .listener_arn(listener.listener_arn().unwrap_or_default())
                        .protocol(mapping.protocol.clone())
                        .default_actions(action)
                        .send()
                        .await
                        .map_err(aws_error)?;
                    retired_groups.extend(forwarded(listener));
                }
                None => {
                    self.elbv2
                        .create_listener()
                        .load_balancer_arn(&lb_arn)
                        .port(mapping.port)
                        .protocol(mapping.protocol.clone())
                        .default_actions(action)
                        .send()
                        .await
                        .map_err(aws_error)?;
                }
            }
        }
        for listener in listeners
            .iter()
            .filter(|l| !mappings.iter().any(|m| Some(m.port) == l.port()))
        {
            self.elbv2
                .delete_listener()
                .listener_arn(listener.listener_arn().unwrap_or_default())
                .send()
                .await
                .map_err(aws_error)?;
            retired_groups.extend(forwarded(listener));
        }
        for group in retired_groups.difference(&keep_groups) {
            self.elbv2
                .delete_target_group()
                .target_group_arn(group)
                .send()
                .await
                .map_err(aws_error)?;
        }
        let subnets: Vec<String> = lb
            .availability_zones()
            .iter()
            .filter_map(|z| z.subnet_id().map(str::to_owned))
            .collect();
        let rules = self
            .wanted_nlb_rules(service, &name, &vpc, &subnets, &mappings)
            .await?;
        let node_groups = self.node_groups(&instances).await?;
        self.nlb_node_rules(&vpc, &name, &node_groups, &rules).await?;
        Ok(LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                hostname: lb.dns_name().map(str::to_owned),
                ..LoadBalancerIngress::default()
            }]),
        })
    }

    pub(crate) async fn update_nlb(&self, service: &Service, nodes: &[Arc<Node>]) -> Result<(), CloudError> {
        let name = default_load_balancer_name(service);
        let Some(lb) = self.describe_nlb(&name).await? else {
            return Err(CloudError::provider(format!("NLB {name} does not exist (yet)")));
        };
        let instances = self.node_instances(nodes).await?;
        let ids: BTreeSet<String> = instances
            .iter()
            .filter_map(|i| i.instance_id().map(str::to_owned))
            .collect();
        let groups: BTreeMap<String, i32> = self
            .listeners(lb.load_balancer_arn().unwrap_or_default())
            .await?
            .iter()
            .flat_map(|l| {
                l.default_actions()
                    .iter()
                    .filter_map(|a| a.target_group_arn().map(str::to_owned))
            })
            .map(|arn| (arn, 0))
            .collect();
        for group in groups.keys() {
            let described = self
                .elbv2
                .describe_target_groups()
                .target_group_arns(group)
                .send()
                .await
                .map_err(aws_error)?;
            let port = described
                .target_groups()
                .first()
                .and_then(TargetGroup::port)
                .unwrap_or_default();
            self.targets(group, port, &ids).await?;
        }
        Ok(())
    }

    pub(crate) async fn delete_nlb(&self, service: &Service) -> Result<(), CloudError> {
        let name = default_load_balancer_name(service);
        let Some(lb) = self.describe_nlb(&name).await? else {
            return Ok(());
        };
        let arn = lb.load_balancer_arn().unwrap_or_default().to_owned();
        let groups: BTreeSet<String> = self
            .listeners(&arn)
            .await?
            .iter()
            .flat_map(|l| {
                l.default_actions()
                    .iter()
                    .filter_map(|a| a.target_group_arn().map(str::to_owned))
            })
            .collect();
        if let Some(vpc) = lb.vpc_id() {
            self.nlb_node_rules(vpc, &name, &BTreeSet::new(), &BTreeSet::new())
                .await?;
        }
        self.elbv2
            .delete_load_balancer()
            .load_balancer_arn(&arn)
            .send()
            .await
            .map_err(aws_error)?;
        tracing::info!(name = %name, "deleted an NLB");
        for group in groups {
            match self
                .elbv2
                .delete_target_group()
                .target_group_arn(&group)
                .send()
                .await
            {
                Ok(_) => {}
                Err(error)
                    if error
                        .as_service_error()
                        .is_some_and(|e| e.is_resource_in_use_exception()) =>
                {
                    return Err(CloudError::Retry {
                        after: std::time::Duration::from_secs(5),
                        message: format!("target group {group} is still in use by the deleted NLB"),
                    });
                }
                Err(error) => return Err(aws_error(error)),
            }
        }
        Ok(())
    }

    pub(crate) async fn get_nlb(&self, service: &Service) -> Result<Option<LoadBalancerStatus>, CloudError> {
        Ok(self
            .describe_nlb(&default_load_balancer_name(service))
            .await?
            .map(|lb| LoadBalancerStatus {
                ingress: Some(vec![LoadBalancerIngress {
                    hostname: lb.dns_name().map(str::to_owned),
                    ..LoadBalancerIngress::default()
                }]),
            }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider(cluster: &str) -> AwsProvider {
        let config = crate::CloudConfig::parse(&format!("[Global]\nKubernetesClusterID = {cluster}\n"))
            .unwrap()
            .config;
        let sdk = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .build();
        AwsProvider::new(config, &sdk)
    }

    fn service(namespace: &str, name: &str, local: bool) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "ports": [{"port": 80, "nodePort": 30080}, {"port": 53, "nodePort": 30053, "protocol": "UDP"}, {"port": 9, "protocol": "SCTP"}],
                "externalTrafficPolicy": if local { "Local" } else { "Cluster" },
                "healthCheckNodePort": 32000,
            },
        }))
        .unwrap()
    }

    #[test]
    fn target_group_names_and_health_checks_are_upstreams() {
        // Known answers: SHA-1 of the concatenated fields, computed independently (Python's hashlib).
        let aws = provider("test");
        let plain = service("shop", "web", false);
        let mut ports = plain.clone();
        ports.spec.as_mut().unwrap().ports.as_mut().unwrap().pop();
        let mappings = aws.nlb_mappings(&ports).unwrap();
        assert_eq!(
            mappings[0].health,
            Health {
                protocol: ProtocolEnum::Tcp,
                port: "traffic-port".into(),
                path: None,
                interval: 30,
                timeout: 10,
                healthy: 3,
                unhealthy: 3
            }
        );
        assert_eq!(
            aws.target_group_name(&ports, &mappings[0]),
            "k8s-shop-web-bd644d32df"
        );
        let prod = provider("prod");
        let mut local = service("kube-system", "my_service.v2", true);
        local.spec.as_mut().unwrap().ports.as_mut().unwrap().pop();
        let mappings = prod.nlb_mappings(&local).unwrap();
        assert_eq!(mappings[1].health.port, "32000");
        assert_eq!(mappings[1].health.path.as_deref(), Some("/healthz"));
        assert_eq!(
            prod.target_group_name(&local, &mappings[1]),
            "k8s-kubesyst-myservic-06f3a16636"
        );
        assert_eq!(
            aws.nlb_mappings(&plain).unwrap_err().to_string(),
            "port 9: protocol SCTP: NLBs take TCP and UDP"
        );
    }
}
