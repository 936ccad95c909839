//! The rules load balancers need on the nodes' security groups.
//!
//! - Classic ELBs: each node's group admits all traffic from the ELB's group.
//! - NLBs (which have no group of their own here): each node's group admits the clients
//!   (`loadBalancerSourceRanges`; else everyone, or the VPC for an internal NLB) on the node ports, and the
//!   NLB's subnets on the health-check ports (left out when the client rule already covers them), each
//!   rule described `kubernetes.io/rule/nlb/{client,health}=<name>` so it is found again and revoked when
//!   no longer wanted. Difference: UDP ports get UDP rules and TCP ports TCP rules (upstream opens every
//!   port with UDP when any is UDP); upstream's ICMP path-MTU rule is not added.
//! - A node's group is its only one, or its one tagged for the cluster.

use std::collections::BTreeSet;

use aws_sdk_ec2::types::{Filter, IpPermission, IpRange, UserIdGroupPair};
use aws_sdk_elasticloadbalancingv2::types::ProtocolEnum;
use k8s_openapi::api::core::v1::Service;
use kube_ccm_provider::{CloudError, service};

use super::is_internal;
use super::network::Mapping;
use crate::{AwsProvider, aws_error};

/// A node rule: `(protocol, port, source CIDR, description)`.
type Rule = (String, i32, String, String);

/// The descriptions that mark this provider's NLB rules for `name`.
fn rule_descriptions(name: &str) -> [String; 2] {
    [
        format!("kubernetes.io/rule/nlb/client={name}"),
        format!("kubernetes.io/rule/nlb/health={name}"),
    ]
}
impl AwsProvider {
    /// Authorizes `add` and revokes `remove` on `group`; nothing is sent for an empty list.
    pub(crate) async fn change_ingress(
        &self,
        group: &str,
        add: Vec<IpPermission>,
        remove: Vec<IpPermission>,
    ) -> Result<(), CloudError> {
        if !add.is_empty() {
            self.ec2
                .authorize_security_group_ingress()
                .group_id(group)
                .set_ip_permissions(Some(add))
                .send()
                .await
                .map_err(aws_error)?;
        }
        if !remove.is_empty() {
            self.ec2
                .revoke_security_group_ingress()
                .group_id(group)
                .set_ip_permissions(Some(remove))
                .send()
                .await
                .map_err(aws_error)?;
        }
        Ok(())
    }

    /// The security group of each instance that admits the ELB: its only one, or its one tagged for the
    /// cluster.
    pub(crate) async fn node_groups(
        &self,
        instances: &[aws_sdk_ec2::types::Instance],
    ) -> Result<BTreeSet<String>, CloudError> {
        let mut groups = BTreeSet::new();
        let mut ambiguous: Vec<String> = Vec::new();
        for instance in instances {
            let ids: Vec<String> = instance
                .security_groups()
                .iter()
                .filter_map(|g| g.group_id().map(str::to_owned))
                .collect();
            match ids.as_slice() {
                [] => {}
                [one] => {
                    groups.insert(one.clone());
                }
                _ => ambiguous.extend(ids),
            }
        }
        if !ambiguous.is_empty() {
            let output = self
                .ec2
                .describe_security_groups()
                .set_group_ids(Some(ambiguous))
                .send()
                .await
                .map_err(aws_error)?;
            for group in output.security_groups() {
                let tags = group
                    .tags()
                    .iter()
                    .map(|t| (t.key().map(str::to_owned), t.value().map(str::to_owned)));
                if self.tagged_for_cluster(tags) {
                    groups.extend(group.group_id().map(str::to_owned));
                }
            }
        }
        Ok(groups)
    }

    /// Node groups admit all traffic from `elb_group`; with `keep: false` (deletion) none do. Which groups
    /// admit it is read from the VPC's groups' rules.
    pub(super) async fn node_ingress(
        &self,
        vpc: &str,
        elb_group: &str,
        node_groups: &BTreeSet<String>,
        keep: bool,
    ) -> Result<(), CloudError> {
        if self.config.disable_security_group_ingress {
            return Ok(());
        }
        let output = self
            .ec2
            .describe_security_groups()
            .filters(Filter::builder().name("vpc-id").values(vpc).build())
            .send()
            .await
            .map_err(aws_error)?;
        let admitting: BTreeSet<String> = output
            .security_groups()
            .iter()
            .filter(|g| {
                g.ip_permissions()
                    .iter()
                    .flat_map(|p| p.user_id_group_pairs())
                    .any(|pair| pair.group_id() == Some(elb_group))
            })
            .filter_map(|g| g.group_id().map(str::to_owned))
            .collect();
        let rule = || {
            IpPermission::builder()
                .ip_protocol("-1")
                .user_id_group_pairs(UserIdGroupPair::builder().group_id(elb_group).build())
                .build()
        };
        let wanted: BTreeSet<String> = if keep {
            node_groups.clone()
        } else {
            BTreeSet::new()
        };
        for group in wanted.difference(&admitting) {
            self.change_ingress(group, vec![rule()], Vec::new()).await?;
        }
        for group in admitting.difference(&wanted).filter(|g| g.as_str() != elb_group) {
            self.change_ingress(group, Vec::new(), vec![rule()]).await?;
        }
        Ok(())
    }

    /// Makes the NLB rules for `name` in the VPC's groups exactly `wanted` on `node_groups` (and none
    /// elsewhere).
    pub(super) async fn nlb_node_rules(
        &self,
        vpc: &str,
        name: &str,
        node_groups: &BTreeSet<String>,
        wanted: &BTreeSet<Rule>,
    ) -> Result<(), CloudError> {
        if self.config.disable_security_group_ingress {
            return Ok(());
        }
        let ours = rule_descriptions(name);
        let ours = &ours;
        let output = self
            .ec2
            .describe_security_groups()
            .filters(Filter::builder().name("vpc-id").values(vpc).build())
            .send()
            .await
            .map_err(aws_error)?;
        let permission = |(protocol, port, cidr, description): &Rule| {
            IpPermission::builder()
                .ip_protocol(protocol)
                .from_port(*port)
                .to_port(*port)
                .ip_ranges(IpRange::builder().cidr_ip(cidr).description(description).build())
                .build()
        };
        for group in output.security_groups() {
            let Some(id) = group.group_id() else { continue };
            let have: BTreeSet<Rule> = group
                .ip_permissions()
                .iter()
                .flat_map(|p| {
                    p.ip_ranges().iter().filter_map(move |r| {
                        let description = r.description()?;
                        ours.iter().any(|d| d == description).then(|| {
                            (
                                p.ip_protocol().unwrap_or_default().to_owned(),
                                p.from_port().unwrap_or_default(),
                                r.cidr_ip().unwrap_or_default().to_owned(),
                                description.to_owned(),
                            )
                        })
                    })
                })
                .collect();
            let empty = BTreeSet::new();
            let want = if node_groups.contains(id) { wanted } else { &empty };
            let add: Vec<IpPermission> = want.difference(&have).map(permission).collect();
            let remove: Vec<IpPermission> = have.difference(want).map(permission).collect();
            self.change_ingress(id, add, remove).await?;
        }
        Ok(())
    }

    /// The rules the nodes need for `mappings`: clients on the node ports, the NLB's subnets on the
    /// health-check ports.
    pub(super) async fn wanted_nlb_rules(
        &self,
        service: &Service,
        name: &str,
        vpc: &str,
        subnets: &[String],
        mappings: &[Mapping],
    ) -> Result<BTreeSet<Rule>, CloudError> {
        let [client, health] = rule_descriptions(name);
        let clients = match service::requested_source_ranges(service)? {
            Some(ranges) => ranges.iter().map(ToString::to_string).collect(),
            None if is_internal(service) => {
                let vpcs = self
                    .ec2
                    .describe_vpcs()
                    .vpc_ids(vpc)
                    .send()
                    .await
                    .map_err(aws_error)?;
                vpcs.vpcs()
                    .iter()
                    .filter_map(|v| v.cidr_block().map(str::to_owned))
                    .collect()
            }
            None => vec!["0.0.0.0/0".to_owned()],
        };
        let subnet_cidrs: Vec<String> = if subnets.is_empty() {
            Vec::new()
        } else {
            let described = self
                .ec2
                .describe_subnets()
                .set_subnet_ids(Some(subnets.to_vec()))
                .send()
                .await
                .map_err(aws_error)?;
            described
                .subnets()
                .iter()
                .filter_map(|s| s.cidr_block().map(str::to_owned))
                .collect()
        };
        let mut rules = BTreeSet::new();
        for mapping in mappings {
            let protocol = if mapping.protocol == ProtocolEnum::Udp {
                "udp"
            } else {
                "tcp"
            };
            for cidr in &clients {
                rules.insert((
                    protocol.to_owned(),
                    mapping.node_port,
                    cidr.clone(),
                    client.clone(),
                ));
            }
            let health_port = mapping.health.port.parse().unwrap_or(mapping.node_port);
            let covered = protocol == "tcp" && health_port == mapping.node_port && clients == ["0.0.0.0/0"];
            if !covered {
                for cidr in &subnet_cidrs {
                    rules.insert(("tcp".to_owned(), health_port, cidr.clone(), health.clone()));
                }
            }
        }
        Ok(rules)
    }
}
