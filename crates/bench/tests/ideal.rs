//! The ceiling of `ccm-bench versus` is honest only if the ideal client (`src/ideal.rs`) does the node
//! controller's work: each node ends initialised as the fake cloud describes its instance (provider ID,
//! addresses, the instance-type, zone and region labels and the cloud's own outside Kubernetes' domains, the
//! uninitialized taint gone and the others kept),
//! with two writes, over HTTP/1.1 and (on kube-apiserver, which speaks it) HTTP/2.

use std::collections::BTreeMap;
use std::process::{Child, Command};
use std::time::Duration;

use control_plane::{ApiServer, Backend, on_both_backends};
use harness::Workload;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube_ccm_fake::{
    AdminRequest, CloudRequest, CloudResponse, FakeCloud, FakeCloudClient, FakeCloudServer, FakeInstance,
    Knobs,
};

const NODES: u32 = 8;

/// The ideal client, killed on drop.
struct Ideal(Child);

impl Drop for Ideal {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Node `index`'s instance, with labels of the cloud's own.
fn instance(index: u32) -> FakeInstance {
    let mut instance = FakeInstance::running(&format!("node-{index}"), index);
    instance.labels.insert("team".into(), "cloud".into());
    instance.labels.insert("node.kubernetes.io/x".into(), "y".into());
    instance
}

async fn initialised(nodes: &Api<Node>, names: &[String]) -> bool {
    let Ok(list) = nodes.list(&Default::default()).await else {
        return false;
    };
    names.iter().all(|name| {
        list.items
            .iter()
            .any(|n| n.metadata.name.as_ref() == Some(name) && harness::initialized(n))
    })
}

/// What the node controller sets on a node: its labels, provider ID, addresses and taint keys.
struct Shape {
    labels: BTreeMap<String, String>,
    provider_id: Option<String>,
    addresses: Vec<(String, String)>,
    taints: Vec<String>,
}

fn shape(node: &Node) -> Shape {
    let spec = node.spec.clone().unwrap_or_default();
    let addresses = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    Shape {
        labels: node.metadata.labels.clone().unwrap_or_default(),
        provider_id: spec.provider_id,
        addresses,
        taints: spec
            .taints
            .unwrap_or_default()
            .into_iter()
            .map(|t| t.key)
            .collect(),
    }
}

async fn the_ideal_client_does_the_node_controllers_two_writes(backend: Backend) {
    let server = ApiServer::for_test(backend).await;
    let cloud = FakeCloudServer::start(
        FakeCloud::new(Vec::new(), Knobs::default()),
        ([127, 0, 0, 1], 0).into(),
    )
    .await
    .unwrap();
    let directory = std::env::temp_dir().join(format!("ideal-{}-{}", std::process::id(), backend.kind()));
    std::fs::create_dir_all(&directory).unwrap();
    let cloud_config = directory.join("cloud.yaml");
    std::fs::write(&cloud_config, format!("endpoint: {}\n", cloud.url())).unwrap();
    let workload = Workload::new(server.client(), cloud.url());
    let nodes: Api<Node> = Api::all(server.client());
    let admin = FakeCloudClient::new(cloud.url());
    let mut protocols = vec![&[][..]];
    if backend == Backend::Kube {
        protocols.push(&["--http2"][..]);
    }
    for (round, flags) in (0u32..).zip(protocols) {
        let indexes: Vec<u32> = (round * NODES..(round + 1) * NODES).collect();
        for &i in &indexes {
            workload.add_node(i).await.unwrap();
            // The cloud's own labels: one the node gets, one in a Kubernetes domain it must not.
            let put = CloudRequest::Admin(AdminRequest::PutInstance(instance(i)));
            assert!(matches!(admin.call(&put).await, CloudResponse::Done));
        }
        let names: Vec<String> = indexes.iter().map(|i| format!("node-{i}")).collect();
        let _ideal = Ideal(
            Command::new(env!("CARGO_BIN_EXE_ideal-node-client"))
                .arg(format!("--kubeconfig={}", server.kubeconfig_path().display()))
                .arg(format!("--cloud-config={}", cloud_config.display()))
                .args(["--cloud-provider=fake", "--concurrency=4"])
                .args(flags)
                .spawn()
                .unwrap(),
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !initialised(&nodes, &names).await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{flags:?}: the ideal client did not initialise {names:?} within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for (&i, name) in indexes.iter().zip(&names) {
            let node = nodes.get(name).await.unwrap();
            let instance = instance(i);
            let Shape {
                labels,
                provider_id,
                addresses,
                taints,
            } = shape(&node);
            assert_eq!(provider_id, Some(instance.provider_id()), "{flags:?} {name}");
            let expected: Vec<(String, String)> = instance
                .addresses
                .iter()
                .map(|a| (a.type_.clone(), a.address.clone()))
                .collect();
            assert_eq!(addresses, expected, "{flags:?} {name}");
            for (key, value) in [
                ("node.kubernetes.io/instance-type", &instance.instance_type),
                ("beta.kubernetes.io/instance-type", &instance.instance_type),
                ("topology.kubernetes.io/zone", &instance.zone),
                ("failure-domain.beta.kubernetes.io/zone", &instance.zone),
                ("topology.kubernetes.io/region", &instance.region),
                ("failure-domain.beta.kubernetes.io/region", &instance.region),
            ] {
                assert_eq!(labels.get(key), Some(value), "{flags:?} {name}: {key}");
            }
            assert_eq!(
                labels.get("team").map(String::as_str),
                Some("cloud"),
                "{flags:?} {name}"
            );
            assert!(!labels.contains_key("node.kubernetes.io/x"), "{flags:?} {name}");
            // The uninitialized taint removed, the API server's own (not-ready, added at creation) kept.
            assert_eq!(taints, ["node.kubernetes.io/not-ready"], "{flags:?} {name}");
        }
    }
    let writes: Vec<String> = server
        .requests()
        .into_iter()
        .filter(|r| r.user_agent.starts_with("ideal-node-client/") && r.is_write())
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    let rounds = if backend == Backend::Kube { 2 } else { 1 };
    assert_eq!(writes.len() as u32, 2 * NODES * rounds, "{writes:#?}");
    assert!(
        writes.iter().all(|w| w.starts_with("PATCH /api/v1/nodes/node-")),
        "{writes:#?}"
    );
    let _ = std::fs::remove_dir_all(&directory);
}

on_both_backends!(the_ideal_client_does_the_node_controllers_two_writes);
