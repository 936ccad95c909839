//! kwok (`sigs.k8s.io/kwok`, built by `cargo xtask kube`): simulated kubelets. A [`Kwok`] process keeps
//! the status and the node Lease of the nodes of one group alive on a real kube-apiserver, as kubelets
//! would, so the real kube-controller-manager's node-lifecycle controller judges them by the same
//! heartbeats it judges real nodes by.
//!
//! Nodes are grouped by the label [`GROUP_LABEL`], one process per group, selected on the server side:
//! killing a group's process stops both its status heartbeats and its Lease renewals, and no other
//! process takes its nodes over (kwok's own advice for stopping heartbeats; an annotation selector is
//! filtered in the client and would not let go of the Leases). kwok never creates nodes: the caller does.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

/// The node label whose value names the kwok process that keeps the node alive.
pub const GROUP_LABEL: &str = "kwok-group";

/// One kwok process managing the nodes labelled [`GROUP_LABEL`]`=<group>`; killed on drop.
pub struct Kwok {
    child: Child,
    log: PathBuf,
}

impl Kwok {
    /// Starts `binary` for `group` against the API server of `kubeconfig`, with `stages` (kwok's binary has
    /// none built in) and node Leases of `lease` (renewed every quarter of it). Logs and its own home
    /// (kwok reads `~/.kwok/kwok.yaml` first, which must not be the machine's) go under `dir`.
    pub fn start(
        binary: &Path,
        stages: &Path,
        kubeconfig: &Path,
        group: &str,
        lease: Duration,
        dir: &Path,
    ) -> Result<Kwok> {
        let home = dir.join(format!("kwok-{group}-home"));
        std::fs::create_dir_all(&home).with_context(|| format!("create {}", home.display()))?;
        let log = dir.join(format!("kwok-{group}.log"));
        let file = std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let stderr = file.try_clone()?;
        let child = Command::new(binary)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--config={}", stages.display()))
            .arg(format!(
                "--manage-nodes-with-label-selector={GROUP_LABEL}={group}"
            ))
            .arg(format!(
                "--node-lease-duration-seconds={}",
                lease.as_secs().max(1)
            ))
            // No kubelet API: two processes would contend for its port, and nothing here calls it.
            .arg("--node-port=0")
            .env("HOME", &home)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("start {}", binary.display()))?;
        Ok(Kwok { child, log })
    }

    /// Its process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, waited for: from now on its nodes get no heartbeat and no Lease renewal.
    pub fn kill(&mut self) -> Result<()> {
        self.child.kill().context("kill kwok")?;
        self.child.wait().context("wait for kwok")?;
        Ok(())
    }

    /// Whether it has exited, and how.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        crate::replica::log_tail(&self.log)
    }
}

impl Drop for Kwok {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
