//! Hostile objects never crash a controller nor make it write garbage: generated nodes with junk provider
//! IDs, labels, annotations (the provided-node-ip one included) and pod CIDRs, and LoadBalancer services
//! with hundreds of ports and junk annotations. Whatever the test API server accepts (it validates like a
//! real one, so these can exist in a cluster) is given to the framework's controllers; then every health
//! check must pass, no write may be refused as invalid, and a node is initialised only with what the cloud
//! says.

mod support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{ListParams, PostParams};
use kube_ccm_fake::{AdminRequest, FakeInstance};
use kube_ccm_provider::names::ANNOTATION_PROVIDED_NODE_IP;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use serde_json::json;
use support::{Backend, Cluster, eventually, manager, settings, start, uninitialized};

fn junk() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,80}",
        "[ -~]{0,40}",
        Just(String::new()),
        Just("://".to_owned()),
        Just("\u{0}\u{7f}".to_owned()),
    ]
}

fn provider_id() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        4 => Just(None),
        1 => junk().prop_map(Some),
        1 => "fake://[a-z]{0,5}/?[^/]{0,20}".prop_map(Some),
        1 => "aws:///[a-z0-9-]{0,12}/i-[0-9a-f]{0,17}".prop_map(Some),
        1 => "gce://[a-z]{0,8}/[a-z0-9-]{0,8}/[a-z0-9-]{0,12}".prop_map(Some),
    ]
}

fn cidr() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9./:a-f]{0,30}",
        Just("10.244.1.0/33".to_owned()),
        Just("300.1.1.1/24".to_owned()),
        Just("::/0".to_owned()),
        Just("0.0.0.0/0".to_owned()),
        (0u8..=255, 0u8..=32).prop_map(|(a, bits)| format!("10.{a}.0.0/{bits}")),
        Just("fd00::/8".to_owned()),
    ]
}

fn annotations() -> impl Strategy<Value = BTreeMap<String, String>> {
    let provided_ip = prop_oneof![
        junk(),
        Just("10.0.0.1,fd00::1".to_owned()),
        Just("10.0.0.1,10.0.0.2".to_owned()),
        Just("010.000.000.001".to_owned()),
        Just(",".to_owned()),
    ];
    (
        proptest::collection::btree_map("example\\.com/[a-z]{1,20}", junk(), 0..6),
        proptest::option::of(provided_ip),
        proptest::collection::btree_map(
            "service\\.beta\\.kubernetes\\.io/[a-z]([a-z-]{0,28}[a-z])?",
            junk(),
            0..4,
        ),
    )
        .prop_map(|(mut map, ip, more)| {
            if let Some(ip) = ip {
                map.insert(ANNOTATION_PROVIDED_NODE_IP.to_owned(), ip);
            }
            map.extend(more);
            map
        })
}

fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::btree_map(
        prop_oneof![
            "[a-z]{1,20}",
            "[a-z]{1,10}(\\.[a-z]{1,10}){0,2}/[a-z]{1,20}",
            Just("topology.kubernetes.io/zone".to_owned()),
            Just("node.kubernetes.io/instance-type".to_owned()),
            Just("node.kubernetes.io/exclude-from-external-load-balancers".to_owned()),
        ],
        prop_oneof![
            8 => "[a-zA-Z0-9]([a-zA-Z0-9._-]{0,61}[a-zA-Z0-9])?",
            1 => "[a-z]{64,300}",
            1 => junk(),
        ],
        0..6,
    )
}

fn node(index: usize) -> impl Strategy<Value = Node> {
    (provider_id(), labels(), annotations(), proptest::collection::vec(cidr(), 0..3)).prop_map(
        move |(provider_id, labels, annotations, cidrs)| {
            let mut spec = json!({"taints": [uninitialized()]});
            if let Some(id) = provider_id {
                spec["providerID"] = json!(id);
            }
            if let Some(first) = cidrs.first() {
                spec["podCIDR"] = json!(first);
                spec["podCIDRs"] = json!(cidrs);
            }
            serde_json::from_value(json!({
                "metadata": {"name": format!("hostile-{index}"), "labels": labels, "annotations": annotations},
                "spec": spec,
                "status": {"conditions": [{"type": "Ready", "status": "True"}], "addresses": [{"type": "Hostname", "address": format!("hostile-{index}")}]},
            }))
            .unwrap()
        },
    )
}

fn service(index: usize) -> impl Strategy<Value = Service> {
    (
        1usize..300,
        1i32..60000,
        annotations(),
        prop_oneof![6 => Just(None), 1 => junk().prop_map(Some), 1 => "[a-z]{1,10}\\.example/[a-z]{1,10}".prop_map(Some)],
        any::<bool>(),
    ).prop_map(
        move |(ports, base, annotations, class, local)| {
            let ports: Vec<serde_json::Value> = (0..ports)
                .map(|i| {
                    let protocol = ["TCP", "UDP", "SCTP"][i % 3];
                    json!({"name": format!("p{i}"), "port": base + i as i32, "protocol": protocol})
                })
                .collect();
            let mut spec = json!({"type": "LoadBalancer", "ports": ports, "selector": {"app": "x"}});
            if let Some(class) = class {
                spec["loadBalancerClass"] = json!(class);
            }
            if local {
                spec["externalTrafficPolicy"] = json!("Local");
            }
            serde_json::from_value(json!({
                "metadata": {"name": format!("hostile-{index}"), "annotations": annotations},
                "spec": spec,
            }))
            .unwrap()
        },
    )
}

async fn hostile_objects_neither_crash_controllers_nor_make_them_write_garbage(backend: Backend) {
    let mut runner = TestRunner::deterministic();
    // Half the nodes have an instance under their name.
    let instances = (0..40u32)
        .filter(|i| i % 2 == 0)
        .map(|i| FakeInstance::running(&format!("hostile-{i}"), i + 1))
        .chain([FakeInstance::running("sentinel", 999)])
        .collect();
    let cluster = Cluster::start(backend, instances).await;
    // Each object is drawn until the server accepts one: what the controllers see is hostile but could
    // exist in a real cluster. (What is refused was checked by the server's validation, not here.)
    for i in 0..40 {
        let mut attempts = 0;
        loop {
            let candidate = node(i).new_tree(&mut runner).unwrap().current();
            match cluster.nodes().create(&PostParams::default(), &candidate).await {
                Ok(_) => break,
                Err(kube::Error::Api(status)) if status.code == 422 || status.code == 400 => {}
                Err(error) => panic!("{error}"),
            }
            attempts += 1;
            assert!(attempts < 200, "no acceptable node {i} drawn");
        }
    }
    for i in 0..20 {
        let mut attempts = 0;
        loop {
            let candidate = service(i).new_tree(&mut runner).unwrap().current();
            match cluster
                .services()
                .create(&PostParams::default(), &candidate)
                .await
            {
                Ok(_) => break,
                Err(kube::Error::Api(status)) if status.code == 422 || status.code == 400 => {}
                Err(error) => panic!("{error}"),
            }
            attempts += 1;
            assert!(attempts < 200, "no acceptable service {i} drawn");
        }
    }

    let manager = manager(&cluster, cluster.cloud_config(), settings());
    let health = manager.health();
    let running = start(manager);
    // A sentinel behind them in every queue: once it is served, the hostile objects ahead were handled.
    cluster
        .nodes()
        .create(
            &PostParams::default(),
            &support::node("sentinel", json!({"spec": {"taints": [uninitialized()]}})),
        )
        .await
        .unwrap();
    let sentinel: Service = serde_json::from_value(json!({
        "metadata": {"name": "sentinel"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}], "selector": {"app": "x"}},
    }))
    .unwrap();
    cluster
        .services()
        .create(&PostParams::default(), &sentinel)
        .await
        .unwrap();
    eventually("the sentinel node initialised and its service served", || async {
        let node = cluster.nodes().get("sentinel").await.unwrap();
        let service = cluster.services().get("sentinel").await.unwrap();
        harness_like::initialized(&node) && support::has_ingress(&service)
    })
    .await;
    // Another full round of the periodic controllers.
    let _ = cluster.admin(AdminRequest::Snapshot).await;

    let verdict = health.health();
    assert!(verdict.ok, "a controller failed: {verdict:?}");
    assert!(!running.task.is_finished(), "the manager stopped");
    let garbage: Vec<_> = cluster
        .server
        .requests()
        .into_iter()
        .filter(|r| r.is_write() && matches!(r.status, 400 | 422))
        .filter(|r| kube_ccm_leadermigration::user_agent::UserAgent::parse(&r.user_agent).is_some())
        .collect();
    assert!(garbage.is_empty(), "writes refused as invalid: {garbage:#?}");
    let mut initialised = 0;
    for node in cluster.nodes().list(&ListParams::default()).await.unwrap() {
        if harness_like::initialized(&node) {
            initialised += 1;
            let name = node.metadata.name.clone().unwrap();
            let provider_id = node.spec.and_then(|s| s.provider_id).unwrap_or_default();
            assert_eq!(
                provider_id,
                format!("fake://{name}"),
                "{name} initialised with a provider ID the cloud did not give"
            );
        }
    }
    assert!(
        initialised > 3,
        "only {initialised} nodes initialised: the check above proves little"
    );
    running.stop().await;
}

/// The harness's predicates (the harness crate depends on this one, so they are restated here).
mod harness_like {
    use k8s_openapi::api::core::v1::Node;
    use kube_ccm_provider::names::TAINT_UNINITIALIZED;

    pub(crate) fn initialized(node: &Node) -> bool {
        node.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_none_or(|t| t.iter().all(|t| t.key != TAINT_UNINITIALIZED))
    }
}

control_plane::on_both_backends!(hostile_objects_neither_crash_controllers_nor_make_them_write_garbage,);
