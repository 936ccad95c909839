//! Both control planes answer what the end-to-end tests ask of them: an administrator, minted identities
//! that RBAC judges, and the server's own record of requests and Lease writes.

#![allow(clippy::print_stderr)]

use control_plane::{ApiServer, Backend, Credentials, UserInfo, on_both_backends};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).unwrap()
}

async fn the_server_records_writes_and_lease_holders(backend: Backend) {
    let server = ApiServer::for_test(backend).await;
    let client = server.client_with(&server.admin(), "tester/1 (linux/amd64) host_1/leader-election");
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let lease: Lease = object(serde_json::json!({
        "metadata": {"name": "probe"},
        "spec": {"holderIdentity": "host_1", "leaseDurationSeconds": 15},
    }));
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut released = created.clone();
    released.spec.as_mut().unwrap().holder_identity = None;
    let released = leases
        .replace("probe", &PostParams::default(), &released)
        .await
        .unwrap();
    Api::<Node>::all(client)
        .create(
            &PostParams::default(),
            &object(serde_json::json!({"metadata": {"name": "n1"}})),
        )
        .await
        .unwrap();

    let writes = server.lease_writes();
    let probe: Vec<_> = writes.iter().filter(|w| w.name == "probe").collect();
    assert_eq!(probe.len(), 2, "{writes:#?}");
    assert_eq!(probe[0].operation, "create");
    assert_eq!(probe[0].holder_identity.as_deref(), Some("host_1"));
    assert_eq!(probe[0].lease_duration_seconds, Some(15));
    assert_eq!(
        probe[0].resource_version.to_string(),
        created.metadata.resource_version.unwrap()
    );
    assert_eq!(
        probe[1].resource_version.to_string(),
        released.metadata.resource_version.unwrap()
    );
    assert!(probe[1].holder_identity.as_deref().is_none_or(str::is_empty));

    let requests = server.requests();
    let node = requests
        .iter()
        .find(|r| r.verb.as_deref() == Some("create") && r.resource.as_deref() == Some("nodes"))
        .unwrap_or_else(|| panic!("the node's create is recorded: {requests:#?}"));
    assert_eq!(
        (node.method.as_str(), node.path.as_str(), node.status),
        ("POST", "/api/v1/nodes", 201)
    );
    assert!(node.user_agent.starts_with("tester/1"), "{node:?}");
    assert!(node.resource_version.is_some());
    let entries = server.request_entries();
    assert!(
        entries
            .iter()
            .any(|e| e.path == "/api/v1/nodes" && e.status == 201)
    );
}

async fn minted_identities_are_judged_by_rbac(backend: Backend) {
    let server = ApiServer::for_test(backend).await;
    if let Some(test) = server.as_test() {
        test.set_rbac(true);
    }
    let reader = server
        .mint(&UserInfo::service_account("monitoring", "prometheus"))
        .await;
    assert!(matches!(reader, Credentials::Token(_)));
    let user = server
        .mint(&UserInfo {
            name: "nobody".into(),
            groups: vec!["system:authenticated".into()],
        })
        .await;
    for credentials in [reader, user] {
        let client = server.client_with(&credentials, "tester/1");
        let error = Api::<Node>::all(client)
            .list(&Default::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&error, kube::Error::Api(status) if status.code == 403),
            "{error}"
        );
    }
    let admin = Api::<Node>::all(server.client()).list(&Default::default()).await;
    assert!(admin.is_ok(), "{admin:?}");
    // kubectl reads the kubeconfig written for an identity.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("nobody.kubeconfig");
    server
        .kubeconfig_for(
            &kubeconfig,
            &UserInfo {
                name: "nobody".into(),
                groups: vec!["system:authenticated".into()],
            },
        )
        .await
        .unwrap();
    let output = std::process::Command::new("kubectl")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"])
        .output()
        .unwrap();
    if backend == Backend::Kube {
        assert_eq!(String::from_utf8_lossy(&output.stdout), "nobody", "{output:?}");
    }
}

/// A write asked for its answer as `PartialObjectMetadata` gets the object's metadata only, on the main
/// resource and the status subresource; a Node created with neither spec nor status has both, so a JSON
/// Patch may add under them.
async fn writes_answer_with_metadata_only_when_asked(backend: Backend) {
    const METADATA_ONLY: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
    let server = ApiServer::for_test(backend).await;
    let client = server.client();
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &object(serde_json::json!({"metadata": {"name": "bare"}})),
        )
        .await
        .unwrap();
    let patch = |path: &str, body: serde_json::Value, accept: Option<&str>| {
        let mut request =
            http::Request::patch(path).header(http::header::CONTENT_TYPE, "application/json-patch+json");
        if let Some(accept) = accept {
            request = request.header(http::header::ACCEPT, accept);
        }
        request.body(serde_json::to_vec(&body).unwrap()).unwrap()
    };
    let status: serde_json::Value = client
        .request(patch(
            "/api/v1/nodes/bare/status",
            serde_json::json!([{"op": "add", "path": "/status/addresses", "value": [{"type": "InternalIP", "address": "10.0.0.1"}]}]),
            Some(METADATA_ONLY),
        ))
        .await
        .unwrap();
    assert_eq!(status["kind"], "PartialObjectMetadata", "{status}");
    assert_eq!(status["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(status["metadata"]["name"], "bare");
    assert!(
        status.get("status").is_none() && status.get("spec").is_none(),
        "{status}"
    );
    let main: serde_json::Value = client
        .request(patch(
            "/api/v1/nodes/bare",
            serde_json::json!([
                {"op": "add", "path": "/metadata/resourceVersion", "value": status["metadata"]["resourceVersion"]},
                {"op": "add", "path": "/metadata/labels", "value": {"a/b": "c"}},
                {"op": "add", "path": "/spec/providerID", "value": "fake://bare"},
            ]),
            Some(METADATA_ONLY),
        ))
        .await
        .unwrap();
    assert_eq!(main["kind"], "PartialObjectMetadata", "{main}");
    assert_eq!(main["metadata"]["labels"]["a/b"], "c");
    assert_ne!(
        main["metadata"]["resourceVersion"],
        status["metadata"]["resourceVersion"]
    );
    // Without the Accept, the whole object; a stale resourceVersion in a JSON Patch is a conflict.
    let whole: Node = client
        .request(patch(
            "/api/v1/nodes/bare",
            serde_json::json!([{"op": "add", "path": "/metadata/labels/a~1b", "value": "d"}]),
            None,
        ))
        .await
        .unwrap();
    assert_eq!(whole.spec.unwrap().provider_id.as_deref(), Some("fake://bare"));
    let addresses = whole.status.unwrap().addresses.unwrap();
    assert_eq!(addresses[0].address, "10.0.0.1");
    assert_eq!(whole.metadata.labels.unwrap()["a/b"], "d");
    let stale = client
        .request::<serde_json::Value>(patch(
            "/api/v1/nodes/bare",
            serde_json::json!([
                {"op": "add", "path": "/metadata/resourceVersion", "value": status["metadata"]["resourceVersion"]},
                {"op": "add", "path": "/metadata/labels/x", "value": "y"},
            ]),
            Some(METADATA_ONLY),
        ))
        .await;
    match stale {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 409, "{status:?}"),
        other => panic!("a stale resourceVersion is a conflict: {other:?}"),
    }
}

/// The node controller's writes as strategic merge patches: a status patch whose `$patch: replace`
/// replaces the addresses whole (their merge key, the type, repeats: two InternalIPs), and a main
/// resource patch that merges labels, replaces the taints (a list with no merge key) and fails on a stale
/// resourceVersion.
async fn strategic_patches_write_a_node_as_the_node_controller_does(backend: Backend) {
    let server = ApiServer::for_test(backend).await;
    let nodes = Api::<Node>::all(server.client());
    let created = nodes
        .create(
            &PostParams::default(),
            &object(serde_json::json!({
                "metadata": {"name": "n", "labels": {"kept": "yes"}},
                "spec": {"taints": [
                    {"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"},
                    {"key": "example.com/keep", "effect": "NoSchedule"},
                ]},
                "status": {"addresses": [
                    {"type": "InternalIP", "address": "10.0.0.1"},
                    {"type": "InternalIP", "address": "10.0.0.2"},
                    {"type": "Hostname", "address": "n"},
                ]},
            })),
        )
        .await
        .unwrap();
    let addresses = serde_json::json!({"status": {"addresses": [
        {"$patch": "replace"},
        {"type": "InternalIP", "address": "10.0.0.4"},
        {"type": "InternalIP", "address": "10.0.0.3"},
        {"type": "Hostname", "address": "n"},
    ]}});
    let status = nodes
        .patch_status("n", &PatchParams::default(), &Patch::Strategic(addresses))
        .await
        .unwrap();
    let listed: Vec<(String, String)> = status
        .status
        .unwrap()
        .addresses
        .unwrap()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert_eq!(
        listed,
        [
            ("InternalIP".to_owned(), "10.0.0.4".to_owned()),
            ("InternalIP".to_owned(), "10.0.0.3".to_owned()),
            ("Hostname".to_owned(), "n".to_owned()),
        ],
        "replaced whole, in the patch's order"
    );
    let main = serde_json::json!({
        "metadata": {"resourceVersion": status.metadata.resource_version, "labels": {"added": "yes"}},
        "spec": {"providerID": "fake://n", "taints": [{"key": "example.com/keep", "effect": "NoSchedule"}]},
    });
    let written = nodes
        .patch("n", &PatchParams::default(), &Patch::Strategic(main.clone()))
        .await
        .unwrap();
    let labels = written.metadata.labels.unwrap();
    assert_eq!(
        (labels["kept"].as_str(), labels["added"].as_str()),
        ("yes", "yes")
    );
    let spec = written.spec.unwrap();
    assert_eq!(spec.provider_id.as_deref(), Some("fake://n"));
    let taints: Vec<String> = spec.taints.unwrap().into_iter().map(|t| t.key).collect();
    assert_eq!(taints, ["example.com/keep"], "the taints replaced");
    match nodes
        .patch("n", &PatchParams::default(), &Patch::Strategic(main))
        .await
    {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 409, "{status:?}"),
        other => panic!("a stale resourceVersion is a conflict: {other:?}"),
    }
    assert_ne!(
        created.metadata.resource_version,
        written.metadata.resource_version
    );
}

on_both_backends!(
    the_server_records_writes_and_lease_holders,
    minted_identities_are_judged_by_rbac,
    writes_answer_with_metadata_only_when_asked,
    strategic_patches_write_a_node_as_the_node_controller_does
);

/// Start-up time and memory of the real control plane, for the record (`--nocapture` shows them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_control_plane_starts_and_reports_its_cost() {
    let Some(binaries) =
        control_plane::KubeBinaries::for_test("the_real_control_plane_starts_and_reports_its_cost")
    else {
        return;
    };
    let server = control_plane::KubeApiServer::start(&binaries, &Default::default())
        .await
        .unwrap();
    let (etcd, apiserver) = server.rss_mib();
    eprintln!(
        "kube-apiserver {} on etcd {}: ready in {:.1} s; resident etcd {etcd:.0} MiB, kube-apiserver {apiserver:.0} MiB",
        server.version(),
        binaries.etcd_version,
        server.started_in().as_secs_f64()
    );
    assert!(etcd > 0.0 && apiserver > 0.0);
    let version = server.client().apiserver_version().await.unwrap();
    assert_eq!(format!("v{}.{}", version.major, version.minor), "v1.37");
    let dir = server.dir().to_owned();
    drop(server);
    assert!(!dir.exists(), "the directory goes with the server");
}
