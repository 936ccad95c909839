//! The API server of a chaos run: the test API server with its admin API, or the real kube-apiserver.

use anyhow::Result;
use harness::Admin;

use crate::process::ApiServer;

/// The API server of the run: ours (with its admin API: faults, its own record) or the real one (its
/// audit log is the record).
pub(super) enum Server {
    Test { process: ApiServer, admin: Admin },
    Kube(Box<control_plane::KubeApiServer>),
}

impl Server {
    pub(super) fn kubeconfig(&self) -> std::path::PathBuf {
        match self {
            Server::Test { process, .. } => process.kubeconfig.clone(),
            Server::Kube(server) => server.kubeconfig_path().to_owned(),
        }
    }

    /// The address in the kubeconfig a slot rewrites to its link's.
    pub(super) fn listen_host(&self) -> &'static str {
        match self {
            Server::Test { .. } => "0.0.0.0",
            Server::Kube(_) => "127.0.0.1",
        }
    }

    /// The API-server faults, where the server has them.
    pub(super) fn faults(&self) -> Option<&Admin> {
        match self {
            Server::Test { admin, .. } => Some(admin),
            Server::Kube(_) => None,
        }
    }

    pub(super) fn describe(&self) -> String {
        match self {
            Server::Test { .. } => "test-apiserver".to_owned(),
            Server::Kube(server) => format!("kube-apiserver ({})", server.version()),
        }
    }

    pub(super) async fn leases(&self) -> Result<Vec<ccm_audit::LeaseWrite>> {
        match self {
            Server::Test { admin, .. } => admin.leases().await,
            Server::Kube(server) => Ok(server.lease_writes()),
        }
    }

    pub(super) async fn requests(&self) -> Result<Vec<ccm_audit::RequestEntry>> {
        match self {
            Server::Test { admin, .. } => admin.requests().await,
            Server::Kube(server) => Ok(server.request_entries()),
        }
    }
}
