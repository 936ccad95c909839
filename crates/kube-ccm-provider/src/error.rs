//! What a cloud call can fail with.

use std::sync::Arc;
use std::time::Duration;

/// An error from a cloud provider.
///
/// `Clone`, so that one failure of a batch call is every node's answer with its kind kept (a `Retry`
/// stays a `Retry`, a `Cancelled` a `Cancelled`); new kinds may be added (`#[non_exhaustive]`).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CloudError {
    /// The provider does not implement this call; callers fall back where upstream does.
    #[error("unimplemented")]
    NotImplemented,
    /// The instance does not exist (not for stopped instances).
    #[error("instance not found")]
    InstanceNotFound,
    /// Something other than this provider implements it (for example another controller owns the load
    /// balancer); the caller treats the call as done. `EnsureLoadBalancerDeleted` must not return it.
    #[error("implemented by alternate to cloud provider")]
    ImplementedElsewhere,
    /// Try again after exactly this long, instead of backing off exponentially (a dependency still
    /// going away, say). For the cloud's rate limit, use [`CloudError::Throttled`].
    #[error("retry after {after:?}: {message}")]
    Retry {
        /// When to try again.
        after: Duration,
        /// Why.
        message: String,
    },
    /// The cloud's API refused the request for its rate limit (EC2's `RequestLimitExceeded`, Compute's
    /// `rateLimitExceeded`, HTTP 429): try again after this long. Reported through
    /// [`CallContext::observe`](crate::CallContext::observe), it also pauses the process's
    /// [`RateBudget`](crate::RateBudget) for that long, so no controller adds to the storm.
    #[error("throttled by the cloud, retry after {after:?}: {message}")]
    Throttled {
        /// When to try again.
        after: Duration,
        /// The cloud's words.
        message: String,
    },
    /// The call did not finish before its deadline (the framework abandoned it).
    #[error("the cloud call did not finish before its deadline")]
    Timeout,
    /// The caller gave up (its controller is stopping).
    #[error("the cloud call was cancelled")]
    Cancelled,
    /// The provider's own failure.
    #[error(transparent)]
    Provider(Arc<dyn std::error::Error + Send + Sync>),
}

impl CloudError {
    /// Wraps a provider-specific error.
    pub fn provider(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> CloudError {
        CloudError::Provider(Arc::from(error.into()))
    }

    /// When to try again, for [`CloudError::Retry`] and [`CloudError::Throttled`]; `None` for the others
    /// (the caller backs off as it would).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            CloudError::Retry { after, .. } | CloudError::Throttled { after, .. } => Some(*after),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_keeps_the_kind_and_the_source() {
        let retry = CloudError::Retry {
            after: Duration::from_secs(3),
            message: "throttled".into(),
        };
        assert!(matches!(retry.clone(), CloudError::Retry { after, .. } if after == Duration::from_secs(3)));
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let provider = CloudError::provider(io);
        let copy = provider.clone();
        assert_eq!(copy.to_string(), "refused");
        let CloudError::Provider(inner) = copy else {
            panic!("the kind changed: {copy:?}");
        };
        assert_eq!(
            inner.downcast_ref::<std::io::Error>().map(std::io::Error::kind),
            Some(std::io::ErrorKind::ConnectionRefused)
        );
    }
}

/// Why a check says no: a provider ID the provider cannot interpret
/// ([`crate::CloudProvider::check_provider_id`]), a flag's value ([`crate::flags::FlagCheck`]), the
/// settings a controller needs, a health check. Its text is what the operator reads (a start-up error, an
/// Event, `/healthz`): say what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(String);

impl Refused {
    /// Refused because of `reason` (e.g. `not of the form gce://<project>/<zone>/<instance>`).
    pub fn new(reason: impl Into<String>) -> Refused {
        Refused(reason.into())
    }

    /// Why.
    pub fn reason(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

impl From<String> for Refused {
    fn from(reason: String) -> Refused {
        Refused(reason)
    }
}

impl From<&str> for Refused {
    fn from(reason: &str) -> Refused {
        Refused(reason.to_owned())
    }
}
