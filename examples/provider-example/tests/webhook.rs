//! The example's admission webhook on the real kube-apiserver: a `ValidatingWebhookConfiguration` points
//! the API server at the manager's webhook port, and a Service with a size the cloud does not sell is
//! refused at creation with the webhook's message, while a good one is stored; a zone is checked against
//! the manager's node cache; the webhook metrics count the requests.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use control_plane::{ApiServer, Backend, KubeBinaries};
use kube_ccm::k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube_ccm::k8s_openapi::api::core::v1::{Node, Service};
use kube_ccm::kube::Api;
use kube_ccm::kube::api::PostParams;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// The manager process; killed on drop.
struct Manager(Child);

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port nothing listens on now (from a block of this process's own, below the ephemeral range).
fn free_port(offset: u16) -> u16 {
    let base = 20_000 + u16::try_from(std::process::id() % 2_000).unwrap_or(0) * 10;
    (0..10)
        .map(|i| base + (offset + i) % 10)
        .find(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
        .expect("a free port in this process's block")
}

fn log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("manager.log")).unwrap_or_default()
}

/// `GET https://127.0.0.1:<port><path>` with curl (the serving certificate is self-signed).
fn curl(port: u16, path: &str) -> Option<String> {
    let output = Command::new("curl")
        .args(["--silent", "--insecure", "--fail", "--max-time", "5"])
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

fn service(name: &str, annotations: serde_json::Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_asks_the_example_webhook_before_storing_a_service() {
    if KubeBinaries::for_test("the example webhook").is_none() {
        return;
    }
    let server = ApiServer::for_test(Backend::Kube).await;
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::write(dir.join("state.json"), "{}").unwrap();
    let config = dir.join("cloud-config.json");
    std::fs::write(&config, json!({ "state": dir.join("state.json") }).to_string()).unwrap();
    let (webhook_port, metrics_port) = (free_port(0), free_port(5));
    let certs = dir.join("webhook-certs");
    let mut manager = Manager(
        Command::new(env!("CARGO_BIN_EXE_example-cloud-controller-manager"))
            .arg("--cloud-provider=example")
            .arg(format!("--cloud-config={}", config.display()))
            .arg(format!("--kubeconfig={}", server.kubeconfig_path().display()))
            .args([
                "--leader-elect=false",
                // The cloud is empty: the lifecycle controller would delete the test's node.
                "--controllers=*,-cloud-node-lifecycle-controller",
                "--feature-gates=CloudControllerManagerWebhook=true",
                "--webhooks=*",
                "--webhook-bind-address=127.0.0.1",
                "--bind-address=127.0.0.1",
                "--authorization-always-allow-paths=/metrics",
                "--authentication-skip-lookup",
            ])
            .arg(format!("--webhook-secure-port={webhook_port}"))
            .arg(format!("--webhook-cert-dir={}", certs.display()))
            .arg(format!("--secure-port={metrics_port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("manager.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    let certificate = certs.join("cloud-controller-manager-webhook.crt");
    while !(certificate.exists() && std::net::TcpStream::connect(("127.0.0.1", webhook_port)).is_ok()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the webhook port never opened:\n{}",
            log(dir)
        );
        if let Some(status) = manager.0.try_wait().unwrap() {
            panic!("the manager exited ({status}):\n{}", log(dir));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ca = std::fs::read(&certificate).unwrap();
    let configuration: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": "example-cloud"},
        "webhooks": [{
            "name": "service-annotations.example.com",
            "clientConfig": {
                "url": format!("https://127.0.0.1:{webhook_port}/validate-service"),
                "caBundle": kube_ccm::k8s_openapi::ByteString(ca),
            },
            "rules": [{
                "apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"], "resources": ["services"],
            }],
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
        }],
    }))
    .unwrap();
    let client = server.client();
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &configuration)
        .await
        .unwrap();

    // The API server takes the configuration up within a moment: until then a Service is stored unasked.
    let services: Api<Service> = Api::namespaced(client, "default");
    let refusal = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never refused:\n{}",
            log(dir)
        );
        match services
            .create(
                &PostParams::default(),
                &service("huge", json!({"example.com/load-balancer-size": "huge"})),
            )
            .await
        {
            Err(error) => break error.to_string(),
            Ok(_) => {
                services.delete("huge", &Default::default()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert!(
        refusal.contains(
            "admission webhook \"service-annotations.example.com\" denied the request: example.com/load-balancer-size: \"huge\" is not a size the example cloud sells (small, medium, large)"
        ),
        "{refusal}"
    );
    services
        .create(
            &PostParams::default(),
            &service("web", json!({"example.com/load-balancer-size": "small"})),
        )
        .await
        .expect("a size the cloud sells is stored");

    // The zone is checked against the manager's node cache.
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "zone-a"}},
    }))
    .unwrap();
    Api::<Node>::all(server.client())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let zone = |zone: &str| json!({"example.com/load-balancer-zone": zone});
    let refusal = services
        .create(&PostParams::default(), &service("elsewhere", zone("zone-b")))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refusal.contains("example.com/load-balancer-zone: no node of the cluster is in zone \"zone-b\""),
        "{refusal}"
    );
    let stored = loop {
        // The node reaches the cache within a moment of its creation.
        assert!(
            tokio::time::Instant::now() < deadline,
            "zone-a never accepted:\n{}",
            log(dir)
        );
        match services
            .create(&PostParams::default(), &service("zoned", zone("zone-a")))
            .await
        {
            Ok(stored) => break stored,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    assert_eq!(stored.metadata.name.as_deref(), Some("zoned"));

    let metrics = curl(metrics_port, "/metrics").unwrap_or_else(|| panic!("/metrics served:\n{}", log(dir)));
    let allowed = metrics
        .lines()
        .find(|l| {
            l.starts_with(
                "cloud_provider_webhook_request_total{code=\"200\",webhook=\"service-annotations\"}",
            )
        })
        .unwrap_or_else(|| panic!("the webhook's requests are counted:\n{metrics}"));
    let count: f64 = allowed.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(count >= 2.0, "{allowed}");
}
