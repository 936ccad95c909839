//! Instances: look-ups by provider ID and name, batching, existence and shutdown, addresses.

use super::*;

#[tokio::test]
async fn nodes_are_described_by_provider_id_and_private_dns_name_in_one_request_each() {
    let Some(moto) = Moto::start() else { return };
    let ec2 = moto.ec2();
    let tagged = run_instances(&ec2, 3, true).await;
    let untagged = run_instances(&ec2, 1, false).await;
    let provider = moto.provider("");
    let instances = provider.instances_v2().unwrap();

    let by_id = &tagged[0];
    let id = by_id.instance_id().unwrap();
    let by_name = &tagged[1];
    let dns = by_name.private_dns_name().unwrap();
    let resource_named = tagged[2].instance_id().unwrap();
    let nodes = vec![
        node("a", Some(&format!("aws:///us-east-1a/{id}"))),
        node(dns, None),
        node(&format!("{resource_named}.ec2.internal"), None),
        node("ghost", Some("aws:////i-0000000000000dead")),
        // Not this cluster's: invisible by name, as upstream.
        node(untagged[0].private_dns_name().unwrap(), None),
    ];
    let before = provider.requests().snapshot();
    let metadata = instances.instance_metadata_batch(&cx(), &nodes).await;
    let after = provider.requests().snapshot();
    // One DescribeInstances by ID, one by name, one DescribeAvailabilityZones (then cached).
    assert_eq!(
        after.get("EC2:DescribeInstances").copied().unwrap_or(0)
            - before.get("EC2:DescribeInstances").copied().unwrap_or(0),
        2,
        "{after:?}"
    );
    assert_eq!(
        after.get("EC2:DescribeAvailabilityZones").copied(),
        Some(1),
        "{after:?}"
    );

    let first = metadata[0].as_ref().unwrap();
    assert_eq!(first.provider_id, format!("aws:///us-east-1a/{id}"));
    assert_eq!(first.instance_type, "m5.large");
    assert_eq!(first.zone, "us-east-1a");
    assert_eq!(first.region, "us-east-1");
    assert!(first.additional_labels[kube_ccm_aws::instances::ZONE_ID_LABEL].starts_with("use1-az"));
    let kinds: Vec<&str> = first.node_addresses.iter().map(|a| a.type_.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "InternalIP",
            "ExternalIP",
            "InternalDNS",
            "Hostname",
            "ExternalDNS"
        ]
    );
    assert_eq!(
        first.node_addresses[0].address,
        by_id.private_ip_address().unwrap()
    );
    assert_eq!(first.node_addresses[3].address, by_id.private_dns_name().unwrap());
    assert_eq!(
        metadata[1].as_ref().unwrap().provider_id,
        format!("aws:///us-east-1a/{}", by_name.instance_id().unwrap())
    );
    assert_eq!(
        metadata[2].as_ref().unwrap().provider_id,
        format!("aws:///us-east-1a/{resource_named}")
    );
    assert!(matches!(metadata[3], Err(CloudError::InstanceNotFound)));
    assert!(matches!(metadata[4], Err(CloudError::InstanceNotFound)));

    // A second look-up of the same nodes: the zone IDs are cached.
    let again = provider.requests().snapshot();
    instances.instance_metadata_batch(&cx(), &nodes).await;
    assert_eq!(
        provider
            .requests()
            .snapshot()
            .get("EC2:DescribeAvailabilityZones"),
        again.get("EC2:DescribeAvailabilityZones")
    );
}

#[tokio::test]
async fn terminated_instances_are_gone_and_stopped_ones_shut_down() {
    let Some(moto) = Moto::start() else { return };
    let ec2 = moto.ec2();
    let started = run_instances(&ec2, 3, true).await;
    let ids: Vec<&str> = started.iter().map(|i| i.instance_id().unwrap()).collect();
    ec2.stop_instances().instance_ids(ids[1]).send().await.unwrap();
    ec2.terminate_instances()
        .instance_ids(ids[2])
        .send()
        .await
        .unwrap();
    let provider = moto.provider("");
    let instances = provider.instances_v2().unwrap();
    let nodes: Vec<Arc<Node>> = ids
        .iter()
        .map(|id| node(id, Some(&format!("aws:///us-east-1a/{id}"))))
        .collect();
    let mut nodes = nodes;
    nodes.push(node("ghost", Some("aws:///us-east-1a/i-0000000000000dead")));

    let exists: Vec<bool> = instances
        .instance_exists_batch(&cx(), &nodes)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        exists,
        [true, true, false, false],
        "running, stopped, terminated, absent"
    );
    let shutdown: Vec<bool> = instances
        .instance_shutdown_batch(&cx(), &nodes)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(shutdown, [false, true, false, false]);
    assert_eq!(
        provider.requests().snapshot().get("EC2:DescribeInstances"),
        Some(&2),
        "one request per batch"
    );
}

#[tokio::test]
async fn ipv6_first_lists_each_interfaces_first_ipv6_address() {
    let Some(moto) = Moto::start() else { return };
    let ec2 = moto.ec2();
    let vpc = ec2
        .create_vpc()
        .cidr_block("10.1.0.0/16")
        .amazon_provided_ipv6_cidr_block(true)
        .send()
        .await
        .unwrap();
    let vpc = vpc.vpc().unwrap();
    let v6 = vpc.ipv6_cidr_block_association_set()[0]
        .ipv6_cidr_block()
        .unwrap();
    let subnet_v6 = v6.replace("::/56", "::/64");
    let subnet = ec2
        .create_subnet()
        .vpc_id(vpc.vpc_id().unwrap())
        .cidr_block("10.1.1.0/24")
        .ipv6_cidr_block(subnet_v6)
        .availability_zone("us-east-1b")
        .send()
        .await
        .unwrap();
    let subnet = subnet.subnet().unwrap().subnet_id().unwrap().to_owned();
    let started = ec2
        .run_instances()
        .image_id("ami-12c6146b")
        .min_count(1)
        .max_count(1)
        .subnet_id(&subnet)
        .ipv6_address_count(1)
        .send()
        .await
        .unwrap();
    let instance = &started.instances()[0];
    let id = instance.instance_id().unwrap();
    let provider = moto.provider("NodeIPFamilies = ipv6\nNodeIPFamilies = ipv4");
    let nodes = [node("n", Some(&format!("aws:///us-east-1b/{id}")))];
    let metadata = provider
        .instances_v2()
        .unwrap()
        .instance_metadata_batch(&cx(), &nodes)
        .await;
    let metadata = metadata[0].as_ref().unwrap();
    assert_eq!(metadata.zone, "us-east-1b");
    let first = &metadata.node_addresses[0];
    assert_eq!(first.type_, "InternalIP");
    assert!(
        first.address.contains(':'),
        "IPv6 first: {:?}",
        metadata.node_addresses
    );
    assert!(
        metadata.node_addresses[1].address.starts_with("10.1.1."),
        "{:?}",
        metadata.node_addresses
    );
}

#[tokio::test]
async fn an_unreachable_endpoint_fails_each_node_without_deleting_it() {
    // No moto needed: nothing listens on this port.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let text = format!(
        "[Global]\nRegion = us-east-1\nKubernetesClusterID = test\n[ServiceOverride \"1\"]\nService = ec2\nRegion = us-east-1\nURL = http://127.0.0.1:{port}\nSigningRegion = us-east-1\n"
    );
    let sdk = SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "t", "t", None, None, "test",
        )))
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    let provider = AwsProvider::new(CloudConfig::parse(&text).unwrap().config, &sdk);
    let nodes = [
        node("a", Some("aws:///us-east-1a/i-0123456789abcdef0")),
        node("b", None),
    ];
    let exists = provider
        .instances_v2()
        .unwrap()
        .instance_exists_batch(&cx(), &nodes)
        .await;
    assert_eq!(exists.len(), 2);
    assert!(
        exists.iter().all(|r| matches!(r, Err(CloudError::Provider(_)))),
        "{exists:?}"
    );
    assert!(provider.has_cluster_id());
}

#[tokio::test]
async fn fargate_nodes_are_found_by_their_attached_interface_and_uninterpretable_ids_are_errors() {
    let Some(moto) = Moto::start() else { return };
    let ec2 = moto.ec2();
    let started = run_instances(&ec2, 1, true).await;
    // A Fargate task's interface is attached; this instance's primary one stands in for it.
    let attached = started[0].private_ip_address().unwrap().to_owned();
    let subnet = started[0].subnet_id().unwrap().to_owned();
    let detached = ec2
        .create_network_interface()
        .subnet_id(&subnet)
        .send()
        .await
        .unwrap()
        .network_interface()
        .unwrap()
        .private_ip_address()
        .unwrap()
        .to_owned();
    let provider = moto.provider("");
    let instances = provider.instances_v2().unwrap();
    let dashed = attached.replace('.', "-");
    let nodes = vec![
        node(
            "fargate-a",
            Some(&format!("aws:///us-east-1a/1abc/fargate-{attached}")),
        ),
        node(
            "fargate-b",
            Some(&format!(
                "aws:///us-east-1a/1abc/fargate-ip-{dashed}.ec2.internal"
            )),
        ),
        node(
            "fargate-detached",
            Some(&format!("aws:///us-east-1a/1abc/fargate-{detached}")),
        ),
        node(
            "fargate-nobody",
            Some("aws:///us-east-1a/1abc/fargate-10.255.255.254"),
        ),
        node("garbage", Some("aws:///us-east-1a/vol-0abc")),
        node("mangled-fargate", Some("aws:///us-east-1a/1abc/fargate-ip-nope")),
        node("empty-aws", Some("aws:///")),
        // A malformed instance ID: EC2 would refuse it; looked up by a filter it would read as "gone".
        node("malformed", Some("aws:///us-east-1a/i-XYZ!")),
    ];
    let exists = instances.instance_exists_batch(&cx(), &nodes).await;
    let answers: Vec<Option<bool>> = exists.iter().map(|r| r.as_ref().ok().copied()).collect();
    assert_eq!(
        answers,
        [
            Some(true),
            Some(true),
            Some(false),
            Some(false),
            None,
            None,
            None,
            None
        ],
        "{exists:?}"
    );
    for (index, result) in exists.iter().enumerate().skip(4) {
        let error = result.as_ref().unwrap_err().to_string();
        assert!(error.contains("cannot be interpreted"), "{index}: {error}");
    }
    assert_eq!(
        provider
            .requests()
            .snapshot()
            .get("EC2:DescribeNetworkInterfaces"),
        Some(&1),
        "one request for the batch's Fargate nodes"
    );
    // As upstream's Fargate variant: a node whose interface exists counts as shut down.
    let shutdown = instances.instance_shutdown_batch(&cx(), &nodes[..4]).await;
    let shutdown: Vec<bool> = shutdown.into_iter().map(Result::unwrap).collect();
    assert_eq!(shutdown, [true, true, false, false]);

    let metadata = instances.instance_metadata(&cx(), &nodes[0]).await.unwrap();
    assert_eq!(
        metadata.provider_id,
        format!("aws:///us-east-1a/1abc/fargate-{attached}")
    );
    assert_eq!(metadata.instance_type, "", "Fargate nodes have no instance type");
    assert_eq!(
        metadata.zone,
        started[0].placement().unwrap().availability_zone().unwrap()
    );
    assert_eq!(metadata.node_addresses[0].type_, "InternalIP");
    assert_eq!(metadata.node_addresses[0].address, attached);
    assert!(matches!(
        instances.instance_metadata(&cx(), &nodes[4]).await,
        Err(CloudError::Provider(_))
    ));
}

/// moto has no `DescribeInstanceTopology`: a proxy in front of it answers that action with EC2's
/// documented answer (its shape recorded; the instance IDs the request names, three network nodes each)
/// and forwards everything else.
fn recorded_topology(body: &str) -> (u16, String) {
    let ids: Vec<String> = body
        .split('&')
        .filter(|pair| pair.starts_with("InstanceId."))
        .filter_map(|pair| pair.split_once('=').map(|(_, id)| id.to_owned()))
        .collect();
    let items: String = ids
        .iter()
        .enumerate()
        .map(|(n, id)| {
            format!(
                "<item><instanceId>{id}</instanceId><instanceType>p5.48xlarge</instanceType><groupName>ml-cpg</groupName>\
                 <networkNodeSet><item>nn-1111111111example</item><item>nn-2222222222example</item><item>nn-33333333333{n}example</item></networkNodeSet>\
                 <availabilityZone>us-east-1a</availabilityZone><zoneId>use1-az6</zoneId></item>"
            )
        })
        .collect();
    (
        200,
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeInstanceTopologyResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>a1b2c3d4-5678-90ab-cdef-EXAMPLE11111</requestId><instanceSet>{items}</instanceSet></DescribeInstanceTopologyResponse>"
        ),
    )
}

#[tokio::test]
async fn topology_labels_for_supported_types_in_one_request_and_none_again() {
    let Some(moto) = Moto::start() else { return };
    let ec2 = moto.ec2();
    let gpus = run_instances_of(&ec2, 3, InstanceType::P548xlarge).await;
    let plain = run_instances(&ec2, 1, true).await;
    let proxy = harness::aws::RecordingProxy::start(moto.0.url()).await.unwrap();
    proxy.answer("DescribeInstanceTopology", recorded_topology);
    let provider = moto.provider_via(&proxy.url, "");
    let instances = provider.instances_v2().unwrap();
    let nodes: Vec<Arc<Node>> = gpus
        .iter()
        .chain(&plain)
        .enumerate()
        .map(|(n, i)| {
            node(
                &format!("node-{n}"),
                Some(&format!("aws:///us-east-1a/{}", i.instance_id().unwrap())),
            )
        })
        .collect();
    let metadata = instances.instance_metadata_batch(&cx(), &nodes).await;
    assert_eq!(
        proxy.take_all().get("DescribeInstanceTopology"),
        Some(&1),
        "one request for three"
    );
    for (n, found) in metadata[..3].iter().enumerate() {
        let labels = &found.as_ref().unwrap().additional_labels;
        assert_eq!(
            labels["topology.k8s.aws/network-node-layer-1"],
            "nn-1111111111example"
        );
        assert_eq!(
            labels["topology.k8s.aws/network-node-layer-2"],
            "nn-2222222222example"
        );
        assert_eq!(
            labels["topology.k8s.aws/network-node-layer-3"],
            format!("nn-33333333333{n}example")
        );
    }
    let other = &metadata[3].as_ref().unwrap().additional_labels;
    assert!(
        !other
            .keys()
            .any(|k| k.starts_with("topology.k8s.aws/network-node-layer-")),
        "m5.large is not a topology type: {other:?}"
    );

    // Nodes that have their labels are not asked about again.
    let labelled: Vec<Arc<Node>> = nodes[..3]
        .iter()
        .map(|n| {
            let mut node = (**n).clone();
            node.metadata.labels = Some(
                [(
                    "topology.k8s.aws/network-node-layer-1".to_owned(),
                    "nn-1".to_owned(),
                )]
                .into(),
            );
            Arc::new(node)
        })
        .collect();
    instances.instance_metadata_batch(&cx(), &labelled).await;
    assert_eq!(proxy.take_all().get("DescribeInstanceTopology"), None);

    // A region without the API: no labels, no error, and not asked again.
    let unsupported = harness::aws::RecordingProxy::start(moto.0.url()).await.unwrap();
    unsupported.answer("DescribeInstanceTopology", |_| {
        (
            400,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>UnsupportedOperation</Code><Message>The functionality you requested is not available in this region.</Message></Error></Errors><RequestID>a1b2c3d4-5678-90ab-cdef-EXAMPLE22222</RequestID></Response>".to_owned(),
        )
    });
    let provider = moto.provider_via(&unsupported.url, "");
    let instances = provider.instances_v2().unwrap();
    for _ in 0..2 {
        let metadata = instances.instance_metadata_batch(&cx(), &nodes[..3]).await;
        for found in &metadata {
            let labels = &found.as_ref().unwrap().additional_labels;
            assert!(
                !labels.contains_key("topology.k8s.aws/network-node-layer-1"),
                "{labels:?}"
            );
        }
    }
    assert_eq!(
        unsupported.take_all().get("DescribeInstanceTopology"),
        Some(&1),
        "the region is remembered"
    );

    // Any other failure fails the nodes that needed the labels (asked again), not the others.
    let failing = harness::aws::RecordingProxy::start(moto.0.url()).await.unwrap();
    failing.answer("DescribeInstanceTopology", |_| {
        (
            400,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>InvalidParameterValue</Code><Message>bad</Message></Error></Errors><RequestID>r</RequestID></Response>".to_owned(),
        )
    });
    let provider = moto.provider_via(&failing.url, "");
    let metadata = provider
        .instances_v2()
        .unwrap()
        .instance_metadata_batch(&cx(), &nodes)
        .await;
    assert!(metadata[..3].iter().all(Result::is_err), "{metadata:?}");
    assert!(metadata[3].is_ok(), "{:?}", metadata[3]);
}
