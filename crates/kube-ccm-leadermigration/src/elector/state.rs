//! What an elector publishes and how leadership ends.

use tokio::time::Instant;

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
