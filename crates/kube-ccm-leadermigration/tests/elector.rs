//! The elector against the test API server and a real kube-apiserver over HTTP: acquisition, renewal,
//! release, fail-over, faults (test API server), interoperation with a client-go-style holder, and what a
//! standby costs.

use std::time::Duration;

use control_plane::{ApiServer, Backend, Credentials, KubeApiServer, KubeBinaries, KubeConfig, UserInfo};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_ccm_leadermigration::LeaseTimings;
use kube_ccm_leadermigration::elector::{ElectorConfig, Ended, LeaderElector, LeaderState, LossReason, Role};
use kube_ccm_test_apiserver::{FaultAction, FaultSpec};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const LEASE: &str = "test-lease";

fn config(identity: &str) -> ElectorConfig {
    ElectorConfig {
        namespace: "kube-system".into(),
        lease_name: LEASE.into(),
        identity: identity.into(),
        timings: LeaseTimings::new(
            Duration::from_secs(1),
            Duration::from_millis(700),
            Duration::from_millis(150),
        )
        .unwrap(),
        release_on_cancel: true,
    }
}

struct Candidate {
    state: watch::Receiver<LeaderState>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<Ended>,
}

impl Candidate {
    fn start(server: &ApiServer, identity: &str) -> Candidate {
        Candidate::start_with(server, &server.admin(), identity)
    }

    fn start_with(server: &ApiServer, credentials: &Credentials, identity: &str) -> Candidate {
        let client = server.client_with(credentials, &format!("test/0 {identity}/leader-election"));
        let (mut elector, state) = LeaderElector::new(client, config(identity)).unwrap();
        let cancel = CancellationToken::new();
        let token = cancel.clone();
        let task = tokio::spawn(async move { elector.run(&token).await });
        Candidate { state, cancel, task }
    }

    async fn leads(&mut self) {
        tokio::time::timeout(
            Duration::from_secs(10),
            self.state.wait_for(|s| s.role == Role::Leading),
        )
        .await
        .expect("leads in time")
        .expect("elector running");
    }

    async fn stop(self) -> Ended {
        self.cancel.cancel();
        self.task.await.unwrap()
    }
}

async fn acquires_renews_and_releases(backend: Backend) {
    let server = ApiServer::for_test(backend).await;
    let mut a = Candidate::start(&server, "a");
    a.leads().await;
    let state = a.state.borrow().clone();
    assert!(state.is_valid_leader(tokio::time::Instant::now()));
    // Wait for two renewals.
    let mut state_changes = a.state.clone();
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(5), state_changes.changed())
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(a.stop().await, Ended::Released);
    let history = server.leases();
    let leases: Vec<_> = history.iter().filter(|r| r.name == LEASE).collect();
    assert_eq!(leases.first().unwrap().operation, "create");
    assert!(leases.len() >= 3, "created, renewed, released: {leases:?}");
    assert!(
        leases
            .iter()
            .all(|r| r.lease_transitions == Some(0) && r.lease_duration_seconds.is_some())
    );
    let last = leases.last().unwrap();
    assert_eq!(
        (last.holder_identity.as_deref(), last.lease_duration_seconds),
        (None, Some(1)),
        "client-go's release record"
    );
    let renewals: Vec<&str> = leases.iter().filter_map(|r| r.renew_time.as_deref()).collect();
    assert!(
        renewals.windows(2).all(|w| w[0] < w[1]),
        "renewTime advances: {renewals:?}"
    );
}

async fn a_release_hands_over_at_once(backend: Backend) {
    let server = ApiServer::for_test(backend).await;
    let mut a = Candidate::start(&server, "a");
    a.leads().await;
    let mut b = Candidate::start(&server, "b");
    // b follows the lease with its watch; wait until it has seen a's record.
    tokio::time::timeout(
        Duration::from_secs(5),
        b.state.wait_for(|s| s.holder.as_deref() == Some("a")),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(a.stop().await, Ended::Released);
    b.leads().await;
    let history: Vec<_> = server.leases().into_iter().filter(|r| r.name == LEASE).collect();
    let released = history.iter().rposition(|r| r.holder_identity.is_none()).unwrap();
    let taken = &history[released + 1];
    assert_eq!(taken.holder_identity.as_deref(), Some("b"));
    assert_eq!(
        taken.lease_transitions,
        Some(1),
        "a created it (0); the release keeps the count; b's acquisition adds one"
    );
    let gap_ms = (taken.time_us - history[released].time_us) as f64 / 1000.0;
    assert!(
        gap_ms < 500.0,
        "hand-over took {gap_ms} ms, far below the 1 s lease duration"
    );
    b.stop().await;
}

async fn a_crashed_leader_is_replaced_after_the_lease_duration(backend: Backend) {
    let server = ApiServer::for_test(backend).await;
    let mut a = Candidate::start(&server, "a");
    a.leads().await;
    let mut b = Candidate::start(&server, "b");
    tokio::time::timeout(
        Duration::from_secs(5),
        b.state.wait_for(|s| s.holder.as_deref() == Some("a")),
    )
    .await
    .unwrap()
    .unwrap();
    // A crash: the elector stops without releasing (its task is aborted mid-flight).
    a.task.abort();
    b.leads().await;
    let history: Vec<_> = server.leases().into_iter().filter(|r| r.name == LEASE).collect();
    let taken = history
        .iter()
        .position(|r| r.holder_identity.as_deref() == Some("b"))
        .unwrap();
    let last_a = &history[taken - 1];
    assert_eq!(last_a.holder_identity.as_deref(), Some("a"));
    let gap_ms = (history[taken].time_us - last_a.time_us) as f64 / 1000.0;
    assert!(
        (1000.0..1600.0).contains(&gap_ms),
        "took over {gap_ms} ms after a's last renewal; the lease lasts 1000 ms"
    );
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_stops_before_anyone_takes_over() {
    let server = ApiServer::for_test(Backend::Test).await;
    let mut a = Candidate::start(&server, "a");
    a.leads().await;
    let mut b = Candidate::start(&server, "b");
    tokio::time::timeout(
        Duration::from_secs(5),
        b.state.wait_for(|s| s.holder.as_deref() == Some("a")),
    )
    .await
    .unwrap()
    .unwrap();
    server.as_test().unwrap().add_fault(FaultSpec {
        user_agent: Some(" a/leader-election".into()),
        action: FaultAction::Partition,
        duration_ms: None,
    });
    let ended = tokio::time::timeout(Duration::from_secs(5), a.task)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ended, Ended::Lost(LossReason::RenewDeadline));
    let a_stopped = std::time::Instant::now();
    b.leads().await;
    assert!(a_stopped.elapsed() > Duration::ZERO);
    // From the server's point of view: b acquired at least a lease duration after a's last successful write.
    let history: Vec<_> = server.leases().into_iter().filter(|r| r.name == LEASE).collect();
    let taken = history
        .iter()
        .position(|r| r.holder_identity.as_deref() == Some("b"))
        .unwrap();
    assert!(history[taken].time_us - history[taken - 1].time_us >= 1_000_000);
    b.stop().await;
}

async fn fields_it_does_not_own_survive(backend: Backend) {
    // The spec fields of coordinated leader election exist only with its feature gate on (off by
    // default, and so in the test API server): the real server is started with it.
    let server = match backend {
        Backend::Test => ApiServer::for_test(backend).await,
        Backend::Kube => ApiServer::Kube(Box::new(
            KubeApiServer::start(
                &KubeBinaries::find().unwrap(),
                &KubeConfig {
                    extra_flags: vec![
                        "--feature-gates=CoordinatedLeaderElection=true".into(),
                        // Its controller lists LeaseCandidates, a beta API off by default.
                        "--runtime-config=coordination.k8s.io/v1beta1=true".into(),
                    ],
                    ..KubeConfig::default()
                },
            )
            .await
            .unwrap(),
        )),
    };
    let leases: Api<Lease> = Api::namespaced(server.client(), "kube-system");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": LEASE, "labels": {"team": "cloud"}, "annotations": {"note": "kept"}},
        "spec": {"preferredHolder": "somebody", "strategy": "OldestEmulationVersion"},
    }))
    .unwrap();
    let created = leases
        .create(&PostParams::default(), &lease)
        .await
        .unwrap()
        .spec
        .unwrap();
    if backend == Backend::Kube {
        assert_eq!(created.preferred_holder.as_deref(), Some("somebody"));
    }
    let mut a = Candidate::start(&server, "a");
    a.leads().await;
    let after = leases.get(LEASE).await.unwrap();
    assert_eq!(after.metadata.labels.unwrap()["team"], "cloud");
    assert_eq!(after.metadata.annotations.unwrap()["note"], "kept");
    let spec = after.spec.unwrap();
    assert_eq!(spec.preferred_holder, created.preferred_holder);
    assert_eq!(spec.strategy, created.strategy);
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    // A label change by someone else makes the cached version stale: renewals carry on after a re-read.
    leases
        .patch(
            LEASE,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"extra": "1"}}})),
        )
        .await
        .unwrap();
    let mut renewals = a.state.clone();
    for _ in 0..3 {
        tokio::time::timeout(Duration::from_secs(5), renewals.changed())
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(a.state.borrow().role, Role::Leading);
    a.stop().await;
}

async fn waits_for_a_client_go_holder_then_takes_over(backend: Backend) {
    let server = ApiServer::for_test(backend).await;
    let leases: Api<Lease> = Api::namespaced(server.client(), "kube-system");
    // A Go kube-controller-manager's record: written with a remote clock we must not compare with ours.
    let go_record = |renew: &str| {
        json!({"spec": {
            "holderIdentity": "master-1_0b1c", "leaseDurationSeconds": 1, "leaseTransitions": 4,
            "acquireTime": "2020-01-01T00:00:00.000000Z", "renewTime": renew,
        }})
    };
    let lease: Lease = serde_json::from_value(
        json!({"metadata": {"name": LEASE}, "spec": go_record("2020-01-01T00:00:00.000000Z")["spec"]}),
    )
    .unwrap();
    leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut a = Candidate::start(&server, "a");
    // Although the renewTime is years old, the holder keeps renewing: a must wait.
    for second in 1..=4 {
        leases
            .patch(
                LEASE,
                &PatchParams::default(),
                &Patch::Merge(go_record(&format!("2020-01-01T00:00:0{second}.000000Z"))),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(a.state.borrow().role, Role::Standby, "the Go holder still renews");
    }
    a.leads().await;
    let lease = leases.get(LEASE).await.unwrap().spec.unwrap();
    assert_eq!(lease.lease_transitions, Some(5));
    assert_eq!(lease.holder_identity.as_deref(), Some("a"));
    // From the server's record, not samples of a's state: a took the Lease only after the Go holder's
    // last renewal had gone unrenewed for its lease duration (1 s), and never before.
    let history = server.lease_writes();
    let last_go = history
        .iter()
        .filter(|w| w.name == LEASE && w.holder_identity.as_deref() == Some("master-1_0b1c"))
        .map(|w| w.time_us)
        .max()
        .unwrap();
    let taken = history
        .iter()
        .filter(|w| w.name == LEASE && w.holder_identity.as_deref() == Some("a"))
        .map(|w| w.time_us)
        .min()
        .unwrap();
    assert!(
        taken - last_go >= 1_000_000,
        "taken {} µs after the last renewal",
        taken - last_go
    );
    a.stop().await;
}

async fn without_watch_permission_it_polls(backend: Backend) {
    let server = ApiServer::for_test(backend).await;
    if let Some(server) = server.as_test() {
        server.set_rbac(true);
    }
    // Upstream's default leader-locking roles grant get, create and update only.
    let rbac: [serde_json::Value; 2] = [
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "locking", "namespace": "kube-system"},
               "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "locking", "namespace": "kube-system"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "locking"},
               "subjects": [{"kind": "ServiceAccount", "name": "ccm", "namespace": "kube-system"}]}),
    ];
    let admin = server.client();
    for object in rbac {
        let kind = object["kind"].as_str().unwrap();
        let resource = kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "rbac.authorization.k8s.io",
            "v1",
            kind,
        ));
        let api: Api<kube::api::DynamicObject> =
            Api::namespaced_with(admin.clone(), "kube-system", &resource);
        api.create(&PostParams::default(), &serde_json::from_value(object).unwrap())
            .await
            .unwrap();
    }
    let token = server
        .mint(&UserInfo::service_account("kube-system", "ccm"))
        .await;
    let mut a = Candidate::start_with(&server, &token, "a");
    a.leads().await;
    let mut b = Candidate::start_with(&server, &token, "b");
    tokio::time::timeout(
        Duration::from_secs(5),
        b.state.wait_for(|s| s.holder.as_deref() == Some("a")),
    )
    .await
    .unwrap()
    .unwrap();
    a.task.abort();
    b.leads().await;
    let forbidden_watches = server.requests().iter().filter(|r| r.status == 403).count();
    assert!(forbidden_watches > 0, "the watch was refused, so b polled");
    b.stop().await;
}

async fn a_watching_standby_costs_almost_nothing(backend: Backend) {
    let server = ApiServer::for_test(backend).await;
    let mut a = Candidate::start(&server, "a");
    a.leads().await;
    let mut b = Candidate::start(&server, "b");
    tokio::time::timeout(
        Duration::from_secs(5),
        b.state.wait_for(|s| s.holder.as_deref() == Some("a")),
    )
    .await
    .unwrap()
    .unwrap();
    // The steady state starts once the standby's watch is open (its start-up costs a get, a list and the watch).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !server
        .requests()
        .iter()
        .any(|r| r.user_agent.contains(" b/") && r.verb.as_deref() == Some("watch"))
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the standby opened a watch"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let before = server
        .requests()
        .iter()
        .filter(|r| r.user_agent.contains(" b/"))
        .count();
    // Measure a quiet period in which a renews about ten times.
    let mut renewals = a.state.clone();
    for _ in 0..10 {
        tokio::time::timeout(Duration::from_secs(5), renewals.changed())
            .await
            .unwrap()
            .unwrap();
    }
    let after = server
        .requests()
        .iter()
        .filter(|r| r.user_agent.contains(" b/"))
        .count();
    assert_eq!(
        after, before,
        "the standby made no requests while the leader renewed"
    );
    let leader = server
        .requests()
        .iter()
        .filter(|r| r.user_agent.contains(" a/") && r.verb.as_deref() == Some("update"))
        .count();
    assert!(leader >= 10);
    a.stop().await;
    b.stop().await;
}

control_plane::on_both_backends!(
    acquires_renews_and_releases,
    a_release_hands_over_at_once,
    a_crashed_leader_is_replaced_after_the_lease_duration,
    fields_it_does_not_own_survive,
    waits_for_a_client_go_holder_then_takes_over,
    without_watch_permission_it_polls,
    a_watching_standby_costs_almost_nothing,
);
