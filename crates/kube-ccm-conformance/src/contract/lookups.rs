//! Instance look-ups and provider IDs.

use super::*;

/// Instance look-ups follow an instance from running to stopped to gone, for the node as registered and
/// as initialised: `instance_exists` is true until the instance is gone (stopped instances exist, and
/// keep their nodes), `instance_shutdown` is true only while stopped.
pub async fn instances_follow_the_instance_through_its_life(fixture: &dyn Fixture) -> Result<(), Failure> {
    let provider = fixture.provider().await?;
    let instances = instances(&*provider)?;
    let (node, init) = launched(fixture, &*provider, "conformance-life").await?;
    for (form, n) in [("as registered", &node), ("as initialised", &init)] {
        let exists = answer(
            "instance_exists (running)",
            instances.instance_exists(&cx(), n).await,
        )?;
        ensure(exists, || {
            format!("instance_exists of a running instance, node {form}: false (its node would be deleted)")
        })?;
        let down = answer(
            "instance_shutdown (running)",
            instances.instance_shutdown(&cx(), n).await,
        )?;
        ensure(!down, || {
            format!("instance_shutdown of a running instance, node {form}: true (its node would be tainted)")
        })?;
    }

    fixture.stop("conformance-life").await?;
    eventually("instance_shutdown of a stopped instance is true", || async {
        Ok(is(instances.instance_shutdown(&cx(), &init).await, true))
    })
    .await?;
    let exists = answer(
        "instance_exists (stopped)",
        instances.instance_exists(&cx(), &init).await,
    )?;
    ensure(exists, || {
        "instance_exists of a stopped instance: false (stopped instances exist; their nodes must stay)".into()
    })?;

    fixture.terminate("conformance-life").await?;
    eventually(
        "instance_exists of a terminated instance is Ok(false)",
        || async { Ok(is(instances.instance_exists(&cx(), &init).await, false)) },
    )
    .await
}

/// `instance_metadata` gives what the cloud-node controller needs: a provider ID the provider owns and can
/// interpret, addresses of known types, the same answer for the node as registered and as initialised, and
/// an error (never made-up metadata) once the instance is gone.
pub async fn metadata_describes_the_instance(fixture: &dyn Fixture) -> Result<(), Failure> {
    let provider = fixture.provider().await?;
    let instances = instances(&*provider)?;
    let (node, init) = launched(fixture, &*provider, "conformance-meta").await?;
    let registered = answer(
        "instance_metadata",
        instances.instance_metadata(&cx(), &node).await,
    )?;
    let id = &registered.provider_id;
    ensure(provider.owns_provider_id(id), || {
        format!(
            "the provider ID {id:?} is not the provider's own (owns_provider_id): the lifecycle controller would never look at its node"
        )
    })?;
    if let Err(why) = provider.check_provider_id(id) {
        return fail(format!(
            "the provider's own ID {id:?} is refused by check_provider_id: {why}"
        ));
    }
    ensure(!registered.node_addresses.is_empty(), || {
        "instance_metadata has no addresses".into()
    })?;
    const TYPES: [&str; 5] = [
        "InternalIP",
        "ExternalIP",
        "Hostname",
        "InternalDNS",
        "ExternalDNS",
    ];
    for address in &registered.node_addresses {
        ensure(
            TYPES.contains(&address.type_.as_str()) && !address.address.is_empty(),
            || format!("instance_metadata has an address the kubelet cannot use: {address:?}"),
        )?;
    }
    let again = answer(
        "instance_metadata (initialised)",
        instances.instance_metadata(&cx(), &init).await,
    )?;
    ensure(again == registered, || {
        format!(
            "instance_metadata differs between the node as registered and as initialised:\n{registered:?}\n{again:?}"
        )
    })?;

    fixture.terminate("conformance-meta").await?;
    eventually(
        "instance_metadata of a terminated instance is an error",
        || async {
            Ok(match instances.instance_metadata(&cx(), &init).await {
                Err(_) => Ok(()),
                Ok(metadata) => Err(format!("{metadata:?}")),
            })
        },
    )
    .await
}

fn same<T: PartialEq + std::fmt::Debug>(
    what: &str,
    single: &Result<T, CloudError>,
    batch: &Result<T, CloudError>,
) -> Result<(), Failure> {
    let agree = match (single, batch) {
        (Ok(a), Ok(b)) => a == b,
        (Err(_), Err(_)) => true,
        _ => false,
    };
    ensure(agree, || {
        format!("{what}: the single form answered {single:?}, the batch form {batch:?}")
    })
}

/// The batch forms (which the controllers call) answer each node as the single forms do, one answer per
/// node, in order.
pub async fn batch_answers_agree_with_single_answers(fixture: &dyn Fixture) -> Result<(), Failure> {
    let provider = fixture.provider().await?;
    let instances = instances(&*provider)?;
    let (a, a_init) = launched(fixture, &*provider, "conformance-batch-a").await?;
    let (_, b_init) = launched(fixture, &*provider, "conformance-batch-b").await?;
    let (_, c_init) = launched(fixture, &*provider, "conformance-batch-c").await?;
    fixture.stop("conformance-batch-b").await?;
    fixture.terminate("conformance-batch-c").await?;
    let nodes = arcs(&[&a_init, &b_init, &c_init, &a]);
    // The cloud settles first (the stop and the termination show), so both forms see the same cloud.
    eventually("the stop and the termination show", || async {
        let down = instances.instance_shutdown(&cx(), &b_init).await;
        let gone = instances.instance_exists(&cx(), &c_init).await;
        Ok(match (&down, &gone) {
            (Ok(true), Ok(false)) => Ok(()),
            _ => Err(format!("stopped: {down:?}, terminated exists: {gone:?}")),
        })
    })
    .await?;

    let exists = instances.instance_exists_batch(&cx(), &nodes).await;
    let shutdown = instances.instance_shutdown_batch(&cx(), &nodes).await;
    let metadata = instances.instance_metadata_batch(&cx(), &nodes).await;
    for (what, count) in [
        ("instance_exists_batch", exists.len()),
        ("instance_shutdown_batch", shutdown.len()),
        ("instance_metadata_batch", metadata.len()),
    ] {
        ensure(count == nodes.len(), || {
            format!("{what} gave {count} answers for {} nodes", nodes.len())
        })?;
    }
    for (index, node) in nodes.iter().enumerate() {
        let name = name_of(node);
        same(
            &format!("instance_exists of {name} (#{index})"),
            &instances.instance_exists(&cx(), node).await,
            &exists[index],
        )?;
        same(
            &format!("instance_shutdown of {name} (#{index})"),
            &instances.instance_shutdown(&cx(), node).await,
            &shutdown[index],
        )?;
        same(
            &format!("instance_metadata of {name} (#{index})"),
            &instances.instance_metadata(&cx(), node).await,
            &metadata[index],
        )?;
    }
    ensure(matches!(exists[2], Ok(false)), || {
        format!("instance_exists_batch of a terminated instance: {:?}", exists[2])
    })?;
    ensure(matches!(shutdown[1], Ok(true)), || {
        format!("instance_shutdown_batch of a stopped instance: {:?}", shutdown[1])
    })
}

/// When the cloud cannot be reached, look-ups fail: `instance_exists` never answers `false` (the node
/// would be deleted), `instance_shutdown` never `true`, and metadata is an error or what it was. Once the
/// cloud is back, the answers are right again.
pub async fn an_outage_is_an_error_never_gone(fixture: &dyn Fixture) -> Result<(), Failure> {
    let provider = fixture.provider().await?;
    let instances = instances(&*provider)?;
    let (_, init) = launched(fixture, &*provider, "conformance-outage").await?;
    let known = answer(
        "instance_metadata",
        instances.instance_metadata(&cx(), &init).await,
    )?;
    fixture.set_outage(true).await?;
    let nodes = arcs(&[&init]);
    let outcome = async {
        let exists = instances.instance_exists(&cx(), &init).await;
        let exists_batch = instances.instance_exists_batch(&cx(), &nodes).await;
        for (form, answer) in [("instance_exists", Some(&exists)), ("instance_exists_batch", exists_batch.first())] {
            ensure(!matches!(answer, Some(Ok(false)) | None), || {
                format!("{form} during a cloud outage answered {answer:?}: \"gone\" gets a running instance's node deleted; answer an error")
            })?;
        }
        let down = instances.instance_shutdown(&cx(), &init).await;
        let down_batch = instances.instance_shutdown_batch(&cx(), &nodes).await;
        for (form, answer) in [("instance_shutdown", Some(&down)), ("instance_shutdown_batch", down_batch.first())] {
            ensure(!matches!(answer, Some(Ok(true)) | None), || {
                format!("{form} during a cloud outage answered {answer:?} for a running instance")
            })?;
        }
        let metadata = instances.instance_metadata(&cx(), &init).await;
        let metadata_batch = instances.instance_metadata_batch(&cx(), &nodes).await;
        for (form, answer) in [("instance_metadata", Some(&metadata)), ("instance_metadata_batch", metadata_batch.first())] {
            let ok = match answer {
                Some(Err(_)) => true,
                Some(Ok(m)) => m == &known,
                None => false,
            };
            ensure(ok, || format!("{form} during a cloud outage answered {answer:?}, not an error nor what the cloud said before"))?;
        }
        Ok::<(), Failure>(())
    }
    .await;
    fixture.set_outage(false).await?;
    outcome?;
    eventually("instance_exists is true again after the outage", || async {
        Ok(is(instances.instance_exists(&cx(), &init).await, true))
    })
    .await
}

/// The provider refuses IDs it cannot interpret and does not claim other providers' IDs, so the lifecycle
/// controller never asks about (and never deletes) such nodes.
pub async fn provider_ids_are_checked(fixture: &dyn Fixture) -> Result<(), Failure> {
    let provider = fixture.provider().await?;
    let scheme = provider.provider_name().to_owned();
    ensure(!scheme.is_empty() && !scheme.contains("://"), || {
        format!("provider_name {scheme:?} cannot be a provider-ID scheme")
    })?;
    for id in ["", "node-1", "://", "some-other-cloud://zone/i-1"] {
        ensure(
            !provider.owns_provider_id(id) || provider.check_provider_id(id).is_err(),
            || format!("the provider claims and accepts the provider ID {id:?}, which is not its own"),
        )?;
    }
    for id in [
        format!("{scheme}://"),
        format!("{scheme}:///"),
        format!("{scheme}://///"),
    ] {
        ensure(provider.check_provider_id(&id).is_err(), || {
            format!("check_provider_id accepts {id:?}, which names no instance")
        })?;
    }
    Ok(())
}
