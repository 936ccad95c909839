//! Load balancers: ensured, updated, deleted, adopted.

use super::*;

/// `ensure_load_balancer` makes one load balancer with an address, sending to the nodes given; made again
/// with the same service and nodes it answers the same and changes nothing in the cloud (no write: the
/// service controller ensures every service at every resync).
pub async fn ensure_is_idempotent_and_a_second_ensure_writes_nothing(
    fixture: &dyn Fixture,
) -> Result<(), Failure> {
    let provider = fixture.provider().await?;
    let lb = load_balancer(fixture, &*provider)?;
    let (_, a) = launched(fixture, &*provider, "conformance-lb-a").await?;
    let (_, b) = launched(fixture, &*provider, "conformance-lb-b").await?;
    let svc = service("idempotent");
    let cluster = fixture.cluster_name();
    let first = answer(
        "ensure_load_balancer",
        lb.ensure_load_balancer(&cx(), cluster, &svc, &arcs(&[&a, &b]))
            .await,
    )?;
    ensure(has_address(&first), || {
        format!("ensure_load_balancer answered no address: {first:?}")
    })?;
    let made = cloud_load_balancer(fixture, lb, &svc).await?;
    let Some(made) = made else {
        return fail(format!(
            "after ensure_load_balancer the cloud holds no load balancer named {:?}: {:?}",
            lb.load_balancer_name(cluster, &svc),
            fixture.load_balancers().await?
        ));
    };
    ensure(made.nodes == names(&[&a, &b]), || {
        format!("the load balancer sends to {:?}, not the nodes given", made.nodes)
    })?;

    let writes = fixture.writes().await?;
    let second = answer(
        "ensure_load_balancer (again)",
        lb.ensure_load_balancer(&cx(), cluster, &svc, &arcs(&[&a, &b]))
            .await,
    )?;
    ensure(second == first, || {
        format!("a second ensure_load_balancer answered {second:?}, the first {first:?}")
    })?;
    let after = fixture.writes().await?;
    ensure(after == writes, || {
        format!(
            "a second ensure_load_balancer with nothing changed made {} writes to the cloud; it must make none",
            after.saturating_sub(writes)
        )
    })?;
    let count = fixture.load_balancers().await?.len();
    ensure(count == 1, || {
        format!("after two ensures of one service the cloud holds {count} load balancers")
    })?;
    let got = answer(
        "get_load_balancer",
        lb.get_load_balancer(&cx(), cluster, &svc).await,
    )?;
    ensure(got.as_ref() == Some(&first), || {
        format!("get_load_balancer answered {got:?}, ensure {first:?}")
    })
}

/// `update_load_balancer` (and a new ensure) point the load balancer at exactly the nodes given.
pub async fn update_follows_the_nodes(fixture: &dyn Fixture) -> Result<(), Failure> {
    let provider = fixture.provider().await?;
    let lb = load_balancer(fixture, &*provider)?;
    let (_, a) = launched(fixture, &*provider, "conformance-up-a").await?;
    let (_, b) = launched(fixture, &*provider, "conformance-up-b").await?;
    let svc = service("update");
    let cluster = fixture.cluster_name();
    answer(
        "ensure_load_balancer",
        lb.ensure_load_balancer(&cx(), cluster, &svc, &arcs(&[&a, &b]))
            .await,
    )?;
    for (step, nodes) in [
        ("update to a", vec![&a]),
        ("update to a and b", vec![&a, &b]),
        ("ensure with b", vec![&b]),
    ] {
        if step.starts_with("update") {
            answer(
                step,
                lb.update_load_balancer(&cx(), cluster, &svc, &arcs(&nodes)).await,
            )?;
        } else {
            answer(
                step,
                lb.ensure_load_balancer(&cx(), cluster, &svc, &arcs(&nodes)).await,
            )?;
        }
        let want = names(&nodes);
        eventually(
            &format!("{step}: the load balancer sends to {want:?}"),
            || async {
                Ok(match cloud_load_balancer(fixture, lb, &svc).await? {
                    Some(held) if held.nodes == want => Ok(()),
                    other => Err(format!("{other:?}")),
                })
            },
        )
        .await?;
    }
    Ok(())
}

/// `ensure_load_balancer_deleted` removes the load balancer, and succeeds when there is none (again, or
/// never made): the service controller deletes until it is told done.
pub async fn delete_is_idempotent(fixture: &dyn Fixture) -> Result<(), Failure> {
    let provider = fixture.provider().await?;
    let lb = load_balancer(fixture, &*provider)?;
    let (_, a) = launched(fixture, &*provider, "conformance-del-a").await?;
    let svc = service("delete");
    let cluster = fixture.cluster_name();
    answer(
        "ensure_load_balancer",
        lb.ensure_load_balancer(&cx(), cluster, &svc, &arcs(&[&a])).await,
    )?;
    answer(
        "ensure_load_balancer_deleted",
        lb.ensure_load_balancer_deleted(&cx(), cluster, &svc).await,
    )?;
    let held = cloud_load_balancer(fixture, lb, &svc).await?;
    ensure(held.is_none(), || {
        format!("after ensure_load_balancer_deleted the cloud still holds {held:?}")
    })?;
    let got = answer(
        "get_load_balancer (deleted)",
        lb.get_load_balancer(&cx(), cluster, &svc).await,
    )?;
    ensure(got.is_none(), || {
        format!("get_load_balancer of a deleted load balancer answered {got:?}")
    })?;
    answer(
        "ensure_load_balancer_deleted (again)",
        lb.ensure_load_balancer_deleted(&cx(), cluster, &svc).await,
    )?;
    let never = service("never-made");
    answer(
        "ensure_load_balancer_deleted (never made)",
        lb.ensure_load_balancer_deleted(&cx(), cluster, &never).await,
    )?;
    let left = fixture.load_balancers().await?;
    ensure(left.is_empty(), || {
        format!("load balancers left in the cloud: {left:?}")
    })
}

/// A new process's provider (after a restart or a hand-over) finds the load balancer another made, answers
/// its status, and ensures it without making a second one.
pub async fn a_new_process_adopts_an_existing_load_balancer(fixture: &dyn Fixture) -> Result<(), Failure> {
    let old = fixture.provider().await?;
    let lb = load_balancer(fixture, &*old)?;
    let (_, a) = launched(fixture, &*old, "conformance-adopt-a").await?;
    let svc = service("adopt");
    let cluster = fixture.cluster_name();
    let made = answer(
        "ensure_load_balancer (old process)",
        lb.ensure_load_balancer(&cx(), cluster, &svc, &arcs(&[&a])).await,
    )?;
    let new = fixture.provider().await?;
    let lb = load_balancer(fixture, &*new)?;
    let got = answer(
        "get_load_balancer (new process)",
        lb.get_load_balancer(&cx(), cluster, &svc).await,
    )?;
    ensure(got.as_ref() == Some(&made), || {
        format!("a new process's get_load_balancer answered {got:?}, the old one made {made:?}")
    })?;
    let again = answer(
        "ensure_load_balancer (new process)",
        lb.ensure_load_balancer(&cx(), cluster, &svc, &arcs(&[&a])).await,
    )?;
    ensure(again == made, || {
        format!("a new process's ensure answered {again:?}, the old one made {made:?}")
    })?;
    let count = fixture.load_balancers().await?.len();
    ensure(count == 1, || {
        format!("after a new process ensured an existing load balancer the cloud holds {count}")
    })
}

/// `list_load_balancers` (the orphan sweep's question) lists a load balancer under the name
/// `load_balancer_name` gives its service, and with that service when it names one; `delete_load_balancer`
/// of what it listed removes every part of it, and succeeds again when it is gone. A provider that lists
/// under another name (a cloud ID, say) would have the sweep delete every live load balancer. Not
/// applicable to a provider that lists none (`NotImplemented`: no sweep).
pub async fn listed_load_balancers_are_named_as_their_services_and_deleted_whole(
    fixture: &dyn Fixture,
) -> Result<(), Failure> {
    let provider = fixture.provider().await?;
    let lb = load_balancer(fixture, &*provider)?;
    let cluster = fixture.cluster_name();
    match lb.list_load_balancers(&cx(), cluster).await {
        Err(CloudError::NotImplemented) => {
            return fail(format!(
                "{NOT_APPLICABLE}the provider lists no load balancers (no orphan sweep)"
            ));
        }
        other => answer("list_load_balancers", other)?,
    };
    let (_, a) = launched(fixture, &*provider, "conformance-list-a").await?;
    let svc = service("listed");
    answer(
        "ensure_load_balancer",
        lb.ensure_load_balancer(&cx(), cluster, &svc, &arcs(&[&a])).await,
    )?;
    let name = lb.load_balancer_name(cluster, &svc);
    let listed = answer(
        "list_load_balancers",
        lb.list_load_balancers(&cx(), cluster).await,
    )?;
    let Some(found) = listed.iter().find(|l| l.name == name) else {
        let names: Vec<_> = listed.iter().map(|l| &l.name).collect();
        return fail(format!(
            "list_load_balancers does not list {name:?}, the name load_balancer_name gives the service it was ensured for; it lists {names:?}"
        ));
    };
    ensure(
        found.service.as_deref().is_none_or(|s| s == "conformance/listed"),
        || {
            format!(
                "list_load_balancers names the service of {name:?} {:?}, not \"conformance/listed\"",
                found.service
            )
        },
    )?;
    answer(
        "delete_load_balancer",
        lb.delete_load_balancer(&cx(), cluster, found).await,
    )?;
    let got = answer(
        "get_load_balancer (deleted by delete_load_balancer)",
        lb.get_load_balancer(&cx(), cluster, &svc).await,
    )?;
    ensure(got.is_none(), || {
        format!("after delete_load_balancer, get_load_balancer answered {got:?}")
    })?;
    eventually("nothing of the deleted load balancer listed", || async {
        let listed = answer(
            "list_load_balancers",
            lb.list_load_balancers(&cx(), cluster).await,
        )?;
        Ok(match listed.iter().find(|l| l.name == name) {
            None => Ok(()),
            Some(left) => Err(format!("{left:?}")),
        })
    })
    .await?;
    let left = fixture.load_balancers().await?;
    ensure(left.is_empty(), || {
        format!("load balancers left in the cloud after delete_load_balancer: {left:?}")
    })?;
    answer(
        "delete_load_balancer (again)",
        lb.delete_load_balancer(&cx(), cluster, found).await,
    )
}

/// Every class [`LoadBalancer::classes`] declares is served: the service controller hands over exactly
/// those services, so a service of a declared class that `ensure_load_balancer` refuses
/// (`ImplementedElsewhere`) would keep the finalizer and never get an address. Each gets a load balancer
/// with an address, in a status the API server takes (an `ipMode` only beside an IP, and only `VIP` or
/// `Proxy`), and `ensure_load_balancer_deleted` removes it.
pub async fn declared_classes_are_served(fixture: &dyn Fixture) -> Result<(), Failure> {
    let provider = fixture.provider().await?;
    let lb = load_balancer(fixture, &*provider)?;
    let declared = lb.classes();
    let (_, a) = launched(fixture, &*provider, "conformance-class-a").await?;
    let cluster = fixture.cluster_name();
    let unclassed = declared.serves_unclassed().then_some(None);
    let classes = unclassed
        .into_iter()
        .chain(declared.classes().iter().map(|c| Some(c.as_str())));
    for (index, class) in classes.enumerate() {
        let mut svc = service(&format!("class-{index}"));
        if let Some(spec) = svc.spec.as_mut() {
            spec.load_balancer_class = class.map(str::to_owned);
        }
        let what = |call: &str| format!("{call} for a service of class {class:?}, which classes() declares");
        let status = answer(
            &what("ensure_load_balancer"),
            lb.ensure_load_balancer(&cx(), cluster, &svc, &arcs(&[&a])).await,
        )?;
        ensure(has_address(&status), || {
            format!("{} answered no address: {status:?}", what("ensure_load_balancer"))
        })?;
        let got = answer(
            &what("get_load_balancer"),
            lb.get_load_balancer(&cx(), cluster, &svc).await,
        )?;
        ensure(got.is_some(), || {
            format!(
                "after ensure_load_balancer, {} answered none",
                what("get_load_balancer")
            )
        })?;
        for ingress in status.ingress.iter().flatten() {
            let has_ip = ingress.ip.as_deref().is_some_and(|ip| !ip.is_empty());
            let valid = match ingress.ip_mode.as_deref() {
                None => true,
                Some("VIP" | "Proxy") => has_ip,
                Some(_) => false,
            };
            ensure(valid, || {
                format!(
                    "{} answered an ipMode the API server refuses (only VIP or Proxy, and only beside an ip): \
                     {ingress:?}",
                    what("ensure_load_balancer")
                )
            })?;
        }
        answer(
            &what("ensure_load_balancer_deleted"),
            lb.ensure_load_balancer_deleted(&cx(), cluster, &svc).await,
        )?;
        eventually(&what("the load balancer gone after delete"), || async {
            let asked = answer(
                "get_load_balancer",
                lb.get_load_balancer(&cx(), cluster, &svc).await,
            )?;
            Ok(match (asked, cloud_load_balancer(fixture, lb, &svc).await?) {
                (None, None) => Ok(()),
                (asked, held) => Err(format!("get_load_balancer: {asked:?}; the cloud holds {held:?}")),
            })
        })
        .await?;
    }
    Ok(())
}
