//! The shipped binary with `--cloud-provider=gce` against the Compute test double and the test API server:
//! a node initialised from its instance, its pod range routed, and the node deleted (and its route with
//! it) when its instance is deleted.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use compute_double::ComputeDouble;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;
use test_apiserver::TestApiServer;

const PROJECT: &str = "test-project";
const ZONE: &str = "us-central1-a";

struct Manager(Child);

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `check` every 100 ms until it is `Some`, for at most 60 s; fails with the manager's log.
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    log: &std::path::Path,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gce_provider_initialises_a_node_routes_it_and_deletes_it_with_its_instance() {
    let double = ComputeDouble::start().await.unwrap();
    let instance: google_cloud_compute_v1::model::Instance = serde_json::from_value(serde_json::json!({
        "name": "node-1",
        "machineType": format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}/machineTypes/n2-standard-8"),
        "networkInterfaces": [{"networkIP": "10.128.0.5", "accessConfigs": [{"natIP": "34.66.1.2"}]}],
    }))
    .unwrap();
    double.put_instance(PROJECT, ZONE, instance);

    let dir = tempfile::tempdir().unwrap();
    let server = TestApiServer::start().await.unwrap();
    let config = dir.path().join("gce.conf");
    std::fs::write(
        &config,
        format!(
            "[global]\nproject-id = {PROJECT}\nlocal-zone = {ZONE}\nnetwork-name = default\nnode-tags = test-node\napi-endpoint = {}\n",
            double.endpoint()
        ),
    )
    .unwrap();
    let log = dir.path().join("manager.log");
    let _manager = Manager(
        Command::new(env!("CARGO_BIN_EXE_cloud-controller-manager"))
            .arg("--cloud-provider=gce")
            .arg(format!("--cloud-config={}", config.display()))
            .arg(format!("--kubeconfig={}", server.kubeconfig_path().display()))
            .args([
                "--leader-elect=false",
                "--secure-port=0",
                "--cluster-name=test",
                "--cluster-cidr=10.64.0.0/14",
                "--configure-cloud-routes=true",
                "--route-reconciliation-period=1s",
                "--node-monitor-period=1s",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );

    let nodes: Api<Node> = Api::all(server.client());
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "node-1.c.test-project.internal"},
        "spec": {
            "podCIDR": "10.64.1.0/24",
            "podCIDRs": ["10.64.1.0/24"],
            "taints": [{"key": cloud_provider::names::TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}],
        },
        "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]},
    }))
    .unwrap();
    let uid = nodes
        .create(&PostParams::default(), &node)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();

    let name = "node-1.c.test-project.internal";
    let initialised = eventually("the node was not initialised", &log, || async {
        let node = nodes.get(name).await.unwrap();
        node.spec.as_ref()?.provider_id.as_ref()?;
        Some(node)
    })
    .await;
    assert_eq!(
        initialised.spec.as_ref().unwrap().provider_id.as_deref(),
        Some(format!("gce://{PROJECT}/{ZONE}/node-1").as_str())
    );
    let labels = initialised.metadata.labels.clone().unwrap();
    assert_eq!(labels["topology.kubernetes.io/zone"], ZONE);
    assert_eq!(labels["topology.kubernetes.io/region"], "us-central1");
    assert_eq!(labels["node.kubernetes.io/instance-type"], "n2-standard-8");
    let addresses: Vec<(String, String)> = initialised
        .status
        .unwrap()
        .addresses
        .unwrap()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert!(
        addresses.contains(&("InternalIP".into(), "10.128.0.5".into())),
        "{addresses:?}"
    );
    assert!(
        addresses.contains(&("ExternalIP".into(), "34.66.1.2".into())),
        "{addresses:?}"
    );

    // The node's pod range, routed to its instance under upstream's name.
    let route = eventually("no route was made for the node's pod range", &log, || async {
        double
            .routes(PROJECT)
            .into_iter()
            .find(|r| r.name.as_deref() == Some(format!("test-{uid}").as_str()))
    })
    .await;
    assert_eq!(route.dest_range.as_deref(), Some("10.64.1.0/24"));
    assert_eq!(route.description.as_deref(), Some("k8s-node-route"));
    assert!(
        route
            .next_hop_instance
            .as_deref()
            .unwrap()
            .ends_with(&format!("zones/{ZONE}/instances/node-1"))
    );

    // The instance is deleted: so is the node, and the route controller removes its route.
    assert!(double.delete_instance(PROJECT, ZONE, "node-1"));
    eventually("the node of a deleted instance was not deleted", &log, || async {
        nodes.get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
    eventually("the deleted node's route was not removed", &log, || async {
        double.routes(PROJECT).is_empty().then_some(())
    })
    .await;
}
