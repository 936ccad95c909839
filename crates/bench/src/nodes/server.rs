//! The API server a benchmark runs on: the test API server, or a real kube-apiserver on etcd.

use anyhow::{Context, Result};
use serde_json::json;

use crate::process::{ApiServer, cpu_seconds};
use crate::stats::round;

/// The API server the benchmark runs on.
pub(crate) enum Server {
    Test(ApiServer),
    Kube(Box<control_plane::KubeApiServer>),
}

impl Server {
    pub(crate) async fn start(kind: &str) -> Result<Server> {
        if kind == "test" {
            return Ok(Server::Test(ApiServer::start(&[])?));
        }
        Server::kube(control_plane::LEAN_AUDIT_POLICY).await
    }

    /// kube-apiserver on etcd, auditing by `audit_policy`.
    pub(crate) async fn kube(audit_policy: &str) -> Result<Server> {
        let binaries = control_plane::KubeBinaries::find()
            .context("--apiserver kube (`cargo xtask kube` builds kube-apiserver and etcd)")?;
        let config = control_plane::KubeConfig {
            audit_policy: Some(audit_policy.to_owned()),
            ..control_plane::KubeConfig::default()
        };
        Ok(Server::Kube(Box::new(
            control_plane::KubeApiServer::start(&binaries, &config).await?,
        )))
    }

    pub(crate) fn kubeconfig(&self) -> &std::path::Path {
        match self {
            Server::Test(server) => &server.kubeconfig,
            Server::Kube(server) => server.kubeconfig_path(),
        }
    }

    pub(crate) async fn client(&self) -> Result<kube::Client> {
        match self {
            Server::Test(server) => server.client().await,
            Server::Kube(server) => Ok(server.client()),
        }
    }

    /// Every request so far: the test API server's log, or kube-apiserver's audit log.
    pub(super) async fn requests(&self, client: &kube::Client) -> Result<Vec<ccm_audit::RequestEntry>> {
        match self {
            Server::Test(_) => harness::Admin::new(client.clone()).requests().await,
            Server::Kube(server) => Ok(server.request_entries()),
        }
    }

    /// CPU seconds used so far by etcd and kube-apiserver (the real one only).
    pub(crate) fn cpu_seconds(&self) -> Option<(f64, f64)> {
        match self {
            Server::Test(_) => None,
            Server::Kube(server) => {
                let (etcd, apiserver) = server.pids();
                Some((cpu_seconds(etcd)?, cpu_seconds(apiserver)?))
            }
        }
    }

    /// What it is, and its memory now (MiB; etcd's and kube-apiserver's for the real one).
    pub(crate) fn describe(&self) -> serde_json::Value {
        match self {
            Server::Test(server) => json!({"kind": "test", "rss_mb": server.rss_mib().map(round)}),
            Server::Kube(server) => {
                let (etcd, apiserver) = server.rss_mib();
                json!({
                    "kind": "kube-apiserver",
                    "version": server.version(),
                    "etcd": server.binaries().etcd_version,
                    "rss_mb": round(apiserver),
                    "etcd_rss_mb": round(etcd),
                })
            }
        }
    }
}
