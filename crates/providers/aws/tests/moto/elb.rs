//! Classic ELBs: the life cycle, and adoption of the in-tree provider's.

use super::*;

#[tokio::test]
async fn a_classic_elb_is_made_kept_in_step_and_deleted_with_its_security_group() {
    let Some(moto) = Moto::start() else { return };
    let ec2 = moto.ec2();
    let elb = elb(&moto);
    let net = network(&ec2, 2).await;
    let provider = moto.provider("");
    let lb = provider.load_balancer().unwrap();
    let nodes = nodes_of(&net.instances);
    let service = web_service(serde_json::json!([{"port": 80, "nodePort": 30080}]));

    assert_eq!(lb.get_load_balancer(&cx(), "c", &service).await.unwrap(), None);
    let status = lb
        .ensure_load_balancer(&cx(), "c", &service, &nodes)
        .await
        .unwrap();
    let hostname = status.ingress.unwrap()[0].hostname.clone().unwrap();
    assert!(!hostname.is_empty());

    let described = elb
        .describe_load_balancers()
        .load_balancer_names(ELB_NAME)
        .send()
        .await
        .unwrap();
    let made = &described.load_balancer_descriptions()[0];
    assert_eq!(made.dns_name(), Some(hostname.as_str()));
    let listeners: Vec<(i32, i32)> = made
        .listener_descriptions()
        .iter()
        .map(|d| d.listener().unwrap())
        .map(|l| (l.load_balancer_port(), l.instance_port()))
        .collect();
    assert_eq!(listeners, [(80, 30080)]);
    let mut subnets = made.subnets().to_vec();
    subnets.sort();
    let mut expected = net.subnets[..2].to_vec();
    expected.sort();
    assert_eq!(
        subnets, expected,
        "one cluster subnet per zone, never the untagged one"
    );
    assert_eq!(made.health_check().unwrap().target(), "TCP:30080");
    assert_eq!(made.instances().len(), 2);
    let elb_group = made.security_groups()[0].clone();
    let group = ec2
        .describe_security_groups()
        .group_ids(&elb_group)
        .send()
        .await
        .unwrap();
    let group = &group.security_groups()[0];
    assert_eq!(group.group_name(), Some(format!("k8s-elb-{ELB_NAME}").as_str()));
    let open: Vec<(i32, String)> = group
        .ip_permissions()
        .iter()
        .flat_map(|p| {
            p.ip_ranges()
                .iter()
                .map(move |r| (p.from_port().unwrap(), r.cidr_ip().unwrap().to_owned()))
        })
        .collect();
    assert_eq!(open, [(80, "0.0.0.0/0".to_owned())]);
    assert_eq!(
        admitting(&ec2, &net.vpc, &elb_group).await,
        std::slice::from_ref(&net.node_group),
        "the nodes admit the ELB"
    );
    assert_eq!(
        lb.get_load_balancer(&cx(), "c", &service)
            .await
            .unwrap()
            .unwrap()
            .ingress
            .unwrap()[0]
            .hostname,
        Some(hostname.clone())
    );

    // One node left: its instance stays registered, the other's goes.
    lb.update_load_balancer(&cx(), "c", &service, &nodes[..1])
        .await
        .unwrap();
    let described = elb
        .describe_load_balancers()
        .load_balancer_names(ELB_NAME)
        .send()
        .await
        .unwrap();
    let registered: Vec<&str> = described.load_balancer_descriptions()[0]
        .instances()
        .iter()
        .filter_map(|i| i.instance_id())
        .collect();
    assert_eq!(registered, [net.instances[0].instance_id().unwrap()]);

    // A second port and source ranges: listeners and the group's rules follow; nothing is recreated.
    let mut changed =
        web_service(serde_json::json!([{"port": 80, "nodePort": 30080}, {"port": 443, "nodePort": 30443}]));
    changed.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["192.0.2.0/24".into()]);
    let creates = provider
        .requests()
        .snapshot()
        .get("Elastic Load Balancing:CreateLoadBalancer")
        .copied();
    lb.ensure_load_balancer(&cx(), "c", &changed, &nodes)
        .await
        .unwrap();
    assert_eq!(
        provider
            .requests()
            .snapshot()
            .get("Elastic Load Balancing:CreateLoadBalancer")
            .copied(),
        creates,
        "{:?}",
        provider.requests().snapshot()
    );
    let described = elb
        .describe_load_balancers()
        .load_balancer_names(ELB_NAME)
        .send()
        .await
        .unwrap();
    let mut listeners: Vec<(i32, i32)> = described.load_balancer_descriptions()[0]
        .listener_descriptions()
        .iter()
        .map(|d| d.listener().unwrap())
        .map(|l| (l.load_balancer_port(), l.instance_port()))
        .collect();
    listeners.sort();
    assert_eq!(listeners, [(80, 30080), (443, 30443)]);
    let group = ec2
        .describe_security_groups()
        .group_ids(&elb_group)
        .send()
        .await
        .unwrap();
    let mut open: Vec<(i32, String)> = group.security_groups()[0]
        .ip_permissions()
        .iter()
        .flat_map(|p| {
            p.ip_ranges()
                .iter()
                .map(move |r| (p.from_port().unwrap(), r.cidr_ip().unwrap().to_owned()))
        })
        .collect();
    open.sort();
    assert_eq!(
        open,
        [(80, "192.0.2.0/24".to_owned()), (443, "192.0.2.0/24".to_owned())]
    );

    // Deleted: the ELB, the nodes' rule, and the group; a second delete is a no-op.
    lb.ensure_load_balancer_deleted(&cx(), "c", &changed)
        .await
        .unwrap();
    assert_eq!(lb.get_load_balancer(&cx(), "c", &changed).await.unwrap(), None);
    assert!(admitting(&ec2, &net.vpc, &elb_group).await.is_empty());
    let groups = ec2
        .describe_security_groups()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("group-name")
                .values(format!("k8s-elb-{ELB_NAME}"))
                .build(),
        )
        .send()
        .await
        .unwrap();
    assert!(groups.security_groups().is_empty(), "the ELB's group is deleted");
    lb.ensure_load_balancer_deleted(&cx(), "c", &changed)
        .await
        .unwrap();
}

#[tokio::test]
async fn an_elb_the_in_tree_provider_made_is_adopted_not_duplicated() {
    let Some(moto) = Moto::start() else { return };
    let ec2 = moto.ec2();
    let elb = elb(&moto);
    let net = network(&ec2, 1).await;
    // As kube-controller-manager's in-tree provider left it: same name, one listener, no instances.
    elb.create_load_balancer()
        .load_balancer_name(ELB_NAME)
        .listeners(
            aws_sdk_elasticloadbalancing::types::Listener::builder()
                .protocol("TCP")
                .load_balancer_port(80)
                .instance_protocol("TCP")
                .instance_port(30080)
                .build()
                .unwrap(),
        )
        .subnets(&net.subnets[0])
        .send()
        .await
        .unwrap();
    let provider = moto.provider("");
    let service = web_service(serde_json::json!([{"port": 80, "nodePort": 30080}]));
    let status = provider
        .load_balancer()
        .unwrap()
        .ensure_load_balancer(&cx(), "c", &service, &nodes_of(&net.instances))
        .await
        .unwrap();
    let all = elb.describe_load_balancers().send().await.unwrap();
    assert_eq!(
        all.load_balancer_descriptions().len(),
        1,
        "adopted, not duplicated"
    );
    let adopted = &all.load_balancer_descriptions()[0];
    assert_eq!(status.ingress.unwrap()[0].hostname.as_deref(), adopted.dns_name());
    assert_eq!(adopted.instances().len(), 1);
    assert_eq!(
        provider
            .requests()
            .snapshot()
            .get("Elastic Load Balancing:CreateLoadBalancer"),
        None
    );
}
