//! `node-route-controller`: a cloud route for every node pod CIDR.
//!
//! Every `--route-reconciliation-period` (10 s), and a second after nodes change: routes are keyed by
//! (target node, destination CIDR) as upstream; routes this controller is responsible for (destination
//! inside a `--cluster-cidr`) that are blackholes or match no node's CIDR are deleted; missing ones are
//! created (name hint: the node's UID). Then each node with pod CIDRs gets the `NetworkUnavailable`
//! condition: `False`/`RouteCreated` when all its routes exist, `True`/`NoRouteCreated` otherwise (written
//! only when status or reason changes).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cloud_provider::{CloudError, Route};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::{ControllerContext, pause, reference};
use crate::cached_node::CachedNode;
use crate::cidr::Cidr;

/// At most this many route calls at once (upstream: 200).
const CONCURRENT_ROUTE_CALLS: usize = 32;

pub(super) async fn run(controller: ControllerContext) {
    let informer = controller.informers.nodes();
    tokio::select! {
        () = controller.stop.cancelled() => return,
        () = informer.ready() => {}
    }
    controller.started.send_replace(true);
    let mut changes = std::pin::pin!(informer.subscribe());
    let api: Api<Node> = Api::all(controller.client.clone());
    loop {
        let started = Instant::now();
        let result = reconcile(&controller, &api).await;
        controller.metrics.reconciled(
            controller.controller.as_str(),
            result.is_ok(),
            started.elapsed().as_secs_f64(),
        );
        if let Err(error) = result {
            tracing::warn!(%error, "cannot reconcile routes");
        }
        let period = controller.settings.route_reconciliation_period;
        tokio::select! {
            () = controller.stop.cancelled() => return,
            () = tokio::time::sleep(period) => {}
            change = changes.next() => {
                if change.is_none() || !pause(&controller.stop, Duration::from_secs(1)).await {
                    return;
                }
                while let Some(Some(_)) = futures::FutureExt::now_or_never(changes.next()) {}
            }
        }
    }
}

async fn reconcile(controller: &ControllerContext, api: &Api<Node>) -> Result<(), CloudError> {
    let Some(routes) = controller.provider.routes() else {
        return Ok(());
    };
    let cluster = &controller.settings.cluster_name;
    let nodes = controller.informers.nodes().store().state();
    let existing = routes.list_routes(cluster).await?;
    controller.metrics.route_syncs.inc();

    let wanted: HashSet<(String, String)> = nodes
        .iter()
        .flat_map(|n| n.pod_cidrs().map(|c| (n.name().to_owned(), c.to_owned())))
        .collect();
    let present: HashSet<(String, String)> = existing
        .iter()
        .filter(|r| !r.blackhole)
        .map(|r| (r.target_node.clone(), r.destination_cidr.clone()))
        .collect();

    // Stale routes inside the cluster CIDRs go first, so a CIDR that moved to another node is replaced.
    let responsible = |route: &Route| {
        route.destination_cidr.parse::<Cidr>().is_ok_and(|cidr| {
            controller
                .settings
                .cluster_cidrs
                .iter()
                .any(|c| c.overlaps(&cidr))
        })
    };
    let stale: Vec<Route> = existing
        .iter()
        .filter(|r| {
            responsible(r)
                && (r.blackhole || !wanted.contains(&(r.target_node.clone(), r.destination_cidr.clone())))
        })
        .cloned()
        .collect();
    futures::stream::iter(stale)
        .for_each_concurrent(CONCURRENT_ROUTE_CALLS, |route: Route| async move {
            match routes.delete_route(cluster, &route).await {
                Ok(()) => tracing::info!(route = %route.name, cidr = %route.destination_cidr, "deleted a stale route"),
                Err(error) => tracing::warn!(route = %route.name, %error, "cannot delete a stale route"),
            }
        })
        .await;

    // Missing routes, then the NetworkUnavailable condition per node.
    let with_cidrs: Vec<Arc<CachedNode>> = nodes
        .into_iter()
        .filter(|n| n.pod_cidrs().next().is_some())
        .collect();
    let present = Arc::new(present);
    let outcomes = futures::stream::iter(with_cidrs)
        .map(|node: Arc<CachedNode>| {
            let present = present.clone();
            async move {
                let name = node.name().to_owned();
                let mut all_created = true;
                for cidr in node.pod_cidrs().map(str::to_owned) {
                    if present.contains(&(name.clone(), cidr.clone())) {
                        continue;
                    }
                    let route = Route {
                        target_node: name.clone(),
                        destination_cidr: cidr.clone(),
                        ..Route::default()
                    };
                    let hint = node.meta().uid.clone().unwrap_or_else(|| name.clone());
                    if let Err(error) = routes.create_route(cluster, &hint, &route).await {
                        all_created = false;
                        let note = format!("Could not create route {hint} {cidr} for node {name}: {error}");
                        controller
                            .event(
                                &reference(node.as_ref()),
                                true,
                                "FailedToCreateRoute",
                                "CreateRoute",
                                note,
                            )
                            .await;
                    }
                }
                (node, all_created)
            }
        })
        .buffer_unordered(CONCURRENT_ROUTE_CALLS)
        .collect::<Vec<(Arc<CachedNode>, bool)>>()
        .await;
    for (node, all_created) in outcomes {
        update_condition(api, &node, all_created).await;
    }
    Ok(())
}

async fn update_condition(api: &Api<Node>, node: &CachedNode, routes_created: bool) {
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
        return;
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
    if let Err(error) = api
        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
    {
        tracing::warn!(node = %name, %error, "cannot set the NetworkUnavailable condition");
    }
}
