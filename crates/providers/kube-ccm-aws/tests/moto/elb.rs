//! Classic ELBs: the life cycle, and adoption of the in-tree provider's.

use std::collections::BTreeMap;

use super::*;

/// A group's ingress rules: (protocol, from port, CIDR), sorted.
fn open(group: &aws_sdk_ec2::types::SecurityGroup) -> Vec<(&str, i32, &str)> {
    let mut rules: Vec<(&str, i32, &str)> = group
        .ip_permissions()
        .iter()
        .flat_map(|p| {
            p.ip_ranges().iter().map(move |r| {
                (
                    p.ip_protocol().unwrap(),
                    p.from_port().unwrap(),
                    r.cidr_ip().unwrap(),
                )
            })
        })
        .collect();
    rules.sort();
    rules
}

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
    assert_eq!(open(group), [("icmp", 3, "0.0.0.0/0"), ("tcp", 80, "0.0.0.0/0")]);
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
    assert_eq!(
        open(&group.security_groups()[0]),
        [
            ("icmp", 3, "192.0.2.0/24"),
            ("tcp", 80, "192.0.2.0/24"),
            ("tcp", 443, "192.0.2.0/24")
        ]
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

#[tokio::test]
async fn upstreams_annotations_shape_the_elb_and_a_second_ensure_changes_nothing() {
    let Some(moto) = Moto::start() else { return };
    let ec2 = moto.ec2();
    let elb = elb(&moto);
    let net = network(&ec2, 2).await;
    let extra = ec2
        .create_security_group()
        .group_name("extra")
        .description("an extra group")
        .vpc_id(&net.vpc)
        .send()
        .await
        .unwrap()
        .group_id()
        .unwrap()
        .to_owned();
    // The first node is in the target pool, the second is not.
    let nodes: Vec<Arc<Node>> = net
        .instances
        .iter()
        .enumerate()
        .map(|(n, i)| {
            let labels = if n == 0 {
                serde_json::json!({"pool": "edge"})
            } else {
                serde_json::json!({"pool": "core"})
            };
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": i.private_dns_name().unwrap(), "labels": labels},
                    "spec": {"providerID": format!("aws:///us-east-1a/{}", i.instance_id().unwrap())},
                }))
                .unwrap(),
            )
        })
        .collect();
    let certificate = "arn:aws:iam::123456789012:server-certificate/web";
    let key = |k: &str| format!("service.beta.kubernetes.io/aws-load-balancer-{k}");
    let mut service = web_service(serde_json::json!([
        {"name": "http", "port": 80, "nodePort": 30080},
        {"name": "https", "port": 443, "nodePort": 30443},
    ]));
    let annotations: BTreeMap<String, String> = [
        (key("ssl-cert"), certificate),
        (key("ssl-ports"), "https"),
        // moto keeps one protocol per listener (it answers the front's as the backend's), so the backend
        // here speaks the front's protocol; the unit tests cover the other pairs.
        (key("backend-protocol"), "https"),
        (key("ssl-negotiation-policy"), "ELBSecurityPolicy-TLS-1-2-2017-01"),
        (key("proxy-protocol"), "*"),
        (key("connection-draining-enabled"), "true"),
        (key("connection-draining-timeout"), "30"),
        (key("connection-idle-timeout"), "120"),
        (key("cross-zone-load-balancing-enabled"), "true"),
        (key("additional-resource-tags"), "team=web,cost-centre=42"),
        (key("healthcheck-protocol"), "HTTP"),
        (key("healthcheck-port"), "10256"),
        (key("healthcheck-path"), "/healthz"),
        (key("healthcheck-interval"), "30"),
        (key("healthcheck-timeout"), "7"),
        (key("healthcheck-healthy-threshold"), "3"),
        (key("healthcheck-unhealthy-threshold"), "4"),
        (key("target-node-labels"), "pool=edge"),
        (key("extra-security-groups"), extra.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_owned()))
    .collect();
    service.metadata.annotations = Some(annotations);
    let provider = moto.provider("");
    let lb = provider.load_balancer().unwrap();
    lb.ensure_load_balancer(&cx(), "c", &service, &nodes)
        .await
        .unwrap();

    let described = elb
        .describe_load_balancers()
        .load_balancer_names(ELB_NAME)
        .send()
        .await
        .unwrap();
    let made = &described.load_balancer_descriptions()[0];
    let mut listeners: Vec<(i32, String, String, Option<String>)> = made
        .listener_descriptions()
        .iter()
        .map(|d| d.listener().unwrap())
        .map(|l| {
            (
                l.load_balancer_port(),
                l.protocol().to_uppercase(),
                l.instance_protocol().unwrap().to_uppercase(),
                l.ssl_certificate_id().map(str::to_owned),
            )
        })
        .collect();
    listeners.sort();
    assert_eq!(
        listeners,
        [
            (80, "TCP".into(), "TCP".into(), None),
            (443, "HTTPS".into(), "HTTPS".into(), Some(certificate.to_owned())),
        ]
    );
    let tls_policies: Vec<&str> = made
        .listener_descriptions()
        .iter()
        .find(|d| d.listener().unwrap().load_balancer_port() == 443)
        .unwrap()
        .policy_names()
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(
        tls_policies,
        ["k8s-SSLNegotiationPolicy-ELBSecurityPolicy-TLS-1-2-2017-01"]
    );
    let mut proxied: Vec<i32> = made
        .backend_server_descriptions()
        .iter()
        .filter(|b| b.policy_names().iter().any(|p| p == "k8s-proxyprotocol-enabled"))
        .map(|b| b.instance_port().unwrap())
        .collect();
    proxied.sort();
    assert_eq!(proxied, [30080, 30443]);
    let health = made.health_check().unwrap();
    assert_eq!(
        (
            health.target(),
            health.interval(),
            health.timeout(),
            health.healthy_threshold(),
            health.unhealthy_threshold()
        ),
        ("HTTP:10256/healthz", 30, 7, 3, 4)
    );
    let registered: Vec<&str> = made.instances().iter().filter_map(|i| i.instance_id()).collect();
    assert_eq!(registered, [net.instances[0].instance_id().unwrap()]);
    assert_eq!(made.security_groups().len(), 2);
    assert!(made.security_groups().contains(&extra));
    let attributes = elb
        .describe_load_balancer_attributes()
        .load_balancer_name(ELB_NAME)
        .send()
        .await
        .unwrap();
    let attributes = attributes.load_balancer_attributes().unwrap();
    let draining = attributes.connection_draining().unwrap();
    assert_eq!((draining.enabled(), draining.timeout()), (true, Some(30)));
    assert_eq!(attributes.connection_settings().unwrap().idle_timeout(), 120);
    assert!(attributes.cross_zone_load_balancing().unwrap().enabled());
    let tags = elb
        .describe_tags()
        .load_balancer_names(ELB_NAME)
        .send()
        .await
        .unwrap();
    let tags: BTreeMap<&str, &str> = tags.tag_descriptions()[0]
        .tags()
        .iter()
        .map(|t| (t.key(), t.value().unwrap_or_default()))
        .collect();
    assert_eq!(tags.get("team"), Some(&"web"));
    assert_eq!(tags.get("cost-centre"), Some(&"42"));
    assert_eq!(tags.get("kubernetes.io/service-name"), Some(&"shop/web"));

    // The same again: every part compared, nothing written.
    let before = writes(&provider);
    lb.ensure_load_balancer(&cx(), "c", &service, &nodes)
        .await
        .unwrap();
    assert_eq!(writes(&provider), before, "a second ensure wrote");

    // The proxy protocol and the certificate dropped: the backends lose the policy, 443 becomes TCP.
    let annotations = service.metadata.annotations.as_mut().unwrap();
    annotations.remove(&key("proxy-protocol"));
    annotations.remove(&key("ssl-cert"));
    lb.ensure_load_balancer(&cx(), "c", &service, &nodes)
        .await
        .unwrap();
    let described = elb
        .describe_load_balancers()
        .load_balancer_names(ELB_NAME)
        .send()
        .await
        .unwrap();
    let made = &described.load_balancer_descriptions()[0];
    assert!(
        made.backend_server_descriptions()
            .iter()
            .all(|b| b.policy_names().is_empty()),
        "{:?}",
        made.backend_server_descriptions()
    );
    let https = made
        .listener_descriptions()
        .iter()
        .map(|d| d.listener().unwrap())
        .find(|l| l.load_balancer_port() == 443)
        .unwrap();
    assert_eq!(
        (https.protocol().to_uppercase(), https.ssl_certificate_id()),
        ("TCP".to_owned(), None)
    );
}

#[tokio::test]
async fn an_in_tree_elb_with_a_tls_listener_is_adopted_as_it_is() {
    let Some(moto) = Moto::start() else { return };
    let ec2 = moto.ec2();
    let elb = elb(&moto);
    let net = network(&ec2, 1).await;
    let certificate = "arn:aws:iam::123456789012:server-certificate/web";
    // As the in-tree provider made it for `ssl-cert` and `backend-protocol: ssl` on port 443 (moto keeps
    // one protocol per listener, so not upstream's default SSL to a TCP backend).
    elb.create_load_balancer()
        .load_balancer_name(ELB_NAME)
        .listeners(
            aws_sdk_elasticloadbalancing::types::Listener::builder()
                .protocol("SSL")
                .load_balancer_port(443)
                .instance_protocol("SSL")
                .instance_port(30443)
                .ssl_certificate_id(certificate)
                .build()
                .unwrap(),
        )
        .subnets(&net.subnets[0])
        .send()
        .await
        .unwrap();
    let mut service = web_service(serde_json::json!([{"port": 443, "nodePort": 30443}]));
    service.metadata.annotations = Some(
        [
            (
                "service.beta.kubernetes.io/aws-load-balancer-ssl-cert".to_owned(),
                certificate.to_owned(),
            ),
            (
                "service.beta.kubernetes.io/aws-load-balancer-backend-protocol".to_owned(),
                "ssl".to_owned(),
            ),
        ]
        .into(),
    );
    let provider = moto.provider("");
    provider
        .load_balancer()
        .unwrap()
        .ensure_load_balancer(&cx(), "c", &service, &nodes_of(&net.instances))
        .await
        .unwrap();
    let written = writes(&provider);
    for operation in [
        "Elastic Load Balancing:CreateLoadBalancer",
        "Elastic Load Balancing:DeleteLoadBalancerListeners",
        "Elastic Load Balancing:CreateLoadBalancerListeners",
    ] {
        assert_eq!(written.get(operation), None, "{operation}: {written:?}");
    }
}
