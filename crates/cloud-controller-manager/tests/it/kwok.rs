//! Real node heartbeats: kwok's simulated kubelets keep nodes' status and Leases alive on the real
//! kube-apiserver, the real kube-controller-manager's node-lifecycle controller judges them, and our
//! manager initialises them and acts on the cloud's answers once they go quiet. Nothing here writes a
//! node condition by hand: every `Ready` the managers see comes from a heartbeat or its absence.
//!
//! Two kwok processes each keep one group of nodes alive. The second is killed: its nodes' Leases stop,
//! kube-controller-manager marks them `Unknown` and taints them unreachable, and our lifecycle controller
//! asks the cloud about them: the stopped instances get the shutdown taint, the terminated ones are
//! deleted (after the deletion guard's confirmation). The first group, whose instances are just as
//! stopped or gone in part, is never touched while its heartbeats continue.
//!
//! Real server only: kwok and kube-controller-manager are built beside kube-apiserver.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use control_plane::{Backend, KubeBinaries};
use harness::kwok::{GROUP_LABEL, Kwok};
use harness::{Replica, Side};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube_ccm_fake::{AdminRequest, CloudRequest, CloudResponse, FakeInstance, InstanceState};
use kube_ccm_provider::names::{TAINT_SHUTDOWN, TAINT_UNINITIALIZED};

use crate::migration::Plane;

/// The taint kube-controller-manager puts on a node whose heartbeats stopped.
const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// kwok's node Leases; kube-controller-manager's grace is a few renewals (every quarter of this) more.
const LEASE: Duration = Duration::from_secs(8);
const GRACE: &str = "--node-monitor-grace-period=12s";
const WAIT: Duration = Duration::from_secs(120);

/// The nodes of a group, and what the cloud says of each once the test changes it.
const NODES: [(&str, &str, InstanceState); 8] = [
    ("node-a-0", "alive", InstanceState::Running),
    ("node-a-1", "alive", InstanceState::Running),
    ("node-a-2", "alive", InstanceState::Stopped),
    ("node-a-3", "alive", InstanceState::Running),
    ("node-b-0", "quiet", InstanceState::Stopped),
    ("node-b-1", "quiet", InstanceState::Stopped),
    ("node-b-2", "quiet", InstanceState::Terminated),
    ("node-b-3", "quiet", InstanceState::Running),
];

#[test]
fn nodes_whose_kwok_heartbeats_stop_are_tainted_or_deleted_by_the_clouds_answer() {
    crate::support::with_kube_binaries(
        "nodes_whose_kwok_heartbeats_stop_are_tainted_or_deleted_by_the_clouds_answer",
        scenario,
    );
}

fn taints(node: &Node) -> BTreeSet<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}

fn ready(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

async fn set_state(plane: &Plane, name: &str, state: InstanceState) {
    let answer = plane
        .cloud
        .cloud()
        .handle(CloudRequest::Admin(AdminRequest::SetInstanceState {
            name: name.to_owned(),
            state,
        }))
        .await;
    assert!(!matches!(answer, CloudResponse::Error { .. }), "{answer:?}");
}

async fn cloud_calls(plane: &Plane) -> BTreeMap<String, u64> {
    match plane
        .cloud
        .cloud()
        .handle(CloudRequest::Admin(AdminRequest::Snapshot))
        .await
    {
        CloudResponse::Snapshot { calls_by_kind, .. } => calls_by_kind,
        other => panic!("{other:?}"),
    }
}

/// Every node initialised by our manager, `Ready` from kwok, and holding a Lease kwok renews.
async fn until_alive(nodes: &Api<Node>, leases: &Api<Lease>, diagnose: impl Fn() -> String) {
    let deadline = Instant::now() + WAIT;
    loop {
        let listed = nodes.list(&Default::default()).await.unwrap().items;
        let initialised = listed
            .iter()
            .filter(|n| !taints(n).contains(TAINT_UNINITIALIZED) && ready(n).as_deref() == Some("True"))
            .count();
        let held = leases
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|l| l.spec.as_ref().is_some_and(|s| s.holder_identity.is_some()))
            .count();
        if initialised == NODES.len() && held >= NODES.len() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{initialised} of {} nodes initialised and Ready, {held} Leases held\n{}",
            NODES.len(),
            diagnose()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn scenario(binaries: KubeBinaries) {
    let plane = Plane::start(Backend::Kube).await;
    let client = plane.server.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    for (index, (name, group, _)) in NODES.iter().enumerate() {
        let put = AdminRequest::PutInstance(FakeInstance::running(name, index as u32));
        plane.cloud.cloud().handle(CloudRequest::Admin(put)).await;
        // As a kubelet registers it: no status (kwok writes it), the cloud's taint.
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {GROUP_LABEL: group, "kubernetes.io/hostname": name}},
            "spec": {"taints": [{"key": TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]},
        }))
        .unwrap();
        nodes.create(&Default::default(), &node).await.unwrap();
    }
    let dir = &plane.environment.log_dir;
    let kubeconfig = plane.server.kubeconfig_path();
    let start_kwok = |group: &str| {
        Kwok::start(
            &binaries.kwok,
            &binaries.kwok_stages,
            kubeconfig,
            group,
            LEASE,
            dir,
        )
        .unwrap()
    };
    let alive = start_kwok("alive");
    let mut quiet = start_kwok("quiet");
    let mut kcm_environment = plane.environment.clone();
    kcm_environment.binary = binaries.kube_controller_manager.clone();
    let kcm = Replica::spawn(
        &kcm_environment,
        "kcm",
        Side::Kcm,
        &[
            format!("--kubeconfig={}", kubeconfig.display()),
            "--bind-address=127.0.0.1".to_owned(),
            "--secure-port=0".to_owned(),
            "--cloud-provider=external".to_owned(),
            "--leader-elect=false".to_owned(),
            "--controllers=node-lifecycle-controller".to_owned(),
            "--node-monitor-period=1s".to_owned(),
            GRACE.to_owned(),
        ],
    )
    .unwrap();
    let ccm = plane.replica("ccm", Side::Ccm);
    let diagnose = |quiet: &Kwok| {
        format!(
            "--- kwok alive\n{}\n--- kwok quiet\n{}\n--- kcm\n{}\n--- ccm\n{}",
            alive.log_tail(),
            quiet.log_tail(),
            kcm.log_tail(),
            ccm.log_tail()
        )
    };
    until_alive(&nodes, &leases, || diagnose(&quiet)).await;

    // The cloud changes under both groups; only the quiet group's heartbeats will stop.
    for (name, _, state) in NODES {
        if state != InstanceState::Running {
            set_state(&plane, name, state).await;
        }
    }
    let calls_before = cloud_calls(&plane).await;
    quiet.kill().unwrap();
    let stopped = Instant::now();

    // What each quiet node should end as: tainted unreachable by kube-controller-manager, then ours.
    let mut first_seen: BTreeMap<(&str, &str), Duration> = BTreeMap::new();
    let deadline = stopped + WAIT;
    loop {
        let listed = nodes.list(&Default::default()).await.unwrap().items;
        let by_name: BTreeMap<&str, &Node> = listed
            .iter()
            .filter_map(|n| Some((n.metadata.name.as_deref()?, n)))
            .collect();
        for (name, group, _) in NODES {
            let Some(node) = by_name.get(name) else {
                first_seen.entry((name, "deleted")).or_insert(stopped.elapsed());
                continue;
            };
            for taint in taints(node) {
                if taint == TAINT_UNREACHABLE || taint == TAINT_SHUTDOWN {
                    let what = if taint == TAINT_SHUTDOWN {
                        "shutdown"
                    } else {
                        "unreachable"
                    };
                    first_seen.entry((name, what)).or_insert(stopped.elapsed());
                }
            }
            if group == "alive" {
                assert_eq!(
                    ready(node).as_deref(),
                    Some("True"),
                    "{name} keeps its heartbeats"
                );
                assert!(
                    !taints(node).contains(TAINT_SHUTDOWN),
                    "{name} is Ready: no shutdown taint whatever the cloud says of it"
                );
            }
        }
        let done = NODES.iter().all(|&(name, group, state)| match (group, state) {
            ("alive", _) => true,
            (_, InstanceState::Stopped) => first_seen.contains_key(&(name, "shutdown")),
            (_, InstanceState::Terminated) => first_seen.contains_key(&(name, "deleted")),
            (_, InstanceState::Running) => first_seen.contains_key(&(name, "unreachable")),
        });
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after {:?}: seen {first_seen:?}\n{}",
            stopped.elapsed(),
            diagnose(&quiet)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let calls_after = cloud_calls(&plane).await;

    // Nothing else happened to any node: the alive group untouched, the quiet running one only
    // unreachable, nothing deleted but the terminated instance's node.
    let listed = nodes.list(&Default::default()).await.unwrap().items;
    let left: BTreeSet<String> = listed.iter().filter_map(|n| n.metadata.name.clone()).collect();
    let expected: BTreeSet<String> = NODES
        .iter()
        .filter(|(_, group, state)| *group == "alive" || *state != InstanceState::Terminated)
        .map(|(name, ..)| (*name).to_owned())
        .collect();
    assert_eq!(left, expected, "only the quiet, terminated node is deleted");
    for node in &listed {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        if name.starts_with("node-a-") {
            assert!(taints(node).is_empty(), "{name}: {:?}", taints(node));
        }
        if name == "node-b-3" {
            assert!(
                !taints(node).contains(TAINT_SHUTDOWN),
                "node-b-3 runs: {:?}",
                taints(node)
            );
        }
    }
    let requests = plane.server.request_entries();
    let invalid = harness::refused_as_invalid(&requests);
    assert!(invalid.is_empty(), "writes refused as invalid: {invalid:#?}");
    let calls: BTreeMap<&String, u64> = calls_after
        .iter()
        .map(|(kind, n)| (kind, n - calls_before.get(kind).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    #[allow(clippy::print_stderr)]
    {
        eprintln!(
            "kwok {}: heartbeats stopped for 4 nodes; first seen after the stop: {first_seen:?}; \
             cloud calls meanwhile: {calls:?}",
            binaries.kwok_version
        );
    }
}
