//! Keeps the Compute test double honest: the real `gcloud` CLI, pointed at the double, reads the state the
//! provider made and the instances the test seeded. A field the double shaped wrongly shows up as a gcloud
//! error or a wrong value here. Skipped, loudly, where gcloud is not installed.

use std::process::Command;
use std::time::Duration;

use std::sync::Arc;

use compute_double::ComputeDouble;
use kube_ccm_gce::{CloudConfig, GceProvider};
use kube_ccm_provider::{CallContext, LoadBalancer, Route, Routes};

const PROJECT: &str = "test-project";
const ZONE: &str = "us-central1-a";

/// `gcloud` with its own configuration directory, pointed at `double`; `None` when gcloud is missing.
struct Gcloud {
    config: tempfile::TempDir,
}

impl Gcloud {
    #[allow(clippy::print_stderr)]
    fn new(double: &ComputeDouble) -> Option<Gcloud> {
        if Command::new("gcloud").arg("--version").output().is_err() {
            // This machine kind has gcloud: with CI set, its absence fails the test.
            assert!(
                std::env::var_os("CI").is_none(),
                "gcloud is not installed; with CI set a missing tool fails the test"
            );
            eprintln!(
                "SKIPPED: gcloud is not installed; the Compute double is not checked against a real client"
            );
            return None;
        }
        let gcloud = Gcloud {
            config: tempfile::tempdir().unwrap(),
        };
        gcloud.run(&["config", "set", "auth/disable_credentials", "True"]);
        gcloud.run(&[
            "config",
            "set",
            "api_endpoint_overrides/compute",
            &double.endpoint(),
        ]);
        gcloud.run(&["config", "set", "core/disable_usage_reporting", "True"]);
        Some(gcloud)
    }

    /// Runs gcloud and returns its standard output; fails the test with its error otherwise.
    fn run(&self, args: &[&str]) -> String {
        let output = Command::new("gcloud")
            .args(args)
            .arg("--quiet")
            .env("CLOUDSDK_CONFIG", self.config.path())
            .env("CLOUDSDK_CORE_DISABLE_PROMPTS", "1")
            .env("CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK", "1")
            .output()
            .expect("gcloud runs");
        assert!(
            output.status.success(),
            "gcloud {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    /// Runs gcloud expecting it to fail; its standard error.
    fn fails(&self, args: &[&str]) -> String {
        let output = Command::new("gcloud")
            .args(args)
            .args(["--quiet", "--project", PROJECT])
            .env("CLOUDSDK_CONFIG", self.config.path())
            .env("CLOUDSDK_CORE_DISABLE_PROMPTS", "1")
            .env("CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK", "1")
            .output()
            .expect("gcloud runs");
        assert!(!output.status.success(), "gcloud {args:?} succeeded");
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut args = args.to_vec();
        args.extend(["--project", PROJECT, "--format=json"]);
        serde_json::from_str(&self.run(&args)).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn gcloud_reads_what_the_provider_made() {
    let double = ComputeDouble::start().await.unwrap();
    let Some(gcloud) = Gcloud::new(&double) else {
        return;
    };
    for (name, ip, zone) in [
        ("node-1", "10.0.0.2", ZONE),
        ("node-2", "10.0.0.3", "us-central1-b"),
    ] {
        let instance = serde_json::from_value(serde_json::json!({
            "name": name,
            "machineType": format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{zone}/machineTypes/e2-small"),
            "networkInterfaces": [{"networkIP": ip, "accessConfigs": [{"natIP": "34.0.0.9", "name": "External NAT"}]}],
            "tags": {"items": ["k8s-node"]},
        }))
        .unwrap();
        double.put_instance(PROJECT, zone, instance);
    }
    let text = format!(
        "[global]\nproject-id = {PROJECT}\nlocal-zone = {ZONE}\nmultizone = true\nnetwork-name = default\nnode-tags = k8s-node\napi-endpoint = {}\n",
        double.endpoint()
    );
    let provider = GceProvider::new(CloudConfig::parse(&text).unwrap().config)
        .await
        .unwrap();
    // A deadline per call: the gcloud runs between the calls take seconds each (Python), more on a busy
    // machine, and must not eat the provider's time.
    let cx = || CallContext::with_timeout(Duration::from_secs(20));
    for (hint, node, cidr) in [
        ("uid-1", "node-1", "10.64.1.0/24"),
        ("uid-2", "node-2", "10.64.2.0/24"),
    ] {
        let route = Route {
            target_node: node.into(),
            destination_cidr: cidr.into(),
            ..Route::default()
        };
        provider
            .create_route(&cx(), "kubernetes", hint, &route)
            .await
            .unwrap();
    }

    // Instances, across zones (gcloud's aggregated list), and one described.
    let listed = gcloud.json(&["compute", "instances", "list"]);
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["name"].as_str())
        .collect();
    assert_eq!(names, ["node-1", "node-2"]);
    let table = gcloud.run(&["compute", "instances", "list", "--project", PROJECT]);
    let row = table
        .lines()
        .find(|l| l.starts_with("node-2"))
        .unwrap_or_else(|| panic!("{table}"));
    for column in ["us-central1-b", "e2-small", "10.0.0.3", "34.0.0.9", "RUNNING"] {
        assert!(row.contains(column), "{column} missing from gcloud's row: {row}");
    }
    let described = gcloud.json(&["compute", "instances", "describe", "node-1", "--zone", ZONE]);
    assert_eq!(described["networkInterfaces"][0]["networkIP"], "10.0.0.2");
    assert_eq!(described["status"], "RUNNING");
    assert!(
        described["zone"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/zones/{ZONE}"))
    );

    // The routes the provider made.
    let routes = gcloud.json(&["compute", "routes", "list"]);
    let routes: Vec<(String, String, String, String)> = routes
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
            (s("name"), s("destRange"), s("description"), s("nextHopInstance"))
        })
        .collect();
    assert_eq!(routes.len(), 2, "{routes:?}");
    assert_eq!(routes[0].0, "kubernetes-uid-1");
    assert_eq!(routes[0].1, "10.64.1.0/24");
    assert_eq!(routes[0].2, "k8s-node-route");
    assert!(
        routes[1].3.ends_with("zones/us-central1-b/instances/node-2"),
        "{routes:?}"
    );
    let described = gcloud.json(&["compute", "routes", "describe", "kubernetes-uid-2"]);
    assert_eq!(described["priority"], 1000);
    assert!(
        described["network"]
            .as_str()
            .unwrap()
            .ends_with("/global/networks/default")
    );

    // A load balancer the provider made, read by gcloud.
    provider.set_cluster_id("c1d2e3f4a5b6c7d8");
    let service: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "shop", "uid": "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}, {"port": 443}], "loadBalancerSourceRanges": ["192.0.2.0/24"]},
    }))
    .unwrap();
    let nodes: Vec<Arc<k8s_openapi::api::core::v1::Node>> = [("node-1", ZONE), ("node-2", "us-central1-b")]
        .iter()
        .map(|(name, zone)| {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": name},
                    "spec": {"providerID": format!("gce://{PROJECT}/{zone}/{name}")},
                }))
                .unwrap(),
            )
        })
        .collect();
    let status = provider
        .ensure_load_balancer(&cx(), "kubernetes", &service, &nodes)
        .await
        .unwrap();
    let ip = status.ingress.unwrap()[0].ip.clone().unwrap();
    let lb = "a0a1b2c3d4e5f60718293a4b5c6d7e8f";
    let region = ["--region", "us-central1"];

    let rules = gcloud.json(&["compute", "forwarding-rules", "list"]);
    let rule = &rules.as_array().unwrap()[0];
    assert_eq!(rule["name"], lb);
    assert_eq!(rule["IPAddress"], ip.as_str());
    assert_eq!(rule["portRange"], "80-443");
    assert_eq!(rule["IPProtocol"], "TCP");
    let table = gcloud.run(&["compute", "forwarding-rules", "list", "--project", PROJECT]);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(lb) && l.contains(&ip) && l.contains("us-central1")),
        "{table}"
    );

    let mut pool_args = vec!["compute", "target-pools", "describe", lb];
    pool_args.extend(region);
    let pool = gcloud.json(&pool_args);
    let instances: Vec<&str> = pool["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i.as_str())
        .collect();
    assert_eq!(instances.len(), 2, "{pool}");
    assert!(
        instances[1].ends_with("zones/us-central1-b/instances/node-2"),
        "{instances:?}"
    );
    assert_eq!(pool["sessionAffinity"], "NONE");
    assert!(
        pool["healthChecks"][0]
            .as_str()
            .unwrap()
            .ends_with("httpHealthChecks/k8s-c1d2e3f4a5b6c7d8-node")
    );

    let firewall = gcloud.json(&["compute", "firewall-rules", "describe", &format!("k8s-fw-{lb}")]);
    assert_eq!(firewall["sourceRanges"], serde_json::json!(["192.0.2.0/24"]));
    assert_eq!(firewall["targetTags"], serde_json::json!(["k8s-node"]));
    assert_eq!(
        firewall["allowed"],
        serde_json::json!([{"IPProtocol": "tcp", "ports": ["80", "443"]}])
    );
    let check = gcloud.json(&[
        "compute",
        "http-health-checks",
        "describe",
        "k8s-c1d2e3f4a5b6c7d8-node",
    ]);
    assert_eq!(
        (check["port"].as_i64(), check["requestPath"].as_str()),
        (Some(10256), Some("/healthz"))
    );

    // An internal load balancer of another service, read by gcloud: its forwarding rule, regional
    // backend service, health check and the per-zone instance groups with their instances.
    let internal: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db", "namespace": "shop", "uid": "1a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9",
            "annotations": {"networking.gke.io/load-balancer-type": "Internal"}},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 5432}]},
    }))
    .unwrap();
    let status = provider
        .ensure_load_balancer(&cx(), "kubernetes", &internal, &nodes)
        .await
        .unwrap();
    let ip = status.ingress.unwrap()[0].ip.clone().unwrap();
    let ilb = "a1a1b2c3d4e5f60718293a4b5c6d7e8f";
    let mut args = vec!["compute", "forwarding-rules", "describe", ilb];
    args.extend(region);
    let rule = gcloud.json(&args);
    assert_eq!(rule["IPAddress"], ip.as_str());
    assert_eq!(rule["loadBalancingScheme"], "INTERNAL");
    assert_eq!(rule["ports"], serde_json::json!(["5432"]));
    assert!(
        rule["backendService"]
            .as_str()
            .unwrap()
            .ends_with(&format!("regions/us-central1/backendServices/{ilb}"))
    );
    let mut args = vec!["compute", "backend-services", "describe", ilb];
    args.extend(region);
    let backend = gcloud.json(&args);
    assert_eq!(backend["loadBalancingScheme"], "INTERNAL");
    assert_eq!(backend["protocol"], "TCP");
    assert_eq!(backend["backends"].as_array().unwrap().len(), 2, "{backend}");
    assert!(
        backend["healthChecks"][0]
            .as_str()
            .unwrap()
            .ends_with("global/healthChecks/k8s-c1d2e3f4a5b6c7d8-node")
    );
    let check = gcloud.json(&[
        "compute",
        "health-checks",
        "describe",
        "k8s-c1d2e3f4a5b6c7d8-node",
    ]);
    assert_eq!(check["type"], "HTTP");
    assert_eq!(check["httpHealthCheck"]["port"], 10256);
    // (`gcloud compute instance-groups unmanaged list` sends Compute's batch API, which the double does
    // not serve: each zone's group is described instead.)
    for zone in [ZONE, "us-central1-b"] {
        let group = gcloud.json(&[
            "compute",
            "instance-groups",
            "unmanaged",
            "describe",
            "k8s-ig--c1d2e3f4a5b6c7d8",
            "--zone",
            zone,
        ]);
        assert_eq!(group["size"], 1, "{group}");
        assert!(group["zone"].as_str().unwrap().ends_with(zone), "{group}");
    }
    let members = gcloud.json(&[
        "compute",
        "instance-groups",
        "unmanaged",
        "list-instances",
        "k8s-ig--c1d2e3f4a5b6c7d8",
        "--zone",
        "us-central1-b",
    ]);
    assert!(
        members[0]["instance"]
            .as_str()
            .unwrap()
            .ends_with("zones/us-central1-b/instances/node-2"),
        "{members}"
    );
}

/// A dual-stack internal load balancer as gcloud reads it (the IPv6 rule, its `/96`, the subnet's range),
/// and Compute's refusals of IPv6 rules as gcloud meets them: a target pool, a subnet without an IPv6
/// range.
#[tokio::test(flavor = "multi_thread")]
async fn gcloud_reads_an_ipv6_rule_and_meets_computes_ipv6_refusals() {
    let double = ComputeDouble::start().await.unwrap();
    let Some(gcloud) = Gcloud::new(&double) else {
        return;
    };
    let region = "regions/us-central1";
    for (name, ipv6) in [("nodes", true), ("plain", false)] {
        let mut subnet =
            serde_json::json!({"name": name, "ipCidrRange": "10.0.0.0/20", "stackType": "IPV4_ONLY"});
        if ipv6 {
            subnet["stackType"] = "IPV4_IPV6".into();
            subnet["ipv6AccessType"] = "INTERNAL".into();
            subnet["internalIpv6Prefix"] = "fd20:a1b:2c3d:0:0:0:0:0/64".into();
        }
        let subnet: google_cloud_compute_v1::model::Subnetwork = serde_json::from_value(subnet).unwrap();
        double.put(compute_double::Collection::Subnetworks, PROJECT, region, subnet);
    }
    let instance = serde_json::from_value(serde_json::json!({
        "name": "node-1", "networkInterfaces": [{"networkIP": "10.0.0.2"}], "tags": {"items": ["k8s-node"]},
    }))
    .unwrap();
    double.put_instance(PROJECT, ZONE, instance);
    let text = format!(
        "[global]\nproject-id = {PROJECT}\nlocal-zone = {ZONE}\nnetwork-name = default\nsubnetwork-name = nodes\nnode-tags = k8s-node\napi-endpoint = {}\n",
        double.endpoint()
    );
    let provider = GceProvider::new(CloudConfig::parse(&text).unwrap().config)
        .await
        .unwrap();
    provider.set_cluster_id("c1d2e3f4a5b6c7d8");
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "node-1"}, "spec": {"providerID": format!("gce://{PROJECT}/{ZONE}/node-1")},
    }))
    .unwrap();
    let service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db", "namespace": "shop", "uid": "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9",
            "annotations": {"networking.gke.io/load-balancer-type": "Internal"}},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 5432}], "ipFamilies": ["IPv4", "IPv6"],
            "ipFamilyPolicy": "RequireDualStack"},
    }))
    .unwrap();
    let cx = CallContext::with_timeout(Duration::from_secs(20));
    let status = provider
        .ensure_load_balancer(&cx, "kubernetes", &service, &[Arc::new(node)])
        .await
        .unwrap();
    let ipv6 = status.ingress.unwrap()[1].ip.clone().unwrap();

    let lb = "a0a1b2c3d4e5f60718293a4b5c6d7e8f";
    let rule = gcloud.json(&[
        "compute",
        "forwarding-rules",
        "describe",
        &format!("{lb}-ipv6"),
        "--region",
        "us-central1",
    ]);
    assert_eq!(rule["ipVersion"], "IPV6", "{rule}");
    assert_eq!(rule["loadBalancingScheme"], "INTERNAL", "{rule}");
    assert_eq!(rule["IPAddress"], format!("{ipv6}/96"), "{rule}");
    assert!(
        rule["backendService"]
            .as_str()
            .unwrap()
            .ends_with(&format!("backendServices/{lb}")),
        "{rule}"
    );
    assert!(
        rule["subnetwork"]
            .as_str()
            .unwrap()
            .ends_with("subnetworks/nodes"),
        "{rule}"
    );
    let subnet = gcloud.json(&[
        "compute",
        "networks",
        "subnets",
        "describe",
        "nodes",
        "--region",
        "us-central1",
    ]);
    assert_eq!(subnet["ipv6AccessType"], "INTERNAL", "{subnet}");
    assert_eq!(subnet["stackType"], "IPV4_IPV6", "{subnet}");

    // Target pools serve IPv4 only.
    let refused = gcloud.fails(&[
        "compute",
        "forwarding-rules",
        "create",
        "v6-pool",
        "--region",
        "us-central1",
        "--ip-version",
        "IPV6",
        "--target-pool",
        lb,
        "--ports",
        "80",
    ]);
    assert!(refused.contains("target pools serve IPv4 only"), "{refused}");
    // An internal IPv6 rule needs a subnet with an internal IPv6 range.
    let refused = gcloud.fails(&[
        "compute",
        "forwarding-rules",
        "create",
        "v6-plain",
        "--region",
        "us-central1",
        "--ip-version",
        "IPV6",
        "--load-balancing-scheme",
        "INTERNAL",
        "--backend-service",
        lb,
        "--subnet",
        "plain",
        "--ports",
        "80",
    ]);
    assert!(refused.contains("has no INTERNAL IPv6 range"), "{refused}");
    assert_eq!(
        double.forwarding_rules(PROJECT).len(),
        2,
        "nothing made by the refused requests"
    );
}
