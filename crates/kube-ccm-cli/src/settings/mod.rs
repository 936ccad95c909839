//! The manager's settings: upstream's flags, with upstream's names and defaults, layered with figment.
//!
//! Built-in defaults < `--config FILE` (YAML, or TOML for `.toml`) < environment (`CCM_<FLAG>`, dashes as
//! underscores) < flags. Every source uses the flag's name as the key (`leader-elect-lease-duration: 15s`).
//!
//! Each flag is declared once, in [`flags`]: that makes the [`Settings`] struct and the [`FLAGS`] table, which
//! builds the clap command and the "flags" layer. Clap never supplies defaults (it would override the file
//! and the environment); the defaults are the table's, through [`Settings::default`].

mod flags;

use std::path::PathBuf;

use clap::{Arg, ArgAction, ArgMatches, Command};
use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use kube_ccm_runtime::{ControllerDefinition, Flag, FlagKind, FlagValue, FlagValues, Registry};
use serde::Deserializer;

pub(crate) use self::flags::{FLAGS, Settings};
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
pub(crate) struct ManagerFlag {
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
    "Authentication flags (who may read /metrics: TokenReview, client certificates, front proxy)";
const AUTHZ: &str =
    "Authorization flags (SubjectAccessReview, except for --authorization-always-allow-paths)";
const WEBHOOK: &str = "Webhook flags (served with the CloudControllerManagerWebhook feature gate)";
const LOGS: &str = "Logs flags";
const CONTROLLERS: &str = "Controllers' flags";
/// The `--help` heading of the flags providers declare.
const PROVIDERS: &str = "Cloud provider flags";

/// A setting's type: how its flag takes a value, and how it is read from any source (flags and files give
/// text, the environment may give TOML-typed values).
pub(crate) trait Setting: Sized {
    /// How the flag takes its value.
    const KIND: Kind;
    /// Reads the value, as text or as itself.
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error>;
}

/// serde's entry point to [`Setting::read`] for every field of [`Settings`].
fn setting<'de, D: Deserializer<'de>, T: Setting>(deserializer: D) -> Result<T, D::Error> {
    T::read(deserializer)
}

impl Setting for String {
    const KIND: Kind = Kind::Value;
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        lenient::string(deserializer)
    }
}

impl Setting for bool {
    const KIND: Kind = Kind::Bool;
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        lenient::boolean(deserializer)
    }
}

impl Setting for Vec<String> {
    const KIND: Kind = Kind::List;
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        lenient::list(deserializer)
    }
}

macro_rules! parsed_setting {
    ($($type:ty),*) => {$(
        impl Setting for $type {
            const KIND: Kind = Kind::Value;
            fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                lenient::parsed(deserializer)
            }
        }
    )*};
}

parsed_setting!(GoDuration, u8, u16, u32, f32);

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

/// What this binary's registries hold, for the help of `--cloud-provider` and `--controllers`.
fn registered(flag: &ManagerFlag, registry: &Registry) -> String {
    match flag.name {
        "cloud-provider" => {
            let names: Vec<&str> = registry.providers().names().collect();
            let names = if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            };
            format!(" This binary has: {names}.")
        }
        "controllers" => {
            let (mut on, mut off) = (Vec::new(), Vec::new());
            for definition in registry.controllers().definitions() {
                let entry = registry
                    .controllers()
                    .catalog()
                    .resolve(definition.name())
                    .expect("a registered controller is in the catalog");
                let mut text = definition.name().to_owned();
                if !entry.aliases.is_empty() {
                    text.push_str(&format!(" (alias {})", entry.aliases.join(", ")));
                }
                if let Some(provider) = definition.provider() {
                    text.push_str(&format!(" [--cloud-provider={provider}]"));
                }
                if entry.disabled_by_default {
                    off.push(text);
                } else {
                    on.push(text);
                }
            }
            let list = |items: &[String]| {
                if items.is_empty() {
                    "none".to_owned()
                } else {
                    items.join(", ")
                }
            };
            format!(
                " Controllers: {}. Disabled-by-default controllers: {}.",
                list(&on),
                list(&off)
            )
        }
        _ => String::new(),
    }
}

/// The clap argument of a flag: no clap default; as pflag, a repeated flag's last value wins (lists
/// accumulate).
fn argument(name: &'static str, kind: Kind, help: String, heading: &'static str) -> Arg {
    let mut arg = Arg::new(name)
        .long(name)
        .help(help)
        .help_heading(heading)
        .global(false);
    if kind != Kind::List {
        arg = arg.overrides_with(name);
    }
    arg = match kind {
        Kind::Bool => arg
            .num_args(0..=1)
            .require_equals(true)
            .default_missing_value("true")
            .value_parser(["true", "false", "True", "False", "1", "0"]),
        Kind::Value => arg.num_args(1).action(ArgAction::Set),
        Kind::List => arg.num_args(1).action(ArgAction::Append).value_delimiter(','),
    };
    if name == "v" {
        arg = arg.short('v').value_name("LEVEL");
    }
    arg
}

fn kind_of(flag: &Flag) -> Kind {
    match flag.kind {
        FlagKind::Bool => Kind::Bool,
        FlagKind::Value => Kind::Value,
        FlagKind::List => Kind::List,
    }
}

/// Who declares a flag of [`declared_flags`].
enum Owner<'a> {
    /// A provider, by name.
    Provider(&'a str),
    /// A controller.
    Controller(&'a ControllerDefinition),
}

/// The flags `registry`'s providers and controllers declare, with who declares each.
fn declared_flags(registry: &Registry) -> impl Iterator<Item = (Owner<'_>, &'static Flag)> {
    let providers = registry
        .provider_flags()
        .map(|(provider, flag)| (Owner::Provider(provider), flag));
    let controllers = registry
        .controllers()
        .definitions()
        .flat_map(|d| d.declared_flags().iter().map(move |f| (Owner::Controller(d), f)));
    providers.chain(controllers)
}

/// `Err` naming the owner when a provider or controller of `registry` declares a flag of the manager's
/// own (or `config`): the binary was put together wrong, and says so before anything starts.
pub(crate) fn check_declared_flags(registry: &Registry) -> Result<(), String> {
    for (owner, flag) in declared_flags(registry) {
        if flag.name == "config" || FLAGS.iter().any(|f| f.name == flag.name) {
            let owner = match owner {
                Owner::Provider(provider) => format!("provider {provider}"),
                Owner::Controller(definition) => format!("controller {}", definition.name()),
            };
            return Err(format!(
                "{owner}'s flag --{} is a flag of the manager; the binary's registry must not declare it",
                flag.name
            ));
        }
    }
    Ok(())
}

/// Adds every flag of [`FLAGS`] to `command`, then those `registry`'s controllers declare, with no clap
/// defaults; the help of `--cloud-provider` and `--controllers` lists what `registry` holds.
///
/// # Panics
/// When a controller declares a flag of the manager's: the binary is built wrong.
pub(crate) fn add_flags(mut command: Command, registry: &Registry) -> Command {
    let with_default = |help: String, default: &str| match default {
        "" => help,
        default => format!("{help} [default: {default}]"),
    };
    for flag in FLAGS {
        let help = format!("{}{}", flag.help, registered(flag, registry));
        command = command.arg(argument(
            flag.name,
            flag.kind,
            with_default(help, flag.default),
            flag.heading,
        ));
    }
    for (owner, flag) in declared_flags(registry) {
        let (owner, heading) = match owner {
            Owner::Provider(provider) => (format!("--cloud-provider={provider}"), PROVIDERS),
            Owner::Controller(definition) => match definition.provider() {
                Some(provider) => (
                    format!("{} (--cloud-provider={provider})", definition.name()),
                    CONTROLLERS,
                ),
                None => (definition.name().to_owned(), CONTROLLERS),
            },
        };
        assert!(
            flag.name != "config" && !FLAGS.iter().any(|f| f.name == flag.name),
            "{owner}'s flag --{} is a flag of the manager",
            flag.name
        );
        let help = format!("{owner}: {}", flag.help);
        command = command.arg(argument(
            flag.name,
            kind_of(flag),
            with_default(help, flag.default),
            heading,
        ));
    }
    command.arg(
        Arg::new("config")
            .long("config")
            .value_name("FILE")
            .help("Settings file (YAML, or TOML when it ends in .toml), with flag names as keys. Layering: defaults < this file < CCM_<FLAG> environment variables < flags.")
            .help_heading(GENERIC),
    )
}

/// The environment variable of the setting `key`: `CCM_` and the flag's name, upper case, dashes as
/// underscores.
fn environment_variable(key: &str) -> String {
    format!("CCM_{}", key.to_ascii_uppercase().replace('-', "_"))
}

/// The flag reference of `docs/operations.md`: every flag under its `--help` heading, with its default, its
/// environment variable and its help (the help of `--cloud-provider` and `--controllers` without a
/// registry's names). A test keeps the document equal to it (and regenerates it with `UPDATE_DOCS=1`).
#[cfg(test)]
fn flag_reference() -> String {
    let cell = |text: &str| text.replace('|', "\\|");
    let mut headings: Vec<&str> = Vec::new();
    for flag in FLAGS {
        if !headings.contains(&flag.heading) {
            headings.push(flag.heading);
        }
    }
    let mut out = String::new();
    for heading in headings {
        out.push_str(&format!(
            "\n#### {heading}\n\n| Flag | Default | Environment | Meaning |\n|---|---|---|---|\n"
        ));
        for flag in FLAGS.iter().filter(|f| f.heading == heading) {
            let name = match (flag.name, flag.kind) {
                ("v", _) => "`-v`, `--v`".to_owned(),
                (name, Kind::List) => format!("`--{name}` (list)"),
                (name, _) => format!("`--{name}`"),
            };
            let default = if flag.default.is_empty() {
                "—".to_owned()
            } else {
                format!("`{}`", cell(flag.default))
            };
            out.push_str(&format!(
                "| {name} | {default} | `{}` | {} |\n",
                environment_variable(flag.name),
                cell(flag.help)
            ));
        }
    }
    out
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
        environment_variable(&key)
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

/// A source with only the keys `keep` accepts: the manager's settings and the controllers' flags are
/// read from the same file, environment and command line, each from its own keys, and an error still
/// names the source.
struct Only<P> {
    source: P,
    keep: fn(&str, &[&str]) -> bool,
    names: Vec<&'static str>,
}

impl<P: Provider> Provider for Only<P> {
    fn metadata(&self) -> Metadata {
        self.source.metadata()
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut data = self.source.data()?;
        for dict in data.values_mut() {
            dict.retain(|key, _| (self.keep)(key, &self.names));
        }
        Ok(data)
    }
}

/// Every source of settings over `defaults`, each with only the keys `keep` accepts given the
/// controllers' flag names `names`; `given` are the flags of the command-line layer.
fn sources(
    matches: &ArgMatches,
    defaults: Serialized<Dict>,
    given: &[(&'static str, Kind)],
    keep: fn(&str, &[&str]) -> bool,
    names: &[&'static str],
) -> Result<Figment, SettingsError> {
    let mut figment = Figment::from(defaults);
    if let Some(path) = matches.get_one::<String>("config") {
        let path = PathBuf::from(path);
        if !path.is_file() {
            return Err(SettingsError(format!(
                "--config: {}: no such file",
                path.display()
            )));
        }
        figment = if path.extension().is_some_and(|e| e == "toml") {
            figment.merge(Only {
                source: Toml::file_exact(&path),
                keep,
                names: names.to_vec(),
            })
        } else {
            figment.merge(Only {
                source: serde_saphyr::figment::Yaml::file_exact(&path),
                keep,
                names: names.to_vec(),
            })
        };
    }
    figment = figment.merge(Only {
        source: Env::prefixed("CCM_")
            .map(|key| key.as_str().replace('_', "-").into())
            .lowercase(true),
        keep,
        names: names.to_vec(),
    });
    let mut flags = Dict::new();
    for &(name, kind) in given {
        if matches.value_source(name) != Some(clap::parser::ValueSource::CommandLine) {
            continue;
        }
        let values: Vec<String> = matches
            .get_many::<String>(name)
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        let value = match kind {
            Kind::List => Value::from(values),
            Kind::Bool | Kind::Value => Value::from(values.last().cloned().unwrap_or_default()),
        };
        flags.insert(name.to_owned(), value);
    }
    Ok(figment.merge(CommandLine(flags)))
}

fn failure(error: figment::Error) -> SettingsError {
    SettingsError(
        error
            .into_iter()
            .map(|e| describe(&e))
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

/// The effective settings from all sources (a binary without controller flags).
#[cfg(test)]
pub(crate) fn layered(matches: &ArgMatches) -> Result<Settings, SettingsError> {
    layered_with(matches, &Registry::new()).map(|(settings, _)| settings)
}

/// The effective settings, and the values of the flags `registry`'s providers and controllers declare,
/// from all sources; each such value passed its check.
pub(crate) fn layered_with(
    matches: &ArgMatches,
    registry: &Registry,
) -> Result<(Settings, FlagValues), SettingsError> {
    let declared: Vec<&'static Flag> = declared_flags(registry).map(|(_, f)| f).collect();
    let names: Vec<&'static str> = declared.iter().map(|f| f.name).collect();
    let own: Vec<(&'static str, Kind)> = FLAGS.iter().map(|f| (f.name, f.kind)).collect();
    let settings: Settings = sources(
        matches,
        defaults(),
        &own,
        |key, names| !names.contains(&key),
        &names,
    )?
    .extract()
    .map_err(failure)?;

    let theirs: Vec<(&'static str, Kind)> = declared.iter().map(|f| (f.name, kind_of(f))).collect();
    let defaults = Serialized::defaults(
        declared
            .iter()
            .map(|f| (f.name.to_owned(), Value::from(f.default.to_owned())))
            .collect::<Dict>(),
    );
    let figment = sources(
        matches,
        defaults,
        &theirs,
        |key, names| names.contains(&key),
        &names,
    )?;
    let mut values = FlagValues::default();
    for flag in declared {
        let value = match flag.kind {
            FlagKind::Bool => figment
                .extract_inner::<Read<BoolSetting>>(flag.name)
                .map(|r| FlagValue::Bool(r.0.0)),
            FlagKind::Value => figment
                .extract_inner::<Read<String>>(flag.name)
                .map(|r| FlagValue::Value(r.0)),
            FlagKind::List => figment
                .extract_inner::<Read<Vec<String>>>(flag.name)
                .map(|r| FlagValue::List(r.0)),
        }
        .map_err(failure)?;
        (flag.check)(&value).map_err(|problem| SettingsError(format!("--{}: {problem}", flag.name)))?;
        values.insert(flag.name, value);
    }
    Ok((settings, values))
}

/// A bool read as [`Setting`] reads one.
struct BoolSetting(bool);

/// A value of a controller's flag, read as the manager's settings of its type are.
#[derive(serde::Deserialize)]
#[serde(transparent)]
struct Read<T: ReadAs>(#[serde(deserialize_with = "ReadAs::read_as")] T);

/// How [`Read`] reads its type.
trait ReadAs: Sized {
    fn read_as<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error>;
}

impl ReadAs for String {
    fn read_as<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        lenient::string(deserializer)
    }
}

impl ReadAs for Vec<String> {
    fn read_as<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        lenient::list(deserializer)
    }
}

impl ReadAs for BoolSetting {
    fn read_as<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        lenient::boolean(deserializer).map(BoolSetting)
    }
}

#[cfg(test)]
// figment::Jail's closures return figment's (large) error type.
#[allow(clippy::result_large_err)]
pub(crate) mod tests {
    use super::*;

    fn command() -> Command {
        add_flags(Command::new("test"), &Registry::new())
    }

    /// Runs `f` with no environment variables, serialised with every other test that touches the environment.
    pub(crate) fn hermetic(f: impl FnOnce()) {
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            f();
            Ok(())
        });
    }

    /// `docs/operations.md` lists every flag as [`flag_reference`] renders it. To regenerate:
    /// `UPDATE_DOCS=1 cargo test -p kube-ccm-cli --lib every_flag_as_the_table`.
    #[test]
    fn the_operations_guide_lists_every_flag_as_the_table_declares_it() {
        const BEGIN: &str = "<!-- flag reference: generated by the settings' flag table -->\n";
        const END: &str = "<!-- end of the flag reference -->";
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operations.md");
        let text = std::fs::read_to_string(&path).unwrap();
        let start = text.find(BEGIN).expect("the reference's opening marker") + BEGIN.len();
        let end = start + text[start..].find(END).expect("the reference's closing marker");
        let generated = flag_reference();
        for row in [
            "| `--leader-elect-lease-duration` | `15s` | `CCM_LEADER_ELECT_LEASE_DURATION` |",
            "| `--controllers` (list) | `*` | `CCM_CONTROLLERS` |",
            "| `-v`, `--v` | `0` | `CCM_V` |",
        ] {
            assert!(generated.contains(row), "{row} missing from\n{generated}");
        }
        assert_eq!(
            generated.matches("\n| `-").count(),
            FLAGS.len(),
            "one row per flag:\n{generated}"
        );
        if text[start..end] != generated {
            if std::env::var_os("UPDATE_DOCS").is_some() {
                std::fs::write(&path, format!("{}{generated}{}", &text[..start], &text[end..])).unwrap();
                return;
            }
            panic!(
                "docs/operations.md's flag reference is out of date; run `UPDATE_DOCS=1 cargo test -p kube-ccm-cli --lib every_flag_as_the_table`. Generated:\n{generated}"
            );
        }
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
    fn upstream_defaults() {
        let s = Settings::default();
        assert_eq!(s.controllers, ["*"]);
        assert_eq!((s.kube_api_qps, s.kube_api_burst), (1000.0, 2000));
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

    /// A binary whose `tagging-controller` (the AWS provider's) declares flags.
    fn with_controller_flags() -> Registry {
        const FLAGS: &[Flag] = &[
            Flag::list("tags", "", "Tags."),
            Flag::value("tagging-controller-burst-limit", "0", "Burst.").checked(|value| {
                value
                    .text()
                    .parse::<u32>()
                    .map(|_| ())
                    .map_err(|_| format!("{:?} is not a whole number", value.text()).into())
            }),
            Flag::bool("tagging-controller-enable-batching", "false", "Batching."),
        ];
        let mut registry = Registry::new();
        registry
            .register_controller(
                ControllerDefinition::new("tagging-controller", |_| async {})
                    .for_provider("aws")
                    .disabled_by_default()
                    .flags(FLAGS),
            )
            .unwrap();
        registry
    }

    /// A controller's flags are read from every source, layered as the manager's own, and each source's
    /// keys go to the manager's settings or to the controller's flags (neither is an unknown setting for
    /// the other); a refused value names its flag.
    #[test]
    fn controller_flags_come_from_every_source_and_are_checked() {
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            let registry = with_controller_flags();
            let command = || add_flags(Command::new("t"), &registry);
            let help = command().render_long_help().to_string();
            assert!(
                help.contains("Controllers' flags")
                    && help.contains("tagging-controller (--cloud-provider=aws): Tags."),
                "{help}"
            );
            jail.create_file(
                "ccm.yaml",
                "cluster-name: filed\ntags: [a=1, b=2]\ntagging-controller-burst-limit: 5\n",
            )?;
            jail.set_env("CCM_TAGGING_CONTROLLER_ENABLE_BATCHING", "true");
            let matches = command()
                .try_get_matches_from(["t", "--config=ccm.yaml", "--tagging-controller-burst-limit=7"])
                .unwrap();
            let (settings, flags) = layered_with(&matches, &registry).unwrap();
            assert_eq!(settings.cluster_name, "filed");
            assert_eq!(flags.items("tags"), ["a=1", "b=2"], "from the file");
            assert_eq!(
                flags.text("tagging-controller-burst-limit"),
                "7",
                "the flag over the file"
            );
            assert!(
                flags.is_true("tagging-controller-enable-batching"),
                "from the environment"
            );

            jail.set_env("CCM_TAGGING_CONTROLLER_ENABLE_BATCHING", "false");
            let bad = command()
                .try_get_matches_from(["t", "--tagging-controller-burst-limit", "lots"])
                .unwrap();
            assert_eq!(
                layered_with(&bad, &registry).unwrap_err().to_string(),
                "--tagging-controller-burst-limit: \"lots\" is not a whole number"
            );
            Ok(())
        });
    }

    #[test]
    fn a_controller_flag_of_another_controller_is_refused() {
        const FLAGS: &[Flag] = &[Flag::list("tags", "", "Tags.")];
        let mut registry = with_controller_flags();
        let error = registry
            .register_controller(ControllerDefinition::new("labeller-controller", |_| async {}).flags(FLAGS))
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "controller labeller-controller's flag --tags is already controller tagging-controller's"
        );
    }

    #[test]
    fn a_declared_flag_of_the_managers_own_is_one_error_naming_its_owner() {
        const CLASH: &[Flag] = &[Flag::value("cluster-name", "", "Clash.")];
        let mut registry = with_controller_flags();
        assert_eq!(check_declared_flags(&registry), Ok(()));
        registry.register_provider_flags("gce", CLASH).unwrap();
        assert_eq!(
            check_declared_flags(&registry).unwrap_err(),
            "provider gce's flag --cluster-name is a flag of the manager; the binary's registry must not declare it"
        );
    }

    /// A provider's flags are offered under their own heading, read and checked as a controller's, and
    /// may not take a name a controller (or another provider) has.
    #[test]
    fn provider_flags_are_read_like_controller_flags_and_never_shared() {
        const GCE: &[Flag] = &[Flag::list(
            "cloud-provider-gce-lb-src-cidrs",
            "130.211.0.0/22,35.191.0.0/16",
            "Ranges.",
        )
        .checked(|value| match value.items().iter().find(|i| !i.contains('/')) {
            Some(bad) => Err(format!("{bad:?} is not a CIDR").into()),
            None => Ok(()),
        })];
        let mut registry = with_controller_flags();
        registry.register_provider_flags("gce", GCE).unwrap();
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            let command = || add_flags(Command::new("t"), &registry);
            let help = command().render_long_help().to_string();
            assert!(
                help.contains("Cloud provider flags")
                    && help.contains("--cloud-provider=gce: Ranges. [default: 130.211.0.0/22,35.191.0.0/16]"),
                "{help}"
            );
            let defaults = command().try_get_matches_from(["t"]).unwrap();
            let (_, flags) = layered_with(&defaults, &registry).unwrap();
            assert_eq!(
                flags.items("cloud-provider-gce-lb-src-cidrs"),
                ["130.211.0.0/22", "35.191.0.0/16"]
            );
            jail.set_env("CCM_CLOUD_PROVIDER_GCE_LB_SRC_CIDRS", "10.0.0.0/8");
            let (_, flags) = layered_with(&defaults, &registry).unwrap();
            assert_eq!(flags.items("cloud-provider-gce-lb-src-cidrs"), ["10.0.0.0/8"]);
            let bad = command()
                .try_get_matches_from(["t", "--cloud-provider-gce-lb-src-cidrs=everyone"])
                .unwrap();
            assert_eq!(
                layered_with(&bad, &registry).unwrap_err().to_string(),
                "--cloud-provider-gce-lb-src-cidrs: \"everyone\" is not a CIDR"
            );
            Ok(())
        });
        const TAGS: &[Flag] = &[Flag::list("tags", "", "Tags.")];
        assert_eq!(
            registry
                .register_provider_flags("aws", TAGS)
                .unwrap_err()
                .to_string(),
            "provider aws's flag --tags is already controller tagging-controller's"
        );
        assert_eq!(
            registry
                .register_controller(ControllerDefinition::new("lb-controller", |_| async {}).flags(GCE))
                .unwrap_err()
                .to_string(),
            "controller lb-controller's flag --cloud-provider-gce-lb-src-cidrs is already provider gce's"
        );
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
