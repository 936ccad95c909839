//! The Go peer (issues 33 and 34): upstream's cloud-controller-manager, built by `cargo xtask kube` from
//! `k8s.io/cloud-provider`'s app package at the pinned release, with a `fake` provider that acts on the
//! same fake cloud as the Rust manager's. On the real kube-apiserver it initialises nodes and serves a
//! LoadBalancer service from that cloud, under upstream's Lease, and every change it makes to the cloud
//! names its Lease identity, so the cloud's log is judged against Go and Rust tenures alike.
//!
//! Real server only: the peer is built beside kube-apiserver.

use std::time::Duration;

use control_plane::{Backend, KubeBinaries};
use harness::{
    Environment, LeaseWatch, Replica, Side, WatchedHandoff, Workload, has_ingress, initialized,
    wait_for_holders,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams};
use kube_ccm_leadermigration::user_agent::UserAgent;

const WAIT: Duration = Duration::from_secs(90);

#[test]
fn the_go_peer_runs_upstreams_controllers_on_the_shared_fake_cloud() {
    crate::support::with_kube_binaries(
        "the_go_peer_runs_upstreams_controllers_on_the_shared_fake_cloud",
        run,
    );
}

async fn run(binaries: KubeBinaries) {
    let plane = crate::migration::Plane::start_secure(Backend::Kube).await;
    let server = &plane.server;
    let mut environment = plane.environment.clone();
    environment.binary = binaries.go_cloud_controller_manager.clone();
    let mut args = vec![
        "--cloud-provider=fake".to_owned(),
        format!("--cloud-config={}", environment.cloud_config.display()),
        format!("--kubeconfig={}", environment.kubeconfig.display()),
        "--secure-port=0".to_owned(),
        "--configure-cloud-routes=false".to_owned(),
        "--concurrent-service-syncs=2".to_owned(),
        "--node-monitor-period=1s".to_owned(),
    ];
    args.extend(environment.timing_flags());
    let peer = Replica::spawn(&environment, "go-ccm", Side::Ccm, &args).unwrap();

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
        move |peer: &Replica| {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}:\n{}",
                peer.log_tail()
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

const CCM: &str = "cloud-controller-manager";
const MIGRATION: &str = "cloud-provider-extraction-migration";

/// Go peers as replicas of the harness: the same environment (cloud, kubeconfig, N+1 configuration,
/// timings) with the Go binary, and the flags upstream's CCM takes for what the Rust replicas run.
fn go_replica(environment: &Environment, name: &str) -> Replica {
    Replica::spawn(environment, name, Side::Ccm, &environment.go_ccm_args()).unwrap()
}

/// Waits until both of the N+1 side's Leases are held by one process that is not `gone`.
async fn wait_for_a_live_leader(client: &kube::Client, gone: &[String], what: &str) -> String {
    let holders = wait_for_holders(client, &[CCM, MIGRATION], WAIT, what, |h| {
        h[CCM].as_ref().is_some_and(|c| !gone.contains(c)) && h[CCM] == h[MIGRATION]
    })
    .await
    .unwrap();
    holders[CCM].clone().unwrap()
}

/// Successful writes so far by the controllers (not the elector) of ours (`ours`: identities in
/// `rust_ids`) or of everyone else.
fn controller_writes(server: &control_plane::ApiServer, rust_ids: &[String], ours: bool) -> usize {
    server
        .request_entries()
        .iter()
        .filter(|r| (200..300).contains(&r.status) && r.method != "GET")
        .filter_map(|r| UserAgent::parse(&r.user_agent))
        .filter(|ua| ua.controller != "leader-election" && rust_ids.contains(&ua.identity) == ours)
        .count()
}

/// Issue 33's scenario 2: a running upstream Go CCM (three replicas, leader migration configured) is
/// replaced by ours one replica at a time under a churn of nodes and services, then ours by the Go CCM
/// again. Judged from the kube-apiserver's audit log with the cloud's log (every write inside its
/// writer's tenure) and from an independent watch of the Leases (no takeover before the record expired
/// by the taker's own rule); the hand-off gaps per direction are reported.
#[test]
fn a_running_go_ccm_is_swapped_for_ours_and_back_one_replica_at_a_time() {
    crate::support::with_kube_binaries(
        "a_running_go_ccm_is_swapped_for_ours_and_back_one_replica_at_a_time",
        swap,
    );
}

async fn swap(binaries: KubeBinaries) {
    let plane = crate::migration::Plane::start(Backend::Kube).await;
    let client = plane.server.client();
    let watch = LeaseWatch::start(client.clone(), "kube-system");
    let mut go_environment = plane.environment.clone();
    go_environment.binary = binaries.go_cloud_controller_manager.clone();

    let mut go: Vec<Replica> = (1..=3)
        .map(|i| go_replica(&go_environment, &format!("go-{i}")))
        .collect();
    wait_for_a_live_leader(&client, &[], "a Go replica to lead").await;
    let (stop, churn) = plane.workload();

    // Ours in, the Go CCM out, one at a time; then back.
    let (mut rust, mut gone, mut rust_ids) = (Vec::new(), Vec::new(), Vec::new());
    for (index, old) in go.iter_mut().enumerate() {
        let mut replica = plane.replica(&format!("rust-{}", index + 1), Side::Ccm);
        rust_ids.push(replica.identity(WAIT).unwrap());
        rust.push(replica);
        gone.extend(old.reported_identity());
        old.terminate().unwrap();
        old.wait(WAIT).unwrap();
        wait_for_a_live_leader(&client, &gone, "a live replica to lead after a Go one stopped").await;
    }
    let leader = wait_for_a_live_leader(&client, &gone, "ours to lead").await;
    assert!(
        rust_ids.contains(&leader),
        "{leader} is not one of ours: {rust_ids:?}"
    );
    // Ours at work before it goes: the churn gives it something to write (a take-over itself writes
    // nothing that is already right).
    let deadline = tokio::time::Instant::now() + WAIT;
    while controller_writes(&plane.server, &rust_ids, true) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "ours led for {WAIT:?} and its controllers wrote nothing"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Back, the leader last and by SIGKILL (a crash at the end of the roll-out): the Go CCM takes over
    // by its own elector's rule; the others stop gracefully before.
    let last = rust.len() - 1;
    let position = rust_ids.iter().position(|id| *id == leader).unwrap();
    rust.swap(last, position);
    let mut back = Vec::new();
    for (index, replica) in rust.iter_mut().enumerate() {
        back.push(go_replica(&go_environment, &format!("go-{}", index + 4)));
        gone.extend(replica.reported_identity());
        if index == last {
            replica.kill().unwrap();
            replica.wait(WAIT).unwrap();
        } else {
            replica.terminate().unwrap();
            let status = replica.wait(WAIT).unwrap();
            assert!(status.success(), "{} exits 0 on SIGTERM: {status}", replica.name);
        }
        wait_for_a_live_leader(&client, &gone, "a live replica to lead after one of ours stopped").await;
    }
    let leader = wait_for_a_live_leader(&client, &gone, "the Go CCM to lead again").await;
    assert!(!rust_ids.contains(&leader), "the Go CCM leads at the end");
    stop.cancel();

    // Converged: every node initialised, every service served, by the Go CCM at the end.
    let created = churn.await.unwrap().unwrap();
    plane.wait_until_served(&back.iter().collect::<Vec<_>>()).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let listed = (
        nodes.list(&Default::default()).await.unwrap().items.len(),
        services
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|s| has_ingress(s))
            .count(),
    );
    assert_eq!(
        listed,
        (created.nodes as usize, created.services as usize),
        "every node and service created is there and served"
    );

    // The server's record: no write outside its writer's tenure, Go's and ours alike.
    let everyone: Vec<&Replica> = go.iter().chain(&rust).chain(&back).collect();
    let report = plane.assert_no_overlap(&everyone).await;
    let writers = |ours: bool| controller_writes(&plane.server, &rust_ids, ours);
    assert!(
        writers(true) > 0 && writers(false) > 0,
        "both managers' controllers wrote: ours {}, Go's {}",
        writers(true),
        writers(false)
    );

    // The independent witness: no takeover before the record expired by the taker's rule.
    let go_elector = |identity: &str| !rust_ids.contains(&identity.to_owned());
    let handoffs = watch.handoffs(go_elector);
    let premature: Vec<_> = handoffs.iter().filter(|h| h.premature).collect();
    assert!(premature.is_empty(), "{premature:#?}");
    let gaps = |from_go: bool, to_go: bool| -> Vec<&WatchedHandoff> {
        handoffs
            .iter()
            .filter(|h| go_elector(&h.from) == from_go && go_elector(&h.to) == to_go)
            .collect()
    };
    let (go_to_rust, rust_to_go) = (gaps(true, false), gaps(false, true));
    assert!(
        !go_to_rust.is_empty() && !rust_to_go.is_empty(),
        "hand-offs both ways: {handoffs:#?}"
    );
    // Ours releases its Leases on SIGTERM and the Go CCM takes them at its next retry (after a crash
    // it waits for the record to expire); the Go CCM does not release (upstream), so ours waits.
    for handoff in &rust_to_go {
        assert!(!handoff.released || handoff.gap_ms < 1000.0, "{handoff:?}");
    }
    assert!(
        rust_to_go.iter().any(|h| !h.released),
        "the crash was a takeover by the Go CCM: {handoffs:#?}"
    );
    for handoff in &go_to_rust {
        assert!(!handoff.released, "{handoff:?}");
    }
    #[allow(clippy::print_stderr)]
    {
        let summary = |h: &[&WatchedHandoff]| {
            h.iter()
                .map(|h| {
                    let how = if h.released { "released" } else { "taken over" };
                    format!("{} {how} {:.0} ms", h.lease, h.gap_ms)
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        eprintln!(
            "hand-offs Go → ours: {}; ours → Go: {}; {} writes judged",
            summary(&go_to_rust),
            summary(&rust_to_go),
            report.writes_checked
        );
    }
    for replica in &back {
        replica.terminate().unwrap();
    }
}
