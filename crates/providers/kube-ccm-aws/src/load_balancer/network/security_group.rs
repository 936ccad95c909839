//! An NLB's own security group, with `NLBSecurityGroupMode = Managed` (cloud-config), as upstream 1.35
//! makes it:
//!
//! - A new NLB gets `k8s-<namespace:8>-<name:8>-<sha256 of the cluster name, name, namespace and UID>[:10]`
//!   (alphanumerics only; upstream's `GetSecurityGroupNameForNLB`, so a group upstream made is adopted),
//!   found by name in the VPC or made there, described `[k8s] Managed SecurityGroup for LoadBalancer` and
//!   tagged `kubernetes.io/cluster/<id>=owned` plus `additional-resource-tags`. Its ingress is exactly the
//!   listener ports from the source ranges (`loadBalancerSourceRanges`, else everyone) and ICMP path-MTU
//!   discovery (type 3, code 4).
//! - With `security-groups` annotated, those groups are attached instead and left as they are (no rules).
//! - EC2 cannot add groups to an NLB made without any: such an NLB (one made before the mode was set) is
//!   left without.
//! - Groups the NLB no longer uses are detached; the rules of cluster-tagged groups that admit them are
//!   revoked, and those the cluster owns are deleted (best effort, as upstream: a failure is logged). The
//!   service's managed group is looked up by name at every ensure that does not use it, so one a failed
//!   clean-up left (EC2 keeps a group in use for a while after it is detached) goes later.
//! - Deleting the NLB deletes its groups that the cluster owns and the service did not name, and the
//!   service's managed group whether attached or not, after the NLB; while EC2 still counts the NLB's
//!   interfaces on one (`DependencyViolation`) the delete is retried, and a retry that finds the NLB gone
//!   finds the group by its name.
//! - Difference: a TLS listener's port is opened for TCP (upstream asks EC2 for protocol `tls`, which EC2
//!   refuses).

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::types::{
    Filter, IpPermission, IpRange, ResourceType, SecurityGroup, Tag as Ec2Tag, TagSpecification,
    UserIdGroupPair,
};
use aws_sdk_elasticloadbalancingv2::types::{LoadBalancer as Nlb, ProtocolEnum};
use k8s_openapi::api::core::v1::Service;
use kube_ccm_provider::{CloudError, service};
use sha2::{Digest, Sha256};

use super::super::list;
use super::Mapping;
use crate::{AwsProvider, aws_error};

/// Upstream's description of the groups it makes for NLBs.
pub const DESCRIPTION: &str = "[k8s] Managed SecurityGroup for LoadBalancer";

/// The groups an NLB is to have.
#[derive(Debug, Default, PartialEq)]
pub(super) struct NlbGroups {
    /// Attached to the NLB (empty: none, or leave the NLB's as they are).
    pub ids: Vec<String>,
    /// The one of them this provider manages the rules of.
    pub managed: Option<String>,
}

/// An ingress rule of the managed group: `(protocol, from, to, CIDR)`.
type Rule = (String, i32, i32, String);

/// Upstream's name of the group it makes for `service`'s NLB in cluster `cluster_name`.
pub fn nlb_security_group_name(cluster_name: &str, service: &Service) -> String {
    let meta = &service.metadata;
    let name = meta.name.as_deref().unwrap_or_default();
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    let mut hasher = Sha256::new();
    for part in [
        cluster_name,
        name,
        namespace,
        meta.uid.as_deref().unwrap_or_default(),
    ] {
        hasher.update(part.as_bytes());
    }
    super::resource_name(namespace, name, &hasher.finalize())
}

impl AwsProvider {
    pub(crate) fn nlb_groups_managed(&self) -> bool {
        self.config.nlb_security_group_mode == "Managed"
    }

    /// The groups `service`'s NLB is to have (`existing`: the NLB as it is), the managed one found or made.
    pub(super) async fn ensure_nlb_groups(
        &self,
        cluster_name: &str,
        service: &Service,
        existing: Option<&Nlb>,
        vpc: &str,
        tags: &BTreeMap<String, String>,
    ) -> Result<NlbGroups, CloudError> {
        if !self.nlb_groups_managed() {
            return Ok(NlbGroups::default());
        }
        if existing.is_some_and(|lb| lb.security_groups().is_empty()) {
            tracing::info!(
                service = %service::service_key(service),
                "the NLB was made without security groups (EC2 cannot add them): left without"
            );
            return Ok(NlbGroups::default());
        }
        let annotated = list(service, "security-groups");
        if !annotated.is_empty() {
            return Ok(NlbGroups {
                ids: annotated,
                managed: None,
            });
        }
        let name = nlb_security_group_name(cluster_name, service);
        let id = match self.find_group(Some(vpc), &name).await? {
            Some(group) => group.group_id().unwrap_or_default().to_owned(),
            None => {
                let (key, value) = self.cluster_tag();
                let tags = [(key, value)]
                    .into_iter()
                    .chain(tags.clone())
                    .map(|(k, v)| Ec2Tag::builder().key(k).value(v).build());
                let created = self
                    .ec2
                    .create_security_group()
                    .group_name(&name)
                    .description(DESCRIPTION)
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
                tracing::info!(group = %name, "created an NLB's security group");
                created.group_id().unwrap_or_default().to_owned()
            }
        };
        Ok(NlbGroups {
            ids: vec![id.clone()],
            managed: Some(id),
        })
    }

    /// The managed group's ingress made exactly the listener ports from the source ranges, and ICMP
    /// path-MTU discovery.
    pub(super) async fn nlb_group_rules(
        &self,
        group: &str,
        service: &Service,
        mappings: &[Mapping],
    ) -> Result<(), CloudError> {
        let sources: Vec<String> = match service::requested_source_ranges(service)? {
            Some(ranges) => ranges.iter().map(ToString::to_string).collect(),
            None => vec!["0.0.0.0/0".to_owned()],
        };
        let ports = mappings.iter().map(|m| {
            let protocol = if m.protocol == ProtocolEnum::Udp {
                "udp"
            } else {
                "tcp"
            };
            (protocol, m.port, m.port)
        });
        let want: BTreeSet<Rule> = ports
            .chain([("icmp", 3, 4)])
            .flat_map(|(protocol, from, to)| {
                sources
                    .iter()
                    .map(move |cidr| (protocol.to_owned(), from, to, cidr.clone()))
            })
            .collect();
        let described = self
            .ec2
            .describe_security_groups()
            .group_ids(group)
            .send()
            .await
            .map_err(aws_error)?;
        let have: BTreeSet<Rule> = described
            .security_groups()
            .iter()
            .flat_map(|g| g.ip_permissions())
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
        let rule = |(protocol, from, to, cidr): &Rule| {
            IpPermission::builder()
                .ip_protocol(protocol)
                .from_port(*from)
                .to_port(*to)
                .ip_ranges(IpRange::builder().cidr_ip(cidr).build())
                .build()
        };
        let add = want.difference(&have).map(rule).collect();
        let remove = have.difference(&want).map(rule).collect();
        self.change_ingress(group, add, remove).await
    }

    /// Whether `group` is tagged `kubernetes.io/cluster/<id>=owned`.
    fn owned(&self, group: &SecurityGroup) -> bool {
        let (key, value) = self.cluster_tag();
        group
            .tags()
            .iter()
            .any(|t| t.key() == Some(key.as_str()) && t.value() == Some(value.as_str()))
    }

    /// Groups detached from an NLB: the rules of cluster-tagged groups that admit them are revoked, and
    /// those the cluster owns deleted. Best effort, as upstream: what fails is logged.
    pub(super) async fn release_nlb_groups(&self, lb: &str, detached: &[String]) {
        for id in detached {
            if let Err(error) = self.release_group(id).await {
                tracing::warn!(nlb = %lb, group = %id, %error, "a security group detached from the NLB was not cleaned up");
            }
        }
    }

    async fn release_group(&self, id: &str) -> Result<(), CloudError> {
        let referring = self
            .ec2
            .describe_security_groups()
            .filters(
                Filter::builder()
                    .name("ip-permission.group-id")
                    .values(id)
                    .build(),
            )
            .send()
            .await
            .map_err(aws_error)?;
        for group in referring.security_groups() {
            let tags = group
                .tags()
                .iter()
                .map(|t| (t.key().map(str::to_owned), t.value().map(str::to_owned)));
            let Some(target) = group.group_id().filter(|_| self.tagged_for_cluster(tags)) else {
                continue;
            };
            let rules: Vec<IpPermission> = group
                .ip_permissions()
                .iter()
                .filter(|p| {
                    p.user_id_group_pairs()
                        .iter()
                        .any(|pair| pair.group_id() == Some(id))
                })
                .map(|p| {
                    IpPermission::builder()
                        .set_ip_protocol(p.ip_protocol().map(str::to_owned))
                        .set_from_port(p.from_port())
                        .set_to_port(p.to_port())
                        .user_id_group_pairs(UserIdGroupPair::builder().group_id(id).build())
                        .build()
                })
                .collect();
            self.change_ingress(target, Vec::new(), rules).await?;
        }
        let described = self
            .ec2
            .describe_security_groups()
            .group_ids(id)
            .send()
            .await
            .map_err(aws_error)?;
        if described.security_groups().first().is_some_and(|g| self.owned(g)) {
            self.delete_group(id).await?;
        }
        Ok(())
    }

    /// The managed group of `service`, when it exists, the cluster owns it and the NLB does not use it
    /// (`using`): released as a detached group is. Best effort: what fails is logged and tried again at
    /// the next ensure, and the service's deletion deletes it for sure.
    pub(super) async fn release_unused_managed_group(
        &self,
        cluster_name: &str,
        service: &Service,
        lb: &str,
        using: &[String],
    ) {
        match self.leftover_nlb_group(cluster_name, service).await {
            Ok(Some(group)) if !using.contains(&group) => {
                self.release_nlb_groups(lb, &[group]).await;
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(nlb = %lb, %error, "cannot look up the NLB's managed security group");
            }
        }
    }

    /// The NLB's groups to delete with it: those the cluster owns that the service does not name.
    pub(super) async fn nlb_groups_to_delete(
        &self,
        service: &Service,
        lb: &Nlb,
    ) -> Result<Vec<String>, CloudError> {
        if lb.security_groups().is_empty() {
            return Ok(Vec::new());
        }
        let named: BTreeSet<String> = list(service, "security-groups")
            .into_iter()
            .chain(list(service, "extra-security-groups"))
            .collect();
        let described = self
            .ec2
            .describe_security_groups()
            .set_group_ids(Some(lb.security_groups().to_vec()))
            .send()
            .await
            .map_err(aws_error)?;
        Ok(described
            .security_groups()
            .iter()
            .filter(|g| self.owned(g) && g.group_id() != Some(self.config.elb_security_group.as_str()))
            .filter_map(|g| g.group_id().map(str::to_owned))
            .filter(|id| !named.contains(id))
            .collect())
    }

    /// The group upstream's managed mode makes for `service`, if it exists and the cluster owns it (for a
    /// delete retried after the NLB went).
    pub(super) async fn leftover_nlb_group(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> Result<Option<String>, CloudError> {
        let group = self
            .find_group(None, &nlb_security_group_name(cluster_name, service))
            .await?;
        Ok(group
            .filter(|g| self.owned(g))
            .and_then(|g| g.group_id().map(str::to_owned)))
    }

    /// Deletes `id`; while EC2 still counts a deleted load balancer's interfaces on it, asks to be retried.
    pub(crate) async fn delete_group(&self, id: &str) -> Result<(), CloudError> {
        match self.ec2.delete_security_group().group_id(id).send().await {
            Ok(_) => {
                tracing::info!(group = %id, "deleted an NLB's security group");
                Ok(())
            }
            Err(error)
                if error
                    .as_service_error()
                    .and_then(|e| aws_sdk_ec2::error::ProvideErrorMetadata::code(e))
                    == Some("DependencyViolation") =>
            {
                Err(CloudError::Retry {
                    after: std::time::Duration::from_secs(5),
                    message: format!("security group {id} is still in use by the deleted load balancer"),
                })
            }
            Err(error) => Err(aws_error(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(namespace: &str, name: &str, uid: &str) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
        }))
        .unwrap()
    }

    #[test]
    fn group_names_are_upstreams() {
        // Upstream's own table (TestCloud_GetSecurityGroupNameForNLB).
        for (cluster, namespace, name, uid, expected) in [
            (
                "test-cluster",
                "default",
                "my-service",
                "12345678-1234-1234-1234-123456789abc",
                "k8s-default-myservic-b7cb8b02f0",
            ),
            (
                "test-cluster",
                "kube-system",
                "my-service-123",
                "87654321-4321-4321-4321-cba987654321",
                "k8s-kubesyst-myservic-5aa269aeaf",
            ),
            (
                "test-cluster",
                "very-long-namespace-name-that-also-exceeds",
                "very-long-service-name-that-exceeds-limits",
                "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
                "k8s-verylong-verylong-24c7f2d8ee",
            ),
            (
                "",
                "default",
                "test-service",
                "test-uid-123",
                "k8s-default-testserv-4ff26f905f",
            ),
            (
                "prod-cluster-01",
                "prod-ns_01",
                "api-v2.service",
                "special-chars-uid-456",
                "k8s-prodns01-apiv2ser-9d72cd8df0",
            ),
        ] {
            assert_eq!(
                nlb_security_group_name(cluster, &service(namespace, name, uid)),
                expected
            );
        }
    }
}
