//! An independent witness of the Leases: a watch of the Lease objects from the test itself, judged by
//! the times the electors wrote into them (`acquireTime`, `renewTime`), so a hand-off is checked without
//! the API server's request records and without any replica's word.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::watcher;
use serde::Serialize;

/// One state of a Lease as the watch saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ObservedLease {
    /// Lease name.
    pub name: String,
    /// `holderIdentity` (`None` when empty: released).
    pub holder: Option<String>,
    /// `acquireTime`, microseconds since the epoch.
    pub acquire_us: Option<i64>,
    /// `renewTime`, microseconds since the epoch.
    pub renew_us: Option<i64>,
    /// `leaseDurationSeconds`.
    pub duration_s: Option<i64>,
}

/// A change of holder the watch saw.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WatchedHandoff {
    /// Lease name.
    pub lease: String,
    /// Previous holder.
    pub from: String,
    /// New holder.
    pub to: String,
    /// Whether the previous holder released the Lease first.
    pub released: bool,
    /// From the previous holder's last renewal (its release) to the new holder's acquisition, by the
    /// times they wrote.
    pub gap_ms: f64,
    /// A takeover of a record that had not expired by the rule of the new holder's elector.
    pub premature: bool,
}

/// A running watch of the Leases of one namespace; stops on drop.
pub struct LeaseWatch {
    seen: Arc<Mutex<Vec<ObservedLease>>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl LeaseWatch {
    /// Starts watching the Leases of `namespace` (the current states first).
    pub fn start(client: kube::Client, namespace: &str) -> LeaseWatch {
        let seen = Arc::new(Mutex::new(Vec::<ObservedLease>::new()));
        let record = Arc::clone(&seen);
        let api: Api<Lease> = Api::namespaced(client, namespace);
        let task = tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Some(event) = events.next().await {
                let lease = match event {
                    Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) => lease,
                    _ => continue,
                };
                let observed = observe(&lease);
                let mut seen = record.lock();
                // A re-list repeats the current state: keep changes only.
                if seen.iter().rev().find(|s| s.name == observed.name) != Some(&observed) {
                    seen.push(observed);
                }
            }
        });
        LeaseWatch {
            seen,
            task: Some(task),
        }
    }

    /// Every state seen so far, in order.
    pub fn seen(&self) -> Vec<ObservedLease> {
        self.seen.lock().clone()
    }

    /// Every change of holder seen so far. `client_go(identity)` says whether a holder's elector is
    /// client-go's, which sees `renewTime` in whole seconds and so may take a record over up to a second
    /// before its last renewal expires (see `ccm-audit`); the others must wait the full
    /// lease duration after the last renewal.
    pub fn handoffs(&self, client_go: impl Fn(&str) -> bool) -> Vec<WatchedHandoff> {
        let mut by_lease: BTreeMap<String, Vec<ObservedLease>> = BTreeMap::new();
        for state in self.seen() {
            by_lease.entry(state.name.clone()).or_default().push(state);
        }
        let mut handoffs = Vec::new();
        for (lease, states) in by_lease {
            // The holder's run of states, and whether it ended in a release.
            let mut run: Vec<&ObservedLease> = Vec::new();
            let mut released: Option<&ObservedLease> = None;
            for state in &states {
                match (&state.holder, run.last().and_then(|s| s.holder.as_ref())) {
                    (None, Some(_)) => released = Some(state),
                    (Some(holder), Some(previous)) if holder == previous && released.is_none() => {
                        run.push(state)
                    }
                    (Some(holder), previous) => {
                        if let (Some(from), Some(last)) = (previous.filter(|p| *p != holder), run.last()) {
                            let acquired = state.acquire_us.or(state.renew_us).unwrap_or(0);
                            let ended = released.unwrap_or(last);
                            let gap_us = acquired - ended.renew_us.or(last.renew_us).unwrap_or(0);
                            let counted_from = if client_go(holder) {
                                first_of_last_second(&run)
                            } else {
                                last
                            };
                            let allowed_us = acquired - counted_from.renew_us.unwrap_or(0);
                            let duration_us = last.duration_s.unwrap_or(0) * 1_000_000;
                            handoffs.push(WatchedHandoff {
                                lease: lease.clone(),
                                from: from.clone(),
                                to: holder.clone(),
                                released: released.is_some(),
                                gap_ms: gap_us as f64 / 1000.0,
                                premature: released.is_none() && allowed_us < duration_us,
                            });
                        }
                        run = vec![state];
                        released = None;
                    }
                    (None, None) => {}
                }
            }
        }
        handoffs
    }
}

impl Drop for LeaseWatch {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// The first state of the run's last whole second of `renewTime`: where a client-go follower starts
/// counting (it sees no change while the record, renewTime in seconds, stays the same).
fn first_of_last_second<'a>(run: &[&'a ObservedLease]) -> &'a ObservedLease {
    let second = |state: &ObservedLease| state.renew_us.map(|us| us.div_euclid(1_000_000));
    let last = run[run.len() - 1];
    run.iter()
        .rev()
        .take_while(|state| second(state) == second(last) && second(last).is_some())
        .last()
        .copied()
        .unwrap_or(last)
}

fn observe(lease: &Lease) -> ObservedLease {
    let spec = lease.spec.clone().unwrap_or_default();
    let micros = |time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime>| {
        time.map(|t| t.0.as_microsecond())
    };
    ObservedLease {
        name: lease.metadata.name.clone().unwrap_or_default(),
        holder: spec.holder_identity.filter(|h| !h.is_empty()),
        acquire_us: micros(spec.acquire_time),
        renew_us: micros(spec.renew_time),
        duration_s: spec.lease_duration_seconds.map(i64::from),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(holder: Option<&str>, acquire_ms: i64, renew_ms: i64) -> ObservedLease {
        ObservedLease {
            name: "cloud-controller-manager".into(),
            holder: holder.map(str::to_owned),
            acquire_us: Some(acquire_ms * 1000),
            renew_us: Some(renew_ms * 1000),
            duration_s: Some(2),
        }
    }

    fn judge(states: Vec<ObservedLease>, client_go: &[&str]) -> Vec<WatchedHandoff> {
        let watch = LeaseWatch {
            seen: Arc::new(Mutex::new(states)),
            task: None,
        };
        watch.handoffs(|identity| client_go.contains(&identity))
    }

    #[test]
    fn takeovers_are_judged_by_the_takers_rule_and_releases_are_not_takeovers() {
        // "rust" renews at 10.1, 10.5 and 10.9 s; "go" takes over at 12.2 s.
        let crash = |taker_ms| {
            vec![
                state(Some("rust"), 10_100, 10_100),
                state(Some("rust"), 10_100, 10_500),
                state(Some("rust"), 10_100, 10_900),
                state(Some("go"), taker_ms, taker_ms),
            ]
        };
        let handoffs = judge(crash(12_200), &["go"]);
        assert_eq!(handoffs.len(), 1);
        assert!(!handoffs[0].premature && !handoffs[0].released, "{handoffs:?}");
        assert_eq!(handoffs[0].gap_ms, 1_300.0);
        assert!(judge(crash(12_000), &["go"])[0].premature);
        // Our elector counts from the last renewal.
        assert!(judge(crash(12_200), &[])[0].premature);
        assert!(!judge(crash(12_950), &[])[0].premature);
        // A release first: never premature, the gap from the release.
        let handoffs = judge(
            vec![
                state(Some("rust"), 10_100, 10_900),
                state(None, 10_100, 11_000),
                state(Some("go"), 11_150, 11_150),
            ],
            &["go"],
        );
        assert!(handoffs[0].released && !handoffs[0].premature, "{handoffs:?}");
        assert_eq!(handoffs[0].gap_ms, 150.0);
    }
}
