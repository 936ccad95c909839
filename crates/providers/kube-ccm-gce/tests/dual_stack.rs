//! Dual-stack load balancers against the Compute test double: an internal load balancer gains an IPv6
//! forwarding rule `<lb>-ipv6` (as ingress-gce makes it) in a subnet with an internal IPv6 range, kept in
//! step and taken down before the backend service both rules use; a subnet without one is an error only
//! for a service that insists; the external load balancer (target pools) stays IPv4 and says why.

use std::sync::Arc;
use std::time::Duration;

use compute_double::{Collection, ComputeDouble};
use google_cloud_compute_v1::model;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use kube_ccm_gce::{CloudConfig, GceProvider};
use kube_ccm_provider::{CallContext, LoadBalancer};

const PROJECT: &str = "test-project";
const ZONE: &str = "us-central1-a";
const REGION: &str = "us-central1";
const CLUSTER: &str = "c1d2e3f4a5b6c7d8";
const UID: &str = "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9";
const LB: &str = "a0a1b2c3d4e5f60718293a4b5c6d7e8f";
const LB_IPV6: &str = "a0a1b2c3d4e5f60718293a4b5c6d7e8f-ipv6";
const RANGE: &str = "fd20:a1b:2c3d:0:0:0:0:0/64";

fn cx() -> CallContext {
    CallContext::with_timeout(Duration::from_secs(30))
}

/// Two nodes, and the subnet `nodes` of the cloud-config: with an internal IPv6 range when `ipv6`.
async fn setup(ipv6: bool) -> (ComputeDouble, GceProvider, Vec<Arc<Node>>) {
    let double = ComputeDouble::start().await.unwrap();
    let subnet: model::Subnetwork = serde_json::from_value(if ipv6 {
        serde_json::json!({"name": "nodes", "ipCidrRange": "10.0.0.0/20", "stackType": "IPV4_IPV6",
            "ipv6AccessType": "INTERNAL", "internalIpv6Prefix": RANGE})
    } else {
        serde_json::json!({"name": "nodes", "ipCidrRange": "10.0.0.0/20", "stackType": "IPV4_ONLY"})
    })
    .unwrap();
    double.put(
        Collection::Subnetworks,
        PROJECT,
        &format!("regions/{REGION}"),
        subnet,
    );
    let mut nodes = Vec::new();
    for i in 1..=2 {
        let name = format!("gke-pool-{i}");
        let instance: model::Instance = serde_json::from_value(serde_json::json!({
            "name": name, "networkInterfaces": [{"networkIP": format!("10.0.0.{i}")}],
        }))
        .unwrap();
        double.put_instance(PROJECT, ZONE, instance);
        nodes.push(Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "spec": {"providerID": format!("gce://{PROJECT}/{ZONE}/{name}")},
            }))
            .unwrap(),
        ));
    }
    let text = format!(
        "[global]\nproject-id = {PROJECT}\nlocal-zone = {ZONE}\nnetwork-name = default\nsubnetwork-name = nodes\nnode-tags = cluster-node\napi-endpoint = {}\n",
        double.endpoint()
    );
    let provider = GceProvider::new(CloudConfig::parse(&text).unwrap().config)
        .await
        .unwrap();
    provider.set_cluster_id(CLUSTER);
    (double, provider, nodes)
}

/// `shop/db` with `families` and `policy`, internal unless `external`.
fn db(families: &[&str], policy: &str, external: bool, extra: serde_json::Value) -> Service {
    let annotations = if external {
        serde_json::json!({})
    } else {
        serde_json::json!({"networking.gke.io/load-balancer-type": "Internal"})
    };
    let mut spec = serde_json::json!({"type": "LoadBalancer", "ports": [{"port": 5432, "nodePort": 30432}],
        "ipFamilies": families, "ipFamilyPolicy": policy});
    for (key, value) in extra.as_object().unwrap() {
        spec[key] = value.clone();
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db", "namespace": "shop", "uid": UID, "annotations": annotations},
        "spec": spec,
    }))
    .unwrap()
}

fn ips(status: &LoadBalancerStatus) -> Vec<String> {
    let ingress = status.ingress.clone().unwrap_or_default();
    assert!(
        ingress.iter().all(|i| i.ip_mode.as_deref() == Some("VIP")),
        "{ingress:?}"
    );
    ingress.into_iter().map(|i| i.ip.unwrap()).collect()
}

fn rule(double: &ComputeDouble, name: &str) -> Option<model::ForwardingRule> {
    double
        .forwarding_rules(PROJECT)
        .into_iter()
        .find(|r| r.name.as_deref() == Some(name))
}

fn firewall(double: &ComputeDouble, name: &str) -> Option<model::Firewall> {
    double
        .firewalls(PROJECT)
        .into_iter()
        .find(|f| f.name.as_deref() == Some(name))
}

fn writes(double: &ComputeDouble) -> usize {
    double
        .requests()
        .iter()
        .filter(|r| !r.starts_with("GET ") && !r.contains("/listInstances"))
        .count()
}

#[tokio::test]
async fn a_dual_stack_internal_load_balancer_has_an_ipv6_rule_kept_in_step_and_deleted_first() {
    let (double, provider, nodes) = setup(true).await;
    let service = db(
        &["IPv4", "IPv6"],
        "RequireDualStack",
        false,
        serde_json::json!({}),
    );
    provider.check_ip_families(&service).unwrap();
    let status = provider
        .ensure_load_balancer(&cx(), "k", &service, &nodes)
        .await
        .unwrap();
    let [v4, v6] = <[String; 2]>::try_from(ips(&status)).unwrap();
    assert!(v4.starts_with("10.128."), "{v4}");
    let address: std::net::Ipv6Addr = v6.parse().expect("an address, without the /96");
    assert_eq!(
        address.segments()[..4],
        [0xfd20, 0xa1b, 0x2c3d, 0],
        "from the subnet's range: {v6}"
    );

    let ipv4_rule = rule(&double, LB).unwrap();
    let ipv6_rule = rule(&double, LB_IPV6).unwrap();
    assert_eq!(ipv6_rule.ip_version.as_ref().and_then(|v| v.name()), Some("IPV6"));
    assert_eq!(ipv6_rule.ip_address.as_deref(), Some(format!("{v6}/96").as_str()));
    assert_eq!(
        ipv6_rule.load_balancing_scheme.as_ref().and_then(|s| s.name()),
        Some("INTERNAL")
    );
    assert_eq!(
        ipv6_rule.backend_service, ipv4_rule.backend_service,
        "one backend service"
    );
    assert_eq!(ipv6_rule.subnetwork, ipv4_rule.subnetwork);
    assert_eq!(ipv6_rule.ports, ["5432"]);
    let clients = firewall(&double, &format!("k8s-fw-{LB_IPV6}")).unwrap();
    assert_eq!(clients.source_ranges, ["::/0"]);
    assert_eq!(clients.destination_ranges, std::slice::from_ref(&v6));
    assert_eq!(clients.target_tags, ["cluster-node"]);
    let checks = firewall(&double, &format!("k8s-{CLUSTER}-node-hc-ipv6")).unwrap();
    assert_eq!(checks.source_ranges, ["2600:2d00:1:b029::/64"]);
    assert_eq!(checks.allowed[0].ports, ["10256"]);
    let ipv4_clients = firewall(&double, &format!("k8s-fw-{LB}")).unwrap();
    assert_eq!(
        ipv4_clients.source_ranges,
        ["0.0.0.0/0"],
        "the IPv4 firewall is as before"
    );

    // Steady: nothing written; the status as the provider reads it, in the service's order.
    let before = writes(&double);
    let again = provider
        .ensure_load_balancer(&cx(), "k", &service, &nodes)
        .await
        .unwrap();
    assert_eq!(ips(&again), [v4.clone(), v6.clone()]);
    assert_eq!(writes(&double), before, "{:?}", double.requests());
    let reversed = db(
        &["IPv6", "IPv4"],
        "RequireDualStack",
        false,
        serde_json::json!({}),
    );
    let read = provider
        .get_load_balancer(&cx(), "k", &reversed)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ips(&read), [v6.clone(), v4.clone()]);

    // IPv6 clients only from the IPv6 ranges given; none given, none let in.
    let ranged = db(
        &["IPv4", "IPv6"],
        "RequireDualStack",
        false,
        serde_json::json!({"loadBalancerSourceRanges": ["10.1.0.0/16", "fd00:1::/64"]}),
    );
    provider
        .ensure_load_balancer(&cx(), "k", &ranged, &nodes)
        .await
        .unwrap();
    assert_eq!(
        firewall(&double, &format!("k8s-fw-{LB_IPV6}"))
            .unwrap()
            .source_ranges,
        ["fd00:1::/64"]
    );
    // Each firewall holds one family.
    let ipv4_firewall = firewall(&double, &format!("k8s-fw-{LB}")).unwrap();
    assert_eq!(ipv4_firewall.source_ranges, ["10.1.0.0/16"]);
    let v4_only = db(
        &["IPv4", "IPv6"],
        "RequireDualStack",
        false,
        serde_json::json!({"loadBalancerSourceRanges": ["10.1.0.0/16"]}),
    );
    provider
        .ensure_load_balancer(&cx(), "k", &v4_only, &nodes)
        .await
        .unwrap();
    assert!(firewall(&double, &format!("k8s-fw-{LB_IPV6}")).is_none());
    let before = writes(&double);
    provider
        .ensure_load_balancer(&cx(), "k", &v4_only, &nodes)
        .await
        .unwrap();
    assert_eq!(writes(&double), before, "steady without the IPv6 firewall too");

    // A change of the IPv4 address alone leaves the IPv6 rule as it is.
    let ipv6_id = rule(&double, LB_IPV6).unwrap().id;
    let moved = db(
        &["IPv4", "IPv6"],
        "RequireDualStack",
        false,
        serde_json::json!({"loadBalancerIP": "10.128.9.9"}),
    );
    let status = provider
        .ensure_load_balancer(&cx(), "k", &moved, &nodes)
        .await
        .unwrap();
    assert_eq!(ips(&status), ["10.128.9.9".to_owned(), v6.clone()]);
    assert_eq!(rule(&double, LB_IPV6).unwrap().id, ipv6_id, "not made again");

    // A change both rules share (the protocol) makes both again; the IPv6 one keeps its address.
    let udp = db(
        &["IPv4", "IPv6"],
        "RequireDualStack",
        false,
        serde_json::json!({"ports": [{"port": 5432, "nodePort": 30432, "protocol": "UDP"}]}),
    );
    let status = provider
        .ensure_load_balancer(&cx(), "k", &udp, &nodes)
        .await
        .unwrap();
    assert_eq!(ips(&status)[1], v6);
    let remade = rule(&double, LB_IPV6).unwrap();
    assert_eq!(remade.ip_protocol.as_ref().and_then(|p| p.name()), Some("UDP"));
    assert_ne!(remade.id, ipv6_id, "made again");
    assert_eq!(
        remade.ip_address,
        Some(format!("{v6}/96")),
        "the kept address, as Compute writes it"
    );

    // IPv6 dropped: its rule and firewall go, the IPv4 rule stays.
    let single = db(&["IPv4"], "SingleStack", false, serde_json::json!({}));
    let status = provider
        .ensure_load_balancer(&cx(), "k", &single, &nodes)
        .await
        .unwrap();
    assert_eq!(ips(&status).len(), 1);
    assert!(rule(&double, LB_IPV6).is_none() && rule(&double, LB).is_some());
    assert!(firewall(&double, &format!("k8s-fw-{LB_IPV6}")).is_none());

    // Deleted whole: the IPv6 rule goes before the backend service, which would otherwise stay in use.
    provider
        .ensure_load_balancer(&cx(), "k", &service, &nodes)
        .await
        .unwrap();
    assert!(rule(&double, LB_IPV6).is_some());
    provider
        .ensure_load_balancer_deleted(&cx(), "k", &service)
        .await
        .unwrap();
    assert!(double.forwarding_rules(PROJECT).is_empty());
    assert!(double.backend_services(PROJECT).is_empty(), "backend services");
    assert!(double.health_checks(PROJECT).is_empty(), "health checks");
    let left: Vec<_> = double
        .firewalls(PROJECT)
        .into_iter()
        .filter_map(|f| f.name)
        .collect();
    assert!(left.is_empty(), "firewalls left: {left:?}");
    assert!(
        provider
            .get_load_balancer(&cx(), "k", &service)
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn a_subnet_without_an_ipv6_range_refuses_only_a_service_that_insists() {
    let (double, provider, nodes) = setup(false).await;
    let preferred = db(&["IPv4", "IPv6"], "PreferDualStack", false, serde_json::json!({}));
    let status = provider
        .ensure_load_balancer(&cx(), "k", &preferred, &nodes)
        .await
        .unwrap();
    assert_eq!(ips(&status).len(), 1, "IPv4 only");
    assert!(rule(&double, LB_IPV6).is_none());

    for (families, policy) in [
        (&["IPv4", "IPv6"][..], "RequireDualStack"),
        (&["IPv6"][..], "SingleStack"),
    ] {
        let insisting = db(families, policy, false, serde_json::json!({}));
        let error = provider
            .ensure_load_balancer(&cx(), "k", &insisting, &nodes)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("subnetworks/nodes has no internal IPv6 range")
                && error.contains("networking.gke.io/internal-load-balancer-subnet"),
            "{error}"
        );
        // The IPv4 load balancer is there, serving what it can.
        assert!(rule(&double, LB).is_some() && rule(&double, LB_IPV6).is_none());
    }
}

#[tokio::test]
async fn the_external_load_balancer_stays_ipv4_and_says_why() {
    let (double, provider, nodes) = setup(true).await;
    let service = db(&["IPv4", "IPv6"], "RequireDualStack", true, serde_json::json!({}));
    let why = provider.check_ip_families(&service).unwrap_err().to_string();
    assert!(
        why.contains("target pool") && why.contains("cloud.google.com/l4-rbs"),
        "{why}"
    );
    let status = provider
        .ensure_load_balancer(&cx(), "k", &service, &nodes)
        .await
        .unwrap();
    assert_eq!(ips(&status).len(), 1);
    assert_eq!(double.forwarding_rules(PROJECT).len(), 1);
}

/// IPv6 added to a load balancer, its rule's or its first firewall's write failed: the next ensure finishes it, and
/// a delete whose first step fails is finished by the next, leaving nothing (the IPv6 rule never keeps
/// the backend service in use).
#[tokio::test]
async fn an_ipv6_step_that_fails_is_finished_by_the_next_ensure_and_a_delete_leaks_nothing() {
    let single = db(&["IPv4"], "SingleStack", false, serde_json::json!({}));
    let dual = db(
        &["IPv4", "IPv6"],
        "RequireDualStack",
        false,
        serde_json::json!({}),
    );
    for step in ["/forwardingRules", "/global/firewalls"] {
        let (double, provider, nodes) = setup(true).await;
        double.set_operation_polls(0);
        provider
            .ensure_load_balancer(&cx(), "k", &single, &nodes)
            .await
            .unwrap();
        double.fail_operations(step, 500, "INTERNAL_ERROR", 1);
        let failed = provider
            .ensure_load_balancer(&cx(), "k", &dual, &nodes)
            .await
            .unwrap_err();
        assert!(failed.to_string().contains("INTERNAL_ERROR"), "{step}: {failed}");
        let status = provider
            .ensure_load_balancer(&cx(), "k", &dual, &nodes)
            .await
            .unwrap_or_else(|e| panic!("{step}: the retry failed: {e}"));
        assert_eq!(ips(&status).len(), 2, "{step}");
        assert!(
            firewall(&double, &format!("k8s-fw-{LB_IPV6}")).is_some(),
            "{step}"
        );
        assert!(
            firewall(&double, &format!("k8s-{CLUSTER}-node-hc-ipv6")).is_some(),
            "{step}"
        );

        double.fail_operations("/forwardingRules", 500, "INTERNAL_ERROR", 1);
        provider
            .ensure_load_balancer_deleted(&cx(), "k", &dual)
            .await
            .unwrap_err();
        provider
            .ensure_load_balancer_deleted(&cx(), "k", &dual)
            .await
            .unwrap();
        assert!(double.forwarding_rules(PROJECT).is_empty(), "{step}");
        assert!(double.backend_services(PROJECT).is_empty(), "{step}");
        let left: Vec<_> = double
            .firewalls(PROJECT)
            .into_iter()
            .filter_map(|f| f.name)
            .collect();
        assert!(left.is_empty(), "{step}: firewalls left: {left:?}");
    }
}
