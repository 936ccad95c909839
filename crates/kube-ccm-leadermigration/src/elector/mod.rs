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

mod calls;
mod follow;
mod record;
mod state;

use std::time::Duration;

use kube::api::{Api, DynamicObject};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::timings::LeaseTimings;

pub use self::record::{LeaderRecord, micro_time_now};
pub use self::state::{Ended, LeaderState, LossReason, Role};

use self::calls::{Attempt, CallError, lease_resource, to_value, version};
use self::follow::{Update, follow};

/// The reason of the Event a process records about a Lease when it acquires it (client-go's lock records
/// the same), with the note [`became_leader`].
pub const EVENT_REASON: &str = "LeaderElection";

/// The note of the [`EVENT_REASON`] Event: "`<identity>` became leader", as client-go writes it.
pub fn became_leader(identity: &str) -> String {
    format!("{identity} became leader")
}

/// The identity in a note written by [`became_leader`] (client-go's included); `None` for any other note.
pub fn who_became_leader(note: &str) -> Option<&str> {
    note.strip_suffix(" became leader")
        .filter(|identity| !identity.is_empty())
}

/// Settings of one elector, as upstream's `--leader-elect-*` flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectorConfig {
    /// Namespace of the Lease (`--leader-elect-resource-namespace`).
    pub namespace: String,
    /// Name of the Lease (`--leader-elect-resource-name`, or a migration lease).
    pub lease_name: String,
    /// This candidate's identity: `<hostname>_<uuid>`, as upstream.
    pub identity: String,
    /// Lease duration, renew deadline and retry period.
    pub timings: LeaseTimings,
    /// Clear the holder when leadership ends by cancellation, so a standby takes over at once.
    pub release_on_cancel: bool,
}

/// Settings that cannot work (the timings are valid by construction).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElectorConfigError {
    /// No identity.
    #[error("the leader-election identity is empty")]
    Identity,
}

impl ElectorConfig {
    /// Checks what [`LeaseTimings`] does not.
    pub fn validate(&self) -> Result<(), ElectorConfigError> {
        if self.identity.is_empty() {
            return Err(ElectorConfigError::Identity);
        }
        Ok(())
    }

    fn lease_duration_seconds(&self) -> i64 {
        i64::from(self.timings.lease_duration_seconds())
    }
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
                let deadline = now + self.config.timings.renew_deadline();
                match self.try_acquire(deadline).await {
                    Ok(Attempt::Acquired { sent }) => return Some(sent),
                    Ok(Attempt::HeldByOther) => {}
                    Err(error) => {
                        tracing::warn!(lease = %self.config.lease_name, %error, "cannot acquire the lease; retrying");
                        retry_at = Instant::now() + jittered(self.config.timings.retry_period(), 1.2);
                    }
                }
                poll_at = Instant::now() + jittered(self.config.timings.retry_period(), 1.2);
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
            .unwrap_or(now + self.config.timings.lease_duration());
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
            Some(last_sent + self.config.timings.renew_deadline()),
        );
        loop {
            let next = last_sent + self.config.timings.retry_period();
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
            let deadline = last_sent + self.config.timings.renew_deadline();
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
                            Some(last_sent + self.config.timings.renew_deadline()),
                        );
                        break;
                    }
                    Err(_) if self.foreign_holder().is_some() => {
                        return Ended::Lost(LossReason::TakenBy(self.foreign_holder().unwrap_or_default()));
                    }
                    Err(CallError::Timeout) => return Ended::Lost(LossReason::RenewDeadline),
                    Err(error) => {
                        tracing::warn!(lease = %self.config.lease_name, %error, "cannot renew the lease; retrying until the renew deadline");
                        let retry = (Instant::now() + self.config.timings.retry_period() / 2).min(deadline);
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
        let deadline = Instant::now()
            + self
                .config
                .timings
                .renew_deadline()
                .min(self.config.timings.retry_period() * 2);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leader_election_note_reads_back_its_identity() {
        let note = became_leader("cp-1_3f2a");
        assert_eq!(note, "cp-1_3f2a became leader");
        assert_eq!(who_became_leader(&note), Some("cp-1_3f2a"));
        // client-go's "stopped leading" note, and a note with no identity, name nobody.
        assert_eq!(who_became_leader("cp-1_3f2a stopped leading"), None);
        assert_eq!(who_became_leader(" became leader"), None);
    }

    #[test]
    fn an_empty_identity_is_refused() {
        let config = ElectorConfig {
            namespace: "kube-system".into(),
            lease_name: "l".into(),
            identity: "me".into(),
            timings: LeaseTimings::upstream_defaults(),
            release_on_cancel: true,
        };
        assert_eq!(config.validate(), Ok(()));
        let anonymous = ElectorConfig {
            identity: String::new(),
            ..config
        };
        assert_eq!(anonymous.validate(), Err(ElectorConfigError::Identity));
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
