//! A real kube-apiserver on a real etcd, on loopback, for one test (or the demo, or a benchmark).
//!
//! Each start gets a temporary directory, free ports, a new cluster CA and front-proxy CA, a
//! service-account key and an audit log. kube-apiserver runs with `--authorization-mode=Node,RBAC` and its
//! own bootstrap roles; the administrator is a client certificate in `system:masters`. Identities are
//! minted while it runs: client certificates signed by the CA for users, TokenRequest tokens for service
//! accounts (made if missing). Both processes are killed, and the directory removed, when the value is
//! dropped, also when a test panics (which prints the end of kube-apiserver's log first). The processes
//! are started under `setpriv --pdeathsig KILL` where it exists, so they die with the process that
//! started them even when it is killed.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use ccm_audit::kube::{AUDIT_POLICY, AuditedRequest};
use ccm_audit::{LeaseWrite, RequestEntry};
use kube_ccm_test_apiserver::{LeaseRecord, RequestRecord};

use crate::binaries::KubeBinaries;
use crate::pki::Credentials;
use crate::pki::{Authority, CertifiedKey, service_account_key};
use crate::process::{
    Process, START_TIMEOUT, StartError, free_port, rss_mib, wait_for_etcd, wait_for_readyz,
};
use crate::records::{format_us, record};
use kube_ccm_test_apiserver::UserInfo;

/// The front proxy's client certificate name that kube-apiserver trusts for request headers.
pub const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

/// How to start the control plane.
#[derive(Debug, Clone, Default)]
pub struct KubeConfig {
    /// More kube-apiserver flags (`--name=value`), after the harness's own.
    pub extra_flags: Vec<String>,
    /// The audit policy, when not [`AUDIT_POLICY`] (a benchmark records less: bodies cost the server
    /// time and disk). [`KubeApiServer::lease_writes`] needs Lease writes at `RequestResponse`.
    pub audit_policy: Option<String>,
    /// Listen on every interface (not only loopback), with these addresses in the serving certificate
    /// too: for clients in other network namespaces, which reach the host through their links.
    pub reachable_at: Vec<IpAddr>,
}

/// An audit policy that records every request's metadata and only Lease writes in full: enough to count
/// requests and judge Lease tenures, at a fraction of [`AUDIT_POLICY`]'s cost.
pub const LEAN_AUDIT_POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
omitManagedFields: true
rules:
- level: RequestResponse
  resources: [{group: coordination.k8s.io, resources: [leases]}]
  verbs: [create, update, patch, delete]
- level: Metadata
";

/// A running etcd + kube-apiserver; both stop, and their directory goes, when it is dropped.
pub struct KubeApiServer {
    // Fields drop in order: the API server before etcd, both before the directory.
    apiserver: Process,
    etcd: Process,
    url: String,
    ca: Authority,
    front_proxy: Authority,
    admin: CertifiedKey,
    kubeconfig: PathBuf,
    audit_log: PathBuf,
    binaries: KubeBinaries,
    started_in: Duration,
    dir: tempfile::TempDir,
}

impl KubeApiServer {
    /// Starts etcd and kube-apiserver with `binaries`, and waits (at most 90 s) until `/readyz` says ok.
    ///
    /// A port is picked free and then handed to the process, so another process may take it in between:
    /// a start that fails for a port in use is tried again (three times in all).
    pub async fn start(binaries: &KubeBinaries, config: &KubeConfig) -> Result<KubeApiServer, StartError> {
        let mut attempt = 1;
        loop {
            match KubeApiServer::start_once(binaries, config).await {
                Err(StartError::NotReady { tail, .. })
                    if attempt < 3 && tail.contains("address already in use") =>
                {
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn start_once(binaries: &KubeBinaries, config: &KubeConfig) -> Result<KubeApiServer, StartError> {
        let started = Instant::now();
        let dir = tempfile::Builder::new()
            .prefix("kube-apiserver-")
            .tempdir()
            .map_err(|source| StartError::Io {
                path: std::env::temp_dir(),
                source,
            })?;
        let path = |name: &str| dir.path().join(name);
        let write = |name: &str, text: &str| {
            let path = path(name);
            std::fs::write(&path, text).map_err(|source| StartError::Io { path, source })
        };
        let ca = Authority::new("kubernetes-ca")?;
        let front_proxy = Authority::new("front-proxy-ca")?;
        let loopback: IpAddr = [127, 0, 0, 1].into();
        let ips: Vec<IpAddr> = std::iter::once(loopback)
            .chain(config.reachable_at.iter().copied())
            .collect();
        let serving = ca.server(&ips)?;
        let admin = ca.client("admin", Some("system:masters"))?;
        write("ca.crt", &ca.pem())?;
        write("front-proxy-ca.crt", &front_proxy.pem())?;
        write("apiserver.crt", &serving.cert_pem)?;
        write("apiserver.key", &serving.key_pem)?;
        let (signing, verifying) = service_account_key()?;
        write("sa.key", &signing)?;
        write("sa.pub", &verifying)?;
        write(
            "audit-policy.yaml",
            config.audit_policy.as_deref().unwrap_or(AUDIT_POLICY),
        )?;

        let etcd_port = free_port()?;
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let mut etcd = Process::spawn(
            "etcd",
            &binaries.etcd,
            &[
                format!("--data-dir={}", path("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                // No peers: a port the kernel picks (envtest's way).
                "--listen-peer-urls=http://127.0.0.1:0".to_owned(),
                "--unsafe-no-fsync".to_owned(),
                "--log-level=warn".to_owned(),
            ],
            path("etcd.log"),
        )?;
        wait_for_etcd(&mut etcd, etcd_port, started + START_TIMEOUT).await?;

        let port = free_port()?;
        let audit_log = path("audit.log");
        let mut args = vec![
            format!("--etcd-servers={etcd_url}"),
            if config.reachable_at.is_empty() {
                "--bind-address=127.0.0.1".to_owned()
            } else {
                "--bind-address=0.0.0.0".to_owned()
            },
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", path("pki").display()),
            format!("--tls-cert-file={}", path("apiserver.crt").display()),
            format!("--tls-private-key-file={}", path("apiserver.key").display()),
            format!("--client-ca-file={}", path("ca.crt").display()),
            format!(
                "--requestheader-client-ca-file={}",
                path("front-proxy-ca.crt").display()
            ),
            format!("--requestheader-allowed-names={FRONT_PROXY_CLIENT}"),
            "--requestheader-username-headers=X-Remote-User".to_owned(),
            "--requestheader-group-headers=X-Remote-Group".to_owned(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_owned(),
            "--service-cluster-ip-range=10.96.0.0/16,fd00:96::/108".to_owned(),
            "--service-account-issuer=https://kubernetes.default.svc".to_owned(),
            format!("--service-account-key-file={}", path("sa.pub").display()),
            format!("--service-account-signing-key-file={}", path("sa.key").display()),
            "--authorization-mode=Node,RBAC".to_owned(),
            // No kube-controller-manager makes the default service accounts pods would need.
            "--disable-admission-plugins=ServiceAccount".to_owned(),
            format!("--audit-policy-file={}", path("audit-policy.yaml").display()),
            format!("--audit-log-path={}", audit_log.display()),
            "--audit-log-mode=blocking".to_owned(),
            "--audit-log-maxsize=0".to_owned(),
            "--profiling=false".to_owned(),
            // Loopback cannot be the `kubernetes` Service's endpoint: nothing reconciles it.
            "--endpoint-reconciler-type=none".to_owned(),
        ];
        args.extend(config.extra_flags.iter().cloned());
        let mut apiserver = Process::spawn(
            "kube-apiserver",
            &binaries.kube_apiserver,
            &args,
            path("kube-apiserver.log"),
        )?;
        let url = format!("https://127.0.0.1:{port}");
        wait_for_readyz(&mut apiserver, &url, &ca, &admin, started + START_TIMEOUT).await?;
        let kubeconfig = path("admin.kubeconfig");
        let server = KubeApiServer {
            apiserver,
            etcd,
            url,
            ca,
            front_proxy,
            admin,
            kubeconfig: kubeconfig.clone(),
            audit_log,
            binaries: binaries.clone(),
            started_in: started.elapsed(),
            dir,
        };
        server
            .write_kubeconfig(&kubeconfig, &Credentials::Certificate(server.admin.clone()))
            .map_err(|source| StartError::Io {
                path: kubeconfig,
                source,
            })?;
        // The release the manifest names is the one serving (`KUBE_TOOLS_MANIFEST` picks others).
        let served = server.client().apiserver_version().await;
        match served {
            Ok(info) if info.git_version == binaries.kubernetes_version => Ok(server),
            Ok(info) => Err(server.apiserver.not_ready(format!(
                "it serves {}, not {}, which its manifest names",
                info.git_version, binaries.kubernetes_version
            ))),
            Err(error) => Err(server.apiserver.not_ready(format!("/version: {error}"))),
        }
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The administrator's kubeconfig (`system:masters`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The cluster CA (PEM): it signed the serving certificate and every client certificate.
    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// The front-proxy CA (PEM) kube-apiserver trusts for request-header authentication.
    pub fn front_proxy_ca_pem(&self) -> String {
        self.front_proxy.pem()
    }

    /// A client certificate of the front proxy (`front-proxy-client`), signed by the front-proxy CA.
    pub fn front_proxy_client(&self) -> CertifiedKey {
        self.front_proxy
            .client(FRONT_PROXY_CLIENT, None)
            .expect("a front-proxy client certificate")
    }

    /// The administrator's credentials.
    pub fn admin(&self) -> Credentials {
        Credentials::Certificate(self.admin.clone())
    }

    /// A kube configuration with these credentials, trusting the cluster CA, without kube's retries.
    pub fn config_with(&self, credentials: &Credentials) -> kube::Config {
        let mut config = kube::Config::new(self.url.parse().expect("the server URL is a URI"));
        config.default_retry = false;
        config.root_cert = Some(vec![self.ca.der()]);
        match credentials {
            Credentials::Token(token) => config.auth_info.token = Some(token.clone().into()),
            Credentials::Certificate(key) => {
                let engine = base64::engine::general_purpose::STANDARD;
                config.auth_info.client_certificate_data = Some(engine.encode(&key.cert_pem));
                config.auth_info.client_key_data = Some(engine.encode(&key.key_pem).into());
            }
        }
        config
    }

    /// Writes a kubeconfig for these credentials.
    pub fn write_kubeconfig(&self, path: &Path, credentials: &Credentials) -> std::io::Result<()> {
        let engine = base64::engine::general_purpose::STANDARD;
        let user = match credentials {
            Credentials::Token(token) => serde_json::json!({"token": token}),
            Credentials::Certificate(key) => serde_json::json!({
                "client-certificate-data": engine.encode(&key.cert_pem),
                "client-key-data": engine.encode(&key.key_pem),
            }),
        };
        let kubeconfig = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kube", "cluster": {
                "server": self.url,
                "certificate-authority-data": engine.encode(self.ca.pem()),
            }}],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "kube", "context": {"cluster": "kube", "user": "user"}}],
            "current-context": "kube",
        });
        std::fs::write(path, serde_json::to_string_pretty(&kubeconfig)?)
    }

    /// Credentials for `user`: a service account (`system:serviceaccount:NS:NAME`) gets a token from the
    /// TokenRequest API (the namespace and the account are made when missing); anyone else a client
    /// certificate, with the user's one group besides `system:authenticated` (which the server adds).
    pub async fn mint(&self, user: &UserInfo) -> Result<Credentials, kube::Error> {
        if let Some(rest) = user.name.strip_prefix("system:serviceaccount:") {
            let (namespace, name) = rest
                .split_once(':')
                .unwrap_or_else(|| panic!("{}: not system:serviceaccount:NS:NAME", user.name));
            return self
                .service_account_token(namespace, name)
                .await
                .map(Credentials::Token);
        }
        let groups: Vec<&String> = user
            .groups
            .iter()
            .filter(|g| *g != "system:authenticated")
            .collect();
        assert!(
            groups.len() <= 1,
            "{}: a client certificate carries one group here, not {groups:?}",
            user.name
        );
        Ok(Credentials::Certificate(
            self.ca
                .client(&user.name, groups.first().map(|g| g.as_str()))
                .expect("a client certificate"),
        ))
    }

    async fn service_account_token(&self, namespace: &str, name: &str) -> Result<String, kube::Error> {
        use k8s_openapi::api::authentication::v1::TokenRequest;
        use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
        use kube::api::{Api, PostParams};
        let client = self.client();
        let create = PostParams::default();
        let namespace_object: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}}))
                .expect("a namespace");
        ignore_conflict(
            Api::<Namespace>::all(client.clone())
                .create(&create, &namespace_object)
                .await,
        )?;
        let accounts: Api<ServiceAccount> = Api::namespaced(client, namespace);
        let account: ServiceAccount =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("an account");
        ignore_conflict(accounts.create(&create, &account).await)?;
        let request: TokenRequest = serde_json::from_value(serde_json::json!({
            "spec": {"audiences": [], "expirationSeconds": 86_400}
        }))
        .expect("a token request");
        let answer = accounts.create_token_request(name, &create, &request).await?;
        Ok(answer.status.map(|s| s.token).unwrap_or_default())
    }

    /// A client as the administrator.
    pub fn client(&self) -> kube::Client {
        self.client_with(&self.admin(), "kube-apiserver-client/0")
    }

    /// A client with these credentials and `User-Agent`.
    pub fn client_with(&self, credentials: &Credentials, user_agent: &str) -> kube::Client {
        let mut config = self.config_with(credentials);
        config.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_str(user_agent).expect("a valid User-Agent"),
        ));
        kube::Client::try_from(config).expect("a client for the server's URL")
    }

    /// The audit log (JSON lines, `audit.k8s.io/v1` Events).
    pub fn audit_log_path(&self) -> &Path {
        &self.audit_log
    }

    fn audited(&self) -> Vec<AuditedRequest> {
        let text = std::fs::read_to_string(&self.audit_log).unwrap_or_default();
        ccm_audit::kube::requests(&text).expect("kube-apiserver's audit log reads")
    }

    /// Every request so far, from the audit log, in the test API server's record form.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.audited()
            .into_iter()
            .enumerate()
            .map(|(seq, audited)| record(seq as u64, audited))
            .collect()
    }

    /// Every request so far, as the overlap audit takes them.
    pub fn request_entries(&self) -> Vec<RequestEntry> {
        self.audited().into_iter().map(|a| a.entry).collect()
    }

    /// Every Lease write so far, from the audit log, in the test API server's record form (a delete
    /// has no record after it: its holder and times are empty).
    pub fn leases(&self) -> Vec<LeaseRecord> {
        self.audited()
            .iter()
            .filter_map(|audited| {
                let (namespace, name) = audited.written_lease()?;
                let spec = audited.lease_after().map(|o| &o["spec"]);
                let text = |field: &str| spec.and_then(|s| s[field].as_str()).map(str::to_owned);
                let number = |field: &str| spec.and_then(|s| s[field].as_i64());
                Some(LeaseRecord {
                    seq: audited.line as u64,
                    time: format_us(audited.entry.time_us),
                    time_us: audited.entry.time_us,
                    resource_version: audited.entry.resource_version.unwrap_or(0),
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    operation: audited.event.verb.clone(),
                    holder_identity: text("holderIdentity").filter(|h| !h.is_empty()),
                    lease_transitions: number("leaseTransitions"),
                    lease_duration_seconds: number("leaseDurationSeconds"),
                    acquire_time: text("acquireTime"),
                    renew_time: text("renewTime"),
                    user_agent: audited.event.user_agent.clone(),
                })
            })
            .collect()
    }

    /// Every Lease write so far, as the overlap audit takes them (from the audit log).
    pub fn lease_writes(&self) -> Vec<LeaseWrite> {
        let text = std::fs::read_to_string(&self.audit_log).unwrap_or_default();
        ccm_audit::kube::parse(&text)
            .expect("kube-apiserver's audit log reads")
            .leases
    }

    /// `kube-apiserver --version` as built (`Kubernetes v1.37.2`).
    pub fn version(&self) -> &str {
        &self.binaries.kubernetes_version
    }

    /// The binaries it runs.
    pub fn binaries(&self) -> &KubeBinaries {
        &self.binaries
    }

    /// From the start to `/readyz` answering ok.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// Resident memory of etcd and kube-apiserver now, in MiB (`VmRSS`).
    pub fn rss_mib(&self) -> (f64, f64) {
        (rss_mib(self.etcd.pid()), rss_mib(self.apiserver.pid()))
    }

    /// The process IDs of etcd and kube-apiserver, in that order (for CPU and memory figures).
    pub fn pids(&self) -> (u32, u32) {
        (self.etcd.pid(), self.apiserver.pid())
    }

    /// Its temporary directory (certificates, logs, etcd's data).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for KubeApiServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            #[allow(clippy::print_stderr)]
            {
                eprintln!(
                    "--- the end of kube-apiserver's log ---\n{}\n---",
                    self.apiserver.tail(30)
                );
            }
        }
    }
}

fn ignore_conflict<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(error) => Err(error),
    }
}
