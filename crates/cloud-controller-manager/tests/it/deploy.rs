//! The shipped manifests (`deploy/`): every overlay renders with the real `kubectl`, its flags are this
//! binary's, and its RBAC is proven both ways, on the test API server in RBAC mode and on a real
//! kube-apiserver with its bootstrap policy: a migration run with the shipped identities gets no 403, and
//! every verb the RBAC grants is one the managers used.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use ccm_audit::audit;
use control_plane::{ApiServer, Backend, RequestRecord, UserInfo};
use harness::{Environment, Replica, Side, Timings, Workload, has_ingress, initialized, wait_for_holders};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube_ccm_fake::{AdminRequest, CloudRequest, FakeInstance, InstanceState};
use kube_ccm_leadermigration::MigrationConfig;
use kube_ccm_runtime::ControllerRegistry;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::support::{binary, curl, free_port, repo_root, stderr, stdout};

const WAIT: Duration = Duration::from_secs(30);
const KCM: &str = "kube-controller-manager";
const CCM: &str = "cloud-controller-manager";
const MIGRATION: &str = "cloud-provider-extraction-migration";
const LEASES: [&str; 3] = [KCM, CCM, MIGRATION];
/// Who the shipped manifests run as: the Deployment's service account and the static pod's user.
const SERVICE_ACCOUNT: &str = "system:serviceaccount:kube-system:cloud-controller-manager";
const STATIC_POD_USER: &str = "system:cloud-controller-manager";
/// The N side's identity, whose migration-Lease rules ship in `deploy/rbac/leader-migration-rbac.yaml`.
const KCM_USER: &str = "system:kube-controller-manager";
/// What a real kube-controller-manager's cloud controllers hold through their own service accounts
/// (`--use-service-account-credentials`), which the N side here plays as kube-controller-manager's user.
const KCM_CLOUD_CONTROLLERS_STAND_IN: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "test:kube-controller-manager-cloud-controllers"}
rules:
  - {apiGroups: [""], resources: [nodes, services], verbs: [list, watch, patch, delete]}
  - {apiGroups: [""], resources: [nodes/status, services/status], verbs: [patch]}
  - {apiGroups: [""], resources: [events], verbs: [create, patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "test:kube-controller-manager-cloud-controllers"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "test:kube-controller-manager-cloud-controllers"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:kube-controller-manager"}]
"#;

pub(crate) fn kubectl(kubeconfig: Option<&Path>, args: &[&str]) -> Output {
    let mut command = Command::new("kubectl");
    command.args(args).current_dir(repo_root());
    command.env_remove("KUBERNETES_SERVICE_HOST");
    match kubeconfig {
        Some(path) => command.env("KUBECONFIG", path),
        // Rendering needs no cluster; never read the developer's.
        None => command.env("KUBECONFIG", "/dev/null"),
    };
    let output = command.output().unwrap_or_else(|error| {
        panic!("kubectl is required for these tests and could not be started: {error}. Install kubectl and put it on PATH")
    });
    assert!(
        output.status.success(),
        "kubectl {args:?} failed ({}):\n{}{}",
        output.status,
        stdout(&output),
        stderr(&output)
    );
    output
}

/// `kubectl kustomize DIR` (relative to the repository), as objects.
pub(crate) fn render(dir: &str) -> Vec<Value> {
    let output = kubectl(None, &["kustomize", dir]);
    serde_saphyr::from_multiple::<Value>(&stdout(&output)).expect("kustomize renders YAML")
}

pub(crate) fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} among {} objects", objects.len()))
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| v.as_str().expect("a string").to_owned())
        .collect()
}

/// A flag's last value: `--name=value`, or `true` for a bare `--name`.
pub(crate) fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().rev().find_map(|a| {
        if a == name {
            Some("true")
        } else {
            a.strip_prefix(name)?.strip_prefix('=')
        }
    })
}

/// The file a container path resolves to through the pod's volumes: (ConfigMap name, key).
pub(crate) fn mounted_config_map<'a>(pod: &'a Value, path: &'a str) -> (&'a str, &'a str) {
    let container = &pod["containers"][0];
    let mount = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| {
            path.strip_prefix(m["mountPath"].as_str().unwrap())
                .is_some_and(|rest| rest.starts_with('/'))
        })
        .unwrap_or_else(|| panic!("{path} is not under any volume mount"));
    let volume = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == mount["name"])
        .expect("the mount's volume");
    let key = &path[mount["mountPath"].as_str().unwrap().len() + 1..];
    (
        volume["configMap"]["name"]
            .as_str()
            .unwrap_or_else(|| panic!("volume {} is not a ConfigMap", volume["name"])),
        key,
    )
}

/// The Deployment's pod spec and its container's arguments.
fn deployment(objects: &[Value]) -> (&Value, Vec<String>) {
    let pod = &find(objects, "Deployment", CCM)["spec"]["template"]["spec"];
    (pod, strings(&pod["containers"][0]["args"]))
}

fn static_pod() -> (Value, Vec<String>) {
    let text =
        std::fs::read_to_string(repo_root().join("deploy/static-pod/cloud-controller-manager.yaml")).unwrap();
    let pod: Value = serde_saphyr::from_str(&text).unwrap();
    let command = strings(&pod["spec"]["containers"][0]["command"]);
    assert_eq!(command[0], CCM, "the static pod runs the binary");
    (pod, command[1..].to_vec())
}

/// The binary validates every other setting of `args` (files included) and refuses only `provider`, which
/// it does not register: exit 2 before anything starts.
fn assert_only_the_provider_is_refused(args: &[String], provider: &str) {
    let output = binary()
        .args(args)
        .args(["--kubeconfig=/nonexistent", "--secure-port=0"])
        .output()
        .unwrap();
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    let problems: Vec<&str> = text.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(
        problems,
        [format!(
            "error: --cloud-provider: unknown cloud provider \"{provider}\" (this binary has: aws, fake, gce)"
        )],
        "{text}"
    );
}

/// The binary accepts every setting of `args` and builds the provider from the overlay's cloud-config
/// (the region as the instance metadata would give it); what stops it is the missing cluster.
fn assert_only_the_cluster_is_missing(args: &[String]) {
    let output = binary()
        .args(args)
        .args(["--kubeconfig=/nonexistent", "--secure-port=0"])
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .unwrap();
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    let problems: Vec<&str> = text.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(problems.len(), 1, "{text}");
    assert!(
        problems[0].starts_with("error: --kubeconfig: cannot read /nonexistent"),
        "{text}"
    );
}

#[test]
fn every_overlay_renders_for_the_control_plane_with_the_binarys_flags() {
    let shipped_config =
        std::fs::read_to_string(repo_root().join("examples/leader-migration/n-plus-1.yaml")).unwrap();
    for (overlay, provider) in [("fake", "fake"), ("aws", "aws"), ("gce", "gce")] {
        let objects = render(&format!("deploy/overlays/{overlay}"));
        let (pod, args) = deployment(&objects);
        assert_eq!(
            flag(&args, "--cloud-provider"),
            Some(provider),
            "{overlay}: {args:?}"
        );
        assert_eq!(flag(&args, "--enable-leader-migration"), Some("true"));
        // On control-plane nodes, before they are initialised or have a network.
        assert_eq!(
            pod["nodeSelector"],
            json!({"node-role.kubernetes.io/control-plane": ""})
        );
        let tolerated: Vec<&Value> = pod["tolerations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| &t["key"])
            .collect();
        for taint in [
            kube_ccm_provider::names::TAINT_UNINITIALIZED,
            "node-role.kubernetes.io/control-plane",
            "node.kubernetes.io/not-ready",
        ] {
            assert!(tolerated.contains(&&json!(taint)), "{overlay} tolerates {taint}");
        }
        assert_eq!(pod["hostNetwork"], true);
        find(
            &objects,
            "ServiceAccount",
            pod["serviceAccountName"].as_str().unwrap(),
        );
        // Both configuration files are mounted from ConfigMaps the overlay ships, and the migration one is
        // the N+1 example, valid.
        let files = tempfile::tempdir().unwrap();
        let mut local = args.clone();
        for file_flag in ["--cloud-config", "--leader-migration-config"] {
            let path = flag(&args, file_flag).unwrap_or_else(|| panic!("{overlay}: no {file_flag}"));
            let (name, key) = mounted_config_map(pod, path);
            let data = find(&objects, "ConfigMap", name)["data"][key]
                .as_str()
                .unwrap_or_else(|| panic!("{overlay}: ConfigMap {name} has no {key}"));
            if file_flag == "--leader-migration-config" {
                assert_eq!(data, shipped_config, "{overlay}: the N+1 example");
                MigrationConfig::load(path, data.as_bytes(), ControllerRegistry::builtin().catalog())
                    .unwrap_or_else(|e| panic!("{overlay}: {e}"));
            }
            let copy = files.path().join(key);
            std::fs::write(&copy, data).unwrap();
            local.push(format!("{file_flag}={}", copy.display()));
        }
        match provider {
            "fake" => {} // It runs, with these flags, in the migration test below.
            _ => assert_only_the_cluster_is_missing(&local),
        }
    }
    let (pod, args) = static_pod();
    assert_eq!(pod["spec"]["hostNetwork"], true);
    assert_eq!(
        flag(&args, "--leader-migration-config"),
        Some("/etc/leadermigration.conf"),
        "the seed guide's path"
    );
    // Each file flag names a mount of the same path on the node, which must exist (type File).
    for file_flag in ["--leader-migration-config", "--kubeconfig", "--cloud-config"] {
        let path = flag(&args, file_flag).unwrap();
        let mount = pod["spec"]["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == path)
            .unwrap_or_else(|| panic!("{file_flag}={path} is not mounted"));
        let volume = pod["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap();
        assert_eq!(
            volume["hostPath"],
            json!({"path": path, "type": "File"}),
            "{file_flag}"
        );
    }
    // Migrated controllers run wherever the migration lock is held: the static pod and the Deployment must
    // configure them alike.
    let (_, fake_args) = deployment(&render("deploy/overlays/fake"));
    for route_flag in [
        "--configure-cloud-routes",
        "--cluster-cidr",
        "--controllers",
        "--cloud-provider",
    ] {
        assert_eq!(
            flag(&args, route_flag),
            flag(&fake_args, route_flag),
            "{route_flag}"
        );
    }
    // The RBAC alone (for static pods) renders without a workload.
    let rbac = render("deploy/rbac");
    assert!(
        rbac.iter()
            .all(|o| o["kind"] != "Deployment" && o["kind"] != "ConfigMap")
    );
    find(&rbac, "ClusterRole", "system:cloud-controller-manager");
}

/// A kustomization in a scratch directory under the target directory, made of the repository's
/// (kustomize takes only relative paths).
pub(crate) fn scratch_kustomization(text: impl Fn(&str) -> String) -> Vec<Value> {
    let scratch = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let depth = scratch.path().canonicalize().unwrap().components().count() - 1;
    let repo = format!(
        "{}{}",
        "../".repeat(depth),
        repo_root().display().to_string().trim_start_matches('/')
    );
    std::fs::write(scratch.path().join("kustomization.yaml"), text(&repo)).unwrap();
    let output = kubectl(None, &["kustomize", scratch.path().to_str().unwrap()]);
    serde_saphyr::from_multiple::<Value>(&stdout(&output)).expect("kustomize renders YAML")
}

#[test]
fn the_leader_migration_done_component_turns_migration_off_cleanly() {
    let objects = scratch_kustomization(|repo| {
        format!(
            "resources:\n  - {repo}/deploy/overlays/fake\ncomponents:\n  - {repo}/deploy/components/leader-migration-done\n"
        )
    });
    let (pod, args) = deployment(&objects);
    assert_eq!(flag(&args, "--enable-leader-migration"), Some("false"));
    assert_eq!(flag(&args, "--leader-migration-config"), Some(""));
    // The earlier flags stay (overridden); the volume and its mount go.
    let volumes = serde_json::to_string(&pod["volumes"]).unwrap();
    let mounts = serde_json::to_string(&pod["containers"][0]["volumeMounts"]).unwrap();
    assert!(!volumes.contains("leader-migration"), "{volumes}");
    assert!(!mounts.contains("leader-migration"), "{mounts}");
    assert!(
        !objects.iter().any(|o| o["kind"] == "ConfigMap"
            && o["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("leader-migration")),
        "the ConfigMap is gone"
    );
    // What is left is a valid command line: only the provider name is swapped for one it lacks, to stop it
    // before it starts.
    let files = tempfile::tempdir().unwrap();
    let cloud_config = files.path().join("cloud.conf");
    std::fs::write(&cloud_config, "{}\n").unwrap();
    let mut local = args.clone();
    local.push(format!("--cloud-config={}", cloud_config.display()));
    local.push("--cloud-provider=none-here".to_owned());
    assert_only_the_provider_is_refused(&local, "none-here");
}

#[test]
fn the_shipped_migration_rbac_is_what_the_rbac_command_generates() {
    let shipped =
        std::fs::read_to_string(repo_root().join("deploy/rbac/leader-migration-rbac.yaml")).unwrap();
    let generated = binary()
        .args([
            "leader-migration",
            "rbac",
            "--config",
            "deploy/base/leader-migration.yaml",
        ])
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(generated.status.success(), "{}", stderr(&generated));
    let parse = |text: &str| serde_saphyr::from_multiple::<Value>(text).unwrap();
    assert_eq!(parse(&shipped), parse(&stdout(&generated)));
}

/// (apiGroup, resource with subresource, verb, object name when a rule names it).
type Access = (String, String, String, Option<String>);

/// What a request did, as an [`Access`] with its object's name (from the path, or a list or watch pinned
/// to one name by `fieldSelector=metadata.name=`).
fn access(record: &RequestRecord) -> Option<Access> {
    let qualified = record.resource.as_deref()?;
    let (resource, group) = qualified.split_once('.').unwrap_or((qualified, ""));
    let resource = match &record.subresource {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource.to_owned(),
    };
    let pinned = record.query.split('&').find_map(|pair| {
        let value = pair
            .strip_prefix("fieldSelector=")?
            .replace("%3D", "=")
            .replace("%3d", "=");
        value.strip_prefix("metadata.name=").map(str::to_owned)
    });
    Some((
        group.to_owned(),
        resource,
        record.verb.clone()?,
        record.name.clone().or(pinned),
    ))
}

/// Roles of kube-apiserver's bootstrap policy the shipped manifests bind.
const BOOTSTRAP_ROLES: [&str; 1] = ["extension-apiserver-authentication-reader"];

/// Every rule the shipped manifests grant the cloud-controller-manager identities, one [`Access`] per
/// verb and named object, after checking that none uses a wildcard.
fn granted(objects: &[Value]) -> BTreeSet<Access> {
    let binds_ccm = |binding: &Value| {
        binding["subjects"].as_array().into_iter().flatten().any(|s| {
            (s["kind"] == "ServiceAccount" && s["namespace"] == "kube-system" && s["name"] == CCM)
                || (s["kind"] == "User" && s["name"] == STATIC_POD_USER)
        })
    };
    let mut grants = BTreeSet::new();
    for binding in objects
        .iter()
        .filter(|o| (o["kind"] == "ClusterRoleBinding" || o["kind"] == "RoleBinding") && binds_ccm(o))
    {
        let (kind, name) = (
            binding["roleRef"]["kind"].as_str().unwrap(),
            binding["roleRef"]["name"].as_str().unwrap(),
        );
        // A role every cluster has (kube-apiserver's bootstrap policy) is not ours to trim: its binding
        // must only not be refused.
        if BOOTSTRAP_ROLES.contains(&name) {
            assert!(
                !objects
                    .iter()
                    .any(|o| o["kind"] == kind && o["metadata"]["name"] == name),
                "{name} is the cluster's own"
            );
            continue;
        }
        let role = find(objects, kind, name);
        for rule in role["rules"].as_array().unwrap() {
            let names = strings(&rule["resourceNames"]);
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        assert!(
                            ![&group, &resource, &verb].iter().any(|s| s.contains('*')),
                            "no wildcards: {rule}"
                        );
                        if resource == "leases" && verb != "create" {
                            assert!(
                                !names.is_empty(),
                                "Lease verbs other than create are limited to named Leases: {rule}"
                            );
                        }
                        if names.is_empty() {
                            grants.insert((group.clone(), resource.clone(), verb, None));
                        } else {
                            for name in &names {
                                grants.insert((
                                    group.clone(),
                                    resource.clone(),
                                    verb.clone(),
                                    Some(name.clone()),
                                ));
                            }
                        }
                    }
                }
            }
        }
    }
    grants
}

/// A kubeconfig that authenticates as `user`.
pub(crate) async fn kubeconfig_for(server: &ApiServer, dir: &Path, file: &str, user: UserInfo) -> PathBuf {
    let path = dir.join(file);
    server.kubeconfig_for(&path, &user).await.unwrap();
    path
}

/// A shipped manifest's arguments, with what differs on this machine appended (later flags win): files
/// where the manifest mounts them (the migration configuration only where the manifest names one), `port`
/// to serve on (0: none) on loopback, and the harness's short election timings.
pub(crate) fn localized(
    args: &[String],
    environment: &Environment,
    kubeconfig: &Path,
    port: u16,
) -> Vec<String> {
    let mut args = args.to_vec();
    if flag(&args, "--leader-migration-config").is_some_and(|path| !path.is_empty()) {
        args.push(format!(
            "--leader-migration-config={}",
            environment.ccm_config.display()
        ));
    }
    args.extend([
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--cloud-config={}", environment.cloud_config.display()),
        format!("--secure-port={port}"),
        "--bind-address=127.0.0.1".to_owned(),
        "--node-monitor-period=500ms".to_owned(),
        "--route-reconciliation-period=1s".to_owned(),
    ]);
    args.extend(environment.timing_flags());
    args
}

/// SIGTERM, and a clean exit.
pub(crate) fn stop_gracefully(replica: &mut Replica) {
    replica.terminate().unwrap();
    let status = replica.wait(WAIT).unwrap();
    assert!(
        status.success(),
        "{} exited {status}: {}",
        replica.name,
        replica.log_tail()
    );
}

/// Requests by the shipped identities that the API server refused.
fn refusals(server: &ApiServer) -> Vec<String> {
    refused(server, |u| {
        u == SERVICE_ACCOUNT || u == STATIC_POD_USER || u == KCM_USER
    })
}

/// Requests by the users `who` picks that the API server refused, one line each.
pub(crate) fn refused(server: &ApiServer, who: impl Fn(&str) -> bool) -> Vec<String> {
    server
        .requests()
        .iter()
        .filter(|r| r.status == 403 && r.user.as_deref().is_some_and(&who))
        .map(|r| {
            format!(
                "{} {} {}?{} ({})",
                r.user.as_deref().unwrap_or_default(),
                r.method,
                r.path,
                r.query,
                r.user_agent
            )
        })
        .collect()
}

/// Waits for `condition`; a timeout names what the shipped RBAC refused, the likely cause.
async fn wait_until<F, Fut>(server: &ApiServer, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}; refused:\n{}",
            refusals(server).join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The route controller created the node's routes: `NetworkUnavailable` is `False`.
pub(crate) fn routed(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "NetworkUnavailable" && c.status == "False")
        })
}

async fn the_shipped_rbac_is_enough_for_a_migration_and_no_more(backend: Backend) {
    let plane = crate::migration::Plane::start_secure(backend).await;
    let server = &plane.server;
    let admin_kubeconfig = server.kubeconfig_path().to_owned();
    kubectl(
        Some(&admin_kubeconfig),
        &["apply", "--server-side", "-k", "deploy/overlays/fake"],
    );
    let objects = render("deploy/overlays/fake");
    let grants = granted(&objects);
    let directory = tempfile::tempdir().unwrap();
    // kube-controller-manager's Lease rules are the bootstrap policy's (both servers have it).
    let stand_in = directory.path().join("kcm-cloud-controllers-stand-in.yaml");
    std::fs::write(&stand_in, KCM_CLOUD_CONTROLLERS_STAND_IN).unwrap();
    kubectl(
        Some(&admin_kubeconfig),
        &["apply", "--server-side", "-f", stand_in.to_str().unwrap()],
    );
    let cloud = &plane.cloud;
    // The N side plays kube-controller-manager as its own user.
    let kcm_user = kubeconfig_for(
        server,
        directory.path(),
        "kcm.kubeconfig",
        UserInfo {
            name: KCM_USER.to_owned(),
            groups: vec!["system:authenticated".to_owned()],
        },
    )
    .await;
    let environment = Environment::prepare(
        directory.path(),
        env!("CARGO_BIN_EXE_cloud-controller-manager").into(),
        kcm_user,
        cloud.url(),
        Timings::fast(),
    )
    .unwrap();
    let service_account = kubeconfig_for(
        server,
        directory.path(),
        "sa.kubeconfig",
        UserInfo::service_account("kube-system", CCM),
    )
    .await;
    let static_pod_user = kubeconfig_for(
        server,
        directory.path(),
        "user.kubeconfig",
        UserInfo {
            name: STATIC_POD_USER.to_owned(),
            groups: vec!["system:authenticated".to_owned()],
        },
    )
    .await;
    let client = server.client();
    let mut kcms: Vec<Replica> = (1..=2)
        .map(|i| Replica::start(&environment, &format!("kcm-{i}"), Side::Kcm).unwrap())
        .collect();
    wait_for_holders(&client, &LEASES, WAIT, "kube-controller-manager to lead", |h| {
        h[KCM].is_some() && h[KCM] == h[MIGRATION]
    })
    .await
    .unwrap();
    // Work for the N side before the roll (the two nodes the end of the test breaks among it), and more
    // throughout the roll.
    let workload = Workload::new(client.clone(), cloud.url());
    for index in 0..3 {
        workload.add_node(index).await.unwrap();
        workload.add_service(index).await.unwrap();
    }
    let stop = CancellationToken::new();
    let churn = workload.churn(Duration::from_millis(100), 100, stop.clone());

    // Roll: the first N+1 replica as the static pod (it takes the cloud-controller-manager lock, being
    // alone), the second as the Deployment's pod, each followed by stopping a kube-controller-manager.
    let (_, static_args) = static_pod();
    let (_, deployment_args) = deployment(&objects);
    let mut static_replica = Replica::spawn(
        &environment,
        "ccm-static-pod",
        Side::Ccm,
        &localized(&static_args, &environment, &static_pod_user, 0),
    )
    .unwrap();
    let static_id = static_replica.identity(WAIT).unwrap();
    wait_for_holders(&client, &LEASES, WAIT, "the static pod's replica to lead", |h| {
        h[CCM].as_ref() == Some(&static_id)
    })
    .await
    .unwrap();
    stop_gracefully(&mut kcms[0]);
    let metrics_port = free_port();
    let mut deployment_replica = Replica::spawn(
        &environment,
        "ccm-deployment",
        Side::Ccm,
        &localized(&deployment_args, &environment, &service_account, metrics_port),
    )
    .unwrap();
    let deployment_id = deployment_replica.identity(WAIT).unwrap();
    stop_gracefully(&mut kcms[1]);
    wait_for_holders(
        &client,
        &LEASES,
        WAIT,
        "the static pod's replica to take the migration lock",
        |h| h[MIGRATION].as_ref() == Some(&static_id) && h[CCM] == h[MIGRATION],
    )
    .await
    .unwrap();
    stop.cancel();
    let created = churn.await.unwrap().unwrap();

    // Everything the controllers do: initialise nodes and routes, serve load balancers, then delete a node
    // whose instance is gone, taint one that is shut down, and clean up a deleted service.
    let nodes: Api<Node> = Api::all(client.clone());
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    wait_until(
        server,
        "every node initialised and routed, every service served",
        || async {
            let all_nodes = nodes.list(&Default::default()).await.unwrap().items;
            let mut all_services = services.list(&Default::default()).await.unwrap().items;
            all_services.retain(harness::is_load_balancer);
            all_nodes.len() == 3 + created.nodes as usize
                && all_nodes.iter().all(initialized)
                && all_nodes.iter().all(routed)
                && all_services.len() == 3 + created.services as usize
                && all_services.iter().all(has_ingress)
        },
    )
    .await;
    // The static pod's replica hands over to the Deployment's, which does the rest.
    stop_gracefully(&mut static_replica);
    wait_for_holders(
        &client,
        &LEASES,
        WAIT,
        "the Deployment's replica to take over",
        |h| h[CCM].as_ref() == Some(&deployment_id) && h[MIGRATION].as_ref() == Some(&deployment_id),
    )
    .await
    .unwrap();
    let not_ready =
        json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletStopped"}]}});
    for (node, state) in [
        ("node-0", InstanceState::Terminated),
        ("node-1", InstanceState::Stopped),
    ] {
        cloud
            .cloud()
            .handle(CloudRequest::Admin(AdminRequest::SetInstanceState {
                name: node.to_owned(),
                state,
            }))
            .await;
        nodes
            .patch_status(node, &PatchParams::default(), &Patch::Strategic(&not_ready))
            .await
            .unwrap();
    }
    services.delete("web-0", &DeleteParams::default()).await.unwrap();
    // A node the cloud cannot initialise (its kubelet names an IP the instance does not have): an Event,
    // and the same Event again (patched as a series) when the node changes.
    cloud
        .cloud()
        .handle(CloudRequest::Admin(AdminRequest::PutInstance(
            FakeInstance::running("node-odd", 50),
        )))
        .await;
    let odd: Node = serde_json::from_value(json!({
        "metadata": {"name": "node-odd", "annotations": {kube_ccm_provider::names::ANNOTATION_PROVIDED_NODE_IP: "192.0.2.1"}},
        "spec": {"taints": [{"key": kube_ccm_provider::names::TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]},
    }))
    .unwrap();
    nodes.create(&Default::default(), &odd).await.unwrap();
    // (The cloud-node controller's events: the other nodes initialise without any.)
    let event_writes = |verb: &str| {
        server
            .requests()
            .iter()
            .filter(|r| {
                r.user.as_deref() == Some(SERVICE_ACCOUNT)
                    && r.user_agent.ends_with("/cloud-node-controller")
                    && r.verb.as_deref() == Some(verb)
                    && r.resource.as_deref() == Some("events")
                    && (200..300).contains(&r.status)
            })
            .count()
    };
    wait_until(server, "an event about node-odd", || async {
        event_writes("create") > 0
    })
    .await;
    nodes
        .patch(
            "node-odd",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched": "1"}}})),
        )
        .await
        .unwrap();
    wait_until(server, "the event about node-odd to repeat", || async {
        event_writes("patch") > 0
    })
    .await;
    wait_until(
        server,
        "the gone node deleted, the stopped one tainted, the service cleaned up",
        || async {
            let gone = nodes.get_opt("node-0").await.unwrap().is_none();
            let tainted = nodes
                .get("node-1")
                .await
                .unwrap()
                .spec
                .and_then(|s| s.taints)
                .is_some_and(|t| {
                    t.iter()
                        .any(|t| t.key == kube_ccm_provider::names::TAINT_SHUTDOWN)
                });
            let cleaned = services.get_opt("web-0").await.unwrap().is_none();
            gone && tainted && cleaned
        },
    )
    .await;
    // A scraper bound to the shipped metrics-reader role reads /metrics (the manager asks the API server
    // with the shipped rules); nobody else does.
    // (As metrics-reader.yaml shows; created here through the API, since the test API server does not decode
    // the protobuf that `kubectl create clusterrolebinding` sends.)
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "prometheus:cloud-controller-manager-metrics"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cloud-controller-manager:metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}],
    }))
    .unwrap();
    Api::all(client.clone())
        .create(&Default::default(), &binding)
        .await
        .unwrap();
    let scraper = server
        .mint(&UserInfo::service_account("monitoring", "prometheus"))
        .await;
    let scraper = scraper.token().expect("a service account's token");
    let metrics_address = ([127, 0, 0, 1], metrics_port).into();
    let bearer = format!("Authorization: Bearer {scraper}");
    let (code, body) = curl(metrics_address, None, "/metrics", &["--header", &bearer]).expect("served");
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        curl(metrics_address, None, "/metrics", &[]).map(|r| r.0),
        Some(403)
    );
    assert_eq!(
        curl(metrics_address, None, "/healthz", &[]).map(|r| r.0),
        Some(200)
    );
    stop_gracefully(&mut deployment_replica);

    // Judged from the server's records.
    let requests = server.requests();
    let by_ccm: Vec<&RequestRecord> = requests
        .iter()
        .filter(|r| {
            r.user
                .as_deref()
                .is_some_and(|u| u == SERVICE_ACCOUNT || u == STATIC_POD_USER)
        })
        .collect();
    for user in [SERVICE_ACCOUNT, STATIC_POD_USER] {
        assert!(
            by_ccm
                .iter()
                .any(|r| r.user.as_deref() == Some(user) && r.verb.as_deref() == Some("patch")),
            "{user} did controller work"
        );
    }
    let refused = refusals(server);
    assert!(
        refused.is_empty(),
        "the shipped RBAC refused:\n{}",
        refused.join("\n")
    );

    // The N side held the migration Lease.
    assert!(
        requests.iter().any(|r| r.user.as_deref() == Some(KCM_USER)
            && r.verb.as_deref() == Some("update")
            && r.name.as_deref() == Some(MIGRATION)
            && r.status == 200),
        "kube-controller-manager renewed the migration Lease"
    );

    // No more: every granted verb, on every object a rule names, was used.
    let used: BTreeSet<Access> = by_ccm.iter().filter_map(|r| access(r)).collect();
    // One exemption: a migration elector follows its Lease by watch, so it reads one by name only after a
    // lost race (409); reading the main Lease by name shows the rule is the one it needs then.
    let raced = |(group, resource, verb, _): &&Access| {
        (group.as_str(), resource.as_str(), verb.as_str()) == ("coordination.k8s.io", "leases", "get")
            && used
                .iter()
                .any(|(g, r, v, n)| (g, r, v) == (group, resource, verb) && n.as_deref() == Some(CCM))
    };
    let unused: Vec<&Access> = grants
        .iter()
        .filter(|access| !raced(access))
        .filter(|(group, resource, verb, name)| {
            !used
                .iter()
                .any(|(g, r, v, n)| (g, r, v) == (group, resource, verb) && (name.is_none() || n == name))
        })
        .collect();
    assert!(
        unused.is_empty(),
        "granted but never used: {unused:#?}\nused: {used:#?}"
    );

    // And the migration itself had no overlap, and wrote nothing a real server refuses.
    let mut requests = server.request_entries();
    let invalid = harness::refused_as_invalid(&requests);
    assert!(invalid.is_empty(), "writes refused as invalid: {invalid:#?}");
    let cloud_writes = harness::cloud_writes(cloud.url()).await.unwrap();
    assert!(!cloud_writes.is_empty(), "the cloud logged no change");
    requests.extend(cloud_writes);
    // The operator applied the manifests with kubectl: its writes are expected, not judged.
    let governance = environment
        .governance()
        .unwrap()
        .other_client("the operator's kubectl", "kubectl/");
    let report = audit(&server.lease_writes(), &requests, &governance);
    assert!(report.overlaps.is_empty(), "{:#?}", report.overlaps);
    assert!(report.writes_checked > 0);
}

control_plane::on_both_backends!(the_shipped_rbac_is_enough_for_a_migration_and_no_more);
