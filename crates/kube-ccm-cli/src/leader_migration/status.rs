//! `leader-migration status`: reads the cluster and prints where the migration stands, as the conditions
//! of [`kube_ccm_leadermigration::status`] (with the rule for `Completed`), the Leases with the component holding
//! each, the managers' pods and the nodes; `--wait-for` waits for a condition.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube_ccm_leadermigration::status::{
    CONDITIONS, Condition, LeaseObservation, ManagerPod, NodeObservation, Observation, Status,
    UNINITIALIZED_TAINT, Visibility, assess, component_of,
};
use kube_ccm_leadermigration::{
    CLOUD_CONTROLLER_MANAGER, ControllerCatalog, KUBE_CONTROLLER_MANAGER, MigrationConfig,
};
use serde_json::json;

use super::{PlanOutput, history, list_all, load};
use crate::duration::GoDuration;

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The leader-migration configuration in use (its migration Leases and their controllers); the
    /// built-in default when absent.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// kube-controller-manager's main Lease (its --leader-elect-resource-name).
    #[arg(long, value_name = "NAME", default_value = KUBE_CONTROLLER_MANAGER)]
    kcm_lease: String,
    /// cloud-controller-manager's main Lease (its --leader-elect-resource-name).
    #[arg(long, value_name = "NAME", default_value = CLOUD_CONTROLLER_MANAGER)]
    ccm_lease: String,
    #[arg(long, value_enum, default_value = "text")]
    output: PlanOutput,
    /// Wait until a condition holds, then print the status: `TYPE` (for True), `TYPE=STATUS` or
    /// `TYPE=STATUS/REASON`, e.g. `Completed`, `NodesInitialized=False` or
    /// `MigrationLocksOnCloudSide=False/HeldByKubeControllerManager`. Exit 1 if it does not within --timeout.
    #[arg(long, value_name = "CONDITION", value_parser = parse_wait_for)]
    wait_for: Option<WaitFor>,
    /// How long --wait-for waits.
    #[arg(long, value_name = "DURATION", default_value = "5m", requires = "wait_for")]
    timeout: GoDuration,
    /// Also draw the Lease history the cluster shows (the managers' `LeaderElection` Events and the Leases'
    /// records) as a tenure chart, with the conditions, in an SVG file.
    #[arg(long, value_name = "FILE.svg")]
    report: Option<PathBuf>,
}

/// Where the cluster is and where the managers' Leases and pods live.
#[derive(Debug, Args)]
pub(crate) struct ClusterArgs {
    /// kubeconfig file; in-cluster configuration or the default kubeconfig when absent.
    #[arg(long, value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// Namespace of the Leases and of the managers' pods (the managers' --leader-elect-resource-namespace).
    #[arg(long, value_name = "NS", default_value = "kube-system")]
    pub(crate) namespace: String,
}

impl ClusterArgs {
    pub(crate) async fn client(&self) -> Result<kube::Client> {
        let config = match &self.kubeconfig {
            Some(path) => crate::startup::kubeconfig_file("kubeconfig", &path.display().to_string()).await?,
            None => kube::Config::infer().await.context(
                "no --kubeconfig, and neither in-cluster configuration nor a default kubeconfig was found",
            )?,
        };
        Ok(kube::Client::try_from(config)?)
    }
}

/// What `--wait-for` waits for.
#[derive(Debug, Clone)]
struct WaitFor {
    kind: String,
    status: Status,
    reason: Option<String>,
}

impl WaitFor {
    fn met(&self, conditions: &[Condition]) -> bool {
        conditions.iter().any(|c| {
            c.kind == self.kind
                && c.status == self.status
                && self.reason.as_deref().is_none_or(|r| r == c.reason)
        })
    }
}

impl std::fmt::Display for WaitFor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.kind, self.status)?;
        match &self.reason {
            Some(reason) => write!(f, "/{reason}"),
            None => Ok(()),
        }
    }
}

fn parse_wait_for(text: &str) -> Result<WaitFor, String> {
    let (kind, status) = text.split_once('=').unwrap_or((text, "True"));
    if !CONDITIONS.contains(&kind) {
        return Err(format!(
            "unknown condition {kind:?} (one of {})",
            CONDITIONS.join(", ")
        ));
    }
    let (status, reason) = match status.split_once('/') {
        Some((status, reason)) => (status, Some(reason)),
        None => (status, None),
    };
    let status = match status {
        "True" => Status::True,
        "False" => Status::False,
        "Unknown" => Status::Unknown,
        other => return Err(format!("unknown status {other:?} (True, False or Unknown)")),
    };
    if let Some(reason) = reason
        && (reason.is_empty() || !reason.chars().all(|c| c.is_ascii_alphanumeric()))
    {
        return Err(format!("a reason is one CamelCase word, not {reason:?}"));
    }
    Ok(WaitFor {
        kind: kind.to_owned(),
        status,
        reason: reason.map(str::to_owned),
    })
}

/// How often `--wait-for` reads the cluster again.
const POLL: Duration = Duration::from_secs(1);

pub(crate) fn run(args: &StatusArgs, catalog: &ControllerCatalog, out: &mut impl Write) -> Result<ExitCode> {
    let migration = match &args.config {
        Some(path) => load(path, catalog)?.config,
        None => MigrationConfig::default_config(catalog),
    };
    if let Some(path) = &args.report {
        crate::chart::Chart::check_destination(path)?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    runtime.block_on(async {
        let client = args.cluster.client().await?;
        let deadline = tokio::time::Instant::now() + args.timeout.0;
        loop {
            let observation = observe(
                &client,
                &args.cluster.namespace,
                [&args.kcm_lease, &args.ccm_lease],
                &migration,
            )
            .await?;
            let conditions = assess(&observation);
            let met = args.wait_for.as_ref().is_none_or(|wait| wait.met(&conditions));
            let timed_out = tokio::time::Instant::now() + POLL > deadline;
            if met || timed_out {
                match args.output {
                    PlanOutput::Text => print_text(&observation, &conditions, out)?,
                    PlanOutput::Json => writeln!(
                        out,
                        "{}",
                        serde_json::to_string_pretty(&to_json(&observation, &conditions))?
                    )?,
                }
                if let Some(path) = &args.report {
                    draw(&client, args, &observation, &conditions, path).await?;
                }
                if met {
                    return Ok(ExitCode::SUCCESS);
                }
                let wait = args.wait_for.as_ref().expect("only a wait times out");
                eprintln!("error: timed out after {} waiting for {wait}", args.timeout);
                return Ok(ExitCode::FAILURE);
            }
            tokio::time::sleep(POLL).await;
        }
    })
}

/// Writes the tenure chart of what the cluster shows to `path`.
async fn draw(
    client: &kube::Client,
    args: &StatusArgs,
    observation: &Observation,
    conditions: &[Condition],
    path: &std::path::Path,
) -> Result<()> {
    let names: Vec<&str> = observation.leases().map(|lease| lease.name.as_str()).collect();
    let (acquisitions, error) = match history::acquisitions(client, &args.cluster.namespace, &names).await {
        Ok(found) => (found, None),
        Err(error) => (Vec::new(), Some(error.to_string())),
    };
    let now_us = jiff::Timestamp::now().as_microsecond();
    history::chart(observation, conditions, &acquisitions, error.as_deref(), now_us).write(path)
}

/// The conditions of the cluster `client` reaches now, its managers' Leases in `namespace` under upstream's
/// names, its migration Leases those of `migration` (for the demo's timeline).
pub async fn conditions_now(
    client: &kube::Client,
    namespace: &str,
    migration: &MigrationConfig,
) -> Result<Vec<kube_ccm_leadermigration::status::Condition>> {
    let observation = observe(
        client,
        namespace,
        [KUBE_CONTROLLER_MANAGER, CLOUD_CONTROLLER_MANAGER],
        migration,
    )
    .await?;
    Ok(assess(&observation))
}

async fn observe(
    client: &kube::Client,
    namespace: &str,
    [kcm_lease, ccm_lease]: [&str; 2],
    migration: &MigrationConfig,
) -> Result<Observation> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let read = |name: String| {
        let leases = leases.clone();
        async move {
            let lease = leases
                .get_opt(&name)
                .await
                .with_context(|| format!("cannot read Lease {namespace}/{name}"))?;
            Ok::<_, anyhow::Error>(lease_observation(name, lease))
        }
    };
    let kcm_lease = read(kcm_lease.to_owned()).await?;
    let ccm_lease = read(ccm_lease.to_owned()).await?;
    let mut migration_leases = Vec::new();
    for lock in migration.locks() {
        let controllers = lock
            .controllers
            .iter()
            .map(|c| c.name.as_str().to_owned())
            .collect();
        migration_leases.push((read(lock.lease_name.clone()).await?, controllers));
    }
    let pods = match Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
    {
        Ok(pods) => Visibility::Visible(pods.items.iter().flat_map(manager_pods).collect()),
        Err(error) => Visibility::Hidden(error.to_string()),
    };
    let nodes = match list_nodes(client).await {
        Ok(nodes) => Visibility::Visible(nodes),
        Err(error) => Visibility::Hidden(error.to_string()),
    };
    // A version that cannot be read only leaves a condition less certain.
    let server_version = client.apiserver_version().await.ok().and_then(|info| {
        let number = |text: &str| text.trim_end_matches('+').parse::<u32>().ok();
        Some((number(&info.major)?, number(&info.minor)?))
    });
    Ok(Observation {
        now: jiff::Timestamp::now().as_second(),
        kcm_lease,
        ccm_lease,
        migration_leases,
        pods,
        nodes,
        server_version,
    })
}

fn lease_observation(name: String, lease: Option<Lease>) -> LeaseObservation {
    let Some(spec) = lease.map(|l| l.spec.unwrap_or_default()) else {
        return LeaseObservation {
            name,
            ..LeaseObservation::default()
        };
    };
    LeaseObservation {
        name,
        exists: true,
        holder: spec.holder_identity,
        acquired: spec.acquire_time.map(|t| t.0.as_second()),
        renewed: spec.renew_time.map(|t| t.0.as_second()),
        duration_seconds: spec.lease_duration_seconds.map(i64::from),
    }
}

fn manager_pods(pod: &Pod) -> Vec<ManagerPod> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let label = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get("component"))
        .map(String::as_str);
    pod.spec
        .iter()
        .flat_map(|spec| &spec.containers)
        .filter_map(|container| {
            let argv: Vec<String> = container
                .command
                .iter()
                .flatten()
                .chain(container.args.iter().flatten())
                .cloned()
                .collect();
            ManagerPod::from_command_line(&name, label, &argv)
        })
        .collect()
}

/// Every node.
async fn list_nodes(client: &kube::Client) -> Result<Vec<NodeObservation>, kube::Error> {
    list_all(&Api::<Node>::all(client.clone()), |node| {
        let spec = node.spec.as_ref();
        Some(NodeObservation {
            name: node.metadata.name.clone().unwrap_or_default(),
            provider_id: spec
                .and_then(|s| s.provider_id.as_deref())
                .is_some_and(|id| !id.is_empty()),
            uninitialized_taint: spec
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|taints| taints.iter().any(|t| t.key == UNINITIALIZED_TAINT)),
        })
    })
    .await
}

fn time(seconds: i64) -> String {
    jiff::Timestamp::from_second(seconds).map_or_else(|_| seconds.to_string(), |t| t.to_string())
}

fn ago(now: i64, seconds: i64) -> String {
    let age = now - seconds;
    match age {
        ..0 => "in the future".to_owned(),
        0..120 => format!("{age}s ago"),
        120..7200 => format!("{}m ago", age / 60),
        _ => format!("{}h ago", age / 3600),
    }
}

/// The Leases, each with its role, holder and the holder's component.
fn lease_rows(observation: &Observation) -> Vec<(String, &LeaseObservation, Option<&'static str>)> {
    let mut rows = vec![
        (
            format!("main ({KUBE_CONTROLLER_MANAGER})"),
            &observation.kcm_lease,
            None,
        ),
        (
            format!("main ({CLOUD_CONTROLLER_MANAGER})"),
            &observation.ccm_lease,
            None,
        ),
    ];
    for (lease, controllers) in &observation.migration_leases {
        rows.push((format!("migration: {}", controllers.join(", ")), lease, None));
    }
    for row in &mut rows {
        row.2 = row
            .1
            .live_holder(observation.now)
            .and_then(|holder| component_of(observation, holder));
    }
    rows
}

fn print_text(observation: &Observation, conditions: &[Condition], out: &mut impl Write) -> Result<()> {
    let now = observation.now;
    writeln!(out, "{:<31} {:<8} {:<28} SINCE", "CONDITION", "STATUS", "REASON")?;
    for condition in conditions {
        let since = condition
            .since
            .map_or_else(String::new, |s| format!("{} ({})", time(s), ago(now, s)));
        writeln!(
            out,
            "{:<31} {:<8} {:<28} {since}",
            condition.kind,
            condition.status.to_string(),
            condition.reason
        )?;
        writeln!(out, "    {}", condition.message)?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "{:<38} {:<40} {:<25} RENEWED",
        "LEASE", "HOLDER", "COMPONENT"
    )?;
    for (role, lease, component) in lease_rows(observation) {
        let holder = match (lease.exists, lease.holder.as_deref().filter(|h| !h.is_empty())) {
            (false, _) => "(no Lease)".to_owned(),
            (true, None) => "(released)".to_owned(),
            (true, Some(holder)) if lease.stale_holder(now).is_some() => format!("{holder} (stale)"),
            (true, Some(holder)) => holder.to_owned(),
        };
        let renewed = lease.renewed.map_or_else(String::new, |r| ago(now, r));
        writeln!(
            out,
            "{:<38} {holder:<40} {:<25} {renewed}",
            lease.name,
            component.unwrap_or("-")
        )?;
        writeln!(out, "    {role}")?;
    }
    writeln!(out)?;
    match &observation.pods {
        Visibility::Visible(pods) if pods.is_empty() => {
            writeln!(out, "PODS: no controller-manager pod visible")?
        }
        Visibility::Visible(pods) => {
            writeln!(out, "{:<45} {:<25} COMMAND LINE", "POD", "COMPONENT")?;
            for pod in pods {
                let mut flags = Vec::new();
                if let Some(provider) = &pod.cloud_provider {
                    flags.push(format!("--cloud-provider={provider}"));
                }
                if pod.leader_migration {
                    flags.push("--enable-leader-migration".to_owned());
                }
                if let Some(config) = &pod.leader_migration_config {
                    flags.push(format!("--leader-migration-config={config}"));
                }
                if let Some(controllers) = &pod.controllers {
                    flags.push(format!("--controllers={controllers}"));
                }
                writeln!(out, "{:<45} {:<25} {}", pod.name, pod.component, flags.join(" "))?;
            }
        }
        Visibility::Hidden(why) => writeln!(out, "PODS: not visible: {why}")?,
    }
    match &observation.nodes {
        Visibility::Visible(nodes) => {
            let initialized = nodes.iter().filter(|n| n.initialized()).count();
            writeln!(
                out,
                "NODES: {initialized} of {} initialised by the cloud provider",
                nodes.len()
            )?;
        }
        Visibility::Hidden(why) => writeln!(out, "NODES: not visible: {why}")?,
    }
    Ok(())
}

fn to_json(observation: &Observation, conditions: &[Condition]) -> serde_json::Value {
    let now = observation.now;
    let conditions: Vec<serde_json::Value> = conditions
        .iter()
        .map(|c| {
            json!({
                "type": c.kind, "status": c.status, "reason": c.reason, "message": c.message,
                "lastTransitionTime": c.since.map(time),
            })
        })
        .collect();
    let leases: Vec<serde_json::Value> = lease_rows(observation)
        .into_iter()
        .map(|(role, lease, component)| {
            json!({
                "name": lease.name, "role": role, "exists": lease.exists,
                "holder": lease.holder.as_deref().filter(|h| !h.is_empty()),
                "component": component, "stale": lease.stale_holder(now).is_some(),
                "renewTime": lease.renewed.map(time),
            })
        })
        .collect();
    let (pods, pods_error) = match &observation.pods {
        Visibility::Visible(pods) => (Some(pods), None),
        Visibility::Hidden(why) => (None, Some(why)),
    };
    let nodes = match &observation.nodes {
        Visibility::Visible(nodes) => json!({
            "total": nodes.len(),
            "initialized": nodes.iter().filter(|n| n.initialized()).count(),
        }),
        Visibility::Hidden(why) => json!({"error": why}),
    };
    json!({
        "observedAt": time(now),
        "conditions": conditions,
        "leases": leases,
        "pods": pods,
        "podsError": pods_error,
        "nodes": nodes,
    })
}
