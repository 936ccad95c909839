//! RBAC mode: tokens map to users, requests are authorised from stored roles and bindings.

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use kube_ccm_test_apiserver::{Config, TestApiServer, UserInfo};
use serde_json::json;

use crate::support::{kubectl_with_input, ok};

/// `get /metrics` for the service account monitoring/prometheus.
const METRICS_READER: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: metrics-reader}
rules:
- {nonResourceURLs: [/metrics], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: metrics-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: metrics-reader}
subjects:
- {kind: ServiceAccount, name: prometheus, namespace: monitoring}
"#;

fn forbidden(result: Result<impl std::fmt::Debug, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) if status.code == 403 => status.message,
        other => panic!("expected 403 Forbidden, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_accounts_get_exactly_what_their_roles_allow() {
    let server = TestApiServer::start_with(Config {
        rbac: true,
        tls: true,
        ..Config::default()
    })
    .await
    .unwrap();
    let token = server.mint_token(UserInfo::service_account(
        "kube-system",
        "cloud-controller-manager",
    ));
    let as_ccm = server.client_with(&token, "cloud-controller-manager/test");
    let leases: Api<Lease> = Api::namespaced(as_ccm, "kube-system");
    let message = forbidden(leases.get("cloud-provider-extraction-migration").await);
    assert_eq!(
        message,
        "leases.coordination.k8s.io \"cloud-provider-extraction-migration\" is forbidden: User \"system:serviceaccount:kube-system:cloud-controller-manager\" cannot get resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"kube-system\""
    );

    // Grant what `leader-migration rbac` prints (applied with the real kubectl as the administrator).
    let rbac = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: migration, namespace: kube-system}
rules:
- {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [create]}
- {apiGroups: [coordination.k8s.io], resources: [leases], resourceNames: [cloud-provider-extraction-migration], verbs: [get, list, watch, update]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: migration, namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: migration}
subjects:
- {kind: ServiceAccount, name: cloud-controller-manager, namespace: kube-system}
"#;
    ok(&kubectl_with_input(
        server.kubeconfig_path(),
        &["apply", "--server-side", "-f", "-"],
        Some(rbac),
    ));

    let lease: Lease = serde_json::from_value(
        json!({"metadata": {"name": "cloud-provider-extraction-migration"}, "spec": {}}),
    )
    .unwrap();
    leases
        .create(&PostParams::default(), &lease)
        .await
        .expect("create is granted without resourceNames");
    leases
        .get("cloud-provider-extraction-migration")
        .await
        .expect("get is granted by name");
    let pinned = kube::api::ListParams::default().fields("metadata.name=cloud-provider-extraction-migration");
    leases
        .list(&pinned)
        .await
        .expect("a list pinned to the name is authorised by name");
    forbidden(leases.list(&kube::api::ListParams::default()).await);
    forbidden(leases.get("kube-controller-manager").await);
    forbidden(
        leases
            .delete("cloud-provider-extraction-migration", &Default::default())
            .await,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_tokens_are_unauthorized_in_rbac_mode() {
    let server = TestApiServer::start_with(Config {
        rbac: true,
        tls: true,
        ..Config::default()
    })
    .await
    .unwrap();
    let leases: Api<Lease> = Api::namespaced(server.client_with("made-up", "x/1"), "kube-system");
    match leases.get("x").await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 401),
        other => panic!("expected 401, got {other:?}"),
    }
    server.set_rbac(false);
    assert!(
        matches!(leases.get("x").await, Err(kube::Error::Api(status)) if status.code == 404),
        "RBAC off: anyone may ask"
    );
}

/// TokenReview and SubjectAccessReview, sent by the real kubectl, answered by the authoriser that decides
/// the server's own requests; creating them needs `system:auth-delegator`'s rules, as on a real cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_and_access_reviews_answer_as_the_servers_own_authoriser() {
    let server = TestApiServer::start_with(Config {
        rbac: true,
        tls: true,
        ..Config::default()
    })
    .await
    .unwrap();
    let reader = server.mint_token(UserInfo::service_account("monitoring", "prometheus"));
    ok(&kubectl_with_input(
        server.kubeconfig_path(),
        &["apply", "--server-side", "-f", "-"],
        Some(METRICS_READER),
    ));
    let create = |path: &str, body: serde_json::Value| {
        let output = kubectl_with_input(
            server.kubeconfig_path(),
            &["create", "--raw", path, "-f", "-"],
            Some(&body.to_string()),
        );
        serde_json::from_str::<serde_json::Value>(&ok(&output)).unwrap()
    };
    let tokens = "/apis/authentication.k8s.io/v1/tokenreviews";
    let review = create(
        tokens,
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": reader}}),
    );
    assert_eq!(review["kind"], "TokenReview");
    assert_eq!(review["status"]["authenticated"], true);
    assert_eq!(
        review["status"]["user"]["username"],
        "system:serviceaccount:monitoring:prometheus"
    );
    let unknown = create(
        tokens,
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "nope"}}),
    );
    assert_eq!(unknown["status"]["authenticated"], false);

    let access = |user: &str, path: &str| {
        create(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
                "user": user, "groups": ["system:authenticated"],
                "nonResourceAttributes": {"verb": "get", "path": path},
            }}),
        )["status"]["allowed"]
            .clone()
    };
    assert_eq!(
        access("system:serviceaccount:monitoring:prometheus", "/metrics"),
        true
    );
    assert_eq!(
        access("system:serviceaccount:monitoring:prometheus", "/debug/pprof/"),
        false
    );
    assert_eq!(access("system:serviceaccount:other:someone", "/metrics"), false);

    // A caller without system:auth-delegator's rules may not ask.
    let as_reader = server.client_with(&reader, "test");
    let request = http::Request::post(tokens)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&json!({"spec": {"token": "x"}})).unwrap())
        .unwrap();
    match as_reader.request::<serde_json::Value>(request).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("expected 403, got {other:?}"),
    }
}

/// A SelfSubjectAccessReview (what `kubectl auth can-i` asks; kubectl sends it as protobuf, which this
/// server refuses with 415, so kube-rs asks here) is answered for the caller, who may always ask
/// (system:basic-user).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_subject_access_reviews_are_answered_for_the_caller() {
    let server = TestApiServer::start_with(Config {
        rbac: true,
        tls: true,
        ..Config::default()
    })
    .await
    .unwrap();
    let token = server.mint_token(UserInfo::service_account("monitoring", "prometheus"));
    let as_prometheus = server.client_with(&token, "test");
    let can_i = |attributes: serde_json::Value| {
        let client = as_prometheus.clone();
        async move {
            let review: k8s_openapi::api::authorization::v1::SelfSubjectAccessReview =
                serde_json::from_value(json!({"spec": attributes})).unwrap();
            kube::Api::<k8s_openapi::api::authorization::v1::SelfSubjectAccessReview>::all(client)
                .create(&PostParams::default(), &review)
                .await
                .unwrap()
                .status
                .unwrap()
                .allowed
        }
    };
    let metrics = json!({"nonResourceAttributes": {"verb": "get", "path": "/metrics"}});
    let nodes = json!({"resourceAttributes": {"verb": "get", "resource": "nodes"}});
    assert!(!can_i(metrics.clone()).await);
    ok(&kubectl_with_input(
        server.kubeconfig_path(),
        &["apply", "--server-side", "-f", "-"],
        Some(METRICS_READER),
    ));
    assert!(can_i(metrics).await);
    assert!(!can_i(nodes).await);
    // kubectl's own can-i sends protobuf: refused as such, not misread.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("prometheus.kubeconfig");
    server.write_kubeconfig(&kubeconfig, &token).unwrap();
    let output = kubectl_with_input(&kubeconfig, &["auth", "can-i", "get", "/metrics"], None);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unknown format"), "{stderr}");
}
