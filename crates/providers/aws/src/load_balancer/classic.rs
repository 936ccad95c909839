//! Classic ELBs, as upstream makes them by default.
//!
//! - **Validation** as upstream: session affinity `None`; no `loadBalancerIP`; TCP ports only (ports
//!   without a node port yet are skipped).
//! - **Security group**: `ElbSecurityGroup` if configured, else `k8s-elb-<name>` in the VPC, tagged for
//!   the cluster, open on the listener ports to `loadBalancerSourceRanges` (default `0.0.0.0/0`); each
//!   node's security group admits the ELB's (unless `DisableSecurityGroupIngress`).
//! - **Health check**: `TCP:<first node port>`, or `HTTP:<healthCheckNodePort>/healthz` for
//!   `externalTrafficPolicy: Local`; upstream's interval, timeout and thresholds.
//! - Listeners, subnets, groups, health check and instances are compared and only differences changed.

use std::collections::BTreeSet;
use std::sync::Arc;

use aws_sdk_ec2::types::{Filter, IpPermission, IpRange, ResourceType, Tag as Ec2Tag, TagSpecification};
use aws_sdk_elasticloadbalancing::types::{
    HealthCheck, Instance as ElbInstance, Listener, LoadBalancerDescription, Tag,
};
use cloud_provider::{CloudError, default_load_balancer_name};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};

use super::{PREFIX, annotated_subnets, is_internal};
use crate::{AwsProvider, aws_error};

/// Health-check settings as upstream's defaults for classic ELBs.
const HEALTH_INTERVAL: i32 = 10;
const HEALTH_TIMEOUT: i32 = 5;
const HEALTHY_THRESHOLD: i32 = 2;
const UNHEALTHY_THRESHOLD: i32 = 6;

/// What the service asks of its ELB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// The ELB's name.
    pub name: String,
    /// `(port, node port)` per TCP port.
    pub listeners: Vec<(i32, i32)>,
    /// Internal scheme.
    pub internal: bool,
    /// Who may connect (`loadBalancerSourceRanges`, default everyone).
    pub source_ranges: Vec<String>,
    /// The health check's target (`TCP:30080`).
    pub health_target: String,
    /// Subnets from the annotation.
    pub subnets: Option<Vec<String>>,
    /// `namespace/name`.
    pub service: String,
}

/// The service's ELB as upstream would make it, or why it cannot have one.
pub fn wanted(service: &Service) -> Result<Wanted, CloudError> {
    let spec = service.spec.clone().unwrap_or_default();
    let refuse = |why: String| Err(CloudError::provider(why));
    if spec.session_affinity.as_deref().is_some_and(|a| a != "None") {
        return refuse(format!(
            "session affinity {:?} is not supported by AWS load balancers",
            spec.session_affinity.unwrap_or_default()
        ));
    }
    if spec.load_balancer_ip.as_deref().is_some_and(|ip| !ip.is_empty()) {
        return refuse("spec.loadBalancerIP is not supported by AWS load balancers".into());
    }
    let mut listeners = Vec::new();
    for port in spec.ports.iter().flatten() {
        let protocol = port.protocol.as_deref().unwrap_or("TCP");
        if protocol != "TCP" {
            return refuse(format!(
                "port {}: protocol {protocol}: classic ELBs take TCP only ({PREFIX}type: nlb takes UDP)",
                port.port
            ));
        }
        if let Some(node_port) = port.node_port.filter(|p| *p > 0) {
            listeners.push((port.port, node_port));
        }
    }
    if listeners.is_empty() {
        return refuse("the service has no port with a node port yet".into());
    }
    let local = spec.external_traffic_policy.as_deref() == Some("Local");
    let health_target = match spec.health_check_node_port.filter(|p| *p > 0) {
        Some(port) if local => format!("HTTP:{port}/healthz"),
        _ => format!("TCP:{}", listeners[0].1),
    };
    let source_ranges = match spec.load_balancer_source_ranges.filter(|r| !r.is_empty()) {
        Some(ranges) => ranges,
        None => vec!["0.0.0.0/0".to_owned()],
    };
    let subnets = annotated_subnets(service);
    Ok(Wanted {
        name: default_load_balancer_name(service),
        listeners,
        internal: is_internal(service),
        source_ranges,
        health_target,
        subnets,
        service: format!(
            "{}/{}",
            service.metadata.namespace.as_deref().unwrap_or("default"),
            service.metadata.name.as_deref().unwrap_or_default()
        ),
    })
}

pub(super) fn status(description: &LoadBalancerDescription) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(vec![LoadBalancerIngress {
            hostname: description.dns_name().map(str::to_owned),
            ..LoadBalancerIngress::default()
        }]),
    }
}

impl AwsProvider {
    /// The ELB called `name`, if there is one.
    pub(crate) async fn describe_elb(
        &self,
        name: &str,
    ) -> Result<Option<LoadBalancerDescription>, CloudError> {
        match self
            .elb
            .describe_load_balancers()
            .load_balancer_names(name)
            .send()
            .await
        {
            Ok(output) => Ok(output.load_balancer_descriptions().first().cloned()),
            Err(error)
                if error
                    .as_service_error()
                    .is_some_and(|e| e.is_access_point_not_found_exception()) =>
            {
                Ok(None)
            }
            Err(error) => Err(aws_error(error)),
        }
    }

    /// The ELB's security group with exactly the wanted ingress: the configured one, or
    /// `k8s-elb-<name>` (created, tagged for the cluster).
    async fn elb_security_group(&self, vpc: &str, wanted: &Wanted) -> Result<String, CloudError> {
        if !self.config.elb_security_group.is_empty() {
            return Ok(self.config.elb_security_group.clone());
        }
        let group_name = format!("k8s-elb-{}", wanted.name);
        let id = match self.find_group(vpc, &group_name).await? {
            Some(group) => group.group_id().unwrap_or_default().to_owned(),
            None => {
                let (key, value) = self.cluster_tag();
                let created = self
                    .ec2
                    .create_security_group()
                    .group_name(&group_name)
                    .description(format!(
                        "Security group for Kubernetes ELB {} ({})",
                        wanted.name, wanted.service
                    ))
                    .vpc_id(vpc)
                    .tag_specifications(
                        TagSpecification::builder()
                            .resource_type(ResourceType::SecurityGroup)
                            .tags(Ec2Tag::builder().key(key).value(value).build())
                            .tags(
                                Ec2Tag::builder()
                                    .key("kubernetes.io/service-name")
                                    .value(&wanted.service)
                                    .build(),
                            )
                            .build(),
                    )
                    .send()
                    .await
                    .map_err(aws_error)?;
                created.group_id().unwrap_or_default().to_owned()
            }
        };
        let group = self.find_group(vpc, &group_name).await?;
        let have: BTreeSet<(i32, String)> = group
            .iter()
            .flat_map(|g| g.ip_permissions())
            .filter(|p| p.ip_protocol() == Some("tcp"))
            .flat_map(|p| {
                p.ip_ranges()
                    .iter()
                    .filter_map(move |r| Some((p.from_port()?, r.cidr_ip()?.to_owned())))
            })
            .collect();
        let want: BTreeSet<(i32, String)> = wanted
            .listeners
            .iter()
            .flat_map(|(port, _)| wanted.source_ranges.iter().map(move |r| (*port, r.clone())))
            .collect();
        let rule = |(port, cidr): &(i32, String)| {
            IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(*port)
                .to_port(*port)
                .ip_ranges(IpRange::builder().cidr_ip(cidr).build())
                .build()
        };
        let add: Vec<IpPermission> = want.difference(&have).map(rule).collect();
        let remove: Vec<IpPermission> = have.difference(&want).map(rule).collect();
        self.change_ingress(&id, add, remove).await?;
        Ok(id)
    }

    async fn find_group(
        &self,
        vpc: &str,
        name: &str,
    ) -> Result<Option<aws_sdk_ec2::types::SecurityGroup>, CloudError> {
        let output = self
            .ec2
            .describe_security_groups()
            .filters(Filter::builder().name("group-name").values(name).build())
            .filters(Filter::builder().name("vpc-id").values(vpc).build())
            .send()
            .await
            .map_err(aws_error)?;
        Ok(output.security_groups().first().cloned())
    }

    pub(super) async fn ensure_classic(
        &self,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<LoadBalancerStatus, CloudError> {
        let wanted = wanted(service)?;
        let instances = self.node_instances(nodes).await?;
        let vpc = self.vpc_of(&instances)?;
        let subnets = match &wanted.subnets {
            Some(subnets) => subnets.clone(),
            None => self.subnets(&vpc, wanted.internal).await?,
        };
        let group = self.elb_security_group(&vpc, &wanted).await?;
        let listeners: Vec<Listener> = wanted
            .listeners
            .iter()
            .map(|(port, node_port)| {
                Listener::builder()
                    .protocol("TCP")
                    .load_balancer_port(*port)
                    .instance_protocol("TCP")
                    .instance_port(*node_port)
                    .build()
                    .expect("protocol and ports are set")
            })
            .collect();
        let description = match self.describe_elb(&wanted.name).await? {
            None => {
                let (key, value) = self.cluster_tag();
                let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build().expect("a tag has a key");
                self.elb
                    .create_load_balancer()
                    .load_balancer_name(&wanted.name)
                    .set_listeners(Some(listeners))
                    .set_subnets(Some(subnets))
                    .security_groups(&group)
                    .set_scheme(wanted.internal.then(|| "internal".to_owned()))
                    .tags(tag(&key, &value))
                    .tags(tag("kubernetes.io/service-name", &wanted.service))
                    .send()
                    .await
                    .map_err(aws_error)?;
                tracing::info!(name = %wanted.name, service = %wanted.service, "created a classic ELB");
                self.describe_elb(&wanted.name).await?.ok_or_else(|| {
                    CloudError::provider(format!("ELB {} vanished after it was created", wanted.name))
                })?
            }
            Some(existing) => {
                self.reconcile_elb(&existing, &wanted, listeners, subnets, &group)
                    .await?;
                existing
            }
        };
        let health = description.health_check();
        if health.map(HealthCheck::target) != Some(wanted.health_target.as_str()) {
            self.elb
                .configure_health_check()
                .load_balancer_name(&wanted.name)
                .health_check(
                    HealthCheck::builder()
                        .target(&wanted.health_target)
                        .interval(HEALTH_INTERVAL)
                        .timeout(HEALTH_TIMEOUT)
                        .healthy_threshold(HEALTHY_THRESHOLD)
                        .unhealthy_threshold(UNHEALTHY_THRESHOLD)
                        .build()
                        .expect("every field is set"),
                )
                .send()
                .await
                .map_err(aws_error)?;
        }
        self.register(&wanted.name, &description, &instances).await?;
        let node_groups = self.node_groups(&instances).await?;
        self.node_ingress(&vpc, &group, &node_groups, true).await?;
        Ok(status(&description))
    }

    /// Changes what differs on an existing ELB (one the in-tree provider made included).
    async fn reconcile_elb(
        &self,
        existing: &LoadBalancerDescription,
        wanted: &Wanted,
        listeners: Vec<Listener>,
        subnets: Vec<String>,
        group: &str,
    ) -> Result<(), CloudError> {
        let internal = existing.scheme() == Some("internal");
        if internal != wanted.internal {
            return Err(CloudError::provider(format!(
                "ELB {} is {} and the service asks for {}: a scheme cannot change; delete the service's load balancer (recreate the service) to change it",
                wanted.name,
                if internal { "internal" } else { "internet-facing" },
                if wanted.internal {
                    "internal"
                } else {
                    "internet-facing"
                }
            )));
        }
        let have: Vec<(i32, i32)> = existing
            .listener_descriptions()
            .iter()
            .filter_map(|d| d.listener())
            .map(|l| (l.load_balancer_port(), l.instance_port()))
            .collect();
        let stale: Vec<i32> = have
            .iter()
            .filter(|h| !wanted.listeners.contains(h))
            .map(|(port, _)| *port)
            .collect();
        if !stale.is_empty() {
            self.elb
                .delete_load_balancer_listeners()
                .load_balancer_name(&wanted.name)
                .set_load_balancer_ports(Some(stale))
                .send()
                .await
                .map_err(aws_error)?;
        }
        let missing: Vec<Listener> = listeners
            .into_iter()
            .filter(|l| !have.contains(&(l.load_balancer_port(), l.instance_port())))
            .collect();
        if !missing.is_empty() {
            self.elb
                .create_load_balancer_listeners()
                .load_balancer_name(&wanted.name)
                .set_listeners(Some(missing))
                .send()
                .await
                .map_err(aws_error)?;
        }
        let have_subnets: BTreeSet<&str> = existing.subnets().iter().map(String::as_str).collect();
        let want_subnets: BTreeSet<&str> = subnets.iter().map(String::as_str).collect();
        let attach: Vec<String> = want_subnets
            .difference(&have_subnets)
            .map(|s| (*s).to_owned())
            .collect();
        if !attach.is_empty() {
            self.elb
                .attach_load_balancer_to_subnets()
                .load_balancer_name(&wanted.name)
                .set_subnets(Some(attach))
                .send()
                .await
                .map_err(aws_error)?;
        }
        let detach: Vec<String> = have_subnets
            .difference(&want_subnets)
            .map(|s| (*s).to_owned())
            .collect();
        if !detach.is_empty() {
            self.elb
                .detach_load_balancer_from_subnets()
                .load_balancer_name(&wanted.name)
                .set_subnets(Some(detach))
                .send()
                .await
                .map_err(aws_error)?;
        }
        if existing.security_groups() != [group.to_owned()] {
            self.elb
                .apply_security_groups_to_load_balancer()
                .load_balancer_name(&wanted.name)
                .security_groups(group)
                .send()
                .await
                .map_err(aws_error)?;
        }
        Ok(())
    }

    /// Registers the nodes' instances and deregisters the others.
    async fn register(
        &self,
        name: &str,
        description: &LoadBalancerDescription,
        instances: &[aws_sdk_ec2::types::Instance],
    ) -> Result<(), CloudError> {
        let have: BTreeSet<&str> = description
            .instances()
            .iter()
            .filter_map(|i| i.instance_id())
            .collect();
        let want: BTreeSet<&str> = instances.iter().filter_map(|i| i.instance_id()).collect();
        let elb_instance = |id: &&str| ElbInstance::builder().instance_id(*id).build();
        let add: Vec<ElbInstance> = want.difference(&have).map(elb_instance).collect();
        if !add.is_empty() {
            self.elb
                .register_instances_with_load_balancer()
                .load_balancer_name(name)
                .set_instances(Some(add))
                .send()
                .await
                .map_err(aws_error)?;
        }
        let remove: Vec<ElbInstance> = have.difference(&want).map(elb_instance).collect();
        if !remove.is_empty() {
            self.elb
                .deregister_instances_from_load_balancer()
                .load_balancer_name(name)
                .set_instances(Some(remove))
                .send()
                .await
                .map_err(aws_error)?;
        }
        Ok(())
    }

    pub(super) async fn update_classic(
        &self,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<(), CloudError> {
        let name = default_load_balancer_name(service);
        let Some(description) = self.describe_elb(&name).await? else {
            return Err(CloudError::provider(format!("ELB {name} does not exist (yet)")));
        };
        let instances = self.node_instances(nodes).await?;
        self.register(&name, &description, &instances).await?;
        if let (Some(group), Some(vpc)) = (description.security_groups().first(), description.vpc_id()) {
            let node_groups = self.node_groups(&instances).await?;
            self.node_ingress(vpc, group, &node_groups, true).await?;
        }
        Ok(())
    }

    pub(super) async fn delete_classic(&self, service: &Service) -> Result<(), CloudError> {
        let name = default_load_balancer_name(service);
        let description = self.describe_elb(&name).await?;
        let group_name = format!("k8s-elb-{name}");
        let vpc = description
            .as_ref()
            .and_then(|d| d.vpc_id().map(str::to_owned))
            .unwrap_or_else(|| self.config.vpc.clone());
        let own_group = if vpc.is_empty() || !self.config.elb_security_group.is_empty() {
            None
        } else {
            self.find_group(&vpc, &group_name).await?
        };
        if let Some(group) = own_group.as_ref().and_then(|g| g.group_id()) {
            self.node_ingress(&vpc, group, &BTreeSet::new(), false).await?;
        }
        if description.is_some() {
            self.elb
                .delete_load_balancer()
                .load_balancer_name(&name)
                .send()
                .await
                .map_err(aws_error)?;
            tracing::info!(name = %name, "deleted a classic ELB");
        }
        if let Some(group) = own_group.as_ref().and_then(|g| g.group_id()) {
            let tags = own_group
                .iter()
                .flat_map(|g| g.tags())
                .map(|t| (t.key().map(str::to_owned), t.value().map(str::to_owned)));
            if self.tagged_for_cluster(tags) {
                match self.ec2.delete_security_group().group_id(group).send().await {
                    Ok(_) => {}
                    // The ELB's network interfaces take a while to go: try again shortly.
                    Err(error) if ec2_code(&error) == "DependencyViolation" => {
                        return Err(CloudError::Retry {
                            after: std::time::Duration::from_secs(5),
                            message: format!("security group {group} is still in use by the deleted ELB"),
                        });
                    }
                    Err(error) => return Err(aws_error(error)),
                }
            }
        }
        Ok(())
    }
}

fn ec2_code<E: aws_sdk_ec2::error::ProvideErrorMetadata, R>(
    error: &aws_sdk_ec2::error::SdkError<E, R>,
) -> String {
    error
        .as_service_error()
        .and_then(|e| e.code())
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(value: serde_json::Value) -> Service {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn services_are_validated_and_mapped_as_upstream() {
        let base = serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "nodePort": 30080}, {"port": 443, "nodePort": 30443}, {"port": 8080}]},
        });
        let wanted = wanted(&service(base.clone())).unwrap();
        assert_eq!(wanted.name, "a0a1b2c3d4e5f60718293a4b5c6d7e8f");
        assert_eq!(wanted.listeners, [(80, 30080), (443, 30443)]);
        assert_eq!(wanted.health_target, "TCP:30080");
        assert_eq!(wanted.source_ranges, ["0.0.0.0/0"]);
        assert_eq!(wanted.service, "shop/web");
        let mut local = base.clone();
        local["spec"]["externalTrafficPolicy"] = "Local".into();
        local["spec"]["healthCheckNodePort"] = 32000.into();
        assert_eq!(
            super::wanted(&service(local)).unwrap().health_target,
            "HTTP:32000/healthz"
        );
        for (field, value, message) in [
            (
                "sessionAffinity",
                serde_json::json!("ClientIP"),
                "session affinity \"ClientIP\" is not supported by AWS load balancers",
            ),
            (
                "loadBalancerIP",
                serde_json::json!("1.2.3.4"),
                "spec.loadBalancerIP is not supported by AWS load balancers",
            ),
            (
                "ports",
                serde_json::json!([{"port": 53, "nodePort": 30053, "protocol": "UDP"}]),
                "port 53: protocol UDP: classic ELBs take TCP only (service.beta.kubernetes.io/aws-load-balancer-type: nlb takes UDP)",
            ),
            (
                "ports",
                serde_json::json!([{"port": 80}]),
                "the service has no port with a node port yet",
            ),
        ] {
            let mut bad = base.clone();
            bad["spec"][field] = value;
            assert_eq!(super::wanted(&service(bad)).unwrap_err().to_string(), message);
        }
    }
}
