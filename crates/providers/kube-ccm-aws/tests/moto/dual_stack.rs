//! Dual-stack NLBs: a service whose `spec.ipFamilies` has IPv6 gets a `dualstack` NLB once its subnets
//! have IPv6 CIDR blocks (checked here before the request: moto would make it in IPv4-only subnets, EC2
//! refuses); until then an `ipv4` one, with an error when the service requires dual stack; the annotation
//! `aws-load-balancer-ip-address-type: ipv4` turns an existing one back.

use aws_sdk_elasticloadbalancingv2::types::IpAddressType;

use super::*;

const IP_ADDRESS_TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-ip-address-type";

fn dual_stack_nlb() -> k8s_openapi::api::core::v1::Service {
    let mut service = nlb_service(serde_json::json!([{"port": 80, "nodePort": 30080}]));
    let spec = service.spec.as_mut().unwrap();
    spec.ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
    spec.ip_family_policy = Some("RequireDualStack".into());
    service
}

async fn address_type(elbv2: &aws_sdk_elasticloadbalancingv2::Client) -> Option<IpAddressType> {
    let described = elbv2
        .describe_load_balancers()
        .names(ELB_NAME)
        .send()
        .await
        .ok()?;
    described.load_balancers().first()?.ip_address_type().cloned()
}

#[tokio::test]
async fn a_dual_stack_service_gets_a_dualstack_nlb_once_its_subnets_have_ipv6() {
    let Some(moto) = Moto::start() else { return };
    let ec2 = moto.ec2();
    let elbv2 = elbv2(&moto);
    let net = network(&ec2, 2).await;
    let provider = moto.provider("");
    let lb = provider.load_balancer().unwrap();
    let nodes = nodes_of(&net.instances);
    let mut service = dual_stack_nlb();
    service.spec.as_mut().unwrap().ip_family_policy = Some("PreferDualStack".into());
    assert_eq!(lb.check_ip_families(&service), Ok(()));

    // The cluster's subnets (one per zone) have no IPv6 block. Preferred: an ipv4 NLB, no error.
    lb.ensure_load_balancer(&cx(), "c", &service, &nodes)
        .await
        .unwrap();
    assert_eq!(address_type(&elbv2).await, Some(IpAddressType::Ipv4));
    // Required: the NLB still serves IPv4, and the ensure names the subnets.
    service.spec.as_mut().unwrap().ip_family_policy = Some("RequireDualStack".into());
    let error = lb
        .ensure_load_balancer(&cx(), "c", &service, &nodes)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("a dualstack NLB needs an IPv6 CIDR block in each of its subnets")
            && error.contains(&net.subnets[0])
            && error.contains(&net.subnets[1]),
        "{error}"
    );
    assert_eq!(address_type(&elbv2).await, Some(IpAddressType::Ipv4));

    for (index, subnet) in net.subnets.iter().take(2).enumerate() {
        ec2.associate_subnet_cidr_block()
            .subnet_id(subnet)
            .ipv6_cidr_block(format!("2600:1f18:3:{index}::/64"))
            .send()
            .await
            .unwrap();
    }
    let status = lb
        .ensure_load_balancer(&cx(), "c", &service, &nodes)
        .await
        .unwrap();
    assert!(status.ingress.unwrap()[0].hostname.is_some());
    assert_eq!(address_type(&elbv2).await, Some(IpAddressType::Dualstack));

    // A second ensure changes nothing; the annotation turns it back to IPv4.
    lb.ensure_load_balancer(&cx(), "c", &service, &nodes)
        .await
        .unwrap();
    assert_eq!(address_type(&elbv2).await, Some(IpAddressType::Dualstack));
    let mut ipv4 = service.clone();
    ipv4.metadata
        .annotations
        .get_or_insert_default()
        .insert(IP_ADDRESS_TYPE.into(), "ipv4".into());
    assert!(lb.check_ip_families(&ipv4).is_err(), "it no longer serves IPv6");
    lb.ensure_load_balancer(&cx(), "c", &ipv4, &nodes).await.unwrap();
    assert_eq!(address_type(&elbv2).await, Some(IpAddressType::Ipv4));
}

/// A new NLB is made dualstack at once when its subnets can take it.
#[tokio::test]
async fn a_new_nlb_in_ipv6_subnets_is_made_dualstack() {
    let Some(moto) = Moto::start() else { return };
    let ec2 = moto.ec2();
    let elbv2 = elbv2(&moto);
    let net = network(&ec2, 1).await;
    for (index, subnet) in net.subnets.iter().take(2).enumerate() {
        ec2.associate_subnet_cidr_block()
            .subnet_id(subnet)
            .ipv6_cidr_block(format!("2600:1f18:4:{index}::/64"))
            .send()
            .await
            .unwrap();
    }
    let provider = moto.provider("");
    let lb = provider.load_balancer().unwrap();
    lb.ensure_load_balancer(&cx(), "c", &dual_stack_nlb(), &nodes_of(&net.instances))
        .await
        .unwrap();
    assert_eq!(address_type(&elbv2).await, Some(IpAddressType::Dualstack));
}

#[tokio::test]
async fn a_classic_elb_cannot_serve_ipv6() {
    let Some(moto) = Moto::start() else { return };
    let provider = moto.provider("");
    let lb = provider.load_balancer().unwrap();
    let mut service = web_service(serde_json::json!([{"port": 80, "nodePort": 30080}]));
    service.spec.as_mut().unwrap().ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
    let refused = lb.check_ip_families(&service).unwrap_err();
    assert!(
        refused.reason().starts_with("classic ELBs serve IPv4 only"),
        "{refused}"
    );
}
