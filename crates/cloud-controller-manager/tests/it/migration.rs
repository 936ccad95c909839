//! Leader migration across processes of the real binary, judged from the API server's records: its Lease
//! history and request log (a real kube-apiserver's audit log), audited by `ccm-audit`
//! (never from what the processes report). Each test runs on the test API server and on kube-apiserver.

use std::time::Duration;

use ccm_audit::{AuditReport, audit};
use control_plane::{ApiServer, Backend};
use harness::{Admin, Environment, Replica, Side, Timings, Workload, has_ingress, wait_for_holders};
use k8s_openapi::api::core::v1::{Node, Service};
use kube_ccm_fake::{FakeCloud, FakeCloudServer, Knobs};
use tokio_util::sync::CancellationToken;

const KCM: &str = "kube-controller-manager";
const CCM: &str = "cloud-controller-manager";
const MIGRATION: &str = "cloud-provider-extraction-migration";
const LEASES: [&str; 3] = [KCM, CCM, MIGRATION];
const WAIT: Duration = Duration::from_secs(30);

/// An API server (the test one or kube-apiserver), a fake cloud, and the environment replicas run in.
pub(crate) struct Plane {
    pub(crate) server: ApiServer,
    pub(crate) cloud: FakeCloudServer,
    pub(crate) environment: Environment,
    _directory: tempfile::TempDir,
}

impl Plane {
    pub(crate) async fn start(backend: Backend) -> Plane {
        Plane::on(ApiServer::for_test(backend).await).await
    }

    /// With RBAC enforced and TLS, as a real cluster serves kubectl (kube-apiserver always does both).
    pub(crate) async fn start_secure(backend: Backend) -> Plane {
        let server = match backend {
            Backend::Test => ApiServer::Test(
                kube_ccm_test_apiserver::TestApiServer::start_with(kube_ccm_test_apiserver::Config {
                    admin: true,
                    rbac: true,
                    tls: true,
                    ..kube_ccm_test_apiserver::Config::default()
                })
                .await
                .unwrap(),
            ),
            Backend::Kube => ApiServer::for_test(backend).await,
        };
        Plane::on(server).await
    }

    async fn on(server: ApiServer) -> Plane {
        let cloud = FakeCloudServer::start(
            FakeCloud::new(Vec::new(), Knobs::default()),
            ([127, 0, 0, 1], 0).into(),
        )
        .await
        .unwrap();
        let directory = tempfile::tempdir().unwrap();
        let environment = Environment::prepare(
            directory.path(),
            env!("CARGO_BIN_EXE_cloud-controller-manager").into(),
            server.kubeconfig_path().to_owned(),
            cloud.url(),
            Timings::fast(),
        )
        .unwrap();
        Plane {
            server,
            cloud,
            environment,
            _directory: directory,
        }
    }

    pub(crate) fn replica(&self, name: &str, side: Side) -> Replica {
        Replica::start(&self.environment, name, side).unwrap()
    }

    pub(crate) fn workload(
        &self,
    ) -> (
        CancellationToken,
        tokio::task::JoinHandle<anyhow::Result<harness::Created>>,
    ) {
        let stop = CancellationToken::new();
        let churn = Workload::new(self.server.client(), self.cloud.url()).churn(
            Duration::from_millis(150),
            0,
            stop.clone(),
        );
        (stop, churn)
    }

    /// The audit, after checking that the server refused none of the managers' writes as invalid.
    pub(crate) async fn audit(&self) -> AuditReport {
        let leases = self.server.lease_writes();
        let mut requests = self.server.request_entries();
        let invalid = harness::refused_as_invalid(&requests);
        assert!(invalid.is_empty(), "writes refused as invalid: {invalid:#?}");
        requests.extend(harness::cloud_writes(self.cloud.url()).await.unwrap());
        let governance = harness::expecting_upstream_peers(self.environment.governance().unwrap());
        audit(&leases, &requests, &governance)
    }

    /// Creates LoadBalancer service `web-<index>` and waits until whoever runs the service controller gives it
    /// an ingress.
    async fn serve_one_load_balancer(&self, index: u32) {
        Workload::new(self.server.client(), self.cloud.url())
            .add_service(index)
            .await
            .unwrap();
        let services: kube::Api<Service> = kube::Api::namespaced(self.server.client(), "default");
        let name = format!("web-{index}");
        let deadline = tokio::time::Instant::now() + WAIT;
        while !has_ingress(&services.get(&name).await.unwrap()) {
            assert!(tokio::time::Instant::now() < deadline, "{name} got no ingress");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every node is initialised and every LoadBalancer service has its ingress; fails with
    /// what is missing and `replicas`' logs.
    pub(crate) async fn wait_until_served(&self, replicas: &[&Replica]) {
        let client = self.server.client();
        let nodes: kube::Api<Node> = kube::Api::all(client.clone());
        let services: kube::Api<Service> = kube::Api::namespaced(client, "default");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let nodes = nodes.list(&Default::default()).await.unwrap().items;
            let services = services.list(&Default::default()).await.unwrap().items;
            let waiting = nodes.iter().filter(|n| !harness::initialized(n)).count()
                + services
                    .iter()
                    .filter(|s| harness::is_load_balancer(s) && !has_ingress(s))
                    .count();
            if waiting == 0 && !nodes.is_empty() {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{waiting} nodes and services not served:\n{}",
                replicas
                    .iter()
                    .map(|r| format!("--- {}\n{}", r.name, r.log_tail()))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the process `identity` has written as a controller (a node or service write the server
    /// accepted): the leader is at work.
    pub(crate) async fn until_writing(&self, identity: &str) {
        let marker = format!(" {identity}/");
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let writing = self.server.request_entries().iter().any(|r| {
                r.method != "GET"
                    && (200..300).contains(&r.status)
                    && r.user_agent.contains(&marker)
                    && (r.path.contains("/nodes/") || r.path.contains("/services/"))
            });
            if writing {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "{identity} never wrote");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until `holder` has renewed each of `leases` `times` more times from now.
    pub(crate) async fn until_renewed(&self, holder: &str, leases: &[&str], times: usize) {
        let renewals = |lease: &str| {
            self.server
                .lease_writes()
                .iter()
                .filter(|w| w.name == lease && w.holder_identity.as_deref() == Some(holder))
                .count()
        };
        let from: Vec<usize> = leases.iter().map(|l| renewals(l)).collect();
        let deadline = tokio::time::Instant::now() + WAIT;
        while leases
            .iter()
            .zip(&from)
            .any(|(lease, from)| renewals(lease) < from + times)
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{holder} stopped renewing"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Audits and fails with the overlaps and the replicas' logs when there is any.
    pub(crate) async fn assert_no_overlap(&self, replicas: &[&Replica]) -> AuditReport {
        let report = self.audit().await;
        if !report.overlaps.is_empty() {
            let logs: Vec<String> = replicas
                .iter()
                .map(|r| format!("--- {}\n{}", r.name, r.log_tail()))
                .collect();
            panic!(
                "overlaps: {:#?}\ntenures: {:#?}\n{}",
                report.overlaps,
                report.tenures,
                logs.join("\n")
            );
        }
        assert!(report.writes_checked > 0, "controllers wrote during the test");
        report
    }
}

fn identities(replicas: &mut [Replica]) -> Vec<String> {
    replicas.iter_mut().map(|r| r.identity(WAIT).unwrap()).collect()
}

async fn a_rolling_migration_from_three_kcm_to_three_ccm(backend: Backend) {
    let plane = Plane::start(backend).await;
    let client = plane.server.client();
    let mut kcms: Vec<Replica> = (1..=3)
        .map(|i| plane.replica(&format!("kcm-{i}"), Side::Kcm))
        .collect();
    let kcm_ids = identities(&mut kcms);
    // The N side: one kube-controller-manager holds its main lock and the migration lock.
    wait_for_holders(
        &client,
        &LEASES,
        WAIT,
        "a kube-controller-manager to hold both of its locks",
        |h| h[KCM].is_some() && h[KCM] == h[MIGRATION],
    )
    .await
    .unwrap();
    // The N side serves load balancers before the roll starts.
    plane.serve_one_load_balancer(9000).await;
    let (stop, churn) = plane.workload();

    // Roll: add a cloud-controller-manager, then remove a kube-controller-manager, one at a time.
    let mut ccms = Vec::new();
    for (index, kcm) in kcms.iter_mut().enumerate() {
        let mut ccm = plane.replica(&format!("ccm-{}", index + 1), Side::Ccm);
        ccm.identity(WAIT).unwrap();
        ccms.push(ccm);
        kcm.terminate().unwrap();
        assert!(
            kcm.wait(WAIT).unwrap().success(),
            "{} stops cleanly on SIGTERM",
            kcm.name
        );
        // Each step converges: exactly one live holder per lock that a live replica contends for.
        let live_ccm: Vec<String> = identities(&mut ccms);
        let live_kcm: Vec<String> = kcm_ids[index + 1..].to_vec();
        wait_for_holders(
            &client,
            &LEASES,
            WAIT,
            "the locks to settle on live replicas",
            |h| {
                let migration_ok = h[MIGRATION]
                    .as_ref()
                    .is_some_and(|m| live_kcm.contains(m) || live_ccm.contains(m));
                let ccm_ok = h[CCM].as_ref().is_some_and(|c| live_ccm.contains(c));
                let kcm_ok = if live_kcm.is_empty() {
                    h[KCM].is_none()
                } else {
                    h[KCM].as_ref().is_some_and(|k| live_kcm.contains(k))
                };
                migration_ok && ccm_ok && kcm_ok
            },
        )
        .await
        .unwrap();
    }
    let ccm_ids = identities(&mut ccms);
    let holders = wait_for_holders(
        &client,
        &LEASES,
        WAIT,
        "a cloud-controller-manager to hold the migration lock",
        |h| h[MIGRATION].as_ref().is_some_and(|m| ccm_ids.contains(m)) && h[CCM] == h[MIGRATION],
    )
    .await
    .unwrap();
    assert_eq!(
        holders[KCM], None,
        "every kube-controller-manager released its lock"
    );
    // The new side serves load balancers: a service created now gets its ingress from a cloud-controller-manager.
    plane.serve_one_load_balancer(9999).await;
    stop.cancel();
    churn.await.unwrap().unwrap();

    let report = plane
        .assert_no_overlap(&ccms.iter().chain(&kcms).collect::<Vec<_>>())
        .await;
    // The migrated controller worked on both sides of the migration (so the audit had writes to judge).
    let requests = plane.server.request_entries();
    let service_writes = |ids: &[String]| {
        requests
            .iter()
            .filter(|r| {
                (200..300).contains(&r.status)
                    && r.verb
                        .as_deref()
                        .is_some_and(|v| v != "get" && v != "list" && v != "watch")
            })
            .filter_map(|r| ccm_audit::UserAgent::parse(&r.user_agent))
            .filter(|ua| ua.controller == "service-lb-controller" && ids.contains(&ua.identity))
            .count()
    };
    assert!(
        service_writes(&kcm_ids) > 0 && service_writes(&ccm_ids) > 0,
        "service-lb writes: kcm {}, ccm {}",
        service_writes(&kcm_ids),
        service_writes(&ccm_ids)
    );
    let migration_handoffs: Vec<_> = report.handoffs.iter().filter(|h| h.lease == MIGRATION).collect();
    assert!(
        migration_handoffs
            .iter()
            .any(|h| kcm_ids.contains(&h.from) && ccm_ids.contains(&h.to)),
        "{migration_handoffs:#?}"
    );
    assert!(
        migration_handoffs.iter().all(|h| h.released),
        "every migration hand-off was a release: {migration_handoffs:#?}"
    );
    for ccm in &ccms {
        ccm.terminate().unwrap();
    }
    for ccm in &mut ccms {
        assert!(ccm.wait(WAIT).unwrap().success());
    }
}

/// Three cloud-controller-managers with the churn running; returns them with the leader's index.
async fn three_ccms(plane: &Plane) -> (Vec<Replica>, usize) {
    let mut ccms: Vec<Replica> = (1..=3)
        .map(|i| plane.replica(&format!("ccm-{i}"), Side::Ccm))
        .collect();
    let ids = identities(&mut ccms);
    let holders = wait_for_holders(
        &plane.server.client(),
        &LEASES,
        WAIT,
        "a leader of both locks",
        |h| h[CCM].is_some() && h[CCM] == h[MIGRATION],
    )
    .await
    .unwrap();
    let leader = ids
        .iter()
        .position(|id| Some(id) == holders[CCM].as_ref())
        .unwrap();
    (ccms, leader)
}

async fn sigkill_of_the_leader_fails_over_after_the_lease_duration(backend: Backend) {
    let plane = Plane::start(backend).await;
    let (mut ccms, leader) = three_ccms(&plane).await;
    let (stop, churn) = plane.workload();
    let old = ccms[leader].identity(WAIT).unwrap();
    plane.until_writing(&old).await;
    ccms[leader].kill().unwrap();
    ccms[leader].wait(WAIT).unwrap();
    wait_for_holders(
        &plane.server.client(),
        &LEASES,
        WAIT,
        "another replica to take over",
        |h| h[CCM].as_ref().is_some_and(|c| *c != old) && h[CCM] == h[MIGRATION],
    )
    .await
    .unwrap();
    stop.cancel();
    churn.await.unwrap().unwrap();
    let report = plane.assert_no_overlap(&ccms.iter().collect::<Vec<_>>()).await;
    let takeover = report
        .handoffs
        .iter()
        .find(|h| h.lease == CCM && h.from == old)
        .unwrap();
    assert!(!takeover.released);
    assert!(
        takeover.gap_ms >= 2000.0,
        "a crashed leader is replaced only after its lease expires: {takeover:?}"
    );
}

async fn sigterm_of_the_leader_hands_over_at_once(backend: Backend) {
    let plane = Plane::start(backend).await;
    let (mut ccms, leader) = three_ccms(&plane).await;
    let (stop, churn) = plane.workload();
    let old = ccms[leader].identity(WAIT).unwrap();
    plane.until_writing(&old).await;
    ccms[leader].terminate().unwrap();
    assert!(ccms[leader].wait(WAIT).unwrap().success(), "exits 0 on SIGTERM");
    wait_for_holders(
        &plane.server.client(),
        &LEASES,
        WAIT,
        "another replica to take over",
        |h| h[CCM].as_ref().is_some_and(|c| *c != old) && h[CCM] == h[MIGRATION],
    )
    .await
    .unwrap();
    stop.cancel();
    churn.await.unwrap().unwrap();
    let report = plane.assert_no_overlap(&ccms.iter().collect::<Vec<_>>()).await;
    for lease in [CCM, MIGRATION] {
        let handoff = report
            .handoffs
            .iter()
            .find(|h| h.lease == lease && h.from == old)
            .unwrap();
        assert!(handoff.released, "{handoff:?}");
        assert!(
            handoff.gap_ms < 1000.0,
            "a released lock is taken at once, not after the 2 s lease: {handoff:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_stops_before_it_is_replaced() {
    // A partition at the server: the test API server's fault (the chaos run cuts the network for real).
    let plane = Plane::start(Backend::Test).await;
    let (mut ccms, leader) = three_ccms(&plane).await;
    let (stop, churn) = plane.workload();
    let old = ccms[leader].identity(WAIT).unwrap();
    plane.until_writing(&old).await;
    // Cut the leader off: every request of its process hangs.
    Admin::new(plane.server.client())
        .add_fault(serde_json::json!({"user_agent": format!(" {old}/"), "action": {"type": "partition"}}))
        .await
        .unwrap();
    let status = ccms[leader].wait(WAIT).unwrap();
    assert_eq!(
        status.code(),
        Some(1),
        "a lost lock ends the process with 1, as upstream: {}",
        ccms[leader].log_tail()
    );
    wait_for_holders(
        &plane.server.client(),
        &LEASES,
        WAIT,
        "another replica to take over",
        |h| h[CCM].as_ref().is_some_and(|c| *c != old) && h[CCM] == h[MIGRATION],
    )
    .await
    .unwrap();
    stop.cancel();
    churn.await.unwrap().unwrap();
    plane.assert_no_overlap(&ccms.iter().collect::<Vec<_>>()).await;
}

async fn many_candidates_racing_for_free_locks_elect_one_leader_each(backend: Backend) {
    let plane = Plane::start(backend).await;
    let (stop, churn) = plane.workload();
    let mut ccms: Vec<Replica> = (1..=6)
        .map(|i| plane.replica(&format!("ccm-{i}"), Side::Ccm))
        .collect();
    let ids = identities(&mut ccms);
    let holders = wait_for_holders(&plane.server.client(), &LEASES, WAIT, "one leader", |h| {
        h[CCM].is_some() && h[CCM] == h[MIGRATION]
    })
    .await
    .unwrap();
    let holder = holders[CCM].clone().unwrap();
    assert!(ids.contains(&holder));
    // Long enough to flap, were it to: the holder renews each lock twice more while five others contend.
    plane.until_renewed(&holder, &[CCM, MIGRATION], 2).await;
    stop.cancel();
    churn.await.unwrap().unwrap();
    let report = plane.assert_no_overlap(&ccms.iter().collect::<Vec<_>>()).await;
    let tenures = |lease: &str| report.tenures.iter().filter(|t| t.lease == lease).count();
    assert_eq!(
        (tenures(CCM), tenures(MIGRATION)),
        (1, 1),
        "one acquisition per lock, no flapping: {:#?}",
        report.tenures
    );
}

/// A negative control: the audit catches the real mistake of a manager left without migration enabled,
/// which then runs the service controller under its own main lock next to the other side's.
async fn the_audit_catches_a_manager_that_runs_a_migrated_controller_outside_the_migration_lock(
    backend: Backend,
) {
    let plane = Plane::start(backend).await;
    let mut kcm = Replica::start_with(
        &plane.environment,
        "kcm-no-migration",
        Side::Kcm,
        &["--enable-leader-migration=false"],
    )
    .unwrap();
    let mut ccm = plane.replica("ccm-1", Side::Ccm);
    let (kcm_id, ccm_id) = (kcm.identity(WAIT).unwrap(), ccm.identity(WAIT).unwrap());
    wait_for_holders(
        &plane.server.client(),
        &LEASES,
        WAIT,
        "both managers leading",
        |h| {
            h[KCM].as_deref() == Some(kcm_id.as_str())
                && h[CCM].as_deref() == Some(ccm_id.as_str())
                && h[MIGRATION] == h[CCM]
        },
    )
    .await
    .unwrap();
    let workload = Workload::new(plane.server.client(), plane.cloud.url());
    for index in 0..3 {
        workload.add_service(index).await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let report = plane.audit().await;
        let caught = report.overlaps.iter().any(|o| {
            matches!(o,
            ccm_audit::Overlap::WriteOutsideTenure { identity, controller, lease, .. }
                if *identity == kcm_id && controller == "service-lb-controller" && lease == MIGRATION)
        });
        if caught {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the audit did not catch the unfenced controller: {:#?}",
            report.overlaps
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

control_plane::on_both_backends!(
    a_rolling_migration_from_three_kcm_to_three_ccm,
    sigkill_of_the_leader_fails_over_after_the_lease_duration,
    sigterm_of_the_leader_hands_over_at_once,
    many_candidates_racing_for_free_locks_elect_one_leader_each,
    the_audit_catches_a_manager_that_runs_a_migrated_controller_outside_the_migration_lock,
);
