//! The GCE provider against the Compute test double, over HTTP, through `google-cloud-compute-v1`.

use std::sync::Arc;
use std::time::Duration;

use compute_double::{ComputeDouble, Fault};
use google_cloud_compute_v1::model;
use k8s_openapi::api::core::v1::Node;
use kube_ccm_gce::{CloudConfig, GceProvider};
use kube_ccm_provider::{CallContext, CloudError, CloudProvider, InstancesV2, LoadBalancer, Route, Routes};

const PROJECT: &str = "test-project";
const ZONE: &str = "us-central1-a";

fn instance(name: &str, ip: &str) -> model::Instance {
    serde_json::from_value(serde_json::json!({
        "name": name,
        "machineType": format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}/machineTypes/e2-standard-4"),
        "networkInterfaces": [{"networkIP": ip, "accessConfigs": [{"natIP": "34.0.0.1"}]}],
    }))
    .unwrap()
}

fn node(name: &str, provider_id: Option<&str>) -> Arc<Node> {
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "uid": format!("uid-{name}")},
            "spec": {"providerID": provider_id},
        }))
        .unwrap(),
    )
}

async fn provider(double: &ComputeDouble, extra: &str) -> GceProvider {
    let text = format!(
        "[global]\nproject-id = {PROJECT}\nlocal-zone = {ZONE}\nnetwork-name = default\napi-endpoint = {}\n{extra}",
        double.endpoint()
    );
    GceProvider::new(CloudConfig::parse(&text).unwrap().config)
        .await
        .unwrap()
}

/// Instances `node-0` … `node-{count - 1}` in [`ZONE`].
fn put_nodes(double: &ComputeDouble, count: usize) {
    for i in 0..count {
        double.put_instance(
            PROJECT,
            ZONE,
            instance(&format!("node-{i}"), &format!("10.0.{}.{}", i / 200, i % 200 + 2)),
        );
    }
}

fn cx() -> CallContext {
    CallContext::with_timeout(Duration::from_secs(20))
}

#[tokio::test]
async fn instances_are_found_by_provider_id_and_by_name_in_one_request_per_100_names() {
    let double = ComputeDouble::start().await.unwrap();
    put_nodes(&double, 250);
    double.put_instance(PROJECT, "us-central1-b", instance("node-b", "10.1.0.2"));
    let provider = provider(&double, "").await;

    let nodes: Vec<Arc<Node>> = (0..250)
        .map(|i| {
            let name = format!("node-{i}");
            if i % 2 == 0 {
                node(&format!("{name}.c.{PROJECT}.internal"), None)
            } else {
                node(&name, Some(&format!("gce://{PROJECT}/{ZONE}/{name}")))
            }
        })
        .collect();
    let metadata = provider.instance_metadata_batch(&cx(), &nodes).await;
    assert_eq!(
        double.count(&format!(
            "GET /compute/v1/projects/{PROJECT}/aggregated/instances"
        )),
        3
    );
    let first = metadata[0].as_ref().unwrap();
    assert_eq!(first.provider_id, format!("gce://{PROJECT}/{ZONE}/node-0"));
    assert_eq!(first.instance_type, "e2-standard-4");
    assert_eq!(
        (first.zone.as_str(), first.region.as_str()),
        (ZONE, "us-central1")
    );
    let addresses: Vec<(String, String)> = first
        .node_addresses
        .iter()
        .map(|a| (a.type_.clone(), a.address.clone()))
        .collect();
    assert_eq!(
        addresses,
        [
            ("InternalIP".into(), "10.0.0.2".into()),
            ("ExternalIP".into(), "34.0.0.1".into())
        ]
    );
    assert!(metadata.iter().all(Result::is_ok));
    assert_eq!(
        metadata[249].as_ref().unwrap().provider_id,
        format!("gce://{PROJECT}/{ZONE}/node-249")
    );

    // By name, only the local zone is searched unless multizone.
    let other_zone = node("node-b", None);
    assert!(!provider.instance_exists(&cx(), &other_zone).await.unwrap());
    let multizone = self::provider(&double, "multizone = true\n").await;
    assert!(multizone.instance_exists(&cx(), &other_zone).await.unwrap());
    assert_eq!(
        multizone
            .instance_metadata(&cx(), &other_zone)
            .await
            .unwrap()
            .zone,
        "us-central1-b"
    );
    // By provider ID the zone is known.
    let pinned = node("node-b", Some(&format!("gce://{PROJECT}/us-central1-b/node-b")));
    assert!(provider.instance_exists(&cx(), &pinned).await.unwrap());
}

#[tokio::test]
async fn gone_instances_do_not_exist_and_stopped_ones_are_shut_down() {
    let double = ComputeDouble::start().await.unwrap();
    double.put_instance(PROJECT, ZONE, instance("running", "10.0.0.2"));
    double.put_instance(PROJECT, ZONE, instance("stopped", "10.0.0.3"));
    double.put_instance(PROJECT, ZONE, instance("deleted", "10.0.0.4"));
    assert!(double.set_instance_status(PROJECT, ZONE, "stopped", "TERMINATED"));
    assert!(double.delete_instance(PROJECT, ZONE, "deleted"));
    let provider = provider(&double, "").await;
    let nodes = [
        node("running", None),
        node("stopped", None),
        node("deleted", None),
    ];
    let exists: Vec<bool> = provider
        .instance_exists_batch(&cx(), &nodes)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(exists, [true, true, false]);
    let shutdown = provider.instance_shutdown_batch(&cx(), &nodes[..2]).await;
    assert_eq!(
        shutdown.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
        [false, true]
    );
    assert!(matches!(
        provider.instance_metadata(&cx(), &nodes[2]).await,
        Err(CloudError::InstanceNotFound)
    ));
    // Another provider's node, and a malformed provider ID, are errors, never "gone".
    let malformed = node("x", Some("gce://only-project"));
    assert!(matches!(
        provider.instance_exists(&cx(), &malformed).await,
        Err(CloudError::Provider(_))
    ));
    assert!(!provider.owns_provider_id("aws:///us-east-1a/i-0123"));
}

#[tokio::test]
async fn rate_limits_are_retries_and_deadlines_bound_the_call() {
    let double = ComputeDouble::start().await.unwrap();
    double.put_instance(PROJECT, ZONE, instance("node-1", "10.0.0.2"));
    let provider = provider(&double, "").await;
    let n = node("node-1", None);
    double.fail_requests(Fault {
        method: None,
        path_contains: "/aggregated/instances".into(),
        status: 429,
        reason: "rateLimitExceeded".into(),
        times: 1,
    });
    match provider.instance_exists(&cx(), &n).await {
        Err(CloudError::Throttled { after, message }) => {
            assert_eq!(after, kube_ccm_gce::RATE_LIMITED_RETRY_AFTER);
            assert!(message.contains("instances.aggregatedList"), "{message}");
        }
        other => panic!("expected a retry, got {other:?}"),
    }
    assert!(
        provider.instance_exists(&cx(), &n).await.unwrap(),
        "the fault is spent"
    );
    // Compute's own refusal for a rate quota is a 403, told from a permission refused by its reason.
    for (status, reason, throttled) in [
        (403, "rateLimitExceeded", true),
        (403, "userRateLimitExceeded", true),
        (403, "forbidden", false),
    ] {
        double.fail_requests(Fault {
            method: None,
            path_contains: "/aggregated/instances".into(),
            status,
            reason: reason.into(),
            times: 1,
        });
        let answer = provider.instance_exists(&cx(), &n).await;
        assert_eq!(
            matches!(answer, Err(CloudError::Throttled { .. })),
            throttled,
            "{reason}: {answer:?}"
        );
    }

    double.set_latency(Duration::from_secs(5));
    let short = CallContext::with_timeout(Duration::from_millis(300));
    let started = std::time::Instant::now();
    assert!(matches!(
        provider.instance_exists(&short, &n).await,
        Err(CloudError::Timeout)
    ));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn routes_are_named_as_upstream_awaited_and_idempotent() {
    let double = ComputeDouble::start().await.unwrap();
    double.set_operation_polls(2);
    double.put_instance(PROJECT, ZONE, instance("node-1", "10.0.0.2"));
    double.put_instance(PROJECT, ZONE, instance("node-2", "10.0.0.3"));
    let provider = provider(&double, "").await;
    let cluster = "a-cluster-name-longer-than-twenty-six";
    let route = |node: &str, cidr: &str| Route {
        target_node: node.into(),
        destination_cidr: cidr.into(),
        ..Route::default()
    };

    provider
        .create_route(&cx(), cluster, "uid-1", &route("node-1", "10.64.1.0/24"))
        .await
        .unwrap();
    provider
        .create_route(&cx(), cluster, "uid-2", &route("node-2", "10.64.2.0/24"))
        .await
        .unwrap();
    // A retried insert (the route exists) is done.
    provider
        .create_route(&cx(), cluster, "uid-1", &route("node-1", "10.64.1.0/24"))
        .await
        .unwrap();
    let made = double.routes(PROJECT);
    assert_eq!(made.len(), 2);
    let first = &made[0];
    assert_eq!(first.name.as_deref(), Some("a-cluster-name-longer-than-uid-1"));
    assert_eq!(first.description.as_deref(), Some("k8s-node-route"));
    assert_eq!(first.priority, Some(1000));
    assert_eq!(
        first.next_hop_instance.as_deref(),
        Some(format!("projects/{PROJECT}/zones/{ZONE}/instances/node-1").as_str())
    );
    assert!(
        first
            .network
            .as_deref()
            .unwrap()
            .ends_with(&format!("projects/{PROJECT}/global/networks/default"))
    );
    // Each write was awaited: polled until done.
    assert!(double.count(&format!("GET /compute/v1/projects/{PROJECT}/global/operations/")) >= 4);

    // Another cluster's routes, and routes that are not node routes, are not listed.
    let mut foreign = first.clone();
    foreign.name = Some("other-cluster-uid-9".into());
    double.put(compute_double::Collection::Routes, PROJECT, "global", foreign);
    let mut manual = first.clone();
    manual.name = Some("a-cluster-name-longer-than-manual".into());
    manual.description = Some("made by hand".into());
    double.put(compute_double::Collection::Routes, PROJECT, "global", manual);

    let listed = provider.list_routes(&cx(), cluster).await.unwrap();
    let summary: Vec<(String, String, String, bool)> = listed
        .iter()
        .map(|r| {
            (
                r.name.clone(),
                r.target_node.clone(),
                r.destination_cidr.clone(),
                r.blackhole,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "a-cluster-name-longer-than-uid-1".into(),
                "node-1".into(),
                "10.64.1.0/24".into(),
                false
            ),
            (
                "a-cluster-name-longer-than-uid-2".into(),
                "node-2".into(),
                "10.64.2.0/24".into(),
                false
            ),
        ]
    );

    // The next hop's instance is gone: a blackhole.
    double.delete_instance(PROJECT, ZONE, "node-2");
    let listed = provider.list_routes(&cx(), cluster).await.unwrap();
    assert!(listed.iter().any(|r| r.target_node == "node-2" && r.blackhole));

    provider.delete_route(&cx(), cluster, &listed[1]).await.unwrap();
    provider.delete_route(&cx(), cluster, &listed[1]).await.unwrap();
    let names: Vec<String> = double
        .routes(PROJECT)
        .into_iter()
        .filter_map(|r| r.name)
        .collect();
    assert_eq!(
        names,
        [
            "a-cluster-name-longer-than-manual",
            "a-cluster-name-longer-than-uid-1",
            "other-cluster-uid-9"
        ]
    );
}

#[tokio::test]
async fn failed_operations_are_errors_and_quota_is_a_retry() {
    let double = ComputeDouble::start().await.unwrap();
    double.put_instance(PROJECT, ZONE, instance("node-1", "10.0.0.2"));
    let provider = provider(&double, "").await;
    let route = Route {
        target_node: "node-1".into(),
        destination_cidr: "10.64.1.0/24".into(),
        ..Route::default()
    };
    double.fail_operations("/global/routes", 403, "QUOTA_EXCEEDED", 1);
    let quota = provider.create_route(&cx(), "k", "uid-1", &route).await;
    assert!(
        matches!(quota, Err(CloudError::Retry { .. })),
        "{quota:?} {:?} {:?}",
        double.requests(),
        double.routes(PROJECT)
    );
    double.fail_operations("/global/routes", 400, "INVALID_ARGUMENT", 1);
    match provider.create_route(&cx(), "k", "uid-1", &route).await {
        Err(CloudError::Provider(error)) => assert!(error.to_string().contains("routes.insert"), "{error}"),
        other => panic!("expected the operation's error, got {other:?}"),
    }
    assert!(
        double.routes(PROJECT).is_empty(),
        "a failed operation changes nothing"
    );
    provider.create_route(&cx(), "k", "uid-1", &route).await.unwrap();
    assert_eq!(double.routes(PROJECT).len(), 1);

    // A route to a node without an instance is an error naming it.
    let stray = Route {
        target_node: "ghost".into(),
        ..route.clone()
    };
    let error = provider
        .create_route(&cx(), "k", "uid-2", &stray)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("ghost"), "{error}");
}

#[tokio::test]
async fn the_factory_names_bad_keys() {
    let error = kube_ccm_gce::factory(Some(
        b"[global]\nproject-id = p\nlocal-zone = us-east1-b\nregional = perhaps\n".to_vec(),
    ))
    .await
    .err()
    .unwrap()
    .to_string();
    assert_eq!(
        error,
        "cloud-config line 4: [global] regional: \"perhaps\" is not a boolean (true/false)"
    );
}

/// gce.conf without `project-id` and `local-zone`: both come from the metadata server (here the double,
/// which answers as one), and the provider works with them; a server that cannot tell them is one error
/// naming the key and the server.
#[tokio::test]
async fn the_project_and_zone_come_from_the_metadata_server_when_gce_conf_leaves_them_out() {
    let double = ComputeDouble::start().await.unwrap();
    let host = double.addr().to_string();
    let text = format!(
        "[global]\nnetwork-name = default\napi-endpoint = {}\n",
        double.endpoint()
    );
    let mut config = CloudConfig::parse(&text).unwrap().config;

    let error = kube_ccm_gce::metadata::fill(&mut config.clone(), &host)
        .await
        .unwrap_err();
    assert!(
        error.starts_with("[global] project-id is not set, and the metadata server cannot tell it (")
            && error.contains("/computeMetadata/v1/project/project-id: HTTP 404"),
        "{error}"
    );
    let closed = kube_ccm_gce::metadata::fill(&mut config.clone(), "127.0.0.1:1")
        .await
        .unwrap_err();
    assert!(
        closed.contains("project-id is not set") && closed.contains("127.0.0.1:1"),
        "{closed}"
    );

    double.set_metadata("project/project-id", PROJECT);
    double.set_metadata("instance/zone", &format!("projects/123456789/zones/{ZONE}"));
    kube_ccm_gce::metadata::fill(&mut config, &host).await.unwrap();
    assert_eq!(
        (config.project_id.as_str(), config.local_zone.as_str()),
        (PROJECT, ZONE)
    );

    double.put_instance(PROJECT, ZONE, instance("node-1", "10.0.0.9"));
    let provider = GceProvider::new(config).await.unwrap();
    let found = provider
        .instance_exists(
            &cx(),
            &node("node-1", Some(&format!("gce://{PROJECT}/{ZONE}/node-1"))),
        )
        .await
        .unwrap();
    assert!(found);
    // One question each (the double answers only those carrying `Metadata-Flavor: Google`, as the
    // server does): the refused project, then the project and the zone.
    assert_eq!(
        double.count("GET /computeMetadata/v1/"),
        3,
        "{:?}",
        double.requests()
    );
}

/// An unreachable zone makes the instances that could be in it unknown, never gone: a node whose provider
/// ID names that zone, and a node looked up by name in a multizone cluster, get an error; a node whose
/// zone answered is still found or gone; a name Compute could not have is an error too.
#[tokio::test]
async fn an_unreachable_zone_is_unknown_and_an_invalid_name_an_error_never_gone() {
    let double = ComputeDouble::start().await.unwrap();
    double.put_instance(PROJECT, ZONE, instance("node-a", "10.0.0.2"));
    double.put_instance(PROJECT, "us-central1-b", instance("node-b", "10.0.0.3"));
    let provider = provider(&double, "multizone = true\n").await;
    let instances = provider.instances_v2().unwrap();
    let nodes = [
        node("node-a", Some(&format!("gce://{PROJECT}/{ZONE}/node-a"))),
        node("node-b", Some(&format!("gce://{PROJECT}/us-central1-b/node-b"))),
        node("gone", Some(&format!("gce://{PROJECT}/{ZONE}/gone"))),
        node("gone-b", Some(&format!("gce://{PROJECT}/us-central1-b/gone-b"))),
        node("by-name", None),
        node("Node_1", None),
    ];
    let answers = |answers: Vec<Result<bool, CloudError>>| -> Vec<Option<bool>> {
        answers.into_iter().map(Result::ok).collect()
    };
    let reachable = answers(instances.instance_exists_batch(&cx(), &nodes).await);
    assert_eq!(
        reachable,
        [
            Some(true),
            Some(true),
            Some(false),
            Some(false),
            Some(false),
            None
        ]
    );
    double.set_zone_reachable(PROJECT, "us-central1-b", false);
    let outage = answers(instances.instance_exists_batch(&cx(), &nodes).await);
    // In the zone that answered: found and gone as before. In the silent one, and by name (it could be
    // there): unknown.
    assert_eq!(outage, [Some(true), None, Some(false), None, None, None]);
    let metadata = instances.instance_metadata_batch(&cx(), &nodes[1..2]).await;
    assert!(metadata[0].is_err(), "{metadata:?}");
    double.set_zone_reachable(PROJECT, "us-central1-b", true);
    assert_eq!(
        answers(instances.instance_exists_batch(&cx(), &nodes).await),
        reachable
    );
}

/// Asks whether 40 nodes' instances exist at once, each call in a context with `budget`: the answers, and
/// how many requests the project's rate quota refused meanwhile.
async fn burst(
    provider: &Arc<GceProvider>,
    double: &ComputeDouble,
    budget: Option<Arc<kube_ccm_provider::RateBudget>>,
) -> (Vec<Result<bool, CloudError>>, u64) {
    let before = double.throttled();
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..40 {
        let (provider, budget) = (provider.clone(), budget.clone());
        calls.spawn(async move {
            let cx = match budget {
                Some(budget) => cx().with_budget(budget, kube_ccm_provider::Priority::Reconcile),
                None => cx(),
            };
            let n = node(&format!("node-{}", i % 4), None);
            provider.instance_exists(&cx, &n).await
        });
    }
    let answers = calls.join_all().await;
    (answers, double.throttled() - before)
}

#[tokio::test]
async fn a_budget_under_the_projects_rate_quota_is_never_refused() {
    let double = ComputeDouble::start().await.unwrap();
    for i in 0..4 {
        double.put_instance(
            PROJECT,
            ZONE,
            instance(&format!("node-{i}"), &format!("10.0.0.{}", i + 2)),
        );
    }
    let provider = Arc::new(provider(&double, "").await);
    double.set_rate_limit(10.0);

    let budget = Arc::new(kube_ccm_provider::RateBudget::new(8.0, 8));
    let (answers, refused) = burst(&provider, &double, Some(budget)).await;
    assert!(answers.iter().all(|a| matches!(a, Ok(true))), "{answers:?}");
    assert_eq!(refused, 0, "a budget of 8 a second never meets a quota of 10");

    // The control: without a budget the same burst meets the quota, and each refusal (Compute's 403
    // `rateLimitExceeded`, which the client's default policy takes as permanent) reaches the caller as a
    // retry, never as a failure or an answer.
    let (answers, refused) = burst(&provider, &double, None).await;
    assert!(
        refused > 0,
        "40 requests at once must meet a quota of 10 a second"
    );
    let retries = answers
        .iter()
        .filter(|a| matches!(a, Err(CloudError::Throttled { .. })))
        .count();
    assert_eq!(u64::try_from(retries).unwrap(), refused, "{answers:?}");
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Ok(true) | Err(CloudError::Throttled { .. }))),
        "{answers:?}"
    );
}

/// Each listing request takes its own turn of the process's budget: a look-up of 250 names (three
/// `aggregatedList` requests of 100 names) takes three, the orphan sweep's listing one per region
/// collection. A call that took one turn for several requests sent them faster than the budget allows,
/// and the project's quota refused them.
#[tokio::test]
async fn every_listing_request_takes_its_own_turn_of_the_budget() {
    let double = ComputeDouble::start().await.unwrap();
    put_nodes(&double, 250);
    let provider = provider(&double, "").await;
    provider.set_cluster_id("c1d2e3f4a5b6c7d8");
    let budgeted = |budget: &Arc<kube_ccm_provider::RateBudget>| {
        cx().with_budget(budget.clone(), kube_ccm_provider::Priority::Initialise)
    };
    let granted = |budget: &kube_ccm_provider::RateBudget| budget.stats().granted.iter().sum::<u64>();
    let sent = || {
        double
            .requests()
            .iter()
            .filter(|r| r.starts_with("GET /compute/"))
            .count()
    };

    let nodes: Vec<Arc<Node>> = (0..250).map(|i| node(&format!("node-{i}"), None)).collect();
    let budget = Arc::new(kube_ccm_provider::RateBudget::new(1000.0, 1000));
    let before = sent();
    let metadata = provider.instance_metadata_batch(&budgeted(&budget), &nodes).await;
    assert!(metadata.iter().all(Result::is_ok), "{metadata:?}");
    assert_eq!((sent() - before, granted(&budget)), (3, 3));

    let budget = Arc::new(kube_ccm_provider::RateBudget::new(1000.0, 1000));
    let before = sent();
    let listed = provider
        .list_load_balancers(&budgeted(&budget), "c")
        .await
        .unwrap();
    assert!(listed.is_empty(), "{listed:?}");
    assert_eq!((sent() - before, granted(&budget)), (3, 3));
}
