//! Running a control plane of this binary's replicas against a test API server and a fake cloud: used by
//! `demo`, the multi-process tests and the leader benchmark, so all three exercise the same thing.
//!
//! The API server and the fake cloud are given by URL (in-process or separate processes alike); the
//! verdict comes from the API server's own records (its admin API's Lease history and request log),
//! checked by [`leadermigration::audit`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use leadermigration::audit::{Governance, LeaseWrite, RequestEntry};
use leadermigration::{
    CLOUD_CONTROLLER_MANAGER, ControllerCatalog, KUBE_CONTROLLER_MANAGER, MigrationConfig,
};

/// The two sides of a migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// kube-controller-manager of version N: runs the migrated controllers under the N configuration.
    Kcm,
    /// cloud-controller-manager of version N+1.
    Ccm,
}

impl Side {
    /// The component name.
    pub fn component(self) -> &'static str {
        match self {
            Side::Kcm => KUBE_CONTROLLER_MANAGER,
            Side::Ccm => CLOUD_CONTROLLER_MANAGER,
        }
    }
}

/// Election timings for every replica (short ones make tests and demos quick).
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// Whole seconds.
    pub lease_duration: Duration,
    /// Renew deadline.
    pub renew_deadline: Duration,
    /// Retry period.
    pub retry_period: Duration,
}

impl Timings {
    /// 2 s / 1 s / 200 ms.
    pub fn fast() -> Timings {
        Timings {
            lease_duration: Duration::from_secs(2),
            renew_deadline: Duration::from_secs(1),
            retry_period: Duration::from_millis(200),
        }
    }
}

/// What every replica shares.
#[derive(Debug, Clone)]
pub struct Environment {
    /// The `cloud-controller-manager` binary.
    pub binary: PathBuf,
    /// Admin kubeconfig of the API server.
    pub kubeconfig: PathBuf,
    /// The fake provider's cloud-config (pointing at the shared fake cloud).
    pub cloud_config: PathBuf,
    /// The N and N+1 leader-migration configurations.
    pub kcm_config: PathBuf,
    /// The N+1 configuration.
    pub ccm_config: PathBuf,
    /// Where replica logs go.
    pub log_dir: PathBuf,
    /// Election timings.
    pub timings: Timings,
    /// Extra flags for every replica.
    pub extra_args: Vec<String>,
}

impl Environment {
    /// Writes the configurations into `dir` (the shipped examples' content) and the fake cloud's
    /// cloud-config, and returns the environment.
    pub fn prepare(
        dir: &Path,
        binary: PathBuf,
        kubeconfig: PathBuf,
        cloud_url: &str,
        timings: Timings,
    ) -> Result<Environment> {
        let kcm_config = dir.join("leadermigration-n.yaml");
        let ccm_config = dir.join("leadermigration-n-plus-1.yaml");
        std::fs::write(
            &kcm_config,
            include_str!("../../../examples/leader-migration/n.yaml"),
        )?;
        std::fs::write(
            &ccm_config,
            include_str!("../../../examples/leader-migration/n-plus-1.yaml"),
        )?;
        let cloud_config = dir.join("cloud.yaml");
        std::fs::write(&cloud_config, format!("endpoint: {cloud_url}\n"))?;
        let log_dir = dir.join("logs");
        std::fs::create_dir_all(&log_dir)?;
        Ok(Environment {
            binary,
            kubeconfig,
            cloud_config,
            kcm_config,
            ccm_config,
            log_dir,
            timings,
            extra_args: Vec::new(),
        })
    }

    /// The election-timing flags of every replica.
    pub fn timing_flags(&self) -> [String; 3] {
        let timings = self.timings;
        [
            format!(
                "--leader-elect-lease-duration={}s",
                timings.lease_duration.as_secs()
            ),
            format!(
                "--leader-elect-renew-deadline={}ms",
                timings.renew_deadline.as_millis()
            ),
            format!(
                "--leader-elect-retry-period={}ms",
                timings.retry_period.as_millis()
            ),
        ]
    }

    /// Who runs which controller under which Lease, as the audit must judge it.
    pub fn governance(&self) -> Result<Governance> {
        let catalog = ControllerCatalog::standard();
        let load = |path: &Path| -> Result<MigrationConfig> {
            let bytes = std::fs::read(path)?;
            Ok(MigrationConfig::load(&path.display().to_string(), &bytes, &catalog)?.config)
        };
        Ok(Governance::default()
            .component(
                KUBE_CONTROLLER_MANAGER,
                KUBE_CONTROLLER_MANAGER,
                Some(&load(&self.kcm_config)?),
                &catalog,
            )
            .component(
                CLOUD_CONTROLLER_MANAGER,
                CLOUD_CONTROLLER_MANAGER,
                Some(&load(&self.ccm_config)?),
                &catalog,
            ))
    }
}

/// One replica process.
pub struct Replica {
    /// Its name in the harness (e.g. `kcm-1`).
    pub name: String,
    /// Its side.
    pub side: Side,
    child: Child,
    log: PathBuf,
    identity: Option<String>,
    exit: Option<ExitStatus>,
}

impl Replica {
    /// Starts a replica: the N side plays kube-controller-manager (without the cloud-node controller, which
    /// kube-controller-manager never had), the N+1 side cloud-controller-manager.
    pub fn start(environment: &Environment, name: &str, side: Side) -> Result<Replica> {
        Replica::start_with(environment, name, side, &[])
    }

    /// As [`Replica::start`], with more flags (later flags win).
    pub fn start_with(environment: &Environment, name: &str, side: Side, flags: &[&str]) -> Result<Replica> {
        let (config, extra): (&Path, &[&str]) = match side {
            Side::Kcm => (
                &environment.kcm_config,
                &[
                    "--leader-migration-component=kube-controller-manager",
                    "--leader-elect-resource-name=kube-controller-manager",
                    "--controllers=*,-cloud-node-controller",
                ],
            ),
            Side::Ccm => (&environment.ccm_config, &[]),
        };
        let mut args = vec![
            "--cloud-provider=fake".to_owned(),
            format!("--cloud-config={}", environment.cloud_config.display()),
            format!("--kubeconfig={}", environment.kubeconfig.display()),
            "--enable-leader-migration".to_owned(),
            format!("--leader-migration-config={}", config.display()),
        ];
        args.extend(environment.timing_flags());
        args.extend(
            [
                "--secure-port=0",
                "--node-monitor-period=500ms",
                "--route-reconciliation-period=1s",
                "--cluster-cidr=10.244.0.0/16",
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
            ]
            .iter()
            .chain(extra)
            .map(|&flag| flag.to_owned()),
        );
        args.extend(environment.extra_args.iter().cloned());
        args.extend(flags.iter().map(|&flag| flag.to_owned()));
        Replica::spawn(environment, name, side, &args)
    }

    /// Starts `environment.binary` with exactly `args` (e.g. a shipped manifest's), logging to the
    /// environment's log directory.
    pub fn spawn(environment: &Environment, name: &str, side: Side, args: &[String]) -> Result<Replica> {
        let log = environment.log_dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let child = Command::new(&environment.binary)
            .args(args)
            .env("RUST_LOG", "info,leadermigration=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .with_context(|| format!("start {}", environment.binary.display()))?;
        Ok(Replica {
            name: name.to_owned(),
            side,
            child,
            log,
            identity: None,
            exit: None,
        })
    }

    /// The process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The identity the replica reports at start (`<hostname>_<uuid>`), waiting up to `timeout` for it.
    pub fn identity(&mut self, timeout: Duration) -> Result<String> {
        if let Some(identity) = &self.identity {
            return Ok(identity.clone());
        }
        let deadline = Instant::now() + timeout;
        loop {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            if let Some(identity) = text
                .lines()
                .find_map(|line| line.split("identity=").nth(1))
                .and_then(|rest| rest.split_whitespace().next())
            {
                self.identity = Some(identity.to_owned());
                return Ok(identity.to_owned());
            }
            if let Some(status) = self.try_wait() {
                bail!(
                    "{} exited ({status}) before starting: {}",
                    self.name,
                    self.log_tail()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not report its identity in {timeout:?}: {}",
                    self.name,
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, signal: &str) -> Result<()> {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()?;
        if !status.success() {
            bail!("kill {signal} {} failed", self.name);
        }
        Ok(())
    }

    /// SIGTERM: a graceful stop (controllers stop, locks are released).
    pub fn terminate(&self) -> Result<()> {
        self.signal("-TERM")
    }

    /// SIGKILL: a crash.
    pub fn kill(&self) -> Result<()> {
        self.signal("-KILL")
    }

    /// The exit status, if it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    /// Waits for the process to exit.
    pub fn wait(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not exit within {timeout:?}: {}",
                    self.name,
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The last lines of its log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if self.try_wait().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The API server's admin API, over HTTP(S), through a kube client.
#[derive(Clone)]
pub struct Admin {
    client: kube::Client,
}

impl Admin {
    /// An admin client for the server `client` talks to.
    pub fn new(client: kube::Client) -> Admin {
        Admin { client }
    }

    async fn lines<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<Vec<T>> {
        let request = http::Request::get(path).body(Vec::new())?;
        let text = self
            .client
            .request_text(request)
            .await
            .with_context(|| format!("GET {path}"))?;
        text.lines()
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l).with_context(|| format!("a record of {path}")))
            .collect()
    }

    /// Every Lease write so far.
    pub async fn leases(&self) -> Result<Vec<LeaseWrite>> {
        self.lines("/_admin/leases").await
    }

    /// Every request so far.
    pub async fn requests(&self) -> Result<Vec<RequestEntry>> {
        self.lines("/_admin/requests").await
    }

    /// Adds a fault (`FaultSpec` JSON).
    pub async fn add_fault(&self, spec: serde_json::Value) -> Result<()> {
        let request = http::Request::post("/_admin/faults")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&spec)?)?;
        self.client.request_text(request).await?;
        Ok(())
    }
}

/// Current holders of the given Leases in `kube-system` (`None`: free or absent).
pub async fn holders(client: &kube::Client, leases: &[&str]) -> Result<BTreeMap<String, Option<String>>> {
    let api: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let mut holders = BTreeMap::new();
    for name in leases {
        let holder = api
            .get_opt(name)
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty());
        holders.insert((*name).to_owned(), holder);
    }
    Ok(holders)
}

/// Waits until `condition` holds for the current holders.
pub async fn wait_for_holders(
    client: &kube::Client,
    leases: &[&str],
    timeout: Duration,
    what: &str,
    mut condition: impl FnMut(&BTreeMap<String, Option<String>>) -> bool,
) -> Result<BTreeMap<String, Option<String>>> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let current = holders(client, leases).await?;
        if condition(&current) {
            return Ok(current);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}; holders: {current:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The cloud-node controller has initialised `node`: it no longer carries the uninitialized taint.
pub fn initialized(node: &k8s_openapi::api::core::v1::Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_none_or(|t| {
            t.iter()
                .all(|t| t.key != cloud_provider::names::TAINT_UNINITIALIZED)
        })
}

/// The service-lb controller has served `service`: its status has an ingress.
pub fn has_ingress(service: &k8s_openapi::api::core::v1::Service) -> bool {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}

/// Keeps the controllers busy: new nodes (each with a cloud instance, the uninitialized taint and a pod
/// CIDR) and LoadBalancer services, so that every controller writes throughout a migration.
#[derive(Clone)]
pub struct Workload {
    client: kube::Client,
    cloud: provider_fake::FakeCloudClient,
}

/// What a workload created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Created {
    /// Nodes.
    pub nodes: u32,
    /// LoadBalancer services.
    pub services: u32,
}

impl Workload {
    /// A workload writing through `client`, with instances in the fake cloud at `cloud_url`.
    pub fn new(client: kube::Client, cloud_url: &str) -> Workload {
        Workload {
            client,
            cloud: provider_fake::FakeCloudClient::new(cloud_url),
        }
    }

    /// Node `index`: its instance first, then the Node (Ready, uninitialized, with a pod CIDR).
    pub async fn add_node(&self, index: u32) -> Result<()> {
        use provider_fake::{AdminRequest, CloudRequest, CloudResponse, FakeInstance};
        let name = format!("node-{index}");
        if let CloudResponse::Error { message, .. } = self
            .cloud
            .call(&CloudRequest::Admin(AdminRequest::PutInstance(
                FakeInstance::running(&name, index),
            )))
            .await
        {
            bail!("cannot add instance {name}: {message}");
        }
        let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {
                "podCIDR": format!("10.244.{}.0/24", index % 256),
                "podCIDRs": [format!("10.244.{}.0/24", index % 256)],
                "taints": [{"key": cloud_provider::names::TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}],
            },
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                "addresses": [{"type": "Hostname", "address": name}],
            },
        }))?;
        Api::all(self.client.clone())
            .create(&Default::default(), &node)
            .await
            .with_context(|| format!("create node {index}"))?;
        Ok(())
    }

    /// LoadBalancer service `index` in `default`.
    pub async fn add_service(&self, index: u32) -> Result<()> {
        let service: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("web-{index}")},
            "spec": {"type": "LoadBalancer", "selector": {"app": format!("web-{index}")}, "ports": [{"port": 80, "targetPort": 8080}]},
        }))?;
        Api::namespaced(self.client.clone(), "default")
            .create(&Default::default(), &service)
            .await
            .with_context(|| format!("create service {index}"))?;
        Ok(())
    }

    /// Every `period`, adds a node and a service, until `stop`.
    pub fn churn(
        self,
        period: Duration,
        first: u32,
        stop: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<Result<Created>> {
        tokio::spawn(async move {
            let mut created = Created::default();
            let mut index = first;
            loop {
                self.add_node(index).await?;
                created.nodes += 1;
                self.add_service(index).await?;
                created.services += 1;
                index += 1;
                tokio::select! {
                    () = stop.cancelled() => return Ok(created),
                    () = tokio::time::sleep(period) => {}
                }
            }
        })
    }
}
