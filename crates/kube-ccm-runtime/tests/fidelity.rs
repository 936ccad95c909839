//! Upstream's behaviours a provider author or operator coming from the Go cloud-controller-manager relies
//! on (`docs/upstream-fidelity.md` lists them), end to end: the real manager against the test API server,
//! with the fake cloud.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube_ccm_fake::{
    AdminRequest, CloudRequest, CloudResponse, FakeAddress, FakeInstance, FakeLoadBalancer, FakeRoute, Knobs,
};
use kube_ccm_provider::names::{ANNOTATION_PROVIDED_NODE_IP, TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER};
use kube_ccm_test_apiserver::{FaultAction, FaultSpec};
use serde_json::json;
use support::*;

fn address(type_: &str, address: &str) -> FakeAddress {
    FakeAddress {
        type_: type_.into(),
        address: address.into(),
    }
}

async fn calls(cluster: &Cluster, kind: &str) -> u64 {
    match cluster.snapshot().await {
        CloudResponse::Snapshot { calls_by_kind, .. } => calls_by_kind.get(kind).copied().unwrap_or(0),
        other => panic!("{other:?}"),
    }
}

async fn load_balancers(cluster: &Cluster) -> Vec<FakeLoadBalancer> {
    match cluster.snapshot().await {
        CloudResponse::Snapshot { load_balancers, .. } => load_balancers,
        other => panic!("{other:?}"),
    }
}

async fn routes(cluster: &Cluster) -> Vec<FakeRoute> {
    match cluster.snapshot().await {
        CloudResponse::Snapshot { routes, .. } => routes,
        other => panic!("{other:?}"),
    }
}

fn addresses(node: &Node) -> Vec<(String, String)> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect()
}

fn lb_service(name: &str, extra: serde_json::Value) -> Service {
    let mut value =
        json!({"metadata": {"name": name}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
    json_patch::merge(&mut value, &extra);
    serde_json::from_value(value).unwrap()
}

async fn dual_stack_node_ips_keep_both_addresses_and_a_pair_that_does_not_match_keeps_the_taint(
    backend: Backend,
) {
    let mut dual = FakeInstance::running("dual", 5);
    dual.addresses = vec![
        address("InternalIP", "10.0.0.5"),
        address("InternalIP", "10.0.0.6"),
        address("InternalIP", "fd00::5"),
        address("Hostname", "dual"),
    ];
    let mut wrong = dual.clone();
    wrong.name = "wrong".into();
    let mut silent = FakeInstance::running("silent", 7);
    silent.addresses.clear();
    let cluster = Cluster::start(backend, vec![dual, wrong, silent]).await;
    let nodes = cluster.nodes();
    for (name, ips) in [
        ("dual", "10.0.0.5,fd00::5"),
        ("wrong", "10.0.0.5,fd00::9"),
        ("silent", "10.0.0.7"),
    ] {
        let node = node(
            name,
            json!({"metadata": {"annotations": {ANNOTATION_PROVIDED_NODE_IP: ips}}, "spec": {"taints": [uninitialized()]}}),
        );
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    let running = start(manager(&cluster, cluster.cloud_config(), settings()));
    eventually("the dual-stack node initialised", || async {
        taint_keys(&nodes, "dual").await.is_empty()
    })
    .await;
    assert_eq!(
        addresses(&nodes.get("dual").await.unwrap()),
        [
            ("InternalIP".to_owned(), "10.0.0.5".to_owned()),
            ("InternalIP".to_owned(), "fd00::5".to_owned()),
            ("Hostname".to_owned(), "dual".to_owned()),
        ],
        "both provided IPs kept, the other InternalIP dropped"
    );
    eventually("a warning about each node whose IPs do not match", || async {
        let warnings = events(&cluster, "ProvidedNodeIPNotFound").await;
        let about = |name: &str| {
            warnings
                .iter()
                .any(|e| e.involved_object.name.as_deref() == Some(name))
        };
        about("wrong") && about("silent")
    })
    .await;
    let notes: Vec<String> = events(&cluster, "ProvidedNodeIPNotFound")
        .await
        .into_iter()
        .filter_map(|e| e.message)
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n == "failed to get node address from cloud provider that matches ip: fd00::9"),
        "{notes:?}"
    );
    for name in ["wrong", "silent"] {
        assert_eq!(
            taint_keys(&nodes, name).await,
            [kube_ccm_provider::names::TAINT_UNINITIALIZED],
            "{name}"
        );
    }
    running.stop().await;
}

async fn a_node_tainted_again_is_initialised_again(backend: Backend) {
    let cluster = Cluster::start(backend, vec![FakeInstance::running("n1", 1)]).await;
    let nodes = cluster.nodes();
    nodes
        .create(
            &PostParams::default(),
            &node("n1", json!({"spec": {"taints": [uninitialized()]}})),
        )
        .await
        .unwrap();
    let running = start(manager(&cluster, cluster.cloud_config(), settings()));
    eventually("n1 initialised", || async {
        taint_keys(&nodes, "n1").await.is_empty()
    })
    .await;
    let writes = cluster.writes_by("cloud-node-controller").len();
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": [uninitialized()]}})),
        )
        .await
        .unwrap();
    eventually("n1 initialised again", || async {
        taint_keys(&nodes, "n1").await.is_empty() && cluster.writes_by("cloud-node-controller").len() > writes
    })
    .await;
    running.stop().await;
}

async fn lifecycle_deletes_only_on_an_answer_and_only_its_providers_nodes(backend: Backend) {
    let cluster = Cluster::start(backend, vec![]).await;
    let nodes = cluster.nodes();
    // Not ready, and no instance behind any of them: `gone` is the fake's and answered "does not exist";
    // `foreign` belongs to another provider.
    for (name, provider_id) in [("gone", "fake://gone"), ("foreign", "other://foreign")] {
        nodes
            .create(
                &PostParams::default(),
                &node(name, json!({"spec": {"providerID": provider_id}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}})),
            )
            .await
            .unwrap();
    }
    let manager = manager(&cluster, cluster.cloud_config(), settings());
    let metrics = manager.metrics();
    let running = start(manager);
    eventually("the fake's gone node deleted", || async {
        nodes.get_opt("gone").await.unwrap().is_none()
    })
    .await;
    assert!(
        nodes.get_opt("foreign").await.unwrap().is_some(),
        "another provider's node is kept"
    );

    // A cloud that cannot answer deletes nothing.
    cluster
        .admin(AdminRequest::SetKnobs(Knobs {
            latency_ms: 0,
            error_rate: 1.0,
            hang_rate: 0.0,
            lost_answer_rate: 0.0,
        }))
        .await;
    nodes
        .create(
            &PostParams::default(),
            &node("unanswered", json!({"spec": {"providerID": "fake://unanswered"}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}})),
        )
        .await
        .unwrap();
    let failed_rounds = || {
        let text = metrics.encode();
        text.lines()
            .find(|l| l.starts_with("controller_reconciles_total{controller=\"cloud-node-lifecycle-controller\",result=\"error\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = failed_rounds();
    eventually("three failed rounds", || async { failed_rounds() >= before + 3 }).await;
    assert!(
        nodes.get_opt("unanswered").await.unwrap().is_some(),
        "an error is not an answer"
    );
    running.stop().await;
}

async fn load_balancers_are_cleaned_up_as_upstream(backend: Backend) {
    let cluster = Cluster::start(backend, vec![FakeInstance::running("n1", 1)]).await;
    cluster
        .nodes()
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap();
    let services = cluster.services();
    // An older object: a classed LoadBalancer service that carries our finalizer. It is left alone while alive.
    let classed = lb_service(
        "classed",
        json!({"metadata": {"finalizers": [kube_ccm_provider::names::FINALIZER_LOAD_BALANCER_CLEANUP]}, "spec": {"loadBalancerClass": "example.com/other"}}),
    );
    services.create(&PostParams::default(), &classed).await.unwrap();
    services
        .create(&PostParams::default(), &lb_service("web", json!({})))
        .await
        .unwrap();
    let running = start(manager(&cluster, cluster.cloud_config(), settings()));
    eventually("web's load balancer", || async {
        load_balancers(&cluster).await.len() == 1
    })
    .await;
    let finalizers = services
        .get("classed")
        .await
        .unwrap()
        .metadata
        .finalizers
        .unwrap_or_default();
    assert_eq!(
        finalizers,
        [kube_ccm_provider::names::FINALIZER_LOAD_BALANCER_CLEANUP],
        "a live classed service keeps it"
    );
    // Deleted, it is still not ours (upstream removes the finalizer, which another manager's service
    // carries under the same name): judged after the later steps below, which the manager must have
    // processed after this deletion.
    services
        .delete("classed", &DeleteParams::default())
        .await
        .unwrap();

    // Events report as upstream's `service-controller`.
    let ensured = events_when(&cluster, "EnsuredLoadBalancer", |e| !e.is_empty()).await;
    assert!(
        ensured
            .iter()
            .all(|e| e.reporting_component.as_deref() == Some("service-controller"))
    );

    // No load balancer in the cloud: a change of type deletes nothing, says it deleted, and lets go.
    let web = services.get("web").await.unwrap();
    let name = format!("a{}", web.metadata.uid.clone().unwrap().replace('-', ""));
    let name = &name[..name.len().min(32)];
    cluster
        .cloud
        .cloud()
        .handle(CloudRequest::DeleteLoadBalancer {
            name: name.to_owned(),
        })
        .await;
    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "ClusterIP"}})),
        )
        .await
        .unwrap();
    eventually("web's finalizer removed", || async {
        services
            .get("web")
            .await
            .unwrap()
            .metadata
            .finalizers
            .unwrap_or_default()
            .is_empty()
    })
    .await;
    events_when(&cluster, "DeletedLoadBalancer", |e| !e.is_empty()).await;
    assert!(
        events(&cluster, "DeletingLoadBalancer")
            .await
            .iter()
            .all(|e| e.involved_object.name.as_deref() != Some("web")),
        "nothing to delete, nothing said about deleting"
    );
    let classed = services.get("classed").await.unwrap();
    assert!(
        classed.metadata.deletion_timestamp.is_some()
            && classed.metadata.finalizers.unwrap_or_default()
                == [kube_ccm_provider::names::FINALIZER_LOAD_BALANCER_CLEANUP],
        "another class's deleting service keeps the finalizer for its own manager"
    );
    running.stop().await;
}

/// Each new service costs one ensure, though the finalizer's own change is queued while the cloud answers
/// and may be taken from the cache before the status written after it (found by `bench versus`: 1.6
/// ensures a service, upstream 1); an address someone else removes is still put back.
async fn a_new_service_is_ensured_once_and_a_removed_address_comes_back(backend: Backend) {
    let cluster = Cluster::start(backend, vec![FakeInstance::running("n1", 1)]).await;
    cluster
        .nodes()
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap();
    cluster
        .admin(AdminRequest::SetKnobs(Knobs {
            latency_ms: 100,
            error_rate: 0.0,
            hang_rate: 0.0,
            lost_answer_rate: 0.0,
        }))
        .await;
    let running = start(manager(&cluster, cluster.cloud_config(), settings()));
    let services = cluster.services();
    services
        .create(&PostParams::default(), &lb_service("first", json!({})))
        .await
        .unwrap();
    eventually("the first service's address", || async {
        has_ingress(&services.get("first").await.unwrap())
    })
    .await;
    let before = calls(&cluster, "ensure_load_balancer").await;
    const SERVICES: u64 = 16;
    for i in 0..SERVICES {
        services
            .create(
                &PostParams::default(),
                &lb_service(&format!("web-{i}"), json!({})),
            )
            .await
            .unwrap();
    }
    eventually("every service's address", || async {
        let list = services.list(&Default::default()).await.unwrap();
        list.items.iter().filter(|s| has_ingress(s)).count() as u64 == SERVICES + 1
    })
    .await;
    // A redundant ensure starts as soon as the sync before it ends, before the address it wrote is seen.
    assert_eq!(
        calls(&cluster, "ensure_load_balancer").await - before,
        SERVICES,
        "one ensure a service"
    );

    services
        .patch_status(
            "web-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": null}}})),
        )
        .await
        .unwrap();
    eventually("the removed address put back", || async {
        has_ingress(&services.get("web-0").await.unwrap())
    })
    .await;
    assert_eq!(
        calls(&cluster, "ensure_load_balancer").await - before,
        SERVICES + 1
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_gone_without_our_finalizer_and_its_new_namesake_leave_no_orphan() {
    let cluster = Cluster::start(Backend::Test, vec![FakeInstance::running("n1", 1)]).await;
    cluster
        .nodes()
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap();
    let services = cluster.services();
    services
        .create(&PostParams::default(), &lb_service("web", json!({})))
        .await
        .unwrap();
    let running = start(manager(&cluster, cluster.cloud_config(), settings()));
    eventually("web's load balancer", || async {
        load_balancers(&cluster).await.len() == 1
    })
    .await;
    let first = load_balancers(&cluster).await[0].name.clone();

    // Slow the controller's writes down, so the finalizer it would put back comes too late: the service
    // goes without it, and comes back under the same name with another UID.
    cluster
        .server
        .as_test()
        .expect("faults need the test API server")
        .add_fault(FaultSpec {
            user_agent: Some("/service-lb-controller".into()),
            action: FaultAction::Latency { ms: 1500 },
            duration_ms: Some(4000),
        });
    let remove: json_patch::Patch =
        serde_json::from_value(json!([{"op": "remove", "path": "/metadata/finalizers"}])).unwrap();
    services
        .patch("web", &PatchParams::default(), &Patch::<()>::Json(remove))
        .await
        .unwrap();
    services.delete("web", &DeleteParams::default()).await.unwrap();
    services
        .create(&PostParams::default(), &lb_service("web", json!({})))
        .await
        .unwrap();

    eventually("one load balancer, the new service's", || async {
        let now = load_balancers(&cluster).await;
        now.len() == 1 && now[0].name != first
    })
    .await;
    running.stop().await;
}

async fn a_load_balancer_gone_before_its_hosts_update_is_not_an_error_and_draining_nodes_leave_later(
    backend: Backend,
) {
    let cluster = Cluster::start(
        backend,
        vec![
            FakeInstance::running("n1", 1),
            FakeInstance::running("n2", 2),
            FakeInstance::running("n3", 3),
        ],
    )
    .await;
    let nodes = cluster.nodes();
    for name in ["n1", "n2"] {
        nodes
            .create(&PostParams::default(), &node(name, json!({})))
            .await
            .unwrap();
    }
    let services = cluster.services();
    services
        .create(&PostParams::default(), &lb_service("web", json!({})))
        .await
        .unwrap();
    let manager = manager(&cluster, cluster.cloud_config(), settings());
    let metrics = manager.metrics();
    let running = start(manager);
    eventually("web's load balancer on n1 and n2", || async {
        load_balancers(&cluster)
            .await
            .first()
            .is_some_and(|lb| lb.nodes == ["n1", "n2"])
    })
    .await;

    // The autoscaler's taint takes n2 out at the next sync something else causes: here n3 joining.
    nodes
        .patch(
            "n2",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": [{"key": TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER, "effect": "NoSchedule"}]}})),
        )
        .await
        .unwrap();
    nodes
        .create(&PostParams::default(), &node("n3", json!({})))
        .await
        .unwrap();
    eventually("hosts n1 and n3", || async {
        load_balancers(&cluster)
            .await
            .first()
            .is_some_and(|lb| lb.nodes == ["n1", "n3"])
    })
    .await;

    // The load balancer disappears behind the controller's back; the next hosts update finds it gone.
    let name = load_balancers(&cluster).await[0].name.clone();
    cluster
        .cloud
        .cloud()
        .handle(CloudRequest::DeleteLoadBalancer { name })
        .await;
    let gets = calls(&cluster, "get_load_balancer").await;
    nodes.delete("n3", &DeleteParams::default()).await.unwrap();
    eventually("the failed update checked against the cloud", || async {
        calls(&cluster, "get_load_balancer").await > gets
    })
    .await;
    assert!(events(&cluster, "UpdateLoadBalancerFailed").await.is_empty());
    assert!(
        metrics
            .encode()
            .contains("service_controller_nodesync_error_total 0"),
        "not an error"
    );
    running.stop().await;
}

/// Regression (seen in CI): node changes are looked at once a second. A node that joined and left within
/// that second left the names as they were, so no pass followed; but the service's own change had put the
/// node in its load balancer meanwhile, and there it stayed.
async fn a_node_that_joins_and_leaves_within_a_second_leaves_the_load_balancer(backend: Backend) {
    let cluster = Cluster::start(
        backend,
        vec![FakeInstance::running("n1", 1), FakeInstance::running("n2", 2)],
    )
    .await;
    let nodes = cluster.nodes();
    nodes
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap();
    let services = cluster.services();
    services
        .create(&PostParams::default(), &lb_service("web", json!({})))
        .await
        .unwrap();
    let running = start(manager(&cluster, cluster.cloud_config(), settings()));
    eventually("web's load balancer on n1", || async {
        load_balancers(&cluster)
            .await
            .first()
            .is_some_and(|lb| lb.nodes == ["n1"])
    })
    .await;

    nodes
        .create(&PostParams::default(), &node("n2", json!({})))
        .await
        .unwrap();
    // A change to the service ensures its load balancer on the node set of the moment: n1 and n2.
    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"touched": "1"}}})),
        )
        .await
        .unwrap();
    eventually("web's load balancer on n1 and n2", || async {
        load_balancers(&cluster)
            .await
            .first()
            .is_some_and(|lb| lb.nodes == ["n1", "n2"])
    })
    .await;
    nodes.delete("n2", &DeleteParams::default()).await.unwrap();
    eventually("n2 out of web's load balancer", || async {
        load_balancers(&cluster)
            .await
            .first()
            .is_some_and(|lb| lb.nodes == ["n1"])
    })
    .await;
    running.stop().await;
}

async fn routes_as_upstream_and_outside_the_cluster_cidr_none(backend: Backend) {
    // Every node has an instance, or the lifecycle controller deletes it (none is Ready).
    let cluster = Cluster::start(
        backend,
        vec![
            FakeInstance::running("n1", 1),
            FakeInstance::running("n3", 3),
            FakeInstance::running("n4", 4),
            FakeInstance::running("n5", 5),
        ],
    )
    .await;
    let nodes = cluster.nodes();
    nodes
        .create(
            &PostParams::default(),
            &node("n1", json!({"spec": {"podCIDRs": ["10.244.1.0/24"]}, "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}})),
        )
        .await
        .unwrap();
    // Outside the cluster CIDR: no route, a warning.
    nodes
        .create(
            &PostParams::default(),
            &node("n3", json!({"spec": {"podCIDRs": ["10.250.3.0/24"]}})),
        )
        .await
        .unwrap();
    // Routes but no pod CIDRs: the network is unavailable.
    nodes
        .create(&PostParams::default(), &node("n4", json!({})))
        .await
        .unwrap();
    // Its route is listed under its provider ID: it is n5's, kept.
    nodes
        .create(
            &PostParams::default(),
            &node(
                "n5",
                json!({"spec": {"providerID": "fake://n5", "podCIDRs": ["10.244.5.0/24"]}}),
            ),
        )
        .await
        .unwrap();
    for (name, target, cidr) in [
        ("vpc", "gateway", "10.0.0.0/8"),
        ("to-n4", "n4", "10.244.4.0/24"),
        ("blackhole", "", "10.244.9.0/24"),
        ("to-n5-by-provider-id", "fake://n5", "10.244.5.0/24"),
    ] {
        cluster
            .admin(AdminRequest::PutRoute(FakeRoute {
                name: name.into(),
                target_node: target.into(),
                destination_cidr: cidr.into(),
                target_node_addresses: Vec::new(),
            }))
            .await;
    }
    let running = start(manager(&cluster, cluster.cloud_config(), settings()));
    eventually("n1's route, the stale ones gone, the supernet kept", || async {
        let mut cidrs: Vec<String> = routes(&cluster)
            .await
            .into_iter()
            .map(|r| r.destination_cidr)
            .collect();
        cidrs.sort();
        cidrs == ["10.0.0.0/8", "10.244.1.0/24", "10.244.5.0/24"]
    })
    .await;
    let kept = routes(&cluster).await;
    assert!(
        kept.iter().any(|r| r.name == "to-n5-by-provider-id"),
        "n5's route, named by provider ID, was replaced: {kept:?}"
    );
    assert_eq!(
        calls(&cluster, "delete_route").await,
        2,
        "to-n4 and the blackhole only"
    );
    let n1 = routes(&cluster)
        .await
        .into_iter()
        .find(|r| r.target_node == "n1")
        .unwrap();
    assert_eq!(n1.target_node_addresses, [address("InternalIP", "10.0.0.1")]);
    eventually("a warning about n3's pod CIDR", || async {
        !events(&cluster, "CIDRNotInClusterCIDR").await.is_empty()
    })
    .await;
    let condition = |node: Node| {
        node.status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "NetworkUnavailable")
            .map(|c| (c.status, c.reason.unwrap_or_default()))
    };
    eventually("n4 marked NetworkUnavailable", || async {
        condition(nodes.get("n4").await.unwrap()) == Some(("True".into(), "NoRouteCreated".into()))
    })
    .await;
    assert_eq!(
        condition(nodes.get("n3").await.unwrap()),
        None,
        "its only CIDR is outside: nothing to say"
    );
    let route_events = events(&cluster, "CIDRNotInClusterCIDR").await;
    assert!(
        route_events
            .iter()
            .all(|e| e.reporting_component.as_deref() == Some("route_controller"))
    );
    running.stop().await;
}

async fn a_busy_cluster_lists_routes_once_per_period(backend: Backend) {
    let cluster = Cluster::start(backend, vec![FakeInstance::running("n1", 1)]).await;
    let nodes = cluster.nodes();
    nodes
        .create(
            &PostParams::default(),
            &node("n1", json!({"spec": {"podCIDRs": ["10.244.1.0/24"]}})),
        )
        .await
        .unwrap();
    let mut settings = settings();
    settings.route_reconciliation_period = Duration::from_secs(2);
    let running = start(manager(&cluster, cluster.cloud_config(), settings));
    eventually("the first round", || async {
        calls(&cluster, "list_routes").await >= 1
    })
    .await;
    let before = calls(&cluster, "list_routes").await;
    let started = std::time::Instant::now();
    // Five relevant changes a second (the node's addresses) for six seconds.
    for i in 0..30 {
        nodes
            .patch_status(
                "n1",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"addresses": [{"type": "InternalIP", "address": format!("10.0.0.{i}")}]}})),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let rounds = calls(&cluster, "list_routes").await - before;
    let allowed = started.elapsed().as_secs() / 2 + 1;
    assert!(
        rounds <= allowed,
        "{rounds} rounds in {:?} (at most {allowed})",
        started.elapsed()
    );
    assert!(rounds >= 2, "changes and the period still bring rounds: {rounds}");
    running.stop().await;
}

control_plane::on_both_backends!(
    dual_stack_node_ips_keep_both_addresses_and_a_pair_that_does_not_match_keeps_the_taint,
    a_node_tainted_again_is_initialised_again,
    lifecycle_deletes_only_on_an_answer_and_only_its_providers_nodes,
    load_balancers_are_cleaned_up_as_upstream,
    a_new_service_is_ensured_once_and_a_removed_address_comes_back,
    a_load_balancer_gone_before_its_hosts_update_is_not_an_error_and_draining_nodes_leave_later,
    a_node_that_joins_and_leaves_within_a_second_leaves_the_load_balancer,
    routes_as_upstream_and_outside_the_cluster_cidr_none,
    a_busy_cluster_lists_routes_once_per_period,
);
