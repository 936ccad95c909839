//! The Service fields a provider's load balancers depend on, end to end on both API servers.
//!
//! - Load-balancer classes: two managers serving different classes share a cluster and never write each
//!   other's services, judged from the server's request log (the test API server) or its audit log
//!   (kube-apiserver). A service that changes class (through a change of type: the class itself is
//!   immutable) moves from one manager to the other. The judge's negative control: a third manager that
//!   serves a class already served is seen to write another's services.
//! - `ingress[].ipMode`: what a provider gives is stored as given; a status the server defaulted (`VIP`)
//!   is not written again by the next manager; a server that drops the field is learnt, and a `Proxy`
//!   load balancer's service warned about.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use control_plane::RequestRecord;
use k8s_openapi::api::core::v1::Service;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube_ccm_fake::{CloudResponse, FakeCloudConfig, FakeInstance};
use kube_ccm_leadermigration::user_agent::UserAgent;
use serde_json::json;

use support::*;

const A: &str = "manager-a_1";
const B: &str = "manager-b_1";
const C: &str = "manager-c_1";
const CLASS_B: &str = "example.com/b";

fn load_balancer(name: &str, class: Option<&str>) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}], "loadBalancerClass": class},
    }))
    .unwrap()
}

/// A cloud-config serving `classes` only.
fn serving(cluster: &Cluster, classes: &[&str]) -> FakeCloudConfig {
    FakeCloudConfig {
        load_balancer_classes: classes.iter().map(|c| (*c).to_owned()).collect(),
        unclassed_load_balancers: false,
        ..cluster.cloud_config()
    }
}

/// The services (`name`) the cloud holds load balancers for.
async fn in_the_cloud(cluster: &Cluster) -> BTreeSet<String> {
    match cluster.snapshot().await {
        CloudResponse::Snapshot { load_balancers, .. } => load_balancers
            .into_iter()
            .map(|lb| lb.service.trim_start_matches("default/").to_owned())
            .collect(),
        other => panic!("{other:?}"),
    }
}

/// Every attempt to write a service in `log` (whatever the answer: a refused write is an attempt too):
/// (writer's identity, service), in the log's order.
fn service_writes(log: &[RequestRecord]) -> Vec<(String, String)> {
    log.iter()
        .filter(|r| r.is_write() && r.resource.as_deref() == Some("services"))
        .filter_map(|r| Some((UserAgent::parse(&r.user_agent)?.identity, r.name.clone()?)))
        .collect()
}

/// The judge: each write to a service by a manager that does not own it at that point, as
/// `writer → service`. `owners` gives each service's owners in the order it passes between them: a write
/// by an earlier owner after a later one has written is a trespass too. A service without owners is
/// nobody's to write.
fn trespasses(writes: &[(String, String)], owners: &BTreeMap<&str, Vec<&str>>) -> BTreeSet<String> {
    let mut reached: BTreeMap<&str, usize> = BTreeMap::new();
    let mut found = BTreeSet::new();
    for (writer, service) in writes {
        let turn = owners
            .get(service.as_str())
            .and_then(|order| order.iter().position(|o| o == writer));
        match turn {
            Some(turn) if turn >= reached.get(service.as_str()).copied().unwrap_or(0) => {
                reached.insert(service.as_str(), turn);
            }
            _ => {
                found.insert(format!("{writer} → {service}"));
            }
        }
    }
    found
}

async fn two_managers_serving_different_classes_never_write_each_others_services(backend: Backend) {
    let cluster = Cluster::start(
        backend,
        vec![FakeInstance::running("n1", 1), FakeInstance::running("n2", 2)],
    )
    .await;
    let (nodes, services) = (cluster.nodes(), cluster.services());
    for name in ["n1", "n2"] {
        nodes
            .create(&PostParams::default(), &node(name, json!({})))
            .await
            .unwrap();
    }
    for (name, class) in [
        ("plain", None),
        ("bee", Some(CLASS_B)),
        ("foreign", Some("example.com/nobody")),
        ("moving", None),
        ("leaving", Some(CLASS_B)),
    ] {
        let service = load_balancer(name, class);
        services.create(&PostParams::default(), &service).await.unwrap();
    }
    let a = start(manager_as(
        &cluster,
        cluster.cloud_config(),
        settings(),
        A,
        &["*"],
    ));
    let b_config = serving(&cluster, &[CLASS_B]);
    let b = start(manager_as(
        &cluster,
        b_config.clone(),
        settings(),
        B,
        &["service-lb-controller"],
    ));
    let wanted = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<BTreeSet<_>>();
    eventually("plain, bee, moving and leaving served, foreign not", || async {
        in_the_cloud(&cluster).await == wanted(&["bee", "leaving", "moving", "plain"])
    })
    .await;
    for name in ["plain", "bee", "moving", "leaving"] {
        eventually(&format!("{name}'s ingress"), || async {
            has_ingress(&services.get(name).await.unwrap())
        })
        .await;
    }

    // The class is immutable while the type stays LoadBalancer (both servers refuse it)…
    let reclass = Patch::Merge(json!({"spec": {"loadBalancerClass": CLASS_B}}));
    match services.patch("plain", &PatchParams::default(), &reclass).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 422, "{status:?}"),
        other => panic!("a class changed in place: {other:?}"),
    }
    // …and changes through another type: `moving` leaves A (cleaned up) and goes to B.
    let to_cluster_ip = Patch::Merge(json!({"spec": {"type": "ClusterIP"}}));
    services
        .patch("moving", &PatchParams::default(), &to_cluster_ip)
        .await
        .unwrap();
    eventually("moving's load balancer and finalizer gone", || async {
        let moving = services.get("moving").await.unwrap();
        moving.metadata.finalizers.unwrap_or_default().is_empty()
            && !in_the_cloud(&cluster).await.contains("moving")
    })
    .await;
    let to_b = Patch::Merge(json!({"spec": {"type": "LoadBalancer", "loadBalancerClass": CLASS_B}}));
    services
        .patch("moving", &PatchParams::default(), &to_b)
        .await
        .unwrap();
    eventually("moving served again, by B", || async {
        has_ingress(&services.get("moving").await.unwrap()) && in_the_cloud(&cluster).await.contains("moving")
    })
    .await;
    // `leaving` (B's) leaves type LoadBalancer while B is down: the class is erased, and a new B, which
    // never ensured it, cleans it up from the class recorded with the finalizer; A, which serves
    // services without a class, leaves it alone.
    b.stop().await;
    services
        .patch("leaving", &PatchParams::default(), &to_cluster_ip)
        .await
        .unwrap();
    let b = start(manager_as(
        &cluster,
        b_config,
        settings(),
        B,
        &["service-lb-controller"],
    ));
    eventually("leaving's load balancer and finalizer gone", || async {
        let leaving = services.get("leaving").await.unwrap();
        leaving.metadata.finalizers.unwrap_or_default().is_empty()
            && !in_the_cloud(&cluster).await.contains("leaving")
    })
    .await;

    // Every load balancer follows the node set, whichever manager serves it.
    let exclude =
        json!({"metadata": {"labels": {"node.kubernetes.io/exclude-from-external-load-balancers": "true"}}});
    nodes
        .patch("n2", &PatchParams::default(), &Patch::Merge(exclude))
        .await
        .unwrap();
    eventually("every load balancer on n1 alone", || async {
        load_balancer_nodes(&cluster.snapshot().await) == vec![vec!["n1".to_owned()]; 3]
    })
    .await;
    for name in ["plain", "bee", "moving"] {
        services.delete(name, &DeleteParams::default()).await.unwrap();
    }
    eventually("the deleted services and their load balancers gone", || async {
        let mut left = Vec::new();
        for name in ["plain", "bee", "moving"] {
            left.extend(services.get_opt(name).await.unwrap());
        }
        left.is_empty() && in_the_cloud(&cluster).await.is_empty()
    })
    .await;
    let foreign = services.get("foreign").await.unwrap();
    assert!(foreign.metadata.finalizers.is_none() && !has_ingress(&foreign));

    let mut owners: BTreeMap<&str, Vec<&str>> = [
        ("plain", vec![A]),
        ("bee", vec![B]),
        ("moving", vec![A, B]),
        ("leaving", vec![B]),
    ]
    .into();
    let writes = service_writes(&cluster.server.requests());
    for (service, writer) in [("moving", A), ("moving", B), ("leaving", B), ("bee", B)] {
        assert!(
            writes.iter().any(|(w, s)| w == writer && s == service),
            "{writer} never wrote {service}: {writes:?}"
        );
    }
    assert_eq!(trespasses(&writes, &owners), BTreeSet::new(), "{writes:?}");

    // The negative control: C serves B's class too (its load balancers in Proxy mode, so its status
    // differs from B's and it writes), and is seen to write B's service.
    let contested = load_balancer("contested", Some(CLASS_B));
    services.create(&PostParams::default(), &contested).await.unwrap();
    let overlapping = FakeCloudConfig {
        load_balancer_ip_mode: Some("Proxy".to_owned()),
        ..serving(&cluster, &[CLASS_B])
    };
    let c = start(manager_as(
        &cluster,
        overlapping,
        settings(),
        C,
        &["service-lb-controller"],
    ));
    let written_by_c = || {
        service_writes(&cluster.server.requests())
            .into_iter()
            .any(|(w, s)| w == C && s == "contested")
    };
    eventually("C to write contested", || async { written_by_c() }).await;
    owners.insert("contested", vec![B]);
    let found = trespasses(&service_writes(&cluster.server.requests()), &owners);
    assert!(found.contains("manager-c_1 → contested"), "{found:?}");
    // And the judge's order: a write by a service's earlier owner after its later one is a trespass.
    let late = [
        (B.to_owned(), "moving".to_owned()),
        (A.to_owned(), "moving".to_owned()),
    ];
    assert_eq!(
        trespasses(&late, &owners),
        BTreeSet::from(["manager-a_1 → moving".to_owned()])
    );
    for running in [a, b, c] {
        running.stop().await;
    }
}

/// The `ipMode` of each of the service's addresses, as stored.
async fn ip_modes(cluster: &Cluster, name: &str) -> Vec<Option<String>> {
    let service = cluster.services().get(name).await.unwrap();
    let status = service.status.and_then(|s| s.load_balancer).unwrap_or_default();
    status
        .ingress
        .unwrap_or_default()
        .into_iter()
        .map(|i| i.ip_mode)
        .collect()
}

/// The manager `identity` has ensured a load balancer (its `EnsuredLoadBalancer` Event is written).
async fn ensured_by(cluster: &Cluster, identity: &str) {
    events_when(cluster, "EnsuredLoadBalancer", |events| {
        events
            .iter()
            .any(|e| e.reporting_instance.as_deref() == Some(identity))
    })
    .await;
}

async fn ip_modes_are_stored_as_given_and_a_defaulted_one_is_not_written_again(backend: Backend) {
    let cluster = Cluster::start(backend, vec![FakeInstance::running("n1", 1)]).await;
    let services = cluster.services();
    cluster
        .nodes()
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap();
    services
        .create(&PostParams::default(), &load_balancer("web", None))
        .await
        .unwrap();
    // The provider names no mode: the server stores the address as a VIP.
    let first = start(manager_as(
        &cluster,
        cluster.cloud_config(),
        settings(),
        "first_1",
        &["*"],
    ));
    eventually("web's ingress", || async {
        has_ingress(&services.get("web").await.unwrap())
    })
    .await;
    assert_eq!(ip_modes(&cluster, "web").await, [Some("VIP".to_owned())]);
    first.stop().await;

    // The next manager ensures it again, finds the status as the server keeps it, and writes none.
    let second = manager_as(&cluster, cluster.cloud_config(), settings(), "second_1", &["*"]);
    let metrics = second.metrics();
    let second = start(second);
    ensured_by(&cluster, "second_1").await;
    // A sync is counted once it is done, status write and all.
    eventually("web's sync done", || async {
        sample(
            &metrics,
            "controller_reconciles_total{controller=\"service-lb-controller\",result=\"success\"}",
        ) >= 1.0
    })
    .await;
    second.stop().await;
    let writes = service_writes(&cluster.server.requests())
        .into_iter()
        .filter(|(writer, _)| writer == "second_1")
        .count();
    assert_eq!(writes, 0, "the second manager wrote web again");

    // A provider that gives Proxy: stored as given.
    let proxy = FakeCloudConfig {
        load_balancer_ip_mode: Some("Proxy".to_owned()),
        ..cluster.cloud_config()
    };
    let third = start(manager_as(&cluster, proxy.clone(), settings(), "third_1", &["*"]));
    eventually("web's address in Proxy mode", || async {
        ip_modes(&cluster, "web").await == [Some("Proxy".to_owned())]
    })
    .await;
    third.stop().await;

    // A server that drops the field (before Kubernetes 1.30): learnt from the answer, and warned about.
    let Some(test) = cluster.server.as_test() else {
        return;
    };
    test.set_load_balancer_ip_mode(false);
    services
        .create(&PostParams::default(), &load_balancer("old", None))
        .await
        .unwrap();
    let fourth = start(manager_as(&cluster, proxy, settings(), "fourth_1", &["*"]));
    // (web may be warned about too, once its address is written again without the mode.)
    events_when(&cluster, "LoadBalancerIPModeUnsupported", |events| {
        events
            .iter()
            .any(|e| e.involved_object.name.as_deref() == Some("old"))
    })
    .await;
    assert_eq!(ip_modes(&cluster, "old").await, [None]);
    fourth.stop().await;
}

control_plane::on_both_backends!(
    two_managers_serving_different_classes_never_write_each_others_services,
    ip_modes_are_stored_as_given_and_a_defaulted_one_is_not_written_again,
);
