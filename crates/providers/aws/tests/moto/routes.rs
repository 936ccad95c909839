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

    let route = cloud_provider::Route {
        target_node: node.clone(),
        destination_cidr: "10.244.1.0/24".into(),
        ..cloud_provider::Route::default()
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
    let other = cloud_provider::Route {
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
