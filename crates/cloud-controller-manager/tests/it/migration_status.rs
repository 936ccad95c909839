//! `leader-migration status` and `preflight` against the test API server and a real kube-apiserver: status
//! through a real migration of the binary's replicas (before, mid-roll, after, after a rollback),
//! preflight with RBAC on (real SelfSubjectAccessReviews and SubjectAccessReviews on kube-apiserver).

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use control_plane::{ApiServer, Backend, UserInfo};
use harness::{Replica, Side, Workload, wait_for_holders};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use crate::deploy::{kubeconfig_for, kubectl};
use crate::migration::Plane;
use crate::support::{SvgTenure, binary, repo_root, stderr, stdout, svg_tenures};

const KCM: &str = "kube-controller-manager";
const CCM: &str = "cloud-controller-manager";
const MIGRATION: &str = "cloud-provider-extraction-migration";
const WAIT: Duration = Duration::from_secs(30);

/// `leader-migration ARGS…` against the cluster of `kubeconfig`, off the async runtime.
pub(crate) async fn tool(kubeconfig: &Path, args: &[&str]) -> Output {
    let mut command = binary();
    command
        .arg("leader-migration")
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .current_dir(repo_root());
    tokio::task::spawn_blocking(move || command.output().expect("run cloud-controller-manager"))
        .await
        .unwrap()
}

/// The conditions of `status --output json`, as `type → (status, reason)`.
pub(crate) async fn conditions(kubeconfig: &Path) -> (Value, Vec<(String, String, String)>) {
    let output = tool(kubeconfig, &["status", "--output", "json"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let document: Value = serde_json::from_str(&stdout(&output)).unwrap();
    let conditions = document["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["type"].as_str().unwrap().to_owned(),
                c["status"].as_str().unwrap().to_owned(),
                c["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    (document, conditions)
}

pub(crate) fn condition<'a>(conditions: &'a [(String, String, String)], kind: &str) -> (&'a str, &'a str) {
    let (_, status, reason) = conditions.iter().find(|(k, _, _)| k == kind).unwrap();
    (status, reason)
}

/// The mirror pod of a static controller-manager pod on `host`, with its command line.
pub(crate) async fn mirror_pod(server: &ApiServer, component: &str, host: &str, flags: &[&str]) {
    let mut command = vec![component];
    command.extend(flags);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("{component}-{host}"), "labels": {"component": component, "tier": "control-plane"}},
        "spec": {"nodeName": host, "containers": [{"name": component, "image": format!("registry.k8s.io/{component}:v1.33.0"), "command": command}]},
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "kube-system");
    let name = pod.metadata.name.clone().unwrap();
    if pods.get_opt(&name).await.unwrap().is_some() {
        // At once: a real server otherwise waits for the node's kubelet, which these tests do not run.
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        pods.delete(&name, &now).await.unwrap();
    }
    pods.create(&PostParams::default(), &pod).await.unwrap();
}

pub(crate) async fn wait_for_holder(plane: &Plane, lease: &str, id: &str, what: &str) {
    wait_for_holders(&plane.server.client(), &[lease], WAIT, what, |h| {
        h[lease].as_deref() == Some(id)
    })
    .await
    .unwrap();
}

/// A migration played on a plane, one control-plane host at a time: the binary's replicas join and
/// leave, and the managers' mirror pods show their command lines, as at each stage of the seed guide.
pub(crate) struct Stages<'a> {
    plane: &'a Plane,
    kcm: Replica,
    ccm: Option<Replica>,
    back: Option<Replica>,
    /// kcm-1's identity (version N).
    pub(crate) kcm_id: String,
    /// ccm-1's (N+1), once it joined.
    pub(crate) ccm_id: String,
    /// kcm-2's (N again, after the rollback), once it joined.
    pub(crate) back_id: String,
}

impl<'a> Stages<'a> {
    /// Version N: kube-controller-manager (kcm-1) with its in-tree provider and Leader Migration holds the
    /// migration lock; one node is registered.
    pub(crate) async fn before(plane: &'a Plane) -> Stages<'a> {
        let mut kcm = plane.replica("kcm-1", Side::Kcm);
        let kcm_id = kcm.identity(WAIT).unwrap();
        mirror_pod(
            &plane.server,
            KCM,
            "cp1",
            &["--cloud-provider=fake", "--enable-leader-migration"],
        )
        .await;
        wait_for_holder(plane, MIGRATION, &kcm_id, "kcm-1 to hold the migration lock").await;
        Workload::new(plane.server.client(), plane.cloud.url())
            .add_node(1)
            .await
            .unwrap();
        Stages {
            plane,
            kcm,
            ccm: None,
            back: None,
            kcm_id,
            ccm_id: String::new(),
            back_id: String::new(),
        }
    }

    /// An N+1 host: cloud-controller-manager (ccm-1) joins and leads its main Lease; kcm-1 still runs.
    pub(crate) async fn mid_roll(&mut self) {
        let mut ccm = self.plane.replica("ccm-1", Side::Ccm);
        self.ccm_id = ccm.identity(WAIT).unwrap();
        mirror_pod(
            &self.plane.server,
            CCM,
            "cp2",
            &["--cloud-provider=fake", "--enable-leader-migration"],
        )
        .await;
        wait_for_holder(self.plane, CCM, &self.ccm_id, "ccm-1 to hold its main Lease").await;
        self.ccm = Some(ccm);
    }

    /// The last N host goes (kcm-1 stops); kube-controller-manager N+1 runs with an external provider and
    /// without Leader Migration.
    pub(crate) async fn after(&mut self) {
        self.kcm.terminate().unwrap();
        assert!(self.kcm.wait(WAIT).unwrap().success());
        mirror_pod(&self.plane.server, KCM, "cp1", &["--cloud-provider=external"]).await;
    }

    /// Rollback: an N host comes back (kcm-2), the N+1 one goes (ccm-1 stops). Does not wait for the
    /// migration lock to move: that is what the caller checks.
    pub(crate) async fn rollback(&mut self) {
        let mut back = self.plane.replica("kcm-2", Side::Kcm);
        self.back_id = back.identity(WAIT).unwrap();
        mirror_pod(
            &self.plane.server,
            KCM,
            "cp1",
            &["--cloud-provider=fake", "--enable-leader-migration"],
        )
        .await;
        let mut ccm = self.ccm.take().expect("mid_roll first");
        ccm.terminate().unwrap();
        assert!(ccm.wait(WAIT).unwrap().success());
        self.back = Some(back);
    }

    /// Stops what still runs, each cleanly.
    pub(crate) fn stop(self) {
        for mut replica in self.ccm.into_iter().chain(self.back) {
            replica.terminate().unwrap();
            assert!(replica.wait(WAIT).unwrap().success());
        }
    }
}

async fn status_follows_a_migration_and_its_rollback(backend: Backend) {
    let plane = Plane::start(backend).await;
    let kubeconfig = plane.server.kubeconfig_path().to_owned();

    // An empty cluster proves nothing: no nodes, no pods, no Leases.
    let (_, empty) = conditions(&kubeconfig).await;
    assert_eq!(condition(&empty, "Completed").0, "False");
    assert_eq!(condition(&empty, "NodesInitialized"), ("Unknown", "NoNodes"));
    assert_eq!(
        condition(&empty, "KubeControllerManagerLeading"),
        ("False", "LeaseAbsent")
    );

    // Before: version N, kube-controller-manager with the in-tree provider runs the cloud controllers.
    let mut stages = Stages::before(&plane).await;
    let kcm_id = stages.kcm_id.clone();
    let (document, before) = conditions(&kubeconfig).await;
    assert_eq!(
        condition(&before, "KubeControllerManagerLeading"),
        ("True", "Held")
    );
    assert_eq!(
        condition(&before, "CloudControllerManagerLeading"),
        ("False", "LeaseAbsent")
    );
    assert_eq!(
        condition(&before, "MigrationLocksOnCloudSide"),
        ("False", "HeldByKubeControllerManager")
    );
    assert_eq!(
        condition(&before, "KubeControllerManagerExternal"),
        ("False", "InTreeCloudProvider")
    );
    assert_eq!(condition(&before, "Completed"), ("False", "InProgress"));
    let migration_lease = document["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == MIGRATION)
        .unwrap();
    assert_eq!(migration_lease["holder"], kcm_id.as_str());
    assert_eq!(
        migration_lease["component"], KCM,
        "attributed by the main Lease's holder"
    );
    // Waiting for completion now times out, with the status printed and exit 1.
    let waited = tool(
        &kubeconfig,
        &["status", "--wait-for", "Completed", "--timeout", "2s"],
    )
    .await;
    assert_eq!(waited.status.code(), Some(1), "{}", stdout(&waited));
    assert!(
        stderr(&waited).contains("timed out after 2s waiting for Completed=True"),
        "{}",
        stderr(&waited)
    );
    assert!(
        stdout(&waited).contains("MigrationLocksOnCloudSide"),
        "{}",
        stdout(&waited)
    );

    // Mid-roll: N+1 on one control-plane host, kube-controller-manager N still on another.
    stages.mid_roll().await;
    let ccm_id = stages.ccm_id.clone();
    let (_, mid) = conditions(&kubeconfig).await;
    assert_eq!(condition(&mid, "CloudControllerManagerLeading"), ("True", "Held"));
    assert_eq!(
        condition(&mid, "MigrationLocksOnCloudSide"),
        ("False", "HeldByKubeControllerManager")
    );
    assert_eq!(condition(&mid, "Completed").0, "False");

    // After: kube-controller-manager N+1 runs without a cloud provider; the migration lock moves.
    stages.after().await;
    let done = tool(
        &kubeconfig,
        &["status", "--wait-for", "Completed", "--timeout", "30s"],
    )
    .await;
    assert_eq!(done.status.code(), Some(0), "{}{}", stdout(&done), stderr(&done));
    let text = stdout(&done);
    assert!(
        text.contains("every migration lock is held by the cloud-controller-manager's leader"),
        "{text}"
    );
    assert!(
        text.contains("NODES: 1 of 1 initialised by the cloud provider"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with(MIGRATION) && l.contains(&ccm_id) && l.contains(CCM)),
        "{text}"
    );

    // Rollback: kube-controller-manager N comes back, the cloud-controller-manager goes.
    stages.rollback().await;
    let back_id = stages.back_id.clone();
    wait_for_holder(
        &plane,
        MIGRATION,
        &back_id,
        "kcm-2 to take the migration lock back",
    )
    .await;
    let rolled_back = tool(
        &kubeconfig,
        &[
            "status",
            "--wait-for",
            "MigrationLocksOnCloudSide=False/HeldByKubeControllerManager",
            "--timeout",
            "30s",
            "--output",
            "json",
        ],
    )
    .await;
    assert_eq!(rolled_back.status.code(), Some(0), "{}", stderr(&rolled_back));
    // The Lease history the cluster shows (the managers' LeaderElection Events), drawn.
    let directory = tempfile::tempdir().unwrap();
    let report = directory.path().join("status.svg");
    let drawn = tool(&kubeconfig, &["status", "--report", report.to_str().unwrap()]).await;
    assert_eq!(drawn.status.code(), Some(0), "{}", stderr(&drawn));
    let text = std::fs::read_to_string(&report).unwrap();
    let svg = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{e}:\n{text}"));
    let drawn = svg_tenures(&svg);
    let tenures = |lease: &str| -> Vec<(String, String, bool)> {
        let mut found: Vec<&SvgTenure> = drawn.iter().filter(|t| t.0 == lease).collect();
        found.sort_by_key(|t| t.3);
        found
            .into_iter()
            .map(|t| (t.1.clone(), t.2.clone(), t.4.is_none()))
            .collect()
    };
    assert_eq!(
        tenures(MIGRATION),
        [
            (kcm_id.clone(), KCM.to_owned(), false),
            (ccm_id.clone(), CCM.to_owned(), false),
            (back_id.clone(), KCM.to_owned(), true),
        ],
        "{text}"
    );
    assert_eq!(tenures(CCM), [(ccm_id.clone(), CCM.to_owned(), false)], "{text}");
    assert!(text.contains("LeaderElection Event(s)"), "{text}");
    let (_, after) = conditions(&kubeconfig).await;
    assert_eq!(
        condition(&after, "CloudControllerManagerLeading"),
        ("False", "Released")
    );
    assert_eq!(condition(&after, "Completed"), ("False", "InProgress"));
    stages.stop();
}

// Multi-threaded: kubectl runs on one worker while the test API server answers on the other.
async fn preflight_checks_lease_access_as_the_api_server_decides_it(backend: Backend) {
    // As a real cluster serves kubectl: over TLS, with RBAC.
    let plane = Plane::start_secure(backend).await;
    let server = &plane.server;
    let directory = tempfile::tempdir().unwrap();
    // The cloud-controller-manager's identity, allowed to delegate authorisation checks (as a CCM is).
    let kubeconfig = kubeconfig_for(
        server,
        directory.path(),
        "ccm.kubeconfig",
        UserInfo {
            name: "system:cloud-controller-manager".into(),
            groups: vec!["system:authenticated".into()],
        },
    )
    .await;
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "ccm-auth-delegator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "system:cloud-controller-manager"}],
    }))
    .unwrap();
    Api::all(server.client())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let preflight = [
        "preflight",
        "--component",
        CCM,
        "--config",
        "examples/leader-migration/n-plus-1.yaml",
        "--other-user",
        "system:kube-controller-manager",
        "--cloud-provider",
        "fake",
        "--allow-untagged-cloud",
        "--cluster-cidr",
        "10.244.0.0/16",
    ];

    let output = tool(&kubeconfig, &preflight).await;
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{text}{}", stderr(&output));
    assert!(
        text.contains("PASS  configuration: examples/leader-migration/n-plus-1.yaml"),
        "{text}"
    );
    assert!(text.contains("PASS  lease names"), "{text}");
    assert!(
        text.contains("FAIL  access (cloud-controller-manager, as this kubeconfig's user): cloud-controller-manager may not create leases; get, list, watch, update leases/cloud-controller-manager; get, list, watch, update leases/cloud-provider-extraction-migration in kube-system"),
        "{text}"
    );
    // kube-controller-manager's bootstrap Role (`system::leader-locking-kube-controller-manager`) lets it
    // use every Lease in kube-system, the migration Lease too.
    assert!(
        text.contains(&format!(
            "PASS  access (kube-controller-manager, as system:kube-controller-manager): may use Lease(s) kube-controller-manager, {MIGRATION} in kube-system"
        )),
        "{text}"
    );
    assert!(
        text.contains("fix: grant it: `cloud-controller-manager leader-migration rbac --namespace kube-system --config examples/leader-migration/n-plus-1.yaml | kubectl apply -f -`"),
        "{text}"
    );

    // The fix it names, applied with kubectl: the RBAC the rbac command prints, and the shipped role of the
    // cloud-controller-manager's main Lease.
    let rbac = crate::support::run(&[
        "leader-migration",
        "rbac",
        "--config",
        "examples/leader-migration/n-plus-1.yaml",
    ]);
    assert_eq!(rbac.status.code(), Some(0), "{}", stderr(&rbac));
    let printed = directory.path().join("migration-rbac.yaml");
    std::fs::write(&printed, &rbac.stdout).unwrap();
    for file in [printed.to_str().unwrap(), "deploy/rbac/leader-election-rbac.yaml"] {
        kubectl(
            Some(server.kubeconfig_path()),
            &["apply", "--server-side", "-f", file],
        );
    }
    let output = tool(&kubeconfig, &preflight).await;
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}{}", stderr(&output));
    assert_eq!(
        text.lines().filter(|l| l.starts_with("PASS")).count(),
        6,
        "{text}"
    );
    assert!(text.ends_with("all checks passed\n"), "{text}");

    // Routes taken over without a cluster CIDR would run nowhere.
    let routes = &preflight[..preflight.len() - 2];
    let output = tool(&kubeconfig, routes).await;
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("FAIL  controllers:")
            && l.contains("node-route-controller (--cluster-cidr is not set")),
        "{text}"
    );
}

control_plane::on_both_backends!(
    status_follows_a_migration_and_its_rollback,
    preflight_checks_lease_access_as_the_api_server_decides_it,
);
