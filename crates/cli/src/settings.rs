//! The manager's settings: upstream's flags, with upstream's names and defaults, layered with figment.
//!
//! Built-in defaults < `--config FILE` (YAML, or TOML for `.toml`) < environment (`CCM_<FLAG>`, dashes as
//! underscores) < flags. Every source uses the flag's name as the key (`leader-elect-lease-duration: 15s`).
//!
//! The flags are one table ([`FLAGS`]): it builds the clap command and the "flags" layer, so a flag and its
//! setting cannot drift apart (a test checks every entry against [`Settings`]). Clap never supplies
//! defaults (it would override the file and the environment); the defaults live in [`Settings::default`].

use std::path::PathBuf;

use clap::{Arg, ArgAction, ArgMatches, Command};
use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::{Deserialize, Serialize};

use crate::duration::GoDuration;
use crate::lenient;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `--flag[=true|false]`.
    Bool,
    /// `--flag VALUE`.
    Value,
    /// `--flag A,B` (repeatable).
    List,
}

/// One flag: name (also the settings key), help section, kind, default as shown, help.
#[derive(Debug)]
pub(crate) struct Flag {
    pub(crate) name: &'static str,
    pub(crate) heading: &'static str,
    pub(crate) kind: Kind,
    pub(crate) default: &'static str,
    pub(crate) help: &'static str,
}

const GENERIC: &str = "Generic flags";
const DEBUGGING: &str = "Debugging flags";
const MIGRATION: &str = "Leader-migration flags";
const NODE: &str = "Cloud-node-controller flags";
const SERVICE: &str = "Service-lb-controller flags";
const MISC: &str = "Misc flags";
const SERVING: &str = "Secure serving flags";
const AUTHN: &str =
    "Authentication flags (delegated authentication is not implemented yet: accepted, no effect)";
const AUTHZ: &str =
    "Authorization flags (delegated authorization is not implemented yet: accepted, no effect)";
const WEBHOOK: &str = "Webhook flags (no webhooks are implemented: accepted, no effect)";
const LOGS: &str = "Logs flags";

macro_rules! flag {
    ($name:literal, $heading:expr, $kind:ident, $default:literal, $help:literal) => {
        Flag {
            name: $name,
            heading: $heading,
            kind: Kind::$kind,
            default: $default,
            help: $help,
        }
    };
}

/// Every flag of the manager.
pub(crate) const FLAGS: &[Flag] = &[
    flag!(
        "cloud-provider",
        GENERIC,
        Value,
        "",
        "The provider for cloud services (this binary has: fake). Required."
    ),
    flag!(
        "cloud-config",
        GENERIC,
        Value,
        "",
        "The path to the cloud provider configuration file. Empty string for no configuration file."
    ),
    flag!(
        "controllers",
        GENERIC,
        List,
        "*",
        "A list of controllers to enable. '*' enables all on-by-default controllers, 'foo' enables the controller named 'foo', '-foo' disables the controller named 'foo'. Controllers: cloud-node-controller, cloud-node-lifecycle-controller, service-lb-controller, node-route-controller. Disabled-by-default controllers: node-ipam-controller."
    ),
    flag!(
        "controller-start-interval",
        GENERIC,
        Value,
        "0s",
        "Interval between starting controller managers."
    ),
    flag!(
        "min-resync-period",
        GENERIC,
        Value,
        "12h0m0s",
        "Accepted for compatibility; watches here do not resync periodically."
    ),
    flag!(
        "kube-api-content-type",
        GENERIC,
        Value,
        "application/vnd.kubernetes.protobuf",
        "Accepted for compatibility; requests are JSON."
    ),
    flag!(
        "kube-api-qps",
        GENERIC,
        Value,
        "20",
        "QPS to use while talking with kubernetes apiserver (per controller, as upstream)."
    ),
    flag!(
        "kube-api-burst",
        GENERIC,
        Value,
        "30",
        "Burst to use while talking with kubernetes apiserver."
    ),
    flag!(
        "leader-elect",
        GENERIC,
        Bool,
        "true",
        "Start a leader election client and gain leadership before executing the main loop. Enable this when running replicated components for high availability."
    ),
    flag!(
        "leader-elect-lease-duration",
        GENERIC,
        Value,
        "15s",
        "The duration that non-leader candidates will wait after observing a leadership renewal until attempting to acquire leadership of a led but unrenewed leader slot (whole seconds)."
    ),
    flag!(
        "leader-elect-renew-deadline",
        GENERIC,
        Value,
        "10s",
        "The interval between attempts by the acting master to renew a leadership slot before it stops leading. Must be less than the lease duration."
    ),
    flag!(
        "leader-elect-retry-period",
        GENERIC,
        Value,
        "2s",
        "The duration the clients should wait between attempting acquisition and renewal of a leadership."
    ),
    flag!(
        "leader-elect-resource-lock",
        GENERIC,
        Value,
        "leases",
        "The type of resource object that is used for locking during leader election. The only supported option is 'leases'."
    ),
    flag!(
        "leader-elect-resource-name",
        GENERIC,
        Value,
        "cloud-controller-manager",
        "The name of resource object that is used for locking during leader election."
    ),
    flag!(
        "leader-elect-resource-namespace",
        GENERIC,
        Value,
        "kube-system",
        "The namespace of resource object that is used for locking during leader election."
    ),
    flag!(
        "on-lost-leadership",
        GENERIC,
        Value,
        "exit",
        "What losing a lock does: 'exit' (exit non-zero, as upstream) or 'recontend' (stop the lock's controllers and campaign again)."
    ),
    flag!(
        "external-cloud-volume-plugin",
        GENERIC,
        Value,
        "",
        "Accepted for compatibility; no effect."
    ),
    flag!(
        "use-service-account-credentials",
        GENERIC,
        Bool,
        "false",
        "Accepted for compatibility; controllers use the manager's credentials, with their own User-Agent."
    ),
    flag!(
        "allow-untagged-cloud",
        GENERIC,
        Bool,
        "false",
        "Allow the cluster to run without the cluster-id on cloud instances (deprecated)."
    ),
    flag!(
        "route-reconciliation-period",
        GENERIC,
        Value,
        "10s",
        "The period for reconciling routes created for Nodes by cloud provider."
    ),
    flag!(
        "node-monitor-period",
        GENERIC,
        Value,
        "5s",
        "The period for syncing NodeStatus in CloudNodeLifecycleController."
    ),
    flag!(
        "cluster-name",
        GENERIC,
        Value,
        "kubernetes",
        "The instance prefix for the cluster."
    ),
    flag!(
        "cluster-cidr",
        GENERIC,
        Value,
        "",
        "CIDR Range for Pods in cluster (one, or one IPv4 and one IPv6, comma-separated)."
    ),
    flag!(
        "allocate-node-cidrs",
        GENERIC,
        Bool,
        "false",
        "Should CIDRs for Pods be allocated and set on the cloud provider (node IPAM is not implemented here)."
    ),
    flag!(
        "cidr-allocator-type",
        GENERIC,
        Value,
        "RangeAllocator",
        "Type of CIDR allocator to use (node IPAM is not implemented here)."
    ),
    flag!(
        "configure-cloud-routes",
        GENERIC,
        Bool,
        "true",
        "Should CIDRs allocated by allocate-node-cidrs be configured on the cloud provider."
    ),
    flag!(
        "node-sync-period",
        GENERIC,
        Value,
        "0s",
        "Deprecated: this flag has no effect."
    ),
    flag!(
        "feature-gates",
        GENERIC,
        Value,
        "",
        "A set of key=value pairs that describe feature gates for alpha/experimental features. Accepted for compatibility; no gate changes behaviour here."
    ),
    flag!(
        "profiling",
        DEBUGGING,
        Bool,
        "true",
        "Accepted for compatibility; profiling endpoints are not served."
    ),
    flag!(
        "contention-profiling",
        DEBUGGING,
        Bool,
        "false",
        "Accepted for compatibility; no effect."
    ),
    flag!(
        "enable-leader-migration",
        MIGRATION,
        Bool,
        "false",
        "Whether to enable controller leader migration."
    ),
    flag!(
        "leader-migration-config",
        MIGRATION,
        Value,
        "",
        "Path to the config file for controller leader migration, or empty to use the value that reflects default configuration of the controller manager. The config file should be of type LeaderMigrationConfiguration, group controllermanager.config.k8s.io, version v1alpha1, v1beta1 or v1."
    ),
    flag!(
        "leader-migration-component",
        MIGRATION,
        Value,
        "cloud-controller-manager",
        "The component name this manager plays in leader migration (e.g. kube-controller-manager, to play the N side of a migration in tests)."
    ),
    flag!(
        "concurrent-node-syncs",
        NODE,
        Value,
        "128",
        "Number of nodes synced concurrently (upstream's default is 1). Cloud look-ups are batched (at most 8 calls in flight), so this bounds the nodes in flight: 128 initialises about 1,800 nodes/s against a cloud answering in 50 ms, where 1 manages about 15."
    ),
    flag!(
        "concurrent-node-status-updates",
        NODE,
        Value,
        "0",
        "Number of workers concurrently updating node status (0: --concurrent-node-syncs)."
    ),
    flag!(
        "concurrent-service-syncs",
        SERVICE,
        Value,
        "8",
        "Number of services synced concurrently (upstream's default is 1; one slow cloud call then stalls every other load balancer)."
    ),
    flag!(
        "master",
        MISC,
        Value,
        "",
        "The address of the Kubernetes API server (overrides any value in kubeconfig)."
    ),
    flag!(
        "kubeconfig",
        MISC,
        Value,
        "",
        "Path to kubeconfig file with authorization and master location information."
    ),
    flag!(
        "node-status-update-frequency",
        MISC,
        Value,
        "5m0s",
        "Specifies how often the controller updates nodes' status."
    ),
    flag!(
        "bind-address",
        SERVING,
        Value,
        "0.0.0.0",
        "The IP address on which to listen for the --secure-port port."
    ),
    flag!(
        "secure-port",
        SERVING,
        Value,
        "10258",
        "The port on which to serve HTTPS (healthz, livez, readyz, metrics). 0 turns serving off."
    ),
    flag!(
        "cert-dir",
        SERVING,
        Value,
        "",
        "Accepted for compatibility; without --tls-cert-file a self-signed certificate is made in memory."
    ),
    flag!(
        "tls-cert-file",
        SERVING,
        Value,
        "",
        "File containing the default x509 Certificate for HTTPS."
    ),
    flag!(
        "tls-private-key-file",
        SERVING,
        Value,
        "",
        "File containing the default x509 private key matching --tls-cert-file."
    ),
    flag!(
        "tls-cipher-suites",
        SERVING,
        List,
        "",
        "Accepted for compatibility; rustls' safe defaults are used."
    ),
    flag!(
        "tls-min-version",
        SERVING,
        Value,
        "",
        "Minimum TLS version supported: VersionTLS12 or VersionTLS13."
    ),
    flag!(
        "tls-sni-cert-key",
        SERVING,
        List,
        "",
        "Accepted for compatibility; no effect."
    ),
    flag!(
        "http2-max-streams-per-connection",
        SERVING,
        Value,
        "0",
        "Accepted for compatibility; serving is HTTP/1.1."
    ),
    flag!(
        "disable-http2-serving",
        SERVING,
        Bool,
        "false",
        "Accepted for compatibility; serving is HTTP/1.1."
    ),
    flag!(
        "permit-port-sharing",
        SERVING,
        Bool,
        "false",
        "Accepted for compatibility; no effect."
    ),
    flag!(
        "permit-address-sharing",
        SERVING,
        Bool,
        "false",
        "Accepted for compatibility; no effect."
    ),
    flag!(
        "authentication-kubeconfig",
        AUTHN,
        Value,
        "",
        "kubeconfig file pointing at the 'core' kubernetes server."
    ),
    flag!(
        "authentication-skip-lookup",
        AUTHN,
        Bool,
        "false",
        "Do not look up missing authentication configuration in the cluster."
    ),
    flag!(
        "authentication-tolerate-lookup-failure",
        AUTHN,
        Bool,
        "false",
        "Start even when authentication configuration cannot be looked up in the cluster."
    ),
    flag!(
        "authentication-token-webhook-cache-ttl",
        AUTHN,
        Value,
        "10s",
        "How long to cache responses from the token review webhook."
    ),
    flag!(
        "client-ca-file",
        AUTHN,
        Value,
        "",
        "CA bundle that verifies client certificates presented to the secure port."
    ),
    flag!(
        "requestheader-client-ca-file",
        AUTHN,
        Value,
        "",
        "CA bundle that verifies the front proxy's client certificate before request headers are trusted for user names."
    ),
    flag!(
        "requestheader-allowed-names",
        AUTHN,
        List,
        "",
        "Common names the front proxy's client certificate may have; empty allows any verified by the CA."
    ),
    flag!(
        "requestheader-username-headers",
        AUTHN,
        List,
        "x-remote-user",
        "Request headers to read the user name from, first match wins."
    ),
    flag!(
        "requestheader-uid-headers",
        AUTHN,
        List,
        "",
        "Request headers to read the user UID from."
    ),
    flag!(
        "requestheader-group-headers",
        AUTHN,
        List,
        "x-remote-group",
        "Request headers to read groups from."
    ),
    flag!(
        "requestheader-extra-headers-prefix",
        AUTHN,
        List,
        "x-remote-extra-",
        "Request header prefixes to read extra user information from."
    ),
    flag!(
        "authorization-kubeconfig",
        AUTHZ,
        Value,
        "",
        "kubeconfig file pointing at the 'core' kubernetes server."
    ),
    flag!(
        "authorization-webhook-cache-authorized-ttl",
        AUTHZ,
        Value,
        "10s",
        "How long to cache 'authorized' responses from the authorization webhook."
    ),
    flag!(
        "authorization-webhook-cache-unauthorized-ttl",
        AUTHZ,
        Value,
        "10s",
        "How long to cache 'unauthorized' responses from the authorization webhook."
    ),
    flag!(
        "authorization-always-allow-paths",
        AUTHZ,
        List,
        "/healthz,/readyz,/livez",
        "Paths served without authorization."
    ),
    flag!("webhooks", WEBHOOK, List, "", "Webhooks to serve."),
    flag!(
        "webhook-bind-address",
        WEBHOOK,
        Value,
        "0.0.0.0",
        "The IP address on which to listen for the --webhook-secure-port port."
    ),
    flag!(
        "webhook-secure-port",
        WEBHOOK,
        Value,
        "10260",
        "The port on which to serve webhooks over HTTPS."
    ),
    flag!(
        "webhook-cert-dir",
        WEBHOOK,
        Value,
        "",
        "The directory holding the webhooks' TLS certificate and key."
    ),
    flag!(
        "v",
        LOGS,
        Value,
        "0",
        "Number for the log level verbosity (0: info, 2+: debug for this program, 6+: trace)."
    ),
    flag!(
        "vmodule",
        LOGS,
        Value,
        "",
        "Accepted for compatibility; use RUST_LOG for per-module levels."
    ),
    flag!(
        "logging-format",
        LOGS,
        Value,
        "text",
        "Sets the log format: text or json."
    ),
    flag!(
        "log-flush-frequency",
        LOGS,
        Value,
        "5s",
        "Accepted for compatibility; logs are written unbuffered."
    ),
];

/// The effective settings.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct Settings {
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) cloud_provider: String,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) cloud_config: String,
    #[serde(deserialize_with = "lenient::list")]
    pub(crate) controllers: Vec<String>,
    #[serde(deserialize_with = "lenient::duration", serialize_with = "as_text::serialize")]
    pub(crate) controller_start_interval: GoDuration,
    #[serde(deserialize_with = "lenient::duration", serialize_with = "as_text::serialize")]
    pub(crate) min_resync_period: GoDuration,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) kube_api_content_type: String,
    #[serde(deserialize_with = "lenient::parsed")]
    pub(crate) kube_api_qps: f32,
    #[serde(deserialize_with = "lenient::parsed")]
    pub(crate) kube_api_burst: u32,
    #[serde(deserialize_with = "lenient::boolean")]
    pub(crate) leader_elect: bool,
    #[serde(deserialize_with = "lenient::duration", serialize_with = "as_text::serialize")]
    pub(crate) leader_elect_lease_duration: GoDuration,
    #[serde(deserialize_with = "lenient::duration", serialize_with = "as_text::serialize")]
    pub(crate) leader_elect_renew_deadline: GoDuration,
    #[serde(deserialize_with = "lenient::duration", serialize_with = "as_text::serialize")]
    pub(crate) leader_elect_retry_period: GoDuration,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) leader_elect_resource_lock: String,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) leader_elect_resource_name: String,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) leader_elect_resource_namespace: String,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) on_lost_leadership: String,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) external_cloud_volume_plugin: String,
    #[serde(deserialize_with = "lenient::boolean")]
    pub(crate) use_service_account_credentials: bool,
    #[serde(deserialize_with = "lenient::boolean")]
    pub(crate) allow_untagged_cloud: bool,
    #[serde(deserialize_with = "lenient::duration", serialize_with = "as_text::serialize")]
    pub(crate) route_reconciliation_period: GoDuration,
    #[serde(deserialize_with = "lenient::duration", serialize_with = "as_text::serialize")]
    pub(crate) node_monitor_period: GoDuration,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) cluster_name: String,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) cluster_cidr: String,
    #[serde(deserialize_with = "lenient::boolean")]
    pub(crate) allocate_node_cidrs: bool,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) cidr_allocator_type: String,
    #[serde(deserialize_with = "lenient::boolean")]
    pub(crate) configure_cloud_routes: bool,
    #[serde(deserialize_with = "lenient::duration", serialize_with = "as_text::serialize")]
    pub(crate) node_sync_period: GoDuration,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) feature_gates: String,
    #[serde(deserialize_with = "lenient::boolean")]
    pub(crate) profiling: bool,
    #[serde(deserialize_with = "lenient::boolean")]
    pub(crate) contention_profiling: bool,
    #[serde(deserialize_with = "lenient::boolean")]
    pub(crate) enable_leader_migration: bool,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) leader_migration_config: String,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) leader_migration_component: String,
    #[serde(deserialize_with = "lenient::parsed")]
    pub(crate) concurrent_node_syncs: u16,
    #[serde(deserialize_with = "lenient::parsed")]
    pub(crate) concurrent_node_status_updates: u16,
    #[serde(deserialize_with = "lenient::parsed")]
    pub(crate) concurrent_service_syncs: u16,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) master: String,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) kubeconfig: String,
    #[serde(deserialize_with = "lenient::duration", serialize_with = "as_text::serialize")]
    pub(crate) node_status_update_frequency: GoDuration,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) bind_address: String,
    #[serde(deserialize_with = "lenient::parsed")]
    pub(crate) secure_port: u16,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) cert_dir: String,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) tls_cert_file: String,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) tls_private_key_file: String,
    #[serde(deserialize_with = "lenient::list")]
    pub(crate) tls_cipher_suites: Vec<String>,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) tls_min_version: String,
    #[serde(deserialize_with = "lenient::list")]
    pub(crate) tls_sni_cert_key: Vec<String>,
    #[serde(deserialize_with = "lenient::parsed")]
    pub(crate) http2_max_streams_per_connection: u32,
    #[serde(deserialize_with = "lenient::boolean")]
    pub(crate) disable_http2_serving: bool,
    #[serde(deserialize_with = "lenient::boolean")]
    pub(crate) permit_port_sharing: bool,
    #[serde(deserialize_with = "lenient::boolean")]
    pub(crate) permit_address_sharing: bool,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) authentication_kubeconfig: String,
    #[serde(deserialize_with = "lenient::boolean")]
    pub(crate) authentication_skip_lookup: bool,
    #[serde(deserialize_with = "lenient::boolean")]
    pub(crate) authentication_tolerate_lookup_failure: bool,
    #[serde(deserialize_with = "lenient::duration", serialize_with = "as_text::serialize")]
    pub(crate) authentication_token_webhook_cache_ttl: GoDuration,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) client_ca_file: String,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) requestheader_client_ca_file: String,
    #[serde(deserialize_with = "lenient::list")]
    pub(crate) requestheader_allowed_names: Vec<String>,
    #[serde(deserialize_with = "lenient::list")]
    pub(crate) requestheader_username_headers: Vec<String>,
    #[serde(deserialize_with = "lenient::list")]
    pub(crate) requestheader_uid_headers: Vec<String>,
    #[serde(deserialize_with = "lenient::list")]
    pub(crate) requestheader_group_headers: Vec<String>,
    #[serde(deserialize_with = "lenient::list")]
    pub(crate) requestheader_extra_headers_prefix: Vec<String>,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) authorization_kubeconfig: String,
    #[serde(deserialize_with = "lenient::duration", serialize_with = "as_text::serialize")]
    pub(crate) authorization_webhook_cache_authorized_ttl: GoDuration,
    #[serde(deserialize_with = "lenient::duration", serialize_with = "as_text::serialize")]
    pub(crate) authorization_webhook_cache_unauthorized_ttl: GoDuration,
    #[serde(deserialize_with = "lenient::list")]
    pub(crate) authorization_always_allow_paths: Vec<String>,
    #[serde(deserialize_with = "lenient::list")]
    pub(crate) webhooks: Vec<String>,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) webhook_bind_address: String,
    #[serde(deserialize_with = "lenient::parsed")]
    pub(crate) webhook_secure_port: u16,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) webhook_cert_dir: String,
    #[serde(deserialize_with = "lenient::parsed")]
    pub(crate) v: u8,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) vmodule: String,
    #[serde(deserialize_with = "lenient::string")]
    pub(crate) logging_format: String,
    #[serde(deserialize_with = "lenient::duration", serialize_with = "as_text::serialize")]
    pub(crate) log_flush_frequency: GoDuration,
}

/// Durations serialise as Go text (for `--help`, `default` and round trips).
mod as_text {
    use serde::Serializer;

    use crate::duration::GoDuration;

    pub(super) fn serialize<S: Serializer>(value: &GoDuration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(value)
    }
}

/// The defaults of [`FLAGS`], as a figment layer: the table is the one place defaults are written.
fn defaults() -> Serialized<Dict> {
    Serialized::defaults(
        FLAGS
            .iter()
            .map(|f| (f.name.to_owned(), Value::from(f.default.to_owned())))
            .collect(),
    )
}

impl Default for Settings {
    fn default() -> Settings {
        Figment::from(defaults())
            .extract()
            .expect("the flag table's defaults are valid settings")
    }
}

/// The flags layer: values given on the command line only.
struct CommandLine(Dict);

impl Provider for CommandLine {
    fn metadata(&self) -> Metadata {
        Metadata::named("command-line flags")
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.0.clone()))
    }
}

/// Adds every flag of [`FLAGS`] to `command`, with no clap defaults.
pub(crate) fn add_flags(mut command: Command) -> Command {
    for flag in FLAGS {
        let help = match (flag.default, flag.help) {
            ("", help) => help.to_owned(),
            (default, help) => format!("{help} [default: {default}]"),
        };
        let mut arg = Arg::new(flag.name)
            .long(flag.name)
            .help(help)
            .help_heading(flag.heading)
            .global(false);
        // As pflag, a repeated flag's last value wins (lists accumulate).
        if flag.kind != Kind::List {
            arg = arg.overrides_with(flag.name);
        }
        arg = match flag.kind {
            Kind::Bool => arg
                .num_args(0..=1)
                .require_equals(true)
                .default_missing_value("true")
                .value_parser(["true", "false", "True", "False", "1", "0"]),
            Kind::Value => arg.num_args(1).action(ArgAction::Set),
            Kind::List => arg.num_args(1).action(ArgAction::Append).value_delimiter(','),
        };
        if flag.name == "v" {
            arg = arg.short('v').value_name("LEVEL");
        }
        command = command.arg(arg);
    }
    command.arg(
        Arg::new("config")
            .long("config")
            .value_name("FILE")
            .help("Settings file (YAML, or TOML when it ends in .toml), with flag names as keys. Layering: defaults < this file < CCM_<FLAG> environment variables < flags.")
            .help_heading(GENERIC),
    )
}

/// A setting that cannot be read, naming its source.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct SettingsError(pub(crate) String);

/// `--cloud-provider` for the command line, `CCM_CLOUD_PROVIDER` for the environment, the key for a file.
fn describe(error: &figment::Error) -> String {
    let key = error.path.last().cloned().unwrap_or_default();
    let source = error
        .metadata
        .as_ref()
        .map(|m| m.name.to_string())
        .unwrap_or_default();
    let place = if source.contains("command-line") {
        format!("--{key}")
    } else if source.contains("environment") {
        format!("CCM_{}", key.to_ascii_uppercase().replace('-', "_"))
    } else {
        match error.metadata.as_ref().and_then(|m| m.source.as_ref()) {
            Some(figment::Source::File(path)) => format!("{}: {key}", path.display()),
            _ => key,
        }
    };
    let mut kind = error.kind.to_string();
    if let figment::error::Kind::UnknownField(field, _) = &error.kind {
        kind = format!(
            "unknown setting {field:?} (settings are named as the flags, e.g. leader-elect-lease-duration)"
        );
    }
    if place.is_empty() {
        kind
    } else {
        format!("{place}: {kind}")
    }
}

/// The effective settings from all sources.
pub(crate) fn layered(matches: &ArgMatches) -> Result<Settings, SettingsError> {
    let mut figment = Figment::from(defaults());
    if let Some(path) = matches.get_one::<String>("config") {
        let path = PathBuf::from(path);
        if !path.is_file() {
            return Err(SettingsError(format!(
                "--config: {}: no such file",
                path.display()
            )));
        }
        figment = if path.extension().is_some_and(|e| e == "toml") {
            figment.merge(Toml::file_exact(&path))
        } else {
            figment.merge(serde_saphyr::figment::Yaml::file_exact(&path))
        };
    }
    figment = figment.merge(
        Env::prefixed("CCM_")
            .map(|key| key.as_str().replace('_', "-").into())
            .lowercase(true),
    );
    let mut given = Dict::new();
    for flag in FLAGS {
        if matches.value_source(flag.name) != Some(clap::parser::ValueSource::CommandLine) {
            continue;
        }
        let values: Vec<String> = matches
            .get_many::<String>(flag.name)
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        let value = match flag.kind {
            Kind::List => Value::from(values),
            Kind::Bool | Kind::Value => Value::from(values.last().cloned().unwrap_or_default()),
        };
        given.insert(flag.name.to_owned(), value);
    }
    figment = figment.merge(CommandLine(given));
    figment.extract().map_err(|error| {
        SettingsError(
            error
                .into_iter()
                .map(|e| describe(&e))
                .collect::<Vec<_>>()
                .join("\n"),
        )
    })
}

#[cfg(test)]
// figment::Jail's closures return figment's (large) error type.
#[allow(clippy::result_large_err)]
pub(crate) mod tests {
    use super::*;

    fn command() -> Command {
        add_flags(Command::new("test"))
    }

    /// Runs `f` with no environment variables, serialised with every other test that touches the environment.
    pub(crate) fn hermetic(f: impl FnOnce()) {
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            f();
            Ok(())
        });
    }

    #[test]
    fn every_flag_says_what_it_does() {
        let silent: Vec<&str> = FLAGS
            .iter()
            .filter(|f| f.help.trim().is_empty())
            .map(|f| f.name)
            .collect();
        assert!(silent.is_empty(), "flags without help: {silent:?}");
    }

    #[test]
    fn the_table_and_the_settings_match() {
        // Every table entry is a setting (deny_unknown_fields would refuse a stray one) …
        let defaults = Settings::default();
        // … and every setting is in the table.
        let serialized = serde_json::to_value(&defaults).unwrap();
        let keys: Vec<&String> = serialized.as_object().unwrap().keys().collect();
        for key in &keys {
            assert!(
                FLAGS.iter().any(|f| f.name == key.as_str()),
                "setting {key} has no flag"
            );
        }
        assert_eq!(keys.len(), FLAGS.len());
    }

    #[test]
    fn upstream_defaults() {
        let s = Settings::default();
        assert_eq!(s.controllers, ["*"]);
        assert_eq!((s.kube_api_qps, s.kube_api_burst), (20.0, 30));
        assert!(s.leader_elect);
        assert_eq!(s.leader_elect_lease_duration.to_string(), "15s");
        assert_eq!(s.leader_elect_renew_deadline.to_string(), "10s");
        assert_eq!(s.leader_elect_retry_period.to_string(), "2s");
        assert_eq!(s.leader_elect_resource_name, "cloud-controller-manager");
        assert_eq!(s.leader_elect_resource_namespace, "kube-system");
        assert_eq!(s.node_monitor_period.to_string(), "5s");
        assert_eq!(s.node_status_update_frequency.to_string(), "5m0s");
        assert_eq!(s.route_reconciliation_period.to_string(), "10s");
        assert_eq!(s.min_resync_period.to_string(), "12h0m0s");
        assert_eq!(s.secure_port, 10258);
        assert_eq!(s.cluster_name, "kubernetes");
        assert!(s.configure_cloud_routes && !s.enable_leader_migration);
        assert_eq!(
            s.authorization_always_allow_paths,
            ["/healthz", "/readyz", "/livez"]
        );
    }

    #[test]
    fn flags_override_and_bools_take_an_equals() {
        hermetic(|| {
            let matches = command()
                .try_get_matches_from([
                    "t",
                    "--leader-elect=false",
                    "--cluster-name",
                    "prod",
                    "--controllers",
                    "*,-route",
                    "--controllers=nodeipam",
                    "-v",
                    "4",
                ])
                .unwrap();
            let s = layered(&matches).unwrap();
            assert!(!s.leader_elect);
            assert_eq!(s.cluster_name, "prod");
            assert_eq!(s.controllers, ["*", "-route", "nodeipam"]);
            assert_eq!(s.v, 4);
            let bare = command()
                .try_get_matches_from(["t", "--enable-leader-migration"])
                .unwrap();
            assert!(layered(&bare).unwrap().enable_leader_migration);
            assert!(
                command()
                    .try_get_matches_from(["t", "--leader-elect", "false"])
                    .is_err(),
                "as pflag: false needs an equals sign"
            );
            let repeated = command()
                .try_get_matches_from([
                    "t",
                    "--enable-leader-migration",
                    "--enable-leader-migration=false",
                    "--v=2",
                    "--v=3",
                ])
                .unwrap();
            let settings = layered(&repeated).unwrap();
            assert_eq!(
                (settings.enable_leader_migration, settings.v),
                (false, 3),
                "the last occurrence wins"
            );
        });
    }

    #[test]
    fn bad_values_name_the_flag() {
        hermetic(|| {
            let matches = command()
                .try_get_matches_from(["t", "--leader-elect-lease-duration", "fifteen"])
                .unwrap();
            let error = layered(&matches).unwrap_err().to_string();
            assert!(error.starts_with("--leader-elect-lease-duration: "), "{error}");
            assert!(error.contains("invalid duration \"fifteen\""), "{error}");
        });
    }

    /// The layers, each from its real source: a file in a scratch directory, the process environment (the
    /// jail restores it and serialises the tests that touch it), and the command line.
    #[test]
    fn defaults_file_environment_and_flags_layer_in_that_order() {
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file(
                "ccm.yaml",
                "cluster-name: from-file\nconcurrent-node-syncs: 4\nkube-api-qps: 50\nnode-monitor-period: 7s\n",
            )?;
            jail.set_env("CCM_CONCURRENT_NODE_SYNCS", "8");
            // A number-looking string stays a string (figment's Env would read an integer).
            jail.set_env("CCM_CLUSTER_NAME", "12345");
            let matches = command()
                .try_get_matches_from(["t", "--config", "ccm.yaml", "--kube-api-qps=100"])
                .unwrap();
            let s = layered(&matches).unwrap();
            assert_eq!(s.cluster_name, "12345", "environment over file");
            assert_eq!(s.concurrent_node_syncs, 8, "environment over file");
            assert_eq!(s.kube_api_qps, 100.0, "flag over file");
            assert_eq!(s.node_monitor_period.to_string(), "7s", "file over default");
            assert!(s.leader_elect, "default");
            Ok(())
        });
    }

    #[test]
    fn a_toml_file_reads_the_same_keys() {
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file(
                "ccm.toml",
                "cluster-name = \"toml\"\nleader-elect = false\ncontrollers = [\"*\", \"-route\"]\n",
            )?;
            let matches = command()
                .try_get_matches_from(["t", "--config=ccm.toml"])
                .unwrap();
            let s = layered(&matches).unwrap();
            assert_eq!(s.cluster_name, "toml");
            assert!(!s.leader_elect);
            assert_eq!(s.controllers, ["*", "-route"]);
            Ok(())
        });
    }

    #[test]
    fn errors_name_the_file_and_key_the_variable_or_the_flag() {
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("bad.yaml", "concurrent-node-syncs: many\n")?;
            let in_file = layered(
                &command()
                    .try_get_matches_from(["t", "--config", "bad.yaml"])
                    .unwrap(),
            )
            .unwrap_err()
            .to_string();
            assert!(in_file.contains("bad.yaml: concurrent-node-syncs: "), "{in_file}");

            jail.create_file("unknown.yaml", "leader-elect-lease-durration: 15s\n")?;
            let unknown = layered(
                &command()
                    .try_get_matches_from(["t", "--config", "unknown.yaml"])
                    .unwrap(),
            )
            .unwrap_err()
            .to_string();
            assert!(
                unknown.contains("unknown setting \"leader-elect-lease-durration\""),
                "{unknown}"
            );

            let missing = layered(
                &command()
                    .try_get_matches_from(["t", "--config", "absent.yaml"])
                    .unwrap(),
            )
            .unwrap_err()
            .to_string();
            assert_eq!(missing, "--config: absent.yaml: no such file");

            jail.set_env("CCM_NODE_MONITOR_PERIOD", "soon");
            let in_env = layered(&command().try_get_matches_from(["t"]).unwrap())
                .unwrap_err()
                .to_string();
            assert!(in_env.starts_with("CCM_NODE_MONITOR_PERIOD: "), "{in_env}");
            assert!(in_env.contains("\"soon\""), "{in_env}");
            Ok(())
        });
    }
}
