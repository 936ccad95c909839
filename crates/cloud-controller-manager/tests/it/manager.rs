//! The manager command as an operator runs it: settings errors, HTTPS serving of health and metrics,
//! trace export.

use parking_lot::Mutex;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use control_plane::{ApiServer, Backend, Credentials, UserInfo};
use http_body_util::{BodyExt, Full};
use k8s_openapi::api::core::v1::Node;
use kube_ccm_test_apiserver::TestApiServer;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};

use crate::support::{binary, curl, free_port, stderr};

pub(crate) const WAIT: Duration = Duration::from_secs(30);

/// A manager process with the fake provider; killed on drop.
pub(crate) struct Manager {
    child: Child,
    log: std::path::PathBuf,
}

impl Manager {
    /// Started with the administrator's `kubeconfig` of an API server.
    pub(crate) fn start(dir: &Path, kubeconfig: &Path, flags: &[&str], env: &[(&str, String)]) -> Manager {
        Manager::spawn(binary(), dir, kubeconfig, flags, env)
    }

    fn spawn(
        mut command: std::process::Command,
        dir: &Path,
        kubeconfig: &Path,
        flags: &[&str],
        env: &[(&str, String)],
    ) -> Manager {
        let cloud_config = dir.join("cloud.yaml");
        std::fs::write(
            &cloud_config,
            "instances:\n  - name: n1\n    addresses: [{type: InternalIP, address: 10.0.0.1}]\n",
        )
        .unwrap();
        let log = dir.join("manager.log");
        let child = command
            .arg("--cloud-provider=fake")
            .arg(format!("--cloud-config={}", cloud_config.display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--leader-elect=false")
            .args(flags)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Manager { child, log }
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        assert!(
            std::process::Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "no exit after SIGTERM:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Registers node `n1` (its instance is in the cloud-config) with the uninitialized taint.
pub(crate) async fn add_uninitialized_node(server: &TestApiServer) {
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "n1"},
        "spec": {"taints": [{"key": kube_ccm_provider::names::TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .unwrap();
    kube::Api::<Node>::all(server.client())
        .create(&Default::default(), &node)
        .await
        .unwrap();
}

#[test]
fn invalid_settings_exit_2_with_one_line_naming_each_flag() {
    let output = binary()
        .args([
            "--cloud-provider=fake",
            "--leader-elect-lease-duration=15s",
            "--leader-elect-renew-deadline=20s",
            "--logging-format=xml",
            "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_RSA_WITH_RC4_128_SHA",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let text = stderr(&output);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("error: --tls-cipher-suites: TLS_RSA_WITH_RC4_128_SHA is not available")),
        "{text}"
    );
    assert!(
        lines.iter().any(|l| l.contains("--leader-elect-renew-deadline")),
        "{text}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("error: --logging-format: ")),
        "{text}"
    );

    let unknown = binary()
        .args(["--cloud-provider=fake", "--no-such-flag"])
        .output()
        .unwrap();
    assert_eq!(unknown.status.code(), Some(2));
    assert!(
        stderr(&unknown).contains("--no-such-flag"),
        "{}",
        stderr(&unknown)
    );
}

#[test]
fn absurd_durations_and_numbers_are_refused_not_overflowed() {
    for (flag, named) in [
        // Beyond Go's int64 nanoseconds: a parse error, not a panic.
        (
            "--leader-elect-renew-deadline=9300000000000000000s",
            "--leader-elect-renew-deadline",
        ),
        // Within it, but beyond the API's int32 seconds.
        (
            "--leader-elect-lease-duration=2000000h",
            "--leader-elect-lease-duration",
        ),
        ("--node-monitor-period=2000000h", "--node-monitor-period"),
        ("--cloud-call-timeout=0s", "--cloud-call-timeout"),
        ("--kube-api-request-timeout=25h", "--kube-api-request-timeout"),
        (
            "--route-reconciliation-period=-5s",
            "--route-reconciliation-period",
        ),
        ("--kube-api-qps=NaN", "--kube-api-qps"),
        ("--cloud-api-qps=NaN", "--cloud-api-qps"),
        (
            "--node-deletion-breaker-ratio=1.5",
            "--node-deletion-breaker-ratio",
        ),
        (
            "--node-deletion-confirm-after=25h",
            "--node-deletion-confirm-after",
        ),
        ("--load-balancer-orphan-grace=1s", "--load-balancer-orphan-grace"),
        (
            "--load-balancer-orphan-sweep-period=48h",
            "--load-balancer-orphan-sweep-period",
        ),
        ("--concurrent-service-syncs=0", "--concurrent-service-syncs"),
        ("--concurrent-node-syncs=70000", "--concurrent-node-syncs"),
    ] {
        let output = binary().args(["--cloud-provider=fake", flag]).output().unwrap();
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{flag}: {text}");
        assert!(text.contains(named), "{flag}: {text}");
        assert!(!text.contains("panicked"), "{flag}: {text}");
    }
}

#[test]
fn an_unknown_provider_is_named_and_nothing_starts() {
    let output = binary()
        .args([
            "--cloud-provider=nope",
            "--leader-elect=false",
            "--kubeconfig=/nonexistent",
        ])
        .output()
        .unwrap();
    // A command-line error, refused before anything starts.
    assert_eq!(output.status.code(), Some(2));
    let text = stderr(&output);
    assert!(text.contains("nope"), "{text}");
    assert!(!text.contains("starting"), "{text}");
    assert!(text.contains("fake"), "the known providers are listed: {text}");
}

/// A client that trusts exactly `cert` (PEM).
fn tls_client(cert_pem: &str) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(cert_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// GET over HTTPS: (status, body).
async fn get(connector: &tokio_rustls::TlsConnector, address: SocketAddr, path: &str) -> (u16, String) {
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = connector.connect(name, tcp).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = http::Request::get(path)
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A serving certificate for `localhost` and its key, written to `dir` as `tls.crt` and `tls.key`.
fn serving_pair(dir: &Path) -> (rcgen::Certificate, std::path::PathBuf, std::path::PathBuf) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (cert_file, key_file) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    (cert, cert_file, key_file)
}

/// A certificate authority named `name`: its certificate in PEM, and what signs with it.
fn authority(name: &str) -> (String, rcgen::Issuer<'static, rcgen::KeyPair>) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    let key = rcgen::KeyPair::generate().unwrap();
    let certificate = params.self_signed(&key).unwrap();
    (certificate.pem(), rcgen::Issuer::new(params, key))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_health_readiness_and_metrics_over_https_with_the_given_certificate() {
    let server = TestApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, cert_file, key_file) = serving_pair(dir.path());
    let port = free_port();
    let mut manager = Manager::start(
        dir.path(),
        server.kubeconfig_path(),
        &[
            "--bind-address=127.0.0.1",
            &format!("--secure-port={port}"),
            &format!("--tls-cert-file={}", cert_file.display()),
            &format!("--tls-private-key-file={}", key_file.display()),
        ],
        &[],
    );
    add_uninitialized_node(&server).await;
    let connector = tls_client(&cert.pem());
    let address: SocketAddr = ([127, 0, 0, 1], port).into();

    // Ready once the controllers run; the node gets initialised meanwhile.
    let deadline = Instant::now() + WAIT;
    loop {
        let ready = match tokio::net::TcpStream::connect(address).await {
            Ok(_) => get(&connector, address, "/readyz").await.0 == 200,
            Err(_) => false,
        };
        let initialised =
            harness::initialized(&kube::Api::<Node>::all(server.client()).get("n1").await.unwrap());
        if ready && initialised {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not ready and initialised:\n{}",
            manager.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(get(&connector, address, "/healthz").await, (200, "ok".to_owned()));
    assert_eq!(get(&connector, address, "/livez").await.0, 200);
    let (status, verbose) = get(&connector, address, "/readyz?verbose").await;
    assert_eq!(status, 200);
    assert!(
        verbose.contains("[+]") && verbose.contains("readyz check passed"),
        "{verbose}"
    );
    assert_eq!(get(&connector, address, "/no-such-path").await.0, 404);

    let (status, metrics) = get(&connector, address, "/metrics").await;
    assert_eq!(status, 200);
    for expected in [
        "running_managed_controllers{",
        "controller_reconciles_total{",
        "cloudprovider_fake_api_request_duration_seconds_count{request=\"instance_metadata_batch\"}",
        "workqueue_adds_total{name=\"cloud-node-controller\"}",
        "workqueue_depth{name=\"cloud-node-controller\"}",
        "workqueue_work_duration_seconds_count{name=\"cloud-node-controller\"}",
        "node_controller_cloud_provider_taint_removal_delay_seconds_bucket",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        // Every API request of the manager's clients, as client-go counts them.
        "rest_client_requests_total{code=\"200\",host=\"127.0.0.1:",
        "rest_client_request_duration_seconds_count{verb=\"GET\",host=\"127.0.0.1:",
        "rest_client_rate_limiter_duration_seconds_count{verb=\"GET\",host=\"127.0.0.1:",
    ] {
        assert!(metrics.contains(expected), "{expected} missing from:\n{metrics}");
    }
    assert!(
        metrics.contains(r#"running_managed_controllers{name="cloud-node-controller",manager="cloud-controller-manager"} 1"#)
            || metrics.contains(r#"running_managed_controllers{manager="cloud-controller-manager",name="cloud-node-controller"} 1"#),
        "{metrics}"
    );
    assert!(manager.terminate().success(), "{}", manager.log());
}

/// Descriptors the process has open (Linux).
fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|entries| entries.count())
        .unwrap_or(0)
}

/// CPU time the process has used (Linux: utime + stime, in clock ticks).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which is in parentheses and may hold spaces).
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of stat; here, after the name, 11 and 12 (0-based).
    field(11) + field(12)
}

async fn renew_time(server: &TestApiServer) -> Option<String> {
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(server.client(), "kube-system");
    let lease = leases.get_opt("cloud-controller-manager").await.ok()??;
    lease
        .spec
        .and_then(|s| s.renew_time)
        .map(|t| format!("{:?}", t.0))
}

/// Issue 16: idle connections held open by whoever reaches the port (the default binds 0.0.0.0) must
/// neither exhaust the descriptors the API client needs to renew the Lease, nor lock out probes, nor
/// make the accept loop spin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::print_stderr)]
async fn thousands_of_idle_connections_starve_neither_the_lease_nor_the_probes() {
    if std::process::Command::new("prlimit")
        .arg("--version")
        .output()
        .is_err()
    {
        harness::skip_unless_ci(
            "thousands_of_idle_connections_starve_neither_the_lease_nor_the_probes",
            "prlimit (util-linux) is not installed; it sets the manager's descriptor limit",
        );
        return;
    }
    let server = TestApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, cert_file, key_file) = serving_pair(dir.path());
    let port = free_port();
    // 1024 descriptors: the connection cap is a quarter of them.
    const OPEN_FILES: usize = 1024;
    let mut command = std::process::Command::new("prlimit");
    command
        .arg(format!("--nofile={OPEN_FILES}:{OPEN_FILES}"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_cloud-controller-manager"));
    let manager = Manager::spawn(
        command,
        dir.path(),
        server.kubeconfig_path(),
        &[
            "--leader-elect=true",
            "--leader-elect-lease-duration=4s",
            "--leader-elect-renew-deadline=3s",
            "--leader-elect-retry-period=500ms",
            "--bind-address=127.0.0.1",
            &format!("--secure-port={port}"),
            &format!("--tls-cert-file={}", cert_file.display()),
            &format!("--tls-private-key-file={}", key_file.display()),
        ],
        &[],
    );
    let pid = manager.child.id();
    let connector = tls_client(&cert.pem());
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    let deadline = Instant::now() + WAIT;
    while !(tokio::net::TcpStream::connect(address).await.is_ok()
        && get(&connector, address, "/readyz").await.0 == 200
        && renew_time(&server).await.is_some())
    {
        assert!(
            Instant::now() < deadline,
            "never ready and leading:\n{}",
            manager.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Three times the manager's descriptors, held open without a byte sent (the test's own limit allowing).
    let own_limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    let flood = (3 * OPEN_FILES).min(usize::try_from(own_limit.saturating_sub(256)).unwrap_or(usize::MAX));
    assert!(
        flood > OPEN_FILES,
        "this test needs more than {OPEN_FILES} descriptors of its own; it has {own_limit}"
    );
    let mut held = Vec::with_capacity(flood);
    for _ in 0..flood {
        match tokio::net::TcpStream::connect(address).await {
            Ok(stream) => held.push(stream),
            Err(error) => panic!("connect {} failed: {error}\n{}", held.len(), manager.log()),
        }
    }
    let ticks_before = cpu_ticks(pid);
    let observed_from = Instant::now();

    // The Lease goes on being renewed, and a probe on a fresh connection is answered.
    let mut renewals = std::collections::BTreeSet::new();
    let deadline = Instant::now() + WAIT;
    while renewals.len() < 4 {
        if let Some(renewed) = renew_time(&server).await {
            renewals.insert(renewed);
        }
        assert!(
            Instant::now() < deadline,
            "the Lease was not renewed under the flood:\n{}",
            manager.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(get(&connector, address, "/readyz").await, (200, "ok".to_owned()));
    let descriptors = open_descriptors(pid);
    assert!(
        descriptors <= OPEN_FILES / 4 + 128,
        "{descriptors} descriptors open with {flood} connections held; the cap is {}",
        OPEN_FILES / 4
    );
    // No busy loop: well under one core while nothing but idle connections arrive.
    let ticks_per_second = 100.0;
    let cpu = (cpu_ticks(pid) - ticks_before) as f64 / ticks_per_second;
    let wall = observed_from.elapsed().as_secs_f64();
    assert!(
        cpu < 0.5 * wall,
        "{cpu:.2} s of CPU in {wall:.2} s with idle connections held"
    );
    assert!(manager.log().contains("max_connections=256"), "{}", manager.log());
    drop(held);
}

/// A certificate and its key written to `dir` as `<file>.crt` and `<file>.key`: curl's arguments.
fn write_certificate(dir: &Path, file: &str, cert_pem: &str, key_pem: &str) -> Vec<String> {
    let (cert_file, key_file) = (dir.join(format!("{file}.crt")), dir.join(format!("{file}.key")));
    std::fs::write(&cert_file, cert_pem).unwrap();
    std::fs::write(&key_file, key_pem).unwrap();
    vec![
        "--cert".to_owned(),
        cert_file.display().to_string(),
        "--key".to_owned(),
        key_file.display().to_string(),
    ]
}

/// A certificate signed by `ca` for a client named `name` in `groups`, written to `dir` as
/// `<file>.crt` and `<file>.key`.
fn client_certificate(
    dir: &Path,
    file: &str,
    ca: &rcgen::Issuer<'_, rcgen::KeyPair>,
    name: &str,
    groups: &[&str],
) -> Vec<String> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    for group in groups {
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, *group);
    }
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let key = rcgen::KeyPair::generate().unwrap();
    let certificate = params.signed_by(&key, ca).unwrap();
    write_certificate(dir, file, &certificate.pem(), &key.serialize_pem())
}

/// Issue 16: the API server decides who may read what, as for upstream's managers: tokens by
/// TokenReview (cached), client certificates by `--client-ca-file`, paths by SubjectAccessReview;
/// health is open to all. curl is the client.
async fn the_api_server_decides_who_reads_metrics_by_token_or_client_certificate(backend: Backend) {
    let plane = crate::migration::Plane::start_secure(backend).await;
    let server = &plane.server;
    let dir = tempfile::tempdir().unwrap();
    let (_, cert_file, key_file) = serving_pair(dir.path());
    let (client_ca_pem, client_ca) = authority("client-ca");
    std::fs::write(dir.path().join("client-ca.crt"), client_ca_pem).unwrap();
    let (_, stranger_ca) = authority("stranger-ca");
    let (proxy_ca_pem, proxy_ca) = authority("front-proxy-ca");
    std::fs::write(dir.path().join("front-proxy-ca.crt"), proxy_ca_pem).unwrap();

    // A metrics reader, as the shipped monitoring role would grant it.
    grant(
        server,
        "metrics-reader",
        serde_json::json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]),
        serde_json::json!([
            {"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"},
            {"kind": "User", "name": "scraper"},
        ]),
    )
    .await;
    let token = |credentials: Credentials| credentials.token().expect("a token").to_owned();
    let prometheus = token(
        server
            .mint(&UserInfo::service_account("monitoring", "prometheus"))
            .await,
    );
    let stranger = token(
        server
            .mint(&UserInfo::service_account("default", "stranger"))
            .await,
    );

    let port = free_port();
    let manager = Manager::start(
        dir.path(),
        server.kubeconfig_path(),
        &[
            "--bind-address=127.0.0.1",
            &format!("--secure-port={port}"),
            &format!("--tls-cert-file={}", cert_file.display()),
            &format!("--tls-private-key-file={}", key_file.display()),
            &format!("--client-ca-file={}", dir.path().join("client-ca.crt").display()),
            &format!(
                "--requestheader-client-ca-file={}",
                dir.path().join("front-proxy-ca.crt").display()
            ),
            "--requestheader-allowed-names=front-proxy-client",
        ],
        &[],
    );
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    let get = |path: &str, extra: &[String]| {
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        curl(address, Some(&cert_file), path, &extra)
    };
    let deadline = Instant::now() + WAIT;
    // Ready, not only alive: readiness follows the informers' first lists, which a loaded API server
    // answers later.
    while get("/readyz", &[]).is_none_or(|(code, _)| code != 200) {
        assert!(Instant::now() < deadline, "never ready:\n{}", manager.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let bearer = |token: &str| vec!["--header".to_owned(), format!("Authorization: Bearer {token}")];
    // Health is open to all, anonymous or not (the stranger below may not read metrics); metrics are not.
    for path in ["/healthz", "/livez"] {
        assert_eq!(get(path, &[]).map(|r| r.0), Some(200), "{path}");
    }
    assert_eq!(get("/readyz", &bearer(&stranger)).map(|r| r.0), Some(200));
    let (code, body) = get("/metrics", &[]).unwrap();
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains(r#"forbidden: User \"system:anonymous\" cannot get path \"/metrics\""#),
        "{body}"
    );
    // A token the API server does not know: 401, everywhere.
    assert_eq!(get("/metrics", &bearer("made-up")).map(|r| r.0), Some(401));
    assert_eq!(get("/healthz", &bearer("made-up")).map(|r| r.0), Some(401));
    // A bound service account reads metrics; another does not.
    for _ in 0..3 {
        let (code, body) = get("/metrics", &bearer(&prometheus)).unwrap();
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("running_managed_controllers"), "{body}");
    }
    let (code, body) = get("/metrics", &bearer(&stranger)).unwrap();
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("system:serviceaccount:default:stranger"), "{body}");
    // Answers are cached: three scrapes with one token made one TokenReview and one SubjectAccessReview.
    let reviews = |resource: &str| {
        server
            .requests()
            .iter()
            .filter(|r| r.resource.as_deref() == Some(resource))
            .count()
    };
    assert_eq!(
        reviews("tokenreviews.authentication.k8s.io"),
        3,
        "made-up once (its refusal is cached too), prometheus once, stranger once"
    );
    assert_eq!(
        reviews("subjectaccessreviews.authorization.k8s.io"),
        3,
        "anonymous, prometheus, stranger"
    );

    // Client certificates: the name and organizations the CA signed.
    let masters = client_certificate(dir.path(), "masters", &client_ca, "ops", &["system:masters"]);
    assert_eq!(get("/metrics", &masters).map(|r| r.0), Some(200));
    let scraper = client_certificate(dir.path(), "scraper", &client_ca, "scraper", &[]);
    assert_eq!(get("/metrics", &scraper).map(|r| r.0), Some(200));
    let viewer = client_certificate(dir.path(), "viewer", &client_ca, "viewer", &[]);
    let (code, body) = get("/metrics", &viewer).unwrap();
    assert_eq!(code, 403, "{body}");
    assert!(body.contains(r#"User \"viewer\""#), "{body}");
    // A certificate from another CA does not get past the handshake: the server's alert says so (curl:
    // 35, an SSL connect error, or 56, a failure receiving), not a timeout or a refused connection.
    let forged = client_certificate(dir.path(), "forged", &stranger_ca, "ops", &["system:masters"]);
    let forged_args: Vec<&str> = forged.iter().map(String::as_str).collect();
    let (code, why) = crate::support::curl_answer(address, Some(&cert_file), "/metrics", &forged_args)
        .expect_err("a certificate from another CA is refused");
    assert!(matches!(code, Some(35 | 56)), "{code:?}: {why}");
    assert!(why.to_ascii_lowercase().contains("unknown ca"), "{why}");
    assert_eq!(
        get("/metrics", &masters).map(|r| r.0),
        Some(200),
        "the server still serves"
    );

    // A front proxy (its CA, an allowed name) names the caller in headers, tried before anything else.
    let proxy = client_certificate(dir.path(), "proxy", &proxy_ca, "front-proxy-client", &[]);
    let through_proxy = |headers: &[&str]| {
        let mut extra = proxy.clone();
        for header in headers {
            extra.extend(["--header".to_owned(), (*header).to_owned()]);
        }
        get("/metrics", &extra).map(|r| r.0)
    };
    assert_eq!(through_proxy(&["X-Remote-User: scraper"]), Some(200));
    assert_eq!(
        through_proxy(&["X-Remote-User: someone", "X-Remote-Group: system:masters"]),
        Some(200)
    );
    let (code, body) = {
        let mut extra = proxy.clone();
        extra.extend(["--header".to_owned(), "X-Remote-User: viewer".to_owned()]);
        get("/metrics", &extra).unwrap()
    };
    assert_eq!(code, 403, "{body}");
    assert!(body.contains(r#"User \"viewer\""#), "{body}");
    // Without a user header the proxy is nobody: its own certificate names no user.
    assert_eq!(through_proxy(&[]), Some(403));
    // A proxy certificate with a name not allowed, and a user's certificate: headers are not trusted.
    let other_proxy = client_certificate(dir.path(), "other-proxy", &proxy_ca, "someone-else", &[]);
    let mut extra = other_proxy;
    extra.extend(["--header".to_owned(), "X-Remote-User: scraper".to_owned()]);
    assert_eq!(get("/metrics", &extra).map(|r| r.0), Some(403));
    let mut extra = viewer.clone();
    extra.extend(["--header".to_owned(), "X-Remote-User: scraper".to_owned()]);
    let (code, body) = get("/metrics", &extra).unwrap();
    assert_eq!(code, 403, "{body}");
    assert!(body.contains(r#"User \"viewer\""#), "{body}");
    drop(manager);
}

/// Issue 16: without `--client-ca-file`, the client CA comes from the ConfigMap kube-apiserver publishes
/// (`kube-system/extension-apiserver-authentication`), unless `--authentication-skip-lookup`; a lookup
/// that is refused stops the start with the ConfigMap named, unless tolerated.
async fn the_client_ca_is_looked_up_in_the_cluster_as_upstream(backend: Backend) {
    let plane = crate::migration::Plane::start_secure(backend).await;
    let server = &plane.server;
    let dir = tempfile::tempdir().unwrap();
    let (masters, mut proxied) = match server {
        // kube-apiserver publishes its own: its cluster CA signs the client certificates, its front-proxy
        // CA the proxy's.
        ApiServer::Kube(kube) => {
            let ops = UserInfo {
                name: "ops".into(),
                groups: vec!["system:masters".into()],
            };
            let Credentials::Certificate(masters) = server.mint(&ops).await else {
                panic!("a certificate");
            };
            let proxy = kube.front_proxy_client();
            (
                write_certificate(dir.path(), "masters", &masters.cert_pem, &masters.key_pem),
                write_certificate(dir.path(), "proxy", &proxy.cert_pem, &proxy.key_pem),
            )
        }
        // As kube-apiserver publishes it: PEM, and lists as JSON.
        ApiServer::Test(_) => {
            let client_ca = authority("client-ca");
            let proxy_ca = authority("front-proxy-ca");
            let published: k8s_openapi::api::core::v1::ConfigMap =
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
                    "data": {
                        "client-ca-file": client_ca.0,
                        "requestheader-client-ca-file": proxy_ca.0,
                        "requestheader-allowed-names": "[\"front-proxy-client\"]",
                        "requestheader-username-headers": "[\"X-Remote-User\"]",
                        "requestheader-group-headers": "[\"X-Remote-Group\"]",
                    },
                }))
                .unwrap();
            kube::Api::namespaced(server.client(), "kube-system")
                .create(&Default::default(), &published)
                .await
                .unwrap();
            (
                client_certificate(dir.path(), "masters", &client_ca.1, "ops", &["system:masters"]),
                client_certificate(dir.path(), "proxy", &proxy_ca.1, "front-proxy-client", &[]),
            )
        }
    };
    proxied.extend([
        "--header".to_owned(),
        "X-Remote-User: ops".to_owned(),
        "--header".to_owned(),
        "X-Remote-Group: system:masters".to_owned(),
    ]);
    let start = |flags: &[&str], kubeconfig: Option<&Path>| {
        let port = free_port();
        let mut all = vec![
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
        ];
        if let Some(kubeconfig) = kubeconfig {
            all.push(format!("--kubeconfig={}", kubeconfig.display()));
        }
        all.extend(flags.iter().map(|f| (*f).to_owned()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let manager = Manager::start(dir.path(), server.kubeconfig_path(), &all, &[]);
        (manager, SocketAddr::from(([127, 0, 0, 1], port)))
    };
    // Served with a self-signed certificate made in memory: curl trusts any.
    let get = |address: SocketAddr, path: &str, extra: &[String]| {
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        curl(address, None, path, &extra)
    };
    let wait_served = |manager: &Manager, address: SocketAddr| {
        let deadline = Instant::now() + WAIT;
        while get(address, "/healthz", &[]).is_none_or(|(code, _)| code != 200) {
            assert!(Instant::now() < deadline, "never served:\n{}", manager.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    };

    let (looked_up, address) = start(&[], None);
    wait_served(&looked_up, address);
    assert_eq!(get(address, "/metrics", &masters).map(|r| r.0), Some(200));
    assert_eq!(get(address, "/metrics", &proxied).map(|r| r.0), Some(200));
    drop(looked_up);

    let (skipped, address) = start(&["--authentication-skip-lookup"], None);
    wait_served(&skipped, address);
    assert_eq!(get(address, "/metrics", &masters).map(|r| r.0), Some(403));
    assert_eq!(get(address, "/metrics", &proxied).map(|r| r.0), Some(403));
    drop(skipped);

    // An identity that may not read the ConfigMap.
    let nobody = dir.path().join("nobody.kubeconfig");
    server
        .kubeconfig_for(
            &nobody,
            &UserInfo {
                name: "nobody".to_owned(),
                groups: vec!["system:authenticated".to_owned()],
            },
        )
        .await
        .unwrap();
    let (mut refused, _) = start(&[], Some(&nobody));
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = refused.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "still running:\n{}", refused.log());
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    assert!(
        refused.log().contains(
            "cannot look up the authentication configuration in ConfigMap kube-system/extension-apiserver-authentication"
        ),
        "{}",
        refused.log()
    );
    let (tolerated, address) = start(&["--authentication-tolerate-lookup-failure"], Some(&nobody));
    wait_served(&tolerated, address);
    assert!(
        tolerated
            .log()
            .contains("cannot look up the authentication configuration"),
        "{}",
        tolerated.log()
    );
}

/// What the collector received: each request's path and body.
type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A test double of an OpenTelemetry collector's OTLP/HTTP receiver.
async fn collector() -> (SocketAddr, Received) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let received: Received = Arc::default();
    let record = received.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let record = record.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                        let record = record.clone();
                        async move {
                            let path = request.uri().path().to_owned();
                            let body = request.into_body().collect().await?.to_bytes().to_vec();
                            record.lock().push((path, body));
                            Ok::<_, hyper::Error>(http::Response::new(Full::new(Bytes::new())))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (address, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_go_to_the_otlp_endpoint_when_one_is_set() {
    let server = TestApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (address, received) = collector().await;
    let mut manager = Manager::start(
        dir.path(),
        server.kubeconfig_path(),
        &["--secure-port=0"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{address}")),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
            ("OTEL_SERVICE_NAME", "ccm-under-test".to_owned()),
        ],
    );
    add_uninitialized_node(&server).await;
    let deadline = Instant::now() + WAIT;
    loop {
        let exported = received.lock().iter().any(|(path, body)| {
            // Our `reconcile` span, with its controller attribute.
            path == "/v1/traces"
                && contains(body, b"reconcile")
                && contains(body, b"cloud-node-controller")
                && contains(body, b"ccm-under-test")
        });
        if exported {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no reconcile span exported; received {} request(s)\n{}",
            received.lock().len(),
            manager.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(manager.terminate().success(), "{}", manager.log());
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn help_groups_flags_like_upstream_and_version_prints() {
    let help = binary().arg("--help").output().unwrap();
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout).into_owned();
    for heading in [
        "Generic flags:",
        "Leader-migration flags:",
        "Secure serving flags:",
    ] {
        assert!(text.contains(heading), "{heading} missing:\n{text}");
    }
    // Each subcommand says what it does (not the name of its flags' struct); the demo is not shipped.
    assert!(
        text.contains(
            "  leader-migration\n          Inspect, validate and generate leader-migration configuration"
        ),
        "{text}"
    );
    assert!(
        !text.contains("  demo\n"),
        "the shipped binary has a demo:\n{text}"
    );
    let version = binary().arg("--version").output().unwrap();
    assert!(version.status.success());
    assert_eq!(
        String::from_utf8_lossy(&version.stdout),
        format!("Kubernetes v{}\n", env!("CARGO_PKG_VERSION"))
    );
    let raw = binary().arg("--version=raw").output().unwrap();
    assert!(
        String::from_utf8_lossy(&raw.stdout).starts_with("version.Info{Major:\"0\", Minor:\"1\""),
        "{raw:?}"
    );
}

/// `--log-text-split-stream` (behind LoggingAlphaOptions, as upstream): errors on stderr, the rest on
/// stdout.
#[test]
fn split_stream_logs_put_errors_on_stderr_and_the_rest_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let output = binary()
        .args([
            "--cloud-provider=fake",
            "--leader-elect=false",
            "--secure-port=0",
            "--feature-gates=LoggingAlphaOptions=true",
            "--log-text-split-stream",
        ])
        .arg(format!("--kubeconfig={}", dir.path().join("missing").display()))
        .output()
        .unwrap();
    let (out, err) = (String::from_utf8_lossy(&output.stdout), stderr(&output));
    assert_eq!(output.status.code(), Some(1), "{out}{err}");
    assert!(
        out.contains("INFO") && out.contains("starting"),
        "info on stdout: {out}"
    );
    assert!(!err.contains("INFO"), "no info on stderr: {err}");
    assert!(err.contains("--kubeconfig"), "the failure on stderr: {err}");
}

/// Every flag of upstream's cloud-controller-manager at Kubernetes v1.37.2 (its command's flag set, listed
/// by the upstream binary itself) is one of ours, so an operator's manifest never fails on a flag.
const UPSTREAM_FLAGS: &str = "allocate-node-cidrs allow-untagged-cloud authentication-kubeconfig authentication-skip-lookup \
    authentication-token-webhook-cache-ttl authentication-tolerate-lookup-failure authorization-always-allow-paths \
    authorization-kubeconfig authorization-webhook-cache-authorized-ttl authorization-webhook-cache-unauthorized-ttl \
    bind-address cert-dir cidr-allocator-type client-ca-file cloud-config cloud-provider cluster-cidr cluster-name \
    concurrent-node-lifecycle-syncs concurrent-node-status-updates concurrent-node-syncs concurrent-service-syncs \
    configure-cloud-routes contention-profiling controller-start-interval controllers disable-http2-serving \
    enable-leader-migration external-cloud-volume-plugin feature-gates help http2-max-streams-per-connection \
    kube-api-burst kube-api-content-type kube-api-qps kubeconfig leader-elect leader-elect-lease-duration \
    leader-elect-renew-deadline leader-elect-resource-lock leader-elect-resource-name leader-elect-resource-namespace \
    leader-elect-retry-period leader-migration-config log-flush-frequency log-text-info-buffer-size \
    log-text-split-stream logging-format master min-resync-period node-monitor-period node-status-update-frequency \
    node-sync-period permit-address-sharing permit-port-sharing profiling requestheader-allowed-names \
    requestheader-client-ca-file requestheader-extra-headers-prefix requestheader-group-headers \
    requestheader-uid-headers requestheader-username-headers route-reconciliation-period secure-port tls-cert-file \
    tls-cipher-suites tls-curve-preferences tls-min-version tls-private-key-file tls-sni-cert-key \
    use-service-account-credentials v version vmodule webhook-bind-address webhook-cert-dir \
    webhook-disable-http2-serving webhook-secure-port webhook-tls-cert-file webhook-tls-cipher-suites \
    webhook-tls-curve-preferences webhook-tls-min-version webhook-tls-private-key-file webhook-tls-sni-cert-key webhooks";

#[test]
fn every_flag_of_upstreams_manager_is_accepted() {
    let help = binary().arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&help.stdout).into_owned();
    let missing: Vec<&str> = UPSTREAM_FLAGS
        .split_whitespace()
        .filter(|flag| {
            !text.contains(&format!("--{flag} "))
                && !text.contains(&format!("--{flag}["))
                && !text.contains(&format!("--{flag}\n"))
        })
        .collect();
    assert!(missing.is_empty(), "upstream's flags missing: {missing:?}");
    assert_eq!(UPSTREAM_FLAGS.split_whitespace().count(), 85);
    // And the new ones parse: a manifest with upstream's values starts (stopped at the first step that
    // needs a cluster).
    let output = binary()
        .args([
            "--cloud-provider=nope",
            "--feature-gates=CloudControllerManagerWebhook=true,LoggingAlphaOptions=true",
            "--log-text-split-stream",
            "--log-text-info-buffer-size=2Ki",
            "--tls-curve-preferences=23,29",
            "--webhook-tls-min-version=VersionTLS12",
            "--webhook-tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            "--concurrent-node-lifecycle-syncs=4",
        ])
        .output()
        .unwrap();
    let errors = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{errors}");
    assert_eq!(errors.lines().count(), 1, "only the unknown provider: {errors}");
    assert!(errors.contains("nope"), "{errors}");
}

/// A ClusterRole `name` with `rules`, bound to `subjects`.
async fn grant(server: &ApiServer, name: &str, rules: serde_json::Value, subjects: serde_json::Value) {
    let admin = server.client();
    let role: k8s_openapi::api::rbac::v1::ClusterRole =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "rules": rules})).unwrap();
    kube::Api::all(admin.clone())
        .create(&Default::default(), &role)
        .await
        .unwrap();
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": subjects,
    }))
    .unwrap();
    kube::Api::all(admin)
        .create(&Default::default(), &binding)
        .await
        .unwrap();
}

/// `go`, when this machine has it; `None` (said loudly) where it does not, never under CI.
fn go_tool() -> Option<()> {
    let found = std::process::Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "go is not on PATH: the CPU profile cannot be read with go tool pprof"
        );
        #[allow(clippy::print_stderr)]
        {
            eprintln!("SKIPPED: reading the CPU profile with go tool pprof: go is not on PATH");
        }
        return None;
    }
    Some(())
}

/// Issue 32: a production process is debugged without a restart, behind the API server's decision as
/// `/metrics` is: its configuration, a CPU profile the real `go tool pprof` reads, and its log verbosity.
async fn debugging_endpoints_answer_whom_the_api_server_allows(backend: Backend) {
    let plane = crate::migration::Plane::start_secure(backend).await;
    let server = &plane.server;
    let dir = tempfile::tempdir().unwrap();
    grant(
        server,
        "debugger",
        serde_json::json!([{"nonResourceURLs": ["/configz", "/debug/*"], "verbs": ["get", "put"]}]),
        serde_json::json!([{"kind": "ServiceAccount", "name": "debugger", "namespace": "default"}]),
    )
    .await;
    let token = |credentials: Credentials| credentials.token().expect("a token").to_owned();
    let debugger = token(
        server
            .mint(&UserInfo::service_account("default", "debugger"))
            .await,
    );
    let stranger = token(
        server
            .mint(&UserInfo::service_account("default", "stranger"))
            .await,
    );
    let port = free_port();
    let manager = Manager::start(
        dir.path(),
        server.kubeconfig_path(),
        &[
            "--bind-address=127.0.0.1",
            &format!("--secure-port={port}"),
            "--v=0",
        ],
        &[("RUST_LOG", String::new())],
    );
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    let as_user = |token: &str, path: &str, extra: &[&str]| {
        let header = format!("Authorization: Bearer {token}");
        let mut all = vec!["--header", header.as_str()];
        all.extend(extra);
        curl(address, None, path, &all)
    };
    let deadline = Instant::now() + WAIT;
    while curl(address, None, "/healthz", &[]).is_none_or(|(code, _)| code != 200) {
        assert!(Instant::now() < deadline, "never served:\n{}", manager.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The effective configuration.
    let (code, body) = as_user(&debugger, "/configz", &[]).unwrap();
    assert_eq!(code, 200, "{body}");
    let configz: serde_json::Value = serde_json::from_str(&body).unwrap();
    let settings = &configz["cloudcontrollermanager.config.k8s.io"];
    assert_eq!(settings["secure-port"], serde_json::json!(port), "{body}");
    assert_eq!(settings["cloud-provider"], "fake", "{body}");
    let (code, body) = as_user(&stranger, "/configz", &[]).unwrap();
    assert_eq!(code, 403, "{body}");
    assert_eq!(curl(address, None, "/configz", &[]).map(|r| r.0), Some(403));

    // The log verbosity, changed at run time: debug lines appear.
    assert!(!manager.log().contains(" DEBUG "), "{}", manager.log());
    let (code, body) = as_user(&stranger, "/debug/flags/v", &["-X", "PUT", "--data", "6"]).unwrap();
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("cannot put path"), "{body}");
    let (code, body) = as_user(&debugger, "/debug/flags/v", &["-X", "PUT", "--data", "6"]).unwrap();
    assert_eq!(
        (code, body.as_str()),
        (200, "successfully set klog.logging.verbosity to 6\n")
    );
    let (code, _) = as_user(&debugger, "/debug/flags/v", &["-X", "PUT", "--data", "six"]).unwrap();
    assert_eq!(code, 400);
    let deadline = Instant::now() + WAIT;
    while !manager.log().contains(" DEBUG ") {
        assert!(
            Instant::now() < deadline,
            "no debug line after -v 6:\n{}",
            manager.log()
        );
        // Scrapes make the manager log at debug level.
        as_user(&debugger, "/configz", &[]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A CPU profile of two seconds while the process works (scraped over TLS meanwhile), read by pprof.
    let busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let load = {
        let busy = busy.clone();
        let debugger = debugger.clone();
        std::thread::spawn(move || {
            while busy.load(std::sync::atomic::Ordering::Relaxed) {
                let header = format!("Authorization: Bearer {debugger}");
                curl(address, None, "/metrics", &["--header", &header]);
            }
        })
    };
    let profile = dir.path().join("cpu.pprof");
    let header = format!("Authorization: Bearer {debugger}");
    let output = dir.path().join("curl.out");
    let fetched = std::process::Command::new("curl")
        .args([
            "--silent",
            "--insecure",
            "--max-time",
            "120",
            "--write-out",
            "%{http_code}",
        ])
        .args(["--header", &header, "--output"])
        .arg(&profile)
        .arg(format!("https://127.0.0.1:{port}/debug/pprof/profile?seconds=2"))
        .output()
        .unwrap();
    busy.store(false, std::sync::atomic::Ordering::Relaxed);
    load.join().unwrap();
    std::fs::write(&output, &fetched.stdout).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&fetched.stdout),
        "200",
        "{}",
        std::fs::read_to_string(&profile).unwrap_or_default()
    );
    if go_tool().is_some() {
        let read = |args: &[&str]| {
            let output = std::process::Command::new("go")
                .args(["tool", "pprof"])
                .args(args)
                .arg(&profile)
                .output()
                .unwrap();
            assert!(
                output.status.success(),
                "go tool pprof {args:?}: {}",
                stderr(&output)
            );
            String::from_utf8_lossy(&output.stdout).into_owned()
        };
        let raw = read(&["-raw"]);
        assert!(raw.contains("PeriodType: cpu nanoseconds"), "{raw}");
        assert!(raw.contains("samples/count cpu/nanoseconds"), "{raw}");
        assert!(raw.contains("Locations"), "a busy process was sampled: {raw}");
        let top = read(&["-top"]);
        assert!(top.contains("Type: cpu"), "{top}");
    }
    drop(manager);
}

control_plane::on_both_backends!(
    debugging_endpoints_answer_whom_the_api_server_allows,
    the_api_server_decides_who_reads_metrics_by_token_or_client_certificate,
    the_client_ca_is_looked_up_in_the_cluster_as_upstream,
);
