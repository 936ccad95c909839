//! NLBs: listeners, target groups, targets and node rules; the hand-off of external load balancers.

use super::*;

#[tokio::test]
async fn an_nlb_gets_a_listener_and_target_group_per_port_and_follows_changes() {
    let Some(moto) = Moto::start() else { return };
    let ec2 = moto.ec2();
    let elbv2 = elbv2(&moto);
    let net = network(&ec2, 2).await;
    let provider = moto.provider("");
    let lb = provider.load_balancer().unwrap();
    let nodes = nodes_of(&net.instances);
    let service = nlb_service(serde_json::json!([
        {"port": 80, "nodePort": 30080},
        {"name": "dns", "port": 53, "nodePort": 30053, "protocol": "UDP"},
    ]));
    assert_eq!(lb.get_load_balancer(&cx(), "c", &service).await.unwrap(), None);
    let status = lb
        .ensure_load_balancer(&cx(), "c", &service, &nodes)
        .await
        .unwrap();
    let hostname = status.ingress.unwrap()[0].hostname.clone().unwrap();
    let described = elbv2
        .describe_load_balancers()
        .names(ELB_NAME)
        .send()
        .await
        .unwrap();
    let made = &described.load_balancers()[0];
    assert_eq!(made.dns_name(), Some(hostname.as_str()));
    assert_eq!(
        made.r#type(),
        Some(&aws_sdk_elasticloadbalancingv2::types::LoadBalancerTypeEnum::Network)
    );
    let (listeners, targets) = nlb_state(&elbv2).await;
    assert_eq!(
        listeners
            .iter()
            .map(|(p, proto, _)| (*p, proto.as_str()))
            .collect::<Vec<_>>(),
        [(53, "UDP"), (80, "TCP")]
    );
    assert_eq!(
        listeners[1].2, "k8s-shop-web-bd644d32df",
        "upstream's name for port 80"
    );
    let mut ids: Vec<String> = net
        .instances
        .iter()
        .map(|i| i.instance_id().unwrap().to_owned())
        .collect();
    ids.sort();
    assert_eq!(
        targets[1],
        ids.iter().map(|id| (id.clone(), 30080)).collect::<Vec<_>>()
    );
    assert_eq!(
        targets[0],
        ids.iter().map(|id| (id.clone(), 30053)).collect::<Vec<_>>()
    );

    // The nodes' group admits the clients on the node ports, and the NLB's subnets on the UDP port's
    // health check (TCP 30080's is covered by the client rule).
    let client = format!("kubernetes.io/rule/nlb/client={ELB_NAME}");
    let health = format!("kubernetes.io/rule/nlb/health={ELB_NAME}");
    let rule = |protocol: &str, port: i32, cidr: &str, description: &str| {
        (protocol.to_owned(), port, cidr.to_owned(), description.to_owned())
    };
    assert_eq!(
        nlb_rules(&ec2, &net.node_group).await,
        [
            rule("tcp", 30053, "10.3.1.0/24", &health),
            rule("tcp", 30053, "10.3.2.0/24", &health),
            rule("tcp", 30080, "0.0.0.0/0", &client),
            rule("udp", 30053, "0.0.0.0/0", &client),
        ]
    );

    // One node left.
    lb.update_load_balancer(&cx(), "c", &service, &nodes[..1])
        .await
        .unwrap();
    let (_, targets) = nlb_state(&elbv2).await;
    let first = net.instances[0].instance_id().unwrap().to_owned();
    assert_eq!(
        targets,
        [vec![(first.clone(), 30053)], vec![(first.clone(), 30080)]]
    );

    // Port 80's node port changes and DNS goes: a new group for 80, the old one and 53's deleted.
    let changed = nlb_service(serde_json::json!([{"port": 80, "nodePort": 30081}]));
    lb.ensure_load_balancer(&cx(), "c", &changed, &nodes)
        .await
        .unwrap();
    let (listeners, targets) = nlb_state(&elbv2).await;
    assert_eq!(listeners.len(), 1);
    assert_eq!((listeners[0].0, listeners[0].1.as_str()), (80, "TCP"));
    assert_ne!(listeners[0].2, "k8s-shop-web-bd644d32df");
    assert_eq!(
        targets[0],
        ids.iter().map(|id| (id.clone(), 30081)).collect::<Vec<_>>()
    );
    let groups = elbv2.describe_target_groups().send().await.unwrap();
    assert_eq!(
        groups.target_groups().len(),
        1,
        "retired target groups are deleted"
    );
    assert_eq!(
        nlb_rules(&ec2, &net.node_group).await,
        [rule("tcp", 30081, "0.0.0.0/0", &client)]
    );

    lb.ensure_load_balancer_deleted(&cx(), "c", &changed)
        .await
        .unwrap();
    assert_eq!(lb.get_load_balancer(&cx(), "c", &changed).await.unwrap(), None);
    assert!(
        elbv2
            .describe_target_groups()
            .send()
            .await
            .unwrap()
            .target_groups()
            .is_empty()
    );
    assert!(
        nlb_rules(&ec2, &net.node_group).await.is_empty(),
        "the rules go with the NLB"
    );
    lb.ensure_load_balancer_deleted(&cx(), "c", &changed)
        .await
        .unwrap();
}

#[tokio::test]
async fn external_load_balancers_are_handed_off() {
    let Some(moto) = Moto::start() else { return };
    let provider = moto.provider("");
    let lb = provider.load_balancer().unwrap();
    let mut external = web_service(serde_json::json!([{"port": 80, "nodePort": 30080}]));
    external.metadata.annotations = Some(
        [(
            "service.beta.kubernetes.io/aws-load-balancer-type".to_owned(),
            "external".to_owned(),
        )]
        .into(),
    );
    assert!(matches!(
        lb.ensure_load_balancer(&cx(), "c", &external, &[]).await,
        Err(CloudError::ImplementedElsewhere)
    ));
    assert!(matches!(
        lb.get_load_balancer(&cx(), "c", &external).await,
        Err(CloudError::ImplementedElsewhere)
    ));
    lb.ensure_load_balancer_deleted(&cx(), "c", &external)
        .await
        .unwrap();
    assert_eq!(provider.requests().total(), 0, "nothing was asked of AWS");
}
