//! The shipped manifests (`deploy/`): every overlay renders with the real `kubectl`, its flags are this
//! binary's, and its RBAC is proven both ways on the test API server in RBAC mode: a migration run with
//! the shipped identities gets no 403, and every verb the RBAC grants is one the managers used.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use cloud_controller_manager::harness::{Environment, Replica, Side, Timings, Workload, wait_for_holders};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use leadermigration::audit::audit;
use leadermigration::{ControllerCatalog, MigrationConfig};
use provider_fake::{
    AdminRequest, CloudRequest, FakeCloud, FakeCloudServer, FakeInstance, InstanceState, Knobs,
};
use serde_json::{Value, json};
use test_apiserver::{Config, RequestRecord, TestApiServer, UserInfo};
use tokio_util::sync::CancellationToken;

use crate::support::{binary, repo_root, stderr, stdout};

const WAIT: Duration = Duration::from_secs(30);
const KCM: &str = "kube-controller-manager";
const CCM: &str = "cloud-controller-manager";
const MIGRATION: &str = "cloud-provider-extraction-migration";
const LEASES: [&str; 3] = [KCM, CCM, MIGRATION];
/// Who the shipped manifests run as: the Deployment's service account and the static pod's user.
const SERVICE_ACCOUNT: &str = "system:serviceaccount:kube-system:cloud-controller-manager";
const STATIC_POD_USER: &str = "system:cloud-controller-manager";

fn kubectl(kubeconfig: Option<&Path>, args: &[&str]) -> Output {
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

/// `kubectl kustomize deploy/overlays/<overlay>`, as objects.
fn render(overlay: &str) -> Vec<Value> {
    let output = kubectl(None, &["kustomize", &format!("deploy/overlays/{overlay}")]);
    serde_saphyr::from_multiple::<Value>(&stdout(&output)).expect("kustomize renders YAML")
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
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

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .rev()
        .find_map(|a| a.strip_prefix(&format!("{name}=")))
}

/// The file a container path resolves to through the pod's volumes: (ConfigMap name, key).
fn mounted_config_map<'a>(pod: &'a Value, path: &'a str) -> (&'a str, &'a str) {
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

#[test]
fn every_overlay_renders_for_the_control_plane_with_the_binarys_flags() {
    let shipped_config =
        std::fs::read_to_string(repo_root().join("examples/leader-migration/n-plus-1.yaml")).unwrap();
    for (overlay, provider) in [("fake", "fake"), ("aws", "aws"), ("gce", "gce")] {
        let objects = render(overlay);
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
            cloud_provider::names::TAINT_UNINITIALIZED,
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
                MigrationConfig::load(path, data.as_bytes(), &ControllerCatalog::standard())
                    .unwrap_or_else(|e| panic!("{overlay}: {e}"));
            }
            let copy = files.path().join(key);
            std::fs::write(&copy, data).unwrap();
            local.push(format!("{file_flag}={}", copy.display()));
        }
        if provider == "fake" {
            continue; // It runs, with these flags, in the migration test below.
        }
        // The binary takes every flag; the provider it does not register is the one error.
        let output = binary()
            .args(&local)
            .args(["--kubeconfig=/nonexistent", "--secure-port=0"])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
        assert!(
            stderr(&output).contains(&format!("unknown cloud provider \"{provider}\"")),
            "{overlay}: {}",
            stderr(&output)
        );
    }
    let (pod, args) = static_pod();
    assert_eq!(pod["spec"]["hostNetwork"], true);
    assert_eq!(
        flag(&args, "--leader-migration-config"),
        Some("/etc/leadermigration.conf"),
        "the seed guide's path"
    );
    let mounts = strings(&json!(
        pod["spec"]["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["mountPath"].clone())
            .collect::<Vec<_>>()
    ));
    for file_flag in ["--leader-migration-config", "--kubeconfig", "--cloud-config"] {
        let path = flag(&args, file_flag).unwrap();
        assert!(
            mounts.iter().any(|m| m == path),
            "{file_flag}={path} is mounted: {mounts:?}"
        );
    }
}

#[test]
fn the_shipped_migration_rbac_is_what_the_rbac_command_generates() {
    let shipped =
        std::fs::read_to_string(repo_root().join("deploy/base/leader-migration-rbac.yaml")).unwrap();
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

/// Every rule the shipped manifests grant the cloud-controller-manager identities, flattened to
/// (apiGroup, resource, verb, resourceNames), after checking that none uses a wildcard.
fn granted(objects: &[Value]) -> BTreeSet<(String, String, String, Vec<String>)> {
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
        let role = find(
            objects,
            binding["roleRef"]["kind"].as_str().unwrap(),
            binding["roleRef"]["name"].as_str().unwrap(),
        );
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
                        grants.insert((group.clone(), resource.clone(), verb, names.clone()));
                    }
                }
            }
        }
    }
    grants
}

/// A kubeconfig that authenticates as `user`.
fn kubeconfig_for(server: &TestApiServer, dir: &Path, file: &str, user: UserInfo) -> PathBuf {
    let path = dir.join(file);
    server.write_kubeconfig(&path, &server.mint_token(user)).unwrap();
    path
}

/// A shipped manifest's arguments, with what differs on this machine appended (later flags win): files
/// where the manifest mounts them, a free port, and the harness's short election timings.
fn localized(args: &[String], environment: &Environment, kubeconfig: &Path) -> Vec<String> {
    let mut args = args.to_vec();
    args.extend([
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--cloud-config={}", environment.cloud_config.display()),
        format!("--leader-migration-config={}", environment.ccm_config.display()),
        "--secure-port=0".to_owned(),
        "--node-monitor-period=500ms".to_owned(),
        "--route-reconciliation-period=1s".to_owned(),
    ]);
    args.extend(environment.timing_flags());
    args
}

/// SIGTERM, and a clean exit.
fn stop_gracefully(replica: &mut Replica) {
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
fn refusals(server: &TestApiServer) -> Vec<String> {
    server
        .requests()
        .iter()
        .filter(|r| {
            r.status == 403
                && r.user
                    .as_deref()
                    .is_some_and(|u| u == SERVICE_ACCOUNT || u == STATIC_POD_USER)
        })
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
async fn wait_until<F, Fut>(server: &TestApiServer, what: &str, mut condition: F)
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

fn initialized(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_none_or(|t| {
            t.iter()
                .all(|t| t.key != cloud_provider::names::TAINT_UNINITIALIZED)
        })
}

fn has_ingress(service: &Service) -> bool {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_rbac_is_enough_for_a_migration_and_no_more() {
    let server = TestApiServer::start_with(Config {
        rbac: true,
        tls: true,
        ..Config::default()
    })
    .await
    .unwrap();
    let admin_kubeconfig = server.kubeconfig_path().to_owned();
    kubectl(
        Some(&admin_kubeconfig),
        &["apply", "--server-side", "-k", "deploy/overlays/fake"],
    );
    let objects = render("fake");
    let grants = granted(&objects);

    let cloud = FakeCloudServer::start(
        FakeCloud::new(Vec::new(), Knobs::default()),
        ([127, 0, 0, 1], 0).into(),
    )
    .await
    .unwrap();
    let directory = tempfile::tempdir().unwrap();
    // The N side plays kube-controller-manager as the cluster admin: what is under test is the N+1 side.
    let environment = Environment::prepare(
        directory.path(),
        env!("CARGO_BIN_EXE_cloud-controller-manager").into(),
        admin_kubeconfig,
        cloud.url(),
        Timings::fast(),
    )
    .unwrap();
    let service_account = kubeconfig_for(
        &server,
        directory.path(),
        "sa.kubeconfig",
        UserInfo::service_account("kube-system", CCM),
    );
    let static_pod_user = kubeconfig_for(
        &server,
        directory.path(),
        "user.kubeconfig",
        UserInfo {
            name: STATIC_POD_USER.to_owned(),
            groups: vec!["system:authenticated".to_owned()],
        },
    );
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
        &localized(&static_args, &environment, &static_pod_user),
    )
    .unwrap();
    let static_id = static_replica.identity(WAIT).unwrap();
    wait_for_holders(&client, &LEASES, WAIT, "the static pod's replica to lead", |h| {
        h[CCM].as_ref() == Some(&static_id)
    })
    .await
    .unwrap();
    stop_gracefully(&mut kcms[0]);
    let mut deployment_replica = Replica::spawn(
        &environment,
        "ccm-deployment",
        Side::Ccm,
        &localized(&deployment_args, &environment, &service_account),
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
        &server,
        "every node initialised and every service served",
        || async {
            let all_nodes = nodes.list(&Default::default()).await.unwrap().items;
            let all_services = services.list(&Default::default()).await.unwrap().items;
            all_nodes.len() == 3 + created.nodes as usize
                && all_nodes.iter().all(initialized)
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
        "metadata": {"name": "node-odd", "annotations": {cloud_provider::names::ANNOTATION_PROVIDED_NODE_IP: "192.0.2.1"}},
        "spec": {"taints": [{"key": cloud_provider::names::TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]},
    }))
    .unwrap();
    nodes.create(&Default::default(), &odd).await.unwrap();
    let event_writes = |verb: &str| {
        server
            .requests()
            .iter()
            .filter(|r| {
                r.user.as_deref() == Some(SERVICE_ACCOUNT)
                    && r.verb.as_deref() == Some(verb)
                    && r.resource.as_deref() == Some("events.events.k8s.io")
                    && (200..300).contains(&r.status)
            })
            .count()
    };
    wait_until(&server, "an event about node-odd", || async {
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
    wait_until(&server, "the event about node-odd to repeat", || async {
        event_writes("patch") > 0
    })
    .await;
    wait_until(
        &server,
        "the gone node deleted, the stopped one tainted, the service cleaned up",
        || async {
            let gone = nodes.get_opt("node-0").await.unwrap().is_none();
            let tainted = nodes
                .get("node-1")
                .await
                .unwrap()
                .spec
                .and_then(|s| s.taints)
                .is_some_and(|t| t.iter().any(|t| t.key == cloud_provider::names::TAINT_SHUTDOWN));
            let cleaned = services.get_opt("web-0").await.unwrap().is_none();
            gone && tainted && cleaned
        },
    )
    .await;
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
    let refused = refusals(&server);
    assert!(
        refused.is_empty(),
        "the shipped RBAC refused:\n{}",
        refused.join("\n")
    );

    // No more: every granted verb was used.
    let used: BTreeSet<(String, String, String)> = by_ccm
        .iter()
        .filter_map(|r| {
            let (resource, group) = r
                .resource
                .as_deref()?
                .split_once('.')
                .unwrap_or((r.resource.as_deref()?, ""));
            let resource = match &r.subresource {
                Some(sub) => format!("{resource}/{sub}"),
                None => resource.to_owned(),
            };
            Some((group.to_owned(), resource, r.verb.clone()?))
        })
        .collect();
    let unused: Vec<_> = grants
        .iter()
        .filter(|(group, resource, verb, _)| !used.contains(&(group.clone(), resource.clone(), verb.clone())))
        .collect();
    assert!(
        unused.is_empty(),
        "granted but never used: {unused:#?}\nused: {used:#?}"
    );

    // And the migration itself had no overlap.
    let admin = cloud_controller_manager::harness::Admin::new(client.clone());
    let report = audit(
        &admin.leases().await.unwrap(),
        &admin.requests().await.unwrap(),
        &environment.governance().unwrap(),
    );
    assert!(report.overlaps.is_empty(), "{:#?}", report.overlaps);
    assert!(report.writes_checked > 0);
}
