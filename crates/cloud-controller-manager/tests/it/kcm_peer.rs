//! Issue 33's scenario 1, the seed guide's procedure from the real kube-controller-manager (the pinned
//! release, built by `cargo xtask kube`): three replicas at N hold its main Lease and the migration Lease
//! while nodes and LoadBalancer services keep arriving; the control plane rolls to N+1 node by node
//! (kube-controller-manager with the N+1 configuration, our manager with `--enable-leader-migration`),
//! then back. Judged from kube-apiserver's audit log and the fake cloud's log.
//!
//! Upstream's own behaviour shapes it: a kube-controller-manager of v1.31 or later has no cloud provider,
//! so it runs none of the migrated controllers, yet it contends for and holds the migration Lease whenever
//! leader migration is on, and never releases it. While it holds it the cloud controllers run nowhere;
//! `leader-migration status` says so (`HeldByExternalKubeControllerManager`) with the remedy, restarting
//! it without `--enable-leader-migration`, which the test then applies.
//!
//! Real server only: the peer is built beside kube-apiserver.

use std::path::Path;
use std::time::Duration;

use control_plane::{Backend, KubeBinaries};
use harness::{Environment, Replica, Side, wait_for_holders};

use crate::migration::Plane;
use crate::migration_status::{condition, conditions};

const KCM: &str = "kube-controller-manager";
const CCM: &str = "cloud-controller-manager";
const MIGRATION: &str = "cloud-provider-extraction-migration";
const LEASES: [&str; 3] = [KCM, CCM, MIGRATION];
const WAIT: Duration = Duration::from_secs(60);
const LOCKS: &str = "MigrationLocksOnCloudSide";

/// A real kube-controller-manager replica: only the controller the scenario needs (its node-lifecycle
/// controller would evict these kubelet-less nodes), the service-account key that controller must
/// have, the shared election timings, and leader migration with `config`.
fn kcm(environment: &Environment, sa_key: &Path, name: &str, config: Option<&Path>) -> Replica {
    let mut args = vec![
        format!("--kubeconfig={}", environment.kubeconfig.display()),
        "--bind-address=127.0.0.1".to_owned(),
        "--secure-port=0".to_owned(),
        "--cloud-provider=external".to_owned(),
        "--leader-elect=true".to_owned(),
        format!("--service-account-private-key-file={}", sa_key.display()),
        // v1.37 no longer lists the cloud controllers (naming them is an error); the token controller
        // is the one whose start opens the migration election.
        "--controllers=serviceaccount-token-controller".to_owned(),
    ];
    args.extend(environment.timing_flags());
    if let Some(config) = config {
        args.push("--enable-leader-migration".to_owned());
        args.push(format!("--leader-migration-config={}", config.display()));
    }
    Replica::spawn(environment, name, Side::Kcm, &args).unwrap()
}

/// `MigrationLocksOnCloudSide`'s status and reason now.
async fn locks(kubeconfig: &Path) -> (String, String) {
    let (_, all) = conditions(kubeconfig).await;
    let (status, reason) = condition(&all, LOCKS);
    (status.to_owned(), reason.to_owned())
}

#[test]
fn from_the_real_kube_controller_manager_to_ours_and_back() {
    crate::support::with_kube_binaries("from_the_real_kube_controller_manager_to_ours_and_back", scenario);
}

async fn scenario(binaries: KubeBinaries) {
    let plane = Plane::start(Backend::Kube).await;
    let client = plane.server.client();
    let kubeconfig = plane.server.kubeconfig_path().to_owned();
    let sa_key = plane.server.as_kube().unwrap().dir().join("sa.key");
    let environment = &plane.environment;
    let mut kcm_environment = environment.clone();
    kcm_environment.binary = binaries.kube_controller_manager.clone();
    let start_kcm = |name: &str, config: Option<&Path>| kcm(&kcm_environment, &sa_key, name, config);

    // N: three kube-controller-managers with the N configuration.
    let mut n: Vec<Replica> = (1..=3)
        .map(|i| start_kcm(&format!("kcm-n-{i}"), Some(&environment.kcm_config)))
        .collect();
    wait_for_holders(
        &client,
        &LEASES,
        WAIT,
        "a kube-controller-manager to hold its main and migration Leases",
        |h| h[KCM].is_some() && h[KCM] == h[MIGRATION],
    )
    .await
    .unwrap_or_else(|e| {
        let logs: Vec<String> = n
            .iter()
            .map(|r| format!("--- {}\n{}", r.name, r.log_tail()))
            .collect();
        panic!("{e}\n{}", logs.join("\n"))
    });
    let (stop, churn) = plane.workload();
    // It runs no cloud controller (v1.37 has no cloud provider), and status says so with the remedy.
    assert_eq!(
        locks(&kubeconfig).await,
        (
            "False".to_owned(),
            "HeldByExternalKubeControllerManager".to_owned()
        )
    );

    // Roll to N+1, one control-plane node at a time: its kube-controller-manager with the N+1
    // configuration, and our manager beside it.
    let (mut n1, mut ccms, mut ccm_ids) = (Vec::new(), Vec::new(), Vec::new());
    for (index, old) in n.iter_mut().enumerate() {
        old.terminate().unwrap();
        old.wait(WAIT).unwrap();
        n1.push(start_kcm(
            &format!("kcm-n1-{}", index + 1),
            Some(&environment.ccm_config),
        ));
        let mut ccm = plane.replica(&format!("ccm-{}", index + 1), Side::Ccm);
        ccm_ids.push(ccm.identity(WAIT).unwrap());
        ccms.push(ccm);
    }
    let holders = wait_for_holders(&client, &LEASES, WAIT, "ours to lead its main Lease", |h| {
        h[CCM].as_ref().is_some_and(|c| ccm_ids.contains(c)) && h[KCM].is_some()
    })
    .await
    .unwrap();
    // Whoever won the migration Lease in the roll: a kube-controller-manager at N+1 runs nothing with
    // it, and status says so; ours runs the migrated controllers.
    let kcm_held_it = holders[MIGRATION].as_ref().is_some_and(|m| !ccm_ids.contains(m));
    let expected = if kcm_held_it {
        ("False", "HeldByExternalKubeControllerManager")
    } else {
        ("True", "OnCloudSide")
    };
    let (status, reason) = locks(&kubeconfig).await;
    assert_eq!((status.as_str(), reason.as_str()), expected, "{holders:?}");

    // The remedy: kube-controller-manager without leader migration, node by node.
    let mut plain = Vec::new();
    for (index, old) in n1.iter_mut().enumerate() {
        old.terminate().unwrap();
        old.wait(WAIT).unwrap();
        plain.push(start_kcm(&format!("kcm-plain-{}", index + 1), None));
    }
    wait_for_holders(&client, &LEASES, WAIT, "ours to hold the migration Lease", |h| {
        h[MIGRATION].as_ref().is_some_and(|m| ccm_ids.contains(m)) && h[MIGRATION] == h[CCM]
    })
    .await
    .unwrap();
    assert_eq!(
        locks(&kubeconfig).await,
        ("True".to_owned(), "OnCloudSide".to_owned())
    );
    // Every node and service that arrived meanwhile is served by ours.
    plane.wait_until_served(&ccms.iter().collect::<Vec<_>>()).await;

    // Rollback, node by node: ours out, kube-controller-manager back to N with leader migration.
    let mut back = Vec::new();
    for (index, (old, ccm)) in plain.iter_mut().zip(&mut ccms).enumerate() {
        old.terminate().unwrap();
        old.wait(WAIT).unwrap();
        back.push(start_kcm(
            &format!("kcm-back-{}", index + 1),
            Some(&environment.kcm_config),
        ));
        ccm.terminate().unwrap();
        let status = ccm.wait(WAIT).unwrap();
        assert!(status.success(), "{} exits 0 on SIGTERM: {status}", ccm.name);
    }
    wait_for_holders(
        &client,
        &LEASES,
        WAIT,
        "a kube-controller-manager to hold the migration Lease again",
        |h| h[MIGRATION].as_ref().is_some_and(|m| !ccm_ids.contains(m)) && h[CCM].is_none(),
    )
    .await
    .unwrap();
    stop.cancel();
    churn.await.unwrap().unwrap();

    // The record: no write outside its writer's tenure; kube-controller-manager never wrote a node or
    // a service (it has no cloud controller); the migration Lease's hand-offs both ways.
    let everyone: Vec<&Replica> = n
        .iter()
        .chain(&n1)
        .chain(&plain)
        .chain(&back)
        .chain(&ccms)
        .collect();
    let report = plane.assert_no_overlap(&everyone).await;
    let kcm_writes: Vec<String> = plane
        .server
        .request_entries()
        .into_iter()
        .filter(|r| r.user_agent.starts_with("kube-controller-manager/") && r.method != "GET")
        .filter(|r| r.path.contains("/nodes") || r.path.contains("/services"))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(kcm_writes.is_empty(), "{kcm_writes:#?}");
    let migration: Vec<_> = report.handoffs.iter().filter(|h| h.lease == MIGRATION).collect();
    let to_ours: Vec<_> = migration
        .iter()
        .filter(|h| !ccm_ids.contains(&h.from) && ccm_ids.contains(&h.to))
        .collect();
    let to_kcm: Vec<_> = migration
        .iter()
        .filter(|h| ccm_ids.contains(&h.from) && !ccm_ids.contains(&h.to))
        .collect();
    assert!(!to_ours.is_empty() && !to_kcm.is_empty(), "{migration:#?}");
    // kube-controller-manager never releases: ours waits for the record to expire (2 s). Ours
    // releases on SIGTERM; a kube-controller-manager contends for the migration Lease only once it
    // holds its main Lease, which the one it replaced did not release either.
    for handoff in &to_ours {
        assert!(!handoff.released && handoff.gap_ms >= 1000.0, "{handoff:?}");
    }
    for handoff in &to_kcm {
        assert!(handoff.released, "{handoff:?}");
    }
    #[allow(clippy::print_stderr)]
    {
        let gaps = |list: &[&&ccm_audit::Handoff]| {
            list.iter()
                .map(|h| format!("{:.0} ms", h.gap_ms))
                .collect::<Vec<_>>()
                .join(", ")
        };
        eprintln!(
            "migration Lease hand-offs, kube-controller-manager → ours: {}; ours → kube-controller-manager: {}; \
             {} writes judged; status at N+1 before the remedy: {reason}",
            gaps(&to_ours),
            gaps(&to_kcm),
            report.writes_checked
        );
    }
}
