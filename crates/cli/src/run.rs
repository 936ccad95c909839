//! Running the manager: settings → validated configuration → provider, manager, serving, signals.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use controller_manager::{
    Cidr, ClientFactory, ControllerRegistry, ControllerSettings, FlagValues, LeaderElectionConfig, Manager,
    ManagerConfig, ManagerError, Registry,
};
use leadermigration::scopes::{LossPolicy, ScopesError};
use leadermigration::{
    ControllerSelection, LeaseTimings, apply_migration_options, validate_leader_elect_resource_lock,
};
use tokio_util::sync::CancellationToken;

use crate::feature_gates::FeatureGates;
use crate::serve::Serving;
use crate::settings::Settings;

/// What is started, once every setting is known to be valid.
pub(crate) struct Startup {
    pub(crate) settings: Settings,
    pub(crate) selection: ControllerSelection,
    /// `None` with `--leader-elect=false`.
    pub(crate) leader_election: Option<LeaderElectionConfig>,
    pub(crate) cluster_cidrs: Vec<Cidr>,
    pub(crate) serving: Option<Serving>,
    /// The values of the controllers' own flags.
    pub(crate) flags: FlagValues,
    /// `--feature-gates`, over the defaults.
    pub(crate) feature_gates: FeatureGates,
}

/// A TLS minimum version flag: whether only TLS 1.3 is offered.
fn tls13_only(flag: &str, value: &str) -> Result<bool, String> {
    match value {
        "" | "VersionTLS12" => Ok(false),
        "VersionTLS13" => Ok(true),
        other => Err(format!(
            "{flag}: {other:?} is not supported (VersionTLS12 or VersionTLS13)"
        )),
    }
}

/// The webhook server's TLS flags, checked as the serving flags are, though this binary serves no webhook
/// yet: a value upstream would refuse is refused here too.
fn webhook_tls_problems(settings: &Settings) -> Vec<String> {
    let mut problems = Vec::new();
    if settings.webhook_tls_cert_file.is_empty() != settings.webhook_tls_private_key_file.is_empty() {
        problems.push(
            "--webhook-tls-cert-file and --webhook-tls-private-key-file must be given together".to_owned(),
        );
    }
    problems.extend(tls13_only("--webhook-tls-min-version", &settings.webhook_tls_min_version).err());
    problems.extend(
        crate::serve::cipher_suites("--webhook-tls-cipher-suites", &settings.webhook_tls_cipher_suites).err(),
    );
    problems.extend(
        crate::serve::kx_groups(
            "--webhook-tls-curve-preferences",
            &settings.webhook_tls_curve_preferences,
        )
        .err(),
    );
    problems
}

/// A Kubernetes quantity as `--log-text-info-buffer-size` takes it: a decimal number with an optional SI
/// (`k`/`K`, `M`, `G`, `T`, `P`, `E`) or binary (`Ki` … `Ei`) suffix.
fn is_quantity(text: &str) -> bool {
    let text = text.trim();
    let digits = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(digits);
    number.parse::<f64>().is_ok_and(|n| n >= 0.0)
        && matches!(
            suffix,
            "" | "k" | "K" | "M" | "G" | "T" | "P" | "E" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"
        )
}

/// Checks every setting; all problems are reported together, each naming its flag. Controller names
/// resolve against `controllers`, the binary's registry, and each enabled controller of the chosen
/// provider checks its own `flags`.
pub(crate) fn validate(
    settings: Settings,
    flags: FlagValues,
    controllers: &ControllerRegistry,
) -> Result<Startup, Vec<String>> {
    let mut problems = Vec::new();
    let catalog = controllers.catalog();
    if settings.cloud_provider.is_empty() {
        problems.push("--cloud-provider cannot be empty".to_owned());
    }
    if let Err(error) =
        validate_leader_elect_resource_lock(settings.leader_elect, &settings.leader_elect_resource_lock)
    {
        problems.push(error.to_string());
    }
    let timings = LeaseTimings::new(
        settings.leader_elect_lease_duration.0,
        settings.leader_elect_renew_deadline.0,
        settings.leader_elect_retry_period.0,
    )
    .map_err(|error| {
        if settings.leader_elect {
            problems.push(error.to_string());
        }
    })
    .ok();
    let on_loss = match settings.on_lost_leadership.as_str() {
        "exit" => LossPolicy::Exit,
        "recontend" => LossPolicy::Recontend,
        other => {
            problems.push(format!(
                "--on-lost-leadership: {other:?} is neither exit nor recontend"
            ));
            LossPolicy::Exit
        }
    };
    let selection = ControllerSelection::parse(&settings.controllers, catalog).unwrap_or_else(|error| {
        problems.push(error.to_string());
        ControllerSelection::default()
    });
    for definition in controllers.definitions() {
        let enabled = catalog
            .resolve(definition.name())
            .is_some_and(|entry| selection.is_enabled(entry));
        let provider_chosen = definition
            .provider()
            .is_none_or(|provider| provider == settings.cloud_provider);
        if enabled
            && provider_chosen
            && let Some(problem) = definition.flags_problem(&flags)
        {
            problems.push(format!("{}: {problem}", definition.name()));
        }
    }
    let migration = match apply_migration_options(
        settings.enable_leader_migration,
        (!settings.leader_migration_config.is_empty()).then(|| Path::new(&settings.leader_migration_config)),
        |path| std::fs::read(path),
        catalog,
    ) {
        Ok(loaded) => loaded.map(|loaded| {
            for warning in &loaded.warnings {
                tracing::warn!("{}", warning.render(&settings.leader_migration_config));
            }
            loaded.config
        }),
        Err(error) => {
            problems.push(error.to_string());
            None
        }
    };
    if migration.is_some() && !settings.leader_elect {
        tracing::warn!(
            "--enable-leader-migration has no effect with --leader-elect=false (as upstream): every enabled controller runs"
        );
    }
    let leader_election = match (settings.leader_elect, timings) {
        (true, Some(timings)) => {
            let election = LeaderElectionConfig::new(
                &settings.leader_elect_resource_namespace,
                &settings.leader_elect_resource_name,
                timings,
                on_loss,
            );
            match migration {
                Some(migration) => election
                    .with_migration(migration)
                    .map_err(|clash| problems.push(clash.to_string()))
                    .ok(),
                None => Some(election),
            }
        }
        _ => None,
    };
    let cluster_cidrs = Cidr::parse_list(&settings.cluster_cidr).unwrap_or_else(|error| {
        problems.push(format!("--cluster-cidr: {error}"));
        Vec::new()
    });
    for (flag, value) in [
        ("--concurrent-node-syncs", settings.concurrent_node_syncs),
        ("--concurrent-service-syncs", settings.concurrent_service_syncs),
        (
            "--concurrent-node-lifecycle-syncs",
            settings.concurrent_node_lifecycle_syncs,
        ),
    ] {
        if value == 0 {
            problems.push(format!("{flag} must be a positive number"));
        }
    }
    // Every duration is bounded: zero would spin, and absurd values overflow timers. Upstream has no upper
    // bounds; a day (a week for the resync period) is far beyond any working setting.
    const DAY: Duration = Duration::from_secs(24 * 3600);
    for (flag, value, may_be_zero, max) in [
        (
            "--node-monitor-period",
            settings.node_monitor_period.0,
            false,
            DAY,
        ),
        (
            "--route-reconciliation-period",
            settings.route_reconciliation_period.0,
            false,
            DAY,
        ),
        (
            "--node-status-update-frequency",
            settings.node_status_update_frequency.0,
            false,
            DAY,
        ),
        ("--cloud-call-timeout", settings.cloud_call_timeout.0, false, DAY),
        (
            "--kube-api-request-timeout",
            settings.kube_api_request_timeout.0,
            false,
            DAY,
        ),
        (
            "--controller-start-interval",
            settings.controller_start_interval.0,
            true,
            DAY,
        ),
        ("--node-sync-period", settings.node_sync_period.0, true, DAY),
        ("--min-resync-period", settings.min_resync_period.0, true, 7 * DAY),
        ("--log-flush-frequency", settings.log_flush_frequency.0, true, DAY),
        (
            "--authentication-token-webhook-cache-ttl",
            settings.authentication_token_webhook_cache_ttl.0,
            true,
            DAY,
        ),
        (
            "--authorization-webhook-cache-authorized-ttl",
            settings.authorization_webhook_cache_authorized_ttl.0,
            true,
            DAY,
        ),
        (
            "--authorization-webhook-cache-unauthorized-ttl",
            settings.authorization_webhook_cache_unauthorized_ttl.0,
            true,
            DAY,
        ),
    ] {
        if value.is_zero() && !may_be_zero {
            problems.push(format!("{flag} must be greater than 0"));
        } else if value > max {
            problems.push(format!(
                "{flag} must be at most {}h (got {}s)",
                max.as_secs() / 3600,
                value.as_secs()
            ));
        }
    }
    if !settings.kube_api_qps.is_finite() {
        problems.push(format!(
            "--kube-api-qps must be a number (got {})",
            settings.kube_api_qps
        ));
    }
    if !matches!(settings.logging_format.as_str(), "text" | "json") {
        problems.push(format!(
            "--logging-format: {:?} is not supported (text or json)",
            settings.logging_format
        ));
    }
    let serving = if settings.secure_port == 0 {
        None
    } else {
        let address: Option<IpAddr> = settings.bind_address.parse().ok();
        if address.is_none() {
            problems.push(format!(
                "--bind-address: {:?} is not an IP address",
                settings.bind_address
            ));
        }
        let files = (
            !settings.tls_cert_file.is_empty(),
            !settings.tls_private_key_file.is_empty(),
        );
        if files.0 != files.1 {
            problems.push("--tls-cert-file and --tls-private-key-file must be given together".to_owned());
        }
        let tls13_only =
            tls13_only("--tls-min-version", &settings.tls_min_version).unwrap_or_else(|problem| {
                problems.push(problem);
                false
            });
        let cipher_suites = crate::serve::cipher_suites("--tls-cipher-suites", &settings.tls_cipher_suites)
            .unwrap_or_else(|problem| {
                problems.push(problem);
                None
            });
        let kx_groups = crate::serve::kx_groups("--tls-curve-preferences", &settings.tls_curve_preferences)
            .unwrap_or_else(|problem| {
                problems.push(problem);
                None
            });
        address.map(|ip| Serving {
            address: SocketAddr::new(ip, settings.secure_port),
            cert_file: files.0.then(|| settings.tls_cert_file.clone()),
            key_file: files.1.then(|| settings.tls_private_key_file.clone()),
            tls13_only,
            // From --client-ca-file, or looked up in the cluster when serving starts.
            client_ca: None,
            front_proxy: None,
            cipher_suites,
            kx_groups,
            reload_check: crate::serve::RELOAD_CHECK,
        })
    };
    problems.extend(webhook_tls_problems(&settings));
    let feature_gates = match FeatureGates::parse(&settings.feature_gates) {
        Ok((gates, warnings)) => {
            for warning in warnings {
                tracing::warn!("{warning}");
            }
            gates
        }
        Err(problem) => {
            problems.push(problem);
            FeatureGates::default()
        }
    };
    // Upstream's text format keeps these behind LoggingAlphaOptions, and refuses them without it.
    if !feature_gates.enabled("LoggingAlphaOptions") {
        if settings.log_text_split_stream {
            problems.push("--log-text-split-stream: Forbidden: Feature LoggingAlphaOptions is disabled (--feature-gates=LoggingAlphaOptions=true)".to_owned());
        }
        if settings.log_text_info_buffer_size.trim() != "0" {
            problems.push("--log-text-info-buffer-size: Forbidden: Feature LoggingAlphaOptions is disabled (--feature-gates=LoggingAlphaOptions=true)".to_owned());
        }
    }
    if !is_quantity(&settings.log_text_info_buffer_size) {
        problems.push(format!(
            "--log-text-info-buffer-size: {:?} is not a quantity (a number, or one with a suffix: 1K, 2Ki, 3M, 5Mi, …)",
            settings.log_text_info_buffer_size
        ));
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Startup {
        feature_gates,
        settings,
        selection,
        leader_election,
        cluster_cidrs,
        serving,
        flags,
    })
}

/// The client configuration in the kubeconfig `file` given by `--flag`; errors name both.
pub(crate) async fn kubeconfig_file(flag: &str, file: &str) -> Result<kube::Config> {
    let kubeconfig =
        kube::config::Kubeconfig::read_from(file).with_context(|| format!("--{flag}: cannot read {file}"))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
        .await
        .with_context(|| format!("--{flag}: {file} cannot be used"))
}

/// The client configuration: `--kubeconfig`, `--master`, in-cluster, or kube's default chain.
async fn kube_config(settings: &Settings) -> Result<kube::Config> {
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

/// The user agent of the connections that serve authentication and authorisation (its metrics and logs
/// tell them apart from the controllers').
const DELEGATED_AUTH_AGENT: &str = "delegated-auth";

/// The clients that ask the API server who a caller is and what they may read: from
/// `--authentication-kubeconfig` and `--authorization-kubeconfig`, or else the manager's own connection
/// (upstream uses the in-cluster configuration, and outside a cluster none).
async fn delegation(
    settings: &Settings,
    clients: &ClientFactory,
    component: &str,
    identity: &str,
) -> Result<std::sync::Arc<crate::serve::auth::Delegation>> {
    let client = |flag: &'static str, file: String| async move {
        if file.is_empty() {
            return clients
                .client(DELEGATED_AUTH_AGENT, None)
                .map_err(anyhow::Error::from);
        }
        let config = kubeconfig_file(flag, &file).await?;
        ClientFactory::new(
            config,
            component,
            identity,
            settings.kube_api_qps,
            settings.kube_api_burst,
        )
        .with_request_timeout(settings.kube_api_request_timeout.0)
        .client(DELEGATED_AUTH_AGENT, None)
        .map_err(anyhow::Error::from)
    };
    let authentication = client(
        "authentication-kubeconfig",
        settings.authentication_kubeconfig.clone(),
    )
    .await?;
    let authorization = client(
        "authorization-kubeconfig",
        settings.authorization_kubeconfig.clone(),
    )
    .await?;
    Ok(crate::serve::auth::Delegation::new(
        crate::serve::auth::DelegationSettings {
            always_allow_paths: settings
                .authorization_always_allow_paths
                .iter()
                .map(|p| p.trim().to_owned())
                .filter(|p| !p.is_empty())
                .collect(),
            token_ttl: settings.authentication_token_webhook_cache_ttl.0,
            allowed_ttl: settings.authorization_webhook_cache_authorized_ttl.0,
            denied_ttl: settings.authorization_webhook_cache_unauthorized_ttl.0,
        },
        Some(authentication),
        Some(authorization),
    ))
}

/// Where a cluster publishes the CA of the client certificates it issues (kube-apiserver writes it).
const AUTHENTICATION_CONFIG_MAP: (&str, &str) = ("kube-system", "extension-apiserver-authentication");

/// Who may authenticate by certificate: the client CA (`--client-ca-file`) and the front proxy
/// (`--requestheader-client-ca-file` and the header flags). What a flag leaves out is looked up, unless
/// `--authentication-skip-lookup`, in `kube-system/extension-apiserver-authentication` (its `client-ca-file`
/// and `requestheader-*` keys), as upstream: a missing ConfigMap means none; a lookup that fails stops the
/// start unless `--authentication-tolerate-lookup-failure`.
async fn authentication_sources(
    settings: &Settings,
    clients: &ClientFactory,
) -> Result<(Option<crate::serve::ClientCa>, Option<crate::serve::FrontProxy>)> {
    use crate::serve::{ClientCa, FrontProxy};
    let read = |flag: &str, file: &str| -> Result<ClientCa> {
        let pem = std::fs::read(file).with_context(|| format!("--{flag}: cannot read {file}"))?;
        Ok(ClientCa {
            source: format!("--{flag}: {file}"),
            pem,
        })
    };
    let listed = |values: &[String]| -> Vec<String> {
        values
            .iter()
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .collect()
    };
    let mut client_ca = if settings.client_ca_file.is_empty() {
        None
    } else {
        Some(read("client-ca-file", &settings.client_ca_file)?)
    };
    let mut front_proxy = if settings.requestheader_client_ca_file.is_empty() {
        None
    } else {
        Some(FrontProxy {
            ca: read(
                "requestheader-client-ca-file",
                &settings.requestheader_client_ca_file,
            )?,
            allowed_names: listed(&settings.requestheader_allowed_names),
            username_headers: listed(&settings.requestheader_username_headers),
            group_headers: listed(&settings.requestheader_group_headers),
        })
    };
    let complete = client_ca.is_some() && front_proxy.is_some();
    if complete || settings.authentication_skip_lookup {
        return Ok((client_ca, front_proxy));
    }
    let (namespace, name) = AUTHENTICATION_CONFIG_MAP;
    let client = clients.client(DELEGATED_AUTH_AGENT, None)?;
    let config_maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client, namespace);
    let looked_up = tokio::time::timeout(std::time::Duration::from_secs(30), config_maps.get_opt(name))
        .await
        .map_err(|_| anyhow::anyhow!("no answer within 30s"))
        .and_then(|answer| {
            answer.map_err(|error| match error {
                kube::Error::Api(status) => anyhow::anyhow!("{} ({})", status.message, status.code),
                other => anyhow::Error::from(other),
            })
        });
    let data = match looked_up {
        Ok(Some(config_map)) => config_map.data.unwrap_or_default(),
        Ok(None) => {
            tracing::info!(configmap = %format!("{namespace}/{name}"), "no authentication configuration published in the cluster");
            return Ok((client_ca, front_proxy));
        }
        Err(error) if settings.authentication_tolerate_lookup_failure => {
            tracing::warn!(%error, configmap = %format!("{namespace}/{name}"), "cannot look up the authentication configuration; going on without it (--authentication-tolerate-lookup-failure)");
            return Ok((client_ca, front_proxy));
        }
        Err(error) => {
            return Err(error.context(format!(
                "cannot look up the authentication configuration in ConfigMap {namespace}/{name} (grant the Role extension-apiserver-authentication-reader, give --client-ca-file and --requestheader-client-ca-file, or pass --authentication-skip-lookup or --authentication-tolerate-lookup-failure)"
            )));
        }
    };
    let pem = |key: &str| {
        data.get(key)
            .filter(|pem| !pem.trim().is_empty())
            .map(|pem| ClientCa {
                source: format!("ConfigMap {namespace}/{name}, key {key}"),
                pem: pem.clone().into_bytes(),
            })
    };
    // The list keys hold JSON arrays of strings, as kube-apiserver writes them.
    let list = |key: &str, fallback: &[String]| -> Result<Vec<String>> {
        match data.get(key) {
            None => Ok(listed(fallback)),
            Some(text) => serde_json::from_str::<Vec<String>>(text).with_context(|| {
                format!("ConfigMap {namespace}/{name}, key {key}: not a JSON list of strings")
            }),
        }
    };
    if client_ca.is_none() {
        client_ca = pem("client-ca-file");
    }
    if front_proxy.is_none()
        && let Some(ca) = pem("requestheader-client-ca-file")
    {
        front_proxy = Some(FrontProxy {
            ca,
            allowed_names: list("requestheader-allowed-names", &[])?,
            username_headers: list(
                "requestheader-username-headers",
                &settings.requestheader_username_headers,
            )?,
            group_headers: list(
                "requestheader-group-headers",
                &settings.requestheader_group_headers,
            )?,
        });
    }
    Ok((client_ca, front_proxy))
}

/// `/configz`: the effective settings by flag name, under upstream's configuration group.
fn configz(settings: &Settings) -> String {
    serde_json::json!({ "cloudcontrollermanager.config.k8s.io": settings }).to_string()
}

/// Runs the manager until SIGTERM/SIGINT (exit 0) or lost leadership (exit 1).
pub(crate) async fn run(
    startup: Startup,
    registry: &Registry,
    set_verbosity: crate::serve::SetVerbosity,
) -> Result<ExitCode> {
    let Startup {
        settings,
        selection,
        leader_election,
        cluster_cidrs,
        serving,
        flags,
        feature_gates,
    } = startup;
    let identity = crate::identity::identity();
    let component = settings.leader_migration_component.clone();
    tracing::info!(version = %crate::version::line(), %identity, %component, "starting");

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

    let base = kube_config(&settings).await?;
    let clients = ClientFactory::new(
        base,
        &component,
        &identity,
        settings.kube_api_qps,
        settings.kube_api_burst,
    )
    .with_request_timeout(settings.kube_api_request_timeout.0);
    let clients = if settings.use_service_account_credentials {
        clients.with_service_account_credentials()?
    } else {
        clients
    };
    let serving = match serving {
        Some(mut serving) => {
            (serving.client_ca, serving.front_proxy) = authentication_sources(&settings, &clients).await?;
            Some((
                serving,
                delegation(&settings, &clients, &component, &identity).await?,
            ))
        }
        None => None,
    };
    let controllers = ControllerSettings {
        cluster_name: settings.cluster_name.clone(),
        cluster_cidrs,
        configure_cloud_routes: settings.configure_cloud_routes,
        allocate_node_cidrs: settings.allocate_node_cidrs,
        cidr_allocator_type: settings.cidr_allocator_type.clone(),
        node_monitor_period: settings.node_monitor_period.0,
        node_status_update_frequency: settings.node_status_update_frequency.0,
        route_reconciliation_period: settings.route_reconciliation_period.0,
        concurrent_node_syncs: settings.concurrent_node_syncs,
        concurrent_node_status_updates: settings.concurrent_node_status_updates,
        concurrent_service_syncs: settings.concurrent_service_syncs,
        cloud_call_timeout: settings.cloud_call_timeout.0,
        flags,
    };
    let config = ManagerConfig {
        component,
        clients,
        leader_election,
        selection,
        controllers,
    };
    let manager = Manager::new(config, registry.controllers().clone(), provider);
    let metrics = manager.metrics();
    metrics.set_build_info(&crate::version::build_info());
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

    let shutdown = CancellationToken::new();
    if let Some((serving, delegation)) = serving {
        let open_files = crate::serve::raise_open_files_limit();
        let limits = crate::serve::Limits::for_open_files(open_files);
        let address = crate::serve::start(
            serving,
            limits,
            delegation,
            manager.health(),
            manager.metrics(),
            crate::serve::Debug {
                profiling: settings.profiling,
                configz: configz(&settings).into(),
                set_verbosity,
            },
            shutdown.clone(),
        )
        .await?;
        tracing::info!(%address, open_files, max_connections = limits.max_connections, "serving healthz, livez, readyz, metrics and configz (and, with --profiling, debug/pprof and debug/flags/v) over HTTPS");
    }
    let signals = shutdown.clone();
    tokio::spawn(async move {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
            _ = terminate.recv() => tracing::info!("SIGTERM: shutting down"),
        }
        signals.cancel();
    });
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
