//! The orphan sweep's questions: what is listed as the cluster's, and deleting it whole, beside another
//! cluster's, untagged and foreign-named load balancers that must never be listed.

use aws_sdk_elasticloadbalancing::types::{Listener, Tag as ElbTag};
use aws_sdk_elasticloadbalancingv2::types::{ProtocolEnum, Tag as Elbv2Tag};
use kube_ccm_provider::ClusterLoadBalancer;

use super::*;

const NLB_UID: &str = "0b1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9";
const NLB_NAME: &str = "a0b1b2c3d4e5f60718293a4b5c6d7e8f";
const GONE_ELB: &str = "a0c1b2c3d4e5f60718293a4b5c6d7e8f";

async fn plain_elb(
    elb: &aws_sdk_elasticloadbalancing::Client,
    name: &str,
    subnet: &str,
    tags: &[(&str, &str)],
) {
    let listener = Listener::builder()
        .protocol("TCP")
        .load_balancer_port(80)
        .instance_port(30080)
        .build()
        .unwrap();
    let tags: Vec<ElbTag> = tags
        .iter()
        .map(|(k, v)| ElbTag::builder().key(*k).value(*v).build().unwrap())
        .collect();
    elb.create_load_balancer()
        .load_balancer_name(name)
        .listeners(listener)
        .subnets(subnet)
        .set_tags((!tags.is_empty()).then_some(tags))
        .send()
        .await
        .unwrap();
}

async fn lone_target_group(
    elbv2: &aws_sdk_elasticloadbalancingv2::Client,
    vpc: &str,
    name: &str,
    service: &str,
) {
    elbv2
        .create_target_group()
        .name(name)
        .protocol(ProtocolEnum::Tcp)
        .port(30090)
        .vpc_id(vpc)
        .tags(
            Elbv2Tag::builder()
                .key("kubernetes.io/cluster/test")
                .value("owned")
                .build(),
        )
        .tags(
            Elbv2Tag::builder()
                .key("kubernetes.io/service-name")
                .value(service)
                .build(),
        )
        .send()
        .await
        .unwrap();
}

fn keys(listed: &[ClusterLoadBalancer]) -> Vec<(String, Option<String>, Vec<&str>)> {
    let mut keys: Vec<_> = listed
        .iter()
        .map(|lb| {
            let kinds = lb
                .parts
                .iter()
                .map(|p| p.split('/').next().unwrap_or_default())
                .collect();
            (lb.name.clone(), lb.service.clone(), kinds)
        })
        .collect();
    keys.sort();
    keys
}

#[tokio::test]
async fn the_clusters_load_balancers_and_leftovers_are_listed_and_deleted_whole_and_nothing_else() {
    let Some(moto) = Moto::start() else { return };
    let ec2 = moto.ec2();
    let elb = elb(&moto);
    let elbv2 = elbv2(&moto);
    let net = network(&ec2, 2).await;
    let provider = moto.provider("");
    let lb = provider.load_balancer().unwrap();
    let nodes = nodes_of(&net.instances);

    // The cluster's: a live classic ELB, an NLB whose service is gone, and what a cut-short delete of a
    // third left (its ELB's group); two target groups on no NLB, one of a live service.
    let classic = web_service(serde_json::json!([{"port": 80, "nodePort": 30080}]));
    lb.ensure_load_balancer(&cx(), "c", &classic, &nodes)
        .await
        .unwrap();
    let mut nlb = nlb_service(serde_json::json!([{"port": 81, "nodePort": 30081}]));
    nlb.metadata.name = Some("api".into());
    nlb.metadata.uid = Some(NLB_UID.into());
    lb.ensure_load_balancer(&cx(), "c", &nlb, &nodes).await.unwrap();
    let mut gone = web_service(serde_json::json!([{"port": 82, "nodePort": 30082}]));
    gone.metadata.name = Some("old".into());
    gone.metadata.uid = Some("0c1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9".into());
    lb.ensure_load_balancer(&cx(), "c", &gone, &nodes).await.unwrap();
    elb.delete_load_balancer()
        .load_balancer_name(GONE_ELB)
        .send()
        .await
        .unwrap();
    lone_target_group(&elbv2, &net.vpc, "k8s-shop-gone-0123456789", "shop/gone").await;
    lone_target_group(&elbv2, &net.vpc, "k8s-shop-live-0123456789", "shop/live").await;

    // Not the cluster's: another cluster's, an untagged one, one named as another controller names them,
    // one the cluster only shares.
    let other = "a1111111111111111111111111111111";
    plain_elb(
        &elb,
        other,
        &net.subnets[0],
        &[("kubernetes.io/cluster/other", "owned")],
    )
    .await;
    let untagged = "a2222222222222222222222222222222";
    plain_elb(&elb, untagged, &net.subnets[0], &[]).await;
    let foreign = "k8s-shop-web-0123456789";
    plain_elb(
        &elb,
        foreign,
        &net.subnets[0],
        &[("kubernetes.io/cluster/test", "owned")],
    )
    .await;

    let listed = lb.list_load_balancers(&cx(), "c").await.unwrap();
    let service = |s: &str| Some(s.to_owned());
    assert_eq!(
        keys(&listed),
        [
            (String::new(), service("shop/gone"), vec!["target-group"]),
            (String::new(), service("shop/live"), vec!["target-group"]),
            (
                ELB_NAME.to_owned(),
                service("shop/web"),
                vec!["elb", "security-group"]
            ),
            (
                NLB_NAME.to_owned(),
                service("shop/api"),
                vec!["nlb", "target-group"]
            ),
            (GONE_ELB.to_owned(), service("shop/old"), vec!["security-group"]),
        ]
    );

    // What the sweep would take: the NLB, the ELB's leftover group, the gone service's target group.
    for orphan in listed
        .iter()
        .filter(|l| l.name == NLB_NAME || l.name == GONE_ELB || l.service.as_deref() == Some("shop/gone"))
    {
        lb.delete_load_balancer(&cx(), "c", orphan).await.unwrap();
        lb.delete_load_balancer(&cx(), "c", orphan).await.unwrap();
    }
    let left = lb.list_load_balancers(&cx(), "c").await.unwrap();
    assert_eq!(
        keys(&left),
        [
            (String::new(), service("shop/live"), vec!["target-group"]),
            (
                ELB_NAME.to_owned(),
                service("shop/web"),
                vec!["elb", "security-group"]
            ),
        ]
    );
    assert_eq!(lb.get_load_balancer(&cx(), "c", &nlb).await.unwrap(), None);
    assert!(
        lb.get_load_balancer(&cx(), "c", &classic)
            .await
            .unwrap()
            .is_some()
    );
    let groups = elbv2.describe_target_groups().send().await.unwrap();
    let names: Vec<_> = groups
        .target_groups()
        .iter()
        .filter_map(|g| g.target_group_name())
        .collect();
    assert_eq!(
        names,
        ["k8s-shop-live-0123456789"],
        "the NLB's target group went with it"
    );
    let elbs = elb.describe_load_balancers().send().await.unwrap();
    let mut names: Vec<_> = elbs
        .load_balancer_descriptions()
        .iter()
        .filter_map(|d| d.load_balancer_name())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [ELB_NAME, other, untagged, foreign],
        "nothing else was touched"
    );
    let rules = ec2
        .describe_security_groups()
        .group_ids(&net.node_group)
        .send()
        .await
        .unwrap();
    let described: Vec<String> = rules.security_groups()[0]
        .ip_permissions()
        .iter()
        .flat_map(|p| p.ip_ranges())
        .filter_map(|r| r.description().map(str::to_owned))
        .collect();
    assert!(
        !described.iter().any(|d| d.contains(NLB_NAME)),
        "the NLB's node rules went with it: {described:?}"
    );
}
