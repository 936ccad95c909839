//! What `status` observes: the Leases, the manager pods' command lines, the nodes.

use serde::Serialize;

use crate::{CLOUD_CONTROLLER_MANAGER, KUBE_CONTROLLER_MANAGER};

/// Everything the conditions are computed from. Times are Unix seconds.
#[derive(Debug, Clone)]
pub struct Observation {
    /// When the observation was made.
    pub now: i64,
    /// kube-controller-manager's main Lease.
    pub kcm_lease: LeaseObservation,
    /// cloud-controller-manager's main Lease.
    pub ccm_lease: LeaseObservation,
    /// The migration Leases of the configuration, with the controllers under each.
    pub migration_leases: Vec<(LeaseObservation, Vec<String>)>,
    /// The controller managers' pods (static pods are mirrored into `kube-system`).
    pub pods: Visibility<Vec<ManagerPod>>,
    /// The cluster's nodes.
    pub nodes: Visibility<Vec<NodeObservation>>,
    /// The API server's version (major, minor), when it answers `/version`.
    pub server_version: Option<(u32, u32)>,
}

impl Observation {
    /// Every Lease observed: kube-controller-manager's main Lease, cloud-controller-manager's, then the
    /// migration Leases.
    pub fn leases(&self) -> impl Iterator<Item = &LeaseObservation> {
        [&self.kcm_lease, &self.ccm_lease]
            .into_iter()
            .chain(self.migration_leases.iter().map(|(lease, _)| lease))
    }
}

/// What could be read, or why not.
#[derive(Debug, Clone)]
pub enum Visibility<T> {
    /// Read.
    Visible(T),
    /// Not readable (the API server's answer).
    Hidden(String),
}

/// One Lease as read (`exists` false when there is none).
#[derive(Debug, Clone, Default)]
pub struct LeaseObservation {
    /// Its name.
    pub name: String,
    /// Whether it exists.
    pub exists: bool,
    /// `spec.holderIdentity` (empty counts as none: a released Lease).
    pub holder: Option<String>,
    /// `spec.acquireTime`.
    pub acquired: Option<i64>,
    /// `spec.renewTime`.
    pub renewed: Option<i64>,
    /// `spec.leaseDurationSeconds`.
    pub duration_seconds: Option<i64>,
}

impl LeaseObservation {
    fn held_by(&self) -> Option<&str> {
        self.holder.as_deref().filter(|holder| !holder.is_empty())
    }

    /// When the holder's claim runs out (last renewal + duration).
    pub fn expires(&self) -> Option<i64> {
        Some(self.renewed.or(self.acquired)? + self.duration_seconds?)
    }

    /// The holder, while its claim is current.
    pub fn live_holder(&self, now: i64) -> Option<&str> {
        self.held_by()
            .filter(|_| self.expires().is_some_and(|expires| expires >= now))
    }

    /// The holder whose claim ran out without a release (it stopped renewing).
    pub fn stale_holder(&self, now: i64) -> Option<&str> {
        self.held_by().filter(|_| self.live_holder(now).is_none())
    }
}

/// A controller manager's pod, from its command line.
#[derive(Debug, Clone, Serialize)]
pub struct ManagerPod {
    /// The pod's name.
    pub name: String,
    /// `kube-controller-manager` or `cloud-controller-manager`.
    pub component: String,
    /// `--cloud-provider` (absent: not given).
    pub cloud_provider: Option<String>,
    /// `--enable-leader-migration`.
    pub leader_migration: bool,
    /// `--leader-migration-config`.
    pub leader_migration_config: Option<String>,
    /// `--controllers`.
    pub controllers: Option<String>,
}

impl ManagerPod {
    /// The manager in a container with this command line (command and args together), if it is one:
    /// recognised by the program's name, or by `component` (kubeadm's label on static pods).
    pub fn from_command_line(name: &str, label: Option<&str>, argv: &[String]) -> Option<ManagerPod> {
        let program = argv.first().map(|p| p.rsplit('/').next().unwrap_or(p));
        let component = [KUBE_CONTROLLER_MANAGER, CLOUD_CONTROLLER_MANAGER]
            .into_iter()
            .find(|c| program == Some(*c) || label == Some(*c))?;
        let flag = |wanted: &str| -> Option<String> {
            let mut args = argv.iter().skip(1);
            let mut found = None;
            while let Some(arg) = args.next() {
                let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
                    continue;
                };
                match flag.split_once('=') {
                    Some((key, value)) if key == wanted => found = Some(value.to_owned()),
                    None if flag == wanted => {
                        found = Some(match args.clone().next() {
                            Some(next) if !next.starts_with('-') => args.next().cloned().unwrap_or_default(),
                            _ => "true".to_owned(),
                        });
                    }
                    _ => {}
                }
            }
            found
        };
        Some(ManagerPod {
            name: name.to_owned(),
            component: component.to_owned(),
            cloud_provider: flag("cloud-provider"),
            leader_migration: flag("enable-leader-migration").is_some_and(|v| v != "false"),
            leader_migration_config: flag("leader-migration-config"),
            controllers: flag("controllers"),
        })
    }
}

/// One node: whether the cloud provider initialised it.
#[derive(Debug, Clone)]
pub struct NodeObservation {
    /// Its name.
    pub name: String,
    /// `spec.providerID` is set.
    pub provider_id: bool,
    /// It carries [`super::UNINITIALIZED_TAINT`].
    pub uninitialized_taint: bool,
}

impl NodeObservation {
    /// The cloud provider initialised it: a providerID, and no uninitialised taint.
    pub fn initialized(&self) -> bool {
        self.provider_id && !self.uninitialized_taint
    }
}
