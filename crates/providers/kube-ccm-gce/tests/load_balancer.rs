//! External load balancers against the Compute test double: made, corrected, adopted and deleted with
//! upstream's names and fields.

use std::sync::Arc;
use std::time::Duration;

use compute_double::{Collection, ComputeDouble};
use google_cloud_compute_v1::model;
use k8s_openapi::api::core::v1::{Node, Service};
use kube_ccm_gce::{CloudConfig, GceProvider};
use kube_ccm_provider::{CallContext, CloudError, LoadBalancer};

const PROJECT: &str = "test-project";
const ZONE: &str = "us-central1-a";
const REGION: &str = "us-central1";
const LB: &str = "a0a1b2c3d4e5f60718293a4b5c6d7e8f";

fn cx() -> CallContext {
    CallContext::with_timeout(Duration::from_secs(30))
}

async fn setup(node_tags: bool) -> (ComputeDouble, GceProvider, Vec<Arc<Node>>) {
    let double = ComputeDouble::start().await.unwrap();
    let mut nodes = Vec::new();
    for i in 1..=3 {
        let name = format!("gke-pool-{i}");
        let instance: model::Instance = serde_json::from_value(serde_json::json!({
            "name": name,
            "networkInterfaces": [{"networkIP": format!("10.0.0.{i}")}],
            "tags": {"items": ["gke-pool", "other"]},
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
    let tags = if node_tags {
        "node-tags = cluster-node\n"
    } else {
        ""
    };
    let text = format!(
        "[global]\nproject-id = {PROJECT}\nlocal-zone = {ZONE}\nnetwork-name = default\n{tags}api-endpoint = {}\n",
        double.endpoint()
    );
    let provider = GceProvider::new(CloudConfig::parse(&text).unwrap().config)
        .await
        .unwrap();
    provider.set_cluster_id("c1d2e3f4a5b6c7d8");
    (double, provider, nodes)
}

fn service(spec: serde_json::Value, uid: &str) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "shop", "uid": uid},
        "spec": spec,
    }))
    .unwrap()
}

const UID: &str = "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9";

fn writes(double: &ComputeDouble) -> Vec<String> {
    double
        .requests()
        .into_iter()
        .filter(|r| !r.starts_with("GET "))
        .collect()
}

fn ip_of(status: &k8s_openapi::api::core::v1::LoadBalancerStatus) -> String {
    let ingress = &status.ingress.as_ref().unwrap()[0];
    // A passthrough load balancer: kube-proxy may short-cut its address.
    assert_eq!(ingress.ip_mode.as_deref(), Some("VIP"));
    ingress.ip.clone().unwrap()
}

#[tokio::test]
async fn a_load_balancer_is_made_with_upstreams_names_kept_in_step_and_deleted() {
    let (double, provider, nodes) = setup(true).await;
    let web = service(
        serde_json::json!({"type": "LoadBalancer", "ports": [{"port": 80, "nodePort": 30080}, {"port": 443, "nodePort": 30443}]}),
        UID,
    );
    let status = provider
        .ensure_load_balancer(&cx(), "k", &web, &nodes)
        .await
        .unwrap();
    let ip = ip_of(&status);

    let rules = double.forwarding_rules(PROJECT);
    assert_eq!(rules.len(), 1);
    let rule = &rules[0];
    assert_eq!(rule.name.as_deref(), Some(LB));
    assert_eq!(rule.ip_address.as_deref(), Some(ip.as_str()));
    assert_eq!(rule.port_range.as_deref(), Some("80-443"));
    assert_eq!(rule.ip_protocol.as_ref().and_then(|p| p.name()), Some("TCP"));
    assert!(
        rule.target
            .as_deref()
            .unwrap()
            .ends_with(&format!("projects/{PROJECT}/regions/{REGION}/targetPools/{LB}"))
    );
    assert_eq!(
        rule.description.as_deref(),
        Some(r#"{"kubernetes.io/service-name":"shop/web"}"#)
    );

    let pools = double.target_pools(PROJECT);
    let pool = &pools[0];
    assert_eq!(pool.instances.len(), 3);
    assert!(pool.instances[0].ends_with(&format!("zones/{ZONE}/instances/gke-pool-1")));
    assert_eq!(
        pool.session_affinity.as_ref().and_then(|a| a.name()),
        Some("NONE")
    );
    assert!(pool.health_checks[0].ends_with("/global/httpHealthChecks/k8s-c1d2e3f4a5b6c7d8-node"));

    let checks = double.http_health_checks(PROJECT);
    assert_eq!(checks.len(), 1);
    assert_eq!(
        (checks[0].port, checks[0].request_path.as_deref()),
        (Some(10256), Some("/healthz"))
    );
    assert_eq!(
        (checks[0].check_interval_sec, checks[0].unhealthy_threshold),
        (Some(8), Some(3))
    );

    let firewalls = double.firewalls(PROJECT);
    let names: Vec<&str> = firewalls.iter().filter_map(|f| f.name.as_deref()).collect();
    assert_eq!(
        names,
        ["k8s-c1d2e3f4a5b6c7d8-node-http-hc", &format!("k8s-fw-{LB}")]
    );
    let clients = &firewalls[1];
    assert_eq!(clients.source_ranges, ["0.0.0.0/0"]);
    assert_eq!(clients.destination_ranges, vec![ip.clone()]);
    assert_eq!(clients.target_tags, ["cluster-node"]);
    assert_eq!(clients.allowed[0].ip_protocol.as_deref(), Some("tcp"));
    assert_eq!(clients.allowed[0].ports, ["80", "443"]);
    assert_eq!(
        clients.description.as_deref(),
        Some(
            format!(r#"{{"kubernetes.io/service-name":"shop/web", "kubernetes.io/service-ip":"{ip}"}}"#)
                .as_str()
        )
    );
    assert_eq!(
        firewalls[0].source_ranges,
        [
            "130.211.0.0/22",
            "209.85.152.0/22",
            "209.85.204.0/22",
            "35.191.0.0/16"
        ],
        "upstream's default --cloud-provider-gce-lb-src-cidrs"
    );
    assert!(
        double.addresses(PROJECT).is_empty(),
        "the temporary reservation is released"
    );

    // Again: nothing to change, nothing written.
    let before = writes(&double).len();
    let again = provider
        .ensure_load_balancer(&cx(), "k", &web, &nodes)
        .await
        .unwrap();
    assert_eq!(ip_of(&again), ip);
    assert_eq!(writes(&double)[before..], [] as [String; 0]);
    assert_eq!(
        provider.get_load_balancer(&cx(), "k", &web).await.unwrap(),
        Some(again)
    );

    // A node leaves: removed from the pool, nothing else touched.
    let before = writes(&double).len();
    provider
        .update_load_balancer(&cx(), "k", &web, &nodes[..2])
        .await
        .unwrap();
    assert_eq!(double.target_pools(PROJECT)[0].instances.len(), 2);
    assert_eq!(
        writes(&double)[before..],
        [format!(
            "POST /compute/v1/projects/{PROJECT}/regions/{REGION}/targetPools/{LB}/removeInstance"
        )]
    );

    // Session affinity changes: the pool and the rule are made again, keeping the IP.
    let sticky = service(
        serde_json::json!({"type": "LoadBalancer", "sessionAffinity": "ClientIP", "ports": [{"port": 80}, {"port": 443}]}),
        UID,
    );
    let status = provider
        .ensure_load_balancer(&cx(), "k", &sticky, &nodes)
        .await
        .unwrap();
    assert_eq!(ip_of(&status), ip);
    assert_eq!(
        double.target_pools(PROJECT)[0]
            .session_affinity
            .as_ref()
            .and_then(|a| a.name()),
        Some("CLIENT_IP")
    );
    assert!(double.addresses(PROJECT).is_empty());

    // Local traffic: the service's own health check; the shared one, unused now, goes.
    let local = service(
        serde_json::json!({"type": "LoadBalancer", "sessionAffinity": "ClientIP", "externalTrafficPolicy": "Local", "healthCheckNodePort": 31999, "ports": [{"port": 80}, {"port": 443}]}),
        UID,
    );
    provider
        .ensure_load_balancer(&cx(), "k", &local, &nodes)
        .await
        .unwrap();
    let checks = double.http_health_checks(PROJECT);
    assert_eq!(checks.len(), 1);
    assert_eq!(
        (checks[0].name.as_deref(), checks[0].port),
        (Some(LB), Some(31999))
    );
    let names: Vec<String> = double
        .firewalls(PROJECT)
        .into_iter()
        .filter_map(|f| f.name)
        .collect();
    assert_eq!(names, [format!("k8s-{LB}-http-hc"), format!("k8s-fw-{LB}")]);

    provider
        .ensure_load_balancer_deleted(&cx(), "k", &local)
        .await
        .unwrap();
    provider
        .ensure_load_balancer_deleted(&cx(), "k", &local)
        .await
        .unwrap();
    assert!(double.forwarding_rules(PROJECT).is_empty());
    assert!(double.target_pools(PROJECT).is_empty());
    assert!(double.http_health_checks(PROJECT).is_empty());
    assert!(double.firewalls(PROJECT).is_empty());
    assert_eq!(
        provider.get_load_balancer(&cx(), "k", &local).await.unwrap(),
        None
    );
}

#[tokio::test]
async fn the_shared_health_check_stays_while_another_pool_uses_it_and_tags_come_from_instances() {
    let (double, provider, nodes) = setup(false).await;
    let one = service(serde_json::json!({"ports": [{"port": 80}]}), UID);
    let two = service(
        serde_json::json!({"ports": [{"port": 53, "protocol": "UDP"}]}),
        "11111111-2222-3333-4444-555555555555",
    );
    provider
        .ensure_load_balancer(&cx(), "k", &one, &nodes)
        .await
        .unwrap();
    provider
        .ensure_load_balancer(&cx(), "k", &two, &nodes)
        .await
        .unwrap();
    let clients = double
        .firewalls(PROJECT)
        .into_iter()
        .find(|f| {
            f.name
                == Some(format!(
                    "k8s-fw-{}",
                    kube_ccm_provider::default_load_balancer_name(&two)
                ))
        })
        .unwrap();
    assert_eq!(
        clients.target_tags,
        ["gke-pool"],
        "the longest tag prefixing the instances' names"
    );
    assert_eq!(clients.allowed[0].ip_protocol.as_deref(), Some("udp"));

    provider
        .ensure_load_balancer_deleted(&cx(), "k", &one)
        .await
        .unwrap();
    let checks: Vec<String> = double
        .http_health_checks(PROJECT)
        .into_iter()
        .filter_map(|c| c.name)
        .collect();
    assert_eq!(
        checks,
        ["k8s-c1d2e3f4a5b6c7d8-node"],
        "still used by the second pool"
    );
    assert!(
        double
            .firewalls(PROJECT)
            .iter()
            .any(|f| f.name.as_deref() == Some("k8s-c1d2e3f4a5b6c7d8-node-http-hc"))
    );
    provider
        .ensure_load_balancer_deleted(&cx(), "k", &two)
        .await
        .unwrap();
    assert!(double.http_health_checks(PROJECT).is_empty());
    assert!(double.firewalls(PROJECT).is_empty());
}

#[tokio::test]
async fn an_in_tree_load_balancer_is_adopted_without_being_made_again() {
    let (double, provider, nodes) = setup(true).await;
    // What the in-tree provider made for this service before the migration.
    let link = |path: &str| format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/{path}");
    let check: model::HttpHealthCheck = serde_json::from_value(serde_json::json!({
        "name": "k8s-c1d2e3f4a5b6c7d8-node", "port": 10256, "requestPath": "/healthz",
        "description": "{\"kubernetes.io/service-name\":\"k8s-c1d2e3f4a5b6c7d8-node\"}",
        "checkIntervalSec": 8, "timeoutSec": 1, "healthyThreshold": 1, "unhealthyThreshold": 3,
    }))
    .unwrap();
    double.put(Collection::HttpHealthChecks, PROJECT, "global", check);
    let pool: model::TargetPool = serde_json::from_value(serde_json::json!({
        "name": LB, "description": "{\"kubernetes.io/service-name\":\"shop/web\"}", "sessionAffinity": "NONE",
        "instances": (1..=3).map(|i| link(&format!("zones/{ZONE}/instances/gke-pool-{i}"))).collect::<Vec<_>>(),
        "healthChecks": [link("global/httpHealthChecks/k8s-c1d2e3f4a5b6c7d8-node")],
    }))
    .unwrap();
    double.put(
        Collection::TargetPools,
        PROJECT,
        &format!("regions/{REGION}"),
        pool,
    );
    let rule: model::ForwardingRule = serde_json::from_value(serde_json::json!({
        "name": LB, "IPAddress": "35.1.2.3", "IPProtocol": "TCP", "portRange": "80-80",
        "target": link(&format!("regions/{REGION}/targetPools/{LB}")), "networkTier": "PREMIUM",
    }))
    .unwrap();
    double.put(
        Collection::ForwardingRules,
        PROJECT,
        &format!("regions/{REGION}"),
        rule,
    );

    let web = service(serde_json::json!({"ports": [{"port": 80}]}), UID);
    let status = provider
        .ensure_load_balancer(&cx(), "k", &web, &nodes)
        .await
        .unwrap();
    assert_eq!(ip_of(&status), "35.1.2.3", "the existing address is kept");
    let made: Vec<String> = writes(&double)
        .into_iter()
        .filter(|w| {
            w.contains("/targetPools") || w.contains("/forwardingRules") || w.contains("/httpHealthChecks")
        })
        .collect();
    assert_eq!(
        made,
        [] as [String; 0],
        "pool, rule and health check adopted as they were"
    );
    assert_eq!(double.forwarding_rules(PROJECT).len(), 1);
}

#[tokio::test]
async fn requested_addresses_and_other_classes() {
    let (double, provider, nodes) = setup(true).await;
    let pinned = service(
        serde_json::json!({"ports": [{"port": 80}], "loadBalancerIP": "35.9.9.9"}),
        UID,
    );
    let error = provider
        .ensure_load_balancer(&cx(), "k", &pinned, &nodes)
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("requested ip \"35.9.9.9\" is neither static nor assigned"),
        "{error}"
    );

    let reserved: model::Address =
        serde_json::from_value(serde_json::json!({"name": "my-ip", "address": "35.9.9.9"})).unwrap();
    double.put(
        Collection::Addresses,
        PROJECT,
        &format!("regions/{REGION}"),
        reserved,
    );
    let status = provider
        .ensure_load_balancer(&cx(), "k", &pinned, &nodes)
        .await
        .unwrap();
    assert_eq!(ip_of(&status), "35.9.9.9");
    provider
        .ensure_load_balancer_deleted(&cx(), "k", &pinned)
        .await
        .unwrap();
    let left: Vec<String> = double
        .addresses(PROJECT)
        .into_iter()
        .filter_map(|a| a.name)
        .collect();
    assert_eq!(left, ["my-ip"], "the user's address is theirs");

    let other = service(
        serde_json::json!({"ports": [{"port": 80}], "loadBalancerClass": "example.com/lb"}),
        UID,
    );
    assert!(matches!(
        provider.ensure_load_balancer(&cx(), "k", &other, &nodes).await,
        Err(CloudError::ImplementedElsewhere)
    ));
    assert!(double.forwarding_rules(PROJECT).is_empty());
}

/// A write failing at any step of a first `ensure` (its operation done with an error, its effect not
/// applied) leaves what was made before it; the next `ensure` finishes the load balancer without making
/// anything twice or leaving the temporary address reserved, and deleting it leaves nothing.
#[tokio::test]
async fn an_ensure_that_fails_at_any_step_is_finished_by_the_next_and_leaks_nothing() {
    // The paths of the writes in the order ensure makes them (an address insert's path has no name
    // after `/addresses`).
    for step in [
        "/regions/us-central1/addresses",
        "/global/firewalls",
        "/global/httpHealthChecks",
        "/regions/us-central1/targetPools",
        "/regions/us-central1/forwardingRules",
    ] {
        let (double, provider, nodes) = setup(true).await;
        let web = service(
            serde_json::json!({"type": "LoadBalancer", "ports": [{"port": 80, "nodePort": 30080}]}),
            UID,
        );
        double.fail_operations(step, 500, "INTERNAL_ERROR", 1);
        let failed = provider
            .ensure_load_balancer(&cx(), "k", &web, &nodes)
            .await
            .unwrap_err();
        assert!(failed.to_string().contains("INTERNAL_ERROR"), "{step}: {failed}");
        let status = provider
            .ensure_load_balancer(&cx(), "k", &web, &nodes)
            .await
            .unwrap_or_else(|e| panic!("{step}: the retry failed: {e}"));
        let ip = ip_of(&status);
        let rules = double.forwarding_rules(PROJECT);
        assert_eq!(rules.len(), 1, "{step}");
        assert_eq!(rules[0].ip_address.as_deref(), Some(ip.as_str()), "{step}");
        assert_eq!(double.target_pools(PROJECT).len(), 1, "{step}");
        assert_eq!(double.target_pools(PROJECT)[0].instances.len(), 3, "{step}");
        assert_eq!(double.http_health_checks(PROJECT).len(), 1, "{step}");
        assert_eq!(double.firewalls(PROJECT).len(), 2, "{step}");
        assert!(
            double.addresses(PROJECT).is_empty(),
            "{step}: the temporary address stayed reserved: {:?}",
            double.addresses(PROJECT)
        );
        // Once made, an ensure with nothing to change writes nothing.
        let before = writes(&double).len();
        provider
            .ensure_load_balancer(&cx(), "k", &web, &nodes)
            .await
            .unwrap();
        assert_eq!(
            writes(&double).len(),
            before,
            "{step}: {:?}",
            &writes(&double)[before..]
        );

        provider
            .ensure_load_balancer_deleted(&cx(), "k", &web)
            .await
            .unwrap();
        assert!(double.forwarding_rules(PROJECT).is_empty(), "{step}");
        assert!(double.target_pools(PROJECT).is_empty(), "{step}");
        assert!(double.http_health_checks(PROJECT).is_empty(), "{step}");
        assert!(double.firewalls(PROJECT).is_empty(), "{step}");
        assert!(double.addresses(PROJECT).is_empty(), "{step}");
    }
}

/// Releasing the temporary address fails after the rule took its IP: as upstream, the address stays
/// reserved while the load balancer lives (a later ensure does not release an address it did not
/// reserve itself), and deleting the load balancer releases it.
#[tokio::test]
async fn a_temporary_address_left_reserved_goes_with_the_load_balancer() {
    let (double, provider, nodes) = setup(true).await;
    let web = service(
        serde_json::json!({"type": "LoadBalancer", "ports": [{"port": 80, "nodePort": 30080}]}),
        UID,
    );
    double.fail_operations(&format!("/addresses/{LB}"), 500, "INTERNAL_ERROR", 1);
    assert!(
        provider
            .ensure_load_balancer(&cx(), "k", &web, &nodes)
            .await
            .is_err()
    );
    let status = provider
        .ensure_load_balancer(&cx(), "k", &web, &nodes)
        .await
        .unwrap();
    let addresses = double.addresses(PROJECT);
    assert_eq!(addresses.len(), 1);
    assert_eq!(addresses[0].address, Some(ip_of(&status)));
    provider
        .ensure_load_balancer_deleted(&cx(), "k", &web)
        .await
        .unwrap();
    assert!(double.addresses(PROJECT).is_empty());
    assert!(double.forwarding_rules(PROJECT).is_empty());
}
