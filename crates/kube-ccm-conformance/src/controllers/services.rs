//! A service's load balancer through its life: made, following the nodes, adopted by a new process, and
//! deleted with the service.

use kube::api::DeleteParams;
use kube_ccm_provider::names::FINALIZER_LOAD_BALANCER_CLEANUP;

use super::*;
use crate::CloudLoadBalancer;
use crate::contract::{ensure, has_address, load_balancer};

/// A `type: LoadBalancer` service `name`, for the manager to serve.
pub(crate) fn load_balancer_service(name: &str) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "type": "LoadBalancer",
            "selector": {"app": name},
            "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
        },
    }))
    .expect("a valid Service")
}

/// Creates service `name` and returns it as the API server holds it (with its UID and node port).
pub(crate) async fn create_service(cluster: &Cluster<'_>, name: &str) -> Result<Service, Failure> {
    cluster
        .services()
        .create(&PostParams::default(), &load_balancer_service(name))
        .await
        .map_err(|e| kube_failed(&format!("create service {name}"), e))
}

/// The cloud's load balancers named as the provider names `service`'s, once `wanted` holds of them.
pub(crate) async fn cloud_load_balancers_when(
    cluster: &Cluster<'_>,
    service: &Service,
    what: &str,
    wanted: impl Fn(&[CloudLoadBalancer]) -> bool,
) -> Result<Vec<CloudLoadBalancer>, Failure> {
    let provider = cluster.fixture.provider().await?;
    let lb = load_balancer(cluster.fixture, &*provider)?;
    let name = lb.load_balancer_name(cluster.fixture.cluster_name(), service);
    eventually_within(REACT, what, || async {
        let all = cluster.fixture.load_balancers().await?;
        let mine: Vec<CloudLoadBalancer> = all.into_iter().filter(|l| l.name == name).collect();
        Ok(if wanted(&mine) {
            Ok(mine)
        } else {
            Err(format!("the cloud's load balancers named {name}: {mine:?}"))
        })
    })
    .await
}

fn sends_to(nodes: &[&String]) -> impl Fn(&[CloudLoadBalancer]) -> bool {
    let mut wanted: Vec<String> = nodes.iter().map(|n| (*n).clone()).collect();
    wanted.sort();
    move |lbs| lbs.len() == 1 && lbs[0].nodes == wanted
}

/// The service controller makes a load balancer for a `type: LoadBalancer` service and writes its address
/// and finalizer; the load balancer follows the nodes as they join; a new manager process adopts it
/// rather than making another; deleting the service deletes it, and the cloud holds none after.
pub async fn a_service_load_balancer_through_its_life(fixture: &dyn Fixture) -> Result<(), Failure> {
    load_balancer(fixture, &*fixture.provider().await?)?;
    let cluster = Cluster::start(fixture).await?;
    let a = cluster.register("conformance-lb-a", None).await?;
    let b = cluster.register("conformance-lb-b", None).await?;
    let running = cluster.run(None).await?;
    for name in [&a, &b] {
        cluster.initialised(name).await?;
    }
    let service = create_service(&cluster, "web").await?;
    let services = cluster.services();
    eventually_within(REACT, "the service's address and finalizer", || async {
        let held = get(&services, "web").await?;
        let status = held
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .and_then(|s| s.load_balancer.clone());
        let finalizers = held
            .as_ref()
            .and_then(|s| s.metadata.finalizers.clone())
            .unwrap_or_default();
        Ok(
            if status.as_ref().is_some_and(has_address)
                && finalizers.iter().any(|f| f == FINALIZER_LOAD_BALANCER_CLEANUP)
            {
                Ok(())
            } else {
                Err(format!("status {status:?}, finalizers {finalizers:?}"))
            },
        )
    })
    .await?;
    cloud_load_balancers_when(
        &cluster,
        &service,
        "one load balancer sending to both nodes",
        sends_to(&[&a, &b]),
    )
    .await?;

    let c = cluster.register("conformance-lb-c", None).await?;
    cluster.initialised(&c).await?;
    cloud_load_balancers_when(
        &cluster,
        &service,
        "the load balancer sending to the node that joined",
        sends_to(&[&a, &b, &c]),
    )
    .await?;

    // A new process: it syncs every service when it starts, and must adopt what the last one made.
    running.stop().await?;
    let restarted = tokio::time::Instant::now();
    let running = cluster.run(None).await?;
    cluster
        .until_called(
            "the new manager's ensure of the service",
            "ensure_load_balancer",
            restarted,
            |c| c.ended.is_some(),
        )
        .await?;
    let all = fixture.load_balancers().await?;
    ensure(all.len() == 1, || {
        format!("after a new process ensured the one service, the cloud holds {all:?}: one was not adopted")
    })?;

    services
        .delete("web", &DeleteParams::default())
        .await
        .map_err(|e| kube_failed("delete service web", e))?;
    eventually_within(REACT, "the service gone (its finalizer removed)", || async {
        Ok(match get(&services, "web").await? {
            None => Ok(()),
            Some(held) => Err(format!("finalizers {:?}", held.metadata.finalizers)),
        })
    })
    .await?;
    let left = fixture.load_balancers().await?;
    ensure(left.is_empty(), || {
        format!("the service is gone, but the cloud still holds {left:?}")
    })?;
    running.stop().await
}
