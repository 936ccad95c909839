//! The real kubectl keeps the server honest.

use kube_ccm_test_apiserver::TestApiServer;
use serde_json::{Value, json};

use crate::support::{kubectl, kubectl_with_input, ok};

const CONFIGMAP: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: demo\n  namespace: kube-system\n  labels:\n    app: demo\ndata:\n  a: \"1\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_and_list_as_json() {
    let server = TestApiServer::start().await.unwrap();
    let config = server.kubeconfig_path();
    let namespaces: Value =
        serde_json::from_str(&ok(&kubectl(config, &["get", "namespaces", "-o", "json"]))).unwrap();
    let names: Vec<&str> = namespaces["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["default", "kube-node-lease", "kube-public", "kube-system"]
    );
    let one: Value = serde_json::from_str(&ok(&kubectl(
        config,
        &["get", "namespace", "kube-system", "-o", "json"],
    )))
    .unwrap();
    assert_eq!(one["status"]["phase"], "Active");
    let missing = kubectl(config, &["get", "configmap", "nope", "-n", "default"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("configmaps \"nope\" not found"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_patch_apply_and_delete() {
    let server = TestApiServer::start().await.unwrap();
    let config = server.kubeconfig_path();
    assert!(
        ok(&kubectl_with_input(
            config,
            &["create", "-f", "-"],
            Some(CONFIGMAP)
        ))
        .contains("configmap/demo created")
    );
    let again = kubectl_with_input(config, &["create", "-f", "-"], Some(CONFIGMAP));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("AlreadyExists")
            || String::from_utf8_lossy(&again.stderr).contains("already exists")
    );

    ok(&kubectl(
        config,
        &[
            "patch",
            "-n",
            "kube-system",
            "configmap",
            "demo",
            "--type=json",
            "-p",
            r#"[{"op":"add","path":"/data/b","value":"2"}]"#,
        ],
    ));
    ok(&kubectl(
        config,
        &[
            "patch",
            "-n",
            "kube-system",
            "configmap",
            "demo",
            "-p",
            r#"{"data":{"c":"3"}}"#,
        ],
    ));
    let data = ok(&kubectl(
        config,
        &[
            "get",
            "-n",
            "kube-system",
            "configmap",
            "demo",
            "-o",
            "jsonpath={.data}",
        ],
    ));
    assert_eq!(
        serde_json::from_str::<Value>(&data).unwrap(),
        json!({"a": "1", "b": "2", "c": "3"})
    );

    assert!(
        ok(&kubectl_with_input(
            config,
            &["apply", "--server-side", "-f", "-"],
            Some(CONFIGMAP)
        ))
        .contains("serverside-applied")
    );
    let applied: Value = serde_json::from_str(&ok(&kubectl(
        config,
        &[
            "get",
            "-n",
            "kube-system",
            "configmap",
            "demo",
            "-o",
            "json",
            "--show-managed-fields",
        ],
    )))
    .unwrap();
    let managers: Vec<&str> = applied["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["manager"].as_str().unwrap())
        .collect();
    assert_eq!(managers, ["kubectl-create", "kubectl-patch", "kubectl"]);

    // A second applier changing a field the first owns conflicts, and --force-conflicts takes it over.
    let changed = CONFIGMAP.replace("a: \"1\"", "a: \"changed\"");
    let conflict = kubectl_with_input(
        config,
        &["apply", "--server-side", "--field-manager=other", "-f", "-"],
        Some(&changed),
    );
    assert!(!conflict.status.success());
    assert!(
        String::from_utf8_lossy(&conflict.stderr).contains("conflict"),
        "{}",
        String::from_utf8_lossy(&conflict.stderr)
    );
    ok(&kubectl_with_input(
        config,
        &[
            "apply",
            "--server-side",
            "--field-manager=other",
            "--force-conflicts",
            "-f",
            "-",
        ],
        Some(&changed),
    ));
    assert_eq!(
        ok(&kubectl(
            config,
            &[
                "get",
                "-n",
                "kube-system",
                "configmap",
                "demo",
                "-o",
                "jsonpath={.data.a}"
            ]
        )),
        "changed"
    );

    assert!(
        ok(&kubectl(
            config,
            &["delete", "-n", "kube-system", "configmap", "demo"]
        ))
        .contains("configmap \"demo\" deleted")
    );
    assert!(
        !kubectl(config, &["get", "-n", "kube-system", "configmap", "demo"])
            .status
            .success()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_guides_role_patch() {
    let server = TestApiServer::start().await.unwrap();
    let config = server.kubeconfig_path();
    let rules = r#"{"rules": [ {"apiGroups":[ "coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["cloud-provider-extraction-migration"], "verbs": ["create", "list", "get", "update"] } ]}"#;
    let out = ok(&kubectl(
        config,
        &[
            "patch",
            "-n",
            "kube-system",
            "role",
            "system::leader-locking-kube-controller-manager",
            "-p",
            rules,
            "--type=merge",
        ],
    ));
    assert!(
        out.contains("role.rbac.authorization.k8s.io/system::leader-locking-kube-controller-manager patched"),
        "{out}"
    );
    let role: Value = serde_json::from_str(&ok(&kubectl(
        config,
        &[
            "get",
            "-n",
            "kube-system",
            "role",
            "system::leader-locking-kube-controller-manager",
            "-o",
            "json",
        ],
    )))
    .unwrap();
    assert_eq!(
        role["rules"],
        serde_json::from_str::<Value>(rules).unwrap()["rules"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_watch_sees_a_change() {
    let server = TestApiServer::start().await.unwrap();
    let config = server.kubeconfig_path().to_owned();
    ok(&kubectl_with_input(
        &config,
        &["create", "-f", "-"],
        Some(CONFIGMAP),
    ));
    // The watch lists first (the existing object), then reports the patch.
    let watcher = std::process::Command::new("kubectl")
        .args([
            "get",
            "configmap",
            "demo",
            "-n",
            "kube-system",
            "--watch",
            "--output-watch-events",
            "-o",
            "json",
            "--request-timeout=10s",
        ])
        .env("KUBECONFIG", &config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl is required");
    // Wait until the watch is established (its request is in the log), then change the object.
    crate::support::eventually(
        std::time::Duration::from_secs(20),
        "kubectl's watch request",
        || async {
            server
                .requests()
                .iter()
                .any(|r| r.verb.as_deref() == Some("watch") && r.user_agent.starts_with("kubectl"))
        },
    )
    .await;
    ok(&kubectl(
        &config,
        &[
            "patch",
            "-n",
            "kube-system",
            "configmap",
            "demo",
            "-p",
            r#"{"data":{"watched":"yes"}}"#,
        ],
    ));

    // Read kubectl's output as it streams, until the MODIFIED event has been printed.
    let mut watcher = watcher;
    let mut stdout = watcher.stdout.take().expect("piped");
    let printed = std::sync::Arc::new(parking_lot::Mutex::new(String::new()));
    let reader = {
        let printed = printed.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut buffer = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buffer) {
                if n == 0 {
                    break;
                }
                printed.lock().push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
        })
    };
    let events = || -> Vec<Value> {
        let text = printed.lock().clone();
        serde_json::Deserializer::from_str(&text)
            .into_iter::<Value>()
            .filter_map(Result::ok)
            .collect()
    };
    crate::support::eventually(
        std::time::Duration::from_secs(20),
        "kubectl to print the MODIFIED event",
        || {
            let found = events().iter().any(|e| e["type"] == "MODIFIED");
            async move { found }
        },
    )
    .await;
    watcher.kill().expect("stop kubectl");
    let _ = watcher.wait();
    reader.join().expect("reader thread");
    let events = events();
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(
        types.first(),
        Some(&"ADDED"),
        "the watch starts with the current object: {types:?}"
    );
    let modified = events.iter().find(|e| e["type"] == "MODIFIED").unwrap();
    assert_eq!(modified["object"]["data"]["watched"], "yes");
}

/// kubectl's typed commands send protobuf, which this server does not decode: it says so with a 415 (a
/// real server would accept them), not that JSON did not parse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_bodies_are_refused_as_an_unsupported_media_type() {
    let server = TestApiServer::start().await.unwrap();
    let output = kubectl(
        server.kubeconfig_path(),
        &[
            "create",
            "clusterrolebinding",
            "b",
            "--clusterrole=view",
            "--user=u",
        ],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("the body of the request was in an unknown format"),
        "{stderr}"
    );
}
