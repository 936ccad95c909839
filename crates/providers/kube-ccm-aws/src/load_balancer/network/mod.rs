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
//! - Health checks, TLS listeners, attributes, target-group attributes, static addresses, tags and
//!   target node labels from upstream's annotations ([`wanted`]); a target group whose health check
//!   differs in port, path or thresholds is modified, one whose protocol or interval differs (they are in
//!   its name) is replaced.
//! - Node security groups ([`super::security`]; unless `DisableSecurityGroupIngress`), as upstream: each node's group admits
//!   the clients (`loadBalancerSourceRanges`; else everyone, or the VPC for an internal NLB) on the node
//!   ports, and the NLB's subnets on the health-check ports (left out when the client rule already covers
//!   them), each rule described `kubernetes.io/rule/nlb/{client,health}=<name>` so it is found again and
//!   revoked when no longer wanted. Difference: UDP ports get UDP rules and TCP ports TCP rules (upstream
//!   opens every port with UDP when any is UDP); upstream's ICMP path-MTU rule is not added.
//! - With `NLBSecurityGroupMode = Managed`, the NLB gets a security group of its own (`security_group.rs`).
//! - `ipv4` or `dualstack` as the service's IP families or annotation ask (`families.rs`; not upstream's,
//!   which makes `ipv4` NLBs only).
//! - Each ensure decides, then acts: `plan.rs` decides from what ELBv2 holds and what the service asks
//!   (pure, tested case by case), in stages where a decision needs what an earlier request found or made
//!   (the NLB's ARN, each target group's); the methods here send the requests.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, Certificate, Listener, LoadBalancer as Nlb, LoadBalancerAttribute,
    LoadBalancerSchemeEnum, LoadBalancerTypeEnum, ProtocolEnum, Tag, TargetDescription, TargetGroup,
    TargetGroupAttribute, TargetTypeEnum,
};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};
use kube_ccm_provider::{CloudError, default_load_balancer_name};
use sha1::{Digest, Sha1};

use super::{annotated_subnets, is_internal, key_values, target_nodes};
use crate::{AwsProvider, aws_error};

mod families;
mod plan;
mod security_group;
mod wanted;

pub(crate) use families::check as check_ip_families;

use plan::{ListenerStep, NlbStep, TargetGroupStep};
pub use security_group::{DESCRIPTION as MANAGED_GROUP_DESCRIPTION, nlb_security_group_name};
use wanted::subnet_mappings;
pub use wanted::{Health, Mapping, NlbAttributes, SharedProbe, WantedNlb, wanted};

/// Upstream's name of an NLB's target group or security group: `k8s-<namespace:8>-<name:8>-<digest:10>`,
/// the namespace and name with alphanumerics only, the digest in hex.
fn resource_name(namespace: &str, name: &str, digest: &[u8]) -> String {
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let clean = |s: &str| {
        s.chars()
            .filter(char::is_ascii_alphanumeric)
            .take(8)
            .collect::<String>()
    };
    format!("k8s-{}-{}-{}", clean(namespace), clean(name), &hex[..10])
}

/// A listener's action: forward to `group`.
fn forward(group: &str) -> Action {
    Action::builder()
        .r#type(ActionTypeEnum::Forward)
        .target_group_arn(group)
        .build()
}

/// A TLS listener's certificate, as ELBv2 takes it.
fn certificates(mapping: &Mapping) -> Option<Vec<Certificate>> {
    mapping
        .certificate
        .as_ref()
        .map(|arn| vec![Certificate::builder().certificate_arn(arn).build()])
}

/// The service's status: the NLB's DNS name.
fn nlb_status(lb: &Nlb) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(vec![LoadBalancerIngress {
            hostname: lb.dns_name().map(str::to_owned),
            ..LoadBalancerIngress::default()
        }]),
    }
}

impl AwsProvider {
    /// What `service` asks of its NLB, with this provider's health-probe mode.
    pub fn wanted_nlb(&self, service: &Service) -> Result<WantedNlb, CloudError> {
        let shared =
            (self.config.cluster_service_load_balancer_health_probe_mode == "Shared").then(|| SharedProbe {
                port: self.config.cluster_service_shared_load_balancer_health_probe_port,
                path: self
                    .config
                    .cluster_service_shared_load_balancer_health_probe_path
                    .clone(),
            });
        wanted(service, shared.as_ref(), self.nlb_groups_managed())
    }

    /// The ports of `service` as listeners and target groups.
    pub fn nlb_mappings(&self, service: &Service) -> Result<Vec<Mapping>, CloudError> {
        Ok(self.wanted_nlb(service)?.mappings)
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
            mapping.traffic_protocol.as_str(),
            TargetTypeEnum::Instance.as_str(),
            mapping.health.protocol.as_str(),
            &mapping.health.interval.to_string(),
        ] {
            hasher.update(part.as_bytes());
        }
        resource_name(namespace, name, &hasher.finalize())
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

    /// The tags of what is made for `service`: the cluster's, the service's, and `additional-resource-tags`.
    fn nlb_tags(&self, service: &Service, additional: &BTreeMap<String, String>) -> Vec<Tag> {
        let service_name = format!(
            "{}/{}",
            service.metadata.namespace.as_deref().unwrap_or("default"),
            service.metadata.name.as_deref().unwrap_or_default()
        );
        [
            (
                format!("kubernetes.io/cluster/{}", self.config.cluster_id()),
                "owned".to_owned(),
            ),
            ("kubernetes.io/service-name".to_owned(), service_name),
        ]
        .into_iter()
        .chain(additional.clone())
        .map(|(key, value)| Tag::builder().key(key).value(value).build())
        .collect()
    }

    /// The target group for `mapping`, created when missing; its health check's port, path and thresholds
    /// modified where they differ ([`plan::target_group`]), as upstream's `ensureTargetGroup`.
    async fn ensure_target_group(
        &self,
        service: &Service,
        wanted: &WantedNlb,
        mapping: &Mapping,
        vpc: &str,
    ) -> Result<String, CloudError> {
        let name = self.target_group_name(service, mapping);
        let health = &mapping.health;
        let found = self.target_group(&name).await?;
        match plan::target_group(found.as_ref(), health) {
            TargetGroupStep::Keep(arn) => Ok(arn),
            TargetGroupStep::Modify(arn) => {
                self.elbv2
                    .modify_target_group()
                    .target_group_arn(&arn)
                    .health_check_port(&health.port)
                    .healthy_threshold_count(health.healthy)
                    .unhealthy_threshold_count(health.unhealthy)
                    .set_health_check_path(
                        health
                            .path
                            .clone()
                            .filter(|_| health.protocol != ProtocolEnum::Tcp),
                    )
                    .send()
                    .await
                    .map_err(aws_error)?;
                Ok(arn)
            }
            TargetGroupStep::Create => {
                self.create_target_group(service, wanted, mapping, vpc, &name)
                    .await
            }
        }
    }

    /// Makes the target group `name` for `mapping`, with its health check and the service's tags.
    async fn create_target_group(
        &self,
        service: &Service,
        wanted: &WantedNlb,
        mapping: &Mapping,
        vpc: &str,
        name: &str,
    ) -> Result<String, CloudError> {
        let health = &mapping.health;
        let created = self
            .elbv2
            .create_target_group()
            .name(name)
            .protocol(mapping.traffic_protocol.clone())
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
            .set_tags(Some(self.nlb_tags(service, &wanted.tags)))
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

    /// `target-group-attributes` on `group`: those it names and the group has are set where they differ;
    /// the others are left as they are (upstream's `buildTargetGroupAttributes`).
    async fn ensure_target_group_attributes(
        &self,
        group: &str,
        wanted: &WantedNlb,
    ) -> Result<(), CloudError> {
        if wanted.target_group_attributes.is_empty() {
            return Ok(());
        }
        let output = self
            .elbv2
            .describe_target_group_attributes()
            .target_group_arn(group)
            .send()
            .await
            .map_err(aws_error)?;
        let have: BTreeMap<&str, &str> = output
            .attributes()
            .iter()
            .filter_map(|a| Some((a.key()?, a.value().unwrap_or_default())))
            .collect();
        let changes: Vec<TargetGroupAttribute> =
            wanted::target_group_attribute_changes(&have, &wanted.target_group_attributes)
                .into_iter()
                .map(|(key, value)| TargetGroupAttribute::builder().key(key).value(value).build())
                .collect();
        if !changes.is_empty() {
            self.elbv2
                .modify_target_group_attributes()
                .target_group_arn(group)
                .set_attributes(Some(changes))
                .send()
                .await
                .map_err(aws_error)?;
        }
        Ok(())
    }

    /// The NLB's attributes, synced to what the service asks (upstream's defaults where not annotated;
    /// [`plan::attribute_changes`]).
    async fn ensure_nlb_attributes(&self, lb: &str, wanted: &WantedNlb) -> Result<(), CloudError> {
        let output = self
            .elbv2
            .describe_load_balancer_attributes()
            .load_balancer_arn(lb)
            .send()
            .await
            .map_err(aws_error)?;
        let have: BTreeMap<&str, &str> = output
            .attributes()
            .iter()
            .filter_map(|a| Some((a.key()?, a.value().unwrap_or_default())))
            .collect();
        let changes: Vec<LoadBalancerAttribute> = plan::attribute_changes(&have, &wanted.attributes)
            .into_iter()
            .map(|(key, value)| LoadBalancerAttribute::builder().key(key).value(value).build())
            .collect();
        if !changes.is_empty() {
            self.elbv2
                .modify_load_balancer_attributes()
                .load_balancer_arn(lb)
                .set_attributes(Some(changes))
                .send()
                .await
                .map_err(aws_error)?;
        }
        Ok(())
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
        let changes = plan::targets(&have, instances);
        let target = |id: &String| TargetDescription::builder().id(id).port(port).build();
        let add: Vec<TargetDescription> = changes.register.iter().map(target).collect();
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
        let remove: Vec<TargetDescription> = changes.deregister.iter().map(target).collect();
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

    /// Makes `service`'s NLB what it asks, in stages, each decided ([`plan`]) from what the one before
    /// found or made: the NLB and its security groups, then its listeners and target groups, then the
    /// groups' rules.
    pub(crate) async fn ensure_nlb(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<LoadBalancerStatus, CloudError> {
        let wanted = self.wanted_nlb(service)?;
        let mappings = &wanted.mappings;
        let name = default_load_balancer_name(service);
        let instances = self
            .node_instances(&target_nodes(nodes, &wanted.target_node_labels))
            .await?;
        let vpc = self.vpc_of(&instances)?;
        let internal = is_internal(service);
        let existing = self.describe_nlb(&name).await?;
        let groups = self
            .ensure_nlb_groups(cluster_name, service, existing.as_ref(), &vpc, &wanted.tags)
            .await?;
        let planned = plan::nlb(&name, internal, existing.as_ref(), &groups)?;
        if let NlbStep::SetGroups { lb, groups: ids } = &planned.step {
            self.elbv2
                .set_security_groups()
                .load_balancer_arn(lb)
                .set_security_groups(Some(ids.clone()))
                .send()
                .await
                .map_err(aws_error)?;
        }
        // The plan's `Create` is exactly no NLB.
        let lb = match existing {
            Some(lb) => lb,
            None => {
                self.create_nlb(service, &wanted, &name, &vpc, &groups.ids)
                    .await?
            }
        };
        let lb_arn = lb.load_balancer_arn().unwrap_or_default().to_owned();
        let ids: BTreeSet<String> = instances
            .iter()
            .filter_map(|i| i.instance_id().map(str::to_owned))
            .collect();
        self.ensure_nlb_listeners(service, &wanted, &vpc, &lb_arn, &ids)
            .await?;
        if let Some(group) = &planned.managed {
            self.nlb_group_rules(group, service, mappings).await?;
        }
        self.release_nlb_groups(&name, &planned.detached).await;
        // Stateless, so that a group a failed or lost clean-up left is found again: the managed group of
        // this service, when the NLB does not use it (annotated groups replaced it), goes.
        if planned.release_unused_managed {
            self.release_unused_managed_group(cluster_name, service, &name, &groups.ids)
                .await;
        }
        let subnets: Vec<String> = lb
            .availability_zones()
            .iter()
            .filter_map(|z| z.subnet_id().map(str::to_owned))
            .collect();
        let rules = self
            .wanted_nlb_rules(service, &name, &vpc, &subnets, mappings)
            .await?;
        let node_groups = self.node_groups(&instances).await?;
        self.nlb_node_rules(&vpc, &name, &node_groups, &rules).await?;
        // Last: whatever happens to it, the NLB serves IPv4 by now.
        self.ensure_ip_address_type(service, &lb, &wanted.ip_address_type)
            .await?;
        Ok(nlb_status(&lb))
    }

    /// Makes the NLB `name` in the annotated subnets, else in upstream's choice of the VPC's, with the
    /// addresses the service annotates and `groups` (none: made without any).
    async fn create_nlb(
        &self,
        service: &Service,
        wanted: &WantedNlb,
        name: &str,
        vpc: &str,
        groups: &[String],
    ) -> Result<Nlb, CloudError> {
        let internal = is_internal(service);
        let subnets = match annotated_subnets(service) {
            Some(subnets) => subnets,
            None => self.subnets(vpc, internal).await?,
        };
        let mappings = subnet_mappings(&subnets, wanted)?;
        let ip_address_type = self
            .creatable_ip_address_type(&wanted.ip_address_type, &subnets)
            .await?;
        let created = self
            .elbv2
            .create_load_balancer()
            .name(name)
            .r#type(LoadBalancerTypeEnum::Network)
            .scheme(if internal {
                LoadBalancerSchemeEnum::Internal
            } else {
                LoadBalancerSchemeEnum::InternetFacing
            })
            .set_subnet_mappings(Some(mappings))
            .ip_address_type(ip_address_type)
            .set_security_groups((!groups.is_empty()).then(|| groups.to_vec()))
            .set_tags(Some(self.nlb_tags(service, &wanted.tags)))
            .send()
            .await
            .map_err(aws_error)?;
        tracing::info!(name = %name, "created an NLB");
        created
            .load_balancers()
            .first()
            .cloned()
            .ok_or_else(|| CloudError::provider(format!("NLB {name} was not returned by CreateLoadBalancer")))
    }

    /// The listeners and target groups: per mapping, in order, its target group, the group's targets
    /// (`instances`) and attributes, and its listener; then the NLB's attributes; last, the listeners of
    /// ports no mapping has and the target groups no listener forwards to any more ([`plan::removals`]).
    /// Each step is decided once the one before is done, as it needs the target group's ARN.
    async fn ensure_nlb_listeners(
        &self,
        service: &Service,
        wanted: &WantedNlb,
        vpc: &str,
        lb: &str,
        instances: &BTreeSet<String>,
    ) -> Result<(), CloudError> {
        let listeners = self.listeners(lb).await?;
        let mut kept = BTreeSet::new();
        let mut retired = BTreeSet::new();
        for mapping in &wanted.mappings {
            let group = self.ensure_target_group(service, wanted, mapping, vpc).await?;
            self.targets(&group, mapping.node_port, instances).await?;
            self.ensure_target_group_attributes(&group, wanted).await?;
            match plan::listener(&listeners, mapping, &group) {
                ListenerStep::Keep => {}
                ListenerStep::Modify {
                    listener,
                    retired: old,
                } => {
                    self.modify_listener(&listener, mapping, &group).await?;
                    retired.extend(old);
                }
                ListenerStep::Create => self.create_listener(lb, mapping, &group).await?,
            }
            kept.insert(group);
        }
        self.ensure_nlb_attributes(lb, wanted).await?;
        let removals = plan::removals(&listeners, &wanted.mappings, &retired, &kept);
        for listener in &removals.listeners {
            self.elbv2
                .delete_listener()
                .listener_arn(listener)
                .send()
                .await
                .map_err(aws_error)?;
        }
        for group in &removals.target_groups {
            self.elbv2
                .delete_target_group()
                .target_group_arn(group)
                .send()
                .await
                .map_err(aws_error)?;
        }
        Ok(())
    }

    /// Makes the listener `listener` `mapping`'s, forwarding to `group`.
    async fn modify_listener(
        &self,
        listener: &str,
        mapping: &Mapping,
        group: &str,
    ) -> Result<(), CloudError> {
        self.elbv2
            .modify_listener()
            .listener_arn(listener)
            .protocol(mapping.protocol.clone())
            .set_certificates(certificates(mapping))
            .set_ssl_policy(mapping.ssl_policy.clone())
            .default_actions(forward(group))
            .send()
            .await
            .map_err(aws_error)?;
        Ok(())
    }

    /// Makes `mapping`'s listener on the NLB `lb`, forwarding to `group`.
    async fn create_listener(&self, lb: &str, mapping: &Mapping, group: &str) -> Result<(), CloudError> {
        self.elbv2
            .create_listener()
            .load_balancer_arn(lb)
            .port(mapping.port)
            .protocol(mapping.protocol.clone())
            .set_certificates(certificates(mapping))
            .set_ssl_policy(mapping.ssl_policy.clone())
            .default_actions(forward(group))
            .send()
            .await
            .map_err(aws_error)?;
        Ok(())
    }

    pub(crate) async fn update_nlb(&self, service: &Service, nodes: &[Arc<Node>]) -> Result<(), CloudError> {
        let name = default_load_balancer_name(service);
        let Some(lb) = self.describe_nlb(&name).await? else {
            return Err(CloudError::provider(format!("NLB {name} does not exist (yet)")));
        };
        let labels = key_values(service, "target-node-labels");
        let instances = self.node_instances(&target_nodes(nodes, &labels)).await?;
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

    pub(crate) async fn delete_nlb(&self, cluster_name: &str, service: &Service) -> Result<(), CloudError> {
        let name = default_load_balancer_name(service);
        let Some(lb) = self.describe_nlb(&name).await? else {
            // A delete retried after the NLB went: its managed group may be left.
            if let Some(group) = self.leftover_nlb_group(cluster_name, service).await? {
                self.delete_group(&group).await?;
            }
            return Ok(());
        };
        let own_groups = self.nlb_groups_to_delete(service, &lb).await?;
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
        for group in &own_groups {
            self.delete_group(group).await?;
        }
        // The managed group, also when the NLB no longer used it (annotated groups replaced it and its
        // clean-up failed then).
        if let Some(group) = self.leftover_nlb_group(cluster_name, service).await?
            && !own_groups.contains(&group)
        {
            self.delete_group(&group).await?;
        }
        Ok(())
    }

    pub(crate) async fn get_nlb(&self, service: &Service) -> Result<Option<LoadBalancerStatus>, CloudError> {
        Ok(self
            .describe_nlb(&default_load_balancer_name(service))
            .await?
            .as_ref()
            .map(nlb_status))
    }
}

#[cfg(test)]
mod tests;
