//! Dual-stack load balancers on the fake cloud, on both API servers (each a dual-stack cluster, IPv4
//! first): a service's load balancer serves each family of `spec.ipFamilies`, its addresses published in
//! that order; a cloud that cannot serve IPv6 gets the service an IPv4 load balancer and the Event
//! `IPFamiliesNotServed`, a Warning when dual stack is required.

mod support;

use k8s_openapi::api::core::v1::{Event, Service};
use kube::api::{Api, PostParams};
use kube_ccm_fake::{FakeCloudConfig, FakeInstance};
use serde_json::json;

use support::*;

fn load_balancer(name: &str, families: serde_json::Value) -> Service {
    let mut spec = json!({"type": "LoadBalancer", "ports": [{"port": 80}]});
    json_patch::merge(&mut spec, &families);
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

/// The service's published addresses, once it has any.
async fn addresses(services: &Api<Service>, name: &str) -> Option<Vec<String>> {
    let service = services.get(name).await.ok()?;
    let ingress = service.status?.load_balancer?.ingress?;
    let ips: Vec<String> = ingress.into_iter().filter_map(|i| i.ip).collect();
    (!ips.is_empty()).then_some(ips)
}

async fn served(services: &Api<Service>, name: &str, count: usize) -> Vec<String> {
    eventually(&format!("{name}'s addresses"), || async {
        addresses(services, name)
            .await
            .is_some_and(|ips| ips.len() == count)
    })
    .await;
    addresses(services, name).await.unwrap()
}

fn is_ipv6(ip: &str) -> bool {
    ip.parse::<std::net::Ipv6Addr>().is_ok()
}

fn about<'a>(events: &'a [Event], service: &str) -> Vec<&'a Event> {
    events
        .iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(service))
        .collect()
}

async fn each_family_of_the_service_is_served_in_its_order(backend: Backend) {
    let cluster = Cluster::start(backend, vec![FakeInstance::running("n1", 1)]).await;
    let nodes = cluster.nodes();
    nodes
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap();
    let running = start(manager(&cluster, cluster.cloud_config(), settings()));
    let services = cluster.services();
    for service in [
        load_balancer("single", json!({})),
        load_balancer("dual", json!({"ipFamilyPolicy": "RequireDualStack"})),
        load_balancer(
            "six-first",
            json!({"ipFamilyPolicy": "PreferDualStack", "ipFamilies": ["IPv6", "IPv4"]}),
        ),
        load_balancer(
            "six",
            json!({"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv6"]}),
        ),
    ] {
        services.create(&PostParams::default(), &service).await.unwrap();
    }
    let single = served(&services, "single", 1).await;
    assert!(!is_ipv6(&single[0]), "{single:?}");
    let dual = served(&services, "dual", 2).await;
    assert_eq!((is_ipv6(&dual[0]), is_ipv6(&dual[1])), (false, true), "{dual:?}");
    let six_first = served(&services, "six-first", 2).await;
    assert_eq!(
        (is_ipv6(&six_first[0]), is_ipv6(&six_first[1])),
        (true, false),
        "{six_first:?}"
    );
    let six = served(&services, "six", 1).await;
    assert!(is_ipv6(&six[0]), "{six:?}");
    // The server kept what was written: each address a VIP.
    let stored = services.get("dual").await.unwrap();
    let modes: Vec<Option<String>> = stored
        .status
        .unwrap()
        .load_balancer
        .unwrap()
        .ingress
        .unwrap()
        .into_iter()
        .map(|i| i.ip_mode)
        .collect();
    assert_eq!(modes, [Some("VIP".to_owned()), Some("VIP".to_owned())]);
    // The family check comes before EnsuredLoadBalancer: once every service has that, none had this.
    events_when(&cluster, "EnsuredLoadBalancer", |events| events.len() >= 4).await;
    assert!(events(&cluster, "IPFamiliesNotServed").await.is_empty());
    running.stop().await;
}

control_plane::on_both_backends!(each_family_of_the_service_is_served_in_its_order);

async fn a_cloud_without_ipv6_serves_ipv4_and_says_so(backend: Backend) {
    let cluster = Cluster::start(backend, vec![FakeInstance::running("n1", 1)]).await;
    cluster
        .nodes()
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap();
    let config = FakeCloudConfig {
        load_balancer_ipv6: false,
        ..cluster.cloud_config()
    };
    let running = start(manager(&cluster, config, settings()));
    let services = cluster.services();
    for service in [
        load_balancer("required", json!({"ipFamilyPolicy": "RequireDualStack"})),
        load_balancer("preferred", json!({"ipFamilyPolicy": "PreferDualStack"})),
        load_balancer("single", json!({})),
        load_balancer(
            "six",
            json!({"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv6"]}),
        ),
    ] {
        services.create(&PostParams::default(), &service).await.unwrap();
    }
    // Each served on what the cloud has, IPv6 alone included.
    for name in ["required", "preferred", "single", "six"] {
        let ips = served(&services, name, 1).await;
        assert!(!is_ipv6(&ips[0]), "{name}: {ips:?}");
    }
    let events = events_when(&cluster, "IPFamiliesNotServed", |events| {
        ["required", "preferred", "six"]
            .iter()
            .all(|name| !about(events, name).is_empty())
    })
    .await;
    assert_eq!(about(&events, "six")[0].type_.as_deref(), Some("Warning"));
    let required = about(&events, "required")[0];
    assert_eq!(required.type_.as_deref(), Some("Warning"));
    assert_eq!(
        required.message.as_deref(),
        Some(
            "The load balancer does not serve every IP family of the service (IPv4, IPv6): this fake cloud's load balancers serve IPv4 only (loadBalancerIPv6: false)"
        )
    );
    assert_eq!(about(&events, "preferred")[0].type_.as_deref(), Some("Normal"));
    assert!(about(&events, "single").is_empty(), "{events:#?}");
    running.stop().await;
}

control_plane::on_both_backends!(a_cloud_without_ipv6_serves_ipv4_and_says_so);
