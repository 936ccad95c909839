//! The contract checks: what the controllers rely on, asked of the provider call by call.
//!
//! Each check starts from a fresh [`Fixture`], makes what it needs (instances, services), asks the
//! provider, and compares the answers with what the cloud holds as the fixture reads it. Waits for the
//! cloud (eventual consistency) are bounded by [`SETTLE`]; checks that a late write does *not* land
//! watch the cloud for a fixed window ([`Check`] docs say which), the one place a fixed wait is the test.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use cloud_provider::{CallContext, CloudError, CloudProvider, InstancesV2, LoadBalancer, Route, Routes};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use tokio_util::sync::CancellationToken;

use crate::{Capability, CloudLoadBalancer, CloudRoute, Failure, Fixture, NOT_APPLICABLE};

/// One check's future.
pub type CheckFuture<'a> = Pin<Box<dyn Future<Output = Result<(), Failure>> + Send + 'a>>;

/// A named check.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct Check {
    /// Its name, which is also its generated test's.
    pub name: &'static str,
    /// Runs it against a fixture.
    pub run: for<'a> fn(&'a dyn Fixture) -> CheckFuture<'a>,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Check")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

macro_rules! checks {
    ($($name:ident),* $(,)?) => {
        /// Every contract check, in the order the generated tests list them.
        pub const CHECKS: &[Check] = &[
            $(Check { name: stringify!($name), run: |fixture| Box::pin($name(fixture)) },)*
        ];
    };
}

checks![
    instances_follow_the_instance_through_its_life,
    metadata_describes_the_instance,
    batch_answers_agree_with_single_answers,
    an_outage_is_an_error_never_gone,
    provider_ids_are_checked,
    ensure_is_idempotent_and_a_second_ensure_writes_nothing,
    update_follows_the_nodes,
    delete_is_idempotent,
    a_new_process_adopts_an_existing_load_balancer,
    routes_are_created_listed_and_deleted,
    a_call_abandoned_at_its_deadline_writes_nothing_later,
    a_cancelled_call_writes_nothing_later,
];

/// How long the cloud may take to show a change (a stopped instance reported stopped, say).
pub const SETTLE: Duration = Duration::from_secs(30);

/// Each call's deadline in the checks that do not test deadlines.
const CALL: Duration = Duration::from_secs(30);

/// The latency the deadline checks give the cloud, and the deadline they give the call (well inside it).
const LATENCY: Duration = Duration::from_millis(600);
const SHORT_DEADLINE: Duration = Duration::from_millis(150);

/// How long the deadline checks watch the cloud, once fast again, for work left running.
pub const WATCH: Duration = Duration::from_secs(2);

fn cx() -> CallContext {
    CallContext::new(
        tokio::time::Instant::now() + CALL,
        CancellationToken::new(),
        "conformance",
    )
}

fn fail<T>(message: impl Into<String>) -> Result<T, Failure> {
    Err(Failure(message.into()))
}

fn ensure(condition: bool, message: impl FnOnce() -> String) -> Result<(), Failure> {
    if condition {
        Ok(())
    } else {
        Err(Failure(message()))
    }
}

fn answer<T>(what: &str, outcome: Result<T, CloudError>) -> Result<T, Failure> {
    outcome.map_err(|e| Failure(format!("{what}: the provider failed: {e}")))
}

/// Polls `probe` until it gives `Some`, for at most [`SETTLE`]; the failure names `what` and the last
/// thing seen.
async fn eventually<T, F>(what: &str, mut probe: impl FnMut() -> F) -> Result<T, Failure>
where
    F: Future<Output = Result<Option<T>, (Failure, String)>>,
{
    let deadline = tokio::time::Instant::now() + SETTLE;
    let mut last = String::new();
    loop {
        match probe().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err((failure, seen)) => {
                if tokio::time::Instant::now() >= deadline {
                    return Err(failure);
                }
                last = seen;
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return fail(format!("{what}: not so within {SETTLE:?}; last seen: {last}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn instances(provider: &dyn CloudProvider) -> Result<&dyn InstancesV2, Failure> {
    provider.instances_v2().ok_or_else(|| {
        Failure(
            "the provider has no InstancesV2 (CloudProvider::instances_v2 is None): the node controllers need it"
                .into(),
        )
    })
}

/// `capability` of the provider: `Some` when it has it; an error saying "not applicable" when it lacks it
/// as the fixture declares; a failure when the two disagree.
fn capability<'p, T: ?Sized>(
    fixture: &dyn Fixture,
    capability: Capability,
    found: Option<&'p T>,
    needed_by: &str,
) -> Result<&'p T, Failure> {
    let declared = fixture.lacks().contains(&capability);
    match (found, declared) {
        (Some(found), false) => Ok(found),
        (None, true) => Err(Failure(format!(
            "{NOT_APPLICABLE}the provider has no {capability:?}, as its fixture declares"
        ))),
        (None, false) => fail(format!(
            "the provider has no {capability:?} (None from CloudProvider): the {needed_by} needs it; if that is meant, list it in Fixture::lacks"
        )),
        (Some(_), true) => fail(format!(
            "the fixture declares that the provider lacks {capability:?}, but it has it"
        )),
    }
}

fn load_balancer<'p>(
    fixture: &dyn Fixture,
    provider: &'p dyn CloudProvider,
) -> Result<&'p dyn LoadBalancer, Failure> {
    capability(
        fixture,
        Capability::LoadBalancer,
        provider.load_balancer(),
        "service controller",
    )
}

fn routes<'p>(fixture: &dyn Fixture, provider: &'p dyn CloudProvider) -> Result<&'p dyn Routes, Failure> {
    capability(fixture, Capability::Routes, provider.routes(), "route controller")
}

/// `node` as the cloud-node controller leaves it: with the provider ID the cloud gave.
fn initialised(node: &Node, provider_id: &str) -> Node {
    let mut node = node.clone();
    node.spec.get_or_insert_with(Default::default).provider_id = Some(provider_id.to_owned());
    node
}

fn name_of(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

/// Launches an instance for node `name` and returns the node as registered and as initialised.
async fn launched(
    fixture: &dyn Fixture,
    provider: &dyn CloudProvider,
    name: &str,
) -> Result<(Node, Node), Failure> {
    let node = fixture.launch(name).await?;
    let instances = instances(provider)?;
    let metadata = eventually(
        &format!("instance_metadata of the new instance of {name}"),
        || async {
            match instances.instance_metadata(&cx(), &node).await {
                Ok(metadata) => Ok(Some(metadata)),
                Err(e) => Err((
                    Failure(format!("instance_metadata of the new instance of {name}: {e}")),
                    e.to_string(),
                )),
            }
        },
    )
    .await?;
    ensure(!metadata.provider_id.is_empty(), || {
        format!("instance_metadata of {name} has no provider ID: the node would stay tainted")
    })?;
    let init = initialised(&node, &metadata.provider_id);
    Ok((node, init))
}

/// A `type: LoadBalancer` service with a fresh UID.
fn service(name: &str) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "conformance", "uid": uuid::Uuid::new_v4().to_string()},
        "spec": {
            "type": "LoadBalancer",
            "selector": {"app": name},
            "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 30080}],
            "externalTrafficPolicy": "Cluster",
        },
    }))
    .expect("a valid Service")
}

fn arcs(nodes: &[&Node]) -> Vec<Arc<Node>> {
    nodes.iter().map(|n| Arc::new((*n).clone())).collect()
}

fn names(nodes: &[&Node]) -> Vec<String> {
    let mut names: Vec<String> = nodes.iter().map(|n| name_of(n)).collect();
    names.sort();
    names
}

/// The load balancer the cloud holds for `service`, if any; more than one is a failure.
async fn cloud_load_balancer(
    fixture: &dyn Fixture,
    lb: &dyn LoadBalancer,
    service: &Service,
) -> Result<Option<CloudLoadBalancer>, Failure> {
    let name = lb.load_balancer_name(fixture.cluster_name(), service);
    let all = fixture.load_balancers().await?;
    let mut mine: Vec<CloudLoadBalancer> = all.iter().filter(|l| l.name == name).cloned().collect();
    ensure(mine.len() <= 1, || {
        format!(
            "the cloud holds {} load balancers named {name}: {mine:?}",
            mine.len()
        )
    })?;
    Ok(mine.pop())
}

fn has_address(status: &LoadBalancerStatus) -> bool {
    status.ingress.iter().flatten().any(|i| {
        i.ip.as_deref().is_some_and(|s| !s.is_empty()) || i.hostname.as_deref().is_some_and(|s| !s.is_empty())
    })
}

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
        match instances.instance_shutdown(&cx(), &init).await {
            Ok(true) => Ok(Some(())),
            Ok(false) => Err((
                Failure("instance_shutdown of a stopped instance: false".into()),
                "false".into(),
            )),
            Err(e) => Err((
                Failure(format!("instance_shutdown of a stopped instance: {e}")),
                e.to_string(),
            )),
        }
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
    eventually("instance_exists of a terminated instance is false", || async {
        match instances.instance_exists(&cx(), &init).await {
            Ok(false) => Ok(Some(())),
            Ok(true) => Err((
                Failure("instance_exists of a terminated instance: still true".into()),
                "true".into(),
            )),
            Err(e) => Err((
                Failure(format!(
                    "instance_exists of a terminated instance: {e} (the answer must be Ok(false))"
                )),
                e.to_string(),
            )),
        }
    })
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
            match instances.instance_metadata(&cx(), &init).await {
                Err(_) => Ok(Some(())),
                Ok(metadata) => Err((
                    Failure(format!(
                        "instance_metadata of a terminated instance answered {metadata:?}"
                    )),
                    format!("{metadata:?}"),
                )),
            }
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
        match (&down, &gone) {
            (Ok(true), Ok(false)) => Ok(Some(())),
            _ => Err((
                Failure(format!("stopped: {down:?}, terminated exists: {gone:?}")),
                format!("{down:?} {gone:?}"),
            )),
        }
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
        match instances.instance_exists(&cx(), &init).await {
            Ok(true) => Ok(Some(())),
            other => Err((
                Failure(format!("instance_exists after the outage: {other:?}")),
                format!("{other:?}"),
            )),
        }
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
                let held = cloud_load_balancer(fixture, lb, &svc)
                    .await
                    .map_err(|f| (f.clone(), f.0))?;
                match held {
                    Some(held) if held.nodes == want => Ok(Some(())),
                    other => Err((
                        Failure(format!("{step}: the cloud holds {other:?}, want nodes {want:?}")),
                        format!("{other:?}"),
                    )),
                }
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

/// How an abandoned call is ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Abandon {
    Deadline,
    Cancelled,
}

/// The two deadline checks: see [`a_call_abandoned_at_its_deadline_writes_nothing_later`].
async fn abandoned_call_writes_nothing(fixture: &dyn Fixture, how: Abandon) -> Result<(), Failure> {
    let provider = fixture.provider().await?;
    let lb = load_balancer(fixture, &*provider)?;
    let (_, a) = launched(fixture, &*provider, "conformance-late-a").await?;
    let svc = service("late");
    let cluster = fixture.cluster_name();
    let before = fixture.writes().await?;
    fixture.set_latency(LATENCY).await?;
    let cancel = CancellationToken::new();
    let call_cx = match how {
        Abandon::Deadline => CallContext::new(
            tokio::time::Instant::now() + SHORT_DEADLINE,
            cancel.clone(),
            "conformance",
        ),
        Abandon::Cancelled => {
            let canceller = cancel.clone();
            tokio::spawn(async move {
                tokio::time::sleep(SHORT_DEADLINE).await;
                canceller.cancel();
            });
            CallContext::new(tokio::time::Instant::now() + CALL, cancel.clone(), "conformance")
        }
    };
    let nodes = arcs(&[&a]);
    let outcome = call_cx
        .guard(lb.ensure_load_balancer(&call_cx, cluster, &svc, &nodes))
        .await;
    let ended = tokio::time::Instant::now();
    let expected = match how {
        Abandon::Deadline => matches!(outcome, Err(CloudError::Timeout)),
        Abandon::Cancelled => matches!(outcome, Err(CloudError::Cancelled)),
    };
    if !expected {
        fixture.set_latency(Duration::ZERO).await?;
        return fail(format!(
            "ensure_load_balancer with {SHORT_DEADLINE:?} against a cloud answering after {LATENCY:?} ended {outcome:?}, not {how:?}: the fixture's latency did not hold the call back"
        ));
    }
    // The cloud is fast again at once, so work left running finishes its requests within the window:
    // the one it had in flight (held one latency), then the rest. The fixed wait is the test here.
    fixture.set_latency(Duration::ZERO).await?;
    tokio::time::sleep_until(ended + LATENCY + WATCH).await;
    let late = fixture.writes().await?;
    let held = cloud_load_balancer(fixture, lb, &svc).await?;
    ensure(late == before && held.is_none(), || {
        format!(
            "ensure_load_balancer was abandoned ({how:?}) after {SHORT_DEADLINE:?}, yet {} cloud writes landed after it ended (load balancer: {held:?}); a provider's work must end with its call's future",
            late.saturating_sub(before)
        )
    })?;
    answer(
        "ensure_load_balancer with time enough",
        lb.ensure_load_balancer(&cx(), cluster, &svc, &nodes).await,
    )?;
    let made = cloud_load_balancer(fixture, lb, &svc).await?;
    ensure(made.is_some() && fixture.writes().await? > before, || {
        "ensure_load_balancer with time enough wrote nothing the fixture saw: the check cannot observe writes"
            .into()
    })
}

/// A call past its deadline writes nothing afterwards.
///
/// Makes `ensure_load_balancer` slower than its context allows, ends it as the framework does (dropping its
/// future, through [`CallContext::guard`]), makes the cloud fast again and watches it for one latency and
/// [`WATCH`] more: nothing of that call may land (work the provider left running in a spawned task, or
/// retries past the deadline, would be a write by a process that may no longer hold the lock). A second call with time enough must then succeed,
/// so the check is seen to be able to observe a write.
pub async fn a_call_abandoned_at_its_deadline_writes_nothing_later(
    fixture: &dyn Fixture,
) -> Result<(), Failure> {
    abandoned_call_writes_nothing(fixture, Abandon::Deadline).await
}

/// A cancelled call (its controller stopping) writes nothing afterwards.
///
/// Makes `ensure_load_balancer` slower than its context allows, ends it as the framework does (dropping its
/// future, through [`CallContext::guard`]), makes the cloud fast again and watches it for one latency and
/// [`WATCH`] more: nothing of that call may land (work the provider left running in a spawned task, or
/// retries past the deadline, would be a write by a process that may no longer hold the lock). A second call with time enough must then succeed,
/// so the check is seen to be able to observe a write.
pub async fn a_cancelled_call_writes_nothing_later(fixture: &dyn Fixture) -> Result<(), Failure> {
    abandoned_call_writes_nothing(fixture, Abandon::Cancelled).await
}
