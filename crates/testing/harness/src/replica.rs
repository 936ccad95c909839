//! Replicas: processes of the `cloud-controller-manager` binary playing either side of a migration.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ccm_audit::Governance;
use kube_ccm_leadermigration::{CLOUD_CONTROLLER_MANAGER, KUBE_CONTROLLER_MANAGER, MigrationConfig};
use kube_ccm_runtime::ControllerRegistry;

use crate::Cloud;

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
    /// `--leader-elect-lease-duration`, `--leader-elect-renew-deadline`, `--leader-elect-retry-period` (the
    /// Rust manager's and upstream's alike).
    pub fn flags(self) -> [String; 3] {
        [
            format!("--leader-elect-lease-duration={}s", self.lease_duration.as_secs()),
            format!(
                "--leader-elect-renew-deadline={}ms",
                self.renew_deadline.as_millis()
            ),
            format!("--leader-elect-retry-period={}ms", self.retry_period.as_millis()),
        ]
    }

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
    /// `--cloud-provider`.
    pub cloud_provider: String,
    /// The provider's cloud-config (pointing at the shared cloud).
    pub cloud_config: PathBuf,
    /// The provider's environment (credentials, metadata server).
    pub cloud_environment: Vec<(String, String)>,
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
        Environment::prepare_for(dir, binary, kubeconfig, &Cloud::fake(cloud_url), timings)
    }

    /// As [`Environment::prepare`], for replicas managing `cloud`.
    pub fn prepare_for(
        dir: &Path,
        binary: PathBuf,
        kubeconfig: PathBuf,
        cloud: &Cloud,
        timings: Timings,
    ) -> Result<Environment> {
        let kcm_config = dir.join("leadermigration-n.yaml");
        let ccm_config = dir.join("leadermigration-n-plus-1.yaml");
        std::fs::write(
            &kcm_config,
            include_str!("../../../../examples/leader-migration/n.yaml"),
        )?;
        std::fs::write(
            &ccm_config,
            include_str!("../../../../examples/leader-migration/n-plus-1.yaml"),
        )?;
        let cloud_config = dir.join("cloud.conf");
        std::fs::write(&cloud_config, cloud.cloud_config())?;
        let log_dir = dir.join("logs");
        std::fs::create_dir_all(&log_dir)?;
        Ok(Environment {
            binary,
            kubeconfig,
            cloud_provider: cloud.provider().to_owned(),
            cloud_config,
            cloud_environment: cloud.environment(),
            kcm_config,
            ccm_config,
            log_dir,
            timings,
            extra_args: Vec::new(),
        })
    }

    /// The election-timing flags of every replica.
    pub fn timing_flags(&self) -> [String; 3] {
        self.timings.flags()
    }

    /// The flags of upstream's Go cloud-controller-manager (the Go peer `cargo xtask kube` builds) on the
    /// N+1 side of this environment's migration: its cloud, kubeconfig, configuration, timings and CIDRs,
    /// as this framework's replicas have them. Flags given after these win.
    pub fn go_ccm_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--cloud-provider={}", self.cloud_provider),
            format!("--cloud-config={}", self.cloud_config.display()),
            format!("--kubeconfig={}", self.kubeconfig.display()),
            "--enable-leader-migration".to_owned(),
            format!("--leader-migration-config={}", self.ccm_config.display()),
            "--secure-port=0".to_owned(),
            "--node-monitor-period=1s".to_owned(),
            "--route-reconciliation-period=1s".to_owned(),
            "--allocate-node-cidrs=true".to_owned(),
            "--cluster-cidr=10.244.0.0/16".to_owned(),
            "--kube-api-qps=500".to_owned(),
            "--kube-api-burst=1000".to_owned(),
        ];
        args.extend(self.timing_flags());
        args
    }

    /// Who runs which controller under which Lease, as the audit must judge it (the replicas run the
    /// framework's built-in controllers).
    pub fn governance(&self) -> Result<Governance> {
        let registry = ControllerRegistry::builtin();
        let catalog = registry.catalog();
        let load = |path: &Path| -> Result<MigrationConfig> {
            let bytes = std::fs::read(path)?;
            Ok(MigrationConfig::load(&path.display().to_string(), &bytes, catalog)?.config)
        };
        Ok(crate::expecting_judges(Governance::default())
            .component(
                KUBE_CONTROLLER_MANAGER,
                KUBE_CONTROLLER_MANAGER,
                Some(&load(&self.kcm_config)?),
                catalog,
            )
            .component(
                CLOUD_CONTROLLER_MANAGER,
                CLOUD_CONTROLLER_MANAGER,
                Some(&load(&self.ccm_config)?),
                catalog,
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
    started: Instant,
}

impl Replica {
    /// Starts a replica: the N side plays kube-controller-manager (without the cloud-node controller, which
    /// kube-controller-manager never had), the N+1 side cloud-controller-manager.
    pub fn start(environment: &Environment, name: &str, side: Side) -> Result<Replica> {
        Replica::start_with(environment, name, side, &[])
    }

    /// As [`Replica::start`], with more flags (later flags win).
    pub fn start_with(environment: &Environment, name: &str, side: Side, flags: &[&str]) -> Result<Replica> {
        Replica::start_wrapped(environment, name, side, flags, &[])
    }

    /// As [`Replica::start_with`], run through `wrapper` (e.g. `ip netns exec NAME`, which execs the
    /// binary, so the process is still the replica's).
    pub fn start_wrapped(
        environment: &Environment,
        name: &str,
        side: Side,
        flags: &[&str],
        wrapper: &[String],
    ) -> Result<Replica> {
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
            format!("--cloud-provider={}", environment.cloud_provider),
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
        Replica::spawn_wrapped(environment, name, side, &args, wrapper)
    }

    /// Starts `environment.binary` with exactly `args` (e.g. a shipped manifest's), logging to the
    /// environment's log directory.
    pub fn spawn(environment: &Environment, name: &str, side: Side, args: &[String]) -> Result<Replica> {
        Replica::spawn_wrapped(environment, name, side, args, &[])
    }

    /// As [`Replica::spawn`], run through `wrapper` (see [`Replica::start_wrapped`]).
    pub fn spawn_wrapped(
        environment: &Environment,
        name: &str,
        side: Side,
        args: &[String],
        wrapper: &[String],
    ) -> Result<Replica> {
        let log = environment.log_dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let mut command = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut command = Command::new(program);
                command.args(rest).arg(&environment.binary);
                command
            }
            None => Command::new(&environment.binary),
        };
        let child = command
            .args(args)
            .envs(environment.cloud_environment.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "info,kube_ccm_leadermigration=debug")
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
            started: Instant::now(),
        })
    }

    /// How long ago it was started.
    pub fn age(&self) -> Duration {
        self.started.elapsed()
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
            if let Some(identity) = self.reported_identity() {
                return Ok(identity);
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

    /// The identity, if the replica has reported it yet (`identity=…` in its log, quoted or not: a Go
    /// peer logs it once it leads).
    pub fn reported_identity(&mut self) -> Option<String> {
        if self.identity.is_none() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            self.identity = text
                .lines()
                .find_map(|line| line.split("identity=").nth(1))
                .and_then(|rest| rest.split_whitespace().next())
                .map(|identity| identity.trim_matches('"').to_owned());
        }
        self.identity.clone()
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

    /// SIGSTOP: the process freezes (a long GC pause, a stalled VM), its locks run out meanwhile.
    pub fn pause(&self) -> Result<()> {
        self.signal("-STOP")
    }

    /// SIGCONT: the frozen process goes on, finding its locks expired.
    pub fn resume(&self) -> Result<()> {
        self.signal("-CONT")
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

    /// Its log (stderr).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last lines of its log, for error messages.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }
}

/// The last 15 lines of the log at `path` (empty when unreadable).
pub(crate) fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

impl Drop for Replica {
    fn drop(&mut self) {
        if self.try_wait().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
