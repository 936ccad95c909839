//! The replicas of the chaos run and their slots: starting, stopping, pausing and restarting them.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use harness::{Environment, Replica, Side};
use rand::Rng;
use rand::rngs::StdRng;
use tokio::time::Instant;

use crate::netns::{Netns, Uts};

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
    /// How replicas get their hostnames.
    pub(super) uts: Uts,
    /// Every replica started, by the hostname the plane gave it: its identity is `<hostname>_<uuid>`, so
    /// whose a write is comes from what the plane started, not from what a process says.
    pub(super) hosts: BTreeMap<String, (Peer, Side)>,
    /// How replicas ended: by how they were stopped (`sigterm`, `sigkill`, `on_its_own`), their exit
    /// statuses (`exit N`, `signal N`) and how many.
    pub(super) exits: BTreeMap<&'static str, BTreeMap<String, u32>>,
    /// What happened to whom and when (server-comparable microseconds since the epoch), written beside
    /// the replicas' logs when a run fails, to read an overlap's `time_us` against.
    pub(super) timeline: Vec<(i64, String)>,
}

/// How a replica is stopped before its replacement starts.
#[derive(Clone, Copy)]
pub(super) enum Stop {
    Kill,
    Terminate,
    /// It exited on its own.
    Exited,
}

/// How a replica may end, by how it was stopped: after SIGTERM ours exits (0, or 1 when its lease was lost
/// meanwhile); upstream's Go CCM, whose `main` passes `wait.NeverStop` and so catches no signal (as
/// upstream's own `main` does), may also be ended by it; after SIGKILL it is killed by it (a shell's 137);
/// on its own only with `exit(1)` after a lost lease. A panic (101 for ours, 2 for Go), another status or
/// a signal nobody sent fails the run.
pub(super) fn expected_exit(how: &str, status: &str) -> bool {
    match how {
        "sigterm" => matches!(status, "exit 0" | "exit 1" | YOUNG_SIGTERM),
        "sigterm (upstream)" => matches!(status, "exit 0" | "exit 1" | "signal 15" | YOUNG_SIGTERM),
        "sigkill" | "sigkill (upstream)" => status == "signal 9",
        _ => status == "exit 1",
    }
}

/// A replica SIGTERM'd within [`YOUNG`] of its start may not have installed its handler yet (the Go
/// runtime's start, a wrapper's exec): the signal's default action ends it, recorded so.
const YOUNG: Duration = Duration::from_secs(2);
const YOUNG_SIGTERM: &str = "signal 15 (within 2 s of its start, before its handler)";

/// An exit status as the report gives it.
fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        (None, None) => status.to_string(),
    }
}

impl Plane {
    pub(super) fn start(&mut self, side: Side, slot: usize) -> Result<()> {
        self.next += 1;
        let peer = self.peers.get(slot).copied().unwrap_or(Peer::Rust);
        let prefix = match (peer, side) {
            (Peer::Go, _) => "go-ccm",
            (Peer::Rust, Side::Kcm) => "kcm",
            (Peer::Rust, Side::Ccm) => "ccm",
        };
        // The replica's name is its hostname too.
        let name = format!("{prefix}-{}", self.next);
        let place = self.slots.get(slot);
        let mut wrapper = place.map(|place| place.netns.wrapper()).unwrap_or_default();
        wrapper.extend(self.uts.wrapper(&name));
        let replica = match (peer, &self.go) {
            (Peer::Go, Some(go)) => {
                let mut args = go.go_ccm_args();
                args.push("--concurrent-service-syncs=5".to_owned());
                if let Some(place) = place {
                    args.extend([place.kubeconfig.clone(), place.cloud_config.clone()]);
                }
                Replica::spawn_wrapped(go, &name, side, &args, &wrapper)?
            }
            (Peer::Go, None) => anyhow::bail!("slot {slot} runs the Go peer, which was not found"),
            (Peer::Rust, _) => {
                // The orphan sweep at chaos speed: what a forced deletion or a kill leaves goes within the
                // run's convergence.
                let mut flags = vec![
                    "--load-balancer-orphan-sweep-period=1s",
                    "--load-balancer-orphan-grace=3s",
                ];
                if let Some(place) = place {
                    flags.extend([place.kubeconfig.as_str(), place.cloud_config.as_str()]);
                }
                Replica::start_wrapped(&self.environment, &name, side, &flags, &wrapper)?
            }
        };
        self.note(format!("start {name} in slot {slot}"));
        self.hosts.insert(name, (peer, side));
        self.replicas.push((replica, slot));
        Ok(())
    }

    /// Who a process identity (`<hostname>_<uuid>`, or a Go peer's bare hostname before it leads) is: a
    /// replica this plane started, or `None`.
    pub(super) fn peer_of(&self, identity: &str) -> Option<(Peer, Side)> {
        let host = identity.split_once('_').map_or(identity, |(host, _)| host);
        self.hosts.get(host).copied()
    }

    /// A `User-Agent` pattern matching every request of replica `index` (its identity follows `) `).
    pub(super) fn user_agent_of(&self, index: usize) -> String {
        format!(") {}_", self.replicas[index].0.name)
    }

    /// Notes `what` in the timeline, now.
    pub(super) fn note(&mut self, what: String) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        self.timeline.push((now, what));
    }

    /// The name of replica `index`.
    pub(super) fn name_of(&self, index: usize) -> String {
        self.replicas[index].0.name.clone()
    }

    /// The timeline as lines of `<time_us> <what>`.
    pub(super) fn timeline_text(&self) -> String {
        self.timeline
            .iter()
            .map(|(at, what)| format!("{at} {what}\n"))
            .collect()
    }

    fn record_exit(&mut self, how: &'static str, status: std::process::ExitStatus) {
        self.record(how, describe(status));
    }

    fn record(&mut self, how: &'static str, status: String) {
        *self.exits.entry(how).or_default().entry(status).or_default() += 1;
    }

    /// Whether replica `name` is upstream's.
    fn upstream(&self, name: &str) -> bool {
        self.hosts.get(name).is_some_and(|(peer, _)| *peer == Peer::Go)
    }

    /// Records how a SIGTERM'd replica ended (see [`YOUNG`]).
    fn record_sigterm(&mut self, name: &str, status: std::process::ExitStatus, age: Duration) {
        let how = if self.upstream(name) {
            "sigterm (upstream)"
        } else {
            "sigterm"
        };
        let described = describe(status);
        if described == "signal 15" && age < YOUNG {
            self.record(how, YOUNG_SIGTERM.to_owned());
        } else {
            self.record(how, described);
        }
    }

    /// Records how a SIGKILL'd replica ended: one that exited on its own before the signal came is
    /// recorded so.
    fn record_sigkill(&mut self, name: &str, status: std::process::ExitStatus) {
        use std::os::unix::process::ExitStatusExt;
        let how = match (status.signal().is_some(), self.upstream(name)) {
            (true, false) => "sigkill",
            (true, true) => "sigkill (upstream)",
            (false, _) => "on_its_own",
        };
        self.record_exit(how, status);
    }

    /// SIGTERM to every replica, each given `wait` to exit (then SIGKILL: it is stuck); every exit recorded.
    pub(super) fn terminate_all(&mut self) -> Result<()> {
        let mut ended = Vec::new();
        let mut signalled = Vec::new();
        for (replica, _) in &mut self.replicas {
            match replica.try_wait() {
                Some(status) => ended.push((None, status, replica.age())),
                None => {
                    replica.terminate()?;
                    signalled.push(replica.name.clone());
                }
            }
        }
        for (replica, _) in &mut self.replicas {
            if !signalled.contains(&replica.name) {
                continue;
            }
            let age = replica.age();
            match replica.wait(self.wait) {
                Ok(status) => ended.push((Some(replica.name.clone()), status, age)),
                Err(_) => {
                    self.stuck.push(replica.name.clone());
                    replica.kill()?;
                }
            }
        }
        for (terminated, status, age) in ended {
            match terminated {
                Some(name) => self.record_sigterm(&name, status, age),
                None => self.record_exit("on_its_own", status),
            }
        }
        Ok(())
    }

    pub(super) fn heal_due(&mut self, now: Instant) -> Result<()> {
        let healed: Vec<usize> = self
            .cut
            .iter()
            .filter(|(_, at)| *at <= now)
            .map(|(slot, _)| *slot)
            .collect();
        for slot in healed {
            self.slots[slot].netns.cut(false)?;
            self.note(format!("heal slot {slot}"));
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
        let mut exited: Vec<(usize, std::process::ExitStatus)> = Vec::new();
        for (index, (replica, _)) in self.replicas.iter_mut().enumerate() {
            if let Some(status) = replica.try_wait() {
                exited.push((index, status));
            }
        }
        for &(index, status) in &exited {
            self.note(format!(
                "{} exited on its own: {}",
                self.name_of(index),
                describe(status)
            ));
            self.record_exit("on_its_own", status);
        }
        // From the back: a removal does not move the replicas still to restart.
        for (index, _) in exited.into_iter().rev() {
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
        // A replica that ended on its own before the signal reached it is recorded so.
        let stop = match (stop, replica.try_wait()) {
            (Stop::Exited, _) => Stop::Exited,
            (_, Some(status)) => {
                self.record_exit("on_its_own", status);
                Stop::Exited
            }
            (stop, None) => stop,
        };
        match stop {
            Stop::Kill => {
                replica.kill()?;
                let status = replica.wait(self.wait)?;
                self.record_sigkill(&replica.name, status);
            }
            Stop::Terminate => {
                let age = replica.age();
                replica.terminate()?;
                match replica.wait(self.wait) {
                    Ok(status) => self.record_sigterm(&replica.name, status, age),
                    Err(_) => {
                        self.stuck.push(replica.name.clone());
                        replica.kill()?;
                        replica.wait(self.wait)?;
                    }
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
            self.note(format!("resume {}", self.name_of(index)));
        }
        self.paused.retain(|(_, at)| *at > now);
        Ok(())
    }
}
