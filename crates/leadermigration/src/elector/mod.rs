//! A Lease elector that interoperates with client-go's `LeaseLock`.
//!
//! **As client-go** (so a Go kube-controller-manager and this binary can share one migration Lease): the
//! record lives in `coordination.k8s.io/v1` Lease fields; every write is a PUT carrying the resourceVersion
//! read (409 means someone else won); a Lease held by another is taken only when its record has not changed
//! for its `leaseDurationSeconds`, judged by the local monotonic clock from when the change was *observed*
//! (never a remote timestamp against the local clock); `leaseTransitions` counts changes of holder; the
//! leader renews every retry period and gives up at the renew deadline; the release record is client-go's
//! `ReleaseOnCancel` one.
//!
//! **Beyond client-go:**
//! - Standbys follow the Lease with a watch and act the moment it is released or its observed expiry
//!   passes, instead of polling every retry period: an idle standby costs the API server one long-running
//!   watch. When the watch is refused (RBAC without `watch`) or failing, it falls back to polling.
//! - Leadership ends at the renew deadline measured from when the last *successful* renewal was *sent*
//!   (client-go measures from a later point), so a leader always stops before anyone else can take over:
//!   others wait the full lease duration from when they saw that renewal.
//! - The state is published on a `watch` channel ([`LeaderState`]), including `valid_until`, the instant
//!   after which this process must no longer act as leader (writes can be fenced on it).
//! - Fields the elector does not own are preserved on every write.
//! - Every API call runs under a timeout no later than the renew deadline.

mod record;

use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use self::record::{LeaderRecord, micro_time_now};

/// Settings of one elector, as upstream's `--leader-elect-*` flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectorConfig {
    /// Namespace of the Lease (`--leader-elect-resource-namespace`).
    pub namespace: String,
    /// Name of the Lease (`--leader-elect-resource-name`, or a migration lease).
    pub lease_name: String,
    /// This candidate's identity: `<hostname>_<uuid>`, as upstream.
    pub identity: String,
    /// How long others wait after the holder's last change before taking the Lease (whole seconds).
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up.
    pub renew_deadline: Duration,
    /// Time between renewals, and between attempts when polling.
    pub retry_period: Duration,
    /// Clear the holder when leadership ends by cancellation, so a standby takes over at once.
    pub release_on_cancel: bool,
}

/// Settings that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElectorConfigError {
    /// The Lease's duration field holds whole seconds.
    #[error("--leader-elect-lease-duration must be a whole number of seconds, at least 1s (got {0:?})")]
    LeaseDuration(Duration),
    /// Upstream's rule: the renew deadline must end before others may take over.
    #[error(
        "--leader-elect-lease-duration ({lease:?}) must be greater than --leader-elect-renew-deadline ({renew:?})"
    )]
    RenewDeadline {
        /// Lease duration.
        lease: Duration,
        /// Renew deadline.
        renew: Duration,
    },
    /// Upstream's rule: at least one jittered retry must fit in the renew deadline.
    #[error(
        "--leader-elect-renew-deadline ({renew:?}) must be greater than 1.2 × --leader-elect-retry-period ({retry:?})"
    )]
    RetryPeriod {
        /// Renew deadline.
        renew: Duration,
        /// Retry period.
        retry: Duration,
    },
    /// No identity.
    #[error("the leader-election identity is empty")]
    Identity,
}

impl ElectorConfig {
    /// Checks upstream's constraints (`leaderelection.NewLeaderElector`).
    pub fn validate(&self) -> Result<(), ElectorConfigError> {
        if self.lease_duration.subsec_nanos() != 0 || self.lease_duration < Duration::from_secs(1) {
            return Err(ElectorConfigError::LeaseDuration(self.lease_duration));
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(ElectorConfigError::RenewDeadline {
                lease: self.lease_duration,
                renew: self.renew_deadline,
            });
        }
        if self.renew_deadline.as_secs_f64() <= 1.2 * self.retry_period.as_secs_f64()
            || self.retry_period.is_zero()
        {
            return Err(ElectorConfigError::RetryPeriod {
                renew: self.renew_deadline,
                retry: self.retry_period,
            });
        }
        if self.identity.is_empty() {
            return Err(ElectorConfigError::Identity);
        }
        Ok(())
    }

    fn lease_duration_seconds(&self) -> i64 {
        i64::try_from(self.lease_duration.as_secs()).unwrap_or(i64::MAX)
    }
}

/// Whether this process leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Not leading: someone else holds the Lease, or nobody yet.
    Standby,
    /// Leading.
    Leading,
}

/// What an elector knows, published on its `watch` channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderState {
    /// The Lease.
    pub lease: String,
    /// Leading or not.
    pub role: Role,
    /// The holder last observed (`None`: nobody).
    pub holder: Option<String>,
    /// When the last successful renewal (or the acquisition) was sent, while leading.
    pub renewed_at: Option<Instant>,
    /// While leading: the instant after which this process must stop acting as leader, unless a renewal
    /// succeeds first (last renewal sent + renew deadline).
    pub valid_until: Option<Instant>,
}

impl LeaderState {
    /// Whether this process leads and may still act as leader at `now`.
    pub fn is_valid_leader(&self, now: Instant) -> bool {
        self.role == Role::Leading && self.valid_until.is_some_and(|until| now < until)
    }
}

/// Why an elector's leadership ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Cancelled before it led.
    CancelledBeforeLeading,
    /// Cancelled while leading; the Lease was released (or left to expire when release is off or failed).
    Released,
    /// Leadership was lost.
    Lost(LossReason),
}

/// How leadership was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LossReason {
    /// No renewal succeeded before the renew deadline.
    RenewDeadline,
    /// Another candidate holds the Lease now.
    TakenBy(String),
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LossReason::RenewDeadline => f.write_str("no renewal succeeded before the renew deadline"),
            LossReason::TakenBy(holder) => write!(f, "the lease is now held by {holder}"),
        }
    }
}

/// What the watch on the Lease reports.
enum Update {
    Object(Box<DynamicObject>),
    Deleted,
    Failing,
}

/// The record last seen to change, and when (local monotonic time).
#[derive(Debug, Clone)]
struct Observed {
    record: LeaderRecord,
    at: Instant,
}

impl Observed {
    fn expires_at(&self) -> Instant {
        self.at + Duration::from_secs(u64::try_from(self.record.lease_duration_seconds.max(0)).unwrap_or(0))
    }
}

/// A failed API call, or a renewal that found the Lease no longer ours.
#[derive(Debug)]
enum CallError {
    Timeout,
    Api(kube::Error),
    NotHolder,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Timeout => f.write_str("timed out"),
            CallError::Api(error) => write!(f, "{error}"),
            CallError::NotHolder => f.write_str("another candidate holds the lease"),
        }
    }
}

impl CallError {
    fn code(&self) -> Option<u16> {
        match self {
            CallError::Api(kube::Error::Api(status)) => Some(status.code),
            _ => None,
        }
    }
}

/// Outcome of one acquisition attempt.
enum Attempt {
    Acquired { sent: Instant },
    HeldByOther,
}

/// One candidate for one Lease.
pub struct LeaderElector {
    api: Api<DynamicObject>,
    config: ElectorConfig,
    state: watch::Sender<LeaderState>,
    observed: Option<Observed>,
    /// The Lease as last read or written, whose resourceVersion the next PUT is conditional on.
    cached: Option<DynamicObject>,
    updates: mpsc::Receiver<Update>,
    watch_healthy: bool,
    watch_task: tokio::task::JoinHandle<()>,
}

impl Drop for LeaderElector {
    fn drop(&mut self) {
        self.watch_task.abort();
    }
}

fn lease_resource() -> ApiResource {
    ApiResource::erase::<k8s_openapi::api::coordination::v1::Lease>(&())
}

fn jittered(period: Duration, factor: f64) -> Duration {
    period.mul_f64(1.0 + rand::random::<f64>() * factor)
}

impl LeaderElector {
    /// An elector using `client` (whose `User-Agent` should name the process and `leader-election`).
    ///
    /// The client should not retry on its own: kube's default retries 429/503/504 for minutes, while the
    /// elector must decide within the renew deadline. Every call here has a timeout either way.
    pub fn new(
        client: kube::Client,
        config: ElectorConfig,
    ) -> Result<(LeaderElector, watch::Receiver<LeaderState>), ElectorConfigError> {
        config.validate()?;
        let api: Api<DynamicObject> = Api::namespaced_with(client, &config.namespace, &lease_resource());
        let (state, receiver) = watch::channel(LeaderState {
            lease: config.lease_name.clone(),
            role: Role::Standby,
            holder: None,
            renewed_at: None,
            valid_until: None,
        });
        let (sender, updates) = mpsc::channel(64);
        let watch_task = tokio::spawn(follow(api.clone(), config.lease_name.clone(), sender));
        let elector = LeaderElector {
            api,
            config,
            state,
            observed: None,
            cached: None,
            updates,
            watch_healthy: false,
            watch_task,
        };
        Ok((elector, receiver))
    }

    /// The settings.
    pub fn config(&self) -> &ElectorConfig {
        &self.config
    }

    /// Campaigns until this process leads, then leads until leadership is lost or `cancel` fires.
    pub async fn run(&mut self, cancel: &CancellationToken) -> Ended {
        let (_always, permitted) = watch::channel(true);
        self.run_when_permitted(permitted, cancel).await
    }

    /// As [`LeaderElector::run`], but makes no attempt to take the Lease while `permit` is false; it still
    /// follows the Lease meanwhile, so that once permitted it already knows how long the record has been
    /// unchanged. (A migration lock may be taken only while the main lock is held; observing it before
    /// then is what lets a new leader take over a crashed one's migration lock one lease duration after the
    /// crash, not two.)
    pub async fn run_when_permitted(
        &mut self,
        permit: watch::Receiver<bool>,
        cancel: &CancellationToken,
    ) -> Ended {
        let Some(sent) = self.acquire(permit, cancel).await else {
            return Ended::CancelledBeforeLeading;
        };
        tracing::info!(lease = %self.config.lease_name, identity = %self.config.identity, "acquired the lease");
        let ended = self.lead(sent, cancel).await;
        self.publish(Role::Standby, None, None);
        ended
    }

    fn publish(&self, role: Role, renewed_at: Option<Instant>, valid_until: Option<Instant>) {
        let holder = self
            .observed
            .as_ref()
            .map(|o| o.record.holder_identity.clone())
            .filter(|h| !h.is_empty());
        self.state.send_replace(LeaderState {
            lease: self.config.lease_name.clone(),
            role,
            holder,
            renewed_at,
            valid_until,
        });
    }

    fn observe(&mut self, object: DynamicObject) {
        let record = LeaderRecord::from_lease(&to_value(&object));
        let changed = self.observed.as_ref().is_none_or(|o| o.record != record);
        if changed {
            self.observed = Some(Observed {
                record,
                at: Instant::now(),
            });
        }
        self.cached = Some(object);
        if changed && self.state.borrow().role == Role::Standby {
            self.publish(Role::Standby, None, None);
        }
    }

    fn apply_update(&mut self, update: Update) {
        match update {
            Update::Object(object) => {
                self.watch_healthy = true;
                // A watch event older than what we wrote must not roll the cache back.
                let newer = match (&self.cached, version(&object)) {
                    (Some(cached), Some(incoming)) => {
                        version(cached).is_none_or(|current| incoming >= current)
                    }
                    _ => true,
                };
                if newer {
                    self.observe(*object);
                }
            }
            Update::Deleted => {
                self.watch_healthy = true;
                self.cached = None;
                self.observed = None;
            }
            Update::Failing => self.watch_healthy = false,
        }
    }

    /// Runs one API call, giving up at `deadline`.
    async fn call<T>(
        &self,
        deadline: Instant,
        future: impl Future<Output = kube::Result<T>>,
    ) -> Result<T, CallError> {
        match tokio::time::timeout_at(deadline, future).await {
            Ok(result) => result.map_err(CallError::Api),
            Err(_) => Err(CallError::Timeout),
        }
    }

    async fn get(&mut self, deadline: Instant) -> Result<Option<DynamicObject>, CallError> {
        let api = self.api.clone();
        let object = self.call(deadline, api.get_opt(&self.config.lease_name)).await?;
        match &object {
            Some(object) => self.observe(object.clone()),
            None => {
                self.cached = None;
                self.observed = None;
            }
        }
        Ok(object)
    }

    /// PUTs `record` over `current`; on success the result is cached and observed.
    async fn put(
        &mut self,
        current: &DynamicObject,
        record: &LeaderRecord,
        deadline: Instant,
    ) -> Result<(), CallError> {
        let body: DynamicObject =
            serde_json::from_value(record.write_into(&to_value(current))).expect("a Lease stays a Lease");
        let api = self.api.clone();
        let written = self
            .call(
                deadline,
                api.replace(&self.config.lease_name, &PostParams::default(), &body),
            )
            .await?;
        self.observe(written);
        Ok(())
    }

    /// One attempt: client-go's `tryAcquireOrRenew` for a candidate that does not lead.
    async fn try_acquire(&mut self, deadline: Instant) -> Result<Attempt, CallError> {
        let current = match self.cached.clone() {
            Some(current) => current,
            None => match self.get(deadline).await? {
                Some(current) => current,
                None => return self.try_create(deadline).await,
            },
        };
        let observed = self.observed.clone().expect("observed with the cached object");
        let holder = &observed.record.holder_identity;
        if !holder.is_empty() && *holder != self.config.identity && Instant::now() < observed.expires_at() {
            return Ok(Attempt::HeldByOther);
        }
        let record = LeaderRecord::acquired_by(
            &observed.record,
            &self.config.identity,
            self.config.lease_duration_seconds(),
            &micro_time_now(),
        );
        let sent = Instant::now();
        match self.put(&current, &record, deadline).await {
            Ok(()) => Ok(Attempt::Acquired { sent }),
            Err(error) if matches!(error.code(), Some(409 | 404)) => {
                // Someone else wrote first: read what they wrote, which resets our view of its expiry.
                self.cached = None;
                self.get(deadline).await?;
                Ok(Attempt::HeldByOther)
            }
            Err(error) => Err(error),
        }
    }

    async fn try_create(&mut self, deadline: Instant) -> Result<Attempt, CallError> {
        let record = LeaderRecord::created_by(
            &self.config.identity,
            self.config.lease_duration_seconds(),
            &micro_time_now(),
        );
        let skeleton = serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.config.lease_name, "namespace": self.config.namespace},
        });
        let body: DynamicObject = serde_json::from_value(record.write_into(&skeleton)).expect("a Lease");
        let sent = Instant::now();
        let api = self.api.clone();
        match self
            .call(deadline, api.create(&PostParams::default(), &body))
            .await
        {
            Ok(created) => {
                self.observe(created);
                Ok(Attempt::Acquired { sent })
            }
            Err(error) if error.code() == Some(409) => {
                self.get(deadline).await?;
                Ok(Attempt::HeldByOther)
            }
            Err(error) => Err(error),
        }
    }

    /// Campaigns until acquired (`Some(when the winning write was sent)`) or cancelled; attempts only while
    /// `permit` is true.
    async fn acquire(
        &mut self,
        mut permit: watch::Receiver<bool>,
        cancel: &CancellationToken,
    ) -> Option<Instant> {
        let mut retry_at = Instant::now();
        let mut poll_at = Instant::now();
        loop {
            if !*permit.borrow_and_update() {
                tokio::select! {
                    () = cancel.cancelled() => return None,
                    changed = permit.changed() => if changed.is_err() { return None },
                    update = self.updates.recv() => match update {
                        Some(update) => self.apply_update(update),
                        None => self.watch_healthy = false,
                    },
                }
                continue;
            }
            let now = Instant::now();
            let may_take = self.observed.as_ref().is_none_or(|o| {
                o.record.holder_identity.is_empty()
                    || o.record.holder_identity == self.config.identity
                    || now >= o.expires_at()
            });
            let polling = !self.watch_healthy;
            if now >= retry_at && (may_take || (polling && now >= poll_at)) {
                let deadline = now + self.config.renew_deadline;
                match self.try_acquire(deadline).await {
                    Ok(Attempt::Acquired { sent }) => return Some(sent),
                    Ok(Attempt::HeldByOther) => {}
                    Err(error) => {
                        tracing::warn!(lease = %self.config.lease_name, %error, "cannot acquire the lease; retrying");
                        retry_at = Instant::now() + jittered(self.config.retry_period, 1.2);
                    }
                }
                poll_at = Instant::now() + jittered(self.config.retry_period, 1.2);
                continue;
            }
            // Sleep until something can change the decision.
            let expiry = self
                .observed
                .as_ref()
                .map(Observed::expires_at)
                .filter(|_| !may_take);
            let mut wake = [
                expiry,
                polling.then_some(poll_at),
                (now < retry_at).then_some(retry_at),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(now + self.config.lease_duration);
            if wake <= now {
                wake = now + Duration::from_millis(1);
            }
            tokio::select! {
                () = cancel.cancelled() => return None,
                update = self.updates.recv() => match update {
                    Some(update) => self.apply_update(update),
                    None => self.watch_healthy = false,
                },
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// Leads: renews every retry period until the renew deadline passes without a renewal, another
    /// candidate is seen holding the Lease, or `cancel` fires.
    async fn lead(&mut self, acquired_sent: Instant, cancel: &CancellationToken) -> Ended {
        let mut last_sent = acquired_sent;
        self.publish(
            Role::Leading,
            Some(last_sent),
            Some(last_sent + self.config.renew_deadline),
        );
        loop {
            let next = last_sent + self.config.retry_period;
            loop {
                tokio::select! {
                    () = cancel.cancelled() => {
                        self.release().await;
                        return Ended::Released;
                    }
                    update = self.updates.recv() => {
                        match update {
                            Some(update) => self.apply_update(update),
                            None => self.watch_healthy = false,
                        }
                        if let Some(holder) = self.foreign_holder() {
                            return Ended::Lost(LossReason::TakenBy(holder));
                        }
                        continue;
                    }
                    () = tokio::time::sleep_until(next) => break,
                }
            }
            let deadline = last_sent + self.config.renew_deadline;
            loop {
                let now = Instant::now();
                if now >= deadline {
                    return Ended::Lost(LossReason::RenewDeadline);
                }
                let sent = now;
                match self.renew(deadline).await {
                    Ok(()) => {
                        last_sent = sent;
                        self.publish(
                            Role::Leading,
                            Some(last_sent),
                            Some(last_sent + self.config.renew_deadline),
                        );
                        break;
                    }
                    Err(_) if self.foreign_holder().is_some() => {
                        return Ended::Lost(LossReason::TakenBy(self.foreign_holder().unwrap_or_default()));
                    }
                    Err(CallError::Timeout) => return Ended::Lost(LossReason::RenewDeadline),
                    Err(error) => {
                        tracing::warn!(lease = %self.config.lease_name, %error, "cannot renew the lease; retrying until the renew deadline");
                        let retry = (Instant::now() + self.config.retry_period / 2).min(deadline);
                        tokio::select! {
                            () = cancel.cancelled() => {
                                self.release().await;
                                return Ended::Released;
                            }
                            () = tokio::time::sleep_until(retry) => {}
                        }
                    }
                }
            }
        }
    }

    fn foreign_holder(&self) -> Option<String> {
        self.observed
            .as_ref()
            .map(|o| o.record.holder_identity.clone())
            .filter(|holder| *holder != self.config.identity)
            .map(|holder| {
                if holder.is_empty() {
                    "nobody (released)".to_owned()
                } else {
                    holder
                }
            })
    }

    async fn renew(&mut self, deadline: Instant) -> Result<(), CallError> {
        let current = match self.cached.clone() {
            Some(current) => current,
            None => match self.get(deadline).await? {
                Some(current) => current,
                // Deleted under us: recreate it, as client-go's slow path does.
                None => {
                    return match self.try_create(deadline).await? {
                        Attempt::Acquired { .. } => Ok(()),
                        Attempt::HeldByOther => Err(CallError::NotHolder),
                    };
                }
            },
        };
        let observed = self.observed.clone().expect("observed with the cached object");
        if observed.record.holder_identity != self.config.identity {
            return Err(CallError::NotHolder);
        }
        let record = LeaderRecord::acquired_by(
            &observed.record,
            &self.config.identity,
            self.config.lease_duration_seconds(),
            &micro_time_now(),
        );
        match self.put(&current, &record, deadline).await {
            Err(error) if error.code() == Some(409) => {
                // Our cached version is stale (a field we do not own changed, or someone else wrote): re-read.
                self.cached = None;
                self.get(deadline).await?;
                Err(error)
            }
            other => other,
        }
    }

    /// Clears the holder, so a standby takes over without waiting for the lease to expire.
    async fn release(&mut self) {
        if !self.config.release_on_cancel {
            return;
        }
        let deadline = Instant::now() + self.config.renew_deadline.min(self.config.retry_period * 2);
        for _ in 0..2 {
            let Some(current) = self.cached.clone() else {
                if self.get(deadline).await.is_err() {
                    break;
                }
                continue;
            };
            let Some(observed) = self.observed.clone() else {
                break;
            };
            if observed.record.holder_identity != self.config.identity {
                return;
            }
            match self
                .put(
                    &current,
                    &LeaderRecord::released(&observed.record, &micro_time_now()),
                    deadline,
                )
                .await
            {
                Ok(()) => {
                    tracing::info!(lease = %self.config.lease_name, "released the lease");
                    return;
                }
                Err(error) if error.code() == Some(409) => self.cached = None,
                Err(error) => {
                    tracing::warn!(lease = %self.config.lease_name, %error, "cannot release the lease; it will expire");
                    return;
                }
            }
        }
    }
}

fn to_value(object: &DynamicObject) -> Value {
    serde_json::to_value(object).expect("a DynamicObject serialises")
}

fn version(object: &DynamicObject) -> Option<u64> {
    object
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
}

/// Follows the Lease with a watch, sending what changes; stops when the elector is dropped.
async fn follow(api: Api<DynamicObject>, name: String, sender: mpsc::Sender<Update>) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    let mut seen_in_list = false;
    while let Some(event) = events.next().await {
        let update = match event {
            Ok(watcher::Event::Init) => {
                seen_in_list = false;
                continue;
            }
            Ok(watcher::Event::InitApply(object)) => {
                seen_in_list = true;
                Update::Object(Box::new(object))
            }
            Ok(watcher::Event::InitDone) if !seen_in_list => Update::Deleted,
            Ok(watcher::Event::InitDone) => continue,
            Ok(watcher::Event::Apply(object)) => Update::Object(Box::new(object)),
            Ok(watcher::Event::Delete(_)) => Update::Deleted,
            Err(error) => {
                tracing::debug!(lease = %name, %error, "watch on the lease is failing; polling instead");
                Update::Failing
            }
        };
        if sender.send(update).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ElectorConfig {
        ElectorConfig {
            namespace: "kube-system".into(),
            lease_name: "l".into(),
            identity: "me".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            release_on_cancel: true,
        }
    }

    #[test]
    fn upstream_constraints() {
        assert_eq!(config().validate(), Ok(()));
        let check = |change: fn(&mut ElectorConfig)| {
            let mut c = config();
            change(&mut c);
            c.validate().unwrap_err().to_string()
        };
        assert!(
            check(|c| c.lease_duration = Duration::from_millis(1500)).contains("whole number of seconds")
        );
        assert!(
            check(|c| c.renew_deadline = Duration::from_secs(15))
                .contains("must be greater than --leader-elect-renew-deadline")
        );
        assert!(
            check(|c| c.retry_period = Duration::from_millis(8500))
                .contains("1.2 × --leader-elect-retry-period")
        );
        assert!(check(|c| c.identity.clear()).contains("identity"));
    }

    #[test]
    fn expiry_is_local_observation_time_plus_the_records_duration() {
        let at = Instant::now();
        let observed = Observed {
            record: LeaderRecord {
                lease_duration_seconds: 7,
                ..LeaderRecord::default()
            },
            at,
        };
        assert_eq!(observed.expires_at(), at + Duration::from_secs(7));
    }
}
