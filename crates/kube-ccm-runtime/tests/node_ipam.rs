//! The framework's `node-ipam-controller` on the fake cloud: the range allocator (any provider) and the
//! cloud allocator (the provider's `PodCidrs`), on both API servers.

mod support;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use kube_ccm_fake::{AdminRequest, FakeInstance};
use kube_ccm_runtime::{Cidr, ControllerSettings, FlagValue};
use serde_json::json;

use support::*;

/// A node registered with its instance's provider ID and no pod CIDR.
fn registered(name: &str) -> Node {
    node(name, json!({"spec": {"providerID": format!("fake://{name}")}}))
}

fn ipam_settings(allocator: &str, cluster_cidrs: &str) -> ControllerSettings {
    ControllerSettings {
        allocate_node_cidrs: true,
        cidr_allocator_type: allocator.to_owned(),
        cluster_cidrs: Cidr::parse_list(cluster_cidrs).unwrap(),
        configure_cloud_routes: false,
        ..settings()
    }
}

fn ipam_manager(cluster: &Cluster, settings: ControllerSettings) -> Running {
    start(manager_as(
        cluster,
        cluster.cloud_config(),
        settings,
        "test-host_1",
        &["*", "node-ipam-controller"],
    ))
}

async fn pod_cidrs(nodes: &Api<Node>, name: &str) -> Option<Vec<String>> {
    let node = nodes.get(name).await.ok()?;
    node.spec?.pod_cidrs.filter(|c| !c.is_empty())
}

/// A node found with networks keeps them and they are taken; new nodes get the next free network of each
/// family of `--cluster-cidr`; when one family is full a node waits, and gets the networks a deleted node
/// gave back.
async fn the_range_allocator_gives_each_node_its_own_networks(backend: Backend) {
    let instances = (0..=4)
        .map(|i| FakeInstance::running(&format!("node-{i}"), i))
        .collect();
    let cluster = Cluster::start(backend, instances).await;
    let nodes = cluster.nodes();
    let mut existing = registered("node-0");
    let spec = existing.spec.get_or_insert_with(Default::default);
    spec.pod_cidr = Some("10.64.0.0/24".into());
    spec.pod_cidrs = Some(vec!["10.64.0.0/24".into(), "fd00:10::/64".into()]);
    nodes.create(&PostParams::default(), &existing).await.unwrap();
    let running = ipam_manager(
        &cluster,
        ipam_settings("RangeAllocator", "10.64.0.0/22,fd00:10::/62"),
    );
    for name in ["node-1", "node-2", "node-3"] {
        nodes
            .create(&PostParams::default(), &registered(name))
            .await
            .unwrap();
    }
    let mut given = Vec::new();
    for name in ["node-1", "node-2", "node-3"] {
        eventually("a node's pod CIDRs", || async {
            pod_cidrs(&nodes, name).await.is_some()
        })
        .await;
        let cidrs = pod_cidrs(&nodes, name).await.unwrap();
        assert_eq!(cidrs.len(), 2, "{name}: {cidrs:?}");
        given.push(cidrs);
    }
    let mut ipv4: Vec<&str> = given.iter().map(|c| c[0].as_str()).collect();
    ipv4.sort();
    assert_eq!(
        ipv4,
        ["10.64.1.0/24", "10.64.2.0/24", "10.64.3.0/24"],
        "node-0's is taken"
    );
    let mut ipv6: Vec<&str> = given.iter().map(|c| c[1].as_str()).collect();
    ipv6.sort();
    assert_eq!(ipv6, ["fd00:10:0:1::/64", "fd00:10:0:2::/64", "fd00:10:0:3::/64"]);
    // Both families are full: a fifth node waits (the Event says why), then gets what a deleted node gave
    // back.
    nodes
        .create(&PostParams::default(), &registered("node-4"))
        .await
        .unwrap();
    events_when(&cluster, "CIDRNotAvailable", |events| {
        events
            .iter()
            .any(|e| e.involved_object.name.as_deref() == Some("node-4"))
    })
    .await;
    assert_eq!(pod_cidrs(&nodes, "node-4").await, None);
    let freed = given[1].clone();
    nodes.delete("node-2", &Default::default()).await.unwrap();
    eventually("the fifth node's pod CIDRs", || async {
        pod_cidrs(&nodes, "node-4").await.is_some()
    })
    .await;
    assert_eq!(pod_cidrs(&nodes, "node-4").await.unwrap(), freed);
    assert!(
        !cluster.writes_by("node-ipam-controller").is_empty(),
        "the writes are the controller's own"
    );
    running.stop().await;
}

control_plane::on_both_backends!(the_range_allocator_gives_each_node_its_own_networks);

/// The cloud allocator: each node gets its instance's ranges in the stack's order (dual stack, from the
/// service ranges), and its network marked available; an instance without ranges gets the Event and is
/// retried until its ranges appear.
async fn the_cloud_allocator_gives_each_node_its_instances_ranges(backend: Backend) {
    let mut ranged = FakeInstance::running("node-a", 1);
    ranged.pod_cidrs = vec!["fd00:7::/112".into(), "10.4.7.0/24".into()];
    let bare = FakeInstance::running("node-b", 2);
    // IPv4 only, in a dual-stack cluster: it waits, without an Event (the range may come).
    let mut half = FakeInstance::running("node-c", 3);
    half.pod_cidrs = vec!["10.4.9.0/24".into()];
    let cluster = Cluster::start(backend, vec![ranged, bare.clone(), half]).await;
    let nodes = cluster.nodes();
    let mut settings = ipam_settings("CloudAllocator", "10.4.0.0/14");
    settings.flags.insert(
        "service-cluster-ip-range",
        FlagValue::Value("10.0.0.0/20,fd00:1::/108".into()),
    );
    let running = ipam_manager(&cluster, settings);
    for name in ["node-a", "node-b", "node-c"] {
        nodes
            .create(&PostParams::default(), &registered(name))
            .await
            .unwrap();
    }
    let available = |node: &Node| {
        node.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "NetworkUnavailable"))
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    eventually("node-a allocated and its network available", || async {
        let node = nodes.get("node-a").await.unwrap();
        available(&node).is_some()
    })
    .await;
    let node_a = nodes.get("node-a").await.unwrap();
    let spec = node_a.spec.clone().unwrap();
    // IPv4 first, as the service ranges are, whatever order the cloud keeps them in.
    assert_eq!(spec.pod_cidr.as_deref(), Some("10.4.7.0/24"));
    assert_eq!(
        spec.pod_cidrs.unwrap(),
        ["10.4.7.0/24".to_owned(), "fd00:7::/112".to_owned()]
    );
    assert_eq!(
        available(&node_a),
        Some(("False".to_owned(), Some("RouteCreated".to_owned())))
    );
    let events = events_when(&cluster, "CIDRNotAvailable", |events| {
        events
            .iter()
            .any(|e| e.involved_object.name.as_deref() == Some("node-b"))
    })
    .await;
    let event = events
        .iter()
        .find(|e| e.involved_object.name.as_deref() == Some("node-b"))
        .unwrap();
    assert_eq!(
        event.message.as_deref(),
        Some("Node node-b status is now: CIDRNotAvailable")
    );
    assert_eq!(event.reporting_component.as_deref(), Some("cidrAllocator"));
    assert_eq!(pod_cidrs(&nodes, "node-b").await, None);
    // node-c was asked about with the others, and has neither CIDRs nor an Event.
    assert_eq!(pod_cidrs(&nodes, "node-c").await, None);
    assert!(
        !events
            .iter()
            .any(|e| e.involved_object.name.as_deref() == Some("node-c")),
        "{events:#?}"
    );
    // Its ranges appear: the retry allocates them.
    let mut later = bare;
    later.pod_cidrs = vec!["10.4.8.0/24".into(), "fd00:8::/112".into()];
    cluster.admin(AdminRequest::PutInstance(later)).await;
    eventually("node-b allocated once its ranges appeared", || async {
        pod_cidrs(&nodes, "node-b").await == Some(vec!["10.4.8.0/24".to_owned(), "fd00:8::/112".to_owned()])
    })
    .await;
    // By now node-c has been asked about, and retried: still quiet.
    assert_eq!(pod_cidrs(&nodes, "node-c").await, None);
    let all = support::events(&cluster, "CIDRNotAvailable").await;
    assert!(
        all.iter()
            .all(|e| e.involved_object.name.as_deref() != Some("node-c")),
        "{all:#?}"
    );
    running.stop().await;
}

control_plane::on_both_backends!(the_cloud_allocator_gives_each_node_its_instances_ranges);

/// Without `--allocate-node-cidrs` the controller is skipped, named or not: nothing is written.
#[tokio::test]
async fn without_allocate_node_cidrs_no_pod_cidr_is_written() {
    let mut instance = FakeInstance::running("node-a", 1);
    instance.pod_cidrs = vec!["10.4.7.0/24".into()];
    let cluster = Cluster::start(Backend::Test, vec![instance, FakeInstance::running("node-b", 2)]).await;
    let nodes = cluster.nodes();
    let settings = ControllerSettings {
        allocate_node_cidrs: false,
        ..ipam_settings("CloudAllocator", "10.4.0.0/14")
    };
    let running = ipam_manager(&cluster, settings);
    nodes
        .create(&PostParams::default(), &registered("node-a"))
        .await
        .unwrap();
    // Once another controller has initialised a later node, the manager is running.
    nodes
        .create(
            &PostParams::default(),
            &node("node-b", json!({"spec": {"taints": [uninitialized()]}})),
        )
        .await
        .unwrap();
    eventually("the other controllers at work", || async {
        taint_keys(&nodes, "node-b").await.is_empty()
    })
    .await;
    assert_eq!(pod_cidrs(&nodes, "node-a").await, None);
    assert!(cluster.writes_by("node-ipam-controller").is_empty());
    running.stop().await;
}
