//! An operator who replaces an upstream CCM keeps its RBAC and its DaemonSet's arguments: the published roles
//! of cloud-provider-aws (its example with per-controller credentials) and cloud-provider-gcp, written here
//! as fixtures from what those projects publish, on a real kube-apiserver with its bootstrap
//! `system:controller:*` roles. The manager runs as their `kube-system/cloud-controller-manager` with
//! `--use-service-account-credentials=true`: nodes are initialised, a LoadBalancer service is served and
//! deleted, Events are recorded (core/v1, which both grant), each controller acts as its own service
//! account, and nothing it asks is refused.
//!
//! Real server only: the test API server has no TokenRequest API.

use std::time::Duration;

use control_plane::{ApiServer, Backend, KubeBinaries, UserInfo};
use harness::{Environment, Replica, Side, Timings, Workload, has_ingress, initialized};
use k8s_openapi::api::core::v1::{Event, Service};
use kube::api::{Api, DeleteParams};

use crate::deploy::{kubeconfig_for, kubectl, refused};
use crate::support::free_port;

const WAIT: Duration = Duration::from_secs(90);

/// cloud-provider-aws's `examples/existing-cluster/base` (its DaemonSet passes
/// `--use-service-account-credentials=true`): the service account, its ClusterRole and binding, and the
/// authentication reader's RoleBinding.
const AWS_RBAC: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: cloud-controller-manager, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:cloud-controller-manager"}
rules:
  - {apiGroups: [""], resources: [events], verbs: [create, patch, update]}
  - {apiGroups: [""], resources: [nodes], verbs: ["*"]}
  - {apiGroups: [""], resources: [nodes/status], verbs: [patch]}
  - {apiGroups: [""], resources: [services], verbs: [list, patch, update, watch]}
  - {apiGroups: [""], resources: [services/status], verbs: [list, patch, update, watch]}
  - {apiGroups: [""], resources: [serviceaccounts], verbs: [create, get, list, watch]}
  - {apiGroups: [""], resources: [persistentvolumes], verbs: [get, list, update, watch]}
  - {apiGroups: [""], resources: [endpoints], verbs: [create, get, list, watch, update]}
  - {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [create, get, list, watch, update]}
  - {apiGroups: [""], resources: [serviceaccounts/token], verbs: [create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:cloud-controller-manager"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:cloud-controller-manager"}
subjects: [{kind: ServiceAccount, name: cloud-controller-manager, namespace: kube-system}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: "cloud-controller-manager:apiserver-authentication-reader", namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: extension-apiserver-authentication-reader}
subjects: [{kind: ServiceAccount, name: cloud-controller-manager, namespace: kube-system}]
"#;

/// cloud-provider-gcp's published manager role (as its kops package binds it, to the service account),
/// the leader-locking Role, and the authentication reader's RoleBinding. Its per-controller accounts have
/// only the bootstrap roles.
const GCP_RBAC: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: cloud-controller-manager, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:cloud-controller-manager"}
rules:
  - {apiGroups: ["", events.k8s.io], resources: [events], verbs: [create, patch, update]}
  - {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [create, get, list, watch, update]}
  - {apiGroups: [""], resources: [endpoints, serviceaccounts, services], verbs: [create, get, update]}
  - {apiGroups: [""], resources: [nodes], verbs: [get, update, patch]}
  - {apiGroups: [""], resources: [namespaces], verbs: [get]}
  - {apiGroups: [""], resources: [nodes/status, services/status], verbs: [patch, update]}
  - {apiGroups: [""], resources: [secrets], verbs: [create, delete, get, update]}
  - {apiGroups: [authentication.k8s.io], resources: [tokenreviews], verbs: [create]}
  - {apiGroups: ["*"], resources: ["*"], verbs: [list, watch]}
  - {apiGroups: [""], resources: [serviceaccounts/token], verbs: [create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:cloud-controller-manager"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:cloud-controller-manager"}
subjects: [{kind: ServiceAccount, name: cloud-controller-manager, namespace: kube-system}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: "system::leader-locking-cloud-controller-manager", namespace: kube-system}
rules:
  - {apiGroups: [""], resources: [configmaps], verbs: [watch]}
  - {apiGroups: [""], resources: [configmaps], resourceNames: [cloud-controller-manager], verbs: [get, update]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: "system::leader-locking-cloud-controller-manager", namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: "system::leader-locking-cloud-controller-manager"}
subjects: [{kind: ServiceAccount, name: cloud-controller-manager, namespace: kube-system}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: "cloud-controller-manager:apiserver-authentication-reader", namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: extension-apiserver-authentication-reader}
subjects: [{kind: ServiceAccount, name: cloud-controller-manager, namespace: kube-system}]
"#;

/// The manager's own account and the controllers' (as upstream names them).
const MANAGER: &str = "system:serviceaccount:kube-system:cloud-controller-manager";
const NODE_CONTROLLER: &str = "system:serviceaccount:kube-system:node-controller";
const SERVICE_CONTROLLER: &str = "system:serviceaccount:kube-system:service-controller";
const ROUTE_CONTROLLER: &str = "system:serviceaccount:kube-system:route-controller";

#[test]
fn upstream_aws_rbac_with_per_controller_credentials() {
    // The DaemonSet's arguments (its provider is AWS; the fake cloud stands in for EC2 here).
    upstream_rbac(
        "upstream_aws_rbac_with_per_controller_credentials",
        AWS_RBAC,
        &[
            "--use-service-account-credentials=true",
            "--configure-cloud-routes=false",
            "--v=2",
        ],
    );
}

#[test]
fn upstream_gcp_rbac_with_per_controller_credentials() {
    // kube-up's and kops' arguments for cloud-provider-gcp (with routes, which the fake cloud has).
    upstream_rbac(
        "upstream_gcp_rbac_with_per_controller_credentials",
        GCP_RBAC,
        &[
            "--use-service-account-credentials",
            "--cluster-cidr=10.64.0.0/14",
            "--route-reconciliation-period=1s",
        ],
    );
}

fn upstream_rbac(test: &str, rbac: &str, upstream_args: &[&str]) {
    if KubeBinaries::for_test(test).is_none() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(rbac, upstream_args));
}

async fn run(rbac: &str, upstream_args: &[&str]) {
    let plane = crate::migration::Plane::start_secure(Backend::Kube).await;
    let server: &ApiServer = &plane.server;
    let directory = tempfile::tempdir().unwrap();
    let fixture = directory.path().join("rbac.yaml");
    std::fs::write(&fixture, rbac).unwrap();
    kubectl(
        Some(server.kubeconfig_path()),
        &["apply", "--server-side", "-f", fixture.to_str().unwrap()],
    );
    let manager = kubeconfig_for(
        server,
        directory.path(),
        "manager.kubeconfig",
        UserInfo::service_account("kube-system", "cloud-controller-manager"),
    )
    .await;
    let environment = Environment::prepare(
        directory.path(),
        env!("CARGO_BIN_EXE_cloud-controller-manager").into(),
        manager.clone(),
        plane.cloud.url(),
        Timings::fast(),
    )
    .unwrap();
    let mut args: Vec<String> = vec![
        "--cloud-provider=fake".to_owned(),
        format!("--cloud-config={}", environment.cloud_config.display()),
        format!("--kubeconfig={}", manager.display()),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--secure-port={}", free_port()),
        "--node-monitor-period=500ms".to_owned(),
    ];
    args.extend(upstream_args.iter().map(|a| (*a).to_owned()));
    args.extend(environment.timing_flags());
    let mut replica = Replica::spawn(&environment, "upstream-rbac", Side::Ccm, &args).unwrap();

    let client = server.client();
    let workload = Workload::new(client.clone(), plane.cloud.url());
    for index in 0..2 {
        workload.add_node(index).await.unwrap();
    }
    workload.add_service(0).await.unwrap();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let refused = || refusals(server);
    wait(
        &mut replica,
        "both nodes initialised and the service served",
        &refused,
        || async {
            let all = nodes.list(&Default::default()).await.unwrap().items;
            all.len() == 2
                && all.iter().all(initialized)
                && services.get("web-0").await.is_ok_and(|s| has_ingress(&s))
        },
    )
    .await;
    services.delete("web-0", &DeleteParams::default()).await.unwrap();
    wait(
        &mut replica,
        "the service's load balancer deleted",
        &refused,
        || async { services.get_opt("web-0").await.unwrap().is_none() },
    )
    .await;
    let events: Api<Event> = Api::all(client.clone());
    let recorded = || async {
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|e| {
                (
                    e.reporting_component.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                )
            })
            .collect::<Vec<(String, String)>>()
    };
    let expected = [
        ("service-controller", "EnsuredLoadBalancer"),
        ("service-controller", "DeletedLoadBalancer"),
        ("cloud-controller-manager", "LeaderElection"),
    ];
    // A controller's Events are written in the background, a moment after what they report.
    wait(&mut replica, "the Events recorded", &refused, || async {
        let recorded = recorded().await;
        expected
            .iter()
            .all(|(component, reason)| recorded.iter().any(|(c, r)| c == component && r == reason))
    })
    .await;
    replica.terminate().unwrap();
    let status = replica.wait(WAIT).unwrap();
    assert!(status.success(), "exited {status}: {}", replica.log_tail());

    // Each controller acted as its own account; the manager's own account did the rest.
    let requests = server.requests();
    let by = |user: &str| {
        requests
            .iter()
            .filter(|r| r.user.as_deref() == Some(user))
            .count()
    };
    assert!(
        by(NODE_CONTROLLER) > 0,
        "the node controllers acted as node-controller"
    );
    assert!(
        by(SERVICE_CONTROLLER) > 0,
        "the service controller acted as service-controller"
    );
    if upstream_args.iter().any(|a| a.starts_with("--cluster-cidr")) {
        assert!(
            by(ROUTE_CONTROLLER) > 0,
            "the route controller acted as route-controller"
        );
    }
    assert!(by(MANAGER) > 0);
    let writes_as_manager: Vec<String> = requests
        .iter()
        .filter(|r| {
            r.user.as_deref() == Some(MANAGER)
                && matches!(r.verb.as_deref(), Some("patch" | "update" | "delete"))
                && matches!(r.resource.as_deref(), Some("nodes" | "services"))
        })
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(
        writes_as_manager.is_empty(),
        "the controllers wrote with the manager's credentials: {writes_as_manager:?}"
    );
    let refused = refusals(server);
    assert!(refused.is_empty(), "refused:\n{}", refused.join("\n"));
}

/// Requests of the manager's accounts that the API server refused.
fn refusals(server: &ApiServer) -> Vec<String> {
    refused(server, |u| u.starts_with("system:serviceaccount:kube-system:"))
}

/// Waits for `condition`; a timeout (or the manager's exit) names what was refused and the manager's log.
pub(crate) async fn wait<F, Fut>(
    replica: &mut Replica,
    what: &str,
    refused: &dyn Fn() -> Vec<String>,
    mut condition: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while !condition().await {
        let exited = replica.try_wait();
        assert!(
            exited.is_none() && tokio::time::Instant::now() < deadline,
            "timed out waiting for {what} (manager exited: {exited:?}); refused:\n{}\nlog:\n{}",
            refused().join("\n"),
            replica.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn an_account_that_cannot_be_made_stops_the_start_naming_it() {
    if KubeBinaries::for_test("an_account_that_cannot_be_made_stops_the_start_naming_it").is_none() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let plane = crate::migration::Plane::start_secure(Backend::Kube).await;
        let server = &plane.server;
        let directory = tempfile::tempdir().unwrap();
        // A manager's identity that may take its Lease but not read or make service accounts.
        let role = directory.path().join("role.yaml");
        std::fs::write(
            &role,
            r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "test:leases-only"}
rules:
  - {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [create, get, list, watch, update]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "test:leases-only"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "test:leases-only"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: limited}]
"#,
        )
        .unwrap();
        kubectl(
            Some(server.kubeconfig_path()),
            &["apply", "--server-side", "-f", role.to_str().unwrap()],
        );
        let limited = kubeconfig_for(
            server,
            directory.path(),
            "limited.kubeconfig",
            UserInfo {
                name: "limited".to_owned(),
                groups: vec!["system:authenticated".to_owned()],
            },
        )
        .await;
        let environment = Environment::prepare(
            directory.path(),
            env!("CARGO_BIN_EXE_cloud-controller-manager").into(),
            limited.clone(),
            plane.cloud.url(),
            Timings::fast(),
        )
        .unwrap();
        let args: Vec<String> = vec![
            "--cloud-provider=fake".to_owned(),
            format!("--cloud-config={}", environment.cloud_config.display()),
            format!("--kubeconfig={}", limited.display()),
            "--secure-port=0".to_owned(),
            "--use-service-account-credentials=true".to_owned(),
        ];
        let mut replica = Replica::spawn(&environment, "no-accounts", Side::Ccm, &args).unwrap();
        let status = replica.wait(WAIT).unwrap();
        let log = replica.log_tail();
        assert_eq!(status.code(), Some(1), "{log}");
        let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
        assert_eq!(errors.len(), 1, "one error: {log}");
        assert!(
            errors[0].contains("--use-service-account-credentials: service account kube-system/node-controller cannot be read or created")
                && errors[0].contains("forbidden"),
            "{log}"
        );
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(server.client(), "kube-system");
        assert!(
            leases.get_opt("cloud-controller-manager").await.unwrap().is_none(),
            "no Lease was contended for"
        );
    });
}
