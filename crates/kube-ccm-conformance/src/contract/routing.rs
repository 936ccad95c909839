//! Routes.

use super::*;

fn route_to(route: &Route, node: &Node, cidr: &str) -> bool {
    let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
    route.destination_cidr == cidr
        && (route.target_node == name_of(node) || Some(route.target_node.as_str()) == provider_id)
}

/// Routes: a created route is listed (to its node and range) and held by the cloud; creating it again
/// makes no second one; a deleted route is gone, the others stay.
pub async fn routes_are_created_listed_and_deleted(fixture: &dyn Fixture) -> Result<(), Failure> {
    let provider = fixture.provider().await?;
    let routes = routes(fixture, &*provider)?;
    let (_, a) = launched(fixture, &*provider, "conformance-route-a").await?;
    let (_, b) = launched(fixture, &*provider, "conformance-route-b").await?;
    let cluster = fixture.cluster_name();
    let wanted = [
        (&a, "10.244.1.0/24", "route-a-uid"),
        (&b, "10.244.2.0/24", "route-b-uid"),
    ];
    for (node, cidr, hint) in wanted {
        let route = Route {
            target_node: name_of(node),
            destination_cidr: cidr.to_owned(),
            target_node_addresses: Vec::new(),
            ..Route::default()
        };
        answer(
            "create_route",
            routes.create_route(&cx(), cluster, hint, &route).await,
        )?;
    }
    let check_cloud = |want: Vec<CloudRoute>| async move {
        let mut held = fixture.routes().await?;
        held.sort_by(|x, y| x.cidr.cmp(&y.cidr));
        ensure(held == want, || {
            format!("the cloud holds the routes {held:?}, want {want:?}")
        })
    };
    let listed = answer("list_routes", routes.list_routes(&cx(), cluster).await)?;
    for (node, cidr, _) in wanted {
        ensure(listed.iter().any(|r| route_to(r, node, cidr)), || {
            format!(
                "list_routes has no route to {} for {cidr}: {listed:?}",
                name_of(node)
            )
        })?;
    }
    check_cloud(vec![
        CloudRoute::new(name_of(&a), "10.244.1.0/24"),
        CloudRoute::new(name_of(&b), "10.244.2.0/24"),
    ])
    .await?;

    let again = Route {
        target_node: name_of(&a),
        destination_cidr: "10.244.1.0/24".into(),
        ..Route::default()
    };
    answer(
        "create_route (again)",
        routes.create_route(&cx(), cluster, "route-a-uid", &again).await,
    )?;
    check_cloud(vec![
        CloudRoute::new(name_of(&a), "10.244.1.0/24"),
        CloudRoute::new(name_of(&b), "10.244.2.0/24"),
    ])
    .await?;

    let listed = answer("list_routes", routes.list_routes(&cx(), cluster).await)?;
    let Some(to_a) = listed.iter().find(|r| route_to(r, &a, "10.244.1.0/24")) else {
        return fail(format!(
            "list_routes lost the route to {}: {listed:?}",
            name_of(&a)
        ));
    };
    answer("delete_route", routes.delete_route(&cx(), cluster, to_a).await)?;
    let listed = answer(
        "list_routes (after delete)",
        routes.list_routes(&cx(), cluster).await,
    )?;
    ensure(!listed.iter().any(|r| route_to(r, &a, "10.244.1.0/24")), || {
        format!("list_routes still has the deleted route: {listed:?}")
    })?;
    ensure(listed.iter().any(|r| route_to(r, &b, "10.244.2.0/24")), || {
        format!("deleting one route removed another: {listed:?}")
    })?;
    check_cloud(vec![CloudRoute::new(name_of(&b), "10.244.2.0/24")]).await
}
