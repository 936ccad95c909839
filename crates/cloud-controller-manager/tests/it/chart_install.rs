//! The Helm chart on a real kube-apiserver, with the real `helm`: installed with Leader Migration on, every
//! object accepted; the manager run with the arguments of the Deployment the server stores and the chart's
//! service account's token, doing its work with 0 refused requests; upgraded to migration off, then to no
//! migration RBAC and per-controller credentials, the manager run again after each; uninstalled, leaving no
//! object of the chart. The DaemonSet kind installs and uninstalls too. Judged from kube-apiserver's audit
//! log.
//!
//! Nothing runs the pods (no kubelet, no kube-controller-manager), so helm never waits (`--wait` would
//! wait for status no one writes) and uninstall takes the default background cascade.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use control_plane::{Backend, KubeBinaries, RequestRecord, UserInfo};
use harness::{Replica, Side, Workload, has_ingress, initialized};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams};
use serde_json::Value;

use crate::deploy::{flag, kubeconfig_for, kubectl, localized, refused, stop_gracefully};
use crate::migration::Plane;
use crate::support::{free_port, repo_root, stderr, stdout};
use crate::upstream_rbac::wait;

const CHART: &str = "charts/cloud-controller-manager";
const RELEASE: &str = "ccm";
const NAMESPACE: &str = "kube-system";
const CCM: &str = "cloud-controller-manager";
const SERVICE_ACCOUNT: &str = "system:serviceaccount:kube-system:cloud-controller-manager";
const MIGRATION: &str = "cloud-provider-extraction-migration";
/// helm's `User-Agent` (`internal/version.GetUserAgent`).
const HELM_AGENT: &str = "Helm/";

/// `helm` against the cluster of `kubeconfig`, with a scratch home.
struct Helm {
    binary: PathBuf,
    kubeconfig: PathBuf,
    home: tempfile::TempDir,
}

impl Helm {
    /// Runs `helm ARGS -n kube-system`, which must succeed; its stdout.
    fn run(&self, args: &[&str]) -> String {
        let home = self.home.path();
        let output = Command::new(&self.binary)
            .args(args)
            .args(["--namespace", NAMESPACE])
            .current_dir(repo_root())
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .output()
            .expect("helm runs");
        assert!(
            output.status.success(),
            "helm {args:?} failed ({}):\n{}{}",
            output.status,
            stdout(&output),
            stderr(&output)
        );
        stdout(&output)
    }

    /// The release's objects as helm last applied them, written to `path` for kubectl.
    fn manifest(&self, path: PathBuf) -> (PathBuf, Vec<Value>) {
        let text = self.run(&["get", "manifest", RELEASE]);
        std::fs::write(&path, &text).unwrap();
        let objects: Vec<Value> = serde_saphyr::from_multiple::<Value>(&text)
            .expect("helm's manifest is YAML")
            .into_iter()
            .filter(|o| o.is_object())
            .collect();
        assert!(!objects.is_empty(), "the release has objects");
        (path, objects)
    }
}

fn values(example: &str) -> String {
    format!("{CHART}/examples/values-{example}.yaml")
}

/// Which objects of `manifest` the server has, as `kind/name`.
fn present(admin: &Path, manifest: &Path) -> Vec<String> {
    let output = kubectl(
        Some(admin),
        &[
            "get",
            "-f",
            manifest.to_str().unwrap(),
            "--ignore-not-found",
            "-o",
            "name",
        ],
    );
    stdout(&output).lines().map(str::to_owned).collect()
}

fn assert_every_object_stored(admin: &Path, (manifest, objects): &(PathBuf, Vec<Value>)) {
    let stored = present(admin, manifest);
    assert_eq!(
        stored.len(),
        objects.len(),
        "every object of the release is stored; the server has {stored:#?}"
    );
}

/// helm's requests that failed, but for the reads of objects that did not exist yet (its checks before
/// creating).
fn helm_failures(requests: &[RequestRecord]) -> Vec<String> {
    requests
        .iter()
        .filter(|r| r.user_agent.starts_with(HELM_AGENT) && r.status >= 400)
        .filter(|r| !(r.status == 404 && r.verb.as_deref() == Some("get")))
        .map(|r| format!("{} {} {} ({})", r.status, r.method, r.path, r.user_agent))
        .collect()
}

/// What one run of the manager did: its arguments and the requests logged from its start.
struct Run {
    args: Vec<String>,
    requests: Vec<RequestRecord>,
}

impl Run {
    /// Whether `user` wrote (2xx) `resource`.
    fn wrote(&self, user: &str, resource: &str) -> bool {
        self.requests.iter().any(|r| {
            r.user.as_deref() == Some(user)
                && matches!(r.verb.as_deref(), Some("create" | "update" | "patch" | "delete"))
                && r.resource.as_deref() == Some(resource)
                && (200..300).contains(&r.status)
        })
    }
}

/// Runs the manager as the chart's Deployment says (read back from the server) under its service
/// account's token, until it initialises node `index` and serves, then deletes, service `web-<index>`.
async fn run_manager(plane: &Plane, directory: &Path, index: u32) -> Run {
    let server = &plane.server;
    let client = server.client();
    let from = server.requests().len();
    let deployment = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .get(CCM)
        .await
        .expect("the chart's Deployment");
    let container = &deployment.spec.unwrap().template.spec.unwrap().containers[0];
    let stored_args = container.args.clone().unwrap_or_default();
    // The token is minted for the account the chart made, as the kubelet would mount it.
    let token = kubeconfig_for(
        server,
        directory,
        &format!("sa-{index}.kubeconfig"),
        UserInfo::service_account(NAMESPACE, CCM),
    )
    .await;
    let args = localized(&stored_args, &plane.environment, &token, free_port());
    let mut replica =
        Replica::spawn(&plane.environment, &format!("chart-{index}"), Side::Ccm, &args).unwrap();
    let workload = Workload::new(client.clone(), plane.cloud.url());
    workload.add_node(index).await.unwrap();
    workload.add_service(index).await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let (node, service) = (format!("node-{index}"), format!("web-{index}"));
    let refusals = || refused(server, |_| true);
    wait(
        &mut replica,
        "the node initialised and the service served",
        &refusals,
        || async {
            nodes.get(&node).await.is_ok_and(|n| initialized(&n))
                && services.get(&service).await.is_ok_and(|s| has_ingress(&s))
        },
    )
    .await;
    services.delete(&service, &DeleteParams::default()).await.unwrap();
    wait(
        &mut replica,
        "the service's load balancer deleted",
        &refusals,
        || async { services.get_opt(&service).await.unwrap().is_none() },
    )
    .await;
    stop_gracefully(&mut replica);
    Run {
        args: stored_args,
        requests: server.requests().split_off(from),
    }
}

/// Leader Migration's objects among the release's: its ConfigMap, Roles and RoleBindings.
fn migration_objects(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .filter(|o| {
            o["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.contains("leader-migration"))
        })
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn the_chart_installs_upgrades_and_uninstalls_on_kube_apiserver() {
    let Some(binaries) =
        KubeBinaries::for_test("the_chart_installs_upgrades_and_uninstalls_on_kube_apiserver")
    else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(install_upgrade_uninstall(binaries.helm));
}

async fn install_upgrade_uninstall(helm: PathBuf) {
    let plane = Plane::start_secure(Backend::Kube).await;
    let server = &plane.server;
    let admin = server.kubeconfig_path().to_owned();
    let directory = tempfile::tempdir().unwrap();
    let dir = directory.path();
    let helm = Helm {
        binary: helm,
        kubeconfig: admin.clone(),
        home: tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap(),
    };
    let (fake, done) = (values("fake"), values("migration-done"));

    // Installed with migration on: every object stored, the manager leads both Leases.
    helm.run(&["install", RELEASE, CHART, "-f", &fake]);
    let installed = helm.manifest(dir.join("installed.yaml"));
    assert_every_object_stored(&admin, &installed);
    let migration = migration_objects(&installed.1);
    assert!(
        migration.len() >= 3,
        "a ConfigMap, Roles and RoleBindings: {migration:?}"
    );
    let on = run_manager(&plane, dir, 0).await;
    assert_eq!(flag(&on.args, "--enable-leader-migration"), Some("true"));
    assert!(
        on.requests
            .iter()
            .any(|r| r.user.as_deref() == Some(SERVICE_ACCOUNT)
                && r.name.as_deref() == Some(MIGRATION)
                && matches!(r.verb.as_deref(), Some("create" | "update"))
                && (200..300).contains(&r.status)),
        "with migration on, the manager holds the migration Lease"
    );

    // Migration off: its ConfigMap, flags and mount go; its RBAC stays for the step after.
    helm.run(&["upgrade", RELEASE, CHART, "-f", &fake, "-f", &done]);
    let off_manifest = helm.manifest(dir.join("off.yaml"));
    assert_every_object_stored(&admin, &off_manifest);
    let left: BTreeSet<String> = migration_objects(&off_manifest.1);
    assert!(
        left.iter().all(|o| !o.starts_with("ConfigMap/")) && left.len() == migration.len() - 1,
        "only the migration ConfigMap goes: {left:?}"
    );
    assert!(
        present(&admin, &installed.0)
            .iter()
            .all(|o| !o.ends_with("/leader-migration")),
        "the migration ConfigMap is deleted"
    );
    let off = run_manager(&plane, dir, 1).await;
    for name in ["--enable-leader-migration", "--leader-migration-config"] {
        assert!(
            flag(&off.args, name).is_none_or(|v| v == "false"),
            "{name} is gone: {:?}",
            off.args
        );
    }
    let touched: Vec<&RequestRecord> = off
        .requests
        .iter()
        .filter(|r| r.name.as_deref() == Some(MIGRATION) && r.verb.as_deref() != Some("watch"))
        .collect();
    assert!(
        touched.is_empty(),
        "nobody uses the migration Lease: {touched:#?}"
    );

    // No migration RBAC, and per-controller credentials.
    helm.run(&[
        "upgrade",
        RELEASE,
        CHART,
        "-f",
        &fake,
        "-f",
        &done,
        "--set",
        "leaderMigration.rbac.create=false",
        "--set",
        "useServiceAccountCredentials=true",
    ]);
    let last = helm.manifest(dir.join("last.yaml"));
    assert_every_object_stored(&admin, &last);
    assert!(migration_objects(&last.1).is_empty());
    let gone = present(&admin, &installed.0);
    assert!(
        gone.iter().all(|o| !o.contains("leader-migration")),
        "the migration RBAC is deleted: {gone:?}"
    );
    let credentials = run_manager(&plane, dir, 2).await;
    assert_eq!(
        flag(&credentials.args, "--use-service-account-credentials"),
        Some("true")
    );
    for controller in ["node-controller", "service-controller"] {
        let user = format!("system:serviceaccount:kube-system:{controller}");
        assert!(
            credentials.wrote(&user, "nodes") || credentials.wrote(&user, "services"),
            "{controller} acted as itself"
        );
    }
    assert!(!credentials.wrote(SERVICE_ACCOUNT, "nodes") && !credentials.wrote(SERVICE_ACCOUNT, "services"));

    let requests = server.requests();
    let refusals = refused(server, |_| true);
    assert!(refusals.is_empty(), "refused:\n{}", refusals.join("\n"));
    let failures = helm_failures(&requests);
    assert!(
        failures.is_empty(),
        "helm's requests failed:\n{}",
        failures.join("\n")
    );

    // Uninstalled: nothing of any revision is left, nor helm's record of the release.
    helm.run(&["uninstall", RELEASE]);
    for (manifest, _) in [&installed, &off_manifest, &last] {
        let left = present(&admin, manifest);
        assert!(left.is_empty(), "left behind: {left:?}");
    }
    let releases = kubectl(
        Some(&admin),
        &[
            "get",
            "secrets",
            "-n",
            NAMESPACE,
            "-l",
            "owner=helm",
            "-o",
            "name",
        ],
    );
    assert_eq!(stdout(&releases).trim(), "", "helm's release records are gone");
    // What the manager made is not the chart's, and stays: the accounts it made for its controllers.
    let accounts = kubectl(
        Some(&admin),
        &["get", "serviceaccounts", "-n", NAMESPACE, "-o", "name"],
    );
    let accounts = stdout(&accounts);
    let accounts: BTreeSet<&str> = accounts
        .lines()
        .map(|l| l.trim_start_matches("serviceaccount/"))
        .collect();
    assert_eq!(
        accounts,
        BTreeSet::from(["node-controller", "route-controller", "service-controller"]),
        "only the controllers' accounts the manager made are left"
    );

    // The DaemonSet kind installs (every object stored) and uninstalls as cleanly.
    helm.run(&["install", RELEASE, CHART, "-f", &fake, "--set", "kind=DaemonSet"]);
    let daemon_set = helm.manifest(dir.join("daemon-set.yaml"));
    assert_every_object_stored(&admin, &daemon_set);
    assert!(daemon_set.1.iter().any(|o| o["kind"] == "DaemonSet"));
    helm.run(&["uninstall", RELEASE]);
    let left = present(&admin, &daemon_set.0);
    assert!(left.is_empty(), "left behind: {left:?}");
    let failures = helm_failures(&server.requests());
    assert!(
        failures.is_empty(),
        "helm's requests failed:\n{}",
        failures.join("\n")
    );
}
