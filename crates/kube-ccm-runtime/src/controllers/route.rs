//! `node-route-controller`: a cloud route for every node pod CIDR, as upstream's route controller (its
//! Events report as `route_controller`, as upstream's).
//!
//! A round: list the cloud's routes; for each node and each of its pod CIDRs, keep the route to it (or
//! replace it when the provider routes by node address and the node's addresses changed) or create one
//! (name hint: the node's UID; with the node's addresses); delete the routes this controller is responsible
//! for — their first or last address inside a `--cluster-cidr`, so a VPC's supernet route never is — that
//! are blackholes or match no node's CIDR; then set each node's `NetworkUnavailable` condition (`False`/
//! `RouteCreated` when all its routes exist, `True`/`NoRouteCreated` otherwise, and for a node with routes
//! but no pod CIDRs), written only when status or reason changes.
//!
//! Cadence: every `--route-reconciliation-period` from start to start (upstream's), and soon after a node
//! is added or deleted or its pod CIDRs or addresses change — but never sooner than one period after the
//! previous round started (at the default 10 s, upstream's floor for its event-driven mode), so a busy
//! cluster does not spend the cloud's rate limit on listing routes.
//!
//! Deliberate differences: routes for pod CIDRs outside every cluster CIDR are not created (upstream
//! creates them and never deletes them: they leak); such a CIDR gets one Warning Event
//! (`CIDRNotInClusterCIDR`) and does not count for `NetworkUnavailable`. A blackhole route is replaced in
//! the same round. Before creating replacements, deletes are awaited whenever a replaced route routes by
//! address (upstream checks only the first listed route).
//!
//! A route whose target the provider names by provider ID (it contains `://`: the provider knows the
//! instance, not the node's name) is the route of the node with that `spec.providerID`.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use kube::api::{Api, Patch};
use kube::runtime::events::EventType;
use kube_ccm_provider::{CloudError, Route};
use serde_json::json;

use super::periodic::{self, Schedule};
use crate::cached_node::CachedNode;
use crate::context::{ControllerContext, event_reference};
use crate::written::Written;
use kube_ccm_provider::Cidr;

/// At most this many route calls at once (upstream's `maxConcurrentRouteOperations`).
const CONCURRENT_ROUTE_CALLS: usize = 200;

/// Why a round did not do everything it should have.
#[derive(Debug, thiserror::Error)]
enum RouteError {
    #[error("error listing routes: {0}")]
    List(#[source] CloudError),
    #[error("{0} route call(s) or condition update(s) failed")]
    Failures(usize),
}

/// What a node's route for one pod CIDR needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RouteNeed {
    /// It exists as it should.
    Keep,
    /// It exists with the node's old addresses: replaced.
    Update,
    /// It does not exist: created.
    Add,
}

/// What one round does, decided from the nodes and the cloud's routes alone ([`plan`]).
#[derive(Debug, Default)]
struct RoutePlan {
    /// Pod CIDRs outside every `--cluster-cidr`: warned about once, never routed.
    outside: Vec<(Arc<CachedNode>, String)>,
    /// The routes this controller is responsible for that no node wants as they are.
    stale: Vec<Route>,
    /// The stale routes must be gone before any create (a replaced route routes by address).
    deletes_first: bool,
    /// The nodes whose `NetworkUnavailable` condition this round sets, with the routes to create for each.
    nodes: Vec<NodeRoutes>,
}

/// One node's part of a [`RoutePlan`].
#[derive(Debug)]
struct NodeRoutes {
    node: Arc<CachedNode>,
    /// Routes to create (new, or replacing one with the node's old addresses).
    create: Vec<Route>,
    /// The node has in-cluster pod CIDRs; when false, it has routes but no pod CIDRs (so no network).
    routed: bool,
}

/// The round's plan: which routes to keep, create and delete, and which nodes' conditions to set.
fn plan(nodes: &[Arc<CachedNode>], mut existing: Vec<Route>, cluster_cidrs: &[Cidr]) -> RoutePlan {
    // A provider that knows a route's target only by its instance names it by provider ID: its node.
    if existing.iter().any(|r| r.target_node.contains("://")) {
        let by_provider_id: HashMap<&str, &str> = nodes
            .iter()
            .filter_map(|n| Some((n.provider_id()?, n.name())))
            .collect();
        for route in existing.iter_mut().filter(|r| r.target_node.contains("://")) {
            if let Some(name) = by_provider_id.get(route.target_node.as_str()) {
                route.target_node = (*name).to_owned();
            }
        }
    }
    let mut by_node: HashMap<&str, Vec<&Route>> = HashMap::new();
    for route in existing
        .iter()
        .filter(|r| !r.target_node.is_empty() && !r.blackhole)
    {
        by_node.entry(route.target_node.as_str()).or_default().push(route);
    }
    let mut plan = RoutePlan::default();
    let mut needs: HashMap<(&str, &str), RouteNeed> = HashMap::new();
    for node in nodes {
        let addresses = node.addresses();
        let mut create = Vec::new();
        let mut routed = false;
        for cidr in node.pod_cidrs() {
            let inside = cidr
                .parse::<Cidr>()
                .is_ok_and(|c| cluster_cidrs.iter().any(|cluster| cluster.contains(&c)));
            if !inside {
                plan.outside.push((node.clone(), cidr.to_owned()));
                continue;
            }
            routed = true;
            let need = match by_node
                .get(node.name())
                .and_then(|routes| routes.iter().find(|r| r.destination_cidr == cidr))
            {
                Some(route) if !route.enable_node_addresses => RouteNeed::Keep,
                Some(route) if same_addresses(&route.target_node_addresses, &addresses) => RouteNeed::Keep,
                Some(_) => RouteNeed::Update,
                None => RouteNeed::Add,
            };
            needs.insert((node.name(), cidr), need);
            if need != RouteNeed::Keep {
                create.push(Route {
                    target_node: node.name().to_owned(),
                    target_node_addresses: addresses.clone(),
                    destination_cidr: cidr.to_owned(),
                    ..Route::default()
                });
            }
        }
        if routed || by_node.contains_key(node.name()) {
            plan.nodes.push(NodeRoutes {
                node: node.clone(),
                create,
                routed,
            });
        }
    }
    plan.stale = existing
        .iter()
        .filter(|r| {
            r.destination_cidr
                .parse::<Cidr>()
                .is_ok_and(|c| Cidr::responsible_for(cluster_cidrs, &c))
        })
        .filter(|r| {
            r.blackhole
                || needs.get(&(r.target_node.as_str(), r.destination_cidr.as_str())) != Some(&RouteNeed::Keep)
        })
        .cloned()
        .collect();
    plan.deletes_first = plan.stale.iter().any(|r| r.enable_node_addresses);
    plan
}

/// Node changes that matter to routes: added, deleted, pod CIDRs or addresses changed.
fn relevant_changes(controller: &ControllerContext) -> futures::stream::BoxStream<'static, ()> {
    let nodes = controller.nodes();
    let mut seen: HashMap<String, u64> = nodes
        .store()
        .state()
        .iter()
        .map(|n| (n.name().to_owned(), fingerprint(n)))
        .collect();
    let changed = nodes.subscribe().filter_map(move |node| {
        let print = fingerprint(&node);
        let relevant = seen.insert(node.name().to_owned(), print) != Some(print);
        std::future::ready(relevant.then_some(()))
    });
    futures::stream::select(changed, nodes.deletions().map(|_| ())).boxed()
}

/// A hash of a node's pod CIDRs and addresses.
fn fingerprint(node: &CachedNode) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut hasher = DefaultHasher::new();
    node.pod_cidrs().for_each(|c| c.hash(&mut hasher));
    for address in node.addresses() {
        (address.type_, address.address).hash(&mut hasher);
    }
    hasher.finish()
}

pub(super) async fn run(controller: ControllerContext) {
    let informer = controller.nodes();
    tokio::select! {
        () = controller.stop().cancelled() => return,
        () = informer.ready() => {}
    }
    controller.set_started();
    let api: Api<Written<Node>> = Api::all(controller.client().clone());
    let schedule = Schedule {
        period: controller.settings().route_reconciliation_period,
        from_start: true,
        first_round_at_once: true,
        on_change: Some((relevant_changes(&controller), Duration::from_secs(1))),
        min_gap: controller.settings().route_reconciliation_period,
    };
    let warned: Arc<Mutex<HashSet<(String, String)>>> = Arc::default();
    periodic::run(controller.stop(), schedule, || {
        let api = api.clone();
        let controller = controller.clone();
        let warned = warned.clone();
        async move {
            let started = Instant::now();
            let result = reconcile(&controller, &api, &warned).await;
            controller.record_reconcile(result.is_ok(), started.elapsed());
            if let Err(error) = result {
                tracing::warn!(%error, "cannot reconcile routes");
            }
        }
    })
    .await;
}

/// Go's `time.Duration` text, as upstream's Event shows how long a create took.
fn go_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    let trim = |text: String| text.trim_end_matches('0').trim_end_matches('.').to_owned();
    if nanos < 1_000 {
        format!("{nanos}ns")
    } else if nanos < 1_000_000 {
        format!("{}µs", trim(format!("{:.3}", nanos as f64 / 1e3)))
    } else if nanos < 1_000_000_000 {
        format!("{}ms", trim(format!("{:.6}", nanos as f64 / 1e6)))
    } else {
        format!("{}s", trim(format!("{:.9}", duration.as_secs_f64())))
    }
}

/// Upstream's `equalNodeAddrs`.
fn same_addresses(a: &[NodeAddress], b: &[NodeAddress]) -> bool {
    a.len() == b.len() && a.iter().all(|x| b.contains(x))
}

async fn reconcile(
    controller: &ControllerContext,
    api: &Api<Written<Node>>,
    warned: &Mutex<HashSet<(String, String)>>,
) -> Result<(), RouteError> {
    let Some(routes) = controller.provider().routes() else {
        return Ok(());
    };
    let _working = controller.working();
    let settings = controller.settings();
    let cluster_cidrs = &settings.cluster_cidrs;
    let cluster = &settings.cluster_name;
    let nodes = controller.nodes().store().state();
    controller.metrics.route_syncs.inc();
    let cx = controller.call_context();
    let existing = cx
        .call("list_routes", routes.list_routes(&cx, cluster))
        .await
        .map_err(RouteError::List)?;
    let plan = plan(&nodes, existing, cluster_cidrs);
    warn_outside(controller, warned, &plan.outside).await;

    let deletes = futures::stream::iter(plan.stale)
        .map(|route: Route| async move {
            let cx = controller.call_context();
            match cx
                .call("delete_route", routes.delete_route(&cx, cluster, &route))
                .await
            {
                Ok(()) => {
                    tracing::info!(route = %route.name, cidr = %route.destination_cidr, "deleted a route");
                    0
                }
                Err(error) => {
                    tracing::warn!(route = %route.name, %error, "cannot delete a route");
                    1
                }
            }
        })
        .buffer_unordered(CONCURRENT_ROUTE_CALLS)
        .fold(0_usize, |sum, failed| std::future::ready(sum + failed));
    let (deleted_first, deleting) = if plan.deletes_first {
        (Some(deletes.await), None)
    } else {
        (None, Some(deletes))
    };
    let creates = futures::stream::iter(plan.nodes)
        .map(|node: NodeRoutes| async move {
            let mut all_exist = true;
            for route in &node.create {
                all_exist &= create_route(controller, routes, cluster, &node.node, route).await;
            }
            // A node with routes but no pod CIDRs has no network either.
            (node.node, node.routed && all_exist)
        })
        .buffer_unordered(CONCURRENT_ROUTE_CALLS)
        .collect::<Vec<(Arc<CachedNode>, bool)>>();
    let (failed_deletes, outcomes) = match (deleted_first, deleting) {
        (_, Some(deletes)) => futures::join!(deletes, creates),
        (failed, None) => (failed.unwrap_or(0), creates.await),
    };
    let mut failed_conditions = 0;
    for (node, routes_created) in outcomes {
        failed_conditions += usize::from(!routes_created);
        failed_conditions += usize::from(!update_condition(api, &node, routes_created).await);
    }
    match failed_deletes + failed_conditions {
        0 => Ok(()),
        n => Err(RouteError::Failures(n)),
    }
}

/// One Warning Event per pod CIDR outside every `--cluster-cidr`, the first time it is seen.
async fn warn_outside(
    controller: &ControllerContext,
    warned: &Mutex<HashSet<(String, String)>>,
    outside: &[(Arc<CachedNode>, String)],
) {
    for (node, cidr) in outside {
        let first = warned.lock().insert((node.name().to_owned(), cidr.clone()));
        if first {
            let note = format!(
                "Not creating a route for pod CIDR {cidr} of node {}: it is outside every --cluster-cidr",
                node.name()
            );
            controller
                .event(
                    &event_reference(node.as_ref()),
                    EventType::Warning,
                    "CIDRNotInClusterCIDR",
                    "CreateRoute",
                    note,
                )
                .await;
        }
    }
}

/// Creates one route (name hint: the node's UID), with a Warning Event when it fails; true when it exists.
async fn create_route(
    controller: &ControllerContext,
    routes: &dyn kube_ccm_provider::Routes,
    cluster: &str,
    node: &CachedNode,
    route: &Route,
) -> bool {
    let name = node.name();
    let hint = if node.uid().is_empty() { name } else { node.uid() };
    let started = Instant::now();
    let cx = controller.call_context();
    let Err(error) = cx
        .call("create_route", routes.create_route(&cx, cluster, hint, route))
        .await
    else {
        return true;
    };
    let note = format!(
        "Could not create route {hint} {} for node {name} after {}: {error}",
        route.destination_cidr,
        go_duration(started.elapsed())
    );
    controller
        .event(
            &event_reference(node),
            EventType::Warning,
            "FailedToCreateRoute",
            "CreateRoute",
            note,
        )
        .await;
    false
}

/// Sets `NetworkUnavailable` when its status or reason changes; false when the write failed.
async fn update_condition(api: &Api<Written<Node>>, node: &CachedNode, routes_created: bool) -> bool {
    let (status, reason, message) = if routes_created {
        ("False", "RouteCreated", "RouteController created a route")
    } else {
        (
            "True",
            "NoRouteCreated",
            "RouteController failed to create a route",
        )
    };
    if node.condition("NetworkUnavailable") == Some((status, Some(reason))) {
        return true;
    }
    let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let condition: BTreeMap<&str, &str> = [
        ("type", "NetworkUnavailable"),
        ("status", status),
        ("reason", reason),
        ("message", message),
        ("lastTransitionTime", now.as_str()),
        ("lastHeartbeatTime", now.as_str()),
    ]
    .into();
    let name = node.name().to_owned();
    let patch = json!({"status": {"conditions": [condition]}});
    match crate::written::patch_status(
        api,
        &name,
        &crate::written::patch_params(),
        &Patch::Strategic(patch),
    )
    .await
    {
        Ok(_) => true,
        Err(error) => {
            tracing::warn!(node = %name, %error, "cannot set the NetworkUnavailable condition");
            false
        }
    }
}

#[cfg(test)]
mod tests;
