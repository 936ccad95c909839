//! What starts and stops the controllers of each scope (a lock's controllers, or all of them without
//! leader election), sharing the manager's clients, provider, caches, metrics and health.

use std::any::Any;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use crate::events::EventType;
use async_trait::async_trait;
use futures::FutureExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube_ccm_leadermigration::ControllerName;
use kube_ccm_leadermigration::elector::{EVENT_REASON, LeaderState, Role, became_leader};
use kube_ccm_leadermigration::scopes::{ScopeContext, ScopeKind, ScopeRunner};
use kube_ccm_leadermigration::user_agent::LEADER_ELECTION;
use kube_ccm_provider::Refused;
use kube_ccm_provider::{CloudProvider, LeadingContext};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::client::ClientFactory;
use crate::config::ControllerSettings;
use crate::context::ControllerContext;
use crate::events::EventRecorder;
use crate::health::Health;
use crate::informers::Informers;

use crate::metrics::{ControllerLabels, LeaseLabels, Metrics};
use crate::registry::ControllerRegistry;
use crate::transport::Fence;
use crate::workqueue::WorkQueue;

/// Starts and stops the controllers of a scope.
pub(super) struct ScopeControllers {
    /// Namespace of the Leases (for their Events).
    pub(super) lease_namespace: String,
    /// Each lock's elector health check (the latest elector per Lease), for `leaderElection`.
    pub(super) electors: parking_lot::Mutex<BTreeMap<String, ElectorCheck>>,
    pub(super) component: String,
    pub(super) clients: ClientFactory,
    pub(super) controllers: ControllerRegistry,
    pub(super) provider: Arc<dyn CloudProvider>,
    pub(super) informers: Arc<Informers>,
    pub(super) settings: Arc<ControllerSettings>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) health: Arc<Health>,
    pub(super) lease_duration: Duration,
}

impl ScopeControllers {
    /// Tells the provider this process leads (`CloudProvider::start_leading`), retrying with back-off while
    /// it fails (its health check then fails, so a liveness probe restarts a process stuck there, releasing
    /// the lock); false when `stop` fired first.
    pub(super) async fn start_leading(&self, fence: Option<Fence>, stop: &CancellationToken) -> bool {
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
    pub(super) async fn run_controllers(
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
