//! `ccm-demo demo`: a leader migration on one machine, with no cluster and no cloud account.
//!
//! The demo is its own binary, `ccm-demo`: the framework's command line (`kube-ccm-cli`) with the fake,
//! AWS and GCE providers and one more subcommand, so no shipped binary compiles the test API server, the
//! harness or the fake cloud (docs/decisions/0007). Without `demo` it runs the manager, which is what
//! each replica is.
//!
//! The test API server and the cloud run in this process (the fake cloud, or the Compute double for
//! `--cloud gce`; for `--cloud aws`, moto as a process behind a recording proxy here); every replica is a
//! process of this same binary. N replicas play kube-controller-manager with the N configuration; nodes (tainted uninitialized)
//! and LoadBalancer services are registered; then the control plane is rolled to N
//! cloud-controller-managers with the N+1 configuration, one replica at a time (a new one joins, an old one
//! leaves), as the seed guide does it. The timeline shows who holds which Lease and what it runs; the
//! verdict comes from the API server's own records (Lease history and request log) and the cloud's (its
//! changes with their callers), audited by `ccm-audit`, never from what the replicas say;
//! it also lists what the cloud holds at the end.

// The timeline and the verdict on stdout are what this command is for.
#![allow(clippy::print_stdout)]

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ccm_audit::{AuditReport, audit};
use control_plane::{ApiServer, Backend};
use futures::StreamExt as _;
use harness::{Created, Environment, Inventory, Replica, Side, Timings};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::Api;
use kube::runtime::watcher;
use kube_ccm_leadermigration::{
    CLOUD_CONTROLLER_MANAGER, ControllerSelection, KUBE_CONTROLLER_MANAGER, MigrationConfig, PlanInput, plan,
};
use kube_ccm_runtime::ControllerRegistry;
use tokio_util::sync::CancellationToken;

use kube_ccm_cli::chart::{Chart, Mark};

mod cloud;
mod peers;
mod report;
mod roll;

use self::cloud::DemoCloud;
use self::peers::From;
use self::report::{report_chart, show};
use self::roll::{Migrated, migrate};

/// The demo's binary: `registry`'s command line with `demo` added; a deliberately broken manager
/// (`broken-ccm`, the negative controls) calls it with its own registry.
pub fn main(registry: kube_ccm_runtime::Registry) -> ExitCode {
    use clap::FromArgMatches as _;
    // After `augment_args`, which would set the about text from `Args`' doc comment.
    let command = <Args as clap::Args>::augment_args(clap::Command::new("demo")).about(
        "Run a leader migration on this machine: a test API server, a fake cloud, and replicas of this binary rolled from kube-controller-manager to cloud-controller-manager",
    );
    kube_ccm_cli::for_demo::main_with(
        registry,
        Some(kube_ccm_cli::for_demo::Extension {
            command,
            run: |matches, registry| {
                let args =
                    Args::from_arg_matches(matches).map_err(|error| anyhow::anyhow!("demo: {error}"))?;
                run(&args, registry.controllers())
            },
        }),
    )
}

const MIGRATION_LEASE: &str = "cloud-provider-extraction-migration";
const LEASES: [&str; 3] = [KUBE_CONTROLLER_MANAGER, CLOUD_CONTROLLER_MANAGER, MIGRATION_LEASE];
/// The N side's `--controllers` (kube-controller-manager never had the cloud-node controller).
const KCM_CONTROLLERS: [&str; 2] = ["*", "-cloud-node-controller"];

/// `demo`'s flags.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Control-plane replicas on each side of the migration.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=9))]
    replicas: u32,
    /// Nodes to register (each with a cloud instance and the uninitialized taint).
    #[arg(long, default_value_t = 6)]
    nodes: u32,
    /// LoadBalancer services to create.
    #[arg(long, default_value_t = 2)]
    services: u32,
    /// Stop the old replicas with SIGKILL (a crash) instead of SIGTERM.
    #[arg(long)]
    crash: bool,
    /// How long each configuration of the control plane runs before the next step, while new nodes and
    /// services keep arriving.
    #[arg(long, default_value_t = 1.0)]
    dwell_seconds: f64,
    /// Lease duration in whole seconds (renew deadline: half; retry period: a tenth). Short, so the demo
    /// is quick.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=60))]
    lease_seconds: u64,
    /// Roll half-way to N+1 (until a cloud-controller-manager leads the migration lock), then back to N,
    /// one replica at a time; judged like the forward migration, ending with kube-controller-manager leading.
    #[arg(long)]
    rollback: bool,
    /// Also draw the tenures of every Lease per process, the hand-off gaps, the joins and stops, and the
    /// verdict, as an SVG file.
    #[arg(long, value_name = "FILE.svg")]
    report: Option<std::path::PathBuf>,
    /// The cloud the managers run against: `fake` (a fake cloud in this process), `aws` (the AWS provider
    /// against moto, an AWS emulator, installed on first use into a Python environment under the target
    /// directory), or `gce` (the GCE provider against a Compute Engine test double in this process).
    #[arg(long, default_value = "fake", value_parser = ["fake", "aws", "gce"])]
    cloud: String,
    /// The API server: `test` (this repository's test API server, in this process; starts in milliseconds)
    /// or `kube` (a real kube-apiserver on etcd, built by `cargo xtask kube`; the verdict is judged from
    /// its audit log).
    #[arg(long, default_value = "test", value_parser = ["test", "kube"])]
    apiserver: String,
    /// Who the control plane migrates from: `ours` (replicas of this binary playing
    /// kube-controller-manager with the N configuration), `kcm` (the real kube-controller-manager of the
    /// pinned release, the seed guide's procedure; since v1.31 it runs no cloud controller) or `go-ccm`
    /// (upstream's Go cloud-controller-manager with a `fake` provider on the same cloud, replaced one
    /// replica at a time). `kcm` and `go-ccm` need `--apiserver kube` and `--cloud fake` (`cargo xtask
    /// kube` builds them).
    #[arg(long, default_value = "ours", value_parser = ["ours", "kcm", "go-ccm"])]
    from: String,
    /// `text`: a live timeline, then the verdict; `json`: only the result, as JSON.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    output: String,
}

/// Runs the demo with replicas of this binary, whose controllers `controllers` are; exit 0 on an "ok"
/// verdict, 1 on "fail".
fn run(args: &Args, controllers: &ControllerRegistry) -> Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    runtime.block_on(demo(args, controllers))
}

/// Prints timeline lines (text mode), each stamped with the time since the start.
#[derive(Clone)]
struct Timeline {
    started: Instant,
    live: bool,
}

impl Timeline {
    fn say(&self, line: &str) {
        if self.live {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{:>7.2}s  {line}", self.started.elapsed().as_secs_f64());
            let _ = out.flush();
        }
    }
}

/// Replica names by identity, filled in as replicas report theirs.
#[derive(Clone, Default)]
struct Names(Arc<Mutex<HashMap<String, (String, Side)>>>);

impl Names {
    fn add(&self, replica: &mut Replica, timeout: Duration) -> Result<String> {
        let identity = replica.identity(timeout)?;
        self.0
            .lock()
            .insert(identity.clone(), (replica.name.clone(), replica.side));
        Ok(identity)
    }

    fn get(&self, identity: &str) -> Option<(String, Side)> {
        self.0.lock().get(identity).cloned()
    }

    fn identity_of(&self, name: &str) -> Option<String> {
        self.0
            .lock()
            .iter()
            .find(|(_, (n, _))| n == name)
            .map(|(identity, _)| identity.clone())
    }

    /// Registers the identity a Go replica has reported (once it led); `None` while it has not.
    fn learn(&self, replica: &mut Replica) -> Option<String> {
        let identity = replica.reported_identity()?;
        self.0
            .lock()
            .insert(identity.clone(), (replica.name.clone(), replica.side));
        Some(identity)
    }

    fn name(&self, identity: &str) -> String {
        self.get(identity)
            .map_or_else(|| identity.to_owned(), |(name, _)| name)
    }
}

/// Which controllers each side runs under each Lease (from the same plan the manager starts with).
struct Roles {
    by_side_and_lease: HashMap<(Side, String), Vec<String>>,
}

impl Roles {
    fn new(environment: &Environment, controllers: &ControllerRegistry, from: From) -> Result<Roles> {
        let catalog = controllers.catalog();
        let load = |path: &std::path::Path| -> Result<MigrationConfig> {
            let bytes = std::fs::read(path)?;
            Ok(MigrationConfig::load(&path.display().to_string(), &bytes, catalog)?.config)
        };
        let mut by_side_and_lease: HashMap<(Side, String), Vec<String>> = HashMap::new();
        let old_side = match from {
            // This binary as kube-controller-manager: its N plan.
            From::Ours => Some((
                Side::Kcm,
                load(&environment.kcm_config)?,
                &KCM_CONTROLLERS[..],
                KUBE_CONTROLLER_MANAGER,
            )),
            // The real one runs no cloud controller.
            From::Kcm => None,
            // Upstream's cloud-controller-manager: the N+1 plan, as ours.
            From::GoCcm => Some((
                Side::Kcm,
                load(&environment.ccm_config)?,
                &["*"][..],
                CLOUD_CONTROLLER_MANAGER,
            )),
        };
        for (side, config, controllers, component) in old_side.into_iter().chain([(
            Side::Ccm,
            load(&environment.ccm_config)?,
            &["*"][..],
            CLOUD_CONTROLLER_MANAGER,
        )]) {
            let selection = ControllerSelection::parse(controllers, catalog)?;
            let placements = plan(PlanInput {
                component,
                main_lease: component,
                migration: Some(&config),
                selection: &selection,
                catalog,
            });
            for planned in placements {
                if let Some(lease) = planned.placement.lease() {
                    by_side_and_lease
                        .entry((side, lease.to_owned()))
                        .or_default()
                        .push(planned.controller.as_str().to_owned());
                }
            }
        }
        Ok(Roles { by_side_and_lease })
    }

    fn runs(&self, side: Side, lease: &str) -> String {
        self.by_side_and_lease
            .get(&(side, lease.to_owned()))
            .map_or_else(|| "no cloud controller".to_owned(), |c| c.join(", "))
    }
}

/// `leader-migration status`'s word on where the migrated controllers run, on the timeline: with the
/// real kube-controller-manager holding the migration Lease, they run nowhere, and it says what to do.
async fn say_status(client: &kube::Client, migration: &MigrationConfig, timeline: &Timeline) {
    let conditions = kube_ccm_cli::for_demo::conditions_now(client, "kube-system", migration).await;
    match conditions {
        Ok(conditions) => {
            for condition in conditions.iter().filter(|c| {
                c.kind == "MigrationLocksOnCloudSide" || c.kind == "KubeControllerManagerExternal"
            }) {
                timeline.say(&format!(
                    "leader-migration status: {} {} ({}): {}",
                    condition.kind, condition.status, condition.reason, condition.message
                ));
            }
        }
        Err(error) => timeline.say(&format!("leader-migration status: cannot assess: {error:#}")),
    }
}

/// What the cluster shows: initialised nodes and services with an ingress.
async fn progress(client: &kube::Client) -> Result<(usize, usize)> {
    let nodes: Vec<Node> = Api::all(client.clone()).list(&Default::default()).await?.items;
    let initialized = nodes.iter().filter(|n| harness::initialized(n)).count();
    let services: Vec<Service> = Api::namespaced(client.clone(), "default")
        .list(&Default::default())
        .await?
        .items;
    let with_ingress = services.iter().filter(|s| harness::has_ingress(s)).count();
    Ok((initialized, with_ingress))
}

/// Reports every change of Lease holder (from a watch) and of progress (polled) on the timeline until
/// `stop`.
fn follow(
    client: kube::Client,
    timeline: Timeline,
    names: Names,
    roles: Arc<Roles>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
        let mut changes = std::pin::pin!(watcher(leases, watcher::Config::default()));
        let mut holders: BTreeMap<String, Option<String>> = BTreeMap::new();
        let mut last_progress = (usize::MAX, usize::MAX);
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {
                    if let Ok(now) = progress(&client).await
                        && now != last_progress
                    {
                        last_progress = now;
                        timeline.say(&format!(
                            "cluster: {} node(s) initialised, {} service(s) with a load balancer",
                            now.0, now.1
                        ));
                    }
                }
                event = changes.next() => {
                    let Some(Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease))) = event else {
                        continue;
                    };
                    let name = lease.metadata.name.clone().unwrap_or_default();
                    let holder = lease
                        .spec
                        .and_then(|s| s.holder_identity)
                        .filter(|h| !h.is_empty());
                    if holders.get(&name) == Some(&holder) {
                        continue;
                    }
                    match &holder {
                        Some(identity) => {
                            let (who, runs) = names.get(identity).map_or_else(
                                || (identity.clone(), "(a process not of this binary, or not yet named)".to_owned()),
                                |(who, side)| (who, roles.runs(side, &name)),
                            );
                            timeline.say(&format!("lease {name:<36} → {who:<6} runs {runs}"));
                        }
                        None => timeline.say(&format!("lease {name:<36} → released")),
                    }
                    holders.insert(name, holder);
                }
            }
        }
    })
}

async fn demo(args: &Args, controllers: &ControllerRegistry) -> Result<ExitCode> {
    if let Some(path) = &args.report {
        Chart::check_destination(path)?;
    }
    let from = from_of(args)?;
    let timeline = Timeline {
        started: Instant::now(),
        live: args.output == "text",
    };
    let stop_how = if args.crash { "SIGKILL" } else { "SIGTERM" };
    timeline.say(&format!(
        "leader migration demo: {n} {} → {n} of this cloud-controller-manager (N+1), old replicas stopped with {stop_how}",
        from.old_side(),
        n = args.replicas
    ));
    let mut stage = Stage::set_up(args, from, &timeline, controllers).await?;
    let (migrated, migration_ended_us) = stage.migrate(args, controllers, &timeline).await?;
    let (outcome, all_handoffs, marks) = stage.judge(args, migrated, migration_ended_us).await?;
    show(args, &timeline, &stage.names, &outcome);
    if let Some(path) = &args.report {
        let chart = report_chart(
            args,
            &stage.names,
            &outcome,
            &all_handoffs,
            marks,
            harness::now_us(),
        );
        chart.write(path)?;
        if args.output == "text" {
            println!("report: {}", path.display());
        }
    }
    Ok(if outcome.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Where the old side comes from, or why these arguments cannot work together.
fn from_of(args: &Args) -> Result<From> {
    let from = From::parse(&args.from);
    if from != From::Ours {
        if args.apiserver != "kube" {
            bail!(
                "--from {}: the Go programs run on the real API server: add --apiserver kube",
                args.from
            );
        }
        if args.cloud != "fake" {
            bail!(
                "--from {}: upstream's Go programs here act on the fake cloud only: use --cloud fake",
                args.from
            );
        }
    }
    if from == From::Kcm && args.rollback {
        bail!(
            "--from kcm --rollback: kube-controller-manager v1.31 and later has no cloud controller, so a rollback to it leaves them running nowhere (`leader-migration status` says HeldByExternalKubeControllerManager); roll back to --from ours or go-ccm instead"
        );
    }
    Ok(from)
}

/// The demo's world: the API server, the cloud, the replicas' environment, and who is who.
struct Stage {
    from: From,
    server: ApiServer,
    peers: Option<peers::Peers>,
    cloud: DemoCloud,
    /// The replicas' working directory, kept (taken out) when the migration fails.
    directory: Option<tempfile::TempDir>,
    environment: Environment,
    roles: Arc<Roles>,
    client: kube::Client,
    names: Names,
    /// The longest wait for a replica or a hand-off.
    wait: Duration,
}

impl Stage {
    /// Starts the API server and the cloud, and prepares the replicas' environment.
    async fn set_up(
        args: &Args,
        from: From,
        timeline: &Timeline,
        controllers: &ControllerRegistry,
    ) -> Result<Stage> {
        let backend = if args.apiserver == "kube" {
            Backend::Kube
        } else {
            Backend::Test
        };
        let server = ApiServer::start(backend).await.map_err(|error| match error {
            control_plane::Error::Unavailable(why) => anyhow::anyhow!(
                "--apiserver kube: {why} (kube-apiserver and etcd are built from their Go modules by `cargo xtask kube` in this repository)"
            ),
            other => anyhow::anyhow!("start the API server: {other}"),
        })?;
        let peers = match from {
            From::Ours => None,
            From::Kcm | From::GoCcm => Some(peers::Peers::find(&server)?),
        };
        let cloud = DemoCloud::start(&args.cloud, timeline).await?;
        let directory = tempfile::Builder::new()
            .prefix("ccm-demo-")
            .tempdir()
            .context("create a working directory")?;
        let lease = Duration::from_secs(args.lease_seconds);
        let environment = Environment::prepare_for(
            directory.path(),
            std::env::current_exe().context("find this binary")?,
            server.kubeconfig_path().to_owned(),
            &cloud.cloud,
            Timings {
                lease_duration: lease,
                renew_deadline: lease / 2,
                retry_period: lease / 10,
            },
        )?;
        let apiserver = match &server {
            ApiServer::Test(_) => "test API server".to_owned(),
            ApiServer::Kube(kube) => format!(
                "kube-apiserver {} on etcd {}",
                kube.version(),
                kube.binaries().etcd_version
            ),
        };
        timeline.say(&format!(
            "{apiserver} {} · {} · replica logs in {}",
            server.url(),
            cloud.description,
            environment.log_dir.display()
        ));
        let roles = Arc::new(Roles::new(&environment, controllers, from)?);
        let client = server.client();
        Ok(Stage {
            from,
            server,
            peers,
            cloud,
            directory: Some(directory),
            environment,
            roles,
            client,
            names: Names::default(),
            wait: lease * 15,
        })
    }

    /// Rolls the replicas while the timeline follows the Leases, then stops every replica, so the audit
    /// sees every tenure end. Also gives when the migration ended (the last Lease write before the stop).
    async fn migrate(
        &mut self,
        args: &Args,
        controllers: &ControllerRegistry,
        timeline: &Timeline,
    ) -> Result<(Migrated, Option<i64>)> {
        let stop_following = CancellationToken::new();
        let follower = follow(
            self.client.clone(),
            timeline.clone(),
            self.names.clone(),
            self.roles.clone(),
            stop_following.clone(),
        );
        let migration = {
            let path = &self.environment.ccm_config;
            let bytes = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
            MigrationConfig::load(&path.display().to_string(), &bytes, controllers.catalog())?.config
        };
        let outcome = migrate(
            args,
            self.from,
            self.peers.as_ref(),
            &migration,
            &self.environment,
            &self.client,
            &self.cloud.cloud,
            &self.names,
            timeline,
            self.wait,
        )
        .await;
        stop_following.cancel();
        let _ = follower.await;
        let mut migrated = match outcome {
            Ok(migrated) => migrated,
            Err(error) => {
                let kept = self
                    .directory
                    .take()
                    .map(tempfile::TempDir::keep)
                    .unwrap_or_default();
                bail!(
                    "{error:#}\n(replica logs kept in {})",
                    kept.join("logs").display()
                );
            }
        };
        // Stop the side in charge too. Its standbys may take a lease over for a moment while the leader
        // stops: the audit judges those writes, the report of hand-offs ends where the migration did.
        let migration_ended_us = self.server.lease_writes().iter().map(|w| w.time_us).max();
        migrated.marks.push(Mark {
            at_us: harness::now_us(),
            label: "every replica stopped (SIGTERM)".to_owned(),
        });
        for replica in &mut migrated.replicas {
            if replica.try_wait().is_none() {
                replica.terminate()?;
            }
        }
        for replica in &mut migrated.replicas {
            replica.wait(self.wait)?;
        }
        Ok((migrated, migration_ended_us))
    }

    /// Judges the migration from the API server's records and the cloud's: the audit, the hand-offs up to
    /// the migration's end, and what the cluster and the cloud hold.
    async fn judge(
        &self,
        args: &Args,
        migrated: Migrated,
        migration_ended_us: Option<i64>,
    ) -> Result<(Outcome, Vec<ccm_audit::Handoff>, Vec<Mark>)> {
        let Migrated {
            registered, marks, ..
        } = migrated;
        let names = &self.names;
        let mut requests = self.server.request_entries();
        let invalid_writes = harness::refused_as_invalid(&requests).len();
        let cloud = &self.cloud.cloud;
        let cloud_writes = cloud
            .writes()
            .await
            .context("read the cloud's record of changes")?;
        requests.extend(cloud_writes.attributed.iter().cloned());
        let inventory = cloud.inventory().await.context("list what the cloud holds")?;
        let expecting = self.from.expecting(self.environment.governance()?);
        let mut report = audit(&self.server.lease_writes(), &requests, &expecting);
        let ended_on = |end: i64| {
            report
                .tenures
                .iter()
                .filter(|t| t.lease == MIGRATION_LEASE && t.start_us <= end)
                .max_by_key(|t| t.start_us)
                .and_then(|t| names.get(&t.identity))
                .map(|(_, side)| side)
        };
        let migration_lease_ends_with = migration_ended_us.and_then(ended_on);
        let all_handoffs = report.handoffs.clone();
        report
            .handoffs
            .retain(|h| migration_ended_us.is_some_and(|end| h.at_us <= end));
        let (nodes_initialized, services_with_ingress) = progress(&self.client).await?;
        let outcome = Outcome {
            migrated: report.handoffs.iter().any(|h| {
                h.lease == MIGRATION_LEASE && names.get(&h.to).is_some_and(|(_, side)| side == Side::Ccm)
            }),
            rollback: args.rollback,
            migration_lease_ends_with,
            report,
            registered,
            nodes_initialized,
            services_with_ingress,
            invalid_writes,
            cloud_writes: cloud_writes.attributed.len(),
            unattributed_cloud_writes: cloud_writes.unattributed,
            inventory,
            apiserver: self.server.describe(),
            from: self.from.describe(self.peers.as_ref()),
            judged_from: match &self.server {
                ApiServer::Test(_) => "the test API server's Lease history and request log".to_owned(),
                ApiServer::Kube(kube) => format!("kube-apiserver {}'s audit log", kube.version()),
            },
        };
        Ok((outcome, all_handoffs, marks))
    }
}

/// What the demo found.
struct Outcome {
    report: AuditReport,
    /// A cloud-controller-manager took the migration lock over.
    migrated: bool,
    /// `--rollback`: the migration lock must end with kube-controller-manager.
    rollback: bool,
    /// The side whose replica held the migration lock last before the final stop.
    migration_lease_ends_with: Option<Side>,
    registered: Created,
    nodes_initialized: usize,
    services_with_ingress: usize,
    /// Managers' writes the API server refused as invalid (a real one would refuse them too).
    invalid_writes: usize,
    /// The cloud's changes attributed to a manager's controller, judged with the API server's writes.
    cloud_writes: usize,
    /// The cloud's changes whose requests named no manager's controller (none may be: the audit could not
    /// judge them).
    unattributed_cloud_writes: Vec<String>,
    /// What the cloud holds at the end.
    inventory: Inventory,
    /// The API server it ran on: `{"kind": "test"|"kube-apiserver", "version": …}`.
    apiserver: serde_json::Value,
    /// The record the verdict was judged from.
    judged_from: String,
    /// Who the control plane migrated from: `{"kind": "ours"|"kube-controller-manager"|
    /// "go-cloud-controller-manager", "version": …}`.
    from: serde_json::Value,
}

impl Outcome {
    /// The verdict: no overlap in a run that had writes to judge (every cloud change attributed), the
    /// migration done (and with `--rollback` undone), the work finished with one load balancer per service
    /// in the cloud (none orphaned, none missing), and nothing written that the API server refused as
    /// invalid.
    fn ok(&self) -> bool {
        let expected_end = if self.rollback { Side::Kcm } else { Side::Ccm };
        self.invalid_writes == 0
            && self.unattributed_cloud_writes.is_empty()
            && self.inventory.load_balancers.len() == self.registered.services as usize
            && self.report.overlaps.is_empty()
            && self.report.writes_checked > 0
            && self.migrated
            && self.migration_lease_ends_with == Some(expected_end)
            && (self.nodes_initialized, self.services_with_ingress)
                == (self.registered.nodes as usize, self.registered.services as usize)
    }
}

#[cfg(test)]
mod tests;
