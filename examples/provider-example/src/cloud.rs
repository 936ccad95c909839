//! The "cloud": one JSON file holding instances, load balancers and routes. A real provider would call
//! its cloud's API here; everything else in this crate would stay the same.

use std::path::PathBuf;

use kube_ccm::provider::CloudError;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

/// What the file holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    /// Virtual machines.
    #[serde(default)]
    pub instances: Vec<Instance>,
    /// Load balancers, by name.
    #[serde(default)]
    pub load_balancers: Vec<LoadBalancer>,
    /// Routes to nodes' pod ranges.
    #[serde(default)]
    pub routes: Vec<Route>,
    /// How long the cloud takes to answer each request, in milliseconds (a real cloud is not instant;
    /// the conformance suite slows it down to check that calls end at their deadlines).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub latency_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A virtual machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Instance {
    /// The cloud's ID, e.g. `i-1`.
    pub id: String,
    /// Its host name, which is the node's name.
    pub name: String,
    /// Machine type.
    #[serde(rename = "type")]
    pub instance_type: String,
    /// Zone.
    pub zone: String,
    /// Private address.
    pub address: String,
    /// `running`, `stopped` or `terminated`.
    pub state: String,
    /// Tags (the tagging controller sets `kubernetes-node`).
    #[serde(default)]
    pub tags: std::collections::BTreeMap<String, String>,
    /// The pod ranges the cloud routes to it (an IPv4 and an IPv6 CIDR at most), for node IPAM's cloud
    /// allocator.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_cidrs: Vec<String>,
}

/// A load balancer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadBalancer {
    /// Its name (the framework's default: `a` + the service's UID).
    pub name: String,
    /// Its public address.
    pub ip: String,
    /// The ports it forwards.
    pub ports: Vec<i32>,
    /// The nodes it forwards to.
    pub nodes: Vec<String>,
    /// Who may connect (CIDRs).
    #[serde(default)]
    pub source_ranges: Vec<String>,
    /// The path and node port it checks each node on, when the service keeps traffic local.
    #[serde(default)]
    pub health_check: Option<(String, i32)>,
}

/// A route.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// Its name (the node's UID).
    pub name: String,
    /// The node it sends to.
    pub node: String,
    /// The pod range.
    pub cidr: String,
}

/// The cloud's API: reads and read-modify-writes of the file, one at a time in this process. (Across
/// processes, leader election makes each controller's writer unique.)
#[derive(Debug)]
pub struct FileCloud {
    path: PathBuf,
    lock: Mutex<()>,
}

impl FileCloud {
    /// The cloud kept in `path`.
    pub fn new(path: PathBuf) -> FileCloud {
        FileCloud {
            path,
            lock: Mutex::new(()),
        }
    }

    /// The cloud's audit log: a line (the time, in microseconds since the epoch) for each change applied.
    pub fn audit_log(&self) -> PathBuf {
        self.path.with_extension("writes")
    }

    /// The current state, after the cloud's latency.
    pub async fn read(&self) -> Result<State, CloudError> {
        let bytes = tokio::fs::read(&self.path)
            .await
            .map_err(|e| CloudError::provider(format!("{}: {e}", self.path.display())))?;
        let state: State = serde_json::from_slice(&bytes)
            .map_err(|e| CloudError::provider(format!("{}: {e}", self.path.display())))?;
        if state.latency_ms > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(state.latency_ms)).await;
        }
        Ok(state)
    }

    /// Applies `change` to the state and, when it changed anything, writes it back whole (temporary file,
    /// then rename) and logs the change in the [audit log](FileCloud::audit_log).
    pub async fn update<T>(&self, change: impl FnOnce(&mut State) -> T) -> Result<T, CloudError> {
        let _one_at_a_time = self.lock.lock().await;
        let mut state = self.read().await?;
        let before = state.clone();
        let outcome = change(&mut state);
        if state == before {
            return Ok(outcome);
        }
        let bytes = serde_json::to_vec_pretty(&state).map_err(CloudError::provider)?;
        let temporary = self.path.with_extension("partial");
        tokio::fs::write(&temporary, bytes)
            .await
            .map_err(CloudError::provider)?;
        tokio::fs::rename(&temporary, &self.path)
            .await
            .map_err(CloudError::provider)?;
        let time_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros());
        let mut log = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.audit_log())
            .await
            .map_err(CloudError::provider)?;
        // A tokio file's write ends when the bytes are handed over; the flush, when they are written.
        log.write_all(format!("{time_us}\n").as_bytes())
            .await
            .map_err(CloudError::provider)?;
        log.flush().await.map_err(CloudError::provider)?;
        Ok(outcome)
    }
}
