//! The IP families of a service's load balancer: an NLB serves IPv4 (`ipv4`) or IPv4 and IPv6
//! (`dualstack`); a classic ELB IPv4 only.
//!
//! The NLB's address type is the service's choice: the AWS Load Balancer Controller's annotation
//! `service.beta.kubernetes.io/aws-load-balancer-ip-address-type` (`ipv4` or `dualstack`) when given, else
//! `dualstack` when `spec.ipFamilies` has IPv6 (as cloud-provider-aws's unfinished dual-stack work reads
//! it). Every subnet of a `dualstack` NLB needs an IPv6 CIDR block; this provider looks before it asks:
//! - An NLB is made `ipv4` when its subnets have no IPv6 block, and changed (`SetIpAddressType`) at the end
//!   of an ensure, after its listeners, targets and rules, so that a load balancer keeps serving IPv4
//!   whatever happens to the change.
//! - When the subnets cannot take it, the change is an error naming the subnets if the service insists
//!   (the annotation, or `RequireDualStack`); for `PreferDualStack` the NLB stays `ipv4`, logged.
//! - With `NLBSecurityGroupMode = Managed` NLBs stay `ipv4` unless annotated: the managed group admits IPv4
//!   clients only (IPv6 rules: not yet).
//!
//! What moto lacks here: it makes a dualstack NLB in IPv4-only subnets (EC2 refuses), and it gives a
//! subnet's IPv6 block the state `{'State': 'associated'}` (`has_ipv6`, tested against EC2's shape as
//! well).

use aws_sdk_ec2::types::{Filter, Subnet, SubnetCidrBlockStateCode};
use aws_sdk_elasticloadbalancingv2::types::{IpAddressType, LoadBalancer as Nlb};
use k8s_openapi::api::core::v1::Service;
use kube_ccm_provider::service::{IpFamily, IpFamilyPolicy, ip_families, ip_family_policy};
use kube_ccm_provider::{CloudError, Refused};

use super::super::{Kind, annotation, kind};
use crate::{AwsProvider, aws_error};

/// The annotation that chooses an NLB's address type (the AWS Load Balancer Controller's).
pub(super) const IP_ADDRESS_TYPE: &str = "ip-address-type";

/// The NLB's address type for `service`: the annotation, else the service's families (IPv4 only when
/// `managed_group`, as the managed group admits IPv4 clients only).
pub(super) fn ip_address_type(service: &Service, managed_group: bool) -> Result<IpAddressType, CloudError> {
    match annotation(service, IP_ADDRESS_TYPE).as_deref() {
        Some("ipv4") => Ok(IpAddressType::Ipv4),
        Some("dualstack") => Ok(IpAddressType::Dualstack),
        Some(other) => Err(CloudError::provider(format!(
            "service.beta.kubernetes.io/aws-load-balancer-{IP_ADDRESS_TYPE}: {other:?} is not ipv4 or dualstack"
        ))),
        None if !managed_group && ip_families(service).contains(&IpFamily::Ipv6) => {
            Ok(IpAddressType::Dualstack)
        }
        None => Ok(IpAddressType::Ipv4),
    }
}

/// Whether a `dualstack` NLB the subnets cannot take is an error (the service insists) rather than an
/// `ipv4` one.
fn insists(service: &Service) -> bool {
    annotation(service, IP_ADDRESS_TYPE).as_deref() == Some("dualstack")
        || ip_family_policy(service) == IpFamilyPolicy::RequireDualStack
}

/// Whether the service's load balancer serves every family of `spec.ipFamilies`
/// ([`kube_ccm_provider::LoadBalancer::check_ip_families`]).
pub(crate) fn check(service: &Service, managed_group: bool) -> Result<(), Refused> {
    let families = ip_families(service);
    if families == [IpFamily::Ipv4] {
        return Ok(());
    }
    match kind(service) {
        Kind::Elsewhere => Ok(()),
        Kind::Classic => Err(
            "classic ELBs serve IPv4 only; an NLB (service.beta.kubernetes.io/aws-load-balancer-type: nlb) serves IPv4 and IPv6"
                .into(),
        ),
        Kind::Network if families == [IpFamily::Ipv6] => {
            Err("an NLB serves IPv4, or IPv4 and IPv6 (dualstack), not IPv6 alone".into())
        }
        Kind::Network => match ip_address_type(service, managed_group) {
            Ok(IpAddressType::Dualstack) => Ok(()),
            Ok(_) if managed_group && annotation(service, IP_ADDRESS_TYPE).is_none() => Err(
                "with NLBSecurityGroupMode = Managed the NLB's security group admits IPv4 clients only, so the NLB is ipv4"
                    .into(),
            ),
            Ok(_) => Err(format!(
                "service.beta.kubernetes.io/aws-load-balancer-{IP_ADDRESS_TYPE} is ipv4"
            )
            .into()),
            Err(error) => Err(error.to_string().into()),
        },
    }
}

/// Whether the subnet has an IPv6 CIDR block associated: a block whose state is not one of EC2's states
/// of a block on its way or gone. A state this code does not know counts as associated (moto lists only
/// associated blocks, their state a Python dict in text): the check is there to name the problem before
/// EC2 would refuse, and a wrong guess only leaves the refusal to EC2.
fn has_ipv6(subnet: &Subnet) -> bool {
    use SubnetCidrBlockStateCode::{Associating, Disassociated, Disassociating, Failed, Failing};
    subnet
        .ipv6_cidr_block_association_set()
        .iter()
        .any(|association| {
            let state = association.ipv6_cidr_block_state().and_then(|s| s.state());
            let not_associated = matches!(
                state,
                Some(Associating | Disassociating | Disassociated | Failing | Failed)
            );
            association.ipv6_cidr_block().is_some() && !not_associated
        })
}

impl AwsProvider {
    /// The subnets of `subnets` without an IPv6 CIDR block (those EC2 does not know included), for a
    /// `dualstack` NLB; none for an `ipv4` one.
    async fn subnets_without_ipv6(
        &self,
        wanted: &IpAddressType,
        subnets: &[String],
    ) -> Result<Vec<String>, CloudError> {
        if *wanted != IpAddressType::Dualstack || subnets.is_empty() {
            return Ok(Vec::new());
        }
        let output = self
            .ec2
            .describe_subnets()
            .filters(
                Filter::builder()
                    .name("subnet-id")
                    .set_values(Some(subnets.to_vec()))
                    .build(),
            )
            .send()
            .await
            .map_err(aws_error)?;
        let with_ipv6: Vec<&str> = output
            .subnets()
            .iter()
            .filter(|subnet| has_ipv6(subnet))
            .filter_map(|subnet| subnet.subnet_id())
            .collect();
        Ok(subnets
            .iter()
            .filter(|id| !with_ipv6.contains(&id.as_str()))
            .cloned()
            .collect())
    }

    /// The address type to make a new NLB with in `subnets`: `wanted`, or `ipv4` when they cannot take a
    /// `dualstack` one (the end of the ensure then says why, [`AwsProvider::ensure_ip_address_type`]).
    pub(super) async fn creatable_ip_address_type(
        &self,
        wanted: &IpAddressType,
        subnets: &[String],
    ) -> Result<IpAddressType, CloudError> {
        if self.subnets_without_ipv6(wanted, subnets).await?.is_empty() {
            Ok(wanted.clone())
        } else {
            Ok(IpAddressType::Ipv4)
        }
    }

    /// Changes an existing NLB's address type to `wanted` when it differs (a type not given is `ipv4`).
    /// A `dualstack` NLB its subnets cannot take is an error naming them when the service insists, and
    /// otherwise left `ipv4`.
    pub(super) async fn ensure_ip_address_type(
        &self,
        service: &Service,
        lb: &Nlb,
        wanted: &IpAddressType,
    ) -> Result<(), CloudError> {
        let current = lb.ip_address_type().cloned().unwrap_or(IpAddressType::Ipv4);
        if current == *wanted {
            return Ok(());
        }
        let arn = lb.load_balancer_arn().unwrap_or_default();
        let subnets: Vec<String> = lb
            .availability_zones()
            .iter()
            .filter_map(|z| z.subnet_id().map(str::to_owned))
            .collect();
        let without = self.subnets_without_ipv6(wanted, &subnets).await?;
        if !without.is_empty() {
            if insists(service) {
                return Err(CloudError::provider(format!(
                    "a dualstack NLB needs an IPv6 CIDR block in each of its subnets, and {} have none (or are not subnet IDs EC2 knows): associate one, or annotate the service with service.beta.kubernetes.io/aws-load-balancer-{IP_ADDRESS_TYPE}: ipv4",
                    without.join(", ")
                )));
            }
            tracing::info!(lb = arn, subnets = ?without, "the NLB stays ipv4: its subnets have no IPv6 block");
            return Ok(());
        }
        self.elbv2
            .set_ip_address_type()
            .load_balancer_arn(arn)
            .ip_address_type(wanted.clone())
            .send()
            .await
            .map_err(aws_error)?;
        tracing::info!(lb = arn, ip_address_type = %wanted, "changed the NLB's IP address type");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn service(annotations: serde_json::Value, spec: serde_json::Value) -> Service {
        serde_json::from_value(json!({"metadata": {"annotations": annotations}, "spec": spec})).unwrap()
    }

    const NLB: &str = "service.beta.kubernetes.io/aws-load-balancer-type";
    const TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-ip-address-type";

    #[test]
    fn the_address_type_is_the_annotations_else_the_families() {
        let dual = json!({"ipFamilies": ["IPv4", "IPv6"]});
        assert_eq!(
            ip_address_type(&service(json!({}), dual.clone()), false).unwrap(),
            IpAddressType::Dualstack
        );
        assert_eq!(
            ip_address_type(&service(json!({}), json!({})), false).unwrap(),
            IpAddressType::Ipv4
        );
        assert_eq!(
            ip_address_type(&service(json!({TYPE: "ipv4"}), dual.clone()), false).unwrap(),
            IpAddressType::Ipv4
        );
        assert_eq!(
            ip_address_type(&service(json!({TYPE: "dualstack"}), json!({})), false).unwrap(),
            IpAddressType::Dualstack
        );
        let error = ip_address_type(&service(json!({TYPE: "ipv6"}), json!({})), false).unwrap_err();
        assert!(
            error.to_string().contains("\"ipv6\" is not ipv4 or dualstack"),
            "{error}"
        );
    }

    #[test]
    fn a_subnet_has_ipv6_when_a_block_is_associated() {
        use aws_sdk_ec2::types::{SubnetCidrBlockState, SubnetIpv6CidrBlockAssociation};
        let subnet = |state: Option<SubnetCidrBlockStateCode>| {
            let mut association =
                SubnetIpv6CidrBlockAssociation::builder().ipv6_cidr_block("2600:1f18:3::/64");
            if let Some(state) = state {
                association =
                    association.ipv6_cidr_block_state(SubnetCidrBlockState::builder().state(state).build());
            }
            Subnet::builder()
                .subnet_id("subnet-1")
                .ipv6_cidr_block_association_set(association.build())
                .build()
        };
        // As EC2 answers: the state says.
        assert!(has_ipv6(&subnet(Some(SubnetCidrBlockStateCode::Associated))));
        assert!(!has_ipv6(&subnet(Some(SubnetCidrBlockStateCode::Disassociated))));
        assert!(!has_ipv6(&subnet(Some(SubnetCidrBlockStateCode::Associating))));
        // As moto answers: a listed block whose state is none of EC2's.
        assert!(has_ipv6(&subnet(Some(SubnetCidrBlockStateCode::from(
            "{'State': 'associated'}"
        )))));
        assert!(has_ipv6(&subnet(None)));
        assert!(!has_ipv6(&Subnet::builder().subnet_id("subnet-2").build()));
    }

    #[test]
    fn classic_elbs_and_ipv6_alone_are_refused_and_dual_nlbs_served() {
        let dual = json!({"ipFamilies": ["IPv4", "IPv6"]});
        assert_eq!(check(&service(json!({}), json!({})), false), Ok(()));
        assert!(
            check(&service(json!({}), dual.clone()), false)
                .unwrap_err()
                .reason()
                .starts_with("classic ELBs serve IPv4 only")
        );
        assert_eq!(check(&service(json!({NLB: "nlb"}), dual.clone()), false), Ok(()));
        assert_eq!(
            check(
                &service(json!({NLB: "nlb"}), json!({"ipFamilies": ["IPv6", "IPv4"]})),
                false
            ),
            Ok(())
        );
        assert!(
            check(
                &service(json!({NLB: "nlb"}), json!({"ipFamilies": ["IPv6"]})),
                false
            )
            .unwrap_err()
            .reason()
            .contains("not IPv6 alone")
        );
        assert!(
            check(&service(json!({NLB: "nlb", TYPE: "ipv4"}), dual.clone()), false)
                .unwrap_err()
                .reason()
                .ends_with("ip-address-type is ipv4")
        );
        assert_eq!(
            check(&service(json!({NLB: "external"}), dual.clone()), false),
            Ok(())
        );
        // The managed group admits IPv4 clients only: ipv4 unless annotated.
        let managed = check(&service(json!({NLB: "nlb"}), dual.clone()), true).unwrap_err();
        assert!(
            managed.reason().contains("NLBSecurityGroupMode = Managed"),
            "{managed}"
        );
        assert_eq!(
            ip_address_type(&service(json!({NLB: "nlb"}), dual.clone()), true).unwrap(),
            IpAddressType::Ipv4
        );
        assert_eq!(
            check(
                &service(json!({NLB: "nlb", TYPE: "dualstack"}), dual.clone()),
                true
            ),
            Ok(())
        );
    }

    #[test]
    fn a_service_insists_when_annotated_or_requiring_dual_stack() {
        let policy = |p: &str| json!({"ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": p});
        assert!(insists(&service(json!({}), policy("RequireDualStack"))));
        assert!(!insists(&service(json!({}), policy("PreferDualStack"))));
        assert!(insists(&service(
            json!({TYPE: "dualstack"}),
            policy("PreferDualStack")
        )));
    }
}
