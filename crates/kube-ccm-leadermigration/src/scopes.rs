//! Lock scopes: which controllers run under which Lease, and when.
//!
//! Upstream's ordering, kept exactly: the main lock is taken first; on acquiring it the non-migrated
//! controllers start; only then does each migration lock campaign, and its migrated controllers start when
//! it is held. A migration lock is never held without the main lock.
//!
//! When a lock is lost, its scope is told to stop and is awaited (at most `stop_grace`, which must end well
//! before anyone else can take the lock). Then, by [`LossPolicy`], everything else stops, held locks are
//! released and the error is returned (upstream exits), or the lock is contended for again. On shutdown
//! every scope stops, then the migration locks are released, then the main lock.
//!
//! **A lock is released only after everything under it stopped.** When a scope does not stop within the
//! grace period, its task is aborted, no lock is released (each elector is abandoned without its release
//! write) and [`ScopesError::StopTimeout`] is returned: the process must exit at once and let the Leases
//! expire, so a successor can only take them after every request this process sent is long finished.
//!
//! An elector whose task ends on its own (it panicked) is restarted with back-off, logged; it never leaves
//! its lock silently uncontended.

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::controller_name::ControllerName;
use crate::elector::{
    ElectorConfig, ElectorConfigError, Ended, LeaderElector, LeaderState, LossReason, Role,
};
use crate::plan::{Placement, Planned};
use crate::timings::LeaseTimings;

/// Which kind of lock governs a scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopeKind {
    /// The component's own leader-election lock.
    Main,
    /// A leader-migration lock.
    Migration,
}

/// A lock and the controllers that run while it is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeSpec {
    /// Name of the Lease.
    pub lease_name: String,
    /// The controllers, in start order.
    pub controllers: Vec<ControllerName>,
}

/// Election timings and identity, shared by all locks (as upstream).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectionSettings {
    /// Namespace of the Leases.
    pub namespace: String,
    /// `<hostname>_<uuid>`.
    pub identity: String,
    /// Lease duration, renew deadline, retry period.
    pub timings: LeaseTimings,
    /// Release locks on shutdown (client-go's `ReleaseOnCancel`).
    pub release_on_cancel: bool,
}

/// What to do when a lock is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossPolicy {
    /// Stop everything and report the loss (the process then exits non-zero, as upstream).
    Exit,
    /// Stop that lock's scope (for the main lock: every scope) and campaign again.
    Recontend,
}

/// Everything [`run_scopes`] needs.
#[derive(Debug, Clone)]
pub struct ScopesConfig {
    /// The main lock.
    pub main: ScopeSpec,
    /// The migration locks (empty when leader migration is off).
    pub migrations: Vec<ScopeSpec>,
    /// Election settings.
    pub election: ElectionSettings,
    /// On loss.
    pub on_loss: LossPolicy,
}

impl ScopesConfig {
    /// The scopes of a plan: the main lock with the controllers placed under it, and each migration lock
    /// with the controllers placed under it, in the order the plan first names them. `running` holds
    /// only the controllers that will run here, so a migration lock none of whose controllers runs here
    /// is left out: holding it would only keep its controllers from running in the component that has
    /// them (upstream contends for it anyway).
    pub fn from_plan(
        main_lease: &str,
        running: impl IntoIterator<Item = Planned>,
        election: ElectionSettings,
        on_loss: LossPolicy,
    ) -> ScopesConfig {
        let mut main = ScopeSpec {
            lease_name: main_lease.to_owned(),
            controllers: Vec::new(),
        };
        let mut migrations: Vec<ScopeSpec> = Vec::new();
        for planned in running {
            match planned.placement {
                Placement::Main { .. } => main.controllers.push(planned.controller),
                Placement::Migration { lease } => {
                    match migrations.iter_mut().find(|spec| spec.lease_name == lease) {
                        Some(spec) => spec.controllers.push(planned.controller),
                        None => migrations.push(ScopeSpec {
                            lease_name: lease,
                            controllers: vec![planned.controller],
                        }),
                    }
                }
                Placement::Elsewhere { .. } | Placement::Disabled => {}
            }
        }
        ScopesConfig {
            main,
            migrations,
            election,
            on_loss,
        }
    }

    /// How long a scope may take to stop after its lock is lost.
    fn stop_grace(&self) -> Duration {
        self.election.timings.stop_grace()
    }
}

/// What a [`ScopeRunner`] is given for one scope.
#[derive(Debug, Clone)]
pub struct ScopeContext {
    /// Main or migration.
    pub kind: ScopeKind,
    /// The Lease that governs the scope.
    pub lease_name: String,
    /// The controllers to run.
    pub controllers: Vec<ControllerName>,
    /// The lock's state; `valid_until` fences writes.
    pub leadership: watch::Receiver<LeaderState>,
    /// Fires when the scope must stop.
    pub stop: CancellationToken,
}

/// Starts and stops controllers; implemented by the controller manager.
#[async_trait]
pub trait ScopeRunner: Send + Sync + 'static {
    /// Runs the scope's controllers until `scope.stop` fires, then stops them and returns.
    async fn run_scope(&self, scope: ScopeContext);

    /// An elector started campaigning (for health checks and metrics). Called before it can lead.
    fn elector_started(&self, _kind: ScopeKind, _lease_name: &str, _state: watch::Receiver<LeaderState>) {}
}

/// Why the scopes stopped, other than a requested shutdown.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScopesError {
    /// The election settings cannot work.
    #[error(transparent)]
    Config(#[from] ElectorConfigError),
    /// A lock was lost (policy [`LossPolicy::Exit`]).
    #[error("leader election lost on lease {lease}: {reason}")]
    Lost {
        /// The Lease.
        lease: String,
        /// How.
        reason: LossReason,
    },
    /// A scope did not stop within the grace period (after its lock was lost, or on shutdown).
    #[error("the controllers of lease {lease} did not stop within {grace:?} {cause}")]
    StopTimeout {
        /// The Lease.
        lease: String,
        /// The grace period.
        grace: Duration,
        /// Why they were being stopped.
        cause: StopCause,
    },
}

/// Why a scope's controllers were being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopCause {
    /// The process shuts down (SIGTERM).
    Shutdown,
    /// The lock was lost.
    LeaseLost,
}

impl std::fmt::Display for StopCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StopCause::Shutdown => "on shutdown",
            StopCause::LeaseLost => "after the lease was lost",
        })
    }
}

struct Running {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Running {
    fn start<R: ScopeRunner>(runner: &std::sync::Arc<R>, context: ScopeContext) -> Running {
        let stop = context.stop.clone();
        let runner = runner.clone();
        Running {
            stop,
            task: tokio::spawn(async move { runner.run_scope(context).await }),
        }
    }

    /// Stops the scope and waits for it, at most `grace`; past that the task is aborted and `false` returned.
    async fn stop(mut self, grace: Duration) -> bool {
        self.stop.cancel();
        if tokio::time::timeout(grace, &mut self.task).await.is_ok() {
            return true;
        }
        self.task.abort();
        false
    }
}

struct Campaign {
    spec: ScopeSpec,
    cancel: CancellationToken,
    state: watch::Receiver<LeaderState>,
    task: JoinHandle<Ended>,
}

impl Campaign {
    /// Starts following the lock after `delay`; it is contended for only while `permit` is true.
    fn start<R: ScopeRunner>(
        client: &kube::Client,
        settings: &ElectionSettings,
        spec: &ScopeSpec,
        kind: ScopeKind,
        runner: &R,
        permit: watch::Receiver<bool>,
        delay: Duration,
    ) -> Result<Campaign, ElectorConfigError> {
        let config = ElectorConfig {
            namespace: settings.namespace.clone(),
            lease_name: spec.lease_name.clone(),
            identity: settings.identity.clone(),
            timings: settings.timings,
            release_on_cancel: settings.release_on_cancel,
        };
        let (mut elector, state) = LeaderElector::new(client.clone(), config)?;
        runner.elector_started(kind, &spec.lease_name, state.clone());
        let cancel = CancellationToken::new();
        let token = cancel.clone();
        let task = tokio::spawn(async move {
            tokio::select! {
                () = token.cancelled() => return Ended::CancelledBeforeLeading,
                () = tokio::time::sleep(delay) => {}
            }
            elector.run_when_permitted(permit, &token).await
        });
        Ok(Campaign {
            spec: spec.clone(),
            cancel,
            state,
            task,
        })
    }

    /// Ends the campaign (releasing the lock if held) and waits for it.
    async fn end(self) -> Ended {
        self.cancel.cancel();
        self.task.await.unwrap_or(Ended::Released)
    }

    /// Stops the campaign without its release write: the lock, if held, expires on its own.
    fn abandon(self) {
        self.task.abort();
    }
}

/// A held lock with its running scope.
struct Held {
    campaign: Campaign,
    scope: Running,
}

/// Back-off for restarting a campaign whose elector ended on its own: 1 s doubling to 30 s, reset once the
/// lock is led.
#[derive(Debug, Default)]
struct Restarts(std::collections::HashMap<String, Duration>);

impl Restarts {
    const FIRST: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(30);

    fn next(&mut self, lease: &str) -> Duration {
        let delay = self.0.entry(lease.to_owned()).or_insert(Duration::ZERO);
        *delay = if delay.is_zero() {
            Self::FIRST
        } else {
            (*delay * 2).min(Self::MAX)
        };
        *delay
    }

    fn led(&mut self, lease: &str) {
        self.0.remove(lease);
    }
}

/// Runs the scopes until `shutdown` fires (`Ok`) or a lock is lost under [`LossPolicy::Exit`] (`Err`).
///
/// On [`ScopesError::StopTimeout`] no lock was released: exit the process at once.
pub async fn run_scopes<R: ScopeRunner>(
    client: kube::Client,
    config: ScopesConfig,
    runner: std::sync::Arc<R>,
    shutdown: CancellationToken,
) -> Result<(), ScopesError> {
    let scopes = Scopes {
        client,
        config,
        runner,
        shutdown,
    };
    let mut restarts = Restarts::default();
    let mut main_delay = Duration::ZERO;
    loop {
        let mut tenure = match scopes.campaign(main_delay, &mut restarts).await? {
            Campaigned::Shutdown => return Ok(()),
            Campaigned::Restart(delay) => {
                main_delay = delay;
                continue;
            }
            Campaigned::Leading(tenure) => tenure,
        };
        main_delay = Duration::ZERO;
        let outcome = scopes.lead(&mut tenure, &mut restarts).await?;
        let outcome = scopes.wind_down(tenure, outcome).await?;
        let (main_lease, grace) = (&scopes.config.main.lease_name, scopes.config.stop_grace());
        match after(outcome, scopes.config.on_loss, main_lease, grace) {
            Some(result) => return result,
            None => tracing::info!(lease = %main_lease, "campaigning again"),
        }
    }
}

/// What [`run_scopes`] works with.
struct Scopes<R> {
    client: kube::Client,
    config: ScopesConfig,
    runner: std::sync::Arc<R>,
    shutdown: CancellationToken,
}

/// How a campaign for the main lock ended.
enum Campaigned {
    Shutdown,
    /// Its elector ended without leading (it panicked): campaign again after this delay.
    Restart(Duration),
    Leading(Tenure),
}

/// One tenure of the main lock: its running scope, and the migration campaigns waiting and held.
struct Tenure {
    main: Held,
    waiting: Vec<Campaign>,
    held: Vec<Held>,
    /// Always true: what the migration campaigns restarted during the tenure are permitted by.
    permitted: watch::Receiver<bool>,
    /// The senders live as long as the tenure, so the campaigns' permits never close.
    _always: watch::Sender<bool>,
    _allow_migrations: watch::Sender<bool>,
}

impl<R: ScopeRunner> Scopes<R> {
    fn start(
        &self,
        spec: &ScopeSpec,
        kind: ScopeKind,
        permit: &watch::Receiver<bool>,
        delay: Duration,
    ) -> Result<Campaign, ElectorConfigError> {
        let election = &self.config.election;
        Campaign::start(
            &self.client,
            election,
            spec,
            kind,
            self.runner.as_ref(),
            permit.clone(),
            delay,
        )
    }

    /// Campaigns for the main lock (after `main_delay`), following the migration locks meanwhile.
    async fn campaign(
        &self,
        main_delay: Duration,
        restarts: &mut Restarts,
    ) -> Result<Campaigned, ScopesError> {
        let (always, permitted) = watch::channel(true);
        let main = self.start(&self.config.main, ScopeKind::Main, &permitted, main_delay)?;
        // The migration locks are followed from the start, so their expiry is judged from when this process
        // first saw their record, but contended for only once the main lock is held.
        let (allow_migrations, migration_permit) = watch::channel(false);
        let mut waiting: Vec<Campaign> = Vec::new();
        for spec in &self.config.migrations {
            waiting.push(self.start(spec, ScopeKind::Migration, &migration_permit, Duration::ZERO)?);
        }
        let mut main_state = main.state.clone();
        tokio::select! {
            () = self.shutdown.cancelled() => {
                for campaign in waiting {
                    campaign.end().await;
                }
                main.end().await;
                return Ok(Campaigned::Shutdown);
            }
            leading = async { main_state.wait_for(|s| s.role == Role::Leading).await.is_ok() } => {
                if !leading {
                    for campaign in waiting {
                        campaign.end().await;
                    }
                    let delay = restarts.next(&self.config.main.lease_name);
                    tracing::error!(lease = %self.config.main.lease_name, retry_in = ?delay, "the leader elector ended unexpectedly; campaigning again");
                    return Ok(Campaigned::Restart(delay));
                }
            }
        }
        restarts.led(&self.config.main.lease_name);
        let scope = Running::start(&self.runner, context(&main, ScopeKind::Main));
        // Only now do the migration locks campaign.
        allow_migrations.send_replace(true);
        Ok(Campaigned::Leading(Tenure {
            main: Held {
                campaign: main,
                scope,
            },
            waiting,
            held: Vec::new(),
            permitted,
            _always: always,
            _allow_migrations: allow_migrations,
        }))
    }

    /// Leads until shutdown or a loss: migration locks are taken and their scopes started as they come.
    async fn lead(&self, tenure: &mut Tenure, restarts: &mut Restarts) -> Result<Outcome, ScopesError> {
        loop {
            match next_event(
                &mut tenure.main,
                &mut tenure.waiting,
                &mut tenure.held,
                &self.shutdown,
            )
            .await
            {
                Event::Shutdown => return Ok(Outcome::Shutdown),
                Event::MigrationAcquired(index) => {
                    let campaign = tenure.waiting.remove(index);
                    restarts.led(&campaign.spec.lease_name);
                    let scope = Running::start(&self.runner, context(&campaign, ScopeKind::Migration));
                    tenure.held.push(Held { campaign, scope });
                }
                Event::CampaignEnded(index) => {
                    let ended = tenure.waiting.remove(index);
                    let delay = restarts.next(&ended.spec.lease_name);
                    tracing::error!(lease = %ended.spec.lease_name, retry_in = ?delay, "the migration leader elector ended unexpectedly; campaigning again");
                    let campaign = self.start(&ended.spec, ScopeKind::Migration, &tenure.permitted, delay)?;
                    tenure.waiting.push(campaign);
                }
                Event::MigrationEnded(index, ended) => {
                    let lost = tenure.held.remove(index);
                    let lease = lost.campaign.spec.lease_name.clone();
                    let reason = loss_reason(ended);
                    tracing::error!(%lease, %reason, "migration leader election lost; stopping its controllers");
                    if !lost.scope.stop(self.config.stop_grace()).await {
                        return Ok(Outcome::StopTimeout(lease));
                    }
                    match self.config.on_loss {
                        LossPolicy::Exit => return Ok(Outcome::Lost(lease, reason)),
                        LossPolicy::Recontend => {
                            // The elector paces its own attempts (retry period, jitter).
                            let spec = &lost.campaign.spec;
                            let campaign =
                                self.start(spec, ScopeKind::Migration, &tenure.permitted, Duration::ZERO)?;
                            tenure.waiting.push(campaign);
                        }
                    }
                }
                Event::MainEnded(ended) => {
                    let reason = loss_reason(ended);
                    tracing::error!(lease = %self.config.main.lease_name, %reason, "leader election lost; stopping every controller");
                    return Ok(Outcome::MainLost(reason));
                }
            }
        }
    }

    /// Winds a tenure down: every scope stops first, then the migration locks are released, then the main
    /// lock (unless it was lost). A scope that does not stop in time releases nothing: every Lease expires.
    async fn wind_down(&self, tenure: Tenure, outcome: Outcome) -> Result<Outcome, ScopesError> {
        let grace = self.config.stop_grace();
        let Tenure {
            main, waiting, held, ..
        } = tenure;
        let (migrations, main_stopped) = tokio::join!(
            futures::future::join_all(
                held.into_iter()
                    .map(|h| async move { (h.scope.stop(grace).await, h.campaign) })
            ),
            main.scope.stop(grace),
        );
        let stopped_in_time = main_stopped
            && migrations.iter().all(|(stopped, _)| *stopped)
            && !matches!(outcome, Outcome::StopTimeout(_));
        if !stopped_in_time {
            for (_, campaign) in migrations {
                campaign.abandon();
            }
            for campaign in waiting {
                campaign.abandon();
            }
            main.campaign.abandon();
            let cause = match outcome {
                Outcome::Shutdown => StopCause::Shutdown,
                _ => StopCause::LeaseLost,
            };
            let lease = match outcome {
                Outcome::StopTimeout(lease) => lease,
                _ => self.config.main.lease_name.clone(),
            };
            tracing::error!(%lease, ?grace, %cause, "controllers did not stop in time: no lock is released; the process must exit");
            return Err(ScopesError::StopTimeout { lease, grace, cause });
        }
        for (_, campaign) in migrations {
            campaign.end().await;
        }
        for campaign in waiting {
            campaign.end().await;
        }
        if !matches!(outcome, Outcome::MainLost(_)) {
            main.campaign.end().await;
        }
        Ok(outcome)
    }
}

/// How a lock's elector ending reads as a loss (an elector ends on its own only when it lost).
fn loss_reason(ended: Ended) -> LossReason {
    match ended {
        Ended::Lost(reason) => reason,
        Ended::Released | Ended::CancelledBeforeLeading => LossReason::RenewDeadline,
    }
}

/// What [`run_scopes`] returns after a tenure wound down in time; `None`: campaign again.
fn after(
    outcome: Outcome,
    on_loss: LossPolicy,
    main_lease: &str,
    grace: Duration,
) -> Option<Result<(), ScopesError>> {
    match outcome {
        Outcome::Shutdown => Some(Ok(())),
        Outcome::StopTimeout(lease) => Some(Err(ScopesError::StopTimeout {
            lease,
            grace,
            cause: StopCause::LeaseLost,
        })),
        Outcome::Lost(lease, reason) => Some(Err(ScopesError::Lost { lease, reason })),
        Outcome::MainLost(reason) => (on_loss == LossPolicy::Exit).then(|| {
            Err(ScopesError::Lost {
                lease: main_lease.to_owned(),
                reason,
            })
        }),
    }
}

#[derive(Debug)]
enum Outcome {
    Shutdown,
    MainLost(LossReason),
    Lost(String, LossReason),
    StopTimeout(String),
}

enum Event {
    Shutdown,
    MainEnded(Ended),
    MigrationAcquired(usize),
    /// A waiting migration campaign's elector ended without leading (it panicked).
    CampaignEnded(usize),
    MigrationEnded(usize, Ended),
}

fn context(campaign: &Campaign, kind: ScopeKind) -> ScopeContext {
    ScopeContext {
        kind,
        lease_name: campaign.spec.lease_name.clone(),
        controllers: campaign.spec.controllers.clone(),
        leadership: campaign.state.clone(),
        stop: CancellationToken::new(),
    }
}

/// Waits for the next thing that changes what runs.
async fn next_event(
    main: &mut Held,
    waiting: &mut [Campaign],
    held: &mut [Held],
    shutdown: &CancellationToken,
) -> Event {
    let acquired = async {
        if waiting.is_empty() {
            return std::future::pending::<Event>().await;
        }
        let campaigns = waiting.iter_mut().enumerate().map(|(index, campaign)| {
            Box::pin(async move {
                // Only this function cancels a waiting campaign, so an elector that ends here ended on its own.
                if campaign.state.wait_for(|s| s.role == Role::Leading).await.is_ok() {
                    Event::MigrationAcquired(index)
                } else {
                    Event::CampaignEnded(index)
                }
            })
        });
        futures::future::select_all(campaigns).await.0
    };
    let ended = async {
        if held.is_empty() {
            return std::future::pending::<(usize, Ended)>().await;
        }
        let elections = held.iter_mut().enumerate().map(|(index, h)| {
            Box::pin(async move {
                (
                    index,
                    (&mut h.campaign.task)
                        .await
                        .unwrap_or(Ended::Lost(LossReason::RenewDeadline)),
                )
            })
        });
        futures::future::select_all(elections).await.0
    };
    tokio::select! {
        () = shutdown.cancelled() => Event::Shutdown,
        result = &mut main.campaign.task => Event::MainEnded(result.unwrap_or(Ended::Lost(LossReason::RenewDeadline))),
        event = acquired => event,
        (index, ended) = ended => Event::MigrationEnded(index, ended),
    }
}

#[cfg(test)]
mod tests;
