//! `leader-migration preflight`: before a component starts with leader migration, checks against the live
//! cluster what would otherwise fail half-way through a roll: the configuration, the Lease names, each
//! identity's access to its Leases (a SelfSubjectAccessReview for the caller, a SubjectAccessReview for
//! the other component's user), that every controller this component takes over can run here (routes
//! need a cluster CIDR), and the cloud provider. One line per check with the fix; exit 0 when all pass.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec, SubjectAccessReview,
    SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use kube_ccm_leadermigration::rbac::{NAMED_LEASE_VERBS, UNNAMED_LEASE_VERBS};
use kube_ccm_leadermigration::{
    CLOUD_CONTROLLER_MANAGER, ControllerCatalog, KUBE_CONTROLLER_MANAGER, MigrationConfig, Placement,
};
use kube_ccm_runtime::Registry;

use super::status::ClusterArgs;
use super::{ComponentArgs, build_provider, load};

/// What client-go's Lease lock does with a Lease it knows the name of.
const CLIENT_GO_LEASE_VERBS: [&str; 2] = ["get", "update"];

#[derive(Debug, Args)]
pub(crate) struct PreflightArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The component about to start with leader migration, and its manager's flags. Its Leases are
    /// checked with the caller's own access: run this as the component's identity (e.g. its kubeconfig).
    #[command(flatten)]
    target: ComponentArgs,
    /// The other component's main Lease; the other component's name when absent.
    #[arg(long, value_name = "NAME")]
    other_lease: Option<String>,
    /// The user the other component runs as (e.g. system:kube-controller-manager, or
    /// system:serviceaccount:kube-system:cloud-controller-manager); its access is checked by
    /// SubjectAccessReview. Not checked when absent.
    #[arg(long, value_name = "USER")]
    other_user: Option<String>,
    /// A group of the other component's user; repeat for several.
    #[arg(long, value_name = "GROUP", requires = "other_user")]
    other_group: Vec<String>,
    /// The component's --allow-untagged-cloud.
    #[arg(long)]
    allow_untagged_cloud: bool,
}

/// One check's outcome.
enum Outcome {
    Pass(String),
    Fail { problem: String, fix: String },
    Skip(String),
}

struct Report<'a, W: Write> {
    out: &'a mut W,
    failed: usize,
}

impl<W: Write> Report<'_, W> {
    fn line(&mut self, check: &str, outcome: Outcome) -> Result<()> {
        match outcome {
            Outcome::Pass(detail) => writeln!(self.out, "PASS  {check}: {detail}")?,
            Outcome::Skip(detail) => writeln!(self.out, "SKIP  {check}: {detail}")?,
            Outcome::Fail { problem, fix } => {
                self.failed += 1;
                writeln!(self.out, "FAIL  {check}: {problem}")?;
                writeln!(self.out, "      fix: {fix}")?;
            }
        }
        Ok(())
    }
}

pub(crate) fn run(args: &PreflightArgs, registry: &Registry, out: &mut impl Write) -> Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    let mut report = Report { out, failed: 0 };
    runtime.block_on(checks(args, registry, &mut report))?;
    let failed = report.failed;
    if failed == 0 {
        writeln!(report.out, "all checks passed")?;
        Ok(ExitCode::SUCCESS)
    } else {
        writeln!(report.out, "{failed} check(s) failed")?;
        Ok(ExitCode::FAILURE)
    }
}

/// Every check in order, each on its own line of `report`; without a valid configuration, only that one.
async fn checks(
    args: &PreflightArgs,
    registry: &Registry,
    report: &mut Report<'_, impl Write>,
) -> Result<()> {
    let source = args
        .target
        .config
        .as_ref()
        .map_or("the built-in default".to_owned(), |p| p.display().to_string());
    let migration = match configuration(args, registry.controllers().catalog(), &source) {
        Ok(migration) => migration,
        Err(fail) => {
            report.line("configuration", fail)?;
            return report.line(
                "the other checks",
                Outcome::Skip("they need a valid configuration".to_owned()),
            );
        }
    };
    let leases: Vec<&str> = migration.locks().iter().map(|l| l.lease_name.as_str()).collect();
    report.line(
        "configuration",
        Outcome::Pass(format!("{source}: migration Lease(s) {}", leases.join(", "))),
    )?;

    let other = match args.target.component.as_str() {
        KUBE_CONTROLLER_MANAGER => CLOUD_CONTROLLER_MANAGER,
        _ => KUBE_CONTROLLER_MANAGER,
    };
    let main_lease = args.target.main_lease();
    let other_lease = args.other_lease.as_deref().unwrap_or(other);
    report.line("lease names", lease_names(main_lease, other_lease, &leases))?;
    access_checks(args, report, main_lease, other_lease, other, &leases).await?;
    let provider = provider_check(args, registry, report).await?;
    report.line(
        "controllers",
        controllers(args, registry, &migration, provider.as_deref()),
    )
}

/// The migration configuration: `--config`'s (named `source` in the fix), else the built-in default; when
/// the file does not load, the configuration check's failure instead.
fn configuration(
    args: &PreflightArgs,
    catalog: &ControllerCatalog,
    source: &str,
) -> Result<MigrationConfig, Outcome> {
    let Some(path) = &args.target.config else {
        return Ok(MigrationConfig::default_config(catalog));
    };
    load(path, catalog)
        .map(|loaded| loaded.config)
        .map_err(|error| Outcome::Fail {
            problem: format!("{error:#}"),
            fix: format!(
                "correct the file (`cloud-controller-manager leader-migration validate {source}` lists every problem)"
            ),
        })
}

/// The access checks: this kubeconfig's user's to the component's `main_lease` and the migration
/// `leases`, then (with `--other-user`) the `other` component's user's to its `other_lease` and the same
/// migration Leases.
async fn access_checks(
    args: &PreflightArgs,
    report: &mut Report<'_, impl Write>,
    main_lease: &str,
    other_lease: &str,
    other: &str,
    leases: &[&str],
) -> Result<()> {
    let client = args.cluster.client().await?;
    let namespace = &args.cluster.namespace;
    let own: Vec<&str> = std::iter::once(main_lease)
        .chain(leases.iter().copied())
        .collect();
    let denied = denials(&client, namespace, &own, None).await?;
    report.line(
        &format!("access ({}, as this kubeconfig's user)", args.target.component),
        access(args, &denied, &own, &args.target.component),
    )?;
    match &args.other_user {
        Some(user) => {
            let theirs: Vec<&str> = std::iter::once(other_lease)
                .chain(leases.iter().copied())
                .collect();
            let denied = denials(&client, namespace, &theirs, Some((user, &args.other_group))).await?;
            report.line(
                &format!("access ({other}, as {user})"),
                access(args, &denied, &theirs, other),
            )
        }
        None => report.line(
            &format!("access ({other})"),
            Outcome::Skip("give --other-user to check the other component's access".to_owned()),
        ),
    }
}

/// The cloud provider check (`--cloud-provider`, else skipped): the provider as initialised, for the
/// controllers check to ask about its capabilities.
async fn provider_check(
    args: &PreflightArgs,
    registry: &Registry,
    report: &mut Report<'_, impl Write>,
) -> Result<Option<std::sync::Arc<dyn kube_ccm_provider::CloudProvider>>> {
    let Some(name) = &args.target.cloud_provider else {
        report.line(
            "cloud provider",
            Outcome::Skip("give --cloud-provider (and --cloud-config) to initialise it".to_owned()),
        )?;
        return Ok(None);
    };
    let outcome = cloud_provider(args, registry, name).await;
    let provider = outcome.as_ref().ok().cloned();
    report.line(
        "cloud provider",
        match outcome {
            Ok(_) if args.allow_untagged_cloud => {
                Outcome::Pass(format!("{name} initialised (untagged cloud allowed)"))
            }
            Ok(_) => Outcome::Pass(format!("{name} initialised; it has a cluster ID")),
            Err(fail) => fail,
        },
    )?;
    Ok(provider)
}

fn lease_names(main: &str, other: &str, migration: &[&str]) -> Outcome {
    let fix = "give every lock its own Lease: the migration Leases (leaderName in the configuration) differ from both managers' --leader-elect-resource-name".to_owned();
    if main == other {
        return Outcome::Fail {
            problem: format!("both components use the main Lease {main}"),
            fix,
        };
    }
    if let Some(clash) = migration.iter().find(|l| **l == main || **l == other) {
        return Outcome::Fail {
            problem: format!("the migration Lease {clash} is also a main Lease"),
            fix,
        };
    }
    Outcome::Pass(format!(
        "main {main} and {other}, migration {}",
        migration.join(", ")
    ))
}

/// The Lease accesses `user` (the caller when `None`) lacks: `verb leases/name` (or `create leases`).
///
/// This binary's elector also lists and watches its Leases (`NAMED_LEASE_VERBS`); the other component may
/// be upstream's, whose elector only gets and updates them, so only those are asked for it.
async fn denials(
    client: &kube::Client,
    namespace: &str,
    leases: &[&str],
    user: Option<(&String, &Vec<String>)>,
) -> Result<Vec<String>> {
    let named: &[&str] = match user {
        None => &NAMED_LEASE_VERBS,
        Some(_) => &CLIENT_GO_LEASE_VERBS,
    };
    let mut asks: Vec<(&str, Option<&str>)> = UNNAMED_LEASE_VERBS.iter().map(|v| (*v, None)).collect();
    for lease in leases {
        asks.extend(named.iter().map(|v| (*v, Some(*lease))));
    }
    let mut denied: Vec<(String, Vec<&str>)> = Vec::new();
    for (verb, name) in asks {
        let attributes = ResourceAttributes {
            group: Some("coordination.k8s.io".to_owned()),
            resource: Some("leases".to_owned()),
            namespace: Some(namespace.to_owned()),
            verb: Some(verb.to_owned()),
            name: name.map(str::to_owned),
            ..ResourceAttributes::default()
        };
        let allowed = match user {
            None => {
                let review = SelfSubjectAccessReview {
                    spec: SelfSubjectAccessReviewSpec {
                        resource_attributes: Some(attributes),
                        ..SelfSubjectAccessReviewSpec::default()
                    },
                    ..SelfSubjectAccessReview::default()
                };
                Api::<SelfSubjectAccessReview>::all(client.clone())
                    .create(&PostParams::default(), &review)
                    .await
                    .context("SelfSubjectAccessReview")?
                    .status
                    .is_some_and(|s| s.allowed)
            }
            Some((user, groups)) => {
                let review = SubjectAccessReview {
                    spec: SubjectAccessReviewSpec {
                        resource_attributes: Some(attributes),
                        user: Some(user.clone()),
                        groups: (!groups.is_empty()).then(|| groups.clone()),
                        ..SubjectAccessReviewSpec::default()
                    },
                    ..SubjectAccessReview::default()
                };
                Api::<SubjectAccessReview>::all(client.clone())
                    .create(&PostParams::default(), &review)
                    .await
                    .context("SubjectAccessReview (the caller may need create on subjectaccessreviews)")?
                    .status
                    .is_some_and(|s| s.allowed)
            }
        };
        if !allowed {
            let object = name.map_or_else(|| "leases".to_owned(), |name| format!("leases/{name}"));
            match denied.iter_mut().find(|(o, _)| *o == object) {
                Some((_, verbs)) => verbs.push(verb),
                None => denied.push((object, vec![verb])),
            }
        }
    }
    // `create leases`, `get, update leases/NAME`, …
    Ok(denied
        .into_iter()
        .map(|(object, verbs)| format!("{} {object}", verbs.join(", ")))
        .collect())
}

fn access(args: &PreflightArgs, denied: &[String], leases: &[&str], component: &str) -> Outcome {
    let namespace = &args.cluster.namespace;
    if denied.is_empty() {
        return Outcome::Pass(format!("may use Lease(s) {} in {namespace}", leases.join(", ")));
    }
    Outcome::Fail {
        problem: format!("{component} may not {} in {namespace}", denied.join("; ")),
        fix: format!(
            "grant it: `cloud-controller-manager leader-migration rbac --namespace {namespace}{} | kubectl apply -f -` for the migration Leases (it binds system:{component} and kube-system/{component}); the main Lease is the component's own leader-election RBAC",
            args.target
                .config
                .as_ref()
                .map_or_else(String::new, |c| format!(" --config {}", c.display()))
        ),
    }
}

/// The component's provider, initialised as the manager would, with a cluster ID unless untagged is allowed.
async fn cloud_provider(
    args: &PreflightArgs,
    registry: &Registry,
    name: &str,
) -> Result<std::sync::Arc<dyn kube_ccm_provider::CloudProvider>, Outcome> {
    let provider = match build_provider(&args.target, registry).await {
        Ok(provider) => provider.expect("asked for with --cloud-provider"),
        Err(error) => {
            return Err(Outcome::Fail {
                problem: format!("{name} does not initialise: {error:#}"),
                fix: "correct --cloud-config or the provider's credentials; the manager would exit the same way"
                    .to_owned(),
            });
        }
    };
    if !args.allow_untagged_cloud && !provider.has_cluster_id() {
        return Err(Outcome::Fail {
            problem: format!("{name} has no cluster ID: the manager refuses to start"),
            fix: "tag the cluster's resources with its ID (see the provider's documentation), or pass --allow-untagged-cloud".to_owned(),
        });
    }
    Ok(provider)
}

/// Every controller this component takes over under a migration lock must run here: one skipped (a
/// capability the provider lacks, routes without a cluster CIDR) would run nowhere once the migration is
/// done.
fn controllers(
    args: &PreflightArgs,
    registry: &Registry,
    migration: &MigrationConfig,
    provider: Option<&dyn kube_ccm_provider::CloudProvider>,
) -> Outcome {
    let planned = match args.target.plan(registry, migration, provider) {
        Ok(planned) => planned,
        Err(error) => {
            return Outcome::Fail {
                problem: format!("{error:#}"),
                fix: "give the component's own flag values".to_owned(),
            };
        }
    };
    let migrated: Vec<_> = planned
        .iter()
        .filter(|p| matches!(p.placement, Placement::Migration { .. }))
        .collect();
    let skipped: Vec<String> = migrated
        .iter()
        .filter_map(|p| Some(format!("{} ({})", p.controller.as_str(), p.skipped.as_ref()?)))
        .collect();
    if skipped.is_empty() {
        let names: Vec<&str> = migrated.iter().map(|p| p.controller.as_str()).collect();
        return Outcome::Pass(if names.is_empty() {
            format!("{} takes over no migrated controller", args.target.component)
        } else {
            format!(
                "{} runs every controller it takes over: {}",
                args.target.component,
                names.join(", ")
            )
        });
    }
    Outcome::Fail {
        problem: format!(
            "{} would take over, but not run: {} (after the migration they would run nowhere)",
            args.target.component,
            skipped.join("; ")
        ),
        fix: "set what is missing (--cluster-cidr for routes, or --configure-cloud-routes=false), or leave these controllers with the other component in the configuration".to_owned(),
    }
}
