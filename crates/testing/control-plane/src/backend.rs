//! The parameter (`Backend`) and the server it starts (`ApiServer`): what a test asks of either.

use std::path::Path;

use ccm_audit::{LeaseWrite, RequestEntry};
use kube_ccm_test_apiserver::{LeaseRecord, RequestRecord, TestApiServer, UserInfo};

use crate::binaries::{KubeBinaries, Unavailable};
use crate::kube_apiserver::{KubeApiServer, KubeConfig};
use crate::pki::Credentials;
use crate::process::StartError;

/// Which API server a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The test API server (`crates/testing/kube-ccm-test-apiserver`).
    Test,
    /// A real kube-apiserver on etcd.
    Kube,
}

impl Backend {
    /// `test` or `kube-apiserver`, as JSON reports name it.
    pub fn kind(self) -> &'static str {
        match self {
            Backend::Test => "test",
            Backend::Kube => "kube-apiserver",
        }
    }
}

/// Why a control plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The test API server did not start.
    #[error("the test API server did not start: {0}")]
    Test(#[from] kube_ccm_test_apiserver::StartError),
    /// The real components are missing.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// The real control plane did not start.
    #[error(transparent)]
    Kube(#[from] StartError),
}

/// A running API server of either kind; it stops when dropped.
pub enum ApiServer {
    /// The test API server.
    Test(TestApiServer),
    /// kube-apiserver and etcd.
    Kube(Box<KubeApiServer>),
}

impl ApiServer {
    /// Starts a server of `backend`'s kind (the test API server with its admin API, on a free loopback
    /// port; the real one as [`KubeApiServer::start`] does).
    pub async fn start(backend: Backend) -> Result<ApiServer, Error> {
        match backend {
            Backend::Test => Ok(ApiServer::Test(TestApiServer::start().await?)),
            Backend::Kube => {
                let binaries = KubeBinaries::find()?;
                Ok(ApiServer::Kube(Box::new(
                    KubeApiServer::start(&binaries, &KubeConfig::default()).await?,
                )))
            }
        }
    }

    /// For a test: [`ApiServer::start`], panicking with the reason when it fails.
    pub async fn for_test(backend: Backend) -> ApiServer {
        match ApiServer::start(backend).await {
            Ok(server) => server,
            Err(error) => panic!("the {} control plane did not start: {error}", backend.kind()),
        }
    }

    /// Its kind.
    pub fn backend(&self) -> Backend {
        match self {
            ApiServer::Test(_) => Backend::Test,
            ApiServer::Kube(_) => Backend::Kube,
        }
    }

    /// The test API server, when it is one (for what only it has: faults, RBAC switched off).
    pub fn as_test(&self) -> Option<&TestApiServer> {
        match self {
            ApiServer::Test(server) => Some(server),
            ApiServer::Kube(_) => None,
        }
    }

    /// The real control plane, when it is one.
    pub fn as_kube(&self) -> Option<&KubeApiServer> {
        match self {
            ApiServer::Test(_) => None,
            ApiServer::Kube(server) => Some(server),
        }
    }

    /// Its URL.
    pub fn url(&self) -> &str {
        match self {
            ApiServer::Test(server) => server.url(),
            ApiServer::Kube(server) => server.url(),
        }
    }

    /// The administrator's kubeconfig.
    pub fn kubeconfig_path(&self) -> &Path {
        match self {
            ApiServer::Test(server) => server.kubeconfig_path(),
            ApiServer::Kube(server) => server.kubeconfig_path(),
        }
    }

    /// The administrator's credentials.
    pub fn admin(&self) -> Credentials {
        match self {
            ApiServer::Test(server) => Credentials::Token(server.admin_token()),
            ApiServer::Kube(server) => server.admin(),
        }
    }

    /// A client as the administrator.
    pub fn client(&self) -> kube::Client {
        match self {
            ApiServer::Test(server) => server.client(),
            ApiServer::Kube(server) => server.client(),
        }
    }

    /// A kube configuration as the administrator, without kube's retries.
    pub fn config(&self) -> kube::Config {
        self.config_with(&self.admin())
    }

    /// A kube configuration with these credentials, without kube's retries.
    pub fn config_with(&self, credentials: &Credentials) -> kube::Config {
        match (self, credentials) {
            (ApiServer::Test(server), Credentials::Token(token)) => server.config_with(token),
            (ApiServer::Test(_), Credentials::Certificate(_)) => {
                panic!("the test API server takes no client certificates")
            }
            (ApiServer::Kube(server), credentials) => server.config_with(credentials),
        }
    }

    /// A client with these credentials and `User-Agent`.
    pub fn client_with(&self, credentials: &Credentials, user_agent: &str) -> kube::Client {
        match (self, credentials) {
            (ApiServer::Test(server), Credentials::Token(token)) => server.client_with(token, user_agent),
            (ApiServer::Test(_), Credentials::Certificate(_)) => {
                panic!("the test API server takes no client certificates")
            }
            (ApiServer::Kube(server), credentials) => server.client_with(credentials, user_agent),
        }
    }

    /// Credentials for `user`: a token from the test API server; from the real one, a TokenRequest token
    /// for a service account, a client certificate for anyone else.
    pub async fn mint(&self, user: &UserInfo) -> Credentials {
        match self {
            ApiServer::Test(server) => Credentials::Token(server.mint_token(user.clone())),
            ApiServer::Kube(server) => server
                .mint(user)
                .await
                .unwrap_or_else(|e| panic!("credentials for {}: {e}", user.name)),
        }
    }

    /// Writes a kubeconfig for these credentials.
    pub fn write_kubeconfig(&self, path: &Path, credentials: &Credentials) -> std::io::Result<()> {
        match (self, credentials) {
            (ApiServer::Test(server), Credentials::Token(token)) => server.write_kubeconfig(path, token),
            (ApiServer::Test(_), Credentials::Certificate(_)) => {
                panic!("the test API server takes no client certificates")
            }
            (ApiServer::Kube(server), credentials) => server.write_kubeconfig(path, credentials),
        }
    }

    /// Writes a kubeconfig for `user` (see [`ApiServer::mint`]).
    pub async fn kubeconfig_for(&self, path: &Path, user: &UserInfo) -> std::io::Result<()> {
        let credentials = self.mint(user).await;
        self.write_kubeconfig(path, &credentials)
    }

    /// The CA that signed the serving certificate (PEM), when it serves TLS.
    pub fn ca_pem(&self) -> Option<String> {
        match self {
            ApiServer::Test(server) => server.ca_pem().map(str::to_owned),
            ApiServer::Kube(server) => Some(server.ca_pem()),
        }
    }

    /// Every request so far: the request log, or kube-apiserver's audit log.
    pub fn requests(&self) -> Vec<RequestRecord> {
        match self {
            ApiServer::Test(server) => server.requests(),
            ApiServer::Kube(server) => server.requests(),
        }
    }

    /// Every request so far, as the overlap audit takes them.
    pub fn request_entries(&self) -> Vec<RequestEntry> {
        match self {
            ApiServer::Test(server) => server.requests().into_iter().map(entry).collect(),
            ApiServer::Kube(server) => server.request_entries(),
        }
    }

    /// Every Lease write so far: the Lease history, or the Lease writes of kube-apiserver's audit log.
    pub fn leases(&self) -> Vec<LeaseRecord> {
        match self {
            ApiServer::Test(server) => server.leases(),
            ApiServer::Kube(server) => server.leases(),
        }
    }

    /// Every Lease write so far, as the overlap audit takes them.
    pub fn lease_writes(&self) -> Vec<LeaseWrite> {
        match self {
            ApiServer::Test(server) => server
                .leases()
                .into_iter()
                .map(|l| LeaseWrite {
                    time_us: l.time_us,
                    resource_version: l.resource_version,
                    namespace: l.namespace,
                    name: l.name,
                    operation: l.operation,
                    holder_identity: l.holder_identity,
                    lease_duration_seconds: l.lease_duration_seconds,
                    renew_time_us: l
                        .renew_time
                        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                        .map(jiff::Timestamp::as_microsecond),
                    user_agent: l.user_agent,
                })
                .collect(),
            ApiServer::Kube(server) => server.lease_writes(),
        }
    }

    /// What it is, for reports: `{"kind": "test"|"kube-apiserver", "version": …}`.
    pub fn describe(&self) -> serde_json::Value {
        match self {
            ApiServer::Test(_) => serde_json::json!({
                "kind": Backend::Test.kind(),
                "version": env!("CARGO_PKG_VERSION"),
            }),
            ApiServer::Kube(server) => serde_json::json!({
                "kind": Backend::Kube.kind(),
                "version": server.version(),
                "etcd": server.binaries().etcd_version,
            }),
        }
    }
}

fn entry(record: RequestRecord) -> RequestEntry {
    RequestEntry {
        time_us: record.time_us,
        method: record.method,
        path: record.path,
        user_agent: record.user_agent,
        verb: record.verb,
        status: record.status,
        resource_version: record.resource_version,
        // Its time less the time to answer, rounded to the earlier microsecond.
        received_us: Some(record.time_us - (record.latency_ms * 1000.0).ceil() as i64),
    }
}

/// Makes each `async fn NAME(backend: Backend)` two tests, `NAME::test_apiserver` and
/// `NAME::kube_apiserver` (multi-threaded tokio runtimes, two workers); with `sync` first, each
/// `fn NAME(backend: Backend)` (a test that drives processes). The kube-apiserver test is skipped, loudly,
/// only on a machine without Go ([`KubeBinaries::for_test`]).
#[macro_export]
macro_rules! on_both_backends {
    (sync $($name:ident),+ $(,)?) => {$(
        mod $name {
            #[test]
            fn test_apiserver() {
                super::$name($crate::Backend::Test)
            }

            #[test]
            fn kube_apiserver() {
                if $crate::KubeBinaries::for_test(concat!(module_path!(), "::", stringify!($name))).is_some() {
                    super::$name($crate::Backend::Kube)
                }
            }
        }
    )+};
    ($($name:ident),+ $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn test_apiserver() {
                super::$name($crate::Backend::Test).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn kube_apiserver() {
                if $crate::KubeBinaries::for_test(concat!(module_path!(), "::", stringify!($name))).is_some() {
                    super::$name($crate::Backend::Kube).await
                }
            }
        }
    )+};
}
