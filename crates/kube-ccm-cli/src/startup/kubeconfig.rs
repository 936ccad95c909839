//! Step 3's input: where the manager's client configuration comes from (`--kubeconfig`, `--master`,
//! in-cluster, kube's default chain), and kubeconfig files named by other flags.

use anyhow::{Context, Result};

use crate::settings::Settings;

/// The client configuration in the kubeconfig `file` given by `--flag`; errors name both.
pub(crate) async fn kubeconfig_file(flag: &str, file: &str) -> Result<kube::Config> {
    let kubeconfig =
        kube::config::Kubeconfig::read_from(file).with_context(|| format!("--{flag}: cannot read {file}"))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
        .await
        .with_context(|| format!("--{flag}: {file} cannot be used"))
}

/// The client configuration: `--kubeconfig`, `--master`, in-cluster, or kube's default chain.
pub(super) async fn kube_config(settings: &Settings) -> Result<kube::Config> {
    let mut config = if !settings.kubeconfig.is_empty() {
        kubeconfig_file("kubeconfig", &settings.kubeconfig).await?
    } else if !settings.master.is_empty() {
        kube::Config::new(
            settings
                .master
                .parse()
                .with_context(|| format!("--master: {:?} is not a URL", settings.master))?,
        )
    } else {
        kube::Config::infer().await.context("no --kubeconfig or --master, and neither in-cluster configuration nor a default kubeconfig was found")?
    };
    if !settings.master.is_empty() {
        config.cluster_url = settings
            .master
            .parse()
            .with_context(|| format!("--master: {:?} is not a URL", settings.master))?;
    }
    Ok(config)
}
