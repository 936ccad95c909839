//! Routes in the cluster's route table.

use super::*;

#[tokio::test]
async fn routes_go_to_instances_in_the_clusters_route_table() {
    let Some(moto) = Moto::start() else { return };
    let ec2 = moto.ec2();
    let provider = moto.provider("");
    let routes = provider.routes().unwrap();
    let missing = routes.list_routes(&cx(), "c").await.unwrap_err().to_string();
    assert_eq!(
        missing,
        "no route table is tagged kubernetes.io/cluster/test: tag the cluster's route table or set RouteTableID"
    );

    let vpc = ec2.create_vpc().cidr_block("10.2.0.0/16").send().await.unwrap();
    let vpc = vpc.vpc().unwrap().vpc_id().unwrap().to_owned();
    let table = ec2.create_route_table().vpc_id(&vpc).send().await.unwrap();
    let table = table.route_table().unwrap().route_table_id().unwrap().to_owned();
    ec2.create_tags()
        .resources(&table)
        .tags(
            Tag::builder()
                .key("kubernetes.io/cluster/test")
                .value("owned")
                .build(),
        )
        .send()
        .await
        .unwrap();
    let started = run_instances(&ec2, 2, true).await;
    let node = started[0].private_dns_name().unwrap().to_owned();
    let id = started[0].instance_id().unwrap().to_owned();

    let route = kube_ccm_provider::Route {
        target_node: node.clone(),
        destination_cidr: "10.244.1.0/24".into(),
        ..kube_ccm_provider::Route::default()
    };
    routes.create_route(&cx(), "c", "uid-1", &route).await.unwrap();
    let listed = routes.list_routes(&cx(), "c").await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].name, "c-10.244.1.0/24");
    assert_eq!(listed[0].target_node, node);
    assert!(!listed[0].blackhole);
    let attribute = ec2
        .describe_instance_attribute()
        .instance_id(&id)
        .attribute(aws_sdk_ec2::types::InstanceAttributeName::SourceDestCheck)
        .send()
        .await
        .unwrap();
    assert_eq!(
        attribute.source_dest_check().and_then(|v| v.value()),
        Some(false),
        "source/dest check disabled"
    );

    // Creating it again (a retried call whose answer was lost) is done already; another node's route to
    // the same range is refused by EC2.
    routes.create_route(&cx(), "c", "uid-1", &route).await.unwrap();
    assert_eq!(routes.list_routes(&cx(), "c").await.unwrap().len(), 1);
    let other = kube_ccm_provider::Route {
        target_node: started[1].private_dns_name().unwrap().to_owned(),
        ..route.clone()
    };
    let clash = routes.create_route(&cx(), "c", "uid-2", &other).await;
    assert!(clash.unwrap_err().to_string().contains("RouteAlreadyExists"));
    routes.delete_route(&cx(), "c", &listed[0]).await.unwrap();
    assert!(routes.list_routes(&cx(), "c").await.unwrap().is_empty());

    // A second tagged table is ambiguous for a new provider (the first one cached its table).
    let second = ec2.create_route_table().vpc_id(&vpc).send().await.unwrap();
    let second = second.route_table().unwrap().route_table_id().unwrap().to_owned();
    ec2.create_tags()
        .resources(&second)
        .tags(Tag::builder().key("KubernetesCluster").value("test").build())
        .send()
        .await
        .unwrap();
    let fresh = moto.provider("");
    let ambiguous = fresh
        .routes()
        .unwrap()
        .list_routes(&cx(), "c")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        ambiguous.starts_with("2 route tables are tagged for cluster test ("),
        "{ambiguous}"
    );
    let pinned = moto.provider(&format!("RouteTableID = {table}"));
    assert!(
        pinned
            .routes()
            .unwrap()
            .list_routes(&cx(), "c")
            .await
            .unwrap()
            .is_empty()
    );
}

/// With the manager's node cache (upstream's node informer), a route goes to the instance a node's
/// provider ID names whatever the node is called, and a listed route names that node; once the replica
/// stops leading, the provider falls back to EC2's names.
#[tokio::test]
async fn routes_name_their_nodes_from_the_shared_node_cache_while_leading() {
    let Some(moto) = Moto::start() else { return };
    let ec2 = moto.ec2();
    let vpc = ec2.create_vpc().cidr_block("10.2.0.0/16").send().await.unwrap();
    let vpc = vpc.vpc().unwrap().vpc_id().unwrap().to_owned();
    let table = ec2.create_route_table().vpc_id(&vpc).send().await.unwrap();
    let table = table.route_table().unwrap().route_table_id().unwrap().to_owned();
    let started = run_instances(&ec2, 1, true).await;
    let id = started[0].instance_id().unwrap().to_owned();
    let provider = moto.provider(&format!("RouteTableID = {table}"));
    let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let caches = kube_ccm_provider::FixedCaches {
        nodes: vec![(*node("worker-a", Some(&format!("aws:///us-east-1a/{id}")))).clone()],
        services: Vec::new(),
    };
    provider
        .initialize(kube_ccm_provider::InitializeContext {
            client: client.clone(),
            shutdown: tokio_util::sync::CancellationToken::new(),
            flags: kube_ccm_provider::flags::FlagValues::default(),
            caches: Arc::new(caches),
        })
        .await
        .unwrap();
    let routes = provider.routes().unwrap();
    let route = kube_ccm_provider::Route {
        target_node: "worker-a".into(),
        destination_cidr: "10.244.1.0/24".into(),
        ..kube_ccm_provider::Route::default()
    };
    let unknown = routes
        .create_route(&cx(), "c", "uid-1", &route)
        .await
        .unwrap_err();
    assert_eq!(
        unknown.to_string(),
        "no instance for node worker-a",
        "not leading: EC2's names only"
    );

    let stop = tokio_util::sync::CancellationToken::new();
    provider
        .start_leading(kube_ccm_provider::LeadingContext {
            client,
            stop: stop.clone(),
        })
        .await
        .unwrap();
    let listed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match routes.create_route(&cx(), "c", "uid-1", &route).await {
                Ok(()) => return routes.list_routes(&cx(), "c").await.unwrap(),
                Err(_) => tokio::task::yield_now().await,
            }
        }
    })
    .await
    .expect("the index follows the cache");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].target_node, "worker-a");
    let described = ec2
        .describe_route_tables()
        .route_table_ids(&table)
        .send()
        .await
        .unwrap();
    let made = described.route_tables()[0]
        .routes()
        .iter()
        .find(|r| r.destination_cidr_block() == Some("10.244.1.0/24"))
        .unwrap();
    assert_eq!(made.instance_id(), Some(id.as_str()));
    routes.create_route(&cx(), "c", "uid-1", &route).await.unwrap();

    stop.cancel();
    let listed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let listed = routes.list_routes(&cx(), "c").await.unwrap();
            if listed[0].target_node != "worker-a" {
                return listed;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("forgotten once not leading");
    assert_eq!(listed[0].target_node, started[0].private_dns_name().unwrap());
}
