//! Starting the manager, as a straight line of named steps:
//!
//! 1. [`validate`] (`validate.rs`): the layered settings checked, every problem at once (exit 2), the
//!    feature gates parsed; a [`Startup`] for the rest.
//! 2. [`provider`]: the cloud provider, from `--cloud-config`.
//! 3. [`clients`] (`kubeconfig.rs`): one client factory for the controllers' clients (each names itself,
//!    is rate-limited and fenced; with `--use-service-account-credentials`, acts as its account).
//! 4. `serving::prepare` (`serving.rs`): who may read what is served.
//! 5. [`manager`]: the controllers' settings and the manager, which plans the main and migration scopes;
//!    its build, gate and plan reports.
//! 6. [`serve`] and the signals, then the manager runs until stopped ([`run_until_stopped`]).
//!
//! [`run`] is that line and nothing else; each step takes what it needs and gives what the next needs.

mod kubeconfig;
mod serving;
mod validate;

pub(crate) use validate::tls13_only;

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use kube_ccm_leadermigration::scopes::ScopesError;
use kube_ccm_provider::CloudProvider;
use kube_ccm_runtime::{
    ClientFactory, ControllerSettings, Manager, ManagerConfig, ManagerError, NodeDeletion, OrphanSweep,
    Registry,
};
use tokio_util::sync::CancellationToken;

pub(crate) use self::kubeconfig::kubeconfig_file;
pub(crate) use self::validate::{Startup, validate};
use crate::feature_gates::FeatureGates;
use crate::serve::{Debug, Serving, SetVerbosity};
use crate::settings::Settings;

/// Runs the manager until SIGTERM/SIGINT (exit 0) or lost leadership (exit 1). The signals are caught
/// first: one that arrives while the manager starts ends the start (exit 0), never the process with the
/// signal's default action.
pub(crate) async fn run(
    mut startup: Startup,
    registry: &Registry,
    set_verbosity: SetVerbosity,
) -> Result<ExitCode> {
    let shutdown = CancellationToken::new();
    stop_on_signals(shutdown.clone())?;
    let manager = tokio::select! {
        manager = start(&mut startup, registry, set_verbosity, &shutdown) => manager?,
        () = shutdown.cancelled() => {
            tracing::info!("stopped while starting");
            return Ok(ExitCode::SUCCESS);
        }
    };
    run_until_stopped(manager, shutdown).await
}

/// Everything before the controllers run: the provider, the clients, the serving and webhook ports.
async fn start(
    startup: &mut Startup,
    registry: &Registry,
    set_verbosity: SetVerbosity,
    shutdown: &CancellationToken,
) -> Result<Manager> {
    let serving = startup.serving.take();
    let identity = crate::identity::identity();
    let component = startup.settings.leader_migration_component.clone();
    tracing::info!(version = %crate::version::line(registry.binary()), %identity, %component, "starting");
    let settings = &startup.settings;
    let provider = provider(settings, registry).await?;
    let clients = clients(settings, &component, &identity, registry.binary().version()).await?;
    let serving = match serving {
        Some(serving) => Some(serving::prepare(serving, settings, &clients, &component, &identity).await?),
        None => None,
    };
    let manager = manager(startup, component, clients, provider, registry);
    report(&manager, &startup.feature_gates, registry.binary());
    if let Some((serving, delegation)) = serving {
        let debug = Debug {
            profiling: startup.settings.profiling,
            configz: serving::configz(&startup.settings).into(),
            set_verbosity,
        };
        serve(serving, delegation, debug, &manager, shutdown.clone()).await?;
    }
    if let Some(serving) = startup.webhook_serving.take() {
        serve_webhooks(serving, startup, registry, &manager, shutdown.clone()).await?;
    }
    Ok(manager)
}

/// Step 2: the provider `--cloud-provider` names, built from `--cloud-config`; it must have a cluster ID
/// unless `--allow-untagged-cloud`.
async fn provider(settings: &Settings, registry: &Registry) -> Result<Arc<dyn CloudProvider>> {
    let cloud_config = if settings.cloud_config.is_empty() {
        None
    } else {
        Some(
            std::fs::read(&settings.cloud_config)
                .with_context(|| format!("--cloud-config: cannot read {}", settings.cloud_config))?,
        )
    };
    let provider = registry
        .providers()
        .build(&settings.cloud_provider, cloud_config)
        .await?;
    if !settings.allow_untagged_cloud && !provider.has_cluster_id() {
        anyhow::bail!(
            "no ClusterID found. A ClusterID is required for the cloud provider to function properly. This check can be bypassed by setting the allow-untagged-cloud option"
        );
    }
    Ok(provider)
}

/// Step 3: the controllers' client factory, on the manager's client configuration.
async fn clients(
    settings: &Settings,
    component: &str,
    identity: &str,
    version: &str,
) -> Result<ClientFactory> {
    let base = kubeconfig::kube_config(settings).await?;
    let clients = ClientFactory::new(
        base,
        component,
        identity,
        settings.kube_api_qps,
        settings.kube_api_burst,
    )
    .with_request_timeout(settings.kube_api_request_timeout.0)
    .with_version(version);
    Ok(if settings.use_service_account_credentials {
        clients.with_service_account_credentials()?
    } else {
        clients
    })
}

/// What the controllers are configured with (upstream's controller flags).
fn controller_settings(startup: &Startup) -> ControllerSettings {
    let settings = &startup.settings;
    ControllerSettings {
        cluster_name: settings.cluster_name.clone(),
        cluster_cidrs: startup.cluster_cidrs.clone(),
        configure_cloud_routes: settings.configure_cloud_routes,
        allocate_node_cidrs: settings.allocate_node_cidrs,
        cidr_allocator_type: settings.cidr_allocator_type.clone(),
        node_monitor_period: settings.node_monitor_period.0,
        node_deletion: NodeDeletion {
            confirm_after: settings.node_deletion_confirm_after.0,
            breaker_ratio: f64::from(settings.node_deletion_breaker_ratio),
            max_per_round: settings.node_deletion_max_per_round,
        },
        load_balancer_sweep: OrphanSweep {
            period: settings.load_balancer_orphan_sweep_period.0,
            grace: settings.load_balancer_orphan_grace.0,
            dry_run: settings.load_balancer_orphan_dry_run,
        },
        node_status_update_frequency: settings.node_status_update_frequency.0,
        route_reconciliation_period: settings.route_reconciliation_period.0,
        concurrent_node_syncs: settings.concurrent_node_syncs,
        concurrent_node_status_updates: settings.concurrent_node_status_updates,
        concurrent_service_syncs: settings.concurrent_service_syncs,
        concurrent_load_balancer_host_updates: settings.concurrent_load_balancer_host_updates,
        cloud_call_timeout: settings.cloud_call_timeout.0,
        cloud_api_qps: f64::from(settings.cloud_api_qps),
        cloud_api_burst: settings.cloud_api_burst,
        flags: startup.flags.clone(),
    }
}

/// Step 5: the manager (it plans where each controller runs: the main and migration scopes).
fn manager(
    startup: &Startup,
    component: String,
    clients: ClientFactory,
    provider: Arc<dyn CloudProvider>,
    registry: &Registry,
) -> Manager {
    let config = ManagerConfig {
        component,
        clients,
        leader_election: startup.leader_election.clone(),
        selection: startup.selection.clone(),
        controllers: controller_settings(startup),
    };
    Manager::new(config, registry.controllers().clone(), provider)
}

/// The build, the feature gates (as metrics; a set gate without effect here is a warning) and the plan.
fn report(manager: &Manager, feature_gates: &FeatureGates, binary: &kube_ccm_runtime::Binary) {
    let metrics = manager.metrics();
    metrics.set_build_info(&crate::version::build_info(binary));
    for (gate, enabled) in feature_gates.all() {
        metrics.set_feature(gate.name, gate.stage.label(), enabled);
    }
    for (gate, enabled, why) in feature_gates.without_effect() {
        tracing::warn!(
            gate,
            enabled,
            "feature gate set, but it has no effect here: {why}"
        );
    }
    for planned in manager.plan() {
        let p = &planned.placement;
        tracing::info!(controller = %planned.controller, lock = p.lock_name(), lease = p.lease().unwrap_or(""), skipped = planned.skipped.as_deref().unwrap_or(""), "plan");
    }
}

/// Step 6: health, readiness, metrics and debugging over HTTPS, until `shutdown`.
async fn serve(
    serving: Serving,
    delegation: Arc<crate::serve::auth::Delegation>,
    debug: Debug,
    manager: &Manager,
    shutdown: CancellationToken,
) -> Result<()> {
    let open_files = crate::serve::raise_open_files_limit();
    let limits = crate::serve::Limits::for_open_files(open_files);
    let address = crate::serve::start(
        serving,
        limits,
        delegation,
        manager.health(),
        manager.metrics(),
        debug,
        shutdown,
    )
    .await?;
    tracing::info!(%address, open_files, max_connections = limits.max_connections, "serving healthz, livez, readyz, metrics and configz (and, with --profiling, debug/pprof and debug/flags/v) over HTTPS");
    Ok(())
}

/// Step 7: the provider's admission webhooks, on every replica, with the `CloudControllerManagerWebhook`
/// feature gate and when `--webhooks` enables any (as upstream; none is enabled unless named).
async fn serve_webhooks(
    serving: Serving,
    startup: &Startup,
    registry: &Registry,
    manager: &Manager,
    shutdown: CancellationToken,
) -> Result<()> {
    let settings = &startup.settings;
    if !startup.feature_gates.enabled("CloudControllerManagerWebhook") {
        if !settings.webhooks.is_empty() {
            tracing::warn!(webhooks = ?settings.webhooks, "--webhooks is ignored: the CloudControllerManagerWebhook feature gate is off");
        }
        return Ok(());
    }
    let context = kube_ccm_runtime::webhooks::WebhookContext {
        provider: manager.provider(),
        caches: manager.caches()?,
    };
    let webhooks = kube_ccm_runtime::webhooks::Webhooks::select(
        registry.webhooks(),
        &settings.webhooks,
        context,
        manager.metrics(),
    )?;
    if webhooks.is_empty() {
        tracing::info!("no webhook is enabled (--webhooks): the webhook port is not opened");
        return Ok(());
    }
    if settings.webhook_tls_cert_file.is_empty()
        && let (Some(cert), Some(key)) = (&serving.cert_file, &serving.key_file)
    {
        crate::serve::ensure_self_signed_pair(std::path::Path::new(cert), std::path::Path::new(key))
            .context("--webhook-cert-dir")?;
    }
    let names = webhooks.names().join(",");
    let limits = crate::serve::Limits::for_open_files(crate::serve::raise_open_files_limit());
    let address = crate::serve::start_webhooks(serving, limits, Arc::new(webhooks), shutdown).await?;
    tracing::info!(%address, webhooks = %names, "serving admission webhooks over HTTPS");
    Ok(())
}

/// SIGTERM or SIGINT cancels `shutdown`. Both are caught from the moment this returns.
fn stop_on_signals(shutdown: CancellationToken) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).context("cannot catch SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot catch SIGINT")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = interrupt.recv() => tracing::info!("SIGINT: shutting down"),
            _ = terminate.recv() => tracing::info!("SIGTERM: shutting down"),
        }
        shutdown.cancel();
    });
    Ok(())
}

/// The manager until `shutdown` (exit 0) or a lost lock (exit 1); a scope that would not stop exits at
/// once.
async fn run_until_stopped(manager: Manager, shutdown: CancellationToken) -> Result<ExitCode> {
    match manager.run(shutdown.clone()).await {
        Ok(()) => {
            tracing::info!("stopped");
            Ok(ExitCode::SUCCESS)
        }
        Err(ManagerError::Scopes(error @ ScopesError::StopTimeout { .. })) => {
            // Something under a lock may still be acting, and no lock was released: exit now, leaving no
            // task time to act, and let the Leases expire.
            tracing::error!(%error, "exiting at once");
            std::process::exit(1)
        }
        Err(error) => {
            shutdown.cancel();
            tracing::error!(%error, "exiting");
            Ok(ExitCode::FAILURE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn startup(args: &[&str]) -> Startup {
        let registry = Registry::new();
        let matches = crate::app::command(&registry)
            .try_get_matches_from(std::iter::once("ccm").chain(args.iter().copied()))
            .unwrap();
        let (settings, flags) = crate::settings::layered_with(&matches, &registry).unwrap();
        validate(settings, flags, &registry).unwrap()
    }

    #[test]
    fn the_controllers_get_upstreams_controller_flags() {
        crate::settings::tests::hermetic(|| {
            let startup = startup(&[
                "--cloud-provider=fake",
                "--cluster-name=prod",
                "--cluster-cidr=10.0.0.0/16,fd00::/56",
                "--configure-cloud-routes=false",
                "--concurrent-node-syncs=7",
                "--node-monitor-period=3s",
                "--cloud-call-timeout=45s",
            ]);
            let controllers = controller_settings(&startup);
            assert_eq!(controllers.cluster_name, "prod");
            assert_eq!(controllers.cluster_cidrs.len(), 2);
            assert!(!controllers.configure_cloud_routes);
            assert_eq!(controllers.concurrent_node_syncs, 7);
            assert_eq!(controllers.node_monitor_period.as_secs(), 3);
            assert_eq!(controllers.cloud_call_timeout.as_secs(), 45);
        });
    }

    #[test]
    fn configz_holds_every_setting_by_flag_name_under_upstreams_group() {
        crate::settings::tests::hermetic(|| {
            let startup = startup(&["--cloud-provider=fake", "--secure-port=10300"]);
            let configz: serde_json::Value =
                serde_json::from_str(&serving::configz(&startup.settings)).unwrap();
            let settings = &configz["cloudcontrollermanager.config.k8s.io"];
            assert_eq!(settings["cloud-provider"], "fake");
            assert_eq!(settings["secure-port"], 10300);
            assert_eq!(
                settings.as_object().unwrap().len(),
                crate::settings::FLAGS.len(),
                "every flag"
            );
        });
    }

    #[test]
    fn every_problem_is_reported_at_once_each_naming_its_flag() {
        crate::settings::tests::hermetic(|| {
            let registry = Registry::new();
            let matches = crate::app::command(&registry)
                .try_get_matches_from([
                    "ccm",
                    "--concurrent-service-syncs=0",
                    "--node-monitor-period=0s",
                    "--bind-address=nowhere",
                    "--feature-gates=NoSuchGate=true",
                    "--logging-format=xml",
                    "--webhooks=*,nope",
                    "--webhook-secure-port=10258",
                ])
                .unwrap();
            let (settings, flags) = crate::settings::layered_with(&matches, &registry).unwrap();
            let Err(problems) = validate(settings, flags, &registry) else {
                panic!("invalid settings pass");
            };
            for flag in [
                "--cloud-provider",
                "--concurrent-service-syncs",
                "--node-monitor-period",
                "--bind-address",
                "NoSuchGate",
                "--logging-format",
                "--webhooks: \"nope\" is not in the list of known webhooks (none)",
                "--webhook-secure-port cannot be the same value as --secure-port",
            ] {
                assert!(
                    problems.iter().any(|p| p.contains(flag)),
                    "{flag} not named: {problems:?}"
                );
            }
        });
    }
}
