//! Internal load balancers against the Compute test double: made, kept in step with the nodes, corrected,
//! adopted and deleted with upstream's names and fields; every write failed in turn without a leak.

use std::sync::Arc;
use std::time::Duration;

use compute_double::{Collection, ComputeDouble};
use google_cloud_compute_v1::model;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use kube_ccm_gce::{CloudConfig, GceProvider};
use kube_ccm_provider::{CallContext, LoadBalancer};

const PROJECT: &str = "test-project";
const ZONE: &str = "us-central1-a";
const OTHER_ZONE: &str = "us-central1-b";
const REGION: &str = "us-central1";
const CLUSTER: &str = "c1d2e3f4a5b6c7d8";
const UID: &str = "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9";
const LB: &str = "a0a1b2c3d4e5f60718293a4b5c6d7e8f";
const GROUP: &str = "k8s-ig--c1d2e3f4a5b6c7d8";
const SHARED_CHECK: &str = "k8s-c1d2e3f4a5b6c7d8-node";

fn cx() -> CallContext {
    CallContext::with_timeout(Duration::from_secs(30))
}

/// Three nodes in `us-central1-a` and one in `us-central1-b` (a regional cluster), a subnet in the
/// cloud-config.
async fn setup() -> (ComputeDouble, GceProvider, Vec<Arc<Node>>) {
    setup_with("subnetwork-name = nodes\n").await
}

/// As [`setup`], with `subnet` (a cloud-config line, or nothing) naming the subnet.
async fn setup_with(subnet: &str) -> (ComputeDouble, GceProvider, Vec<Arc<Node>>) {
    let double = ComputeDouble::start().await.unwrap();
    let mut nodes = Vec::new();
    for (i, zone) in [(1, ZONE), (2, ZONE), (3, ZONE), (4, OTHER_ZONE)] {
        let name = format!("gke-pool-{i}");
        let instance: model::Instance = serde_json::from_value(serde_json::json!({
            "name": name,
            "networkInterfaces": [{"networkIP": format!("10.0.0.{i}")}],
        }))
        .unwrap();
        double.put_instance(PROJECT, zone, instance);
        nodes.push(Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "spec": {"providerID": format!("gce://{PROJECT}/{zone}/{name}")},
            }))
            .unwrap(),
        ));
    }
    let text = format!(
        "[global]\nproject-id = {PROJECT}\nlocal-zone = {ZONE}\nregional = true\nnetwork-name = default\n{subnet}node-tags = cluster-node\napi-endpoint = {}\n",
        double.endpoint()
    );
    let provider = GceProvider::new(CloudConfig::parse(&text).unwrap().config)
        .await
        .unwrap();
    provider.set_cluster_id(CLUSTER);
    (double, provider, nodes)
}

fn internal(spec: serde_json::Value, annotations: serde_json::Value, uid: &str) -> Service {
    let mut annotations = annotations;
    annotations["networking.gke.io/load-balancer-type"] = "Internal".into();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db", "namespace": "shop", "uid": uid, "annotations": annotations},
        "spec": spec,
    }))
    .unwrap()
}

fn db() -> Service {
    internal(
        serde_json::json!({"type": "LoadBalancer", "ports": [{"port": 5432, "nodePort": 30432}]}),
        serde_json::json!({}),
        UID,
    )
}

fn writes(double: &ComputeDouble) -> Vec<String> {
    double
        .requests()
        .into_iter()
        .filter(|r| !r.starts_with("GET ") && !r.contains("/listInstances"))
        .collect()
}

fn ip_of(status: &LoadBalancerStatus) -> String {
    let ingress = &status.ingress.as_ref().unwrap()[0];
    // A passthrough load balancer: kube-proxy may short-cut its address.
    assert_eq!(ingress.ip_mode.as_deref(), Some("VIP"));
    ingress.ip.clone().unwrap()
}

fn members(double: &ComputeDouble, zone: &str) -> Vec<String> {
    let mut names: Vec<String> = double
        .instance_group_members(PROJECT, zone, GROUP)
        .unwrap_or_default()
        .iter()
        .map(|l| l.rsplit('/').next().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

fn names<T>(items: Vec<T>, name: impl Fn(&T) -> Option<String>) -> Vec<String> {
    let mut names: Vec<String> = items.iter().filter_map(name).collect();
    names.sort();
    names
}

fn firewall(double: &ComputeDouble, name: &str) -> model::Firewall {
    double
        .firewalls(PROJECT)
        .into_iter()
        .find(|f| f.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no firewall {name}"))
}

fn nothing_left(double: &ComputeDouble, what: &str) {
    assert!(double.forwarding_rules(PROJECT).is_empty(), "{what}: rules");
    assert!(
        double.backend_services(PROJECT).is_empty(),
        "{what}: backend services"
    );
    assert!(double.health_checks(PROJECT).is_empty(), "{what}: health checks");
    assert!(
        double.instance_groups(PROJECT).is_empty(),
        "{what}: instance groups"
    );
    assert!(double.firewalls(PROJECT).is_empty(), "{what}: firewalls");
    assert!(double.addresses(PROJECT).is_empty(), "{what}: addresses");
}

#[tokio::test]
async fn an_internal_load_balancer_is_made_with_upstreams_names_kept_in_step_and_deleted() {
    let (double, provider, nodes) = setup().await;
    let status = provider
        .ensure_load_balancer(&cx(), "k", &db(), &nodes)
        .await
        .unwrap();
    let ip = ip_of(&status);
    assert!(ip.starts_with("10.128."), "an internal address: {ip}");

    let rules = double.forwarding_rules(PROJECT);
    assert_eq!(rules.len(), 1);
    let rule = &rules[0];
    assert_eq!(rule.name.as_deref(), Some(LB));
    assert_eq!(rule.ip_address.as_deref(), Some(ip.as_str()));
    assert_eq!(
        rule.load_balancing_scheme.as_ref().and_then(|s| s.name()),
        Some("INTERNAL")
    );
    assert_eq!(rule.ip_protocol.as_ref().and_then(|p| p.name()), Some("TCP"));
    assert_eq!(rule.ports, ["5432"]);
    assert!(rule.port_range.is_none() && rule.all_ports.is_none() && rule.allow_global_access.is_none());
    assert!(rule.backend_service.as_deref().unwrap().ends_with(&format!(
        "projects/{PROJECT}/regions/{REGION}/backendServices/{LB}"
    )));
    assert!(
        rule.subnetwork
            .as_deref()
            .unwrap()
            .ends_with(&format!("projects/{PROJECT}/regions/{REGION}/subnetworks/nodes"))
    );
    assert!(
        rule.network
            .as_deref()
            .unwrap()
            .ends_with("global/networks/default")
    );
    assert_eq!(
        rule.description.as_deref(),
        Some(r#"{"kubernetes.io/service-name":"shop/db"}"#)
    );

    let backends = double.backend_services(PROJECT);
    assert_eq!(backends.len(), 1);
    let backend = &backends[0];
    assert_eq!(backend.name.as_deref(), Some(LB));
    assert_eq!(
        backend.load_balancing_scheme.as_ref().and_then(|s| s.name()),
        Some("INTERNAL")
    );
    assert_eq!(backend.protocol.as_ref().and_then(|p| p.name()), Some("TCP"));
    assert_eq!(
        backend.session_affinity.as_ref().and_then(|a| a.name()),
        Some("NONE")
    );
    assert!(backend.health_checks[0].ends_with(&format!("global/healthChecks/{SHARED_CHECK}")));
    let mut groups: Vec<&str> = backend
        .backends
        .iter()
        .filter_map(|b| b.group.as_deref())
        .collect();
    groups.sort();
    assert_eq!(groups.len(), 2, "one group per zone: {groups:?}");
    assert!(groups[0].ends_with(&format!("zones/{ZONE}/instanceGroups/{GROUP}")));
    assert!(groups[1].ends_with(&format!("zones/{OTHER_ZONE}/instanceGroups/{GROUP}")));
    assert_eq!(members(&double, ZONE), ["gke-pool-1", "gke-pool-2", "gke-pool-3"]);
    assert_eq!(members(&double, OTHER_ZONE), ["gke-pool-4"]);

    let checks = double.health_checks(PROJECT);
    assert_eq!(checks.len(), 1);
    let check = &checks[0];
    assert_eq!(check.name.as_deref(), Some(SHARED_CHECK));
    assert_eq!(check.r#type.as_ref().and_then(|t| t.name()), Some("HTTP"));
    let http = check.http_health_check.as_ref().unwrap();
    assert_eq!(
        (http.port, http.request_path.as_deref()),
        (Some(10256), Some("/healthz"))
    );
    assert_eq!(
        (
            check.check_interval_sec,
            check.timeout_sec,
            check.healthy_threshold,
            check.unhealthy_threshold
        ),
        (Some(8), Some(1), Some(1), Some(3))
    );

    let clients = firewall(&double, &format!("k8s-fw-{LB}"));
    assert_eq!(clients.source_ranges, ["0.0.0.0/0"]);
    assert_eq!(clients.destination_ranges, [ip.as_str()]);
    assert_eq!(clients.target_tags, ["cluster-node"]);
    assert_eq!(clients.allowed[0].ip_protocol.as_deref(), Some("tcp"));
    assert_eq!(clients.allowed[0].ports, ["5432"]);
    let checkers = firewall(&double, &format!("{SHARED_CHECK}-hc"));
    assert_eq!(
        checkers.source_ranges,
        [
            "130.211.0.0/22",
            "209.85.152.0/22",
            "209.85.204.0/22",
            "35.191.0.0/16"
        ]
    );
    assert!(checkers.destination_ranges.is_empty());
    assert_eq!(checkers.allowed[0].ports, ["10256"]);
    assert!(
        double.addresses(PROJECT).is_empty(),
        "the temporary address is released"
    );

    // Again: nothing to change, nothing written.
    let before = writes(&double).len();
    provider
        .ensure_load_balancer(&cx(), "k", &db(), &nodes)
        .await
        .unwrap();
    assert_eq!(writes(&double)[before..], [] as [String; 0]);

    // A node leaves: only the group changes.
    let before = writes(&double).len();
    provider
        .update_load_balancer(&cx(), "k", &db(), &nodes[1..])
        .await
        .unwrap();
    assert_eq!(members(&double, ZONE), ["gke-pool-2", "gke-pool-3"]);
    let changed = writes(&double)[before..].to_vec();
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert!(
        changed[0].ends_with(&format!("/instanceGroups/{GROUP}/removeInstances")),
        "{changed:?}"
    );
    // Every node of a zone leaves: its group stays (upstream keeps it), out of the backend service.
    let no_other_zone: Vec<Arc<Node>> = nodes[..3].to_vec();
    provider
        .update_load_balancer(&cx(), "k", &db(), &no_other_zone)
        .await
        .unwrap();
    let backend = &double.backend_services(PROJECT)[0];
    assert_eq!(backend.backends.len(), 1);

    // Another port and global access: the rule is made again, on the same IP.
    let changed = internal(
        serde_json::json!({"type": "LoadBalancer", "ports": [{"port": 5432}, {"port": 5433}]}),
        serde_json::json!({"networking.gke.io/internal-load-balancer-allow-global-access": "true"}),
        UID,
    );
    let status = provider
        .ensure_load_balancer(&cx(), "k", &changed, &nodes)
        .await
        .unwrap();
    assert_eq!(ip_of(&status), ip, "the IP is kept");
    let rule = &double.forwarding_rules(PROJECT)[0];
    assert_eq!(rule.ports, ["5432", "5433"]);
    assert_eq!(rule.allow_global_access, Some(true));
    assert_eq!(
        firewall(&double, &format!("k8s-fw-{LB}")).allowed[0].ports,
        ["5432-5433"]
    );
    assert!(double.addresses(PROJECT).is_empty());

    provider
        .ensure_load_balancer_deleted(&cx(), "k", &changed)
        .await
        .unwrap();
    nothing_left(&double, "deleted");
    // Deleting again is done.
    provider
        .ensure_load_balancer_deleted(&cx(), "k", &changed)
        .await
        .unwrap();
}

/// Local traffic: the service's own health check on its node port; more than five ports: every port;
/// a requested IP and a subnet by annotation; shared pieces stay while another load balancer uses them.
#[tokio::test]
async fn local_traffic_all_ports_a_requested_ip_and_shared_pieces() {
    let (double, provider, nodes) = setup().await;
    let local = internal(
        serde_json::json!({
            "type": "LoadBalancer", "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000,
            "ports": (1..=6).map(|n| serde_json::json!({"port": 9000 + n, "protocol": "UDP"})).collect::<Vec<_>>(),
            "loadBalancerIP": "10.130.0.7",
        }),
        serde_json::json!({"networking.gke.io/internal-load-balancer-subnet": "ilb"}),
        UID,
    );
    let status = provider
        .ensure_load_balancer(&cx(), "k", &local, &nodes)
        .await
        .unwrap();
    assert_eq!(ip_of(&status), "10.130.0.7");
    let rule = &double.forwarding_rules(PROJECT)[0];
    assert_eq!(rule.all_ports, Some(true));
    assert!(rule.ports.is_empty());
    assert_eq!(rule.ip_protocol.as_ref().and_then(|p| p.name()), Some("UDP"));
    assert!(rule.subnetwork.as_deref().unwrap().ends_with("/subnetworks/ilb"));
    let check = &double.health_checks(PROJECT)[0];
    assert_eq!(check.name.as_deref(), Some(LB));
    assert_eq!(check.http_health_check.as_ref().unwrap().port, Some(31000));
    assert_eq!(
        check.description.as_deref(),
        Some(r#"{"kubernetes.io/service-name":"shop/db"}"#)
    );
    firewall(&double, &format!("{LB}-hc"));
    assert!(double.addresses(PROJECT).is_empty());

    // A second internal service: the shared health check and the groups; deleting the first keeps them.
    let other_uid = "1a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9";
    let other = internal(
        serde_json::json!({"type": "LoadBalancer", "ports": [{"port": 80}]}),
        serde_json::json!({}),
        other_uid,
    );
    let third = internal(
        serde_json::json!({"type": "LoadBalancer", "ports": [{"port": 81}]}),
        serde_json::json!({}),
        "2a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9",
    );
    for service in [&other, &third] {
        provider
            .ensure_load_balancer(&cx(), "k", service, &nodes)
            .await
            .unwrap();
    }
    provider
        .ensure_load_balancer_deleted(&cx(), "k", &local)
        .await
        .unwrap();
    assert_eq!(
        names(double.health_checks(PROJECT), |c| c.name.clone()),
        [SHARED_CHECK]
    );
    provider
        .ensure_load_balancer_deleted(&cx(), "k", &other)
        .await
        .unwrap();
    assert_eq!(
        names(double.health_checks(PROJECT), |c| c.name.clone()),
        [SHARED_CHECK],
        "still used by the third"
    );
    assert_eq!(
        double.instance_groups(PROJECT).len(),
        2,
        "still used by the third"
    );
    firewall(&double, &format!("{SHARED_CHECK}-hc"));
    provider
        .ensure_load_balancer_deleted(&cx(), "k", &third)
        .await
        .unwrap();
    nothing_left(&double, "all three deleted");
}

/// What upstream made (its shapes: its descriptions, an empty shared health check description, no
/// firewall priority, members by full URL) is adopted: an ensure writes nothing.
#[tokio::test]
async fn an_upstream_internal_load_balancer_is_adopted_without_a_write() {
    let (double, provider, nodes) = setup().await;
    let base = "https://www.googleapis.com/compute/v1";
    let region = format!("regions/{REGION}");
    let mut groups = Vec::new();
    for (zone, names) in [
        (ZONE, &["gke-pool-1", "gke-pool-2", "gke-pool-3"][..]),
        (OTHER_ZONE, &["gke-pool-4"][..]),
    ] {
        let group: model::InstanceGroup = serde_json::from_value(serde_json::json!({"name": GROUP})).unwrap();
        let members: Vec<String> = names
            .iter()
            .map(|n| format!("{base}/projects/{PROJECT}/zones/{zone}/instances/{n}"))
            .collect();
        double.put_instance_group(PROJECT, zone, group, &members);
        groups.push(format!(
            "{base}/projects/{PROJECT}/zones/{zone}/instanceGroups/{GROUP}"
        ));
    }
    let check: model::HealthCheck = serde_json::from_value(serde_json::json!({
        "name": SHARED_CHECK, "type": "HTTP", "description": "",
        "httpHealthCheck": {"port": 10256, "requestPath": "/healthz"},
        "checkIntervalSec": 8, "timeoutSec": 1, "healthyThreshold": 1, "unhealthyThreshold": 5,
    }))
    .unwrap();
    double.put(Collection::HealthChecks, PROJECT, "global", check);
    let backend: model::BackendService = serde_json::from_value(serde_json::json!({
        "name": LB, "protocol": "TCP", "loadBalancingScheme": "INTERNAL", "sessionAffinity": "NONE",
        "description": r#"{"kubernetes.io/service-name":"shop/db"}"#,
        "healthChecks": [format!("{base}/projects/{PROJECT}/global/healthChecks/{SHARED_CHECK}")],
        "backends": groups.iter().map(|g| serde_json::json!({"group": g})).collect::<Vec<_>>(),
    }))
    .unwrap();
    double.put(Collection::BackendServices, PROJECT, &region, backend);
    let rule: model::ForwardingRule = serde_json::from_value(serde_json::json!({
        "name": LB, "IPAddress": "10.128.0.50", "IPProtocol": "TCP", "loadBalancingScheme": "INTERNAL",
        "ports": ["5432"], "description": r#"{"kubernetes.io/service-name":"shop/db"}"#,
        "backendService": format!("{base}/projects/{PROJECT}/regions/{REGION}/backendServices/{LB}"),
        "subnetwork": format!("{base}/projects/{PROJECT}/regions/{REGION}/subnetworks/nodes"),
        "network": format!("{base}/projects/{PROJECT}/global/networks/default"),
    }))
    .unwrap();
    double.put(Collection::ForwardingRules, PROJECT, &region, rule);
    for (name, description, sources, destination, port) in [
        (
            format!("k8s-fw-{LB}"),
            r#"{"kubernetes.io/service-name":"shop/db", "kubernetes.io/service-ip":"10.128.0.50"}"#
                .to_owned(),
            vec!["0.0.0.0/0"],
            vec!["10.128.0.50"],
            "5432",
        ),
        (
            format!("{SHARED_CHECK}-hc"),
            String::new(),
            vec![
                "35.191.0.0/16",
                "130.211.0.0/22",
                "209.85.152.0/22",
                "209.85.204.0/22",
            ],
            vec![],
            "10256",
        ),
    ] {
        let firewall: model::Firewall = serde_json::from_value(serde_json::json!({
            "name": name, "description": description, "sourceRanges": sources, "destinationRanges": destination,
            "targetTags": ["cluster-node"], "allowed": [{"IPProtocol": "tcp", "ports": [port]}],
            "network": format!("{base}/projects/{PROJECT}/global/networks/default"),
        }))
        .unwrap();
        double.put(Collection::Firewalls, PROJECT, "global", firewall);
    }

    let before = double.requests().len();
    let status = provider
        .ensure_load_balancer(&cx(), "k", &db(), &nodes)
        .await
        .unwrap();
    assert_eq!(ip_of(&status), "10.128.0.50");
    let written: Vec<String> = double.requests()[before..]
        .iter()
        .filter(|r| !r.starts_with("GET ") && !r.contains("/listInstances"))
        .cloned()
        .collect();
    assert_eq!(written, [] as [String; 0]);
    assert_eq!(
        double.health_checks(PROJECT)[0].unhealthy_threshold,
        Some(5),
        "a larger threshold set by hand is kept"
    );
}

/// A write failing at any step of a first `ensure` (its operation done with an error) leaves what was
/// made before it; the next `ensure` finishes the load balancer without making anything twice or leaving
/// the temporary address reserved, and deleting it leaves nothing.
#[tokio::test]
async fn an_internal_ensure_that_fails_at_any_step_is_finished_by_the_next_and_leaks_nothing() {
    for step in [
        "/zones/us-central1-a/instanceGroups",
        "/addInstances",
        "/global/healthChecks",
        "/regions/us-central1/addresses",
        "/regions/us-central1/backendServices",
        "/regions/us-central1/forwardingRules",
        "/global/firewalls",
    ] {
        let (double, provider, nodes) = setup().await;
        // Operations done at once: this test is about the order of writes, not their polling.
        double.set_operation_polls(0);
        double.fail_operations(step, 500, "INTERNAL_ERROR", 1);
        let failed = provider
            .ensure_load_balancer(&cx(), "k", &db(), &nodes)
            .await
            .unwrap_err();
        assert!(failed.to_string().contains("INTERNAL_ERROR"), "{step}: {failed}");
        assert!(
            double.addresses(PROJECT).is_empty() || step.ends_with("/addresses"),
            "{step}: a failed ensure released its address"
        );
        let status = provider
            .ensure_load_balancer(&cx(), "k", &db(), &nodes)
            .await
            .unwrap_or_else(|e| panic!("{step}: the retry failed: {e}"));
        let ip = ip_of(&status);
        let rules = double.forwarding_rules(PROJECT);
        assert_eq!(rules.len(), 1, "{step}");
        assert_eq!(rules[0].ip_address.as_deref(), Some(ip.as_str()), "{step}");
        assert_eq!(double.backend_services(PROJECT).len(), 1, "{step}");
        assert_eq!(double.backend_services(PROJECT)[0].backends.len(), 2, "{step}");
        assert_eq!(members(&double, ZONE).len(), 3, "{step}");
        assert_eq!(double.health_checks(PROJECT).len(), 1, "{step}");
        assert_eq!(double.firewalls(PROJECT).len(), 2, "{step}");
        assert!(
            double.addresses(PROJECT).is_empty(),
            "{step}: the temporary address stayed reserved: {:?}",
            double.addresses(PROJECT)
        );
        let before = writes(&double).len();
        provider
            .ensure_load_balancer(&cx(), "k", &db(), &nodes)
            .await
            .unwrap();
        assert_eq!(writes(&double)[before..], [] as [String; 0], "{step}");
        provider
            .ensure_load_balancer_deleted(&cx(), "k", &db())
            .await
            .unwrap();
        nothing_left(&double, step);
    }
}

/// A service that changes kind: its next ensure takes the other kind's load balancer down first.
#[tokio::test]
async fn a_service_that_changes_kind_leaves_nothing_of_the_other() {
    let (double, provider, nodes) = setup().await;
    let external: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db", "namespace": "shop", "uid": UID},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 5432}]},
    }))
    .unwrap();
    provider
        .ensure_load_balancer(&cx(), "k", &external, &nodes)
        .await
        .unwrap();
    assert_eq!(double.target_pools(PROJECT).len(), 1);
    provider
        .ensure_load_balancer(&cx(), "k", &db(), &nodes)
        .await
        .unwrap();
    assert!(double.target_pools(PROJECT).is_empty(), "the external pool went");
    assert!(
        double.http_health_checks(PROJECT).is_empty(),
        "the external health check went"
    );
    assert_eq!(
        double.forwarding_rules(PROJECT)[0]
            .load_balancing_scheme
            .as_ref()
            .and_then(|s| s.name()),
        Some("INTERNAL")
    );
    provider
        .ensure_load_balancer(&cx(), "k", &external, &nodes)
        .await
        .unwrap();
    assert!(
        double.backend_services(PROJECT).is_empty(),
        "the backend service went"
    );
    assert!(
        double.health_checks(PROJECT).is_empty(),
        "the internal health check went"
    );
    assert!(double.instance_groups(PROJECT).is_empty(), "the groups went");
    assert_eq!(double.target_pools(PROJECT).len(), 1);
    provider
        .ensure_load_balancer_deleted(&cx(), "k", &external)
        .await
        .unwrap();
    nothing_left(&double, "deleted");
    assert!(double.target_pools(PROJECT).is_empty());
}

/// Without a subnet named, Compute chooses the region's for the rule, and the rule keeps it: a second
/// ensure writes nothing (it would remake the rule on a new IP if it compared the rule against none).
#[tokio::test]
async fn without_a_subnet_named_the_rule_keeps_the_one_compute_chose() {
    let (double, provider, nodes) = setup_with("").await;
    let status = provider
        .ensure_load_balancer(&cx(), "k", &db(), &nodes)
        .await
        .unwrap();
    let rule = &double.forwarding_rules(PROJECT)[0];
    assert!(
        rule.subnetwork
            .as_deref()
            .unwrap()
            .ends_with("/subnetworks/default")
    );
    let before = writes(&double).len();
    let again = provider
        .ensure_load_balancer(&cx(), "k", &db(), &nodes)
        .await
        .unwrap();
    assert_eq!(writes(&double)[before..], [] as [String; 0]);
    assert_eq!(ip_of(&again), ip_of(&status));
}

/// Upstream's rules about who owns a service and when a delete is finished.
#[tokio::test]
async fn ownership_by_finalizers_and_a_delete_that_is_not_finished() {
    let (double, provider, nodes) = setup().await;
    // GKE's newer controller's service (its finalizer, no load balancer of ours): not ours.
    let mut theirs = db();
    theirs.metadata.finalizers = Some(vec!["gke.networking.io/l4-ilb-v2".into()]);
    assert!(matches!(
        provider.ensure_load_balancer(&cx(), "k", &theirs, &nodes).await,
        Err(kube_ccm_provider::CloudError::ImplementedElsewhere)
    ));
    assert!(double.forwarding_rules(PROJECT).is_empty() && double.backend_services(PROJECT).is_empty());
    // Ours (upstream's finalizer) with its rule already gone: the delete is not finished, so the load
    // balancer still "exists" for the service controller, which then deletes it again.
    let mut ours = db();
    ours.metadata.finalizers = Some(vec!["gke.networking.io/l4-ilb-v1".into()]);
    assert!(
        provider
            .get_load_balancer(&cx(), "k", &ours)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        provider
            .get_load_balancer(&cx(), "k", &db())
            .await
            .unwrap()
            .is_none()
    );
}

/// A delete takes down what the rule points at, though the spec changed since (the service's own
/// health check of local traffic, after the policy went back to Cluster).
#[tokio::test]
async fn a_delete_follows_the_rule_not_a_changed_spec() {
    let (double, provider, nodes) = setup().await;
    let local = internal(
        serde_json::json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000, "ports": [{"port": 5432}]}),
        serde_json::json!({}),
        UID,
    );
    provider
        .ensure_load_balancer(&cx(), "k", &local, &nodes)
        .await
        .unwrap();
    assert_eq!(double.health_checks(PROJECT)[0].name.as_deref(), Some(LB));
    provider
        .ensure_load_balancer_deleted(&cx(), "k", &db())
        .await
        .unwrap();
    nothing_left(&double, "deleted after the policy changed");
}

/// A service of the legacy internal class that left type LoadBalancer has lost its class (the API server
/// erases it), and perhaps the finalizer of the internal kind: its delete still takes the internal load
/// balancer down whole, found by the rule's scheme.
#[tokio::test]
async fn a_legacy_internal_class_that_left_type_load_balancer_is_deleted_whole() {
    for keep_finalizer in [true, false] {
        let (double, provider, nodes) = setup().await;
        let classed: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db", "namespace": "shop", "uid": UID},
            "spec": {"type": "LoadBalancer", "loadBalancerClass": kube_ccm_gce::load_balancer::CLASS_LEGACY_INTERNAL,
                     "ports": [{"port": 5432, "nodePort": 30432}]},
        }))
        .unwrap();
        provider
            .ensure_load_balancer(&cx(), "k", &classed, &nodes)
            .await
            .unwrap();
        assert_eq!(
            double.backend_services(PROJECT).len(),
            1,
            "an internal load balancer"
        );
        let finalizers = if keep_finalizer {
            serde_json::json!([kube_ccm_gce::load_balancer::internal::FINALIZER_ILB_V1])
        } else {
            serde_json::json!([])
        };
        let left: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db", "namespace": "shop", "uid": UID, "finalizers": finalizers},
            "spec": {"type": "ClusterIP", "ports": [{"port": 5432}]},
        }))
        .unwrap();
        provider
            .ensure_load_balancer_deleted(&cx(), "k", &left)
            .await
            .unwrap();
        nothing_left(
            &double,
            &format!("deleted after the type changed (finalizer kept: {keep_finalizer})"),
        );
    }
}

/// The temporary address could not be released after the rule took its IP: the next ensure, with
/// nothing else to change, releases it.
#[tokio::test]
async fn an_address_left_held_is_released_by_the_next_ensure() {
    let (double, provider, nodes) = setup().await;
    double.set_operation_polls(0);
    double.fail_operations(&format!("/addresses/{LB}"), 500, "INTERNAL_ERROR", 1);
    assert!(
        provider
            .ensure_load_balancer(&cx(), "k", &db(), &nodes)
            .await
            .is_err()
    );
    assert_eq!(double.addresses(PROJECT).len(), 1);
    provider
        .ensure_load_balancer(&cx(), "k", &db(), &nodes)
        .await
        .unwrap();
    assert!(double.addresses(PROJECT).is_empty());
}

/// The orphan sweep's questions: the cluster's load balancers, external and internal, are claimed through
/// their links to the parts named for its ID and deleted whole; another cluster's and one that links to
/// nothing of the cluster's (it keeps traffic local) are never listed, and stay.
#[tokio::test]
async fn orphans_are_listed_through_the_clusters_parts_and_deleted_whole() {
    let (double, provider, nodes) = setup().await;
    let lb = &provider;
    lb.ensure_load_balancer(&cx(), "c", &db(), &nodes).await.unwrap();
    let external_uid = "0b1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9";
    let external_name = "a0b1b2c3d4e5f60718293a4b5c6d7e8f";
    let web: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "shop", "uid": external_uid},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "nodePort": 30080}]},
    }))
    .unwrap();
    lb.ensure_load_balancer(&cx(), "c", &web, &nodes).await.unwrap();
    let pool = |name: &str, check: &str, service: &str| -> model::TargetPool {
        serde_json::from_value(serde_json::json!({
            "name": name,
            "description": format!("{{\"kubernetes.io/service-name\":\"{service}\"}}"),
            "healthChecks": [format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/global/httpHealthChecks/{check}")],
        }))
        .unwrap()
    };
    let other = "a2222222222222222222222222222222";
    double.put(
        Collection::TargetPools,
        PROJECT,
        REGION,
        pool(other, "k8s-0ther0000000000-node", "shop/other"),
    );
    let local = "a3333333333333333333333333333333";
    double.put(
        Collection::TargetPools,
        PROJECT,
        REGION,
        pool(local, local, "shop/local"),
    );

    let listed = lb.list_load_balancers(&cx(), "c").await.unwrap();
    let mut seen: Vec<(String, Option<String>, Vec<String>)> = listed
        .iter()
        .map(|l| (l.name.clone(), l.service.clone(), l.parts.clone()))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (
                LB.to_owned(),
                Some("shop/db".to_owned()),
                vec![format!("backendServices/{LB}"), format!("forwardingRules/{LB}")]
            ),
            (
                external_name.to_owned(),
                Some("shop/web".to_owned()),
                vec![
                    format!("targetPools/{external_name}"),
                    format!("forwardingRules/{external_name}")
                ]
            ),
        ]
    );

    for orphan in &listed {
        lb.delete_load_balancer(&cx(), "c", orphan).await.unwrap();
        lb.delete_load_balancer(&cx(), "c", orphan).await.unwrap();
    }
    assert!(lb.list_load_balancers(&cx(), "c").await.unwrap().is_empty());
    assert!(double.forwarding_rules(PROJECT).is_empty());
    assert!(double.backend_services(PROJECT).is_empty());
    assert_eq!(
        names(double.target_pools(PROJECT), |p| p.name.clone()),
        [other, local],
        "another cluster's and the unprovable are left"
    );
    let firewalls = names(double.firewalls(PROJECT), |f| f.name.clone());
    assert!(
        !firewalls
            .iter()
            .any(|f| f.contains(LB) || f.contains(external_name)),
        "the load balancers' firewalls went with them: {firewalls:?}"
    );
}
