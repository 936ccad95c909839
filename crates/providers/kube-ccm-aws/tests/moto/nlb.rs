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

#[tokio::test]
async fn upstreams_nlb_annotations_shape_listeners_target_groups_and_attributes() {
    let Some(moto) = Moto::start() else { return };
    let ec2 = moto.ec2();
    let elbv2 = elbv2(&moto);
    let net = network(&ec2, 2).await;
    let provider = moto.provider("");
    let lb = provider.load_balancer().unwrap();
    // The first node is a target, the second is not.
    let nodes: Vec<Arc<Node>> = nodes_of(&net.instances)
        .into_iter()
        .enumerate()
        .map(|(n, node)| {
            let mut node = (*node).clone();
            node.metadata.labels =
                Some([("pool".to_owned(), if n == 0 { "edge" } else { "core" }.to_owned())].into());
            Arc::new(node)
        })
        .collect();
    let certificate = "arn:aws:iam::123456789012:server-certificate/web";
    let key = |k: &str| format!("service.beta.kubernetes.io/aws-load-balancer-{k}");
    let mut service = nlb_service(serde_json::json!([
        {"name": "http", "port": 80, "nodePort": 30080},
        {"name": "https", "port": 443, "nodePort": 30443},
    ]));
    let annotations = service.metadata.annotations.as_mut().unwrap();
    for (k, v) in [
        ("ssl-cert", certificate),
        ("ssl-ports", "https"),
        ("ssl-negotiation-policy", "ELBSecurityPolicy-TLS13-1-2-2021-06"),
        ("backend-protocol", "ssl"),
        ("healthcheck-protocol", "HTTP"),
        ("healthcheck-port", "10256"),
        ("healthcheck-path", "/healthz"),
        ("healthcheck-healthy-threshold", "2"),
        ("healthcheck-unhealthy-threshold", "2"),
        ("target-group-attributes", "proxy_protocol_v2.enabled=true"),
        ("cross-zone-load-balancing-enabled", "true"),
        ("additional-resource-tags", "team=web"),
        ("target-node-labels", "pool=edge"),
    ] {
        annotations.insert(key(k), v.to_owned());
    }
    lb.ensure_load_balancer(&cx(), "c", &service, &nodes)
        .await
        .unwrap();

    let described = elbv2
        .describe_load_balancers()
        .names(ELB_NAME)
        .send()
        .await
        .unwrap();
    let arn = described.load_balancers()[0]
        .load_balancer_arn()
        .unwrap()
        .to_owned();
    let listeners = elbv2
        .describe_listeners()
        .load_balancer_arn(&arn)
        .send()
        .await
        .unwrap();
    let mut seen: Vec<(i32, String, Option<String>, Option<String>)> = listeners
        .listeners()
        .iter()
        .map(|l| {
            (
                l.port().unwrap(),
                l.protocol().unwrap().as_str().to_owned(),
                l.certificates()
                    .first()
                    .and_then(|c| c.certificate_arn())
                    .map(str::to_owned),
                // moto gives TCP listeners a default policy too; only TLS ones are compared.
                l.ssl_policy()
                    .filter(|_| l.protocol().map(|p| p.as_str()) == Some("TLS"))
                    .map(str::to_owned),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (80, "TCP".into(), None, None),
            (
                443,
                "TLS".into(),
                Some(certificate.into()),
                Some("ELBSecurityPolicy-TLS13-1-2-2021-06".into())
            ),
        ]
    );
    let groups = elbv2
        .describe_target_groups()
        .load_balancer_arn(&arn)
        .send()
        .await
        .unwrap();
    let tls_group = groups
        .target_groups()
        .iter()
        .find(|g| g.port() == Some(30443))
        .unwrap();
    assert_eq!(tls_group.protocol().map(|p| p.as_str()), Some("TLS"));
    assert_eq!(
        (
            tls_group.health_check_protocol().map(|p| p.as_str()),
            tls_group.health_check_port(),
            tls_group.health_check_path(),
            tls_group.healthy_threshold_count(),
            tls_group.unhealthy_threshold_count()
        ),
        (Some("HTTP"), Some("10256"), Some("/healthz"), Some(2), Some(2))
    );
    // `target-group-attributes` sets only attributes a group has, as upstream: moto's NLB target groups
    // have neither `proxy_protocol_v2.enabled` nor `preserve_client_ip.enabled` (the unit tests cover the
    // rule), so here it is only read.
    let lb_attributes = elbv2
        .describe_load_balancer_attributes()
        .load_balancer_arn(&arn)
        .send()
        .await
        .unwrap();
    assert!(
        lb_attributes
            .attributes()
            .iter()
            .any(|a| a.key() == Some("load_balancing.cross_zone.enabled") && a.value() == Some("true")),
        "{:?}",
        lb_attributes.attributes()
    );
    let tags = elbv2.describe_tags().resource_arns(&arn).send().await.unwrap();
    assert!(
        tags.tag_descriptions()[0]
            .tags()
            .iter()
            .any(|t| t.key() == Some("team") && t.value() == Some("web"))
    );
    let (_, targets) = nlb_state(&elbv2).await;
    assert!(
        targets.iter().all(|t| t
            .iter()
            .map(|(id, _)| id.as_str())
            .eq([net.instances[0].instance_id().unwrap()])),
        "only the labelled node is a target: {targets:?}"
    );

    // The same again: nothing written. A new health-check port: the target groups are modified, not made again.
    let before = writes(&provider);
    lb.ensure_load_balancer(&cx(), "c", &service, &nodes)
        .await
        .unwrap();
    assert_eq!(writes(&provider), before, "a second ensure wrote");
    service
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(key("healthcheck-port"), "10257".to_owned());
    lb.ensure_load_balancer(&cx(), "c", &service, &nodes)
        .await
        .unwrap();
    let after = writes(&provider);
    assert_eq!(
        after
            .get("Elastic Load Balancing v2:ModifyTargetGroup")
            .copied()
            .unwrap_or(0),
        before
            .get("Elastic Load Balancing v2:ModifyTargetGroup")
            .copied()
            .unwrap_or(0)
            + 2,
        "{after:?}"
    );
    assert_eq!(
        after.get("Elastic Load Balancing v2:CreateTargetGroup"),
        before.get("Elastic Load Balancing v2:CreateTargetGroup"),
        "{after:?}"
    );
}

/// `(protocol, from, to, CIDR)` of each ingress rule of `group`, sorted.
async fn ingress(ec2: &aws_sdk_ec2::Client, group: &str) -> Vec<(String, i32, i32, String)> {
    let described = ec2
        .describe_security_groups()
        .group_ids(group)
        .send()
        .await
        .unwrap();
    let mut rules: Vec<(String, i32, i32, String)> = described.security_groups()[0]
        .ip_permissions()
        .iter()
        .flat_map(|p| {
            p.ip_ranges().iter().map(move |r| {
                (
                    p.ip_protocol().unwrap().to_owned(),
                    p.from_port().unwrap(),
                    p.to_port().unwrap(),
                    r.cidr_ip().unwrap().to_owned(),
                )
            })
        })
        .collect();
    rules.sort();
    rules
}

/// The NLB's security groups.
async fn nlb_groups(elbv2: &aws_sdk_elasticloadbalancingv2::Client) -> Vec<String> {
    let described = elbv2
        .describe_load_balancers()
        .names(ELB_NAME)
        .send()
        .await
        .unwrap();
    described.load_balancers()[0].security_groups().to_vec()
}

/// Whether a group called `name` exists.
async fn group_exists(ec2: &aws_sdk_ec2::Client, name: &str) -> bool {
    let described = ec2
        .describe_security_groups()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("group-name")
                .values(name)
                .build(),
        )
        .send()
        .await
        .unwrap();
    !described.security_groups().is_empty()
}

/// `NLBSecurityGroupMode = Managed`: the NLB gets upstream's group, open on the listener ports from the
/// source ranges, kept equal to them, replaced by annotated groups, deleted with the NLB; a group upstream
/// made is adopted; an NLB made without groups is left without.
#[tokio::test]
async fn a_managed_nlb_security_group_follows_the_service_and_goes_with_the_nlb() {
    let Some(moto) = Moto::start() else { return };
    let ec2 = moto.ec2();
    let elbv2 = elbv2(&moto);
    let net = network(&ec2, 2).await;
    let proxy = harness::aws::RecordingProxy::start(moto.0.url()).await.unwrap();
    let provider = moto.provider_via(&proxy.url, "NLBSecurityGroupMode = Managed");
    let lb = provider.load_balancer().unwrap();
    let nodes = nodes_of(&net.instances);
    let mut service = nlb_service(serde_json::json!([
        {"port": 80, "nodePort": 30080},
        {"name": "dns", "port": 53, "nodePort": 30053, "protocol": "UDP"},
    ]));
    let name = kube_ccm_aws::load_balancer::network::nlb_security_group_name("c", &service);
    // SHA-256 of "c" "web" "shop" and the UID, computed independently (Python's hashlib).
    assert_eq!(name, "k8s-shop-web-96c196df0a");
    lb.ensure_load_balancer(&cx(), "c", &service, &nodes)
        .await
        .unwrap();
    let groups = nlb_groups(&elbv2).await;
    assert_eq!(groups.len(), 1, "{groups:?}");
    let described = ec2
        .describe_security_groups()
        .group_ids(&groups[0])
        .send()
        .await
        .unwrap();
    let group = &described.security_groups()[0];
    assert_eq!(group.group_name(), Some(name.as_str()));
    assert_eq!(group.vpc_id(), Some(net.vpc.as_str()));
    assert_eq!(
        group.description(),
        Some(kube_ccm_aws::load_balancer::network::MANAGED_GROUP_DESCRIPTION)
    );
    assert!(
        group
            .tags()
            .iter()
            .any(|t| t.key() == Some("kubernetes.io/cluster/test") && t.value() == Some("owned")),
        "{:?}",
        group.tags()
    );
    let rule =
        |protocol: &str, from: i32, to: i32, cidr: &str| (protocol.to_owned(), from, to, cidr.to_owned());
    assert_eq!(
        ingress(&ec2, &groups[0]).await,
        [
            rule("icmp", 3, 4, "0.0.0.0/0"),
            rule("tcp", 80, 80, "0.0.0.0/0"),
            rule("udp", 53, 53, "0.0.0.0/0"),
        ]
    );

    // Nothing to change: nothing written.
    let before = writes(&provider);
    lb.ensure_load_balancer(&cx(), "c", &service, &nodes)
        .await
        .unwrap();
    assert_eq!(writes(&provider), before, "a second ensure writes nothing");

    // Source ranges: the group admits exactly them.
    service.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["192.0.2.0/24".into()]);
    lb.ensure_load_balancer(&cx(), "c", &service, &nodes)
        .await
        .unwrap();
    assert_eq!(
        ingress(&ec2, &groups[0]).await,
        [
            rule("icmp", 3, 4, "192.0.2.0/24"),
            rule("tcp", 80, 80, "192.0.2.0/24"),
            rule("udp", 53, 53, "192.0.2.0/24"),
        ]
    );

    // Groups of one's own (annotated): attached and left alone; the managed one is detached and deleted.
    let own = ec2
        .create_security_group()
        .group_name("mine")
        .description("mine")
        .vpc_id(&net.vpc)
        .send()
        .await
        .unwrap()
        .group_id()
        .unwrap()
        .to_owned();
    let annotations = service.metadata.annotations.as_mut().unwrap();
    annotations.insert(
        "service.beta.kubernetes.io/aws-load-balancer-security-groups".into(),
        own.clone(),
    );
    // EC2 keeps a detached group in use for a while: its delete fails then, and a later ensure deletes it.
    proxy.answer("DeleteSecurityGroup", |_| {
        (
            400,
            "<Response><Errors><Error><Code>DependencyViolation</Code><Message>resource sg has a dependent object</Message></Error></Errors><RequestID>1</RequestID></Response>".to_owned(),
        )
    });
    lb.ensure_load_balancer(&cx(), "c", &service, &nodes)
        .await
        .unwrap();
    assert_eq!(nlb_groups(&elbv2).await, std::slice::from_ref(&own));
    assert!(
        ingress(&ec2, &own).await.is_empty(),
        "an annotated group gets no rules"
    );
    assert!(group_exists(&ec2, &name).await, "still in use when detached");
    proxy.forward("DeleteSecurityGroup");
    lb.ensure_load_balancer(&cx(), "c", &service, &nodes)
        .await
        .unwrap();
    assert!(!group_exists(&ec2, &name).await, "the managed group was deleted");

    // Delete: the annotated group stays.
    lb.ensure_load_balancer_deleted(&cx(), "c", &service)
        .await
        .unwrap();
    assert_eq!(lb.get_load_balancer(&cx(), "c", &service).await.unwrap(), None);
    assert!(group_exists(&ec2, "mine").await);

    // Adoption: a group upstream made (its name, owned) is used, not a second one.
    service
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove("service.beta.kubernetes.io/aws-load-balancer-security-groups");
    let upstreams = ec2
        .create_security_group()
        .group_name(&name)
        .description(kube_ccm_aws::load_balancer::network::MANAGED_GROUP_DESCRIPTION)
        .vpc_id(&net.vpc)
        .tag_specifications(
            aws_sdk_ec2::types::TagSpecification::builder()
                .resource_type(aws_sdk_ec2::types::ResourceType::SecurityGroup)
                .tags(
                    aws_sdk_ec2::types::Tag::builder()
                        .key("kubernetes.io/cluster/test")
                        .value("owned")
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap()
        .group_id()
        .unwrap()
        .to_owned();
    lb.ensure_load_balancer(&cx(), "c", &service, &nodes)
        .await
        .unwrap();
    assert_eq!(nlb_groups(&elbv2).await, std::slice::from_ref(&upstreams));

    // A delete that stopped after the NLB went (the group still in use then) finds the group by its name.
    let arn = elbv2
        .describe_load_balancers()
        .names(ELB_NAME)
        .send()
        .await
        .unwrap()
        .load_balancers()[0]
        .load_balancer_arn()
        .unwrap()
        .to_owned();
    elbv2
        .delete_load_balancer()
        .load_balancer_arn(arn)
        .send()
        .await
        .unwrap();
    assert!(group_exists(&ec2, &name).await);
    lb.ensure_load_balancer_deleted(&cx(), "c", &service)
        .await
        .unwrap();
    assert!(!group_exists(&ec2, &name).await, "the leftover group was deleted");

    // An NLB made before the mode was set has no groups, and EC2 cannot add any: it is left without.
    let unmanaged = moto.provider("");
    unmanaged
        .load_balancer()
        .unwrap()
        .ensure_load_balancer(&cx(), "c", &service, &nodes)
        .await
        .unwrap();
    assert!(nlb_groups(&elbv2).await.is_empty());
    lb.ensure_load_balancer(&cx(), "c", &service, &nodes)
        .await
        .unwrap();
    assert!(nlb_groups(&elbv2).await.is_empty());
    assert!(!group_exists(&ec2, &name).await, "no group made for it");
    lb.ensure_load_balancer_deleted(&cx(), "c", &service)
        .await
        .unwrap();
}
