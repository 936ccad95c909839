//! What every cloud call is handed: a deadline, a cancellation signal, and who is calling.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::CloudError;

/// The context of one cloud call.
///
/// **The contract for provider authors.** The deadline is never later than the validity of the lock the
/// calling controller runs under (nor than its call timeout): after it, another process may be acting on
/// the same cloud objects. Pass it to your SDK's request timeout ([`CallContext::remaining`]) and stop
/// retrying when [`CallContext::cancellation`] fires. The framework also runs every call through
/// [`CallContext::guard`], which drops the call's future at the deadline or on cancellation, closing its
/// connections; a provider that keeps work going in spawned tasks must tie them to this context itself.
#[derive(Debug, Clone)]
pub struct CallContext {
    deadline: Instant,
    cancel: CancellationToken,
    caller: String,
}

impl CallContext {
    /// A context ending at `deadline` or when `cancel` fires; `caller` names who calls (the identity and
    /// controller, e.g. `host_1234/service-lb-controller`), for the cloud's logs.
    pub fn new(deadline: Instant, cancel: CancellationToken, caller: &str) -> CallContext {
        CallContext {
            deadline,
            cancel,
            caller: caller.to_owned(),
        }
    }

    /// A context for tests and tools: `timeout` from now, never cancelled.
    pub fn with_timeout(timeout: Duration) -> CallContext {
        CallContext::new(Instant::now() + timeout, CancellationToken::new(), "")
    }

    /// When the call must be finished.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The time left until the deadline (zero once it passed).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Fires when the caller gives up (its controller is stopping).
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Who calls.
    pub fn caller(&self) -> &str {
        &self.caller
    }

    /// A context for a part of this call: the same cancellation and caller, a deadline no later than this
    /// one's.
    pub fn narrowed(&self, timeout: Duration) -> CallContext {
        CallContext {
            deadline: self.deadline.min(Instant::now() + timeout),
            cancel: self.cancel.clone(),
            caller: self.caller.clone(),
        }
    }

    /// Runs `call`, abandoning it (dropping its future) at the deadline ([`CloudError::Timeout`]) or on
    /// cancellation ([`CloudError::Cancelled`]).
    pub async fn guard<T>(&self, call: impl Future<Output = Result<T, CloudError>>) -> Result<T, CloudError> {
        if self.cancel.is_cancelled() {
            return Err(CloudError::Cancelled);
        }
        tokio::select! {
            () = self.cancel.cancelled() => Err(CloudError::Cancelled),
            outcome = tokio::time::timeout_at(self.deadline, call) => {
                outcome.unwrap_or(Err(CloudError::Timeout))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn calls_are_abandoned_at_the_deadline_or_on_cancellation() {
        let cx = CallContext::with_timeout(Duration::from_secs(5));
        let slow = async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, CloudError>(1)
        };
        assert!(matches!(cx.guard(slow).await, Err(CloudError::Timeout)));
        assert_eq!(cx.guard(async { Ok(2) }).await.unwrap(), 2);

        let cancel = CancellationToken::new();
        let cx = CallContext::new(Instant::now() + Duration::from_secs(60), cancel.clone(), "me/c");
        let pending = std::future::pending::<Result<(), CloudError>>();
        let (outcome, ()) = tokio::join!(cx.guard(pending), async { cancel.cancel() });
        assert!(matches!(outcome, Err(CloudError::Cancelled)));
        assert!(cx.narrowed(Duration::from_secs(1)).deadline() <= cx.deadline());
    }
}
