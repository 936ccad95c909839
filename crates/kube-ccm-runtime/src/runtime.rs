//! The manager: which controllers run, under which lock, and their lifecycle.

use std::any::Any;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use crate::events::EventType;
use crate::plan::{PlannedController, plan_controllers};
use async_trait::async_trait;
use futures::FutureExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube_ccm_leadermigration::elector::{EVENT_REASON, LeaderState, Role, became_leader};
use kube_ccm_leadermigration::scopes::{
    ElectionSettings, ScopeContext, ScopeKind, ScopeRunner, ScopesConfig, ScopesError, run_scopes,
};
use kube_ccm_leadermigration::user_agent::LEADER_ELECTION;
use kube_ccm_leadermigration::{ControllerName, Placement, PlanInput, Planned};
use kube_ccm_provider::Refused;
use kube_ccm_provider::{CloudError, CloudProvider, InitializeContext, LeadingContext, RateBudget};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::client::ClientFactory;
use crate::config::{ControllerSettings, LeaderElectionConfig, ManagerConfig};
use crate::context::ControllerContext;
use crate::events::EventRecorder;
use crate::health::Health;
use crate::informers::Informers;

use crate::metrics::{ControllerLabels, LeaseLabels, Metrics};
use crate::registry::ControllerRegistry;
use crate::transport::Fence;
use crate::workqueue::WorkQueue;

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
        let informers = self.initialize(&shutdown).await?;
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

    /// Builds the provider's client and the shared caches (stopped when `shutdown` fires), then runs the
    /// provider's `initialize`; the caches, for the controllers. A separate step because every replica
    /// does it, before any lock is contended for.
    async fn initialize(&self, shutdown: &CancellationToken) -> Result<Arc<Informers>, ManagerError> {
        let provider_client = self
            .config
            .clients
            .client(self.provider.provider_name(), None)
            .map_err(ManagerError::Client)?;
        let informers = self.informers()?;
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

/// Starts and stops the controllers of a scope.
struct ScopeControllers {
    /// Namespace of the Leases (for their Events).
    lease_namespace: String,
    /// Each lock's elector health check (the latest elector per Lease), for `leaderElection`.
    electors: parking_lot::Mutex<BTreeMap<String, ElectorCheck>>,
    component: String,
    clients: ClientFactory,
    controllers: ControllerRegistry,
    provider: Arc<dyn CloudProvider>,
    informers: Arc<Informers>,
    settings: Arc<ControllerSettings>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    lease_duration: Duration,
}

impl ScopeControllers {
    /// Tells the provider this process leads (`CloudProvider::start_leading`), retrying with back-off while
    /// it fails (its health check then fails, so a liveness probe restarts a process stuck there, releasing
    /// the lock); false when `stop` fired first.
    async fn start_leading(&self, fence: Option<Fence>, stop: &CancellationToken) -> bool {
        const CHECK: &str = "cloud-provider-leading";
        let client = match self.clients.client(self.provider.provider_name(), fence) {
            Ok(client) => client,
            Err(error) => {
                tracing::error!(%error, "cannot build the provider's client");
                return false;
            }
        };
        let mut delay = Duration::from_secs(1);
        loop {
            let context = LeadingContext {
                client: client.clone(),
                stop: stop.child_token(),
            };
            match self.provider.start_leading(context).await {
                Ok(()) => {
                    self.health.remove_health_check(CHECK);
                    return true;
                }
                Err(error) => {
                    tracing::error!(%error, "the cloud provider failed to start leading; retrying");
                    let message = format!("the cloud provider failed to start leading: {error}");
                    self.health
                        .add_health_check(CHECK, move || Err(message.clone().into()));
                }
            }
            tokio::select! {
                () = stop.cancelled() => return false,
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(30));
        }
    }

    /// Records that this process leads `lease`, as client-go's lock does: a Normal Event, reason
    /// `LeaderElection`, "<identity> became leader", about the Lease, reported by this component. Written
    /// under the lock (fenced), beside the controllers' start rather than before it; a failure is logged,
    /// never fatal. `leader-migration status --report` draws the Lease history from these.
    fn announce(&self, lease: &str, fence: Fence) {
        let client = match self.clients.client(LEADER_ELECTION, Some(fence)) {
            Ok(client) => client,
            Err(error) => {
                tracing::warn!(%error, lease, "cannot build the client for the leader-election event");
                return;
            }
        };
        let about = ObjectReference {
            api_version: Some("coordination.k8s.io/v1".to_owned()),
            kind: Some("Lease".to_owned()),
            namespace: Some(self.lease_namespace.clone()),
            name: Some(lease.to_owned()),
            ..ObjectReference::default()
        };
        let recorder = EventRecorder::new(client, &self.component, self.clients.identity()).with_event_time();
        let message = became_leader(self.clients.identity());
        tokio::spawn(async move {
            recorder
                .record(&about, EventType::Normal, EVENT_REASON, "Lead", message)
                .await;
        });
    }

    /// Runs `controllers` until `stop`, then waits for them to stop. Dropping this future (the scope did
    /// not stop in time and was aborted) aborts every controller task.
    async fn run_controllers(
        &self,
        scope: &str,
        controllers: Vec<ControllerName>,
        fence: Option<Fence>,
        stop: CancellationToken,
    ) {
        tracing::info!(scope, controllers = ?controllers, "starting controllers");
        // Not ready from before the first controller starts (one may act at once, e.g. initialise a
        // node) until every one has: none of the scope's until all of them are registered.
        let readiness = format!("controllers-started-{scope}");
        let registered: Arc<parking_lot::Mutex<Option<Vec<watch::Receiver<bool>>>>> = Arc::default();
        let check = registered.clone();
        self.health
            .add_readiness_check(&readiness, move || match &*check.lock() {
                Some(started) if started.iter().all(|s| *s.borrow()) => Ok(()),
                _ => Err("controllers are still starting".into()),
            });
        let mut tasks = Vec::new();
        let mut started: Vec<watch::Receiver<bool>> = Vec::new();
        for name in controllers {
            if let Some((task, started_receiver)) =
                self.start_controller(scope, name, fence.as_ref(), &stop).await
            {
                tasks.push(task);
                started.push(started_receiver);
            }
        }
        *registered.lock() = Some(started);
        stop.cancelled().await;
        for ControllerTask { name, labels, task } in tasks {
            self.health.remove_health_check(name.as_str());
            let _ = task.await;
            // A controller that stopped has nothing waiting (its queue's depth is zero).
            self.metrics.work_queue(name.as_str()).clear();
            self.metrics
                .running_managed_controllers
                .get_or_create(&labels)
                .set(0);
        }
        self.health.remove_readiness_check(&readiness);
        tracing::info!(scope, "controllers stopped");
    }

    /// Starts the controller `name` of `scope` under `fence` (its context, its
    /// `running_managed_controllers` gauge, its health check, its task), with what tells when it has
    /// started; `None` when it is not registered or its client cannot be built (logged), so the scope's
    /// other controllers still start.
    async fn start_controller(
        &self,
        scope: &str,
        name: ControllerName,
        fence: Option<&Fence>,
        stop: &CancellationToken,
    ) -> Option<(ControllerTask, watch::Receiver<bool>)> {
        let definition = self.controllers.get(name)?;
        let client = match self
            .clients
            .controller_client(name.as_str(), definition.account(), fence.cloned())
            .await
        {
            Ok(client) => client,
            Err(error) => {
                tracing::error!(controller = %name, %error, "cannot build the controller's client; not starting it");
                return None;
            }
        };
        let (started_sender, started_receiver) = watch::channel(false);
        let queue = self.metrics.work_queue(name.as_str());
        queue.clear();
        let context = ControllerContext {
            name,
            client: client.clone(),
            provider: self.provider.clone(),
            informers: self.informers.clone(),
            settings: self.settings.clone(),
            metrics: self.metrics.clone(),
            recorder: Arc::new(
                EventRecorder::new(client, definition.reporter(), self.clients.identity()).in_background(),
            ),
            stop: stop.child_token(),
            started: Arc::new(started_sender),
            fence: fence.cloned(),
            lease: if fence.is_some() { scope.into() } else { "".into() },
            caller: self.clients.user_agent(name.as_str()).into(),
            queue: queue.clone(),
        };
        let run = definition.run(context);
        let labels = ControllerLabels {
            name: name.as_str().to_owned(),
            manager: self.component.clone(),
        };
        self.metrics
            .running_managed_controllers
            .get_or_create(&labels)
            .set(1);
        let ended: Arc<std::sync::OnceLock<String>> = Arc::default();
        self.add_controller_health_check(name, queue, ended.clone());
        let task = tokio::spawn(async move {
            let why = match AssertUnwindSafe(run).catch_unwind().await {
                Ok(()) => "the controller stopped".to_owned(),
                Err(panic) => {
                    let message = panic_message(panic.as_ref());
                    tracing::error!(controller = %name, panic = %message, "the controller panicked; its health check fails until the process restarts");
                    format!("the controller panicked: {message}")
                }
            };
            let _ = ended.set(why);
        });
        let running = ControllerTask {
            name,
            labels,
            task: AbortOnDropHandle::new(task),
        };
        Some((running, started_receiver))
    }

    /// The controller's health check, named after it: failing once its task has `ended` (why is the
    /// message), or while one unit of work of its `queue` has run longer than the settings' `stuck_after`.
    fn add_controller_health_check(
        &self,
        name: ControllerName,
        queue: Arc<WorkQueue>,
        ended: Arc<std::sync::OnceLock<String>>,
    ) {
        let stuck_after = self.settings.stuck_after();
        self.health.add_health_check(name.as_str(), move || {
            if let Some(why) = ended.get() {
                return Err(why.clone().into());
            }
            match queue.longest_running() {
                Some(running) if running > stuck_after => Err(format!(
                    "stuck: one unit of work has been running for {}s (more than {}s)",
                    running.as_secs(),
                    stuck_after.as_secs()
                )
                .into()),
                _ => Ok(()),
            }
        });
    }
}

/// A controller task [`ScopeControllers::start_controller`] started, with what its stop undoes: its health
/// check, its work queue's depth and its `running_managed_controllers` gauge.
struct ControllerTask {
    name: ControllerName,
    labels: ControllerLabels,
    /// Aborts the task when dropped (the scope was aborted before its controllers stopped).
    task: AbortOnDropHandle<()>,
}

/// The text of a panic's payload.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(a panic without a message)".to_owned())
}

#[async_trait]
impl ScopeRunner for ScopeControllers {
    async fn run_scope(&self, scope: ScopeContext) {
        let fence = Fence::new(scope.leadership.clone()).stopping_with(scope.stop.clone());
        self.announce(&scope.lease_name, fence.clone());
        if scope.kind == ScopeKind::Main && !self.start_leading(Some(fence.clone()), &scope.stop).await {
            fence.settled().await;
            return;
        }
        self.run_controllers(
            &scope.lease_name,
            scope.controllers,
            Some(fence.clone()),
            scope.stop,
        )
        .await;
        // Nothing under the lock starts a request now; one already sent (a background Event) is answered
        // before the lock is released.
        fence.settled().await;
    }

    fn elector_started(&self, kind: ScopeKind, lease_name: &str, state: watch::Receiver<LeaderState>) {
        // leader_election_master_status follows the elector; the hand-off and lost counters count its
        // transitions.
        let lease = LeaseLabels {
            name: lease_name.to_owned(),
        };
        let gauge = self
            .metrics
            .leader_election_master_status
            .get_or_create(&lease)
            .clone();
        let holder_changes = self.metrics.leader_holder_changes.get_or_create(&lease).clone();
        let lost = self.metrics.leader_lost.get_or_create(&lease).clone();
        let mut updates = state.clone();
        tokio::spawn(async move {
            let mut last: Option<LeaderState> = None;
            loop {
                let current = updates.borrow_and_update().clone();
                gauge.set(i64::from(current.role == Role::Leading));
                if let Some(last) = &last {
                    if current.holder.is_some() && current.holder != last.holder {
                        holder_changes.inc();
                    }
                    if last.role == Role::Leading && current.role != Role::Leading {
                        lost.inc();
                    }
                }
                let leading = current.role == Role::Leading;
                last = Some(current);
                if updates.changed().await.is_err() {
                    if leading {
                        lost.inc();
                    }
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
        let check = move |state: &watch::Receiver<LeaderState>| {
            let current = state.borrow();
            match (current.role, current.renewed_at) {
                (Role::Leading, Some(renewed)) if renewed.elapsed() > tolerance => {
                    Err(format!("failed election to renew leadership on lease {lease}"))
                }
                _ => Ok(()),
            }
        };
        let own = state.clone();
        let own_check = check.clone();
        self.health
            .add_health_check(&name, move || own_check(&own).map_err(Refused::from));
        // Upstream's name for the same check (`leaderElection`), over every lock of this process, so existing
        // probes keep working.
        let mut electors = self.electors.lock();
        electors.insert(lease_name.to_owned(), Arc::new(move || check(&state)));
        let all: Vec<ElectorCheck> = electors.values().cloned().collect();
        self.health.add_health_check("leaderElection", move || {
            all.iter().try_for_each(|check| check()).map_err(Refused::from)
        });
    }
}

type ElectorCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;
