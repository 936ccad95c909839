//! Routes: one per node's pod range, and none left for a node that is gone.

use kube::api::DeleteParams;

use super::*;
use crate::CloudRoute;
use crate::contract::routes;

/// The route controller makes a route to each node for its pod range and marks the node's network
/// available; the route of a deleted node goes.
pub async fn routes_follow_the_nodes(fixture: &dyn Fixture) -> Result<(), Failure> {
    routes(fixture, &*fixture.provider().await?)?;
    let cluster = Cluster::start(fixture).await?;
    let mut wanted = Vec::new();
    for (name, cidr) in [
        ("conformance-route-a", "10.244.1.0/24"),
        ("conformance-route-b", "10.244.2.0/24"),
    ] {
        wanted.push((cluster.register(name, Some(cidr)).await?, cidr));
    }
    let running = cluster.run(None).await?;
    let held = |want: Vec<CloudRoute>| {
        let fixture = cluster.fixture;
        move || {
            let want = want.clone();
            async move {
                let mut routes = fixture.routes().await?;
                routes.sort_by(|x, y| x.cidr.cmp(&y.cidr));
                Ok(if routes == want {
                    Ok(())
                } else {
                    Err(format!("{routes:?}"))
                })
            }
        }
    };
    let both: Vec<CloudRoute> = wanted.iter().map(|(n, c)| CloudRoute::new(n, *c)).collect();
    eventually_within(REACT, "a route to each node for its pod range", held(both)).await?;
    let nodes = cluster.nodes();
    eventually_within(REACT, "NetworkUnavailable=False on both nodes", || async {
        let mut seen = Vec::new();
        for (name, _) in &wanted {
            let condition = get(&nodes, name)
                .await?
                .and_then(|n| n.status)
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "NetworkUnavailable")
                .map(|c| c.status);
            seen.push(condition);
        }
        Ok(if seen.iter().all(|c| c.as_deref() == Some("False")) {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        })
    })
    .await?;

    nodes
        .delete(&wanted[1].0, &DeleteParams::default())
        .await
        .map_err(|e| kube_failed("delete a node", e))?;
    let one = vec![CloudRoute::new(&wanted[0].0, wanted[0].1)];
    eventually_within(REACT, "the deleted node's route gone, the other kept", held(one)).await?;
    running.stop().await
}
