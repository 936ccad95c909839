//! `--from kcm` and `--from go-ccm`: the old side of the roll is not this binary but a Go program, built by
//! `cargo xtask kube` at the pinned release: the real kube-controller-manager (the seed guide's
//! procedure; since v1.31 it has no cloud provider, so it holds its Leases and runs no cloud controller)
//! or upstream's Go cloud-controller-manager (`k8s.io/cloud-provider`'s app with a Go `fake` provider on
//! the same fake cloud), replaced one replica at a time.
//!
//! A Go replica says who it is only once it leads (client-go logs no identity before), so the roll learns
//! its identity from its log when it can; until then a Lease holder that is none of ours is taken to be a
//! Go replica still running (every replica of ours says who it is at once).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use harness::{Environment, Replica, Side};
use kube_ccm_leadermigration::{CLOUD_CONTROLLER_MANAGER, KUBE_CONTROLLER_MANAGER};

/// Who the control plane migrates from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum From {
    /// Replicas of this binary playing kube-controller-manager with the N configuration.
    Ours,
    /// The real kube-controller-manager with the N configuration.
    Kcm,
    /// Upstream's Go cloud-controller-manager, on the same Leases as ours.
    GoCcm,
}

impl From {
    pub(super) fn parse(text: &str) -> From {
        match text {
            "kcm" => From::Kcm,
            "go-ccm" => From::GoCcm,
            _ => From::Ours,
        }
    }

    /// The main Lease of the old side.
    pub(super) fn old_main_lease(self) -> &'static str {
        match self {
            From::GoCcm => CLOUD_CONTROLLER_MANAGER,
            From::Ours | From::Kcm => KUBE_CONTROLLER_MANAGER,
        }
    }

    /// The main Lease of `side`.
    pub(super) fn main_lease(self, side: Side) -> &'static str {
        match side {
            Side::Kcm => self.old_main_lease(),
            Side::Ccm => CLOUD_CONTROLLER_MANAGER,
        }
    }

    /// What the old side is called on the timeline.
    pub(super) fn old_side(self) -> &'static str {
        match self {
            From::Ours => "kube-controller-manager (played by this binary)",
            From::Kcm => "the real kube-controller-manager",
            From::GoCcm => "upstream's Go cloud-controller-manager",
        }
    }

    /// The prefix of the old side's replica names.
    pub(super) fn old_prefix(self) -> &'static str {
        match self {
            From::Ours | From::Kcm => "kcm",
            From::GoCcm => "go-ccm",
        }
    }

    /// `governance` expecting the old side's writes that name no process: the real
    /// kube-controller-manager's (client-go's `User-Agent`; since v1.31 it runs no cloud controller, so
    /// none is one the audit governs), upstream's Go CCM's own client's (its leader-election Events).
    pub(super) fn expecting(self, governance: ccm_audit::Governance) -> ccm_audit::Governance {
        match self {
            From::Ours => governance,
            From::Kcm => governance.other_client(
                "the real kube-controller-manager (client-go names no process)",
                "kube-controller-manager/",
            ),
            From::GoCcm => governance.other_client_writing(
                "upstream's Go CCM's own client (Events)",
                "go-cloud-controller-manager/",
                &["events"],
            ),
        }
    }

    /// `{"kind": …, "version": …}` of the old side, for `--output json`.
    pub(super) fn describe(self, peers: Option<&Peers>) -> serde_json::Value {
        match (self, peers) {
            (From::Ours, _) | (_, None) => {
                serde_json::json!({"kind": "ours", "version": format!("v{}", kube_ccm_runtime::Binary::default().version())})
            }
            (From::Kcm, Some(peers)) => {
                serde_json::json!({"kind": "kube-controller-manager", "version": peers.version})
            }
            (From::GoCcm, Some(peers)) => {
                serde_json::json!({"kind": "go-cloud-controller-manager", "version": peers.version})
            }
        }
    }
}

/// The Go programs and what they need.
pub(super) struct Peers {
    kube_controller_manager: PathBuf,
    go_cloud_controller_manager: PathBuf,
    /// The service-account signing key kube-controller-manager's token controller needs (the API server's).
    service_account_key: PathBuf,
    /// The pinned Kubernetes release they are built at.
    pub(super) version: String,
}

impl Peers {
    /// The Go programs beside the real API server `server` (built with it by `cargo xtask kube`).
    pub(super) fn find(server: &control_plane::ApiServer) -> Result<Peers> {
        let Some(kube) = server.as_kube() else {
            bail!("--from kcm and --from go-ccm run on the real API server: add --apiserver kube");
        };
        let binaries = kube.binaries();
        Ok(Peers {
            kube_controller_manager: binaries.kube_controller_manager.clone(),
            go_cloud_controller_manager: binaries.go_cloud_controller_manager.clone(),
            service_account_key: kube.dir().join("sa.key"),
            version: binaries.kubernetes_version.clone(),
        })
    }

    /// Starts an old-side replica of `from` called `name` with the N configuration (the Go CCM: the
    /// N+1 one, on the same Leases as ours).
    pub(super) fn start(&self, from: From, environment: &Environment, name: &str) -> Result<Replica> {
        let mut environment = environment.clone();
        let mut args = vec![format!("--kubeconfig={}", environment.kubeconfig.display())];
        match from {
            From::Ours => bail!("replicas of this binary are not peers"),
            From::Kcm => {
                environment.binary = self.kube_controller_manager.clone();
                args.extend([
                    "--bind-address=127.0.0.1".to_owned(),
                    "--secure-port=0".to_owned(),
                    "--cloud-provider=external".to_owned(),
                    "--leader-elect=true".to_owned(),
                    format!(
                        "--service-account-private-key-file={}",
                        self.service_account_key.display()
                    ),
                    // Only the controller that opens its migration election: its node-lifecycle
                    // controller would evict these kubelet-less nodes (v1.37 lists no cloud controller).
                    "--controllers=serviceaccount-token-controller".to_owned(),
                    "--enable-leader-migration".to_owned(),
                    format!("--leader-migration-config={}", environment.kcm_config.display()),
                ]);
                args.extend(environment.timing_flags());
            }
            From::GoCcm => {
                environment.binary = self.go_cloud_controller_manager.clone();
                args = environment.go_ccm_args();
                args.push("--concurrent-service-syncs=2".to_owned());
            }
        }
        Replica::spawn(&environment, name, Side::Kcm, &args)
            .with_context(|| format!("start {name} ({})", environment.binary.display()))
    }
}

/// The placeholder identity of a Go replica not yet known.
pub(super) fn pending(name: &str) -> String {
    format!("pending:{name}")
}

/// Whether `identity` is a placeholder.
pub(super) fn is_pending(identity: &str) -> bool {
    identity.starts_with("pending:")
}
