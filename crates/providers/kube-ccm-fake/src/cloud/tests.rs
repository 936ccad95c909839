use super::*;

fn node(name: &str) -> NodeRef {
    NodeRef {
        name: name.into(),
        provider_id: None,
    }
}

fn by_id(provider_id: &str) -> NodeRef {
    NodeRef {
        name: "whatever".into(),
        provider_id: Some(provider_id.into()),
    }
}

/// The names of the instances the cloud describes for `nodes`, in order.
async fn described(cloud: &FakeCloud, nodes: Vec<NodeRef>) -> Vec<Option<String>> {
    let CloudResponse::Instances { instances, .. } =
        cloud.handle(CloudRequest::DescribeInstances { nodes }).await
    else {
        panic!("instances")
    };
    instances.into_iter().map(|i| i.map(|i| i.name)).collect()
}

/// Replacing an instance moves its provider ID: the old one finds nothing, the new one finds it.
#[tokio::test]
async fn a_replaced_instance_is_found_by_its_new_provider_id_only() {
    let cloud = FakeCloud::new(vec![FakeInstance::running("n1", 1)], Knobs::default());
    let moved = FakeInstance {
        provider_id: Some("fake://elsewhere/n1".into()),
        ..FakeInstance::running("n1", 1)
    };
    cloud
        .handle(CloudRequest::Admin(AdminRequest::PutInstance(moved)))
        .await;
    let names = described(&cloud, vec![by_id("fake://n1"), by_id("fake://elsewhere/n1")]).await;
    assert_eq!(names, [None, Some("n1".to_owned())]);
}

#[tokio::test]
async fn instances_by_name_or_provider_id_and_terminated_ones_are_gone() {
    let cloud = FakeCloud::new(
        vec![FakeInstance::running("n1", 1), FakeInstance::running("n2", 2)],
        Knobs::default(),
    );
    let names = described(&cloud, vec![node("n1"), by_id("fake://n2"), node("n3")]).await;
    assert_eq!(names, [Some("n1".to_owned()), Some("n2".to_owned()), None]);
    cloud
        .handle(CloudRequest::Admin(AdminRequest::SetInstanceState {
            name: "n1".into(),
            state: InstanceState::Terminated,
        }))
        .await;
    let CloudResponse::Instances { instances, .. } = cloud
        .handle(CloudRequest::DescribeInstances {
            nodes: vec![node("n1")],
        })
        .await
    else {
        panic!()
    };
    assert_eq!(instances, [None]);
}

#[tokio::test]
async fn load_balancers_keep_their_address() {
    let cloud = FakeCloud::default();
    let ensure = |nodes: Vec<&str>| CloudRequest::EnsureLoadBalancer {
        name: "a1".into(),
        service: "default/s".into(),
        cluster: "k".into(),
        ports: vec![80],
        nodes: nodes.into_iter().map(str::to_owned).collect(),
        ipv6: false,
    };
    let CloudResponse::LoadBalancer {
        load_balancer: Some(first),
    } = cloud.handle(ensure(vec!["b", "a"])).await
    else {
        panic!()
    };
    assert_eq!(first.nodes, ["a", "b"]);
    let CloudResponse::LoadBalancer {
        load_balancer: Some(second),
    } = cloud.handle(ensure(vec!["c"])).await
    else {
        panic!()
    };
    assert_eq!(first.ip, second.ip);
    assert!(matches!(
        cloud
            .handle(CloudRequest::UpdateLoadBalancer {
                name: "zz".into(),
                nodes: vec![]
            })
            .await,
        CloudResponse::Error { not_found: true, .. }
    ));
}

#[tokio::test]
async fn host_sets_group_load_balancers_by_their_nodes() {
    let cloud = FakeCloud::default();
    for (name, nodes) in [
        ("a1", vec!["n1", "n2"]),
        ("a2", vec!["n2", "n1"]),
        ("a3", vec!["n1"]),
    ] {
        cloud
            .handle(CloudRequest::EnsureLoadBalancer {
                name: name.into(),
                service: format!("default/{name}"),
                cluster: "k".into(),
                ports: vec![80],
                nodes: nodes.into_iter().map(str::to_owned).collect(),
                ipv6: false,
            })
            .await;
    }
    let CloudResponse::HostSets { sets, .. } =
        cloud.handle(CloudRequest::Admin(AdminRequest::HostSets)).await
    else {
        panic!("not host sets")
    };
    let sets: Vec<(Vec<&str>, usize)> = sets
        .iter()
        .map(|set| (set.nodes.iter().map(String::as_str).collect(), set.load_balancers))
        .collect();
    assert_eq!(sets, [(vec!["n1", "n2"], 2), (vec!["n1"], 1)]);
}

#[tokio::test]
async fn a_lost_answer_leaves_the_write_applied_and_the_caller_waiting() {
    let knobs = Knobs {
        lost_answer_rate: 1.0,
        ..Knobs::default()
    };
    let cloud = FakeCloud::new(vec![], knobs);
    let ensure = CloudRequest::EnsureLoadBalancer {
        name: "a1".into(),
        service: "default/s".into(),
        cluster: "k".into(),
        ports: vec![80],
        nodes: vec![],
        ipv6: false,
    };
    let answered = tokio::time::timeout(Duration::from_millis(200), cloud.handle(ensure)).await;
    assert!(answered.is_err(), "the answer never comes: {answered:?}");
    let CloudResponse::Snapshot { load_balancers, .. } =
        cloud.handle(CloudRequest::Admin(AdminRequest::Snapshot)).await
    else {
        panic!("not a snapshot")
    };
    assert_eq!(load_balancers.len(), 1, "the write was applied");
    // Reads are never lost.
    let read = cloud.handle(CloudRequest::ListRoutes);
    assert!(tokio::time::timeout(Duration::from_secs(5), read).await.is_ok());
}

#[tokio::test]
async fn an_ensure_that_changes_nothing_is_no_write() {
    let cloud = FakeCloud::default();
    let ensure = |nodes: &[&str]| CloudRequest::EnsureLoadBalancer {
        name: "a1".into(),
        service: "default/s".into(),
        cluster: "k".into(),
        ports: vec![80],
        nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
        ipv6: false,
    };
    let writes = || async {
        match cloud
            .handle(CloudRequest::Admin(AdminRequest::Writes { from: 0 }))
            .await
        {
            CloudResponse::Writes { writes } => writes.len(),
            other => panic!("{other:?}"),
        }
    };
    cloud.handle(ensure(&["b", "a"])).await;
    assert_eq!(writes().await, 1);
    // The same load balancer, nodes in another order: answered, nothing changed, nothing logged.
    let again = cloud.handle(ensure(&["a", "b"])).await;
    assert!(matches!(
        again,
        CloudResponse::LoadBalancer {
            load_balancer: Some(_)
        }
    ));
    assert_eq!(writes().await, 1);
    cloud.handle(ensure(&["a"])).await;
    assert_eq!(writes().await, 2);
}

#[tokio::test]
async fn every_call_can_fail() {
    let cloud = FakeCloud::new(
        vec![],
        Knobs {
            latency_ms: 0,
            error_rate: 1.0,
            hang_rate: 0.0,
            lost_answer_rate: 0.0,
        },
    );
    assert!(matches!(
        cloud.handle(CloudRequest::ListRoutes).await,
        CloudResponse::Error { not_found: false, .. }
    ));
    assert!(matches!(
        cloud.handle(CloudRequest::Admin(AdminRequest::Snapshot)).await,
        CloudResponse::Snapshot { calls: 1, .. }
    ));
}
