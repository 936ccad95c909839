//! The manager: which controllers run, under which lock, and their lifecycle.

use std::sync::Arc;
use std::time::Duration;

use crate::plan::{PlannedController, plan_controllers};
use kube_ccm_leadermigration::scopes::{ElectionSettings, ScopesConfig, ScopesError, run_scopes};
use kube_ccm_leadermigration::user_agent::LEADER_ELECTION;
use kube_ccm_leadermigration::{ControllerName, Placement, PlanInput, Planned};
use kube_ccm_provider::{CloudError, CloudProvider, InitializeContext, RateBudget};
use tokio_util::sync::CancellationToken;

use crate::config::{LeaderElectionConfig, ManagerConfig};
use crate::health::Health;
use crate::informers::Informers;
use crate::informers::SharedCache;
use crate::metrics::Metrics;
use crate::registry::ControllerRegistry;

mod scope_controllers;

use scope_controllers::ScopeControllers;

/// Why the manager stopped or could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManagerError {
    /// A client could not be built from the configuration.
    #[error("cannot build a Kubernetes client: {0}")]
    Client(#[source] crate::client::ClientError),
    /// The provider's `initialize` failed.
    #[error("cloud provider initialization failed: {0}")]
    Initialize(#[source] CloudError),
    /// Leader election ended (a lock was lost, or controllers did not stop in time).
    #[error(transparent)]
    Scopes(#[from] ScopesError),
}

/// A runnable cloud-controller-manager.
pub struct Manager {
    config: ManagerConfig,
    controllers: ControllerRegistry,
    provider: Arc<dyn CloudProvider>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    /// The shared caches (made on first use; started when first read), and what stops them.
    informers: parking_lot::Mutex<Option<Arc<Informers>>>,
    stop_informers: CancellationToken,
}

impl Manager {
    /// A manager running `controllers` (those the plan places here) with `provider`.
    pub fn new(
        config: ManagerConfig,
        controllers: ControllerRegistry,
        provider: Arc<dyn CloudProvider>,
    ) -> Manager {
        let metrics = Arc::new(Metrics::new());
        metrics.set_provider(provider.provider_name());
        let rate = config.controllers.request_rate(provider.default_request_rate());
        metrics.set_budget(Arc::new(RateBudget::new(rate.per_second, rate.burst)));
        let mut config = config;
        config.clients = config.clients.with_metrics(metrics.clone());
        Manager {
            config,
            controllers,
            provider,
            health: Arc::new(Health::default()),
            metrics,
            informers: parking_lot::Mutex::default(),
            stop_informers: CancellationToken::new(),
        }
    }

    /// The process's shared caches of nodes and services (the ones its controllers read), for what runs
    /// beside the controllers (the webhooks); they stop when [`Manager::run`] ends.
    pub fn caches(&self) -> Result<Arc<dyn kube_ccm_provider::SharedCaches>, ManagerError> {
        Ok(self.informers()?)
    }

    fn informers(&self) -> Result<Arc<Informers>, ManagerError> {
        let mut informers = self.informers.lock();
        if let Some(informers) = informers.as_ref() {
            return Ok(informers.clone());
        }
        let client = self
            .config
            .clients
            .client("shared-informers", None)
            .map_err(ManagerError::Client)?;
        let made = Informers::new(client, self.stop_informers.clone());
        *informers = Some(made.clone());
        Ok(made)
    }

    /// Health and readiness checks (for `/healthz`, `/readyz`).
    pub fn health(&self) -> Arc<Health> {
        self.health.clone()
    }

    /// Metrics (for `/metrics`).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// The cloud provider.
    pub fn provider(&self) -> Arc<dyn CloudProvider> {
        self.provider.clone()
    }

    /// Where each controller of the binary runs for this manager, with skip reasons.
    pub fn plan(&self) -> Vec<PlannedController> {
        let config = &self.config;
        let main_lease = config
            .leader_election
            .as_ref()
            .map_or(config.component.as_str(), |e| e.main_lease.as_str());
        // Without leader election there is no migration (upstream): everything enabled runs.
        let migration = config
            .leader_election
            .as_ref()
            .and_then(LeaderElectionConfig::migration);
        plan_controllers(
            &self.controllers,
            PlanInput {
                component: &config.component,
                main_lease,
                migration,
                selection: &config.selection,
                catalog: self.controllers.catalog(),
            },
            Some(self.provider.as_ref()),
            &config.controllers,
        )
    }

    /// Runs until `shutdown` fires (`Ok`) or leadership is lost (`Err`, and the process should exit non-zero).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), ManagerError> {
        // The shared caches stop when this returns, however it returns.
        let _caches = self.stop_informers.clone().drop_guard();
        let planned = self.plan();
        self.report_plan(&planned);
        let stopping = shutdown.clone();
        self.health.add_readiness_check("shutdown", move || {
            if stopping.is_cancelled() {
                Err("shutting down".into())
            } else {
                Ok(())
            }
        });
        let informers = self.initialize(&planned, &shutdown).await?;
        let runner = Arc::new(self.scope_controllers(informers));
        let running = self.prepare_accounts(planned).await?;
        let Some(election) = &self.config.leader_election else {
            let controllers: Vec<ControllerName> = running.into_iter().map(|p| p.controller).collect();
            if runner.start_leading(None, &shutdown).await {
                runner
                    .run_controllers("leader-election-disabled", controllers, None, shutdown)
                    .await;
            }
            return Ok(());
        };
        self.run_elected(election, running, runner, shutdown).await
    }

    /// Logs why each controller that does not run here does not; a skipped one (one the provider cannot
    /// serve) also gets a readiness note, so the operator sees it on `/readyz`.
    fn report_plan(&self, planned: &[PlannedController]) {
        for controller in planned {
            let name = controller.controller;
            match (&controller.skipped, &controller.placement) {
                (Some(reason), _) => {
                    tracing::warn!(controller = %name, %reason, "skipping controller");
                    self.health.add_readiness_note(&format!("skipped-{name}"), reason);
                }
                (None, Placement::Disabled) => {
                    tracing::info!(controller = %name, "controller disabled by --controllers")
                }
                (None, Placement::Elsewhere { owner }) => {
                    tracing::info!(controller = %name, %owner, "controller owned by another component")
                }
                _ => {}
            }
        }
    }

    /// Builds the provider's client and the shared caches (stopped when `shutdown` fires; with
    /// `--warm-standby`, those the `planned` controllers that run here read are started), then runs the
    /// provider's `initialize`; the caches, for the controllers. A separate step because every replica
    /// does it, before any lock is contended for.
    async fn initialize(
        &self,
        planned: &[PlannedController],
        shutdown: &CancellationToken,
    ) -> Result<Arc<Informers>, ManagerError> {
        let provider_client = self
            .config
            .clients
            .client(self.provider.provider_name(), None)
            .map_err(ManagerError::Client)?;
        let informers = self.informers()?;
        if self
            .config
            .leader_election
            .as_ref()
            .is_some_and(|e| e.warm_standby)
        {
            // A standby lists and watches now, so that leading costs no list (decision 0036).
            let reads = planned
                .iter()
                .filter(|p| p.runs())
                .filter_map(|p| self.controllers.get(p.controller))
                .flat_map(|definition| definition.cache_reads());
            for cache in reads {
                match cache {
                    SharedCache::Nodes => {
                        informers.nodes();
                    }
                    SharedCache::Services => {
                        informers.services();
                    }
                }
            }
        }
        let stop_informers = self.stop_informers.clone();
        let stopping = shutdown.clone();
        tokio::spawn(async move {
            stopping.cancelled().await;
            stop_informers.cancel();
        });
        self.provider
            .initialize(InitializeContext {
                client: provider_client,
                shutdown: shutdown.clone(),
                flags: self.config.controllers.flags.clone(),
                caches: informers.clone(),
            })
            .await
            .map_err(ManagerError::Initialize)?;
        Ok(informers)
    }

    /// What starts and stops the controllers of each scope, sharing this manager's clients, provider,
    /// caches, metrics and health.
    fn scope_controllers(&self, informers: Arc<Informers>) -> ScopeControllers {
        let election = self.config.leader_election.as_ref();
        ScopeControllers {
            lease_namespace: election.map_or_else(String::new, |e| e.namespace.clone()),
            electors: parking_lot::Mutex::default(),
            component: self.config.component.clone(),
            clients: self.config.clients.clone(),
            controllers: self.controllers.clone(),
            provider: self.provider.clone(),
            informers,
            settings: Arc::new(self.config.controllers.clone()),
            metrics: self.metrics.clone(),
            health: self.health.clone(),
            lease_duration: election.map_or(Duration::ZERO, |e| e.timings.lease_duration()),
        }
    }

    /// The controllers the plan runs here, with where each runs.
    ///
    /// With service-account credentials, every account this process may act as is made ready now, so a
    /// missing account or a refused TokenRequest stops the start with one error naming it, before any
    /// Lease is contended for.
    async fn prepare_accounts(&self, planned: Vec<PlannedController>) -> Result<Vec<Planned>, ManagerError> {
        let running: Vec<Planned> = planned
            .into_iter()
            .filter(PlannedController::runs)
            .map(|p| Planned {
                controller: p.controller,
                placement: p.placement,
            })
            .collect();
        for planned in &running {
            if let Some(definition) = self.controllers.get(planned.controller) {
                self.config
                    .clients
                    .prepare_account(definition.account())
                    .await
                    .map_err(ManagerError::Client)?;
            }
        }
        Ok(running)
    }

    /// With leader election: contends for the main lock and for each migration lock one of `running`
    /// needs, running each lock's controllers while it is held ([`run_scopes`]); returns when `shutdown`
    /// fires or a lock is lost.
    async fn run_elected(
        &self,
        election: &LeaderElectionConfig,
        running: Vec<Planned>,
        runner: Arc<ScopeControllers>,
        shutdown: CancellationToken,
    ) -> Result<(), ManagerError> {
        let clients = &self.config.clients;
        let scopes = ScopesConfig::from_plan(
            &election.main_lease,
            running,
            ElectionSettings {
                namespace: election.namespace.clone(),
                identity: clients.identity().to_owned(),
                timings: election.timings,
                release_on_cancel: election.release_on_cancel,
            },
            election.on_loss,
        );
        for lock in election.migration().iter().flat_map(|m| m.locks()) {
            if !scopes.migrations.iter().any(|s| s.lease_name == lock.lease_name) {
                tracing::info!(lease = %lock.lease_name, "not contending for this migration lease: none of its controllers runs in this component");
            }
        }
        let client = clients
            .client(LEADER_ELECTION, None)
            .map_err(ManagerError::Client)?;
        run_scopes(client, scopes, runner, shutdown).await?;
        Ok(())
    }
}
