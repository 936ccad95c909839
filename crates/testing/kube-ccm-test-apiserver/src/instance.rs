//! A running server: start, clients and kubeconfigs for it, and what a test reads from it.

use parking_lot::Mutex;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::auth::UserInfo;
use crate::faults::{FaultAction, FaultSpec};
use crate::observe::{LeaseRecord, RequestRecord};
use crate::state::{CloseWatches, Settings, State};
use crate::tls::TlsError;
use crate::{auth, faults, observe, resources, server, store, tls};

/// How to start a server.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to listen on; port 0 picks a free one.
    pub listen: SocketAddr,
    /// Start with RBAC enforced.
    pub rbac: bool,
    /// Serve HTTPS with a CA made at start (in the kubeconfig). kubectl sends credentials only over TLS, so
    /// RBAC mode with kubectl needs this.
    pub tls: bool,
    /// Changes kept per resource type for watches that resume from a resourceVersion.
    pub history_limit: usize,
    /// How often watches that asked for bookmarks get one.
    pub bookmark_interval: Duration,
    /// Where to write the admin kubeconfig; a temporary directory owned by the server when absent.
    pub kubeconfig_out: Option<PathBuf>,
    /// Records kept of each log (requests, Lease writes); older ones are dropped and counted.
    pub log_limit: usize,
    /// Serve the admin API (`/_admin/`, which can change RBAC and mint tokens), to loopback callers only.
    pub admin: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            rbac: false,
            tls: false,
            history_limit: 20_000,
            bookmark_interval: Duration::from_secs(1),
            kubeconfig_out: None,
            log_limit: 500_000,
            admin: false,
        }
    }
}

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The listen address is not available.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// TLS could not be set up.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The kubeconfig could not be written.
    #[error("cannot write the kubeconfig {path}: {source}")]
    Kubeconfig {
        /// Where.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A running server; it stops when dropped.
pub struct TestApiServer {
    state: Arc<State>,
    url: String,
    ca: Option<(String, Vec<u8>)>,
    kubeconfig: PathBuf,
    task: tokio::task::JoinHandle<()>,
    _temporary: Option<tempfile::TempDir>,
}

impl TestApiServer {
    /// Starts a server with the default configuration and the admin API on a free loopback port.
    pub async fn start() -> Result<TestApiServer, StartError> {
        TestApiServer::start_with(Config {
            admin: true,
            ..Config::default()
        })
        .await
    }

    /// Starts a server.
    pub async fn start_with(config: Config) -> Result<TestApiServer, StartError> {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| StartError::Bind {
                address: config.listen,
                source,
            })?;
        let address = listener.local_addr().map_err(|source| StartError::Bind {
            address: config.listen,
            source,
        })?;
        let mut store = store::Store::new(config.history_limit);
        for object in auth::bootstrap_objects() {
            let id = resources::find_kind(
                object["apiVersion"].as_str().unwrap_or_default(),
                object["kind"].as_str().unwrap_or_default(),
            )
            .expect("bootstrap objects are of stored types");
            let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
            let namespace = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let mut object = object;
            object["metadata"]["uid"] = serde_json::json!(uuid::Uuid::new_v4().to_string());
            object["metadata"]["creationTimestamp"] = serde_json::json!(observe::Clock::new().seconds());
            store.put(id, (namespace, name), object);
        }
        let state = Arc::new(State {
            store: Mutex::new(store),
            logs: Mutex::new(observe::Logs::new(config.log_limit)),
            faults: Mutex::new(faults::Faults::default()),
            auth: Mutex::new(auth::Auth::new(config.rbac)),
            clock: observe::Clock::new(),
            address,
            close_watches: tokio::sync::watch::channel(CloseWatches::default()).0,
            settings: Settings {
                bookmark_interval: config.bookmark_interval,
                admin: config.admin,
            },
        });
        let tls = if config.tls { Some(tls::generate()?) } else { None };
        let url = format!("{}://{address}", if tls.is_some() { "https" } else { "http" });
        let ca = tls.as_ref().map(|t| (t.ca_pem.clone(), t.ca_der.clone()));
        let (kubeconfig, temporary) = match config.kubeconfig_out {
            Some(path) => (path, None),
            None => {
                let directory = tempfile::tempdir().map_err(|source| StartError::Kubeconfig {
                    path: std::env::temp_dir(),
                    source,
                })?;
                (directory.path().join("kubeconfig"), Some(directory))
            }
        };
        let admin_token = state.auth.lock().admin_token.clone();
        write_kubeconfig(
            &kubeconfig,
            &url,
            ca.as_ref().map(|(pem, _)| pem.as_str()),
            &admin_token,
        )
        .map_err(|source| StartError::Kubeconfig {
            path: kubeconfig.clone(),
            source,
        })?;
        let task = tokio::spawn(server::serve(state.clone(), listener, tls.map(|t| t.acceptor)));
        Ok(TestApiServer {
            state,
            url,
            ca,
            kubeconfig,
            task,
            _temporary: temporary,
        })
    }

    /// `http://127.0.0.1:PORT` (`https://` with TLS).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The admin kubeconfig (for kubectl and kube-rs).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The administrator's bearer token (`system:masters`).
    pub fn admin_token(&self) -> String {
        self.state.auth.lock().admin_token.clone()
    }

    /// A client authenticated as the administrator.
    pub fn client(&self) -> kube::Client {
        self.client_with(&self.admin_token(), "test-apiserver-client/0")
    }

    /// A client with this bearer token and `User-Agent`.
    ///
    /// Unlike kube's default, it does not retry 429, 503 and 504 (kube retries them up to 15 times with
    /// exponential backoff): a test sees exactly what the server answered.
    pub fn client_with(&self, token: &str, user_agent: &str) -> kube::Client {
        let mut config = self.config_with(token);
        config.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_str(user_agent).expect("a valid User-Agent"),
        ));
        kube::Client::try_from(config).expect("a client for the server's URL")
    }

    /// A kube configuration for this server with the administrator's token (and the CA when serving TLS),
    /// without kube's retries of 429/503/504.
    pub fn config(&self) -> kube::Config {
        self.config_with(&self.admin_token())
    }

    /// As [`TestApiServer::config`], with this bearer token.
    pub fn config_with(&self, token: &str) -> kube::Config {
        let mut config = kube::Config::new(self.url.parse().expect("the server URL is a URI"));
        config.default_retry = false;
        config.auth_info.token = Some(token.to_owned().into());
        if let Some((_, der)) = &self.ca {
            config.root_cert = Some(vec![der.clone()]);
        }
        config
    }

    /// Writes a kubeconfig for this server and `token` (for example a service account's).
    pub fn write_kubeconfig(&self, path: &Path, token: &str) -> std::io::Result<()> {
        write_kubeconfig(
            path,
            &self.url,
            self.ca.as_ref().map(|(pem, _)| pem.as_str()),
            token,
        )
    }

    /// The CA certificate (PEM) when serving TLS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca.as_ref().map(|(pem, _)| pem.as_str())
    }

    /// A new bearer token for `user`.
    pub fn mint_token(&self, user: UserInfo) -> String {
        self.state.auth.lock().mint(user)
    }

    /// Turns RBAC enforcement on or off.
    pub fn set_rbac(&self, enabled: bool) {
        self.state.auth.lock().rbac = enabled;
    }

    /// Stores `status.loadBalancer.ingress[].ipMode` (`true`, the default: Kubernetes 1.30 and later), or
    /// drops it as a server without the `LoadBalancerIPMode` feature does.
    pub fn set_load_balancer_ip_mode(&self, stored: bool) {
        self.state.store.lock().features.load_balancer_ip_mode = stored;
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.state.logs.lock().requests.iter().cloned().collect()
    }

    /// Every Lease write so far.
    pub fn leases(&self) -> Vec<LeaseRecord> {
        self.state.logs.lock().leases.iter().cloned().collect()
    }

    /// Request counts by `"<verb> <resource>"`.
    pub fn counters(&self) -> std::collections::BTreeMap<String, u64> {
        self.state.logs.lock().counters.clone()
    }

    /// Adds a fault; returns its id.
    pub fn add_fault(&self, spec: FaultSpec) -> u64 {
        let partition = (spec.action == FaultAction::Partition).then(|| spec.user_agent.clone());
        let id = self.state.faults.lock().add(spec);
        if let Some(pattern) = partition {
            self.state.end_watches(pattern);
        }
        id
    }

    /// Removes every fault.
    pub fn clear_faults(&self) {
        self.state.faults.lock().clear();
    }

    /// Ends open watches of clients whose `User-Agent` contains `pattern` (all when None).
    pub fn close_watches(&self, pattern: Option<&str>) {
        self.state.end_watches(pattern.map(str::to_owned));
    }

    /// Forgets watch history: watches from any earlier resourceVersion get 410 Expired.
    pub fn compact(&self) {
        self.state.store.lock().compact();
    }

    /// Number of stored objects of a type (`group`, `plural`), e.g. `("", "nodes")`.
    pub fn object_count(&self, group: &str, plural: &str) -> usize {
        let id = resources::RESOURCES
            .iter()
            .position(|r| r.group == group && r.plural == plural)
            .expect("a stored type");
        self.state.store.lock().count(id)
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn write_kubeconfig(path: &Path, url: &str, ca_pem: Option<&str>, token: &str) -> std::io::Result<()> {
    use base64::Engine;
    let ca = ca_pem
        .map(|pem| {
            format!(
                "\n    certificate-authority-data: {}",
                base64::engine::general_purpose::STANDARD.encode(pem)
            )
        })
        .unwrap_or_default();
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test-apiserver\n  cluster:\n    server: {url}{ca}\nusers:\n- name: test-apiserver-user\n  user:\n    token: {token}\ncontexts:\n- name: test-apiserver\n  context:\n    cluster: test-apiserver\n    user: test-apiserver-user\n    namespace: default\ncurrent-context: test-apiserver\n"
    );
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, kubeconfig)?;
    std::fs::rename(&temporary, path)
}
