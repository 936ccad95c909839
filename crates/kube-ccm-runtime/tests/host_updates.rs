//! A change of node set updates the load balancers' hosts `--concurrent-load-balancer-host-updates` at a
//! time, while syncs that create load balancers stay within `--concurrent-service-syncs`: seen as the
//! cloud's most calls in flight at once, by call.

mod support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use kube::api::PostParams;
use kube_ccm_fake::{AdminRequest, CloudResponse, FakeInstance, Knobs};
use serde_json::json;

use support::*;

const SERVICES: usize = 24;

/// Serves `SERVICES` load balancers with `service_syncs` and `host_updates`, adds a node, and returns the
/// cloud's peak calls in flight by call once every load balancer has it.
async fn peaks(backend: Backend, service_syncs: u16, host_updates: u16) -> BTreeMap<String, u64> {
    let cluster = Cluster::start(
        backend,
        (1..=3)
            .map(|i| FakeInstance::running(&format!("n{i}"), i))
            .collect(),
    )
    .await;
    // Slow enough that calls overlap whenever the controller lets them.
    cluster
        .admin(AdminRequest::SetKnobs(Knobs {
            latency_ms: 100,
            ..Knobs::default()
        }))
        .await;
    let nodes = cluster.nodes();
    for name in ["n1", "n2"] {
        nodes
            .create(&PostParams::default(), &node(name, json!({})))
            .await
            .unwrap();
    }
    let services = cluster.services();
    for i in 0..SERVICES {
        let service: Service = serde_json::from_value(json!({
            "metadata": {"name": format!("web-{i}")},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
        }))
        .unwrap();
        services.create(&PostParams::default(), &service).await.unwrap();
    }
    let settings = kube_ccm_runtime::ControllerSettings {
        concurrent_service_syncs: service_syncs,
        concurrent_load_balancer_host_updates: host_updates,
        ..settings()
    };
    let running = start(manager(&cluster, cluster.cloud_config(), settings));
    let every_one_has = |wanted: &'static [&'static str]| {
        let cluster = &cluster;
        async move {
            let sets = load_balancer_nodes(&cluster.snapshot().await);
            sets.len() == SERVICES && sets.iter().all(|set| set == wanted)
        }
    };
    eventually("a load balancer for every service", || {
        every_one_has(&["n1", "n2"])
    })
    .await;
    nodes
        .create(&PostParams::default(), &node("n3", json!({})))
        .await
        .unwrap();
    eventually("every load balancer with the new node", || {
        every_one_has(&["n1", "n2", "n3"])
    })
    .await;
    running.stop().await;
    match cluster.snapshot().await {
        CloudResponse::Snapshot { peak_in_flight, .. } => peak_in_flight,
        other => panic!("not a snapshot: {other:?}"),
    }
}

async fn host_updates_go_wider_than_service_syncs(backend: Backend) {
    let wide = peaks(backend, 2, 12).await;
    let peak = |peaks: &BTreeMap<String, u64>, call: &str| peaks.get(call).copied().unwrap_or(0);
    assert!(peak(&wide, "ensure_load_balancer") <= 2, "{wide:?}");
    let updates = peak(&wide, "update_load_balancer");
    assert!((3..=12).contains(&updates), "{wide:?}");
    // The control: as upstream, host updates as narrow as the other syncs.
    let narrow = peaks(backend, 2, 2).await;
    assert!(peak(&narrow, "update_load_balancer") <= 2, "{narrow:?}");
    assert!(peak(&narrow, "ensure_load_balancer") <= 2, "{narrow:?}");
}

control_plane::on_both_backends!(host_updates_go_wider_than_service_syncs);
