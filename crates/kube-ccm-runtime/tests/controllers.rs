//! The cloud controllers end to end: the real manager against the test API server, with the fake cloud.

mod support;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use std::time::Duration;

use kube_ccm_fake::{
    AdminRequest, CloudRequest, CloudResponse, FakeCloudConfig, FakeInstance, FakeLoadBalancer, InstanceState,
};
use kube_ccm_provider::names::{TAINT_SHUTDOWN, TAINT_UNINITIALIZED};
use kube_ccm_runtime::OrphanSweep;
use serde_json::json;

use support::*;

async fn nodes_are_initialized_from_the_cloud_in_two_writes(backend: Backend) {
    let mut instance = FakeInstance::running("n1", 1);
    instance.instance_type = "fake.large".into();
    instance.zone = "zone-b".into();
    instance
        .addresses
        .push(kube_ccm_fake::FakeInstance::running("x", 9).addresses[0].clone());
    instance.addresses[2].type_ = "ExternalIP".into();
    instance.addresses.retain(|a| a.type_ != "Hostname");
    instance.labels = [
        ("team".to_owned(), "cloud".to_owned()),
        ("node.kubernetes.io/reserved".to_owned(), "no".to_owned()),
    ]
    .into();
    let cluster = Cluster::start(backend, vec![instance, FakeInstance::running("n2", 2)]).await;
    let nodes = cluster.nodes();
    let keep = json!({"key": "example.com/keep", "effect": "NoSchedule"});
    nodes
        .create(
            &PostParams::default(),
            &node(
                "n1",
                json!({
                    "metadata": {"annotations": {"alpha.kubernetes.io/provided-node-ip": "10.0.0.1"}},
                    "spec": {"taints": [uninitialized(), keep]},
                    "status": {"addresses": [{"type": "Hostname", "address": "n1"}]},
                }),
            ),
        )
        .await
        .unwrap();
    // n2's kubelet was given an IP the cloud does not have.
    nodes
        .create(&PostParams::default(), &node("n2", json!({"metadata": {"annotations": {"alpha.kubernetes.io/provided-node-ip": "10.9.9.9"}}, "spec": {"taints": [uninitialized()]}})))
        .await
        .unwrap();
    let running = start(manager(&cluster, cluster.cloud_config(), settings()));

    eventually("n1 to lose the uninitialized taint", || async {
        !taint_keys(&nodes, "n1")
            .await
            .contains(&TAINT_UNINITIALIZED.to_owned())
    })
    .await;
    let n1 = nodes.get("n1").await.unwrap();
    assert_eq!(
        n1.spec.as_ref().unwrap().provider_id.as_deref(),
        Some("fake://n1")
    );
    assert_eq!(
        taint_keys(&nodes, "n1").await,
        ["example.com/keep"],
        "other taints stay"
    );
    let labels = n1.metadata.labels.unwrap();
    for (key, value) in [
        ("node.kubernetes.io/instance-type", "fake.large"),
        ("beta.kubernetes.io/instance-type", "fake.large"),
        ("topology.kubernetes.io/zone", "zone-b"),
        ("failure-domain.beta.kubernetes.io/zone", "zone-b"),
        ("topology.kubernetes.io/region", "fake-region-1"),
        ("failure-domain.beta.kubernetes.io/region", "fake-region-1"),
        ("team", "cloud"),
    ] {
        assert_eq!(labels.get(key).map(String::as_str), Some(value), "{key}");
    }
    assert!(
        !labels.contains_key("node.kubernetes.io/reserved"),
        "additional labels under kubernetes.io are dropped"
    );
    let addresses: Vec<(String, String)> = n1
        .status
        .unwrap()
        .addresses
        .unwrap()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert_eq!(
        addresses,
        [
            ("InternalIP".into(), "10.0.0.1".into()),
            ("ExternalIP".into(), "10.0.0.9".into()),
            ("Hostname".into(), "n1".into())
        ],
        "the provided IP first, the kubelet's hostname kept"
    );
    let n1_writes: Vec<_> = cluster
        .writes_by("cloud-node-controller")
        .into_iter()
        .filter(|w| w.name.as_deref() == Some("n1"))
        .collect();
    assert_eq!(
        n1_writes.len(),
        2,
        "addresses, then everything else with the taint removed last"
    );
    for write in &n1_writes {
        assert!(
            write.query.split('&').any(|q| q == "fieldValidation=Ignore"),
            "the API server is spared validating fields nobody reads the warnings of: {}?{}",
            write.path,
            write.query
        );
    }

    eventually("an event explaining why n2 stays tainted", || async {
        !events(&cluster, "ProvidedNodeIPNotFound").await.is_empty()
    })
    .await;
    assert!(
        taint_keys(&nodes, "n2")
            .await
            .contains(&TAINT_UNINITIALIZED.to_owned())
    );
    running.stop().await;
}

/// The cloud's `describe_instances` calls so far.
async fn describe_calls(cluster: &Cluster) -> u64 {
    match cluster.snapshot().await {
        CloudResponse::Snapshot { calls_by_kind, .. } => {
            calls_by_kind.get("describe_instances").copied().unwrap_or(0)
        }
        other => panic!("{other:?}"),
    }
}

/// The address refresh asks the cloud about 1,000 nodes a call: 1,001 initialised nodes whose instances
/// all moved take two calls and one status write each.
async fn addresses_are_refreshed_in_one_cloud_call_per_thousand_nodes(backend: Backend) {
    const NODES: u32 = 1_001;
    let instance = |i: u32| FakeInstance::running(&format!("n{i}"), i);
    let cluster = Cluster::start(backend, (0..NODES).map(instance).collect()).await;
    let nodes = cluster.nodes();
    futures::stream::iter(0..NODES)
        .map(|i| {
            let nodes = nodes.clone();
            let addresses: Vec<_> = instance(i)
                .addresses
                .iter()
                .map(|a| json!({"type": a.type_, "address": a.address}))
                .collect();
            let mut extra = ready("True");
            extra["spec"] = json!({"providerID": format!("fake://n{i}")});
            extra["status"]["addresses"] = json!(addresses);
            async move {
                nodes
                    .create(&PostParams::default(), &node(&format!("n{i}"), extra))
                    .await
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await
        .unwrap();
    // Every instance moves to another internal address (10.0.x.y to 10.200.x.y).
    for i in 0..NODES {
        let mut moved = instance(i);
        moved.addresses[0].address = moved.addresses[0].address.replacen("10.0.", "10.200.", 1);
        cluster.admin(AdminRequest::PutInstance(moved)).await;
    }
    let before = describe_calls(&cluster).await;
    let settings = kube_ccm_runtime::ControllerSettings {
        node_status_update_frequency: Duration::from_secs(3),
        ..settings()
    };
    let running = start(manager(&cluster, cluster.cloud_config(), settings));
    eventually("every node's new address", || async {
        nodes
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .all(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.addresses.as_ref())
                    .is_some_and(|a| a.iter().any(|a| a.address.starts_with("10.200.")))
            })
    })
    .await;
    // Two a round; the next round (3 s after this one's last write) may have begun meanwhile.
    let calls = describe_calls(&cluster).await - before;
    assert!(
        (2..=4).contains(&calls),
        "{calls} calls: one per 1,000 nodes a round"
    );
    assert_eq!(
        cluster.writes_by("cloud-node-controller").len(),
        NODES as usize,
        "one write a node"
    );
    running.stop().await;
}

async fn a_node_without_a_provider_id_stays_tainted_with_an_event(backend: Backend) {
    let cluster = Cluster::start(
        backend,
        vec![FakeInstance {
            provider_id: Some(String::new()),
            ..FakeInstance::running("n1", 1)
        }],
    )
    .await;
    let nodes = cluster.nodes();
    nodes
        .create(
            &PostParams::default(),
            &node("n1", json!({"spec": {"taints": [uninitialized()]}})),
        )
        .await
        .unwrap();
    let running = start(manager(&cluster, cluster.cloud_config(), settings()));
    eventually("a ProviderIDMissing event", || async {
        !events(&cluster, "ProviderIDMissing").await.is_empty()
    })
    .await;
    let event = &events(&cluster, "ProviderIDMissing").await[0];
    assert!(
        event
            .message
            .as_deref()
            .unwrap()
            .contains("does not set a provider ID for node n1"),
        "{event:?}"
    );
    assert_eq!(
        event.reporting_component.as_deref(),
        Some("cloud-node-controller")
    );
    assert!(
        taint_keys(&nodes, "n1")
            .await
            .contains(&TAINT_UNINITIALIZED.to_owned())
    );
    running.stop().await;
}

async fn lifecycle_deletes_gone_nodes_and_taints_shut_down_ones(backend: Backend) {
    let cluster = Cluster::start(
        backend,
        vec![
            FakeInstance::running("gone", 1),
            FakeInstance::running("stopped", 2),
            FakeInstance::running("back", 3),
        ],
    )
    .await;
    cluster
        .admin(AdminRequest::SetInstanceState {
            name: "gone".into(),
            state: InstanceState::Terminated,
        })
        .await;
    cluster
        .admin(AdminRequest::SetInstanceState {
            name: "stopped".into(),
            state: InstanceState::Stopped,
        })
        .await;
    let nodes = cluster.nodes();
    nodes
        .create(&PostParams::default(), &node("gone", ready("Unknown")))
        .await
        .unwrap();
    nodes
        .create(&PostParams::default(), &node("stopped", ready("False")))
        .await
        .unwrap();
    let mut back = node("back", ready("True"));
    back.spec = Some(
        serde_json::from_value(json!({"taints": [{"key": TAINT_SHUTDOWN, "effect": "NoSchedule"}]})).unwrap(),
    );
    nodes.create(&PostParams::default(), &back).await.unwrap();
    // Provider IDs the provider cannot interpret: the fake cloud would answer "no such instance" for them
    // (it has none), so without the framework's check they would be deleted with `gone`.
    for (name, id) in [("blank-id", "fake://"), ("slashes-id", "fake:///")] {
        let mut odd = node(name, ready("Unknown"));
        odd.spec = Some(serde_json::from_value(json!({"providerID": id})).unwrap());
        nodes.create(&PostParams::default(), &odd).await.unwrap();
    }
    let manager = manager(&cluster, cluster.cloud_config(), settings());
    let metrics = manager.metrics();
    let running = start(manager);

    eventually("the node of the terminated instance to be deleted", || async {
        nodes.get_opt("gone").await.unwrap().is_none()
    })
    .await;
    events_when(&cluster, "DeletingNode", |e| !e.is_empty()).await;
    let refused = events_when(&cluster, "ProviderIDNotInterpretable", |e| e.len() >= 2).await;
    for name in ["blank-id", "slashes-id"] {
        assert!(
            nodes.get_opt(name).await.unwrap().is_some(),
            "{name}: a node whose provider ID cannot be interpreted is never deleted"
        );
        assert!(
            refused
                .iter()
                .any(|e| e.involved_object.name.as_deref() == Some(name)
                    && e.type_.as_deref() == Some("Warning")
                    && e.reporting_component.as_deref() == Some("cloud-node-lifecycle-controller")),
            "{name}: a Warning Event says why: {refused:?}"
        );
    }
    assert!(
        metrics
            .exposition("text/plain")
            .1
            .contains("node_lifecycle_uninterpretable_provider_ids 2"),
        "the gauge counts them"
    );
    eventually("the shutdown taint on the stopped node", || async {
        taint_keys(&nodes, "stopped")
            .await
            .contains(&TAINT_SHUTDOWN.to_owned())
    })
    .await;
    eventually("the shutdown taint off the ready node", || async {
        taint_keys(&nodes, "back").await.is_empty()
    })
    .await;

    // The stopped instance starts again and its node becomes Ready: the taint goes.
    cluster
        .admin(AdminRequest::SetInstanceState {
            name: "stopped".into(),
            state: InstanceState::Running,
        })
        .await;
    nodes
        .patch_status("stopped", &PatchParams::default(), &Patch::Merge(ready("True")))
        .await
        .unwrap();
    eventually("the shutdown taint off the restarted node", || async {
        !taint_keys(&nodes, "stopped")
            .await
            .contains(&TAINT_SHUTDOWN.to_owned())
    })
    .await;
    assert!(
        nodes.get_opt("stopped").await.unwrap().is_some(),
        "a stopped instance keeps its node"
    );
    running.stop().await;
}

async fn load_balancers_follow_services_and_nodes_across_a_restart(backend: Backend) {
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
    nodes
        .create(&PostParams::default(), &node("n2", json!({})))
        .await
        .unwrap();
    let services = cluster.services();
    let lb: Service = serde_json::from_value(
        json!({"metadata": {"name": "web"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
    )
    .unwrap();
    services.create(&PostParams::default(), &lb).await.unwrap();
    let running = start(manager(&cluster, cluster.cloud_config(), settings()));

    let ingress = || async {
        services
            .get("web")
            .await
            .ok()
            .and_then(|s| s.status)
            .and_then(|s| s.load_balancer)
            .and_then(|lb| lb.ingress)
            .and_then(|i| i.first().and_then(|i| i.ip.clone()))
    };
    eventually("an ingress IP on the service", || async {
        ingress().await.is_some()
    })
    .await;
    assert!(ingress().await.unwrap().starts_with("203.0."));
    let web = services.get("web").await.unwrap();
    assert_eq!(
        web.metadata.finalizers.unwrap(),
        ["service.kubernetes.io/load-balancer-cleanup"]
    );
    assert_eq!(
        load_balancer_nodes(&cluster.snapshot().await),
        [vec!["n1".to_owned(), "n2".to_owned()]]
    );
    events_when(&cluster, "EnsuredLoadBalancer", |e| !e.is_empty()).await;

    // A node leaves the load balancers: the cloud load balancer is updated.
    let exclude =
        json!({"metadata": {"labels": {"node.kubernetes.io/exclude-from-external-load-balancers": "true"}}});
    nodes
        .patch("n2", &PatchParams::default(), &Patch::Merge(exclude))
        .await
        .unwrap();
    eventually("the load balancer to drop n2", || async {
        load_balancer_nodes(&cluster.snapshot().await) == [vec!["n1".to_owned()]]
    })
    .await;
    events_when(&cluster, "UpdatedLoadBalancer", |e| !e.is_empty()).await;

    // The controller goes away; the service is deleted meanwhile; the finalizer keeps it until cleanup.
    running.stop().await;
    services.delete("web", &DeleteParams::default()).await.unwrap();
    assert!(
        services
            .get("web")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    assert_eq!(
        load_balancer_nodes(&cluster.snapshot().await).len(),
        1,
        "nobody deleted the cloud load balancer yet"
    );
    let running = start(manager(&cluster, cluster.cloud_config(), settings()));
    eventually("the service to be gone", || async {
        services.get_opt("web").await.unwrap().is_none()
    })
    .await;
    assert!(
        load_balancer_nodes(&cluster.snapshot().await).is_empty(),
        "the cloud load balancer is gone too"
    );

    // Changing the type away from LoadBalancer also cleans up, without deleting the service.
    let other: Service = serde_json::from_value(
        json!({"metadata": {"name": "other"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 81}]}}),
    )
    .unwrap();
    services.create(&PostParams::default(), &other).await.unwrap();
    eventually("a load balancer for the second service", || async {
        load_balancer_nodes(&cluster.snapshot().await).len() == 1
    })
    .await;
    services
        .patch(
            "other",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "ClusterIP"}})),
        )
        .await
        .unwrap();
    eventually("the finalizer to go", || async {
        services
            .get("other")
            .await
            .unwrap()
            .metadata
            .finalizers
            .unwrap_or_default()
            .is_empty()
    })
    .await;
    assert!(load_balancer_nodes(&cluster.snapshot().await).is_empty());
    assert!(
        services
            .get("other")
            .await
            .unwrap()
            .status
            .unwrap()
            .load_balancer
            .unwrap()
            .ingress
            .unwrap_or_default()
            .is_empty()
    );
    running.stop().await;
}

async fn routes_for_pod_cidrs_and_the_network_unavailable_condition(backend: Backend) {
    // Nodes need instances, or the lifecycle controller deletes them (they are not Ready).
    let cluster = Cluster::start(
        backend,
        vec![FakeInstance::running("n1", 1), FakeInstance::running("n2", 2)],
    )
    .await;
    let nodes = cluster.nodes();
    nodes
        .create(
            &PostParams::default(),
            &node("n1", json!({"spec": {"podCIDRs": ["10.244.1.0/24"]}})),
        )
        .await
        .unwrap();
    nodes
        .create(
            &PostParams::default(),
            &node("n2", json!({"spec": {"podCIDRs": ["10.244.2.0/24"]}})),
        )
        .await
        .unwrap();
    // A route of a node that is gone (inside the cluster CIDR) and one this controller does not own.
    for (name, node, cidr) in [
        ("stale", "old", "10.244.9.0/24"),
        ("foreign", "vpn", "192.168.0.0/24"),
    ] {
        cluster
            .cloud
            .cloud()
            .handle(CloudRequest::CreateRoute {
                name: name.into(),
                target_node: node.into(),
                destination_cidr: cidr.into(),
                target_node_addresses: Vec::new(),
            })
            .await;
    }
    let running = start(manager(&cluster, cluster.cloud_config(), settings()));
    let cidrs = || async {
        match cluster.snapshot().await {
            CloudResponse::Snapshot { routes, .. } => {
                let mut cidrs: Vec<String> = routes.into_iter().map(|r| r.destination_cidr).collect();
                cidrs.sort();
                cidrs
            }
            _ => unreachable!(),
        }
    };
    eventually("routes for both nodes and the stale one gone", || async {
        cidrs().await == ["10.244.1.0/24", "10.244.2.0/24", "192.168.0.0/24"]
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
    eventually("NetworkUnavailable=False on both nodes", || async {
        let n1 = condition(nodes.get("n1").await.unwrap());
        let n2 = condition(nodes.get("n2").await.unwrap());
        n1 == Some(("False".into(), "RouteCreated".into())) && n2 == n1
    })
    .await;
    running.stop().await;
}

async fn missing_capabilities_and_settings_skip_controllers_with_a_reason(backend: Backend) {
    let cluster = Cluster::start(backend, vec![FakeInstance::running("n1", 1)]).await;
    let config = FakeCloudConfig {
        load_balancers: false,
        ..cluster.cloud_config()
    };
    let mut no_cidr = settings();
    no_cidr.cluster_cidrs.clear();
    let manager = manager(&cluster, config, no_cidr);
    let planned = manager.plan();
    let reason = |name: &str| {
        planned
            .iter()
            .find(|p| p.controller.as_str() == name)
            .unwrap()
            .skipped
            .clone()
    };
    assert_eq!(
        reason("service-lb-controller").as_deref(),
        Some("the cloud provider does not support load balancers")
    );
    assert!(
        reason("node-route-controller")
            .unwrap()
            .starts_with("--cluster-cidr is not set")
    );
    assert_eq!(reason("cloud-node-controller"), None);

    let services = cluster.services();
    let lb: Service = serde_json::from_value(
        json!({"metadata": {"name": "web"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
    )
    .unwrap();
    services.create(&PostParams::default(), &lb).await.unwrap();
    let nodes = cluster.nodes();
    nodes
        .create(
            &PostParams::default(),
            &node("n1", json!({"spec": {"taints": [uninitialized()]}})),
        )
        .await
        .unwrap();
    let running = start(manager);
    // The node controller working shows the manager is up; the skipped controller never acted.
    eventually("n1 initialized", || async {
        taint_keys(&nodes, "n1").await.is_empty()
    })
    .await;
    assert!(
        cluster
            .server
            .requests()
            .iter()
            .all(|r| !r.user_agent.ends_with("/service-lb-controller"))
    );
    assert!(services.get("web").await.unwrap().metadata.finalizers.is_none());
    running.stop().await;
}

async fn a_cloud_that_says_every_node_is_gone_deletes_none_and_a_terminated_one_still_goes(backend: Backend) {
    // Eight nodes whose instances all run, half of them not ready.
    let names: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
    let instances = (1..)
        .zip(&names)
        .map(|(i, n)| FakeInstance::running(n, i))
        .collect();
    let cluster = Cluster::start(backend, instances).await;
    let nodes = cluster.nodes();
    for (i, name) in names.iter().enumerate() {
        let status = if i % 2 == 0 { "True" } else { "False" };
        let extra = json!({"spec": {"providerID": format!("fake://{name}")}, "status": {"conditions": [{"type": "Ready", "status": status}]}});
        nodes
            .create(&PostParams::default(), &node(name, extra))
            .await
            .unwrap();
    }
    // A wrong cloud-config after a restart (another account, with no instances): every answer is "no
    // such instance".
    let lied_to = manager(&cluster, FakeCloudConfig::default(), settings());
    let metrics = lied_to.metrics();
    let running = start(lied_to);
    eventually("the breaker to hold five rounds", || async {
        sample(&metrics, "node_lifecycle_deletion_breaker_trips_total") >= 5.0
    })
    .await;
    running.stop().await;
    let held = events_when(&cluster, "NodeDeletionHeld", |e| !e.is_empty()).await;
    assert!(
        held.iter().all(|e| e.type_.as_deref() == Some("Warning")
            && e.message
                .as_deref()
                .is_some_and(|m| m.contains("8 of the 8 nodes asked about are gone (4 of them ready)"))),
        "{held:?}"
    );
    for name in &names {
        assert!(nodes.get_opt(name).await.unwrap().is_some(), "{name} is kept");
    }
    assert!(events(&cluster, "DeletingNode").await.is_empty());
    assert_eq!(sample(&metrics, "node_lifecycle_nodes_awaiting_deletion"), 4.0);

    // The right cloud-config, and one not-ready node's instance terminated: that node goes, once
    // confirmed, and no other.
    cluster
        .admin(AdminRequest::SetInstanceState {
            name: "n3".into(),
            state: InstanceState::Terminated,
        })
        .await;
    let told_truly = manager(&cluster, cluster.cloud_config(), settings());
    let metrics = told_truly.metrics();
    let running = start(told_truly);
    eventually("n3 deleted", || async {
        nodes.get_opt("n3").await.unwrap().is_none()
    })
    .await;
    running.stop().await;
    for name in names.iter().filter(|n| *n != "n3") {
        assert!(nodes.get_opt(name).await.unwrap().is_some(), "{name} is kept");
    }
    assert_eq!(sample(&metrics, "node_lifecycle_deleted_nodes_total"), 1.0);
    assert_eq!(
        sample(&metrics, "node_lifecycle_deletion_breaker_trips_total"),
        0.0
    );

    // The control: without the breaker (upstream's behaviour), the same wrong cloud-config deletes every
    // not-ready node, so the first part above was a real test of it.
    let mut upstream_like = settings();
    upstream_like.node_deletion.breaker_ratio = 1.0;
    let running = start(manager(&cluster, FakeCloudConfig::default(), upstream_like));
    eventually("every not-ready node deleted", || async {
        let mut left = Vec::new();
        for name in ["n1", "n5", "n7"] {
            left.extend(nodes.get_opt(name).await.unwrap());
        }
        left.is_empty()
    })
    .await;
    running.stop().await;
    for name in ["n0", "n2", "n4", "n6"] {
        assert!(
            nodes.get_opt(name).await.unwrap().is_some(),
            "ready {name} is kept"
        );
    }
}

/// The orphan sweep: this cluster's load balancers that no service claims go, after the grace period; the
/// dry run only reports them; another cluster's and untagged ones are never touched.
async fn the_orphan_sweep_deletes_only_this_clusters_unclaimed_load_balancers(backend: Backend) {
    let cluster = Cluster::start(backend, vec![FakeInstance::running("n1", 1)]).await;
    cluster
        .nodes()
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap();
    let services = cluster.services();
    for name in ["web", "kept"] {
        let lb: Service = serde_json::from_value(
            json!({"metadata": {"name": name}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
        )
        .unwrap();
        services.create(&PostParams::default(), &lb).await.unwrap();
    }
    let put = |name: &str, cluster: &str, service: &str| {
        AdminRequest::PutLoadBalancer(FakeLoadBalancer {
            name: name.to_owned(),
            service: service.to_owned(),
            cluster: cluster.to_owned(),
            ports: vec![80],
            nodes: vec!["n1".to_owned()],
            ip: "198.51.100.1".to_owned(),
            ipv6: None,
        })
    };
    // Left by a manager killed before it wrote the status (its service deleted since), another cluster's,
    // and an untagged one.
    cluster
        .admin(put("aleftover", "test-cluster", "default/leftover"))
        .await;
    cluster
        .admin(put("aother", "another-cluster", "default/web"))
        .await;
    cluster.admin(put("auntagged", "", "default/web")).await;
    let names = || async {
        match cluster.snapshot().await {
            CloudResponse::Snapshot { load_balancers, .. } => {
                load_balancers.into_iter().map(|lb| lb.name).collect::<Vec<_>>()
            }
            other => panic!("{other:?}"),
        }
    };
    let sweeping = |dry_run| {
        let mut settings = settings();
        settings.load_balancer_sweep = OrphanSweep {
            period: Duration::from_millis(200),
            grace: Duration::from_millis(600),
            dry_run,
        };
        settings
    };

    // A dry run reports the leftover on its (gone) service, and deletes nothing.
    let dry = manager(&cluster, cluster.cloud_config(), sweeping(true));
    let dry_metrics = dry.metrics();
    let running = start(dry);
    eventually("both services' load balancers", || async {
        let web = services.get("web").await.unwrap();
        let kept = services.get("kept").await.unwrap();
        has_ingress(&web) && has_ingress(&kept)
    })
    .await;
    let reported = events_when(&cluster, "OrphanedLoadBalancer", |e| !e.is_empty()).await;
    assert_eq!(reported[0].involved_object.name.as_deref(), Some("leftover"));
    assert_eq!(names().await.len(), 5, "a dry run deletes nothing");
    eventually("the orphan counted", || async {
        sample(&dry_metrics, "service_controller_orphaned_load_balancers") == 1.0
    })
    .await;
    running.stop().await;

    // While no manager runs, `web` is deleted with its finalizer removed by hand: its load balancer is
    // orphaned too.
    let web_lb = names().await;
    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    services.delete("web", &DeleteParams::default()).await.unwrap();
    eventually("web to be gone", || async {
        services.get_opt("web").await.unwrap().is_none()
    })
    .await;

    let sweeper = manager(&cluster, cluster.cloud_config(), sweeping(false));
    let metrics = sweeper.metrics();
    let running = start(sweeper);
    eventually("the two orphans deleted", || async {
        sample(
            &metrics,
            "service_controller_orphaned_load_balancers_deleted_total",
        ) == 2.0
    })
    .await;
    let kept = services.get("kept").await.unwrap();
    let kept_ip = kept.status.unwrap().load_balancer.unwrap().ingress.unwrap()[0]
        .ip
        .clone();
    let left = names().await;
    assert_eq!(left.len(), 3, "{left:?} (was {web_lb:?})");
    assert!(left.contains(&"aother".to_owned()) && left.contains(&"auntagged".to_owned()));
    assert!(!left.contains(&"aleftover".to_owned()));
    match cluster.snapshot().await {
        CloudResponse::Snapshot { load_balancers, .. } => assert!(
            load_balancers
                .iter()
                .any(|lb| lb.service == "default/kept" && Some(&lb.ip) == kept_ip.as_ref()),
            "the live service keeps its load balancer"
        ),
        other => panic!("{other:?}"),
    }
    let deleted = events_when(&cluster, "DeletedOrphanedLoadBalancer", |e| e.len() == 2).await;
    let mut about: Vec<_> = deleted
        .iter()
        .filter_map(|e| e.involved_object.name.clone())
        .collect();
    about.sort();
    assert_eq!(about, ["leftover", "web"]);
    running.stop().await;
}

control_plane::on_both_backends!(
    nodes_are_initialized_from_the_cloud_in_two_writes,
    addresses_are_refreshed_in_one_cloud_call_per_thousand_nodes,
    a_node_without_a_provider_id_stays_tainted_with_an_event,
    lifecycle_deletes_gone_nodes_and_taints_shut_down_ones,
    a_cloud_that_says_every_node_is_gone_deletes_none_and_a_terminated_one_still_goes,
    load_balancers_follow_services_and_nodes_across_a_restart,
    the_orphan_sweep_deletes_only_this_clusters_unclaimed_load_balancers,
    routes_for_pod_cidrs_and_the_network_unavailable_condition,
    missing_capabilities_and_settings_skip_controllers_with_a_reason,
);
