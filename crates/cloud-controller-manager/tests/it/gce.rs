//! The shipped binary with `--cloud-provider=gce` against the Compute test double and the test API server:
//! a node initialised from its instance, its pod range routed, a LoadBalancer service's external load
//! balancer made and deleted through the service-lb controller, and the node deleted (and its route with
//! it) when its instance is deleted.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use compute_double::ComputeDouble;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use kube::Api;
use kube::api::PostParams;
use kube_ccm_test_apiserver::TestApiServer;

use crate::bursts::{UnderLimit, initialise_burst};

const PROJECT: &str = "test-project";
const ZONE: &str = "us-central1-a";

struct Manager(Child);

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `check` every 100 ms until it is `Some`, for at most 60 s; fails with the manager's log.
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    log: &std::path::Path,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The shipped binary with `--cloud-provider=gce` against `double` and `server`, with `args` more; its log
/// is `manager.log` in `dir`.
fn start_manager(
    double: &ComputeDouble,
    server: &TestApiServer,
    dir: &std::path::Path,
    args: &[&str],
) -> (Manager, std::path::PathBuf) {
    // The project and the zone come from the metadata server, as on a GCE instance: the double answers
    // as one, named by GCE_METADATA_HOST.
    double.set_metadata("project/project-id", PROJECT);
    double.set_metadata("instance/zone", &format!("projects/123456789/zones/{ZONE}"));
    let config = dir.join("gce.conf");
    std::fs::write(
        &config,
        format!(
            "[global]\nnetwork-name = default\nnode-tags = test-node\napi-endpoint = {}\n",
            double.endpoint()
        ),
    )
    .unwrap();
    let log = dir.join("manager.log");
    let manager = Manager(
        Command::new(env!("CARGO_BIN_EXE_cloud-controller-manager"))
            .arg("--cloud-provider=gce")
            .arg(format!("--cloud-config={}", config.display()))
            .arg(format!("--kubeconfig={}", server.kubeconfig_path().display()))
            .args(["--leader-elect=false", "--secure-port=0", "--cluster-name=test"])
            .args(args)
            .env("GCE_METADATA_HOST", double.addr().to_string())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    (manager, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gce_provider_initialises_a_node_routes_it_serves_a_load_balancer_and_deletes_the_node_with_its_instance()
 {
    let double = ComputeDouble::start().await.unwrap();
    let instance: google_cloud_compute_v1::model::Instance = serde_json::from_value(serde_json::json!({
        "name": "node-1",
        "machineType": format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}/machineTypes/n2-standard-8"),
        "networkInterfaces": [{"networkIP": "10.128.0.5", "accessConfigs": [{"natIP": "34.66.1.2"}]}],
    }))
    .unwrap();
    double.put_instance(PROJECT, ZONE, instance);

    let dir = tempfile::tempdir().unwrap();
    let server = TestApiServer::start().await.unwrap();
    let (_manager, log) = start_manager(
        &double,
        &server,
        dir.path(),
        &[
            "--cluster-cidr=10.64.0.0/14",
            "--configure-cloud-routes=true",
            "--route-reconciliation-period=1s",
            "--node-monitor-period=1s",
            "--cloud-provider-gce-lb-src-cidrs=35.191.0.0/16,10.9.8.7/8",
        ],
    );

    let nodes: Api<Node> = Api::all(server.client());
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "node-1.c.test-project.internal"},
        "spec": {
            "podCIDR": "10.64.1.0/24",
            "podCIDRs": ["10.64.1.0/24"],
            "taints": [{"key": kube_ccm_provider::names::TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}],
        },
        "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]},
    }))
    .unwrap();
    let uid = nodes
        .create(&PostParams::default(), &node)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();

    let name = "node-1.c.test-project.internal";
    let initialised = eventually("the node was not initialised", &log, || async {
        let node = nodes.get(name).await.unwrap();
        node.spec.as_ref()?.provider_id.as_ref()?;
        Some(node)
    })
    .await;
    assert_eq!(
        initialised.spec.as_ref().unwrap().provider_id.as_deref(),
        Some(format!("gce://{PROJECT}/{ZONE}/node-1").as_str())
    );
    let labels = initialised.metadata.labels.clone().unwrap();
    assert_eq!(labels["topology.kubernetes.io/zone"], ZONE);
    assert_eq!(labels["topology.kubernetes.io/region"], "us-central1");
    assert_eq!(labels["node.kubernetes.io/instance-type"], "n2-standard-8");
    let addresses: Vec<(String, String)> = initialised
        .status
        .unwrap()
        .addresses
        .unwrap()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert!(
        addresses.contains(&("InternalIP".into(), "10.128.0.5".into())),
        "{addresses:?}"
    );
    assert!(
        addresses.contains(&("ExternalIP".into(), "34.66.1.2".into())),
        "{addresses:?}"
    );

    // The node's pod range, routed to its instance under upstream's name.
    let route = eventually("no route was made for the node's pod range", &log, || async {
        double
            .routes(PROJECT)
            .into_iter()
            .find(|r| r.name.as_deref() == Some(format!("test-{uid}").as_str()))
    })
    .await;
    assert_eq!(route.dest_range.as_deref(), Some("10.64.1.0/24"));
    assert_eq!(route.description.as_deref(), Some("k8s-node-route"));
    assert!(
        route
            .next_hop_instance
            .as_deref()
            .unwrap()
            .ends_with(&format!("zones/{ZONE}/instances/node-1"))
    );

    // A LoadBalancer service: a forwarding rule and target pool under upstream's names, the rule's IP in
    // the service's status; deleting the service deletes them. The cluster ID the shared health check is
    // named after is upstream's ConfigMap, made when the manager started leading.
    let services: Api<Service> = Api::namespaced(server.client(), "default");
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {"type": "LoadBalancer", "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080, "nodePort": 30080}]},
    }))
    .unwrap();
    let service_uid = services
        .create(&PostParams::default(), &service)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let lb = format!("a{}", service_uid.replace('-', ""))[..32].to_owned();
    let ip = eventually("the service got no load balancer", &log, || async {
        let status = services.get("web").await.unwrap().status?.load_balancer?;
        status.ingress?.first()?.ip.clone()
    })
    .await;
    let rules = double.forwarding_rules(PROJECT);
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].name.as_deref(), Some(lb.as_str()));
    assert_eq!(rules[0].ip_address.as_deref(), Some(ip.as_str()));
    let pools = double.target_pools(PROJECT);
    assert!(
        pools[0].instances[0].ends_with(&format!("zones/{ZONE}/instances/node-1")),
        "{:?}",
        pools[0].instances
    );
    let maps: Api<ConfigMap> = Api::namespaced(server.client(), "kube-system");
    let cluster_id = maps.get("ingress-uid").await.unwrap().data.unwrap()["provider-uid"].clone();
    assert_eq!(cluster_id.len(), 16);
    assert!(pools[0].health_checks[0].ends_with(&format!("k8s-{cluster_id}-node")));
    // The health checkers' firewall opens what --cloud-provider-gce-lb-src-cidrs names.
    let health_firewall = double
        .firewalls(PROJECT)
        .into_iter()
        .find(|f| f.name.as_deref() == Some(format!("k8s-{cluster_id}-node-http-hc").as_str()))
        .expect("the health checks' firewall");
    assert_eq!(health_firewall.source_ranges, ["10.0.0.0/8", "35.191.0.0/16"]);
    services.delete("web", &Default::default()).await.unwrap();
    eventually("the load balancer outlived its service", &log, || async {
        (double.forwarding_rules(PROJECT).is_empty()
            && double.target_pools(PROJECT).is_empty()
            && double.firewalls(PROJECT).is_empty()
            && double.http_health_checks(PROJECT).is_empty())
        .then_some(())
    })
    .await;

    // An internal load balancer: upstream's finalizer on the service while it lives, its pieces in the
    // cloud; deleting the service takes them down and lets the service go.
    let db: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db", "annotations": {"networking.gke.io/load-balancer-type": "Internal"}},
        "spec": {"type": "LoadBalancer", "selector": {"app": "db"}, "ports": [{"port": 5432, "targetPort": 5432, "nodePort": 30432}]},
    }))
    .unwrap();
    services.create(&PostParams::default(), &db).await.unwrap();
    let internal_ip = eventually("the internal service got no load balancer", &log, || async {
        let status = services.get("db").await.unwrap().status?.load_balancer?;
        status.ingress?.first()?.ip.clone()
    })
    .await;
    assert!(internal_ip.starts_with("10."), "{internal_ip}");
    let finalizers = services
        .get("db")
        .await
        .unwrap()
        .metadata
        .finalizers
        .unwrap_or_default();
    assert!(
        finalizers.contains(&"gke.networking.io/l4-ilb-v1".to_owned())
            && finalizers.contains(&"service.kubernetes.io/load-balancer-cleanup".to_owned()),
        "{finalizers:?}"
    );
    assert_eq!(double.backend_services(PROJECT).len(), 1);
    assert_eq!(
        double.instance_groups(PROJECT)[0].name.as_deref(),
        Some(format!("k8s-ig--{cluster_id}").as_str())
    );
    // The delete fails half-way once (the rule gone, the backend service not): upstream's finalizer
    // keeps the service, and the next delete finishes.
    double.fail_operations("/backendServices/", 500, "INTERNAL_ERROR", 1);
    services.delete("db", &Default::default()).await.unwrap();
    eventually("the internal service was not let go", &log, || async {
        services.get_opt("db").await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(double.forwarding_rules(PROJECT).is_empty());
    assert!(double.backend_services(PROJECT).is_empty());
    assert!(double.instance_groups(PROJECT).is_empty());
    assert!(double.health_checks(PROJECT).is_empty());
    assert!(double.firewalls(PROJECT).is_empty());

    // The instance is deleted: so is the node, and the route controller removes its route.
    assert!(double.delete_instance(PROJECT, ZONE, "node-1"));
    eventually("the node of a deleted instance was not deleted", &log, || async {
        nodes.get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
    eventually("the deleted node's route was not removed", &log, || async {
        double.routes(PROJECT).is_empty().then_some(())
    })
    .await;
}

/// An instance in the double with `interface` as its only network interface.
fn put_instance(double: &ComputeDouble, name: &str, interface: serde_json::Value) {
    let instance: google_cloud_compute_v1::model::Instance = serde_json::from_value(serde_json::json!({
        "name": name,
        "machineType": format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}/machineTypes/e2-medium"),
        "networkInterfaces": [interface],
    }))
    .unwrap();
    double.put_instance(PROJECT, ZONE, instance);
}

/// A registered node of `name`'s instance, with its provider ID and no pod CIDR yet.
fn registered_node(name: &str) -> Node {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"providerID": format!("gce://{PROJECT}/{ZONE}/{name}")},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gce_node_ipam_controller_sets_pod_cidrs_from_alias_ranges_and_reports_nodes_without_one() {
    let double = ComputeDouble::start().await.unwrap();
    put_instance(
        &double,
        "node-a",
        serde_json::json!({"name": "nic0", "networkIP": "10.128.0.7", "aliasIpRanges": [{"ipCidrRange": "10.4.7.0/24", "subnetworkRangeName": "pods"}]}),
    );
    put_instance(
        &double,
        "node-b",
        serde_json::json!({"name": "nic0", "networkIP": "10.128.0.8"}),
    );
    let dir = tempfile::tempdir().unwrap();
    let server = TestApiServer::start().await.unwrap();
    let (_manager, log) = start_manager(
        &double,
        &server,
        dir.path(),
        &[
            "--controllers=*,node-ipam-controller",
            "--allocate-node-cidrs=true",
            "--cidr-allocator-type=CloudAllocator",
            "--cluster-cidr=10.4.0.0/14",
            // An IPv4 cluster (upstream's stack type comes from the service ranges' families).
            "--service-cluster-ip-range=10.0.0.0/20",
            "--configure-cloud-routes=false",
        ],
    );
    let nodes: Api<Node> = Api::all(server.client());
    for name in ["node-a", "node-b"] {
        nodes
            .create(&PostParams::default(), &registered_node(name))
            .await
            .unwrap();
    }

    // node-a: its alias range as its pod CIDRs, and its network marked available as upstream marks it.
    let allocated = eventually("node-a got no pod CIDR", &log, || async {
        let node = nodes.get("node-a").await.unwrap();
        node.spec.as_ref()?.pod_cidr.as_ref()?;
        let conditions = node.status.as_ref()?.conditions.as_ref()?;
        conditions
            .iter()
            .any(|c| c.type_ == "NetworkUnavailable")
            .then_some(node)
    })
    .await;
    let spec = allocated.spec.unwrap();
    assert_eq!(spec.pod_cidr.as_deref(), Some("10.4.7.0/24"));
    assert_eq!(spec.pod_cidrs, Some(vec!["10.4.7.0/24".to_owned()]));
    let conditions = allocated.status.unwrap().conditions.unwrap();
    let network = conditions
        .iter()
        .find(|c| c.type_ == "NetworkUnavailable")
        .unwrap();
    assert_eq!(
        (
            network.status.as_str(),
            network.reason.as_deref(),
            network.message.as_deref()
        ),
        (
            "False",
            Some("RouteCreated"),
            Some("NodeController create implicit route")
        )
    );

    // node-b has no alias range: no pod CIDR, and upstream's Event, reported as upstream's allocator.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(server.client(), "default");
    let event = eventually("node-b got no CIDRNotAvailable Event", &log, || async {
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("CIDRNotAvailable")
                    && e.involved_object.name.as_deref() == Some("node-b")
            })
    })
    .await;
    assert_eq!(
        event.message.as_deref(),
        Some("Node node-b status is now: CIDRNotAvailable")
    );
    assert_eq!(event.reporting_component.as_deref(), Some("cidrAllocator"));
    let node_b = nodes.get("node-b").await.unwrap();
    assert_eq!(node_b.spec.unwrap().pod_cidr, None);

    // The range appears (the instance gets one): the retry allocates it.
    put_instance(
        &double,
        "node-b",
        serde_json::json!({"name": "nic0", "networkIP": "10.128.0.8", "aliasIpRanges": [{"ipCidrRange": "10.4.8.0/24"}]}),
    );
    eventually(
        "node-b was not allocated once its range appeared",
        &log,
        || async {
            let spec = nodes.get("node-b").await.unwrap().spec?;
            (spec.pod_cidr.as_deref() == Some("10.4.8.0/24")).then_some(())
        },
    )
    .await;

    // An allocated node's later changes ask nothing of Compute. The watch delivers node-a's change before
    // node-c's creation, so once node-c is allocated node-a's change has been seen: one request, node-c's.
    let instances = "GET /compute/v1/projects/test-project/aggregated/instances";
    let asked = double.count(instances);
    let mut labelled = nodes.get("node-a").await.unwrap();
    labelled
        .metadata
        .labels
        .get_or_insert_default()
        .insert("team".into(), "blue".into());
    nodes
        .replace("node-a", &PostParams::default(), &labelled)
        .await
        .unwrap();
    put_instance(
        &double,
        "node-c",
        serde_json::json!({"name": "nic0", "aliasIpRanges": [{"ipCidrRange": "10.4.9.0/24"}], "ipv6Address": "2600:1900:4000:318:0:9::"}),
    );
    nodes
        .create(&PostParams::default(), &registered_node("node-c"))
        .await
        .unwrap();
    eventually("node-c was not allocated", &log, || async {
        let node = nodes.get("node-c").await.unwrap();
        // Its IPv6 address is no pod range in an IPv4 cluster.
        let allocated = node.spec?.pod_cidrs? == ["10.4.9.0/24"];
        let available = node
            .status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "NetworkUnavailable");
        (allocated && available).then_some(())
    })
    .await;
    assert_eq!(double.count(instances), asked + 1, "{:#?}", double.requests());
}

#[test]
fn a_bad_load_balancer_source_range_stops_the_start_naming_the_flag() {
    let output = Command::new(env!("CARGO_BIN_EXE_cloud-controller-manager"))
        .args([
            "--cloud-provider=gce",
            "--cloud-provider-gce-lb-src-cidrs=130.211.0.0/22,everyone",
            "--kubeconfig=/nonexistent",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "error: --cloud-provider-gce-lb-src-cidrs: \"everyone\" is not a CIDR (for example 130.211.0.0/22)"
        ),
        "{stderr}"
    );
    let help = Command::new(env!("CARGO_BIN_EXE_cloud-controller-manager"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("Cloud provider flags:") && help.contains("--cloud-provider-gce-l7lb-src-cidrs"),
        "{help}"
    );
}

/// `--cidr-allocator-type=RangeAllocator` (route-based clusters): a node found with a range keeps it and
/// the range is taken; new nodes get the next free networks of each family of `--cluster-cidr`, one each;
/// a deleted node's networks go back and are given again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gce_range_allocator_gives_each_node_its_own_networks_of_the_cluster_cidrs() {
    let double = ComputeDouble::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = TestApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(server.client());
    let mut existing = registered_node("node-0");
    let spec = existing.spec.get_or_insert_with(Default::default);
    spec.pod_cidr = Some("10.64.0.0/24".into());
    spec.pod_cidrs = Some(vec!["10.64.0.0/24".into(), "fd00:10::/64".into()]);
    nodes.create(&PostParams::default(), &existing).await.unwrap();
    let (_manager, log) = start_manager(
        &double,
        &server,
        dir.path(),
        &[
            "--controllers=*,node-ipam-controller",
            "--allocate-node-cidrs=true",
            "--cidr-allocator-type=RangeAllocator",
            "--cluster-cidr=10.64.0.0/22,fd00:10::/62",
            "--configure-cloud-routes=false",
        ],
    );
    for name in ["node-1", "node-2", "node-3"] {
        nodes
            .create(&PostParams::default(), &registered_node(name))
            .await
            .unwrap();
    }
    let cidrs_of = |name: &'static str| {
        let nodes = nodes.clone();
        async move {
            let node = nodes.get(name).await.unwrap();
            node.spec?.pod_cidrs.filter(|c| !c.is_empty())
        }
    };
    let mut given = Vec::new();
    for name in ["node-1", "node-2", "node-3"] {
        let cidrs = eventually("a node got no pod CIDRs", &log, || cidrs_of(name)).await;
        assert_eq!(cidrs.len(), 2, "{name}: {cidrs:?}");
        given.push(cidrs);
    }
    let mut ipv4: Vec<&str> = given.iter().map(|c| c[0].as_str()).collect();
    ipv4.sort();
    assert_eq!(
        ipv4,
        ["10.64.1.0/24", "10.64.2.0/24", "10.64.3.0/24"],
        "node-0's is taken"
    );
    let mut ipv6: Vec<&str> = given.iter().map(|c| c[1].as_str()).collect();
    ipv6.sort();
    assert_eq!(ipv6, ["fd00:10:0:1::/64", "fd00:10:0:2::/64", "fd00:10:0:3::/64"]);
    // Both families are taken now: a fifth node waits, then gets the networks a deleted node gave back.
    nodes
        .create(&PostParams::default(), &registered_node("node-4"))
        .await
        .unwrap();
    let freed = given[1].clone();
    nodes.delete("node-2", &Default::default()).await.unwrap();
    let cidrs = eventually("the fifth node got no pod CIDRs", &log, || cidrs_of("node-4")).await;
    assert_eq!(cidrs, freed);
}

/// Nodes initialised in each run of [`initialise_under_quota`].
const QUOTA_NODES: usize = 1000;
/// Not-ready nodes, initialised already, that keep the lifecycle controller asking Compute every 100 ms.
const QUOTA_NOT_READY: usize = 20;
/// The project's rate quota in those runs, requests a second: half what the lifecycle rounds alone would
/// ask, and low enough that a loaded machine (tests in parallel) still asks more without a budget.
const QUOTA: f64 = 5.0;

/// [`QUOTA_NODES`] nodes created at once for the binary to initialise, beside [`QUOTA_NOT_READY`]
/// not-ready ones, against a project whose rate quota is `quota` requests a second (0: none), with `flags`
/// for the process's budget; with `until_refused`, only until the quota refused a request.
async fn initialise_under_quota(quota: f64, flags: &[&str], until_refused: bool) -> UnderLimit {
    let double = ComputeDouble::start().await.unwrap();
    for i in 0..QUOTA_NODES + QUOTA_NOT_READY {
        let ip = format!("10.128.{}.{}", i / 250, i % 250 + 2);
        put_instance(
            &double,
            &format!("node-{i}"),
            serde_json::json!({"networkIP": ip}),
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let server = TestApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(server.client());
    for i in QUOTA_NODES..QUOTA_NODES + QUOTA_NOT_READY {
        let mut node = registered_node(&format!("node-{i}"));
        node.status =
            serde_json::from_value(serde_json::json!({"conditions": [{"type": "Ready", "status": "False"}]}))
                .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    double.set_rate_limit(quota);
    let mut args = vec!["--node-monitor-period=100ms"];
    args.extend(flags);
    let (_manager, log) = start_manager(&double, &server, dir.path(), &args);
    let names: Vec<String> = (0..QUOTA_NODES).map(|i| format!("node-{i}")).collect();
    initialise_burst(
        server.client(),
        &names,
        &log,
        || double.throttled(),
        until_refused,
    )
    .await
}

/// The process's budget against Compute's rate quota (the double's 403 `rateLimitExceeded`), with the
/// lifecycle controller's rounds alone asking as fast as the quota allows: a thousand nodes initialise with
/// no refused request and no failed sync, in at most twice the time without a quota. The control: without
/// the budget, the quota refuses requests and node syncs fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::print_stderr)] // the runs' figures, for whoever reads the output
async fn a_thousand_gce_nodes_initialise_under_the_projects_rate_quota_without_a_failed_sync() {
    let unlimited = initialise_under_quota(0.0, &["--cloud-api-qps=-1"], false).await;
    // A budget well under the quota, and a burst of one: the provider's start-up requests (the region,
    // its subnetworks) are made before the budget exists and take most of the quota's first second, and
    // on a loaded machine requests granted apart may reach the cloud together.
    let budgeted =
        initialise_under_quota(QUOTA, &["--cloud-api-qps=3.5", "--cloud-api-burst=1"], false).await;
    eprintln!("no quota: {unlimited:?}\nbudgeted: {budgeted:?}");
    assert_eq!(budgeted.refused, 0, "{budgeted:?}");
    assert_eq!(budgeted.failed_syncs, 0, "{budgeted:?}");
    assert!(
        budgeted.took <= unlimited.took * 2,
        "at most twice the run without a quota: {budgeted:?} against {unlimited:?}"
    );

    let unbudgeted = initialise_under_quota(QUOTA, &["--cloud-api-qps=-1"], true).await;
    eprintln!("no budget: {unbudgeted:?}");
    assert!(unbudgeted.refused > 0, "{unbudgeted:?}");
}
