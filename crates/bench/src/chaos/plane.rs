//! The replicas of the chaos run and their slots: starting, stopping, pausing and restarting them.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use harness::{Environment, Replica, Side};
use rand::Rng;
use rand::rngs::StdRng;
use tokio::time::Instant;

use crate::netns::Netns;

/// Where a replica runs: its own network namespace, with a kubeconfig and cloud-config that reach the
/// servers through its link.
pub(super) struct Slot {
    pub(super) netns: Netns,
    pub(super) kubeconfig: String,
    pub(super) cloud_config: String,
}

/// Which manager a slot runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Peer {
    /// This framework's binary.
    Rust,
    /// Upstream's Go cloud-controller-manager (`k8s.io/cloud-provider`'s app, with the Go `fake`
    /// provider on the same fake cloud), built by `cargo xtask kube`.
    Go,
}

pub(super) struct Plane {
    pub(super) environment: Environment,
    /// The Go peer's environment (its binary), when a slot runs it.
    pub(super) go: Option<Environment>,
    /// Which manager each slot runs.
    pub(super) peers: Vec<Peer>,
    /// Each replica and its slot (the slots are fixed; a replacement takes over its predecessor's).
    pub(super) replicas: Vec<(Replica, usize)>,
    pub(super) slots: Vec<Slot>,
    pub(super) paused: Vec<(usize, Instant)>,
    /// Slots whose link is down, until when.
    pub(super) cut: Vec<(usize, Instant)>,
    pub(super) next: u32,
    pub(super) wait: Duration,
    pub(super) stuck: Vec<String>,
    /// The identities of this framework's replicas (to tell their writes from the Go peer's).
    pub(super) ours: std::collections::BTreeSet<String>,
    pub(super) exits: BTreeMap<String, u32>,
}

/// How a replica is stopped before its replacement starts.
#[derive(Clone, Copy)]
pub(super) enum Stop {
    Kill,
    Terminate,
    /// It exited on its own.
    Exited,
}

/// A replica ending on its own ends this way: `exit(1)` after a lost lease.
pub(super) const EXPECTED_EXIT: &str = "exit status: 1";

impl Plane {
    pub(super) fn start(&mut self, side: Side, slot: usize) -> Result<()> {
        self.next += 1;
        let peer = self.peers.get(slot).copied().unwrap_or(Peer::Rust);
        let prefix = match (peer, side) {
            (Peer::Go, _) => "go-ccm",
            (Peer::Rust, Side::Kcm) => "kcm",
            (Peer::Rust, Side::Ccm) => "ccm",
        };
        let name = format!("{prefix}-{}", self.next);
        let place = self.slots.get(slot);
        let mut replica = match (peer, &self.go) {
            (Peer::Go, Some(go)) => {
                let mut args = go.go_ccm_args();
                args.push("--concurrent-service-syncs=5".to_owned());
                let wrapper = match place {
                    Some(place) => {
                        args.extend([place.kubeconfig.clone(), place.cloud_config.clone()]);
                        place.netns.wrapper()
                    }
                    None => Vec::new(),
                };
                Replica::spawn_wrapped(go, &name, side, &args, &wrapper)?
            }
            (Peer::Go, None) => anyhow::bail!("slot {slot} runs the Go peer, which was not found"),
            (Peer::Rust, _) => match place {
                Some(place) => Replica::start_wrapped(
                    &self.environment,
                    &name,
                    side,
                    &[&place.kubeconfig, &place.cloud_config],
                    &place.netns.wrapper(),
                )?,
                None => Replica::start(&self.environment, &name, side)?,
            },
        };
        // Ours says who it is at once; upstream's only once it leads (nothing here needs it).
        if peer == Peer::Rust {
            let identity = replica.identity(self.wait)?;
            self.ours.insert(identity);
        }
        self.replicas.push((replica, slot));
        Ok(())
    }

    pub(super) fn heal_due(&mut self, now: Instant) -> Result<()> {
        for (slot, _) in self.cut.iter().filter(|(_, at)| *at <= now) {
            self.slots[*slot].netns.cut(false)?;
        }
        self.cut.retain(|(_, at)| *at > now);
        Ok(())
    }

    /// A running, unpaused replica, at random.
    pub(super) fn pick(&self, rng: &mut StdRng) -> Option<usize> {
        let candidates: Vec<usize> = (0..self.replicas.len())
            .filter(|i| !self.paused.iter().any(|(p, _)| p == i))
            .collect();
        (!candidates.is_empty()).then(|| candidates[rng.random_range(0..candidates.len())])
    }

    /// Restarts the replicas that exited on their own, in their slots, as kubelet restarts a container.
    pub(super) fn restart_exited(&mut self) -> Result<()> {
        let mut exited: Vec<usize> = Vec::new();
        for (index, (replica, _)) in self.replicas.iter_mut().enumerate() {
            if let Some(status) = replica.try_wait() {
                *self.exits.entry(status.to_string()).or_default() += 1;
                exited.push(index);
            }
        }
        // From the back: a removal does not move the replicas still to restart.
        for index in exited.into_iter().rev() {
            self.replace(index, Stop::Exited)?;
        }
        Ok(())
    }

    /// Stops replica `index` (SIGKILL; or SIGTERM, bounded, then SIGKILL if it is stuck) and starts another
    /// on its side, in its slot.
    pub(super) fn replace(&mut self, index: usize, stop: Stop) -> Result<()> {
        let (mut replica, slot) = self.replicas.remove(index);
        self.paused = self
            .paused
            .iter()
            .filter(|(p, _)| *p != index)
            .map(|&(p, at)| (if p > index { p - 1 } else { p }, at))
            .collect();
        match stop {
            Stop::Kill => {
                replica.kill()?;
                replica.wait(self.wait)?;
            }
            Stop::Terminate => {
                replica.terminate()?;
                if replica.wait(self.wait).is_err() {
                    self.stuck.push(replica.name.clone());
                    replica.kill()?;
                    replica.wait(self.wait)?;
                }
            }
            Stop::Exited => {}
        }
        self.start(replica.side, slot)
    }

    pub(super) fn resume_due(&mut self, now: Instant) -> Result<()> {
        let due: Vec<usize> = self
            .paused
            .iter()
            .filter(|(_, at)| *at <= now)
            .map(|(i, _)| *i)
            .collect();
        for index in due {
            self.replicas[index].0.resume()?;
        }
        self.paused.retain(|(_, at)| *at > now);
        Ok(())
    }
}
