//! RBAC mode: tokens map to users, requests are authorised from stored roles and bindings.

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use serde_json::json;
use test_apiserver::{Config, TestApiServer, UserInfo};

use crate::support::{kubectl_with_input, ok};

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
