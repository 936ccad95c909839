//! The shipped IAM policy (`deploy/overlays/aws/iam-policy.json`) is enough: moto is told to check every
//! request (a known access key, a valid SigV4 signature, an action its user's policies allow) and the
//! shipped binary, with a user holding exactly that policy, initialises a node, routes its pod range,
//! serves a classic ELB and an NLB, deletes them, and deletes the node of a terminated instance, without
//! one request refused.

use std::process::{Child, Stdio};

use aws_sdk_ec2::error::ProvideErrorMetadata as _;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Service};
use kube::Api;
use kube::api::PostParams;
use kube_ccm_test_apiserver::TestApiServer;

const POLICY: &str = include_str!("../../../../deploy/overlays/aws/iam-policy.json");

struct Manager(Child);

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An access key.
#[derive(Clone)]
struct Keys {
    id: String,
    secret: String,
}

/// An IAM user `name` with the inline policy `policy` and an access key (moto's IAM Query API, before
/// moto checks anything).
async fn user(moto: &str, name: &str, policy: &str) -> Keys {
    let iam = |form: Vec<(&'static str, String)>| async move {
        let mut form = form;
        form.push(("Version", "2010-05-08".to_owned()));
        harness::aws::query(moto, "iam", &form).await.unwrap()
    };
    iam(vec![("Action", "CreateUser".into()), ("UserName", name.into())]).await;
    iam(vec![
        ("Action", "PutUserPolicy".into()),
        ("UserName", name.into()),
        ("PolicyName", format!("{name}-policy")),
        ("PolicyDocument", policy.into()),
    ])
    .await;
    let created = iam(vec![
        ("Action", "CreateAccessKey".into()),
        ("UserName", name.into()),
    ])
    .await;
    let value = |tag: &str| harness::aws::xml_values(&created, tag).remove(0);
    Keys {
        id: value("AccessKeyId"),
        secret: value("SecretAccessKey"),
    }
}

/// From now on moto authenticates and authorises every request.
async fn enforce(moto: &str) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let request = http::Request::post(format!("{moto}/moto-api/reset-auth"))
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"0")))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert!(response.status().is_success(), "{response:?}");
}

fn credentials(keys: &Keys) -> aws_sdk_ec2::config::Credentials {
    aws_sdk_ec2::config::Credentials::new(&keys.id, &keys.secret, None, None, "test")
}

fn ec2(moto: &str, keys: &Keys) -> aws_sdk_ec2::Client {
    let config = aws_sdk_ec2::config::Builder::new()
        .behavior_version(aws_sdk_ec2::config::BehaviorVersion::latest())
        .region(aws_sdk_ec2::config::Region::new("us-east-1"))
        .credentials_provider(credentials(keys))
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .endpoint_url(moto)
        .build();
    aws_sdk_ec2::Client::from_conf(config)
}

fn elb(moto: &str, keys: &Keys) -> aws_sdk_elasticloadbalancing::Client {
    let config = aws_sdk_elasticloadbalancing::config::Builder::new()
        .behavior_version(aws_sdk_elasticloadbalancing::config::BehaviorVersion::latest())
        .region(aws_sdk_elasticloadbalancing::config::Region::new("us-east-1"))
        .credentials_provider(credentials(keys))
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .endpoint_url(moto)
        .build();
    aws_sdk_elasticloadbalancing::Client::from_conf(config)
}

/// The manager's requests moto refused (401, 403): none may be.
fn refused_requests(proxy: &harness::aws::RecordingProxy) -> Vec<String> {
    proxy
        .requests()
        .into_iter()
        .filter(|r| matches!(r.status, 401 | 403))
        .map(|r| format!("{} ({})", r.action, r.status))
        .collect()
}

/// Polls `check` every 100 ms until it is `Some`, for at most 60 s; fails with what `diagnosis` says.
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    diagnosis: &dyn Fn() -> String,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}:\n{}", diagnosis());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The error code of a refused request: the SDK's, or the `<Code>` of the body (moto answers ELB's
/// authentication refusals in EC2's error format, which the ELB client does not read).
fn refusal<E: aws_sdk_ec2::error::ProvideErrorMetadata>(
    error: &aws_sdk_ec2::error::SdkError<E, aws_sdk_ec2::config::http::HttpResponse>,
) -> Option<String> {
    if let Some(code) = error.code() {
        return Some(code.to_owned());
    }
    let body = std::str::from_utf8(error.raw_response()?.body().bytes()?).ok()?;
    harness::aws::xml_values(body, "Code").into_iter().next()
}

fn ingress(service: &Service) -> Option<String> {
    service
        .status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .hostname
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_iam_policy_is_enough_when_moto_enforces_it() {
    let Some(moto) = harness::Moto::for_test() else {
        return;
    };
    // Set-up, before moto checks anything: the cluster's account (a tagged subnet and route table), one
    // instance, the manager's user with the shipped policy, an administrator for this test's own reads,
    // and a user with the shipped policy less one action.
    let cloud = harness::AwsCloud::start(moto).await.unwrap();
    let url = cloud.moto_url().to_owned();
    let node_name = harness::aws::run_instances(&url, 1).await.unwrap().remove(0);
    let manager_keys = user(&url, "cloud-controller-manager", POLICY).await;
    let admin = user(
        &url,
        "administrator",
        r#"{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}"#,
    )
    .await;
    let less_one = POLICY.replace("\"elasticloadbalancing:CreateLoadBalancer\",", "");
    assert_ne!(less_one, POLICY);
    let short_keys = user(&url, "short-of-one-action", &less_one).await;
    enforce(&url).await;

    // Moto enforces: an unknown key, a wrong secret and a missing action are refused; the administrator
    // is not.
    let stranger = Keys {
        id: "AKIAIOSFODNN7EXAMPLE".into(),
        secret: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
    };
    // (moto answers EC2's refusals as AuthFailure, as EC2 does; ELB's name the cause.)
    for keys in [&stranger, &manager_keys] {
        let wrong = Keys {
            secret: "not-the-secret".into(),
            ..keys.clone()
        };
        let refused = ec2(&url, &wrong).describe_instances().send().await.unwrap_err();
        assert_eq!(refusal(&refused).as_deref(), Some("AuthFailure"), "{refused:?}");
    }
    let refused = elb(&url, &stranger)
        .describe_load_balancers()
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        refusal(&refused).as_deref(),
        Some("InvalidClientTokenId"),
        "{refused:?}"
    );
    let forged = Keys {
        secret: "not-the-secret".into(),
        ..manager_keys.clone()
    };
    let refused = elb(&url, &forged)
        .describe_load_balancers()
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        refusal(&refused).as_deref(),
        Some("SignatureDoesNotMatch"),
        "{refused:?}"
    );
    let refused = elb(&url, &short_keys)
        .create_load_balancer()
        .load_balancer_name("not-allowed")
        .availability_zones("us-east-1a")
        .listeners(
            aws_sdk_elasticloadbalancing::types::Listener::builder()
                .protocol("TCP")
                .load_balancer_port(80)
                .instance_port(30080)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap_err();
    assert_eq!(refusal(&refused).as_deref(), Some("AccessDenied"), "{refused:?}");
    let admin_ec2 = ec2(&url, &admin);
    admin_ec2.describe_instances().send().await.unwrap();

    // The manager, as the user with the shipped policy, its requests recorded on the way.
    let proxy = harness::aws::RecordingProxy::start(&url).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = TestApiServer::start().await.unwrap();
    let log = dir.path().join("manager.log");
    let _manager = Manager(
        harness::aws_cost::manager_command(
            std::path::Path::new(env!("CARGO_BIN_EXE_cloud-controller-manager")),
            server.kubeconfig_path(),
            dir.path(),
            &proxy.url,
            None,
        )
        .unwrap()
        .args([
            "--configure-cloud-routes=true",
            "--cluster-cidr=10.244.0.0/16",
            "--route-reconciliation-period=1s",
            "--node-monitor-period=1s",
        ])
        .env("AWS_ACCESS_KEY_ID", &manager_keys.id)
        .env("AWS_SECRET_ACCESS_KEY", &manager_keys.secret)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap(),
    );

    let diagnosis = || {
        format!(
            "refused: {:?}\n{}",
            refused_requests(&proxy),
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    };
    let log = &diagnosis;
    let nodes: Api<Node> = Api::all(server.client());
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": node_name},
        "spec": {
            "podCIDR": "10.244.7.0/24",
            "podCIDRs": ["10.244.7.0/24"],
            "taints": [{"key": kube_ccm_provider::names::TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}],
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let provider_id = eventually("the node was not initialised", log, || async {
        nodes.get(&node_name).await.ok()?.spec?.provider_id
    })
    .await;
    let instance_id = provider_id.rsplit('/').next().unwrap().to_owned();

    // Its pod range routed to its instance.
    eventually("no route to the node's pod range", log, || async {
        let tables = admin_ec2.describe_route_tables().send().await.ok()?;
        tables
            .route_tables()
            .iter()
            .flat_map(|t| t.routes())
            .find(|r| {
                r.destination_cidr_block() == Some("10.244.7.0/24")
                    && r.instance_id() == Some(instance_id.as_str())
            })
            .map(drop)
    })
    .await;

    // A classic ELB and an NLB, then both deleted.
    let services: Api<Service> = Api::namespaced(server.client(), "default");
    for (name, annotations, node_port) in [
        ("classic", serde_json::json!({}), 30080),
        (
            "network",
            serde_json::json!({"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}),
            30081,
        ),
    ] {
        let service: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"type": "LoadBalancer", "selector": {"app": name}, "ports": [{"port": 80, "targetPort": 8080, "nodePort": node_port}]},
        }))
        .unwrap();
        services.create(&PostParams::default(), &service).await.unwrap();
    }
    for name in ["classic", "network"] {
        eventually(
            &format!("the {name} service got no load balancer"),
            log,
            || async { ingress(&services.get(name).await.ok()?) },
        )
        .await;
    }
    let admin_elb = elb(&url, &admin);
    let classic_count = || async {
        admin_elb
            .describe_load_balancers()
            .send()
            .await
            .unwrap()
            .load_balancer_descriptions()
            .len()
    };
    assert_eq!(classic_count().await, 1);
    for name in ["classic", "network"] {
        services.delete(name, &Default::default()).await.unwrap();
    }
    eventually("the services' load balancers outlived them", log, || async {
        let gone = !services
            .list(&Default::default())
            .await
            .ok()?
            .items
            .iter()
            .any(harness::is_load_balancer)
            && classic_count().await == 0;
        gone.then_some(())
    })
    .await;

    // The node of a terminated instance (whose kubelet stopped reporting) is deleted.
    let unknown = serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}});
    nodes
        .patch_status(
            &node_name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(unknown),
        )
        .await
        .unwrap();
    admin_ec2
        .terminate_instances()
        .instance_ids(&instance_id)
        .send()
        .await
        .unwrap();
    eventually(
        "the node of a terminated instance was not deleted",
        log,
        || async { nodes.get_opt(&node_name).await.ok()?.is_none().then_some(()) },
    )
    .await;

    // And not one request was refused on the way.
    assert_eq!(refused_requests(&proxy), Vec::<String>::new());
    assert!(proxy.requests().len() > 10);
    let text = std::fs::read_to_string(dir.path().join("manager.log")).unwrap();
    for refusal in [
        "AccessDenied",
        "UnauthorizedOperation",
        "not authorized",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "AuthFailure",
    ] {
        assert!(!text.contains(refusal), "{refusal} in the manager's log:\n{text}");
    }
}
