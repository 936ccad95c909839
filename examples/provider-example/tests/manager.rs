//! The example binary against the test API server: a node initialised from the cloud, a LoadBalancer
//! service's life cycle, a route, the provider's own controller, a terminated instance's node deleted, and
//! the framework's node-IPAM controller giving nodes the cloud's pod ranges.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kube_ccm::k8s_openapi::api::core::v1::{Node, Service};
use kube_ccm::kube::Api;
use kube_ccm::kube::api::{DeleteParams, PostParams};
use kube_ccm_conformance::test_apiserver::TestApiServer;
use provider_example::cloud::{Instance, State};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

/// The manager process; killed on drop.
struct Manager(Child);

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(dir: &Path, server: &TestApiServer, flags: &[&str]) -> Manager {
    let config = dir.join("cloud-config.json");
    let state = json!({ "state": dir.join("state.json") });
    std::fs::write(&config, state.to_string()).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_example-cloud-controller-manager"))
        .arg("--cloud-provider=example")
        .arg(format!("--cloud-config={}", config.display()))
        .arg(format!("--kubeconfig={}", server.kubeconfig_path().display()))
        .args([
            "--leader-elect=false",
            "--secure-port=0",
            "--node-monitor-period=1s",
        ])
        .args(flags)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("manager.log")).unwrap())
        .spawn()
        .unwrap();
    Manager(child)
}

fn write_state(dir: &Path, state: &State) {
    std::fs::write(dir.join("state.json"), serde_json::to_vec_pretty(state).unwrap()).unwrap();
}

fn read_state(dir: &Path) -> State {
    serde_json::from_slice(&std::fs::read(dir.join("state.json")).unwrap()).unwrap()
}

/// Polls `check` until it gives `Some`, for at most [`WAIT`].
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    dir: &Path,
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        let log = std::fs::read_to_string(dir.join("manager.log")).unwrap_or_default();
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}; manager log:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_provider_runs_every_controller_against_the_api_server() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let instance = |id: &str, name: &str, address: &str| Instance {
        id: id.into(),
        name: name.into(),
        instance_type: "small".into(),
        zone: "zone-a".into(),
        address: address.into(),
        state: "running".into(),
        tags: Default::default(),
        pod_cidrs: Vec::new(),
    };
    write_state(
        dir,
        &State {
            instances: vec![
                instance("i-1", "n1", "10.0.0.1"),
                instance("i-2", "n2", "10.0.0.2"),
            ],
            ..State::default()
        },
    );
    let server = TestApiServer::start().await.unwrap();
    let _manager = start(
        dir,
        &server,
        &[
            "--controllers=*,example-tagging-controller",
            "--cluster-cidr=10.244.0.0/16",
            "--allocate-node-cidrs=true",
            "--route-reconciliation-period=1s",
        ],
    );
    let nodes: Api<Node> = Api::all(server.client());
    for (name, cidr) in [("n1", "10.244.1.0/24"), ("n2", "10.244.2.0/24")] {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "podCIDR": cidr, "podCIDRs": [cidr],
                "taints": [{"key": kube_ccm::provider::names::TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}],
            },
            "status": {"conditions": [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]},
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }

    // The cloud-node controller initialises the node from the instance.
    let n1 = eventually(dir, "n1 initialised", || async {
        let node = nodes.get("n1").await.ok()?;
        let spec = node.spec.clone()?;
        let tainted = spec
            .taints
            .iter()
            .flatten()
            .any(|t| t.key == kube_ccm::provider::names::TAINT_UNINITIALIZED);
        (!tainted).then_some(node)
    })
    .await;
    assert_eq!(
        n1.spec.as_ref().unwrap().provider_id.as_deref(),
        Some("example://zone-a/i-1")
    );
    let labels = n1.metadata.labels.clone().unwrap();
    assert_eq!(labels["topology.kubernetes.io/zone"], "zone-a");
    assert_eq!(labels["topology.kubernetes.io/region"], "example-1");
    assert_eq!(labels["node.kubernetes.io/instance-type"], "small");
    assert_eq!(labels["example.com/instance-id"], "i-1");
    let addresses: Vec<_> = n1
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
            ("Hostname".into(), "n1".into())
        ]
    );

    // The provider's own controller tags the instances; the route controller makes a route per node.
    eventually(dir, "instances tagged and routes made", || async {
        let state = read_state(dir);
        let tagged = state
            .instances
            .iter()
            .all(|i| i.tags.get(provider_example::tagging::TAG) == Some(&i.name));
        let mut routes: Vec<_> = state
            .routes
            .iter()
            .map(|r| (r.node.clone(), r.cidr.clone()))
            .collect();
        routes.sort();
        (tagged
            && routes
                == [
                    ("n1".into(), "10.244.1.0/24".into()),
                    ("n2".into(), "10.244.2.0/24".into()),
                ])
        .then_some(())
    })
    .await;

    // A LoadBalancer service gets a load balancer in the cloud and its address in its status; its
    // source ranges and health check are read by the framework's service helpers.
    let services: Api<Service> = Api::namespaced(server.client(), "default");
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "annotations": {"service.beta.kubernetes.io/load-balancer-source-ranges": "10.1.2.3/8"}},
        "spec": {
            "type": "LoadBalancer", "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}],
            "externalTrafficPolicy": "Local", "healthCheckNodePort": 31234,
        },
    }))
    .unwrap();
    services.create(&PostParams::default(), &service).await.unwrap();
    let ip = eventually(dir, "the service's load balancer", || async {
        let status = services.get("web").await.ok()?.status?.load_balancer?;
        status.ingress?.first()?.ip.clone()
    })
    .await;
    let state = read_state(dir);
    assert_eq!(state.load_balancers.len(), 1);
    assert_eq!(state.load_balancers[0].ip, ip);
    assert_eq!(state.load_balancers[0].ports, [80]);
    assert_eq!(state.load_balancers[0].nodes, ["n1", "n2"]);
    assert_eq!(state.load_balancers[0].source_ranges, ["10.0.0.0/8"]);
    assert_eq!(
        state.load_balancers[0].health_check,
        Some(("/healthz".to_owned(), 31234))
    );

    // Deleting the service deletes the load balancer.
    services.delete("web", &DeleteParams::default()).await.unwrap();
    eventually(dir, "the load balancer deleted", || async {
        read_state(dir).load_balancers.is_empty().then_some(())
    })
    .await;

    // n2's instance is terminated: its node (not Ready) is deleted, and its route with it.
    let mut state = read_state(dir);
    state.instances[1].state = "terminated".into();
    write_state(dir, &state);
    eventually(dir, "n2 deleted", || async {
        nodes.get_opt("n2").await.ok()?.is_none().then_some(())
    })
    .await;
    eventually(dir, "n2's route deleted", || async {
        let routes = read_state(dir).routes;
        (routes.len() == 1 && routes[0].node == "n1").then_some(())
    })
    .await;
    assert!(
        nodes.get_opt("n1").await.unwrap().is_some(),
        "n1's instance runs: its node stays"
    );
    // Every request names the vendor's binary version, not the framework's.
    let agents: std::collections::BTreeSet<String> = server
        .requests()
        .into_iter()
        .map(|r| r.user_agent)
        .filter(|agent| agent.starts_with("cloud-controller-manager/"))
        .collect();
    assert!(!agents.is_empty(), "no request of the manager was logged");
    assert!(
        agents
            .iter()
            .all(|agent| agent.starts_with("cloud-controller-manager/1.4.0 ")),
        "{agents:?}"
    );
}

#[test]
fn the_binary_reports_its_own_name_and_version() {
    let run = |arg: &str| {
        let output = Command::new(env!("CARGO_BIN_EXE_example-cloud-controller-manager"))
            .arg(arg)
            .output()
            .unwrap();
        assert!(output.status.success(), "{arg}: {output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    assert_eq!(run("--version"), "Kubernetes v1.4.0\n");
    assert!(
        run("--version=raw").contains("GitVersion:\"v1.4.0\""),
        "{}",
        run("--version=raw")
    );
    assert!(
        run("--help").contains("Usage: example-cloud-controller-manager"),
        "{}",
        run("--help")
    );
}

#[test]
fn a_bad_cloud_config_is_one_error_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cloud-config.json");
    std::fs::write(&config, r#"{"state": "/nonexistent", "regoin": "x"}"#).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_example-cloud-controller-manager"))
        .arg("--cloud-provider=example")
        .arg(format!("--cloud-config={}", config.display()))
        .args(["--kubeconfig=/nonexistent", "--leader-elect=false"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unknown field `regoin`"), "{stderr}");
}

/// `node-ipam-controller` with `CloudAllocator` on a vendor's binary: once the cloud-node controller has
/// set the provider ID, the node gets its instance's pod ranges (dual stack, in the service ranges' order)
/// and its network is marked available.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cloud_allocator_gives_nodes_the_examples_pod_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    write_state(
        dir,
        &State {
            instances: vec![Instance {
                id: "i-1".into(),
                name: "n1".into(),
                instance_type: "small".into(),
                zone: "zone-a".into(),
                address: "10.0.0.1".into(),
                state: "running".into(),
                tags: Default::default(),
                pod_cidrs: vec!["fd00:44::/112".into(), "10.244.7.0/24".into()],
            }],
            ..State::default()
        },
    );
    let server = TestApiServer::start().await.unwrap();
    let _manager = start(
        dir,
        &server,
        &[
            "--controllers=*,node-ipam-controller",
            "--allocate-node-cidrs=true",
            "--cidr-allocator-type=CloudAllocator",
            "--service-cluster-ip-range=10.96.0.0/16,fd00:96::/108",
            "--configure-cloud-routes=false",
        ],
    );
    let nodes: Api<Node> = Api::all(server.client());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "n1"},
        "spec": {"taints": [{"key": kube_ccm::provider::names::TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let spec = eventually(dir, "n1's pod CIDRs", || async {
        let spec = nodes.get("n1").await.ok()?.spec?;
        spec.pod_cidrs.as_ref().filter(|c| !c.is_empty())?;
        Some(spec)
    })
    .await;
    assert_eq!(spec.provider_id.as_deref(), Some("example://zone-a/i-1"));
    assert_eq!(spec.pod_cidr.as_deref(), Some("10.244.7.0/24"));
    assert_eq!(
        spec.pod_cidrs.unwrap(),
        ["10.244.7.0/24".to_owned(), "fd00:44::/112".to_owned()]
    );
    eventually(dir, "n1's network available", || async {
        let status = nodes.get("n1").await.ok()?.status?;
        status
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "NetworkUnavailable" && c.status == "False")
    })
    .await;
}
