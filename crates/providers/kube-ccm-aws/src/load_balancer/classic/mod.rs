//! Classic ELBs, as upstream makes them by default.
//!
//! - **What the service asks** ([`wanted`]): validation as upstream (session affinity `None`, no
//!   `loadBalancerIP`, TCP ports only, ports without a node port yet skipped), and every annotation of
//!   upstream's for classic ELBs (TLS listeners, attributes, access logs, proxy protocol, groups,
//!   health-check tuning, tags, target node labels).
//! - **Security groups**: `security-groups` if annotated; else `ElbSecurityGroup` if configured; else
//!   `k8s-elb-<name>` in the VPC, tagged for the cluster (and `additional-resource-tags`), open on the
//!   listener ports and to ICMP path-MTU discovery from `loadBalancerSourceRanges` (default `0.0.0.0/0`);
//!   then `extra-security-groups`. Each node's security group admits the ELB's first group (unless
//!   `DisableSecurityGroupIngress`).
//! - **Health check**: `TCP:<first node port>` (`SSL:` for an `ssl`/`https` backend), or
//!   `HTTP:<healthCheckNodePort>/healthz` for `externalTrafficPolicy: Local`, with upstream's timing,
//!   each overridable by annotation.
//! - **Attributes** are synced on every ensure, to upstream's defaults where not annotated, as upstream.
//! - Listeners (port, protocols, certificate), subnets, groups, policies, attributes, tags, health check
//!   and instances are compared and only differences changed.

use std::collections::BTreeSet;
use std::sync::Arc;

use aws_sdk_ec2::types::{IpPermission, IpRange, ResourceType, Tag as Ec2Tag, TagSpecification};
use aws_sdk_elasticloadbalancing::types::{Instance as ElbInstance, Listener, LoadBalancerDescription, Tag};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};
use kube_ccm_provider::{CloudError, default_load_balancer_name};

use super::{key_values, target_nodes};
use crate::{AwsProvider, aws_error};

mod settings;
mod wanted;

pub use wanted::{Wanted, WantedAttributes, WantedHealthCheck, WantedListener, wanted};

pub(super) fn status(description: &LoadBalancerDescription) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(vec![LoadBalancerIngress {
            hostname: description.dns_name().map(str::to_owned),
            ..LoadBalancerIngress::default()
        }]),
    }
}

/// `wanted` as the ELB API takes a listener.
fn listener(wanted: &WantedListener) -> Listener {
    Listener::builder()
        .protocol(&wanted.protocol)
        .load_balancer_port(wanted.port)
        .instance_protocol(&wanted.instance_protocol)
        .instance_port(wanted.node_port)
        .set_ssl_certificate_id(wanted.certificate.clone())
        .build()
        .expect("protocol and ports are set")
}

/// Whether the ELB's listener is `wanted` (protocols and certificates compared regardless of case, as
/// upstream's `elbListenersAreEqual`).
pub(super) fn same_listener(have: &Listener, wanted: &WantedListener) -> bool {
    let same = |a: Option<&str>, b: Option<&str>| match (a, b) {
        (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
        (a, b) => a.map(str::is_empty).unwrap_or(true) && b.map(str::is_empty).unwrap_or(true),
    };
    have.load_balancer_port() == wanted.port
        && have.instance_port() == wanted.node_port
        && have.protocol().eq_ignore_ascii_case(&wanted.protocol)
        && same(have.instance_protocol(), Some(&wanted.instance_protocol))
        && same(have.ssl_certificate_id(), wanted.certificate.as_deref())
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

    /// The ELB's security groups, first the one that node groups admit: `security-groups` if annotated,
    /// else the configured `ElbSecurityGroup`, else `k8s-elb-<name>` (created, tagged for the cluster, with
    /// exactly the wanted ingress); then `extra-security-groups`.
    async fn elb_security_groups(&self, vpc: &str, wanted: &Wanted) -> Result<Vec<String>, CloudError> {
        let mut groups = if !wanted.security_groups.is_empty() {
            wanted.security_groups.clone()
        } else if !self.config.elb_security_group.is_empty() {
            vec![self.config.elb_security_group.clone()]
        } else {
            vec![self.own_security_group(vpc, wanted).await?]
        };
        for extra in &wanted.extra_security_groups {
            if !groups.contains(extra) {
                groups.push(extra.clone());
            }
        }
        Ok(groups)
    }

    /// `k8s-elb-<name>`, made if missing, open on the listener ports and to ICMP path-MTU discovery
    /// (type 3, code 4) from the source ranges, and to nothing else.
    async fn own_security_group(&self, vpc: &str, wanted: &Wanted) -> Result<String, CloudError> {
        let group_name = format!("k8s-elb-{}", wanted.name);
        let id = match self.find_group(Some(vpc), &group_name).await? {
            Some(group) => group.group_id().unwrap_or_default().to_owned(),
            None => {
                let (key, value) = self.cluster_tag();
                let tags = [
                    (key, value),
                    ("kubernetes.io/service-name".to_owned(), wanted.service.clone()),
                ]
                .into_iter()
                .chain(wanted.tags.clone())
                .map(|(k, v)| Ec2Tag::builder().key(k).value(v).build());
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
                            .set_tags(Some(tags.collect()))
                            .build(),
                    )
                    .send()
                    .await
                    .map_err(aws_error)?;
                created.group_id().unwrap_or_default().to_owned()
            }
        };
        let group = self.find_group(Some(vpc), &group_name).await?;
        // (protocol, from, to, CIDR)
        let have: BTreeSet<(String, i32, i32, String)> = group
            .iter()
            .flat_map(|g| g.ip_permissions())
            .filter(|p| matches!(p.ip_protocol(), Some("tcp" | "icmp")))
            .flat_map(|p| {
                p.ip_ranges().iter().filter_map(move |r| {
                    Some((
                        p.ip_protocol()?.to_owned(),
                        p.from_port()?,
                        p.to_port()?,
                        r.cidr_ip()?.to_owned(),
                    ))
                })
            })
            .collect();
        let ports = wanted.listeners.iter().map(|l| ("tcp", l.port, l.port));
        let want: BTreeSet<(String, i32, i32, String)> = ports
            .chain([("icmp", 3, 4)])
            .flat_map(|(protocol, from, to)| {
                wanted
                    .source_ranges
                    .iter()
                    .map(move |r| (protocol.to_owned(), from, to, r.clone()))
            })
            .collect();
        let rule = |(protocol, from, to, cidr): &(String, i32, i32, String)| {
            IpPermission::builder()
                .ip_protocol(protocol)
                .from_port(*from)
                .to_port(*to)
                .ip_ranges(IpRange::builder().cidr_ip(cidr).build())
                .build()
        };
        let add: Vec<IpPermission> = want.difference(&have).map(rule).collect();
        let remove: Vec<IpPermission> = have.difference(&want).map(rule).collect();
        self.change_ingress(&id, add, remove).await?;
        Ok(id)
    }

    pub(super) async fn ensure_classic(
        &self,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<LoadBalancerStatus, CloudError> {
        let wanted = wanted(service)?;
        let instances = self
            .node_instances(&target_nodes(nodes, &wanted.target_node_labels))
            .await?;
        let vpc = self.vpc_of(&instances)?;
        let subnets = match &wanted.subnets {
            Some(subnets) => subnets.clone(),
            None => self.subnets(&vpc, wanted.internal).await?,
        };
        let groups = self.elb_security_groups(&vpc, &wanted).await?;
        let listeners: Vec<Listener> = wanted.listeners.iter().map(listener).collect();
        let description = match self.describe_elb(&wanted.name).await? {
            None => {
                let (key, value) = self.cluster_tag();
                let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build().expect("a tag has a key");
                let tags = [
                    tag(&key, &value),
                    tag("kubernetes.io/service-name", &wanted.service),
                ]
                .into_iter()
                .chain(wanted.tags.iter().map(|(k, v)| tag(k, v)));
                self.elb
                    .create_load_balancer()
                    .load_balancer_name(&wanted.name)
                    .set_listeners(Some(listeners))
                    .set_subnets(Some(subnets))
                    .set_security_groups(Some(groups.clone()))
                    .set_scheme(wanted.internal.then(|| "internal".to_owned()))
                    .set_tags(Some(tags.collect()))
                    .send()
                    .await
                    .map_err(aws_error)?;
                tracing::info!(name = %wanted.name, service = %wanted.service, "created a classic ELB");
                self.describe_elb(&wanted.name).await?.ok_or_else(|| {
                    CloudError::provider(format!("ELB {} vanished after it was created", wanted.name))
                })?
            }
            Some(existing) => {
                self.reconcile_elb(&existing, &wanted, subnets, &groups).await?;
                self.ensure_tags(&wanted).await?;
                existing
            }
        };
        self.ensure_proxy_protocol(&description, &wanted).await?;
        self.ensure_attributes(&wanted).await?;
        self.ensure_ssl_negotiation_policy(&description, &wanted).await?;
        self.ensure_health_check(&description, &wanted).await?;
        self.register(&wanted.name, &description, &instances).await?;
        let node_groups = self.node_groups(&instances).await?;
        self.node_ingress(&vpc, &groups[0], &node_groups, true).await?;
        Ok(status(&description))
    }

    /// Changes what differs on an existing ELB (one the in-tree provider made included): listeners,
    /// subnets, groups.
    async fn reconcile_elb(
        &self,
        existing: &LoadBalancerDescription,
        wanted: &Wanted,
        subnets: Vec<String>,
        groups: &[String],
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
        let have: Vec<&Listener> = existing
            .listener_descriptions()
            .iter()
            .filter_map(|d| d.listener())
            .collect();
        // A listener that differs in anything is deleted and made again (listeners are changed by port).
        let stale: Vec<i32> = have
            .iter()
            .filter(|h| !wanted.listeners.iter().any(|w| same_listener(h, w)))
            .map(|h| h.load_balancer_port())
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
        let missing: Vec<Listener> = wanted
            .listeners
            .iter()
            .filter(|w| !have.iter().any(|h| same_listener(h, w)))
            .map(listener)
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
        let have_groups: BTreeSet<&str> = existing.security_groups().iter().map(String::as_str).collect();
        let want_groups: BTreeSet<&str> = groups.iter().map(String::as_str).collect();
        if have_groups != want_groups {
            self.elb
                .apply_security_groups_to_load_balancer()
                .load_balancer_name(&wanted.name)
                .set_security_groups(Some(groups.to_vec()))
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
        let labels = key_values(service, "target-node-labels");
        let instances = self.node_instances(&target_nodes(nodes, &labels)).await?;
        self.register(&name, &description, &instances).await?;
        if let (Some(group), Some(vpc)) = (ingress_source(&description, service), description.vpc_id()) {
            let node_groups = self.node_groups(&instances).await?;
            self.node_ingress(vpc, &group, &node_groups, true).await?;
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
            self.find_group(Some(&vpc), &group_name).await?
        };
        let source = description
            .as_ref()
            .and_then(|d| ingress_source(d, service))
            .or_else(|| own_group.as_ref().and_then(|g| g.group_id().map(str::to_owned)));
        if let Some(group) = source.filter(|_| !vpc.is_empty()) {
            self.node_ingress(&vpc, &group, &BTreeSet::new(), false).await?;
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

/// The ELB's group that the nodes' groups admit: the first of `security-groups` when annotated, else
/// the first of its groups that is not one of `extra-security-groups` (the one made for it, or
/// `ElbSecurityGroup`), as upstream orders them.
fn ingress_source(description: &LoadBalancerDescription, service: &Service) -> Option<String> {
    let annotated = super::list(service, "security-groups");
    if let Some(first) = annotated.first() {
        return Some(first.clone());
    }
    let extra = super::list(service, "extra-security-groups");
    description
        .security_groups()
        .iter()
        .find(|group| !extra.contains(group))
        .or(description.security_groups().first())
        .cloned()
}

pub(crate) fn ec2_code<E: aws_sdk_ec2::error::ProvideErrorMetadata, R>(
    error: &aws_sdk_ec2::error::SdkError<E, R>,
) -> String {
    error
        .as_service_error()
        .and_then(|e| e.code())
        .unwrap_or_default()
        .to_owned()
}
