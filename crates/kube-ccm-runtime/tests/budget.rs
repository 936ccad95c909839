//! The process's cloud budget against a cloud that enforces a rate limit (the fake cloud's
//! `SetRateLimit`): a thousand nodes initialise with no throttled request and no failed sync, while the
//! lifecycle controller's periodic rounds wait behind them; without the budget, the same cloud throttles
//! and syncs fail (the control).

mod support;

use std::time::Duration;

use futures::StreamExt as _;
use kube::api::PostParams;
use kube_ccm_fake::{AdminRequest, CloudResponse, FakeInstance, Knobs};
use kube_ccm_provider::names::TAINT_UNINITIALIZED;
use kube_ccm_runtime::ControllerSettings;
use serde_json::json;
use tokio::time::Instant;

use support::*;

/// The nodes initialised in each run.
const NODES: u32 = 1000;
/// Not-ready nodes, initialised already, that keep the lifecycle controller asking the cloud.
const NOT_READY: u32 = 20;
/// What the cloud allows: calls a second.
const CLOUD_LIMIT: f64 = 10.0;

/// What one run saw.
#[derive(Debug)]
struct Outcome {
    /// From the first node created to the last one initialised.
    took: Duration,
    /// Calls the cloud refused for its rate limit.
    throttled: u64,
    /// The node controller's failed syncs.
    failed_syncs: f64,
    /// Requests the budget let through, by priority: initialise, refresh.
    granted: (f64, f64),
}

/// Initialises [`NODES`] nodes against a cloud answering in 20 ms and limited to `limit` calls a second,
/// with `settings`.
async fn initialise(limit: f64, settings: ControllerSettings) -> Outcome {
    let names: Vec<String> = (0..NODES + NOT_READY).map(|i| format!("n{i}")).collect();
    let instances = (1..)
        .zip(&names)
        .map(|(i, n)| FakeInstance::running(n, i))
        .collect();
    let cluster = Cluster::start(Backend::Test, instances).await;
    cluster
        .admin(AdminRequest::SetKnobs(Knobs {
            latency_ms: 20,
            ..Knobs::default()
        }))
        .await;
    let nodes = cluster.nodes();
    for name in &names[NODES as usize..] {
        let extra = json!({"spec": {"providerID": format!("fake://{name}")}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}});
        nodes
            .create(&PostParams::default(), &node(name, extra))
            .await
            .unwrap();
    }
    cluster
        .admin(AdminRequest::SetRateLimit { per_second: limit })
        .await;
    let manager = manager(&cluster, cluster.cloud_config(), settings);
    let metrics = manager.metrics();
    let running = start(manager);
    let started = Instant::now();
    futures::stream::iter(&names[..NODES as usize])
        .for_each_concurrent(32, |name| {
            let nodes = nodes.clone();
            async move {
                let tainted = node(name, json!({"spec": {"taints": [uninitialized()]}}));
                nodes.create(&PostParams::default(), &tainted).await.unwrap();
            }
        })
        .await;
    let deadline = started + Duration::from_secs(240);
    loop {
        let list = nodes.list(&Default::default()).await.unwrap();
        let waiting = list
            .items
            .iter()
            .filter(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| t.iter().any(|t| t.key == TAINT_UNINITIALIZED))
            })
            .count();
        if waiting == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{waiting} nodes still uninitialised");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = started.elapsed();
    running.stop().await;
    let throttled = match cluster.snapshot().await {
        CloudResponse::Snapshot { throttled, .. } => throttled,
        other => panic!("{other:?}"),
    };
    let granted = |priority: &str| {
        let series = format!("cloudprovider_fake_api_budget_requests_total{{priority=\"{priority}\"}}");
        sample(&metrics, &series)
    };
    Outcome {
        took,
        throttled,
        failed_syncs: sample(
            &metrics,
            "controller_reconciles_total{controller=\"cloud-node-controller\",result=\"error\"}",
        ),
        granted: (granted("initialise"), granted("refresh")),
    }
}

/// A budget of `per_second` (negative: none), with a burst of one second's worth.
fn settings_with_budget(per_second: f64) -> ControllerSettings {
    ControllerSettings {
        cloud_api_qps: per_second,
        cloud_api_burst: 0,
        ..settings()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::print_stderr)] // the three runs' figures, for whoever reads the output
async fn a_thousand_nodes_initialise_under_the_clouds_rate_limit_without_a_failed_sync() {
    let unthrottled = initialise(0.0, settings_with_budget(-1.0)).await;
    // A client's limit a little under the cloud's: requests granted a tenth of a second apart may reach
    // the cloud closer together.
    let budgeted = initialise(CLOUD_LIMIT, settings_with_budget(CLOUD_LIMIT * 0.9)).await;
    eprintln!("unthrottled: {unthrottled:?}\nbudgeted: {budgeted:?}");
    assert_eq!(
        budgeted.throttled, 0,
        "the budget kept under the limit: {budgeted:?}"
    );
    assert_eq!(budgeted.failed_syncs, 0.0, "{budgeted:?}");
    assert!(
        budgeted.took <= unthrottled.took * 2,
        "at most twice the unthrottled run: {budgeted:?} against {unthrottled:?}"
    );
    // The lifecycle controller's rounds alone would ask twice what the cloud allows: while nodes waited
    // to be initialised, they had the budget's leftovers only.
    assert!(
        budgeted.granted.1 * 3.0 <= budgeted.granted.0,
        "the periodic work waits behind initialisation: {budgeted:?}"
    );

    // The control: the same cloud, without the budget, throttles and syncs fail.
    let unbudgeted = initialise(CLOUD_LIMIT, settings_with_budget(-1.0)).await;
    eprintln!("unbudgeted: {unbudgeted:?}");
    assert!(unbudgeted.throttled > 0, "{unbudgeted:?}");
    assert!(unbudgeted.failed_syncs > 0.0, "{unbudgeted:?}");
}
