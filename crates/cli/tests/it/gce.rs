//! The shipped binary with `--cloud-provider=gce` against the Compute test double and the test API server:
//! a node initialised from its instance, its pod range routed, a LoadBalancer service's external load
//! balancer made and deleted through the service-lb controller, and the node deleted (and its route with
//! it) when its instance is deleted.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use compute_double::ComputeDouble;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
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
async fn the_gce_provider_initialises_a_node_routes_it_serves_a_load_balancer_and_deletes_the_node_with_its_instance()
 {
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

    // A LoadBalancer service: a forwarding rule and target pool under upstream's names, the rule's IP in
    // the service's status; deleting the service deletes them. The cluster ID the shared health check is
    // named after is upstream's ConfigMap, made when the manager started leading.
    let services: Api<Service> = Api::namespaced(server.client(), "default");
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {"type": "LoadBalancer", "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080, "nodePort": 30080}]},
    }))
    .unwrap();
    let service_uid = services
        .create(&PostParams::default(), &service)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let lb = format!("a{}", service_uid.replace('-', ""))[..32].to_owned();
    let ip = eventually("the service got no load balancer", &log, || async {
        let status = services.get("web").await.unwrap().status?.load_balancer?;
        status.ingress?.first()?.ip.clone()
    })
    .await;
    let rules = double.forwarding_rules(PROJECT);
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].name.as_deref(), Some(lb.as_str()));
    assert_eq!(rules[0].ip_address.as_deref(), Some(ip.as_str()));
    let pools = double.target_pools(PROJECT);
    assert!(
        pools[0].instances[0].ends_with(&format!("zones/{ZONE}/instances/node-1")),
        "{:?}",
        pools[0].instances
    );
    let maps: Api<ConfigMap> = Api::namespaced(server.client(), "kube-system");
    let cluster_id = maps.get("ingress-uid").await.unwrap().data.unwrap()["provider-uid"].clone();
    assert_eq!(cluster_id.len(), 16);
    assert!(pools[0].health_checks[0].ends_with(&format!("k8s-{cluster_id}-node")));
    services.delete("web", &Default::default()).await.unwrap();
    eventually("the load balancer outlived its service", &log, || async {
        (double.forwarding_rules(PROJECT).is_empty()
            && double.target_pools(PROJECT).is_empty()
            && double.firewalls(PROJECT).is_empty()
            && double.http_health_checks(PROJECT).is_empty())
        .then_some(())
    })
    .await;

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
