//! The cloud the demo's managers run against (`--cloud`): the fake cloud, the AWS provider against moto
//! (installed on first use), or the GCE provider against the Compute double; and what it holds at the end.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use harness::{Cloud, Inventory};
use kube_ccm_fake::{FakeCloud, FakeCloudServer, Knobs};

use super::Timeline;

/// A started cloud, kept alive for the demo.
pub(super) struct DemoCloud {
    pub(super) cloud: Cloud,
    /// What the timeline says about it.
    pub(super) description: String,
    /// The fake cloud's server, served from this process.
    _fake: Option<FakeCloudServer>,
}

impl DemoCloud {
    /// Starts the cloud `name` (`fake`, `aws`, `gce`), saying what it does on the timeline.
    pub(super) async fn start(name: &str, timeline: &Timeline) -> Result<DemoCloud> {
        match name {
            "fake" => {
                let server = FakeCloudServer::start(
                    FakeCloud::new(Vec::new(), Knobs::default()),
                    ([127, 0, 0, 1], 0).into(),
                )
                .await
                .context("start the fake cloud")?;
                Ok(DemoCloud {
                    cloud: Cloud::fake(server.url()),
                    description: format!("fake cloud {}", server.url()),
                    _fake: Some(server),
                })
            }
            "aws" => aws(timeline).await,
            "gce" => gce().await,
            other => bail!("--cloud: no cloud {other:?} (fake, aws, gce)"),
        }
    }
}

async fn aws(timeline: &Timeline) -> Result<DemoCloud> {
    use harness::Moto;
    let server = match Moto::installed() {
        Some(server) => server,
        None => install_moto(timeline)?,
    };
    timeline.say(&format!("starting moto ({})", server.display()));
    let moto = Moto::start(&server).with_context(|| format!("start {}", server.display()))?;
    let cloud = harness::AwsCloud::start(moto)
        .await
        .context("set moto up as the cluster's account")?;
    let description = format!(
        "AWS: moto {} (EC2, ELB), the managers' requests recorded by a proxy at {}",
        cloud.moto_url(),
        cloud.proxy().url
    );
    Ok(DemoCloud {
        cloud: Cloud::Aws(Arc::new(cloud)),
        description,
        _fake: None,
    })
}

/// Installs moto into [`Moto::venv`] (a Python virtual environment, pip's progress on stderr, so that
/// `--output json` keeps stdout for the result); the path of its `moto_server`.
fn install_moto(timeline: &Timeline) -> Result<std::path::PathBuf> {
    use std::process::{Command, Stdio};
    let venv = harness::Moto::venv()
        .context("no place to install moto: neither a cargo target directory nor HOME")?;
    timeline.say(&format!(
        "moto (an AWS emulator) is not installed: installing {} into {} (once)…",
        harness::MOTO_REQUIREMENT,
        venv.display()
    ));
    let python = ["python3", "python"]
        .into_iter()
        .find(|python| {
            Command::new(python)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .context("--cloud aws needs Python 3 (python3) to install moto, an AWS emulator")?;
    let run = |command: &mut Command, what: &str| -> Result<()> {
        let status = command
            .stdin(Stdio::null())
            .stdout(std::io::stderr())
            .status()
            .with_context(|| format!("run {what}"))?;
        if !status.success() {
            bail!(
                "{what} failed ({status}); remove {} and try again",
                venv.display()
            );
        }
        Ok(())
    };
    run(
        Command::new(python).args(["-m", "venv"]).arg(&venv),
        &format!("{python} -m venv {}", venv.display()),
    )?;
    run(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--disable-pip-version-check", "--progress-bar", "on"])
            .arg(harness::MOTO_REQUIREMENT),
        &format!("pip install {}", harness::MOTO_REQUIREMENT),
    )?;
    let server = venv.join("bin/moto_server");
    if !server.is_file() {
        bail!("pip installed moto, but {} is missing", server.display());
    }
    Ok(server)
}

async fn gce() -> Result<DemoCloud> {
    let cloud = harness::GceCloud::start()
        .await
        .context("start the Compute double")?;
    let description = format!(
        "GCE: the Compute double {} (project {}, zone {}; also the metadata server)",
        cloud.double().endpoint(),
        harness::GceCloud::PROJECT,
        harness::GceCloud::ZONE
    );
    Ok(DemoCloud {
        cloud: Cloud::Gce(Arc::new(cloud)),
        description,
        _fake: None,
    })
}

/// The inventory as lines of text.
pub(super) fn describe(inventory: &Inventory) -> Vec<String> {
    let mut lines = vec![format!(
        "{} instance(s), {} route(s) to pod ranges, {} load balancer(s)",
        inventory.instances,
        inventory.routes,
        inventory.load_balancers.len()
    )];
    for lb in &inventory.load_balancers {
        lines.push(format!(
            "  load balancer {} at {} → {} instance(s)",
            lb.name, lb.address, lb.backends
        ));
    }
    lines
}
