//! The Go peer (issues 33 and 34): upstream's cloud-controller-manager, built by `cargo xtask kube` from
//! `k8s.io/cloud-provider`'s app package at the pinned release, with a `fake` provider that acts on the
//! same fake cloud as the Rust manager's. On the real kube-apiserver it initialises nodes and serves a
//! LoadBalancer service from that cloud, under upstream's Lease, and every change it makes to the cloud
//! names its Lease identity, so the cloud's log is judged against Go and Rust tenures alike.
//!
//! Real server only: the peer is built beside kube-apiserver.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use control_plane::{Backend, KubeBinaries};
use harness::{Timings, Workload, has_ingress, initialized};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams};

const WAIT: Duration = Duration::from_secs(90);

/// A running Go peer; killed on drop.
struct GoPeer {
    child: Child,
    log: PathBuf,
}

impl GoPeer {
    fn start(binary: &Path, dir: &Path, args: &[String]) -> GoPeer {
        let log = dir.join("go-ccm.log");
        let child = Command::new(binary)
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        GoPeer { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for GoPeer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_go_peer_runs_upstreams_controllers_on_the_shared_fake_cloud() {
    let Some(binaries) =
        KubeBinaries::for_test("the_go_peer_runs_upstreams_controllers_on_the_shared_fake_cloud")
    else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(binaries));
}

async fn run(binaries: KubeBinaries) {
    let plane = crate::migration::Plane::start_secure(Backend::Kube).await;
    let server = &plane.server;
    let directory = tempfile::tempdir().unwrap();
    let cloud_config = directory.path().join("cloud.yaml");
    std::fs::write(&cloud_config, format!("endpoint: {}\n", plane.cloud.url())).unwrap();
    let mut args = vec![
        "--cloud-provider=fake".to_owned(),
        format!("--cloud-config={}", cloud_config.display()),
        format!("--kubeconfig={}", server.kubeconfig_path().display()),
        "--secure-port=0".to_owned(),
        "--configure-cloud-routes=false".to_owned(),
        "--concurrent-service-syncs=2".to_owned(),
        "--node-monitor-period=1s".to_owned(),
    ];
    args.extend(Timings::fast().flags());
    let peer = GoPeer::start(&binaries.go_cloud_controller_manager, directory.path(), &args);

    let client = server.client();
    let workload = Workload::new(client.clone(), plane.cloud.url());
    for index in 0..3 {
        workload.add_node(index).await.unwrap();
    }
    workload.add_service(0).await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let wait = |what: &'static str| {
        let deadline = tokio::time::Instant::now() + WAIT;
        move |peer: &GoPeer| {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}:\n{}",
                peer.log()
            );
        }
    };
    let check = wait("the Go peer to initialise every node and serve the service");
    loop {
        let all = nodes.list(&Default::default()).await.unwrap().items;
        let served = services.get("web-0").await.is_ok_and(|s| has_ingress(&s));
        if all.len() == 3 && all.iter().all(initialized) && served {
            break;
        }
        check(&peer);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Upstream's initialisation: provider ID, zone and instance-type labels from the fake cloud.
    let node = nodes.get("node-0").await.unwrap();
    assert_eq!(
        node.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
        Some("fake://node-0")
    );
    let labels = node.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get("topology.kubernetes.io/zone").map(String::as_str),
        Some("fake-zone-a")
    );
    assert_eq!(
        labels.get("node.kubernetes.io/instance-type").map(String::as_str),
        Some("fake.medium")
    );

    services.delete("web-0", &DeleteParams::default()).await.unwrap();
    let check = wait("the Go peer to delete the load balancer");
    while services.get_opt("web-0").await.unwrap().is_some() {
        check(&peer);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Its Lease is upstream's, and every cloud change names that holder and the controller.
    let leases: Api<Lease> = Api::namespaced(client, "kube-system");
    let holder = leases
        .get("cloud-controller-manager")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity)
        .expect("the Go peer holds upstream's Lease");
    let writes = harness::cloud_writes(plane.cloud.url()).await.unwrap();
    let calls: Vec<&str> = writes.iter().map(|w| w.path.as_str()).collect();
    assert!(
        calls.iter().any(|c| c.starts_with("cloud:ensure_load_balancer/"))
            && calls.iter().any(|c| c.starts_with("cloud:delete_load_balancer/")),
        "{calls:?}"
    );
    for write in &writes {
        assert!(
            write
                .user_agent
                .starts_with("cloud-controller-manager/v1.37.2 (linux/")
                && write
                    .user_agent
                    .ends_with(&format!(" {holder}/service-lb-controller")),
            "{write:?} is not attributed to the Lease holder {holder}"
        );
    }
    drop(peer);
}
