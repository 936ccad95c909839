//! Nodes: initialised from the cloud; deleted only when the instance is gone.

use kube_ccm_provider::names::{LABEL_INSTANCE_TYPE, LABEL_REGION, LABEL_ZONE, TAINT_SHUTDOWN};

use super::*;
use crate::contract::{answer, cx, ensure, instances, name_of};

/// A node registered tainted is initialised by the cloud-node controller as the provider describes its
/// instance: the provider ID, the addresses, and the instance-type, zone and region labels.
pub async fn nodes_are_initialised_from_the_cloud(fixture: &dyn Fixture) -> Result<(), Failure> {
    let cluster = Cluster::start(fixture).await?;
    let name = cluster.register("conformance-init", None).await?;
    let registered = get(&cluster.nodes(), &name)
        .await?
        .ok_or_else(|| Failure(format!("node {name} is not there after its creation")))?;
    let running = cluster.run(None).await?;
    let node = cluster.initialised(&name).await?;
    let provider = fixture.provider().await?;
    let metadata = answer(
        "instance_metadata",
        instances(&*provider)?.instance_metadata(&cx(), &registered).await,
    )?;
    let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.clone());
    ensure(provider_id.as_deref() == Some(&metadata.provider_id), || {
        format!(
            "the initialised node's providerID is {provider_id:?}; the provider's instance_metadata says {:?}",
            metadata.provider_id
        )
    })?;
    let addresses: Vec<(String, String)> = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    for address in &metadata.node_addresses {
        let wanted = (address.type_.clone(), address.address.clone());
        ensure(addresses.contains(&wanted), || {
            format!("the initialised node's addresses {addresses:?} lack {wanted:?} of its instance_metadata")
        })?;
    }
    let labels = node.metadata.labels.clone().unwrap_or_default();
    for (label, value) in [
        (LABEL_INSTANCE_TYPE, &metadata.instance_type),
        (LABEL_ZONE, &metadata.zone),
        (LABEL_REGION, &metadata.region),
    ] {
        ensure(value.is_empty() || labels.get(label) == Some(value), || {
            format!(
                "the initialised node's {label} is {:?}, not {value:?}",
                labels.get(label)
            )
        })?;
    }
    running.stop().await
}

/// The node-lifecycle controller deletes the node of a terminated instance and taints the node of a
/// stopped one, and deletes nothing while the cloud fails (an outage is not "gone": upstream's #28901 is
/// every node deleted at once).
pub async fn a_node_is_deleted_only_when_its_instance_is_gone(fixture: &dyn Fixture) -> Result<(), Failure> {
    let cluster = Cluster::start(fixture).await?;
    let keep = cluster.register("conformance-keep", None).await?;
    let stop = cluster.register("conformance-stop", None).await?;
    let gone = cluster.register("conformance-gone", None).await?;
    let names = [keep.as_str(), stop.as_str(), gone.as_str()];
    let running = cluster.run(None).await?;
    for name in names {
        cluster.initialised(name).await?;
        // The lifecycle controller asks the cloud only about nodes that are not Ready.
        cluster.set_ready(name, "False").await?;
    }

    fixture.set_outage(true).await?;
    let outage = tokio::time::Instant::now();
    let lookups = ["instance_exists", "instance_exists_batch"];
    // A deletion needs two "gone" answers a monitor period apart. Until a look-up that started a period
    // after the outage's first was answered, and the pass after it begun (whatever that answer made the
    // controller do is done by then), no node may go.
    let period = cluster.settings().node_monitor_period;
    let nodes = cluster.nodes();
    let deleted_during_outage = |name: &str| {
        Failure(format!(
            "node {name} was deleted during a cloud outage: the provider must answer an error, never \"gone\", when it cannot tell"
        ))
    };
    eventually_within(
        REACT,
        "a pass of the lifecycle controller during the outage",
        || async {
            for name in names {
                if get(&nodes, name).await?.is_none() {
                    return Err(deleted_during_outage(name));
                }
            }
            let asked: Vec<Call> = cluster
                .calls_of(&lookups)
                .into_iter()
                .filter(|c| c.started >= outage)
                .collect();
            let first = asked.iter().map(|c| c.started).min();
            let confirming = asked
                .iter()
                .filter(|c| first.is_some_and(|first| c.started >= first + period))
                .filter_map(|c| c.ended)
                .min();
            Ok(match confirming {
                Some(at) if asked.iter().any(|c| c.started >= at) => Ok(()),
                _ => Err(format!("{} look-ups asked", asked.len())),
            })
        },
    )
    .await?;
    for name in names {
        if get(&nodes, name).await?.is_none() {
            return Err(deleted_during_outage(name));
        }
    }
    fixture.set_outage(false).await?;

    fixture.stop("conformance-stop").await?;
    fixture.terminate("conformance-gone").await?;
    eventually_within(REACT, "the node of the terminated instance deleted", || async {
        Ok(match get(&nodes, &gone).await? {
            None => Ok(()),
            Some(node) => Err(format!("{} still there", name_of(&node))),
        })
    })
    .await?;
    eventually_within(
        REACT,
        "the node of the stopped instance tainted shut down",
        || async {
            Ok(match get(&nodes, &stop).await? {
                Some(node) if has_taint(&node, TAINT_SHUTDOWN) => Ok(()),
                Some(node) => Err(format!("taints {:?}", node.spec.and_then(|s| s.taints))),
                None => Err("deleted".to_owned()),
            })
        },
    )
    .await?;
    for name in [&keep, &stop] {
        ensure(get(&nodes, name).await?.is_some(), || {
            format!("node {name} was deleted, though its instance exists")
        })?;
    }
    running.stop().await
}
