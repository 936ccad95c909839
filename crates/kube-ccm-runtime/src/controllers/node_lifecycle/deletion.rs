//! When the lifecycle controller may delete a node whose instance the cloud says is gone (decision 0033).
//!
//! Upstream deletes a not-ready node on the first "gone" answer, so a cloud that answers "gone" for a
//! moment (eventual consistency after a launch) or for everything (a wrong region or account in a new
//! cloud-config) deletes nodes that run. Here a deletion needs three things:
//! - **Confirmation**: the cloud said "gone" at least [`NodeDeletion::confirm_after`] before, and said so
//!   again now, with no "exists" in between (an error is no answer either way).
//! - **A closed breaker**: in this round, the cloud did not answer "gone" for more than
//!   [`NodeDeletion::breaker_ratio`] of the nodes it was asked about. Those are the not-ready nodes and as
//!   many ready ones (whose kubelets report, so whose instances surely run): a cloud that answers "gone"
//!   for everything trips it, one terminated instance never does.
//! - **Room in the round**: at most [`NodeDeletion::max_per_round`] nodes go in one round, the longest
//!   confirmed first; the others wait for the next round, where they need a "gone" answer again.
//!
//! Everything here is pure: the round's answers in, the deletions out, and what is remembered between
//! rounds ([`GoneSince`]) lives only as long as the controller's tenure (a new leader confirms afresh).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// How certain the cloud's "gone" must be before a node is deleted (`--node-deletion-*`).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeDeletion {
    /// The least time between the first "gone" answer and the one that deletes
    /// (`--node-deletion-confirm-after`; zero: one `--node-monitor-period`).
    pub confirm_after: Duration,
    /// The breaker trips when more than this share of the nodes asked about in a round are answered
    /// "gone" (`--node-deletion-breaker-ratio`; 1 turns it off). A single "gone" never trips it.
    pub breaker_ratio: f64,
    /// The most nodes one round deletes (`--node-deletion-max-per-round`; 0: none ever).
    pub max_per_round: u32,
}

impl Default for NodeDeletion {
    fn default() -> Self {
        NodeDeletion {
            confirm_after: Duration::ZERO,
            breaker_ratio: 0.5,
            max_per_round: 10,
        }
    }
}

/// What the cloud answered about one not-ready node's instance this round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answer {
    /// It exists.
    Exists,
    /// It is gone.
    Gone,
    /// No answer (an error): it neither confirms nor contradicts.
    Unknown,
}

/// One round's answers, as [`GoneSince::decide`] reads them.
#[derive(Debug)]
pub(super) struct Round<'a> {
    /// When the cloud was asked.
    pub(super) at: Instant,
    /// Each not-ready node's UID and its answer.
    pub(super) answers: &'a [(&'a str, Answer)],
    /// The ready nodes asked about alongside, and how many of them were answered "gone" (errors left out).
    pub(super) cross_checked: usize,
    /// Of `cross_checked`, those answered "gone".
    pub(super) cross_checked_gone: usize,
}

/// Why a round deleted nothing although some nodes' instances were answered "gone".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the cloud answered that {gone} of the {asked} nodes asked about are gone ({ready_gone} of them ready), \
     more than --node-deletion-breaker-ratio allows: deleting none this round"
)]
pub(super) struct Held {
    /// Nodes answered "gone", the ready ones included.
    pub(super) gone: usize,
    /// Nodes answered at all.
    pub(super) asked: usize,
    /// Ready nodes answered "gone".
    pub(super) ready_gone: usize,
}

/// What a round does about the not-ready nodes answered "gone".
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Decision {
    /// Indexes into the round's answers of the nodes to delete now.
    pub(super) delete: Vec<usize>,
    /// Nodes answered "gone" that are not deleted this round (not yet confirmed, held, or over the cap).
    pub(super) waiting: usize,
    /// Set when the breaker tripped.
    pub(super) held: Option<Held>,
}

/// For each not-ready node (by UID), when the cloud first answered "gone" with no "exists" since.
#[derive(Debug, Default)]
pub(super) struct GoneSince(HashMap<String, Instant>);

impl GoneSince {
    /// Records the round's answers and decides which nodes go. `period` is `--node-monitor-period`, the
    /// confirmation delay when `policy` has none.
    pub(super) fn decide(&mut self, policy: &NodeDeletion, period: Duration, round: &Round<'_>) -> Decision {
        // A node not asked about this round (ready again, deleted, or no longer ours) starts afresh.
        self.0
            .retain(|uid, _| round.answers.iter().any(|(u, _)| u == uid));
        for (uid, answer) in round.answers {
            match answer {
                Answer::Gone => {
                    self.0.entry((*uid).to_owned()).or_insert(round.at);
                }
                Answer::Exists => {
                    self.0.remove(*uid);
                }
                Answer::Unknown => {}
            }
        }
        let gone_now: Vec<usize> = (0..round.answers.len())
            .filter(|&i| round.answers[i].1 == Answer::Gone)
            .collect();
        let answered = round
            .answers
            .iter()
            .filter(|(_, a)| *a != Answer::Unknown)
            .count();
        let gone = gone_now.len() + round.cross_checked_gone;
        let asked = answered + round.cross_checked;
        #[allow(clippy::cast_precision_loss)] // counts of nodes: far below 2^52
        let tripped = gone > 1 && gone as f64 > policy.breaker_ratio * asked as f64;
        if tripped {
            return Decision {
                delete: Vec::new(),
                waiting: gone_now.len(),
                held: Some(Held {
                    gone,
                    asked,
                    ready_gone: round.cross_checked_gone,
                }),
            };
        }
        let confirm_after = if policy.confirm_after.is_zero() {
            period
        } else {
            policy.confirm_after
        };
        let mut confirmed: Vec<(Instant, usize)> = gone_now
            .iter()
            .filter_map(|&i| {
                let since = *self.0.get(round.answers[i].0)?;
                (round.at.saturating_duration_since(since) >= confirm_after).then_some((since, i))
            })
            .collect();
        // The longest confirmed first; the round's order among equals.
        confirmed.sort();
        confirmed.truncate(usize::try_from(policy.max_per_round).unwrap_or(usize::MAX));
        let delete: Vec<usize> = confirmed.into_iter().map(|(_, i)| i).collect();
        Decision {
            waiting: gone_now.len() - delete.len(),
            delete,
            held: None,
        }
    }

    /// How many nodes wait for their "gone" to be confirmed or acted on.
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// Forgets a node (deleted).
    pub(super) fn forget(&mut self, uid: &str) {
        self.0.remove(uid);
    }
}

#[cfg(test)]
mod tests;
