//! A provider's own controller, registered only here, is planned, started and stopped exactly like the
//! built-in ones: under the migration lock when the leader-migration configuration migrates it, under the
//! main lock otherwise, and not at all when `--controllers` turns it off.

use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use control_plane::{ApiServer, Backend, RequestRecord};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_ccm_leadermigration::scopes::LossPolicy;
use kube_ccm_leadermigration::user_agent::UserAgent;
use kube_ccm_leadermigration::{ControllerSelection, LeaseTimings, MigrationConfig, Placement};
use kube_ccm_provider::{CloudError, CloudProvider, LeadingContext};
use kube_ccm_runtime::{
    ClientFactory, ControllerContext, ControllerDefinition, ControllerRegistry, ControllerSettings,
    LeaderElectionConfig, Manager, ManagerConfig, ManagerError, SharedCache,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const MIGRATION_LEASE: &str = "probe-migration";
const MAIN_LEASE: &str = "cloud-controller-manager";

/// A cloud with nothing but a greeting, which its own controller reads through the downcast, and a count of
/// its leaderships: started, and ended (its `stop` fired).
#[derive(Default)]
struct ProbeCloud {
    greeting: String,
    leading: AtomicUsize,
    stopped: Arc<AtomicUsize>,
}

#[async_trait]
impl CloudProvider for ProbeCloud {
    fn provider_name(&self) -> &str {
        "probe"
    }

    async fn start_leading(&self, context: LeadingContext) -> Result<(), CloudError> {
        self.leading.fetch_add(1, Ordering::SeqCst);
        let stopped = self.stopped.clone();
        tokio::spawn(async move {
            context.stop.cancelled().await;
            stopped.fetch_add(1, Ordering::SeqCst);
        });
        Ok(())
    }
}

/// Writes the provider's greeting into a ConfigMap named after itself, every 50 ms until stopped.
async fn write_greetings(context: ControllerContext) {
    let cloud = context
        .provider_as::<ProbeCloud>()
        .expect("a provider's controller sees its provider's type");
    let api: Api<ConfigMap> = Api::namespaced(context.client().clone(), "default");
    let name = context.name().as_str();
    context.set_started();
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tokio::select! {
            () = context.stop().cancelled() => return,
            _ = tick.tick() => {}
        }
        let object = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name}, "data": {"greeting": cloud.greeting},
        });
        let _ = api
            .patch(name, &PatchParams::apply(name).force(), &Patch::Apply(object))
            .await;
    }
}

/// The framework's controllers, plus two of the probe provider's: `probe-controller` (which the
/// configuration below migrates) and `canary-controller` (which it does not).
fn registry() -> ControllerRegistry {
    let mut registry = ControllerRegistry::builtin();
    for (name, aliases) in [
        ("probe-controller", &["probe"][..]),
        ("canary-controller", &[][..]),
    ] {
        registry
            .register(
                ControllerDefinition::new(name, write_greetings)
                    .aliases(aliases)
                    .for_provider("probe")
                    // What a warm standby fills: the probe's nodes, nobody's services.
                    .reads(if name == "probe-controller" {
                        &[SharedCache::Nodes]
                    } else {
                        &[]
                    }),
            )
            .unwrap();
    }
    registry
}

fn migration(registry: &ControllerRegistry) -> MigrationConfig {
    let yaml = format!(
        "apiVersion: controllermanager.config.k8s.io/v1\nkind: LeaderMigrationConfiguration\nleaderName: {MIGRATION_LEASE}\ncontrollerLeaders:\n  - name: probe\n    component: cloud-controller-manager\n"
    );
    MigrationConfig::load("probe.yaml", yaml.as_bytes(), registry.catalog())
        .unwrap()
        .config
}

fn manager(server: &ApiServer, registry: &ControllerRegistry, controllers: &[&str]) -> Manager {
    let timings = LeaseTimings::new(
        Duration::from_secs(2),
        Duration::from_secs(1),
        Duration::from_millis(200),
    )
    .unwrap();
    let election = LeaderElectionConfig::new("kube-system", MAIN_LEASE, timings, LossPolicy::Exit)
        .with_migration(migration(registry))
        .unwrap();
    let config = ManagerConfig {
        component: "cloud-controller-manager".into(),
        clients: ClientFactory::new(
            server.config(),
            "cloud-controller-manager",
            "probe-host_1",
            1000.0,
            1000,
        ),
        leader_election: Some(election),
        selection: ControllerSelection::parse(controllers, registry.catalog()).unwrap(),
        controllers: ControllerSettings::defaults("test-cluster"),
    };
    let provider = Arc::new(ProbeCloud {
        greeting: "hello".into(),
        ..ProbeCloud::default()
    });
    Manager::new(config, registry.clone(), provider)
}

fn placement(manager: &Manager, name: &str) -> (Placement, Option<String>) {
    let planned = manager
        .plan()
        .into_iter()
        .find(|p| p.controller.as_str() == name)
        .unwrap();
    (planned.placement, planned.skipped)
}

/// Successful writes of `controller`, in the server's order.
fn writes_by(server: &ApiServer, controller: &str) -> Vec<RequestRecord> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.is_write() && (200..300).contains(&r.status))
        .filter(|r| UserAgent::parse(&r.user_agent).is_some_and(|ua| ua.controller == controller))
        .collect()
}

async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A Lease held by someone else for an hour.
async fn hold_elsewhere(server: &ApiServer, name: &str) {
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "kube-system"},
        "spec": {
            "holderIdentity": "someone-else", "leaseDurationSeconds": 3600,
            "acquireTime": "2026-01-01T00:00:00.000000Z", "renewTime": "2026-01-01T00:00:00.000000Z",
            "leaseTransitions": 0,
        },
    }))
    .unwrap();
    Api::<Lease>::namespaced(server.client(), "kube-system")
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
}

fn start(
    manager: Manager,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<Result<(), ManagerError>>,
) {
    let shutdown = CancellationToken::new();
    (shutdown.clone(), tokio::spawn(manager.run(shutdown)))
}

async fn a_providers_controller_runs_under_the_migration_lock_the_configuration_gives_it(backend: Backend) {
    let server = ApiServer::for_test(backend).await;
    let registry = registry();
    let manager = manager(&server, &registry, &["*"]);
    assert_eq!(
        placement(&manager, "probe-controller"),
        (
            Placement::Migration {
                lease: MIGRATION_LEASE.into()
            },
            None
        )
    );
    assert_eq!(
        placement(&manager, "canary-controller"),
        (
            Placement::Main {
                lease: MAIN_LEASE.into()
            },
            None
        )
    );
    hold_elsewhere(&server, MIGRATION_LEASE).await;
    let health = manager.health();
    let (shutdown, task) = start(manager);

    // The canary runs as soon as the main lock is held; the probe waits for its migration lock.
    eventually("the canary's writes", || {
        !writes_by(&server, "canary-controller").is_empty()
    })
    .await;
    let leases: Api<Lease> = Api::namespaced(server.client(), "kube-system");
    let released = leases
        .patch(
            MIGRATION_LEASE,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": null}})),
        )
        .await
        .unwrap();
    let released_at = server
        .requests()
        .into_iter()
        .find(|r| r.resource_version.map(|v| v.to_string()) == released.metadata.resource_version)
        .unwrap()
        .seq;
    eventually("the probe's writes", || {
        !writes_by(&server, "probe-controller").is_empty()
    })
    .await;
    let probe = writes_by(&server, "probe-controller");
    assert!(
        probe.iter().all(|w| w.seq > released_at),
        "the probe wrote before its migration lock was free: {probe:?}"
    );
    let greeting = Api::<ConfigMap>::namespaced(server.client(), "default")
        .get("probe-controller")
        .await
        .unwrap();
    assert_eq!(greeting.data.unwrap()["greeting"], "hello");
    let holder = leases
        .get(MIGRATION_LEASE)
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity;
    assert_eq!(holder.as_deref(), Some("probe-host_1"));

    // /healthz has a check per running controller, as for a built-in one.
    let checks: Vec<String> = health.health().checks.into_iter().map(|(name, _)| name).collect();
    for expected in [
        "probe-controller",
        "canary-controller",
        "leader-migration-probe-migration",
    ] {
        assert!(
            checks.iter().any(|c| c == expected),
            "{expected} missing from {checks:?}"
        );
    }
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

async fn without_migration_it_runs_under_the_main_lock_and_controllers_can_turn_it_off(backend: Backend) {
    let server = ApiServer::for_test(backend).await;
    let registry = registry();
    // Turned off: planned as disabled, and never started.
    let off = manager(&server, &registry, &["*", "-probe"]);
    assert_eq!(placement(&off, "probe-controller"), (Placement::Disabled, None));
    let (shutdown, task) = start(off);
    eventually("the canary's writes", || {
        !writes_by(&server, "canary-controller").is_empty()
    })
    .await;
    shutdown.cancel();
    task.await.unwrap().unwrap();
    assert!(writes_by(&server, "probe-controller").is_empty());

    // Without migration (leader election alone): the main lock.
    let timings = LeaseTimings::new(
        Duration::from_secs(2),
        Duration::from_secs(1),
        Duration::from_millis(200),
    )
    .unwrap();
    let plain = ManagerConfig {
        component: "cloud-controller-manager".into(),
        clients: ClientFactory::new(
            server.config(),
            "cloud-controller-manager",
            "probe-host_2",
            1000.0,
            1000,
        ),
        leader_election: Some(LeaderElectionConfig::new(
            "kube-system",
            MAIN_LEASE,
            timings,
            LossPolicy::Exit,
        )),
        selection: ControllerSelection::parse(&["*"], registry.catalog()).unwrap(),
        controllers: ControllerSettings::defaults("test-cluster"),
    };
    let manager = Manager::new(
        plain,
        registry.clone(),
        Arc::new(ProbeCloud {
            greeting: "main".into(),
            ..ProbeCloud::default()
        }),
    );
    assert_eq!(
        placement(&manager, "probe-controller"),
        (
            Placement::Main {
                lease: MAIN_LEASE.into()
            },
            None
        )
    );
    let (shutdown, task) = start(manager);
    eventually("the probe's writes under the main lock", || {
        writes_by(&server, "probe-controller")
            .iter()
            .any(|w| w.user_agent.contains("probe-host_2"))
    })
    .await;
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[test]
fn another_providers_controller_is_skipped_with_a_reason() {
    let registry = registry();
    let definition = registry
        .get(registry.catalog().resolve("probe").unwrap().name)
        .unwrap();
    struct Other;
    impl CloudProvider for Other {
        fn provider_name(&self) -> &str {
            "other"
        }
    }
    assert_eq!(
        definition.skip_reason(&Other, &ControllerSettings::defaults("c")),
        Some("it belongs to cloud provider \"probe\", and --cloud-provider is \"other\"".to_owned())
    );
}

fn timings() -> LeaseTimings {
    LeaseTimings::new(
        Duration::from_secs(2),
        Duration::from_secs(1),
        Duration::from_millis(200),
    )
    .unwrap()
}

fn plain_manager(server: &ApiServer, identity: &str, provider: Arc<ProbeCloud>) -> Manager {
    warmed_manager(server, identity, provider, false)
}

/// As [`plain_manager`], with `--warm-standby` as `warm` says.
fn warmed_manager(server: &ApiServer, identity: &str, provider: Arc<ProbeCloud>, warm: bool) -> Manager {
    let mut election = LeaderElectionConfig::new("kube-system", MAIN_LEASE, timings(), LossPolicy::Exit);
    election.warm_standby = warm;
    let registry = registry();
    let config = ManagerConfig {
        component: "cloud-controller-manager".into(),
        clients: ClientFactory::new(
            server.config(),
            "cloud-controller-manager",
            identity,
            1000.0,
            1000,
        ),
        leader_election: Some(election),
        selection: ControllerSelection::parse(&["*"], registry.catalog()).unwrap(),
        controllers: ControllerSettings::defaults("test-cluster"),
    };
    Manager::new(config, registry, provider)
}

async fn only_the_leader_tells_its_provider_it_leads_and_the_provider_hears_when_that_ends(backend: Backend) {
    let server = ApiServer::for_test(backend).await;
    let leases: Api<Lease> = Api::namespaced(server.client(), "kube-system");
    let holder = || async {
        leases
            .get_opt(MAIN_LEASE)
            .await
            .unwrap()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
    };
    let first = Arc::new(ProbeCloud::default());
    let (first_stop, first_task) = start(plain_manager(&server, "first_1", first.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while holder().await.as_deref() != Some("first_1") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first manager never led"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = Arc::new(ProbeCloud::default());
    let (second_stop, second_task) = start(plain_manager(&server, "second_1", second.clone()));
    // The standby is campaigning: it has read the Lease.
    eventually("the standby reads the lease", || {
        server
            .requests()
            .iter()
            .any(|r| r.user_agent.contains("second_1/leader-election"))
    })
    .await;
    // The Lease names it before the manager has told its provider: wait for that too.
    eventually("the leader's provider hears it leads", || {
        first.leading.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(
        second.leading.load(Ordering::SeqCst),
        0,
        "a standby does no leader's work"
    );

    first_stop.cancel();
    first_task.await.unwrap().unwrap();
    assert_eq!(
        first.stopped.load(Ordering::SeqCst),
        1,
        "its stop fired when its leadership ended"
    );
    eventually("the second manager leads and its provider knows", || {
        second.leading.load(Ordering::SeqCst) == 1
    })
    .await;
    second_stop.cancel();
    second_task.await.unwrap().unwrap();
}

/// Whether `identity`'s shared caches have asked for the nodes.
fn listed_nodes(server: &ApiServer, identity: &str) -> bool {
    listed(server, identity, "/api/v1/nodes")
}

/// Whether `identity`'s shared caches have asked for `path`.
fn listed(server: &ApiServer, identity: &str, path: &str) -> bool {
    server.requests().iter().any(|r| {
        r.user_agent.contains(&format!("{identity}/shared-informers"))
            && r.path.split('?').next() == Some(path)
    })
}

async fn a_warm_standby_lists_before_it_leads_and_a_cold_one_does_not(backend: Backend) {
    let server = ApiServer::for_test(backend).await;
    hold_elsewhere(&server, MAIN_LEASE).await;
    let warm = Arc::new(ProbeCloud::default());
    let (warm_stop, warm_task) = start(warmed_manager(&server, "warm_1", warm.clone(), true));
    let cold = Arc::new(ProbeCloud::default());
    let (cold_stop, cold_task) = start(warmed_manager(&server, "cold_1", cold.clone(), false));
    eventually("the warm standby lists the nodes", || {
        listed_nodes(&server, "warm_1")
    })
    .await;
    // Both campaign: their caches (or none) were started before they first read the Lease.
    eventually("both standbys read the lease", || {
        let requests = server.requests();
        ["warm_1", "cold_1"].iter().all(|identity| {
            requests
                .iter()
                .any(|r| r.user_agent.contains(&format!("{identity}/leader-election")))
        })
    })
    .await;
    assert!(!listed_nodes(&server, "cold_1"), "a cold standby lists nothing");
    assert!(
        !listed(&server, "warm_1", "/api/v1/services"),
        "a warm standby fills only the caches its controllers read"
    );
    assert_eq!(
        warm.leading.load(Ordering::SeqCst),
        0,
        "the warm standby does not lead"
    );
    let writes: Vec<String> = server
        .requests()
        .into_iter()
        .filter(|r| r.is_write() && r.user_agent.contains("warm_1"))
        .map(|r| format!("{} {} ({})", r.method, r.path, r.user_agent))
        .collect();
    assert!(writes.is_empty(), "a warm standby writes nothing: {writes:?}");
    for (stop, task) in [(warm_stop, warm_task), (cold_stop, cold_task)] {
        stop.cancel();
        task.await.unwrap().unwrap();
    }
}

control_plane::on_both_backends!(
    a_warm_standby_lists_before_it_leads_and_a_cold_one_does_not,
    a_providers_controller_runs_under_the_migration_lock_the_configuration_gives_it,
    without_migration_it_runs_under_the_main_lock_and_controllers_can_turn_it_off,
    only_the_leader_tells_its_provider_it_leads_and_the_provider_hears_when_that_ends,
);
