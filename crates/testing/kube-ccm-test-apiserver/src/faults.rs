//! Faults a test injects, for all clients or those whose `User-Agent` contains a pattern.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// What a fault does to a matching request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FaultAction {
    /// Delay the request before it is handled.
    Latency {
        /// Added delay.
        ms: u64,
    },
    /// Answer with an error at this rate (0.0–1.0) instead of handling the request.
    Error {
        /// 500, 503 or 429.
        code: u16,
        /// Probability per request.
        rate: f64,
        /// `Retry-After` for 429 and 503; 1 s when absent.
        #[serde(default)]
        retry_after_seconds: Option<u64>,
    },
    /// The client is cut off: its requests hang until it drops them, and its open watches end.
    Partition,
}

/// A fault: which clients, what, and for how long.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultSpec {
    /// Substring of the `User-Agent` to match; every client when absent.
    #[serde(default)]
    pub user_agent: Option<String>,
    /// What happens to matching requests.
    pub action: FaultAction,
    /// How long the fault lasts from when it is added; until removed when absent.
    #[serde(default)]
    pub duration_ms: Option<u64>,
}

impl FaultSpec {
    pub(crate) fn matches(&self, user_agent: &str) -> bool {
        self.user_agent
            .as_deref()
            .is_none_or(|pattern| user_agent.contains(pattern))
    }
}

/// What to do with one request, after every matching fault has been considered.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Verdict {
    pub(crate) delay: Duration,
    pub(crate) error: Option<(u16, u64)>,
    pub(crate) hang: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Faults {
    next_id: u64,
    active: Vec<(u64, FaultSpec, Option<Instant>)>,
}

impl Faults {
    pub(crate) fn add(&mut self, spec: FaultSpec) -> u64 {
        self.next_id += 1;
        let expires = spec
            .duration_ms
            .map(|ms| Instant::now() + Duration::from_millis(ms));
        self.active.push((self.next_id, spec, expires));
        self.next_id
    }

    pub(crate) fn remove(&mut self, id: u64) -> bool {
        let before = self.active.len();
        self.active.retain(|(i, _, _)| *i != id);
        self.active.len() != before
    }

    pub(crate) fn clear(&mut self) {
        self.active.clear();
    }

    pub(crate) fn list(&mut self) -> Vec<(u64, FaultSpec)> {
        self.expire();
        self.active
            .iter()
            .map(|(id, spec, _)| (*id, spec.clone()))
            .collect()
    }

    fn expire(&mut self) {
        let now = Instant::now();
        self.active
            .retain(|(_, _, expires)| expires.is_none_or(|e| e > now));
    }

    /// The verdict for one request; `roll` gives uniform numbers in [0, 1) for error rates.
    pub(crate) fn verdict(&mut self, user_agent: &str, mut roll: impl FnMut() -> f64) -> Verdict {
        self.expire();
        let mut verdict = Verdict::default();
        for (_, spec, _) in self.active.iter().filter(|(_, spec, _)| spec.matches(user_agent)) {
            match &spec.action {
                FaultAction::Latency { ms } => verdict.delay += Duration::from_millis(*ms),
                FaultAction::Error {
                    code,
                    rate,
                    retry_after_seconds,
                } => {
                    if verdict.error.is_none() && roll() < *rate {
                        verdict.error = Some((*code, retry_after_seconds.unwrap_or(1)));
                    }
                }
                FaultAction::Partition => verdict.hang = true,
            }
        }
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_match_by_user_agent_and_combine() {
        let mut faults = Faults::default();
        faults.add(FaultSpec {
            user_agent: Some("ccm-a".into()),
            action: FaultAction::Latency { ms: 5 },
            duration_ms: None,
        });
        faults.add(FaultSpec {
            user_agent: None,
            action: FaultAction::Latency { ms: 7 },
            duration_ms: None,
        });
        let id = faults.add(FaultSpec {
            user_agent: Some("ccm-a".into()),
            action: FaultAction::Error {
                code: 503,
                rate: 0.5,
                retry_after_seconds: None,
            },
            duration_ms: None,
        });
        assert_eq!(
            faults.verdict("ccm-a/1.0", || 0.4),
            Verdict {
                delay: Duration::from_millis(12),
                error: Some((503, 1)),
                hang: false
            }
        );
        assert_eq!(faults.verdict("ccm-a/1.0", || 0.6).error, None);
        assert_eq!(
            faults.verdict("kubectl", || 0.0),
            Verdict {
                delay: Duration::from_millis(7),
                error: None,
                hang: false
            }
        );
        assert!(faults.remove(id));
        assert!(!faults.remove(id));
    }

    #[test]
    fn partitions_expire() {
        let mut faults = Faults::default();
        faults.add(FaultSpec {
            user_agent: Some("x".into()),
            action: FaultAction::Partition,
            duration_ms: Some(0),
        });
        assert!(
            !faults.verdict("x", || 0.0).hang,
            "a zero-length partition is already over"
        );
        faults.add(FaultSpec {
            user_agent: Some("x".into()),
            action: FaultAction::Partition,
            duration_ms: None,
        });
        assert!(faults.verdict("x", || 0.0).hang);
        assert!(!faults.verdict("y", || 0.0).hang);
    }
}
