//! `cloud-controller-manager leader-migration …`: tools for operators planning a migration and following
//! it on a live cluster (`status`, `preflight`).

mod history;
mod preflight;
pub(crate) mod status;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use kube_ccm_leadermigration::rbac::{RbacRequest, migration_rbac};
use kube_ccm_leadermigration::{
    CLOUD_CONTROLLER_MANAGER, ControllerCatalog, ControllerSelection, DEFAULT_MIGRATION_LEASE,
    MigrationConfig, Placement, PlanInput, Severity,
};
use kube_ccm_runtime::{Cidr, ControllerSettings, PlannedController, Registry, plan_controllers};

/// What `keep` makes of every object `api` lists, a page of 500 at a time (only a page is held whole).
async fn list_all<K, T>(
    api: &kube::Api<K>,
    mut keep: impl FnMut(&K) -> Option<T>,
) -> Result<Vec<T>, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut kept = Vec::new();
    let mut params = kube::api::ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await?;
        kept.extend(page.items.iter().filter_map(&mut keep));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(kept),
        }
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Check leader-migration configuration files. Exit 0 when all are valid, 1 when one is not.
    Validate(ValidateArgs),
    /// Show where each controller of this binary runs, for one component.
    Plan(PlanArgs),
    /// Print the built-in configuration (used when --leader-migration-config is not given).
    Default(DefaultArgs),
    /// Print the Roles and RoleBindings both controller managers need for the migration Leases.
    Rbac(RbacArgs),
    /// Show where a migration stands on a live cluster: conditions (with a rule for Completed), who holds
    /// each Lease, the managers' pods and the nodes. With --wait-for, wait for a condition (exit 1 on
    /// timeout).
    Status(status::StatusArgs),
    /// Check a live cluster before starting a component with leader migration: the configuration, the
    /// Lease names, each component's access to its Leases, that every controller it takes over can run
    /// here, and the cloud provider. One line per check with the fix; exit 0 when all pass, 1 otherwise.
    Preflight(preflight::PreflightArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ValidateArgs {
    /// Files to check (YAML or JSON; several documents mean several migration locks).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum PlanOutput {
    Text,
    Json,
}

/// The component a plan or a preflight is for, with its manager's flags that decide where each controller
/// runs.
#[derive(Debug, Args)]
pub(crate) struct ComponentArgs {
    /// The component, e.g. kube-controller-manager or cloud-controller-manager.
    #[arg(long, value_name = "NAME")]
    component: String,
    /// Leader-migration configuration file; the built-in default when absent.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Controllers to enable, as the manager's --controllers (`*`, `name`, `-name`).
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "*")]
    controllers: Vec<String>,
    /// Name of the component's main Lease; the component name when absent.
    #[arg(long, value_name = "NAME")]
    leader_elect_resource_name: Option<String>,
    /// The manager's cloud provider (one of this binary's): controllers it cannot serve are skipped, with
    /// the reason. Without it, `plan` lists each controller's needs instead, and `preflight` skips the
    /// provider's checks.
    #[arg(long, value_name = "NAME")]
    cloud_provider: Option<String>,
    /// The provider's configuration file, as the manager's --cloud-config.
    #[arg(long, value_name = "FILE", requires = "cloud_provider")]
    cloud_config: Option<PathBuf>,
    /// The manager's --cluster-cidr (routes are configured only inside it).
    #[arg(long, value_name = "CIDRS", default_value = "")]
    cluster_cidr: String,
    /// The manager's --configure-cloud-routes.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    configure_cloud_routes: bool,
}

impl ComponentArgs {
    /// The component's main Lease.
    fn main_lease(&self) -> &str {
        self.leader_elect_resource_name
            .as_deref()
            .unwrap_or(&self.component)
    }

    /// Where each of `registry`'s controllers runs for this component under `migration`, and which are
    /// skipped here (with `provider`: by its capabilities too).
    fn plan(
        &self,
        registry: &Registry,
        migration: &MigrationConfig,
        provider: Option<&dyn kube_ccm_provider::CloudProvider>,
    ) -> Result<Vec<PlannedController>> {
        let controllers = registry.controllers();
        let catalog = controllers.catalog();
        let selection = ControllerSelection::parse(&self.controllers, catalog).context("--controllers")?;
        let settings = ControllerSettings {
            cluster_cidrs: Cidr::parse_list(&self.cluster_cidr).context("--cluster-cidr")?,
            configure_cloud_routes: self.configure_cloud_routes,
            ..ControllerSettings::defaults("kubernetes")
        };
        Ok(plan_controllers(
            controllers,
            PlanInput {
                component: &self.component,
                main_lease: self.main_lease(),
                migration: Some(migration),
                selection: &selection,
                catalog,
            },
            provider,
            &settings,
        ))
    }
}

#[derive(Debug, Args)]
pub(crate) struct PlanArgs {
    #[command(flatten)]
    target: ComponentArgs,
    #[arg(long, value_enum, default_value = "text")]
    output: PlanOutput,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum DocumentOutput {
    Yaml,
    Json,
}

#[derive(Debug, Args)]
pub(crate) struct DefaultArgs {
    #[arg(long, value_enum, default_value = "yaml")]
    output: DocumentOutput,
}

#[derive(Debug, Args)]
pub(crate) struct RbacArgs {
    /// Namespace of the Leases (the managers' --leader-elect-resource-namespace).
    #[arg(long, value_name = "NS", default_value = "kube-system")]
    namespace: String,
    /// A migration Lease name; repeat for several. Default: the Leases of --config, else the default Lease.
    #[arg(long = "lease", value_name = "NAME")]
    leases: Vec<String>,
    /// Take the Lease names from this leader-migration configuration.
    #[arg(long, value_name = "FILE", conflicts_with = "leases")]
    config: Option<PathBuf>,
}

impl Command {
    /// Runs the tool; controller names resolve against `registry`'s controllers.
    pub(crate) fn run(self, registry: &Registry) -> Result<ExitCode> {
        let catalog = registry.controllers().catalog();
        let mut stdout = std::io::stdout().lock();
        match self {
            Command::Validate(args) => validate(&args, catalog, &mut stdout, &mut std::io::stderr().lock()),
            Command::Plan(args) => print_plan(&args, registry, &mut stdout),
            Command::Default(args) => print_default(&args, catalog, &mut stdout),
            Command::Rbac(args) => print_rbac(&args, catalog, &mut stdout),
            Command::Status(args) => status::run(&args, catalog, &mut stdout),
            Command::Preflight(args) => preflight::run(&args, registry, &mut stdout),
        }
    }
}

/// Reads and validates one file; on failure the error lists every problem.
pub(crate) fn load(
    path: &Path,
    catalog: &ControllerCatalog,
) -> Result<kube_ccm_leadermigration::LoadedConfig> {
    let bytes = std::fs::read(path).with_context(|| format!("{}: cannot read the file", path.display()))?;
    Ok(MigrationConfig::load(
        &path.display().to_string(),
        &bytes,
        catalog,
    )?)
}

fn validate(
    args: &ValidateArgs,
    catalog: &ControllerCatalog,
    out: &mut impl Write,
    err: &mut impl Write,
) -> Result<ExitCode> {
    let mut all_valid = true;
    for path in &args.files {
        let name = path.display().to_string();
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(error) => {
                writeln!(err, "{name}: cannot read the file: {error}")?;
                all_valid = false;
                continue;
            }
        };
        match MigrationConfig::load(&name, &bytes, catalog) {
            Ok(loaded) => {
                let locks: Vec<String> = loaded
                    .config
                    .locks()
                    .iter()
                    .map(|lock| {
                        let count = lock.controllers.len();
                        format!(
                            "{} ({count} controller{})",
                            lock.lease_name,
                            if count == 1 { "" } else { "s" }
                        )
                    })
                    .collect();
                let noun = if locks.len() == 1 {
                    "migration lock"
                } else {
                    "migration locks"
                };
                writeln!(out, "{name}: valid: {} {noun}: {}", locks.len(), locks.join(", "))?;
                for warning in &loaded.warnings {
                    writeln!(err, "{}", warning.render(&name))?;
                }
            }
            Err(error) => {
                all_valid = false;
                let (errors, warnings): (Vec<_>, Vec<_>) =
                    error.problems.iter().partition(|p| p.severity == Severity::Error);
                for problem in errors.into_iter().chain(warnings) {
                    writeln!(err, "{}", problem.render(&name))?;
                }
            }
        }
    }
    Ok(if all_valid {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The provider named by `--cloud-provider`, built from its `--cloud-config` as the manager builds it.
async fn build_provider(
    args: &ComponentArgs,
    registry: &Registry,
) -> Result<Option<std::sync::Arc<dyn kube_ccm_provider::CloudProvider>>> {
    let Some(name) = &args.cloud_provider else {
        return Ok(None);
    };
    let config = match &args.cloud_config {
        Some(path) => Some(
            std::fs::read(path).with_context(|| format!("--cloud-config: cannot read {}", path.display()))?,
        ),
        None => None,
    };
    Ok(Some(registry.providers().build(name, config).await?))
}

fn print_plan(args: &PlanArgs, registry: &Registry, out: &mut impl Write) -> Result<ExitCode> {
    let target = &args.target;
    let controllers = registry.controllers();
    let migration = match &target.config {
        Some(path) => load(path, controllers.catalog())?.config,
        None => MigrationConfig::default_config(controllers.catalog()),
    };
    let provider = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?
        .block_on(build_provider(target, registry))?;
    let planned = target.plan(registry, &migration, provider.as_deref())?;
    let needs = |name: kube_ccm_leadermigration::ControllerName| {
        controllers
            .get(name)
            .map(kube_ccm_runtime::ControllerDefinition::needs)
            .unwrap_or_default()
    };
    match args.output {
        PlanOutput::Json => {
            let controllers: Vec<serde_json::Value> = planned
                .iter()
                .map(|p| {
                    serde_json::json!({
                        "name": p.controller.as_str(),
                        "lock": p.placement.lock_name(),
                        "lease": p.placement.lease(),
                        "owner": p.placement.owner(),
                        "skipped": p.skipped,
                        "needs": needs(p.controller),
                    })
                })
                .collect();
            let document = serde_json::json!({"component": target.component, "controllers": controllers});
            writeln!(out, "{}", serde_json::to_string_pretty(&document)?)?;
        }
        PlanOutput::Text => {
            let source = target
                .config
                .as_ref()
                .map_or("built-in default".to_owned(), |p| p.display().to_string());
            writeln!(
                out,
                "component {} (leader-migration configuration: {source})",
                target.component
            )?;
            writeln!(out, "{:<34} {:<10} DETAIL", "CONTROLLER", "LOCK")?;
            for p in &planned {
                let mut detail = match &p.placement {
                    Placement::Main { lease } | Placement::Migration { lease } => format!("lease {lease}"),
                    Placement::Elsewhere { owner } => format!("runs in {owner}"),
                    Placement::Disabled => "off by --controllers".to_owned(),
                };
                let needs = needs(p.controller);
                match &p.skipped {
                    Some(reason) => detail.push_str(&format!("; skipped: {reason}")),
                    None if provider.is_none() && p.runs() && !needs.is_empty() => {
                        detail.push_str(&format!("; needs: {}", needs.join(", ")));
                    }
                    None => {}
                }
                writeln!(
                    out,
                    "{:<34} {:<10} {detail}",
                    p.controller.as_str(),
                    p.placement.lock_name()
                )?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_default(args: &DefaultArgs, catalog: &ControllerCatalog, out: &mut impl Write) -> Result<ExitCode> {
    let default = MigrationConfig::default_config(catalog);
    match args.output {
        DocumentOutput::Yaml => write!(out, "{}", default.to_yaml())?,
        DocumentOutput::Json => writeln!(out, "{}", serde_json::to_string_pretty(&default.to_json())?)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn print_rbac(args: &RbacArgs, catalog: &ControllerCatalog, out: &mut impl Write) -> Result<ExitCode> {
    let leases = match (&args.config, args.leases.is_empty()) {
        (Some(path), _) => load(path, catalog)?
            .config
            .locks()
            .iter()
            .map(|l| l.lease_name.clone())
            .collect(),
        (None, false) => args.leases.clone(),
        (None, true) => vec![DEFAULT_MIGRATION_LEASE.to_owned()],
    };
    let objects = migration_rbac(&RbacRequest {
        namespace: args.namespace.clone(),
        leases: leases.clone(),
    });
    writeln!(
        out,
        "# RBAC for leader migration on Lease(s) {} in namespace {}: apply with `kubectl apply -f -`.\n# kube-controller-manager is bound as user system:kube-controller-manager and service account kube-system/kube-controller-manager;\n# {CLOUD_CONTROLLER_MANAGER} as user system:cloud-controller-manager and service account kube-system/cloud-controller-manager.",
        leases.join(", "),
        args.namespace
    )?;
    for object in objects {
        writeln!(out, "---")?;
        write!(out, "{}", serde_saphyr::to_string(&object)?)?;
    }
    Ok(ExitCode::SUCCESS)
}
