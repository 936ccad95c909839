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
use std::time::{Duration, SystemTime};

use control_plane::{ApiServer, Backend, KubeBinaries, RequestRecord, UserInfo};
use harness::{Replica, Side, Workload, has_ingress, initialized, wait_for_holders};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use kube::api::{Api, DeleteParams};
use serde_json::Value;

use crate::deploy::{flag, kubeconfig_for, kubectl, localized, mounted_config_map, routed, stop_gracefully};
use crate::migration::Plane;
use crate::support::{repo_root, stderr, stdout};
use crate::upstream_rbac::wait;

const CHART: &str = "charts/cloud-controller-manager";
const RELEASE: &str = "ccm";
const NAMESPACE: &str = "kube-system";
const CCM: &str = "cloud-controller-manager";
const SERVICE_ACCOUNT: &str = "system:serviceaccount:kube-system:cloud-controller-manager";
const MIGRATION: &str = "cloud-provider-extraction-migration";
/// helm's `User-Agent` (`internal/version.GetUserAgent`).
const HELM_AGENT: &str = "Helm/";
const WAIT: Duration = Duration::from_secs(30);
/// Leader Migration's objects in the chart: its configuration, and the Lease rules of both sides.
const MIGRATION_OBJECTS: [&str; 5] = [
    "ConfigMap/kube-system/leader-migration",
    "Role/kube-system/system::leader-migration-cloud-controller-manager",
    "Role/kube-system/system::leader-migration-kube-controller-manager",
    "RoleBinding/kube-system/system::leader-migration-cloud-controller-manager",
    "RoleBinding/kube-system/system::leader-migration-kube-controller-manager",
];
/// What `useServiceAccountCredentials` adds: the right to make the controllers' accounts and tokens.
const CREDENTIALS_OBJECTS: [&str; 2] = [
    "Role/kube-system/cloud-controller-manager:controller-credentials",
    "RoleBinding/kube-system/cloud-controller-manager:controller-credentials",
];

/// `helm` against the cluster of `kubeconfig`, with a scratch home and nothing else of the environment.
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
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", home)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_DRIVER", "secret")
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
    fn manifest(&self, path: PathBuf) -> Revision {
        let text = self.run(&["get", "manifest", RELEASE]);
        std::fs::write(&path, &text).unwrap();
        let objects: Vec<Value> = serde_saphyr::from_multiple::<Value>(&text)
            .expect("helm's manifest is YAML")
            .into_iter()
            .filter(|o| o.is_object())
            .collect();
        assert!(!objects.is_empty(), "the release has objects");
        Revision { path, objects }
    }
}

/// One revision of the release: its manifest's file and objects.
struct Revision {
    path: PathBuf,
    objects: Vec<Value>,
}

impl Revision {
    /// `kind/namespace/name` of each object.
    fn names(&self) -> BTreeSet<String> {
        self.objects
            .iter()
            .map(|o| {
                let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
                format!(
                    "{}/{}/{}",
                    text(&o["kind"]),
                    text(&o["metadata"]["namespace"]),
                    text(&o["metadata"]["name"])
                )
            })
            .collect()
    }

    /// Which of its objects the server has, as `kind/name`.
    fn present(&self, admin: &Path) -> Vec<String> {
        let path = self.path.to_str().unwrap();
        let output = kubectl(
            Some(admin),
            &["get", "-f", path, "--ignore-not-found", "-o", "name"],
        );
        stdout(&output).lines().map(str::to_owned).collect()
    }

    fn assert_stored(&self, admin: &Path) {
        let stored = self.present(admin);
        assert_eq!(
            stored.len(),
            self.objects.len(),
            "every object of the release is stored; the server has {stored:#?}"
        );
    }
}

fn values(example: &str) -> String {
    format!("{CHART}/examples/values-{example}.yaml")
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// Every request refused for who made it (401 or 403), one line each.
fn refusals(server: &ApiServer) -> Vec<String> {
    server
        .requests()
        .iter()
        .filter(|r| matches!(r.status, 401 | 403))
        .map(|r| {
            let user = r.user.as_deref().unwrap_or("(anonymous)");
            format!(
                "{} {user} {} {}?{} ({})",
                r.status, r.method, r.path, r.query, r.user_agent
            )
        })
        .collect()
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

fn micros_now() -> i64 {
    let since = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap();
    i64::try_from(since.as_micros()).unwrap()
}

/// A request the chart's service account must be allowed: (verb, group, resource, subresource, name).
type Grant = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
);

/// Waits until kube-apiserver's authorizer, which learns of new RBAC objects by watch, allows `grants`
/// to the chart's service account; the manager then meets no refusal for being early.
async fn until_allowed(client: &kube::Client, grants: &[Grant]) {
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + WAIT;
    for (verb, group, resource, subresource, name) in grants {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(SERVICE_ACCOUNT.to_owned()),
                groups: Some(vec![
                    "system:serviceaccounts".to_owned(),
                    format!("system:serviceaccounts:{NAMESPACE}"),
                    "system:authenticated".to_owned(),
                ]),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some((*verb).to_owned()),
                    group: Some((*group).to_owned()),
                    resource: Some((*resource).to_owned()),
                    subresource: Some((*subresource).to_owned()),
                    name: Some((*name).to_owned()),
                    namespace: Some(NAMESPACE.to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        loop {
            let answer = reviews.create(&Default::default(), &review).await.unwrap();
            if answer.status.is_some_and(|s| s.allowed) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the chart's service account is never allowed to {verb} {group}/{resource}/{subresource} {name}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// What one run of the manager did: its arguments, identity, and the requests received while it ran.
struct Run {
    args: Vec<String>,
    identity: String,
    requests: Vec<RequestRecord>,
}

impl Run {
    /// Whether `user` wrote (2xx) `resource` (core resources are unqualified), status included.
    fn wrote(&self, user: &str, resource: &str) -> bool {
        self.requests.iter().any(|r| {
            r.user.as_deref() == Some(user)
                && matches!(r.verb.as_deref(), Some("create" | "update" | "patch" | "delete"))
                && r.resource.as_deref() == Some(resource)
                && (200..300).contains(&r.status)
        })
    }
}

/// The stored Deployment's container arguments, with the migration configuration the stored ConfigMap
/// holds (written to a file) when they name one.
async fn stored_arguments(
    client: &kube::Client,
    directory: &Path,
    index: u32,
) -> (Vec<String>, Option<PathBuf>) {
    let deployment = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .get(CCM)
        .await
        .expect("the chart's Deployment");
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    let args = pod.containers[0].args.clone().unwrap_or_default();
    let Some(path) = flag(&args, "--leader-migration-config").filter(|p| !p.is_empty()) else {
        return (args, None);
    };
    let pod = serde_json::to_value(&pod).unwrap();
    let (name, key) = mounted_config_map(&pod, path);
    let config_map = Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("ConfigMap {name} the Deployment mounts: {e}"));
    let data = config_map.data.unwrap_or_default();
    let text = data.get(key).unwrap_or_else(|| panic!("{name} has no {key}"));
    let file = directory.join(format!("leader-migration-{index}.yaml"));
    std::fs::write(&file, text).unwrap();
    (args, Some(file))
}

/// Runs the manager as the chart's Deployment says (read back from the server) under its service
/// account's token, once `grants` are allowed, until it holds the Leases `leads`, has initialised and
/// routed node `index`, and has served, then deleted, service `web-<index>`.
async fn run_manager(plane: &Plane, directory: &Path, index: u32, grants: &[Grant], leads: &[&str]) -> Run {
    let server = &plane.server;
    let client = server.client();
    until_allowed(&client, grants).await;
    let from = micros_now();
    let (stored, migration) = stored_arguments(&client, directory, index).await;
    // The token is minted for the account the chart made, as the kubelet would mount it.
    let token = kubeconfig_for(
        server,
        directory,
        &format!("sa-{index}.kubeconfig"),
        UserInfo::service_account(NAMESPACE, CCM),
    )
    .await;
    let mut args = localized(&stored, &plane.environment, &token, 0);
    args.extend(migration.map(|file| format!("--leader-migration-config={}", file.display())));
    let mut replica =
        Replica::spawn(&plane.environment, &format!("chart-{index}"), Side::Ccm, &args).unwrap();
    let identity = replica.identity(WAIT).unwrap();
    wait_for_holders(&client, leads, WAIT, "the manager to lead", |h| {
        leads.iter().all(|l| h[*l].as_deref() == Some(identity.as_str()))
    })
    .await
    .unwrap();
    let workload = Workload::new(client.clone(), plane.cloud.url());
    workload.add_node(index).await.unwrap();
    workload.add_service(index).await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let (node, service) = (format!("node-{index}"), format!("web-{index}"));
    let refused = || refusals(server);
    wait(
        &mut replica,
        "the node initialised and routed, and the service served",
        &refused,
        || async {
            nodes
                .get(&node)
                .await
                .is_ok_and(|n| initialized(&n) && routed(&n))
                && services.get(&service).await.is_ok_and(|s| has_ingress(&s))
        },
    )
    .await;
    services.delete(&service, &DeleteParams::default()).await.unwrap();
    wait(
        &mut replica,
        "the service's load balancer deleted",
        &refused,
        || async { services.get_opt(&service).await.unwrap().is_none() },
    )
    .await;
    stop_gracefully(&mut replica);
    let requests = server
        .requests()
        .into_iter()
        .filter(|r| r.time_us - (r.latency_ms * 1000.0) as i64 >= from)
        .collect();
    Run {
        args: stored,
        identity,
        requests,
    }
}

/// What the manager needs on every run: its Leases, node and service writes, and delegated
/// authentication's ConfigMap.
const MANAGER: [Grant; 4] = [
    ("update", "coordination.k8s.io", "leases", "", CCM),
    ("patch", "", "nodes", "status", ""),
    ("patch", "", "services", "status", ""),
    ("get", "", "configmaps", "", "extension-apiserver-authentication"),
];

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
    runtime.block_on(async {
        let plane = Plane::start_secure(Backend::Kube).await;
        let directory = tempfile::tempdir().unwrap();
        let helm = Helm {
            binary: binaries.helm,
            kubeconfig: plane.server.kubeconfig_path().to_owned(),
            home: tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap(),
        };
        let revisions = [
            install_with_migration(&plane, &helm, directory.path()).await,
            upgrade_to_migration_off(&plane, &helm, directory.path()).await,
            upgrade_to_own_credentials(&plane, &helm, directory.path()).await,
        ];
        let refused = refusals(&plane.server);
        assert!(refused.is_empty(), "refused:\n{}", refused.join("\n"));
        uninstall(&plane, &helm, &revisions);
        install_and_uninstall_a_daemon_set(&plane, &helm, directory.path());
        let failures = helm_failures(&plane.server.requests());
        assert!(
            failures.is_empty(),
            "helm's requests failed:\n{}",
            failures.join("\n")
        );
    });
}

/// Installed with migration on: every object stored; the manager leads both Leases.
async fn install_with_migration(plane: &Plane, helm: &Helm, dir: &Path) -> Revision {
    helm.run(&["install", RELEASE, CHART, "-f", &values("fake")]);
    let installed = helm.manifest(dir.join("installed.yaml"));
    installed.assert_stored(plane.server.kubeconfig_path());
    let names = installed.names();
    assert!(set(&MIGRATION_OBJECTS).is_subset(&names), "{names:#?}");
    let mut grants = MANAGER.to_vec();
    grants.push(("update", "coordination.k8s.io", "leases", "", MIGRATION));
    let on = run_manager(plane, dir, 0, &grants, &[CCM, MIGRATION]).await;
    assert_eq!(flag(&on.args, "--enable-leader-migration"), Some("true"));
    installed
}

/// Migration off: only its ConfigMap goes (its RBAC stays for pods still rolling); the manager leads
/// without touching the migration Lease.
async fn upgrade_to_migration_off(plane: &Plane, helm: &Helm, dir: &Path) -> Revision {
    let before = helm.manifest(dir.join("before-off.yaml"));
    helm.run(&[
        "upgrade",
        RELEASE,
        CHART,
        "-f",
        &values("fake"),
        "-f",
        &values("migration-done"),
    ]);
    let off = helm.manifest(dir.join("off.yaml"));
    off.assert_stored(plane.server.kubeconfig_path());
    let removed: BTreeSet<String> = before.names().difference(&off.names()).cloned().collect();
    assert_eq!(removed, set(&MIGRATION_OBJECTS[..1]));
    assert!(off.names().is_subset(&before.names()), "nothing added");
    assert!(
        before.present(plane.server.kubeconfig_path()).len() == before.objects.len() - 1,
        "the migration ConfigMap is deleted"
    );
    let run = run_manager(plane, dir, 1, &MANAGER, &[CCM]).await;
    for name in ["--enable-leader-migration", "--leader-migration-config"] {
        assert!(
            flag(&run.args, name).is_none_or(|v| v == "false" || v.is_empty()),
            "{name} is gone: {:?}",
            run.args
        );
    }
    let touched: Vec<&RequestRecord> = run
        .requests
        .iter()
        .filter(|r| r.name.as_deref() == Some(MIGRATION))
        .collect();
    assert!(
        touched.is_empty(),
        "nobody uses the migration Lease: {touched:#?}"
    );
    let holders = harness::holders(&plane.server.client(), &[MIGRATION])
        .await
        .unwrap();
    assert_ne!(holders[MIGRATION].as_deref(), Some(run.identity.as_str()));
    off
}

/// No migration RBAC, and per-controller credentials: the controllers act as their own accounts.
async fn upgrade_to_own_credentials(plane: &Plane, helm: &Helm, dir: &Path) -> Revision {
    let before = helm.manifest(dir.join("before-credentials.yaml"));
    helm.run(&[
        "upgrade",
        RELEASE,
        CHART,
        "-f",
        &values("fake"),
        "-f",
        &values("migration-done"),
        "--set",
        "leaderMigration.rbac.create=false",
        "--set",
        "useServiceAccountCredentials=true",
    ]);
    let last = helm.manifest(dir.join("last.yaml"));
    last.assert_stored(plane.server.kubeconfig_path());
    let (old, new) = (before.names(), last.names());
    let removed: BTreeSet<String> = old.difference(&new).cloned().collect();
    let added: BTreeSet<String> = new.difference(&old).cloned().collect();
    assert_eq!(removed, set(&MIGRATION_OBJECTS[1..]), "the migration RBAC goes");
    assert_eq!(added, set(&CREDENTIALS_OBJECTS));
    assert_eq!(
        before.present(plane.server.kubeconfig_path()).len(),
        before.objects.len() - removed.len(),
        "the migration RBAC is deleted"
    );
    let mut grants = MANAGER.to_vec();
    grants.push(("create", "", "serviceaccounts", "token", "node-controller"));
    let run = run_manager(plane, dir, 2, &grants, &[CCM]).await;
    assert_eq!(flag(&run.args, "--use-service-account-credentials"), Some("true"));
    for (controller, resource) in [
        ("node-controller", "nodes"),
        ("route-controller", "nodes"),
        ("service-controller", "services"),
    ] {
        let user = format!("system:serviceaccount:kube-system:{controller}");
        assert!(
            run.wrote(&user, resource),
            "{controller} wrote {resource} as itself"
        );
    }
    for resource in ["nodes", "services"] {
        assert!(
            !run.wrote(SERVICE_ACCOUNT, resource),
            "the manager's own account wrote {resource}"
        );
    }
    last
}

/// Uninstalled: nothing of any revision is left, nor helm's record of the release; what stays is the
/// manager's own (the accounts it made for its controllers), not the chart's.
fn uninstall(plane: &Plane, helm: &Helm, revisions: &[Revision]) {
    let admin = plane.server.kubeconfig_path();
    helm.run(&["uninstall", RELEASE]);
    for revision in revisions {
        let left = revision.present(admin);
        assert!(left.is_empty(), "left behind: {left:?}");
    }
    let releases = kubectl(
        Some(admin),
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
    let accounts = kubectl(
        Some(admin),
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
}

/// The DaemonSet kind installs (every object stored) and uninstalls as cleanly.
fn install_and_uninstall_a_daemon_set(plane: &Plane, helm: &Helm, dir: &Path) {
    let admin = plane.server.kubeconfig_path();
    helm.run(&[
        "install",
        RELEASE,
        CHART,
        "-f",
        &values("fake"),
        "--set",
        "kind=DaemonSet",
    ]);
    let daemon_set = helm.manifest(dir.join("daemon-set.yaml"));
    daemon_set.assert_stored(admin);
    assert!(daemon_set.objects.iter().any(|o| o["kind"] == "DaemonSet"));
    helm.run(&["uninstall", RELEASE]);
    let left = daemon_set.present(admin);
    assert!(left.is_empty(), "left behind: {left:?}");
}
