//! The elector's API calls: each under a deadline, a PUT conditional on the resourceVersion read, and
//! client-go's `tryAcquireOrRenew` for a candidate that does not lead.

use std::future::Future;

use kube::api::{ApiResource, DynamicObject, PostParams};
use serde_json::Value;
use tokio::time::Instant;

use super::LeaderElector;
use super::record::{LeaderRecord, micro_time_now};

/// A failed API call, or a renewal that found the Lease no longer ours.
#[derive(Debug)]
pub(super) enum CallError {
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
    pub(super) fn code(&self) -> Option<u16> {
        match self {
            CallError::Api(kube::Error::Api(status)) => Some(status.code),
            _ => None,
        }
    }
}

/// Outcome of one acquisition attempt.
pub(super) enum Attempt {
    Acquired { sent: Instant },
    HeldByOther,
}

impl LeaderElector {
    /// Runs one API call, giving up at `deadline`.
    pub(super) async fn call<T>(
        &self,
        deadline: Instant,
        future: impl Future<Output = kube::Result<T>>,
    ) -> Result<T, CallError> {
        match tokio::time::timeout_at(deadline, future).await {
            Ok(result) => result.map_err(CallError::Api),
            Err(_) => Err(CallError::Timeout),
        }
    }

    pub(super) async fn get(&mut self, deadline: Instant) -> Result<Option<DynamicObject>, CallError> {
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
    pub(super) async fn put(
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
    pub(super) async fn try_acquire(&mut self, deadline: Instant) -> Result<Attempt, CallError> {
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

    pub(super) async fn try_create(&mut self, deadline: Instant) -> Result<Attempt, CallError> {
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
}

pub(super) fn lease_resource() -> ApiResource {
    ApiResource::erase::<k8s_openapi::api::coordination::v1::Lease>(&())
}

pub(super) fn to_value(object: &DynamicObject) -> Value {
    serde_json::to_value(object).expect("a DynamicObject serialises")
}

pub(super) fn version(object: &DynamicObject) -> Option<u64> {
    object
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
}
