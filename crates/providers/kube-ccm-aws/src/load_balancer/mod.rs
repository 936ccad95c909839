//! Service load balancers: which kind a service gets, and what every kind shares.
//!
//! - **Type** by `service.beta.kubernetes.io/aws-load-balancer-type`: absent or anything else → a classic
//!   ELB ([`classic`]); `nlb` → an NLB ([`network`]); `external` or `nlb-ip` →
//!   [`CloudError::ImplementedElsewhere`] (the AWS Load Balancer Controller owns the service).
//! - **Name**: upstream's `a` + the service UID (the framework's default), so a load balancer the in-tree
//!   provider made is found and adopted after a migration, not duplicated.
//! - **Subnets**: the `…-subnets` annotation (IDs), else one per zone among the VPC's subnets tagged for
//!   the cluster, preferring `kubernetes.io/role/elb` (`internal-elb` for `…-internal`), then the lowest ID.
//! - **Security groups** ([`security`]): the rules the nodes' groups need, found again and revoked.
//! - Every call is idempotent: what exists is compared and only differences are changed.
//! - **Upstream's annotations**: classic ELBs ([`classic::wanted`]: TLS listeners, attributes, access
//!   logs, proxy protocol, groups, health-check tuning, tags, target node labels) and NLBs
//!   ([`network::wanted`]: TLS listeners, health checks, attributes, target-group attributes, static
//!   addresses, tags, target node labels) take them as upstream does; what upstream refuses for a kind is
//!   refused before any write ([`not_implemented`]).
//! - **Orphans** ([`orphans`]): the cluster's load balancers and leftover parts listed by their tags, for
//!   the framework's sweep.

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_ec2::types::{Filter, SecurityGroup};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use kube_ccm_provider::{
    CallContext, CloudError, ClusterLoadBalancer, LoadBalancer, default_load_balancer_name,
};

use crate::instances::instance_key_of;
use crate::{AwsProvider, aws_error};

pub mod classic;
pub mod network;
pub mod orphans;
pub mod security;

pub use classic::{Wanted, WantedAttributes, WantedHealthCheck, WantedListener, wanted};

const PREFIX: &str = "service.beta.kubernetes.io/aws-load-balancer-";

/// `Ok` unless `service`, of `kind`, carries an annotation of upstream's that upstream refuses for that
/// kind: `target-group-attributes` on a classic ELB, `extra-security-groups` on an NLB.
pub fn not_implemented(service: &Service, kind: Kind) -> Result<(), CloudError> {
    match kind {
        Kind::Classic if annotation(service, "target-group-attributes").is_some() => Err(
            CloudError::provider("target group attributes annotation is only supported for NLB"),
        ),
        Kind::Network if annotation(service, "extra-security-groups").is_some() => {
            Err(CloudError::provider(format!(
                "BYO extra security group annotation \"{PREFIX}extra-security-groups\" is not supported by NLB"
            )))
        }
        _ => Ok(()),
    }
}

/// Which load balancer a service gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A classic ELB (the default).
    Classic,
    /// A network load balancer (`…-type: nlb`).
    Network,
    /// Someone else's (`…-type: external` or `nlb-ip`).
    Elsewhere,
}

/// The kind `service` asks for.
pub fn kind(service: &Service) -> Kind {
    match annotation(service, "type").as_deref() {
        Some("nlb") => Kind::Network,
        Some("external" | "nlb-ip") => Kind::Elsewhere,
        _ => Kind::Classic,
    }
}

fn annotation(service: &Service, key: &str) -> Option<String> {
    service
        .metadata
        .annotations
        .as_ref()?
        .get(&format!("{PREFIX}{key}"))
        .cloned()
}

/// A boolean annotation, read as Go's `strconv.ParseBool` (as upstream reads them); unset or empty is
/// `None`.
fn go_bool(service: &Service, key: &str) -> Result<Option<bool>, CloudError> {
    match annotation(service, key).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(value) => match value.as_str() {
            "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(Some(true)),
            "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(Some(false)),
            _ => Err(CloudError::provider(format!(
                "error parsing service annotation: {PREFIX}{key}={value}"
            ))),
        },
    }
}

/// A whole-number annotation; unset or empty is `None`.
fn number(service: &Service, key: &str) -> Result<Option<i32>, CloudError> {
    match annotation(service, key).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(value) => value.trim().parse().map(Some).map_err(|_| {
            CloudError::provider(format!("error parsing service annotation: {PREFIX}{key}={value}"))
        }),
    }
}

/// `ssl-ports`: the ports (numbers or names) that take the certificate; every port when unset, empty or
/// `*` (upstream's `getPortSets`).
struct SslPorts(Option<Vec<String>>);

impl SslPorts {
    fn of(service: &Service) -> SslPorts {
        SslPorts(
            annotation(service, "ssl-ports")
                .filter(|p| !p.is_empty() && p != "*")
                .map(|p| p.split(',').map(str::to_owned).collect()),
        )
    }

    /// Whether port `number`, called `name`, takes the certificate.
    fn covers(&self, number: i32, name: &str) -> bool {
        self.0.as_ref().is_none_or(|ports| {
            ports
                .iter()
                .any(|p| p.parse::<i32>().ok() == Some(number) || p == name)
        })
    }
}

/// A `k=v,…` annotation as upstream reads one (`getKeyValuePropertiesFromAnnotation`): `k=` and a bare `k`
/// have empty values; empty keys are dropped.
fn key_values(service: &Service, key: &str) -> std::collections::BTreeMap<String, String> {
    let text = annotation(service, key).unwrap_or_default();
    text.trim()
        .split(',')
        .filter_map(|pair| {
            let mut parts = pair.trim().split('=');
            let key = parts.next().filter(|k| !k.is_empty())?;
            Some((key.to_owned(), parts.next().unwrap_or_default().to_owned()))
        })
        .collect()
}

/// A comma-separated list annotation, trimmed, empty items dropped (upstream's `getSGListFromAnnotation`).
fn list(service: &Service, key: &str) -> Vec<String> {
    annotation(service, key)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The nodes a load balancer sends to: those whose labels match every `k=v` of `labels` (an empty value
/// matching any), or all of them (upstream's `filterTargetNodes`).
pub(crate) fn target_nodes(
    nodes: &[Arc<Node>],
    labels: &std::collections::BTreeMap<String, String>,
) -> Vec<Arc<Node>> {
    if labels.is_empty() {
        return nodes.to_vec();
    }
    nodes
        .iter()
        .filter(|node| {
            let have = node.metadata.labels.as_ref();
            labels.iter().all(|(key, value)| {
                have.and_then(|l| l.get(key))
                    .is_some_and(|v| value.is_empty() || v == value)
            })
        })
        .cloned()
        .collect()
}

/// The subnets of the `…-subnets` annotation (IDs, comma-separated).
pub fn annotated_subnets(service: &Service) -> Option<Vec<String>> {
    annotation(service, "subnets").map(|list| {
        list.split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect()
    })
}

/// `…-internal`: any non-empty value but `false`.
pub fn is_internal(service: &Service) -> bool {
    annotation(service, "internal").is_some_and(|v| !v.is_empty() && v != "false")
}

impl AwsProvider {
    fn cluster_tag(&self) -> (String, String) {
        (
            format!("kubernetes.io/cluster/{}", self.config.cluster_id()),
            "owned".to_owned(),
        )
    }

    fn tagged_for_cluster(&self, tags: impl Iterator<Item = (Option<String>, Option<String>)>) -> bool {
        let id = self.config.cluster_id();
        let key = format!("kubernetes.io/cluster/{id}");
        tags.into_iter().any(|(k, v)| {
            k.as_deref() == Some(key.as_str())
                || (k.as_deref() == Some("KubernetesCluster") && v.as_deref() == Some(id))
        })
    }

    /// The security group called `name` (in `vpc`, when given).
    pub(super) async fn find_group(
        &self,
        vpc: Option<&str>,
        name: &str,
    ) -> Result<Option<SecurityGroup>, CloudError> {
        let filters = [Some(("group-name", name)), vpc.map(|vpc| ("vpc-id", vpc))]
            .into_iter()
            .flatten()
            .map(|(key, value)| Filter::builder().name(key).values(value).build());
        let output = self
            .ec2
            .describe_security_groups()
            .set_filters(Some(filters.collect()))
            .send()
            .await
            .map_err(aws_error)?;
        Ok(output.security_groups().first().cloned())
    }

    /// The instances of `nodes` that EC2 knows.
    pub(crate) async fn node_instances(
        &self,
        nodes: &[Arc<Node>],
    ) -> Result<Vec<aws_sdk_ec2::types::Instance>, CloudError> {
        let keys: Vec<_> = nodes.iter().filter_map(|n| instance_key_of(n)).collect();
        let found = self.describe(&keys).await?;
        let mut instances: Vec<_> = keys.iter().filter_map(|k| found.get(k).cloned()).collect();
        instances.sort_by(|a, b| a.instance_id().cmp(&b.instance_id()));
        instances.dedup_by(|a, b| a.instance_id() == b.instance_id());
        Ok(instances)
    }

    /// The VPC: configured, or the nodes' instances'.
    pub(crate) fn vpc_of(&self, instances: &[aws_sdk_ec2::types::Instance]) -> Result<String, CloudError> {
        if !self.config.vpc.is_empty() {
            return Ok(self.config.vpc.clone());
        }
        instances
            .iter()
            .find_map(|i| i.vpc_id())
            .map(str::to_owned)
            .ok_or_else(|| {
                CloudError::provider(
                    "cannot tell the VPC: set VPC in the cloud-config, or wait for a node with an instance",
                )
            })
    }

    /// One subnet per zone in `vpc` for the ELB, as upstream chooses them.
    pub(crate) async fn subnets(&self, vpc: &str, internal: bool) -> Result<Vec<String>, CloudError> {
        let output = self
            .ec2
            .describe_subnets()
            .filters(Filter::builder().name("vpc-id").values(vpc).build())
            .send()
            .await
            .map_err(aws_error)?;
        let role = if internal {
            "kubernetes.io/role/internal-elb"
        } else {
            "kubernetes.io/role/elb"
        };
        let mut best: std::collections::BTreeMap<String, (bool, String)> = std::collections::BTreeMap::new();
        for subnet in output.subnets() {
            let tags = || {
                subnet
                    .tags()
                    .iter()
                    .map(|t| (t.key().map(str::to_owned), t.value().map(str::to_owned)))
            };
            if !self.tagged_for_cluster(tags()) {
                continue;
            }
            let (Some(zone), Some(id)) = (subnet.availability_zone(), subnet.subnet_id()) else {
                continue;
            };
            let has_role = tags().any(|(k, _)| k.as_deref() == Some(role));
            let better = match best.get(zone) {
                None => true,
                Some((best_role, best_id)) => {
                    (has_role, std::cmp::Reverse(id)) > (*best_role, std::cmp::Reverse(best_id.as_str()))
                }
            };
            if better {
                best.insert(zone.to_owned(), (has_role, id.to_owned()));
            }
        }
        if best.is_empty() {
            return Err(CloudError::provider(format!(
                "no subnet of {vpc} is tagged kubernetes.io/cluster/{}: tag the cluster's subnets or annotate the service with {PREFIX}subnets",
                self.config.cluster_id()
            )));
        }
        Ok(best.into_values().map(|(_, id)| id).collect())
    }
}

#[async_trait]
impl LoadBalancer for AwsProvider {
    /// A dualstack NLB serves both families; a classic ELB, IPv4 only (`network/families.rs`).
    fn check_ip_families(&self, service: &Service) -> Result<(), kube_ccm_provider::Refused> {
        network::check_ip_families(service, self.nlb_groups_managed())
    }

    async fn get_load_balancer(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>, CloudError> {
        match kind(service) {
            Kind::Elsewhere => Err(CloudError::ImplementedElsewhere),
            Kind::Network => cx.call("DescribeLoadBalancers", self.get_nlb(service)).await,
            Kind::Classic => {
                let name = default_load_balancer_name(service);
                Ok(cx
                    .call("DescribeLoadBalancers", self.describe_elb(&name))
                    .await?
                    .as_ref()
                    .map(classic::status))
            }
        }
    }

    async fn ensure_load_balancer(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<LoadBalancerStatus, CloudError> {
        let kind = kind(service);
        not_implemented(service, kind)?;
        match kind {
            Kind::Elsewhere => Err(CloudError::ImplementedElsewhere),
            Kind::Network => cx.guard(self.ensure_nlb(cluster_name, service, nodes)).await,
            Kind::Classic => cx.guard(self.ensure_classic(service, nodes)).await,
        }
    }

    async fn update_load_balancer(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<(), CloudError> {
        match kind(service) {
            Kind::Elsewhere => Err(CloudError::ImplementedElsewhere),
            Kind::Network => cx.guard(self.update_nlb(service, nodes)).await,
            Kind::Classic => cx.guard(self.update_classic(service, nodes)).await,
        }
    }

    async fn ensure_load_balancer_deleted(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
    ) -> Result<(), CloudError> {
        match kind(service) {
            // Not ours to delete.
            Kind::Elsewhere => Ok(()),
            Kind::Network => cx.guard(self.delete_nlb(cluster_name, service)).await,
            Kind::Classic => cx.guard(self.delete_classic(service)).await,
        }
    }

    async fn list_load_balancers(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
    ) -> Result<Vec<ClusterLoadBalancer>, CloudError> {
        cx.guard(self.cluster_load_balancers()).await
    }

    async fn delete_load_balancer(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
        load_balancer: &ClusterLoadBalancer,
    ) -> Result<(), CloudError> {
        cx.guard(self.delete_cluster_load_balancer(load_balancer)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(value: serde_json::Value) -> Service {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_annotation_picks_the_kind_and_the_scheme() {
        let annotated = |value: &str| {
            service(serde_json::json!({"metadata": {"annotations": {
                "service.beta.kubernetes.io/aws-load-balancer-type": value,
                "service.beta.kubernetes.io/aws-load-balancer-internal": "true",
            }}}))
        };
        assert_eq!(kind(&annotated("nlb")), Kind::Network);
        assert_eq!(kind(&annotated("external")), Kind::Elsewhere);
        assert_eq!(kind(&annotated("nlb-ip")), Kind::Elsewhere);
        assert_eq!(kind(&annotated("clb")), Kind::Classic);
        assert_eq!(kind(&service(serde_json::json!({}))), Kind::Classic);
        assert!(is_internal(&annotated("nlb")));
        let not = service(
            serde_json::json!({"metadata": {"annotations": {"service.beta.kubernetes.io/aws-load-balancer-internal": "false"}}}),
        );
        assert!(!is_internal(&not));
    }

    #[test]
    fn what_upstream_refuses_for_a_kind_is_refused_by_name() {
        let check = |kind: Kind, annotations: serde_json::Value, expected: Option<&str>| {
            let outcome = not_implemented(
                &service(serde_json::json!({"metadata": {"annotations": annotations}})),
                kind,
            );
            match expected {
                None => assert!(outcome.is_ok(), "{annotations}: {outcome:?}"),
                Some(message) => assert_eq!(outcome.unwrap_err().to_string(), message, "{annotations}"),
            }
        };
        let key = |k: &str| format!("{PREFIX}{k}");
        check(Kind::Network, serde_json::json!({}), None);
        check(
            Kind::Network,
            serde_json::json!({key("ssl-cert"): "arn", key("target-group-attributes"): "a=b", key("nonsense"): "1"}),
            None,
        );
        check(
            Kind::Network,
            serde_json::json!({key("extra-security-groups"): "sg-1"}),
            Some(
                "BYO extra security group annotation \"service.beta.kubernetes.io/aws-load-balancer-extra-security-groups\" is not supported by NLB",
            ),
        );
        check(
            Kind::Classic,
            serde_json::json!({key("extra-security-groups"): "sg-1"}),
            None,
        );
        check(
            Kind::Classic,
            serde_json::json!({key("target-group-attributes"): "a=b"}),
            Some("target group attributes annotation is only supported for NLB"),
        );
    }

    #[test]
    fn target_node_labels_pick_the_nodes() {
        let node = |name: &str, labels: serde_json::Value| -> Arc<Node> {
            Arc::new(
                serde_json::from_value(serde_json::json!({"metadata": {"name": name, "labels": labels}}))
                    .unwrap(),
            )
        };
        let nodes = [
            node("a", serde_json::json!({"pool": "edge", "zone": "1"})),
            node("b", serde_json::json!({"pool": "edge"})),
            node("c", serde_json::json!({"pool": "core", "zone": "1"})),
            node("d", serde_json::json!(null)),
        ];
        let names = |labels: &[(&str, &str)]| {
            let labels = labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            target_nodes(&nodes, &labels)
                .iter()
                .map(|n| n.metadata.name.clone().unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&[]), ["a", "b", "c", "d"]);
        assert_eq!(names(&[("pool", "edge")]), ["a", "b"]);
        assert_eq!(names(&[("pool", "edge"), ("zone", "")]), ["a"]);
        assert_eq!(names(&[("zone", "")]), ["a", "c"]);
    }
}
