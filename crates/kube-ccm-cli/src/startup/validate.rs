//! Step 1 of the start: every setting checked, all problems reported together (exit 2), each naming its
//! flag; what the later steps need comes out of it as a [`Startup`].

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use kube_ccm_leadermigration::scopes::LossPolicy;
use kube_ccm_leadermigration::{
    ControllerCatalog, ControllerSelection, LeaseTimings, apply_migration_options,
    validate_leader_elect_resource_lock,
};
use kube_ccm_runtime::{Cidr, ControllerRegistry, FlagValues, LeaderElectionConfig, Registry};

use crate::feature_gates::FeatureGates;
use crate::serve::Serving;
use crate::settings::Settings;

/// Problems found so far, each a line naming its flag.
type Problems = Vec<String>;

/// What is started, once every setting is known to be valid.
pub(crate) struct Startup {
    pub(crate) settings: Settings,
    pub(crate) selection: ControllerSelection,
    /// `None` with `--leader-elect=false`.
    pub(crate) leader_election: Option<LeaderElectionConfig>,
    pub(crate) cluster_cidrs: Vec<Cidr>,
    pub(crate) serving: Option<Serving>,
    /// The webhook server (`--webhook-secure-port`, its TLS flags); `None` with port 0.
    pub(crate) webhook_serving: Option<Serving>,
    /// The values of the controllers' own flags.
    pub(crate) flags: FlagValues,
    /// `--feature-gates`, over the defaults.
    pub(crate) feature_gates: FeatureGates,
}

/// Checks every setting; all problems are reported together, each naming its flag. Controller names
/// resolve against `controllers`, the binary's registry, and each enabled controller of the chosen
/// provider checks its own `flags`.
pub(crate) fn validate(
    settings: Settings,
    flags: FlagValues,
    registry: &Registry,
) -> Result<Startup, Vec<String>> {
    let controllers = registry.controllers();
    let mut problems = Problems::new();
    if settings.cloud_provider.is_empty() {
        problems.push("--cloud-provider cannot be empty".to_owned());
    }
    let selection = controller_selection(&settings, &flags, controllers, &mut problems);
    let leader_election = leader_election(&settings, controllers.catalog(), &mut problems);
    let cluster_cidrs = Cidr::parse_list(&settings.cluster_cidr).unwrap_or_else(|error| {
        problems.push(format!("--cluster-cidr: {error}"));
        Vec::new()
    });
    workers_and_periods(&settings, &mut problems);
    safeguards(&settings, &mut problems);
    let serving = serving(&settings, &mut problems);
    let webhook_serving = webhook_serving(&settings, registry, &mut problems);
    let feature_gates = feature_gates(&settings, &mut problems);
    logging(&settings, &feature_gates, &mut problems);
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
        webhook_serving,
        flags,
    })
}

/// `--controllers`, and the own flags of each enabled controller of the chosen provider.
fn controller_selection(
    settings: &Settings,
    flags: &FlagValues,
    controllers: &ControllerRegistry,
    problems: &mut Problems,
) -> ControllerSelection {
    let catalog = controllers.catalog();
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
            && let Some(problem) = definition.flags_problem(flags)
        {
            problems.push(format!("{}: {problem}", definition.name()));
        }
    }
    selection
}

/// The main lock (`--leader-elect*`, `--on-lost-leadership`) and the migration configuration
/// (`--enable-leader-migration`, `--leader-migration-config`); `None` without leader election.
fn leader_election(
    settings: &Settings,
    catalog: &ControllerCatalog,
    problems: &mut Problems,
) -> Option<LeaderElectionConfig> {
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
    if settings.leader_elect
        && let Some(warning) = timings.as_ref().and_then(takeover_margin)
    {
        tracing::warn!("{warning}");
    }
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
    for warning in without_election(settings, migration.is_some()) {
        tracing::warn!("{warning}");
    }
    match (settings.leader_elect, timings) {
        (true, Some(timings)) => {
            let mut election = LeaderElectionConfig::new(
                &settings.leader_elect_resource_namespace,
                &settings.leader_elect_resource_name,
                timings,
                on_loss,
            );
            election.warm_standby = settings.warm_standby;
            match migration {
                Some(migration) => election
                    .with_migration(migration)
                    .map_err(|clash| problems.push(clash.to_string()))
                    .ok(),
                None => Some(election),
            }
        }
        _ => None,
    }
}

/// The flags that `--leader-elect=false` makes void, each as a warning: a leader-migration configuration
/// (`migration`: one was given) and `--warm-standby`.
fn without_election(settings: &Settings, migration: bool) -> Vec<&'static str> {
    let mut warnings = Vec::new();
    if settings.leader_elect {
        return warnings;
    }
    if migration {
        warnings.push(
            "--enable-leader-migration has no effect with --leader-elect=false (as upstream): every enabled controller runs",
        );
    }
    if settings.warm_standby {
        warnings.push(
            "--warm-standby has no effect with --leader-elect=false: the process runs its controllers at once, so it is never a standby",
        );
    }
    warnings
}

/// What may still reach the API server after this process stopped acting (a renew deadline after its last
/// renewal) comes before the earliest takeover (a lease duration after it) only if the margin between the
/// two covers: client-go's electors (kube-controller-manager, upstream cloud-controller-managers sharing a
/// Lease with this process) reading `renewTime` in whole seconds, so taking a Lease up to a second early;
/// and the network holding a write the fence let go before its deadline (Linux keeps what a socket sent
/// while it resolves the next hop's address, 3 probes 1 s apart by default, and sends it when the link
/// returns, after the socket was reset). A warning when the margin is 3 s or less.
fn takeover_margin(timings: &LeaseTimings) -> Option<String> {
    let margin = timings.lease_duration().saturating_sub(timings.renew_deadline());
    (margin <= Duration::from_secs(3)).then(|| {
        format!(
            "--leader-elect-renew-deadline ({:?}) is within 3s of --leader-elect-lease-duration ({:?}): a write sent just before this process stops acting may reach the API server after another process took the Lease (client-go's electors read renewals in whole seconds and may take a Lease up to a second early; a network may hold a write for seconds, Linux for up to 3s while it resolves an address); leave more than 3s between them (upstream's defaults leave 5s)",
            timings.renew_deadline(),
            timings.lease_duration()
        )
    })
}

/// The workers' counts, every period and timeout, and the client's rate.
fn workers_and_periods(settings: &Settings, problems: &mut Problems) {
    for (flag, value) in [
        ("--concurrent-node-syncs", settings.concurrent_node_syncs),
        ("--concurrent-service-syncs", settings.concurrent_service_syncs),
        (
            "--concurrent-load-balancer-host-updates",
            settings.concurrent_load_balancer_host_updates,
        ),
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
}

/// The node-deletion safeguards, the orphan sweep and the cloud budget (flags of this manager's own).
fn safeguards(settings: &Settings, problems: &mut Problems) {
    const DAY: Duration = Duration::from_secs(24 * 3600);
    if settings.node_deletion_confirm_after.0 > DAY {
        problems.push(format!(
            "--node-deletion-confirm-after must be at most 24h (got {}s)",
            settings.node_deletion_confirm_after.0.as_secs()
        ));
    }
    if !(0.0..=1.0).contains(&settings.node_deletion_breaker_ratio) {
        problems.push(format!(
            "--node-deletion-breaker-ratio must be between 0 and 1 (got {})",
            settings.node_deletion_breaker_ratio
        ));
    }
    if settings.load_balancer_orphan_grace.0 > 7 * DAY {
        problems.push(format!(
            "--load-balancer-orphan-grace must be at most 168h (got {}s)",
            settings.load_balancer_orphan_grace.0.as_secs()
        ));
    }
    let period = settings.load_balancer_orphan_sweep_period.0;
    if !period.is_zero() && settings.load_balancer_orphan_grace.0 < period {
        problems.push(format!(
            "--load-balancer-orphan-grace must be at least --load-balancer-orphan-sweep-period (got {}s and {}s), so that two sweeps see a load balancer unclaimed before it is deleted",
            settings.load_balancer_orphan_grace.0.as_secs_f64(),
            period.as_secs_f64()
        ));
    }
    if settings.load_balancer_orphan_sweep_period.0 > DAY {
        problems.push(format!(
            "--load-balancer-orphan-sweep-period must be at most 24h (got {}s)",
            settings.load_balancer_orphan_sweep_period.0.as_secs()
        ));
    }
    if !settings.cloud_api_qps.is_finite() {
        problems.push(format!(
            "--cloud-api-qps must be a number (got {})",
            settings.cloud_api_qps
        ));
    }
}

/// Secure serving (`--bind-address`, `--secure-port`, the TLS flags) and the webhook server's TLS flags;
/// `None` with `--secure-port=0`.
fn serving(settings: &Settings, problems: &mut Problems) -> Option<Serving> {
    if settings.secure_port == 0 {
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
            flags: "",
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
    }
}

/// `--feature-gates`, over the defaults (the default gates when they do not parse).
fn feature_gates(settings: &Settings, problems: &mut Problems) -> FeatureGates {
    match FeatureGates::parse(&settings.feature_gates) {
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
    }
}

/// `--logging-format` and the alpha logging flags (behind `LoggingAlphaOptions`, as upstream).
fn logging(settings: &Settings, feature_gates: &FeatureGates, problems: &mut Problems) {
    if !matches!(settings.logging_format.as_str(), "text" | "json") {
        problems.push(format!(
            "--logging-format: {:?} is not supported (text or json)",
            settings.logging_format
        ));
    }
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
}

/// A TLS minimum version flag: whether only TLS 1.3 is offered.
pub(crate) fn tls13_only(flag: &str, value: &str) -> Result<bool, String> {
    match value {
        "" | "VersionTLS12" => Ok(false),
        "VersionTLS13" => Ok(true),
        other => Err(format!(
            "{flag}: {other:?} is not supported (VersionTLS12 or VersionTLS13)"
        )),
    }
}

/// The webhook server: `--webhooks` names registered webhooks, `--webhook-bind-address`,
/// `--webhook-secure-port` (not `--secure-port`'s), and the TLS flags checked as the serving flags are;
/// `None` with `--webhook-secure-port=0`. Without `--webhook-tls-cert-file`, `--webhook-cert-dir` holds
/// upstream's `cloud-controller-manager-webhook.crt`/`.key` (made when missing); without either, a
/// self-signed certificate is made in memory.
fn webhook_serving(settings: &Settings, registry: &Registry, problems: &mut Problems) -> Option<Serving> {
    if let Err(problem) = kube_ccm_runtime::webhooks::check_selection(registry.webhooks(), &settings.webhooks)
    {
        problems.push(problem.to_string());
    }
    let files = (
        !settings.webhook_tls_cert_file.is_empty(),
        !settings.webhook_tls_private_key_file.is_empty(),
    );
    if files.0 != files.1 {
        problems.push(
            "--webhook-tls-cert-file and --webhook-tls-private-key-file must be given together".to_owned(),
        );
    }
    let tls13_only = tls13_only("--webhook-tls-min-version", &settings.webhook_tls_min_version)
        .unwrap_or_else(|problem| {
            problems.push(problem);
            false
        });
    let cipher_suites =
        crate::serve::cipher_suites("--webhook-tls-cipher-suites", &settings.webhook_tls_cipher_suites)
            .unwrap_or_else(|problem| {
                problems.push(problem);
                None
            });
    let kx_groups = crate::serve::kx_groups(
        "--webhook-tls-curve-preferences",
        &settings.webhook_tls_curve_preferences,
    )
    .unwrap_or_else(|problem| {
        problems.push(problem);
        None
    });
    if settings.webhook_secure_port == 0 {
        return None;
    }
    if settings.webhook_secure_port == settings.secure_port {
        problems.push("--webhook-secure-port cannot be the same value as --secure-port".to_owned());
    }
    let Ok(ip) = settings.webhook_bind_address.parse::<IpAddr>() else {
        problems.push(format!(
            "--webhook-bind-address: {:?} is not an IP address",
            settings.webhook_bind_address
        ));
        return None;
    };
    let (cert_file, key_file) = if files.0 {
        (
            Some(settings.webhook_tls_cert_file.clone()),
            Some(settings.webhook_tls_private_key_file.clone()),
        )
    } else if !settings.webhook_cert_dir.is_empty() {
        let dir = Path::new(&settings.webhook_cert_dir);
        let pair = |extension: &str| {
            Some(
                dir.join(format!("{WEBHOOK_PAIR_NAME}.{extension}"))
                    .display()
                    .to_string(),
            )
        };
        (pair("crt"), pair("key"))
    } else {
        (None, None)
    };
    Some(Serving {
        address: SocketAddr::new(ip, settings.webhook_secure_port),
        flags: "webhook-",
        cert_file,
        key_file,
        tls13_only,
        client_ca: None,
        front_proxy: None,
        cipher_suites,
        kx_groups,
        reload_check: crate::serve::RELOAD_CHECK,
    })
}

/// Upstream's name for the webhook server's certificate pair in `--webhook-cert-dir`.
const WEBHOOK_PAIR_NAME: &str = "cloud-controller-manager-webhook";

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renew_deadline_within_3s_of_the_lease_duration_is_warned_about() {
        let check = |lease: u64, renew_ms: u64, warned: bool| {
            let timings = LeaseTimings::new(
                Duration::from_secs(lease),
                Duration::from_millis(renew_ms),
                Duration::from_millis(100),
            )
            .unwrap();
            assert_eq!(
                takeover_margin(&timings).is_some(),
                warned,
                "{lease}s/{renew_ms}ms"
            );
        };
        check(15, 10_000, false);
        check(5, 1_900, false);
        check(5, 2_000, true);
        check(2, 900, true);
        check(15, 14_500, true);
    }

    #[test]
    fn flags_void_without_leader_election_are_warned_about() {
        let settings = |leader_elect: bool, warm_standby: bool| Settings {
            leader_elect,
            warm_standby,
            ..Settings::default()
        };
        assert!(without_election(&settings(true, true), true).is_empty());
        assert!(without_election(&settings(false, false), false).is_empty());
        let both = without_election(&settings(false, true), true);
        assert_eq!(both.len(), 2);
        assert!(both[0].starts_with("--enable-leader-migration "));
        assert!(both[1].starts_with("--warm-standby "));
        assert_eq!(without_election(&settings(false, true), false), [both[1]]);
    }
}
