//! The manager: which controllers run, under which lock, and their lifecycle.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use cloud_provider::{CloudError, CloudProvider, InitializeContext};
use leadermigration::audit::LEADER_ELECTION;
use leadermigration::elector::{LeaderState, Role};
use leadermigration::scopes::{
    ElectionSettings, ScopeContext, ScopeKind, ScopeRunner, ScopeSpec, ScopesConfig, ScopesError, run_scopes,
};
use leadermigration::{ControllerName, Lock, Placement, PlanInput, plan};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::client::{ClientFactory, Fence};
use crate::config::{ControllerSettings, ManagerConfig};
use crate::controllers::{self, ControllerContext};
use crate::health::Health;
use crate::informers::Informers;
use crate::metrics::{ControllerLabels, LeaseLabels, Metrics};

/// A controller, where it runs for this manager, and why it will not run when it will not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedController {
    /// Placement by leader migration and `--controllers`.
    pub placement: Placement,
    /// Set when the controller would run here but cannot (its capability is missing, a setting is off).
    pub skipped: Option<String>,
}

impl PlannedController {
    /// Whether it starts when its lock is held.
    pub fn runs(&self) -> bool {
        matches!(self.placement.lock, Lock::Main | Lock::Migration) && self.skipped.is_none()
    }
}

/// Why the manager stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// A client could not be built from the configuration.
    #[error("cannot build a Kubernetes client: {0}")]
    Client(#[source] crate::client::ClientError),
    /// The provider's `initialize` failed.
    #[error("cloud provider initialization failed: {0}")]
    Initialize(#[source] CloudError),
    /// A migration Lease is the main Lease.
    #[error(
        "leader migration lease {0:?} is also the main lease (--leader-elect-resource-name); they must differ"
    )]
    LeaseClash(String),
    /// Leader election ended (a lock was lost, or controllers did not stop in time).
    #[error(transparent)]
    Scopes(#[from] ScopesError),
}

/// A runnable cloud-controller-manager.
pub struct Manager {
    config: ManagerConfig,
    provider: Arc<dyn CloudProvider>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
}

impl Manager {
    /// A manager for `provider`.
    pub fn new(config: ManagerConfig, provider: Arc<dyn CloudProvider>) -> Result<Manager, ManagerError> {
        if let (Some(election), Some(migration)) = (&config.leader_election, &config.migration)
            && let Some(lock) = migration
                .locks()
                .iter()
                .find(|l| l.lease_name == election.main_lease)
        {
            return Err(ManagerError::LeaseClash(lock.lease_name.clone()));
        }
        Ok(Manager {
            config,
            provider,
            health: Arc::new(Health::default()),
            metrics: Arc::new(Metrics::new()),
        })
    }

    /// Health and readiness checks (for `/healthz`, `/readyz`).
    pub fn health(&self) -> Arc<Health> {
        self.health.clone()
    }

    /// Metrics (for `/metrics`).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Where each controller of the binary runs for this manager, with skip reasons.
    pub fn plan(&self) -> Vec<PlannedController> {
        let config = &self.config;
        let main_lease = config
            .leader_election
            .as_ref()
            .map_or(config.component.as_str(), |e| e.main_lease.as_str());
        // Without leader election there is no migration (upstream): everything enabled runs.
        let migration = config.leader_election.as_ref().and(config.migration.as_ref());
        plan(PlanInput {
            component: &config.component,
            main_lease,
            migration,
            selection: &config.selection,
            catalog: &config.catalog,
        })
        .into_iter()
        .map(|placement| {
            let skipped = match (placement.lock, placement.controller.cloud_controller()) {
                (Lock::Main | Lock::Migration, Some(controller)) => {
                    controllers::skip_reason(controller, self.provider.as_ref(), &config.controllers)
                }
                (Lock::Main | Lock::Migration, None) => {
                    Some("no implementation is registered for this controller".to_owned())
                }
                _ => None,
            };
            PlannedController { placement, skipped }
        })
        .collect()
    }

    /// Runs until `shutdown` fires (`Ok`) or leadership is lost (`Err`, and the process should exit non-zero).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), ManagerError> {
        let planned = self.plan();
        for controller in &planned {
            match (&controller.skipped, controller.placement.lock) {
                (Some(reason), _) => {
                    tracing::warn!(controller = %controller.placement.controller, %reason, "skipping controller")
                }
                (None, Lock::Disabled) => {
                    tracing::info!(controller = %controller.placement.controller, "controller disabled by --controllers")
                }
                (None, Lock::None) => {
                    tracing::info!(controller = %controller.placement.controller, owner = controller.placement.owner.as_deref().unwrap_or_default(), "controller owned by another component")
                }
                _ => {}
            }
        }
        let stopping = shutdown.clone();
        self.health.add_readiness_check("shutdown", move || {
            if stopping.is_cancelled() {
                Err("shutting down".to_owned())
            } else {
                Ok(())
            }
        });

        let clients = &self.config.clients;
        let provider_client = clients
            .client(self.provider.provider_name(), None)
            .map_err(ManagerError::Client)?;
        self.provider
            .initialize(InitializeContext {
                client: provider_client,
                shutdown: shutdown.clone(),
            })
            .await
            .map_err(ManagerError::Initialize)?;
        let informers = Informers::new(
            clients
                .client("shared-informers", None)
                .map_err(ManagerError::Client)?,
            shutdown.clone(),
        );
        let runner = Arc::new(Runner {
            component: self.config.component.clone(),
            clients: clients.clone(),
            provider: self.provider.clone(),
            informers,
            settings: Arc::new(self.config.controllers.clone()),
            metrics: self.metrics.clone(),
            health: self.health.clone(),
            lease_duration: self
                .config
                .leader_election
                .as_ref()
                .map_or(Duration::ZERO, |e| e.lease_duration),
        });

        let Some(election) = &self.config.leader_election else {
            let controllers: Vec<ControllerName> = planned
                .iter()
                .filter(|p| p.runs())
                .map(|p| p.placement.controller)
                .collect();
            runner
                .run_controllers("leader-election-disabled", controllers, None, shutdown)
                .await;
            return Ok(());
        };

        let running = |lock: Lock, lease: &str| -> Vec<ControllerName> {
            planned
                .iter()
                .filter(|p| {
                    p.runs() && p.placement.lock == lock && p.placement.lease.as_deref() == Some(lease)
                })
                .map(|p| p.placement.controller)
                .collect()
        };
        let mut migrations = Vec::new();
        for lock in self.config.migration.iter().flat_map(|m| m.locks()) {
            let controllers = running(Lock::Migration, &lock.lease_name);
            if controllers.is_empty() {
                // Holding a lock whose controllers all run elsewhere would only keep them from running there.
                tracing::info!(lease = %lock.lease_name, "not contending for this migration lease: none of its controllers runs in this component");
                continue;
            }
            migrations.push(ScopeSpec {
                lease_name: lock.lease_name.clone(),
                controllers,
            });
        }
        let scopes = ScopesConfig {
            main: ScopeSpec {
                lease_name: election.main_lease.clone(),
                controllers: running(Lock::Main, &election.main_lease),
            },
            migrations,
            election: ElectionSettings {
                namespace: election.namespace.clone(),
                identity: clients.identity().to_owned(),
                lease_duration: election.lease_duration,
                renew_deadline: election.renew_deadline,
                retry_period: election.retry_period,
                release_on_cancel: election.release_on_cancel,
            },
            on_loss: election.on_loss,
            stop_grace: ((election.lease_duration - election.renew_deadline) / 2)
                .max(Duration::from_millis(100)),
        };
        let client = clients
            .client(LEADER_ELECTION, None)
            .map_err(ManagerError::Client)?;
        run_scopes(client, scopes, runner, shutdown).await?;
        Ok(())
    }
}

/// Starts and stops the controllers of a scope.
struct Runner {
    component: String,
    clients: ClientFactory,
    provider: Arc<dyn CloudProvider>,
    informers: Arc<Informers>,
    settings: Arc<ControllerSettings>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    lease_duration: Duration,
}

impl Runner {
    /// Runs `controllers` until `stop`, then waits for them to stop.
    async fn run_controllers(
        &self,
        scope: &str,
        controllers: Vec<ControllerName>,
        fence: Option<Fence>,
        stop: CancellationToken,
    ) {
        tracing::info!(scope, controllers = ?controllers, "starting controllers");
        let mut tasks = Vec::new();
        let mut started: Vec<watch::Receiver<bool>> = Vec::new();
        for name in controllers {
            let Some(controller) = name.cloud_controller() else {
                continue;
            };
            let client = match self.clients.client(name.as_str(), fence.clone()) {
                Ok(client) => client,
                Err(error) => {
                    tracing::error!(controller = %name, %error, "cannot build the controller's client; not starting it");
                    continue;
                }
            };
            let (started_sender, started_receiver) = watch::channel(false);
            let context = ControllerContext {
                controller,
                client: client.clone(),
                provider: self.provider.clone(),
                informers: self.informers.clone(),
                settings: self.settings.clone(),
                metrics: self.metrics.clone(),
                recorder: Arc::new(controllers::recorder(client, controller, self.clients.identity())),
                stop: stop.child_token(),
                started: Arc::new(started_sender),
            };
            let labels = ControllerLabels {
                name: name.as_str().to_owned(),
                manager: self.component.clone(),
            };
            self.metrics
                .running_managed_controllers
                .get_or_create(&labels)
                .set(1);
            let alive = Arc::new(AtomicBool::new(true));
            let check = alive.clone();
            self.health.add_health_check(name.as_str(), move || {
                if check.load(Ordering::Relaxed) {
                    Ok(())
                } else {
                    Err("the controller stopped".to_owned())
                }
            });
            tasks.push((
                name,
                labels,
                tokio::spawn(async move {
                    controllers::run(context).await;
                    alive.store(false, Ordering::Relaxed);
                }),
            ));
            started.push(started_receiver);
        }
        let readiness = format!("controllers-started-{scope}");
        self.health.add_readiness_check(&readiness, move || {
            if started.iter().all(|s| *s.borrow()) {
                Ok(())
            } else {
                Err("controllers are still starting".to_owned())
            }
        });
        stop.cancelled().await;
        for (name, labels, task) in tasks {
            self.health.remove_health_check(name.as_str());
            let _ = task.await;
            self.metrics
                .running_managed_controllers
                .get_or_create(&labels)
                .set(0);
        }
        self.health.remove_readiness_check(&readiness);
        tracing::info!(scope, "controllers stopped");
    }
}

#[async_trait]
impl ScopeRunner for Runner {
    async fn run_scope(&self, scope: ScopeContext) {
        let fence = Fence(scope.leadership.clone());
        self.run_controllers(&scope.lease_name, scope.controllers, Some(fence), scope.stop)
            .await;
    }

    fn elector_started(&self, kind: ScopeKind, lease_name: &str, state: watch::Receiver<LeaderState>) {
        // leader_election_master_status follows the elector.
        let gauge = self
            .metrics
            .leader_election_master_status
            .get_or_create(&LeaseLabels {
                name: lease_name.to_owned(),
            })
            .clone();
        let mut updates = state.clone();
        tokio::spawn(async move {
            loop {
                gauge.set(i64::from(updates.borrow_and_update().role == Role::Leading));
                if updates.changed().await.is_err() {
                    gauge.set(0);
                    return;
                }
            }
        });
        // As upstream's leader-election health adaptor: unhealthy when leading with renewals overdue by
        // more than the lease duration plus 20 s (the elector itself stops leading sooner; this catches a
        // stuck elector).
        let tolerance = self.lease_duration + Duration::from_secs(20);
        let name = match kind {
            ScopeKind::Main => "leader-election".to_owned(),
            ScopeKind::Migration => format!("leader-migration-{lease_name}"),
        };
        let lease = lease_name.to_owned();
        self.health.add_health_check(&name, move || {
            let current = state.borrow();
            match (current.role, current.renewed_at) {
                (Role::Leading, Some(renewed)) if renewed.elapsed() > tolerance => {
                    Err(format!("failed election to renew leadership on lease {lease}"))
                }
                _ => Ok(()),
            }
        });
    }
}

/// Placements by lock, for logs and tests.
pub fn summarize(planned: &[PlannedController]) -> BTreeMap<String, Vec<String>> {
    let mut summary: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in planned {
        let key = match (&p.skipped, &p.placement.lease) {
            (Some(_), _) => "skipped".to_owned(),
            (None, Some(lease)) => lease.clone(),
            (None, None) => p.placement.lock.as_str().to_owned(),
        };
        summary
            .entry(key)
            .or_default()
            .push(p.placement.controller.as_str().to_owned());
    }
    summary
}
